//! `kvshare-bench manager`: cache-manager bookkeeping costs, through the C ABI (what an engine
//! pays, lock and checks included) and the Rust core, each beside a floor measured in the same run.

use std::ffi::OsString;
use std::ptr;

use kvshare::cache::{kvs_cache, kvs_config};
use kvshare::enums::kvs_status;
use kvshare::types::kvs_copy;
use kvshare_core::{Config, State};
use xxhash_rust::xxh3::xxh3_128;

use crate::timing::ns_per_unit;

fn ok(s: kvs_status) {
    assert_eq!(s, kvs_status::Ok, "kvshare call failed");
}

struct CCache(*mut kvs_cache);

impl CCache {
    fn new(page_size: u32, pages: u32) -> Self {
        Self::with_unit(page_size, 0, pages)
    }

    fn with_unit(page_size: u32, match_unit: u32, pages: u32) -> Self {
        let mut cfg: kvs_config = kvs_cache::kvs_config_default();
        cfg.page_size = page_size;
        cfg.match_unit = match_unit;
        cfg.num_device_pages = pages;
        let mut c = ptr::null_mut();
        // SAFETY: `cfg` and `c` are live locals, readable / writable for the call.
        unsafe { ok(kvs_cache::kvs_cache_new(&cfg, &mut c)) };
        CCache(c)
    }
}

impl Drop for CCache {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from `kvs_cache_new` (`CCache::new` asserted success), is freed
        // only here, once, and no call can be using it while its owner is dropped.
        unsafe { kvs_cache::kvs_cache_free(self.0) };
    }
}

/// Deterministic pseudo-random token ids.
fn tokens(seed: u64, n: usize) -> Vec<i32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 150_000) as i32
        })
        .collect()
}

struct Row {
    name: &'static str,
    unit: &'static str,
    ns: f64,
    floor_ns: f64,
    target_ns: f64,
}

fn alloc_release(repeats: usize, rows: &mut Vec<Row>) {
    const BATCH: usize = 64;
    const ROUNDS: usize = 200;
    let c = CCache::new(16, 4096);
    let mut pages = vec![0u32; BATCH];
    // SAFETY: `c.0` is a live cache (owned by `c`, outlives the closure); `pages` holds BATCH
    // ids, the length passed with it, and the released ids are the ones just allocated.
    let ns_c = ns_per_unit(repeats, BATCH * ROUNDS, || unsafe {
        for _ in 0..ROUNDS {
            ok(kvs_cache::kvs_pages_alloc(
                c.0,
                BATCH,
                pages.as_mut_ptr(),
                BATCH,
            ));
            ok(kvs_cache::kvs_pages_release(c.0, pages.as_ptr(), BATCH));
        }
    });
    let mut s = State::new(Config {
        num_device_pages: 4096,
        ..Config::default()
    })
    .unwrap();
    let ns_core = ns_per_unit(repeats, BATCH * ROUNDS, || {
        for _ in 0..ROUNDS {
            let p = s.alloc_pages(BATCH).unwrap();
            s.release_pages(&p).unwrap();
        }
    });
    // Floor: a bare free stack with a refcount array, no checks, no lists, no lock.
    let mut free: Vec<u32> = (0..4096).collect();
    let mut rc = vec![0u32; 4096];
    let ns_floor = ns_per_unit(repeats, BATCH * ROUNDS, || {
        for _ in 0..ROUNDS {
            for slot in pages.iter_mut() {
                let p = free.pop().unwrap();
                rc[p as usize] = 1;
                *slot = p;
            }
            for &p in pages.iter().rev() {
                rc[p as usize] -= 1;
                free.push(p);
            }
            std::hint::black_box(&pages);
        }
    });
    rows.push(Row {
        name: "alloc_release_c_abi",
        unit: "page",
        ns: ns_c,
        floor_ns: ns_floor,
        target_ns: 50.0,
    });
    rows.push(Row {
        name: "alloc_release_core",
        unit: "page",
        ns: ns_core,
        floor_ns: ns_floor,
        target_ns: 50.0,
    });
}

