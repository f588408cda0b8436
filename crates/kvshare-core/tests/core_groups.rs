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
//! after `release_skipped`, as vLLM releases before it allocates, some appends alone), frees,
//! and pools small enough to evict and refuse. After every operation both sides must agree on
//! the result (ok or out of space), the hit, every group's block table of every live sequence
//! (page ids, the null page at released positions) and the whole free queue in order; the
//! cached (hash, group, page) triples rebuilt from the cache's events alone must be vLLM's
//! cached blocks (duplicates included); and the cache's invariant checker must pass.

use std::collections::{HashMap, HashSet};

use kvshare_core::prefix::{chain_hash, root_hash};
use kvshare_core::{Config, EvictionPolicy, GroupKind, GroupSpec, State, StateMode};
use kvshare_core::{Error, EventKind};
use proptest::prelude::*;

const NULL: u32 = 0;

/// The cache's geometry in these tests: a page size, pages per pool, the groups.
struct HybridConfig {
    page_size: u32,
    num_pages: u32,
    groups: Vec<GroupSpec>,
    enable_prefix_caching: bool,
    enable_events: bool,
    /// `None`: vLLM's free order (LRU, duplicates kept); else kvshare's own order and this
    /// eviction policy (parents held back behind their children).
    policy: Option<EvictionPolicy>,
}

/// A cache of groups that keeps pages as vLLM's block pool does (or in kvshare's order with an
/// eviction policy).
struct Hybrid;

impl Hybrid {
    #[allow(clippy::new_ret_no_self)]
    fn new(c: HybridConfig) -> Result<State, Error> {
        State::new(Config {
            page_size: c.page_size,
            num_device_pages: c.num_pages,
            groups: c.groups,
            enable_prefix_caching: c.enable_prefix_caching,
            enable_events: c.enable_events,
            reserve_null_page: true,
            skip_cached_writes: false,
            vllm_free_order: c.policy.is_none(),
            eviction_policy: c.policy.unwrap_or_default(),
            ..Config::default()
        })
    }
}

/// An append as vLLM's `allocate_slots` makes it (no copies: nothing is forked here).
fn append(h: &mut State, id: u64, tokens: &[i32], lookahead: usize) -> Result<(), Error> {
    let mut copies = Vec::new();
    h.append(id, tokens, lookahead, &mut copies, 0)
}

/// vLLM's side, one pool.
struct Vllm {
    ps: usize,
    kinds: Vec<GroupKind>,
    /// Spec groups (identical specs together), full attention first.
    sets: Vec<Vec<usize>>,
    /// The free queue, head first.
    queue: Vec<u32>,
    ref_cnt: Vec<u32>,
    block_hash: Vec<Option<(u128, usize)>>,
    /// `cached_block_hash_to_block`: blocks per (hash, group), insertion order.
    cached: HashMap<(u128, usize), Vec<u32>>,
    reqs: HashMap<u64, Req>,
    /// `enable_caching` (off: vLLM's `KVCacheCoordinatorNoPrefixCache`: no hit, nothing cached).
    caching: bool,
    /// Per group: `MambaManager.cached_blocks_this_step`.
    this_step: Vec<HashSet<u128>>,
}

/// vLLM's mamba block size in mode "none": `max_model_len` (longer than any test sequence).
const MAX_MODEL_LEN: usize = 1 << 30;

struct Req {
    tokens: Vec<i32>,
    hashes: Vec<u128>,
    blocks: Vec<Vec<u32>>,
    num_cached: Vec<usize>,
    /// Align mode: `last_state_block_idx` and `_allocated_block_reqs`, per group.
    last_state: Vec<Option<usize>>,
    allocated: Vec<bool>,
}

fn hashes_of(tokens: &[i32], ps: usize) -> Vec<u128> {
    let mut scratch = Vec::new();
    let mut parent = root_hash();
    tokens
        .chunks_exact(ps)
        .map(|c| {
            parent = chain_hash(parent, 0, c, &mut scratch);
            parent
        })
        .collect()
}

