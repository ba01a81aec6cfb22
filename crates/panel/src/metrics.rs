//! Prometheus metrics (the text exposition format, version 0.0.4) at `/metrics`: the deployment's
//! counters (jobs by outcome and reason, durations, servers' ready times, tool calls, tools
//! withheld by pins, egress denials, tokens and cost), which each record adds to as it is stored
//! and which pruning never lowers (`records::counts`), so they are exact across restarts; the
//! queue as it stands (depth, running); the servers whose drift from their pin waits for
//! approval; the records kept; and the disk (the state folder's bytes and the free space).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use records::workers::WorkerShown;

use crate::Panel;
use crate::auth::{Checked, may_read_metrics};

/// The queue's gauges; `None` when the queue cannot be read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueGauges {
    /// Queued now or waiting to be retried.
    pub depth: usize,
    /// Held by a worker whose lease is current (those being cancelled included).
    pub running: usize,
    /// Held by a worker whose lease lapsed, or lost on their last attempt.
    pub lost: usize,
    /// Queued, and no live worker carries the labels they need.
    pub waiting_for_host: usize,
    /// The workers as they announced themselves.
    pub workers: Vec<WorkerShown>,
}

/// A label's value as the text format writes it.
fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The workers: how many in each state, and each one's last sighting and running jobs.
fn workers_gauges(out: &mut String, workers: &[WorkerShown]) {
    let _ = writeln!(
        out,
        "# HELP pi_dispatch_workers Workers by state: live, draining (taking no new job), gone (unseen past the bound).\n# TYPE pi_dispatch_workers gauge"
    );
    for state in ["live", "draining", "gone"] {
        let n = workers.iter().filter(|w| w.state == state).count();
        let _ = writeln!(out, "pi_dispatch_workers{{state=\"{state}\"}} {n}");
    }
    let each = |out: &mut String, name: &str, help: &str, value: fn(&WorkerShown) -> u64| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for w in workers {
            let _ = writeln!(
                out,
                "{name}{{worker=\"{}\",host=\"{}\"}} {}",
                label_value(&w.card.id),
                label_value(&w.card.host),
                value(w)
            );
        }
    };
    each(
        out,
        "pi_dispatch_worker_seen_seconds",
        "Seconds since each worker last announced itself.",
        |w| w.seen_secs_ago,
    );
    each(
        out,
        "pi_dispatch_worker_jobs_running",
        "Jobs each worker ran when it last announced itself.",
        |w| u64::from(w.card.running),
    );
}

fn gauge(out: &mut String, name: &str, help: &str, value: f64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
    );
}

/// The disk: the deployment's bytes (measured at most once a minute) and the free space.
#[derive(Default)]
pub struct DiskGauges {
    used: std::sync::Mutex<Option<(std::time::Instant, u64)>>,
}

/// How long a measure of the deployment's bytes is shown before it is taken again.
const USED_FOR: std::time::Duration = std::time::Duration::from_secs(60);

impl DiskGauges {
    fn render(&self, out: &mut String, state: &std::path::Path) {
        let used = {
            let mut last = self
                .used
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match *last {
                Some((at, bytes)) if at.elapsed() < USED_FOR => bytes,
                _ => {
                    let bytes = config::files::used_bytes(state);
                    *last = Some((std::time::Instant::now(), bytes));
                    bytes
                }
            }
        };
        gauge(
            out,
            "pi_dispatch_state_bytes",
            "Bytes the deployment's state folder takes on disk (queue, records, job folders, transcripts).",
            used as f64,
        );
        if let Ok(free) = config::files::free_bytes(state) {
            gauge(
                out,
                "pi_dispatch_state_free_bytes",
                "Bytes free on the state folder's file system.",
                free as f64,
            );
        }
    }
}

