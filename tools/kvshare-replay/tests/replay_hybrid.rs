//! `kvshare-replay --window/--chunk` (`replay::hybrid`): a hybrid model's groups against the
//! full-attention model of the same size on one workload, with the invariant checker after
//! every step. A window longer than any sequence must change nothing; a short window must keep
//! the window groups at their ideal (never fewer pages than the window needs, at most a page
//! per sequence more: the page released one step later) and below the full group; a pool too
//! small for everyone must preempt and still finish; state groups (`--state`) must hold about one
//! page per running sequence and hit on their checkpoints.

use kvshare_core::{GroupKind, StateMode};
use kvshare_replay::hybrid::{hybrid_kinds, replay_groups, HybridReplayConfig};
use kvshare_replay::workload::ChatWorkload;
use kvshare_replay::Request;

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

fn cfg(kinds: Vec<GroupKind>, num_pages: u32) -> HybridReplayConfig {
    HybridReplayConfig {
        kinds,
        page_size: 16,
        num_pages,
        concurrency: 4,
        step_ms: 20.0,
        check: true,
    }
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
    assert_eq!(hy.hit_tokens, full.hit_tokens);
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
    assert!(out.preemptions > 0);
    assert!(out.peak_in_use <= 59);
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
        assert!(out.hit_tokens <= full.hit_tokens, "{mode:?}");
        assert!(out.hit_tokens > full.hit_tokens / 2, "{mode:?}: {out:?}");
        assert_eq!(out.steps, full.steps, "{mode:?}");
    }
}