impl Vllm {
    fn new(ps: usize, num_pages: u32, kinds: Vec<GroupKind>, caching: bool) -> Self {
        let mut sets: Vec<Vec<usize>> = Vec::new();
        for (g, k) in kinds.iter().enumerate() {
            match sets.iter_mut().find(|s| kinds[s[0]] == *k) {
                Some(s) => s.push(g),
                None => sets.push(vec![g]),
            }
        }
        sets.sort_by_key(|s| kinds[s[0]] != GroupKind::Full);
        let n = num_pages as usize;
        let n_groups = kinds.len();
        Vllm {
            ps,
            kinds,
            sets,
            queue: (1..num_pages).collect(), // block 0 is popped as the null block
            ref_cnt: vec![0; n],
            block_hash: vec![None; n],
            cached: HashMap::new(),
            reqs: HashMap::new(),
            caching,
            this_step: vec![HashSet::new(); n_groups],
        }
    }

    /// Block size of group `g`: the page size, or `max_model_len` for a "none" state group.
    fn bs(&self, g: usize) -> usize {
        match self.kinds[g] {
            GroupKind::State(StateMode::None) => MAX_MODEL_LEN,
            _ => self.ps,
        }
    }

    /// `KVCacheManager.new_step_starts`.
    fn new_step(&mut self) {
        self.this_step.iter_mut().for_each(HashSet::clear);
    }

    fn get_cached_block(&self, h: u128, gids: &[usize]) -> Option<Vec<u32>> {
        gids.iter()
            .map(|&g| self.cached.get(&(h, g)).map(|v| v[0]))
            .collect()
    }

    fn find(
        &self,
        kind: GroupKind,
        gids: &[usize],
        hashes: &[u128],
        max_len: usize,
    ) -> Vec<Vec<u32>> {
        let ps = self.ps;
        let max_blocks = max_len / ps;
        match kind {
            GroupKind::Full => {
                let mut out = vec![Vec::new(); gids.len()];
                for &h in hashes.iter().take(max_blocks) {
                    match self.get_cached_block(h, gids) {
                        Some(b) => out.iter_mut().zip(b).for_each(|(o, x)| o.push(x)),
                        None => break,
                    }
                }
                out
            }
            GroupKind::SlidingWindow(w) => {
                let need = (w as usize - 1).div_ceil(ps);
                let mut out = vec![vec![NULL; max_blocks]; gids.len()];
                let mut n = 0;
                let mut found = false;
                for i in (0..max_blocks).rev() {
                    if let Some(b) = self.get_cached_block(hashes[i], gids) {
                        out.iter_mut().zip(b).for_each(|(o, x)| o[i] = x);
                        n += 1;
                        if n >= need {
                            out.iter_mut().for_each(|o| o.truncate(i + n));
                            found = true;
                            break;
                        }
                    } else {
                        n = 0;
                    }
                }
                if !found {
                    out.iter_mut().for_each(|o| o.truncate(n));
                }
                out
            }
            GroupKind::ChunkedLocal(c) => {
                let start = if max_len > 0 {
                    max_len / c as usize * c as usize
                } else {
                    0
                };
                let sb = start / ps;
                let mut out = vec![vec![NULL; sb]; gids.len()];
                for &h in &hashes[sb..max_blocks] {
                    match self.get_cached_block(h, gids) {
                        Some(b) => out.iter_mut().zip(b).for_each(|(o, x)| o.push(x)),
                        None => break,
                    }
                }
                out
            }
            GroupKind::State(_) => {
                // MambaManager: right to left, stop at the first cached block.
                let mut out = vec![Vec::new(); gids.len()];
                for i in (0..max_blocks).rev() {
                    if let Some(b) = self.get_cached_block(hashes[i], gids) {
                        for (o, x) in out.iter_mut().zip(b) {
                            o.extend(std::iter::repeat_n(NULL, i));
                            o.push(x);
                        }
                        break;
                    }
                }
                out
            }
        }
    }

