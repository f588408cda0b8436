//! Cache geometry and options, the KV-cache groups, and their validation.
//!
//! A cache holds one or more KV-cache groups. A group is a set of layers that share an attention
//! kind (full, sliding window, chunked local, Mamba / linear-attention state) and therefore one
//! block table per sequence; a plain model is one full-attention group. Groups whose pages have
//! equal bytes draw their pages from one pool (vLLM makes every group's page bytes equal, so a
//! vLLM model has one pool); each pool has `num_device_pages` device pages and `num_host_pages`
//! host pages.

use super::error::{Error, Result};
use super::evict::EvictionPolicy;
use super::pooltier::PoolConfig;
use super::tier::Tier;

/// Element type of the KV cache (and of attention inputs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary16.
    F16,
    /// bfloat16.
    BF16,
    /// 8-bit float E4M3 as OCP's "fn" variant (bias 7, no infinity, largest finite 448): a
    /// quantized KV cache, each element its stored value times the layer's per-tensor scale.
    Fp8E4M3,
    /// 8-bit float E5M2 (bias 15, the upper byte of an IEEE binary16): a quantized KV cache as
    /// [`DType::Fp8E4M3`].
    Fp8E5M2,
    /// 8-bit signed integer: a quantized KV cache whose element stands for its value times the
    /// scale of its channel (kv head and head-dim index; Ascend's and MindIE's int8 KV) and the
    /// layer's per-tensor scale.
    Int8,
    /// 8-bit signed integer with a scale per (token, kv head) row, vLLM's
    /// `int8_per_token_head`: each row of the K (and V) cache is `head_dim` codes followed by
    /// the row's f32 scale, 4 bytes little-endian ([`DType::row_bytes`]); a code stands for its
    /// value times its row's scale and the layer's per-tensor scale.
    Int8PerTokenHead,
}

impl DType {
    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Fp8E4M3 | DType::Fp8E5M2 | DType::Int8 | DType::Int8PerTokenHead => 1,
        }
    }

    /// Bytes of one (token, kv head) row of `head_dim` elements: the elements, and for
    /// [`DType::Int8PerTokenHead`] the row's f32 scale after them (4 more bytes). Strides of a
    /// cache of this type count bytes, so its dense head stride is this too.
    pub fn row_bytes(self, head_dim: usize) -> usize {
        head_dim * self.size_bytes() + self.row_scale_bytes()
    }

    /// Bytes a row holds after its elements: 4 (the f32 scale) for
    /// [`DType::Int8PerTokenHead`], else 0.
    pub fn row_scale_bytes(self) -> usize {
        match self {
            DType::Int8PerTokenHead => 4,
            _ => 0,
        }
    }

    /// Whether this is a quantized KV format (a cache element stands for its value times a
    /// scale; attention inputs and outputs are never of such a type).
    pub fn is_quantized(self) -> bool {
        matches!(
            self,
            DType::Fp8E4M3 | DType::Fp8E5M2 | DType::Int8 | DType::Int8PerTokenHead
        )
    }
}

/// Largest page size accepted (tokens per page). CANN and MindIE stop at 128 for most modes;
/// 1024 leaves room for CPU-only use.
pub const MAX_PAGE_SIZE: u32 = 1024;
/// Largest page count per tier and pool; page ids must fit `i32` block tables with room to spare.
pub const MAX_PAGES: u32 = 1 << 30;
/// Most groups one cache holds (Gemma-3-like models have 2 kinds; vLLM splits layers into
/// groups of equal size, so a few dozen at most).
pub const MAX_GROUPS: usize = 32;

/// The attention of a group's layers, which decides which of a sequence's pages it still needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupKind {
    /// Full attention (MLA too): every page of the sequence, as long as it lives.
    Full,
    /// Sliding-window attention over the last `window` tokens (vLLM `SlidingWindowSpec`).
    SlidingWindow(u32),
    /// Chunked local attention: a token attends to its own chunk of `chunk` tokens (vLLM
    /// `ChunkedLocalAttentionSpec`, Llama 4); `chunk` is a multiple of the page size.
    ChunkedLocal(u32),
    /// Mamba / linear-attention state (vLLM `MambaSpec`): one running state per sequence, in
    /// a page of the group's page bytes, cached at page-aligned checkpoints as the mode says.
    State(StateMode),
}

