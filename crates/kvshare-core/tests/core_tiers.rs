//! Scenario tests of what stays cached through the core cache manager's Rust API: the host
//! tier (demotion, promotion, prefetch), swaps, pins, retention priorities and the eviction
//! orders, each under every eviction policy where the orders agree.

use kvshare_core::{Config, CopyKind, Error, EvictionPolicy, State, Tier};

mod support;
use support::{tiered, toks};

#[test]
fn evicted_pages_are_demoted_and_promoted_back_on_a_hit() {
    for policy in EvictionPolicy::ALL {
        eprintln!("eviction policy {policy:?}");
        let mut s = tiered(4, 4, policy);
        s.begin(1, &toks(0..8), None, usize::MAX, 0).unwrap();
        s.free(1).unwrap(); // 2 cached device pages
        let old = s.seq_pages(1, 0).err();
        assert!(old.is_some());
        // A 4-page request evicts both cached pages: they are demoted, not dropped.
        s.begin(2, &toks(100..116), None, usize::MAX, 0).unwrap();
        let demoted = s.take_copies(usize::MAX);
        assert_eq!(demoted.len(), 2);
        assert!(demoted
            .iter()
            .all(|c| c.kind == CopyKind::DeviceToHost && c.num_tokens == 4));
        let st = s.stats();
        assert_eq!(
            (
                st.counters.demotions,
                st.host_pages_cached,
                st.host_index_pages
            ),
            (2, 2, 2)
        );
        s.check().unwrap();
        s.free(2).unwrap();
        // The old prompt hits in the host tier: promoted back, counted as a hit.
        let b = s.begin(3, &toks(0..9), None, usize::MAX, 0).unwrap();
        assert_eq!((b.matched_tokens, b.promoted_pages, b.new_pages), (8, 2, 1));
        let promoted = s.take_copies(usize::MAX);
        let h2d: Vec<_> = promoted
            .iter()
            .filter(|c| c.kind == CopyKind::HostToDevice)
            .collect();
        assert_eq!(h2d.len(), 2);
        assert_eq!(
            h2d.iter().map(|c| c.dst_page).collect::<Vec<_>>(),
            s.seq_pages(3, 0).unwrap()[..2]
        );
        let st = s.stats();
        assert_eq!(
            (st.counters.promotions, st.counters.host_hit_tokens),
            (2, 8)
        );
        s.check().unwrap();
    }
}

#[test]
fn without_host_tier_evicted_pages_are_dropped() {
    for policy in EvictionPolicy::ALL {
        eprintln!("eviction policy {policy:?}");
        let mut s = tiered(4, 0, policy);
        s.begin(1, &toks(0..8), None, usize::MAX, 0).unwrap();
        s.free(1).unwrap();
        s.begin(2, &toks(100..116), None, usize::MAX, 0).unwrap();
        assert!(s.take_copies(usize::MAX).is_empty());
        s.free(2).unwrap();
        assert_eq!(
            s.begin(3, &toks(0..9), None, usize::MAX, 0)
                .unwrap()
                .matched_tokens,
            0
        );
    }
}

#[test]
fn pinned_prefix_survives_pressure_until_unpinned() {
    for policy in EvictionPolicy::ALL {
        eprintln!("eviction policy {policy:?}");
        let mut s = tiered(6, 0, policy);
        let system = toks(0..8);
        s.begin(1, &system, None, usize::MAX, 0).unwrap();
        s.free(1).unwrap();
        let (pin, n) = s.pin(&system, None).unwrap();
        assert_eq!(n, 2);
        assert_eq!(s.stats().device_pages_pinned, 2);
        // Only 4 pages are allocatable now; a 5-page request is refused rather than evicting.
        assert!(matches!(
            s.begin(2, &toks(100..120), None, usize::MAX, 0),
            Err(Error::NoSpace { available: 4, .. })
        ));
        s.begin(3, &toks(100..116), None, usize::MAX, 0).unwrap();
        s.free(3).unwrap();
        assert_eq!(
            s.begin(4, &toks(0..9), None, usize::MAX, 0)
                .unwrap()
                .matched_tokens,
            8
        );
        s.free(4).unwrap();
        s.unpin(pin).unwrap();
        assert!(s.unpin(pin).is_err());
        s.check().unwrap();
        s.begin(5, &toks(200..224), None, usize::MAX, 0).unwrap(); // 6 pages: evicts everything
        s.free(5).unwrap();
        assert_eq!(
            s.begin(6, &toks(0..9), None, usize::MAX, 0)
                .unwrap()
                .matched_tokens,
            0
        );
        s.check().unwrap();
    }
}

