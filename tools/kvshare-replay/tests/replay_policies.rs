//! Eviction policies, the offline reference, trace formats and streaming, end to end through the
//! replay loop: every policy serves the same schedule (what the offline reference assumes), the
//! offline model's LRU reproduces the core's LRU hits exactly (so the recorded log is what the
//! core was asked), the offline reference is never below any policy, and a generated trace in
//! each public format replays from its file with the same results as from memory.

use kvshare_core::EvictionPolicy;
use kvshare_replay::formats::excerpt;
use kvshare_replay::formats::parse_trace_as;
use kvshare_replay::sweep;
use kvshare_replay::trace::Request;
use kvshare_replay::workload::ChatWorkload;
use kvshare_replay::{
    replay, replay_source, FileSource, NoModel, Outcome, ReplayConfig, RequestSource, Schedule,
    TraceFormat, VecSource,
};

fn chat() -> Vec<Request> {
    ChatWorkload {
        users: 6,
        turns: 5,
        system_tokens: 256,
        user_tokens: (20, 60),
        output_tokens: (20, 60),
        fork_every: 4,
        think_ms: (0, 300),
        ..ChatWorkload::default()
    }
    .generate()
}

fn cfg(device_pages: u32, policy: EvictionPolicy) -> ReplayConfig {
    ReplayConfig {
        page_size: 16,
        device_pages,
        concurrency: 4,
        policy,
        reference: true,
        check: true,
        ..ReplayConfig::default()
    }
}

fn run(reqs: &[Request], c: &ReplayConfig) -> Outcome {
    replay(reqs, c, &mut NoModel, &mut |_| {}).unwrap()
}

fn tmp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kvshare-policies-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn every_policy_serves_the_same_schedule_and_the_reference_bounds_them() {
    let reqs = chat();
    for pages in [90, 120, 160] {
        let runs: Vec<Outcome> = EvictionPolicy::ALL
            .into_iter()
            .map(|p| run(&reqs, &cfg(pages, p)))
            .collect();
        let key = |o: &Outcome| (o.steps, o.swaps, o.recomputes, o.query_tokens());
        for o in &runs {
            assert_eq!(key(o), key(&runs[0]), "{pages} pages");
            assert_eq!(o.gap_steps, 0, "{pages} pages: kvshare == ideal");
            let r = o.reference.unwrap();
            assert!(
                r.hit_tokens >= o.hit_tokens(),
                "{pages} pages: reference {} below {}",
                r.hit_tokens,
                o.hit_tokens()
            );
        }
        let lru = &runs[0];
        assert_eq!(
            lru.reference.unwrap().lru_model_hit_tokens,
            lru.hit_tokens(),
            "{pages} pages: the model's LRU is the core's LRU"
        );
        assert!(lru.final_stats.counters.evictions > 0, "{pages}: pressure");
    }
}

#[test]
fn with_a_host_tier_the_reference_counts_both_tiers() {
    let reqs = chat();
    for policy in EvictionPolicy::ALL {
        let c = ReplayConfig {
            host_pages: 64,
            ..cfg(90, policy)
        };
        let o = run(&reqs, &c);
        let r = o.reference.unwrap();
        assert!(o.final_stats.counters.promotions > 0, "{policy:?}");
        assert!(r.hit_tokens >= o.hit_tokens(), "{policy:?}");
        let device_only = run(&reqs, &cfg(90, policy));
        assert!(r.hit_tokens >= device_only.reference.unwrap().hit_tokens);
    }
}

#[test]
fn no_reference_for_groups_or_unit_hits() {
    let reqs = chat();
    let c = ReplayConfig {
        match_unit: 4,
        ..cfg(220, EvictionPolicy::Lru)
    };
    assert!(run(&reqs, &c).reference.is_none());
    let c = ReplayConfig {
        groups: vec![
            kvshare_core::GroupKind::Full,
            kvshare_core::GroupKind::SlidingWindow(64),
        ],
        device_pages: 441,
        ..cfg(220, EvictionPolicy::Lru)
    };
    assert!(run(&reqs, &c).reference.is_none());
}