/// Which full pages of a sliding-window group a sequence registers as prefix hits. A hit in such
/// a group needs the `cdiv(window - 1, page_size)` pages before its end (the group's tail), so
/// a page outside every tail a later lookup can end at only takes room in the index and the
/// cached part of the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WindowRetention {
    /// Every full page, as other kinds register them (vLLM 0.23; vLLM 0.32 with
    /// `prefix_cache_retention_interval` None).
    #[default]
    Dense,
    /// Only the tails ending at the sequence's retention boundaries
    /// ([`State::set_retention`](crate::State::set_retention): vLLM 0.32 gives the prompt's last
    /// token and a lookup's shared-prefix junction), plus, when `segment_pages` is not 0, the
    /// tail ending at every multiple of `segment_pages` pages (vLLM 0.32's
    /// `prefix_cache_retention_interval`, 0 by default, in pages). Segments no longer than a
    /// tail register every page. At most [`MAX_SEGMENT_PAGES`].
    Sparse {
        /// Pages per segment; 0 for no segments.
        segment_pages: u32,
    },
}

/// Most pages a [`WindowRetention::Sparse`] segment can span (what the C ABI's 16-bit field
/// holds).
pub const MAX_SEGMENT_PAGES: u32 = u16::MAX as u32 - 1;

/// Most retention boundaries a sequence keeps
/// ([`State::set_retention`](crate::State::set_retention)).
pub const MAX_RETENTION_BOUNDARIES: usize = 4;

/// How a state group keeps and caches states (vLLM's `mamba_cache_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StateMode {
    /// `"none"` (prefix caching off): one page per sequence, never cached; vLLM's mamba block
    /// is `max_model_len` tokens long, so a request holds exactly one block.
    None,
    /// `"all"`: a page per page of tokens, the state after token `(j + 1) * page_size` in page
    /// `j`; every full page is cached; the sequence keeps only the page holding its last
    /// computed token (vLLM's `get_num_skipped_tokens(n) = n - 1`).
    All,
    /// `"align"` (Qwen3-Next / GDN): the running state in one page at the table's last
    /// position, at most one new page per step, the previous step's page kept until the next
    /// release; a checkpoint is cached when a step ends on a page boundary.
    Align,
}

impl GroupKind {
    /// The window or chunk in tokens; 0 for full attention and state groups.
    pub fn window(self) -> u32 {
        match self {
            GroupKind::Full | GroupKind::State(_) => 0,
            GroupKind::SlidingWindow(w) | GroupKind::ChunkedLocal(w) => w,
        }
    }
}

/// One group: its kind and the bytes of one of its pages (all its layers, K and V).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GroupSpec {
    /// Attention kind.
    pub kind: GroupKind,
    /// Bytes of one page; groups with equal page bytes share one page pool. 0: the bytes the
    /// cache's geometry gives ([`Config::page_bytes`]).
    pub page_bytes: u64,
    /// An EAGLE / MTP group (vLLM's `is_eagle_group`, or every group with `use_eagle`): the
    /// draft model recomputes the last page of a hit for its hidden states, so the hit of an
    /// engine's lookup ([`State::find_hit`](crate::State::find_hit)) ends one page earlier in
    /// this group, and a sliding window finds its tail one page longer before dropping it
    /// (vLLM's `drop_eagle_block`); a begin takes the hit it is capped at. Groups of one kind and
    /// page size are looked up together and drop together when any of them is EAGLE's. Full
    /// attention and sliding windows only.
    pub eagle: bool,
}

impl GroupSpec {
    /// A full-attention group of the cache's geometry.
    pub const FULL: GroupSpec = GroupSpec {
        kind: GroupKind::Full,
        page_bytes: 0,
        eagle: false,
    };
}