/// What changes from one scrape to the next: the queue's gauges and how many records are kept.
fn of_the_moment(queue: Option<QueueGauges>, records: Option<u64>) -> String {
    let mut out = String::new();
    if let Some(q) = &queue {
        gauge(
            &mut out,
            "pi_dispatch_queue_depth",
            "Jobs queued or waiting to be retried.",
            q.depth as f64,
        );
        gauge(
            &mut out,
            "pi_dispatch_jobs_running",
            "Jobs held by a worker whose lease is current.",
            q.running as f64,
        );
        gauge(
            &mut out,
            "pi_dispatch_jobs_lost",
            "Jobs whose worker stopped renewing its lease.",
            q.lost as f64,
        );
        gauge(
            &mut out,
            "pi_dispatch_jobs_waiting_for_host",
            "Jobs queued that no live worker carries the labels for.",
            q.waiting_for_host as f64,
        );
        workers_gauges(&mut out, &q.workers);
    }
    gauge(
        &mut out,
        "pi_dispatch_queue_up",
        "Whether the queue could be read for these metrics.",
        if queue.is_some() { 1.0 } else { 0.0 },
    );
    if let Some(n) = records {
        gauge(
            &mut out,
            "pi_dispatch_records",
            "Records kept (older ones are pruned; the counters keep what they counted).",
            n as f64,
        );
    }
    out
}

/// The servers whose drift from their pin waits for approval (left out when the store's pins
/// cannot be read).
fn pins_gauge(out: &mut String, queue: &dyn queue::Queue) {
    if let Ok(all) = crate::pins::read(queue) {
        gauge(
            out,
            "pi_dispatch_pin_drift_waiting_servers",
            "Servers whose last job saw tools differ from their pin, not yet approved (pi-dispatch mcp pin).",
            all.iter().filter(|s| s.drift_waits()).count() as f64,
        );
    }
}

/// The queue's gauges now.
fn queue_gauges(queue: &dyn queue::Queue, gone_after: std::time::Duration) -> Option<QueueGauges> {
    let now = SystemTime::now();
    let status = queue.status(now, 0).ok()?;
    let workers = records::workers::shown(&queue.workers().ok()?, now, gone_after);
    let mut open: Vec<_> = status
        .open
        .iter()
        .map(|job| records::open_jobs::shown(job, now))
        .collect();
    records::open_jobs::place(&mut open, &workers);
    let mut g = QueueGauges {
        workers,
        ..QueueGauges::default()
    };
    for job in &open {
        match job.state {
            "waiting-for-host" => {
                g.depth += 1;
                g.waiting_for_host += 1;
            }
            "queued" | "waiting" => g.depth += 1,
            "running" | "cancelling" => g.running += 1,
            _ => g.lost += 1,
        }
    }
    Some(g)
}

pub async fn metrics(
    State(panel): State<Arc<Panel>>,
    client: crate::client::Client,
    headers: HeaderMap,
) -> Response {
    match may_read_metrics(&panel, &headers, &client) {
        Checked::Right => {}
        Checked::Wrong => {
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                "the metrics need the panel's token as a bearer token\n",
            )
                .into_response();
        }
        Checked::Throttled => {
            return (
                StatusCode::TOO_MANY_REQUESTS,
                "too many wrong tokens from this client in the last minute\n",
            )
                .into_response();
        }
    }
    let p = panel.clone();
    let text = tokio::task::spawn_blocking(move || {
        let (counters, records_up) = match p.records.counters() {
            Ok(c) => (c, 1.0),
            Err(e) => {
                tracing::warn!(event = "panel_records_unreadable", detail = %e);
                (Vec::new(), 0.0)
            }
        };
        let mut text = records::counts::render(&counters);
        gauge(
            &mut text,
            "pi_dispatch_records_up",
            "Whether the records could be read for these metrics.",
            records_up,
        );
        text.push_str(&of_the_moment(
            queue_gauges(&*p.queue, p.worker_gone_after),
            p.records.count().ok(),
        ));
        pins_gauge(&mut text, &*p.queue);
        p.disk.render(&mut text, &p.state_dir);
        text
    })
    .await
    .unwrap_or_default();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}
