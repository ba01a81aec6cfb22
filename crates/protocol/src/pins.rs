//! Pins: what each server of the overlay told the agent when it was approved, so that a server
//! changed since (a new tool, a rewritten description, another schema, another version) cannot
//! put new words before the model unnoticed.
//!
//! On the job's path: the worker hands the runner the pins of the job's servers; the hub digests
//! every tool a server lists at connect and withholds what does not match; the exit line carries
//! what was seen, and the worker keeps it as the pin (first use, or a policy that follows the
//! server) or as drift for the operator to approve.
//!
//! A tool's digest is taken over its definition exactly as the server wrote it, put in one
//! canonical form (keys sorted, no white space), so that two listings that only order keys or
//! space them differently agree, and any other change to any field does not.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::json::{self, Json};

/// What a digest of a canonical definition starts with.
pub const CANONICAL_PREFIX: &str = "sha256:";

/// The most tools a pin holds of one server: what a server lists past it (in name order) is never
/// pinned, and so never offered. It keeps the runner's input and exit line within their bounds
/// with eight servers of the most tools each.
pub const MAX_PINNED_TOOLS: usize = 256;

/// The longest tool name a pin holds, in bytes (a longer one is never offered either).
pub const MAX_PINNED_NAME: usize = 128;

/// What a digest of a definition that is not strict JSON (a key written twice) starts with: it is
/// taken over the bytes as sent, and never equals a canonical one.
pub const RAW_PREFIX: &str = "sha256-raw:";

/// How a trigger treats a server whose tools no longer match their pin (`run.pins`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PinPolicy {
    /// The changed tools are not offered to pi; the job goes on with the others.
    #[default]
    Withhold,
    /// The job ends before its prompt.
    Refuse,
    /// The changed tools are offered, the drift is recorded and the pin follows the server.
    Accept,
}

impl PinPolicy {
    pub const ALL: [PinPolicy; 3] = [PinPolicy::Withhold, PinPolicy::Refuse, PinPolicy::Accept];

    pub fn as_str(self) -> &'static str {
        match self {
            PinPolicy::Withhold => "withhold",
            PinPolicy::Refuse => "refuse",
            PinPolicy::Accept => "accept",
        }
    }

    pub fn parse(text: &str) -> Option<PinPolicy> {
        PinPolicy::ALL.into_iter().find(|p| p.as_str() == text)
    }

    pub fn is_default(&self) -> bool {
        *self == PinPolicy::default()
    }

    /// The stricter of two policies: refusing over withholding over accepting.
    pub fn stricter(self, other: PinPolicy) -> PinPolicy {
        let rank = |p: PinPolicy| match p {
            PinPolicy::Accept => 0,
            PinPolicy::Withhold => 1,
            PinPolicy::Refuse => 2,
        };
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }
}

/// The server as it named itself in its `initialize` answer (`serverInfo`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ServerInfo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// What one server listed at one connect: who it said it was, and each tool's digest by name.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Listing {
    pub server: ServerInfo,
    pub tools: BTreeMap<String, String>,
    /// How many tools the server listed past a pin's bounds (too many, or too long a name): never
    /// pinned, so never offered.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unpinnable: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Listing {
    /// The listing of these definitions, each as the server wrote it (`(name, definition)`):
    /// at most [`MAX_PINNED_TOOLS`], the first by name, each name at most [`MAX_PINNED_NAME`]
    /// bytes. A name listed twice keeps its first definition.
    pub fn of<'a>(server: ServerInfo, tools: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        Listing::with_texts(server, tools).0
    }

    /// [`Listing::of`], with each pinned tool's definition in canonical form (where it is strict
    /// JSON), taken in the same one pass as its digest.
    pub fn with_texts<'a>(
        server: ServerInfo,
        tools: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> (Self, BTreeMap<String, String>) {
        let mut kept: BTreeMap<&str, &str> = BTreeMap::new();
        let mut too_long = std::collections::BTreeSet::new();
        for (name, definition) in tools {
            if name.len() <= MAX_PINNED_NAME {
                kept.entry(name).or_insert(definition);
            } else {
                too_long.insert(name);
            }
        }
        let past = kept.len().saturating_sub(MAX_PINNED_TOOLS);
        let mut digests = BTreeMap::new();
        let mut texts = BTreeMap::new();
        for (name, definition) in kept.into_iter().take(MAX_PINNED_TOOLS) {
            let (digest, text) = digest_and_text(definition);
            digests.insert(name.to_owned(), digest);
            if let Some(text) = text {
                texts.insert(name.to_owned(), text);
            }
        }
        let listing = Listing {
            server,
            tools: digests,
            unpinnable: u32::try_from(past + too_long.len()).unwrap_or(u32::MAX),
        };
        (listing, texts)
    }
}

