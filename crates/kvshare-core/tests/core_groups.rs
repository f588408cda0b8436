//! Model-based test of a cache of KV-cache groups (`kvshare_core::State`, in vLLM's block-pool
//! mode: `vllm_free_order`, no dedup, no host tier) against
//! `Vllm` below: a line-by-line port of what vLLM 0.23's hybrid manager does with one shared
//! block pool (`block_pool.py`: the free queue, `touch`, `free_blocks(prepend)`,
//! `_maybe_evict_cached_block`, duplicate hashes; `single_type_kv_cache_manager.py`: each kind's
//! `find_longest_cache_hit`, `get_num_skipped_tokens`, `remove_skipped_blocks`, `free`,
//! `get_num_blocks_to_allocate`; `MambaManager`'s rules for mamba_cache_mode "all" and "none":
//! the right-to-left hit, `n - 1` skipped tokens, `cached_blocks_this_step` and
//! `new_step_starts`, a "none" block of `max_model_len` tokens;
//! `kv_cache_coordinator.py`: the fixed point of
//! `HybridKVCacheCoordinator.find_longest_cache_hit`; `kv_cache_manager.allocate_slots`' order).
//!
//! An engine plays gpt-oss-like (sliding window 128 / full), Gemma-3-like (5 sliding-window
//! groups of window 1024 per full group), Llama-4-like (chunk 8192 / full) and state-group
//! (Qwen3-Next-like, Nemotron-H-like, Jamba-like) configurations, with scheduler steps:
//! multi-turn conversations over shared documents, chunked prefills and decode steps (most
//! after `release_skipped`, as vLLM releases before it allocates, some appends alone), begins
//! with a KV connector's external tokens (`begin_computed`; refused with state groups), frees
//! (some deferred, as vLLM 0.32's scheduler frees: `free_deferred`),
//! and pools small enough to evict and refuse. After every operation both sides must agree on
//! the result (ok or out of space), the hit, every group's block table of every live sequence
//! (page ids, the null page at released positions) and the whole free queue in order; the
//! cached (hash, group, page) triples rebuilt from the cache's events alone must be vLLM's
//! cached blocks (duplicates included); and the cache's invariant checker must pass.

use std::collections::{HashMap, HashSet};

use kvshare_core::prefix::{chain_hash, root_hash};
use kvshare_core::{Config, GroupKind, GroupSpec, State, StateMode, WindowRetention};
use kvshare_core::{Error, EventKind, Tier};
use proptest::prelude::*;

mod support;
#[path = "core_groups/vllm.rs"]
mod vllm;
use support::{append, doc, noise, Hybrid, HybridConfig, NULL};
use vllm::{hashes_of, Vllm};

#[derive(Debug, Clone)]
enum Op {
    /// A new conversation turn: a shared document (or the tokens of an earlier sequence, a
    /// multi-turn follow-up) plus `extra` new tokens. With `ext`, a KV connector supplies that
    /// share (in 1/256ths) of the tokens after the hit but the last (vLLM's external computed
    /// tokens: `kvs_seq_begin_computed`).
    Begin {
        doc: u8,
        prev: Option<usize>,
        extra: u16,
        seed: u32,
        ext: Option<u8>,
        /// A retention boundary besides the prompt's last token (a lookup's shared-prefix
        /// junction, in tokens), under sparse retention.
        junction: Option<u16>,
    },
    /// A step of a live sequence: `k` new tokens (a prefill chunk or one decode token), after
    /// `release_skipped` when `release` (vLLM's order), or an append alone.
    Step {
        who: usize,
        k: u16,
        seed: u32,
        release: bool,
    },
    /// A request ends: its sequence freed, or with `deferred` freed as vLLM 0.32's scheduler
    /// frees a request it deferred (`pop_blocks_for_free`, then one `free_blocks`).
    Free { who: usize, deferred: bool },
    /// The scheduler starts a new step.
    NewStep,
    /// Every live sequence ends, then the prefix cache is reset (vLLM's `reset_prefix_cache`,
    /// which refuses while a block is in use; kvshare's `clear_index`).
    Reset,
}

