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
use super::trace::{parse_native_line, Request};

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

/// Small excerpts in each public format, generated (never downloaded): realistic shapes at a
/// chosen size, for tests, measurements and examples.
pub mod excerpt {
    use super::Rng;
    use std::fmt::Write as _;

    /// One conversation of a generated block trace: the ids of its history's complete blocks,
    /// and its length in tokens.
    struct Conv {
        full: Vec<u64>,
        len: usize,
        parent: i64,
        turn: u32,
    }

    /// The ids of a prompt of `len` tokens continuing `c` (its complete blocks, then new ids
    /// from `fresh` for the rest), and `c` after the prompt and `output` more tokens (a block
    /// completed by new tokens is new content: a new id).
    fn extend(
        c: &mut Conv,
        len: usize,
        output: usize,
        block: usize,
        fresh: &mut dyn FnMut() -> u64,
    ) -> Vec<u64> {
        let mut ids = c.full.clone();
        ids.truncate(c.len / block);
        while ids.len() < len.div_ceil(block) {
            ids.push(fresh());
        }
        c.full = ids[..len / block].to_vec();
        c.len = len + output;
        while c.full.len() < c.len / block {
            c.full.push(fresh());
        }
        ids
    }

    /// A Mooncake-format conversation trace: `requests` requests over about `sessions`
    /// conversations at once (each turn's prompt is its conversation's history, previous replies
    /// included, plus a new message; ids of 512-token blocks, numbered in order of first use as
    /// Mooncake numbers them; every conversation starts with the same two-block system prompt),
    /// one request every `gap_ms` on average. Lengths follow the published conversation trace's
    /// shape: a first message of 1-20k tokens, 100-1,500 new tokens per later turn, 50-600
    /// output tokens; a conversation ends once its prompt passes `max_prompt`.
    pub fn mooncake(
        requests: usize,
        sessions: usize,
        gap_ms: u64,
        max_prompt: usize,
        seed: u64,
    ) -> String {
        let mut rng = Rng::stream(seed, 0x6d6f_6f6e);
        let mut next_id = 2u64;
        let mut fresh = move || {
            next_id += 1;
            next_id - 1
        };
        let mut convs: Vec<Conv> = Vec::new();
        let mut out = String::new();
        let mut t = 0u64;
        for _ in 0..requests {
            t += rng.below(2 * gap_ms + 1);
            let k = if convs.is_empty() || (convs.len() < sessions.max(1) && rng.below(4) == 0) {
                convs.push(Conv {
                    full: vec![0, 1],
                    len: 1024,
                    parent: -1,
                    turn: 0,
                });
                convs.len() - 1
            } else {
                rng.below(convs.len() as u64) as usize
            };
            let c = &mut convs[k];
            let add = if c.turn == 0 {
                rng.range(1000, 20_000)
            } else {
                rng.range(100, 1500)
            } as usize;
            let output = rng.range(50, 600) as usize;
            let len = c.len + add;
            let ids = extend(c, len, output, 512, &mut fresh);
            c.turn += 1;
            let _ = writeln!(
                out,
                "{{\"timestamp\": {t}, \"input_length\": {len}, \"output_length\": {output}, \"hash_ids\": {ids:?}}}"
            );
            if c.len > max_prompt {
                convs.swap_remove(k);
            }
        }
        out
    }

