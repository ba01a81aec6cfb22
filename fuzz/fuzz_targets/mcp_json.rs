//! The overlay's `mcp.json` (crates/config mcp.rs), as the admission and `mcp check` read it:
//!
//! - a refusal of the file and every problem of an entry name a field, never a planted value
//!   (the url problems that write the url back as a hint, or name a query parameter, aside);
//! - the file written back pretty reads the same (the verdicts do not depend on layout);
//! - judging only the named entries gives, for those, what judging all of them gives.
#![no_main]

#[path = "../common/canary.rs"]
mod canary;

use config::mcp::{parse_overlay, parse_overlay_named};
use libfuzzer_sys::fuzz_target;
use protocol::json;

fuzz_target!(|data: &[u8]| {
    let document = std::str::from_utf8(data)
        .ok()
        .and_then(|t| json::parse(t).ok());
    let read = parse_overlay(data);
    match &read {
        Err(e) => {
            if document.is_some() || e.code() != "duplicate-key" {
                canary::assert_not_shown(document.as_ref(), &e.to_string());
            }
        }
        Ok(overlay) => {
            for entry in &overlay.servers {
                // These write the url back as it would read (a hint, by design: its scheme, host,
                // port, path and references, never credentials), or name a query parameter.
                let hints = [
                    "url-credentials",
                    "url-fragment",
                    "url-not-plain",
                    "url-query-literal",
                ];
                for p in entry
                    .problems()
                    .iter()
                    .filter(|p| !hints.contains(&p.code.as_str()))
                {
                    canary::assert_not_shown(document.as_ref(), &p.to_string());
                }
            }
        }
    }
    let Some(document) = document else {
        return;
    };
    let pretty = json::to_pretty(&document);
    assert_eq!(
        parse_overlay(pretty.as_bytes()),
        read,
        "the layout changed the verdict"
    );
    if let Ok(overlay) = &read {
        let names: Vec<&str> = overlay.servers.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(parse_overlay_named(data, &names).as_ref(), Ok(overlay));
        if let Some(first) = names.first() {
            let one = parse_overlay_named(data, &[first]).unwrap();
            assert_eq!(one.servers.first(), overlay.servers.first());
        }
    }
});
