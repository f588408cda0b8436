//! Which instruction-set path the CPU kernel runs, chosen once per backend at run time.
//!
//! The kernel is one generic loop over 8 or 16 f32 lanes ([`super::kernel`]), compiled
//! once per path with that path's target features:
//!
//! * `portable`: plain `[f32; 8]` arrays (the compiler vectorises them for the build target:
//!   SSE2 on x86-64, NEON on aarch64). Runs everywhere.
//! * `portable16`: plain `[f32; 16]` arrays: the `avx512` path's 16-lane algorithm (group
//!   sizes, score batches, tails) without its intrinsics, so that algorithm runs and is tested
//!   on any machine. Never picked by default (the 8-lane paths are faster without AVX-512).
//! * `avx2`: AVX2 + FMA + F16C intrinsics (f16 converted by `vcvtph2ps`, bf16 by a shift).
//! * `avx512`: 16 lanes in `__m512` with AVX-512F intrinsics (`vcvtph2ps zmm` for f16, a
//!   widening shift for bf16, `vscalefps` in `exp`); needs AVX-512F/VL and the AVX2 set. Run
//!   and timed natively on a Zen 4 EPYC (docs/performance.md, "AVX-512"); on
//!   machines without AVX-512 its tests run under an x86 emulator (BochsCPU,
//!   `integration/vllm_ascend/tests/test_ops_emulated.py`).
//! * `amx`: prefill rows (the tiled kernel, `kernel/tiled.rs`) of a bf16 cache on AMX tiles
//!   in bf16 (`kernel/amx.rs`, `tdpbf16ps`), of an f16 cache in f16 where CPUID also reports
//!   amx_fp16 (`tdpfp16ps`, [`Isa::amx_fp16`]); everything else (decode rows, an f32 cache's
//!   prefill, an f16 cache's without AMX-FP16) on the best vector path (`avx512`, else
//!   `avx2`: [`Isa::vector`]), so that no cache is computed below its own precision. Runs only when CPUID reports amx_tile and amx_bf16 and the
//!   kernel granted tile data to the process ([`amx_permission`], the one-time
//!   `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)` request); otherwise refused with
//!   the reason. Run natively on a Xeon with AMX-BF16 (no AMX-FP16); elsewhere the algorithm
//!   is tested through software tiles that round as `tdpbf16ps` does, bit for bit
//!   (`kernel/amx.rs`).
//!
//! The best available path is picked unless `KVSHARE_CPU_ISA` names one
//! (`portable|portable16|avx2|avx512|amx`); a named path the machine lacks makes backend creation fail
//! with the reason, so a test or benchmark that forces a path never silently runs another.

use crate::error::{Error, Result};

/// The environment variable that forces a path. (A `static`, which cbindgen does not export,
/// so the C header keeps only `KVS_`/`kvs_` names.)
pub static ISA_ENV: &str = "KVSHARE_CPU_ISA";

/// One CPU kernel path. Construct with [`Isa::parse`], [`Isa::best`] or [`Isa::from_env`];
/// the kernel re-checks [`Isa::check`] before running a path, so a value naming a path the
/// machine lacks runs the portable path instead of faulting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Plain 8-lane arrays; any CPU.
    Portable,
    /// Plain 16-lane arrays (the AVX-512 path's algorithm); any CPU, never the default.
    Portable16,
    /// AVX2 + FMA + F16C, 8 lanes.
    Avx2,
    /// AVX-512F + AVX-512VL (+ the AVX2 set), 16 lanes.
    Avx512,
    /// AMX tiles for the prefill of bf16 caches (and of f16 caches with AMX-FP16), the best
    /// vector path for the rest.
    Amx,
}

impl Isa {
    /// Every path, in order of preference from worst to best. (A function, not an associated
    /// constant, so that cbindgen does not put this Rust-only type into the C header.)
    pub fn all() -> [Isa; 5] {
        [
            Isa::Portable,
            Isa::Portable16,
            Isa::Avx2,
            Isa::Avx512,
            Isa::Amx,
        ]
    }

