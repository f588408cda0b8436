//! Property test: random operation sequences against a model of the KV each page holds.
//!
//! The test plays the engine: it writes a fingerprint of "the KV of token `pos` given the whole
//! prefix before it" into a model of every page slot, through the slot mapping kvshare returns,
//! and executes every copy kvshare reports (copy-on-write, swap). After every operation it
//! checks `State::check` and that every live sequence reads, through its block table, exactly
//! the fingerprints of its own tokens. A false prefix hit, a missed copy-on-write, a wrong swap
//! pair, a leaked or doubly used page all fail here.
//!
//! The eviction policy is drawn too (LRU, LFU, S3-FIFO): the checker verifies each one's own
//! bookkeeping and that parents held back behind their children have a child.
//!
//! The match unit is drawn too (the page, half of it, one token): hits ending inside a page
//! queue a partial copy, and `BeginPair` starts two prompts in one step (copies, then KV writes):
//! the second begin's allocations (evictions, demotions) run between the first one's unit hit and
//! its copy, and the second may find pages whose KV the step has yet to write.
//!
//! Every begin after a drained step is also held to `kvs_config.match_unit`'s promise, as the
//! header words it: a prompt that goes on for whole units inside a cached page (refcount 0,
//! registered: `KVS_PAGE_STATE_CACHED`) no sequence holds takes at least those units. The test
//! finds such pages from the KV it wrote itself (the slots of a cached page hold the prompt's
//! fingerprints) and from what it knows was registered of them (a full page, or the whole units
//! of a finished sequence's last page). The second begin of a `BeginPair` is not held to it:
//! copies queued by the first (demotions) have not run yet, so the test's KV of their targets
//! is not what the cache will hold.

use std::collections::HashSet;

use kvshare_core::{
    BeginInfo, Config, CopyKind, Error, EventKind, EvictionPolicy, ExtraKeys, PageCopy, PageState,
    State, Tier,
};
use proptest::prelude::*;

const PS: usize = 4;

#[derive(Debug, Clone)]
enum Op {
    Begin {
        prefix: u8,
        extra_len: u8,
        salt: bool,
        cap_last: bool,
    },
    /// Two begins, then the drain and both KV writes.
    BeginPair {
        first: (u8, u8),
        second: (u8, u8),
    },
    Append {
        seq: u8,
        n: u8,
    },
    Decode,
    Fork {
        seq: u8,
    },
    Free {
        seq: u8,
    },
    SwapOut {
        seq: u8,
    },
    SwapIn {
        seq: u8,
    },
    PageMatch {
        prefix: u8,
    },
    ReleaseHeld,
    Clear,
    Pin {
        prefix: u8,
    },
    Unpin,
    Prefetch {
        prefix: u8,
    },
    Priority {
        seq: u8,
        prio: u8,
    },
    /// Drops a device page's index entry (an engine's failed KV load).
    Unregister {
        page: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..4, 0u8..10, any::<bool>(), any::<bool>())
            .prop_map(|(prefix, extra_len, salt, cap_last)| Op::Begin { prefix, extra_len, salt, cap_last }),
        2 => ((0u8..4, 0u8..10), (0u8..4, 0u8..16))
            .prop_map(|(first, second)| Op::BeginPair { first, second }),
        3 => (any::<u8>(), 1u8..7).prop_map(|(seq, n)| Op::Append { seq, n }),
        2 => Just(Op::Decode),
        2 => any::<u8>().prop_map(|seq| Op::Fork { seq }),
        3 => any::<u8>().prop_map(|seq| Op::Free { seq }),
        1 => any::<u8>().prop_map(|seq| Op::SwapOut { seq }),
        1 => any::<u8>().prop_map(|seq| Op::SwapIn { seq }),
        1 => (0u8..4).prop_map(|prefix| Op::PageMatch { prefix }),
        1 => Just(Op::ReleaseHeld),
        1 => Just(Op::Clear),
        1 => (0u8..4).prop_map(|prefix| Op::Pin { prefix }),
        1 => Just(Op::Unpin),
        1 => (0u8..4).prop_map(|prefix| Op::Prefetch { prefix }),
        1 => (any::<u8>(), 0u8..4).prop_map(|(seq, prio)| Op::Priority { seq, prio }),
        1 => (0u8..24).prop_map(|page| Op::Unregister { page }),
    ]
}

