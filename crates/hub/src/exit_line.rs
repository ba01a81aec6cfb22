//! The runner's exit line: its last stdout line, JSON, authenticated with an HMAC-SHA256 keyed by the
//! per-job key the worker writes to the runner's stdin, so that nothing the job prints can pass for it.

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
    pub tool_calls: Vec<crate::relay::ToolCallCount>,
    /// What pi spent (turns, tokens, cost), when the agent was pi.
    pub usage: Option<crate::pi_agent::Usage>,
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
    Some(
        m.finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
    )
}

/// The line to print: the content with an `hmac` over its own serialization.
pub fn sign(line: &ExitLine, key: &[u8]) -> Result<String, serde_json::Error> {
    let body = serde_json::to_string(line)?;
    let hmac = mac(key, &body).unwrap_or_default();
    serde_json::to_string(&Signed {
        line: line.clone(),
        hmac,
    })
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
            }],
            tool_calls: vec![crate::relay::ToolCallCount {
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
}
