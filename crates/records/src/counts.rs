//! What each record adds to the deployment's counters (the Prometheus series `/metrics` shows:
//! jobs by outcome and reason, durations, servers' ready times, tool calls, tools withheld by
//! pins, egress denials, tokens and cost), and those counters in the text format. The store adds a record's counts when it
//! stores the record, in the same step, and pruning a record takes nothing back: the counters are
//! exact whatever was pruned and however often the panel restarts.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use protocol::pins::PinPolicy;

use crate::record::Record;

const JOB_BUCKETS: [f64; 11] = [
    1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0,
];
const READY_BUCKETS: [f64; 9] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Counter,
    /// With its buckets' bounds.
    Histogram(&'static [f64]),
    Summary,
}

/// Every family, in the order they are shown: name, kind, help.
const FAMILIES: [(&str, Kind, &str); 12] = [
    (
        "pi_dispatch_jobs_total",
        Kind::Counter,
        "Jobs ended, by outcome and reason (from the records).",
    ),
    (
        "pi_dispatch_job_duration_seconds",
        Kind::Histogram(&JOB_BUCKETS),
        "From the sandbox asked for to the end, by outcome.",
    ),
    (
        "pi_dispatch_job_wait_seconds",
        Kind::Histogram(&JOB_BUCKETS),
        "From queued to the sandbox asked for.",
    ),
    (
        "pi_dispatch_mcp_server_ready_seconds",
        Kind::Histogram(&READY_BUCKETS),
        "From the start of a job's connections to a server's tool list, by server.",
    ),
    (
        "pi_dispatch_mcp_server_connections_total",
        Kind::Counter,
        "Servers a job connected, by server and how it ended (ready, failed, waiting, skipped).",
    ),
    (
        "pi_dispatch_tool_calls_total",
        Kind::Counter,
        "MCP tool calls, by server, tool and result (ok, error, refused).",
    ),
    (
        "pi_dispatch_tool_call_duration_seconds",
        Kind::Summary,
        "Time of the MCP tool calls that reached their server, by server and tool.",
    ),
    (
        "pi_dispatch_tool_result_bytes_total",
        Kind::Counter,
        "Bytes of the MCP tool calls' results, by server and tool.",
    ),
    (
        "pi_dispatch_pin_withheld_tools_total",
        Kind::Counter,
        "Tools kept from pi because they differed from their server's pin, by server and kind (new, changed, server-changed).",
    ),
    (
        "pi_dispatch_egress_denials_total",
        Kind::Counter,
        "Connections the egress proxy refused jobs, by the proxy's reason (the hosts are in each job's record: a job chooses them).",
    ),
    (
        "pi_dispatch_model_tokens_total",
        Kind::Counter,
        "Model tokens, by provider, model and direction.",
    ),
    (
        "pi_dispatch_model_cost_usd_total",
        Kind::Counter,
        "Model cost in US dollars, by provider and model.",
    ),
];