    fn find_longest_cache_hit(&self, hashes: &[u128], max: usize) -> (Vec<Vec<u32>>, usize) {
        if !self.caching {
            return (vec![Vec::new(); self.kinds.len()], 0);
        }
        let mut by_group: Vec<Option<Vec<u32>>> = vec![None; self.kinds.len()];
        let simple = self.sets.len() == 2 && self.kinds[self.sets[0][0]] == GroupKind::Full;
        let mut hit = max;
        loop {
            let mut curr = hit;
            for set in &self.sets {
                let kind = self.kinds[set[0]];
                if kind == GroupKind::Full && by_group[set[0]].is_some() {
                    curr = curr / self.ps * self.ps;
                    continue;
                }
                let blocks = self.find(kind, set, hashes, curr);
                curr = blocks[0].len() * self.ps;
                for (&g, b) in set.iter().zip(blocks) {
                    by_group[g] = Some(b);
                }
            }
            if curr >= hit {
                break;
            }
            hit = curr;
            if simple {
                break;
            }
        }
        if self.kinds[self.sets[0][0]] == GroupKind::Full {
            for &g in &self.sets[0] {
                if let Some(b) = &mut by_group[g] {
                    b.truncate(hit / self.ps);
                }
            }
        }
        (
            by_group
                .into_iter()
                .map(Option::unwrap_or_default)
                .collect(),
            hit,
        )
    }

    fn skipped(&self, g: usize, computed: usize) -> usize {
        match self.kinds[g] {
            GroupKind::Full => 0,
            GroupKind::SlidingWindow(w) => (computed + 1).saturating_sub(w as usize),
            GroupKind::ChunkedLocal(c) => computed / c as usize * c as usize,
            // MambaManager.get_num_skipped_tokens: num_computed_tokens - 1.
            GroupKind::State(_) => computed.saturating_sub(1),
        }
    }

    fn get_new_blocks(&mut self, n: usize) -> Vec<u32> {
        let out: Vec<u32> = self.queue.drain(..n).collect();
        for &b in &out {
            if let Some(key) = self.block_hash[b as usize].take() {
                let list = self.cached.get_mut(&key).unwrap();
                list.retain(|&x| x != b);
                if list.is_empty() {
                    self.cached.remove(&key);
                }
            }
            self.ref_cnt[b as usize] += 1;
        }
        out
    }

    fn touch(&mut self, blocks: &[u32]) {
        for &b in blocks.iter().filter(|&&b| b != NULL) {
            if self.ref_cnt[b as usize] == 0 {
                self.queue.retain(|&x| x != b);
            }
            self.ref_cnt[b as usize] += 1;
        }
    }

    fn free_blocks(&mut self, blocks: &[u32], prepend: bool) {
        let mut freed = Vec::new();
        for &b in blocks {
            if b == NULL {
                continue;
            }
            self.ref_cnt[b as usize] -= 1;
            if self.ref_cnt[b as usize] == 0 {
                freed.push(b);
            }
        }
        if prepend {
            freed.append(&mut self.queue);
            self.queue = freed;
        } else {
            self.queue.extend(freed);
        }
    }

    fn remove_skipped_blocks(&mut self, id: u64, computed: usize) {
        for g in 0..self.kinds.len() {
            let skipped = self.skipped(g, computed) / self.bs(g);
            let r = self.reqs.get_mut(&id).unwrap();
            let skipped = skipped.min(r.blocks[g].len());
            let (mut cached, mut uncached) = (Vec::new(), Vec::new());
            for i in (0..skipped).rev() {
                let b = r.blocks[g][i];
                if b == NULL {
                    break;
                }
                if self.block_hash[b as usize].is_none() {
                    uncached.push(b);
                } else {
                    cached.push(b);
                }
                r.blocks[g][i] = NULL;
            }
            self.free_blocks(&cached, false);
            self.free_blocks(&uncached, true);
            // MambaManager align: free the state block of two steps ago.
            if self.kinds[g] == GroupKind::State(StateMode::Align) {
                let r = self.reqs.get_mut(&id).unwrap();
                if let Some(i) = r.last_state[g] {
                    if (i as isize) < computed.div_ceil(self.ps) as isize - 1
                        && r.blocks[g][i] != NULL
                    {
                        let b = std::mem::replace(&mut r.blocks[g][i], NULL);
                        self.free_blocks(&[b], false);
                    }
                }
            }
        }
    }

