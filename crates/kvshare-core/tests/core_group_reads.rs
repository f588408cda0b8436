//! Model-based test of what the first token to compute reads, through every group's block
//! table (see the section comment below), on `kvshare_core::State` built as in
//! `core_groups.rs`.

use std::collections::HashMap;

use kvshare_core::{Error, EvictionPolicy, GroupKind, GroupSpec, State, StateMode};
use proptest::prelude::*;

mod support;
use support::{append, doc, noise, Hybrid, HybridConfig, NULL};

// ---- What the first token to compute reads ----
//
// An engine that writes, through the block tables, a fingerprint of what each page slot holds:
// the KV of token `pos` given the whole prefix before it, or (a state group's page) the state
// after the first `n` tokens. Before every computation, the tables of every group must hold
// what the first token to compute reads, with the right content: full attention every token
// before it; a sliding window of W the W - 1 tokens before it; chunked local attention the
// tokens of its chunk before it; a state group the state after exactly the tokens before it
// (at a hit: the checkpoint at the hit). Random groups of every kind, random mixes, two pools,
// placeholder tokens (which stop hashing), prompts that share documents and earlier turns, and
// pools small enough to evict, appends with and without a release before them. Align state
// groups get steps cut at page boundaries, as vLLM's scheduler cuts them in that mode.

/// The domain of state fingerprints (apart from KV ones).
const STATE_FP: u64 = 0x5747_4154_4500_0000;

/// `fps[n]`: fingerprint of `tokens[..n]` (FNV-1a over the token ids).
fn prefix_fps(tokens: &[i32]) -> Vec<u64> {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut out = Vec::with_capacity(tokens.len() + 1);
    out.push(h);
    for &t in tokens {
        h = (h ^ t as u32 as u64).wrapping_mul(0x100_0000_01b3);
        out.push(h);
    }
    out
}

#[derive(Debug, Clone)]
enum ReadOp {
    /// A prompt: a document or an earlier sequence's tokens, `extra` new tokens, a placeholder
    /// at `hole` (modulo the length) when set; the hit limited to all tokens or all but one.
    Begin {
        doc: u8,
        prev: Option<usize>,
        extra: u8,
        seed: u32,
        hole: Option<u8>,
        whole: bool,
    },
    /// `k` new tokens for a live sequence, after releasing what it no longer reads when
    /// `release`.
    Step {
        who: usize,
        k: u8,
        seed: u32,
        release: bool,
    },
    Free {
        who: usize,
    },
    NewStep,
}

fn read_op() -> impl Strategy<Value = ReadOp> {
    prop_oneof![
        4 => (0u8..3, proptest::option::weighted(0.7, 0usize..64), 0u8..24, any::<u32>(),
              proptest::option::weighted(0.2, any::<u8>()), any::<bool>())
            .prop_map(|(doc, prev, extra, seed, hole, whole)| ReadOp::Begin {
                doc, prev, extra, seed, hole, whole
            }),
        4 => (0usize..64, prop_oneof![Just(1u8), 1u8..12], any::<u32>(), any::<bool>())
            .prop_map(|(who, k, seed, release)| ReadOp::Step { who, k, seed, release }),
        3 => (0usize..64).prop_map(|who| ReadOp::Free { who }),
        2 => Just(ReadOp::NewStep),
    ]
}

struct Reader {
    h: State,
    ps: usize,
    kinds: Vec<GroupKind>,
    pool_of: Vec<usize>,
    /// Per pool, page and slot: the fingerprint written there last.
    mem: Vec<Vec<Vec<Option<u64>>>>,
    tokens: HashMap<u64, Vec<i32>>,
    live: Vec<u64>,
    history: Vec<Vec<i32>>,
    next: u64,
}

