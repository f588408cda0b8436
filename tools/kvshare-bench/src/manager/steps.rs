//! The decode step and the host tier, each model beside the plain one.

use super::*;

/// A decode step's bookkeeping and a request's begin + free, for one model.
struct DecodeCost {
    /// ns per step of 256 sequences: `kvs_seq_append_batch`, then every group's block tables
    /// and slot mapping; in the hybrid model each sequence's `kvs_seq_release_skipped` first
    /// (vLLM's `remove_skipped_blocks`, which its manager runs every step, so the window group
    /// holds only the pages its window reads).
    step_ns: f64,
    /// ns per step of writing the same block tables from an engine-side copy.
    table_copy_ns: f64,
    /// ns per begin + free of an 812-token request sharing the 512-token system prompt.
    begin_free_ns: f64,
}

fn decode_step(repeats: usize, model: Model) -> DecodeCost {
    const SEQS: usize = 256;
    const PS: usize = 16;
    const MAX_PAGES: usize = 128;
    let groups = model.num_groups();
    let c = CCache::build(model, PS as u32, 0, (SEQS * MAX_PAGES) as u32 + 64);
    let system = tokens(1, 512);
    let ids: Vec<u64> = (1..=SEQS as u64).collect();
    let mut computed = 0;
    for &id in &ids {
        let mut p = system.clone();
        p.extend(tokens(100 + id, 300));
        c.begin(id, &p, p.len() - 1);
        computed = p.len();
    }
    let releases = model != Model::Plain;
    let mut released = 0usize;
    let mut tables = vec![vec![0i32; SEQS * MAX_PAGES]; groups];
    let mut lens = vec![0i32; SEQS];
    let mut slots = vec![0i64; SEQS];
    let qlens = vec![1u32; SEQS];
    let mut copies = vec![
        kvs_copy {
            src_page: 0,
            dst_page: 0,
            num_tokens: 0,
            kind: 0,
            group: 0,
        };
        SEQS * groups
    ];
    let mut step = 0i32;
    const STEPS: usize = 20;
    // SAFETY: `c.0` is a live cache; every buffer is passed with its own length (`ids`, `toks`:
    // SEQS; `copies`: its len; each table: its len, rows of MAX_PAGES; `lens`, `qlens`,
    // `slots`: SEQS) and lives across the closure; `nc` is a live out location; the NULL
    // `num_slots_out` is optional; every group index is below the model's group count; `n` is
    // a live out location and every id a live sequence.
    let step_ns = ns_per_unit(repeats.min(15), STEPS, || unsafe {
        for _ in 0..STEPS {
            step += 1;
            if releases {
                for &id in &ids {
                    let mut n = 0;
                    ok(kvs_cache::kvs_seq_release_skipped(
                        c.0, id, computed, &mut n,
                    ));
                    released += n;
                }
            }
            computed += 1;
            let toks = vec![step; SEQS];
            let mut nc = 0;
            ok(kvs_cache::kvs_seq_append_batch(
                c.0,
                ids.as_ptr(),
                SEQS,
                toks.as_ptr(),
                SEQS,
                copies.as_mut_ptr(),
                copies.len(),
                &mut nc,
            ));
            for (g, table) in tables.iter_mut().enumerate() {
                ok(kvs_cache::kvs_cache_block_tables(
                    c.0,
                    g,
                    ids.as_ptr(),
                    SEQS,
                    MAX_PAGES,
                    -1,
                    table.as_mut_ptr(),
                    table.len(),
                    lens.as_mut_ptr(),
                    SEQS,
                ));
                ok(kvs_cache::kvs_cache_slot_mapping(
                    c.0,
                    g,
                    ids.as_ptr(),
                    qlens.as_ptr(),
                    SEQS,
                    slots.as_mut_ptr(),
                    SEQS,
                    ptr::null_mut(),
                ));
            }
        }
    });
    // Floor: writing the same block-table matrices from an engine-side copy (no bookkeeping).
    let src = tables.clone();
    let table_copy_ns = ns_per_unit(repeats, STEPS, || {
        for _ in 0..STEPS {
            for (t, s) in tables.iter_mut().zip(&src) {
                t.copy_from_slice(std::hint::black_box(s));
            }
            std::hint::black_box(&tables);
        }
    });
    c.check();
    // The first release drops the pages of each 812-token prompt before its 128-token window.
    assert_eq!(
        releases,
        released > 0,
        "{model:?}: released {released} pages"
    );

    let begin_free_ns = ns_per_unit(repeats, 100, || {
        for k in 0..100u64 {
            let mut p = system.clone();
            p.extend(tokens(10_000 + k, 300));
            c.begin(1_000_000 + k, &p, p.len() - 1);
            c.free(1_000_000 + k);
        }
    });
    c.check();
    DecodeCost {
        step_ns,
        table_copy_ns,
        begin_free_ns,
    }
}