fn op(max_extra: u16, max_step: u16) -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..3, proptest::option::of(0usize..64), 1..=max_extra, any::<u32>(),
              proptest::option::weighted(0.3, any::<u8>()),
              proptest::option::weighted(0.5, any::<u16>()))
            .prop_map(|(doc, prev, extra, seed, ext, junction)| {
                Op::Begin { doc, prev, extra, seed, ext, junction }
            }),
        5 => (0usize..64, prop_oneof![Just(1u16), 1..=max_step], any::<u32>(),
              proptest::bool::weighted(0.7))
            .prop_map(|(who, k, seed, release)| Op::Step { who, k, seed, release }),
        2 => (0usize..64, proptest::bool::weighted(0.4))
            .prop_map(|(who, deferred)| Op::Free { who, deferred }),
        2 => Just(Op::NewStep),
        1 => Just(Op::Reset),
    ]
}

fn run(
    ps: usize,
    num_pages: u32,
    kinds: Vec<GroupKind>,
    doc_len: usize,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    run_with(ps, num_pages, kinds, doc_len, ops, VLLM_0_23)
}

/// What a run's cache and vLLM are set to beyond the layout.
#[derive(Debug, Clone, Copy)]
struct Mode {
    caching: bool,
    /// The block pool of vLLM 0.32 (kvshare's `vllm_uncached_first`), which reuses every freed
    /// block without a hash first, not vLLM 0.23's.
    uncached_first: bool,
    /// vLLM 0.32's `prefix_cache_retention_interval` (tokens; None dense): kvshare's
    /// `window_retention`, each sequence's boundaries given right after its begin.
    retention: Option<usize>,
    /// The groups (bits) marked EAGLE's (vLLM's `eagle_group_ids`).
    eagle: u32,
}

const VLLM_0_23: Mode = Mode {
    caching: true,
    uncached_first: false,
    retention: None,
    eagle: 0,
};

