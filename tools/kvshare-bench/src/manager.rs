//! `kvshare-bench manager`: cache-manager bookkeeping costs, through the C ABI (what an engine
//! pays, lock and checks included) and the Rust core, each beside a floor measured in the same run.
//!
//! The manager serves one KV-cache group or several, so the benchmark runs each sequence
//! operation on two models: a plain one (one full-attention group) against its floor, and a
//! hybrid one (a full-attention group and a sliding-window group sharing one pool, the shape of
//! Gemma 3 and gpt-oss) whose row's floor is the plain model's figure from the same run: its
//! "x floor" is what the second group costs.

use std::ffi::OsString;
use std::ptr;

use kvshare::cache::{kvs_cache, kvs_config};
use kvshare::enums::{kvs_group_kind, kvs_status};
use kvshare::groups::kvs_group;
use kvshare::seq::kvs_seq_info;
use kvshare::types::kvs_copy;
use kvshare_core::{Config, GroupKind, GroupSpec, State};
use xxhash_rust::xxh3::xxh3_128;

use crate::timing::ns_per_unit;

mod policies;
mod steps;
use policies::policy_rows;
use steps::{decode_rows, tiers};

fn ok(s: kvs_status) {
    assert_eq!(s, kvs_status::Ok, "kvshare call failed");
}

/// Tokens of the hybrid model's sliding window (gpt-oss's; short enough that the prompts here
/// span several windows, so the window group releases pages).
const WINDOW: u32 = 128;

/// The model a cache is configured for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Model {
    /// One full-attention group (a cache configured without groups).
    Plain,
    /// A full-attention group and a sliding-window group of [`WINDOW`] tokens, one pool.
    Hybrid,
}

/// The hybrid model's groups, as the C API takes them.
const HYBRID_GROUPS: [kvs_group; 2] = [
    kvs_group {
        kind: kvs_group_kind::Full as u32,
        window: 0,
        page_bytes: 0,
        flags: 0,
    },
    kvs_group {
        kind: kvs_group_kind::SlidingWindow as u32,
        window: WINDOW,
        page_bytes: 0,
        flags: 0,
    },
];

impl Model {
    /// The groups of the C config (none for the plain model: one full group).
    fn c_groups(self) -> &'static [kvs_group] {
        match self {
            Model::Plain => &[],
            Model::Hybrid => &HYBRID_GROUPS,
        }
    }

    /// The groups of the core config.
    fn core_groups(self) -> Vec<GroupSpec> {
        match self {
            Model::Plain => Vec::new(),
            Model::Hybrid => vec![
                GroupSpec::FULL,
                GroupSpec {
                    kind: GroupKind::SlidingWindow(WINDOW),
                    page_bytes: 0,
                    eagle: false,
                },
            ],
        }
    }

    /// Groups the model has.
    fn num_groups(self) -> usize {
        self.c_groups().len().max(1)
    }

    /// A group that releases pages needs the null page; the plain model keeps the default.
    fn reserve_null_page(self) -> bool {
        self == Model::Hybrid
    }
}

struct CCache(*mut kvs_cache);

impl CCache {
    fn new(page_size: u32, pages: u32) -> Self {
        Self::build(Model::Plain, page_size, 0, pages)
    }

    fn build(model: Model, page_size: u32, match_unit: u32, pages: u32) -> Self {
        let mut cfg: kvs_config = kvs_cache::kvs_config_default();
        cfg.page_size = page_size;
        cfg.match_unit = match_unit;
        cfg.num_device_pages = pages;
        cfg.reserve_null_page = model.reserve_null_page();
        let groups = model.c_groups();
        cfg.groups = if groups.is_empty() {
            ptr::null()
        } else {
            groups.as_ptr()
        };
        cfg.num_groups = groups.len();
        let mut c = ptr::null_mut();
        // SAFETY: `cfg`, the `'static` groups it points to and `c` are live, readable / writable
        // for the call (the cache copies the groups).
        unsafe { ok(kvs_cache::kvs_cache_new(&cfg, &mut c)) };
        CCache(c)
    }

    /// `kvs_seq_begin` of `tokens` as sequence `id`, matching at most `max_match` tokens.
    fn begin(&self, id: u64, tokens: &[i32], max_match: usize) -> kvs_seq_info {
        let mut info = kvs_seq_info::default();
        // SAFETY: `self.0` is a live cache; `tokens` is passed with its length; NULL extra is
        // allowed; `info` is a live out location.
        unsafe {
            ok(kvs_cache::kvs_seq_begin(
                self.0,
                id,
                tokens.as_ptr(),
                tokens.len(),
                ptr::null(),
                max_match,
                0,
                &mut info,
            ))
        };
        info
    }

