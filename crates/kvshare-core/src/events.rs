//! KV events: what entered and left the prefix index, per tier, for routers and offload tiers.
//!
//! With `Config::enable_events`, every page stored in or removed from a group's index in a tier,
//! and every clear, is queued as an [`Event`]; the engine drains the queue in batches. Applying the events
//! in order to an empty set of `(tier, group, hash)` gives exactly the registered pages.

use std::collections::VecDeque;

use super::tier::Tier;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A page was registered under `hash` in `tier`.
    Stored,
    /// The page registered under `hash` in `tier` was dropped (evicted, demoted or cleared).
    Removed,
    /// Every entry of `tier` was dropped.
    Cleared,
}

/// One index change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// Kind of change.
    pub kind: EventKind,
    /// Tier whose index changed.
    pub tier: Tier,
    /// Chain digest `h_i` of the page (0 for `Cleared`).
    pub hash: u128,
    /// Chain digest of the previous page (`root_hash()` for a first page; 0 unless `Stored`).
    pub parent: u128,
    /// LoRA id of the sequence that stored it (0 unless `Stored`).
    pub lora_id: u64,
    /// Tokens in the page (the page size; 0 for `Cleared`).
    pub num_tokens: u32,
    /// Page id in `tier` (0 for `Cleared`).
    pub page: u32,
    /// The group whose index changed (0 in a cache of one group; 0 for `Cleared`, which
    /// clears every group of the tier).
    pub group: u32,
}

/// Events kept when nobody drains them; older events are dropped (and counted) past this.
pub const MAX_QUEUED_EVENTS: usize = 1 << 20;

/// A bounded FIFO of events.
#[derive(Debug, Default)]
pub struct EventQueue {
    enabled: bool,
    queue: VecDeque<Event>,
    dropped: u64,
}

impl EventQueue {
    /// A queue that records only when `enabled`.
    pub fn new(enabled: bool) -> Self {
        EventQueue {
            enabled,
            ..Default::default()
        }
    }

    /// Queues `e` (dropping the oldest event when full).
    pub fn push(&mut self, e: Event) {
        if !self.enabled {
            return;
        }
        if self.queue.len() == MAX_QUEUED_EVENTS {
            self.queue.pop_front();
            self.dropped += 1;
        }
        self.queue.push_back(e);
    }

    /// Removes and returns up to `max` oldest events.
    pub fn take(&mut self, max: usize) -> Vec<Event> {
        let n = max.min(self.queue.len());
        self.queue.drain(..n).collect()
    }

    /// Events waiting.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether none is waiting.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Events dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}
