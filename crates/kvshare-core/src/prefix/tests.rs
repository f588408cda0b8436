//! Unit tests of the prefix index: digests, entries per group, unit keys and their lists.
use super::*;

#[test]
fn chain_differs_by_parent_extra_and_tokens() {
    let mut s = Vec::new();
    let r = root_hash();
    let a = chain_hash(r, 0, &[1, 2], &mut s);
    assert_ne!(a, chain_hash(r, 0, &[1, 3], &mut s));
    assert_ne!(a, chain_hash(r, 1, &[1, 2], &mut s));
    assert_ne!(a, chain_hash(a, 0, &[1, 2], &mut s));
    assert_eq!(a, chain_hash(r, 0, &[1, 2], &mut s));
}

#[test]
fn extra_digest() {
    let none = ExtraKeys::default();
    assert_eq!(none.page_digest(3, 16), 0);
    let salted = ExtraKeys {
        salt: b"tenant-a".to_vec(),
        ..Default::default()
    };
    let other = ExtraKeys {
        salt: b"tenant-b".to_vec(),
        ..Default::default()
    };
    assert_ne!(salted.page_digest(0, 16), 0);
    assert_ne!(salted.page_digest(0, 16), other.page_digest(0, 16));
    let lora = ExtraKeys {
        lora_id: 7,
        ..Default::default()
    };
    assert_ne!(lora.page_digest(0, 16), 0);
    let mm = ExtraKeys {
        mm: vec![MmItem {
            hash: 99,
            offset: 20,
            length: 8,
        }],
        ..Default::default()
    };
    assert_eq!(mm.page_digest(0, 16), 0, "item does not overlap page 0");
    assert_ne!(mm.page_digest(1, 16), 0);
    assert_eq!(mm.page_digest(2, 16), 0);
    let mm2 = ExtraKeys {
        mm: vec![MmItem {
            hash: 98,
            offset: 20,
            length: 8,
        }],
        ..Default::default()
    };
    assert_ne!(mm.page_digest(1, 16), mm2.page_digest(1, 16));
}

#[test]
fn insert_lookup_remove() {
    let mut ix = PrefixIndex::new(4, 2, 2, 1, "test").unwrap();
    let e = |hash| Entry {
        hash,
        parent: 1,
        extra: 0,
        lora: 0,
        tokens: &[5, 6],
    };
    assert!(ix.insert(1, 0, e(10)));
    assert!(!ix.insert(2, 0, e(10)), "duplicate hash");
    assert!(!ix.insert(1, 0, e(11)), "page already registered");
    let stored = ix.entry(1).unwrap();
    assert_eq!(
        (stored.group, stored.hash, stored.tokens),
        (0, 10, &[5, 6][..])
    );
    assert_eq!(ix.lookup(0, 10, 0, &[5, 6]), Some(1));
    // Another group's entry under the same digest is its own.
    assert!(ix.insert(3, 2, e(10)));
    assert_eq!((ix.lookup(2, 10, 0, &[5, 6]), ix.group_of(3)), (Some(3), 2));
    assert_eq!(ix.lookup(1, 10, 0, &[5, 6]), None, "group verified");
    assert!(ix.remove(3).is_some());
    assert_eq!(ix.lookup(0, 10, 0, &[5, 7]), None, "tokens verified");
    assert_eq!(ix.lookup(0, 10, 3, &[5, 6]), None, "extra verified");
    assert!(ix.remove(1).is_some());
    assert!(ix.remove(1).is_none());
    assert_eq!(ix.lookup(0, 10, 0, &[5, 6]), None);
    assert!(ix.insert(2, 0, e(10)));
    assert_eq!(ix.clear(), vec![2]);
    assert!(ix.is_empty());
    assert_eq!(ix.registered_count(), 0);
}

