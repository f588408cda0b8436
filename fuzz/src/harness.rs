//! The C-ABI campaign harness shared by the coverage-guided fuzzer (`fuzz/`, `cargo afl`) and the
//! soak test (`tests/soak.rs`): a structured operation language decoded from bytes with
//! `arbitrary`, driven through the exported `kvs_*` functions exactly as a C caller would (raw
//! pointers, lengths, out-params), checked after every operation against an independent model
//! and against `kvs_cache_check`.
//!
//! A program's setup picks the geometry and options (host tier, deferred commit, `match_unit`,
//! vLLM's reuse order, ...) and the KV-cache groups: one full-attention group, or full attention
//! next to a sliding window, chunked local attention or a state group (modes none, all, align),
//! some in a pool of their own page bytes. Every operation then runs on every group: begins
//! share hits across groups, appends copy on write in each, swaps, pins and prefetch move every
//! group's pages, and the page calls take a group.
//!
//! The model knows only what the API promises, not how the cache does it: which sequences live
//! and where (tier, token count), how many references the caller holds on each page of each
//! pool, which pins exist. From that it predicts statuses exactly where the contract fixes them
//! (an unknown id is `SEQ_NOT_FOUND`, a release past what the caller holds is
//! `REFCOUNT_UNDERFLOW` with nothing released, a fork never needs pages, NULL with a length is
//! `NULL_ARGUMENT`, a group index past the groups is `INVALID_ARGUMENT`, ...) and bounds them
//! where capacity decides (`OK` or `NO_SPACE`). After every operation: the checker, the stats'
//! sequence counts, each caller-held page in use with at least the caller's references, and the
//! shape of one live sequence. Any disagreement panics with the operation and the expected and
//! actual outcome, which the fuzzer records as a crash.

use std::collections::HashMap;
use std::ffi::CStr;
use std::ptr::{null, null_mut};

use arbitrary::{Arbitrary, Unstructured};
use kvshare::cache::{kvs_cache, kvs_config, kvs_stats, KVS_WINDOW_RETENTION_BOUNDARIES};
use kvshare::enums::{kvs_eviction_policy, kvs_group_kind, kvs_state_mode, kvs_status};
use kvshare::events::kvs_event;
use kvshare::groups::{kvs_group, kvs_group_info, KVS_GROUP_EAGLE, KVS_NULL_PAGE};
use kvshare::pages::kvs_page_info;
use kvshare::seq::kvs_seq_info;
use kvshare::types::kvs_copy;

/// Geometry, small so that pages run out, evictions and copies happen often.
#[derive(Debug, Arbitrary)]
pub struct Setup {
    page_size: u8,
    device_pages: u8,
    host_pages: u8,
    caching: bool,
    null_page: bool,
    defer_commit: bool,
    skip_cached_writes: bool,
    demote: bool,
    events: bool,
    /// The groups (see `groups_of`).
    layout: u8,
    /// `match_unit`: 0, 1, half a page or a page.
    unit: u8,
    vllm_free_order: bool,
    /// `eviction_policy` (kvshare's order only; vLLM's is LRU).
    policy: u8,
}

/// Page bytes of a group with a pool of its own (any value other than the geometry's).
const OWN_POOL_BYTES: u64 = 12_345;

/// The groups of `layout`: half the programs one full-attention group (`groups` NULL), the rest
/// full attention next to another kind, some in a pool of their own; full attention next to a
/// sliding window is EAGLE's (both groups, or the window only) in some.
fn groups_of(layout: u8, ps: u32, caching: bool) -> Vec<kvs_group> {
    let g = |kind: kvs_group_kind, window: u32, page_bytes: u64| kvs_group {
        kind: kind as u32,
        window,
        page_bytes,
        flags: 0,
    };
    let full = g(kvs_group_kind::Full, 0, 0);
    let mode = match (caching, layout & 8 != 0) {
        (false, _) => kvs_state_mode::None,
        (true, false) => kvs_state_mode::All,
        (true, true) => kvs_state_mode::Align,
    };
    match layout % 8 {
        4 => {
            let mut v = vec![
                full,
                g(
                    kvs_group_kind::SlidingWindow,
                    1 + ps + u32::from(layout >> 4 & 7),
                    0,
                ),
            ];
            if layout & 0x80 != 0 {
                v[1].flags = KVS_GROUP_EAGLE;
                v[0].flags = u32::from(layout & 0x40 != 0) * KVS_GROUP_EAGLE;
            }
            v
        }
        5 => vec![full, g(kvs_group_kind::ChunkedLocal, 2 * ps, 0)],
        6 => vec![full, g(kvs_group_kind::State, mode as u32, OWN_POOL_BYTES)],
        7 => vec![
            full,
            g(kvs_group_kind::SlidingWindow, 3, OWN_POOL_BYTES),
            g(kvs_group_kind::State, mode as u32, 0),
        ],
        _ => Vec::new(),
    }
}

