//! What a KV-cache group is: its attention kind (and window), its page bytes, and the geometry
//! of a cache made of groups, with their validation.

use super::super::config::{MAX_PAGES, MAX_PAGE_SIZE};
use super::super::error::{Error, Result};

/// Most groups one hybrid cache holds (Gemma-3-like models have 2 specs; vLLM splits layers
/// into groups of equal size, so a few dozen at most).
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
    /// Tokens at the start of a sequence this group no longer reads once `computed` tokens have
    /// KV (vLLM's `get_num_skipped_tokens`): the next token attends to none of them.
    pub fn skipped_tokens(self, computed: usize) -> usize {
        match self {
            GroupKind::Full => 0,
            GroupKind::SlidingWindow(w) => (computed + 1).saturating_sub(w as usize),
            GroupKind::ChunkedLocal(c) => computed / c as usize * c as usize,
            // MambaManager: only the state after the last computed token is needed. "none"
            // keeps its one page wherever the sequence is (see `Hybrid`).
            GroupKind::State(StateMode::All | StateMode::Align) => computed.saturating_sub(1),
            GroupKind::State(StateMode::None) => 0,
        }
    }

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
    /// Bytes of one page; groups with equal page bytes share one page pool.
    pub page_bytes: u64,
}

/// Geometry and options of a cache made of groups ([`super::Hybrid`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HybridConfig {
    /// Tokens per page, every group.
    pub page_size: u32,
    /// Pages in each pool, page 0 (the null page) included.
    pub num_pages: u32,
    /// The groups, in the engine's order (the index is the `group_idx`).
    pub groups: Vec<GroupSpec>,
    /// Register full pages and match prompts against them.
    pub enable_prefix_caching: bool,
    /// Queue an event for every page stored in / removed from a group's index.
    pub enable_events: bool,
}