#[test]
fn unit_keys_find_prefixes_inside_pages() {
    // Pages of 8 tokens in units of 2: keys for 2, 4 and 6 tokens.
    let mut ix = PrefixIndex::new(4, 8, 2, 1, "test").unwrap();
    let mut s = Vec::new();
    let a = [1, 2, 3, 4, 5, 6, 7, 8];
    let b = [1, 2, 3, 4, 9, 9, 9, 9];
    let e = |tokens, hash| Entry {
        hash,
        parent: 7,
        extra: 0,
        lora: 0,
        tokens,
    };
    assert!(ix.insert(1, 0, e(&a, 100)));
    assert_eq!(ix.unit_keys_len(), 3);
    let hit =
        |ix: &PrefixIndex, q: &[i32], s: &mut Vec<u8>| ix.lookup_units(0, 7, 0, q, s, |_| true);
    assert_eq!(
        hit(&ix, &[1, 2, 3, 4, 5, 6, 7], &mut s),
        Some(UnitHit { page: 1, tokens: 6 })
    );
    assert_eq!(
        hit(&ix, &[1, 2, 3, 4, 5, 0, 7, 8], &mut s),
        Some(UnitHit { page: 1, tokens: 4 }),
        "diverges inside unit 3"
    );
    assert_eq!(
        hit(&ix, &a, &mut s),
        Some(UnitHit { page: 1, tokens: 6 }),
        "never a whole page"
    );
    assert_eq!(hit(&ix, &[1], &mut s), None, "less than a unit");
    assert_eq!(hit(&ix, &[0, 2, 3, 4], &mut s), None);
    assert_eq!(
        ix.lookup_units(0, 8, 0, &a, &mut s, |_| true),
        None,
        "other parent"
    );
    assert_eq!(
        ix.lookup_units(0, 7, 1, &a, &mut s, |_| true),
        None,
        "other extra"
    );
    assert_eq!(
        ix.lookup_units(0, 7, 0, &a, &mut s, |p| p != 1),
        None,
        "refused page"
    );
    // A sibling sharing 4 tokens: both pages hold the shared keys, so a refused one never
    // hides the other, and either leaving gives the other back whole.
    assert!(ix.insert(2, 0, e(&b, 200)));
    assert_eq!(ix.stray_unit_key(), None);
    let q = [1, 2, 3, 4, 0];
    assert_eq!(hit(&ix, &q, &mut s), Some(UnitHit { page: 1, tokens: 4 }));
    for (refused, found) in [(1, 2), (2, 1)] {
        assert_eq!(
            ix.lookup_units(0, 7, 0, &q, &mut s, |p| p != refused),
            Some(UnitHit {
                page: found,
                tokens: 4
            }),
            "page {refused} refused"
        );
    }
    assert_eq!(ix.lookup_units(0, 7, 0, &q, &mut s, |_| false), None);
    assert!(ix.remove(2).is_some());
    assert_eq!(ix.stray_unit_key(), None);
    assert_eq!(
        ix.lookup_units(0, 7, 0, &[1, 2, 3, 4, 5, 0], &mut s, |p| p == 1),
        Some(UnitHit { page: 1, tokens: 4 }),
        "the older page keeps its keys when the newer one leaves"
    );
    assert!(ix.insert(2, 0, e(&b, 200)));
    assert!(ix.remove(1).is_some());
    assert_eq!(ix.stray_unit_key(), None);
    assert_eq!(
        hit(&ix, &[1, 2, 3, 4, 5, 6], &mut s),
        Some(UnitHit { page: 2, tokens: 4 })
    );
    assert!(ix.remove(2).is_some());
    assert_eq!(ix.unit_keys_len(), 0);
    assert_eq!(hit(&ix, &[1, 2, 3, 4], &mut s), None);
    assert!(ix.insert(3, 0, e(&a, 100)));
    assert!(ix.insert(1, 0, e(&b, 200)));
    ix.clear();
    assert_eq!(ix.unit_keys_len(), 0);
    assert_eq!(ix.stray_unit_key(), None);
    assert!(ix.insert(3, 0, e(&a, 100)));
    assert_eq!(ix.stray_unit_key(), None);
    assert_eq!(
        hit(&ix, &[1, 2, 3, 4, 5, 6, 7], &mut s),
        Some(UnitHit { page: 3, tokens: 6 })
    );
}

