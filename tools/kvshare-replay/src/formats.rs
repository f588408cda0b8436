//! Trace formats: the replay's own JSON Lines (`native`) and the public traces researchers
//! publish, read line by line ([`LineReader`]) into [`Record`]s, which become [`Request`]s with
//! token ids ([`Record::into_request`]).
//!
//! | format | file | prompt identity | sessions | arrival |
//! |---|---|---|---|---|
//! | `native` | JSON Lines, `trace-format.md` | the token ids | `session` | `arrival_ms` |
//! | `mooncake` | JSON Lines `{timestamp, input_length, output_length, hash_ids}` (Mooncake FAST'25) | `hash_ids`: one id per 512-token block, chained (an id names its block *and* everything before it) | none | `timestamp`, ms |
//! | `bailian` | JSON Lines `{chat_id, parent_chat_id, timestamp, input_length, output_length, type, turn, hash_ids}` (Alibaba Qwen-Bailian) | `hash_ids`: one id per 16-token block, a salted hash of the block's tokens alone | a chat's root (`parent_chat_id` -1) | `timestamp`, s |
//! | `azure` | CSV `TIMESTAMP,ContextTokens,GeneratedTokens` (Azure LLM inference 2023, 2024) | none: lengths only | none | date-time, from the first row |
//! | `burstgpt` | CSV `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type` (BurstGPT; a `Session ID` column is used when present) | none: lengths only | `Session ID` | `Timestamp`, s |
//!
//! Token ids: block `b` of a block format becomes the block size's worth of ids drawn from
//! SplitMix64 seeded by `b` (31-bit, non-negative), the prompt their concatenation cut to
//! `input_length`. Requests with equal leading ids therefore share exactly those tokens, and the
//! cache's chained page keys decide the sharing: a Bailian id, which names a block's tokens
//! alone, is re-keyed by its prefix that way (the same 16 tokens after another prefix are
//! another page). Prompts of the length-only formats, and every request's output, are ids drawn
//! from the request's line number: nothing is shared. A row with no prompt token (a failed call
//! in BurstGPT) is skipped and counted.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::rng::{mix, Rng};
use super::trace::Request;
use native::parse_native_line;
pub use native::{parse_trace, parse_trace_as};

mod native;

/// A trace file's format (`--trace-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TraceFormat {
    /// The replay's JSON Lines with token ids.
    Native,
    /// Mooncake FAST'25 (`hash_ids` of 512-token blocks).
    Mooncake,
    /// Alibaba Qwen-Bailian (`hash_ids` of 16-token blocks, sessions).
    Bailian,
    /// Azure LLM inference 2023 / 2024 (CSV, lengths only).
    Azure,
    /// BurstGPT (CSV, lengths only).
    BurstGpt,
}

impl TraceFormat {
    /// Every format, in `--help` order.
    pub const ALL: [TraceFormat; 5] = [
        TraceFormat::Native,
        TraceFormat::Mooncake,
        TraceFormat::Bailian,
        TraceFormat::Azure,
        TraceFormat::BurstGpt,
    ];

    /// The name `--trace-format` takes.
    pub fn name(self) -> &'static str {
        match self {
            TraceFormat::Native => "native",
            TraceFormat::Mooncake => "mooncake",
            TraceFormat::Bailian => "bailian",
            TraceFormat::Azure => "azure",
            TraceFormat::BurstGpt => "burstgpt",
        }
    }

    /// The format called `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.name() == name)
    }

    /// Tokens per `hash_ids` block (block formats only).
    pub fn block_size(self) -> Option<usize> {
        match self {
            TraceFormat::Mooncake => Some(512),
            TraceFormat::Bailian => Some(16),
            _ => None,
        }
    }
}

/// How a record's prompt becomes token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Given as ids.
    Tokens(Vec<i32>),
    /// `len` tokens of the concatenated blocks `ids` of `block` tokens each.
    Blocks {
        ids: Vec<u64>,
        block: usize,
        len: usize,
    },
    /// `len` tokens of the request's own.
    Unique { len: usize },
}

impl Prompt {
    /// Prompt tokens.
    pub fn len(&self) -> usize {
        match self {
            Prompt::Tokens(t) => t.len(),
            Prompt::Blocks { len, .. } | Prompt::Unique { len } => *len,
        }
    }

    /// Whether the prompt has no token.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How a record's output becomes token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Given as ids.
    Tokens(Vec<i32>),
    /// `n` tokens of the request's own.
    Unique(usize),
}

impl Output {
    /// Output tokens.
    pub fn len(&self) -> usize {
        match self {
            Output::Tokens(t) => t.len(),
            Output::Unique(n) => *n,
        }
    }

