//! Requests, a refused trace line, and requests written as the replay's own JSON Lines trace
//! ([`to_jsonl`]). Reading traces, the replay's own format (`native`) and the public ones, is in
//! [`super::formats`].

use std::fmt;

use serde_json::{Map, Value};

/// One request of a workload: a prompt and the tokens it generates.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Unique id.
    pub id: String,
    /// Conversation it belongs to (`None`: a conversation of its own).
    pub session: Option<String>,
    /// Arrival time on the simulated clock.
    pub arrival_ms: f64,
    /// Full prompt (a later chat turn repeats the whole history).
    pub prompt: Vec<i32>,
    /// Generated tokens, one list per parallel sample. A trace line has exactly one (`output`);
    /// the built-in workload gives some requests two (parallel sampling, `n = 2`), which the
    /// replay runs as a fork after the prefill.
    pub outputs: Vec<Vec<i32>>,
    /// Cache salt (`""`: none).
    pub salt: String,
    /// LoRA adapter id (0: base model).
    pub lora: u64,
    /// Line of the trace file (0 for generated requests).
    pub line: usize,
}

impl Request {
    /// Tokens of branch `b` at its end (prompt plus all of its output).
    pub fn final_len(&self, b: usize) -> usize {
        self.prompt.len() + self.outputs[b].len()
    }
}

/// A refused trace line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceError {
    /// 1-based line number.
    pub line: usize,
    /// Why the line is refused.
    pub reason: String,
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.reason)
    }
}

/// Writes requests as a JSON Lines trace (one `output` per line: only the first sample of a
/// parallel-sampling request is written).
pub fn to_jsonl(reqs: &[Request]) -> String {
    let mut s = String::new();
    for r in reqs {
        let mut obj = Map::new();
        obj.insert("id".into(), Value::from(r.id.clone()));
        if let Some(sess) = &r.session {
            obj.insert("session".into(), Value::from(sess.clone()));
        }
        obj.insert("arrival_ms".into(), Value::from(r.arrival_ms));
        obj.insert("prompt".into(), Value::from(r.prompt.clone()));
        obj.insert("output".into(), Value::from(r.outputs[0].clone()));
        if !r.salt.is_empty() {
            obj.insert("salt".into(), Value::from(r.salt.clone()));
        }
        if r.lora != 0 {
            obj.insert("lora".into(), Value::from(r.lora));
        }
        s.push_str(&Value::Object(obj).to_string());
        s.push('\n');
    }
    s
}
