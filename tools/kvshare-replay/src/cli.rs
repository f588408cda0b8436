//! Command-line options, read with `lexopt` (one small crate, no dependencies): it takes the
//! arguments as `OsString`s (a non-UTF-8 argument is an error message, not a panic in
//! `std::env::args`), accepts `--flag value` and `--flag=value`, and refuses a value attached
//! to a flag that takes none (`--check=1`). `clap` would also write the usage text, but costs
//! 16 crates and about 470 KB of binary (docs/dependencies.md).

use std::ffi::OsString;

use kvshare_core::{DType, EvictionPolicy};
use kvshare_replay::engines::Route;
use kvshare_replay::model::parse_dtype;
use kvshare_replay::{Schedule, TraceFormat};

pub const USAGE: &str = "\
kvshare-replay: replay multi-turn chat (or a trace) through kvshare's cache manager and the CPU
attention backend, and report KV memory with and without prefix sharing, the ideal, prefix hits
(and the offline reference's), evictions, copy-on-write copies and the time spent in the cache
manager and in attention.

USAGE:
    kvshare-replay [OPTIONS]              (cargo run --release -- [OPTIONS])

WORKLOAD:
    --trace FILE          replay a trace file instead of the built-in chat workload, read as the
                          replay goes (every line is checked first; malformed lines are refused
                          before anything runs)
    --trace-format F      the trace's format [native]:
                            native    JSON Lines with token ids (id, session, arrival_ms, prompt,
                                      output, salt, lora)
                            mooncake  Mooncake FAST'25 JSON Lines (timestamp ms, input_length,
                                      output_length, hash_ids of 512-token blocks)
                            bailian   Alibaba Qwen-Bailian JSON Lines (chat_id, parent_chat_id,
                                      timestamp s, input_length, output_length, hash_ids of
                                      16-token blocks); a chat's turns are one conversation
                            azure     Azure LLM inference 2023/2024 CSV (TIMESTAMP,
                                      ContextTokens, GeneratedTokens): lengths only
                            burstgpt  BurstGPT CSV (Timestamp s, Request tokens, Response tokens,
                                      Session ID if present): lengths only
                          block ids become fixed token ids, so requests share exactly the blocks
                          they share in the trace; lengths-only traces share nothing
    --users N             built-in workload: conversations [8]
    --turns N             built-in workload: turns per conversation [10]
    --system-tokens N     built-in workload: shared system prompt tokens [1024]
    --seed N              seed of the built-in workload and of the model's values [42]
    --dump-trace FILE     write the built-in workload (or the --trace) as a native trace (first
                          sample of each request) and exit
    --excerpt F           with --dump-trace: write instead a generated excerpt in public format F
                          (mooncake, bailian, azure, burstgpt) of --requests requests, about
                          --users conversations at once, one every --gap-ms on average, seeded
                          by --seed (test data of realistic shapes, never a real trace)
    --requests N          --excerpt: requests [1000]
    --gap-ms MS           --excerpt: mean time between arrivals [300]

