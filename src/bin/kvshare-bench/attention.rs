//! `kvshare-bench attention`: decode throughput of the CPU paged-attention kernel against the
//! machine's measured memory read bandwidth, and against the same KV stored contiguously.
//!
//! Prints human lines, then one final single-line JSON object. Not a test: numbers depend on
//! the machine; the targets are a bandwidth fraction >= 0.6 and paging overhead within 10%.

use std::time::{Duration, Instant};

use half::f16;
use kvshare::attention::cpu::CpuBackend;
use kvshare::attention::{
    AttnBatch, AttnBuffers, AttnParams, Backend, Buf, BufMut, CacheLayout, DType, TokenStrides,
};

struct Opts {
    seqs: usize,
    ctx: usize,
    kv_heads: usize,
    head_dim: usize,
    group: usize,
    page_size: usize,
    iters: usize,
    threads: usize,
}

const USAGE: &str =
    "kvshare-bench attention [--seqs 32] [--ctx 4096] [--kv-heads 8] [--head-dim 128] \
[--group 4] [--page-size 128] [--iters 5] [--threads 0 (= all cores)]";

fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        seqs: 32,
        ctx: 4096,
        kv_heads: 8,
        head_dim: 128,
        group: 4,
        page_size: 128,
        iters: 5,
        threads: 0,
    };
    let mut it = args.iter().skip_while(|a| *a == "attention");
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            return Err(USAGE.to_string());
        }
        let value: usize = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?
            .parse()
            .map_err(|e| format!("{flag}: {e}"))?;
        match flag.as_str() {
            "--seqs" => o.seqs = value,
            "--ctx" => o.ctx = value,
            "--kv-heads" => o.kv_heads = value,
            "--head-dim" => o.head_dim = value,
            "--group" => o.group = value,
            "--page-size" => o.page_size = value,
            "--iters" => o.iters = value.max(1),
            "--threads" => o.threads = value,
            _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
        }
    }
    Ok(o)
}

/// Best-of-`reps` time of a parallel streaming read of `bufs` (sum of u64 words), in seconds.
fn read_bandwidth(bufs: &[&[f16]], threads: usize, reps: usize) -> (f64, u64) {
    let words: Vec<&[u64]> = bufs
        .iter()
        .map(|b| {
            // SAFETY: f16 buffers reinterpreted as u64 words (every bit pattern is valid);
            // align_to gives only the aligned middle part.
            let (_, mid, _) = unsafe { b.align_to::<u64>() };
            mid
        })
        .collect();
    let bytes: usize = words.iter().map(|w| w.len() * 8).sum();
    let mut best = f64::INFINITY;
    let mut check = 0u64;
    for _ in 0..reps {
        let t = Instant::now();
        let sums: Vec<u64> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|i| {
                    let words = &words;
                    s.spawn(move || {
                        let mut acc = [0u64; 8];
                        for w in words.iter() {
                            let per = w.len().div_ceil(threads);
                            let part = &w[(i * per).min(w.len())..((i + 1) * per).min(w.len())];
                            for c in part.chunks_exact(8) {
                                for j in 0..8 {
                                    acc[j] = acc[j].wrapping_add(c[j]);
                                }
                            }
                        }
                        acc.iter().fold(0u64, |a, &b| a.wrapping_add(b))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or(0)).collect()
        });
        best = best.min(t.elapsed().as_secs_f64());
        check = sums.iter().fold(check, |a, &b| a.wrapping_add(b));
    }
    (bytes as f64 / best, check)
}

fn time_best(iters: usize, mut f: impl FnMut() -> Result<(), String>) -> Result<Duration, String> {
    f()?; // warm-up
    let mut best = Duration::MAX;
    for _ in 0..iters {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed());
    }
    Ok(best)
}

