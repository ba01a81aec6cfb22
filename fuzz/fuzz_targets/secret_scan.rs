//! The search of what a `fix` job publishes for the values it was given (crates/forge scan.rs):
//! a value planted in the bytes, as it is or encoded (base64 standard and URL-safe at any
//! alignment, with or without padding; percent-encoding of the reserved bytes or of all, in
//! either case of letters; hex in either case), is always found, whole or fed in pieces of any
//! size.
#![no_main]

use base64::Engine as _;
use forge::scan::{MIN_VALUE, Needles};
use libfuzzer_sys::fuzz_target;

const VARIABLE: &str = "GH_TOKEN";

fn percent(value: &[u8], all: bool, lower: bool) -> Vec<u8> {
    let unreserved = |b: u8| b.is_ascii_alphanumeric() || b"-._~".contains(&b);
    let mut out = String::new();
    for &b in value {
        if !all && unreserved(b) {
            out.push(char::from(b));
        } else if lower {
            out.push_str(&format!("%{b:02x}"));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out.into_bytes()
}

/// `value` planted in the form `form` picks, between `before` and `after` (the encodings cover
/// them too, as a file's encoded content would).
fn plant(form: u8, before: &[u8], value: &[u8], after: &[u8]) -> Vec<u8> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    let mut whole = before.to_vec();
    whole.extend_from_slice(value);
    whole.extend_from_slice(after);
    match form % 9 {
        0 => whole,
        1 => STANDARD.encode(&whole).into_bytes(),
        2 => URL_SAFE.encode(&whole).into_bytes(),
        3 => STANDARD_NO_PAD.encode(&whole).into_bytes(),
        4 => URL_SAFE_NO_PAD.encode(&whole).into_bytes(),
        5 | 6 => {
            let mut out = before.to_vec();
            out.extend(percent(value, form % 9 == 6, form & 0x80 != 0));
            out.extend_from_slice(after);
            out
        }
        _ => {
            let mut hex = protocol::ids::hex(value);
            if form % 9 == 8 {
                hex = hex.to_ascii_uppercase();
            }
            let mut out = before.to_vec();
            out.extend(hex.into_bytes());
            out.extend_from_slice(after);
            out
        }
    }
}

fuzz_target!(|data: &[u8]| {
    // form, value length, piece size, then the value and the bytes around it.
    let [form, length, piece, rest @ ..] = data else {
        return;
    };
    let length = usize::from(*length).min(rest.len());
    let Ok(value) = std::str::from_utf8(&rest[..length]) else {
        return;
    };
    if value.len() < MIN_VALUE {
        return;
    }
    let around = &rest[length..];
    let (before, after) = around.split_at(around.len() / 2);
    let needles = Needles::new([
        ("SHORT", "abc"),
        (VARIABLE, value),
        ("OTHER", "zzzzzzzzzzzzzzz"),
    ]);
    let planted = plant(*form, before, value.as_bytes(), after);
    let found = needles.find(&planted).expect("a planted value is found");
    assert!([VARIABLE, "OTHER"].contains(&found.variable.as_str()));
    let mut stream = needles.stream();
    for chunk in planted.chunks(usize::from(*piece).max(1)) {
        stream.feed(chunk);
    }
    assert!(
        stream.found().is_some(),
        "a planted value fed in pieces is missed"
    );
});