/// Geometry and options of one cache. See `kvs_config` in the C header for field meanings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Tokens per page, every group.
    pub page_size: u32,
    /// Pages in the device tier of each pool (including the padding page when reserved).
    pub num_device_pages: u32,
    /// Pages in the host tier of each pool (0: no host tier).
    pub num_host_pages: u32,
    /// Transformer layers of a group whose page bytes are 0 (byte sizes only).
    pub num_layers: u32,
    /// KV heads per layer (byte sizes only).
    pub num_kv_heads: u32,
    /// Head dimension (byte sizes only).
    pub head_dim: u32,
    /// KV element type (byte sizes only).
    pub dtype: DType,
    /// The KV-cache groups, in the engine's order (the index is the group id). Empty: one
    /// full-attention group of this geometry.
    pub groups: Vec<GroupSpec>,
    /// Register full pages in the prefix index and match prompts against it.
    pub enable_prefix_caching: bool,
    /// Reserve device page 0 of each pool as the padding/null page (vLLM's `null_block`); never
    /// allocated. Groups that release pages (windows, chunks, states) need it: a released
    /// position shows it.
    pub reserve_null_page: bool,
    /// Pages that fill up become matchable only after [`State::commit`](crate::State::commit)
    /// (MindIE's `MarkBlocksAsComputed`); otherwise as soon as they are full.
    pub defer_commit: bool,
    /// A prompt shares every cached full page, even the ones holding tokens past
    /// `max_match_tokens` that the engine recomputes (for the last token's logits); the slot
    /// mapping then marks those already-cached slots -1 so the recomputation never writes into a
    /// shared page. A page that fills with content already cached is switched to the cached
    /// copy (dedup). Turn it off for engines that build their own slot mapping (vLLM): such
    /// pages are then allocated fresh and recomputed, and identical pages computed twice are
    /// kept as vLLM keeps them. Sharing past the limit applies to caches of one full-attention
    /// group only (a window must be computed from the first recomputed token).
    pub skip_cached_writes: bool,
    /// With host pages: a cached device page chosen for eviction is copied to a host page and
    /// stays matchable there (promoted back on a hit) instead of being dropped.
    pub demote_to_host: bool,
    /// Queue an event for every page stored in / removed from a tier's index and every clear.
    pub enable_events: bool,
    /// Granularity of prefix hits in tokens: a divisor of `page_size`, or 0 for the page size
    /// (the default). Equal to `page_size`, a hit covers whole pages; smaller, a prompt that
    /// ends or diverges inside a cached page also takes that page's first whole units, copied
    /// into a new page of its own (one partial copy per group queued for `take_copies`).
    /// Engines that cannot execute copies keep the page size. State groups keep checkpoints
    /// only at page boundaries, so a cache with one takes whole pages only.
    pub match_unit: u32,
    /// Keep pages as vLLM's block pool keeps them: a page released with no cached content goes
    /// behind the cached pages (vLLM appends every freed block to its queue), except the pages a
    /// group releases out of its window, which vLLM puts first; and a page filled with content
    /// already cached (two requests computed the same page) is kept as a duplicate that takes
    /// the cached page's place when that one is evicted. Off (the default), a page with no cached
    /// content is always reused before any cached page is evicted, which keeps more prefixes
    /// cached. For lockstep with vLLM's own manager; it keeps vLLM's order, so it takes
    /// [`EvictionPolicy::Lru`] only, and parents are not held back behind their children.
    pub vllm_free_order: bool,
    /// With [`vllm_free_order`](Self::vllm_free_order): every page released with no cached
    /// content goes to the front of the reuse order, the last released first (a batch keeps its
    /// order), as the block pool of newer vLLM releases (0.32) keeps blocks: uncached blocks
    /// are reused before any cached block is evicted, whichever manager freed them. Off (the
    /// default), vLLM 0.23's order: only a window's releases and a sliding-window group's frees
    /// go first. Refused without `vllm_free_order`.
    pub vllm_uncached_first: bool,
    /// Which full pages of a sliding-window group are registered as prefix hits (see
    /// [`WindowRetention`]); every page of the other kinds is. [`WindowRetention::Dense`] by
    /// default.
    pub window_retention: WindowRetention,
    /// The order in which unreferenced cached pages of one retention priority are evicted when
    /// an allocation finds no free page (see [`crate::evict`]). Every policy evicts lower
    /// priorities first and, outside `vllm_free_order`, a full-attention page only after its
    /// cached children.
    pub eviction_policy: EvictionPolicy,
    /// The pool tier: a store shared by engines behind device and host (see
    /// [`crate::pooltier`]). None: no pool tier.
    pub pool: Option<PoolConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            page_size: 16,
            num_device_pages: 1024,
            num_host_pages: 0,
            num_layers: 1,
            num_kv_heads: 1,
            head_dim: 128,
            dtype: DType::F16,
            groups: Vec::new(),
            enable_prefix_caching: true,
            reserve_null_page: false,
            defer_commit: false,
            skip_cached_writes: true,
            demote_to_host: true,
            enable_events: false,
            match_unit: 0,
            vllm_free_order: false,
            vllm_uncached_first: false,
            window_retention: WindowRetention::Dense,
            eviction_policy: EvictionPolicy::Lru,
            pool: None,
        }
    }
}

