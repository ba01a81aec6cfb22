//! The runner's exit line: its last stdout line, JSON, authenticated with an HMAC-SHA256 keyed by the
//! per-job key the worker writes to the runner's stdin, so that nothing the job prints can pass for it.

use std::collections::BTreeMap;

use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// How one server fared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServerState {
    pub name: String,
    /// `ready`, `failed`, `waiting` (still not answered when the wait ran out) or `skipped`.
    pub state: String,
    /// Milliseconds from the start of the connections to the tool list.
    pub ready_ms: Option<u64>,
    /// What a ready server listed (its name and version, each tool's digest), as the hub held it
    /// against the server's pin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listing: Option<crate::pins::Listing>,
}

/// The line's content. Field order is fixed by this type, so both sides serialize it identically.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExitLine {
    pub event: String,
    pub job_id: String,
    pub code: u8,
    pub reason: Option<String>,
    /// For the worker's log: the server and the cause (names and rules, never a value).
    pub server: Option<String>,
    pub cause: Option<String>,
    pub servers: Vec<ServerState>,
    /// Every tool call the agent made, per server and tool (counts, time, bytes, outcome; never
    /// arguments), for the record.
    pub tool_calls: Vec<crate::usage::ToolCallCount>,
    /// What pi spent (turns, tokens, cost), when the agent was pi.
    pub usage: Option<crate::usage::Usage>,
    /// The text of the agent's last answer (at most [`MAX_FINAL_MESSAGE`] bytes), for the record;
    /// the worker redacts it before it keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_message: Option<String>,
}

/// The most of the agent's last answer an exit line carries.
pub const MAX_FINAL_MESSAGE: usize = 16 * 1024;

/// Adds `piece` to `text`, keeping it within [`MAX_FINAL_MESSAGE`] bytes on a character
/// boundary; `cut` says when something was left out.
pub fn push_bounded(text: &mut String, cut: &mut bool, piece: &str) {
    let room = MAX_FINAL_MESSAGE.saturating_sub(text.len());
    if piece.len() <= room {
        text.push_str(piece);
        return;
    }
    let mut end = room;
    while !piece.is_char_boundary(end) {
        end -= 1;
    }
    text.push_str(&piece[..end]);
    *cut = true;
}

/// The longest line [`read`] holds in memory; a longer one cannot be an exit line and is skipped.
pub const MAX_LINE: usize = 1024 * 1024;

/// Room on the line for the signature and its field.
const SIGNATURE_ROOM: usize = 128;

impl ExitLine {
    /// Makes the line fit [`MAX_LINE`] once signed, whatever the job did: the counts are bounded
    /// where they are made ([`crate::usage::MAX_TOOL_ENTRIES`]), and should a line still be too
    /// long (a job of thousands of servers), the tool calls are folded into one count a server,
    /// then left out, then the server states cut, before the line would be lost (and the job run
    /// again for it).
    pub fn fit(&mut self) {
        let fits = |line: &ExitLine| {
            serde_json::to_string(line).is_ok_and(|t| t.len() + SIGNATURE_ROOM <= MAX_LINE)
        };
        if fits(self) {
            return;
        }
        let mut folded: Vec<crate::usage::ToolCallCount> = Vec::new();
        for call in self.tool_calls.drain(..) {
            match folded.iter_mut().find(|c| c.server == call.server) {
                Some(c) => {
                    c.calls = c.calls.saturating_add(call.calls);
                    c.ok = c.ok.saturating_add(call.ok);
                    c.error = c.error.saturating_add(call.error);
                    c.refused = c.refused.saturating_add(call.refused);
                    c.total_ms = c.total_ms.saturating_add(call.total_ms);
                    c.result_bytes = c.result_bytes.saturating_add(call.result_bytes);
                }
                None => folded.push(crate::usage::ToolCallCount {
                    tool: crate::usage::OTHER_TOOL.to_owned(),
                    ..call
                }),
            }
        }
        self.tool_calls = folded;
        if fits(self) {
            return;
        }
        self.tool_calls.clear();
        if !fits(self) {
            // As many server states as fit (found by halving, each try one serialization).
            let all = std::mem::take(&mut self.servers);
            let (mut low, mut high) = (0, all.len());
            while low < high {
                let mid = (low + high).div_ceil(2);
                self.servers = all[..mid].to_vec();
                if fits(self) {
                    low = mid;
                } else {
                    high = mid - 1;
                }
            }
            self.servers = all[..low].to_vec();
        }
        if !fits(self) {
            self.final_message = None;
            self.cause = None;
        }
    }