/// Fingerprint of the KV at position `pos` of `tokens` under `salt`: depends on the whole prefix.
fn fp(tokens: &[i32], pos: usize, salt: bool) -> u64 {
    let mut h: u64 = if salt {
        0x9e37_79b9_7f4a_7c15
    } else {
        0x1234_5678
    };
    for &t in &tokens[..=pos] {
        h = (h ^ t as u64).wrapping_mul(0x100_0000_01b3).rotate_left(17);
    }
    h
}

/// Shared prompt prefixes: the first two and the last share 5 and 8 tokens, so hits end inside
/// pages as well as on their boundaries.
const PREFIXES: [&[i32]; 4] = [
    &[0, 1, 2, 3, 4, 5, 6, 7],
    &[0, 1, 2, 3, 4],
    &[100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111],
    &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
];

struct Engine {
    s: State,
    dev: Vec<[Option<u64>; PS]>,
    host: Vec<[Option<u64>; PS]>,
    live: Vec<(u64, bool)>,
    next_id: u64,
    held: Vec<u32>,
    pins: Vec<u64>,
    /// The registered set as an event consumer sees it.
    seen: HashSet<(Tier, u128)>,
    /// The match unit in tokens.
    unit: usize,
    /// Per device page: the tokens registered of it when it holds a partial entry (the whole
    /// units of a finished sequence's last page), `None` otherwise.
    partial: Vec<Option<usize>>,
    /// Begins held to the match-unit promise, and those where it promised units.
    unit_checks: (usize, usize),
    /// `Config::skip_cached_writes` (a begin then also shares a cached page the limit cuts).
    skip_cached_writes: bool,
}

impl Engine {
    fn new(skip_cached_writes: bool, match_unit: u32, eviction_policy: EvictionPolicy) -> Self {
        let cfg = Config {
            page_size: PS as u32,
            match_unit,
            eviction_policy,
            num_device_pages: 24,
            num_host_pages: 12,
            reserve_null_page: true,
            skip_cached_writes,
            enable_events: true,
            ..Config::default()
        };
        Engine {
            s: State::new(cfg).unwrap(),
            dev: vec![[None; PS]; 24],
            host: vec![[None; PS]; 12],
            live: vec![],
            next_id: 1,
            held: vec![],
            pins: vec![],
            seen: HashSet::new(),
            unit: if match_unit == 0 {
                PS
            } else {
                match_unit as usize
            },
            partial: vec![None; 24],
            unit_checks: (0, 0),
            skip_cached_writes,
        }
    }

    /// Per page position `i` of `t`: the whole units (fewer than a page, within the first
    /// `limit` tokens) of page `i` that some cached page holds, by the KV the test wrote and what
    /// was registered of the page.
    fn promised_units(&self, t: &[i32], salt: bool, limit: usize) -> Vec<usize> {
        let limit = limit.min(t.len());
        let mut best = vec![0; t.len() / PS + 1];
        if self.unit == PS {
            return best;
        }
        let mut cached: Vec<(&[Option<u64>; PS], usize)> = Vec::new();
        for (tier, kv) in [(Tier::Device, &self.dev), (Tier::Host, &self.host)] {
            for (p, slots) in kv.iter().enumerate() {
                let (_, state, registered) = self.s.page_info(tier, 0, p as u32).unwrap();
                if state == PageState::Cached && registered {
                    let len = match tier {
                        Tier::Device => self.partial[p].unwrap_or(PS),
                        Tier::Host => PS,
                    };
                    cached.push((slots, len));
                }
            }
        }
        for (i, b) in best.iter_mut().enumerate() {
            for &(slots, len) in &cached {
                let mut o = 0;
                while o < len.min(PS - 1)
                    && i * PS + o < limit
                    && slots[o] == Some(fp(t, i * PS + o, salt))
                {
                    o += 1;
                }
                *b = (*b).max(o / self.unit * self.unit);
            }
        }
        best
    }

    /// Holds a begin of `t` to the match-unit promise computed before it (`promised`).
    fn check_unit_promise(&mut self, t: &[i32], b: &BeginInfo, promised: &[usize]) {
        let i = b.num_pages - b.new_pages;
        let want = promised.get(i).copied().unwrap_or(0);
        self.unit_checks.0 += 1;
        self.unit_checks.1 += usize::from(want > 0);
        assert!(
            b.unit_tokens >= want,
            "begin of {t:?} took {} tokens inside page {i}, but a cached page no sequence holds \
             has {want} of them in whole units ({b:?})",
            b.unit_tokens
        );
    }

