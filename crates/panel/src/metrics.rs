//! Prometheus metrics (the text exposition format, version 0.0.4) at `/metrics`: the records
//! counted (jobs by outcome and reason, durations, servers' ready times, tool calls, egress
//! denials, tokens and cost) and the queue as it stands (depth, running). Counts come from the
//! records, so they match `pi-dispatch runs`; they only grow while records are kept.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use records::record::Record;

use crate::Panel;
use crate::auth::may_read_metrics;

/// The queue's gauges; `None` when the queue cannot be read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueGauges {
    /// Queued now or waiting to be retried.
    pub depth: usize,
    /// Held by a worker whose lease is current (those being cancelled included).
    pub running: usize,
    /// Held by a worker whose lease lapsed, or lost on their last attempt.
    pub lost: usize,
}

const JOB_BUCKETS: [f64; 11] = [
    1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0,
];
const READY_BUCKETS: [f64; 9] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// A label value as the format writes it inside quotes.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// `{a="x",b="y"}`.
fn labels(pairs: &[(&str, &str)]) -> String {
    let inner: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    format!("{{{}}}", inner.join(","))
}

/// Observations of one histogram, by their labels.
#[derive(Default)]
struct Histogram {
    series: BTreeMap<String, (Vec<u64>, f64, u64)>,
}

impl Histogram {
    fn observe(&mut self, buckets: &[f64], pairs: &[(&str, &str)], value: f64) {
        let entry = self
            .series
            .entry(labels(pairs))
            .or_insert_with(|| (vec![0; buckets.len()], 0.0, 0));
        for (i, le) in buckets.iter().enumerate() {
            if value <= *le {
                entry.0[i] += 1;
            }
        }
        entry.1 += value;
        entry.2 += 1;
    }

    fn write(&self, out: &mut String, name: &str, help: &str, buckets: &[f64]) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (pairs, (counts, sum, count)) in &self.series {
            // `{a="x"}` → `a="x",` to put before `le`.
            let lead = pairs.trim_start_matches('{').trim_end_matches('}');
            let lead = if lead.is_empty() {
                String::new()
            } else {
                format!("{lead},")
            };
            for (le, n) in buckets.iter().zip(counts) {
                let _ = writeln!(out, "{name}_bucket{{{lead}le=\"{le}\"}} {n}");
            }
            let _ = writeln!(out, "{name}_bucket{{{lead}le=\"+Inf\"}} {count}");
            let _ = writeln!(out, "{name}_sum{pairs} {sum}");
            let _ = writeln!(out, "{name}_count{pairs} {count}");
        }
    }
}

fn counter<K: AsRef<str>>(out: &mut String, name: &str, help: &str, values: &BTreeMap<K, f64>) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
    for (pairs, v) in values {
        let _ = writeln!(out, "{name}{} {v}", pairs.as_ref());
    }
}

fn gauge(out: &mut String, name: &str, help: &str, value: f64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
    );
}

/// The counts the records make, kept as records are read: a record is written once, so adding
/// each new one is exact, and a scrape renders the counts, not the records.
#[derive(Default)]
pub struct Tally {
    records: usize,
    jobs: BTreeMap<String, f64>,
    durations: Histogram,
    waits: Histogram,
    ready: Histogram,
    connections: BTreeMap<String, f64>,
    calls: BTreeMap<String, f64>,
    call_time: BTreeMap<String, (f64, u64)>,
    call_bytes: BTreeMap<String, f64>,
    denials: BTreeMap<String, f64>,
    tokens: BTreeMap<String, f64>,
    cost: BTreeMap<String, f64>,
}