    /// The reason it gives, when it is one of the product's.
    pub fn known_reason(&self) -> Option<crate::reason::Reason> {
        self.reason
            .as_deref()
            .and_then(crate::reason::Reason::parse)
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Signed {
    #[serde(flatten)]
    line: ExitLine,
    hmac: String,
}

fn mac(key: &[u8], body: &str) -> Option<String> {
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(key).ok()?;
    m.update(body.as_bytes());
    Some(crate::ids::hex(m.finalize().into_bytes()))
}

/// The line to print: the content, made to fit [`MAX_LINE`] ([`ExitLine::fit`]), with an `hmac`
/// over its own serialization.
pub fn sign(line: &ExitLine, key: &[u8]) -> Result<String, serde_json::Error> {
    let mut line = line.clone();
    line.fit();
    let body = serde_json::to_string(&line)?;
    let hmac = mac(key, &body).unwrap_or_default();
    serde_json::to_string(&Signed { line, hmac })
}

/// The worker's side: the content, when the line is the runner's (its HMAC checks out, compared in
/// constant time).
pub fn verify(text: &str, key: &[u8]) -> Option<ExitLine> {
    let signed: Signed = serde_json::from_str(text).ok()?;
    let body = serde_json::to_string(&signed.line).ok()?;
    let given = decode_hex(&signed.hmac)?;
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(key).ok()?;
    m.update(body.as_bytes());
    m.verify_slice(&given).ok().map(|()| signed.line)
}

/// A line read by [`Lines`].
#[derive(Debug, PartialEq, Eq)]
pub enum Line<'a> {
    /// A line, without its line end.
    Text(&'a [u8]),
    /// A line longer than [`MAX_LINE`], skipped: its first [`MAX_LINE`] bytes, its last
    /// [`OVERLONG_TAIL`] bytes (so that a reader can still tell what it was), and its length.
    Overlong {
        head: &'a [u8],
        tail: &'a [u8],
        bytes: u64,
    },
}

/// How much of the end of an overlong line [`Lines`] keeps.
pub const OVERLONG_TAIL: usize = 64 * 1024;

/// Lines of a stream, none longer than [`MAX_LINE`] held in memory (with the `stream` feature:
/// the readers of the runner's output, the worker and the runner itself).
#[cfg(feature = "stream")]
pub struct Lines<R> {
    input: tokio::io::BufReader<R>,
    line: Vec<u8>,
    tail: Vec<u8>,
}

#[cfg(feature = "stream")]
impl<R: tokio::io::AsyncRead + Unpin> Lines<R> {
    pub fn new(input: R) -> Lines<R> {
        Lines {
            input: tokio::io::BufReader::new(input),
            line: Vec::new(),
            tail: Vec::new(),
        }
    }

    /// The next line, or `None` at the end of the stream (or on a read error).
    pub async fn next(&mut self) -> Option<Line<'_>> {
        use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _};
        self.line.clear();
        let mut limited = (&mut self.input).take(MAX_LINE as u64 + 1);
        match limited.read_until(b'\n', &mut self.line).await {
            Ok(0) | Err(_) => None,
            Ok(_) if self.line.len() > MAX_LINE && !self.line.ends_with(b"\n") => {
                // Skip the rest of it, a bounded chunk at a time, keeping its last bytes.
                let mut bytes = self.line.len() as u64;
                self.tail.clear();
                let keep = |tail: &mut Vec<u8>, more: &[u8]| {
                    tail.extend_from_slice(more);
                    if tail.len() > OVERLONG_TAIL {
                        tail.drain(..tail.len() - OVERLONG_TAIL);
                    }
                };
                keep(&mut self.tail, &self.line);
                let mut rest = Vec::new();
                loop {
                    rest.clear();
                    let mut chunk = (&mut self.input).take(64 * 1024);
                    match chunk.read_until(b'\n', &mut rest).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {
                            let end = rest.ends_with(b"\n");
                            let text = rest.strip_suffix(b"\n").unwrap_or(&rest);
                            bytes += text.len() as u64;
                            keep(&mut self.tail, text);
                            if end {
                                break;
                            }
                        }
                    }
                }
                Some(Line::Overlong {
                    head: &self.line[..MAX_LINE],
                    tail: &self.tail,
                    bytes,
                })
            }
            Ok(_) => Some(Line::Text(
                self.line.strip_suffix(b"\n").unwrap_or(&self.line),
            )),
        }
    }
}

