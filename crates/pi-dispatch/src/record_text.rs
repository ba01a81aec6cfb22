//! A run record as the terminal shows it to a person (`runs show`, `run --follow`'s end, the live
//! view's servers): how the job ended and why, what it used, and what the egress proxy refused it
//! with the lines that would let each through. One place, for every command that prints a record.

use std::fmt::Write as _;

use records::record::Record;

/// A record for a person: how it ended and why, then what it used.
pub fn human(r: &Record) -> String {
    let mut out = String::new();
    ending_lines(&mut out, r);
    spent_lines(&mut out, r);
    attempt_lines(&mut out, r);
    used_lines(&mut out, r);
    out
}

/// The job, what it was for, and how it ended and why.
fn ending_lines(out: &mut String, r: &Record) {
    let _ = writeln!(out, "job {}  {}", r.job_id, r.outcome);
    if let Some(of) = &r.rerun_of {
        let _ = writeln!(out, "runs again: {of}");
    }
    match (&r.item, &r.url) {
        (Some(item), Some(url)) => {
            let _ = writeln!(out, "for: {item} ({url})");
        }
        (Some(item), None) => {
            let _ = writeln!(out, "for: {item}");
        }
        _ => {}
    }
    if let Some(folder) = &r.folder {
        let _ = writeln!(out, "folder: {folder}");
    }
    if let Some(task) = &r.task {
        let _ = writeln!(
            out,
            "task: {}",
            task.lines().collect::<Vec<_>>().join("\n      ")
        );
    }
    if let Some(reason) = r.reason {
        let _ = writeln!(out, "reason: {reason}: {}", reason.sentence());
    }
    if let Some(d) = &r.detail {
        let _ = writeln!(out, "why: {}", d.why);
        let names = d.concerns();
        if !names.is_empty() {
            let _ = writeln!(out, "concerns: {}", names.join("; "));
        }
    }
    if let Some(fix) = &r.fix {
        let _ = writeln!(out, "fix: {fix}");
    }
}

/// What started the job, and what its model spent.
fn spent_lines(out: &mut String, r: &Record) {
    let _ = writeln!(
        out,
        "trigger: {} (index {}), kind {}, attempt {}",
        r.trigger_type,
        r.trigger_index.map_or("-".to_owned(), |i| i.to_string()),
        r.kind,
        r.attempt
    );
    let _ = writeln!(
        out,
        "model: {}/{}  turns {}  tokens {}  cost {}  spent {}  budget reserved {}",
        r.provider.as_deref().unwrap_or("-"),
        r.model.as_deref().unwrap_or("-"),
        r.turns.map_or("-".to_owned(), |t| t.to_string()),
        tokens_text(r.tokens.as_ref()),
        cost_text(r.cost_usd),
        if r.spent { "yes" } else { "no" },
        if r.budget_reserved { "yes" } else { "no" },
    );
}

/// The job's other attempts, and how long it waited and ran.
fn attempt_lines(out: &mut String, r: &Record) {
    if let Some(job) = &r.attempt_of {
        let _ = writeln!(
            out,
            "an earlier attempt of job {job}, which was run again (pi-dispatch runs show {job})"
        );
    }
    for e in &r.earlier_attempts {
        let _ = writeln!(
            out,
            "earlier attempt {}: {}{}, tokens {}, cost {} (pi-dispatch runs show {})",
            e.attempt,
            e.outcome,
            e.reason.map_or(String::new(), |r| format!(" {r}")),
            tokens_text(e.tokens.as_ref()),
            cost_text(e.cost_usd),
            e.record
        );
    }
    if !r.earlier_attempts.is_empty() {
        let _ = writeln!(
            out,
            "the turns, tokens and cost above are the whole run's, every attempt's"
        );
    }
    if let (Some(q), Some(s)) = (r.queued_at_ms, r.started_at_ms) {
        let _ = writeln!(
            out,
            "times: waited {} ms, ran {} ms",
            s.saturating_sub(q),
            r.finished_at_ms.saturating_sub(s)
        );
    }
}

