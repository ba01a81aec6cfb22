//! The strict JSON reader and the canonical form of pinned tool definitions (crates/protocol
//! json.rs, pins.rs):
//!
//! - canonical form is strict JSON and a fixed point: canonical(canonical(x)) == canonical(x);
//! - what the reader accepts, written back pretty, reads back as the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use protocol::json;
use protocol::pins::canonical;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(value) = json::parse(text) else {
        return;
    };
    let once = canonical(&value);
    let again = json::parse(&once).expect("canonical form is strict JSON");
    assert_eq!(canonical(&again), once, "canonical form is a fixed point");
    let pretty = json::parse(&json::to_pretty(&value)).expect("pretty form is strict JSON");
    assert_eq!(pretty, value, "pretty form reads back as the value");
});