    /// The name `KVSHARE_CPU_ISA` takes and `describe` prints.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Portable16 => "portable16",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Amx => "amx",
        }
    }

    /// The path named `s` (one of [`Isa::name`]'s values), if any.
    pub fn parse(s: &str) -> Option<Isa> {
        Isa::all().into_iter().find(|i| i.name() == s)
    }

    /// `Ok` when this machine (and this process) can run the path, else why not.
    pub fn check(self) -> std::result::Result<(), String> {
        match self {
            Isa::Portable | Isa::Portable16 => Ok(()),
            Isa::Avx2 => need(&[
                ("avx2", has_avx2()),
                ("fma", has_fma()),
                ("f16c", has_f16c()),
            ]),
            Isa::Avx512 => need(&[
                ("avx2", has_avx2()),
                ("fma", has_fma()),
                ("f16c", has_f16c()),
                ("avx512f", has_avx512f()),
                ("avx512vl", has_avx512vl()),
            ]),
            Isa::Amx => {
                need(&[
                    ("avx2", has_avx2()),
                    ("fma", has_fma()),
                    ("f16c", has_f16c()),
                    ("amx_tile", has_amx_tile()),
                    ("amx_bf16", has_amx_bf16()),
                ])?;
                amx_permission()
            }
        }
    }

    /// Whether this path's tiled (prefill) kernel runs an f16 cache on AMX-FP16 tiles
    /// (`tdpfp16ps`, the f16 values exact) rather than rounding it to bf16: `amx` on a CPU
    /// whose CPUID reports amx_fp16 (which needs the tile permission `amx` already holds).
    pub fn amx_fp16(self) -> bool {
        self == Isa::Amx && has_amx_fp16() && self.check().is_ok()
    }

    /// The vector path that runs this path's decode rows (and `amx`'s prefill rows that its
    /// tiles do not take): itself, except `amx`, whose vector path is `avx512` where the CPU
    /// has it, else `avx2`.
    pub fn vector(self) -> Isa {
        match self {
            Isa::Amx if Isa::Avx512.check().is_ok() => Isa::Avx512,
            Isa::Amx => Isa::Avx2,
            isa => isa,
        }
    }

    /// Whether this path's tiled (prefill) kernel scores a bf16 query against a bf16 cache by
    /// multiplying bf16 pairs (`vdpbf16ps`, `kernel/bf16dot.rs`): `avx512` on a CPU with
    /// AVX512_BF16.
    pub fn bf16_pairs(self) -> bool {
        self == Isa::Avx512 && self.check().is_ok() && has_avx512bf16()
    }

    /// The best path this machine runs (`portable16` is never the best: without AVX-512,
    /// 16 lanes in arrays are split into narrower vectors and only add work).
    pub fn best() -> Isa {
        Isa::all()
            .into_iter()
            .rev()
            .find(|i| *i != Isa::Portable16 && i.check().is_ok())
            .unwrap_or(Isa::Portable)
    }

    /// [`Isa::best`], unless `KVSHARE_CPU_ISA` is set: then that path, or an error when the
    /// value names no path or the machine cannot run it.
    pub fn from_env() -> Result<Isa> {
        match std::env::var(ISA_ENV) {
            Err(std::env::VarError::NotPresent) => Ok(Isa::best()),
            Err(std::env::VarError::NotUnicode(_)) => Err(Error::BackendUnavailable(format!(
                "{ISA_ENV} is not valid UTF-8"
            ))),
            Ok(s) if s.is_empty() => Ok(Isa::best()),
            Ok(s) => {
                let isa = Isa::parse(&s).ok_or_else(|| {
                    Error::BackendUnavailable(format!(
                        "{ISA_ENV}={s:?} names no CPU path (portable, portable16, avx2, avx512, amx)"
                    ))
                })?;
                isa.check().map_err(|why| {
                    Error::BackendUnavailable(format!("{ISA_ENV}={s}: cannot run here: {why}"))
                })?;
                Ok(isa)
            }
        }
    }
}

fn need(flags: &[(&str, bool)]) -> std::result::Result<(), String> {
    let missing: Vec<&str> = flags.iter().filter(|f| !f.1).map(|f| f.0).collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("the CPU lacks {}", missing.join(", ")))
    }
}

macro_rules! detect {
    ($name:ident, $feat:tt) => {
        fn $name() -> bool {
            #[cfg(target_arch = "x86_64")]
            {
                std::arch::is_x86_feature_detected!($feat)
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                false
            }
        }
    };
}
detect!(has_avx2, "avx2");
detect!(has_fma, "fma");
detect!(has_f16c, "f16c");
detect!(has_avx512f, "avx512f");
detect!(has_avx512vl, "avx512vl");
detect!(has_avx512bf16, "avx512bf16");
detect!(has_avx512fp16, "avx512fp16");