/// A label value as the format writes it inside quotes.
pub fn escape(value: &str) -> String {
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
pub fn labels(pairs: &[(&str, &str)]) -> String {
    let inner: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    format!("{{{}}}", inner.join(","))
}

/// What one record adds, series by series.
#[derive(Default)]
struct Adds(BTreeMap<String, f64>);

impl Adds {
    fn add(&mut self, name: &str, pairs: &[(&str, &str)], amount: f64) {
        *self
            .0
            .entry(format!("{name}{}", labels(pairs)))
            .or_default() += amount;
    }

    /// One observation of a histogram: each bucket it falls in, `+Inf`, the sum and the count.
    fn observe(&mut self, name: &str, buckets: &[f64], pairs: &[(&str, &str)], value: f64) {
        let bucket = format!("{name}_bucket");
        for le in buckets.iter().filter(|le| value <= **le) {
            let le = le.to_string();
            let mut p = pairs.to_vec();
            p.push(("le", &le));
            self.add(&bucket, &p, 1.0);
        }
        let mut p = pairs.to_vec();
        p.push(("le", "+Inf"));
        self.add(&bucket, &p, 1.0);
        self.add(&format!("{name}_sum"), pairs, value);
        self.add(&format!("{name}_count"), pairs, 1.0);
    }
}

/// What `r` adds to the counters.
pub fn of(r: &Record) -> Vec<(String, f64)> {
    let mut a = Adds::default();
    jobs(&mut a, r);
    calls(&mut a, r);
    model(&mut a, r);
    a.0.into_iter().collect()
}

fn jobs(a: &mut Adds, r: &Record) {
    let outcome = r.outcome.as_str();
    let reason = r.reason.map_or("none", |r| r.as_str());
    a.add(
        "pi_dispatch_jobs_total",
        &[("outcome", outcome), ("reason", reason)],
        1.0,
    );
    if let Some(s) = r.started_at_ms {
        let secs = r.finished_at_ms.saturating_sub(s) as f64 / 1000.0;
        let pairs = [("outcome", outcome)];
        a.observe(
            "pi_dispatch_job_duration_seconds",
            &JOB_BUCKETS,
            &pairs,
            secs,
        );
    }
    if let (Some(q), Some(s)) = (r.queued_at_ms, r.started_at_ms) {
        let secs = s.saturating_sub(q) as f64 / 1000.0;
        a.observe("pi_dispatch_job_wait_seconds", &JOB_BUCKETS, &[], secs);
    }
    for s in &r.mcp.servers {
        let pairs = [("server", s.name.as_str()), ("state", s.state.as_str())];
        a.add("pi_dispatch_mcp_server_connections_total", &pairs, 1.0);
        if let Some(ms) = s.ready_ms {
            let pairs = [("server", s.name.as_str())];
            let secs = ms as f64 / 1000.0;
            a.observe(
                "pi_dispatch_mcp_server_ready_seconds",
                &READY_BUCKETS,
                &pairs,
                secs,
            );
        }
    }
}

fn calls(a: &mut Adds, r: &Record) {
    for c in &r.mcp.tool_calls {
        let st = [("server", c.server.as_str()), ("tool", c.tool.as_str())];
        for (result, n) in [("ok", c.ok), ("error", c.error), ("refused", c.refused)] {
            let mut p = st.to_vec();
            p.push(("result", result));
            a.add("pi_dispatch_tool_calls_total", &p, n as f64);
        }
        let name = "pi_dispatch_tool_call_duration_seconds";
        a.add(&format!("{name}_sum"), &st, c.total_ms as f64 / 1000.0);
        a.add(&format!("{name}_count"), &st, (c.ok + c.error) as f64);
        let bytes = c.result_bytes as f64;
        a.add("pi_dispatch_tool_result_bytes_total", &st, bytes);
    }
    // By server and kind only: a tool's name is the server's to choose.
    for p in r
        .mcp
        .pins
        .iter()
        .filter(|p| p.policy == PinPolicy::Withhold)
    {
        for d in &p.drift {
            let pairs = [("server", p.server.as_str()), ("kind", d.kind.as_str())];
            a.add("pi_dispatch_pin_withheld_tools_total", &pairs, 1.0);
        }
    }
    // A tool past a pin's bounds is withheld under every policy.
    for p in r.mcp.pins.iter().filter(|p| p.unpinnable > 0) {
        let pairs = [("server", p.server.as_str()), ("kind", "unpinnable")];
        a.add(
            "pi_dispatch_pin_withheld_tools_total",
            &pairs,
            f64::from(p.unpinnable),
        );
    }
    // By reason only: a label value a job chooses (a host, a port) would let a job grow the
    // series without end.
    for d in &r.egress_denied {
        let reason = match d.reason.as_str() {
            r if protocol::egress::REASONS.contains(&r) => r,
            _ => "other",
        };
        a.add(
            "pi_dispatch_egress_denials_total",
            &[("reason", reason)],
            d.count as f64,
        );
    }
}

fn model(a: &mut Adds, r: &Record) {
    let provider = r.provider.as_deref().unwrap_or("");
    let model = r.model.as_deref().unwrap_or("");
    if let Some(t) = &r.tokens {
        for (direction, n) in [("input", t.input), ("output", t.output)] {
            let pairs = [
                ("provider", provider),
                ("model", model),
                ("direction", direction),
            ];
            a.add("pi_dispatch_model_tokens_total", &pairs, n as f64);
        }
    }
    if let Some(c) = r.cost_usd {
        let pairs = [("provider", provider), ("model", model)];
        a.add("pi_dispatch_model_cost_usd_total", &pairs, c);
    }
}

/// A series' name without its labels, and its labels (`{...}`, or empty).
fn split(series: &str) -> (&str, &str) {
    series
        .find('{')
        .map_or((series, ""), |i| series.split_at(i))
}

/// A bucket's labels without its bound (`le`), as `{...}`, and the bound.
fn without_le(labels: &str) -> (String, String) {
    let inner = labels.trim_start_matches('{').trim_end_matches('}');
    let mut rest = Vec::new();
    let mut le = String::new();
    for part in inner.split(',').filter(|p| !p.is_empty()) {
        match part.strip_prefix("le=\"") {
            Some(v) => le = v.trim_end_matches('"').to_owned(),
            None => rest.push(part),
        }
    }
    (format!("{{{}}}", rest.join(",")), le)
}

/// One histogram or summary's series by label set: its buckets by bound, its sum and its count.
#[derive(Default)]
struct Observed {
    buckets: BTreeMap<String, f64>,
    sum: f64,
    count: f64,
}

fn observed(name: &str, counters: &[(String, f64)]) -> BTreeMap<String, Observed> {
    let mut sets: BTreeMap<String, Observed> = BTreeMap::new();
    for (series, v) in counters {
        let (n, labels) = split(series);
        match n.strip_prefix(name) {
            Some("_bucket") => {
                let (set, le) = without_le(labels);
                sets.entry(set).or_default().buckets.insert(le, *v);
            }
            Some("_sum") => sets.entry(labels.to_owned()).or_default().sum = *v,
            Some("_count") => sets.entry(labels.to_owned()).or_default().count = *v,
            _ => {}
        }
    }
    sets
}

/// The counters in the text format, family by family, each with its help and type; every bucket
/// of a histogram is shown, those nothing fell in too.
pub fn render(counters: &[(String, f64)]) -> String {
    let mut out = String::new();
    for (name, kind, help) in FAMILIES {
        let kind_word = match kind {
            Kind::Counter => "counter",
            Kind::Histogram(_) => "histogram",
            Kind::Summary => "summary",
        };
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind_word}");
        if kind == Kind::Counter {
            for (series, v) in counters.iter().filter(|(s, _)| split(s).0 == name) {
                let _ = writeln!(out, "{series} {v}");
            }
            continue;
        }
        for (set, o) in observed(name, counters) {
            if let Kind::Histogram(bounds) = kind {
                // `{a="x"}` → `a="x",` to put before `le`.
                let lead = set.trim_start_matches('{').trim_end_matches('}');
                let lead = if lead.is_empty() {
                    String::new()
                } else {
                    format!("{lead},")
                };
                for le in bounds.iter().map(f64::to_string).chain(["+Inf".to_owned()]) {
                    let n = o.buckets.get(&le).copied().unwrap_or(0.0);
                    let _ = writeln!(out, "{name}_bucket{{{lead}le=\"{le}\"}} {n}");
                }
            }
            let _ = writeln!(
                out,
                "{name}_sum{set} {}\n{name}_count{set} {}",
                o.sum, o.count
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::job::Job;

    #[test]
    fn a_label_value_is_escaped_as_the_format_says() {
        assert_eq!(
            labels(&[("server", "a\"b\\c\nd")]),
            r#"{server="a\"b\\c\nd"}"#
        );
    }

    #[test]
    fn a_histogram_shows_every_bucket_counted_up_to_its_bound() {
        let mut fast = Record::new(
            &Job::new("a", "cli", "local"),
            crate::record::Outcome::Completed,
            None,
            1,
            3_000,
        );
        fast.started_at_ms = Some(0);
        let mut slow = fast.clone();
        slow.finished_at_ms = 500;
        let mut counters = BTreeMap::new();
        for r in [&fast, &slow] {
            for (series, v) in of(r) {
                *counters.entry(series).or_insert(0.0) += v;
            }
        }
        let counters: Vec<(String, f64)> = counters.into_iter().collect();
        let out = render(&counters);
        let name = "pi_dispatch_job_duration_seconds";
        for line in [
            format!("{name}_bucket{{outcome=\"completed\",le=\"1\"}} 1\n"),
            format!("{name}_bucket{{outcome=\"completed\",le=\"5\"}} 2\n"),
            format!("{name}_bucket{{outcome=\"completed\",le=\"7200\"}} 2\n"),
            format!("{name}_bucket{{outcome=\"completed\",le=\"+Inf\"}} 2\n"),
            format!("{name}_sum{{outcome=\"completed\"}} 3.5\n"),
            format!("{name}_count{{outcome=\"completed\"}} 2\n"),
        ] {
            assert!(out.contains(&line), "{line}\n{out}");
        }
        // The buckets come in order of their bounds, then the sum and the count.
        let at = |s: &str| out.find(s).unwrap();
        assert!(at("le=\"1\"}") < at("le=\"5\"}") && at("le=\"5\"}") < at("le=\"10\"}"));
        assert!(at("le=\"+Inf\"}") < at(&format!("{name}_sum")));
        // The family of a job without a wait is still declared.
        assert!(
            out.contains("# TYPE pi_dispatch_job_wait_seconds histogram\n"),
            "{out}"
        );
        assert!(out.contains("pi_dispatch_jobs_total{outcome=\"completed\",reason=\"none\"} 2\n"));
    }
}