/// The decode-step and begin + free rows of both models.
pub(super) fn decode_rows(repeats: usize, rows: &mut Vec<Row>) {
    let plain = decode_step(repeats, Model::Plain);
    let hybrid = decode_step(repeats, Model::Hybrid);
    rows.push(Row {
        name: "decode_step_256_seqs",
        unit: "step",
        ns: plain.step_ns,
        floor_ns: plain.table_copy_ns,
        target_ns: 50_000.0,
    });
    rows.push(Row::hybrid(
        "decode_step_256_seqs_hybrid",
        "step",
        hybrid.step_ns,
        plain.step_ns,
    ));
    println!(
        "decode: hybrid step {:.2}x its own table copies",
        hybrid.step_ns / hybrid.table_copy_ns
    );
    rows.push(Row {
        name: "begin_free_812_tokens",
        unit: "request",
        ns: plain.begin_free_ns,
        floor_ns: f64::NAN,
        target_ns: f64::NAN,
    });
    rows.push(Row::hybrid(
        "begin_free_812_tokens_hybrid",
        "request",
        hybrid.begin_free_ns,
        plain.begin_free_ns,
    ));
}

/// The host tier's cost for one model.
struct TierCost {
    /// ns per prompt page of a round (begin on a prompt demoted to host, free, copies drained).
    ns: f64,
    /// Index events per prompt page of a round.
    events_per_page: f64,
}

/// Host tier: two prompts that each fill the full-attention group's device pages take turns, so
/// every begin demotes the other prompt's pages to host and promotes its own back (copies
/// drained each round), and every index change is an event drained in batches. `device_only`
/// runs the same rounds on a cache without a host tier, where they are plain misses (evict +
/// allocate).
fn tier_rounds(repeats: usize, model: Model, device_only: bool) -> TierCost {
    const PAGES: usize = 256;
    const PS: usize = 16;
    // The hybrid model's window group gets a pool of its own (pages of half the bytes), so
    // the full group's pool is as full as the plain model's (one more page: the null page).
    // The window group's pool holds one prompt's pages, as the cold begin needs, but a hit
    // needs only the window's.
    let (device, groups) = match model {
        Model::Plain => (PAGES, Vec::new()),
        Model::Hybrid => {
            let mut g = model.core_groups();
            g[1].page_bytes = Config::default().page_bytes().unwrap_or(2) / 2;
            (PAGES + 1, g)
        }
    };
    let mut s = State::new(Config {
        page_size: PS as u32,
        num_device_pages: device as u32,
        num_host_pages: if device_only { 0 } else { 4 * PAGES as u32 },
        enable_events: !device_only,
        groups,
        reserve_null_page: model.reserve_null_page(),
        ..Config::default()
    })
    .unwrap();
    let a = tokens(1, PAGES * PS);
    let b = tokens(2, PAGES * PS);
    let mut id = 0u64;
    let mut round = |s: &mut State, p: &[i32]| {
        id += 1;
        s.begin(id, p, None, usize::MAX, 0).unwrap();
        s.free(id).unwrap();
        std::hint::black_box(s.take_copies(usize::MAX));
    };
    round(&mut s, &a);
    round(&mut s, &b);
    s.take_events(usize::MAX);
    const ROUNDS: usize = 10;
    let before = s.stats().counters;
    let mut events = 0usize;
    let reps = repeats.min(11);
    let ns = ns_per_unit(reps, ROUNDS * PAGES, || {
        for k in 0..ROUNDS {
            round(&mut s, if k % 2 == 0 { &a } else { &b });
            events += s.take_events(4096).len();
        }
    });
    let after = s.stats().counters;
    if !device_only {
        assert!(
            after.promotions > before.promotions && after.demotions > before.demotions,
            "{model:?}: the rounds must move pages between the tiers"
        );
    }
    s.check().unwrap();
    TierCost {
        ns,
        events_per_page: events as f64 / (ROUNDS * PAGES) as f64 / (reps + 1) as f64,
    }
}

/// The host tier's rows: the plain model against the same rounds without a host tier, the
/// hybrid model against the plain one.
pub(super) fn tiers(repeats: usize, rows: &mut Vec<Row>) {
    let plain = tier_rounds(repeats, Model::Plain, false);
    let floor = tier_rounds(repeats, Model::Plain, true);
    let hybrid = tier_rounds(repeats, Model::Hybrid, false);
    rows.push(Row {
        name: "demote_promote_page",
        unit: "page",
        ns: plain.ns,
        floor_ns: floor.ns,
        target_ns: f64::NAN,
    });
    rows.push(Row::hybrid(
        "demote_promote_page_hybrid",
        "page",
        hybrid.ns,
        plain.ns,
    ));
    // Per page and round: device Removed + host Stored (demotion) + device Stored (promotion).
    for (what, t) in [("plain", &plain), ("hybrid", &hybrid)] {
        println!(
            "tiers ({what}): {:.1} events per prompt page moved, {:.1} M events/s of bookkeeping",
            t.events_per_page,
            t.events_per_page / t.ns * 1e3
        );
    }
    rows.push(Row {
        name: "tiered_bookkeeping_per_event",
        unit: "event",
        ns: plain.ns / plain.events_per_page,
        floor_ns: f64::NAN,
        target_ns: f64::NAN,
    });
}