/// `value` in canonical form: object keys in the order of their bytes, no white space, strings and
/// numbers as serde_json writes them.
pub fn canonical(value: &Json) -> String {
    let mut out = Vec::new();
    write_canonical(value, &mut out);
    // Only JSON text was written, from strings that were UTF-8.
    String::from_utf8(out).unwrap_or_default()
}

fn write_canonical(value: &Json, out: &mut Vec<u8>) {
    match value {
        Json::Object(members) => {
            let mut sorted: Vec<(&str, &Json)> = members.iter().collect();
            sorted.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (key, item)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(key, out);
                out.push(b':');
                write_canonical(item, out);
            }
            out.push(b'}');
        }
        Json::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        Json::String(s) => write_string(s, out),
        Json::Number(n) => {
            let _ = serde_json::to_writer(&mut *out, n);
        }
        Json::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Json::Null => out.extend_from_slice(b"null"),
    }
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    // serde_json's own escaping: one form for each string.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// One tool's definition as the server wrote it, in canonical form; `None` for one that is not
/// strict JSON (its digest is then over its bytes, and no definition of it is kept).
pub fn canonical_text(definition: &str) -> Option<String> {
    json::parse(definition).ok().map(|value| canonical(&value))
}

/// The definitions of `listing`'s tools that are what it digested: each canonical text in
/// `definitions` whose digest is the listing's for that tool, at most [`MAX_DEFINITIONS_BYTES`] in
/// all (the first by name). Whoever wrote `definitions`, what is kept is what the server sent.
pub fn verified_definitions(
    listing: &Listing,
    definitions: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut kept = BTreeMap::new();
    let mut bytes = 0;
    for (tool, text) in definitions {
        let Some(expected) = listing.tools.get(tool) else {
            continue;
        };
        if bytes + text.len() > MAX_DEFINITIONS_BYTES || digest(text) != *expected {
            continue;
        }
        bytes += text.len();
        kept.insert(tool.clone(), text.clone());
    }
    kept
}

/// The most bytes of definitions a pin or a drift keeps of one server (what does not fit is still
/// digested, and shown in a diff by its digest alone).
pub const MAX_DEFINITIONS_BYTES: usize = 256 * 1024;

/// The largest pin or drift a worker writes to the store, in bytes, as JSON: the most tools with
/// the longest names and [`MAX_DEFINITIONS_BYTES`] of definitions, each character of which JSON
/// may write as two. A reader of the store may take a larger entry as not a worker's.
pub const MAX_STORED_ENTRY: usize = 1 << 20;

/// The digest of one tool's definition as the server wrote it.
pub fn digest(definition: &str) -> String {
    digest_and_text(definition).0
}

/// The digest of one definition, and its canonical text when it is strict JSON.
fn digest_and_text(definition: &str) -> (String, Option<String>) {
    match json::parse(definition) {
        Ok(value) => {
            let text = canonical(&value);
            let digest = format!("{CANONICAL_PREFIX}{}", hex(&Sha256::digest(&text)));
            (digest, Some(text))
        }
        Err(_) => {
            let digest = format!(
                "{RAW_PREFIX}{}",
                hex(&Sha256::digest(definition.as_bytes()))
            );
            (digest, None)
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// How one tool a server listed differs from its pin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DriftKind {
    /// The pin has no tool of this name.
    New,
    /// The tool's definition is not the one pinned.
    Changed,
    /// The server names another version (or another name) than when pinned.
    ServerChanged,
}

impl DriftKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DriftKind::New => "new",
            DriftKind::Changed => "changed",
            DriftKind::ServerChanged => "server-changed",
        }
    }
}

/// One tool that does not match its pin, with both digests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drift {
    pub tool: String,
    pub kind: DriftKind,
    /// The pinned digest; `None` for a new tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned: Option<String>,
    pub seen: String,
}

/// A server's listing held against its pin.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Comparison {
    /// No pin yet: the listing becomes the pin (trust on first use) and every tool is offered.
    pub first_use: bool,
    /// The tools that do not match, by name.
    pub drift: Vec<Drift>,
    /// Tools the pin has and the server no longer lists (nothing to withhold; said for the record).
    pub gone: Vec<String>,
    /// How many tools the server listed past a pin's bounds, withheld whatever the policy.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unpinnable: u32,
}

impl Comparison {
    /// Whether `tool` matches its pin (or the server has no pin yet).
    pub fn matches(&self, tool: &str) -> bool {
        !self.drift.iter().any(|d| d.tool == tool)
    }