impl HybridConfig {
    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &'static str, reason: String| Err(Error::InvalidConfig { field, reason });
        if self.page_size == 0 || self.page_size > MAX_PAGE_SIZE {
            return bad(
                "page_size",
                format!("{} is not in 1..={MAX_PAGE_SIZE}", self.page_size),
            );
        }
        if self.num_pages < 2 || self.num_pages > MAX_PAGES {
            return bad(
                "num_pages",
                format!("{} is not in 2..={MAX_PAGES}", self.num_pages),
            );
        }
        if (self.num_pages as u64) * (self.page_size as u64) > i64::MAX as u64 / 2 {
            return bad("num_pages", "slot ids would overflow int64".into());
        }
        if self.groups.is_empty() || self.groups.len() > MAX_GROUPS {
            return bad(
                "num_groups",
                format!("{} is not in 1..={MAX_GROUPS}", self.groups.len()),
            );
        }
        for (i, g) in self.groups.iter().enumerate() {
            if g.page_bytes == 0 {
                return bad(
                    "groups.page_bytes",
                    format!("group {i}: must be at least 1"),
                );
            }
            if let GroupKind::SlidingWindow(0) | GroupKind::ChunkedLocal(0) = g.kind {
                return bad("groups.window", format!("group {i}: must be at least 1"));
            }
            // A chunk boundary inside a page would leave the first computed token's chunk
            // partly in a page the hit treats as out of reach. vLLM refuses such chunks too
            // (its local-attention metadata asserts `attn_chunk_size % block_size == 0`).
            if let GroupKind::ChunkedLocal(c) = g.kind {
                if !c.is_multiple_of(self.page_size) {
                    return bad(
                        "groups.window",
                        format!(
                            "group {i}: chunk {c} is not a multiple of page_size {}",
                            self.page_size
                        ),
                    );
                }
            }
            // vLLM sets "none" exactly when prefix caching is off, and "all" only with it on.
            match (g.kind, self.enable_prefix_caching) {
                (GroupKind::State(StateMode::None), true) => {
                    return bad(
                        "groups.window",
                        format!("group {i}: state mode none needs prefix caching off"),
                    )
                }
                (GroupKind::State(m @ (StateMode::All | StateMode::Align)), false) => {
                    return bad(
                        "groups.window",
                        format!("group {i}: state mode {m:?} needs prefix caching on"),
                    )
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The pool of each group (pools numbered by first appearance of their page bytes), and
    /// the number of pools.
    pub fn pools(&self) -> (Vec<usize>, usize) {
        let mut bytes: Vec<u64> = Vec::new();
        let of = self
            .groups
            .iter()
            .map(|g| match bytes.iter().position(|&b| b == g.page_bytes) {
                Some(p) => p,
                None => {
                    bytes.push(g.page_bytes);
                    bytes.len() - 1
                }
            })
            .collect();
        (of, bytes.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(groups: Vec<GroupSpec>) -> HybridConfig {
        HybridConfig {
            page_size: 16,
            num_pages: 64,
            groups,
            enable_prefix_caching: true,
            enable_events: false,
        }
    }

    fn g(kind: GroupKind, page_bytes: u64) -> GroupSpec {
        GroupSpec { kind, page_bytes }
    }

    #[test]
    fn skipped_tokens_match_vllm_examples() {
        // SlidingWindowManager.get_num_skipped_tokens: window 4, 7 computed -> 4.
        assert_eq!(GroupKind::SlidingWindow(4).skipped_tokens(7), 4);
        assert_eq!(GroupKind::SlidingWindow(4).skipped_tokens(2), 0);
        // ChunkedLocalAttentionManager: chunk 8 -> 13: 8, 8: 8, 7: 0.
        let c = GroupKind::ChunkedLocal(8);
        assert_eq!(
            (
                c.skipped_tokens(13),
                c.skipped_tokens(8),
                c.skipped_tokens(7)
            ),
            (8, 8, 0)
        );
        assert_eq!(GroupKind::Full.skipped_tokens(1 << 20), 0);
        // MambaManager.get_num_skipped_tokens: n - 1 (nothing at 0); "none" keeps its page.
        for m in [StateMode::All, StateMode::Align] {
            assert_eq!(GroupKind::State(m).skipped_tokens(7), 6);
            assert_eq!(GroupKind::State(m).skipped_tokens(0), 0);
        }
        assert_eq!(GroupKind::State(StateMode::None).skipped_tokens(99), 0);
    }

    #[test]
    fn pools_follow_page_bytes() {
        let c = cfg(vec![
            g(GroupKind::Full, 100),
            g(GroupKind::SlidingWindow(8), 50),
            g(GroupKind::SlidingWindow(8), 100),
        ]);
        assert_eq!(c.pools(), (vec![0, 1, 0], 2));
    }

    #[test]
    fn bad_fields_are_named() {
        let cases = [
            ("num_groups", cfg(vec![])),
            ("groups.page_bytes", cfg(vec![g(GroupKind::Full, 0)])),
            (
                "groups.window",
                cfg(vec![g(GroupKind::SlidingWindow(0), 1)]),
            ),
            ("groups.window", cfg(vec![g(GroupKind::ChunkedLocal(0), 1)])),
            // Chunks are whole pages (page_size 16 here), as vLLM requires.
            (
                "groups.window",
                cfg(vec![g(GroupKind::ChunkedLocal(24), 1)]),
            ),
            (
                "groups.window",
                cfg(vec![
                    g(GroupKind::Full, 1),
                    g(GroupKind::ChunkedLocal(8), 1),
                ]),
            ),
            // vLLM: "none" exactly when prefix caching is off (cfg has it on).
            (
                "groups.window",
                cfg(vec![g(GroupKind::State(StateMode::None), 1)]),
            ),
            (
                "groups.window",
                HybridConfig {
                    enable_prefix_caching: false,
                    ..cfg(vec![g(GroupKind::State(StateMode::Align), 1)])
                },
            ),
            (
                "num_pages",
                HybridConfig {
                    num_pages: 1,
                    ..cfg(vec![g(GroupKind::Full, 1)])
                },
            ),
            (
                "page_size",
                HybridConfig {
                    page_size: 0,
                    ..cfg(vec![g(GroupKind::Full, 1)])
                },
            ),
        ];
        for (field, c) in cases {
            match c.validate() {
                Err(Error::InvalidConfig { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: {other:?}"),
            }
        }
        cfg(vec![g(GroupKind::Full, 1)]).validate().unwrap();
        cfg(vec![
            g(GroupKind::ChunkedLocal(16), 1),
            g(GroupKind::ChunkedLocal(48), 1),
        ])
        .validate()
        .unwrap();
    }
}
