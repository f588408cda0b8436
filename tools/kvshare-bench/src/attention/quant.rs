//! The quantized caches' side of `kvshare-bench attention`: their codes, the bf16 query and
//! output they run with, and their decode timed against the same K/V as bf16 and f16.

use super::*;

/// The per-channel scale of the benchmark's int8 caches: `2^-8`, so that every code's value is
/// exact in bf16 and f16 (the baselines hold the same values).
pub(super) const INT8_SCALE: f32 = 1.0 / 256.0;

/// `x` as an int8 code with the scale [`INT8_SCALE`].
pub(super) fn int8_code(x: f32) -> u8 {
    (x / INT8_SCALE).round_ties_even() as i8 as u8
}

/// The query and output type of a run whose K/V is `kv`: `kv` itself, bf16 for a quantized
/// cache (as vLLM runs an fp8 cache under a bf16 model).
pub(super) fn io_dtype(kv: DType) -> DType {
    if kv.is_quantized() {
        DType::BF16
    } else {
        kv
    }
}

/// The 16-bit words `n` elements of `dt` take (two one-byte codes a word).
pub(super) fn words(dt: DType, n: usize) -> usize {
    (n * dt.size_bytes()).div_ceil(2)
}

/// `next()`'s values in `dt`, as the 16-bit words of their bits in memory order: one word per
/// f16 or bf16 value, two per f32, one per two fp8 codes (scale 1) or int8 codes
/// ([`INT8_SCALE`]).
pub(super) fn words_of(dt: DType, mut next: impl FnMut() -> f32) -> impl FnMut() -> u16 {
    let mut pending: Option<u16> = None;
    move || {
        if let Some(w) = pending.take() {
            return w;
        }
        let x = next();
        match dt {
            DType::BF16 => bf16::from_f32(x).to_bits(),
            DType::F16 => f16::from_f32(x).to_bits(),
            DType::Fp8E4M3 => {
                u16::from_ne_bytes([Fp8E4M3::from_f32(x).0, Fp8E4M3::from_f32(next()).0])
            }
            DType::Fp8E5M2 => {
                u16::from_ne_bytes([Fp8E5M2::from_f32(x).0, Fp8E5M2::from_f32(next()).0])
            }
            DType::Int8 => u16::from_ne_bytes([int8_code(x), int8_code(next())]),
            // Rows with their scales inside them are made by [`row_words`].
            DType::Int8PerTokenHead => u16::from_ne_bytes([int8_code(x), int8_code(next())]),
            DType::F32 => {
                let b = x.to_ne_bytes();
                pending = Some(u16::from_ne_bytes([b[2], b[3]]));
                u16::from_ne_bytes([b[0], b[1]])
            }
        }
    }
}

/// The scale of row `r` of the benchmark's int8 per-token-head caches: [`INT8_SCALE`] times
/// 1/2, 1, 2 or 4 by row, so that rows differ and every code's value is exact in bf16 and f16.
pub(crate) fn row_scale(r: usize) -> f32 {
    INT8_SCALE * [0.5, 1.0, 2.0, 4.0][r % 4]
}

/// The 16-bit words of an int8 per-token-head cache in memory order: each row of `d` (even)
/// elements is `d` codes of `next()`'s values at the scale [`INT8_SCALE`] (so the row's values
/// are the codes times [`row_scale`]), then the row's scale's 4 bytes.
pub(super) fn row_words(d: usize, mut next: impl FnMut() -> f32) -> impl FnMut() -> u16 {
    let (mut j, mut r) = (0, 0);
    move || {
        let mut byte = || {
            let b = if j < d {
                int8_code(next())
            } else {
                row_scale(r).to_le_bytes()[j - d]
            };
            j += 1;
            if j == d + 4 {
                (j, r) = (0, r + 1);
            }
            b
        };
        let lo = byte();
        u16::from_ne_bytes([lo, byte()])
    }
}

