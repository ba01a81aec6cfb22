//! The servers' pins as the operator sees them: each pin and each drift the queue's store keeps,
//! read with a bound, and whether the drift still waits for approval. The panel's pins page and
//! `/metrics` read the store through it, and so does `pi-dispatch doctor`.
//!
//! On the job's path: after it: what the worker kept of what each server listed, for the operator.

use std::collections::BTreeMap;

use protocol::pins::{DriftKind, StoredDrift, StoredPin};

/// The most of one store entry read, in bytes ([`protocol::pins::MAX_STORED_ENTRY`], which every
/// pin and drift a worker writes fits): an entry past this was not written by a worker, and is
/// said to be unreadable rather than read.
pub const MAX_ENTRY: usize = protocol::pins::MAX_STORED_ENTRY;

/// The most characters of a name sent by a server (a tool, its version) shown.
const MAX_SHOWN: usize = 128;

/// One entry of the store: read, or why not (said without its text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry<T> {
    Read(T),
    /// Larger than [`MAX_ENTRY`]: its size in bytes.
    TooLarge(usize),
    /// Not what this version writes (not JSON, or not of its shape).
    NotReadable,
}

impl<T> Entry<T> {
    fn of(text: &str) -> Entry<T>
    where
        T: serde::de::DeserializeOwned,
    {
        if text.len() > MAX_ENTRY {
            return Entry::TooLarge(text.len());
        }
        match serde_json::from_str(text) {
            Ok(value) => Entry::Read(value),
            Err(_) => Entry::NotReadable,
        }
    }

    pub fn read(&self) -> Option<&T> {
        match self {
            Entry::Read(value) => Some(value),
            _ => None,
        }
    }

    /// Why it cannot be read, in words; `None` when it was.
    pub fn why_not(&self) -> Option<String> {
        match self {
            Entry::Read(_) => None,
            Entry::TooLarge(bytes) => Some(format!(
                "it is {bytes} bytes, more than the 1 MiB a pin or its drift can take"
            )),
            Entry::NotReadable => Some("it is not JSON of the shape this version writes".into()),
        }
    }
}

/// What the store keeps of one server: its pin, and the drift noted since.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerPins {
    pub server: String,
    pub pin: Option<Entry<StoredPin>>,
    pub drift: Option<Entry<StoredDrift>>,
}

/// Whether the drift a job noted waits for the operator: it was seen after the pin was stored.
/// An approval (`mcp pin`, or a pin that follows its server under `accept`) removes the drift
/// with it in the store; this also leaves aside drift a job noted against a pin replaced while it
/// ran. With no pin to compare, it waits.
pub fn is_pending(pin: Option<&StoredPin>, drift: &StoredDrift) -> bool {
    pin.is_none_or(|p| drift.seen_at_ms > p.pinned_at_ms)
}

impl ServerPins {
    /// The drift that waits for approval, when it reads.
    pub fn pending(&self) -> Option<&StoredDrift> {
        let drift = self.drift.as_ref()?.read()?;
        let pin = self.pin.as_ref().and_then(Entry::read);
        is_pending(pin, drift).then_some(drift)
    }

    /// Whether drift waits for approval: read and newer than the pin, or noted and unreadable (the
    /// store says a job saw drift, and nothing approved it since).
    pub fn drift_waits(&self) -> bool {
        match &self.drift {
            None => false,
            Some(Entry::Read(_)) => self.pending().is_some(),
            Some(_) => true,
        }
    }
}

/// Every server the store has a pin or drift for, by name.
pub fn read(queue: &dyn queue::Queue) -> Result<Vec<ServerPins>, queue::QueueError> {
    let mut servers: BTreeMap<String, ServerPins> = BTreeMap::new();
    let blank = |server: String| ServerPins {
        server,
        pin: None,
        drift: None,
    };
    for (server, text) in queue.pins()? {
        let entry = servers
            .entry(server.clone())
            .or_insert_with(|| blank(server));
        entry.pin = Some(Entry::of(&text));
    }
    for (server, text) in queue.pin_drifts()? {
        let entry = servers
            .entry(server.clone())
            .or_insert_with(|| blank(server));
        entry.drift = Some(Entry::of(&text));
    }
    Ok(servers.into_values().collect())
}

