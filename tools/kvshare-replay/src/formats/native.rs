//! The replay's own JSON Lines trace format (`native`: token ids, see the replay's documentation
//! of trace formats), and whole traces in any format: [`parse_trace`] parses a whole text
//! (tests, small traces); [`super::super::source`] streams a file, checking every line before
//! anything runs: a bad line is refused with its line number and the reason, and nothing is
//! half-applied.

use serde_json::{Map, Value};

use super::super::trace::{Request, TraceError};
use super::{kind, LineReader, TraceFormat};

fn opt_string(obj: &Map<String, Value>, field: &str) -> Result<Option<String>, String> {
    match obj.get(field) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(format!(
            "field `{field}` must be a string, found {}",
            kind(v)
        )),
    }
}

fn tokens(obj: &Map<String, Value>, field: &str) -> Result<Vec<i32>, String> {
    let arr = match obj.get(field) {
        None => return Err(format!("missing field `{field}`")),
        Some(Value::Array(a)) => a,
        Some(v) => {
            return Err(format!(
                "field `{field}` must be an array of token ids, found {}",
                kind(v)
            ))
        }
    };
    let mut out = Vec::with_capacity(arr.len());
    for (i, v) in arr.iter().enumerate() {
        let t = match v {
            Value::Number(n) => {
                if let Some(x) = n.as_i64() {
                    x
                } else if n.as_u64().is_some() {
                    i64::MAX
                } else {
                    return Err(format!(
                        "field `{field}`: element {i} is {n}, not an integer token id"
                    ));
                }
            }
            v => {
                return Err(format!(
                    "field `{field}`: element {i} is {}, not a token id",
                    kind(v)
                ))
            }
        };
        if t < 0 {
            return Err(format!(
                "field `{field}`: element {i} is {t}; token ids must be non-negative \
                 (kvshare reserves negative ids for placeholders)"
            ));
        }
        if t > i32::MAX as i64 {
            return Err(format!(
                "field `{field}`: element {i} is {v}, larger than the int32 maximum {}",
                i32::MAX
            ));
        }
        out.push(t as i32);
    }
    Ok(out)
}

/// Parses one native line (already known to be non-blank) into a request; `prev_arrival` is the
/// previous request's arrival, used when `arrival_ms` is absent and to check the order.
pub(super) fn parse_native_line(
    text: &str,
    line: usize,
    prev_arrival: f64,
) -> Result<Request, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let Value::Object(obj) = v else {
        return Err(format!("expected a JSON object, found {}", kind(&v)));
    };
    let id = match obj.get("id") {
        None => return Err("missing field `id`".into()),
        Some(Value::String(s)) if s.is_empty() => return Err("field `id` is empty".into()),
        Some(Value::String(s)) => s.clone(),
        Some(v) => return Err(format!("field `id` must be a string, found {}", kind(v))),
    };
    let session = opt_string(&obj, "session")?;
    let arrival_ms = match obj.get("arrival_ms") {
        None => prev_arrival,
        Some(Value::Number(n)) => {
            let a = n.as_f64().unwrap_or(f64::NAN);
            if !a.is_finite() || a < 0.0 {
                return Err(format!(
                    "field `arrival_ms` is {n}; it must be a finite number >= 0"
                ));
            }
            if a < prev_arrival {
                return Err(format!(
                    "field `arrival_ms` is {n}, earlier than the previous request's {prev_arrival}; \
                     lines must be in arrival order"
                ));
            }
            a
        }
        Some(v) => {
            return Err(format!(
                "field `arrival_ms` must be a number, found {}",
                kind(v)
            ))
        }
    };
    let prompt = tokens(&obj, "prompt")?;
    if prompt.is_empty() {
        return Err("field `prompt` is empty; a request needs at least one prompt token".into());
    }
    let output = tokens(&obj, "output")?;
    let salt = opt_string(&obj, "salt")?.unwrap_or_default();
    let lora = match obj.get("lora") {
        None => 0,
        Some(Value::Number(n)) => n.as_u64().ok_or_else(|| {
            format!("field `lora` is {n}; it must be a non-negative integer adapter id")
        })?,
        Some(v) => {
            return Err(format!(
                "field `lora` must be an integer, found {}",
                kind(v)
            ))
        }
    };
    Ok(Request {
        id,
        session,
        arrival_ms,
        prompt,
        outputs: vec![output],
        salt,
        lora,
        line,
    })
}

