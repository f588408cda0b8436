//! `kvshare-bench kv-write`: the CPU backend's KV write (`kvs_kv_write_scaled`) of one step's new
//! K/V into the cache, per cache format and kernel path: bf16 values (a bf16 model's K/V)
//! written into a bf16 cache (a copy), an f16 cache (a conversion) and the 8-bit formats (a
//! division by the scales and a rounding per element). Every combination runs once per round,
//! rounds alternate, best of `--iters` each, so all see the machine's moment; the figures are
//! ratios: a format's write against the bf16 copy on the same path, and a vector path against
//! the plain loop (`portable`) on the same format.

use std::ffi::OsString;
use std::time::Instant;

use half::bf16;
use kvshare_attention::cpu::{cpu_flags, CpuBackend, Isa};
use kvshare_attention::{
    Backend, Buf, BufMut, CacheLayout, ChannelScales, DType, Fp8E4M3, Fp8E5M2, KvCachesMut,
    KvScales, KvWrite, KvWriteParams, SlotMapping, TokenStrides,
};
use kvshare_replay::model::{dtype_name, parse_dtype};

use super::{number, see_help, value};

const USAGE: &str = "\
kvshare-bench kv-write: the CPU KV write per cache format and kernel path, against the bf16 copy
and the plain loop in the same run

USAGE:
    kvshare-bench kv-write [OPTIONS]

OPTIONS:
    --tokens N        new tokens per write (one prefill step) [default: 4096]
    --heads N         KV heads [default: 8]
    --head-dim N      elements per head [default: 128]
    --page-size N     token slots per page [default: 128]
    --iters N         rounds; each figure is the best of them [default: 9]
    --dtype LIST      cache formats, comma-separated [default: bf16,f16,fp8_e4m3,fp8_e5m2,int8,
                      int8_per_token_head]
    -h, --help        this text
";

struct Opts {
    tokens: usize,
    heads: usize,
    head_dim: usize,
    page_size: usize,
    iters: usize,
    dtypes: Vec<DType>,
}

fn parse(args: Vec<OsString>) -> Result<Option<Opts>, String> {
    use lexopt::Arg::{Long, Short};
    let mut o = Opts {
        tokens: 4096,
        heads: 8,
        head_dim: 128,
        page_size: 128,
        iters: 9,
        dtypes: vec![
            DType::BF16,
            DType::F16,
            DType::Fp8E4M3,
            DType::Fp8E5M2,
            DType::Int8,
            DType::Int8PerTokenHead,
        ],
    };
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = p.next().map_err(see_help)? {
        match arg {
            Short('h') | Long("help") => return Ok(None),
            Long(f @ ("tokens" | "heads" | "head-dim" | "page-size" | "iters")) => {
                let f = f.to_string();
                let flag = format!("--{f}");
                let n: usize = number(&flag, &value(&mut p, &flag)?)?;
                if n == 0 {
                    return Err(format!("{flag} must be at least 1"));
                }
                match f.as_str() {
                    "tokens" => o.tokens = n,
                    "heads" => o.heads = n,
                    "head-dim" => o.head_dim = n,
                    "page-size" => o.page_size = n,
                    _ => o.iters = n,
                }
            }
            Long("dtype") => {
                o.dtypes = value(&mut p, "--dtype")?
                    .split(',')
                    .map(|s| parse_dtype(s).ok_or(format!("--dtype: unknown format {s:?}")))
                    .collect::<Result<_, _>>()?;
            }
            other => return Err(format!("{} (see --help)", other.unexpected())),
        }
    }
    Ok(Some(o))
}

/// One cache of `n` elements of `dt`.
enum Cache {
    F32(Vec<f32>),
    F16(Vec<half::f16>),
    BF16(Vec<bf16>),
    E4M3(Vec<Fp8E4M3>),
    E5M2(Vec<Fp8E5M2>),
    I8(Vec<i8>),
    I8Rows(Vec<i8>),
}

