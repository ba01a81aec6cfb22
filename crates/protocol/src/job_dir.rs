//! The job's folder across the sandbox wall: what the worker writes into it, by name, where the
//! sandbox mounts it (`/job`, read-only), and the runner's input, one file the worker writes and
//! the runner alone reads. What the job's processes must inherit (the provider's key, the trigger's
//! secrets, the proxy, `PI_JOB_ID`) stays in their environment; everything else the runner needs
//! from the worker is in [`RunnerInput`].

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Where the sandbox mounts the job's folder.
pub const JOB_DIR: &str = "/job";
/// The agent's prompt.
pub const PROMPT: &str = "prompt.md";
/// The job as the agent may read it: its id, kind, trigger, flow and forge event.
pub const EVENT: &str = "event.json";
/// The servers the job connects ([`crate::job_mcp`]), when it names any.
pub const MCP: &str = "mcp.json";
/// The runner's input ([`RunnerInput`]).
pub const RUNNER_INPUT: &str = "runner.json";
/// The job's socket to the egress proxy, when egress is on.
pub const EGRESS_SOCKET: &str = "egress.sock";
/// Where, in the sandbox, the runner keeps pi's private agent folder.
pub const AGENT_DIR: &str = "/tmp/pi-dispatch/agent";
/// The job's `HOME` in the sandbox.
pub const HOME: &str = "/tmp";

/// The most a runner's input may hold.
const MAX_INPUT_BYTES: u64 = 1024 * 1024;

/// What the worker tells the runner about the job, beside `mcp.json`: how to check that file, what
/// to withhold, the job's model rules and its routes on the host. None of it reaches pi or a
/// server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunnerInput {
    /// The digest of `mcp.json` ([`crate::job_mcp::digest`]), when the job names servers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_digest: Option<String>,
    /// `run.excludeTools`: the runner passes them to pi and withholds the MCP tools they match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude_tools: Vec<String>,
    /// The overlay's `codemodeModels`, for a job that names no server (one that does has it in
    /// its `mcp.json`).
    #[serde(default = "on")]
    pub codemode_models: bool,
    /// `run.models`: the only models the runner's model gateway lets pi call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    /// `run.maxCostUsd`: the most the gateway lets the job spend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
    /// With egress on, the job's routes to hosts on the worker's own machine (`host:port`), which
    /// the runner serves on the job's loopback.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub loopback: Vec<String>,
    /// The pins of the job's servers that have one, by server name: the hub withholds (or, as
    /// `pin_policy` says, refuses or accepts) what differs from them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pins: BTreeMap<String, crate::pins::Listing>,
    /// `run.pins`.
    #[serde(default, skip_serializing_if = "crate::pins::PinPolicy::is_default")]
    pub pin_policy: crate::pins::PinPolicy,
    /// Connect the servers, say what they list, and end: no agent runs (`mcp pin`, whose
    /// listing becomes the servers' pins).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub list_only: bool,
}

fn on() -> bool {
    true
}

impl Default for RunnerInput {
    /// A runner started by hand: no servers to check, nothing withheld, no rules.
    fn default() -> RunnerInput {
        RunnerInput {
            mcp_digest: None,
            exclude_tools: Vec::new(),
            codemode_models: true,
            models: None,
            max_cost_usd: None,
            loopback: Vec::new(),
            pins: BTreeMap::new(),
            pin_policy: crate::pins::PinPolicy::default(),
            list_only: false,
        }
    }
}

/// Why the runner's input cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("{RUNNER_INPUT} cannot be read ({0})")]
    Unreadable(std::io::ErrorKind),
    #[error("{RUNNER_INPUT} is larger than {MAX_INPUT_BYTES} bytes")]
    TooLarge,
    #[error("{RUNNER_INPUT} is not the runner's input (at line {line}, column {column})")]
    Invalid { line: usize, column: usize },
}

