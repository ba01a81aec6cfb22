//! The hub's JSON-RPC framing on both sides (crates/hub raw.rs, endpoint.rs, rpc.rs): the first
//! byte picks the side, a server's standard output or the lines pi's relay sends; then the line
//! limit, the sizes of the pieces the peer writes in, and the bytes.
//!
//! - lines are read as the bytes say, whatever the pieces: each whole up to the limit (its CR
//!   dropped), a longer one dropped with the id at its top level, the one JSON would read;
//! - a message read keeps its bytes: given another id it reads back with that id and everything
//!   else as it was; it is never both a request and an answer;
//! - a server's message passed on to pi (as a stream's event, or as one line) is the same JSON;
//!   a tools list kept by name keeps only those, each as written;
//! - whatever pi's relay sends, what the hub answers at once is one valid JSON-RPC error answer;
//!   pi's request as the server gets it carries the hub's id and progress token, and nothing else
//!   changed.
#![no_main]

use hub::fuzz::{self, Envelope, Line};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// The lines `data` holds, as the reader must give them.
fn expected_lines(data: &[u8], max_line: usize) -> Vec<(Vec<u8>, bool)> {
    let mut segments: Vec<&[u8]> = data.split(|b| *b == b'\n').collect();
    if segments.last().is_some_and(|s| s.is_empty()) {
        segments.pop();
    }
    segments
        .into_iter()
        .map(|s| {
            let whole = s.len() <= max_line;
            let s = if whole {
                s.strip_suffix(b"\r").unwrap_or(s)
            } else {
                s
            };
            (s.to_vec(), whole)
        })
        .collect()
}

/// The data of the first event of an event stream, as a browser's EventSource reads it.
fn sse_data(stream: &[u8]) -> Option<Vec<u8>> {
    let mut data: Option<Vec<u8>> = None;
    let text = stream;
    let mut at = 0;
    while at < text.len() {
        let end = text[at..]
            .iter()
            .position(|b| *b == b'\r' || *b == b'\n')
            .map_or(text.len(), |e| at + e);
        let line = &text[at..end];
        at = if text[end..].starts_with(b"\r\n") {
            end + 2
        } else {
            end + 1
        };
        if line.is_empty() {
            return data.map(|mut d| {
                d.pop();
                d
            });
        }
        let (field, value) = match line.iter().position(|b| *b == b':') {
            Some(c) => (
                &line[..c],
                line[c + 1..].strip_prefix(b" ").unwrap_or(&line[c + 1..]),
            ),
            None => (line, &b""[..]),
        };
        if field == b"data" {
            let d = data.get_or_insert_with(Vec::new);
            d.extend_from_slice(value);
            d.push(b'\n');
        }
    }
    None
}

fn json(bytes: &[u8]) -> Option<Value> {
    serde_json::from_slice(bytes).ok()
}

/// Whether `bytes` is JSON text (a number past f64's range included, which `Value` refuses).
fn is_json_text(bytes: &[u8]) -> bool {
    serde_json::from_slice::<&serde_json::value::RawValue>(bytes).is_ok()
}

/// The message given another id reads back with it, and nothing else moved.
fn keeps_its_bytes(line: &[u8], m: &Envelope) {
    assert!(!(m.is_request && m.is_answer));
    if m.id.is_none() {
        return;
    }
    let moved = fuzz::with_id(line, b"4242").unwrap();
    let again = fuzz::message(&moved).expect("a message with a new id reads");
    assert_eq!(again.numeric_id, Some(4242));
    assert_eq!(
        (&again.method, &again.params, &again.result, &again.error),
        (&m.method, &m.params, &m.result, &m.error)
    );
}