CACHE AND SCHEDULER:
    --page-size N         tokens per page [16]
    --device-pages N      device pages [14336 tokens' worth: 896 at page size 16]
    --host-pages N        host pages: evicted cached pages are demoted there and promoted back on
                          a hit, preempted requests are swapped there (0: none; recompute) [0]
    --match-unit N        prefix-hit granularity in tokens, a divisor of the page size: a prompt
                          that goes on inside a cached page takes its whole units by a partial
                          page copy (0: whole pages) [0]
    --no-demote           with host pages, drop evicted cached pages instead of demoting them
    --concurrency N       most requests running at once [8]
    --step-ms MS          simulated duration of one engine step [20]
    --no-skip-cached-writes
                          allocate and recompute the last page of a fully cached prompt (vLLM's
                          behaviour) instead of sharing it
    --window W            hybrid model: sliding-window groups of window W next to full attention
                          (a cache of KV-cache groups; report per group, against a full-attention
                          model of the same size in the same run)
    --chunk C             hybrid model: chunked-local groups of chunk C instead of a window
    --state MODE          hybrid model: Mamba / linear-attention state groups (vLLM's
                          mamba_cache_mode all or align) instead of a window; a state page has
                          the attention page's bytes (vLLM pads them equal)
    --full-every K        hybrid model: one full-attention group per K groups [6]
    --policy P            eviction policy of the cache's cached pages: lru, lfu (with dynamic
                          aging) or s3fifo [lru]
    --schedule S          admission order of waiting requests [fcfs]:
                            fcfs              in the order they joined the queue (a turn joins
                                              when its previous turn has finished)
                            session-affinity  turns of conversations that started earlier first
                          (either way a turn waits for its conversation's previous turn, and a
                          preempted request goes back first)
    --check               run the cache manager's invariant checker after every step
    --kv-dtype F          replay twice at one device KV byte budget, with bf16 pages and with
                          pages of F (f32, f16, bf16, fp8_e4m3, fp8_e5m2, int8,
                          int8_per_token_head; the page bytes are the cache manager's, a
                          per-token-head row's scale included), and report pages, prefix hits, recomputed
                          prompt tokens and KV memory side by side (cache manager only)
    --kv-bytes B          --kv-dtype: the device KV budget in bytes [--device-pages bf16 pages]

SEVERAL ENGINES (cache manager only; each engine has --device-pages, --host-pages, --concurrency):
    --engines N           N engines, each its own cache, behind a router [1]
    --pool-pages M        a pool of M pages shared by the engines (LRU over entries; every page
                          an engine registers is stored, a prompt's pages past an engine's
                          device and host hit are loaded from it); 0: no pool [0]
    --route R             the router [session]:
                            round-robin  the k-th request to engine k mod N
                            session      every turn of a conversation to one engine
                            kv-aware     the engine with the least work: the prompt tokens past
                                         its cached prefix plus the tokens it has in flight
    --compare-routes      run the three routings without the pool and with --pool-pages M
                          (M >= 1) and print them as one table

MODEL (attention for every prefill and decode step):
    --no-attention        cache manager only: no KV write, no attention
    --layers N            layers [2]
    --kv-heads N          KV heads [4]
    --gqa N               query heads per KV head [2]
    --head-dim N          head dimension [64]
    --dtype T             f16, bf16 or f32 [f16]
    --threads N           attention threads (0: all cores) [0]
    --verify              check every attention output row against a dense reference recomputed
                          from the token ids (slow: for small runs)

OUTPUT:
    --sweep WHAT          share-ratio: memory saving for shared ratios 10-90% (article 5.1);
                          page-size: saving, time and index size for pages of 8-128 tokens (5.2);
                          with --match-unit N, each page size above N also runs with unit N;
                          capacity: prefix hits of every eviction policy and of the offline
                          reference against device pages (with --host-pages N, also with N host
                          pages), as a table and a plot (--svg)
    --capacities LIST     capacity sweep: device page counts, comma-separated [six from the
                          smallest device that fits the trace to one that never evicts]
    --no-reference        skip the offline reference (Belady's rule on the run's recorded
                          accesses; recorded by default for a plain model with whole-page hits)
    --svg PATH            where to write the plot [target/kvshare-replay.svg]
    --json                print the totals as one JSON line on stdout (the report goes to stderr)
    -h, --help            this text
";

/// Tokens of device memory by default (896 pages of 16 tokens: the built-in workload starts evicting useful history in its last turns).
pub const DEFAULT_DEVICE_TOKENS: u64 = 14336;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sweep {
    ShareRatio,
    PageSize,
    Capacity,
}

#[derive(Debug, Clone)]
pub struct Args {
    pub excerpt: Option<TraceFormat>,
    pub requests: usize,
    pub gap_ms: u64,
    pub trace: Option<String>,
    pub trace_format: TraceFormat,
    pub policy: EvictionPolicy,
    pub schedule: Schedule,
    pub capacities: Option<Vec<u32>>,
    pub reference: bool,
    pub users: usize,
    pub turns: usize,
    pub system_tokens: usize,
    pub seed: u64,
    pub dump_trace: Option<String>,
    pub page_size: u32,
    pub device_pages: Option<u32>,
    pub host_pages: u32,
    pub concurrency: usize,
    pub step_ms: f64,
    pub skip_cached_writes: bool,
    pub demote_to_host: bool,
    pub match_unit: u32,
    pub check: bool,
    pub attention: bool,
    pub layers: u32,
    pub kv_heads: u32,
    pub gqa: u32,
    pub head_dim: u32,
    pub dtype: DType,
    pub threads: usize,
    pub verify: bool,
    pub sweep: Option<Sweep>,
    pub svg: String,
    pub json: bool,
    pub window: Option<u32>,
    pub chunk: Option<u32>,
    pub state: Option<String>,
    pub full_every: u32,
    pub kv_dtype: Option<DType>,
    pub kv_bytes: Option<u64>,
    pub engines: usize,
    pub pool_pages: usize,
    pub route: Route,
    pub compare_routes: bool,
    pub help: bool,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            excerpt: None,
            requests: 1000,
            gap_ms: 300,
            trace: None,
            trace_format: TraceFormat::Native,
            policy: EvictionPolicy::Lru,
            schedule: Schedule::Fcfs,
            capacities: None,
            reference: true,
            users: 8,
            turns: 10,
            system_tokens: 1024,
            seed: 42,
            dump_trace: None,
            page_size: 16,
            device_pages: None,
            host_pages: 0,
            concurrency: 8,
            step_ms: 20.0,
            skip_cached_writes: true,
            demote_to_host: true,
            match_unit: 0,
            check: false,
            attention: true,
            layers: 2,
            kv_heads: 4,
            gqa: 2,
            head_dim: 64,
            dtype: DType::F16,
            threads: 0,
            verify: false,
            sweep: None,
            svg: "target/kvshare-replay.svg".into(),
            json: false,
            window: None,
            chunk: None,
            state: None,
            full_every: 6,
            kv_dtype: None,
            kv_bytes: None,
            engines: 1,
            pool_pages: 0,
            route: Route::Session,
            compare_routes: false,
            help: false,
        }
    }
}

