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
    assert!(
        err(TraceFormat::Azure, "TIME,ContextTokens\n").contains("lacks the column `TIMESTAMP`")
    );
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
