//! The runner's signed lines (crates/protocol exit_line.rs): the exit line, the servers line (the
//! same shape) and the definitions line.
//!
//! - a line that verifies with key A, signed again, verifies again with A to the same content,
//!   and never with key B;
//! - any content the reader takes, signed with A, verifies with A to that content (made to fit)
//!   and never with B, and the signed line is within the bound;
//! - a signed line with one byte changed never verifies to other content.
#![no_main]

use libfuzzer_sys::fuzz_target;
use protocol::exit_line::{self, Definitions, ExitLine, MAX_LINE};

const KEY_A: &[u8] = b"key-a-0123456789abcdef0123456789";
const KEY_B: &[u8] = b"key-b-0123456789abcdef0123456789";

/// `line` with the byte at `at` changed by `by` (wrapping), when it has one.
fn bent(line: &str, at: usize, by: u8) -> Option<String> {
    let mut bytes = line.as_bytes().to_vec();
    if bytes.is_empty() || by == 0 {
        return None;
    }
    let i = at % bytes.len();
    bytes[i] = bytes[i].wrapping_add(by);
    String::from_utf8(bytes).ok()
}

fn exit_lines(text: &str, at: usize, by: u8) {
    if let Some(line) = exit_line::verify(text, KEY_A) {
        assert!(
            exit_line::verify(text, KEY_B).is_none(),
            "verified with the other key"
        );
        let again = exit_line::sign(&line, KEY_A).unwrap();
        assert_eq!(exit_line::verify(&again, KEY_A), Some(line));
    }
    let Ok(line) = serde_json::from_str::<ExitLine>(text) else {
        return;
    };
    let signed = exit_line::sign(&line, KEY_A).unwrap();
    assert!(signed.len() <= MAX_LINE, "a signed line past the bound");
    let mut fitted = line.clone();
    fitted.fit();
    assert_eq!(exit_line::verify(&signed, KEY_A), Some(fitted.clone()));
    assert!(
        exit_line::verify(&signed, KEY_B).is_none(),
        "verified with the other key"
    );
    if let Some(other) = bent(&signed, at, by) {
        // A change that leaves the content as it was (a hex digit's case in the HMAC) may pass.
        if let Some(read) = exit_line::verify(&other, KEY_A) {
            assert_eq!(read, fitted, "a changed line verified to other content");
        }
    }
}

fn definitions(text: &str, at: usize, by: u8) {
    if let Some(d) = Definitions::verify(text, KEY_A) {
        assert!(
            Definitions::verify(text, KEY_B).is_none(),
            "verified with the other key"
        );
        let again = d.clone().sign(KEY_A).unwrap();
        assert_eq!(Definitions::verify(&again, KEY_A), Some(d));
    }
    let Ok(d) = serde_json::from_str::<Definitions>(text) else {
        return;
    };
    let signed = d.clone().sign(KEY_A).unwrap();
    assert!(
        signed.len() <= MAX_LINE + 1024,
        "a signed definitions line past the bound"
    );
    assert!(
        Definitions::verify(&signed, KEY_B).is_none(),
        "verified with the other key"
    );
    let read = Definitions::verify(&signed, KEY_A);
    if d.event == exit_line::DEFINITIONS_EVENT {
        let read = read.expect("a signed definitions line verifies");
        // As many tools as fit are kept, each as it was.
        assert!(read.tools.iter().all(|(k, v)| d.tools.get(k) == Some(v)));
        assert_eq!((read.job_id, read.server), (d.job_id, d.server));
        if let Some(other) = bent(&signed, at, by) {
            if let Some(read_other) = Definitions::verify(&other, KEY_A) {
                assert!(
                    read_other
                        .tools
                        .iter()
                        .all(|(k, v)| d.tools.get(k) == Some(v))
                );
            }
        }
    } else {
        assert!(
            read.is_none(),
            "a line of another event passed for definitions"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&head, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let at = usize::from(head) * 7;
    let by = head | 1;
    exit_lines(text, at, by);
    definitions(text, at, by);
});