/// The `event` of a signed line the runner prints before its end: the servers' states once they
/// have connected (or failed to), for the job's live view. Never the exit line.
pub const SERVERS_EVENT: &str = "servers";

/// The `event` of a signed line the runner prints once a server's listing is held to its pin:
/// its tools' definitions in canonical form ([`Definitions`]), for the pin and its diff.
pub const DEFINITIONS_EVENT: &str = "definitions";

/// One server's tools' definitions as it listed them, each in canonical form by tool name: what a
/// pin keeps so that a later change can be shown field by field. The worker keeps only those whose
/// digest is on the exit line ([`crate::pins::verified_definitions`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Definitions {
    pub event: String,
    pub job_id: String,
    pub server: String,
    pub tools: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SignedDefinitions {
    #[serde(flatten)]
    definitions: Definitions,
    hmac: String,
}

impl Definitions {
    /// The line to print, signed with `key`: as many of the tools (the first by name) as fit in
    /// [`MAX_LINE`].
    pub fn sign(mut self, key: &[u8]) -> Result<String, serde_json::Error> {
        let overhead = 256 + self.job_id.len() + self.server.len();
        let mut used = overhead;
        let written = |text: &str| serde_json::to_string(text).map_or(usize::MAX / 4, |t| t.len());
        self.tools.retain(|name, text| {
            // Each entry as JSON writes it, with its colon and comma.
            used += written(name) + written(text) + 2;
            used <= MAX_LINE
        });
        let body = serde_json::to_string(&self)?;
        let hmac = mac(key, &body).unwrap_or_default();
        serde_json::to_string(&SignedDefinitions {
            definitions: self,
            hmac,
        })
    }

    /// The worker's side: the definitions, when the line is a definitions line the runner signed.
    pub fn verify(text: &str, key: &[u8]) -> Option<Definitions> {
        if !text.starts_with(r#"{"event":"definitions""#) {
            return None;
        }
        let signed: SignedDefinitions = serde_json::from_str(text).ok()?;
        let body = serde_json::to_string(&signed.definitions).ok()?;
        let given = decode_hex(&signed.hmac)?;
        let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(key).ok()?;
        m.update(body.as_bytes());
        m.verify_slice(&given).ok()?;
        (signed.definitions.event == DEFINITIONS_EVENT).then_some(signed.definitions)
    }
}

/// A signed line the runner prints before its exit line.
#[derive(Debug)]
pub enum Said {
    /// The servers' states once they connected ([`SERVERS_EVENT`]).
    Servers(ExitLine),
    /// One server's definitions ([`DEFINITIONS_EVENT`]).
    Definitions(Definitions),
}