    fn cache_blocks(&mut self, id: u64, num_tokens: usize) {
        if !self.caching {
            return;
        }
        let r = self.reqs.get_mut(&id).unwrap();
        let full = num_tokens / self.ps;
        for g in 0..self.kinds.len() {
            for j in r.num_cached[g]..full {
                let b = r.blocks[g][j];
                if b == NULL {
                    continue;
                }
                let key = (r.hashes[j], g);
                if let GroupKind::State(_) = self.kinds[g] {
                    self.this_step[g].insert(r.hashes[j]);
                }
                self.block_hash[b as usize] = Some(key);
                self.cached.entry(key).or_default().push(b);
            }
            r.num_cached[g] = r.num_cached[g].max(full);
        }
    }

    /// `get_computed_blocks` + `allocate_slots` of a new request scheduling all its tokens.
    fn begin(&mut self, id: u64, tokens: &[i32]) -> Option<usize> {
        let hashes = hashes_of(tokens, self.ps);
        let (hit_blocks, hit) = self.find_longest_cache_hit(&hashes, tokens.len() - 1);
        let mut need = 0;
        let align = |k| k == GroupKind::State(StateMode::Align);
        for (g, b) in hit_blocks.iter().enumerate() {
            // MambaManager: a hit on a block cached in this step answers num_gpu_blocks + 1.
            if let (GroupKind::State(_), Some(&last)) = (self.kinds[g], b.last()) {
                let (h, _) = self.block_hash[last as usize].unwrap();
                if self.this_step[g].contains(&h) {
                    return None;
                }
            }
            let required = tokens.len().div_ceil(self.bs(g));
            let skipped = self.skipped(g, hit) / self.bs(g);
            need += if align(self.kinds[g]) {
                usize::from(required > b.len()) // first prefill: 1 block
            } else {
                required.saturating_sub(skipped.max(b.len()))
            };
            need += b[skipped.min(b.len())..]
                .iter()
                .filter(|&&x| x != NULL && self.ref_cnt[x as usize] == 0)
                .count();
        }
        if need > self.queue.len() {
            return None;
        }
        let mut blocks = Vec::new();
        for (g, b) in hit_blocks.iter().enumerate() {
            let skipped = (self.skipped(g, hit) / self.bs(g)).min(b.len());
            self.touch(&b[skipped..]);
            let mut t = vec![NULL; skipped];
            t.extend_from_slice(&b[skipped..]);
            blocks.push(t);
        }
        let n = self.kinds.len();
        self.reqs.insert(
            id,
            Req {
                tokens: tokens.to_vec(),
                hashes,
                num_cached: blocks.iter().map(Vec::len).collect(),
                blocks,
                last_state: vec![None; n],
                allocated: vec![false; n],
            },
        );
        for g in 0..n {
            self.allocate_new_blocks(id, g, tokens.len().div_ceil(self.bs(g)));
        }
        self.cache_blocks(id, tokens.len());
        Some(hit)
    }