fn run_with(
    ps: usize,
    num_pages: u32,
    kinds: Vec<GroupKind>,
    doc_len: usize,
    ops: &[Op],
    mode: Mode,
) -> Result<(), TestCaseError> {
    let Mode {
        caching,
        uncached_first,
        retention,
        eagle,
    } = mode;
    let cfg = HybridConfig {
        page_size: ps as u32,
        num_pages,
        groups: kinds
            .iter()
            .enumerate()
            .map(|(g, &kind)| GroupSpec {
                kind,
                page_bytes: 4096,
                eagle: eagle & (1 << g) != 0,
            })
            .collect(),
        enable_prefix_caching: caching,
        enable_events: true,
        policy: None,
        uncached_first,
        retention: retention.map(|t| WindowRetention::Sparse {
            segment_pages: (t / ps) as u32,
        }),
    };
    let mut h = Hybrid::new(cfg).unwrap();
    // (hash, group, page) of every cached page, rebuilt from the events alone.
    let mut from_events: HashSet<(u128, usize, u32)> = HashSet::new();
    let mut v = Vllm::new(ps, num_pages, kinds.clone(), caching);
    v.uncached_first = uncached_first;
    v.retention = retention;
    v.set_eagle_groups(eagle);
    let mut live: Vec<u64> = Vec::new();
    let mut history: Vec<Vec<i32>> = Vec::new();
    let mut next = 1u64;
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Begin {
                doc: d,
                prev,
                extra,
                seed,
                ext,
                junction,
            } => {
                let mut toks = match prev.filter(|_| !history.is_empty()) {
                    Some(i) => history[i % history.len()].clone(),
                    None => doc(d, doc_len),
                };
                toks.extend(noise(seed, extra as usize));
                let id = next;
                next += 1;
                // The read-only lookup finds vLLM's hit, page for page, before the begin.
                let (want_pages, want_hit) =
                    v.find_longest_cache_hit(&hashes_of(&toks, ps), toks.len() - 1);
                let (hit, pages) = h.find_hit(&toks, None, toks.len() - 1);
                prop_assert_eq!(hit, want_hit, "step {}: find_hit", step);
                prop_assert_eq!(pages, want_pages, "step {}: find_hit pages", step);
                // External tokens: after the hit, at least one token left to compute.
                let ext = ext.map_or(0, |e| (toks.len() - 1 - hit) * e as usize / 256);
                let state = kinds.iter().any(|k| matches!(k, GroupKind::State(_)));
                if ext > 0 && state {
                    // Refused whole: the model's vLLM does nothing either.
                    let got = h.begin_computed(id, &toks, None, hit, 0, hit + ext);
                    prop_assert!(
                        matches!(got, Err(Error::InvalidArgument { .. })),
                        "{:?}",
                        got
                    );
                    h.check()
                        .map_err(|e| TestCaseError::fail(format!("step {step}: {e}")))?;
                    continue;
                }
                // vLLM 0.32's boundaries: the prompt's last token, maybe a junction.
                let mut bounds = vec![toks.len() - 1];
                bounds.extend(junction.map(|j| j as usize % toks.len()));
                if retention.is_none() {
                    bounds.clear();
                }
                let want = v.begin_external(id, &toks, ext, &bounds);
                // With EAGLE groups the begin takes the lookup's hit (capped at it): a begin
                // does not drop a page itself.
                let cap = if eagle != 0 { hit } else { toks.len() - 1 };
                let got = if ext > 0 {
                    h.begin_computed(id, &toks, None, hit, 0, hit + ext)
                } else {
                    h.begin(id, &toks, None, cap, 0)
                };
                if got.is_ok() {
                    // Dense retention refuses boundaries.
                    let set = h.set_retention(id, &bounds);
                    match retention {
                        Some(_) => set.unwrap(),
                        None => {
                            let refused = matches!(set, Err(Error::InvalidArgument { .. }));
                            prop_assert!(refused, "{:?}", set);
                        }
                    }
                }
                match (want, got) {
                    (Some(hit), Ok(b)) => {
                        prop_assert_eq!(hit, b.matched_tokens, "step {}: hit", step);
                        live.push(id);
                    }
                    (None, Err(Error::NoSpace { .. })) => {}
                    (w, g) => prop_assert!(false, "step {step}: vLLM {w:?}, kvshare {g:?}"),
                }
            }
            Op::Step {
                who,
                k,
                seed,
                release,
            } => {
                if live.is_empty() {
                    continue;
                }
                let id = live[who % live.len()];
                let toks = noise(seed, k as usize);
                let want = v.step(id, &toks, release);
                if release {
                    let len = h.seq_info(id).unwrap().num_tokens;
                    h.release_skipped(id, len).unwrap();
                }
                let got = append(&mut h, id, &toks, 0);
                match (want, got) {
                    (true, Ok(())) | (false, Err(Error::NoSpace { .. })) => {}
                    (w, g) => prop_assert!(false, "step {step}: vLLM {w}, kvshare {g:?}"),
                }
            }
            Op::Free { who, deferred } => {
                if live.is_empty() {
                    continue;
                }
                let id = live.swap_remove(who % live.len());
                history.push(v.reqs[&id].tokens.clone());
                if deferred {
                    v.free_deferred(id);
                    h.free_deferred(id).unwrap();
                } else {
                    v.free(id);
                    h.free(id).unwrap();
                }
            }
            Op::NewStep => {
                v.new_step();
                h.new_step();
            }
            Op::Reset => {
                for id in live.drain(..) {
                    history.push(v.reqs[&id].tokens.clone());
                    v.free(id);
                    h.free(id).unwrap();
                }
                prop_assert!(
                    v.reset_prefix_cache(),
                    "step {}: vLLM refused the reset",
                    step
                );
                h.clear_index();
            }
        }
        h.check()
            .map_err(|e| TestCaseError::fail(format!("step {step}: {e}")))?;
        for &id in &live {
            for (g, &kind) in kinds.iter().enumerate() {
                if kind == GroupKind::State(StateMode::None) {
                    // vLLM's one block of max_model_len tokens: kvshare's table holds that one
                    // page at its last position, the length of the other groups' tables.
                    let t = h.seq_pages(id, g).unwrap();
                    let held: Vec<u32> = t.iter().copied().filter(|&p| p != NULL).collect();
                    prop_assert_eq!(
                        &v.reqs[&id].blocks[g],
                        &held,
                        "step {}: seq {} group {}",
                        step,
                        id,
                        g
                    );
                    prop_assert_eq!(
                        t.last().copied(),
                        held.first().copied(),
                        "step {}: state page last",
                        step
                    );
                    prop_assert_eq!(
                        h.state_page(id, g).ok(),
                        held.first().copied(),
                        "step {}",
                        step
                    );
                    continue;
                }
                prop_assert_eq!(
                    &v.reqs[&id].blocks[g][..],
                    h.seq_pages(id, g).unwrap(),
                    "step {}: sequence {} group {}",
                    step,
                    id,
                    g
                );
            }
        }
        for e in h.take_events(usize::MAX) {
            let key = (e.hash, e.group as usize, e.page);
            match e.kind {
                EventKind::Stored => {
                    prop_assert!(from_events.insert(key), "step {step}: stored twice")
                }
                EventKind::Removed => {
                    prop_assert!(from_events.remove(&key), "step {step}: removed unknown")
                }
                EventKind::Cleared => {
                    if e.tier == Tier::Device {
                        from_events.clear();
                    }
                }
            }
        }
        let cached: HashSet<(u128, usize, u32)> = v
            .cached
            .iter()
            .flat_map(|(&(hash, g), blocks)| blocks.iter().map(move |&b| (hash, g, b)))
            .collect();
        prop_assert_eq!(
            &cached,
            &from_events,
            "step {}: events vs vLLM's cached blocks",
            step
        );
        let (free, back) = h.pool(0).unwrap().lists().unwrap();
        let queue: Vec<u32> = free.into_iter().chain(back[0].iter().copied()).collect();
        prop_assert_eq!(&v.queue, &queue, "step {}: free queue", step);
    }
    Ok(())
}