impl RunnerInput {
    /// The file's text, as the worker writes it.
    pub fn to_text(&self) -> String {
        // Plain strings, booleans and a finite number always serialize.
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }

    /// Reads `dir/runner.json`; a folder without one is a runner started by hand
    /// ([`RunnerInput::default`]).
    pub fn read(dir: &Path) -> Result<RunnerInput, InputError> {
        use std::io::Read as _;
        let file = match std::fs::File::open(dir.join(RUNNER_INPUT)) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(RunnerInput::default());
            }
            Err(e) => return Err(InputError::Unreadable(e.kind())),
        };
        let mut bytes = Vec::new();
        file.take(MAX_INPUT_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| InputError::Unreadable(e.kind()))?;
        if bytes.len() as u64 > MAX_INPUT_BYTES {
            return Err(InputError::TooLarge);
        }
        serde_json::from_slice(&bytes).map_err(|e| InputError::Invalid {
            line: e.line(),
            column: e.column(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_input_reads_back_as_written_and_a_missing_file_is_a_runner_by_hand() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            RunnerInput::read(dir.path()).unwrap(),
            RunnerInput::default()
        );
        let input = RunnerInput {
            mcp_digest: Some("ab".repeat(32)),
            exclude_tools: vec!["mcp__docs__*".into()],
            codemode_models: false,
            models: Some(vec!["fake/m1".into()]),
            max_cost_usd: Some(0.5),
            loopback: vec!["127.0.0.1:8080".into()],
            pins: BTreeMap::from([(
                "docs".to_owned(),
                crate::pins::Listing::of(
                    crate::pins::ServerInfo::default(),
                    [("echo", r#"{"name": "echo"}"#)],
                ),
            )]),
            pin_policy: crate::pins::PinPolicy::Refuse,
            list_only: true,
        };
        std::fs::write(dir.path().join(RUNNER_INPUT), input.to_text()).unwrap();
        assert_eq!(RunnerInput::read(dir.path()).unwrap(), input);
    }

    #[test]
    fn an_input_that_is_not_the_workers_is_refused_without_its_text() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(RUNNER_INPUT);
        std::fs::write(&file, r#"{"mcpDigest": "x", "secret": "cnry-41"}"#).unwrap();
        let e = RunnerInput::read(dir.path()).unwrap_err().to_string();
        assert!(e.contains(RUNNER_INPUT) && !e.contains("cnry-41"), "{e}");
        std::fs::write(&file, vec![b' '; 2 * MAX_INPUT_BYTES as usize]).unwrap();
        assert!(matches!(
            RunnerInput::read(dir.path()),
            Err(InputError::TooLarge)
        ));
    }

    #[test]
    fn eight_servers_pins_of_the_most_tools_fit_the_input() {
        use crate::pins::{Listing, MAX_PINNED_TOOLS, ServerInfo, digest};
        const ECHO: &str = r#"{"name": "echo", "description": "Echoes"}"#;
        let names: Vec<String> = (0..MAX_PINNED_TOOLS).map(|n| format!("t{n:04}")).collect();
        let listing = Listing::of(
            ServerInfo::default(),
            names.iter().map(|n| (n.as_str(), ECHO)),
        );
        // Eight servers of the most tools each fit the runner's input.
        let input = RunnerInput {
            pins: (0..8)
                .map(|s| (format!("server-{s}"), listing.clone()))
                .collect(),
            ..Default::default()
        };
        let long_names = Listing {
            tools: (0..MAX_PINNED_TOOLS)
                .map(|n| (format!("{n:0>128}"), digest(ECHO)))
                .collect(),
            ..Listing::default()
        };
        let worst = RunnerInput {
            pins: (0..8)
                .map(|s| (format!("server-{s}"), long_names.clone()))
                .collect(),
            ..Default::default()
        };
        assert!(input.to_text().len() < worst.to_text().len());
        assert!(
            worst.to_text().len() < 1024 * 1024,
            "{}",
            worst.to_text().len()
        );
    }
}
