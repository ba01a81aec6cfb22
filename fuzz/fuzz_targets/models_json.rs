//! pi's `models.json` as the overlay carries it (crates/config models.rs), checked before it is
//! staged and read for the model gateway:
//!
//! - a refusal names the place, never a planted value (a credential written in the file);
//! - a file taken references only variable names, and holds no `!` command;
//! - the file written back pretty reads the same.
#![no_main]

#[path = "../common/canary.rs"]
mod canary;

use config::models::check;
use libfuzzer_sys::fuzz_target;
use protocol::json;

fuzz_target!(|data: &[u8]| {
    let document = std::str::from_utf8(data)
        .ok()
        .and_then(|t| json::parse(t).ok());
    let read = check(data);
    match &read {
        Err(e) => {
            let duplicate = matches!(
                e,
                config::models::ModelsError::Json(json::JsonError::DuplicateKey { .. })
            );
            if document.is_some() || !duplicate {
                canary::assert_not_shown(document.as_ref(), &e.to_string());
            }
        }
        Ok(models) => {
            for name in &models.references {
                assert!(
                    config::dotenv::is_variable_name(name),
                    "a reference that is no name"
                );
            }
            assert_eq!(models.providers.len(), models.entries.len());
        }
    }
    let Some(document) = document else {
        return;
    };
    let pretty = json::to_pretty(&document);
    assert_eq!(
        check(pretty.as_bytes()),
        read,
        "the layout changed the verdict"
    );
});