/// A state group whose page bytes differ from the attention pages' gets a pool of its own: the
/// state's pages come from it, the attention pool is untouched by them, and both pools return
/// to empty (vLLM pads the bytes equal instead; this is the cache's answer when they are not).
#[test]
fn state_pages_of_other_bytes_have_their_own_pool() {
    let group = |kind, page_bytes| GroupSpec {
        kind,
        page_bytes,
        eagle: false,
    };
    let mut h = Hybrid::new(HybridConfig {
        page_size: 4,
        num_pages: 16,
        groups: vec![
            group(GroupKind::Full, 4096),
            group(GroupKind::State(StateMode::All), 12_288),
        ],
        enable_prefix_caching: true,
        enable_events: false,
        policy: None,
        uncached_first: false,
        retention: None,
    })
    .unwrap();
    assert_eq!((h.pool_of(0).unwrap(), h.pool_of(1).unwrap()), (0, 1));
    let toks: Vec<i32> = (0..10).collect();
    h.begin(1, &toks, None, 9, 0).unwrap();
    h.release_skipped(1, 10).unwrap();
    // 3 attention pages; of the 3 state pages only the running one is held.
    assert_eq!(h.pool(0).unwrap().num_in_use(), 3);
    assert_eq!(h.pool(1).unwrap().num_in_use(), 1);
    h.new_step();
    let b = h.begin(2, &toks, None, 9, 0).unwrap();
    assert_eq!(
        b.matched_tokens, 8,
        "the released checkpoint at 8 is matchable"
    );
    h.check().unwrap();
    h.free(1).unwrap();
    h.free(2).unwrap();
    assert_eq!(
        h.pool(0).unwrap().num_in_use() + h.pool(1).unwrap().num_in_use(),
        0
    );
    h.check().unwrap();
}