/// Runs the benchmark. `args` are the flags after `attention` (a leading `attention` is
/// skipped too).
pub fn run(args: &[String]) -> Result<(), String> {
    let o = parse(args)?;
    let backend = CpuBackend::new(o.threads).map_err(|e| e.to_string())?;
    let threads = backend.num_threads();
    let (hk, d, ps) = (o.kv_heads, o.head_dim, o.page_size);
    let h = hk * o.group;
    let pages_per_seq = o.ctx.div_ceil(ps);
    let num_pages = o.seqs * pages_per_seq;
    let elems = num_pages * ps * hk * d;
    println!(
        "attention decode: {} seqs x {} ctx, {} kv heads x {} dim, GQA {}, f16 KV, page {}, {} threads",
        o.seqs, o.ctx, hk, d, o.group, ps, threads
    );
    let mut seed = 0x1234_5678u32;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        f16::from_f32((seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5)
    };
    let k: Vec<f16> = (0..elems).map(|_| rnd()).collect();
    let v: Vec<f16> = (0..elems).map(|_| rnd()).collect();
    let q: Vec<f16> = (0..o.seqs * h * d).map(|_| rnd()).collect();
    let mut out = vec![f16::ZERO; o.seqs * h * d];
    let kv_bytes = (o.seqs * o.ctx * hk * d * 2 * 2) as f64;
    println!(
        "KV bytes read per launch: {:.1} MiB",
        kv_bytes / (1u64 << 20) as f64
    );

    let (bw, check) = read_bandwidth(&[&k, &v], threads, 5);
    println!(
        "memory read bandwidth (streaming, {threads} threads): {:.2} GB/s [{check:x}]",
        bw / 1e9
    );

    // Paged: pages of all sequences shuffled through the cache.
    let mut perm: Vec<i32> = (0..num_pages as i32).collect();
    let mut s = 0x9e37_79b9u64;
    for i in (1..perm.len()).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        perm.swap(i, (s % (i as u64 + 1)) as usize);
    }
    let ctx_lens = vec![o.ctx as i32; o.seqs];
    let params = |cache: CacheLayout, max_pages: usize| AttnParams {
        num_seqs: o.seqs,
        num_tokens: o.seqs,
        num_heads: h,
        query_dtype: DType::F16,
        query_strides: TokenStrides::dense(h, d),
        output_dtype: DType::F16,
        output_strides: TokenStrides::dense(h, d),
        cache,
        max_pages_per_seq: max_pages,
        block_table_stride: max_pages,
        varlen: false,
        scale: 1.0 / (d as f32).sqrt(),
        softcap: 0.0,
        sliding_window: 0,
    };
    let mut launch = |p: AttnParams, table: &[i32]| -> Result<(), String> {
        let bufs = AttnBuffers {
            query: Buf::F16(&q),
            key_cache: Buf::F16(&k),
            value_cache: Buf::F16(&v),
            block_table: table,
            context_lens: &ctx_lens,
            query_start_loc: None,
            output: BufMut::F16(&mut out),
        };
        let batch = AttnBatch::new(p, bufs).map_err(|e| e.to_string())?;
        backend.attention(batch).map_err(|e| e.to_string())
    };
    let paged_p = params(
        CacheLayout::dense(DType::F16, num_pages, ps, hk, d),
        pages_per_seq,
    );
    let paged = time_best(o.iters, || launch(paged_p, &perm))?;
    // Contiguous: the same bytes viewed as one page per sequence, [seqs, ctx, kv_heads, dim].
    let contig_p = params(
        CacheLayout::dense(DType::F16, o.seqs, pages_per_seq * ps, hk, d),
        1,
    );
    let seq_ids: Vec<i32> = (0..o.seqs as i32).collect();
    let contig = time_best(o.iters, || launch(contig_p, &seq_ids))?;

    let paged_s = paged.as_secs_f64();
    let achieved = kv_bytes / paged_s;
    let ratio = paged_s / contig.as_secs_f64();
    println!(
        "paged decode: {:.2} ms, {:.2} GB/s of KV, {:.2} of measured bandwidth (target >= 0.6)",
        paged_s * 1e3,
        achieved / 1e9,
        achieved / bw
    );
    println!(
        "contiguous decode: {:.2} ms; paged/contiguous time ratio {:.3} (target <= 1.10)",
        contig.as_secs_f64() * 1e3,
        ratio
    );
    let torch = std::process::Command::new("python3")
        .args(["-c", "import torch"])
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if torch {
        println!("torch: importable, but the comparison is not implemented yet (skipped)");
    } else {
        println!("torch: not installed, comparison skipped");
    }
    println!(
        "{{\"bench\":\"attention\",\"seqs\":{},\"ctx\":{},\"kv_heads\":{},\"head_dim\":{},\"group\":{},\
\"page_size\":{},\"dtype\":\"f16\",\"threads\":{},\"kv_bytes\":{},\"mem_read_gbs\":{:.3},\
\"paged_ms\":{:.3},\"kv_read_gbs\":{:.3},\"bw_fraction\":{:.3},\"contiguous_ms\":{:.3},\
\"paged_over_contiguous\":{:.3},\"torch\":null}}",
        o.seqs,
        o.ctx,
        hk,
        d,
        o.group,
        ps,
        threads,
        kv_bytes as u64,
        bw / 1e9,
        paged_s * 1e3,
        achieved / 1e9,
        achieved / bw,
        contig.as_secs_f64() * 1e3,
        ratio
    );
    Ok(())
}