#[test]
fn lower_priority_cached_pages_are_evicted_first() {
    for policy in EvictionPolicy::ALL {
        eprintln!("eviction policy {policy:?}");
        let mut s = tiered(4, 0, policy);
        s.begin(1, &toks(0..4), None, usize::MAX, 0).unwrap();
        s.set_priority(1, 3).unwrap();
        s.begin(2, &toks(10..14), None, usize::MAX, 0).unwrap();
        s.free(1).unwrap(); // high priority, released first (older in LRU)
        s.free(2).unwrap();
        assert!(matches!(s.set_priority(1, 1), Err(Error::SeqNotFound(1))));
        // One page is needed beyond the 2 free ones: the low-priority page goes, not the older one.
        s.begin(3, &toks(20..32), None, usize::MAX, 0).unwrap();
        s.free(3).unwrap();
        assert_eq!(
            s.begin(4, &toks(0..5), None, usize::MAX, 0)
                .unwrap()
                .matched_tokens,
            4
        );
        assert_eq!(
            s.begin(5, &toks(10..15), None, usize::MAX, 0)
                .unwrap()
                .matched_tokens,
            0
        );
        assert!(matches!(
            s.set_priority(4, 4),
            Err(Error::InvalidArgument { .. })
        ));
        s.check().unwrap();
    }
}

#[test]
fn prefetch_promotes_ahead_of_the_request() {
    for policy in EvictionPolicy::ALL {
        eprintln!("eviction policy {policy:?}");
        let mut s = tiered(4, 4, policy);
        s.begin(1, &toks(0..8), None, usize::MAX, 0).unwrap();
        s.free(1).unwrap();
        s.begin(2, &toks(100..116), None, usize::MAX, 0).unwrap();
        s.free(2).unwrap();
        s.take_copies(usize::MAX);
        assert_eq!(s.prefetch(&toks(0..9), None), 2);
        assert_eq!(
            s.take_copies(usize::MAX).len(),
            4,
            "2 promotions + 2 demotions of the pages they displaced"
        );
        assert_eq!(s.stats().counters.prefetched, 2);
        let b = s.begin(3, &toks(0..9), None, usize::MAX, 0).unwrap();
        assert_eq!(
            (b.matched_tokens, b.promoted_pages),
            (8, 0),
            "already on the device"
        );
        s.check().unwrap();
    }
}

/// A long walk whose middle pages were demoted to the host tier finds them there and goes on.
#[test]
fn long_walks_continue_through_host_hits() {
    for policy in EvictionPolicy::ALL {
        eprintln!("eviction policy {policy:?}");
        let mut s = tiered(24, 32, policy);
        let base = toks(0..4 * 20);
        s.begin(1, &base, None, usize::MAX, 0).unwrap();
        s.free(1).unwrap(); // 20 cached device pages, LRU: the last page first
                            // Taking 12 fresh pages evicts (demotes) the 8 least recently used cached ones.
        s.begin(2, &toks(5000..5000 + 4 * 12), None, usize::MAX, 0)
            .unwrap();
        assert_eq!(s.stats().counters.demotions, 8);
        s.free(2).unwrap();
        s.take_copies(usize::MAX);
        let b = s.begin(3, &base, None, usize::MAX, 0).unwrap();
        assert_eq!((b.matched_tokens, b.promoted_pages), (80, 8));
        s.check().unwrap();
    }
}

fn swap_state(caching: bool, demote: bool, host: u32, eviction_policy: EvictionPolicy) -> State {
    State::new(Config {
        page_size: 4,
        num_device_pages: 16,
        num_host_pages: host,
        enable_prefix_caching: caching,
        demote_to_host: demote,
        eviction_policy,
        ..Config::default()
    })
    .unwrap()
}