    /// Before a device sequence ends: what the cache keeps of its last, never-full page (the
    /// whole units, when the sequence is the page's only holder).
    fn note_partial(&mut self, id: u64) {
        if self.s.seq_info(id).unwrap().tier != Tier::Device {
            return;
        }
        let n = self.s.seq_tokens(id).unwrap().len();
        let pages = self.s.seq_pages(id, 0).unwrap();
        let units = n % PS / self.unit * self.unit;
        if let Some(&p) = pages.get(n / PS) {
            if units > 0 && self.unit < PS && self.s.page_info(Tier::Device, 0, p).unwrap().0 == 1 {
                self.partial[p as usize] = Some(units);
            }
        }
    }

    fn pick(&self, k: u8) -> Option<(u64, bool)> {
        (!self.live.is_empty()).then(|| self.live[k as usize % self.live.len()])
    }

    fn exec(&mut self, copies: &[PageCopy]) {
        for c in copies {
            let n = c.num_tokens as usize;
            let (src, dst) = match c.kind {
                CopyKind::DeviceToDevice => (
                    self.dev[c.src_page as usize],
                    &mut self.dev[c.dst_page as usize],
                ),
                CopyKind::DeviceToHost => (
                    self.dev[c.src_page as usize],
                    &mut self.host[c.dst_page as usize],
                ),
                CopyKind::HostToDevice => (
                    self.host[c.src_page as usize],
                    &mut self.dev[c.dst_page as usize],
                ),
            };
            dst[..n].copy_from_slice(&src[..n]);
        }
    }

    /// Executes the queued demotion / promotion copies (before anything else of the step).
    fn drain(&mut self) {
        let queued = self.s.take_copies(usize::MAX);
        self.exec(&queued);
    }

    /// Writes the last `q` tokens' KV through the slot mapping kvshare returns.
    fn write_last(&mut self, id: u64, salt: bool, q: usize) {
        self.write_last_of_step(id, salt, q, false)
    }

    /// [`write_last`](Self::write_last); with `same_step`, the pages may already be shared by a
    /// prompt begun later in the same step (it found them registered and hides their slots).
    fn write_last_of_step(&mut self, id: u64, salt: bool, q: usize, same_step: bool) {
        let tokens = self.s.seq_tokens(id).unwrap().to_vec();
        let mut slots = vec![0i64; q];
        assert_eq!(
            self.s
                .slot_mapping(0, &[id], &[q as u32], &mut slots)
                .unwrap(),
            q
        );
        for (i, &slot) in slots.iter().enumerate() {
            if slot >= 0 {
                let page = (slot as usize / PS) as u32;
                let rc = self.s.page_info(Tier::Device, 0, page).unwrap().0;
                assert!(
                    rc == 1 || same_step,
                    "KV write into page {page} shared by {rc} holders"
                );
                let pos = tokens.len() - q + i;
                self.dev[slot as usize / PS][slot as usize % PS] = Some(fp(&tokens, pos, salt));
            }
        }
    }

    fn verify(&mut self) {
        self.s.check().unwrap();
        for p in 0..self.partial.len() {
            let (_, state, registered) = self.s.page_info(Tier::Device, 0, p as u32).unwrap();
            if state != PageState::Cached || !registered {
                self.partial[p] = None;
            }
        }
        for e in self.s.take_events(usize::MAX) {
            match e.kind {
                EventKind::Stored => {
                    assert_eq!(e.num_tokens as usize, PS, "a partial page published: {e:?}");
                    assert!(self.seen.insert((e.tier, e.hash)), "stored twice: {e:?}")
                }
                EventKind::Removed => assert!(
                    self.seen.remove(&(e.tier, e.hash)),
                    "removed unknown: {e:?}"
                ),
                EventKind::Cleared => self.seen.retain(|&(t, _)| t != e.tier),
            }
        }
        let actual: HashSet<(Tier, u128)> = self
            .s
            .registered_hashes()
            .into_iter()
            .map(|(t, _, h)| (t, h))
            .collect();
        assert_eq!(self.seen, actual, "event consumer disagrees with the index");
        for &(id, salt) in &self.live {
            let info = self.s.seq_info(id).unwrap();
            let tokens = self.s.seq_tokens(id).unwrap();
            let pages = self.s.seq_pages(id, 0).unwrap();
            let kv = match info.tier {
                Tier::Device => &self.dev,
                Tier::Host => &self.host,
            };
            for pos in 0..tokens.len() {
                let got = kv[pages[pos / PS] as usize][pos % PS];
                assert_eq!(
                    got,
                    Some(fp(tokens, pos, salt)),
                    "seq {id} pos {pos} reads wrong KV ({:?})",
                    info.tier
                );
            }
        }
    }

