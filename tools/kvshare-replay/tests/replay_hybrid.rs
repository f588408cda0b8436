//! `kvshare-replay --window/--chunk/--state`: a hybrid model's groups, replayed by the same loop
//! as a plain model, against the full-attention model of the same size on one workload, with the
//! invariant checker after every step. A window longer than any sequence must change nothing; a short window must keep
//! the window groups at their ideal (never fewer pages than the window needs, at most a page
//! per sequence more: the page released one step later) and below the full group; a pool too
//! small for everyone must preempt and still finish; state groups (`--state`) must hold about one
//! page per running sequence and hit on their checkpoints.

use kvshare_core::{EvictionPolicy, GroupKind, StateMode};
use kvshare_replay::hybrid::hybrid_kinds;
use kvshare_replay::workload::ChatWorkload;
use kvshare_replay::{replay, NoModel, Outcome, ReplayConfig, Request, Schedule};

fn workload() -> Vec<Request> {
    ChatWorkload {
        users: 4,
        turns: 4,
        system_tokens: 96,
        user_tokens: (10, 30),
        output_tokens: (20, 60),
        fork_every: 0,
        think_ms: (0, 200),
        ..ChatWorkload::default()
    }
    .generate()
}

fn cfg(kinds: Vec<GroupKind>, num_pages: u32) -> ReplayConfig {
    ReplayConfig {
        groups: kinds,
        page_size: 16,
        device_pages: num_pages,
        concurrency: 4,
        step_ms: 20.0,
        check: true,
        ..ReplayConfig::default()
    }
}

fn replay_groups(reqs: &[Request], c: &ReplayConfig) -> Result<Outcome, String> {
    replay(reqs, c, &mut NoModel, &mut |_| {})
}

#[test]
fn a_window_longer_than_every_sequence_changes_nothing() {
    let reqs = workload();
    let full = replay_groups(&reqs, &cfg(vec![GroupKind::Full], 401)).unwrap();
    let hy = replay_groups(
        &reqs,
        &cfg(hybrid_kinds(GroupKind::SlidingWindow(100_000), 3), 1201),
    )
    .unwrap();
    for g in &hy.groups {
        assert_eq!(g.peak_pages, full.groups[0].peak_pages);
        assert_eq!(g.mean_pages, full.groups[0].mean_pages);
        assert_eq!(g.released, 0);
    }
    assert_eq!(hy.hit_tokens(), full.hit_tokens());
    assert_eq!(hy.steps, full.steps);
}

#[test]
fn short_windows_and_chunks_hold_their_ideal() {
    let reqs = workload();
    for local in [GroupKind::SlidingWindow(64), GroupKind::ChunkedLocal(128)] {
        let out = replay_groups(&reqs, &cfg(hybrid_kinds(local, 4), 1601)).unwrap();
        let full = &out.groups[0];
        assert_eq!(
            full.peak_pages, full.ideal_peak,
            "{local:?}: full group at its ideal"
        );
        for g in &out.groups[1..] {
            assert!(g.released > 0, "{local:?}: pages were released");
            assert!(
                g.mean_pages >= g.ideal_mean,
                "{local:?}: never below the ideal"
            );
            assert!(g.mean_pages <= g.ideal_mean + 4.0, "{local:?}: {g:?}");
            assert!(
                g.mean_pages < 0.8 * full.mean_pages,
                "{local:?}: {g:?} vs {full:?}"
            );
        }
        assert!(out.mean_model_pages() < full.mean_pages);
    }
}

#[test]
fn a_small_pool_preempts_and_finishes() {
    let reqs = workload();
    let out = replay_groups(
        &reqs,
        &cfg(hybrid_kinds(GroupKind::SlidingWindow(32), 2), 60),
    )
    .unwrap();
    assert!(out.recomputes > 0);
    assert!(out.series.kvshare_peak <= 59);
}

