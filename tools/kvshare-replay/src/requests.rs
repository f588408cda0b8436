//! The replay's state of each request: its phase, its parallel samples (one cache-manager
//! sequence each), and the queue of requests waiting for admission in the order the schedule
//! says.

use std::collections::{BTreeMap, VecDeque};

use kvshare_core::ExtraKeys;

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
    /// Chain digests of its full pages so far (offline reference, per-group ideal).
    pub(super) keys: Vec<u128>,
}

/// Where a request is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Arrived, waiting for the previous turn of its conversation to finish.
    Blocked,
    /// Waiting for admission.
    Queued,
    /// On the device.
    Running,
    /// Preempted to the host tier.
    Swapped,
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
    /// The next turn of its conversation, waiting for it to finish.
    pub(super) next_turn: Option<usize>,
    /// Its conversation's order (the trace index of the conversation's first turn) and its turn.
    pub(super) conversation: (usize, usize),
}

/// The order in which requests waiting for admission are admitted (`--schedule`).
///
/// In both, a turn of a conversation waits for the previous turn to finish before it joins the
/// queue (a client sends turn k+1 after reading reply k, whatever the trace's time says), and a
/// request preempted for recomputation goes back to the queue's head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Schedule {
    /// First come, first served: requests are admitted in the order they joined the queue, so
    /// a turn that waited for its predecessor joins behind everything that arrived meanwhile and
    /// many conversations interleave.
    #[default]
    Fcfs,
    /// Conversations in order: a waiting turn of a conversation that started earlier is admitted
    /// before any turn of a conversation that started later, so a conversation's next turn
    /// follows its previous one while its history is still cached.
    SessionAffinity,
}

impl Schedule {
    /// `fcfs` or `session-affinity`.
    pub fn name(self) -> &'static str {
        match self {
            Schedule::Fcfs => "fcfs",
            Schedule::SessionAffinity => "session-affinity",
        }
    }

    /// The schedule called `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        [Schedule::Fcfs, Schedule::SessionAffinity]
            .into_iter()
            .find(|s| s.name() == name)
    }
}

/// Requests waiting for admission (trace indices), in the schedule's order.
#[derive(Debug, Clone)]
pub(super) struct Queue {
    schedule: Schedule,
    /// Preempted requests, first out first.
    head: VecDeque<usize>,
    /// FCFS: in the order they joined.
    fifo: VecDeque<usize>,
    /// Session affinity: by (conversation order, turn, index).
    ordered: BTreeMap<(usize, usize, usize), ()>,
}

impl Queue {
    pub(super) fn new(schedule: Schedule) -> Self {
        Queue {
            schedule,
            head: VecDeque::new(),
            fifo: VecDeque::new(),
            ordered: BTreeMap::new(),
        }
    }

    /// Request `i` of conversation `conversation` (order, turn) joins the queue.
    pub(super) fn push(&mut self, i: usize, conversation: (usize, usize)) {
        match self.schedule {
            Schedule::Fcfs => self.fifo.push_back(i),
            Schedule::SessionAffinity => {
                self.ordered.insert((conversation.0, conversation.1, i), ());
            }
        }
    }

    /// A preempted request goes back to the head.
    pub(super) fn push_head(&mut self, i: usize) {
        self.head.push_front(i);
    }

    /// The request admitted next.
    pub(super) fn front(&self) -> Option<usize> {
        self.head.front().copied().or(match self.schedule {
            Schedule::Fcfs => self.fifo.front().copied(),
            Schedule::SessionAffinity => self.ordered.keys().next().map(|k| k.2),
        })
    }

    /// Takes the request [`front`](Self::front) returned.
    pub(super) fn pop(&mut self) -> Option<usize> {
        if let Some(i) = self.head.pop_front() {
            return Some(i);
        }
        match self.schedule {
            Schedule::Fcfs => self.fifo.pop_front(),
            Schedule::SessionAffinity => self.ordered.pop_first().map(|(k, _)| k.2),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.front().is_none()
    }
}

/// The cache manager's sequence id of sample `sample` of request `req`.
pub(super) fn seq_id(req: usize, sample: usize) -> u64 {
    ((req as u64) << 16) | sample as u64
}
