//! Scenario tests of the core cache manager through its Rust API, each under every eviction
//! policy (their orders agree on these scenarios: retention priorities first, leaves first).

use kvshare_core::{
    AppendNeed, Cache, Config, CopyKind, Error, EvictionPolicy, ExtraKeys, PageCopy, PageState,
    State, Tier,
};

mod support;
use support::{state, tiered, toks};

#[test]
fn shared_prefix_is_stored_once_and_freed_after_last_user() {
    for policy in EvictionPolicy::ALL {
        eprintln!("eviction policy {policy:?}");
        let mut s = state(16, 4, policy);
        let sys = toks(0..8); // two full pages of system prompt
        let a: Vec<i32> = sys.iter().copied().chain(100..103).collect();
        let b: Vec<i32> = sys.iter().copied().chain(200..206).collect();
        let ia = s.begin(1, &a, None, usize::MAX, 0).unwrap();
        assert_eq!((ia.matched_tokens, ia.num_pages, ia.new_pages), (0, 3, 3));
        let ib = s.begin(2, &b, None, usize::MAX, 0).unwrap();
        assert_eq!((ib.matched_tokens, ib.num_pages, ib.new_pages), (8, 4, 2));
        let pa = s.seq_pages(1, 0).unwrap().to_vec();
        let pb = s.seq_pages(2, 0).unwrap().to_vec();
        assert_eq!(pa[..2], pb[..2]);
        for &p in &pa[..2] {
            assert_eq!(s.page_info(Tier::Device, 0, p).unwrap().0, 2);
        }
        let st = s.stats();
        assert_eq!(st.device_pages_in_use, 5);
        assert_eq!(st.device_pages_shared, 2);
        assert_eq!(st.logical_tokens, 11 + 14);
        s.check().unwrap();
        s.free(1).unwrap();
        assert_eq!(s.page_info(Tier::Device, 0, pa[0]).unwrap().0, 1);
        assert_eq!(
            s.page_info(Tier::Device, 0, pa[2]).unwrap().1,
            PageState::Free,
            "partial page not cached"
        );
        s.free(2).unwrap();
        let (rc, st, reg) = s.page_info(Tier::Device, 0, pa[0]).unwrap();
        assert_eq!((rc, st, reg), (0, PageState::Cached, true));
        assert_eq!(s.stats().device_pages_in_use, 0);
        assert_eq!(s.free(2), Err(Error::SeqNotFound(2)));
        s.check().unwrap();
        // A third request hits the cached prefix after both users left.
        let c: Vec<i32> = sys.iter().copied().chain(300..301).collect();
        assert_eq!(
            s.begin(3, &c, None, usize::MAX, 0).unwrap().matched_tokens,
            8
        );
        s.check().unwrap();
    }
}

#[test]
fn max_match_and_salt_and_lora_isolate() {
    for policy in EvictionPolicy::ALL {
        eprintln!("eviction policy {policy:?}");
        let mut s = state(32, 4, policy);
        let p = toks(0..12);
        s.begin(1, &p, None, usize::MAX, 0).unwrap();
        // The engine recomputes the last token: cap at len-1. All 3 cached pages are shared, and the
        // recomputed token's slot is hidden from the KV write.
        let b = s.begin(2, &p, None, p.len() - 1, 0).unwrap();
        assert_eq!((b.matched_tokens, b.new_pages), (11, 0));
        assert_eq!(s.seq_pages(2, 0).unwrap(), s.seq_pages(1, 0).unwrap());
        let mut slots = [0i64; 3];
        assert_eq!(s.slot_mapping(0, &[2], &[2], &mut slots).unwrap(), 2);
        assert_eq!(slots, [-1, -1, -1]);
        let salted = ExtraKeys {
            salt: b"tenant".to_vec(),
            ..Default::default()
        };
        assert_eq!(
            s.begin(3, &p, Some(salted.clone()), usize::MAX, 0)
                .unwrap()
                .matched_tokens,
            0
        );
        assert_eq!(
            s.begin(4, &p, Some(salted), usize::MAX, 0)
                .unwrap()
                .matched_tokens,
            12
        );
        let lora = ExtraKeys {
            lora_id: 3,
            ..Default::default()
        };
        assert_eq!(
            s.begin(5, &p, Some(lora), usize::MAX, 0)
                .unwrap()
                .matched_tokens,
            0
        );
        s.check().unwrap();
    }
}

