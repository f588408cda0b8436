//! `kvshare-replay`'s engine, as a library so tests can drive it: replays a request trace (or a
//! built-in workload) through the cache manager and a model, step by step on a simulated clock,
//! and reports memory with and without sharing, the ideal, prefix hits, evictions,
//! copy-on-write copies and the time spent in the cache manager and in attention.
//!
//! * [`trace`]: requests and the JSON Lines trace parser;
//! * [`workload`]: the built-in workloads (multi-turn chat; shared-prefix ratio);
//! * [`config`]: the replay's settings; [`sim`]: the replay loop; `requests`: its state of
//!   each request; [`outcome`]: what it reports; [`ideal`]: the ideal page count, computed
//!   independently;
//! * [`model`]: the model step behind a small trait ([`model::NoModel`] for `--no-attention`,
//!   [`cpu_model::CpuModel`] on the CPU attention backend);
//! * [`report`], [`svg`], [`sweep`]: the table, the plot and the section-5 sweeps.

pub mod config;
pub mod cpu_model;
pub mod hybrid;
pub mod ideal;
pub mod model;
pub mod outcome;
pub mod report;
mod requests;
pub mod rng;
pub mod sim;
pub mod svg;
pub mod sweep;
pub mod trace;
pub mod workload;

pub use config::{check_fits, ReplayConfig};
pub use model::{Forward, Geometry, Model, NoModel};
pub use outcome::{Outcome, Progress, RequestStats, StepPages};
pub use sim::replay;
pub use trace::{parse_trace, Request, TraceError};
