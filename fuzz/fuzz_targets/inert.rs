//! What the bot posts, made inert (crates/forge inert.rs), and what a stranger wrote as it goes
//! into the prompt:
//!
//! - no line of the posted text starts (after spaces and tabs) with `/`, holds `<!--`, or has a
//!   mass mention (`@all`, `@here`, `@channel`, `@everyone`, `@org/team`) still live, and it never
//!   passes for the worker's own mark;
//! - making it inert again changes nothing (a fixed point), and it grows by a bounded amount;
//! - the prompt's text has no control character but LF and tab, no invisible character that
//!   reorders or hides text, and is a fixed point too.
#![no_main]

use forge::inert::{markdown, prompt_text};
use libfuzzer_sys::fuzz_target;

const EVERYONE: [&str; 4] = ["all", "here", "channel", "everyone"];

fn is_name(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

/// Whether `line` has a live mass mention: `@` after no name character, then a word for
/// everyone, or a team (`@org/…`).
fn mass_mention(line: &str) -> bool {
    let mut previous: Option<char> = None;
    for (at, c) in line.char_indices() {
        if c == '@' && !previous.is_some_and(is_name) {
            let after = &line[at + 1..];
            let name: String = after.chars().take_while(|c| is_name(*c)).collect();
            let team = !name.is_empty() && after[name.len()..].starts_with('/');
            if team || EVERYONE.contains(&name.to_ascii_lowercase().as_str()) {
                return true;
            }
        }
        previous = Some(c);
    }
    false
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let inert = markdown(&text);
    for line in inert.split(['\r', '\n']) {
        assert!(
            !line.trim_start_matches([' ', '\t']).starts_with('/'),
            "a line starts a command: {line:?}"
        );
        assert!(!line.contains("<!--"), "a hidden comment is left");
        assert!(!mass_mention(line), "a mass mention is live: {line:?}");
    }
    assert!(!protocol::forge_event::is_worker_comment(&inert));
    assert_eq!(markdown(&inert), inert, "inert text is not a fixed point");
    assert!(
        inert.len() <= 4 * text.len() + 4,
        "inert text grew past its bound"
    );
    let prompt = prompt_text(&text);
    for c in prompt.chars() {
        let hidden = matches!(c,
            '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}');
        assert!(!hidden, "an invisible character reached the prompt");
        assert!(
            !c.is_control() || c == '\n' || c == '\t',
            "a control character reached the prompt"
        );
    }
    assert_eq!(
        prompt_text(&prompt),
        prompt,
        "the prompt's text is not a fixed point"
    );
});