/// What the job used (its servers and tools, what the egress proxy refused it), its final
/// message and where its transcript is.
fn used_lines(out: &mut String, r: &Record) {
    servers_text(out, &r.mcp.servers);
    for c in &r.mcp.tool_calls {
        let _ = writeln!(
            out,
            "tool {}/{}: {} calls ({} ok, {} errors, {} refused), {} ms, {} bytes",
            c.server, c.tool, c.calls, c.ok, c.error, c.refused, c.total_ms, c.result_bytes
        );
    }
    if !r.egress_denied.is_empty() {
        out.push_str(&denied(&r.egress_denied));
    }
    if let Some(m) = &r.final_message {
        let _ = writeln!(out, "final message:");
        for line in m.lines() {
            let _ = writeln!(out, "  {line}");
        }
    }
    if r.transcript {
        let _ = writeln!(
            out,
            "transcript: pi-dispatch runs show {} --transcript",
            r.job_id
        );
    }
}

fn tokens_text(tokens: Option<&records::record::Tokens>) -> String {
    tokens.map_or("-".to_owned(), |t| {
        format!("{} in, {} out", t.input, t.output)
    })
}

fn cost_text(cost_usd: Option<f64>) -> String {
    cost_usd.map_or("-".to_owned(), |c| format!("${c:.4}"))
}

/// Each server's state, a line each.
pub fn servers_text(out: &mut String, servers: &[protocol::exit_line::ServerState]) {
    for s in servers {
        let _ = writeln!(
            out,
            "server {}: {}{}",
            s.name,
            s.state,
            s.ready_ms
                .map_or(String::new(), |m| format!(", ready in {m} ms"))
        );
    }
}

