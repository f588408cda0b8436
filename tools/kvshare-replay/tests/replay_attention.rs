//! kvshare-replay with the CPU attention backend: every attention output row of every prefill
//! and decode step is checked against a dense reference recomputed from the token ids, while the
//! cache manager shares prefixes, copies on write, evicts, demotes, promotes and preempts. A page
//! shared with the wrong request, a missed copy or a stale page would show as a wrong number.

use kvshare_core::DType;
use kvshare_replay::cpu_model::CpuModel;
use kvshare_replay::model::Geometry;
use kvshare_replay::trace::Request;
use kvshare_replay::workload::ChatWorkload;
use kvshare_replay::{replay, ReplayConfig};

fn chat() -> Vec<Request> {
    ChatWorkload {
        users: 4,
        turns: 3,
        system_tokens: 24,
        user_tokens: (4, 12),
        output_tokens: (6, 14),
        fork_every: 3,
        think_ms: (0, 60),
        ..ChatWorkload::default()
    }
    .generate()
}

fn run(cfg: &ReplayConfig) -> (kvshare_replay::Outcome, u64) {
    let mut m = CpuModel::new(
        cfg.geometry,
        cfg.page_size,
        cfg.device_pages,
        cfg.host_pages,
        2,
        9,
        true,
    )
    .unwrap();
    let out = replay(&chat(), cfg, &mut m, &mut |_| {}).unwrap();
    (out, m.verified_rows)
}

fn cfg(device_pages: u32, host_pages: u32, dtype: DType) -> ReplayConfig {
    ReplayConfig {
        page_size: 4,
        device_pages,
        host_pages,
        concurrency: 6,
        geometry: Geometry {
            layers: 2,
            kv_heads: 2,
            gqa: 2,
            head_dim: 16,
            dtype,
        },
        check: true,
        ..ReplayConfig::default()
    }
}

#[test]
fn attention_reads_the_right_kv_with_sharing_and_copy_on_write() {
    let (out, rows) = run(&cfg(512, 0, DType::F16));
    assert!(rows > 0);
    let c = out.final_stats.counters;
    assert!(c.cow_copies > 0 && c.prefix_hit_tokens > 0);
    assert_eq!(c.evictions, 0);
    assert_eq!(out.gap_steps, 0);
}

#[test]
fn attention_reads_the_right_kv_under_eviction_and_preemption() {
    let (out, rows) = run(&cfg(48, 0, DType::BF16));
    assert!(rows > 0);
    assert!(out.final_stats.counters.evictions > 0);
    assert!(out.recomputes > 0, "recompute preemption exercised");
    assert_eq!(out.gap_steps, 0);
}

#[test]
fn attention_reads_the_right_kv_through_swap_demotion_and_promotion() {
    let (out, rows) = run(&cfg(48, 64, DType::F32));
    assert!(rows > 0);
    let c = out.final_stats.counters;
    assert!(out.swaps > 0, "swap exercised");
    assert!(c.demotions > 0 && c.promotions > 0, "{c:?}");
    assert_eq!(out.gap_steps, 0);
}

#[test]
fn attention_reads_the_right_kv_after_hits_inside_pages() {
    // Pages of 8 tokens matched by 2: hits end inside pages (partial copies), with eviction,
    // demotion and promotion of their sources.
    for (device, host) in [(512, 0), (24, 32)] {
        let c = ReplayConfig {
            page_size: 8,
            match_unit: 2,
            ..cfg(device, host, DType::F16)
        };
        let (out, rows) = run(&c);
        assert!(rows > 0);
        let k = out.final_stats.counters;
        assert!(k.unit_hits > 0 && k.unit_hit_tokens > 0, "{k:?}");
        if host > 0 {
            assert!(k.evictions > 0 && k.demotions > 0, "{k:?}");
        }
    }
}
