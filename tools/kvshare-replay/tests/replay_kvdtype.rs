//! `--kv-dtype`: a page format against bf16 at one device byte budget. The budget buys
//! `budget / page bytes` pages, the page bytes being the cache manager's for the format (a
//! one-byte format at least doubles the pages), and on the built-in chat workload with LRU the
//! larger cache of a one-byte format never computes more prompt tokens than bf16. Its prefix hits
//! are never fewer either when neither run preempts; a preempted request is admitted again and
//! finds its own pages, so the smaller cache can count more hits on more prompt tokens.

use kvshare_core::{DType, EvictionPolicy};
use kvshare_replay::kvdtype::{budget_config, compare, DtypeRun, BASELINE};
use kvshare_replay::workload::ChatWorkload;
use kvshare_replay::{Geometry, ReplayConfig, VecSource};
use proptest::prelude::*;

const FORMATS: [DType; 7] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Fp8E4M3,
    DType::Fp8E5M2,
    DType::Int8,
    DType::Int8PerTokenHead,
];

fn base(page_size: u32, layers: u32, kv_heads: u32, head_dim: u32) -> ReplayConfig {
    ReplayConfig {
        page_size,
        concurrency: 4,
        policy: EvictionPolicy::Lru,
        geometry: Geometry {
            layers,
            kv_heads,
            head_dim,
            ..Geometry::default()
        },
        ..ReplayConfig::default()
    }
}

proptest! {
    #[test]
    fn the_budget_buys_whole_pages_of_the_cache_managers_bytes(
        ps in 1u32..64, layers in 1u32..8, kv_heads in 1u32..9, head_dim in 1u32..257,
        budget in 1u64..(1 << 40), f in 0usize..7,
    ) {
        let b = base(ps, layers, kv_heads, head_dim);
        let dtype = FORMATS[f];
        let mut c = b.cache_config();
        c.dtype = dtype;
        let page = c.page_bytes().unwrap();
        match budget_config(&b, dtype, budget) {
            Ok(cfg) => {
                prop_assert_eq!(cfg.geometry.dtype, dtype);
                prop_assert_eq!(cfg.page_bytes(), page);
                let pages = cfg.device_pages as u64;
                prop_assert!(pages >= 1 && pages * page <= budget && budget < (pages + 1) * page);
                // One byte an element and nothing else in the row (per-token-head rows add a scale).
                let halves = dtype.size_bytes() == 1 && dtype.row_scale_bytes() == 0;
                if let (true, Ok(bf)) = (halves, budget_config(&b, BASELINE, budget)) {
                    prop_assert!(pages >= 2 * bf.device_pages as u64);
                }
            }
            Err(e) => {
                prop_assert!(budget / page == 0 || budget / page > kvshare_core::config::MAX_PAGES as u64);
                prop_assert!(e.contains("--kv-bytes"), "{}", e);
            }
        }
    }
}

/// The requests of the chat workload with these settings.
fn chat(seed: u64, users: usize, turns: usize, system: usize) -> Vec<kvshare_replay::Request> {
    ChatWorkload {
        users,
        turns,
        system_tokens: system,
        user_tokens: (10, 80),
        output_tokens: (10, 80),
        think_ms: (0, 400),
        seed,
        ..ChatWorkload::default()
    }
    .generate()
}

/// bf16 and `dtype` at the budget of `bf16_pages` bf16 pages; `None` when the bf16 device is too
/// small for the longest request.
fn at_budget(
    reqs: &[kvshare_replay::Request],
    bf16_pages: u32,
    dtype: DType,
) -> Result<Option<(u64, [DtypeRun; 2])>, String> {
    let b = base(16, 2, 4, 64);
    let mut bf16 = b.clone();
    bf16.geometry.dtype = BASELINE;
    let budget = bf16_pages as u64 * bf16.page_bytes();
    let mut src = VecSource::new(reqs);
    match compare(&mut src, &b, dtype, budget, &mut |_, _| {}) {
        Ok(r) => Ok(Some((budget, r))),
        Err(e) if e.contains("needs") => Ok(None),
        Err(e) => Err(e),
    }
}

fn preemptions(r: &DtypeRun) -> u64 {
    r.out.swaps + r.out.recomputes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn a_one_byte_format_never_computes_more_prompt_tokens_than_bf16_at_the_same_budget(
        seed in 0u64..1000, users in 2usize..7, turns in 2usize..6,
        system in 0usize..400, bf16_pages in 40u32..200, f in 3usize..6,
    ) {
        let reqs = chat(seed, users, turns, system);
        let Some((budget, runs)) = at_budget(&reqs, bf16_pages, FORMATS[f])
            .map_err(TestCaseError::fail)? else { return Ok(()) };
        let [bf, q] = &runs;
        prop_assert!(q.pages() >= 2 * bf.pages());
        prop_assert!(q.kv_bytes() <= budget && bf.kv_bytes() <= budget);
        prop_assert!(
            q.recomputed_tokens() <= bf.recomputed_tokens(),
            "{:?}: {} computed prompt tokens on {} pages, bf16 {} on {}",
            q.dtype, q.recomputed_tokens(), q.pages(), bf.recomputed_tokens(), bf.pages()
        );
        if preemptions(bf) + preemptions(q) == 0 {
            prop_assert!(
                q.out.hit_tokens() >= bf.out.hit_tokens(),
                "{:?}: {} hit tokens on {} pages, bf16 {} on {}",
                q.dtype, q.out.hit_tokens(), q.pages(), bf.out.hit_tokens(), bf.pages()
            );
        }
        prop_assert_eq!(q.recomputed_tokens() + q.out.hit_tokens(), q.out.query_tokens());
    }
}

/// A bf16 cache small enough to preempt: its re-admitted requests find their own pages again, so
/// it counts more hit tokens than the fp8 cache of twice the pages, on more prompt tokens, and
/// computes more of them.
#[test]
fn a_preempting_cache_counts_hits_again_on_the_tokens_it_queries_again() {
    let reqs = chat(788, 3, 5, 5);
    let (_, [bf, q]) = at_budget(&reqs, 60, DType::Fp8E4M3).unwrap().unwrap();
    assert!(preemptions(&bf) > 0 && preemptions(&q) == 0);
    assert!(
        bf.out.hit_tokens() > q.out.hit_tokens(),
        "{} {}",
        bf.out.hit_tokens(),
        q.out.hit_tokens()
    );
    assert!(bf.out.query_tokens() > q.out.query_tokens());
    assert!(bf.recomputed_tokens() > q.recomputed_tokens());
}