/// `free_deferred` on groups in two pools (full attention and a sliding window of 4096-byte
/// pages, full attention of 8192-byte pages), with 0.32's free order: each pool places its own
/// part of the one list (the last group's tail first) at once, uncached pages to the front in
/// list order, cached ones to the back in list order; `free` places them group by group.
#[test]
fn a_deferred_free_places_each_pools_part_of_the_list_at_once() {
    let group = |kind, page_bytes| GroupSpec {
        kind,
        page_bytes,
        eagle: false,
    };
    let toks: Vec<i32> = (0..10).collect(); // 2 full pages of 4 (cached), 1 partial
    let mut orders = Vec::new();
    for deferred in [true, false] {
        let mut h = Hybrid::new(HybridConfig {
            page_size: 4,
            num_pages: 16,
            groups: vec![
                group(GroupKind::Full, 4096),
                group(GroupKind::SlidingWindow(64), 4096),
                group(GroupKind::Full, 8192),
            ],
            enable_prefix_caching: true,
            enable_events: false,
            policy: None,
            uncached_first: true,
            retention: None,
        })
        .unwrap();
        assert_eq!((h.pool_of(1).unwrap(), h.pool_of(2).unwrap()), (0, 1));
        h.begin(1, &toks, None, 9, 0).unwrap();
        let t: Vec<Vec<u32>> = (0..3)
            .map(|g| h.seq_pages(1, g).unwrap().to_vec())
            .collect();
        if deferred {
            h.free_deferred(1).unwrap();
        } else {
            h.free(1).unwrap();
        }
        h.check().unwrap();
        let queue = |pool: usize| {
            let (free, back) = h.pool(pool).unwrap().lists().unwrap();
            (free[..free.len().min(2)].to_vec(), back[0].clone())
        };
        orders.push((queue(0), queue(1), t));
    }
    let ((front, back), (front1, back1), t) = &orders[0];
    assert_eq!(
        front,
        &[t[1][2], t[0][2]],
        "pool 0: uncached, the last group first"
    );
    assert_eq!(
        back,
        &[t[1][1], t[1][0], t[0][1], t[0][0]],
        "pool 0: cached in list order"
    );
    assert_eq!(
        (front1[0], &back1[..]),
        (t[2][2], &[t[2][1], t[2][0]][..]),
        "pool 1"
    );
    // `free`: group by group, so the cached pages of the first group go back first.
    let ((front, back), _, t) = &orders[1];
    assert_eq!(front, &[t[1][2], t[0][2]]);
    assert_eq!(back, &[t[0][1], t[0][0], t[1][1], t[1][0]]);
}