    /// Whether there is no output token.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One request as a trace line describes it, before its token ids are drawn.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Request id (a format without ids: the line number).
    pub id: String,
    /// Conversation.
    pub session: Option<String>,
    /// Arrival on the simulated clock.
    pub arrival_ms: f64,
    /// The prompt.
    pub prompt: Prompt,
    /// The output.
    pub output: Output,
    /// Cache salt.
    pub salt: String,
    /// LoRA adapter id.
    pub lora: u64,
    /// 1-based line.
    pub line: usize,
}

/// 31-bit token id number `i` of stream `stream`.
fn token(stream: u64, i: u64) -> i32 {
    (mix(stream ^ mix(i.wrapping_add(0x6b76_7368)))) as i32 & i32::MAX
}

/// Stream of block `id`'s tokens.
fn block_stream(id: u64) -> u64 {
    mix(id ^ 0x626c_6f63_6b00_0000)
}

/// Stream of the own tokens (prompt or output) of the request on `line`.
fn own_stream(line: usize, output: bool) -> u64 {
    mix(line as u64
        ^ if output {
            0x6f75_7400 << 32
        } else {
            0x696e_0000 << 32
        })
}

impl Record {
    /// Prompt plus output tokens.
    pub fn final_len(&self) -> usize {
        self.prompt.len() + self.output.len()
    }

    /// The request, with its token ids drawn.
    pub fn into_request(self) -> Request {
        let prompt = match self.prompt {
            Prompt::Tokens(t) => t,
            Prompt::Blocks { ids, block, len } => {
                let mut t = Vec::with_capacity(len);
                for id in ids {
                    let s = block_stream(id);
                    let n = block.min(len - t.len());
                    t.extend((0..n as u64).map(|i| token(s, i)));
                    if t.len() == len {
                        break;
                    }
                }
                // Ids covering fewer tokens than the prompt: the rest is the request's own.
                let own = own_stream(self.line, false);
                let have = t.len() as u64;
                t.extend((have..len as u64).map(|i| token(own, i)));
                t
            }
            Prompt::Unique { len } => {
                let s = own_stream(self.line, false);
                (0..len as u64).map(|i| token(s, i)).collect()
            }
        };
        let output = match self.output {
            Output::Tokens(t) => t,
            Output::Unique(n) => {
                let s = own_stream(self.line, true);
                (0..n as u64).map(|i| token(s, i)).collect()
            }
        };
        Request {
            id: self.id,
            session: self.session,
            arrival_ms: self.arrival_ms,
            prompt,
            outputs: vec![output],
            salt: self.salt,
            lora: self.lora,
            line: self.line,
        }
    }
}

/// What a reader noticed besides the requests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadNotes {
    /// Rows skipped for having no prompt token.
    pub empty_prompts: usize,
    /// Requests whose time was earlier than the previous one's (replayed at that time).
    pub reordered: usize,
    /// Block-format requests whose ids do not cover their `input_length` (the rest of the
    /// prompt is their own) or cover more than it (the extra ids are unused).
    pub ids_mismatch: usize,
}

/// Column positions of a CSV format.
#[derive(Debug, Clone, Copy)]
struct Columns {
    time: usize,
    input: usize,
    output: usize,
    session: Option<usize>,
    width: usize,
}

/// Reads a trace's lines in order, keeping what the format needs across lines.
#[derive(Debug)]
pub struct LineReader {
    format: TraceFormat,
    prev_arrival: f64,
    /// Azure: the first row's time (ms since the epoch).
    first_time: Option<f64>,
    columns: Option<Columns>,
    /// Native: the line of each id (duplicates are refused).
    ids: HashMap<String, usize>,
    /// Bailian: each chat's root chat.
    roots: HashMap<u64, u64>,
    /// What was noticed so far.
    pub notes: ReadNotes,
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn field<'a>(obj: &'a Map<String, Value>, name: &str) -> Result<&'a Value, String> {
    obj.get(name)
        .ok_or_else(|| format!("missing field `{name}`"))
}

fn count(obj: &Map<String, Value>, name: &str) -> Result<usize, String> {
    match field(obj, name)? {
        Value::Number(n) => n
            .as_u64()
            .filter(|&x| x <= u32::MAX as u64)
            .map(|x| x as usize)
            .ok_or_else(|| format!("field `{name}` is {n}; it must be a token count")),
        v => Err(format!(
            "field `{name}` must be a number, found {}",
            kind(v)
        )),
    }
}

fn seconds(obj: &Map<String, Value>, name: &str, scale: f64) -> Result<f64, String> {
    match field(obj, name)? {
        Value::Number(n) => {
            let t = n.as_f64().unwrap_or(f64::NAN) * scale;
            if !t.is_finite() || t < 0.0 {
                return Err(format!("field `{name}` is {n}; it must be a time >= 0"));
            }
            Ok(t)
        }
        v => Err(format!(
            "field `{name}` must be a number, found {}",
            kind(v)
        )),
    }
}

