//! kvshare-replay on small traces with hand-computed answers: every reported figure (per-turn
//! rows, the three page series, hits, evictions, copy-on-write copies) is checked, kvshare's
//! pages in use are compared with the independently computed ideal at every step, and the known
//! gaps are pinned down with numbers.

use kvshare_replay::formats::parse_trace;
use kvshare_replay::model::NoModel;
use kvshare_replay::report::{json_totals, series, total_row, turn_rows, TurnRow};
use kvshare_replay::trace::Request;
use kvshare_replay::workload::ChatWorkload;
use kvshare_replay::{replay, Outcome, ReplayConfig};

fn cfg(ps: u32, device_pages: u32) -> ReplayConfig {
    ReplayConfig {
        page_size: ps,
        device_pages,
        check: true,
        ..ReplayConfig::default()
    }
}

fn load(name: &str) -> Vec<Request> {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    parse_trace(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn run(reqs: &[Request], c: &ReplayConfig) -> Outcome {
    replay(reqs, c, &mut NoModel, &mut |_| {}).unwrap()
}

fn col(out: &Outcome, f: impl Fn(&kvshare_replay::StepPages) -> u32) -> Vec<u32> {
    out.per_step.iter().map(f).collect()
}

fn req(id: &str, arrival: f64, prompt: &[i32], outputs: &[&[i32]]) -> Request {
    Request {
        id: id.into(),
        session: None,
        arrival_ms: arrival,
        prompt: prompt.to_vec(),
        outputs: outputs.iter().map(|o| o.to_vec()).collect(),
        salt: String::new(),
        lora: 0,
        line: 0,
    }
}

fn row(
    turn: usize,
    prompt: u64,
    output: u64,
    no_reuse: u64,
    kvshare: u64,
    q: u64,
    hit: u64,
) -> TurnRow {
    TurnRow {
        turn,
        requests: 1,
        prompt_tokens: prompt,
        output_tokens: output,
        no_reuse_pages: no_reuse,
        kvshare_pages: kvshare,
        query_tokens: q,
        hit_tokens: hit,
        mgr_ns: 0,
        attn_ns: 0,
    }
}

/// Rows without their timings.
fn rows(out: &Outcome) -> Vec<TurnRow> {
    turn_rows(out)
        .into_iter()
        .map(|r| TurnRow {
            mgr_ns: 0,
            attn_ns: 0,
            ..r
        })
        .collect()
}

#[test]
fn two_turns_of_one_conversation() {
    // Page size 4. Turn 1: prompt 10 tokens (3 pages), 2 outputs; its pages [1-4] [5-8] [9-12]
    // are cached when it ends. Turn 2 waits for turn 1 (same session), repeats the 12 tokens of
    // history plus 2 new ones: 3 pages hit (12 of 14 tokens), 1 page allocated.
    let out = run(&load("replay_two_turns.jsonl"), &cfg(4, 64));
    assert_eq!(
        rows(&out),
        vec![row(1, 10, 2, 3, 3, 10, 0), row(2, 14, 1, 4, 1, 14, 12)]
    );
    let t = total_row(&turn_rows(&out));
    assert_eq!((t.no_reuse_pages, t.kvshare_pages), (7, 4));
    assert!((t.saving_pct() - 300.0 / 7.0).abs() < 1e-9);
    assert_eq!(t.hit_pct(), 50.0);
    assert_eq!(col(&out, |s| s.kvshare), vec![3, 3, 3, 4, 4]);
    assert_eq!(col(&out, |s| s.no_sharing), vec![3, 3, 3, 4, 4]);
    assert_eq!(col(&out, |s| s.ideal), vec![3, 3, 3, 4, 4]);
    assert_eq!(col(&out, |s| s.cached), vec![0, 0, 0, 0, 0]);
    assert_eq!(out.steps, 5);
    assert_eq!(out.sim_ms, 100.0);
    let r = &out.requests;
    assert_eq!((r[0].start_ms, r[0].finish_ms), (0.0, 60.0));
    assert_eq!(
        (r[1].start_ms, r[1].finish_ms),
        (60.0, 100.0),
        "turn 2 waits for turn 1"
    );
    let c = out.final_stats.counters;
    assert_eq!((c.prefix_hit_tokens, c.prefix_query_tokens), (12, 24));
    assert_eq!((c.evictions, c.cow_copies), (0, 0));
    assert_eq!(out.gap_steps, 0);
    assert_eq!(out.final_stats.device_pages_in_use, 0);
    assert_eq!(
        out.final_stats.device_pages_cached, 3,
        "[1-4] [5-8] [9-12]; the partial page is freed"
    );
}

#[test]
fn shared_system_prompt_between_two_users() {
    // Both arrive at 0 and share the 8-token system prompt (2 pages): a allocates 3 pages,
    // b hits 8 of 9 prompt tokens and allocates 1.
    let out = run(&load("replay_shared_system.jsonl"), &cfg(4, 64));
    assert_eq!(
        rows(&out),
        vec![TurnRow {
            requests: 2,
            ..row(1, 19, 4, 6, 4, 19, 8)
        }]
    );
    assert_eq!(col(&out, |s| s.kvshare), vec![4, 4, 3, 3]);
    assert_eq!(col(&out, |s| s.no_sharing), vec![6, 6, 3, 3]);
    assert_eq!(col(&out, |s| s.ideal), vec![4, 4, 3, 3]);
    assert_eq!(col(&out, |s| s.running), vec![2, 2, 1, 1]);
    let se = series(&out);
    assert_eq!(
        (se.kvshare_peak, se.no_sharing_peak, se.ideal_peak),
        (4, 6, 4)
    );
    assert_eq!(se.kvshare_avg, 3.5);
    assert_eq!(se.no_sharing_avg, 4.5);
    let by_id: Vec<(u64, u64, u64, u64)> = out
        .requests
        .iter()
        .map(|r| {
            (
                r.no_reuse_pages,
                r.allocated_pages,
                r.query_tokens,
                r.hit_tokens,
            )
        })
        .collect();
    assert_eq!(by_id, vec![(3, 3, 10, 0), (3, 1, 9, 8)]);
    assert_eq!(out.gap_steps, 0);
}

#[test]
fn eviction_is_counted_and_lru_decides_what_hits_later() {
    // 4 device pages of 4 tokens. r1 leaves [1-4] [5-8] cached. r2's decode needs a page with
    // the free list empty: the least recently used cached page, [5-8] (released last page first),
    // is evicted. r3 repeats r1's prompt: [1-4] still hits, [5-8] is recomputed; its decode
    // evicts r2's [24-27].
    let out = run(&load("replay_eviction.jsonl"), &cfg(4, 4));
    assert_eq!(out.final_stats.counters.evictions, 2);
    let hits: Vec<(u64, u64)> = out
        .requests
        .iter()
        .map(|r| (r.query_tokens, r.hit_tokens))
        .collect();
    assert_eq!(hits, vec![(8, 0), (8, 0), (8, 4)]);
    let alloc: Vec<u64> = out.requests.iter().map(|r| r.allocated_pages).collect();
    assert_eq!(alloc, vec![3, 3, 2]);
    assert_eq!(col(&out, |s| s.kvshare), vec![2, 3, 2, 3, 2, 3]);
    assert_eq!(col(&out, |s| s.ideal), vec![2, 3, 2, 3, 2, 3]);
    assert_eq!(
        out.gap_steps, 0,
        "eviction does not open a gap to the ideal"
    );
    let starts: Vec<f64> = out.requests.iter().map(|r| r.start_ms).collect();
    assert_eq!(
        starts,
        vec![0.0, 1000.0, 2000.0],
        "idle time is skipped to the next arrival"
    );
}

#[test]
fn salts_and_lora_isolate() {
    // Same 5 tokens under salts a, b and (a, lora 3): three separate [1-4] pages; t4 (salt a,
    // other tail) shares t1's page.
    let out = run(&load("replay_salted.jsonl"), &cfg(4, 64));
    let hits: Vec<u64> = out.requests.iter().map(|r| r.hit_tokens).collect();
    assert_eq!(hits, vec![0, 0, 0, 4]);
    assert_eq!(col(&out, |s| s.kvshare), vec![7, 7]);
    assert_eq!(col(&out, |s| s.ideal), vec![7, 7]);
    assert_eq!(col(&out, |s| s.no_sharing), vec![8, 8]);
}

#[test]
fn parallel_sampling_forks_and_copies_on_write() {
    // n = 2 after a 6-token prompt: the partial page [5,6] is shared after the fork, copied on
    // the first write of sample 0, written in place by sample 1.
    let r = vec![req(
        "f",
        0.0,
        &[1, 2, 3, 4, 5, 6],
        &[&[7, 8, 9], &[17, 18, 19]],
    )];
    let out = run(&r, &cfg(4, 64));
    assert_eq!(col(&out, |s| s.kvshare), vec![2, 3, 3, 5]);
    assert_eq!(col(&out, |s| s.ideal), vec![2, 3, 3, 5]);
    assert_eq!(col(&out, |s| s.no_sharing), vec![4, 4, 4, 6]);
    assert_eq!(out.final_stats.counters.cow_copies, 1);
    let s = &out.requests[0];
    assert_eq!(
        (
            s.samples,
            s.output_tokens,
            s.no_reuse_pages,
            s.allocated_pages
        ),
        (2, 6, 6, 5)
    );
    assert_eq!(out.gap_steps, 0);
}

#[test]
fn fully_cached_page_aligned_prompt_shares_its_last_page() {
    // Two identical 8-token prompts at once. The engine recomputes the last prompt token
    // (max_match = 7), but the core's skip_cached_writes shares the cached page [5-8] anyway and
    // hides the recomputed slot from the KV write: kvshare equals the ideal.
    let r = vec![
        req("x", 0.0, &[1, 2, 3, 4, 5, 6, 7, 8], &[&[9]]),
        req("y", 0.0, &[1, 2, 3, 4, 5, 6, 7, 8], &[&[10]]),
    ];
    let out = run(&r, &cfg(4, 64));
    assert_eq!(col(&out, |s| s.kvshare), vec![2, 4]);
    assert_eq!(col(&out, |s| s.ideal), vec![2, 4]);
    assert_eq!(
        out.requests[1].hit_tokens, 7,
        "all but the recomputed token"
    );
    assert_eq!(out.requests[1].allocated_pages, 1);
    assert_eq!(out.gap_steps, 0);

    // vLLM's behaviour (skip_cached_writes off): y gets a fresh duplicate of [5-8], one page
    // more than the ideal while both live.
    let vllm = ReplayConfig {
        skip_cached_writes: false,
        ..cfg(4, 64)
    };
    let out = run(&r, &vllm);
    assert_eq!(col(&out, |s| s.kvshare), vec![3, 5]);
    assert_eq!(col(&out, |s| s.ideal), vec![2, 4]);
    assert_eq!((out.gap_steps, out.min_gap, out.max_gap), (2, 0, 1));
    assert_eq!(out.requests[1].hit_tokens, 4);
}

#[test]
fn identical_pages_filled_independently_are_deduplicated() {
    // Two live requests fill the same full page independently (same prompt tail, same outputs,
    // as greedy decoding of identical requests does). When the second copy fills up, the core
    // switches that request to the cached page and frees the duplicate: kvshare == ideal.
    let r = vec![
        req("p", 0.0, &[1, 2, 3, 4, 5, 6], &[&[7, 8, 9]]),
        req("q", 0.0, &[1, 2, 3, 4, 5, 6], &[&[7, 8, 9]]),
    ];
    let out = run(&r, &cfg(4, 64));
    assert_eq!(col(&out, |s| s.kvshare), vec![3, 3, 2, 4]);
    assert_eq!(col(&out, |s| s.ideal), vec![3, 3, 2, 4]);
    assert_eq!((out.gap_steps, out.max_gap), (0, 0));
    // Engines that keep their own block tables (vLLM mode) must not have pages switched under
    // them: the duplicate stays until its request ends.
    let vllm = ReplayConfig {
        skip_cached_writes: false,
        ..cfg(4, 64)
    };
    let out = run(&r, &vllm);
    assert_eq!(col(&out, |s| s.kvshare), vec![3, 3, 3, 5]);
    assert_eq!((out.gap_steps, out.max_gap), (2, 1));
}

fn small_chat() -> Vec<Request> {
    ChatWorkload {
        users: 4,
        turns: 4,
        system_tokens: 96,
        user_tokens: (10, 30),
        output_tokens: (10, 30),
        fork_every: 3,
        think_ms: (0, 200),
        ..ChatWorkload::default()
    }
    .generate()
}

#[test]
fn chat_without_eviction_matches_the_ideal_at_every_step() {
    let reqs = small_chat();
    let out = run(&reqs, &cfg(16, 4096));
    let c = out.final_stats.counters;
    assert_eq!(c.evictions, 0);
    assert!(c.cow_copies > 0, "forks were exercised");
    assert_eq!(
        out.gap_steps, 0,
        "kvshare != ideal: {:?}",
        out.first_gap_step
    );
    assert!(out
        .per_step
        .iter()
        .all(|s| s.kvshare == s.ideal && s.kvshare <= s.no_sharing));
    let t = total_row(&turn_rows(&out));
    assert_eq!(t.hit_tokens, c.prefix_hit_tokens);
    assert_eq!(t.query_tokens, c.prefix_query_tokens);
    assert_eq!(t.requests, 16);
    let se = series(&out);
    assert!(se.kvshare_peak < se.no_sharing_peak);
    // Later turns hit their whole history but the last partial page.
    let rows = turn_rows(&out);
    assert!(rows[3].hit_pct() > 80.0, "{:?}", rows[3]);
    // The JSON totals carry the same figures.
    let j = json_totals(&out, &cfg(16, 4096), false, None);
    assert_eq!(j["hit_tokens"], t.hit_tokens);
    assert_eq!(j["ideal_gap_steps"], 0);
    assert_eq!(j["peak_pages"]["kvshare"], se.kvshare_peak);
}

#[test]
fn chat_under_memory_pressure_evicts_preempts_and_still_matches_the_ideal() {
    // Eight conversations with long replies on 64 pages: requests admitted with room for their
    // prompt outgrow the device while decoding.
    let reqs = ChatWorkload {
        users: 8,
        turns: 3,
        system_tokens: 32,
        user_tokens: (10, 30),
        output_tokens: (60, 120),
        fork_every: 3,
        think_ms: (0, 100),
        ..ChatWorkload::default()
    }
    .generate();
    // Recompute preemption (no host tier).
    let tight = ReplayConfig {
        concurrency: 16,
        ..cfg(16, 64)
    };
    let out = run(&reqs, &tight);
    assert!(out.final_stats.counters.evictions > 0);
    assert!(out.recomputes > 0, "preemption exercised");
    assert_eq!(out.gap_steps, 0);
    assert!(out.per_step.iter().all(|s| s.kvshare <= 64));
    // Swap preemption and demotion with a host tier.
    let host = ReplayConfig {
        host_pages: 256,
        ..tight
    };
    let out = run(&reqs, &host);
    assert!(out.swaps > 0, "swap exercised");
    assert!(out.final_stats.counters.demotions > 0);
    assert_eq!(out.gap_steps, 0);
    assert_eq!(
        out.requests.iter().map(|r| r.output_tokens).sum::<usize>(),
        reqs.iter()
            .map(|r| r.outputs.iter().map(Vec::len).sum::<usize>())
            .sum::<usize>()
    );
}

#[test]
fn too_large_request_is_refused_before_running() {
    let r = vec![req("big", 0.0, &[1; 40], &[&[2]])];
    let e = replay(&r, &cfg(4, 8), &mut NoModel, &mut |_| {}).unwrap_err();
    assert!(e.contains("\"big\" needs 12 pages"), "{e}");
}

#[test]
fn share_ratio_sweep_measures_the_shared_prefix() {
    use kvshare_replay::model::Model;
    use kvshare_replay::sweep;
    // 4 concurrent requests of 128 tokens (120 prompt + 8 output), 16-token pages: the first
    // round(r * 128) tokens are common, so each request but the first hits k = that / 16 whole
    // pages, and at the peak (all four at their end) kvshare holds 4 * 8 - 3k pages.
    let mut factory = |_: &ReplayConfig| Ok(Box::new(NoModel) as Box<dyn Model>);
    let rows = sweep::share_ratio(&cfg(16, 0), 4, 128, 8, 7, &mut factory, &mut |_, _| {}).unwrap();
    let got: Vec<(u32, u64, u32, u32)> = rows
        .iter()
        .map(|r| {
            let t = total_row(&turn_rows(&r.out));
            let s = series(&r.out);
            (r.value, t.hit_tokens, s.kvshare_peak, s.no_sharing_peak)
        })
        .collect();
    let want: Vec<(u32, u64, u32, u32)> = [(10, 0), (30, 2), (50, 4), (70, 5), (90, 7)]
        .iter()
        .map(|&(r, k)| (r, 3 * 16 * k as u64, 32 - 3 * k, 32))
        .collect();
    assert_eq!(got, want);
    assert!(rows
        .iter()
        .all(|r| r.out.gap_steps == 0 && r.out.final_stats.counters.evictions == 0));
    let table = sweep::format_share_ratio(&rows);
    assert_eq!(table.lines().count(), 6, "{table}");
}
