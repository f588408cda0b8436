//! Where a replay's requests come from, one at a time: a file read as it is replayed
//! ([`FileSource`]) or requests already in memory ([`VecSource`]).
//!
//! A file is read twice: once to check every line (and to learn the request count and the
//! longest request) before anything runs, then again as the replay reaches each request's arrival
//! time. Memory is one line and one request at a time, plus what each format keeps across lines
//! (the native format's request ids, to refuse duplicates; Bailian's chat ids, to find each
//! chat's conversation): a few tens of bytes per request.

use std::fs::File;
use std::io::{BufRead, BufReader};

use super::config::ReplayConfig;
use super::formats::{LineReader, ReadNotes, Record, TraceFormat};
use super::trace::{Request, TraceError};

/// Token counts of a source's requests (prompt plus output, every sample).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sizes {
    /// The longest request's tokens at its end.
    pub longest: usize,
    /// All requests' tokens at their end.
    pub total: usize,
}

/// Requests in arrival order, one at a time.
pub trait RequestSource {
    /// Token counts of the requests.
    fn sizes(&self) -> Sizes;
    /// Requests in all.
    fn len(&self) -> usize;
    /// Whether there is no request.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The next request, `None` after the last.
    fn next_request(&mut self) -> Result<Option<Request>, String>;
    /// Starts again from the first request (a sweep replays one trace many times).
    fn rewind(&mut self) -> Result<(), String>;
    /// Refuses, before anything runs, a request that cannot fit the device alone.
    fn check_fits(&self, cfg: &ReplayConfig) -> Result<(), String>;
}

/// Requests held in memory (the built-in workloads, tests).
#[derive(Debug, Clone)]
pub struct VecSource<'a> {
    reqs: &'a [Request],
    next: usize,
}

impl<'a> VecSource<'a> {
    /// The requests, first to last.
    pub fn new(reqs: &'a [Request]) -> Self {
        VecSource { reqs, next: 0 }
    }
}

impl RequestSource for VecSource<'_> {
    fn sizes(&self) -> Sizes {
        let lens = self
            .reqs
            .iter()
            .map(|r| (0..r.outputs.len()).map(|b| r.final_len(b)).sum::<usize>());
        Sizes {
            longest: lens.clone().max().unwrap_or(0),
            total: lens.sum(),
        }
    }
    fn len(&self) -> usize {
        self.reqs.len()
    }
    fn next_request(&mut self) -> Result<Option<Request>, String> {
        let r = self.reqs.get(self.next).cloned();
        self.next += usize::from(r.is_some());
        Ok(r)
    }
    fn rewind(&mut self) -> Result<(), String> {
        self.next = 0;
        Ok(())
    }
    fn check_fits(&self, cfg: &ReplayConfig) -> Result<(), String> {
        super::config::check_fits(self.reqs, cfg)
    }
}

/// The longest request of a file (every file request has one sample).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Longest {
    id: String,
    line: usize,
    tokens: usize,
}

/// A trace file in some format, read as the replay goes.
#[derive(Debug)]
pub struct FileSource {
    path: String,
    format: TraceFormat,
    lines: std::io::Lines<BufReader<File>>,
    reader: LineReader,
    line: usize,
    count: usize,
    longest: Option<Longest>,
    total: usize,
    /// What the checking read noticed.
    pub notes: ReadNotes,
}

fn open(path: &str) -> Result<std::io::Lines<BufReader<File>>, String> {
    let f = File::open(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    Ok(BufReader::with_capacity(1 << 20, f).lines())
}

impl FileSource {
    /// Opens `path` in `format` and checks every line. Refused lines come back all at once
    /// (with their line numbers and reasons), and then nothing may run.
    pub fn open(path: &str, format: TraceFormat) -> Result<Self, Vec<TraceError>> {
        let io = |reason: String| vec![TraceError { line: 0, reason }];
        let mut reader = LineReader::new(format);
        let mut errors = Vec::new();
        let (mut count, mut longest, mut total) = (0usize, None::<Longest>, 0usize);
        for (i, text) in open(path).map_err(io)?.enumerate() {
            let line = i + 1;
            let text = text.map_err(|e| io(format!("cannot read {path}: {e}")))?;
            match reader.read(line, &text) {
                Ok(Some(r)) => {
                    count += 1;
                    total += r.final_len();
                    let tokens = r.final_len();
                    if longest.as_ref().is_none_or(|l| tokens > l.tokens) {
                        longest = Some(Longest {
                            id: r.id,
                            line,
                            tokens,
                        });
                    }
                }
                Ok(None) => {}
                Err(reason) => errors.push(TraceError { line, reason }),
            }
        }
        if errors.is_empty() && count == 0 {
            errors.push(TraceError {
                line: 0,
                reason: "the trace has no requests".into(),
            });
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(FileSource {
            path: path.to_string(),
            format,
            lines: open(path).map_err(io)?,
            notes: reader.notes,
            reader: LineReader::new(format),
            line: 0,
            count,
            longest,
            total,
        })
    }

    /// The format.
    pub fn format(&self) -> TraceFormat {
        self.format
    }

    fn next_record(&mut self) -> Result<Option<Record>, String> {
        for text in self.lines.by_ref() {
            self.line += 1;
            let text = text.map_err(|e| format!("cannot read {}: {e}", self.path))?;
            // The checking read accepted every line; a file changed since is refused here.
            match self.reader.read(self.line, &text) {
                Ok(Some(r)) => return Ok(Some(r)),
                Ok(None) => {}
                Err(e) => {
                    return Err(format!(
                        "{}:line {}: {e} (the file changed while it was replayed)",
                        self.path, self.line
                    ))
                }
            }
        }
        Ok(None)
    }
}

impl RequestSource for FileSource {
    fn sizes(&self) -> Sizes {
        Sizes {
            longest: self.longest.as_ref().map_or(0, |l| l.tokens),
            total: self.total,
        }
    }
    fn len(&self) -> usize {
        self.count
    }
    fn next_request(&mut self) -> Result<Option<Request>, String> {
        Ok(self.next_record()?.map(Record::into_request))
    }
    fn rewind(&mut self) -> Result<(), String> {
        self.lines = open(&self.path)?;
        self.reader = LineReader::new(self.format);
        self.line = 0;
        Ok(())
    }
    fn check_fits(&self, cfg: &ReplayConfig) -> Result<(), String> {
        let Some(l) = &self.longest else {
            return Ok(());
        };
        super::config::check_request(&l.id, l.line, &[l.tokens], cfg)
    }
}
