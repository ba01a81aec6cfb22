//! The servers' tools held to their pins: once the job's servers are connected, and before pi
//! sees any tool, each server's listing (its name and version, each tool's digest) is held
//! against the pin the worker gave the runner. What differs is withheld from pi, ends the job, or
//! is let through, as the trigger's `run.pins` says; a server without a pin is pinned by this job.
//!
//! On the job's path: in the runner, between connecting the servers (`connect_all`) and serving
//! them to pi (`serve`); the listings go to the worker on the servers' states.

use std::collections::BTreeMap;

use protocol::exit_line::{DEFINITIONS_EVENT, Definitions, ServerState};
use protocol::job_dir::RunnerInput;
use protocol::pins::{self, Comparison, Listing, PinPolicy, ServerInfo};
use protocol::reason::Reason;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::connect::Upstream;
use crate::connect_all::Connected;
use crate::job_file::Stop;
use crate::output::write_output;
use crate::relay::Withheld;
use crate::runner::Runner;

/// The longest server name or version kept as written, in bytes; a longer one is kept as its
/// digest (still a change when it changes).
const MAX_INFO: usize = 256;

/// Holds every connected server to its pin: the tools that differ withheld (or let through), the
/// listings on the servers' states; under `refuse`, a server that differs stops the job.
pub fn hold(
    connected: Connected,
    input: &RunnerInput,
) -> Result<Connected, (Stop, Vec<ServerState>)> {
    let listed = listings(&connected);
    hold_listed(connected, input, listed)
}

/// What each server of `connected` listed (in its order), each tool digested once: the listing a
/// pin holds, and the definitions in canonical form.
pub fn listings(connected: &Connected) -> Vec<Listed> {
    connected
        .upstreams
        .iter()
        .map(|(upstream, _)| listing_of(upstream))
        .collect()
}

/// One server's listing, with its tools' definitions in canonical form.
pub type Listed = (Listing, BTreeMap<String, String>);

/// [`hold`], with the listings already taken ([`listings`]).
pub fn hold_listed(
    mut connected: Connected,
    input: &RunnerInput,
    listed: Vec<Listed>,
) -> Result<Connected, (Stop, Vec<ServerState>)> {
    let mut refused: Vec<(String, Comparison)> = Vec::new();
    for ((upstream, withheld), (listing, _)) in connected.upstreams.iter_mut().zip(listed) {
        let comparison = pins::compare(input.pins.get(&upstream.name), &listing);
        withhold_unpinnable(upstream, &listing, withheld);
        match input.pin_policy {
            PinPolicy::Withhold => withhold_drift(&comparison, withheld),
            PinPolicy::Refuse if !comparison.drift.is_empty() => {
                refused.push((upstream.name.clone(), comparison));
            }
            PinPolicy::Refuse | PinPolicy::Accept => {}
        }
        if let Some(state) = connected
            .states
            .iter_mut()
            .find(|s| s.name == upstream.name)
        {
            state.listing = Some(listing);
        }
    }
    match refused.first() {
        None => Ok(connected),
        Some((server, comparison)) => Err((refusal(server, comparison), connected.states)),
    }
}

/// Tells the worker each ready server's tools' definitions, in canonical form, on a line signed
/// with the job's key (when the runner has one): what a pin keeps for its diff. The lines are made
/// and written off the job's path, and the runner waits for them before its exit line
/// ([`Runner::said`]); the worker keeps only the definitions whose digest is on the exit line.
pub(crate) fn say_definitions(runner: &Runner, connected: &Connected, listed: &[Listed]) {
    let Some(key) = runner.job.key.clone() else {
        return;
    };
    let job_id = runner.job.job_id.clone();
    let servers: Vec<(String, BTreeMap<String, String>)> = connected
        .upstreams
        .iter()
        .zip(listed)
        .map(|((upstream, _), (_, texts))| (upstream.name.clone(), texts.clone()))
        .collect();
    let handle = tokio::spawn(async move {
        let made = tokio::task::spawn_blocking(move || {
            servers
                .into_iter()
                .filter_map(|(server, tools)| sign(&job_id, key.as_bytes(), server, tools))
                .collect::<Vec<String>>()
        })
        .await;
        for line in made.unwrap_or_default() {
            write_output(format!("{line}\n").as_bytes()).await;
        }
    });
    if let Ok(mut saying) = runner.saying.lock() {
        saying.push(handle);
    }
}

fn sign(
    job_id: &str,
    key: &[u8],
    server: String,
    tools: BTreeMap<String, String>,
) -> Option<String> {
    let definitions = Definitions {
        event: DEFINITIONS_EVENT.to_owned(),
        job_id: job_id.to_owned(),
        server,
        tools,
    };
    definitions.sign(key).ok()
}

/// The signed definitions line of each server of `connected`, from what it `listed` (the tools a
/// pin holds, each in canonical form).
pub fn definitions_lines(
    job_id: &str,
    key: &[u8],
    connected: &Connected,
    listed: &[Listed],
) -> Vec<String> {
    connected
        .upstreams
        .iter()
        .zip(listed)
        .filter_map(|((upstream, _), (_, texts))| {
            sign(job_id, key, upstream.name.clone(), texts.clone())
        })
        .collect()
}

/// What `upstream` listed at connect, as a pin holds it, with its definitions.
fn listing_of(upstream: &Upstream) -> Listed {
    let info = upstream.info().get("serverInfo");
    let field = |key: &str| {
        info.and_then(|i| i.get(key))
            .and_then(Value::as_str)
            .map(bounded)
    };
    let server = ServerInfo {
        name: field("name"),
        version: field("version"),
    };
    Listing::with_texts(
        server,
        upstream
            .tools
            .iter()
            .map(|t| (t.name.as_str(), t.definition.get())),
    )
}

/// `text` as written, or its digest when it is longer than [`MAX_INFO`] bytes.
fn bounded(text: &str) -> String {
    if text.len() <= MAX_INFO {
        return text.to_owned();
    }
    let digest = Sha256::digest(text.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// A tool past a pin's bounds (too many tools, too long a name) is never in a listing, so never
/// pinned: it is withheld whatever the policy.
fn withhold_unpinnable(upstream: &Upstream, listing: &Listing, withheld: &mut Withheld) {
    for tool in &upstream.tools {
        if !listing.tools.contains_key(&tool.name) && !withheld.contains(&tool.name) {
            withheld.0.push(tool.name.clone());
        }
    }
}

/// Every tool that differs from its pin, withheld.
fn withhold_drift(comparison: &Comparison, withheld: &mut Withheld) {
    for drift in &comparison.drift {
        if !withheld.contains(&drift.tool) {
            withheld.0.push(drift.tool.clone());
        }
    }
}

/// The stop of a job whose trigger refuses drift: the first server that differs, and how many of
/// its tools do, by kind (names of tools, never what they say).
fn refusal(server: &str, comparison: &Comparison) -> Stop {
    let tools: Vec<String> = comparison
        .drift
        .iter()
        .take(8)
        .map(|d| format!("{} ({})", d.tool, d.kind.as_str()))
        .collect();
    let more = comparison.drift.len().saturating_sub(tools.len());
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    Stop::new(
        Reason::ToolDrift,
        Some(server),
        format!(
            "{} of its tools differ from the pin: {}{more}",
            comparison.drift.len(),
            tools.join(", ")
        ),
    )
}