#[test]
fn state_groups_hold_one_state_per_sequence_and_resume_from_checkpoints() {
    let reqs = workload();
    let full = replay_groups(&reqs, &cfg(vec![GroupKind::Full], 401)).unwrap();
    for mode in [StateMode::All, StateMode::Align] {
        let out =
            replay_groups(&reqs, &cfg(hybrid_kinds(GroupKind::State(mode), 4), 1601)).unwrap();
        assert_eq!(
            out.groups[0].peak_pages, out.groups[0].ideal_peak,
            "{mode:?}"
        );
        for g in &out.groups[1..] {
            assert!(g.released > 0, "{mode:?}: states were released");
            assert!(g.mean_pages >= g.ideal_mean, "{mode:?}: {g:?}");
            // The running state, plus the previous one or a prefill's checkpoints for a step.
            assert!(g.mean_pages <= 2.0 * g.ideal_mean + 1.0, "{mode:?}: {g:?}");
        }
        // Resuming needs the checkpoint at the hit: at most the full model's hits, and some.
        assert!(out.hit_tokens() <= full.hit_tokens(), "{mode:?}");
        assert!(
            out.hit_tokens() > full.hit_tokens() / 2,
            "{mode:?}: {} of {}",
            out.hit_tokens(),
            full.hit_tokens()
        );
        assert_eq!(out.steps, full.steps, "{mode:?}");
    }
}

#[test]
fn hybrid_turns_wait_for_their_previous_turn_under_both_schedules() {
    let reqs = workload();
    for schedule in [Schedule::Fcfs, Schedule::SessionAffinity] {
        for policy in EvictionPolicy::ALL {
            let c = ReplayConfig {
                schedule,
                policy,
                ..cfg(hybrid_kinds(GroupKind::SlidingWindow(64), 3), 200)
            };
            let out = replay_groups(&reqs, &c).unwrap();
            // Turn k+1 of a conversation starts after turn k finished.
            for (i, r) in reqs.iter().enumerate() {
                let prev = reqs[..i].iter().rposition(|p| p.session == r.session);
                if let (Some(p), Some(_)) = (prev, &r.session) {
                    assert!(
                        out.requests[i].start_ms >= out.requests[p].finish_ms,
                        "{schedule:?} {policy:?}: {} started before {} finished",
                        r.id,
                        reqs[p].id
                    );
                }
            }
            assert_eq!(out.groups.len(), 3);
            assert!(out.groups[1].released > 0);
        }
    }
}

/// Forked samples (n = 2) share their last page in every group: a decode step can copy on write
/// once per sample and group. Each kind of group, six groups, with and without a host tier, under
/// memory pressure, must finish with the checker quiet; the host tier must not lose hits.
#[test]
fn forked_samples_copy_in_every_group_with_and_without_a_host_tier() {
    let reqs = ChatWorkload {
        users: 4,
        turns: 5,
        system_tokens: 96,
        user_tokens: (10, 30),
        output_tokens: (20, 60),
        fork_every: 2,
        think_ms: (0, 200),
        ..ChatWorkload::default()
    }
    .generate();
    assert!(
        reqs.iter().any(|r| r.outputs.len() > 1),
        "the workload forks"
    );
    for local in [
        GroupKind::SlidingWindow(64),
        GroupKind::ChunkedLocal(64),
        GroupKind::State(StateMode::All),
        GroupKind::State(StateMode::Align),
    ] {
        let mut hits = Vec::new();
        for host in [0, 2000] {
            let c = ReplayConfig {
                host_pages: host,
                ..cfg(hybrid_kinds(local, 6), 6 * 60 + 1)
            };
            let out =
                replay_groups(&reqs, &c).unwrap_or_else(|e| panic!("{local:?}, host {host}: {e}"));
            assert_eq!(out.requests.len(), reqs.len());
            hits.push(out.hit_tokens());
        }
        assert!(
            hits[1] >= hits[0],
            "{local:?}: host tier {} < {}",
            hits[1],
            hits[0]
        );
    }
}