/// Whether `host` is a plain host name a line could admit: letters, digits and hyphens in dotted
/// labels, neither an address nor a name for this machine. A job chose every host it asked for,
/// so only such a name is offered as a line to add.
fn plain_host(host: &str) -> bool {
    let labels: Vec<&str> = host.split('.').collect();
    let is_label = |l: &&str| {
        (1..=63).contains(&l.len())
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    let lower = host.to_ascii_lowercase();
    host.len() <= 253
        && labels.len() >= 2
        && labels.iter().all(is_label)
        && host.parse::<std::net::IpAddr>().is_err()
        && !labels
            .last()
            .is_some_and(|tld| tld.bytes().all(|b| b.is_ascii_digit()))
        && lower != "localhost"
        && !lower.ends_with(".localhost")
        && !lower.ends_with(".local")
}

/// What the egress proxy refused the job, and the lines that would let each through (or why
/// none would). Every host is the job's choice: a line is offered only for a plain host name.
fn denied(list: &[records::record::EgressDenial]) -> String {
    let mut out = String::from("egress denied (host:port, attempts, the proxy's reason):\n");
    for d in list.iter().filter(|d| d.reason != egress::LEFT_OUT) {
        let _ = writeln!(out, "  {}:{}  {}x  {}", d.host, d.port, d.count, d.reason);
    }
    if let Some(more) = list.iter().find(|d| d.reason == egress::LEFT_OUT) {
        let _ = writeln!(
            out,
            "  and {}x to hosts left out (the record keeps the first 256 hosts a job asked for)",
            more.count
        );
    }
    let mut allow: Vec<&str> = Vec::new();
    let mut declare: Vec<String> = Vec::new();
    let mut none: Vec<String> = Vec::new();
    for d in list.iter().filter(|d| d.reason != egress::LEFT_OUT) {
        let at = format!("{}:{}", d.host, d.port);
        let plain = plain_host(&d.host);
        match (d.reason.as_str(), d.port) {
            ("not-allowed" | "loopback", _) if !plain => none.push(format!(
                "{at}: an address or a name of this machine, which the job chose: no line is offered for it"
            )),
            ("not-allowed", 443) => {
                if !allow.contains(&d.host.as_str()) {
                    allow.push(&d.host);
                }
            }
            ("not-allowed" | "loopback", port) => declare.push(format!(
                "{{\"id\": \"...\", \"host\": \"{}\", \"port\": {port}}}",
                d.host
            )),
            ("plain-http-443", _) => none.push(format!("{at}: plain http to port 443; use https")),
            ("special-address" | "own-machine", _) => none.push(format!(
                "{at}: the name resolves to this machine or to an address no job reaches"
            )),
            ("unresolved", _) => none.push(format!("{at}: the name did not resolve at the proxy")),
            _ => none.push(format!("{at}: the proxy could not read its files then")),
        }
    }
    if !allow.is_empty() {
        out.push_str("the job asked for these hosts; if the job needs them (its choice, not yours: check each), add to egress-allowlist.conf (https on port 443):\n");
        for h in allow {
            let _ = writeln!(out, "  {h}");
        }
    }
    if !declare.is_empty() {
        out.push_str(
            "the job asked for these; if it needs them (its choice: check each), declare in model-endpoints.json (only a declared endpoint opens a port other than 443, or one on this machine):\n",
        );
        for e in declare {
            let _ = writeln!(out, "  {e}");
        }
    }
    if !none.is_empty() {
        out.push_str("no line lets these through:\n");
        for n in none {
            let _ = writeln!(out, "  {n}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use records::record::EgressDenial;

    fn d(host: &str, port: u16, reason: &str, count: u64) -> EgressDenial {
        EgressDenial {
            host: host.into(),
            port,
            reason: reason.into(),
            count,
        }
    }

    #[test]
    fn denials_become_the_lines_that_would_admit_them() {
        let text = super::denied(&[
            d("unlisted.example", 443, "not-allowed", 3),
            d("[2001:db8::1]", 443, "not-allowed", 1),
            d("api.example.com", 8443, "not-allowed", 1),
            d("127.0.0.1", 9, "loopback", 2),
            d("rebind.example", 443, "special-address", 1),
            d("plain.example", 443, "plain-http-443", 1),
        ]);
        assert!(
            text.contains("  unlisted.example:443  3x  not-allowed\n"),
            "{text}"
        );
        let allow = text
            .split("add to egress-allowlist.conf (https on port 443):\n")
            .nth(1)
            .unwrap()
            .split("the job asked for these; if it needs them")
            .next()
            .unwrap();
        // A plain host name is offered, marked as the job's choice; an address never is.
        assert_eq!(allow, "  unlisted.example\n", "{text}");
        assert!(text.contains("its choice"), "{text}");
        assert!(
            text.contains(r#"{"id": "...", "host": "api.example.com", "port": 8443}"#),
            "{text}"
        );
        assert!(!text.contains(r#""host": "127.0.0.1""#), "{text}");
        for address in ["[2001:db8::1]:443", "127.0.0.1:9"] {
            assert!(
                text.contains(&format!(
                    "  {address}: an address or a name of this machine"
                )),
                "{text}"
            );
        }
        assert!(
            text.contains("  rebind.example:443: the name resolves to this machine"),
            "{text}"
        );
        assert!(
            text.contains("  plain.example:443: plain http to port 443; use https"),
            "{text}"
        );
        // A port other than 443 is never offered as an allowlist line.
        assert!(!allow.contains("api.example.com"), "{text}");
    }

    #[test]
    fn only_plain_host_names_are_offered_and_what_was_left_out_is_said() {
        for plain in ["api.example.com", "a-b.example.org"] {
            assert!(super::plain_host(plain), "{plain}");
        }
        for not in [
            "localhost",
            "db.localhost",
            "printer.local",
            "10.0.0.1",
            "[::1]",
            "127.1",
            "example",
            "-x.example",
            "a_b.example",
        ] {
            assert!(!super::plain_host(not), "{not}");
        }
        let text = super::denied(&[
            d("made-up-1.example", 443, "not-allowed", 1),
            d("*", 0, egress::LEFT_OUT, 44),
        ]);
        assert!(text.contains("and 44x to hosts left out"), "{text}");
        assert!(!text.contains("*:0"), "{text}");
    }
}