#[test]
fn without_skip_cached_writes_the_capped_page_is_recomputed() {
    for policy in EvictionPolicy::ALL {
        eprintln!("eviction policy {policy:?}");
        let cfg = Config {
            page_size: 4,
            num_device_pages: 16,
            skip_cached_writes: false,
            eviction_policy: policy,
            ..Config::default()
        };
        let mut s = State::new(cfg).unwrap();
        let p = toks(0..12);
        s.begin(1, &p, None, usize::MAX, 0).unwrap();
        let b = s.begin(2, &p, None, p.len() - 1, 0).unwrap();
        assert_eq!((b.matched_tokens, b.new_pages), (8, 1));
        let pages = s.seq_pages(2, 0).unwrap().to_vec();
        let mut slots = [0i64; 4];
        s.slot_mapping(0, &[2], &[4], &mut slots).unwrap();
        assert_eq!(slots, [0, 1, 2, 3].map(|o| pages[2] as i64 * 4 + o));
        s.check().unwrap();
    }
}

#[test]
fn append_registers_full_pages_and_decode_continues_chain() {
    for policy in EvictionPolicy::ALL {
        eprintln!("eviction policy {policy:?}");
        let mut s = state(32, 4, policy);
        s.begin(1, &toks(0..6), None, usize::MAX, 0).unwrap();
        let mut copies = Vec::new();
        s.append(1, &[6, 7], 0, &mut copies, usize::MAX).unwrap();
        assert!(copies.is_empty());
        s.append(1, &[8], 0, &mut copies, usize::MAX).unwrap();
        assert_eq!(s.seq_info(1).unwrap().num_pages, 3);
        // A later turn repeating the history hits both pages filled by decode.
        assert_eq!(
            s.begin(2, &toks(0..10), None, usize::MAX, 0)
                .unwrap()
                .matched_tokens,
            8
        );
        s.check().unwrap();
    }
}

#[test]
fn fork_then_append_copies_on_write() {
    for policy in EvictionPolicy::ALL {
        eprintln!("eviction policy {policy:?}");
        let mut s = state(32, 4, policy);
        s.begin(1, &toks(0..6), None, usize::MAX, 0).unwrap();
        s.fork(1, 2).unwrap();
        let before = s.seq_pages(2, 0).unwrap().to_vec();
        let mut copies = Vec::new();
        s.append(2, &[50], 0, &mut copies, usize::MAX).unwrap();
        let after = s.seq_pages(2, 0).unwrap().to_vec();
        assert_eq!(before[0], after[0], "full page stays shared");
        assert_ne!(before[1], after[1], "partial page copied");
        assert_eq!(
            copies,
            vec![PageCopy {
                src_page: before[1],
                dst_page: after[1],
                num_tokens: 2,
                kind: CopyKind::DeviceToDevice,
                group: 0,
            }]
        );
        // The parent now owns its partial page alone: no copy.
        copies.clear();
        s.append(1, &[60], 0, &mut copies, usize::MAX).unwrap();
        assert!(copies.is_empty());
        assert_eq!(s.seq_pages(1, 0).unwrap()[1], before[1]);
        assert_eq!(s.stats().counters.cow_copies, 1);
        s.check().unwrap();
        s.free(1).unwrap();
        s.free(2).unwrap();
        s.check().unwrap();
        assert_eq!(s.stats().device_pages_in_use, 0);
    }
}

