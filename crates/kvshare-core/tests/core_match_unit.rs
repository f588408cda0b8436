//! Scenario tests of hits finer than a page (`Config::match_unit`): what a hit inside a page
//! shares, copies and holds. The random-operation coverage is in `core_model.rs`.

use kvshare_core::{Config, CopyKind, Error, PageCopy, PageState, State, Tier};

fn state(ps: u32, unit: u32, device: u32, host: u32) -> State {
    State::new(Config {
        page_size: ps,
        match_unit: unit,
        num_device_pages: device,
        num_host_pages: host,
        ..Config::default()
    })
    .unwrap()
}

/// `0..n`, then `tail` tokens from 1000 on.
fn prompt(n: i32, tail: std::ops::Range<i32>) -> Vec<i32> {
    (0..n).chain(tail.map(|t| 1000 + t)).collect()
}

#[test]
fn hit_inside_a_page_shares_full_pages_and_copies_whole_units() {
    let mut s = state(8, 2, 16, 0);
    let a = prompt(16, 0..3);
    s.begin(1, &a, None, usize::MAX, 0).unwrap();
    let pa = s.seq_pages(1, 0).unwrap().to_vec();
    s.free(1).unwrap();
    // Shares 13 tokens with `a`: page 0 whole, then 5 tokens of page 1, so 2 units (4 tokens).
    let b = prompt(13, 50..60);
    // The read-only lookup announces the units with the shared page (an engine's scheduler
    // asks it before allocating); a limit inside a unit drops that unit.
    assert_eq!(s.find_hit(&b, None, usize::MAX), (12, vec![vec![pa[0]]]));
    assert_eq!(s.find_hit(&b, None, 11).0, 10);
    assert_eq!(s.find_hit(&b, None, 7), (6, vec![vec![]]));
    let info = s.begin(2, &b, None, usize::MAX, 0).unwrap();
    assert_eq!((info.matched_tokens, info.unit_tokens), (12, 4));
    assert_eq!((info.num_pages, info.new_pages), (3, 2));
    let pb = s.seq_pages(2, 0).unwrap().to_vec();
    assert_eq!(pb[0], pa[0], "the full page is shared");
    assert_ne!(
        pb[1], pa[1],
        "the partly matched page is the sequence's own"
    );
    // The source is held (refcount 1, in use) until the copy is taken.
    assert_eq!(
        s.page_info(Tier::Device, 0, pa[1]).unwrap(),
        (1, PageState::InUse, true)
    );
    s.check().unwrap();
    let st = s.stats();
    assert_eq!((st.counters.unit_hits, st.counters.unit_hit_tokens), (1, 4));
    assert_eq!(st.counters.prefix_hit_tokens, 12);
    assert_eq!(
        s.take_copies(usize::MAX),
        vec![PageCopy {
            src_page: pa[1],
            dst_page: pb[1],
            num_tokens: 4,
            kind: CopyKind::DeviceToDevice,
            group: 0,
        }]
    );
    assert_eq!(
        s.page_info(Tier::Device, 0, pa[1]).unwrap(),
        (0, PageState::Cached, true),
        "taking the copy drops the hold"
    );
    s.check().unwrap();
}

#[test]
fn whole_page_unit_changes_nothing() {
    for unit in [0, 8] {
        let mut s = state(8, unit, 16, 0);
        s.begin(1, &prompt(16, 0..3), None, usize::MAX, 0).unwrap();
        let info = s
            .begin(2, &prompt(13, 50..60), None, usize::MAX, 0)
            .unwrap();
        assert_eq!((info.matched_tokens, info.unit_tokens), (8, 0));
        assert!(s.take_copies(usize::MAX).is_empty());
    }
}

#[test]
fn unit_hits_respect_the_match_limit_and_recover_the_last_page() {
    let mut s = state(8, 2, 16, 0);
    let a = prompt(16, 0..0);
    s.begin(1, &a, None, usize::MAX, 0).unwrap();
    // The same 16 tokens, the last one recomputed: page 1 is shared no more (without
    // skip_cached_writes it would be written) but its first 3 units are copied.
    let mut s2 = State::new(Config {
        page_size: 8,
        match_unit: 2,
        num_device_pages: 16,
        skip_cached_writes: false,
        ..Config::default()
    })
    .unwrap();
    s2.begin(1, &a, None, usize::MAX, 0).unwrap();
    // While sequence 1 runs, its pages are no unit source (they may have filled this step and
    // hold no KV until the step's writes, which come after the copies).
    let info = s2.begin(5, &a, None, 15, 0).unwrap();
    assert_eq!((info.matched_tokens, info.unit_tokens), (8, 0));
    s2.free(5).unwrap();
    s2.free(1).unwrap();
    let info = s2.begin(2, &a, None, 15, 0).unwrap();
    assert_eq!((info.matched_tokens, info.unit_tokens), (14, 6));
    s2.check().unwrap();
    // With skip_cached_writes both pages are shared and no unit hit is needed.
    let info = s.begin(2, &a, None, 15, 0).unwrap();
    assert_eq!((info.matched_tokens, info.unit_tokens), (15, 0));
    // A limit inside the first unit of page 1 matches page 0 only.
    let info = s2.begin(3, &prompt(16, 0..4), None, 9, 0).unwrap();
    assert_eq!((info.matched_tokens, info.unit_tokens), (8, 0));
}