/// A swap-out of content the host tier already holds (swapped out by another sequence) shares
/// that host page: no copy, no new page, with or without demotion. `swap_out_need` says what it
/// takes, and the pages stay cached on the host after the swap-in for later swap-outs.
#[test]
fn swap_out_shares_content_already_on_the_host() {
    for policy in EvictionPolicy::ALL {
        eprintln!("eviction policy {policy:?}");
        for demote in [false, true] {
            let mut s = swap_state(true, demote, 8, policy);
            let sys = toks(0..8); // two full pages
            let a: Vec<i32> = sys.iter().copied().chain(100..103).collect();
            let b: Vec<i32> = sys.iter().copied().chain(200..206).collect();
            s.begin(1, &a, None, usize::MAX, 0).unwrap();
            s.begin(2, &b, None, usize::MAX, 0).unwrap(); // shares the two system pages on the device
            let mut copies = Vec::new();
            assert_eq!(s.swap_out_need(1).unwrap(), (3, 8));
            s.swap_out(1, &mut copies, usize::MAX).unwrap();
            assert_eq!(copies.len(), 3);
            let host_a = s.seq_pages(1, 0).unwrap().to_vec();
            // b's system pages are on the host already (a's copies): only its own 2 pages move.
            assert_eq!(s.swap_out_need(2).unwrap(), (2, 5));
            copies.clear();
            s.swap_out(2, &mut copies, 2).unwrap();
            assert_eq!(copies.len(), 2, "demote={demote}");
            let host_b = s.seq_pages(2, 0).unwrap().to_vec();
            assert_eq!(host_b[..2], host_a[..2]);
            assert_eq!(
                copies.iter().map(|c| c.num_tokens).collect::<Vec<_>>(),
                vec![4, 2]
            );
            let st = s.stats();
            assert_eq!(st.host_pages_in_use, 5);
            assert_eq!(st.counters.swap_out_pages, 5, "pages copied");
            s.check().unwrap();
            // Swap-ins release the host pages; the registered ones stay cached (evictable), so a
            // later swap-out of the same content shares them again.
            copies.clear();
            s.swap_in(1, &mut copies, usize::MAX).unwrap();
            s.swap_in(2, &mut copies, usize::MAX).unwrap();
            let st = s.stats();
            assert_eq!(st.host_pages_in_use, 0);
            assert_eq!(
                st.host_pages_cached, 3,
                "the two system pages and b's full page"
            );
            assert_eq!(s.available(Tier::Host, 0).unwrap(), 8);
            s.check().unwrap();
            // Sharing a cached host page takes it off the evictable count: available excludes it.
            assert_eq!(s.swap_out_need(1).unwrap(), (1, 6));
            copies.clear();
            s.swap_out(1, &mut copies, usize::MAX).unwrap();
            assert_eq!(copies.len(), 1);
            assert_eq!(
                s.available(Tier::Host, 0).unwrap(),
                5,
                "its three pages are in use"
            );
            // Freeing a swapped-out sequence keeps its registered host pages cached.
            s.free(1).unwrap();
            assert_eq!(s.stats().host_pages_cached, 3);
            s.check().unwrap();
        }
    }
}

/// The room check counts only the pages a swap-out takes, and reserves the cached host pages
/// it shares: exactly when `need > available` it fails with NoSpace, changing nothing.
#[test]
fn swap_out_need_is_exactly_the_room_check() {
    for policy in EvictionPolicy::ALL {
        eprintln!("eviction policy {policy:?}");
        let mut s = swap_state(true, false, 3, policy);
        let p: Vec<i32> = toks(0..8).into_iter().chain(50..52).collect(); // 2 full + 1 partial
        s.begin(1, &p, None, usize::MAX, 0).unwrap();
        s.begin(2, &p, None, usize::MAX, 0).unwrap();
        let mut copies = Vec::new();
        s.swap_out(1, &mut copies, usize::MAX).unwrap(); // all 3 host pages
        assert_eq!(s.available(Tier::Host, 0).unwrap(), 0);
        // Seq 2 shares the two full pages but needs one page for its partial one: no room.
        assert_eq!(s.swap_out_need(2).unwrap(), (1, 0));
        let before = s.stats();
        assert!(matches!(
            s.swap_out(2, &mut copies, usize::MAX),
            Err(Error::NoSpace {
                tier: Tier::Host,
                ..
            })
        ));
        assert_eq!(s.stats(), before);
        s.check().unwrap();
        // Seq 1 back in: its 2 full pages are cached on the host, its partial page free.
        s.swap_in(1, &mut copies, usize::MAX).unwrap();
        assert_eq!(s.swap_out_need(2).unwrap(), (1, 1));
        copies.clear();
        s.swap_out(2, &mut copies, usize::MAX).unwrap();
        assert_eq!(copies.len(), 1);
        assert_eq!(s.available(Tier::Host, 0).unwrap(), 0);
        assert!(matches!(
            s.swap_out_need(2),
            Err(Error::SeqWrongTier { .. })
        ));
        assert!(matches!(s.swap_out_need(9), Err(Error::SeqNotFound(9))));
        s.check().unwrap();
    }
}