/// Reads the runner's standard output to its end: the exit line is the last line that verifies
/// with `key` and is not a [`SERVERS_EVENT`] line; those, and the [`DEFINITIONS_EVENT`] lines,
/// go to `said` as they come; every other line goes to `other` as it comes.
#[cfg(feature = "stream")]
pub async fn read<R>(
    input: R,
    key: &[u8],
    mut other: impl FnMut(Line<'_>),
    mut said: impl FnMut(Said),
) -> Option<ExitLine>
where
    R: tokio::io::AsyncRead + Unpin,
{
    let mut lines = Lines::new(input);
    let mut verified = None;
    while let Some(line) = lines.next().await {
        match line {
            Line::Text(text) => {
                let text_str = std::str::from_utf8(text).ok();
                if let Some(d) = text_str.and_then(|t| Definitions::verify(t, key)) {
                    said(Said::Definitions(d));
                    continue;
                }
                match text_str.and_then(|t| verify(t, key)) {
                    Some(found) if found.event == SERVERS_EVENT => said(Said::Servers(found)),
                    Some(found) => verified = Some(found),
                    None => other(Line::Text(text)),
                }
            }
            overlong @ Line::Overlong { .. } => other(overlong),
        }
    }
    verified
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len() / 2)
        .map(|i| u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line() -> ExitLine {
        ExitLine {
            event: "exit".into(),
            job_id: "job-1".into(),
            code: 2,
            reason: Some("mcp-secret-missing".into()),
            server: Some("docs".into()),
            cause: Some("DOCS_TOKEN is not set in the job".into()),
            servers: vec![ServerState {
                name: "docs".into(),
                state: "skipped".into(),
                ready_ms: None,
                listing: None,
            }],
            tool_calls: vec![crate::usage::ToolCallCount {
                server: "docs".into(),
                tool: "search".into(),
                calls: 2,
                ok: 1,
                error: 1,
                refused: 0,
                total_ms: 12,
                result_bytes: 340,
            }],
            usage: None,
            final_message: Some("Done.".into()),
        }
    }

    #[test]
    fn the_largest_line_a_job_can_make_fits_once_signed() {
        use crate::usage::{MAX_TOOL_ENTRIES, MAX_TOOL_NAME, ToolCallCount};
        // Every character JSON writes six bytes for, in every field a job's text can reach.
        let wide = |n: usize| "\u{1}".repeat(n);
        let count = |server: String, tool: String| ToolCallCount {
            server,
            tool,
            calls: u64::MAX,
            ok: u64::MAX,
            error: u64::MAX,
            refused: u64::MAX,
            total_ms: u64::MAX,
            result_bytes: u64::MAX,
        };
        let full = |servers: usize| ExitLine {
            servers: (0..servers)
                .map(|i| ServerState {
                    name: format!("{i:0>32}"),
                    state: "waiting".into(),
                    ready_ms: Some(u64::MAX),
                    listing: None,
                })
                .collect(),
            tool_calls: (0..MAX_TOOL_ENTRIES + servers)
                .map(|i| count(format!("{:0>32}", i % servers.max(1)), wide(MAX_TOOL_NAME)))
                .collect(),
            final_message: Some(wide(MAX_FINAL_MESSAGE)),
            ..line()
        };
        for servers in [1, 32, 20_000] {
            let text = sign(&full(servers), b"k").unwrap();
            assert!(text.len() <= MAX_LINE, "{servers}: {}", text.len());
            let read = verify(&text, b"k").unwrap();
            // What fits is kept: all of it for a job of a few servers.
            if servers <= 32 {
                assert_eq!(read, full(servers), "{servers}");
            } else {
                assert!(!read.servers.is_empty());
            }
        }
    }

    #[test]
    fn a_signed_line_verifies_with_its_key_only() {
        let text = sign(&line(), b"job-key").unwrap();
        assert!(text.starts_with("{\"event\":\"exit\""), "{text}");
        assert_eq!(verify(&text, b"job-key"), Some(line()));
        assert_eq!(verify(&text, b"other-key"), None);
        let forged = text.replace("\"code\":2", "\"code\":0");
        assert_eq!(verify(&forged, b"job-key"), None);
        assert_eq!(verify("{\"event\":\"exit\"}", b"job-key"), None);
    }

    #[test]
    fn a_line_with_any_cost_verifies() {
        // Costs summed from per-token prices are floats without a short decimal form; the worker
        // reads the line back and must write each the same way.
        let mut cost = 0.0f64;
        for i in 1..2000u32 {
            cost += f64::from(i) * 1e-7 / 3.0 + 4e-5;
            let usage = crate::usage::Usage {
                cost_usd: cost,
                ..crate::usage::Usage::default()
            };
            let l = ExitLine {
                usage: Some(usage),
                ..line()
            };
            let text = sign(&l, b"job-key").unwrap();
            assert_eq!(verify(&text, b"job-key"), Some(l), "{text}");
        }
    }

    #[cfg(feature = "stream")]
    #[tokio::test]
    async fn the_reader_finds_the_line_and_hands_on_the_rest() {
        let signed = sign(&line(), b"job-key").unwrap();
        let forged = sign(&ExitLine { code: 0, ..line() }, b"other").unwrap();
        let long = "x".repeat(MAX_LINE + 10);
        // A servers line, signed and forged: the signed one is the live view's, never the exit.
        let servers = ExitLine {
            event: SERVERS_EVENT.into(),
            ..line()
        };
        let progress = sign(&servers, b"job-key").unwrap();
        let forged_progress = sign(&servers, b"other").unwrap();
        let text = format!(
            "{{\"type\":\"turn_start\"}}\n{long}\n{forged}\n{progress}\n{forged_progress}\n{signed}\n{progress}\nafter"
        );
        let mut seen = Vec::new();
        let mut said = Vec::new();
        let found = read(
            text.as_bytes(),
            b"job-key",
            |o| {
                seen.push(match o {
                    Line::Text(l) => String::from_utf8_lossy(l).into_owned(),
                    Line::Overlong { .. } => "<overlong>".to_owned(),
                })
            },
            |s| match s {
                Said::Servers(s) => said.push(s),
                Said::Definitions(d) => panic!("{d:?}"),
            },
        )
        .await;
        assert_eq!(found, Some(line()));
        assert_eq!(
            seen,
            [
                "{\"type\":\"turn_start\"}",
                "<overlong>",
                &forged,
                &forged_progress,
                "after"
            ]
        );
        assert_eq!(said, [servers.clone(), servers]);
    }

    #[cfg(feature = "stream")]
    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    fn definitions(tools: &[(&str, &str)]) -> Definitions {
        Definitions {
            event: DEFINITIONS_EVENT.into(),
            job_id: "job-1".into(),
            server: "docs".into(),
            tools: tools
                .iter()
                .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
                .collect(),
        }
    }

    #[cfg(feature = "stream")]
    #[test]
    fn a_definitions_line_verifies_only_with_the_key_and_fits_a_line() {
        let d = definitions(&[("echo", r#"{"name":"echo"}"#)]);
        let text = d.clone().sign(b"job-key").unwrap();
        assert_eq!(Definitions::verify(&text, b"job-key"), Some(d.clone()));
        assert_eq!(Definitions::verify(&text, b"other"), None);
        let forged = text.replace("echo\\\"}", "echo\\\",\\\"x\\\":1}");
        assert_ne!(forged, text);
        assert_eq!(Definitions::verify(&forged, b"job-key"), None);
        // An exit line is not a definitions line, nor the other way round.
        let exit = sign(&line(), b"job-key").unwrap();
        assert_eq!(Definitions::verify(&exit, b"job-key"), None);
        assert_eq!(verify(&text, b"job-key"), None);
        // The reader hands on the signed line only; a forged one, even first, is another line.
        let text = format!("{forged}\n{}\n", d.clone().sign(b"job-key").unwrap());
        let mut said = Vec::new();
        let mut other = 0;
        let found = block_on(read(
            text.as_bytes(),
            b"job-key",
            |_| other += 1,
            |s| said.push(s),
        ));
        assert_eq!(found, None);
        assert_eq!(other, 1);
        assert!(
            matches!(&said[..], [Said::Definitions(x)] if *x == d),
            "{said:?}"
        );
        // Definitions past a line's bound are left out, the first by name kept.
        let big = format!(r#"{{"d":"{}"}}"#, "q".repeat(300 * 1024));
        let many: Vec<(String, &str)> = (0..5).map(|i| (format!("t{i}"), big.as_str())).collect();
        let many: Vec<(&str, &str)> = many.iter().map(|(n, t)| (n.as_str(), *t)).collect();
        let text = definitions(&many).sign(b"job-key").unwrap();
        assert!(text.len() <= MAX_LINE, "{}", text.len());
        let kept = Definitions::verify(&text, b"job-key").unwrap().tools;
        assert_eq!(kept.keys().collect::<Vec<_>>(), ["t0", "t1", "t2"]);
    }
}