impl Config {
    /// Checks every field; the error names the first bad one (both, for a combination).
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &'static str, reason: String| Err(Error::InvalidConfig { field, reason });
        if self.page_size == 0 || self.page_size > MAX_PAGE_SIZE {
            return bad(
                "page_size",
                format!("{} is not in 1..={MAX_PAGE_SIZE}", self.page_size),
            );
        }
        let min_device = 1 + u32::from(self.reserve_null_page);
        if self.num_device_pages < min_device || self.num_device_pages > MAX_PAGES {
            return bad(
                "num_device_pages",
                format!(
                    "{} is not in {min_device}..={MAX_PAGES}",
                    self.num_device_pages
                ),
            );
        }
        if self.num_host_pages > MAX_PAGES {
            return bad(
                "num_host_pages",
                format!("{} exceeds {MAX_PAGES}", self.num_host_pages),
            );
        }
        if (self.num_device_pages as u64) * (self.page_size as u64) > i64::MAX as u64 / 2 {
            return bad("num_device_pages", "slot ids would overflow int64".into());
        }
        for (field, v) in [
            ("num_layers", self.num_layers),
            ("num_kv_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
        ] {
            if v == 0 {
                return bad(field, "must be at least 1".into());
            }
        }
        if self.page_bytes().is_none() {
            return bad("head_dim", "bytes per page overflow u64".into());
        }
        if self.match_unit != 0 && !self.page_size.is_multiple_of(self.match_unit) {
            return bad(
                "match_unit",
                format!(
                    "{} does not divide page_size {}",
                    self.match_unit, self.page_size
                ),
            );
        }
        if self.defer_commit && !self.enable_prefix_caching {
            return bad("defer_commit", "needs enable_prefix_caching".into());
        }
        if self.vllm_uncached_first && !self.vllm_free_order {
            return bad(
                "vllm_uncached_first",
                "orders vLLM's block pool and needs vllm_free_order".into(),
            );
        }
        if let WindowRetention::Sparse { segment_pages } = self.window_retention {
            if segment_pages > MAX_SEGMENT_PAGES {
                return bad(
                    "window_retention",
                    format!("segments of {segment_pages} pages: at most {MAX_SEGMENT_PAGES}"),
                );
            }
        }
        if self.vllm_free_order && self.eviction_policy != EvictionPolicy::Lru {
            return bad(
                "eviction_policy",
                format!(
                    "{:?} cannot keep vllm_free_order: vLLM's block pool evicts in LRU order \
                     (vllm_free_order takes eviction_policy Lru)",
                    self.eviction_policy
                ),
            );
        }
        if self.groups.len() > MAX_GROUPS {
            return bad(
                "num_groups",
                format!("{} is more than {MAX_GROUPS}", self.groups.len()),
            );
        }
        for (i, g) in self.groups.iter().enumerate() {
            self.validate_group(i, g)?;
        }
        if let Some(pool) = &self.pool {
            pool.validate(self)?;
        }
        Ok(())
    }

