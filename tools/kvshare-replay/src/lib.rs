//! `kvshare-replay`'s engine, as a library so tests can drive it: replays a request trace (or a
//! built-in workload) through the cache manager and a model, step by step on a simulated clock,
//! and reports memory with and without sharing, the ideal, prefix hits, evictions,
//! copy-on-write copies and the time spent in the cache manager and in attention.
//!
//! * [`trace`]: requests and the native JSON Lines trace; [`formats`]: the public trace formats
//!   (Mooncake, Bailian, Azure, BurstGPT) and generated excerpts of them; [`source`]: requests
//!   streamed from a file (or held in memory);
//! * [`workload`]: the built-in workloads (multi-turn chat; shared-prefix ratio);
//! * [`config`]: the replay's settings; [`sim`]: the replay loop (plain and hybrid models);
//!   [`requests`]: its state of each request and the admission queue ([`Schedule`]);
//!   [`outcome`]: what it reports; [`ideal`]: the ideal page count, computed independently;
//!   [`offline`]: the offline reference (Belady's rule on the run's recorded accesses);
//! * [`engines`]: several engines behind a router, with a shared pool ([`replay_engines`]);
//! * [`hybrid`]: a hybrid model's groups and their table; [`kvdtype`]: a page format against
//!   bf16 at one device byte budget;
//! * [`model`]: the model step behind a small trait ([`model::NoModel`] for `--no-attention`,
//!   [`cpu_model::CpuModel`] on the CPU attention backend);
//! * [`report`], [`svg`], [`sweep`]: the table, the plots and the sweeps (share ratio, page
//!   size, capacity).

pub mod config;
pub mod cpu_model;
pub mod engines;
pub mod formats;
pub mod hybrid;
pub mod ideal;
pub mod kvdtype;
pub mod model;
pub mod offline;
pub mod outcome;
pub mod report;
pub mod requests;
pub mod rng;
pub mod sim;
pub mod source;
pub mod svg;
pub mod sweep;
pub mod trace;
pub mod workload;

pub use config::{check_fits, ReplayConfig};
pub use formats::{parse_trace, TraceFormat};
pub use model::{Forward, Geometry, Model, NoModel};
pub use outcome::{GroupMemory, Outcome, Progress, Reference, RequestStats, StepPages};
pub use requests::Schedule;
pub use sim::{replay, replay_engines, replay_source};
pub use source::{FileSource, RequestSource, VecSource};
pub use trace::{Request, TraceError};