/// One call. Ids and page indices are small so that operations meet each other.
#[derive(Debug, Arbitrary)]
pub enum Op {
    Begin {
        id: u8,
        len: u8,
        vocab: u8,
        max_match: u8,
    },
    Append {
        id: u8,
        len: u8,
        vocab: u8,
        lookahead: u8,
    },
    AppendBatch {
        ids: Vec<u8>,
        vocab: u8,
    },
    Fork {
        parent: u8,
        child: u8,
    },
    /// `kvs_seq_free`, or `kvs_seq_free_deferred` (vLLM 0.32's deferred free).
    Free {
        id: u8,
        deferred: bool,
    },
    SwapOut {
        id: u8,
    },
    SwapIn {
        id: u8,
    },
    SetPriority {
        id: u8,
        priority: u8,
    },
    Alloc {
        n: u8,
        group: u8,
    },
    /// Acquire pages the caller holds (`held` indices) and raw ids (`raw`, maybe bad).
    Acquire {
        held: Vec<u8>,
        raw: Vec<u16>,
        group: u8,
    },
    /// Release pages by index into what the caller holds, possibly more often than held.
    Release {
        held: Vec<u8>,
        raw: Vec<u16>,
        group: u8,
    },
    Register {
        held: Vec<u8>,
        len: u8,
        vocab: u8,
        group: u8,
    },
    /// Drop the index entries of pages the caller holds and of arbitrary ids (some past the
    /// pool or the padding page: the call is then refused as a whole).
    Unregister {
        held: Vec<u8>,
        raw: Vec<u16>,
        group: u8,
    },
    Match {
        len: u8,
        vocab: u8,
        max: u8,
        acquire: bool,
        room: u8,
        group: u8,
    },
    Pin {
        len: u8,
        vocab: u8,
    },
    Unpin {
        index: u8,
    },
    Prefetch {
        len: u8,
        vocab: u8,
    },
    Commit,
    Clear,
    TakeCopies {
        room: u8,
    },
    TakeEvents {
        room: u8,
    },
    PageInfo {
        page: u16,
        tier: u8,
        group: u8,
    },
    /// Bad pointers: a NULL buffer with a length, a bad tier, a NULL out-param, a bad group.
    BadPointers {
        which: u8,
        len: u8,
    },
    /// `kvs_seq_release_skipped` at the sequence's token count, or `back` below it.
    ReleaseSkipped {
        id: u8,
        back: u8,
    },
    /// `kvs_seq_set_computed` at the sequence's token count plus one (refused) down to three
    /// below it.
    SetComputed {
        id: u8,
        back: u8,
    },
    /// `kvs_seq_set_retention` with `n % 6` boundaries (5: refused) derived from `at`, near the
    /// sequence's token count.
    SetRetention {
        id: u8,
        n: u8,
        at: u16,
    },
    NewStep,
    StatePage {
        id: u8,
        group: u8,
    },
    /// `kvs_prefix_find`, with a pages buffer of `room` pages per group (`room` 0: none).
    Find {
        len: u8,
        vocab: u8,
        max: u8,
        room: u8,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    Device,
    Host,
}

#[derive(Debug)]
struct ModelSeq {
    tokens: usize,
    tier: Tier,
}

/// What the API promises, tracked independently of the cache.
#[derive(Debug, Default)]
struct Model {
    seqs: HashMap<u64, ModelSeq>,
    /// References the caller holds through the page API, per `(pool, device page)`.
    held: HashMap<(u32, u32), u32>,
    pins: Vec<u64>,
}

impl Model {
    /// The pages of `pool` the caller holds, sorted.
    fn held_list(&self, pool: u32) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .held
            .keys()
            .filter(|k| k.0 == pool)
            .map(|k| k.1)
            .collect();
        v.sort_unstable();
        v
    }
    fn hold(&mut self, pool: u32, page: u32, n: u32) {
        *self.held.entry((pool, page)).or_default() += n;
    }
}