fn prefix_match(repeats: usize, page_size: u32, target_ns: f64, rows: &mut Vec<Row>) {
    const N: usize = 4096;
    let c = CCache::new(page_size, 8192);
    let prompt = tokens(7, N);
    let mut info = Default::default();
    // SAFETY: `c.0` is a live cache; `prompt` holds N tokens, the length passed with it; `extra`
    // NULL is allowed; `info` is a live out location.
    unsafe {
        ok(kvs_cache::kvs_seq_begin(
            c.0,
            1,
            prompt.as_ptr(),
            N,
            ptr::null(),
            usize::MAX,
            &mut info,
        ));
        ok(kvs_cache::kvs_seq_free(c.0, 1));
    }
    let mut pages = vec![0u32; N];
    let (mut np, mut nt) = (0usize, 0usize);
    // SAFETY: `c.0` is a live cache; `prompt` holds N tokens and `pages` N ids, the lengths
    // passed with them; `np`/`nt` are live out locations; the released ids are the `np` just
    // matched (and pinned).
    let ns = ns_per_unit(repeats, 100, || unsafe {
        for _ in 0..100 {
            ok(kvs_cache::kvs_prefix_match(
                c.0,
                prompt.as_ptr(),
                N,
                ptr::null(),
                usize::MAX,
                true,
                pages.as_mut_ptr(),
                N,
                &mut np,
                &mut nt,
            ));
            ok(kvs_cache::kvs_pages_release(c.0, pages.as_ptr(), np));
        }
    });
    assert_eq!(nt, N, "the whole prompt must match");
    // Floor: one xxh3-128 pass over the prompt's bytes (any hashing matcher reads them once).
    let bytes: Vec<u8> = prompt.iter().flat_map(|t| t.to_le_bytes()).collect();
    let floor = ns_per_unit(repeats, 100, || {
        for _ in 0..100 {
            std::hint::black_box(xxh3_128(std::hint::black_box(&bytes)));
        }
    });
    let name = if page_size == 128 {
        "match_4096_tokens_ps128"
    } else {
        "match_4096_tokens_ps16"
    };
    rows.push(Row {
        name,
        unit: "call",
        ns,
        floor_ns: floor,
        target_ns,
    });
}

/// A request whose 4041-token prompt repeats the first 4040 tokens of a cached 4096-token one:
/// `kvs_seq_begin` (the prefix walk, plus the unit lookup inside the page where the match ends),
/// draining its copies, `kvs_seq_free`; per call. Page 128 / unit 16 and page 16 / unit 16
/// match 4032 tokens, page 128 / unit 128 matches 3968; each allocates one page. Floor: one
/// xxh3-128 pass over the prompt's bytes, as for the match rows.
fn begin_with_unit(
    repeats: usize,
    page_size: u32,
    unit: u32,
    name: &'static str,
    rows: &mut Vec<Row>,
) {
    const N: usize = 4096;
    const Q: usize = 4041;
    let c = CCache::with_unit(page_size, unit, 8192);
    let cached = tokens(7, N);
    let mut prompt = cached[..Q - 1].to_vec();
    prompt.push(-7 & 0x7fff_ffff);
    let mut info = Default::default();
    unsafe {
        ok(kvs_cache::kvs_seq_begin(
            c.0,
            1,
            cached.as_ptr(),
            N,
            ptr::null(),
            usize::MAX,
            &mut info,
        ));
        ok(kvs_cache::kvs_seq_free(c.0, 1));
    }
    let mut copies = [kvs_copy {
        src_page: 0,
        dst_page: 0,
        num_tokens: 0,
        kind: 0,
    }; 4];
    let mut n = 0usize;
    let ns = ns_per_unit(repeats, 100, || unsafe {
        for _ in 0..100 {
            ok(kvs_cache::kvs_seq_begin(
                c.0,
                2,
                prompt.as_ptr(),
                Q,
                ptr::null(),
                usize::MAX,
                &mut info,
            ));
            ok(kvs_cache::kvs_cache_take_copies(
                c.0,
                copies.as_mut_ptr(),
                copies.len(),
                &mut n,
            ));
            ok(kvs_cache::kvs_seq_free(c.0, 2));
        }
    });
    let whole = (Q - 1) / page_size as usize * page_size as usize;
    let expect = whole + ((Q - 1 - whole) / unit as usize) * unit as usize;
    assert_eq!(info.matched_tokens as usize, expect, "{name}");
    let bytes: Vec<u8> = prompt.iter().flat_map(|t| t.to_le_bytes()).collect();
    let floor = ns_per_unit(repeats, 100, || {
        for _ in 0..100 {
            std::hint::black_box(xxh3_128(std::hint::black_box(&bytes)));
        }
    });
    rows.push(Row {
        name,
        unit: "call",
        ns,
        floor_ns: floor,
        target_ns: f64::NAN,
    });
}