#[test]
fn allocation_is_all_or_nothing_and_evicts_the_chain_tail_first() {
    for policy in EvictionPolicy::ALL {
        eprintln!("eviction policy {policy:?}");
        let mut s = state(4, 4, policy);
        s.begin(1, &toks(0..8), None, usize::MAX, 0).unwrap();
        s.free(1).unwrap(); // 2 cached pages
        assert_eq!(s.stats().device_pages_cached, 2);
        let err = s
            .begin(2, &toks(100..120), None, usize::MAX, 0)
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::NoSpace {
                    needed: 5,
                    available: 4,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(s.stats().device_pages_cached, 2, "nothing changed");
        s.check().unwrap();
        s.begin(3, &toks(100..112), None, usize::MAX, 0).unwrap(); // 3 pages: 2 free + evict 1
        assert_eq!(s.stats().counters.evictions, 1);
        // The tail page of the old chain went first; its head survives.
        assert_eq!(
            s.begin(4, &toks(0..8), None, usize::MAX, 0).unwrap_err(),
            Error::NoSpace {
                tier: Tier::Device,
                needed: 1,
                available: 0
            }
        );
        s.check().unwrap();
    }
}

#[test]
fn swap_out_and_in_reports_pairs_and_reuses_cached_pages() {
    for policy in EvictionPolicy::ALL {
        eprintln!("eviction policy {policy:?}");
        let mut s = state(8, 4, policy);
        s.begin(1, &toks(0..10), None, usize::MAX, 0).unwrap();
        s.begin(2, &toks(0..8), None, usize::MAX, 0).unwrap(); // shares 2 pages
        let dev = s.seq_pages(1, 0).unwrap().to_vec();
        let mut copies = Vec::new();
        s.swap_out(1, &mut copies, usize::MAX).unwrap();
        assert_eq!(copies.len(), 3);
        assert!(copies.iter().all(|c| c.kind == CopyKind::DeviceToHost));
        assert_eq!(
            copies.iter().map(|c| c.num_tokens).collect::<Vec<_>>(),
            vec![4, 4, 2]
        );
        assert_eq!(copies.iter().map(|c| c.src_page).collect::<Vec<_>>(), dev);
        assert_eq!(s.seq_info(1).unwrap().tier, Tier::Host);
        let mut c2 = Vec::new();
        assert!(matches!(
            s.append(1, &[1], 0, &mut c2, usize::MAX),
            Err(Error::SeqWrongTier { .. })
        ));
        s.check().unwrap();
        copies.clear();
        s.swap_in(1, &mut copies, usize::MAX).unwrap();
        // The two shared full pages were still cached on device: only the partial page is copied.
        assert_eq!(copies.len(), 1);
        assert_eq!(copies[0].kind, CopyKind::HostToDevice);
        assert_eq!(s.seq_pages(1, 0).unwrap()[..2], dev[..2]);
        s.check().unwrap();
        assert_eq!(s.stats().host_pages_in_use, 0);
    }
}

#[test]
fn defer_commit_gates_hits() {
    for policy in EvictionPolicy::ALL {
        eprintln!("eviction policy {policy:?}");
        let cfg = Config {
            page_size: 4,
            num_device_pages: 16,
            defer_commit: true,
            eviction_policy: policy,
            ..Config::default()
        };
        let mut s = State::new(cfg).unwrap();
        s.begin(1, &toks(0..8), None, usize::MAX, 0).unwrap();
        assert_eq!(
            s.begin(2, &toks(0..8), None, usize::MAX, 0)
                .unwrap()
                .matched_tokens,
            0
        );
        s.commit();
        s.check().unwrap();
        assert_eq!(
            s.begin(3, &toks(0..8), None, usize::MAX, 0)
                .unwrap()
                .matched_tokens,
            8
        );
        s.check().unwrap();
    }
}

#[test]
fn placeholder_pages_never_hashed() {
    for policy in EvictionPolicy::ALL {
        eprintln!("eviction policy {policy:?}");
        let mut s = state(16, 4, policy);
        s.begin(
            1,
            &[1, 2, 3, 4, 5, 6, 7, -1, 9, 10, 11, 12],
            None,
            usize::MAX,
            0,
        )
        .unwrap();
        assert_eq!(s.stats().index_pages, 1);
        s.check().unwrap();
    }
}

#[test]
fn page_api_refcounts_and_underflow() {
    for policy in EvictionPolicy::ALL {
        eprintln!("eviction policy {policy:?}");
        let mut s = State::new(Config {
            page_size: 4,
            num_device_pages: 4,
            reserve_null_page: true,
            eviction_policy: policy,
            ..Config::default()
        })
        .unwrap();
        let pages = s.alloc_pages(0, 3).unwrap();
        assert_eq!(pages, vec![1, 2, 3]);
        assert!(matches!(s.alloc_pages(0, 1), Err(Error::NoSpace { .. })));
        s.acquire_pages(0, &[1]).unwrap();
        assert_eq!(
            s.release_pages(0, &[2, 2]),
            Err(Error::RefcountUnderflow { page: 2 })
        );
        assert_eq!(
            s.page_info(Tier::Device, 0, 2).unwrap().0,
            1,
            "nothing released"
        );
        assert_eq!(
            s.release_pages(0, &[0]),
            Err(Error::PaddingPage { page: 0 })
        );
        assert!(matches!(
            s.release_pages(0, &[9]),
            Err(Error::PageOutOfRange { .. })
        ));
        s.register(0, &toks(0..8), &pages[..2], None).unwrap();
        s.release_pages(0, &[1, 1, 2, 3]).unwrap();
        assert_eq!(s.stats().device_pages_cached, 2);
        assert!(matches!(
            s.acquire_pages(0, &[3]),
            Err(Error::PageNotAllocated { .. })
        ));
        let m = s
            .match_prefix(0, &toks(0..9), None, usize::MAX, true, usize::MAX)
            .unwrap();
        assert_eq!((m.pages.clone(), m.tokens), (vec![1, 2], 8));
        s.check().unwrap();
        s.clear_index();
        assert_eq!(s.stats().index_pages, 0);
        s.release_pages(0, &m.pages).unwrap();
        assert_eq!(s.stats().device_pages_free, 3);
        s.check().unwrap();
    }
}

/// A page a sequence holds is registered by the sequence, under its own tokens: the page API
/// registers it under no other tokens (a later prompt with those tokens would read the
/// sequence's KV), even for a caller holding a reference to it. Pages the caller holds alone
/// in the same call are registered.
#[test]
fn register_leaves_a_sequences_pages_to_the_sequence() {
    let mut s = state(16, 4, EvictionPolicy::Lru);
    s.begin(1, &toks(0..6), None, usize::MAX, 0).unwrap();
    let seq_page = s.seq_pages(1, 0).unwrap()[1];
    let own = s.alloc_pages(0, 1).unwrap()[0];
    s.acquire_pages(0, &[seq_page]).unwrap();
    let other = toks(100..108);
    // Page 0 of `other` in the caller's own page, page 1 in the sequence's partial page.
    assert_eq!(s.register(0, &other, &[own, seq_page], None).unwrap(), 1);
    s.check().unwrap();
    // The sequence fills its page (a copy: the caller shares it) and registers it under its
    // own tokens.
    let mut copies = Vec::new();
    s.append(1, &[6, 7], 0, &mut copies, usize::MAX).unwrap();
    s.check().unwrap();
    let mine = s
        .match_prefix(0, &toks(0..8), None, usize::MAX, false, 8)
        .unwrap();
    assert_eq!(mine.pages[1], s.seq_pages(1, 0).unwrap()[1]);
    assert_eq!(copies[0].src_page, seq_page);
    let theirs = s
        .match_prefix(0, &other, None, usize::MAX, false, 8)
        .unwrap();
    assert_eq!(theirs.pages, [own]);
    s.release_pages(0, &[seq_page, own]).unwrap();
    s.free(1).unwrap();
    s.check().unwrap();
}

/// In vLLM's order a page filled with content already cached is kept as a duplicate of it; a
/// page carries one digest, so the page API registers a duplicate under no other tokens (it
/// would be in the index and in a duplicate list at once).
#[test]
fn register_leaves_a_duplicate_page_to_its_content() {
    let mut s = State::new(Config {
        page_size: 4,
        num_device_pages: 16,
        enable_prefix_caching: true,
        reserve_null_page: true,
        vllm_free_order: true,
        skip_cached_writes: false,
        ..Config::default()
    })
    .unwrap();
    s.begin(1, &toks(0..8), None, usize::MAX, 0).unwrap();
    // The same prompt without a hit: its pages fill with content seq 1's pages already cache.
    s.begin(2, &toks(0..8), None, 0, 0).unwrap();
    let dup = s.seq_pages(2, 0).unwrap()[0];
    assert_ne!(dup, s.seq_pages(1, 0).unwrap()[0]);
    s.free(2).unwrap();
    s.acquire_pages(0, &[dup]).unwrap();
    assert_eq!(s.register(0, &toks(100..104), &[dup], None).unwrap(), 0);
    s.check().unwrap();
    s.release_pages(0, &[dup]).unwrap();
    s.free(1).unwrap();
    s.check().unwrap();
}

#[test]
fn cache_is_send_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Cache>();
}