#[test]
fn capacity_sweep_covers_every_policy_and_the_reference() {
    let reqs = chat();
    let mut src = VecSource::new(&reqs);
    let mut none =
        |_: &ReplayConfig| Ok(Box::new(NoModel) as Box<dyn kvshare_replay::model::Model>);
    let points = sweep::capacity(
        &cfg(0, EvictionPolicy::Lru),
        &mut src,
        &[90, 140, 2000],
        &mut none,
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(points.len(), 3);
    for p in &points {
        assert!(p.schedules_agree());
        assert_eq!(p.runs.len(), EvictionPolicy::ALL.len());
        for (_, o) in &p.runs {
            assert!(p.reference.hit_tokens >= o.hit_tokens());
        }
    }
    assert!(points[0].under_pressure() && !points[2].under_pressure());
    // Without pressure every policy is the reference.
    for (_, o) in &points[2].runs {
        assert_eq!(o.hit_tokens(), points[2].reference.hit_tokens);
    }
    let table = sweep::format_capacity(&points);
    assert_eq!(table.lines().count(), 4, "{table}");
    let svg = sweep::plot_capacity(&points, "t");
    assert_eq!(svg.matches("<path ").count(), EvictionPolicy::ALL.len() + 1);
}

#[test]
fn generated_public_traces_replay_from_their_files_as_from_memory() {
    for (format, text) in [
        (
            TraceFormat::Mooncake,
            excerpt::mooncake(80, 6, 200, 40_000, 7),
        ),
        (TraceFormat::Bailian, excerpt::bailian(120, 8, 200, 7)),
        (TraceFormat::Azure, excerpt::azure(60, 200, false, 7)),
        (TraceFormat::BurstGpt, excerpt::burstgpt(60, 200, true, 7)),
    ] {
        let path = tmp(&format!("{}.trace", format.name()));
        std::fs::write(&path, &text).unwrap();
        let mem = parse_trace_as(&text, format).unwrap();
        let mut file = FileSource::open(path.to_str().unwrap(), format).unwrap();
        assert_eq!(file.len(), mem.len(), "{format:?}");
        let ps = 16;
        let longest = mem.iter().map(|r| r.final_len(0)).max().unwrap();
        let c = ReplayConfig {
            page_size: ps,
            device_pages: (longest.div_ceil(ps as usize) * 3) as u32,
            concurrency: 4,
            reference: true,
            check: false,
            ..ReplayConfig::default()
        };
        let from_file = replay_source(&mut file, &c, &mut NoModel, &mut |_| {}).unwrap();
        let from_mem = run(&mem, &c);
        assert_eq!(from_file.hit_tokens(), from_mem.hit_tokens(), "{format:?}");
        assert_eq!(from_file.steps, from_mem.steps, "{format:?}");
        assert_eq!(from_file.requests.len(), mem.len());
        match format {
            // Block traces share what their ids share; length-only traces share nothing.
            TraceFormat::Mooncake | TraceFormat::Bailian => {
                assert!(from_file.hit_tokens() > 0, "{format:?}")
            }
            _ => assert_eq!(from_file.hit_tokens(), 0, "{format:?}"),
        }
        // Rewound, the file replays again the same way.
        file.rewind().unwrap();
        let again = replay_source(&mut file, &c, &mut NoModel, &mut |_| {}).unwrap();
        assert_eq!(again.hit_tokens(), from_file.hit_tokens());
    }
}

#[test]
fn session_affinity_admits_older_conversations_first() {
    // Two conversations of three turns that arrive at once, one request running at a time: FCFS
    // alternates them (a turn rejoins the back of the queue), session affinity finishes the
    // first conversation before the second.
    let mut reqs = Vec::new();
    for t in 0..3 {
        for (u, base) in [(0, 1000), (1, 2000)] {
            let mut prompt: Vec<i32> = (base..base + 40).collect();
            prompt.extend(base + 100..base + 100 + 10 * t);
            reqs.push(Request {
                id: format!("u{u}-t{t}"),
                session: Some(format!("u{u}")),
                arrival_ms: 0.0,
                prompt,
                outputs: vec![vec![7; 4]],
                salt: String::new(),
                lora: 0,
                line: 0,
            });
        }
    }
    let order = |schedule| {
        let c = ReplayConfig {
            concurrency: 1,
            schedule,
            ..cfg(64, EvictionPolicy::Lru)
        };
        let out = run(&reqs, &c);
        let mut ids: Vec<(f64, String)> = out
            .requests
            .iter()
            .map(|r| (r.start_ms, r.id.clone()))
            .collect();
        ids.sort_by(|a, b| a.0.total_cmp(&b.0));
        ids.into_iter().map(|x| x.1).collect::<Vec<_>>()
    };
    assert_eq!(
        order(Schedule::Fcfs),
        ["u0-t0", "u1-t0", "u0-t1", "u1-t1", "u0-t2", "u1-t2"]
    );
    assert_eq!(
        order(Schedule::SessionAffinity),
        ["u0-t0", "u0-t1", "u0-t2", "u1-t0", "u1-t1", "u1-t2"]
    );
}

#[test]
fn memory_follows_the_requests_in_flight() {
    // 400 requests arriving over time through at most 4 at once: the replay keeps a handful of
    // requests in flight, never the trace.
    let text = excerpt::mooncake(400, 8, 50, 20_000, 3);
    let path = tmp("flight.jsonl");
    std::fs::write(&path, &text).unwrap();
    let mut file = FileSource::open(path.to_str().unwrap(), TraceFormat::Mooncake).unwrap();
    let c = ReplayConfig {
        page_size: 64,
        device_pages: 2000,
        concurrency: 4,
        ..ReplayConfig::default()
    };
    let out = replay_source(&mut file, &c, &mut NoModel, &mut |_| {}).unwrap();
    assert_eq!(out.requests.len(), 400);
    assert!(out.peak_live < 400, "{} in flight", out.peak_live);
    assert!(out.per_step.len() <= 8192);
}
