//! The sequence record and what sequence operations report. The operations themselves are in
//! `begin.rs`, `append.rs`, `sequences.rs` (fork, free, release) and `swap.rs`.

use super::pooltier::SeqPool;
use super::prefix::ExtraKeys;
use super::rules::GrowState;
use super::tier::Tier;

/// What a page of a prompt is looked up and registered under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PageKey {
    /// Chain digest `h_i`.
    pub hash: u128,
    /// Extra-key digest `e_i`.
    pub extra: u128,
}

/// Marks a released position in a host-tier table (a device table shows the null page there).
pub(crate) const HOST_NULL: u32 = u32::MAX;

/// One sequence (request, or one beam of it): its tokens and one block table per group.
#[derive(Debug, Clone)]
pub(crate) struct Seq {
    pub tokens: Vec<i32>,
    pub extra: Option<Box<ExtraKeys>>,
    /// Keys of the first `keys.len()` full pages, up to the first page holding a placeholder.
    pub keys: Vec<PageKey>,
    /// A page with a placeholder (negative) token was reached: no later page is hashed.
    pub hash_stopped: bool,
    /// Per group: page ids; the null page (device) or [`HOST_NULL`] (host) at released
    /// positions.
    pub tables: Vec<Vec<u32>>,
    /// Per group: positions below this were offered to the group's index.
    pub offered: Vec<usize>,
    /// Per group: what a state group remembers between steps.
    pub grow: Vec<GrowState>,
    /// Per group: positions (ascending) of pages switched to an identical cached page when they
    /// filled up (dedup): their slots are never written.
    pub borrowed: Vec<Vec<u32>>,
    pub tier: Tier,
    /// Full pages await [`super::State::commit`] (defer_commit mode).
    pub pending: bool,
    /// Tokens whose KV the engine has written ([`super::State::set_computed`]; `usize::MAX`:
    /// all of them). Only pages within them are registered, stored to the pool tier, or shared
    /// by content on a swap: the content of the others is not final.
    pub computed: usize,
    pub matched_tokens: usize,
    /// Tokens at the start whose KV sits in shared cached pages: their slots are never written.
    pub cached_tokens: usize,
    /// The batch call that last listed this sequence (duplicate detection).
    pub stamp: u64,
    /// Retention priority its pages keep once cached (higher is evicted later).
    pub priority: u8,
    /// Its loads from the pool tier (outstanding, or the positions they served).
    pub pool: Option<Box<SeqPool>>,
    /// Retention boundaries (token positions) of sparse window retention.
    pub retain: Vec<usize>,
}

impl Seq {
    /// LoRA id of the sequence (0: base model).
    pub fn lora(&self) -> u64 {
        self.extra.as_ref().map_or(0, |x| x.lora_id)
    }

    /// The chain digest of the page before full page `j` (`root` for the first).
    pub fn parent(&self, j: usize, root: u128) -> u128 {
        if j == 0 {
            root
        } else {
            self.keys[j - 1].hash
        }
    }

    /// Leading full pages whose KV is written: their content is final (see `computed`; the
    /// pages of its prefix hit always are).
    pub fn final_pages(&self, ps: usize) -> usize {
        self.tokens.len().min(self.computed.max(self.cached_tokens)) / ps
    }

    /// Pages in every group's table (they are all as long).
    pub fn len(&self) -> usize {
        self.tables[0].len()
    }
}

/// What [`super::State::begin`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BeginInfo {
    /// Prompt tokens whose KV was found cached (a multiple of the page size, or of the match
    /// unit when the hit ends inside a page): the engine may skip computing them.
    pub matched_tokens: usize,
    /// Positions in every group's block table.
    pub num_pages: usize,
    /// Pages newly allocated (all groups) for tokens to compute (the rest are prefix hits).
    pub new_pages: usize,
    /// Prefix-hit pages promoted from the host tier (their copies are queued: `take_copies`).
    pub promoted_pages: usize,
    /// Tokens of `matched_tokens` found in the first units of a cached page and copied into
    /// the sequence's own page (one partial copy per group queued: `take_copies`); 0 with
    /// whole-page matching.
    pub unit_tokens: usize,
    /// Positions of `matched_tokens` whose pages load from the pool tier (one load per group
    /// each, from `take_pool_work`); the match is final once they are reported
    /// (`pool_loading` is 0, `seq_info` gives it).
    pub pool_pages: usize,
}

/// What [`super::State::append_need`] reports: what an append would take, without the append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendNeed {
    /// Device pages it would take (new capacity plus copy-on-write replacements), all groups.
    pub pages: usize,
    /// Page copies it would report.
    pub copies: usize,
}

/// A sequence's current shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqInfo {
    /// Tokens (prompt plus appended).
    pub num_tokens: usize,
    /// Positions in each group's block table (may exceed what the tokens need by reserved
    /// lookahead).
    pub num_pages: usize,
    /// Tokens matched in the prefix index at begin.
    pub matched_tokens: usize,
    /// Where the pages are.
    pub tier: Tier,
}
