//! The harness's interpreter: [`Run::apply`] runs one operation of the language on every group
//! through the C exports and checks the outcome against the model.

use super::*;

impl Run {
    pub(super) fn apply(&mut self, op: &Op) {
        let mut copies = [kvs_copy {
            src_page: 0,
            dst_page: 0,
            num_tokens: 0,
            kind: 0,
            group: 0,
        }; 128];
        let mut ncopies = usize::MAX;
        match *op {
            Op::Begin {
                id,
                len,
                vocab,
                max_match,
            } => {
                let toks = tokens(len, vocab, u64::from(vocab));
                let max = if max_match == 255 {
                    usize::MAX
                } else {
                    usize::from(max_match)
                };
                // The id's high bits: the share of the tokens computed elsewhere (0: none).
                let computed = toks.len() * usize::from(id / 16) / 15;
                self.begin(u64::from(id % 16), &toks, max, computed);
            }
            Op::Append {
                id,
                len,
                vocab,
                lookahead,
            } => {
                let id = u64::from(id % 16);
                let toks = tokens(len % 20, vocab, id + 7);
                let lookahead = usize::from(lookahead % 8);
                let st = unsafe {
                    kvs_cache::kvs_seq_append(
                        self.c,
                        id,
                        toks.as_ptr(),
                        toks.len(),
                        lookahead,
                        copies.as_mut_ptr(),
                        copies.len(),
                        &mut ncopies,
                    )
                };
                if let Some(want) = self.seq_status(id, Tier::Device) {
                    return self.expect(st, &[want]);
                }
                if self.align && lookahead > 0 {
                    return self.expect(st, &[kvs_status::InvalidArgument]);
                }
                self.expect(st, &[kvs_status::Ok, kvs_status::NoSpace]);
                if st == kvs_status::Ok {
                    // At most one copy-on-write per group.
                    assert!(ncopies <= self.ng(), "{}: {ncopies} copies", self.op);
                    self.check_copies(&copies[..ncopies]);
                    self.model.seqs.get_mut(&id).unwrap().tokens += toks.len();
                }
            }
            Op::AppendBatch { ref ids, vocab } => {
                let ids: Vec<u64> = ids.iter().take(8).map(|&i| u64::from(i % 16)).collect();
                let toks: Vec<i32> = ids
                    .iter()
                    .map(|&i| (i as i32 + i32::from(vocab)) % 3)
                    .collect();
                let st = unsafe {
                    kvs_cache::kvs_seq_append_batch(
                        self.c,
                        ids.as_ptr(),
                        ids.len(),
                        toks.as_ptr(),
                        toks.len(),
                        copies.as_mut_ptr(),
                        copies.len(),
                        &mut ncopies,
                    )
                };
                let mut sorted = ids.clone();
                sorted.sort_unstable();
                let dup = sorted.windows(2).any(|w| w[0] == w[1]);
                let bad: Vec<kvs_status> = ids
                    .iter()
                    .filter_map(|&i| self.seq_status(i, Tier::Device))
                    .collect();
                if !bad.is_empty() || dup {
                    let mut allowed = bad;
                    if dup {
                        allowed.push(kvs_status::InvalidArgument);
                    }
                    return self.expect(st, &allowed);
                }
                self.expect(st, &[kvs_status::Ok, kvs_status::NoSpace]);
                if st == kvs_status::Ok {
                    assert!(ncopies <= ids.len() * self.ng());
                    self.check_copies(&copies[..ncopies]);
                    for i in ids {
                        self.model.seqs.get_mut(&i).unwrap().tokens += 1;
                    }
                }
            }
            Op::Fork { parent, child } => {
                let (p, ch) = (u64::from(parent % 16), u64::from(child % 16));
                let st = unsafe { kvs_cache::kvs_seq_fork(self.c, p, ch) };
                if self.model.seqs.contains_key(&ch) {
                    // Which check comes first is not promised.
                    let mut allowed = vec![kvs_status::SeqExists];
                    allowed.extend(self.seq_status(p, Tier::Device));
                    return self.expect(st, &allowed);
                }
                if let Some(want) = self.seq_status(p, Tier::Device) {
                    return self.expect(st, &[want]);
                }
                // Forking shares pages: it never needs free ones.
                self.expect(st, &[kvs_status::Ok]);
                let tokens = self.model.seqs[&p].tokens;
                self.model.seqs.insert(
                    ch,
                    ModelSeq {
                        tokens,
                        tier: Tier::Device,
                    },
                );
            }
            Op::Free { id, deferred } => {
                let id = u64::from(id % 16);
                let st = if deferred {
                    unsafe { kvs_cache::kvs_seq_free_deferred(self.c, id) }
                } else {
                    unsafe { kvs_cache::kvs_seq_free(self.c, id) }
                };
                if self.model.seqs.remove(&id).is_some() {
                    self.expect(st, &[kvs_status::Ok]);
                } else {
                    self.expect(st, &[kvs_status::SeqNotFound]);
                }
            }
            Op::SwapOut { id } => self.swap(
                id,
                Tier::Device,
                Tier::Host,
                kvs_cache::kvs_seq_swap_out,
                &mut copies,
                &mut ncopies,
            ),
            Op::SwapIn { id } => self.swap(
                id,
                Tier::Host,
                Tier::Device,
                kvs_cache::kvs_seq_swap_in,
                &mut copies,
                &mut ncopies,
            ),
            Op::SetPriority { id, priority } => {
                let id = u64::from(id % 16);
                let prio = u32::from(priority % 6);
                let st = unsafe { kvs_cache::kvs_seq_set_priority(self.c, id, prio) };
                let mut allowed: Vec<kvs_status> =
                    self.seq_status(id, Tier::Device).into_iter().collect();
                if prio >= 4 {
                    allowed.push(kvs_status::InvalidArgument);
                }
                if allowed.is_empty() {
                    allowed.push(kvs_status::Ok);
                }
                self.expect(st, &allowed);
            }
            Op::Alloc { n, group } => {
                let g = self.group(group);
                let pool = self.pools[g];
                let n = usize::from(n % 8);
                let mut out = vec![u32::MAX; n + 1];
                let st =
                    unsafe { kvs_cache::kvs_pages_alloc(self.c, g, n, out.as_mut_ptr(), n + 1) };
                self.expect(st, &[kvs_status::Ok, kvs_status::NoSpace]);
                if st != kvs_status::Ok {
                    assert!(
                        out.iter().all(|&p| p == u32::MAX),
                        "{}: wrote on error",
                        self.op
                    );
                    return;
                }
                assert_eq!(out[n], u32::MAX, "{}: wrote past num_pages", self.op);
                for &p in &out[..n] {
                    // A fresh page: nobody else holds it.
                    assert!(
                        !self.model.held.contains_key(&(pool, p)),
                        "{}: page {p} given twice",
                        self.op
                    );
                    let info = self.page_info(0, g, p).unwrap();
                    assert_eq!((info.refcount, info.state), (1, 2), "{}: page {p}", self.op);
                    self.model.hold(pool, p, 1);
                }
            }
            Op::Acquire {
                ref held,
                ref raw,
                group,
            } => {
                let g = self.group(group);
                let pool = self.pools[g];
                let pages = self.pick_pages(pool, held, 8, raw, 2);
                let st =
                    unsafe { kvs_cache::kvs_pages_acquire(self.c, g, pages.as_ptr(), pages.len()) };
                if raw.is_empty() {
                    // Only pages the caller holds: in use, so acquiring them must work.
                    self.expect(st, &[kvs_status::Ok]);
                } else {
                    self.expect(
                        st,
                        &[
                            kvs_status::Ok,
                            kvs_status::PageNotAllocated,
                            kvs_status::PageOutOfRange,
                            kvs_status::PaddingPage,
                        ],
                    );
                }
                if st == kvs_status::Ok {
                    for p in pages {
                        self.model.hold(pool, p, 1);
                    }
                }
            }
            Op::Release {
                ref held,
                ref raw,
                group,
            } => {
                let g = self.group(group);
                let pool = self.pools[g];
                let pages = self.pick_pages(pool, held, 8, raw, 1);
                let st =
                    unsafe { kvs_cache::kvs_pages_release(self.c, g, pages.as_ptr(), pages.len()) };
                let mut need: HashMap<u32, u32> = HashMap::new();
                for &p in &pages {
                    *need.entry(p).or_default() += 1;
                }
                let covered = need
                    .iter()
                    .all(|(&p, &n)| self.model.held.get(&(pool, p)).copied().unwrap_or(0) >= n);
                if covered {
                    self.expect(st, &[kvs_status::Ok]);
                    for (p, n) in need {
                        let h = self.model.held.get_mut(&(pool, p)).unwrap();
                        *h -= n;
                        if *h == 0 {
                            self.model.held.remove(&(pool, p));
                        }
                    }
                } else {
                    // More releases than the caller holds: refused, nothing released.
                    self.expect(
                        st,
                        &[
                            kvs_status::RefcountUnderflow,
                            kvs_status::PageOutOfRange,
                            kvs_status::PaddingPage,
                        ],
                    );
                }
            }
            Op::Register {
                ref held,
                len,
                vocab,
                group,
            } => {
                let g = self.group(group);
                let pages = self.pick_pages(self.pools[g], held, 6, &[], 0);
                let toks = tokens(len, vocab, u64::from(vocab));
                let mut n = usize::MAX;
                let st = unsafe {
                    kvs_cache::kvs_prefix_register(
                        self.c,
                        g,
                        toks.as_ptr(),
                        toks.len(),
                        pages.as_ptr(),
                        pages.len(),
                        null(),
                        &mut n,
                    )
                };
                self.expect(
                    st,
                    &[
                        kvs_status::Ok,
                        kvs_status::InvalidArgument,
                        kvs_status::Unsupported,
                    ],
                );
                if st == kvs_status::Ok {
                    assert!(n <= pages.len());
                }
            }
            Op::Unregister {
                ref held,
                ref raw,
                group,
            } => {
                let g = self.group(group);
                let pages = self.pick_pages(self.pools[g], held, 4, raw, 4);
                let mut n = usize::MAX;
                let st = unsafe {
                    kvs_cache::kvs_prefix_unregister(self.c, g, pages.as_ptr(), pages.len(), &mut n)
                };
                self.expect(
                    st,
                    &[
                        kvs_status::Ok,
                        kvs_status::PageOutOfRange,
                        kvs_status::PaddingPage,
                    ],
                );
                if st == kvs_status::Ok {
                    assert!(n <= pages.len());
                } else {
                    assert_eq!(n, usize::MAX, "a refused unregister wrote its count");
                }
            }
            Op::Match {
                len,
                vocab,
                max,
                acquire,
                room,
                group,
            } => {
                let g = self.group(group);
                let toks = tokens(len, vocab, u64::from(vocab));
                let room = usize::from(room % 12);
                let mut out = vec![u32::MAX; room];
                let (mut n, mut matched) = (usize::MAX, usize::MAX);
                let st = unsafe {
                    kvs_cache::kvs_prefix_match(
                        self.c,
                        g,
                        toks.as_ptr(),
                        toks.len(),
                        null(),
                        usize::from(max),
                        acquire,
                        out.as_mut_ptr(),
                        room,
                        &mut n,
                        &mut matched,
                    )
                };
                self.expect(st, &[kvs_status::Ok, kvs_status::BufferTooSmall]);
                if st == kvs_status::Ok {
                    assert!(n <= room && matched == n * self.ps, "{}", self.op);
                    assert!(matched <= toks.len().min(usize::from(max)));
                    if acquire {
                        for &p in &out[..n] {
                            self.model.hold(self.pools[g], p, 1);
                        }
                    }
                } else {
                    assert_eq!((n, matched), (usize::MAX, usize::MAX), "{}", self.op);
                }
            }
            Op::Pin { len, vocab } => {
                let toks = tokens(len, vocab, u64::from(vocab));
                let (mut id, mut n) = (0u64, 0usize);
                let st = unsafe {
                    kvs_cache::kvs_prefix_pin(
                        self.c,
                        toks.as_ptr(),
                        toks.len(),
                        null(),
                        &mut id,
                        &mut n,
                    )
                };
                self.expect(st, &[kvs_status::Ok, kvs_status::NoSpace]);
                if st == kvs_status::Ok {
                    assert!(!self.model.pins.contains(&id), "{}: pin id reused", self.op);
                    self.model.pins.push(id);
                }
            }
            Op::Unpin { index } => {
                let (id, known) = match self.model.pins.len() {
                    0 => (u64::from(index) + 1000, false),
                    l => (self.model.pins[usize::from(index) % l], true),
                };
                let st = unsafe { kvs_cache::kvs_prefix_unpin(self.c, id) };
                if known {
                    self.expect(st, &[kvs_status::Ok]);
                    self.model.pins.retain(|&p| p != id);
                } else {
                    self.expect(st, &[kvs_status::InvalidArgument]);
                }
            }
            Op::Prefetch { len, vocab } => {
                let toks = tokens(len, vocab, u64::from(vocab));
                let mut n = usize::MAX;
                let st = unsafe {
                    kvs_cache::kvs_prefix_prefetch(
                        self.c,
                        toks.as_ptr(),
                        toks.len(),
                        null(),
                        &mut n,
                    )
                };
                self.expect(st, &[kvs_status::Ok]);
                assert!(n * self.ps <= toks.len() * self.ng());
            }
            Op::Commit => {
                let st = unsafe { kvs_cache::kvs_cache_commit(self.c) };
                self.expect(st, &[kvs_status::Ok]);
            }
            Op::Clear => {
                let st = unsafe { kvs_cache::kvs_prefix_clear(self.c) };
                self.expect(st, &[kvs_status::Ok]);
            }
            Op::TakeCopies { room } => {
                let room = usize::from(room % 64);
                let st = unsafe {
                    kvs_cache::kvs_cache_take_copies(
                        self.c,
                        copies.as_mut_ptr(),
                        room,
                        &mut ncopies,
                    )
                };
                self.expect(st, &[kvs_status::Ok]);
                assert!(ncopies <= room);
                self.check_copies(&copies[..ncopies]);
            }
            Op::TakeEvents { room } => {
                let room = usize::from(room % 64);
                // SAFETY: kvs_event is plain data; all-zero is a valid value.
                let mut ev: Vec<kvs_event> =
                    (0..room).map(|_| unsafe { std::mem::zeroed() }).collect();
                let st = unsafe {
                    kvs_cache::kvs_cache_take_events(self.c, ev.as_mut_ptr(), room, &mut ncopies)
                };
                self.expect(st, &[kvs_status::Ok]);
                assert!(ncopies <= room);
                for e in &ev[..ncopies] {
                    assert!((e.group as usize) < self.ng(), "{}: event {e:?}", self.op);
                }
            }
            Op::PageInfo { page, tier, group } => {
                let page = u32::from(page) % (self.dev_pages + 4);
                let r = self.page_info(u32::from(tier % 3), self.group(group), page);
                if tier % 3 == 2 {
                    assert_eq!(r.err(), Some(kvs_status::InvalidArgument), "{}", self.op);
                } else if let Ok(i) = r {
                    assert!(i.state <= 3);
                    assert_eq!(i.refcount > 0, i.state == 2, "{}: page {page}", self.op);
                }
            }
            Op::BadPointers { which, len } => {
                let n = usize::from(len) + 1;
                let ng = self.ng();
                let mut page = u32::MAX;
                let st = unsafe {
                    match which % 8 {
                        0 => kvs_cache::kvs_pages_acquire(self.c, 0, null(), n),
                        1 => kvs_cache::kvs_pages_release(self.c, 0, null(), n),
                        2 => kvs_cache::kvs_seq_begin(
                            self.c,
                            99,
                            null(),
                            n,
                            null(),
                            0,
                            0,
                            null_mut(),
                        ),
                        3 => kvs_cache::kvs_pages_alloc(self.c, 0, 1, null_mut(), n),
                        4 => kvs_cache::kvs_cache_stats(self.c, null_mut()),
                        5 => kvs_cache::kvs_cache_available(self.c, 7, 0, &mut ncopies),
                        6 => kvs_cache::kvs_cache_available(self.c, 0, ng + n, &mut ncopies),
                        _ => kvs_cache::kvs_pages_alloc(self.c, ng + n, 1, &mut page, 1),
                    }
                };
                let want = if which % 8 >= 5 {
                    kvs_status::InvalidArgument
                } else {
                    kvs_status::NullArgument
                };
                self.expect(st, &[want]);
                assert_eq!((ncopies, page), (usize::MAX, u32::MAX), "{}", self.op);
            }
            Op::ReleaseSkipped { id, back } => {
                let id = u64::from(id % 16);
                // The engine's computed tokens: at most the sequence's.
                let computed = self.model.seqs.get(&id).map_or(0, |s| s.tokens);
                let computed = computed.saturating_sub(usize::from(back % 4));
                let mut n = usize::MAX;
                let st =
                    unsafe { kvs_cache::kvs_seq_release_skipped(self.c, id, computed, &mut n) };
                if let Some(want) = self.seq_status(id, Tier::Device) {
                    self.expect(st, &[want]);
                    return assert_eq!(n, usize::MAX, "{}", self.op);
                }
                self.expect(st, &[kvs_status::Ok]);
                // Positions hold one page each, in every group.
                let pages = computed.div_ceil(self.ps) * self.ng();
                assert!(n <= pages, "{}: released {n}", self.op);
            }
            Op::SetComputed { id, back } => {
                let id = u64::from(id % 16);
                let Some(held) = self.model.seqs.get(&id).map(|s| s.tokens) else {
                    let st = unsafe { kvs_cache::kvs_seq_set_computed(self.c, id, 0) };
                    return self.expect(st, &[kvs_status::SeqNotFound]);
                };
                let computed = (held + 1).saturating_sub(usize::from(back % 5));
                let st = unsafe { kvs_cache::kvs_seq_set_computed(self.c, id, computed) };
                let want = if computed > held {
                    kvs_status::InvalidArgument
                } else {
                    kvs_status::Ok
                };
                self.expect(st, &[want]);
            }
            Op::SetRetention { id, n, at } => {
                let id = u64::from(id % 16);
                let held = self.model.seqs.get(&id).map_or(0, |s| s.tokens);
                let n = usize::from(n % 6);
                let bounds: Vec<usize> = (0..n)
                    .map(|i| {
                        (held + 1).saturating_sub(usize::from(at.rotate_left(4 * i as u32) % 48))
                    })
                    .collect();
                let st = unsafe {
                    kvs_cache::kvs_seq_set_retention(self.c, id, bounds.as_ptr(), bounds.len())
                };
                let want = if !self.sparse || n > 4 {
                    kvs_status::InvalidArgument
                } else {
                    self.seq_status(id, Tier::Device).unwrap_or(kvs_status::Ok)
                };
                self.expect(st, &[want]);
            }
            Op::NewStep => {
                let st = unsafe { kvs_cache::kvs_cache_new_step(self.c) };
                self.expect(st, &[kvs_status::Ok]);
            }
            Op::StatePage { id, group } => {
                let id = u64::from(id % 16);
                let g = usize::from(group) % (self.ng() + 1);
                let mut page = u32::MAX;
                let st = unsafe { kvs_cache::kvs_seq_state_page(self.c, id, g, &mut page) };
                if g == self.ng() || !self.state[g] {
                    self.expect(st, &[kvs_status::InvalidArgument]);
                } else if let Some(want) = self.seq_status(id, Tier::Device) {
                    self.expect(st, &[want]);
                } else if self.model.seqs[&id].tokens == 0 {
                    // No state page yet, unless an append reserved lookahead slots.
                    self.expect(st, &[kvs_status::InvalidArgument, kvs_status::Ok]);
                    if st == kvs_status::Ok {
                        return;
                    }
                } else {
                    self.expect(st, &[kvs_status::Ok]);
                    let info = self.page_info(0, g, page).unwrap();
                    assert!(
                        page != KVS_NULL_PAGE && info.refcount > 0,
                        "{}: state page {page}: {info:?}",
                        self.op
                    );
                    return;
                }
                assert_eq!(page, u32::MAX, "{}: written on error", self.op);
            }
            Op::Find {
                len,
                vocab,
                max,
                room,
            } => {
                let toks = tokens(len, vocab, u64::from(vocab));
                let max = usize::from(max);
                let room = usize::from(room % 12);
                let ng = self.ng();
                let mut out = vec![u32::MAX; room * ng];
                let ptr = if room == 0 {
                    null_mut()
                } else {
                    out.as_mut_ptr()
                };
                let mut matched = usize::MAX;
                let st = unsafe {
                    kvs_cache::kvs_prefix_find(
                        self.c,
                        toks.as_ptr(),
                        toks.len(),
                        null(),
                        max,
                        ptr,
                        out.len(),
                        room,
                        &mut matched,
                    )
                };
                if st != kvs_status::Ok {
                    self.expect(st, &[kvs_status::BufferTooSmall]);
                    assert!(room > 0 && matched == usize::MAX, "{}", self.op);
                    return assert!(out.iter().all(|&p| p == u32::MAX), "{}", self.op);
                }
                // Whole pages, plus whole units of one more page with a unit below the page.
                let n = matched / self.ps;
                assert!(
                    matched % self.unit == 0 && matched <= max.min(toks.len()),
                    "{}: matched {matched}",
                    self.op
                );
                if room > 0 {
                    assert!(n <= room, "{}", self.op);
                    for (g, row) in out.chunks(room).enumerate() {
                        for &p in &row[..n] {
                            assert!(p < self.dev_pages, "{}: group {g} page {p}", self.op);
                        }
                        assert!(row[n..].iter().all(|&p| p == u32::MAX), "{}", self.op);
                    }
                }
                if ng == 1 {
                    // One group: the hit is that group's device match.
                    let mut m = usize::MAX;
                    let st = unsafe {
                        kvs_cache::kvs_prefix_match(
                            self.c,
                            0,
                            toks.as_ptr(),
                            toks.len(),
                            null(),
                            max,
                            false,
                            null_mut(),
                            0,
                            null_mut(),
                            &mut m,
                        )
                    };
                    // A non-empty match needs room: BUFFER_TOO_SMALL then, and the hit is not 0.
                    match st {
                        kvs_status::Ok => assert_eq!(m, n * self.ps, "{}", self.op),
                        _ => assert!(st == kvs_status::BufferTooSmall && n > 0, "{}", self.op),
                    }
                }
            }
        }
    }
}
