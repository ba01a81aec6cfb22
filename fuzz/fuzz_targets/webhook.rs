//! GitHub's and GitLab's deliveries (crates/receiver github.rs, gitlab.rs, payload.rs,
//! signature.rs): the first byte picks the forge and the event header; a delivery id line, then
//! the body.
//!
//! - a delivery is read or refused, the refusal naming a place in the payload, never a planted
//!   value; an event read is of its forge and delivery, and names what the forge's grammar allows;
//! - the matching triggers give jobs whose ids carry the forge and the delivery;
//! - a body's own signature passes; the same signature over a changed body, or another secret's,
//!   never does; GitLab's token passes only when it is the very secret.
#![no_main]

use libfuzzer_sys::fuzz_target;
use protocol::forge_event::Forge;
use receiver::payload::Parsed;
use receiver::signature::{github_signature, github_signature_ok, gitlab_token_ok};
use receiver::{github, gitlab, matching};
use serde_json::Value;

const SECRET: &[u8] = b"It's a Secret to Everybody";
const OTHER: &[u8] = b"It's a Secret to Somebody";
const CANARY: &str = "CANARY";

const GITHUB: [&str; 5] = ["issues", "pull_request", "issue_comment", "ping", "push"];
const GITLAB: [&str; 5] = [
    "Issue Hook",
    "Merge Request Hook",
    "Note Hook",
    "Confidential Note Hook",
    "Pipeline Hook",
];

const TRIGGERS: &str = r#"{"triggers": [
  {"on": {"type": "label", "any": ["docs"]}, "run": {"kind": "github", "flow": "answer"}},
  {"on": {"type": "label", "all": ["docs", "bug"], "none": ["wontfix"]}, "run": {"kind": "github", "flow": "fix", "sameIssue": "cancel-older"}},
  {"on": {"type": "comment", "phrase": "/pi answer"}, "run": {"kind": "github", "flow": "answer"}},
  {"on": {"type": "issue", "action": "opened"}, "run": {"kind": "gitlab", "flow": "answer"}},
  {"on": {"type": "pull_request", "action": "opened"}, "run": {"kind": "github", "flow": "answer"}},
  {"on": {"type": "comment", "phrase": "/pi fix"}, "run": {"kind": "gitlab", "flow": "fix"}},
  {"on": {"type": "label", "any": ["docs"]}, "run": {"kind": "gitlab", "flow": "answer"}}
]}"#;

/// Whether no key of the body holds the canary.
fn in_values_only(v: &Value) -> bool {
    match v {
        Value::Object(o) => o
            .iter()
            .all(|(k, v)| !k.contains(CANARY) && in_values_only(v)),
        Value::Array(items) => items.iter().all(in_values_only),
        _ => true,
    }
}

fn signatures(body: &[u8], at: usize) {
    let signature = github_signature(SECRET, body);
    assert!(github_signature_ok(SECRET, body, &signature));
    assert!(!github_signature_ok(OTHER, body, &signature));
    let mut changed = body.to_vec();
    if changed.is_empty() {
        changed.push(b'{');
    } else {
        let i = at % changed.len();
        changed[i] ^= 0x20;
    }
    assert!(!github_signature_ok(SECRET, &changed, &signature));
    let mut cut = body.to_vec();
    cut.pop();
    assert!(body.is_empty() || !github_signature_ok(SECRET, &cut, &signature));
    assert!(gitlab_token_ok(SECRET, SECRET));
    assert_eq!(gitlab_token_ok(SECRET, body), body == SECRET);
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let (delivery, body) = match rest.iter().position(|b| *b == b'\n') {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => (&b"d-1"[..], rest),
    };
    let delivery = String::from_utf8_lossy(delivery);
    signatures(body, usize::from(pick));
    let forge = if pick & 1 == 0 {
        Forge::Github
    } else {
        Forge::Gitlab
    };
    let which = usize::from(pick >> 1) % 5;
    let parsed = match forge {
        Forge::Github => github::parse(GITHUB[which], &delivery, body),
        Forge::Gitlab => gitlab::parse(GITLAB[which], &delivery, body),
    };
    let values_only = serde_json::from_slice::<Value>(body)
        .map(|v| in_values_only(&v))
        .unwrap_or(true);
    let said = match &parsed {
        Err(e) => e.to_string(),
        Ok(Parsed::Ignored(why)) => why.clone(),
        Ok(_) => String::new(),
    };
    if values_only && !delivery.contains(CANARY) {
        assert!(
            !said.contains(CANARY),
            "a refusal repeats a value: {said:?}"
        );
    }
    let Ok(Parsed::Event(event)) = parsed else {
        return;
    };
    assert_eq!(event.forge, forge);
    assert_eq!(event.delivery, delivery);
    assert!(protocol::forge_names::check(&event).is_ok());
    let triggers = config::triggers::parse_triggers(TRIGGERS.as_bytes()).unwrap();
    let prefix = match forge {
        Forge::Github => "gh-",
        Forge::Gitlab => "gl-",
    };
    for job in matching::jobs_for(&triggers, &event) {
        assert!(job.id.starts_with(&format!("{prefix}{delivery}-t")));
    }
    let _ = matching::queued(&triggers, &event);
});