impl Tally {
    /// Counts one more record.
    pub fn add(&mut self, r: &Record) {
        self.records += 1;
        let outcome = r.outcome.as_str();
        let reason = r.reason.map_or("none", |r| r.as_str());
        *self
            .jobs
            .entry(labels(&[("outcome", outcome), ("reason", reason)]))
            .or_default() += 1.0;
        if let Some(s) = r.started_at_ms {
            let secs = r.finished_at_ms.saturating_sub(s) as f64 / 1000.0;
            self.durations
                .observe(&JOB_BUCKETS, &[("outcome", outcome)], secs);
        }
        if let (Some(q), Some(s)) = (r.queued_at_ms, r.started_at_ms) {
            self.waits
                .observe(&JOB_BUCKETS, &[], s.saturating_sub(q) as f64 / 1000.0);
        }
        for s in &r.mcp.servers {
            *self
                .connections
                .entry(labels(&[("server", &s.name), ("state", &s.state)]))
                .or_default() += 1.0;
            if let Some(ms) = s.ready_ms {
                self.ready
                    .observe(&READY_BUCKETS, &[("server", &s.name)], ms as f64 / 1000.0);
            }
        }
        for c in &r.mcp.tool_calls {
            let st = [("server", c.server.as_str()), ("tool", c.tool.as_str())];
            for (result, n) in [("ok", c.ok), ("error", c.error), ("refused", c.refused)] {
                let mut p = st.to_vec();
                p.push(("result", result));
                *self.calls.entry(labels(&p)).or_default() += n as f64;
            }
            let t = self.call_time.entry(labels(&st)).or_default();
            t.0 += c.total_ms as f64 / 1000.0;
            t.1 += c.ok + c.error;
            *self.call_bytes.entry(labels(&st)).or_default() += c.result_bytes as f64;
        }
        for d in &r.egress_denied {
            let port = d.port.to_string();
            *self
                .denials
                .entry(labels(&[
                    ("host", &d.host),
                    ("port", &port),
                    ("reason", &d.reason),
                ]))
                .or_default() += d.count as f64;
        }
        let (provider, model) = (
            r.provider.as_deref().unwrap_or(""),
            r.model.as_deref().unwrap_or(""),
        );
        if let Some(t) = &r.tokens {
            for (direction, n) in [("input", t.input), ("output", t.output)] {
                *self
                    .tokens
                    .entry(labels(&[
                        ("provider", provider),
                        ("model", model),
                        ("direction", direction),
                    ]))
                    .or_default() += n as f64;
            }
        }
        if let Some(c) = r.cost_usd {
            *self
                .cost
                .entry(labels(&[("provider", provider), ("model", model)]))
                .or_default() += c;
        }
    }

    /// The counts in the text format, with the number of files that could not be read.
    pub fn render(&self, unreadable: usize) -> String {
        let mut out = String::new();
        self.render_jobs(&mut out);
        self.render_use(&mut out);
        gauge(
            &mut out,
            "pi_dispatch_records",
            "Records read.",
            self.records as f64,
        );
        gauge(
            &mut out,
            "pi_dispatch_records_unreadable",
            "Records that cannot be read as one.",
            unreadable as f64,
        );
        out
    }

    /// The jobs: how they ended, how long they ran and waited, and their servers' connections.
    fn render_jobs(&self, out: &mut String) {
        counter(
            out,
            "pi_dispatch_jobs_total",
            "Jobs ended, by outcome and reason (from the records).",
            &self.jobs,
        );
        self.durations.write(
            out,
            "pi_dispatch_job_duration_seconds",
            "From the sandbox asked for to the end, by outcome.",
            &JOB_BUCKETS,
        );
        self.waits.write(
            out,
            "pi_dispatch_job_wait_seconds",
            "From queued to the sandbox asked for.",
            &JOB_BUCKETS,
        );
        self.ready.write(
            out,
            "pi_dispatch_mcp_server_ready_seconds",
            "From the start of a job's connections to a server's tool list, by server.",
            &READY_BUCKETS,
        );
        counter(
            out,
            "pi_dispatch_mcp_server_connections_total",
            "Servers a job connected, by server and how it ended (ready, failed, waiting, skipped).",
            &self.connections,
        );
    }

