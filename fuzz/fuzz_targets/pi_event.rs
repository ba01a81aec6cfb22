//! pi's JSON events (crates/protocol pi_events.rs), one a line, read as the runner and the worker
//! read them (`PiEvents`), as the panel reads them (`PiLine`), and as an overlong line is read
//! from its head and tail.
//!
//! - what pi spent never goes down as more lines come (tokens, turns, answers);
//! - the last answer's text stays within `MAX_FINAL_MESSAGE`, the tool name within its bound,
//!   the provider and model are short words;
//! - pi's claim never passes when pi exited with a failure, and its cause never repeats the
//!   provider's text (a planted canary).
#![no_main]

use libfuzzer_sys::fuzz_target;
use protocol::exit_line::MAX_FINAL_MESSAGE;
use protocol::pi_events::{MAX_TOOL_NAME, PiEvent, PiEvents, PiLine};

const CANARY: &str = "CANARY";

fn spent(e: &PiEvents) -> [u64; 5] {
    let u = &e.usage;
    [
        u.turns,
        u.input_tokens,
        u.output_tokens,
        u.total_tokens,
        e.answers(),
    ]
}

fn words_only(s: &Option<String>) {
    if let Some(s) = s {
        assert!(s.len() <= 128);
        assert!(
            s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_./:@".contains(&b))
        );
    }
}

fn check(events: &PiEvents) {
    let (text, _) = events.final_text();
    assert!(
        text.len() <= MAX_FINAL_MESSAGE,
        "the final text past its bound"
    );
    words_only(&events.usage.provider);
    words_only(&events.usage.model);
    assert!(
        events.verdict(false).is_err(),
        "pi's claim passed after a failed exit"
    );
    for exited in [true, false] {
        if let Err((_, cause)) = events.verdict(exited) {
            assert!(
                !cause.contains(CANARY),
                "the cause repeats the provider's text"
            );
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut events = PiEvents::default();
    let mut before = spent(&events);
    for line in text.split('\n') {
        if let Some(PiEvent::ToolStart { tool: Some(tool) }) = PiEvent::parse(line) {
            assert!(tool.chars().count() <= MAX_TOOL_NAME);
        }
        let _ = PiLine::parse(line);
        events.observe(line);
        let now = spent(&events);
        assert!(
            now.iter().zip(before).all(|(n, b)| *n >= b),
            "what pi spent went down"
        );
        before = now;
        check(&events);
    }
    // The same bytes as one overlong line: its head and its tail.
    let cut = data.len() / 2;
    let mut overlong = events.clone();
    let _ = overlong.observe_overlong(&data[..cut], &data[cut..]);
    assert!(spent(&overlong).iter().zip(before).all(|(n, b)| *n >= b));
    check(&overlong);
});