    /// A Bailian-format trace: `requests` requests over about `sessions` chats at once, turns
    /// chained by `parent_chat_id`, timestamps in seconds, 16-token blocks whose ids name their
    /// content alone: every chat starts with one 32-block system prompt (ids 0-31), and a tenth
    /// of the other blocks are common phrases with ids 100-131 wherever they stand (the same
    /// id after another prefix, which the cache must not share). 20-600 new tokens per turn,
    /// 20-400 output tokens, at most 12 turns.
    pub fn bailian(requests: usize, sessions: usize, gap_ms: u64, seed: u64) -> String {
        let mut rng = Rng::stream(seed, 0x6261_696c);
        let mut phrase = Rng::stream(seed, 0x7068_7261);
        let mut next_block = 1000u64;
        let mut fresh = move || {
            if phrase.below(10) == 0 {
                100 + phrase.below(32)
            } else {
                next_block += 1;
                next_block
            }
        };
        let mut chats: Vec<Conv> = Vec::new();
        let mut out = String::new();
        let mut t = 0u64;
        for chat in 0..requests as u64 {
            t += rng.below(2 * gap_ms + 1);
            let k = if chats.is_empty() || (chats.len() < sessions.max(1) && rng.below(3) == 0) {
                chats.push(Conv {
                    full: (0..32).collect(),
                    len: 32 * 16,
                    parent: -1,
                    turn: 0,
                });
                chats.len() - 1
            } else {
                rng.below(chats.len() as u64) as usize
            };
            let c = &mut chats[k];
            let len = c.len + rng.range(20, 600) as usize;
            let output = rng.range(20, 400) as usize;
            let ids = extend(c, len, output, 16, &mut fresh);
            let _ = writeln!(
                out,
                "{{\"chat_id\": {chat}, \"parent_chat_id\": {}, \"timestamp\": {:.3}, \"input_length\": {len}, \"output_length\": {output}, \"type\": \"text\", \"turn\": {}, \"hash_ids\": {ids:?}}}",
                c.parent,
                t as f64 / 1e3,
                c.turn + 1
            );
            c.parent = chat as i64;
            c.turn += 1;
            if c.turn >= 12 {
                chats.swap_remove(k);
            }
        }
        out
    }

    /// An Azure-format CSV (2023's timestamps, or 2024's with `+00:00` when `v2024`).
    pub fn azure(requests: usize, gap_ms: u64, v2024: bool, seed: u64) -> String {
        let mut rng = Rng::stream(seed, 0x617a_7572);
        let mut out = String::from("TIMESTAMP,ContextTokens,GeneratedTokens\n");
        let mut ms = 0u64;
        for _ in 0..requests {
            ms += rng.below(2 * gap_ms + 1);
            let (s, frac) = (ms / 1000, ms % 1000);
            let (h, m, sec) = (18 + s / 3600, s / 60 % 60, s % 60);
            let stamp = if v2024 {
                format!("2024-05-10 {h:02}:{m:02}:{sec:02}.{frac:03}930+00:00")
            } else {
                format!("2023-11-16 {h:02}:{m:02}:{sec:02}.{frac:03}5900")
            };
            let _ = writeln!(
                out,
                "{stamp},{},{}",
                rng.range(20, 4000),
                rng.range(10, 500)
            );
        }
        out
    }