/// A hit that ends at a chunk boundary needs no page of the chunked group (the first token to
/// compute starts a chunk), so that group looks nothing up: the hit is the full group's pages
/// and null pages for the chunked one, for the lookup and the begin alike.
#[test]
fn a_hit_ending_at_a_chunk_boundary_takes_no_chunked_page() {
    let group = |kind| GroupSpec {
        kind,
        page_bytes: 4096,
        eagle: false,
    };
    let mut h = Hybrid::new(HybridConfig {
        page_size: 4,
        num_pages: 16,
        groups: vec![group(GroupKind::Full), group(GroupKind::ChunkedLocal(4))],
        enable_prefix_caching: true,
        enable_events: false,
        policy: None,
        uncached_first: false,
        retention: None,
    })
    .unwrap();
    let toks: Vec<i32> = (0..9).collect();
    h.begin(1, &toks, None, 8, 0).unwrap();
    let full = h.seq_pages(1, 0).unwrap()[..2].to_vec();
    h.free(1).unwrap();
    let (hit, pages) = h.find_hit(&toks, None, 8);
    assert_eq!((hit, pages), (8, vec![full.clone(), vec![NULL, NULL]]));
    let b = h.begin(2, &toks, None, 8, 0).unwrap();
    assert_eq!(b.matched_tokens, 8);
    assert_eq!(h.seq_pages(2, 0).unwrap()[..2], full[..]);
    assert_eq!(h.seq_pages(2, 1).unwrap()[..2], [NULL, NULL]);
    h.check().unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// gpt-oss-like: sliding window 128 alternating with full attention.
    #[test]
    fn gpt_oss_like(ops in proptest::collection::vec(op(300, 200), 1..40)) {
        let kinds = vec![GroupKind::SlidingWindow(128), GroupKind::Full];
        run(16, 160, kinds, 200, &ops)?;
    }

    /// Gemma-3-like: five sliding-window groups (window 1024) per full-attention group.
    #[test]
    fn gemma3_like(ops in proptest::collection::vec(op(1500, 700), 1..30)) {
        let mut kinds = vec![GroupKind::Full];
        kinds.extend([GroupKind::SlidingWindow(1024); 5]);
        run(16, 1200, kinds, 1100, &ops)?;
    }

    /// Llama-4-like: chunked local attention (chunk 8192) next to full attention.
    #[test]
    fn llama4_like(ops in proptest::collection::vec(op(9000, 4000), 1..24)) {
        let kinds = vec![GroupKind::ChunkedLocal(8192), GroupKind::Full];
        run(64, 700, kinds, 8500, &ops)?;
    }

    /// vLLM 0.32's block pool (`vllm_uncached_first`): a freed block without a hash goes to
    /// the front of the free queue whichever group frees it; gpt-oss-like and Llama-4-like
    /// layouts, with and without prefix caching.
    #[test]
    fn vllm_0_32_free_order(
        ops in proptest::collection::vec(op(300, 200), 1..40),
        layout in 0..2usize,
        caching in proptest::bool::weighted(0.8),
    ) {
        let (kinds, ps, pages, doc) = if layout == 0 {
            (vec![GroupKind::SlidingWindow(128), GroupKind::Full], 16, 160, 200)
        } else {
            (vec![GroupKind::ChunkedLocal(64), GroupKind::Full], 16, 120, 200)
        };
        let mode = Mode { caching, uncached_first: true, retention: None, eagle: 0 };
        run_with(ps, pages, kinds, doc, &ops, mode)?;
    }

    /// vLLM 0.32's sparse retention of sliding-window pages (`prefix_cache_retention_interval`
    /// 0, its default, and 64 tokens): only the tails a hit can end at are registered, each
    /// sequence's boundaries given right after its begin; gpt-oss- and Gemma-3-like layouts
    /// with short windows, 0.32's free order (uncached blocks first), small pools.
    #[test]
    fn vllm_0_32_sparse_window_retention(
        ops in proptest::collection::vec(op(300, 200), 1..40),
        layout in 0..2usize,
        interval in prop_oneof![Just(0usize), Just(64)],
    ) {
        let kinds = if layout == 0 {
            vec![GroupKind::SlidingWindow(32), GroupKind::Full]
        } else {
            vec![GroupKind::SlidingWindow(20), GroupKind::SlidingWindow(20), GroupKind::Full]
        };
        let mode =
            Mode { caching: true, uncached_first: true, retention: Some(interval), eagle: 0 };
        run_with(16, 160, kinds, 200, &ops, mode)?;
    }

    /// Prefix caching off (h17b's report: the checker indexed the empty indices): no hit,
    /// nothing registered, the same tables and free queue as vLLM's no-cache coordinator.
    #[test]
    fn no_prefix_caching(ops in proptest::collection::vec(op(40, 20), 1..60)) {
        let kinds = vec![GroupKind::SlidingWindow(9), GroupKind::Full, GroupKind::ChunkedLocal(12)];
        run_with(4, 48, kinds, 10, &ops, Mode { caching: false, ..VLLM_0_23 })?;
    }

    /// Qwen3-Next-like: three linear-attention (state) groups per full-attention group, mode
    /// "all" (vLLM runs Qwen3-Next itself in "align"; the layer shape is what this plays).
    #[test]
    fn qwen3_next_like(ops in proptest::collection::vec(op(300, 200), 1..50)) {
        let mut kinds = vec![GroupKind::Full];
        kinds.extend([GroupKind::State(StateMode::All); 3]);
        run(16, 200, kinds, 200, &ops)?;
    }

    /// Nemotron-H-like: mostly Mamba2 layers, a few attention layers (six state groups per
    /// full group), mode "all", long documents.
    #[test]
    fn nemotron_h_like(ops in proptest::collection::vec(op(600, 300), 1..40)) {
        let mut kinds = vec![GroupKind::State(StateMode::All); 6];
        kinds.insert(2, GroupKind::Full);
        run(32, 300, kinds, 500, &ops)?;
    }

    /// Jamba-like: one attention layer per eight (seven state groups per full group), and a
    /// sliding-window group too for a three-spec fixed point; mode "all"; small pages.
    #[test]
    fn jamba_like(ops in proptest::collection::vec(op(40, 20), 1..60)) {
        let mut kinds = vec![GroupKind::Full];
        kinds.extend([GroupKind::State(StateMode::All); 7]);
        kinds.push(GroupKind::SlidingWindow(9));
        run(4, 120, kinds, 10, &ops)?;
    }

    /// Qwen3-Next in vLLM's own mode, "align": the running state in the last page, the
    /// previous step's page until the next release, checkpoints on page boundaries.
    #[test]
    fn qwen3_next_align(ops in proptest::collection::vec(op(300, 200), 1..50)) {
        let mut kinds = vec![GroupKind::Full];
        kinds.extend([GroupKind::State(StateMode::Align); 3]);
        run(16, 200, kinds, 200, &ops)?;
    }

    /// Align next to a window and full attention, two state groups, small pages.
    #[test]
    fn align_mixed_small(ops in proptest::collection::vec(op(40, 20), 1..60)) {
        let kinds = vec![
            GroupKind::State(StateMode::Align),
            GroupKind::Full,
            GroupKind::State(StateMode::Align),
            GroupKind::SlidingWindow(9),
        ];
        run(4, 64, kinds, 10, &ops)?;
    }

    /// Mode "none" (prefix caching off): one state page per sequence, nothing cached.
    #[test]
    fn state_none_no_caching(ops in proptest::collection::vec(op(40, 20), 1..60)) {
        let kinds = vec![
            GroupKind::State(StateMode::None),
            GroupKind::Full,
            GroupKind::State(StateMode::None),
            GroupKind::SlidingWindow(9),
        ];
        run_with(4, 48, kinds, 10, &ops, Mode { caching: false, ..VLLM_0_23 })?;
    }

    /// EAGLE / MTP (vLLM's `drop_eagle_block` and `eagle_verified`): every group EAGLE's
    /// (`use_eagle` with no group marked), or only some (`is_eagle_group`); a plain model,
    /// gpt-oss-like and Gemma-3-like layouts with short windows and small pools, windows a page
    /// multiple plus one and less; dense retention, or vLLM 0.32's sparse one and free order.
    #[test]
    fn eagle(
        ops in proptest::collection::vec(op(300, 200), 1..40),
        layout in 0..4usize,
        marked in 1u32..16,
        sparse in proptest::option::weighted(0.3, prop_oneof![Just(0usize), Just(64)]),
    ) {
        let kinds = match layout {
            0 => vec![GroupKind::Full],
            1 => vec![GroupKind::SlidingWindow(32), GroupKind::Full],
            2 => vec![GroupKind::Full, GroupKind::SlidingWindow(33), GroupKind::SlidingWindow(33)],
            _ => vec![
                GroupKind::SlidingWindow(9),
                GroupKind::Full,
                GroupKind::SlidingWindow(40),
                GroupKind::Full,
            ],
        };
        let mode = Mode {
            caching: true,
            uncached_first: sparse.is_some(),
            retention: sparse,
            eagle: marked & ((1 << kinds.len()) - 1),
        };
        let pages = if layout == 3 { 48 } else { 160 };
        run_with(16, pages, kinds, 200, &ops, mode)?;
    }

    /// Mixed kinds, windows of a page multiple plus one and less, small pages.
    #[test]
    fn mixed_small(ops in proptest::collection::vec(op(40, 20), 1..60)) {
        let kinds = vec![
            GroupKind::SlidingWindow(9),
            GroupKind::Full,
            GroupKind::ChunkedLocal(12),
            GroupKind::SlidingWindow(9),
            GroupKind::SlidingWindow(6),
        ];
        run(4, 48, kinds, 10, &ops)?;
    }
}

