//! vLLM's side of the model-based test: a line-by-line port of what vLLM 0.23's hybrid manager
//! does with one shared block pool (the module doc of `core_groups.rs` lists what it follows).

use super::*;

/// vLLM's side, one pool.
pub struct Vllm {
    pub ps: usize,
    pub kinds: Vec<GroupKind>,
    /// Spec groups (identical specs together), full attention first.
    pub sets: Vec<Vec<usize>>,
    /// The free queue, head first.
    pub queue: Vec<u32>,
    pub ref_cnt: Vec<u32>,
    pub block_hash: Vec<Option<(u128, usize)>>,
    /// `cached_block_hash_to_block`: blocks per (hash, group), insertion order.
    pub cached: HashMap<(u128, usize), Vec<u32>>,
    pub reqs: HashMap<u64, Req>,
    /// `enable_caching` (off: vLLM's `KVCacheCoordinatorNoPrefixCache`: no hit, nothing cached).
    pub caching: bool,
    /// Per group: `MambaManager.cached_blocks_this_step`.
    pub this_step: Vec<HashSet<u128>>,
    /// vLLM 0.32's `BlockPool.free_blocks`: freed blocks without a hash (all, without caching)
    /// go to the front of the queue, the others to its back, each in the given order,
    /// whatever the caller asked (0.32 has no `prepend`).
    pub uncached_first: bool,
    /// vLLM 0.32's `prefix_cache_retention_interval` (tokens): None dense, 0 only the tails
    /// before each request's `reachable_boundaries`, positive also one tail per segment.
    pub retention: Option<usize>,
    /// Per spec group (`sets`): `SpecGroup.use_eagle` (one of its groups is in
    /// `eagle_group_ids`).
    pub set_eagle: Vec<bool>,
}

/// vLLM's mamba block size in mode "none": `max_model_len` (longer than any test sequence).
pub const MAX_MODEL_LEN: usize = 1 << 30;

pub struct Req {
    pub tokens: Vec<i32>,
    pub hashes: Vec<u128>,
    pub blocks: Vec<Vec<u32>>,
    pub num_cached: Vec<usize>,
    /// Align mode: `last_state_block_idx` and `_allocated_block_reqs`, per group.
    pub last_state: Vec<Option<usize>>,
    pub allocated: Vec<bool>,
    /// `replay_boundaries` plus the request's `shared_prefix_boundary` (sparse retention).
    pub boundaries: Vec<usize>,
}