    /// `allocate_slots` of a running request with `tokens` new tokens (all earlier computed).
    ///
    /// With `release` false it plays an append without `release_skipped`: of
    /// `remove_skipped_blocks` only what the append promises, the align groups' state page of
    /// two steps ago, for the groups that grow, counted as free and released only when the
    /// allocation succeeds (a refused append changes nothing).
    fn step(&mut self, id: u64, tokens: &[i32], release: bool) -> bool {
        let computed = self.reqs[&id].tokens.len();
        if release {
            self.remove_skipped_blocks(id, computed);
        }
        let required: Vec<usize> = (0..self.kinds.len())
            .map(|g| (computed + tokens.len()).div_ceil(self.bs(g)))
            .collect();
        let need: usize = self.reqs[&id]
            .blocks
            .iter()
            .enumerate()
            .map(|(g, b)| match self.kinds[g] {
                GroupKind::State(StateMode::Align) => usize::from(required[g] > b.len()),
                _ => required[g].saturating_sub(b.len()),
            })
            .sum();
        // Align groups that grow: the state of two steps ago they release first.
        let stale: Vec<(usize, usize)> = if release {
            Vec::new()
        } else {
            let r = &self.reqs[&id];
            (0..self.kinds.len())
                .filter(|&g| {
                    self.kinds[g] == GroupKind::State(StateMode::Align)
                        && required[g] > r.blocks[g].len()
                })
                .filter_map(|g| {
                    let i = r.last_state[g]?;
                    let live = i + 1 < computed.div_ceil(self.ps) && r.blocks[g][i] != NULL;
                    live.then_some((g, i))
                })
                .collect()
        };
        let back = stale
            .iter()
            .filter(|&&(g, i)| self.ref_cnt[self.reqs[&id].blocks[g][i] as usize] == 1)
            .count();
        if need > self.queue.len() + back {
            return false;
        }
        for (g, i) in stale {
            let r = self.reqs.get_mut(&id).unwrap();
            let b = std::mem::replace(&mut r.blocks[g][i], NULL);
            self.free_blocks(&[b], false);
        }
        for (g, &req) in required.iter().enumerate() {
            self.allocate_new_blocks(id, g, req);
        }
        let r = self.reqs.get_mut(&id).unwrap();
        r.tokens.extend_from_slice(tokens);
        r.hashes = hashes_of(&r.tokens, self.ps);
        let n = r.tokens.len();
        self.cache_blocks(id, n);
        true
    }

    /// `allocate_new_blocks` (base, and MambaManager's align branch without speculative
    /// blocks).
    fn allocate_new_blocks(&mut self, id: u64, g: usize, required: usize) {
        let have = self.reqs[&id].blocks[g].len();
        if required <= have {
            return;
        }
        if self.kinds[g] != GroupKind::State(StateMode::Align) {
            let new = self.get_new_blocks(required - have);
            self.reqs.get_mut(&id).unwrap().blocks[g].extend(new);
            return;
        }
        let r = self.reqs.get_mut(&id).unwrap();
        if r.allocated[g] || have > 0 {
            r.last_state[g] = Some(have - 1);
        }
        r.blocks[g].resize(required - 1, NULL);
        let new = self.get_new_blocks(1);
        let r = self.reqs.get_mut(&id).unwrap();
        r.blocks[g].extend(new);
        r.allocated[g] = true;
    }

    fn free(&mut self, id: u64) {
        let r = self.reqs.remove(&id).unwrap();
        for (g, blocks) in r.blocks.iter().enumerate() {
            let rev: Vec<u32> = blocks.iter().rev().copied().collect();
            if let GroupKind::SlidingWindow(_) = self.kinds[g] {
                let (cached, uncached): (Vec<u32>, Vec<u32>) = rev
                    .into_iter()
                    .filter(|&b| b != NULL)
                    .partition(|&b| self.block_hash[b as usize].is_some());
                self.free_blocks(&cached, false);
                self.free_blocks(&uncached, true);
            } else {
                self.free_blocks(&rev, false);
            }
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// A new conversation turn: a shared document (or the tokens of an earlier sequence, a
    /// multi-turn follow-up) plus `extra` new tokens.
    Begin {
        doc: u8,
        prev: Option<usize>,
        extra: u16,
        seed: u32,
    },
    /// A step of a live sequence: `k` new tokens (a prefill chunk or one decode token), after
    /// `release_skipped` when `release` (vLLM's order), or an append alone.
    Step {
        who: usize,
        k: u16,
        seed: u32,
        release: bool,
    },
    Free {
        who: usize,
    },
    /// The scheduler starts a new step.
    NewStep,
}

fn op(max_extra: u16, max_step: u16) -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..3, proptest::option::of(0usize..64), 1..=max_extra, any::<u32>())
            .prop_map(|(doc, prev, extra, seed)| Op::Begin { doc, prev, extra, seed }),
        5 => (0usize..64, prop_oneof![Just(1u16), 1..=max_step], any::<u32>(),
              proptest::bool::weighted(0.7))
            .prop_map(|(who, k, seed, release)| Op::Step { who, k, seed, release }),
        2 => (0usize..64).prop_map(|who| Op::Free { who }),
        2 => Just(Op::NewStep),
    ]
}

