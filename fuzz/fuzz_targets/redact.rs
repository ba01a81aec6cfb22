//! The redaction of transcripts (crates/worker transcript.rs): whatever the secrets and the text,
//! no secret's value (nor its JSON-escaped form) is left visible in the redacted text, the
//! `[redacted:NAME]` marker included (the cases fixed in b3d028b stay fixed). Parts are cut at
//! 0xFF bytes: the text, then names and values of the secrets; each value is also planted in the
//! text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use worker::transcript::{MIN_REDACTED, Redactor};

fuzz_target!(|data: &[u8]| {
    let mut parts = data.split(|b| *b == 0xFF).map(String::from_utf8_lossy);
    let Some(text) = parts.next() else {
        return;
    };
    let mut secrets = Vec::new();
    while let (Some(name), Some(value)) = (parts.next(), parts.next()) {
        secrets.push((name.into_owned(), value.into_owned()));
    }
    let redactor = Redactor::new(secrets.iter().map(|(n, v)| (n.as_str(), v.as_str())));
    let mut planted = text.to_string();
    for (i, (_, value)) in secrets.iter().enumerate() {
        let at = (i * 7919) % (planted.len() + 1);
        let at = (0..=at)
            .rev()
            .find(|i| planted.is_char_boundary(*i))
            .unwrap_or(0);
        planted.insert_str(at, value);
    }
    for input in [text.as_ref(), planted.as_str()] {
        let out = redactor.redact(input);
        for (name, value) in &secrets {
            if value.len() < MIN_REDACTED {
                continue;
            }
            assert!(
                !out.contains(value.as_str()),
                "{name}'s value is left in {out:?}"
            );
            let json = serde_json::to_string(value).unwrap();
            let escaped = &json[1..json.len() - 1];
            assert!(
                !out.contains(escaped),
                "{name}'s escaped value is left in {out:?}"
            );
        }
    }
});