#[test]
fn many_siblings_share_unit_keys_in_any_removal_order() {
    // Pages of 4 tokens in units of 1; pages 1..=6 share their first 1..3 tokens in turn.
    let mut ix = PrefixIndex::new(8, 4, 1, 1, "test").unwrap();
    let mut s = Vec::new();
    let pages: Vec<[i32; 4]> = (1..=6).map(|p| [9, 9 + p % 2, 9 + p % 3, p]).collect();
    for (i, t) in pages.iter().enumerate() {
        let entry = Entry {
            hash: 1000 + i as u128,
            parent: 3,
            extra: 0,
            lora: 0,
            tokens: t,
        };
        assert!(ix.insert(i as u32 + 1, 0, entry));
    }
    assert_eq!(ix.stray_unit_key(), None);
    let mut live: Vec<u32> = (1..=6).collect();
    for gone in [3, 1, 6, 2, 5, 4] {
        // Every live page is found by its own first 3 tokens, whichever others are refused.
        for &p in &live {
            let t = &pages[p as usize - 1];
            let found = ix.lookup_units(0, 3, 0, &t[..3], &mut s, |x| x == p);
            assert_eq!(found, Some(UnitHit { page: p, tokens: 3 }), "page {p}");
        }
        assert!(ix.remove(gone).is_some());
        live.retain(|&p| p != gone);
        assert_eq!(ix.stray_unit_key(), None);
    }
    assert_eq!(ix.unit_keys_len(), 0);
}

#[test]
fn whole_page_unit_keeps_no_unit_keys() {
    let mut ix = PrefixIndex::new(2, 4, 4, 1, "test").unwrap();
    let t = [1, 2, 3, 4];
    let e = Entry {
        hash: 1,
        parent: 0,
        extra: 0,
        lora: 0,
        tokens: &t,
    };
    assert!(ix.insert(0, 0, e));
    assert_eq!(ix.unit_keys_len(), 0);
    assert_eq!(
        ix.lookup_units(0, 0, 0, &t, &mut Vec::new(), |_| true),
        None
    );
}

#[test]
fn children_are_counted_per_parent_in_chained_groups_only() {
    // Groups 0 (chained) and 1 (not), pages of 2 tokens, whole-page units.
    let mut ix = PrefixIndex::new(8, 2, 2, 0b01, "test").unwrap();
    let r = root_hash();
    let entry = |hash, parent, tokens: &'static [i32]| Entry {
        hash,
        parent,
        extra: 0,
        lora: 0,
        tokens,
    };
    assert!(ix.insert(0, 0, entry(10, r, &[1, 2])));
    assert!(ix.insert(1, 0, entry(11, 10, &[3, 4])));
    assert!(ix.insert(2, 0, entry(12, 10, &[5, 6])));
    assert!(ix.insert(3, 1, entry(10, r, &[1, 2])));
    assert!(ix.insert(4, 1, entry(11, 10, &[3, 4])));
    assert!(ix.has_child(0));
    assert!(!ix.has_child(1) && !ix.has_child(2));
    assert!(!ix.has_child(3), "group 1 is not chained");
    assert_eq!(ix.stray_child_count(), None);
    assert_eq!(ix.remove(1), Some(Removed { parent_leaf: None }));
    assert_eq!(
        ix.remove(2),
        Some(Removed {
            parent_leaf: Some(0)
        })
    );
    assert!(!ix.has_child(0));
    assert_eq!(ix.remove(4), Some(Removed { parent_leaf: None }));
    // A child registered before its parent (a host tier receives a chain last page first) waits
    // for it: the parent adopts it when it registers.
    assert!(ix.remove(0).is_some());
    assert!(ix.insert(5, 0, entry(13, 10, &[7, 8])));
    assert_eq!(ix.stray_child_count(), None);
    assert!(ix.insert(6, 0, entry(10, r, &[1, 2])));
    assert!(ix.has_child(6));
    assert_eq!(ix.stray_child_count(), None);
    // The parent leaves: its child waits again; it comes back in another page and adopts it.
    assert!(ix.remove(6).is_some());
    assert!(ix.insert(7, 0, entry(10, r, &[1, 2])));
    assert!(ix.has_child(7));
    assert_eq!(
        ix.remove(5),
        Some(Removed {
            parent_leaf: Some(7)
        })
    );
    assert_eq!(ix.stray_child_count(), None);
    ix.clear();
    assert_eq!(ix.stray_child_count(), None);
    assert!(!ix.has_child(7));
}

#[test]
fn placeholder_is_any_negative_id() {
    assert!(!has_placeholder(&[]));
    assert!(!has_placeholder(&[0, 1, i32::MAX, 7]));
    for bad in [-1, i32::MIN, -65536] {
        for at in 0..5 {
            let mut t = vec![3, 0, i32::MAX, 1, 9];
            t[at] = bad;
            assert!(has_placeholder(&t), "{bad} at {at}");
        }
    }
}