/// A quantized cache's decode against the same K/V (its values exactly) stored as bf16 and as f16,
/// on every path, in alternating rounds (one launch of each type per path and round, best of
/// `--iters`, at least 3), so all three see the machine's moment: time ratios and the K/V bytes
/// each reads per context token (per layer: K and V of every kv head). Returns the JSON object.
#[allow(clippy::type_complexity)]
pub(super) fn quant_baselines(
    o: &Opts,
    paths: &[Isa],
    backends: &[CpuBackend],
    p: AttnParams,
    (k, v): (&[u16], &[u16]),
    warm: &mut dyn FnMut(AttnParams, (&[u16], &[u16])) -> Result<(), String>,
    launch: &mut dyn FnMut(&CpuBackend, AttnParams, (&[u16], &[u16])) -> Result<(), String>,
) -> Result<String, String> {
    let fmt = p.cache.dtype;
    let c = p.cache;
    let d = c.head_dim;
    // The baselines' elements: the cache's values without an int8 per-token-head row's scale.
    let n = c.num_pages * c.page_size * c.num_kv_heads * d;
    let row = c.row_len();
    let value = |codes: &[u8], i: usize| match fmt {
        DType::Fp8E4M3 => Fp8E4M3(codes[i]).to_f32(),
        DType::Fp8E5M2 => Fp8E5M2(codes[i]).to_f32(),
        DType::Int8PerTokenHead => {
            let at = i / d * row;
            let s = f32::from_le_bytes(codes[at + d..at + d + 4].try_into().unwrap());
            codes[at + i % d] as i8 as f32 * s
        }
        _ => codes[i] as i8 as f32 * INT8_SCALE,
    };
    let widen = |x: &[u16], to: DType| -> Result<Words, String> {
        let codes = bytes(x);
        let mut i = 0;
        let (w, _) = Words::new(n, o.huge_pages, &mut || {
            let y = value(codes, i);
            i += 1;
            match to {
                DType::BF16 => bf16::from_f32(y).to_bits(),
                _ => f16::from_f32(y).to_bits(),
            }
        })?;
        Ok(w)
    };
    let types = [fmt, DType::BF16, DType::F16];
    let kv: Vec<(Words, Words)> = types[1..]
        .iter()
        .map(|&t| Ok((widen(k, t)?, widen(v, t)?)))
        .collect::<Result<_, String>>()?;
    let with = |t: DType| AttnParams {
        cache: CacheLayout::dense(t, c.num_pages, c.page_size, c.num_kv_heads, d),
        ..p
    };
    for (i, &t) in types.iter().enumerate() {
        let kvi = if i == 0 {
            (k, v)
        } else {
            (&kv[i - 1].0[..], &kv[i - 1].1[..])
        };
        warm(with(t), kvi)?;
    }
    let mut best = vec![[f64::INFINITY; 3]; backends.len()];
    for _ in 0..o.iters.max(3) {
        for (bi, b) in backends.iter().enumerate() {
            for (i, &t) in types.iter().enumerate() {
                let kvi = if i == 0 {
                    (k, v)
                } else {
                    (&kv[i - 1].0[..], &kv[i - 1].1[..])
                };
                let at = Instant::now();
                launch(b, with(t), kvi)?;
                best[bi][i] = best[bi][i].min(at.elapsed().as_secs_f64());
            }
        }
    }
    let per_token = |t: DType| 2 * c.num_kv_heads * t.row_bytes(d);
    println!(
        "K/V bytes read per context token (per layer): {} {} B, bf16 {} B, f16 {} B",
        dtype_name(fmt),
        per_token(fmt),
        per_token(DType::BF16),
        per_token(DType::F16)
    );
    let mut json = Vec::new();
    for (isa, t) in paths.iter().zip(&best) {
        let [q, b16, h16] = t.map(|x| x * 1e3);
        println!(
            "kvshare path {:<8} paged decode, alternating rounds: {} {q:.2} ms, bf16 {b16:.2} ms, \
f16 {h16:.2} ms; {} time / bf16 time {:.3}, / f16 time {:.3}",
            isa.name(),
            dtype_name(fmt),
            dtype_name(fmt),
            q / b16,
            q / h16
        );
        json.push(format!(
            "\"{}\":{{\"ms\":{q:.3},\"bf16_ms\":{b16:.3},\"f16_ms\":{h16:.3},\"over_bf16\":{:.3},\"over_f16\":{:.3}}}",
            isa.name(),
            q / b16,
            q / h16
        ));
    }
    Ok(format!(
        "{{\"bytes_per_token\":{{\"{}\":{},\"bf16\":{},\"f16\":{}}},\"paths\":{{{}}}}}",
        dtype_name(fmt),
        per_token(fmt),
        per_token(DType::BF16),
        per_token(DType::F16),
        json.join(",")
    ))
}

/// For an fp8 cache, what vLLM's side says of it: the text after "its own layout" and the JSON
/// fields (with their leading comma): its `kv_cache_dtype`, whether its cache holds kvshare's
/// stored codes, and the bound the outputs must meet. Empty for an unquantized cache.
pub(super) fn fp8_check(kv: DType, ready: &attention_vllm::Ready) -> (String, String) {
    if !kv.is_quantized() {
        return (String::new(), String::new());
    }
    let same = match ready.same_bytes {
        Some(true) => "the same stored bytes as kvshare's",
        Some(false) => "NOT the same stored bytes as kvshare's",
        None => "stored bytes not compared",
    };
    let opt = |x: Option<String>| x.unwrap_or_else(|| "null".into());
    (
        format!(
            ", kv_cache_dtype {} (uint8, k_scale = v_scale = 1; {same}{})",
            dtype_name(kv),
            ready.misread.map_or(String::new(), misread_text)
        ),
        format!(
            ",\"kv_cache_dtype\":\"{}\",\"same_bytes\":{},\"bound\":{},\"misread_codes\":{},\"misread_max\":{}",
            dtype_name(kv),
            opt(ready.same_bytes.map(|b| b.to_string())),
            opt(ready.bound.map(|b| format!("{b:.3e}"))),
            opt(ready.misread.map(|m| m.0.to_string())),
            opt(ready.misread.map(|m| format!("{:.3e}", m.1)))
        ),
    )
}

/// What the vLLM script found of its kernel's fp8 reads (`(finite codes read as another value,
/// the largest error)`), as printed after the stored bytes' check.
pub(crate) fn misread_text((n, max): (u64, f64)) -> String {
    if n == 0 {
        "; its kernel reads every finite code exactly".into()
    } else {
        format!("; its kernel reads {n} finite codes as another value, at most {max:.2e} off")
    }
}