impl Reader {
    /// Every group's table of `id` holds what token `first` reads, with the right content.
    fn check_reads(&self, id: u64, first: usize, what: &str) -> Result<(), TestCaseError> {
        let ps = self.ps;
        let fps = prefix_fps(&self.tokens[&id]);
        for (g, &kind) in self.kinds.iter().enumerate() {
            let t = self.h.seq_pages(id, g).unwrap();
            let mem = &self.mem[self.pool_of[g]];
            let reads = match kind {
                GroupKind::Full => 0..first,
                GroupKind::SlidingWindow(w) => first.saturating_sub(w as usize - 1)..first,
                GroupKind::ChunkedLocal(c) => first / c as usize * c as usize..first,
                GroupKind::State(_) => {
                    if first > 0 {
                        let j = (first - 1) / ps;
                        let page = t.get(j).copied().unwrap_or(NULL);
                        prop_assert!(
                            page != NULL && mem[page as usize][0] == Some(fps[first] ^ STATE_FP),
                            "{what}: seq {id} group {g} ({kind:?}): position {j} (page {page}) \
                             lacks the state after {first} tokens; table {t:?}"
                        );
                    }
                    continue;
                }
            };
            for pos in reads {
                let page = t.get(pos / ps).copied().unwrap_or(NULL);
                prop_assert!(
                    page != NULL && mem[page as usize][pos % ps] == Some(fps[pos + 1]),
                    "{what}: seq {id} group {g} ({kind:?}): token {first} reads token {pos}, \
                     which page {page} (position {}) does not hold; table {t:?}",
                    pos / ps
                );
            }
        }
        Ok(())
    }

    /// The engine computes tokens `from..to` of `id`: their KV into every attention group's
    /// pages; into a state group's pages the state after `to` (at the table's position holding
    /// token `to - 1`) and, in mode all, the checkpoint of every page boundary passed.
    fn compute(&mut self, id: u64, from: usize, to: usize) -> Result<(), TestCaseError> {
        if from >= to {
            return Ok(());
        }
        let ps = self.ps;
        let fps = prefix_fps(&self.tokens[&id]);
        for (g, &kind) in self.kinds.iter().enumerate() {
            let t = self.h.seq_pages(id, g).unwrap().to_vec();
            let mem = &mut self.mem[self.pool_of[g]];
            match kind {
                GroupKind::State(m) => {
                    let mut ends: Vec<usize> = Vec::new();
                    if m == StateMode::All {
                        ends.extend((from / ps + 1..=to / ps).map(|j| j * ps));
                    }
                    if ends.last() != Some(&to) {
                        ends.push(to);
                    }
                    for n in ends {
                        let page = t[(n - 1) / ps];
                        prop_assert!(page != NULL, "seq {id} group {g}: state into a null page");
                        let slots = &mut mem[page as usize];
                        slots.fill(None);
                        slots[0] = Some(fps[n] ^ STATE_FP);
                    }
                }
                _ => {
                    for pos in from..to {
                        let page = t[pos / ps];
                        prop_assert!(page != NULL, "seq {id} group {g}: KV of {pos} into null");
                        mem[page as usize][pos % ps] = Some(fps[pos + 1]);
                    }
                }
            }
        }
        Ok(())
    }

    fn step(&mut self, op: &ReadOp, doc_len: usize) -> Result<(), TestCaseError> {
        let ps = self.ps;
        match *op {
            ReadOp::Begin {
                doc: d,
                prev,
                extra,
                seed,
                hole,
                whole,
            } => {
                let mut toks = match prev.filter(|_| !self.history.is_empty()) {
                    Some(i) => self.history[i % self.history.len()].clone(),
                    None => doc(d, doc_len),
                };
                toks.extend(noise(seed, extra as usize));
                if let Some(at) = hole {
                    let i = at as usize % toks.len();
                    toks[i] = -1;
                }
                let id = self.next;
                self.next += 1;
                let max = if whole { toks.len() } else { toks.len() - 1 };
                match self.h.begin(id, &toks, None, max, 0) {
                    Ok(b) => {
                        prop_assert!(b.matched_tokens <= max);
                        self.tokens.insert(id, toks.clone());
                        self.live.push(id);
                        self.check_reads(id, b.matched_tokens, "begin")?;
                        self.compute(id, b.matched_tokens, toks.len())?;
                    }
                    Err(Error::NoSpace { .. }) => {}
                    Err(e) => prop_assert!(false, "begin: {e}"),
                }
            }
            ReadOp::Step {
                who,
                k,
                seed,
                release,
            } => {
                if self.live.is_empty() {
                    return Ok(());
                }
                let id = self.live[who % self.live.len()];
                let n = self.tokens[&id].len();
                let mut k = k as usize;
                let align = self.kinds.contains(&GroupKind::State(StateMode::Align));
                if align && !n.is_multiple_of(ps) {
                    // vLLM's align mode ends a step that passes a page boundary on it.
                    k = k.min(n.next_multiple_of(ps) - n);
                }
                if release {
                    self.h.release_skipped(id, n).unwrap();
                }
                let new = noise(seed, k);
                match append(&mut self.h, id, &new, 0) {
                    Ok(()) => {
                        self.tokens.get_mut(&id).unwrap().extend_from_slice(&new);
                        self.check_reads(id, n, "step")?;
                        self.compute(id, n, n + k)?;
                    }
                    Err(Error::NoSpace { .. }) => self.check_reads(id, n, "refused step")?,
                    Err(e) => prop_assert!(false, "append: {e}"),
                }
            }
            ReadOp::Free { who } => {
                if self.live.is_empty() {
                    return Ok(());
                }
                let id = self.live.swap_remove(who % self.live.len());
                self.h.free(id).unwrap();
                self.history.push(self.tokens.remove(&id).unwrap());
            }
            ReadOp::NewStep => self.h.new_step(),
        }
        self.h
            .check()
            .map_err(|e| TestCaseError::fail(format!("{op:?}: {e}")))
    }
}