impl Cache {
    fn new(dt: DType, n: usize) -> Cache {
        match dt {
            DType::F32 => Cache::F32(vec![0.0; n]),
            DType::F16 => Cache::F16(vec![half::f16::ZERO; n]),
            DType::BF16 => Cache::BF16(vec![bf16::ZERO; n]),
            DType::Fp8E4M3 => Cache::E4M3(vec![Fp8E4M3(0); n]),
            DType::Fp8E5M2 => Cache::E5M2(vec![Fp8E5M2(0); n]),
            DType::Int8 => Cache::I8(vec![0; n]),
            DType::Int8PerTokenHead => Cache::I8Rows(vec![0; n]),
        }
    }

    fn buf(&mut self) -> BufMut<'_> {
        match self {
            Cache::F32(x) => BufMut::F32(x),
            Cache::F16(x) => BufMut::F16(x),
            Cache::BF16(x) => BufMut::BF16(x),
            Cache::E4M3(x) => BufMut::Fp8E4M3(x),
            Cache::E5M2(x) => BufMut::Fp8E5M2(x),
            Cache::I8(x) => BufMut::I8(x),
            Cache::I8Rows(x) => BufMut::I8Rows(x),
        }
    }

    /// A checksum of the codes, so that the writes cannot be optimised away and the paths can
    /// be compared.
    fn digest(&self) -> u64 {
        fn fold(it: impl Iterator<Item = u64>) -> u64 {
            it.fold(0xcbf2_9ce4_8422_2325, |h, x| {
                (h ^ x).wrapping_mul(0x0100_0000_01b3)
            })
        }
        match self {
            Cache::F32(x) => fold(x.iter().map(|v| v.to_bits() as u64)),
            Cache::F16(x) => fold(x.iter().map(|v| v.to_bits() as u64)),
            Cache::BF16(x) => fold(x.iter().map(|v| v.to_bits() as u64)),
            Cache::E4M3(x) => fold(x.iter().map(|v| v.0 as u64)),
            Cache::E5M2(x) => fold(x.iter().map(|v| v.0 as u64)),
            Cache::I8(x) | Cache::I8Rows(x) => fold(x.iter().map(|v| *v as u8 as u64)),
        }
    }
}