    /// What the jobs used: tool calls, egress refused, model tokens and cost.
    fn render_use(&self, out: &mut String) {
        counter(
            out,
            "pi_dispatch_tool_calls_total",
            "MCP tool calls, by server, tool and result (ok, error, refused).",
            &self.calls,
        );
        let _ = writeln!(
            out,
            "# HELP pi_dispatch_tool_call_duration_seconds Time of the MCP tool calls that reached their server, by server and tool.\n# TYPE pi_dispatch_tool_call_duration_seconds summary"
        );
        for (pairs, (sum, count)) in &self.call_time {
            let _ = writeln!(
                out,
                "pi_dispatch_tool_call_duration_seconds_sum{pairs} {sum}\npi_dispatch_tool_call_duration_seconds_count{pairs} {count}"
            );
        }
        counter(
            out,
            "pi_dispatch_tool_result_bytes_total",
            "Bytes of the MCP tool calls' results, by server and tool.",
            &self.call_bytes,
        );
        counter(
            out,
            "pi_dispatch_egress_denials_total",
            "Connections the egress proxy refused jobs, by host, port and the proxy's reason.",
            &self.denials,
        );
        counter(
            out,
            "pi_dispatch_model_tokens_total",
            "Model tokens, by provider, model and direction.",
            &self.tokens,
        );
        counter(
            out,
            "pi_dispatch_model_cost_usd_total",
            "Model cost in US dollars, by provider and model.",
            &self.cost,
        );
    }
}

/// What changes from one scrape to the next: the queue's gauges and when the records were read.
fn of_the_moment(queue: Option<QueueGauges>, read_at: Option<SystemTime>) -> String {
    let mut out = String::new();
    if let Some(q) = queue {
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
    }
    gauge(
        &mut out,
        "pi_dispatch_queue_up",
        "Whether the queue could be read for these metrics.",
        if queue.is_some() { 1.0 } else { 0.0 },
    );
    if let Some(at) = read_at {
        let secs = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        gauge(
            &mut out,
            "pi_dispatch_records_read_timestamp_seconds",
            "When the records were last read (Unix seconds).",
            secs,
        );
    }
    out
}

/// The queue's gauges now.
fn queue_gauges(queue: &dyn queue::Queue) -> Option<QueueGauges> {
    let now = SystemTime::now();
    let status = queue.status(now, 0).ok()?;
    let mut g = QueueGauges::default();
    for job in &status.open {
        match records::open_jobs::shown(job, now).state {
            "queued" | "waiting" => g.depth += 1,
            "running" | "cancelling" => g.running += 1,
            _ => g.lost += 1,
        }
    }
    Some(g)
}

pub async fn metrics(State(panel): State<Arc<Panel>>, headers: HeaderMap) -> Response {
    if !may_read_metrics(&panel, &headers) {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "the metrics need the panel's token as a bearer token\n",
        )
            .into_response();
    }
    let p = panel.clone();
    let text = tokio::task::spawn_blocking(move || {
        let snapshot = p.snapshot.get();
        let mut text = String::clone(&snapshot.metrics);
        text.push_str(&of_the_moment(queue_gauges(&*p.queue), snapshot.read_at));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_value_is_escaped_as_the_format_says() {
        assert_eq!(
            labels(&[("server", "a\"b\\c\nd")]),
            r#"{server="a\"b\\c\nd"}"#
        );
    }

    #[test]
    fn a_histogram_counts_each_bucket_up_to_its_bound() {
        let mut h = Histogram::default();
        h.observe(&[1.0, 5.0], &[("outcome", "completed")], 3.0);
        h.observe(&[1.0, 5.0], &[("outcome", "completed")], 0.5);
        let mut out = String::new();
        h.write(&mut out, "x", "help", &[1.0, 5.0]);
        assert!(
            out.contains("x_bucket{outcome=\"completed\",le=\"1\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("x_bucket{outcome=\"completed\",le=\"5\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains("x_bucket{outcome=\"completed\",le=\"+Inf\"} 2\n"),
            "{out}"
        );
        assert!(out.contains("x_sum{outcome=\"completed\"} 3.5\n"), "{out}");
    }
}