    fn validate_group(&self, i: usize, g: &GroupSpec) -> Result<()> {
        let bad = |field: &'static str, reason: String| Err(Error::InvalidConfig { field, reason });
        match g.kind {
            GroupKind::SlidingWindow(0) | GroupKind::ChunkedLocal(0) => {
                return bad("groups.window", format!("group {i}: must be at least 1"));
            }
            // A chunk boundary inside a page would leave the first computed token's chunk
            // partly in a page the hit treats as out of reach; vLLM refuses such chunks too
            // (its local-attention metadata asserts `attn_chunk_size % block_size == 0`).
            GroupKind::ChunkedLocal(c) if !c.is_multiple_of(self.page_size) => {
                return bad(
                    "groups.window",
                    format!(
                        "group {i}: chunk {c} is not a multiple of page_size {}",
                        self.page_size
                    ),
                );
            }
            // vLLM sets "none" exactly when prefix caching is off, and "all" only with it on.
            GroupKind::State(StateMode::None) if self.enable_prefix_caching => {
                return bad(
                    "groups.window",
                    format!("group {i}: state mode none needs enable_prefix_caching off"),
                );
            }
            GroupKind::State(m @ (StateMode::All | StateMode::Align))
                if !self.enable_prefix_caching =>
            {
                return bad(
                    "groups.window",
                    format!("group {i}: state mode {m:?} needs enable_prefix_caching on"),
                );
            }
            GroupKind::State(_) if self.unit() < self.page_size as usize => {
                return bad(
                    "match_unit",
                    format!(
                        "{} is finer than page_size {} but group {i} is a state group, whose \
                         checkpoints exist only at page boundaries (groups)",
                        self.match_unit, self.page_size
                    ),
                );
            }
            _ => {}
        }
        if g.eagle {
            self.validate_eagle(i, g)?;
        }
        if g.kind != GroupKind::Full && !self.reserve_null_page {
            return bad(
                "reserve_null_page",
                format!(
                    "group {i} ({:?}) releases pages and shows the null page (page 0) at released \
                     positions: reserve_null_page must be on (groups)",
                    g.kind
                ),
            );
        }
        Ok(())
    }

    /// What an EAGLE group `i` cannot be combined with.
    fn validate_eagle(&self, i: usize, g: &GroupSpec) -> Result<()> {
        let bad = |field: &'static str, reason: String| Err(Error::InvalidConfig { field, reason });
        if !matches!(g.kind, GroupKind::Full | GroupKind::SlidingWindow(_)) {
            // vLLM asserts `drop_eagle_block` off for chunked local attention and never drops a
            // state block; its EAGLE with Mamba layers needs speculative state blocks.
            return bad(
                "groups.flags",
                format!(
                    "group {i} ({:?}): EAGLE drops a hit's last page in full-attention and \
                     sliding-window groups only",
                    g.kind
                ),
            );
        }
        if self.unit() < self.page_size as usize {
            return bad(
                "match_unit",
                format!(
                    "{} is finer than page_size {} but group {i} is EAGLE's, whose hits end a \
                     page early for the draft model to recompute (groups.flags)",
                    self.match_unit, self.page_size
                ),
            );
        }
        Ok(())
    }

    /// Bytes of K plus V for one page across all layers of the cache's geometry, or `None` on
    /// overflow. An fp8 or int8 page is its elements alone: its scales are per layer (per tensor
    /// or per channel), held by the engine, not by the page; an int8 per-token-head page holds
    /// each row's scale after the row ([`DType::row_bytes`]).
    pub fn page_bytes(&self) -> Option<u64> {
        let row = (self.head_dim as u64)
            .checked_mul(self.dtype.size_bytes() as u64)?
            .checked_add(self.dtype.row_scale_bytes() as u64)?;
        2u64.checked_mul(self.num_layers as u64)?
            .checked_mul(self.page_size as u64)?
            .checked_mul(self.num_kv_heads as u64)?
            .checked_mul(row)
    }