pub fn run(args: Vec<OsString>) -> Result<(), String> {
    let Some(o) = parse(args)? else {
        print!("{USAGE}");
        return Ok(());
    };
    println!("CPU flags: {}", cpu_flags());
    let mut paths = Vec::new();
    for isa in Isa::all() {
        match isa.check() {
            Err(why) => println!("path {}: not run: {why}", isa.name()),
            // `amx` writes with its vector path's code, `portable16` with the plain loop.
            Ok(()) if matches!(isa, Isa::Amx | Isa::Portable16) => println!(
                "path {}: not run separately (it writes with {}'s code)",
                isa.name(),
                if isa == Isa::Amx {
                    isa.vector()
                } else {
                    Isa::Portable
                }
                .name()
            ),
            Ok(()) => paths.push(isa),
        }
    }
    let (t, h, d) = (o.tokens, o.heads, o.head_dim);
    let pages = t.div_ceil(o.page_size);
    // A bf16 model's K and V, spread over a few binades (as K/V are).
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        bf16::from_f32(((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 16.0)
    };
    let key: Vec<bf16> = (0..t * h * d).map(|_| next()).collect();
    let val: Vec<bf16> = (0..t * h * d).map(|_| next()).collect();
    // Slots in page order, as a prefill of a fresh sequence writes them.
    let slots: Vec<i64> = (0..t as i64).collect();
    let ch = vec![1.0 / 32.0; h * d];
    let off = vec![0.0; h * d];
    // Elements of one cache in `dt` (an int8 per-token-head row holds its scale too).
    let elems = |dt: DType| {
        let lay = CacheLayout::dense(dt, pages, o.page_size, h, d);
        lay.num_pages * lay.page_stride
    };
    let backends: Vec<CpuBackend> = paths
        .iter()
        .map(|&isa| CpuBackend::with_isa(1, isa).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let combos: Vec<(DType, usize)> = o
        .dtypes
        .iter()
        .flat_map(|&dt| (0..paths.len()).map(move |p| (dt, p)))
        .collect();
    let mut caches: Vec<(Cache, Cache)> = combos
        .iter()
        .map(|&(dt, _)| (Cache::new(dt, elems(dt)), Cache::new(dt, elems(dt))))
        .collect();
    let mut best = vec![f64::INFINITY; combos.len()];
    for _ in 0..o.iters {
        for (i, &(dt, p)) in combos.iter().enumerate() {
            let (kc, vc) = &mut caches[i];
            let params = KvWriteParams {
                num_tokens: t,
                src_dtype: DType::BF16,
                src_strides: TokenStrides::dense(h, d),
                cache: CacheLayout::dense(dt, pages, o.page_size, h, d),
                scales: KvScales { k: 1.0, v: 1.0 },
            };
            let channels = (dt == DType::Int8).then(|| ChannelScales {
                k: &ch,
                v: &ch,
                k_offsets: Some(&off),
                v_offsets: Some(&off),
            });
            let w = KvWrite::new(
                params,
                Buf::BF16(&key),
                Buf::BF16(&val),
                SlotMapping::I64(&slots),
                KvCachesMut::Split {
                    key: kc.buf(),
                    value: vc.buf(),
                },
                channels,
            )
            .map_err(|e| e.to_string())?;
            let start = Instant::now();
            backends[p].kv_write(w).map_err(|e| e.to_string())?;
            best[i] = best[i].min(start.elapsed().as_secs_f64());
        }
    }
    // Every path stores the same bytes for a format.
    for (i, &(dt, p)) in combos.iter().enumerate() {
        let first = combos.iter().position(|&(d2, _)| d2 == dt).unwrap();
        let same = caches[i].0.digest() == caches[first].0.digest()
            && caches[i].1.digest() == caches[first].1.digest();
        if !same {
            return Err(format!(
                "{} on {} stored other codes than on {}",
                dtype_name(dt),
                paths[p].name(),
                paths[combos[first].1].name()
            ));
        }
    }
    let rows = (t * h) as f64;
    let time = |dt: DType, p: usize| combos.iter().position(|&c| c == (dt, p)).map(|i| best[i]);
    println!(
        "KV write of {t} tokens x {h} kv heads x {d} (K and V), bf16 values, page {}, 1 thread, \
         best of {}:",
        o.page_size, o.iters
    );
    println!(
        "| format | path | ns per token and head | ÷ bf16 copy, same path | plain loop ÷ this |"
    );
    println!("|---|---|---|---|---|");
    let mut json = Vec::new();
    for (i, &(dt, p)) in combos.iter().enumerate() {
        let ns = best[i] * 1e9 / rows;
        let vs_copy = time(DType::BF16, p).map(|b| best[i] / b);
        let vs_plain = paths
            .iter()
            .position(|&x| x == Isa::Portable)
            .and_then(|q| time(dt, q))
            .map(|b| b / best[i]);
        let show = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.2}"));
        println!(
            "| {} | {} | {ns:.1} | {} | {} |",
            dtype_name(dt),
            paths[p].name(),
            show(vs_copy),
            show(vs_plain)
        );
        json.push(format!(
            "{{\"dtype\":\"{}\",\"path\":\"{}\",\"ns_per_token_head\":{ns:.2},\"vs_bf16_copy\":{},\"speedup_vs_plain\":{}}}",
            dtype_name(dt),
            paths[p].name(),
            vs_copy.map_or("null".into(), |x| format!("{x:.3}")),
            vs_plain.map_or("null".into(), |x| format!("{x:.3}"))
        ));
    }
    println!(
        "{{\"mode\":\"kv-write\",\"tokens\":{t},\"heads\":{h},\"head_dim\":{d},\"rows\":[{}]}}",
        json.join(",")
    );
    Ok(())
}