/// The AMX bits of CPUID leaf 7 (detection through `is_x86_feature_detected!` is not stable
/// Rust yet): amx_tile (subleaf 0, EDX bit 24), amx_bf16 (EDX bit 22) and amx_fp16 (subleaf
/// 1, EAX bit 21; Granite Rapids on). Read once per process: the kernel asks per launch, and
/// `cpuid` traps to the hypervisor in a VM.
#[derive(Clone, Copy, Default)]
struct AmxBits {
    tile: bool,
    bf16: bool,
    fp16: bool,
}

fn amx_bits() -> AmxBits {
    static BITS: std::sync::OnceLock<AmxBits> = std::sync::OnceLock::new();
    *BITS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::__cpuid_count;
            // Leaf 7 is read only when leaf 0 says it exists, subleaf 1 only when subleaf 0's
            // EAX (the highest subleaf) says so.
            if __cpuid_count(0, 0).eax < 7 {
                return AmxBits::default();
            }
            let l7 = __cpuid_count(7, 0);
            AmxBits {
                tile: l7.edx & (1 << 24) != 0,
                bf16: l7.edx & (1 << 22) != 0,
                fp16: l7.eax >= 1 && __cpuid_count(7, 1).eax & (1 << 21) != 0,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            AmxBits::default()
        }
    })
}

fn has_amx_tile() -> bool {
    amx_bits().tile
}

fn has_amx_bf16() -> bool {
    amx_bits().bf16
}

/// AMX-FP16 (`tdpfp16ps`).
fn has_amx_fp16() -> bool {
    amx_bits().fp16
}

/// The CPU flags that matter to the paths, present ones only, e.g. `avx2 fma f16c`.
pub fn cpu_flags() -> String {
    let all = [
        ("avx2", has_avx2()),
        ("fma", has_fma()),
        ("f16c", has_f16c()),
        ("avx512f", has_avx512f()),
        ("avx512vl", has_avx512vl()),
        ("avx512_bf16", has_avx512bf16()),
        ("avx512_fp16", has_avx512fp16()),
        ("amx_tile", has_amx_tile()),
        ("amx_bf16", has_amx_bf16()),
        ("amx_fp16", has_amx_fp16()),
    ];
    let on: Vec<&str> = all.iter().filter(|f| f.1).map(|f| f.0).collect();
    if on.is_empty() {
        "none".into()
    } else {
        on.join(" ")
    }
}

/// Asks the kernel, once per process, for permission to use AMX tile data
/// (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`; Linux 5.16+ requires it before the
/// first tile instruction, which otherwise kills the process with SIGILL). `Ok` when granted;
/// `Err` with the reason when the CPU lacks AMX, the OS is not Linux/x86-64, or the kernel
/// refuses (the caller then uses another path). Later calls return the first answer.
pub fn amx_permission() -> std::result::Result<(), String> {
    static ANSWER: std::sync::OnceLock<std::result::Result<(), String>> =
        std::sync::OnceLock::new();
    ANSWER.get_or_init(request_amx).clone()
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn request_amx() -> std::result::Result<(), String> {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    if !(has_amx_tile() && has_amx_bf16()) {
        return Err("the CPU lacks amx_tile/amx_bf16".into());
    }
    // SAFETY: arch_prctl with ARCH_REQ_XCOMP_PERM only reads its integer argument; it changes
    // the process's permitted xsave features (adding tile data), nothing in our memory.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!(
            "the kernel refused AMX tile data (arch_prctl: {})",
            std::io::Error::last_os_error()
        ))
    }
}

#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
fn request_amx() -> std::result::Result<(), String> {
    Err("AMX tile permission is requested on Linux x86-64 only".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_best_is_runnable() {
        for isa in Isa::all() {
            assert_eq!(Isa::parse(isa.name()), Some(isa));
        }
        assert_eq!(Isa::parse("sse"), None);
        assert!(Isa::best().check().is_ok());
        assert!(Isa::Portable.check().is_ok());
        assert_eq!(Isa::Avx2.vector(), Isa::Avx2);
        match Isa::Amx.check() {
            Ok(()) => assert!(amx_permission().is_ok() && Isa::Amx.vector() != Isa::Amx),
            Err(why) => assert!(why.contains("lacks") || why.contains("refused"), "{why}"),
        }
    }

    #[test]
    fn amx_permission_answers_the_same_twice() {
        // On a machine without AMX this is the refusal; with AMX it is granted (or refused by
        // the kernel); either way it never faults and the second call repeats the first.
        assert_eq!(amx_permission(), amx_permission());
        if !cpu_flags().contains("amx_tile") {
            assert!(amx_permission().unwrap_err().contains("lacks"));
        }
    }
}