/// A group of any kind (caching on: state mode none is not among them); chunks are page
/// multiples.
fn any_group(ps: u32) -> impl Strategy<Value = GroupKind> {
    prop_oneof![
        Just(GroupKind::Full),
        (1u32..=12).prop_map(GroupKind::SlidingWindow),
        (1u32..=3).prop_map(move |m| GroupKind::ChunkedLocal(m * ps)),
        Just(GroupKind::State(StateMode::All)),
        Just(GroupKind::State(StateMode::Align)),
    ]
}

/// vLLM's order, or kvshare's with each eviction policy.
fn any_order() -> impl Strategy<Value = Option<EvictionPolicy>> {
    prop_oneof![
        Just(None),
        Just(Some(EvictionPolicy::Lru)),
        Just(Some(EvictionPolicy::Lfu)),
        Just(Some(EvictionPolicy::S3Fifo)),
    ]
}

fn run_reads(
    ps: u32,
    groups: Vec<(GroupKind, u64)>,
    num_pages: u32,
    policy: Option<EvictionPolicy>,
    ops: &[ReadOp],
) -> Result<(), TestCaseError> {
    let cfg = HybridConfig {
        page_size: ps,
        num_pages,
        groups: groups
            .iter()
            .map(|&(kind, page_bytes)| GroupSpec {
                kind,
                page_bytes,
                eagle: false,
            })
            .collect(),
        enable_prefix_caching: true,
        enable_events: false,
        policy,
        uncached_first: false,
        retention: None,
    };
    let h = Hybrid::new(cfg).unwrap();
    let pool_of: Vec<usize> = (0..groups.len()).map(|g| h.pool_of(g).unwrap()).collect();
    let slots = vec![vec![None; ps as usize]; num_pages as usize];
    let mut r = Reader {
        mem: vec![slots; h.num_pools()],
        h,
        ps: ps as usize,
        kinds: groups.iter().map(|g| g.0).collect(),
        pool_of,
        tokens: HashMap::new(),
        live: Vec::new(),
        history: Vec::new(),
        next: 1,
    };
    for op in ops {
        r.step(op, 6 * ps as usize + 1)?;
    }
    for id in std::mem::take(&mut r.live) {
        r.h.free(id).unwrap();
    }
    r.h.check()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    for p in 0..r.h.num_pools() {
        prop_assert_eq!(r.h.pool(p).unwrap().num_in_use(), 0);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Every hit and every step gives each group what its first computed token reads: one to
    /// four groups of any kinds, in one or two pools, in vLLM's order or under each eviction
    /// policy.
    #[test]
    fn tables_hold_what_the_first_computed_token_reads(
        (ps, groups, num_pages, ops) in prop_oneof![Just(1u32), Just(2u32), Just(4u32)]
            .prop_flat_map(|ps| (
                Just(ps),
                proptest::collection::vec((any_group(ps), 1u64..=2), 1..=4),
                12u32..=40,
                proptest::collection::vec(read_op(), 1..80),
            )),
        policy in any_order(),
    ) {
        run_reads(ps, groups, num_pages, policy, &ops)?;
    }

    /// The same next to full attention in one pool: two lookup sets, the coordinator's fast
    /// path (one pass, no fixed-point iteration).
    #[test]
    fn tables_hold_what_the_first_computed_token_reads_next_to_full_attention(
        (ps, other, num_pages, ops) in prop_oneof![Just(1u32), Just(2u32), Just(4u32)]
            .prop_flat_map(|ps| (
                Just(ps),
                any_group(ps),
                12u32..=40,
                proptest::collection::vec(read_op(), 1..80),
            )),
        policy in any_order(),
    ) {
        run_reads(ps, vec![(GroupKind::Full, 1), (other, 1)], num_pages, policy, &ops)?;
    }
}