fn decode_step(repeats: usize, rows: &mut Vec<Row>) {
    const SEQS: usize = 256;
    const PS: usize = 16;
    const MAX_PAGES: usize = 128;
    let c = CCache::new(PS as u32, (SEQS * MAX_PAGES) as u32 + 64);
    let system = tokens(1, 512);
    let ids: Vec<u64> = (1..=SEQS as u64).collect();
    for &id in &ids {
        let mut p = system.clone();
        p.extend(tokens(100 + id, 300));
        // SAFETY: `c.0` is a live cache; `p` holds `p.len()` tokens; NULL extra and info are
        // allowed.
        unsafe {
            ok(kvs_cache::kvs_seq_begin(
                c.0,
                id,
                p.as_ptr(),
                p.len(),
                ptr::null(),
                p.len() - 1,
                ptr::null_mut(),
            ))
        };
    }
    let mut table = vec![0i32; SEQS * MAX_PAGES];
    let mut lens = vec![0i32; SEQS];
    let mut slots = vec![0i64; SEQS];
    let qlens = vec![1u32; SEQS];
    let mut copies = vec![
        kvs_copy {
            src_page: 0,
            dst_page: 0,
            num_tokens: 0,
            kind: 0
        };
        SEQS
    ];
    let mut step = 0i32;
    const STEPS: usize = 20;
    // SAFETY: `c.0` is a live cache; every buffer is passed with its own length (`ids`, `toks`:
    // SEQS; `copies`: SEQS records; `table`: its len, rows of MAX_PAGES; `lens`, `qlens`,
    // `slots`: SEQS) and lives across the closure; `nc` is a live out location; the NULL
    // `num_slots_out` is optional.
    let ns = ns_per_unit(repeats.min(15), STEPS, || unsafe {
        for _ in 0..STEPS {
            step += 1;
            let toks = vec![step; SEQS];
            let mut nc = 0;
            ok(kvs_cache::kvs_seq_append_batch(
                c.0,
                ids.as_ptr(),
                SEQS,
                toks.as_ptr(),
                SEQS,
                copies.as_mut_ptr(),
                SEQS,
                &mut nc,
            ));
            ok(kvs_cache::kvs_cache_block_tables(
                c.0,
                ids.as_ptr(),
                SEQS,
                MAX_PAGES,
                -1,
                table.as_mut_ptr(),
                table.len(),
                lens.as_mut_ptr(),
                SEQS,
            ));
            ok(kvs_cache::kvs_cache_slot_mapping(
                c.0,
                ids.as_ptr(),
                qlens.as_ptr(),
                SEQS,
                slots.as_mut_ptr(),
                SEQS,
                ptr::null_mut(),
            ));
        }
    });
    // Floor: writing the same block-table matrix from an engine-side copy (no bookkeeping).
    let src = table.clone();
    let floor = ns_per_unit(repeats, STEPS, || {
        for _ in 0..STEPS {
            table.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&table);
        }
    });
    // SAFETY: `c.0` is a live cache.
    unsafe { ok(kvs_cache::kvs_cache_check(c.0)) };
    rows.push(Row {
        name: "decode_step_256_seqs",
        unit: "step",
        ns,
        floor_ns: floor,
        target_ns: 50_000.0,
    });

    // begin + free of a request sharing the 512-token system prompt (prompt 812 tokens).
    // SAFETY: `c.0` is a live cache; `p` holds `p.len()` tokens; NULL extra and info are allowed.
    let ns_bf = ns_per_unit(repeats, 100, || unsafe {
        for k in 0..100u64 {
            let mut p = system.clone();
            p.extend(tokens(10_000 + k, 300));
            ok(kvs_cache::kvs_seq_begin(
                c.0,
                1_000_000 + k,
                p.as_ptr(),
                p.len(),
                ptr::null(),
                p.len() - 1,
                ptr::null_mut(),
            ));
            ok(kvs_cache::kvs_seq_free(c.0, 1_000_000 + k));
        }
    });
    rows.push(Row {
        name: "begin_free_812_tokens",
        unit: "request",
        ns: ns_bf,
        floor_ns: f64::NAN,
        target_ns: f64::NAN,
    });
}