/// How many of `drift`'s tools are of each kind, as words (`2 changed, 1 new`).
pub fn kinds(drift: &StoredDrift) -> String {
    let mut parts = Vec::new();
    for kind in [DriftKind::Changed, DriftKind::New, DriftKind::ServerChanged] {
        let n = drift
            .comparison
            .drift
            .iter()
            .filter(|d| d.kind == kind)
            .count();
        if n > 0 {
            parts.push(format!("{n} {}", kind.as_str()));
        }
    }
    let gone = drift.comparison.gone.len();
    if gone > 0 {
        parts.push(format!("{gone} gone"));
    }
    parts.join(", ")
}

/// A name a server sent (a tool's, its version), as it may be shown anywhere: without control
/// characters (a terminal's escapes, line ends) or the marks that reorder text, and cut short.
pub fn printable(text: &str) -> String {
    let reorders = |c: char| matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    let kept: String = text
        .chars()
        .filter(|c| !c.is_control() && !reorders(*c))
        .collect();
    if kept.chars().count() > MAX_SHOWN {
        kept.chars().take(MAX_SHOWN).chain(['…']).collect()
    } else {
        kept
    }
}

/// A digest cut to its kind and first 12 hex digits (`sha256:0a1b2c3d4e5f…`), to tell two apart.
pub fn short_digest(digest: &str) -> String {
    let (kind, hex) = digest.split_once(':').unwrap_or(("", digest));
    let hex: String = hex.chars().take(12).collect();
    printable(&format!("{kind}:{hex}…"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::pins::{Comparison, Drift, Listing};

    fn pin(at: u64) -> StoredPin {
        StoredPin {
            definitions: Default::default(),
            listing: Listing::default(),
            pinned_at_ms: at,
            by: "job a".into(),
        }
    }

    fn drift(at: u64) -> StoredDrift {
        let tool = |name: &str, kind| Drift {
            tool: name.into(),
            kind,
            pinned: None,
            seen: "sha256:00".into(),
        };
        StoredDrift {
            definitions: Default::default(),
            job_id: "job-b".into(),
            seen_at_ms: at,
            listing: Listing::default(),
            comparison: Comparison {
                unpinnable: 0,
                first_use: false,
                drift: vec![
                    tool("a", DriftKind::Changed),
                    tool("b", DriftKind::New),
                    tool("c", DriftKind::Changed),
                ],
                gone: vec!["d".into()],
            },
        }
    }

    #[test]
    fn drift_waits_when_seen_after_the_pin_or_with_none() {
        assert!(is_pending(Some(&pin(10)), &drift(11)));
        assert!(!is_pending(Some(&pin(11)), &drift(11)));
        assert!(!is_pending(Some(&pin(12)), &drift(11)));
        assert!(is_pending(None, &drift(11)));
    }

    #[test]
    fn kinds_are_counted_in_words() {
        assert_eq!(kinds(&drift(1)), "2 changed, 1 new, 1 gone");
    }

    #[test]
    fn an_entry_too_large_or_not_json_is_unreadable_and_a_good_one_reads() {
        let good = serde_json::to_string(&pin(1)).unwrap_or_default();
        assert_eq!(Entry::<StoredPin>::of(&good), Entry::Read(pin(1)));
        assert_eq!(Entry::<StoredPin>::of("{not json"), Entry::NotReadable);
        let mut huge = pin(1);
        huge.by = "x".repeat(MAX_ENTRY);
        let huge = serde_json::to_string(&huge).unwrap_or_default();
        assert_eq!(Entry::<StoredPin>::of(&huge), Entry::TooLarge(huge.len()));
    }

    #[test]
    fn names_lose_control_characters_and_reordering_marks() {
        assert_eq!(printable("ok\u{1b}[2J\nname\u{202e}txt"), "ok[2Jnametxt");
        assert_eq!(printable(&"n".repeat(200)).chars().count(), MAX_SHOWN + 1);
        assert_eq!(
            short_digest(&format!("sha256:{}", "a".repeat(64))),
            "sha256:aaaaaaaaaaaa…"
        );
    }
}