/// Without prefix caching nothing is hashed, so every swap-out copies every page and the host
/// pages come back free.
#[test]
fn swap_out_without_caching_copies_every_page() {
    for policy in EvictionPolicy::ALL {
        eprintln!("eviction policy {policy:?}");
        let mut s = swap_state(false, false, 8, policy);
        s.begin(1, &toks(0..10), None, usize::MAX, 0).unwrap();
        s.begin(2, &toks(0..10), None, usize::MAX, 0).unwrap();
        let mut copies = Vec::new();
        s.swap_out(1, &mut copies, usize::MAX).unwrap();
        assert_eq!(s.swap_out_need(2).unwrap(), (3, 5));
        s.swap_out(2, &mut copies, usize::MAX).unwrap();
        assert_eq!(copies.len(), 6);
        s.swap_in(1, &mut copies, usize::MAX).unwrap();
        s.free(2).unwrap();
        let st = s.stats();
        assert_eq!((st.host_pages_free, st.host_pages_cached), (8, 0));
        s.check().unwrap();
    }
}

/// Digests of the full pages of `tokens` (no extra keys), as the index keys them.
fn digests(tokens: &[i32], ps: usize) -> Vec<u128> {
    let mut scratch = Vec::new();
    let mut h = kvshare_core::prefix::root_hash();
    tokens
        .chunks_exact(ps)
        .map(|c| {
            h = kvshare_core::prefix::chain_hash(h, 0, c, &mut scratch);
            h
        })
        .collect()
}

/// A prefix promoted from the host tier leaves its host copies behind, released first page first:
/// in release order the host tier's oldest page is then the chain's head. When the host evicts,
/// it must take the chain's last page, not the head that the last page needs.
#[test]
fn the_host_tier_evicts_a_promoted_chain_from_its_last_page() {
    for policy in EvictionPolicy::ALL {
        eprintln!("eviction policy {policy:?}");
        let mut s = tiered(4, 2, policy);
        let ab = toks(0..8);
        let [a, b] = digests(&ab, 4)[..] else {
            unreachable!()
        };
        s.begin(1, &ab, None, usize::MAX, 0).unwrap();
        s.free(1).unwrap();
        // Four new pages evict A and B, which are demoted: the host holds both.
        s.begin(2, &toks(100..116), None, usize::MAX, 0).unwrap();
        s.free(2).unwrap();
        // A hit on the host promotes them (their host copies stay cached there, A released
        // first); the prompt's third page evicts a page of request 2, whose demotion evicts a
        // host page.
        let b3 = s.begin(3, &toks(0..9), None, usize::MAX, 0).unwrap();
        assert_eq!(b3.promoted_pages, 2);
        assert_eq!(s.stats().counters.host_evictions, 1);
        s.check().unwrap();
        let host: Vec<u128> = s
            .registered_hashes()
            .into_iter()
            .filter(|&(t, _, _)| t == Tier::Host)
            .map(|(_, _, h)| h)
            .collect();
        assert!(
            host.contains(&a) && !host.contains(&b),
            "{policy:?}: the host evicted A and kept its child B"
        );
    }
}

/// A page a sequence reads once (a long prompt nobody repeats) against a prefix hit again and
/// again (a system prompt): LRU keeps what was released last, LFU and S3-FIFO what is used.
#[test]
fn lfu_and_s3fifo_keep_a_hot_prefix_through_a_scan() {
    let hot = toks(0..8);
    for policy in EvictionPolicy::ALL {
        let mut s = tiered(8, 0, policy);
        for id in 1..=3 {
            let mut t = hot.clone();
            t.push(1000 + id as i32);
            s.begin(id, &t, None, usize::MAX, 0).unwrap();
            s.free(id).unwrap();
        }
        // Two scans of one-time prompts, each filling the pages the hot prefix leaves.
        for id in 10..12 {
            let base = 10_000 * id as i32;
            s.begin(id, &toks(base..base + 24), None, usize::MAX, 0)
                .unwrap();
            s.free(id).unwrap();
        }
        let hit = s
            .begin(99, &hot, None, usize::MAX, 0)
            .unwrap()
            .matched_tokens;
        let kept = match policy {
            EvictionPolicy::Lru => 0,
            EvictionPolicy::Lfu | EvictionPolicy::S3Fifo => 8,
        };
        assert_eq!(hit, kept, "{policy:?}");
        s.check().unwrap();
    }
}