/// Host tier: two prompts that each fill the device take turns, so every begin demotes the other
/// prompt's pages to host and promotes its own back (copies drained each round), and every
/// index change is an event drained in batches.
fn tiers(repeats: usize, rows: &mut Vec<Row>) {
    const PAGES: usize = 256;
    const PS: usize = 16;
    let mut s = State::new(Config {
        page_size: PS as u32,
        num_device_pages: PAGES as u32,
        num_host_pages: 2 * PAGES as u32,
        enable_events: true,
        ..Config::default()
    })
    .unwrap();
    let a = tokens(1, PAGES * PS);
    let b = tokens(2, PAGES * PS);
    let mut id = 0u64;
    let mut round = |s: &mut State, p: &[i32]| {
        id += 1;
        s.begin(id, p, None, usize::MAX).unwrap();
        s.free(id).unwrap();
        std::hint::black_box(s.take_copies(usize::MAX));
    };
    round(&mut s, &a);
    round(&mut s, &b);
    s.take_events(usize::MAX);
    const ROUNDS: usize = 10;
    let before = s.stats().counters;
    let mut events = 0usize;
    let ns = ns_per_unit(repeats.min(11), ROUNDS * PAGES, || {
        for k in 0..ROUNDS {
            round(&mut s, if k % 2 == 0 { &a } else { &b });
            events += s.take_events(4096).len();
        }
    });
    let after = s.stats().counters;
    assert!(after.promotions > before.promotions && after.demotions > before.demotions);
    s.check().unwrap();
    // Floor: a device-only cache where the same rounds are plain misses (evict + allocate).
    let mut f = State::new(Config {
        page_size: PS as u32,
        num_device_pages: PAGES as u32,
        ..Config::default()
    })
    .unwrap();
    let mut fid = 0u64;
    let floor = ns_per_unit(repeats.min(11), ROUNDS * PAGES, || {
        for k in 0..ROUNDS {
            fid += 1;
            f.begin(fid, if k % 2 == 0 { &a } else { &b }, None, usize::MAX)
                .unwrap();
            f.free(fid).unwrap();
        }
    });
    rows.push(Row {
        name: "demote_promote_page",
        unit: "page",
        ns,
        floor_ns: floor,
        target_ns: f64::NAN,
    });
    // Per page and round: device Removed + host Stored (demotion) + device Stored (promotion).
    let per_page = events as f64 / (ROUNDS * PAGES) as f64 / (repeats.min(11) + 1) as f64;
    println!(
        "tiers: {per_page:.1} events per page moved, {:.1} M events/s of bookkeeping",
        per_page / ns * 1e3
    );
    rows.push(Row {
        name: "tiered_bookkeeping_per_event",
        unit: "event",
        ns: ns / per_page,
        floor_ns: f64::NAN,
        target_ns: f64::NAN,
    });
}

pub const USAGE: &str = "\
kvshare-bench manager: the cache manager's bookkeeping (allocate and release, prefix match, a
sequence's begin on a cached prompt, a decode step, the host tier), each against its floor
measured in the same run, with the targets met or not.

USAGE:
    kvshare-bench manager [OPTIONS]

OPTIONS:
    --quick               5 repeats instead of 31
    -h, --help            this text
";

/// Runs the manager benchmarks; `--quick` uses fewer repeats.
pub fn run(args: Vec<OsString>) -> Result<(), String> {
    use lexopt::Arg::{Long, Short, Value};
    let mut quick = false;
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = p.next().map_err(super::see_help)? {
        match arg {
            Long("quick") => quick = true,
            Long("help") | Short('h') => {
                print!("{USAGE}");
                return Ok(());
            }
            Value(v) => return Err(format!("unexpected argument {v:?} (see --help)")),
            other => return Err(format!("{} (see --help)", other.unexpected())),
        }
    }
    let repeats = if quick { 5 } else { 31 };
    let mut rows = Vec::new();
    alloc_release(repeats, &mut rows);
    prefix_match(repeats, 128, 10_000.0, &mut rows);
    prefix_match(repeats, 16, 30_000.0, &mut rows);
    begin_with_unit(repeats, 128, 128, "begin_4k_hit_ps128_u128", &mut rows);
    begin_with_unit(repeats, 128, 16, "begin_4k_hit_ps128_u16", &mut rows);
    begin_with_unit(repeats, 16, 16, "begin_4k_hit_ps16_u16", &mut rows);
    decode_step(repeats, &mut rows);
    tiers(repeats, &mut rows);

    println!(
        "{:<26} {:>12} {:>10} {:>12} {:>9} {:>10} {:>6}",
        "operation", "ns", "per", "floor ns", "x floor", "target ns", "met"
    );
    let mut json = String::from("{\"mode\":\"manager\"");
    for r in &rows {
        let met = if r.target_ns.is_nan() {
            "-"
        } else if r.ns <= r.target_ns {
            "yes"
        } else {
            "NO"
        };
        println!(
            "{:<26} {:>12.1} {:>10} {:>12.1} {:>9.2} {:>10.0} {:>6}",
            r.name,
            r.ns,
            r.unit,
            r.floor_ns,
            r.ns / r.floor_ns,
            r.target_ns,
            met
        );
        let num = |v: f64| {
            if v.is_finite() {
                format!("{v:.1}")
            } else {
                "null".into()
            }
        };
        json.push_str(&format!(
            ",\"{}\":{{\"ns_per_{}\":{},\"floor_ns\":{},\"ratio_to_floor\":{},\"target_ns\":{}}}",
            r.name,
            r.unit,
            num(r.ns),
            num(r.floor_ns),
            num(r.ns / r.floor_ns),
            num(r.target_ns)
        ));
    }
    json.push('}');
    println!("{json}");
    Ok(())
}