    /// A BurstGPT-format CSV (with a `Session ID` column when `sessions`); a few failed calls
    /// with no request tokens.
    pub fn burstgpt(requests: usize, gap_ms: u64, sessions: bool, seed: u64) -> String {
        let mut rng = Rng::stream(seed, 0x6275_7273);
        let mut out = String::from(if sessions {
            "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        } else {
            "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        });
        let mut ms = 5000u64;
        for _ in 0..requests {
            ms += rng.below(2 * gap_ms + 1);
            let req = if rng.below(50) == 0 {
                0
            } else {
                rng.range(10, 2000)
            };
            let resp = rng.range(0, 400);
            let model = if rng.below(4) == 0 {
                "GPT-4"
            } else {
                "ChatGPT"
            };
            let sess = if sessions {
                format!("s{},{},", rng.below(20), rng.below(5000))
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "{},{sess}{model},{req},{resp},{},Conversation log",
                ms / 1000,
                req + resp
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(format: TraceFormat, text: &str) -> (Vec<Request>, ReadNotes) {
        let mut r = LineReader::new(format);
        let mut out = Vec::new();
        for (i, l) in text.lines().enumerate() {
            if let Some(rec) = r.read(i + 1, l).unwrap() {
                out.push(rec.into_request());
            }
        }
        (out, r.notes)
    }

    fn err(format: TraceFormat, text: &str) -> String {
        let mut r = LineReader::new(format);
        for (i, l) in text.lines().enumerate() {
            if let Err(e) = r.read(i + 1, l) {
                return format!("line {}: {e}", i + 1);
            }
        }
        panic!("no error in {text}")
    }

    #[test]
    fn mooncake_blocks_share_exactly_their_tokens() {
        // The published README's two samples: 12 common blocks, then their own.
        let text = "{\"timestamp\": 27482, \"input_length\": 6955, \"output_length\": 52, \"hash_ids\": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 2353, 2354]}\n\
                    {\"timestamp\": 30535, \"input_length\": 6472, \"output_length\": 26, \"hash_ids\": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 2366]}\n";
        let (r, notes) = read_all(TraceFormat::Mooncake, text);
        assert_eq!(notes, ReadNotes::default());
        assert_eq!((r[0].prompt.len(), r[1].prompt.len()), (6955, 6472));
        assert_eq!((r[0].outputs[0].len(), r[1].outputs[0].len()), (52, 26));
        assert_eq!((r[0].arrival_ms, r[1].arrival_ms), (27482.0, 30535.0));
        let common = r[0]
            .prompt
            .iter()
            .zip(&r[1].prompt)
            .take_while(|(a, b)| a == b)
            .count();
        assert_eq!(common, 12 * 512, "exactly the 12 common blocks");
        assert!(r.iter().all(|q| q.prompt.iter().all(|&t| t >= 0)));
        assert_ne!(r[0].outputs[0], r[1].outputs[0]);
        assert_eq!(r[0].id, "1");
        // Deterministic.
        assert_eq!(read_all(TraceFormat::Mooncake, text).0, r);
    }

    #[test]
    fn bailian_chats_form_sessions_and_blocks_are_keyed_by_prefix() {
        let text = "{\"chat_id\": 159, \"parent_chat_id\": -1, \"timestamp\": 61.114, \"input_length\": 40, \"output_length\": 3, \"type\": \"text\", \"turn\": 1, \"hash_ids\": [7, 8, 9]}\n\
                    {\"chat_id\": 160, \"parent_chat_id\": 159, \"timestamp\": 62.5, \"input_length\": 48, \"output_length\": 3, \"type\": \"text\", \"turn\": 2, \"hash_ids\": [7, 8, 10]}\n\
                    {\"chat_id\": 161, \"parent_chat_id\": -1, \"timestamp\": 63, \"input_length\": 32, \"output_length\": 3, \"type\": \"search\", \"turn\": 1, \"hash_ids\": [8, 7]}\n";
        let (r, _) = read_all(TraceFormat::Bailian, text);
        assert_eq!(r[0].session.as_deref(), Some("159"));
        assert_eq!(r[1].session.as_deref(), Some("159"));
        assert_eq!(r[2].session.as_deref(), Some("161"));
        assert_eq!(r[1].arrival_ms, 62_500.0);
        // Block 8's tokens are the same after block 7 or first: the cache's chained keys tell
        // the two apart, not the ids.
        assert_eq!(r[0].prompt[16..32], r[2].prompt[..16]);
        assert_eq!(r[0].prompt[..32], r[1].prompt[..32]);
        assert_ne!(r[0].prompt[32..40], r[1].prompt[32..40]);
        assert!(err(TraceFormat::Bailian, "{\"chat_id\": 1, \"parent_chat_id\": 9, \"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}").contains("parent_chat_id 9 is not an earlier"));
    }

    #[test]
    fn csv_formats_read_lengths_and_times() {
        let azure = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n";
        let (r, _) = read_all(TraceFormat::Azure, azure);
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].prompt.len(), r[0].outputs[0].len()), (374, 44));
        assert_eq!(r[0].arrival_ms, 0.0);
        assert!(
            (r[1].arrival_ms - 4314.579).abs() < 1e-3,
            "{}",
            r[1].arrival_ms
        );
        assert!(r[0].prompt[..10] != r[1].prompt[..10], "nothing shared");
        let azure24 = "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00.009930+00:00,10,2\n2024-05-10 00:00:01.5+00:00,10,2\n";
        let (r, _) = read_all(TraceFormat::Azure, azure24);
        assert!((r[1].arrival_ms - 1490.07).abs() < 1e-3);
        let burst = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,472,18,490,Conversation log\n45,GPT-4,0,0,0,API log\n118,GPT-4,417,276,693,Conversation log\n";
        let (r, notes) = read_all(TraceFormat::BurstGpt, burst);
        assert_eq!(r.len(), 2);
        assert_eq!(notes.empty_prompts, 1);
        assert_eq!((r[0].arrival_ms, r[1].arrival_ms), (5000.0, 118_000.0));
        assert_eq!(r[1].line, 4);
        let with_sessions = "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n1,abc,10,ChatGPT,5,5,10,Conversation log\n";
        let (r, _) = read_all(TraceFormat::BurstGpt, with_sessions);
        assert_eq!(r[0].session.as_deref(), Some("abc"));
        assert!(err(TraceFormat::Azure, "TIME,ContextTokens\n")
            .contains("lacks the column `TIMESTAMP`"));
        assert!(err(TraceFormat::Azure, azure.replace("374", "x").as_str())
            .starts_with("line 2: the input length"));
        assert!(err(
            TraceFormat::BurstGpt,
            "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n1,a,2\n"
        )
        .contains("3 cells where the header has 6"));
    }

    #[test]
    fn datetimes() {
        assert_eq!(parse_datetime("1970-01-01 00:00:01"), Some(1000.0));
        assert_eq!(parse_datetime("1970-01-02T00:00:00Z"), Some(86_400_000.0));
        assert_eq!(parse_datetime("1970-01-01 01:00:00+01:00"), Some(0.0));
        assert_eq!(
            parse_datetime("2024-05-10 00:00:00+00:00"),
            Some(1_715_299_200_000.0)
        );
        assert_eq!(parse_datetime("2024-13-10 00:00:00"), None);
        assert_eq!(parse_datetime("yesterday"), None);
    }

    #[test]
    fn out_of_order_rows_arrive_with_their_predecessor() {
        let text = "{\"timestamp\": 10, \"input_length\": 3, \"output_length\": 1, \"hash_ids\": [1]}\n{\"timestamp\": 4, \"input_length\": 3, \"output_length\": 1, \"hash_ids\": [2]}\n";
        let (r, notes) = read_all(TraceFormat::Mooncake, text);
        assert_eq!(r[1].arrival_ms, 10.0);
        assert_eq!(notes.reordered, 1);
    }

    #[test]
    fn generated_excerpts_read_back() {
        for (f, text) in [
            (
                TraceFormat::Mooncake,
                excerpt::mooncake(60, 8, 500, 60_000, 1),
            ),
            (TraceFormat::Bailian, excerpt::bailian(60, 8, 500, 1)),
            (TraceFormat::Azure, excerpt::azure(30, 500, false, 1)),
            (TraceFormat::Azure, excerpt::azure(30, 500, true, 1)),
            (TraceFormat::BurstGpt, excerpt::burstgpt(30, 500, false, 1)),
            (TraceFormat::BurstGpt, excerpt::burstgpt(30, 500, true, 1)),
        ] {
            let (r, notes) = read_all(f, &text);
            assert!(r.len() >= 25, "{f:?}: {}", r.len());
            assert_eq!(notes.ids_mismatch, 0, "{f:?}");
            assert_eq!(notes.reordered, 0, "{f:?}");
            assert!(r.windows(2).all(|w| w[0].arrival_ms <= w[1].arrival_ms));
        }
        // A Mooncake conversation's later turn repeats its earlier prompt.
        let (r, _) = read_all(
            TraceFormat::Mooncake,
            &excerpt::mooncake(40, 4, 500, 1 << 30, 3),
        );
        let shares = r.iter().skip(1).any(|q| {
            r.iter().any(|p| {
                p.prompt.len() > 1024 + 512
                    && q.prompt.len() > p.prompt.len()
                    && q.prompt
                        .starts_with(&p.prompt[..p.prompt.len() / 512 * 512])
            })
        });
        assert!(shares);
    }
}
