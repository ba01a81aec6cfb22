//! The servers' pins, on the worker's side: read from the queue's store for the runner before the
//! job's folder is written, and, once the runner has said what each server listed (on its signed
//! exit line), kept: a server's first listing becomes its pin, drift is noted for the operator
//! (or, under `accept`, becomes the pin), and the record says what differed.
//!
//! On the job's path: in the worker, around the sandbox step: before it (the pins into the
//! runner's input) and after it (the record's pins, the store's pins and drift).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use protocol::pins::{self, Listing, PinPolicy, PinReport, StoredDrift, StoredPin};
use queue::Queue;
use records::record::Draft;

/// Where the pins are: the queue's store, shared by every worker on it.
pub type PinStore = Arc<dyn Queue>;

/// Why the pins could not be read: the store's error, said without its values.
#[derive(Debug)]
pub struct Unreadable(pub String);

/// The pins of `servers` that have one, by server name. A stored pin that no longer reads (written
/// by another version) is as no pin: the server is pinned anew by this job.
pub fn read(
    store: &dyn Queue,
    servers: &[String],
) -> Result<BTreeMap<String, Listing>, Unreadable> {
    let mut pins = BTreeMap::new();
    for server in servers {
        let stored = store
            .pin(server)
            .map_err(|e| Unreadable(format!("the pin of {server}: {e}")))?;
        if let Some(pin) = stored.and_then(|text| serde_json::from_str::<PinListing>(&text).ok()) {
            pins.insert(server.clone(), pin.listing);
        }
    }
    Ok(pins)
}

/// What a job's start needs of a stored pin ([`StoredPin`]): its listing, read without the
/// definitions beside it.
#[derive(serde::Deserialize)]
struct PinListing {
    listing: Listing,
    #[serde(rename = "pinnedAtMs")]
    _pinned_at_ms: u64,
    #[serde(rename = "by")]
    _by: String,
}

/// A write the store is to make once the job has run.
pub enum Write {
    /// The server's pin: its first (only if none yet), under `accept` the one it follows, or an
    /// operator's approval (`mcp pin`, with what differed from the pin it replaces, for the log).
    Pin {
        server: String,
        pin: StoredPin,
        first: bool,
        approved: Option<pins::Comparison>,
    },
    /// What the job saw differ from the server's pin, for the operator to approve.
    Drift { server: String, drift: StoredDrift },
}

/// Holds what each server listed (the runner's report, in `draft`) against the pin the job was
/// given: the record told what differed, and what the store is to keep.
pub fn reckon(
    draft: &mut Draft,
    given: &BTreeMap<String, Listing>,
    policy: PinPolicy,
    now: SystemTime,
) -> Vec<Write> {
    let job_id = draft.job_id().to_owned();
    let mut reports = Vec::new();
    let mut writes = Vec::new();
    for (server, listing) in draft.listings() {
        let comparison = pins::compare(given.get(server), listing);
        let Some(report) = PinReport::of(server, &comparison, policy) else {
            continue;
        };
        reports.push(report);
        let definitions = pins::verified_definitions(listing, &draft.definitions(server));
        let server = server.clone();
        writes.push(if comparison.first_use || policy == PinPolicy::Accept {
            let pin = StoredPin {
                listing: listing.clone(),
                pinned_at_ms: ms(now),
                by: format!("job {job_id}"),
                definitions,
            };
            Write::Pin {
                server,
                pin,
                first: comparison.first_use,
                approved: None,
            }
        } else {
            let drift = StoredDrift {
                job_id: job_id.clone(),
                seen_at_ms: ms(now),
                listing: listing.clone(),
                definitions: drifted_only(definitions, &comparison),
                comparison,
            };
            Write::Drift { server, drift }
        });
    }
    draft.pins_reported(reports);
    writes
}

/// The definitions of the tools that differ from the pin.
fn drifted_only(
    mut definitions: BTreeMap<String, String>,
    comparison: &pins::Comparison,
) -> BTreeMap<String, String> {
    definitions.retain(|tool, _| !comparison.matches(tool));
    definitions
}

/// An operator's approval (`mcp pin`, run by `who`): what each server listed in this run becomes
/// its pin, whatever the pin was, with what differed from it for the log.
pub fn approve(
    draft: &Draft,
    given: &BTreeMap<String, Listing>,
    who: &str,
    now: SystemTime,
) -> Vec<Write> {
    draft
        .listings()
        .iter()
        .map(|(server, listing)| Write::Pin {
            server: server.clone(),
            pin: StoredPin {
                listing: listing.clone(),
                pinned_at_ms: ms(now),
                by: who.to_owned(),
                definitions: pins::verified_definitions(listing, &draft.definitions(server)),
            },
            first: false,
            approved: Some(pins::compare(given.get(server), listing)),
        })
        .collect()
}

/// Makes `writes` in the store (blocking: call it off the async loop). A store that cannot be
/// written loses no job: it is logged, and the server's next job tries again.
pub fn write(store: &dyn Queue, job_id: &str, writes: Vec<Write>, now: SystemTime) {
    for w in writes {
        let (server, result) = match &w {
            Write::Pin {
                server,
                pin,
                first,
                approved,
            } => {
                let text = serde_json::to_string(pin).unwrap_or_default();
                let stored = match store.put_pin(server, &text, *first, now) {
                    // A first pin in place of an entry that does not read as a pin: the job
                    // took the server as unpinned, and pins it anew.
                    Ok(false) if *first && unreadable_pin(store, server) => {
                        store.put_pin(server, &text, false, now)
                    }
                    other => other,
                };
                match (&stored, approved) {
                    (Ok(true), Some(diff)) => log_approval(job_id, server, &pin.by, diff),
                    (Ok(true), None) => {
                        tracing::info!(event = "pin_stored", job_id = %job_id, server = %server,
                            first_use = *first);
                    }
                    _ => {}
                }
                (server, stored.map(|_| ()))
            }
            Write::Drift { server, drift } => {
                let text = serde_json::to_string(drift).unwrap_or_default();
                tracing::warn!(event = "pin_drift", job_id = %job_id, server = %server,
                    tools = drift.comparison.drift.len(), gone = drift.comparison.gone.len());
                (server, store.put_pin_drift(server, &text, now))
            }
        };
        if let Err(e) = result {
            tracing::warn!(event = "pin_not_kept", job_id = %job_id, server = %server, detail = %e);
        }
    }
}

/// Whether `server`'s stored pin is there but does not read as one (written by another version,
/// or damaged).
fn unreadable_pin(store: &dyn Queue, server: &str) -> bool {
    matches!(store.pin(server), Ok(Some(text)) if serde_json::from_str::<StoredPin>(&text).is_err())
}

/// The log's account of an approval: who, and each tool that differed from the pin it replaced
/// (name, kind, both digests), or that it is the server's first pin.
fn log_approval(job_id: &str, server: &str, by: &str, diff: &pins::Comparison) {
    let tools: Vec<String> = diff
        .drift
        .iter()
        .map(|d| {
            let pinned = d.pinned.as_deref().unwrap_or("none");
            format!("{} {} {pinned} -> {}", d.tool, d.kind.as_str(), d.seen)
        })
        .chain(diff.gone.iter().map(|t| format!("{t} gone")))
        .collect();
    tracing::warn!(event = "pin_approved", job_id = %job_id, server = %server, by = %by,
        first_use = diff.first_use, changes = %tools.join("; "));
}

fn ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
#[path = "pins_tests.rs"]
mod tests;