fn ids(obj: &Map<String, Value>) -> Result<Vec<u64>, String> {
    let Value::Array(a) = field(obj, "hash_ids")? else {
        return Err("field `hash_ids` must be an array of block ids".into());
    };
    a.iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_u64()
                .ok_or_else(|| format!("field `hash_ids`: element {i} is {v}, not a block id"))
        })
        .collect()
}

fn object(text: &str) -> Result<Map<String, Value>, String> {
    match serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))? {
        Value::Object(o) => Ok(o),
        v => Err(format!("expected a JSON object, found {}", kind(&v))),
    }
}

/// Milliseconds since 1970 of `YYYY-MM-DD HH:MM:SS[.fraction][+HH:MM|Z]` (Azure's timestamps;
/// a `T` may separate date and time).
pub fn parse_datetime(s: &str) -> Option<f64> {
    let s = s.trim();
    let (date, rest) = s.split_at(s.find([' ', 'T'])?);
    let rest = &rest[1..];
    let mut d = date.split('-');
    let (y, m, day): (i64, i64, i64) = (
        d.next()?.parse().ok()?,
        d.next()?.parse().ok()?,
        d.next()?.parse().ok()?,
    );
    if d.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&day) {
        return None;
    }
    // The zone: a trailing Z, or +HH:MM / -HH:MM after the seconds.
    let (time, offset_min) = if let Some(t) = rest.strip_suffix('Z') {
        (t, 0)
    } else if let Some(i) = rest.rfind(['+', '-']) {
        let (t, z) = rest.split_at(i);
        let sign = if z.starts_with('-') { -1 } else { 1 };
        let mut hm = z[1..].split(':');
        let h: i64 = hm.next()?.parse().ok()?;
        let mi: i64 = hm.next().map_or(Some(0), |x| x.parse().ok())?;
        (t, sign * (h * 60 + mi))
    } else {
        (rest, 0)
    };
    let mut t = time.split(':');
    let (hh, mm): (i64, i64) = (t.next()?.parse().ok()?, t.next()?.parse().ok()?);
    let ss: f64 = t.next()?.parse().ok()?;
    if t.next().is_some() || hh > 23 || mm > 59 || !(0.0..61.0).contains(&ss) {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hh * 3600 + mm * 60 - offset_min * 60;
    Some(secs as f64 * 1e3 + ss * 1e3)
}

impl LineReader {
    /// A reader of `format`, before its first line.
    pub fn new(format: TraceFormat) -> Self {
        LineReader {
            format,
            prev_arrival: 0.0,
            first_time: None,
            columns: None,
            ids: HashMap::new(),
            roots: HashMap::new(),
            notes: ReadNotes::default(),
        }
    }

    /// Arrival of a public format's request: never before the previous one (counted).
    fn arrival(&mut self, t: f64) -> f64 {
        if t < self.prev_arrival {
            self.notes.reordered += 1;
            return self.prev_arrival;
        }
        t
    }

    /// The record on line `line` (1-based), `None` for a line that holds none (blank, a CSV
    /// header, a row with no prompt token), or why the line is refused.
    pub fn read(&mut self, line: usize, text: &str) -> Result<Option<Record>, String> {
        if text.trim().is_empty() {
            return Ok(None);
        }
        let rec = match self.format {
            TraceFormat::Native => self.native(line, text)?,
            TraceFormat::Mooncake => self.mooncake(line, text)?,
            TraceFormat::Bailian => self.bailian(line, text)?,
            TraceFormat::Azure | TraceFormat::BurstGpt => match self.csv(line, text)? {
                Some(r) => r,
                None => return Ok(None),
            },
        };
        if rec.prompt.is_empty() {
            if self.format == TraceFormat::Native {
                return Err(
                    "field `prompt` is empty; a request needs at least one prompt token".into(),
                );
            }
            self.notes.empty_prompts += 1;
            return Ok(None);
        }
        self.prev_arrival = rec.arrival_ms;
        Ok(Some(rec))
    }

    fn native(&mut self, line: usize, text: &str) -> Result<Record, String> {
        let r = parse_native_line(text, line, self.prev_arrival)?;
        if let Some(&first) = self.ids.get(&r.id) {
            return Err(format!(
                "duplicate id {:?} (first used on line {first})",
                r.id
            ));
        }
        self.ids.insert(r.id.clone(), line);
        let mut outputs = r.outputs;
        Ok(Record {
            id: r.id,
            session: r.session,
            arrival_ms: r.arrival_ms,
            prompt: Prompt::Tokens(r.prompt),
            output: Output::Tokens(outputs.remove(0)),
            salt: r.salt,
            lora: r.lora,
            line,
        })
    }

