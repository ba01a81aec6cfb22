//! A planted value: a refusal or a problem may name a field (a key is a name), never repeat what
#![allow(dead_code)] // Each target uses what it needs of this.
//! was written in one. The seeds carry `CANARY` in values; the mutator moves it around.

use protocol::json::Json;

pub const CANARY: &str = "CANARY";

/// Whether no key of the document holds the canary (then no message may hold it either).
pub fn in_values_only(value: &Json) -> bool {
    match value {
        Json::Object(o) => o
            .iter()
            .all(|(k, v)| !k.contains(CANARY) && in_values_only(v)),
        Json::Array(items) => items.iter().all(in_values_only),
        _ => true,
    }
}

/// Asserts that `message` does not repeat the canary, when the document held it in values only.
pub fn assert_not_shown(document: Option<&Json>, message: &str) {
    if document.is_none_or(in_values_only) {
        assert!(
            !message.contains(CANARY),
            "a message repeats a value: {message:?}"
        );
    }
}