    /// Whether anything differs from the pin.
    pub fn drifted(&self) -> bool {
        !self.drift.is_empty() || !self.gone.is_empty()
    }
}

/// Holds what a server `seen` listed against its `pin`.
pub fn compare(pin: Option<&Listing>, seen: &Listing) -> Comparison {
    let Some(pin) = pin else {
        return Comparison {
            first_use: true,
            unpinnable: seen.unpinnable,
            ..Comparison::default()
        };
    };
    let server_changed = pin.server != seen.server;
    let drift = seen
        .tools
        .iter()
        .filter_map(|(tool, digest)| {
            let pinned = pin.tools.get(tool);
            let kind = match pinned {
                None => DriftKind::New,
                Some(p) if p != digest => DriftKind::Changed,
                Some(_) if server_changed => DriftKind::ServerChanged,
                Some(_) => return None,
            };
            Some(Drift {
                tool: tool.clone(),
                kind,
                pinned: pinned.cloned(),
                seen: digest.clone(),
            })
        })
        .collect();
    let gone = pin
        .tools
        .keys()
        .filter(|t| !seen.tools.contains_key(*t))
        .cloned()
        .collect();
    Comparison {
        first_use: false,
        drift,
        gone,
        unpinnable: seen.unpinnable,
    }
}

/// A pin as the queue's store keeps it: what the server listed, when, and who or what pinned it
/// (`job ID` on first use or under `accept`, the operator's name for an approval).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredPin {
    pub listing: Listing,
    pub pinned_at_ms: u64,
    pub by: String,
    /// Each tool's definition in canonical form, as far as they were seen and fit
    /// ([`verified_definitions`]): what `mcp pins diff` shows a change against.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub definitions: BTreeMap<String, String>,
}

/// Drift as the queue's store keeps it until it is approved: what the last job to see it saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredDrift {
    pub job_id: String,
    pub seen_at_ms: u64,
    pub listing: Listing,
    pub comparison: Comparison,
    /// The definitions of the tools that differ, in canonical form, as far as they were seen and
    /// fit ([`verified_definitions`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub definitions: BTreeMap<String, String>,
}

/// What a job's record says of one server and its pin: pinned by this job (first use), or what
/// differed and what the trigger's policy made of it. A server that matched its pin has none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PinReport {
    pub server: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub first_use: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drift: Vec<Drift>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gone: Vec<String>,
    /// How many tools were past a pin's bounds, and withheld (under every policy).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unpinnable: u32,
    /// The policy the drift met: withheld, refused (the job ended) or accepted.
    pub policy: PinPolicy,
}

impl PinReport {
    /// The report of `server` held against its pin under `policy`; `None` when it matched.
    pub fn of(server: &str, comparison: &Comparison, policy: PinPolicy) -> Option<PinReport> {
        let said = comparison.first_use || comparison.drifted() || comparison.unpinnable > 0;
        said.then(|| PinReport {
            server: server.to_owned(),
            first_use: comparison.first_use,
            drift: comparison.drift.clone(),
            gone: comparison.gone.clone(),
            unpinnable: comparison.unpinnable,
            policy,
        })
    }
}

/// One field that differs between two definitions of a tool: where (a JSON pointer, `""` for the
/// whole), and its canonical text before and after (`None` where it is absent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldChange {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub was: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub now: Option<String>,
}

/// Every field that differs between `was` and `now`, in the order of their paths: objects are
/// followed key by key, arrays item by item while their lengths agree; anything else that differs
/// is one change of the whole value.
pub fn field_changes(was: &Json, now: &Json) -> Vec<FieldChange> {
    let mut out = Vec::new();
    changes_at(String::new(), Some(was), Some(now), &mut out);
    out
}

fn changes_at(path: String, was: Option<&Json>, now: Option<&Json>, out: &mut Vec<FieldChange>) {
    match (was, now) {
        (Some(Json::Object(a)), Some(Json::Object(b))) => {
            let mut keys: Vec<&str> = a.keys().chain(b.keys()).collect();
            keys.sort_unstable();
            keys.dedup();
            for key in keys {
                let at = format!("{path}/{}", key.replace('~', "~0").replace('/', "~1"));
                changes_at(at, a.get(key), b.get(key), out);
            }
        }
        (Some(Json::Array(a)), Some(Json::Array(b))) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                changes_at(format!("{path}/{i}"), Some(x), Some(y), out);
            }
        }
        (was, now) => {
            let was = was.map(canonical);
            let now = now.map(canonical);
            if was != now {
                out.push(FieldChange { path, was, now });
            }
        }
    }
}

#[cfg(test)]
#[path = "pins_tests.rs"]
mod tests;