#[test]
fn held_source_is_neither_evicted_nor_reused_before_its_copy_is_taken() {
    // 4 device pages, no host: `a` leaves 2 cached pages.
    let mut s = state(4, 2, 4, 0);
    let a = prompt(8, 0..0);
    s.begin(1, &a, None, usize::MAX, 0).unwrap();
    let pa = s.seq_pages(1, 0).unwrap().to_vec();
    s.free(1).unwrap();
    // b hits page 0 and 2 tokens of page 1 (a's page 1 is the held source).
    let b = prompt(6, 0..0);
    let b: Vec<i32> = b.into_iter().chain([7000, 7001]).collect();
    let info = s.begin(2, &b, None, usize::MAX, 0).unwrap();
    assert_eq!((info.matched_tokens, info.unit_tokens), (6, 2));
    // Two free pages were left; b took one. The held source is not evictable: a prompt needing
    // two more pages is refused rather than taking it.
    assert_eq!(s.available(Tier::Device, 0).unwrap(), 1);
    let c = prompt(0, 500..508);
    assert!(matches!(
        s.begin(3, &c, None, usize::MAX, 0),
        Err(Error::NoSpace { .. })
    ));
    let copies = s.take_copies(usize::MAX);
    assert_eq!(copies.len(), 1);
    assert_eq!((copies[0].src_page, copies[0].num_tokens), (pa[1], 2));
    // Taken, the source is cached again and an allocation may evict it.
    assert_eq!(s.available(Tier::Device, 0).unwrap(), 2);
    s.begin(3, &c, None, usize::MAX, 0).unwrap();
    s.check().unwrap();
}

#[test]
fn a_demoted_source_is_copied_from_the_host_tier() {
    let mut s = state(4, 2, 3, 4);
    let a = prompt(8, 0..0);
    s.begin(1, &a, None, usize::MAX, 0).unwrap();
    s.free(1).unwrap();
    // Fill the device: a's two pages are evicted and demoted to the host.
    s.begin(2, &prompt(0, 100..112), None, usize::MAX, 0)
        .unwrap();
    assert_eq!(s.stats().counters.demotions, 2);
    s.take_copies(usize::MAX);
    s.free(2).unwrap();
    let b: Vec<i32> = prompt(6, 0..0).into_iter().chain([7000, 7001]).collect();
    // The device tier holds neither page now: the lookup finds no whole page, but the units a
    // begin would copy from a host page.
    assert_eq!(s.find_hit(&b, None, usize::MAX).0, 2);
    let info = s.begin(3, &b, None, usize::MAX, 0).unwrap();
    assert_eq!((info.matched_tokens, info.unit_tokens), (6, 2));
    assert_eq!(info.promoted_pages, 1);
    s.check().unwrap();
    let copies = s.take_copies(usize::MAX);
    let kinds: Vec<(CopyKind, u32)> = copies.iter().map(|c| (c.kind, c.num_tokens)).collect();
    assert!(kinds.contains(&(CopyKind::HostToDevice, 4)), "{kinds:?}");
    assert!(kinds.contains(&(CopyKind::HostToDevice, 2)), "{kinds:?}");
    assert_eq!(s.stats().host_pages_in_use, 0, "the host hold is dropped");
    s.check().unwrap();
}

#[test]
fn partial_page_is_published_only_once_full() {
    let mut s = State::new(Config {
        page_size: 4,
        match_unit: 1,
        num_device_pages: 8,
        enable_events: true,
        ..Config::default()
    })
    .unwrap();
    s.begin(1, &prompt(8, 0..0), None, usize::MAX, 0).unwrap();
    let stored = s.take_events(usize::MAX).len();
    assert_eq!(stored, 2);
    s.begin(2, &prompt(6, 0..0), None, usize::MAX, 0).unwrap();
    assert!(
        s.take_events(usize::MAX).is_empty(),
        "6 tokens: no new full page"
    );
    let mut copies = vec![];
    s.append(2, &[9000, 9001], 0, &mut copies, 1).unwrap();
    let ev = s.take_events(usize::MAX);
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].num_tokens, 4);
    s.check().unwrap();
}