fn server_side(line: &[u8]) {
    let Some(m) = fuzz::message(line) else {
        return;
    };
    keeps_its_bytes(line, &m);
    // The envelope's reader does not look into the members it skips: bytes that are no UTF-8,
    // or control characters inside a string, pass on there as they came. A number past f64's
    // range is JSON, which serde_json's `Value` does not hold.
    let Some(value) = json(line) else {
        assert!(
            is_json_text(line)
                || std::str::from_utf8(line).is_err()
                || line.iter().any(|b| *b < 0x20),
            "a message that is no JSON"
        );
        return;
    };
    let event = fuzz::event(line);
    let data = sse_data(&event).expect("an event with data");
    assert_eq!(
        json(&data),
        Some(value.clone()),
        "the event is not the message"
    );
    let one = fuzz::one_line(line);
    assert!(!one.contains(&b'\n') && !one.contains(&b'\r'));
    assert_eq!(json(&one), Some(value), "the line is not the message");
    if let Some(params) = &m.params {
        let (token, _) = fuzz::server_notification(params);
        assert!(token.is_none_or(|(s, e)| s <= e && e <= params.len()));
    }
    if let Some(result) = &m.result {
        let keep = |name: &str| name.len() % 2 == 0;
        let (_, _, kept, version) = fuzz::server_result(result, keep);
        if let Some(((s, e), list)) = kept {
            assert!(s <= e && e <= result.len());
            let list: Vec<Value> = serde_json::from_slice(&list).expect("the kept list is JSON");
            assert!(
                list.iter()
                    .all(|t| t.get("name").and_then(Value::as_str).is_some_and(keep))
            );
        }
        assert!(version.is_none_or(|(_, (s, e))| s <= e && e <= result.len()));
    }
}

fn pi_side(line: Line) {
    match fuzz::pi_line(line) {
        Err(None) => {}
        Err(Some(answer)) => {
            assert!(
                json(&answer).is_some(),
                "the hub answered pi with no JSON: {answer:?}"
            );
            let m = fuzz::message(&answer).expect("an answer the hub writes is a message");
            assert!(m.is_answer && m.error.is_some());
        }
        Ok(m) => {
            keeps_its_bytes(&m.bytes, &m);
            let Some((request, token)) = fuzz::upstream_request(&m.bytes, "77") else {
                return;
            };
            let sent = fuzz::message(&request).expect("the request the server gets reads");
            assert_eq!(
                (&sent.method, sent.id.is_some()),
                (&m.method, m.id.is_some())
            );
            if m.id.is_some() {
                assert_eq!(sent.numeric_id, Some(77));
            }
            if token.is_some() {
                let (_, at) = fuzz::request_params(sent.params.as_deref()).unwrap();
                let (s, e) = at.expect("the token is still there");
                assert_eq!(&sent.params.as_deref().unwrap()[s..e], b"77");
            }
            if let Some(id) = &m.id {
                // Under pi's id as pi wrote it: JSON when the id was.
                let refusal = fuzz::error_answer(id, -32600, "the session is not initialized");
                assert!(!is_json_text(id) || is_json_text(&refusal));
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let [side, limit, a, b, bytes @ ..] = data else {
        return;
    };
    let max_line = 16 + usize::from(*limit) * 16;
    let pieces = [usize::from(*a), usize::from(*b) * 64];
    let lines = fuzz::lines(bytes, &pieces, max_line);
    let expected = expected_lines(bytes, max_line);
    assert_eq!(lines.len(), expected.len(), "lines read otherwise");
    for (line, (text, whole)) in lines.into_iter().zip(expected) {
        match &line {
            Line::Whole(got) => assert!(whole && *got == text, "a line read otherwise"),
            Line::TooLong(id) => {
                assert!(!whole, "a line within the limit dropped");
                // The id JSON reads at the top level (a string or a number), where the line is
                // plain enough to tell.
                let plain = !text.iter().any(|b| *b == b'\\' || b.is_ascii_whitespace());
                if let Some(want) = fuzz::message(&text)
                    .and_then(|m| m.id)
                    .filter(|i| plain && i.len() < 60)
                    .filter(|i| json(i).is_some_and(|v| v.is_string() || v.is_number()))
                {
                    assert_eq!(id.as_ref(), Some(&want), "the scanner found another id");
                }
            }
        }
        if side & 1 == 0 {
            if let Line::Whole(text) = &line {
                server_side(text);
            }
        } else {
            pi_side(line);
        }
    }
});