#[test]
fn vllm_free_order_takes_lru_only() {
    for policy in [EvictionPolicy::Lfu, EvictionPolicy::S3Fifo] {
        let err = State::new(Config {
            vllm_free_order: true,
            eviction_policy: policy,
            ..Config::default()
        })
        .unwrap_err();
        match err {
            Error::InvalidConfig { field, reason } => {
                assert_eq!(field, "eviction_policy");
                assert!(reason.contains("vllm_free_order"), "{reason}");
            }
            e => panic!("{e:?}"),
        }
    }
    State::new(Config {
        vllm_free_order: true,
        ..Config::default()
    })
    .unwrap();
}

/// A cache of a full and a window group sharing one pool, with a host tier.
fn two_groups_one_pool(device: u32, host: u32) -> State {
    use kvshare_core::{GroupKind, GroupSpec};
    State::new(Config {
        page_size: 4,
        num_device_pages: device,
        num_host_pages: host,
        reserve_null_page: true,
        demote_to_host: false,
        groups: vec![
            GroupSpec::FULL,
            GroupSpec {
                kind: GroupKind::SlidingWindow(100),
                page_bytes: 0,
                eagle: false,
            },
        ],
        ..Config::default()
    })
    .unwrap()
}

/// Every table of `id` holds pages no other of its tables holds.
fn tables_apart(s: &State, id: u64) {
    let a = s.seq_pages(id, 0).unwrap().to_vec();
    let b = s.seq_pages(id, 1).unwrap().to_vec();
    assert!(
        a.iter().all(|p| !b.contains(p)),
        "{a:?} and {b:?} share a page"
    );
}

/// A swap-in shares the cached device pages of every group before it takes a page for any: a
/// page one group takes must not evict a cached page a later group shares (both groups' tables
/// would hold it, one with the other's KV).
#[test]
fn a_swap_in_takes_no_page_another_group_shares() {
    let mut s = two_groups_one_pool(16, 16);
    let mut copies = Vec::new();
    s.begin(1, &toks(0..10), None, usize::MAX, 0).unwrap();
    s.swap_out(1, &mut copies, usize::MAX).unwrap();
    // Cached, oldest first: sequence 1's full pages (group 0's, then group 1's), then
    // sequence 2's.
    s.begin(2, &toks(100..108), None, usize::MAX, 0).unwrap();
    s.free(2).unwrap();
    let free = s.stats().device_pages_free as usize;
    let held = s.alloc_pages(0, free).unwrap();
    // Each group shares its 2 full pages and takes 1 for its partial page: by evicting two of
    // sequence 2's.
    s.swap_in(1, &mut copies, usize::MAX).unwrap();
    s.check().unwrap();
    tables_apart(&s, 1);
    let m = s
        .match_prefix(1, &toks(0..10), None, usize::MAX, false, 8)
        .unwrap();
    assert_eq!(m.pages[..], s.seq_pages(1, 1).unwrap()[..2]);
    s.release_pages(0, &held).unwrap();
    s.free(1).unwrap();
    s.check().unwrap();
}

/// The same for a swap-out sharing cached host pages.
#[test]
fn a_swap_out_takes_no_host_page_another_group_shares() {
    let mut s = two_groups_one_pool(32, 10);
    let mut copies = Vec::new();
    s.begin(1, &toks(0..10), None, usize::MAX, 0).unwrap();
    s.swap_out(1, &mut copies, usize::MAX).unwrap();
    s.swap_in(1, &mut copies, usize::MAX).unwrap();
    // Cached on the host, oldest first: sequence 1's full pages, then sequence 3's; sequence 2
    // holds the last free ones.
    s.begin(2, &toks(50..52), None, usize::MAX, 0).unwrap();
    s.swap_out(2, &mut copies, usize::MAX).unwrap();
    s.begin(3, &toks(200..208), None, usize::MAX, 0).unwrap();
    s.swap_out(3, &mut copies, usize::MAX).unwrap();
    s.swap_in(3, &mut copies, usize::MAX).unwrap();
    assert_eq!(s.stats().host_pages_free, 0);
    // Each group shares its 2 full host pages and takes 1 for its partial page.
    copies.clear();
    s.swap_out(1, &mut copies, usize::MAX).unwrap();
    assert_eq!(copies.len(), 2);
    s.check().unwrap();
    tables_apart(&s, 1);
    s.swap_in(1, &mut copies, usize::MAX).unwrap();
    s.check().unwrap();
    for id in [1, 2, 3] {
        s.free(id).unwrap();
    }
    s.check().unwrap();
}
