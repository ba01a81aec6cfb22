//! The pins as pages show them: on a run's page, what the job made of each server's pin (pinned on
//! first use, or each tool that differed, both digests cut short, and the trigger's policy); and
//! the pins page, with the servers whose drift waits for the operator's approval. Every name a
//! server sent is shown as text, without control characters.
//!
//! On the job's path: after it: the operator reads what the worker kept of the servers' listings.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use protocol::pins::{PinPolicy, PinReport, StoredDrift};
use records::record::Record;

use crate::Panel;
use crate::auth::Authed;
use crate::pins::{self, Entry, ServerPins, printable, short_digest};
use crate::view::{Section, count, frame, pill, when};

/// The most tools of one server's drift named on the pins page.
const NAMED: usize = 20;

/// What the policy made of a tool that differed.
fn policy_did(policy: PinPolicy) -> &'static str {
    match policy {
        PinPolicy::Withhold => "withheld: kept from pi",
        PinPolicy::Refuse => "refused: the job ended before its prompt",
        PinPolicy::Accept => "accepted: offered, and the pin follows the server",
    }
}

/// A run's section on pins: each server pinned by the job, and each tool that differed.
pub fn run_pins(r: &Record) -> Markup {
    html! {
        h2 { "Pins" }
        @if r.mcp.pins.is_empty() {
            p.muted { "No server was pinned by this job, and every tool listed matched its pin." }
        } @else {
            table #pins {
                thead { tr {
                    th { "Server" } th { "Tool" } th { "What" } th { "Pinned" } th { "Seen" }
                    th { "Policy" }
                } }
                tbody { @for report in &r.mcp.pins { (report_rows(report)) } }
            }
        }
    }
}

fn report_rows(report: &PinReport) -> Markup {
    let policy = report.policy.as_str();
    html! {
        @if report.first_use {
            tr {
                td { (report.server) } td {} td { "first use: pinned by this job" } td {} td {}
                td { (policy) }
            }
        }
        @for d in &report.drift {
            tr {
                td { (report.server) }
                td { code { (printable(&d.tool)) } }
                td { (d.kind.as_str()) }
                td { @match &d.pinned { Some(p) => code { (short_digest(p)) }, None => "—" } }
                td { code { (short_digest(&d.seen)) } }
                td { (policy_did(report.policy)) }
            }
        }
        @for tool in &report.gone {
            tr {
                td { (report.server) } td { code { (printable(tool)) } } td { "gone" } td {} td {}
                td { "no longer listed: nothing to keep from pi" }
            }
        }
        @if report.unpinnable > 0 {
            tr {
                td { (report.server) } td { (report.unpinnable) " tools" }
                td { "past a pin's bounds (too many, or too long a name)" } td {} td {}
                td { "withheld: kept from pi under every policy" }
            }
        }
    }
}

/// How many servers have drift waiting for approval; `None` when the store cannot be read.
pub async fn waiting(panel: &Arc<Panel>) -> Option<usize> {
    let queue = panel.queue.clone();
    tokio::task::spawn_blocking(move || pins::read(&*queue).ok())
        .await
        .ok()
        .flatten()
        .map(|all| all.iter().filter(|s| s.drift_waits()).count())
}

/// `/pins`: the servers with drift waiting for approval, then every pin the store keeps.
pub async fn page(State(panel): State<Arc<Panel>>, authed: Authed) -> Response {
    let queue = panel.queue.clone();
    let read = tokio::task::spawn_blocking(move || pins::read(&*queue).map_err(|e| e.to_string()))
        .await
        .unwrap_or_else(|_| Err("the queue's store could not be read".to_owned()));
    let body = html! {
        h1 { "Pins" }
        p.muted {
            "A server's pin is what it listed when it was approved. A job offers pi only the tools "
            "that match it; what differed is noted here until it is approved. "
            "See what changed with " code { "pi-dispatch mcp pins diff NAME" }
            "; approve it with " code { "pi-dispatch mcp pin NAME" } "."
        }
        @match &read {
            Err(e) => p.error { "The pins cannot be read from the queue's store: " (e) },
            Ok(all) => (pins_body(all)),
        }
    };
    let markup = frame("Pins", Some(Section::Pins), &authed.csrf, None, &body);
    (StatusCode::OK, axum::response::Html(markup.into_string())).into_response()
}

fn pins_body(all: &[ServerPins]) -> Markup {
    let waiting: Vec<&ServerPins> = all.iter().filter(|s| s.drift_waits()).collect();
    html! {
        h2 { "Drift waiting for approval" }
        @if waiting.is_empty() {
            p #no-drift { "No server has drift waiting for approval." }
        } @else {
            table #pending {
                thead { tr { th { "Server" } th { "Tools" } th { "Seen by" } th { "When" } } }
                tbody { @for s in &waiting { (pending_row(s)) } }
            }
        }
        h2 { "Pinned servers" }
        @if all.iter().all(|s| s.pin.is_none()) {
            p.muted { "No server is pinned yet: each is pinned by the first job that connects it." }
        } @else {
            table #pinned {
                thead { tr { th { "Server" } th.num { "Tools" } th { "Pinned by" } th { "When" } } }
                tbody { @for s in all { @if let Some(pin) = &s.pin { (pin_row(&s.server, pin)) } } }
            }
        }
    }
}

fn pending_row(s: &ServerPins) -> Markup {
    html! {
        tr {
            td { (printable(&s.server)) }
            @match (s.pending(), &s.drift) {
                (Some(drift), _) => (drift_cells(drift)),
                (None, Some(entry)) => td colspan="3" {
                    (pill("warn")) " The drift noted cannot be read: "
                    (entry.why_not().unwrap_or_default()) "."
                },
                (None, None) => td colspan="3" {},
            }
        }
    }
}

fn drift_cells(drift: &StoredDrift) -> Markup {
    let tools = &drift.comparison.drift;
    let more = tools.len().saturating_sub(NAMED);
    html! {
        td {
            (pins::kinds(drift))
            ul.tools {
                @for d in tools.iter().take(NAMED) {
                    li { code { (printable(&d.tool)) } " (" (d.kind.as_str()) ")" }
                }
                @if more > 0 { li { "and " (count(more, "more tool")) } }
            }
        }
        td {
            @if records::store::is_plain_id(&drift.job_id) {
                a href={"/runs/" (drift.job_id)} { code { (drift.job_id) } }
            } @else {
                code { (printable(&drift.job_id)) }
            }
        }
        td { (when(drift.seen_at_ms)) }
    }
}

fn pin_row(server: &str, pin: &Entry<protocol::pins::StoredPin>) -> Markup {
    html! {
        tr {
            td { (printable(server)) }
            @match pin {
                Entry::Read(p) => {
                    td.num { (p.listing.tools.len()) }
                    td { (printable(&p.by)) }
                    td { (when(p.pinned_at_ms)) }
                },
                other => td colspan="3" {
                    (pill("warn")) " The pin cannot be read: " (other.why_not().unwrap_or_default())
                    "."
                    @if *other == Entry::NotReadable {
                        " Until it is stored again (" code { "pi-dispatch mcp pin " (printable(server)) }
                        "), a job takes the server as unpinned and offers every tool it lists."
                    }
                },
            }
        }
    }
}
