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
use kvshare::cache::{kvs_cache, kvs_config, kvs_stats};
use kvshare::enums::{kvs_eviction_policy, kvs_group_kind, kvs_state_mode, kvs_status};
use kvshare::events::kvs_event;
use kvshare::groups::{kvs_group, kvs_group_info, KVS_NULL_PAGE};
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
/// full attention next to another kind, some in a pool of their own.
fn groups_of(layout: u8, ps: u32, caching: bool) -> Vec<kvs_group> {
    let g = |kind: kvs_group_kind, window: u32, page_bytes: u64| kvs_group {
        kind: kind as u32,
        window,
        page_bytes,
    };
    let full = g(kvs_group_kind::Full, 0, 0);
    let mode = match (caching, layout & 8 != 0) {
        (false, _) => kvs_state_mode::None,
        (true, false) => kvs_state_mode::All,
        (true, true) => kvs_state_mode::Align,
    };
    match layout % 8 {
        4 => vec![
            full,
            g(
                kvs_group_kind::SlidingWindow,
                1 + ps + u32::from(layout >> 4),
                0,
            ),
        ],
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
    Free {
        id: u8,
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
    dev_pages: u32,
    /// Per group: its pool and whether it is a state group.
    pools: Vec<u32>,
    state: Vec<bool>,
    /// A state group in mode align: appends take no lookahead slots.
    align: bool,
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

    fn begin(&mut self, id: u64, toks: &[i32], max_match: usize) {
        let mut info = std::mem::MaybeUninit::<kvs_seq_info>::zeroed();
        let st = unsafe {
            kvs_cache::kvs_seq_begin(
                self.c,
                id,
                toks.as_ptr(),
                toks.len(),
                null(),
                max_match,
                0,
                info.as_mut_ptr(),
            )
        };
        if self.model.seqs.contains_key(&id) {
            return self.expect(st, &[kvs_status::SeqExists]);
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

    fn apply(&mut self, op: &Op) {
        let mut copies = [kvs_copy {
            src_page: 0,
            dst_page: 0,
            num_tokens: 0,
            kind: 0,
            group: 0,
        }; 128];
        let mut ncopies = usize::MAX;
        match *op {
            Op::Begin {
                id,
                len,
                vocab,
                max_match,
            } => {
                let toks = tokens(len, vocab, u64::from(vocab));
                let max = if max_match == 255 {
                    usize::MAX
                } else {
                    usize::from(max_match)
                };
                self.begin(u64::from(id % 16), &toks, max);
            }
            Op::Append {
                id,
                len,
                vocab,
                lookahead,
            } => {
                let id = u64::from(id % 16);
                let toks = tokens(len % 20, vocab, id + 7);
                let lookahead = usize::from(lookahead % 8);
                let st = unsafe {
                    kvs_cache::kvs_seq_append(
                        self.c,
                        id,
                        toks.as_ptr(),
                        toks.len(),
                        lookahead,
                        copies.as_mut_ptr(),
                        copies.len(),
                        &mut ncopies,
                    )
                };
                if let Some(want) = self.seq_status(id, Tier::Device) {
                    return self.expect(st, &[want]);
                }
                if self.align && lookahead > 0 {
                    return self.expect(st, &[kvs_status::InvalidArgument]);
                }
                self.expect(st, &[kvs_status::Ok, kvs_status::NoSpace]);
                if st == kvs_status::Ok {
                    // At most one copy-on-write per group.
                    assert!(ncopies <= self.ng(), "{}: {ncopies} copies", self.op);
                    self.check_copies(&copies[..ncopies]);
                    self.model.seqs.get_mut(&id).unwrap().tokens += toks.len();
                }
            }
            Op::AppendBatch { ref ids, vocab } => {
                let ids: Vec<u64> = ids.iter().take(8).map(|&i| u64::from(i % 16)).collect();
                let toks: Vec<i32> = ids
                    .iter()
                    .map(|&i| (i as i32 + i32::from(vocab)) % 3)
                    .collect();
                let st = unsafe {
                    kvs_cache::kvs_seq_append_batch(
                        self.c,
                        ids.as_ptr(),
                        ids.len(),
                        toks.as_ptr(),
                        toks.len(),
                        copies.as_mut_ptr(),
                        copies.len(),
                        &mut ncopies,
                    )
                };
                let mut sorted = ids.clone();
                sorted.sort_unstable();
                let dup = sorted.windows(2).any(|w| w[0] == w[1]);
                let bad: Vec<kvs_status> = ids
                    .iter()
                    .filter_map(|&i| self.seq_status(i, Tier::Device))
                    .collect();
                if !bad.is_empty() || dup {
                    let mut allowed = bad;
                    if dup {
                        allowed.push(kvs_status::InvalidArgument);
                    }
                    return self.expect(st, &allowed);
                }
                self.expect(st, &[kvs_status::Ok, kvs_status::NoSpace]);
                if st == kvs_status::Ok {
                    assert!(ncopies <= ids.len() * self.ng());
                    self.check_copies(&copies[..ncopies]);
                    for i in ids {
                        self.model.seqs.get_mut(&i).unwrap().tokens += 1;
                    }
                }
            }
            Op::Fork { parent, child } => {
                let (p, ch) = (u64::from(parent % 16), u64::from(child % 16));
                let st = unsafe { kvs_cache::kvs_seq_fork(self.c, p, ch) };
                if self.model.seqs.contains_key(&ch) {
                    // Which check comes first is not promised.
                    let mut allowed = vec![kvs_status::SeqExists];
                    allowed.extend(self.seq_status(p, Tier::Device));
                    return self.expect(st, &allowed);
                }
                if let Some(want) = self.seq_status(p, Tier::Device) {
                    return self.expect(st, &[want]);
                }
                // Forking shares pages: it never needs free ones.
                self.expect(st, &[kvs_status::Ok]);
                let tokens = self.model.seqs[&p].tokens;
                self.model.seqs.insert(
                    ch,
                    ModelSeq {
                        tokens,
                        tier: Tier::Device,
                    },
                );
            }
            Op::Free { id } => {
                let id = u64::from(id % 16);
                let st = unsafe { kvs_cache::kvs_seq_free(self.c, id) };
                if self.model.seqs.remove(&id).is_some() {
                    self.expect(st, &[kvs_status::Ok]);
                } else {
                    self.expect(st, &[kvs_status::SeqNotFound]);
                }
            }
            Op::SwapOut { id } => self.swap(
                id,
                Tier::Device,
                Tier::Host,
                kvs_cache::kvs_seq_swap_out,
                &mut copies,
                &mut ncopies,
            ),
            Op::SwapIn { id } => self.swap(
                id,
                Tier::Host,
                Tier::Device,
                kvs_cache::kvs_seq_swap_in,
                &mut copies,
                &mut ncopies,
            ),
            Op::SetPriority { id, priority } => {
                let id = u64::from(id % 16);
                let prio = u32::from(priority % 6);
                let st = unsafe { kvs_cache::kvs_seq_set_priority(self.c, id, prio) };
                let mut allowed: Vec<kvs_status> =
                    self.seq_status(id, Tier::Device).into_iter().collect();
                if prio >= 4 {
                    allowed.push(kvs_status::InvalidArgument);
                }
                if allowed.is_empty() {
                    allowed.push(kvs_status::Ok);
                }
                self.expect(st, &allowed);
            }
            Op::Alloc { n, group } => {
                let g = self.group(group);
                let pool = self.pools[g];
                let n = usize::from(n % 8);
                let mut out = vec![u32::MAX; n + 1];
                let st =
                    unsafe { kvs_cache::kvs_pages_alloc(self.c, g, n, out.as_mut_ptr(), n + 1) };
                self.expect(st, &[kvs_status::Ok, kvs_status::NoSpace]);
                if st != kvs_status::Ok {
                    assert!(
                        out.iter().all(|&p| p == u32::MAX),
                        "{}: wrote on error",
                        self.op
                    );
                    return;
                }
                assert_eq!(out[n], u32::MAX, "{}: wrote past num_pages", self.op);
                for &p in &out[..n] {
                    // A fresh page: nobody else holds it.
                    assert!(
                        !self.model.held.contains_key(&(pool, p)),
                        "{}: page {p} given twice",
                        self.op
                    );
                    let info = self.page_info(0, g, p).unwrap();
                    assert_eq!((info.refcount, info.state), (1, 2), "{}: page {p}", self.op);
                    self.model.hold(pool, p, 1);
                }
            }
            Op::Acquire {
                ref held,
                ref raw,
                group,
            } => {
                let g = self.group(group);
                let pool = self.pools[g];
                let list = self.model.held_list(pool);
                let mut pages: Vec<u32> = held
                    .iter()
                    .take(8)
                    .filter_map(|&i| list.get(usize::from(i) % list.len().max(1)).copied())
                    .collect();
                pages.extend(
                    raw.iter()
                        .take(2)
                        .map(|&r| u32::from(r) % (self.dev_pages + 2)),
                );
                let st =
                    unsafe { kvs_cache::kvs_pages_acquire(self.c, g, pages.as_ptr(), pages.len()) };
                if raw.is_empty() {
                    // Only pages the caller holds: in use, so acquiring them must work.
                    self.expect(st, &[kvs_status::Ok]);
                } else {
                    self.expect(
                        st,
                        &[
                            kvs_status::Ok,
                            kvs_status::PageNotAllocated,
                            kvs_status::PageOutOfRange,
                            kvs_status::PaddingPage,
                        ],
                    );
                }
                if st == kvs_status::Ok {
                    for p in pages {
                        self.model.hold(pool, p, 1);
                    }
                }
            }
            Op::Release {
                ref held,
                ref raw,
                group,
            } => {
                let g = self.group(group);
                let pool = self.pools[g];
                let list = self.model.held_list(pool);
                let mut pages: Vec<u32> = held
                    .iter()
                    .take(8)
                    .filter_map(|&i| list.get(usize::from(i) % list.len().max(1)).copied())
                    .collect();
                pages.extend(
                    raw.iter()
                        .take(1)
                        .map(|&r| u32::from(r) % (self.dev_pages + 2)),
                );
                let st =
                    unsafe { kvs_cache::kvs_pages_release(self.c, g, pages.as_ptr(), pages.len()) };
                let mut need: HashMap<u32, u32> = HashMap::new();
                for &p in &pages {
                    *need.entry(p).or_default() += 1;
                }
                let covered = need
                    .iter()
                    .all(|(&p, &n)| self.model.held.get(&(pool, p)).copied().unwrap_or(0) >= n);
                if covered {
                    self.expect(st, &[kvs_status::Ok]);
                    for (p, n) in need {
                        let h = self.model.held.get_mut(&(pool, p)).unwrap();
                        *h -= n;
                        if *h == 0 {
                            self.model.held.remove(&(pool, p));
                        }
                    }
                } else {
                    // More releases than the caller holds: refused, nothing released.
                    self.expect(
                        st,
                        &[
                            kvs_status::RefcountUnderflow,
                            kvs_status::PageOutOfRange,
                            kvs_status::PaddingPage,
                        ],
                    );
                }
            }
            Op::Register {
                ref held,
                len,
                vocab,
                group,
            } => {
                let g = self.group(group);
                let list = self.model.held_list(self.pools[g]);
                let pages: Vec<u32> = held
                    .iter()
                    .take(6)
                    .filter_map(|&i| list.get(usize::from(i) % list.len().max(1)).copied())
                    .collect();
                let toks = tokens(len, vocab, u64::from(vocab));
                let mut n = usize::MAX;
                let st = unsafe {
                    kvs_cache::kvs_prefix_register(
                        self.c,
                        g,
                        toks.as_ptr(),
                        toks.len(),
                        pages.as_ptr(),
                        pages.len(),
                        null(),
                        &mut n,
                    )
                };
                self.expect(
                    st,
                    &[
                        kvs_status::Ok,
                        kvs_status::InvalidArgument,
                        kvs_status::Unsupported,
                    ],
                );
                if st == kvs_status::Ok {
                    assert!(n <= pages.len());
                }
            }
            Op::Match {
                len,
                vocab,
                max,
                acquire,
                room,
                group,
            } => {
                let g = self.group(group);
                let toks = tokens(len, vocab, u64::from(vocab));
                let room = usize::from(room % 12);
                let mut out = vec![u32::MAX; room];
                let (mut n, mut matched) = (usize::MAX, usize::MAX);
                let st = unsafe {
                    kvs_cache::kvs_prefix_match(
                        self.c,
                        g,
                        toks.as_ptr(),
                        toks.len(),
                        null(),
                        usize::from(max),
                        acquire,
                        out.as_mut_ptr(),
                        room,
                        &mut n,
                        &mut matched,
                    )
                };
                self.expect(st, &[kvs_status::Ok, kvs_status::BufferTooSmall]);
                if st == kvs_status::Ok {
                    assert!(n <= room && matched == n * self.ps, "{}", self.op);
                    assert!(matched <= toks.len().min(usize::from(max)));
                    if acquire {
                        for &p in &out[..n] {
                            self.model.hold(self.pools[g], p, 1);
                        }
                    }
                } else {
                    assert_eq!((n, matched), (usize::MAX, usize::MAX), "{}", self.op);
                }
            }
            Op::Pin { len, vocab } => {
                let toks = tokens(len, vocab, u64::from(vocab));
                let (mut id, mut n) = (0u64, 0usize);
                let st = unsafe {
                    kvs_cache::kvs_prefix_pin(
                        self.c,
                        toks.as_ptr(),
                        toks.len(),
                        null(),
                        &mut id,
                        &mut n,
                    )
                };
                self.expect(st, &[kvs_status::Ok, kvs_status::NoSpace]);
                if st == kvs_status::Ok {
                    assert!(!self.model.pins.contains(&id), "{}: pin id reused", self.op);
                    self.model.pins.push(id);
                }
            }
            Op::Unpin { index } => {
                let (id, known) = match self.model.pins.len() {
                    0 => (u64::from(index) + 1000, false),
                    l => (self.model.pins[usize::from(index) % l], true),
                };
                let st = unsafe { kvs_cache::kvs_prefix_unpin(self.c, id) };
                if known {
                    self.expect(st, &[kvs_status::Ok]);
                    self.model.pins.retain(|&p| p != id);
                } else {
                    self.expect(st, &[kvs_status::InvalidArgument]);
                }
            }
            Op::Prefetch { len, vocab } => {
                let toks = tokens(len, vocab, u64::from(vocab));
                let mut n = usize::MAX;
                let st = unsafe {
                    kvs_cache::kvs_prefix_prefetch(
                        self.c,
                        toks.as_ptr(),
                        toks.len(),
                        null(),
                        &mut n,
                    )
                };
                self.expect(st, &[kvs_status::Ok]);
                assert!(n * self.ps <= toks.len() * self.ng());
            }
            Op::Commit => {
                let st = unsafe { kvs_cache::kvs_cache_commit(self.c) };
                self.expect(st, &[kvs_status::Ok]);
            }
            Op::Clear => {
                let st = unsafe { kvs_cache::kvs_prefix_clear(self.c) };
                self.expect(st, &[kvs_status::Ok]);
            }
            Op::TakeCopies { room } => {
                let room = usize::from(room % 64);
                let st = unsafe {
                    kvs_cache::kvs_cache_take_copies(
                        self.c,
                        copies.as_mut_ptr(),
                        room,
                        &mut ncopies,
                    )
                };
                self.expect(st, &[kvs_status::Ok]);
                assert!(ncopies <= room);
                self.check_copies(&copies[..ncopies]);
            }
            Op::TakeEvents { room } => {
                let room = usize::from(room % 64);
                // SAFETY: kvs_event is plain data; all-zero is a valid value.
                let mut ev: Vec<kvs_event> =
                    (0..room).map(|_| unsafe { std::mem::zeroed() }).collect();
                let st = unsafe {
                    kvs_cache::kvs_cache_take_events(self.c, ev.as_mut_ptr(), room, &mut ncopies)
                };
                self.expect(st, &[kvs_status::Ok]);
                assert!(ncopies <= room);
                for e in &ev[..ncopies] {
                    assert!((e.group as usize) < self.ng(), "{}: event {e:?}", self.op);
                }
            }
            Op::PageInfo { page, tier, group } => {
                let page = u32::from(page) % (self.dev_pages + 4);
                let r = self.page_info(u32::from(tier % 3), self.group(group), page);
                if tier % 3 == 2 {
                    assert_eq!(r.err(), Some(kvs_status::InvalidArgument), "{}", self.op);
                } else if let Ok(i) = r {
                    assert!(i.state <= 3);
                    assert_eq!(i.refcount > 0, i.state == 2, "{}: page {page}", self.op);
                }
            }
            Op::BadPointers { which, len } => {
                let n = usize::from(len) + 1;
                let ng = self.ng();
                let mut page = u32::MAX;
                let st = unsafe {
                    match which % 8 {
                        0 => kvs_cache::kvs_pages_acquire(self.c, 0, null(), n),
                        1 => kvs_cache::kvs_pages_release(self.c, 0, null(), n),
                        2 => kvs_cache::kvs_seq_begin(
                            self.c,
                            99,
                            null(),
                            n,
                            null(),
                            0,
                            0,
                            null_mut(),
                        ),
                        3 => kvs_cache::kvs_pages_alloc(self.c, 0, 1, null_mut(), n),
                        4 => kvs_cache::kvs_cache_stats(self.c, null_mut()),
                        5 => kvs_cache::kvs_cache_available(self.c, 7, 0, &mut ncopies),
                        6 => kvs_cache::kvs_cache_available(self.c, 0, ng + n, &mut ncopies),
                        _ => kvs_cache::kvs_pages_alloc(self.c, ng + n, 1, &mut page, 1),
                    }
                };
                let want = if which % 8 >= 5 {
                    kvs_status::InvalidArgument
                } else {
                    kvs_status::NullArgument
                };
                self.expect(st, &[want]);
                assert_eq!((ncopies, page), (usize::MAX, u32::MAX), "{}", self.op);
            }
            Op::ReleaseSkipped { id, back } => {
                let id = u64::from(id % 16);
                // The engine's computed tokens: at most the sequence's.
                let computed = self.model.seqs.get(&id).map_or(0, |s| s.tokens);
                let computed = computed.saturating_sub(usize::from(back % 4));
                let mut n = usize::MAX;
                let st =
                    unsafe { kvs_cache::kvs_seq_release_skipped(self.c, id, computed, &mut n) };
                if let Some(want) = self.seq_status(id, Tier::Device) {
                    self.expect(st, &[want]);
                    return assert_eq!(n, usize::MAX, "{}", self.op);
                }
                self.expect(st, &[kvs_status::Ok]);
                // Positions hold one page each, in every group.
                let pages = computed.div_ceil(self.ps) * self.ng();
                assert!(n <= pages, "{}: released {n}", self.op);
            }
            Op::NewStep => {
                let st = unsafe { kvs_cache::kvs_cache_new_step(self.c) };
                self.expect(st, &[kvs_status::Ok]);
            }
            Op::StatePage { id, group } => {
                let id = u64::from(id % 16);
                let g = usize::from(group) % (self.ng() + 1);
                let mut page = u32::MAX;
                let st = unsafe { kvs_cache::kvs_seq_state_page(self.c, id, g, &mut page) };
                if g == self.ng() || !self.state[g] {
                    self.expect(st, &[kvs_status::InvalidArgument]);
                } else if let Some(want) = self.seq_status(id, Tier::Device) {
                    self.expect(st, &[want]);
                } else if self.model.seqs[&id].tokens == 0 {
                    // No state page yet, unless an append reserved lookahead slots.
                    self.expect(st, &[kvs_status::InvalidArgument, kvs_status::Ok]);
                    if st == kvs_status::Ok {
                        return;
                    }
                } else {
                    self.expect(st, &[kvs_status::Ok]);
                    let info = self.page_info(0, g, page).unwrap();
                    assert!(
                        page != KVS_NULL_PAGE && info.refcount > 0,
                        "{}: state page {page}: {info:?}",
                        self.op
                    );
                    return;
                }
                assert_eq!(page, u32::MAX, "{}: written on error", self.op);
            }
            Op::Find {
                len,
                vocab,
                max,
                room,
            } => {
                let toks = tokens(len, vocab, u64::from(vocab));
                let max = usize::from(max);
                let room = usize::from(room % 12);
                let ng = self.ng();
                let mut out = vec![u32::MAX; room * ng];
                let ptr = if room == 0 {
                    null_mut()
                } else {
                    out.as_mut_ptr()
                };
                let mut matched = usize::MAX;
                let st = unsafe {
                    kvs_cache::kvs_prefix_find(
                        self.c,
                        toks.as_ptr(),
                        toks.len(),
                        null(),
                        max,
                        ptr,
                        out.len(),
                        room,
                        &mut matched,
                    )
                };
                if st != kvs_status::Ok {
                    self.expect(st, &[kvs_status::BufferTooSmall]);
                    assert!(room > 0 && matched == usize::MAX, "{}", self.op);
                    return assert!(out.iter().all(|&p| p == u32::MAX), "{}", self.op);
                }
                let n = matched / self.ps;
                assert!(
                    matched % self.ps == 0 && matched <= max.min(toks.len()),
                    "{}: matched {matched}",
                    self.op
                );
                if room > 0 {
                    assert!(n <= room, "{}", self.op);
                    for (g, row) in out.chunks(room).enumerate() {
                        for &p in &row[..n] {
                            assert!(p < self.dev_pages, "{}: group {g} page {p}", self.op);
                        }
                        assert!(row[n..].iter().all(|&p| p == u32::MAX), "{}", self.op);
                    }
                }
                if ng == 1 {
                    // One group: the hit is that group's device match.
                    let mut m = usize::MAX;
                    let st = unsafe {
                        kvs_cache::kvs_prefix_match(
                            self.c,
                            0,
                            toks.as_ptr(),
                            toks.len(),
                            null(),
                            max,
                            false,
                            null_mut(),
                            0,
                            null_mut(),
                            &mut m,
                        )
                    };
                    // A non-empty match needs room: BUFFER_TOO_SMALL then, and the hit is not 0.
                    match st {
                        kvs_status::Ok => assert_eq!(m, matched, "{}", self.op),
                        _ => assert!(
                            st == kvs_status::BufferTooSmall && matched > 0,
                            "{}",
                            self.op
                        ),
                    }
                }
            }
        }
    }
}

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
    cfg.eviction_policy = if setup.vllm_free_order {
        kvs_eviction_policy::Lru as u32
    } else {
        u32::from(setup.policy % 3)
    };
    let groups = groups_of(setup.layout, cfg.page_size, setup.caching);
    let state = |g: &kvs_group| g.kind == kvs_group_kind::State as u32;
    let has_state = groups.iter().any(state);
    // Every kind but full attention shows the null page at released positions; state groups
    // keep checkpoints at page boundaries only.
    cfg.reserve_null_page |= !groups.is_empty();
    cfg.match_unit = match setup.unit % 4 {
        _ if has_state => 0,
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
        dev_pages: cfg.num_device_pages,
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
