//! The replay's state of each request: its phase, its parallel samples (one cache-manager
//! sequence each) and the conversation order of turns.

use kvshare_core::ExtraKeys;

use super::trace::Request;

/// One parallel sample of a request: its sequence in the cache manager and how far it got.
#[derive(Debug, Clone)]
pub(super) struct SampleSeq {
    /// Its sequence id in the cache manager ([`seq_id`]).
    pub(super) seq: u64,
    /// Tokens in the sequence (prompt plus output appended).
    pub(super) len: usize,
    /// Output tokens appended.
    pub(super) out: usize,
    /// Freed after its last token.
    pub(super) done: bool,
}

/// Where a request is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Its arrival time has not come yet.
    NotArrived,
    /// Arrived, waiting for the previous turn of its conversation to finish.
    Blocked,
    /// Waiting for admission.
    Queued,
    /// On the device.
    Running,
    /// Preempted to the host tier.
    Swapped,
    /// Every sample finished.
    Done,
}

/// The replay's state of one request.
#[derive(Debug, Clone)]
pub(super) struct RequestState {
    pub(super) phase: Phase,
    pub(super) samples: Vec<SampleSeq>,
    /// Started (begin called) at least once.
    pub(super) started: bool,
    /// Admitted (or swapped in) during the current step: no decode this step.
    pub(super) fresh: bool,
    /// Admission count when it was last admitted (the latest admitted is preempted first).
    pub(super) admitted_order: u64,
    /// Its salt and LoRA id as the cache manager's extra keys.
    pub(super) extra: Option<ExtraKeys>,
}

/// Each request's 1-based turn in its conversation, and the request of its previous turn.
pub(super) fn turn_numbers(reqs: &[Request]) -> (Vec<usize>, Vec<Option<usize>>) {
    let mut last: std::collections::HashMap<&str, (usize, usize)> = Default::default();
    let mut turn = Vec::with_capacity(reqs.len());
    let mut prev = Vec::with_capacity(reqs.len());
    for (i, r) in reqs.iter().enumerate() {
        match &r.session {
            None => {
                turn.push(1);
                prev.push(None);
            }
            Some(s) => {
                let e = last.get(s.as_str()).copied();
                turn.push(e.map_or(1, |(_, t)| t + 1));
                prev.push(e.map(|(j, _)| j));
                last.insert(s.as_str(), (i, e.map_or(1, |(_, t)| t + 1)));
            }
        }
    }
    (turn, prev)
}

/// The cache manager's sequence id of sample `sample` of request `req`.
pub(super) fn seq_id(req: usize, sample: usize) -> u64 {
    ((req as u64) << 16) | sample as u64
}