    /// The prompt of a begin: one of the shared prefixes plus `extra_len` tokens that differ
    /// between ids (so prompts diverge inside pages).
    fn prompt(&self, id: u64, prefix: u8, extra_len: u8) -> Vec<i32> {
        let mut t = PREFIXES[prefix as usize].to_vec();
        t.extend((0..extra_len as i32).map(|k| 1000 + k + (id as i32 % 3) * 10));
        t
    }

    fn step(&mut self, op: &Op) {
        let prefixes = PREFIXES.map(|p| p.to_vec());
        match *op {
            Op::BeginPair { first, second } => {
                // One engine step: both prompts begin, then the queued copies run, then the KV
                // writes. The second may hit pages the first registered this step, whose KV is
                // written only now; and the first's unit copy runs after the second begin's
                // allocations (evictions, demotions).
                let mut started = vec![];
                for (k, (prefix, extra_len)) in [first, second].into_iter().enumerate() {
                    let id = self.next_id;
                    self.next_id += 1;
                    let t = self.prompt(id, prefix, extra_len);
                    let cap = t.len().saturating_sub(1);
                    let promised = self.promised_units(&t, false, cap);
                    match self.s.begin(id, &t, None, cap, 0) {
                        Ok(b) => {
                            if k == 0 {
                                self.check_unit_promise(&t, &b, &promised);
                            }
                            self.live.push((id, false));
                            started.push((id, t.len() - b.matched_tokens));
                        }
                        Err(Error::NoSpace { .. }) => {}
                        Err(e) => panic!("begin: {e}"),
                    }
                }
                self.drain();
                for (id, q) in started {
                    self.write_last_of_step(id, false, q, true);
                }
            }
            Op::Begin {
                prefix,
                extra_len,
                salt,
                cap_last,
            } => {
                let id = self.next_id;
                self.next_id += 1;
                let t = self.prompt(id, prefix, extra_len);
                let extra = salt.then(|| ExtraKeys {
                    salt: b"tenant-b".to_vec(),
                    ..Default::default()
                });
                let cap = if cap_last {
                    t.len().saturating_sub(1)
                } else {
                    usize::MAX
                };
                let promised = self.promised_units(&t, salt, cap);
                // The read-only lookup announces what the begin takes: whole pages and units,
                // unless host-tier pages lengthen the begin's page hit or skip_cached_writes
                // shares the page the limit cuts.
                let (found, _) = self.s.find_hit(&t, extra.as_ref(), cap);
                match self.s.begin(id, &t, extra, cap, 0) {
                    Ok(b) => {
                        if b.promoted_pages == 0 && !self.skip_cached_writes {
                            assert_eq!(b.matched_tokens, found, "find_hit before begin");
                        }
                        self.check_unit_promise(&t, &b, &promised);
                        self.drain();
                        assert!(b.matched_tokens <= cap);
                        self.live.push((id, salt));
                        self.write_last(id, salt, t.len() - b.matched_tokens);
                    }
                    Err(Error::NoSpace { .. }) => {}
                    Err(e) => panic!("begin: {e}"),
                }
            }
            Op::Append { seq, n } => {
                if let Some((id, salt)) = self.pick(seq) {
                    let t: Vec<i32> = (0..n as i32).map(|k| 2000 + k + id as i32).collect();
                    let mut copies = vec![];
                    let before = self.s.seq_pages(id, 0).unwrap().len();
                    // Odd counts go through append_pages: the same append, plus the table's
                    // tail from the old page count, which must be exactly the pages added.
                    let res = if n % 2 == 0 {
                        self.s.append(id, &t, 0, &mut copies, 1)
                    } else {
                        self.s
                            .append_pages(id, &t, 0, &mut copies, 1, before, usize::MAX)
                            .map(|tail| tail.to_vec())
                            .map(|tail| {
                                let all = self.s.seq_pages(id, 0).unwrap();
                                assert_eq!(tail, all[before..], "append_pages tail");
                            })
                    };
                    match res {
                        Ok(()) => {
                            self.drain();
                            self.exec(&copies);
                            self.write_last(id, salt, t.len());
                        }
                        Err(Error::NoSpace { .. } | Error::SeqWrongTier { .. }) => {
                            assert!(copies.is_empty())
                        }
                        Err(e) => panic!("append: {e}"),
                    }
                }
            }
            Op::Decode => {
                let ids: Vec<u64> = self
                    .live
                    .iter()
                    .filter(|(id, _)| self.s.seq_info(*id).unwrap().tier == Tier::Device)
                    .map(|(id, _)| *id)
                    .collect();
                let toks: Vec<i32> = ids.iter().map(|&id| 3000 + id as i32).collect();
                let mut copies = vec![];
                match self.s.append_batch(&ids, &toks, &mut copies, ids.len()) {
                    Ok(()) => {
                        self.drain();
                        self.exec(&copies);
                        for &(id, salt) in &self.live.clone() {
                            if ids.contains(&id) {
                                self.write_last(id, salt, 1);
                            }
                        }
                    }
                    Err(Error::NoSpace { .. }) => {}
                    Err(e) => panic!("decode: {e}"),
                }
            }
            Op::Fork { seq } => {
                if let Some((id, salt)) = self.pick(seq) {
                    let child = self.next_id;
                    self.next_id += 1;
                    match self.s.fork(id, child) {
                        Ok(()) => self.live.push((child, salt)),
                        Err(Error::SeqWrongTier { .. }) => {}
                        Err(e) => panic!("fork: {e}"),
                    }
                }
            }
            Op::Free { seq } => {
                if let Some((id, _)) = self.pick(seq) {
                    self.note_partial(id);
                    self.s.free(id).unwrap();
                    self.live.retain(|&(i, _)| i != id);
                    assert_eq!(self.s.free(id), Err(Error::SeqNotFound(id)));
                }
            }
            Op::SwapOut { seq } => {
                if let Some((id, _)) = self.pick(seq) {
                    let mut copies = vec![];
                    match self.s.swap_out(id, &mut copies, usize::MAX) {
                        Ok(()) => {
                            self.drain();
                            self.exec(&copies)
                        }
                        Err(Error::NoSpace { .. } | Error::SeqWrongTier { .. }) => {}
                        Err(e) => panic!("swap_out: {e}"),
                    }
                }
            }
            Op::SwapIn { seq } => {
                if let Some((id, _)) = self.pick(seq) {
                    let mut copies = vec![];
                    match self.s.swap_in(id, &mut copies, usize::MAX) {
                        Ok(()) => {
                            self.drain();
                            self.exec(&copies)
                        }
                        Err(Error::NoSpace { .. } | Error::SeqWrongTier { .. }) => {}
                        Err(e) => panic!("swap_in: {e}"),
                    }
                }
            }
            Op::PageMatch { prefix } => {
                let t = &prefixes[prefix as usize];
                // The read-only cross-group hit is the device part of the match that follows.
                let (hit, found) = self.s.find_hit(t, None, usize::MAX);
                let pages_hit = found[0].len() * PS;
                // Whole pages, then (with a unit below the page) fewer than a page of units.
                assert_eq!(found.len(), 1);
                assert!(
                    hit >= pages_hit && hit - pages_hit < PS.max(1),
                    "find_hit {hit}"
                );
                if self.unit == PS {
                    assert_eq!(hit, pages_hit, "find_hit with whole-page hits");
                }
                // The device-and-host hit a router asks for: read-only, at least the device
                // hit, at most what the match that follows takes (host pages promoted as room
                // allows).
                let before = self.s.stats();
                let cached = self.s.cached_prefix_tokens(t, None, usize::MAX);
                assert_eq!(
                    self.s.stats(),
                    before,
                    "cached_prefix_tokens changed the cache"
                );
                assert!(
                    cached >= pages_hit,
                    "cached_prefix_tokens {cached} < device hit {pages_hit}"
                );
                let m = self
                    .s
                    .match_prefix(0, t, None, usize::MAX, true, usize::MAX)
                    .unwrap();
                assert!(
                    m.tokens <= cached,
                    "match {} > cached prefix {cached}",
                    m.tokens
                );
                assert_eq!(m.pages[..found[0].len()], found[0][..], "find_hit");
                self.drain();
                for (i, &p) in m.pages.iter().enumerate() {
                    for o in 0..PS {
                        assert_eq!(
                            self.dev[p as usize][o],
                            Some(fp(t, i * PS + o, false)),
                            "false hit"
                        );
                    }
                }
                self.held.extend(m.pages);
            }
            Op::ReleaseHeld => {
                let held = std::mem::take(&mut self.held);
                self.s.release_pages(0, &held).unwrap();
                if let Some(&p) = held.first() {
                    if self.s.page_info(Tier::Device, 0, p).unwrap().0 == 0 {
                        assert_eq!(
                            self.s.release_pages(0, &[p]),
                            Err(Error::RefcountUnderflow { page: p })
                        );
                    }
                }
            }
            Op::Clear => self.s.clear_index(),
            Op::Unregister { page } => {
                let page = u32::from(page);
                let before = self.s.page_info(Tier::Device, 0, page).unwrap();
                let n = match self.s.unregister(0, &[page]) {
                    Ok(n) => n,
                    Err(Error::PaddingPage { .. }) => {
                        assert_eq!(self.s.page_info(Tier::Device, 0, page).unwrap(), before);
                        return;
                    }
                    Err(e) => panic!("unregister: {e}"),
                };
                self.drain();
                let (refs, state, registered) = self.s.page_info(Tier::Device, 0, page).unwrap();
                // Found by no lookup now; freed unless held; an entry dropped only if it had one.
                assert!(!registered, "page {page} still registered");
                assert_eq!(refs, before.0, "unregister changed page {page}'s holders");
                if refs == 0 {
                    assert_eq!(state, PageState::Free, "unreferenced page {page} not freed");
                }
                assert!(
                    n <= 1 && (n == 1 || !before.2),
                    "page {page}: {n} dropped, {before:?}"
                );
            }
            Op::Pin { prefix } => match self.s.pin(&prefixes[prefix as usize], None) {
                Ok((id, _)) => {
                    self.drain();
                    self.pins.push(id);
                }
                Err(Error::NoSpace { .. }) => {}
                Err(e) => panic!("pin: {e}"),
            },
            Op::Unpin => {
                if let Some(id) = self.pins.pop() {
                    self.s.unpin(id).unwrap();
                    assert!(self.s.unpin(id).is_err(), "double unpin refused");
                }
            }
            Op::Prefetch { prefix } => {
                self.s.prefetch(&prefixes[prefix as usize], None);
                self.drain();
            }
            Op::Priority { seq, prio } => {
                if let Some((id, _)) = self.pick(seq) {
                    match self.s.set_priority(id, prio) {
                        Ok(()) | Err(Error::SeqWrongTier { .. }) => {}
                        Err(e) => panic!("set_priority: {e}"),
                    }
                }
            }
        }
    }

    fn finish(mut self) {
        for (id, _) in std::mem::take(&mut self.live) {
            self.s.free(id).unwrap();
        }
        self.s
            .release_pages(0, &std::mem::take(&mut self.held))
            .unwrap();
        for id in std::mem::take(&mut self.pins) {
            self.s.unpin(id).unwrap();
        }
        self.s.check().unwrap();
        let st = self.s.stats();
        assert_eq!(
            (st.device_pages_in_use, st.host_pages_in_use, st.num_seqs),
            (0, 0, 0)
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_operations_keep_every_sequence_reading_its_own_kv(
        ops in proptest::collection::vec(op(), 1..60),
        skip in any::<bool>(),
        unit in prop_oneof![Just(PS as u32), Just(2u32), Just(1u32)],
        policy in prop_oneof![
            Just(EvictionPolicy::Lru),
            Just(EvictionPolicy::Lfu),
            Just(EvictionPolicy::S3Fifo)
        ],
    ) {
        let mut e = Engine::new(skip, unit, policy);
        for o in &ops {
            e.step(o);
            e.verify();
        }
        e.finish();
    }
}
