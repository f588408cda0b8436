//! What a sequence's KV writes touch and when a page's content counts as final: the pages an
//! append copies before writing, and the computed-token mark (`State::set_computed`) that keeps
//! pages whose KV is not written yet out of the prefix index, the pool tier and content-shared
//! swaps.

use kvshare_core::{Config, Error, EvictionPolicy, PageCopy, State};

mod support;
use support::toks;

/// Tokens of `tokens` the device index matches now (a read-only probe).
fn cached(s: &mut State, tokens: &[i32]) -> usize {
    s.match_prefix(0, tokens, None, usize::MAX, false, usize::MAX)
        .unwrap()
        .tokens
}

fn deferred(policy: EvictionPolicy) -> State {
    State::new(Config {
        page_size: 4,
        num_device_pages: 32,
        num_host_pages: 16,
        defer_commit: true,
        eviction_policy: policy,
        ..Config::default()
    })
    .unwrap()
}

/// A prompt given whole and computed a chunk per step (MindIE's chunked prefill): a commit makes
/// only the pages within the computed tokens hits, the rest once the mark covers them.
#[test]
fn a_commit_registers_only_the_pages_within_the_computed_tokens() {
    for policy in EvictionPolicy::ALL {
        let mut s = deferred(policy);
        s.begin(1, &toks(0..12), None, usize::MAX, 0).unwrap();
        s.set_computed(1, 5).unwrap();
        s.commit();
        s.check().unwrap();
        assert_eq!(cached(&mut s, &toks(0..12)), 4, "{policy:?}");
        // The next chunk: every page computed.
        s.set_computed(1, 12).unwrap();
        assert_eq!(
            cached(&mut s, &toks(0..12)),
            4,
            "{policy:?}: before the commit"
        );
        s.commit();
        s.check().unwrap();
        assert_eq!(cached(&mut s, &toks(0..12)), 12, "{policy:?}");
        s.free(1).unwrap();
        s.check().unwrap();
    }
}

/// Without deferred commits the mark gates registration at once; raising it registers.
#[test]
fn without_deferred_commits_raising_the_mark_registers_at_once() {
    let mut s = State::new(Config {
        page_size: 4,
        num_device_pages: 32,
        ..Config::default()
    })
    .unwrap();
    s.begin(1, &toks(0..4), None, usize::MAX, 0).unwrap();
    s.set_computed(1, 4).unwrap();
    s.append(1, &toks(4..12), 0, &mut Vec::new(), 0).unwrap();
    assert_eq!(cached(&mut s, &toks(0..12)), 4);
    s.set_computed(1, 8).unwrap();
    assert_eq!(cached(&mut s, &toks(0..12)), 8);
    s.free(1).unwrap();
    s.check().unwrap();
}

/// A swap-out registers the host copy of a page only when its KV is written, so a later swap-out
/// of the same content never shares a copy taken before the KV was there (it copies its own).
#[test]
fn a_swap_shares_host_copies_of_computed_pages_only() {
    for policy in EvictionPolicy::ALL {
        let mut s = deferred(policy);
        s.begin(1, &toks(0..12), None, usize::MAX, 0).unwrap();
        s.set_computed(1, 5).unwrap();
        s.commit();
        let mut copies: Vec<PageCopy> = Vec::new();
        s.swap_out(1, &mut copies, usize::MAX).unwrap();
        assert_eq!(copies.len(), 3, "{policy:?}");
        // The same prompt, computed whole: its first page's host copy is shared, the other two
        // are copied.
        s.begin(2, &toks(0..12), None, 0, 0).unwrap();
        s.commit();
        copies.clear();
        s.swap_out(2, &mut copies, usize::MAX).unwrap();
        assert_eq!(copies.len(), 2, "{policy:?}: {copies:?}");
        s.check().unwrap();
        // Swapped back in, the first sequence computes the rest; swapped out again it shares
        // the second sequence's copies, now of final content, and copies nothing.
        copies.clear();
        s.swap_in(1, &mut copies, usize::MAX).unwrap();
        s.set_computed(1, 12).unwrap();
        s.commit();
        copies.clear();
        s.swap_out(1, &mut copies, usize::MAX).unwrap();
        assert!(copies.is_empty(), "{policy:?}: {copies:?}");
        s.free(1).unwrap();
        s.free(2).unwrap();
        s.check().unwrap();
    }
}

