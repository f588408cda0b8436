//! Small excerpts in each public format, generated (never downloaded): realistic shapes at a
//! chosen size, for tests, measurements and examples.

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