    /// The groups, the implicit full-attention group when none is given.
    pub fn group_specs(&self) -> Vec<GroupSpec> {
        if self.groups.is_empty() {
            vec![GroupSpec::FULL]
        } else {
            self.groups.clone()
        }
    }

    /// Bytes of one page of `spec` (its own, or the geometry's when 0).
    pub fn group_page_bytes(&self, spec: &GroupSpec) -> u64 {
        match spec.page_bytes {
            0 => self.page_bytes().unwrap_or(0),
            b => b,
        }
    }

    /// Number of pages in a tier (each pool).
    pub fn num_pages(&self, tier: Tier) -> u32 {
        match tier {
            Tier::Device => self.num_device_pages,
            Tier::Host => self.num_host_pages,
        }
    }

    /// Tokens per match unit: `match_unit`, or the page size when it is 0.
    pub fn unit(&self) -> usize {
        match self.match_unit {
            0 => self.page_size as usize,
            u => u as usize,
        }
    }

    /// Pages of `tier` in each pool that can ever hold KV (the padding page excluded).
    pub fn usable_pages(&self, tier: Tier) -> u32 {
        match tier {
            Tier::Device => self.num_device_pages - u32::from(self.reserve_null_page),
            Tier::Host => self.num_host_pages,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid() {
        Config::default().validate().unwrap();
    }

    fn groups(kinds: &[GroupKind]) -> Config {
        Config {
            reserve_null_page: true,
            groups: kinds
                .iter()
                .map(|&kind| GroupSpec {
                    kind,
                    page_bytes: 0,
                    eagle: false,
                })
                .collect(),
            ..Config::default()
        }
    }

    /// [`groups`] with every group EAGLE's.
    fn eagle(kinds: &[GroupKind]) -> Config {
        let mut c = groups(kinds);
        c.groups.iter_mut().for_each(|g| g.eagle = true);
        c
    }

    #[test]
    fn bad_fields_are_named() {
        type Mutation = Box<dyn Fn(&mut Config)>;
        let cases: Vec<(&str, Mutation)> = vec![
            ("page_size", Box::new(|c| c.page_size = 0)),
            ("page_size", Box::new(|c| c.page_size = MAX_PAGE_SIZE + 1)),
            ("num_device_pages", Box::new(|c| c.num_device_pages = 0)),
            (
                "num_device_pages",
                Box::new(|c| {
                    c.num_device_pages = 1;
                    c.reserve_null_page = true;
                }),
            ),
            (
                "num_host_pages",
                Box::new(|c| c.num_host_pages = MAX_PAGES + 1),
            ),
            ("num_layers", Box::new(|c| c.num_layers = 0)),
            ("num_kv_heads", Box::new(|c| c.num_kv_heads = 0)),
            ("head_dim", Box::new(|c| c.head_dim = 0)),
            ("match_unit", Box::new(|c| c.match_unit = 5)),
            ("match_unit", Box::new(|c| c.match_unit = 32)),
            (
                "defer_commit",
                Box::new(|c| {
                    c.defer_commit = true;
                    c.enable_prefix_caching = false;
                }),
            ),
            (
                "num_groups",
                Box::new(|c| c.groups = vec![GroupSpec::FULL; MAX_GROUPS + 1]),
            ),
            (
                "vllm_uncached_first",
                Box::new(|c| c.vllm_uncached_first = true),
            ),
            (
                "window_retention",
                Box::new(|c| {
                    c.window_retention = WindowRetention::Sparse {
                        segment_pages: MAX_SEGMENT_PAGES + 1,
                    }
                }),
            ),
            // vLLM's order is LRU's.
            (
                "eviction_policy",
                Box::new(|c| {
                    c.vllm_free_order = true;
                    c.eviction_policy = EvictionPolicy::S3Fifo;
                }),
            ),
            (
                "groups.window",
                Box::new(|c| *c = groups(&[GroupKind::SlidingWindow(0)])),
            ),
            (
                "groups.window",
                Box::new(|c| *c = groups(&[GroupKind::ChunkedLocal(0)])),
            ),
            // Chunks are whole pages (page_size 16 here), as vLLM requires.
            (
                "groups.window",
                Box::new(|c| *c = groups(&[GroupKind::Full, GroupKind::ChunkedLocal(24)])),
            ),
            // vLLM: "none" exactly when prefix caching is off (on by default).
            (
                "groups.window",
                Box::new(|c| *c = groups(&[GroupKind::State(StateMode::None)])),
            ),
            (
                "groups.window",
                Box::new(|c| {
                    *c = groups(&[GroupKind::State(StateMode::Align)]);
                    c.enable_prefix_caching = false;
                }),
            ),
            // A window shows the null page at released positions.
            (
                "reserve_null_page",
                Box::new(|c| {
                    *c = groups(&[GroupKind::Full, GroupKind::SlidingWindow(8)]);
                    c.reserve_null_page = false;
                }),
            ),
            // States are checkpointed at page boundaries only.
            (
                "match_unit",
                Box::new(|c| {
                    *c = groups(&[GroupKind::Full, GroupKind::State(StateMode::All)]);
                    c.match_unit = 4;
                }),
            ),
        ];
        let eagle_cases: Vec<(&str, Config)> = vec![
            ("groups.flags", eagle(&[GroupKind::ChunkedLocal(16)])),
            ("groups.flags", eagle(&[GroupKind::State(StateMode::All)])),
            ("match_unit", {
                let mut c = eagle(&[GroupKind::Full, GroupKind::SlidingWindow(8)]);
                c.match_unit = 4;
                c
            }),
        ];
        for (field, c) in eagle_cases {
            match c.validate() {
                Err(Error::InvalidConfig { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: expected InvalidConfig, got {other:?}"),
            }
        }
        eagle(&[GroupKind::Full, GroupKind::SlidingWindow(8)])
            .validate()
            .unwrap();
        for (field, mutate) in cases {
            let mut c = Config::default();
            mutate(&mut c);
            match c.validate() {
                Err(Error::InvalidConfig { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: expected InvalidConfig, got {other:?}"),
            }
        }
        groups(&[GroupKind::ChunkedLocal(16), GroupKind::ChunkedLocal(48)])
            .validate()
            .unwrap();
        let mut c = groups(&[GroupKind::Full, GroupKind::SlidingWindow(8)]);
        c.match_unit = 4;
        c.validate().unwrap();
    }

    #[test]
    fn page_bytes() {
        let c = Config {
            num_layers: 2,
            num_kv_heads: 8,
            head_dim: 128,
            page_size: 16,
            ..Config::default()
        };
        assert_eq!(c.page_bytes(), Some(2 * 2 * 16 * 8 * 128 * 2));
        for dtype in [DType::Fp8E4M3, DType::Fp8E5M2, DType::Int8] {
            let q = Config { dtype, ..c.clone() };
            assert_eq!(q.page_bytes(), Some(2 * 2 * 16 * 8 * 128));
        }
        // Per-token-head int8: each (token, kv head) row carries its 4-byte scale.
        let q = Config {
            dtype: DType::Int8PerTokenHead,
            ..c.clone()
        };
        assert_eq!(q.page_bytes(), Some(2 * 2 * 16 * 8 * (128 + 4)));
        assert_eq!(DType::Int8PerTokenHead.row_bytes(128), 132);
        assert_eq!(DType::BF16.row_bytes(128), 256);
        assert_eq!(c.usable_pages(Tier::Device), 1024);
        assert_eq!(c.group_specs(), vec![GroupSpec::FULL]);
        assert_eq!(
            c.group_page_bytes(&GroupSpec::FULL),
            c.page_bytes().unwrap()
        );
        let c = Config {
            reserve_null_page: true,
            ..c
        };
        assert_eq!(c.usable_pages(Tier::Device), 1023);
    }
}