fn num<T>(flag: &str, v: &str, min: T) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display,
{
    let x: T = v
        .parse()
        .map_err(|_| format!("{flag}: {v:?} is not a valid number"))?;
    if x < min {
        return Err(format!("{flag}: {v} is below the minimum {min}"));
    }
    Ok(x)
}

/// Parses the arguments after the program name.
pub fn parse<I>(argv: I) -> Result<Args, String>
where
    I: IntoIterator,
    I::Item: Into<OsString>,
{
    use lexopt::Arg::{Long, Short, Value};
    let mut a = Args::default();
    let mut p = lexopt::Parser::from_args(argv);
    let see_help = |e: lexopt::Error| format!("{e} (see --help)");
    while let Some(arg) = p.next().map_err(see_help)? {
        let flag = match arg {
            Long(name) => format!("--{name}"),
            Short(c) => format!("-{c}"),
            Value(v) => return Err(format!("unexpected argument {v:?} (see --help)")),
        };
        let flag = flag.as_str();
        let mut val = || -> Result<String, String> {
            p.value()
                .map_err(|_| format!("{flag} needs a value (see --help)"))?
                .into_string()
                .map_err(|v| format!("{flag}: {v:?} is not valid UTF-8"))
        };
        match flag {
            "-h" | "--help" => a.help = true,
            "--trace" => a.trace = Some(val()?),
            "--trace-format" => {
                let v = val()?;
                a.trace_format = TraceFormat::from_name(&v).ok_or_else(|| {
                    format!(
                        "--trace-format: {v:?} is not native, mooncake, bailian, azure or burstgpt"
                    )
                })?
            }
            "--policy" => {
                let v = val()?;
                a.policy = EvictionPolicy::from_name(&v)
                    .ok_or_else(|| format!("--policy: {v:?} is not lru, lfu or s3fifo"))?
            }
            "--schedule" => {
                let v = val()?;
                a.schedule = Schedule::from_name(&v)
                    .ok_or_else(|| format!("--schedule: {v:?} is not fcfs or session-affinity"))?
            }
            "--capacities" => {
                let v = val()?;
                let list: Result<Vec<u32>, String> = v
                    .split(',')
                    .map(|x| num("--capacities", x.trim(), 1))
                    .collect();
                a.capacities = Some(list?);
            }
            "--no-reference" => a.reference = false,
            "--excerpt" => {
                let v = val()?;
                a.excerpt = match TraceFormat::from_name(&v) {
                    Some(TraceFormat::Native) | None => {
                        return Err(format!(
                            "--excerpt: {v:?} is not mooncake, bailian, azure or burstgpt"
                        ))
                    }
                    f => f,
                }
            }
            "--requests" => a.requests = num(flag, &val()?, 1)?,
            "--gap-ms" => a.gap_ms = num(flag, &val()?, 0)?,
            "--users" => a.users = num(flag, &val()?, 1)?,
            "--turns" => a.turns = num(flag, &val()?, 1)?,
            "--system-tokens" => a.system_tokens = num(flag, &val()?, 0)?,
            "--seed" => a.seed = num(flag, &val()?, 0)?,
            "--dump-trace" => a.dump_trace = Some(val()?),
            "--page-size" => a.page_size = num(flag, &val()?, 1)?,
            "--device-pages" => a.device_pages = Some(num(flag, &val()?, 1)?),
            "--host-pages" => a.host_pages = num(flag, &val()?, 0)?,
            "--concurrency" => a.concurrency = num(flag, &val()?, 1)?,
            "--step-ms" => {
                a.step_ms = num(flag, &val()?, 0.0)?;
                if a.step_ms <= 0.0 {
                    return Err("--step-ms must be above 0".into());
                }
            }
            "--no-skip-cached-writes" => a.skip_cached_writes = false,
            "--no-demote" => a.demote_to_host = false,
            "--match-unit" => a.match_unit = num(flag, &val()?, 0)?,
            "--check" => a.check = true,
            "--no-attention" => a.attention = false,
            "--layers" => a.layers = num(flag, &val()?, 1)?,
            "--kv-heads" => a.kv_heads = num(flag, &val()?, 1)?,
            "--gqa" => a.gqa = num(flag, &val()?, 1)?,
            "--head-dim" => a.head_dim = num(flag, &val()?, 1)?,
            "--dtype" => {
                let v = val()?;
                a.dtype = parse_dtype(&v)
                    .ok_or_else(|| format!("--dtype: {v:?} is not f16, bf16 or f32"))?
            }
            "--threads" => a.threads = num(flag, &val()?, 0)?,
            "--verify" => a.verify = true,
            "--sweep" => {
                a.sweep = Some(match val()?.as_str() {
                    "share-ratio" => Sweep::ShareRatio,
                    "page-size" => Sweep::PageSize,
                    "capacity" => Sweep::Capacity,
                    v => {
                        return Err(format!(
                            "--sweep: {v:?} is not share-ratio, page-size or capacity"
                        ))
                    }
                })
            }
            "--svg" => a.svg = val()?,
            "--json" => a.json = true,
            "--window" => a.window = Some(num(flag, &val()?, 1)?),
            "--chunk" => a.chunk = Some(num(flag, &val()?, 1)?),
            "--state" => match val()?.as_str() {
                m @ ("all" | "align") => a.state = Some(m.to_string()),
                v => return Err(format!("--state: {v:?} is not all or align")),
            },
            "--full-every" => a.full_every = num(flag, &val()?, 1)?,
            "--kv-dtype" => {
                let v = val()?;
                a.kv_dtype = Some(parse_dtype(&v).ok_or_else(|| {
                    format!(
                        "--kv-dtype: {v:?} is not f32, f16, bf16, fp8_e4m3, fp8_e5m2, int8 or \
                         int8_per_token_head"
                    )
                })?)
            }
            "--kv-bytes" => a.kv_bytes = Some(num(flag, &val()?, 1)?),
            "--engines" => a.engines = num(flag, &val()?, 1)?,
            "--pool-pages" => a.pool_pages = num(flag, &val()?, 0)?,
            "--route" => {
                let v = val()?;
                a.route = Route::from_name(&v).ok_or_else(|| {
                    format!("--route: {v:?} is not round-robin, session or kv-aware")
                })?
            }
            "--compare-routes" => a.compare_routes = true,
            other => return Err(format!("unknown option {other:?} (see --help)")),
        }
    }
    if a.excerpt.is_some() && a.dump_trace.is_none() {
        return Err("--excerpt writes a file: give --dump-trace FILE (see --help)".into());
    }
    if [a.window.is_some(), a.chunk.is_some(), a.state.is_some()]
        .iter()
        .filter(|&&x| x)
        .count()
        > 1
    {
        return Err("--window, --chunk and --state exclude each other (see --help)".into());
    }
    if a.compare_routes && a.pool_pages == 0 {
        return Err(
            "--compare-routes runs each routing without and with the pool: give --pool-pages M (M >= 1)"
                .into(),
        );
    }
    if a.several_engines()
        && (a.kv_dtype.is_some()
            || a.sweep.is_some()
            || a.window.is_some()
            || a.chunk.is_some()
            || a.state.is_some())
    {
        return Err(
            "--engines, --pool-pages and --compare-routes run a plain model: no --kv-dtype, --sweep, --window, --chunk or --state (see --help)"
                .into(),
        );
    }
    if a.kv_bytes.is_some() && a.kv_dtype.is_none() {
        return Err(
            "--kv-bytes is the budget of --kv-dtype: give --kv-dtype F (see --help)".into(),
        );
    }
    if a.kv_dtype.is_some()
        && (a.sweep.is_some() || a.window.is_some() || a.chunk.is_some() || a.state.is_some())
    {
        return Err(
            "--kv-dtype runs a plain model once per format: no --sweep, --window, --chunk or --state (see --help)"
                .into(),
        );
    }
    Ok(a)
}

impl Args {
    /// Whether the run is the engines behind a router (any of their options given).
    pub fn several_engines(&self) -> bool {
        self.engines > 1 || self.pool_pages > 0 || self.compare_routes
    }

    /// Device pages: the flag, or the default memory at this page size.
    pub fn device_pages(&self) -> u32 {
        self.device_pages
            .unwrap_or((DEFAULT_DEVICE_TOKENS / self.page_size as u64).max(1) as u32)
    }
}