pub fn hashes_of(tokens: &[i32], ps: usize) -> Vec<u128> {
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
    pub fn new(ps: usize, num_pages: u32, kinds: Vec<GroupKind>, caching: bool) -> Self {
        let mut sets: Vec<Vec<usize>> = Vec::new();
        for (g, k) in kinds.iter().enumerate() {
            match sets.iter_mut().find(|s| kinds[s[0]] == *k) {
                Some(s) => s.push(g),
                None => sets.push(vec![g]),
            }
        }
        sets.sort_by_key(|s| kinds[s[0]] != GroupKind::Full);
        let n_sets = sets.len();
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
            uncached_first: false,
            retention: None,
            set_eagle: vec![false; n_sets],
        }
    }

    /// `eagle_group_ids`: the groups of `mask` (bits); a spec group drops when any of its
    /// groups is one.
    pub fn set_eagle_groups(&mut self, mask: u32) {
        self.set_eagle = self
            .sets
            .iter()
            .map(|s| s.iter().any(|&g| mask & (1 << g) != 0))
            .collect();
    }

    /// Whether group `g`'s manager has `use_eagle` (its spec group's bit, propagated).
    pub fn eagle_of(&self, g: usize) -> bool {
        self.sets
            .iter()
            .zip(&self.set_eagle)
            .any(|(s, &e)| e && s.contains(&g))
    }

    /// Block size of group `g`: the page size, or `max_model_len` for a "none" state group.
    pub fn bs(&self, g: usize) -> usize {
        match self.kinds[g] {
            GroupKind::State(StateMode::None) => MAX_MODEL_LEN,
            _ => self.ps,
        }
    }

    /// `KVCacheManager.new_step_starts`.
    pub fn new_step(&mut self) {
        self.this_step.iter_mut().for_each(HashSet::clear);
    }

    pub fn get_cached_block(&self, h: u128, gids: &[usize]) -> Option<Vec<u32>> {
        gids.iter()
            .map(|&g| self.cached.get(&(h, g)).map(|v| v[0]))
            .collect()
    }

    pub fn find(
        &self,
        kind: GroupKind,
        gids: &[usize],
        hashes: &[u128],
        max_len: usize,
        drop_eagle_block: bool,
    ) -> Vec<Vec<u32>> {
        let ps = self.ps;
        let max_blocks = max_len / ps;
        let mut out = self.find_kind(kind, gids, hashes, max_len, max_blocks, drop_eagle_block);
        // Full attention and sliding windows drop the last matched block (chunked local
        // attention asserts no drop; mamba ignores it: the cache refuses both with EAGLE).
        if drop_eagle_block && !out[0].is_empty() {
            out.iter_mut().for_each(|o| {
                o.pop();
            });
        }
        out
    }

    fn find_kind(
        &self,
        kind: GroupKind,
        gids: &[usize],
        hashes: &[u128],
        max_len: usize,
        max_blocks: usize,
        drop_eagle_block: bool,
    ) -> Vec<Vec<u32>> {
        let ps = self.ps;
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
                // `_contiguous_blocks_for_hit`: one block more for EAGLE.
                let need = (w as usize - 1).div_ceil(ps) + usize::from(drop_eagle_block);
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

    pub fn find_longest_cache_hit(&self, hashes: &[u128], max: usize) -> (Vec<Vec<u32>>, usize) {
        if !self.caching {
            return (vec![Vec::new(); self.kinds.len()], 0);
        }
        let mut by_group: Vec<Option<Vec<u32>>> = vec![None; self.kinds.len()];
        let simple = self.sets.len() == 2 && self.kinds[self.sets[0][0]] == GroupKind::Full;
        let mut hit = max;
        let mut eagle_verified: HashSet<usize> = HashSet::new();
        loop {
            let mut curr = hit;
            for (idx, set) in self.sets.iter().enumerate() {
                let kind = self.kinds[set[0]];
                if kind == GroupKind::Full && by_group[set[0]].is_some() {
                    curr = curr / self.ps * self.ps;
                    continue;
                }
                let drop = self.set_eagle[idx] && !eagle_verified.contains(&idx);
                let max_length = if drop {
                    (curr + self.ps).min(max)
                } else {
                    curr
                };
                let blocks = self.find(kind, set, hashes, max_length, drop);
                let new = blocks[0].len() * self.ps;
                if drop {
                    eagle_verified.insert(idx);
                } else if new < curr {
                    eagle_verified.clear();
                }
                curr = new;
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

    pub fn skipped(&self, g: usize, computed: usize) -> usize {
        match self.kinds[g] {
            GroupKind::Full => 0,
            GroupKind::SlidingWindow(w) => (computed + 1).saturating_sub(w as usize),
            GroupKind::ChunkedLocal(c) => computed / c as usize * c as usize,
            // MambaManager.get_num_skipped_tokens: num_computed_tokens - 1.
            GroupKind::State(_) => computed.saturating_sub(1),
        }
    }

    /// `BlockPool.reset_prefix_cache`: refused while a block is in use; otherwise every hash
    /// is forgotten and the free queue stays as it is.
    pub fn reset_prefix_cache(&mut self) -> bool {
        if self.ref_cnt.iter().any(|&r| r > 0) {
            return false;
        }
        self.cached.clear();
        self.block_hash.iter_mut().for_each(|h| *h = None);
        true
    }

    pub fn get_new_blocks(&mut self, n: usize) -> Vec<u32> {
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

    pub fn touch(&mut self, blocks: &[u32]) {
        for &b in blocks.iter().filter(|&&b| b != NULL) {
            if self.ref_cnt[b as usize] == 0 {
                self.queue.retain(|&x| x != b);
            }
            self.ref_cnt[b as usize] += 1;
        }
    }

    pub fn free_blocks(&mut self, blocks: &[u32], prepend: bool) {
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
        if self.uncached_first {
            let caching = self.caching;
            let (cached, mut first): (Vec<u32>, Vec<u32>) = freed
                .into_iter()
                .partition(|&b| caching && self.block_hash[b as usize].is_some());
            first.append(&mut self.queue);
            self.queue = first;
            self.queue.extend(cached);
        } else if prepend {
            freed.append(&mut self.queue);
            self.queue = freed;
        } else {
            self.queue.extend(freed);
        }
    }

    pub fn remove_skipped_blocks(&mut self, id: u64, computed: usize) {
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

    /// vLLM 0.32's `SlidingWindowManager.reachable_block_mask` (alignment one block) for
    /// blocks `start..end` of a window group: None caches every block.
    fn reachable_block_mask(
        &self,
        (window, use_eagle): (usize, bool),
        start: usize,
        end: usize,
        boundaries: &[usize],
    ) -> Option<Vec<bool>> {
        let interval = self.retention?;
        let need = (window - 1).div_ceil(self.ps) + usize::from(use_eagle);
        let shift = usize::from(use_eagle);
        let mut mask = vec![false; end.saturating_sub(start)];
        if interval > 0 {
            let per = interval / self.ps;
            if need >= per {
                return None;
            }
            for i in start..end {
                if i >= shift && (i - shift) % per >= per - need {
                    mask[i - start] = true;
                }
            }
        }
        for &b in boundaries {
            let e = b / self.ps + shift;
            for j in start.max(e.saturating_sub(need))..end.min(e) {
                mask[j - start] = true;
            }
        }
        Some(mask)
    }

    pub fn cache_blocks(&mut self, id: u64, num_tokens: usize) {
        if !self.caching {
            return;
        }
        // An EAGLE manager may cache one block past the aligned boundary
        // (`min(num_computed, aligned + block_size)`): with alignment one block, that is
        // `num_tokens` itself.
        let full = num_tokens / self.ps;
        for g in 0..self.kinds.len() {
            let (start, bounds) = (self.reqs[&id].num_cached[g], &self.reqs[&id].boundaries);
            let mask = match self.kinds[g] {
                GroupKind::SlidingWindow(w) => {
                    self.reachable_block_mask((w as usize, self.eagle_of(g)), start, full, bounds)
                }
                _ => None,
            };
            let r = self.reqs.get_mut(&id).unwrap();
            for j in r.num_cached[g]..full {
                let b = r.blocks[g][j];
                if b == NULL || mask.as_ref().is_some_and(|m| !m[j - start]) {
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

    /// `get_computed_blocks` + `allocate_slots` of a new request scheduling all its tokens, `ext`
    /// of them after the hit computed by a KV connector (`num_external_computed_tokens`, loaded
    /// at once): `get_num_blocks_to_allocate` and
    /// `allocate_new_computed_blocks` skip at the hit plus those tokens, every group's blocks
    /// for them come first, then every group's for the rest (`allocate_new_blocks`).
    pub fn begin_external(
        &mut self,
        id: u64,
        tokens: &[i32],
        ext: usize,
        boundaries: &[usize],
    ) -> Option<usize> {
        let hashes = hashes_of(tokens, self.ps);
        let (hit_blocks, hit) = self.find_longest_cache_hit(&hashes, tokens.len() - 1);
        let computed = hit + ext;
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
            let skipped = self.skipped(g, computed) / self.bs(g);
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
            let skipped = self.skipped(g, computed) / self.bs(g);
            let live = &b[skipped.min(b.len())..];
            self.touch(live);
            let mut t = vec![NULL; skipped];
            t.extend_from_slice(live);
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
                boundaries: boundaries.to_vec(),
            },
        );
        if ext > 0 {
            for g in 0..n {
                let r = self.reqs.get_mut(&id).unwrap();
                let have = r.blocks[g].len();
                let new = self.get_new_blocks(computed.div_ceil(self.bs(g)).saturating_sub(have));
                self.reqs.get_mut(&id).unwrap().blocks[g].extend(new);
            }
        }
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
    pub fn step(&mut self, id: u64, tokens: &[i32], release: bool) -> bool {
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
    pub fn allocate_new_blocks(&mut self, id: u64, g: usize, required: usize) {
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

    /// vLLM 0.32's deferred free: the scheduler takes `pop_blocks_for_free`'s one list of
    /// every group's blocks in group order, and later gives it reversed to `free_blocks`.
    pub fn free_deferred(&mut self, id: u64) {
        let r = self.reqs.remove(&id).unwrap();
        let list: Vec<u32> = r.blocks.iter().flatten().rev().copied().collect();
        self.free_blocks(&list, false);
    }

    pub fn free(&mut self, id: u64) {
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