#[test]
fn events_replay_to_exactly_the_registered_pages() {
    for policy in EvictionPolicy::ALL {
        eprintln!("eviction policy {policy:?}");
        use kvshare_core::EventKind;
        use std::collections::HashSet;
        let mut s = tiered(4, 4, policy);
        s.begin(1, &toks(0..8), None, usize::MAX, 0).unwrap();
        s.free(1).unwrap();
        s.begin(2, &toks(100..116), None, usize::MAX, 0).unwrap();
        let mut seen = HashSet::new();
        let mut apply = |s: &mut State| {
            for e in s.take_events(usize::MAX) {
                match e.kind {
                    EventKind::Stored => assert!(seen.insert((e.tier, e.hash))),
                    EventKind::Removed => assert!(seen.remove(&(e.tier, e.hash))),
                    EventKind::Cleared => seen.retain(|&(t, _)| t != e.tier),
                }
            }
            let actual: HashSet<_> = s
                .registered_hashes()
                .into_iter()
                .map(|(t, _, h)| (t, h))
                .collect();
            assert_eq!(seen, actual);
        };
        apply(&mut s);
        s.clear_index();
        apply(&mut s);
        assert!(s.registered_hashes().is_empty());
    }
}

#[test]
fn capacity_queries_match_what_the_operations_take() {
    for policy in EvictionPolicy::ALL {
        eprintln!("eviction policy {policy:?}");
        let mut s = State::new(Config {
            page_size: 4,
            num_device_pages: 8,
            num_host_pages: 8,
            eviction_policy: policy,
            ..Config::default()
        })
        .unwrap();
        s.begin(1, &toks(0..6), None, usize::MAX, 0).unwrap();
        s.fork(1, 2).unwrap();
        // Appending 3 tokens to a fork: copy the shared partial page, plus one new page.
        assert_eq!(
            s.append_need(2, 3, 0).unwrap(),
            AppendNeed {
                pages: 2,
                copies: 1
            }
        );
        assert_eq!(
            s.append_need(2, 0, 9).unwrap(),
            AppendNeed {
                pages: 2,
                copies: 0
            },
            "6 tokens + 9 reserved slots: 4 pages, 2 of them new"
        );
        assert!(matches!(
            s.append_need(2, 1, usize::MAX),
            Err(Error::InvalidArgument { .. })
        ));
        let free_before = s.stats().device_pages_free;
        let mut copies = Vec::new();
        s.append(2, &[50, 51, 52], 0, &mut copies, 1).unwrap();
        assert_eq!(free_before - s.stats().device_pages_free, 2);
        assert_eq!(copies.len(), 1);
        // Swap-in need: both full pages (the one shared with seq 1, and seq 2's own full page, left
        // cached on the device by the swap-out) are shared back; only the partial page is copied.
        s.swap_out(2, &mut copies, usize::MAX).unwrap();
        let (need, avail) = s.swap_in_need(2).unwrap();
        assert_eq!(need, 1);
        let before = s.stats();
        s.swap_in(2, &mut copies, usize::MAX).unwrap();
        let after = s.stats();
        // The swap-in takes `need` new pages and un-caches the cached pages it shares, which is why
        // `avail` leaves those out of what it can have.
        let before_total = before.device_pages_free + before.device_pages_cached;
        let after_total = after.device_pages_free + after.device_pages_cached;
        let shared_cached = before_total - avail as u64;
        assert_eq!(
            shared_cached, 1,
            "seq 2's own full page was cached; the shared one is held by seq 1"
        );
        assert_eq!(before_total - after_total, need as u64 + shared_cached);
        assert!(avail >= need);
        assert!(matches!(s.swap_in_need(2), Err(Error::SeqWrongTier { .. })));
        assert!(matches!(s.append_need(9, 1, 0), Err(Error::SeqNotFound(9))));
        // An overflowing size names the argument that overflows.
        let field = |r: Result<AppendNeed, Error>| match r {
            Err(Error::InvalidArgument { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(s.append_need(1, usize::MAX, 0)), "num_tokens");
        assert_eq!(field(s.append_need(1, 1, usize::MAX)), "lookahead_slots");
        s.check().unwrap();
    }
}

/// Walks hash pages in groups before looking them up (State::walk): a long walk must still stop
/// exactly at the first page that differs, holds a placeholder, or passes the cap, wherever
/// that falls in a group.
#[test]
fn long_walks_stop_exactly_at_the_first_difference() {
    for policy in EvictionPolicy::ALL {
        eprintln!("eviction policy {policy:?}");
        const PAGES: usize = 37; // several walk groups and a partial one
        let mut s = state(4 * PAGES as u32, 4, policy);
        let base = toks(1000..1000 + 4 * PAGES as i32);
        s.begin(1, &base, None, usize::MAX, 0).unwrap();
        let registered = s.seq_pages(1, 0).unwrap().to_vec();
        s.free(1).unwrap();
        let full = s
            .match_prefix(0, &base, None, usize::MAX, false, PAGES)
            .unwrap();
        assert_eq!(full.pages, registered);
        for k in 0..PAGES {
            let mut other = base.clone();
            other[4 * k + 2] += 1; // page k differs
            let m = s
                .match_prefix(0, &other, None, usize::MAX, false, PAGES)
                .unwrap();
            assert_eq!(m.pages, registered[..k], "difference in page {k}");
            let mut held = base.clone();
            held[4 * k + 3] = -1; // page k holds a placeholder
            let m = s
                .match_prefix(0, &held, None, usize::MAX, false, PAGES)
                .unwrap();
            assert_eq!(m.pages, registered[..k], "placeholder in page {k}");
            let m = s
                .match_prefix(0, &base, None, 4 * k + 3, false, PAGES)
                .unwrap();
            assert_eq!(m.pages, registered[..k], "cap of {} tokens", 4 * k + 3);
            let m = s
                .match_prefix(0, &base[..4 * k + 1], None, usize::MAX, false, PAGES)
                .unwrap();
            assert_eq!(m.pages, registered[..k], "prompt of {} tokens", 4 * k + 1);
        }
        let salted = ExtraKeys {
            salt: b"other".to_vec(),
            ..Default::default()
        };
        assert!(s
            .match_prefix(0, &base, Some(&salted), usize::MAX, false, PAGES)
            .unwrap()
            .pages
            .is_empty());
        s.check().unwrap();
    }
}

/// A sequence begun with no token (an engine reserving a request's id before its prompt is
/// known) gets its first page from an append, a batch append or a capacity query, in every
/// group kind: its tables are empty, and no position of them is written.
#[test]
fn an_empty_sequence_takes_its_first_pages_by_append() {
    use kvshare_core::{GroupKind, GroupSpec, StateMode};
    let group = |kind| GroupSpec {
        kind,
        page_bytes: 0,
        eagle: false,
    };
    for groups in [
        vec![],
        vec![
            group(GroupKind::Full),
            group(GroupKind::SlidingWindow(5)),
            group(GroupKind::ChunkedLocal(8)),
        ],
        vec![
            group(GroupKind::Full),
            group(GroupKind::State(StateMode::All)),
        ],
        vec![
            group(GroupKind::Full),
            group(GroupKind::State(StateMode::Align)),
        ],
    ] {
        let ng = groups.len().max(1);
        let mut s = State::new(Config {
            page_size: 4,
            num_device_pages: 32,
            reserve_null_page: true,
            groups,
            ..Config::default()
        })
        .unwrap();
        for id in [1, 2] {
            let b = s.begin(id, &[], None, usize::MAX, 0).unwrap();
            assert_eq!((b.num_pages, b.new_pages), (0, 0));
        }
        assert_eq!(
            s.append_need(1, 1, 0).unwrap(),
            AppendNeed {
                pages: ng,
                copies: 0
            }
        );
        let mut copies = Vec::new();
        s.append(1, &[7], 0, &mut copies, usize::MAX).unwrap();
        s.append_batch(&[2], &[7], &mut copies, usize::MAX).unwrap();
        assert!(copies.is_empty());
        for id in [1, 2] {
            assert_eq!(s.seq_info(id).unwrap().num_tokens, 1);
            for g in 0..ng {
                assert_eq!(s.seq_pages(id, g).unwrap().len(), 1);
            }
        }
        s.check().unwrap();
        s.free(1).unwrap();
        s.free(2).unwrap();
        assert_eq!(s.stats().device_pages_in_use, 0);
    }
}

/// An align state group lets go of its state page of two steps ago; a page whose checkpoint is
/// no longer cached (the index was cleared) is then free, reused before any cached page in
/// kvshare's reuse order as any other page without cached content: the growing append that
/// releases it takes it back at once (for the full group's new page; both share one pool).
#[test]
fn a_released_align_state_without_a_checkpoint_is_free() {
    use kvshare_core::{GroupKind, GroupSpec, StateMode};
    let mut s = State::new(Config {
        page_size: 4,
        num_device_pages: 16,
        reserve_null_page: true,
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
    s.begin(1, &toks(0..6), None, usize::MAX, 0).unwrap();
    let first = s.state_page(1, 1).unwrap();
    let mut copies = Vec::new();
    s.append(1, &toks(6..10), 0, &mut copies, usize::MAX)
        .unwrap();
    assert!(
        s.page_info(Tier::Device, 1, first).unwrap().2,
        "a checkpoint"
    );
    s.clear_index();
    s.check().unwrap();
    // The next growing append releases it and takes it again.
    s.append(1, &toks(10..14), 0, &mut copies, usize::MAX)
        .unwrap();
    assert_eq!(s.seq_pages(1, 1).unwrap()[1], 0);
    let (refs, state, registered) = s.page_info(Tier::Device, 1, first).unwrap();
    assert_eq!((refs, state, registered), (1, PageState::InUse, false));
    assert!(
        s.seq_pages(1, 0).unwrap().contains(&first),
        "the full group's new page"
    );
    s.check().unwrap();
    s.free(1).unwrap();
    s.check().unwrap();
}

/// A fork shares every group's pages, its running state included; the first write into a shared
/// state page copies the whole state, whether the append stays in the page or crosses into the
/// next one: in mode all the crossing append writes the page's checkpoint (the state after its
/// last token) into it, in mode none the one page carries the state on, in mode align the
/// previous state (read for the new page's) becomes the checkpoint of the sequence's own tokens.
/// Either sequence then goes on with tokens of its own, every page registered under them.
#[test]
fn a_forked_state_is_copied_on_its_first_write() {
    use kvshare_core::{GroupKind, GroupSpec, StateMode};
    for (mode, caching, copied) in [
        (StateMode::All, true, true),
        (StateMode::None, false, true),
        (StateMode::Align, true, true),
    ] {
        let mut s = State::new(Config {
            page_size: 4,
            num_device_pages: 32,
            reserve_null_page: true,
            enable_prefix_caching: caching,
            groups: vec![
                GroupSpec::FULL,
                GroupSpec {
                    kind: GroupKind::State(mode),
                    page_bytes: 0,
                    eagle: false,
                },
            ],
            ..Config::default()
        })
        .unwrap();
        s.begin(1, &toks(0..6), None, usize::MAX, 0).unwrap();
        s.fork(1, 2).unwrap();
        let shared = s.state_page(1, 1).unwrap();
        // Sequence 2 crosses into its third page: 6 + 3 tokens.
        let mut copies = Vec::new();
        s.append(2, &[60, 61, 62], 0, &mut copies, usize::MAX)
            .unwrap();
        let state_copies: Vec<&PageCopy> = copies.iter().filter(|c| c.group == 1).collect();
        if copied {
            assert_eq!(state_copies.len(), 1, "{mode:?}: {copies:?}");
            assert_eq!(
                (state_copies[0].src_page, state_copies[0].num_tokens),
                (shared, 4)
            );
        } else {
            assert!(state_copies.is_empty(), "{mode:?}: {copies:?}");
        }
        assert_eq!(s.state_page(1, 1).unwrap(), shared, "{mode:?}");
        assert_ne!(s.state_page(2, 1).unwrap(), shared, "{mode:?}");
        s.check().unwrap();
        // Sequence 1 goes on with other tokens: its pages are its own.
        copies.clear();
        s.append(1, &[70, 71, 72], 0, &mut copies, usize::MAX)
            .unwrap();
        s.check().unwrap();
        s.free(1).unwrap();
        s.free(2).unwrap();
        s.check().unwrap();
        assert_eq!(s.stats().device_pages_in_use, 0);
    }
}

/// In vLLM's order a freed page with no cached content goes behind the cached pages (0.23's
/// block pool) or, with `vllm_uncached_first`, in front of them (0.32's): a later allocation
/// evicts the older cached page in the first, reuses the uncached one in the second.
#[test]
fn uncached_first_reuses_a_freed_uncached_page_before_evicting() {
    for uncached_first in [false, true] {
        let mut s = State::new(Config {
            page_size: 4,
            num_device_pages: 3, // the null page and two
            enable_prefix_caching: true,
            reserve_null_page: true,
            vllm_free_order: true,
            vllm_uncached_first: uncached_first,
            skip_cached_writes: false,
            ..Config::default()
        })
        .unwrap();
        s.begin(1, &toks(0..4), None, usize::MAX, 0).unwrap(); // one full page: cached
        let cached = s.seq_pages(1, 0).unwrap()[0];
        s.free(1).unwrap();
        s.begin(2, &toks(10..12), None, usize::MAX, 0).unwrap(); // a partial page: uncached
        let uncached = s.seq_pages(2, 0).unwrap()[0];
        s.free(2).unwrap();
        s.begin(3, &toks(20..22), None, usize::MAX, 0).unwrap();
        let want = if uncached_first { uncached } else { cached };
        assert_eq!(
            s.seq_pages(3, 0).unwrap()[0],
            want,
            "uncached_first {uncached_first}"
        );
        s.check().unwrap();
        let hit = s.begin(4, &toks(0..4), None, usize::MAX, 0).unwrap();
        assert_eq!(hit.matched_tokens, if uncached_first { 4 } else { 0 });
        s.check().unwrap();
    }
}