#[test]
fn match_unit_must_divide_the_page() {
    for unit in [3, 16] {
        let cfg = Config {
            page_size: 8,
            match_unit: unit,
            ..Config::default()
        };
        assert!(matches!(
            State::new(cfg),
            Err(Error::InvalidConfig {
                field: "match_unit",
                ..
            })
        ));
    }
}

#[test]
fn a_finished_sequence_keeps_the_whole_units_of_its_last_page() {
    let mut s = State::new(Config {
        page_size: 8,
        match_unit: 2,
        num_device_pages: 4,
        enable_events: true,
        ..Config::default()
    })
    .unwrap();
    // Turn 1 ends 3 tokens into page 1: one whole unit is kept, unpublished.
    let turn1 = prompt(11, 0..0);
    s.begin(1, &turn1, None, usize::MAX, 0).unwrap();
    let p1 = s.seq_pages(1, 0).unwrap()[1];
    s.free(1).unwrap();
    assert_eq!(
        s.page_info(Tier::Device, 0, p1).unwrap(),
        (0, PageState::Cached, true)
    );
    let events = s.take_events(usize::MAX);
    assert_eq!(
        events.len(),
        1,
        "only the full page is published: {events:?}"
    );
    assert_eq!(s.stats().index_pages, 1);
    s.check().unwrap();
    // Turn 2 repeats turn 1 and goes on: page 0 shared, 2 tokens of page 1 copied.
    let turn2 = prompt(11, 0..6);
    let info = s.begin(2, &turn2, None, usize::MAX, 0).unwrap();
    assert_eq!((info.matched_tokens, info.unit_tokens), (10, 2));
    let copies = s.take_copies(usize::MAX);
    assert_eq!((copies[0].src_page, copies[0].num_tokens), (p1, 2));
    s.free(2).unwrap();
    // Evicting the partial page publishes nothing either; clearing drops it.
    s.begin(3, &prompt(0, 100..132), None, usize::MAX, 0)
        .unwrap();
    // Four pages evicted: two full ones (page 0 and turn 2's page 1) and the partial one.
    let removed = s
        .take_events(usize::MAX)
        .iter()
        .filter(|e| e.kind == kvshare_core::EventKind::Removed)
        .count();
    assert_eq!(removed, 2);
    assert_eq!(s.stats().counters.evictions, 3);
    s.check().unwrap();
    s.free(3).unwrap();
    s.clear_index();
    s.check().unwrap();
    assert_eq!(
        s.begin(4, &turn2, None, usize::MAX, 0)
            .unwrap()
            .matched_tokens,
        0
    );
}

/// Tokens computed elsewhere past a unit hit (`begin_computed`, a KV connector's): full
/// attention still reads the hit's page and copies its units into its own page; a sliding
/// window that no longer reads that page takes the null page there and no copy, and holds no
/// source. The matched tokens are the units' all the same.
#[test]
fn a_window_past_a_unit_hit_takes_no_copy() {
    use kvshare_core::{GroupKind, GroupSpec};
    let g = |kind| GroupSpec {
        kind,
        page_bytes: 4096,
        eagle: false,
    };
    let mut s = State::new(Config {
        page_size: 8,
        match_unit: 2,
        num_device_pages: 32,
        groups: vec![g(GroupKind::SlidingWindow(8)), g(GroupKind::Full)],
        reserve_null_page: true,
        ..Config::default()
    })
    .unwrap();
    let a = prompt(16, 0..3);
    s.begin(1, &a, None, usize::MAX, 0).unwrap();
    s.free(1).unwrap();
    // 13 shared tokens: page 0 whole and 2 units of page 1 (12 tokens); 20 more come from
    // elsewhere, so the window (8) reads from token 25 on: not page 1.
    let b = prompt(13, 50..60);
    let info = s.begin_computed(2, &b[..12], None, 12, 24, 32).unwrap();
    assert_eq!((info.matched_tokens, info.unit_tokens), (12, 4));
    let window = s.seq_pages(2, 0).unwrap().to_vec();
    let full = s.seq_pages(2, 1).unwrap().to_vec();
    assert_eq!(window.len(), 5);
    assert_eq!(
        window[..3],
        [0, 0, 0],
        "the window's pages up to token 25 are null"
    );
    assert!(full.iter().all(|&p| p != 0));
    let copies = s.take_copies(usize::MAX);
    assert_eq!(copies.len(), 1, "{copies:?}");
    assert_eq!(
        (copies[0].group, copies[0].dst_page, copies[0].num_tokens),
        (1, full[1], 4)
    );
    s.check().unwrap();
    s.free(2).unwrap();
    s.check().unwrap();
    assert_eq!(s.pool(0).unwrap().num_in_use(), 0);
}