/// A commit that met a placeholder below the mark stops hashing there; the pages before it
/// still become hits once the mark covers them.
#[test]
fn pages_before_a_placeholder_register_once_the_mark_covers_them() {
    let mut s = deferred(EvictionPolicy::Lru);
    let mut prompt = toks(0..12);
    prompt[5] = -1;
    s.begin(1, &prompt, None, usize::MAX, 0).unwrap();
    s.set_computed(1, 0).unwrap();
    s.commit();
    assert_eq!(cached(&mut s, &prompt), 0);
    s.set_computed(1, 12).unwrap();
    s.commit();
    assert_eq!(cached(&mut s, &prompt), 4);
    s.free(1).unwrap();
    s.check().unwrap();
}

/// The pages of a prefix hit hold final KV whatever the mark says: a swap shares their host
/// copies.
#[test]
fn hit_pages_are_final_below_the_mark() {
    for policy in EvictionPolicy::ALL {
        let mut s = deferred(policy);
        s.begin(1, &toks(0..8), None, usize::MAX, 0).unwrap();
        s.commit();
        let mut copies: Vec<PageCopy> = Vec::new();
        s.swap_out(1, &mut copies, usize::MAX).unwrap();
        assert_eq!(copies.len(), 2, "{policy:?}");
        let hit = s.begin(2, &toks(0..12), None, usize::MAX, 0).unwrap();
        assert_eq!(hit.matched_tokens, 8, "{policy:?}");
        s.set_computed(2, 0).unwrap();
        copies.clear();
        s.swap_out(2, &mut copies, usize::MAX).unwrap();
        assert_eq!(copies.len(), 1, "{policy:?}: {copies:?}");
        s.free(1).unwrap();
        s.free(2).unwrap();
        s.check().unwrap();
    }
}

/// Refused, with nothing changed: an unknown sequence, more tokens than it holds.
#[test]
fn a_bad_mark_is_refused() {
    let mut s = deferred(EvictionPolicy::Lru);
    s.begin(1, &toks(0..8), None, usize::MAX, 0).unwrap();
    assert!(matches!(s.set_computed(9, 0), Err(Error::SeqNotFound(9))));
    let e = s.set_computed(1, 9).unwrap_err();
    assert!(e.to_string().contains("num_computed_tokens"), "{e}");
    s.commit();
    assert_eq!(cached(&mut s, &toks(0..8)), 8);
    s.check().unwrap();
}

/// In align mode a sequence whose tokens fill its last page holds the checkpoint after them
/// there; another request's hit on it (vLLM: a new request with the same prefix while the first
/// one runs), or a fork at the page boundary, shares that page. The owner's next step only reads
/// it for the new page's state: no copy, and an append given no room for copies succeeds, as
/// vLLM's `allocate_slots` gives none.
#[test]
fn a_full_align_checkpoint_another_holder_shares_is_read_not_copied() {
    use kvshare_core::{GroupKind, GroupSpec, StateMode};
    for fork in [false, true] {
        let mut s = State::new(Config {
            page_size: 4,
            num_device_pages: 32,
            reserve_null_page: true,
            enable_prefix_caching: true,
            groups: vec![
                GroupSpec::FULL,
                GroupSpec {
                    kind: GroupKind::State(StateMode::Align),
                    page_bytes: 0,
                    eagle: false,
                },
            ],
            ..Config::default()
        })
        .unwrap();
        s.begin(1, &toks(0..8), None, usize::MAX, 0).unwrap();
        let checkpoint = s.state_page(1, 1).unwrap();
        if fork {
            s.fork(1, 2).unwrap();
        } else {
            s.new_step();
            let hit = s.begin(2, &toks(0..9), None, 8, 0).unwrap();
            assert_eq!(hit.matched_tokens, 8);
        }
        let mut copies = Vec::new();
        s.append(1, &[80], 0, &mut copies, 0).unwrap();
        assert!(copies.is_empty(), "fork {fork}: {copies:?}");
        assert_ne!(s.state_page(1, 1).unwrap(), checkpoint, "fork {fork}");
        s.check().unwrap();
        s.append(2, &[90], 0, &mut copies, 0).unwrap();
        assert!(copies.is_empty(), "fork {fork}: {copies:?}");
        s.check().unwrap();
        s.free(1).unwrap();
        s.free(2).unwrap();
        s.check().unwrap();
        assert_eq!(s.stats().device_pages_in_use, 0);
    }
}