    /// The prompt of a block format's `input_length` and `hash_ids`.
    fn blocks(&mut self, obj: &Map<String, Value>) -> Result<Prompt, String> {
        let len = count(obj, "input_length")?;
        let ids = ids(obj)?;
        let block = self.format.block_size().expect("a block format");
        if ids.len() != len.div_ceil(block) {
            self.notes.ids_mismatch += 1;
        }
        Ok(Prompt::Blocks { ids, block, len })
    }

    fn mooncake(&mut self, line: usize, text: &str) -> Result<Record, String> {
        let obj = object(text)?;
        let t = seconds(&obj, "timestamp", 1.0)?;
        let prompt = self.blocks(&obj)?;
        let output = Output::Unique(count(&obj, "output_length")?);
        Ok(Record {
            id: line.to_string(),
            session: None,
            arrival_ms: self.arrival(t),
            prompt,
            output,
            salt: String::new(),
            lora: 0,
            line,
        })
    }

    fn bailian(&mut self, line: usize, text: &str) -> Result<Record, String> {
        let obj = object(text)?;
        let chat = match field(&obj, "chat_id")? {
            Value::Number(n) => n.as_u64(),
            _ => None,
        }
        .ok_or("field `chat_id` must be a non-negative integer")?;
        let parent = match field(&obj, "parent_chat_id")? {
            Value::Number(n) => n.as_i64(),
            _ => None,
        }
        .ok_or("field `parent_chat_id` must be an integer (-1 for a first turn)")?;
        if self.roots.contains_key(&chat) {
            return Err(format!("chat_id {chat} appears twice"));
        }
        let root = if parent < 0 {
            chat
        } else {
            *self.roots.get(&(parent as u64)).ok_or_else(|| {
                format!("parent_chat_id {parent} is not an earlier line's chat_id")
            })?
        };
        let t = seconds(&obj, "timestamp", 1e3)?;
        let prompt = self.blocks(&obj)?;
        let output = Output::Unique(count(&obj, "output_length")?);
        self.roots.insert(chat, root);
        Ok(Record {
            id: chat.to_string(),
            session: Some(root.to_string()),
            arrival_ms: self.arrival(t),
            prompt,
            output,
            salt: String::new(),
            lora: 0,
            line,
        })
    }

    fn csv(&mut self, line: usize, text: &str) -> Result<Option<Record>, String> {
        let cells: Vec<&str> = text.trim_end_matches('\r').split(',').collect();
        let Some(c) = self.columns else {
            let find = |name: &str| cells.iter().position(|h| h.trim() == name);
            let need = |name: &str| {
                find(name).ok_or_else(|| {
                    format!(
                        "the {} header lacks the column `{name}` (found: {})",
                        self.format.name(),
                        text.trim()
                    )
                })
            };
            self.columns = Some(match self.format {
                TraceFormat::Azure => Columns {
                    time: need("TIMESTAMP")?,
                    input: need("ContextTokens")?,
                    output: need("GeneratedTokens")?,
                    session: None,
                    width: cells.len(),
                },
                _ => Columns {
                    time: need("Timestamp")?,
                    input: need("Request tokens")?,
                    output: need("Response tokens")?,
                    session: find("Session ID"),
                    width: cells.len(),
                },
            });
            return Ok(None);
        };
        if cells.len() != c.width {
            return Err(format!(
                "{} cells where the header has {}",
                cells.len(),
                c.width
            ));
        }
        let num = |i: usize, what: &str| -> Result<usize, String> {
            cells[i]
                .trim()
                .parse::<u32>()
                .map(|x| x as usize)
                .map_err(|_| format!("{what} {:?} is not a token count", cells[i]))
        };
        let input = num(c.input, "the input length")?;
        let output = num(c.output, "the output length")?;
        let raw = cells[c.time].trim();
        let t = match self.format {
            TraceFormat::Azure => {
                let ms = parse_datetime(raw)
                    .ok_or_else(|| format!("timestamp {raw:?} is not a date and time"))?;
                ms - *self.first_time.get_or_insert(ms)
            }
            _ => {
                let s: f64 = raw
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s >= 0.0)
                    .ok_or_else(|| format!("timestamp {raw:?} is not a time in seconds"))?;
                s * 1e3
            }
        };
        let session = c
            .session
            .map(|i| cells[i].trim().to_string())
            .filter(|s| !s.is_empty());
        Ok(Some(Record {
            id: line.to_string(),
            session,
            arrival_ms: self.arrival(t.max(0.0)),
            prompt: Prompt::Unique { len: input },
            output: Output::Unique(output),
            salt: String::new(),
            lora: 0,
            line,
        }))
    }
}

/// Small excerpts in each public format, generated (never downloaded).
pub mod excerpt;

#[cfg(test)]
mod tests;