/// Outside vLLM's free order, a page without cached content goes back to the free list: an align
/// state group's previous-step page too, when the step that left it held a placeholder (nothing
/// hashed, nothing registered). Among the cached pages nothing could ever find it, and the
/// checker would refuse the cache.
#[test]
fn align_stale_state_without_content_is_freed_outside_vllm_order() {
    for vllm_free_order in [true, false] {
        let mut h = State::new(Config {
            page_size: 1,
            num_device_pages: 19,
            groups: vec![
                GroupSpec::FULL,
                GroupSpec {
                    kind: GroupKind::State(StateMode::Align),
                    page_bytes: 0,
                    eagle: false,
                },
            ],
            reserve_null_page: true,
            skip_cached_writes: false,
            vllm_free_order,
            ..Config::default()
        })
        .unwrap();
        let mut toks: Vec<i32> = vec![-1];
        toks.extend(100..106);
        h.begin(1, &toks, None, toks.len() - 1, 0).unwrap();
        // Each one-token step moves the running state to a new page; the append lets go of the
        // page of two steps ago.
        for t in [7, 8] {
            append(&mut h, 1, &[t], 0).unwrap();
            h.check()
                .unwrap_or_else(|e| panic!("vllm_free_order {vllm_free_order}: {e}"));
        }
        h.free(1).unwrap();
        h.check().unwrap();
    }
}