/// Tokens drawn from a small vocabulary derived from the op's bytes, so that prompts share
/// prefixes (vocab 0: one repeated token; a few: long shared prefixes).
fn tokens(len: u8, vocab: u8, salt: u64) -> Vec<i32> {
    let v = u64::from(vocab % 4) + 1;
    (0..u64::from(len) % 40)
        .map(|i| ((i.wrapping_mul(salt | 1) / 3) % v) as i32)
        .collect()
}

fn status_name(s: kvs_status) -> String {
    unsafe { CStr::from_ptr(kvs_status::kvs_status_str(s as u32)) }
        .to_string_lossy()
        .into_owned()
}

fn last_error() -> String {
    unsafe { CStr::from_ptr(kvs_status::kvs_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

struct Run {
    c: *mut kvs_cache,
    ps: usize,
    /// The granularity of a prefix hit: `match_unit` when below the page, else the page.
    unit: usize,
    dev_pages: u32,
    /// Per group: its pool and whether it is a state group.
    pools: Vec<u32>,
    state: Vec<bool>,
    /// A state group in mode align: appends take no lookahead slots.
    align: bool,
    /// Sparse window retention: sequences take retention boundaries.
    sparse: bool,
    model: Model,
    op: String,
}

impl Run {
    #[track_caller]
    fn expect(&self, got: kvs_status, allowed: &[kvs_status]) {
        if !allowed.contains(&got) {
            let want: Vec<String> = allowed.iter().map(|&s| status_name(s)).collect();
            panic!(
                "{}: got {} ({}), want one of {want:?}",
                self.op,
                status_name(got),
                last_error()
            );
        }
    }

    fn seq_info(&self, id: u64) -> Result<kvs_seq_info, kvs_status> {
        let mut info = kvs_seq_info {
            num_tokens: 0,
            num_pages: 0,
            matched_tokens: 0,
            new_pages: 0,
            promoted_pages: 0,
            tier: 9,
        };
        let st = unsafe { kvs_cache::kvs_seq_get_info(self.c, id, &mut info) };
        if st == kvs_status::Ok {
            Ok(info)
        } else {
            Err(st)
        }
    }

    /// Number of groups.
    fn ng(&self) -> usize {
        self.pools.len()
    }

    /// Pages for a page call: up to `max_held` of the pages the caller holds in `pool` (each
    /// drawn index taken modulo the held list), then up to `max_raw` arbitrary page ids, some
    /// past the pool.
    fn pick_pages(
        &self,
        pool: u32,
        held: &[u8],
        max_held: usize,
        raw: &[u16],
        max_raw: usize,
    ) -> Vec<u32> {
        let list = self.model.held_list(pool);
        let mut pages: Vec<u32> = held
            .iter()
            .take(max_held)
            .filter_map(|&i| list.get(usize::from(i) % list.len().max(1)).copied())
            .collect();
        pages.extend(
            raw.iter()
                .take(max_raw)
                .map(|&r| u32::from(r) % (self.dev_pages + 2)),
        );
        pages
    }

    /// The group `raw` picks.
    fn group(&self, raw: u8) -> usize {
        usize::from(raw) % self.ng()
    }

    /// A group of `pool` (the page calls of a pool's pages may name any of its groups).
    fn group_of_pool(&self, pool: u32) -> usize {
        self.pools.iter().position(|&p| p == pool).unwrap()
    }

    /// Every copy names a group of the cache.
    fn check_copies(&self, copies: &[kvs_copy]) {
        for c in copies {
            assert!((c.group as usize) < self.ng(), "{}: copy {c:?}", self.op);
        }
    }

    fn page_info(&self, tier: u32, group: usize, page: u32) -> Result<kvs_page_info, kvs_status> {
        let mut info = kvs_page_info {
            refcount: 0,
            state: 9,
            registered: false,
        };
        let st = unsafe { kvs_cache::kvs_page_get_info(self.c, tier, group, page, &mut info) };
        if st == kvs_status::Ok {
            Ok(info)
        } else {
            Err(st)
        }
    }

    /// The invariants checked after every operation.
    fn check(&self, step: usize) {
        let st = unsafe { kvs_cache::kvs_cache_check(self.c) };
        assert_eq!(
            st,
            kvs_status::Ok,
            "{}: kvs_cache_check: {}",
            self.op,
            last_error()
        );
        let mut s = std::mem::MaybeUninit::<kvs_stats>::zeroed();
        let st = unsafe { kvs_cache::kvs_cache_stats(self.c, s.as_mut_ptr()) };
        assert_eq!(st, kvs_status::Ok);
        let s = unsafe { s.assume_init() };
        let swapped = self
            .model
            .seqs
            .values()
            .filter(|q| q.tier == Tier::Host)
            .count();
        assert_eq!(
            (s.num_seqs, s.num_seqs_swapped),
            (self.model.seqs.len() as u64, swapped as u64),
            "{}: sequence counts",
            self.op
        );
        for (&(pool, page), &n) in &self.model.held {
            let info = self
                .page_info(0, self.group_of_pool(pool), page)
                .unwrap_or_else(|e| panic!("{}: page_info({page}): {e:?}", self.op));
            assert!(
                info.state == 2 && info.refcount >= n,
                "{}: page {page} held {n} times by the caller: refcount {}, state {}",
                self.op,
                info.refcount,
                info.state
            );
        }
        // One live sequence's shape, rotating through them.
        if !self.model.seqs.is_empty() {
            let mut ids: Vec<&u64> = self.model.seqs.keys().collect();
            ids.sort_unstable();
            let id = *ids[step % ids.len()];
            let m = &self.model.seqs[&id];
            let info = self
                .seq_info(id)
                .unwrap_or_else(|e| panic!("{}: seq_info({id}): {e:?}", self.op));
            let tier = match m.tier {
                Tier::Device => 0,
                Tier::Host => 1,
            };
            assert_eq!(
                (info.num_tokens, info.tier),
                (m.tokens as u64, tier),
                "{}: sequence {id}",
                self.op
            );
            assert!(info.num_pages as usize >= m.tokens.div_ceil(self.ps));
        }
    }

    /// `kvs_seq_begin`, or `kvs_seq_begin_computed` when `computed` tokens are computed
    /// elsewhere (refused with a state group).
    fn begin(&mut self, id: u64, toks: &[i32], max_match: usize, computed: usize) {
        let mut info = std::mem::MaybeUninit::<kvs_seq_info>::zeroed();
        let (t, n, out) = (toks.as_ptr(), toks.len(), info.as_mut_ptr());
        let st = unsafe {
            if computed == 0 {
                kvs_cache::kvs_seq_begin(self.c, id, t, n, null(), max_match, 0, out)
            } else {
                kvs_cache::kvs_seq_begin_computed(
                    self.c,
                    id,
                    t,
                    n,
                    null(),
                    max_match,
                    0,
                    computed,
                    out,
                )
            }
        };
        if self.model.seqs.contains_key(&id) {
            return self.expect(st, &[kvs_status::SeqExists]);
        }
        if computed > 0 && self.state.iter().any(|&s| s) {
            return self.expect(st, &[kvs_status::InvalidArgument]);
        }
        self.expect(st, &[kvs_status::Ok, kvs_status::NoSpace]);
        if st == kvs_status::Ok {
            let info = unsafe { info.assume_init() };
            assert_eq!(info.num_tokens as usize, toks.len(), "{}", self.op);
            assert_eq!(info.num_pages as usize, toks.len().div_ceil(self.ps));
            assert!(info.matched_tokens as usize <= max_match.min(toks.len()));
            self.model.seqs.insert(
                id,
                ModelSeq {
                    tokens: toks.len(),
                    tier: Tier::Device,
                },
            );
        }
    }

    fn seq_status(&self, id: u64, need: Tier) -> Option<kvs_status> {
        match self.model.seqs.get(&id) {
            None => Some(kvs_status::SeqNotFound),
            Some(s) if s.tier != need => Some(kvs_status::SeqWrongTier),
            Some(_) => None,
        }
    }

    /// One swap call (`kvs_seq_swap_out` / `kvs_seq_swap_in`) of sequence `id % 16`, which the
    /// model must hold in tier `from`; on success the model moves it to `to`.
    fn swap(
        &mut self,
        id: u8,
        from: Tier,
        to: Tier,
        call: unsafe extern "C" fn(
            *mut kvs_cache,
            u64,
            *mut kvs_copy,
            usize,
            *mut usize,
        ) -> kvs_status,
        copies: &mut [kvs_copy],
        ncopies: &mut usize,
    ) {
        let id = u64::from(id % 16);
        // SAFETY: `self.c` is the live cache this harness owns; `copies` is a writable buffer of
        // `copies.len()` entries and `ncopies` a valid out-pointer, both outliving the call.
        let st = unsafe { call(self.c, id, copies.as_mut_ptr(), copies.len(), ncopies) };
        if let Some(want) = self.seq_status(id, from) {
            return self.expect(st, &[want]);
        }
        self.expect(
            st,
            &[
                kvs_status::Ok,
                kvs_status::NoSpace,
                kvs_status::BufferTooSmall,
            ],
        );
        if st == kvs_status::Ok {
            self.check_copies(&copies[..*ncopies]);
            self.model.seqs.get_mut(&id).unwrap().tier = to;
        }
    }
}

#[path = "harness_apply.rs"]
mod apply;

/// Runs one program: a setup then operations until the bytes run out (at most `max_ops`).
/// Returns the operations executed; panics on any disagreement.
pub fn run(data: &[u8], max_ops: usize) -> usize {
    let mut u = Unstructured::new(data);
    let Ok(setup) = Setup::arbitrary(&mut u) else {
        return 0;
    };
    let trace = std::env::var_os("KVS_TRACE").is_some();
    if trace {
        eprintln!("{setup:?}");
    }
    let mut cfg: kvs_config = kvs_cache::kvs_config_default();
    cfg.page_size = [1, 2, 4, 16][usize::from(setup.page_size % 4)];
    cfg.num_device_pages = 2 + u32::from(setup.device_pages % 40);
    cfg.num_host_pages = u32::from(setup.host_pages % 24);
    cfg.enable_prefix_caching = setup.caching;
    cfg.reserve_null_page = setup.null_page;
    cfg.defer_commit = setup.defer_commit && setup.caching;
    cfg.skip_cached_writes = setup.skip_cached_writes;
    cfg.demote_to_host = setup.demote;
    cfg.enable_events = setup.events;
    cfg.vllm_free_order = setup.vllm_free_order;
    // vLLM 0.32's order (uncached pages first) or 0.23's; the policy byte picks (unused there).
    cfg.vllm_uncached_first = setup.vllm_free_order && setup.policy & 1 == 1;
    // Window retention: dense, boundaries only, or segments of 1 or 3 pages (the policy
    // byte's high bits).
    cfg.window_retention =
        [0, KVS_WINDOW_RETENTION_BOUNDARIES, 1, 3][usize::from(setup.policy >> 4 & 3)];
    cfg.eviction_policy = if setup.vllm_free_order {
        kvs_eviction_policy::Lru as u32
    } else {
        u32::from(setup.policy % 3)
    };
    let groups = groups_of(setup.layout, cfg.page_size, setup.caching);
    let state = |g: &kvs_group| g.kind == kvs_group_kind::State as u32;
    let has_state = groups.iter().any(state);
    let eagle = groups.iter().any(|g| g.flags & KVS_GROUP_EAGLE != 0);
    // Every kind but full attention shows the null page at released positions; state groups
    // keep checkpoints at page boundaries only.
    cfg.reserve_null_page |= !groups.is_empty();
    cfg.match_unit = match setup.unit % 4 {
        // An EAGLE hit ends a page early: whole pages only.
        _ if has_state || eagle => 0,
        1 => 1,
        2 => cfg.page_size / 2,
        3 => cfg.page_size,
        _ => 0,
    };
    cfg.groups = if groups.is_empty() {
        null()
    } else {
        groups.as_ptr()
    };
    cfg.num_groups = groups.len();
    let mut c = null_mut();
    let st = unsafe { kvs_cache::kvs_cache_new(&cfg, &mut c) };
    assert_eq!(st, kvs_status::Ok, "kvs_cache_new: {}", last_error());
    let ng = groups.len().max(1);
    let mut pools = Vec::with_capacity(ng);
    for g in 0..ng {
        // SAFETY: kvs_group_info is plain data; all-zero is a valid value.
        let mut info: kvs_group_info = unsafe { std::mem::zeroed() };
        let st = unsafe { kvs_cache::kvs_cache_group_info(c, g, &mut info) };
        assert_eq!(st, kvs_status::Ok, "kvs_cache_group_info: {}", last_error());
        assert_eq!(info.num_groups as usize, ng);
        pools.push(info.pool);
    }
    let mode_align = |g: &kvs_group| state(g) && g.window == kvs_state_mode::Align as u32;
    let mut run = Run {
        c,
        ps: cfg.page_size as usize,
        unit: match cfg.match_unit {
            0 => cfg.page_size as usize,
            u => u.min(cfg.page_size) as usize,
        },
        dev_pages: cfg.num_device_pages,
        sparse: cfg.window_retention != 0,
        pools,
        state: (0..ng).map(|g| groups.get(g).is_some_and(state)).collect(),
        align: groups.iter().any(mode_align),
        model: Model::default(),
        op: String::new(),
    };
    let mut done = 0;
    while done < max_ops {
        let Ok(op) = Op::arbitrary(&mut u) else { break };
        run.op = format!("op {done}: {op:?}");
        if trace {
            eprintln!("{}", run.op);
        }
        run.apply(&op);
        done += 1;
        run.check(done);
        if u.is_empty() {
            break;
        }
    }
    // Tear down through the API: everything the model says is held can be given back.
    for ((pool, p), n) in std::mem::take(&mut run.model.held) {
        let pages = vec![p; n as usize];
        let g = run.group_of_pool(pool);
        let st = unsafe { kvs_cache::kvs_pages_release(run.c, g, pages.as_ptr(), pages.len()) };
        assert_eq!(
            st,
            kvs_status::Ok,
            "final release of page {p}: {}",
            last_error()
        );
    }
    for id in std::mem::take(&mut run.model.seqs).into_keys() {
        assert_eq!(
            unsafe { kvs_cache::kvs_seq_free(run.c, id) },
            kvs_status::Ok
        );
    }
    for id in std::mem::take(&mut run.model.pins) {
        assert_eq!(
            unsafe { kvs_cache::kvs_prefix_unpin(run.c, id) },
            kvs_status::Ok
        );
    }
    // A queued sub-page copy holds its source page until the engine takes it.
    // SAFETY: kvs_copy is plain data; all-zero is a valid value.
    let mut copies: Vec<kvs_copy> = (0..64).map(|_| unsafe { std::mem::zeroed() }).collect();
    loop {
        let mut n = 0;
        let st = unsafe {
            kvs_cache::kvs_cache_take_copies(run.c, copies.as_mut_ptr(), copies.len(), &mut n)
        };
        assert_eq!(st, kvs_status::Ok);
        if n == 0 {
            break;
        }
    }
    let mut s = std::mem::MaybeUninit::<kvs_stats>::zeroed();
    assert_eq!(
        unsafe { kvs_cache::kvs_cache_stats(run.c, s.as_mut_ptr()) },
        kvs_status::Ok
    );
    let s = unsafe { s.assume_init() };
    assert_eq!(
        (s.device_pages_in_use, s.host_pages_in_use, s.num_seqs),
        (0, 0, 0),
        "pages still in use after everything was released"
    );
    assert_eq!(unsafe { kvs_cache::kvs_cache_check(run.c) }, kvs_status::Ok);
    unsafe { kvs_cache::kvs_cache_free(run.c) };
    done
}