/// Parses a whole native JSON Lines trace. Blank lines are skipped; fields not in the format are
/// ignored. On failure, returns every refused line (in order).
pub fn parse_trace(text: &str) -> Result<Vec<Request>, Vec<TraceError>> {
    parse_trace_as(text, TraceFormat::Native)
}

/// Parses a whole trace in `format` (see [`crate::formats`]).
pub fn parse_trace_as(text: &str, format: TraceFormat) -> Result<Vec<Request>, Vec<TraceError>> {
    let mut reader = LineReader::new(format);
    let mut reqs = Vec::new();
    let mut errors = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        match reader.read(line, raw) {
            Ok(Some(r)) => reqs.push(r.into_request()),
            Ok(None) => {}
            Err(reason) => errors.push(TraceError { line, reason }),
        }
    }
    if errors.is_empty() && reqs.is_empty() {
        errors.push(TraceError {
            line: 0,
            reason: "the trace has no requests".into(),
        });
    }
    if errors.is_empty() {
        Ok(reqs)
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::to_jsonl;

    fn err(text: &str) -> TraceError {
        parse_trace(text).unwrap_err().remove(0)
    }

    #[test]
    fn good_trace_round_trips() {
        let t = "{\"id\":\"a\",\"session\":\"s\",\"arrival_ms\":1.5,\"prompt\":[1,2],\"output\":[3],\"salt\":\"x\",\"lora\":2}\n\n{\"id\":\"b\",\"prompt\":[1],\"output\":[],\"extra\":true}\n";
        let r = parse_trace(t).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].session.as_deref(), Some("s"));
        assert_eq!((r[0].salt.as_str(), r[0].lora, r[0].line), ("x", 2, 1));
        assert_eq!(r[1].arrival_ms, 1.5, "absent arrival = previous one");
        assert_eq!(r[1].line, 3);
        assert_eq!(parse_trace(&to_jsonl(&r)).unwrap()[0], r[0]);
    }

    #[test]
    fn bad_lines_are_named() {
        let ok = "{\"id\":\"a\",\"prompt\":[1],\"output\":[2]}\n";
        let e = err(&format!(
            "{ok}{{\"id\":\"b\",\"prompt\":[1,-4],\"output\":[]}}"
        ));
        assert_eq!(e.line, 2);
        assert!(e.reason.contains("element 1 is -4"), "{e}");
        assert!(err("{\"id\":\"a\",\"output\":[]}")
            .reason
            .contains("missing field `prompt`"));
        assert!(err("{\"prompt\":[1],\"output\":[]}")
            .reason
            .contains("missing field `id`"));
        assert!(err("{\"id\":\"a\",\"prompt\":[1]}")
            .reason
            .contains("missing field `output`"));
        assert!(err("{\"id\":\"a\",\"prompt\":[1],")
            .reason
            .contains("not valid JSON"));
        assert!(err("[1]").reason.contains("expected a JSON object"));
        assert!(err("{\"id\":7,\"prompt\":[1],\"output\":[]}")
            .reason
            .contains("`id` must be a string"));
        assert!(err("{\"id\":\"a\",\"prompt\":[1.5],\"output\":[]}")
            .reason
            .contains("not an integer"));
        assert!(err("{\"id\":\"a\",\"prompt\":[2147483648],\"output\":[]}")
            .reason
            .contains("int32"));
        assert!(err("{\"id\":\"a\",\"prompt\":[],\"output\":[]}")
            .reason
            .contains("empty"));
        let e = err(&format!("{ok}{ok}"));
        assert_eq!(e.line, 2);
        assert!(e
            .reason
            .contains("duplicate id \"a\" (first used on line 1)"));
        let e = err("{\"id\":\"a\",\"arrival_ms\":5,\"prompt\":[1],\"output\":[]}\n{\"id\":\"b\",\"arrival_ms\":4,\"prompt\":[1],\"output\":[]}");
        assert!(e.reason.contains("arrival order"), "{e}");
        assert_eq!(err("\n\n").reason, "the trace has no requests");
        let all = parse_trace("x\n{\"id\":\"a\",\"prompt\":[1],\"output\":[]}\ny").unwrap_err();
        assert_eq!(all.iter().map(|e| e.line).collect::<Vec<_>>(), vec![1, 3]);
    }
}
