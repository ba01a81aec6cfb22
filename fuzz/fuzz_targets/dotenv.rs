//! The deployment's `.env` (crates/config dotenv.rs):
//!
//! - what it takes, written back one `NAME="value"` a line, reads back the same;
//! - a refusal names the line (and at most the name), never a value: a planted canary in a value
//!   is never repeated, and the line it names is one the text has.
#![no_main]

#[path = "../common/canary.rs"]
mod canary;

use config::dotenv::{DotenvError, parse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse(text) {
        Ok(env) => {
            let mut written = String::new();
            for (name, value) in &env {
                written.push_str(&format!("{name}=\"{value}\"\n"));
            }
            assert_eq!(parse(&written), Ok(env), "written back, it read otherwise");
        }
        Err(e) => {
            let (line, name) = match &e {
                DotenvError::NoEquals { line } | DotenvError::BadName { line } => (*line, None),
                DotenvError::Duplicate { line, name } | DotenvError::Unclosed { line, name } => {
                    (*line, Some(name))
                }
            };
            assert!(
                line >= 1 && line <= text.lines().count(),
                "a line the text has not"
            );
            if name.is_none_or(|n| !n.contains(canary::CANARY)) {
                assert!(
                    !e.to_string().contains(canary::CANARY),
                    "a refusal repeats a value"
                );
            }
        }
    }
});