    /// `kvs_seq_free` of sequence `id`.
    fn free(&self, id: u64) {
        // SAFETY: `self.0` is a live cache.
        unsafe { ok(kvs_cache::kvs_seq_free(self.0, id)) };
    }

    /// `kvs_cache_check`: the invariant checker.
    fn check(&self) {
        // SAFETY: `self.0` is a live cache.
        unsafe { ok(kvs_cache::kvs_cache_check(self.0)) };
    }
}

impl Drop for CCache {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from `kvs_cache_new` (`CCache::build` asserted success), is freed
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

/// One xxh3-128 pass over the bytes of `prompt`, per call: any hashing matcher reads them once.
fn hash_floor(repeats: usize, prompt: &[i32]) -> f64 {
    let bytes: Vec<u8> = prompt.iter().flat_map(|t| t.to_le_bytes()).collect();
    ns_per_unit(repeats, 100, || {
        for _ in 0..100 {
            std::hint::black_box(xxh3_128(std::hint::black_box(&bytes)));
        }
    })
}

struct Row {
    name: &'static str,
    unit: &'static str,
    ns: f64,
    floor_ns: f64,
    target_ns: f64,
}

impl Row {
    /// A hybrid-model row: its floor is the plain model's figure for the same operation.
    fn hybrid(name: &'static str, unit: &'static str, ns: f64, plain_ns: f64) -> Row {
        Row {
            name,
            unit,
            ns,
            floor_ns: plain_ns,
            target_ns: f64::NAN,
        }
    }
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
                0,
                BATCH,
                pages.as_mut_ptr(),
                BATCH,
            ));
            ok(kvs_cache::kvs_pages_release(c.0, 0, pages.as_ptr(), BATCH));
        }
    });
    let mut s = State::new(Config {
        num_device_pages: 4096,
        ..Config::default()
    })
    .unwrap();
    let ns_core = ns_per_unit(repeats, BATCH * ROUNDS, || {
        for _ in 0..ROUNDS {
            let p = s.alloc_pages(0, BATCH).unwrap();
            s.release_pages(0, &p).unwrap();
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
    c.begin(1, &prompt, usize::MAX);
    c.free(1);
    let mut pages = vec![0u32; N];
    let (mut np, mut nt) = (0usize, 0usize);
    // SAFETY: `c.0` is a live cache; `prompt` holds N tokens and `pages` N ids, the lengths
    // passed with them; `np`/`nt` are live out locations; the released ids are the `np` just
    // matched (and pinned).
    let ns = ns_per_unit(repeats, 100, || unsafe {
        for _ in 0..100 {
            ok(kvs_cache::kvs_prefix_match(
                c.0,
                0,
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
            ok(kvs_cache::kvs_pages_release(c.0, 0, pages.as_ptr(), np));
        }
    });
    assert_eq!(nt, N, "the whole prompt must match");
    let name = if page_size == 128 {
        "match_4096_tokens_ps128"
    } else {
        "match_4096_tokens_ps16"
    };
    rows.push(Row {
        name,
        unit: "call",
        ns,
        floor_ns: hash_floor(repeats, &prompt),
        target_ns,
    });
}

/// `kvs_prefix_find` (the read-only hit every group can serve, each group's pages of it) of a
/// cached 4096-token prompt, page 16: (ns per call, matched tokens).
fn prefix_find(repeats: usize, model: Model) -> (f64, usize) {
    const N: usize = 4096;
    const PS: usize = 16;
    let c = CCache::build(model, PS as u32, 0, 8192);
    let prompt = tokens(7, N);
    c.begin(1, &prompt, usize::MAX);
    c.free(1);
    let per_group = N / PS;
    let mut pages = vec![0u32; model.num_groups() * per_group];
    let mut nt = 0usize;
    // SAFETY: `c.0` is a live cache; `prompt` holds N tokens and `pages` `num_groups` rows of
    // `per_group` ids, the lengths passed with them; `nt` is a live out location.
    let ns = ns_per_unit(repeats, 100, || unsafe {
        for _ in 0..100 {
            ok(kvs_cache::kvs_prefix_find(
                c.0,
                prompt.as_ptr(),
                N,
                ptr::null(),
                usize::MAX,
                pages.as_mut_ptr(),
                pages.len(),
                per_group,
                &mut nt,
            ));
        }
    });
    std::hint::black_box(&pages);
    (ns, nt)
}

/// The plain and the hybrid model's `kvs_prefix_find` rows.
fn prefix_find_rows(repeats: usize, rows: &mut Vec<Row>) {
    let (plain, n_plain) = prefix_find(repeats, Model::Plain);
    let (hybrid, n_hybrid) = prefix_find(repeats, Model::Hybrid);
    assert_eq!(n_plain, 4096, "the whole prompt must be found");
    // The window group keeps the prompt's last window cached, so it serves the whole hit too.
    assert_eq!(n_hybrid, n_plain, "the hybrid hit must match the plain one");
    rows.push(Row {
        name: "find_4096_tokens_ps16",
        unit: "call",
        ns: plain,
        floor_ns: hash_floor(repeats, &tokens(7, 4096)),
        target_ns: f64::NAN,
    });
    rows.push(Row::hybrid(
        "find_4096_tokens_ps16_hybrid",
        "call",
        hybrid,
        plain,
    ));
}

/// A request whose 4041-token prompt repeats the first 4040 tokens of a cached 4096-token one:
/// `kvs_seq_begin` (the prefix walk, plus the unit lookup inside the page where the match ends),
/// draining its copies, `kvs_seq_free`; ns per call. Page 128 / unit 16 and page 16 / unit 16
/// match 4032 tokens, page 128 / unit 128 matches 3968; each allocates one page per group.
fn begin_with_unit(repeats: usize, model: Model, page_size: u32, unit: u32) -> f64 {
    const N: usize = 4096;
    const Q: usize = 4041;
    let c = CCache::build(model, page_size, unit, 8192);
    let cached = tokens(7, N);
    let mut prompt = cached[..Q - 1].to_vec();
    prompt.push(-7 & 0x7fff_ffff);
    c.begin(1, &cached, usize::MAX);
    c.free(1);
    let mut copies = [kvs_copy {
        src_page: 0,
        dst_page: 0,
        num_tokens: 0,
        kind: 0,
        group: 0,
    }; 4];
    let mut n = 0usize;
    let mut info = kvs_seq_info::default();
    let ns = ns_per_unit(repeats, 100, || {
        for _ in 0..100 {
            info = c.begin(2, &prompt, usize::MAX);
            // SAFETY: `c.0` is a live cache; `copies` is passed with its length; `n` is a live
            // out location.
            unsafe {
                ok(kvs_cache::kvs_cache_take_copies(
                    c.0,
                    copies.as_mut_ptr(),
                    copies.len(),
                    &mut n,
                ))
            };
            c.free(2);
        }
    });
    let whole = (Q - 1) / page_size as usize * page_size as usize;
    let expect = whole + ((Q - 1 - whole) / unit as usize) * unit as usize;
    assert_eq!(
        info.matched_tokens as usize, expect,
        "{model:?} page {page_size} unit {unit}"
    );
    c.check();
    ns
}

/// The `begin_with_unit` rows: the plain model's three page / unit shapes against one hash pass
/// over the prompt, and the hybrid model's page 16 against the plain one.
fn begin_rows(repeats: usize, rows: &mut Vec<Row>) {
    let floor = hash_floor(repeats, &tokens(7, 4040));
    for (page_size, unit, name) in [
        (128, 128, "begin_4k_hit_ps128_u128"),
        (128, 16, "begin_4k_hit_ps128_u16"),
        (16, 16, "begin_4k_hit_ps16_u16"),
    ] {
        rows.push(Row {
            name,
            unit: "call",
            ns: begin_with_unit(repeats, Model::Plain, page_size, unit),
            floor_ns: floor,
            target_ns: f64::NAN,
        });
    }
    let plain = rows.last().map_or(f64::NAN, |r| r.ns);
    let hybrid = begin_with_unit(repeats, Model::Hybrid, 16, 16);
    rows.push(Row::hybrid(
        "begin_4k_hit_ps16_u16_hybrid",
        "call",
        hybrid,
        plain,
    ));
}

pub const USAGE: &str = "\
kvshare-bench manager: the cache manager's bookkeeping (allocate and release, prefix match and
find, a sequence's begin on a cached prompt, a decode step, the host tier), each against its
floor measured in the same run, with the targets met or not. Each sequence operation also runs
on a hybrid model (a full-attention group and a 128-token sliding-window group, one pool), whose
rows (*_hybrid) take the plain model's figure as their floor; each eviction policy's cost per page
under pressure (begin_free_page_*) takes LRU's as its floor.

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
    prefix_find_rows(repeats, &mut rows);
    begin_rows(repeats, &mut rows);
    decode_rows(repeats, &mut rows);
    tiers(repeats, &mut rows);
    policy_rows(repeats, quick, &mut rows);

    println!(
        "{:<30} {:>12} {:>10} {:>12} {:>9} {:>10} {:>6}",
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
            "{:<30} {:>12.1} {:>10} {:>12.1} {:>9.2} {:>10.0} {:>6}",
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