fn noise(seed: u32, n: usize) -> Vec<i32> {
    let mut x = seed as u64 | 1;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 40) as i32 & 0x7fff
        })
        .collect()
}

fn doc(d: u8, len: usize) -> Vec<i32> {
    (0..len)
        .map(|i| 100_000 + d as i32 * 10_000 + (i as i32 % 9_973))
        .collect()
}

fn run(
    ps: usize,
    num_pages: u32,
    kinds: Vec<GroupKind>,
    doc_len: usize,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    run_with(ps, num_pages, kinds, doc_len, ops, true)
}

fn run_with(
    ps: usize,
    num_pages: u32,
    kinds: Vec<GroupKind>,
    doc_len: usize,
    ops: &[Op],
    caching: bool,
) -> Result<(), TestCaseError> {
    let cfg = HybridConfig {
        page_size: ps as u32,
        num_pages,
        groups: kinds
            .iter()
            .map(|&kind| GroupSpec {
                kind,
                page_bytes: 4096,
            })
            .collect(),
        enable_prefix_caching: caching,
        enable_events: true,
        policy: None,
    };
    let mut h = Hybrid::new(cfg).unwrap();
    // (hash, group, page) of every cached page, rebuilt from the events alone.
    let mut from_events: HashSet<(u128, usize, u32)> = HashSet::new();
    let mut v = Vllm::new(ps, num_pages, kinds.clone(), caching);
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
                let want = v.begin(id, &toks);
                let got = h.begin(id, &toks, None, toks.len() - 1, 0);
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
            Op::Free { who } => {
                if live.is_empty() {
                    continue;
                }
                let id = live.swap_remove(who % live.len());
                history.push(v.reqs[&id].tokens.clone());
                v.free(id);
                h.free(id).unwrap();
            }
            Op::NewStep => {
                v.new_step();
                h.new_step();
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
                EventKind::Cleared => prop_assert!(false, "no clear"),
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
    let group = |kind, page_bytes| GroupSpec { kind, page_bytes };
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

/// A hit that ends at a chunk boundary needs no page of the chunked group (the first token to
/// compute starts a chunk), so that group looks nothing up: the hit is the full group's pages
/// and null pages for the chunked one, for the lookup and the begin alike.
#[test]
fn a_hit_ending_at_a_chunk_boundary_takes_no_chunked_page() {
    let group = |kind| GroupSpec {
        kind,
        page_bytes: 4096,
    };
    let mut h = Hybrid::new(HybridConfig {
        page_size: 4,
        num_pages: 16,
        groups: vec![group(GroupKind::Full), group(GroupKind::ChunkedLocal(4))],
        enable_prefix_caching: true,
        enable_events: false,
        policy: None,
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

    /// Prefix caching off (h17b's report: the checker indexed the empty indices): no hit,
    /// nothing registered, the same tables and free queue as vLLM's no-cache coordinator.
    #[test]
    fn no_prefix_caching(ops in proptest::collection::vec(op(40, 20), 1..60)) {
        let kinds = vec![GroupKind::SlidingWindow(9), GroupKind::Full, GroupKind::ChunkedLocal(12)];
        run_with(4, 48, kinds, 10, &ops, false)?;
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
        run_with(4, 48, kinds, 10, &ops, false)?;
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
            .map(|&(kind, page_bytes)| GroupSpec { kind, page_bytes })
            .collect(),
        enable_prefix_caching: true,
        enable_events: false,
        policy,
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
