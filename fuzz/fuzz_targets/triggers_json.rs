//! The operator's `triggers.json` (crates/config triggers.rs), as the worker, the receiver and
//! `triggers check` read it:
//!
//! - a refusal names where and why, never a planted value;
//! - the file written back pretty reads the same;
//! - every trigger of a file taken makes a job, and its cron pattern (if any) is one the
//!   scheduler reads.
#![no_main]

#[path = "../common/canary.rs"]
mod canary;

use config::triggers::{On, parse_triggers};
use libfuzzer_sys::fuzz_target;
use protocol::json;

fuzz_target!(|data: &[u8]| {
    let document = std::str::from_utf8(data)
        .ok()
        .and_then(|t| json::parse(t).ok());
    let read = parse_triggers(data);
    match &read {
        Err(e) => {
            if document.is_some() || e.code() != "duplicate-key" {
                canary::assert_not_shown(document.as_ref(), &e.to_string());
            }
        }
        Ok(triggers) => {
            for t in &triggers.triggers {
                let _ = t.job("job-1");
                if let On::Cron { pattern, .. } = &t.on {
                    assert!(config::triggers::cron_schedule(pattern).is_ok());
                }
            }
        }
    }
    let Some(document) = document else {
        return;
    };
    let pretty = json::to_pretty(&document);
    assert_eq!(
        parse_triggers(pretty.as_bytes()),
        read,
        "the layout changed the verdict"
    );
});
