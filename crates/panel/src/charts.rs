//! Pictures drawn on the server as SVG: a run's timeline, and the outcomes of the runs over time.
//! Every label is one of the product's own words or a number. Pure.

use crate::view::count;
use maud::{Markup, html};
use records::record::{Outcome, Record};

const WIDTH: f64 = 720.0;

/// One stretch of a run's timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct Stretch {
    pub label: &'static str,
    pub from_ms: u64,
    pub to_ms: u64,
}

/// The stretches of a run, each from one moment the record holds to the next: waiting in the
/// queue, being prepared after the admission (the folder's lock, secrets, a clone, the job's
/// folder), the sandbox starting, the servers connecting (until the slowest was ready), and the
/// agent at work until the end. A stretch the record cannot place is left out.
pub fn stretches(r: &Record) -> Vec<Stretch> {
    let ready = r.mcp.servers.iter().filter_map(|s| s.ready_ms).max();
    let connected_from = r.sandbox_up_at_ms.or(r.started_at_ms);
    let moments = [
        ("queued", r.queued_at_ms),
        ("preparing", r.admitted_at_ms),
        ("sandbox starting", r.started_at_ms),
        ("servers connecting", r.sandbox_up_at_ms),
        ("agent", connected_from.zip(ready).map(|(s, m)| s + m)),
    ];
    // Each moment that is known and in order, then the end.
    let mut known: Vec<(&'static str, u64)> = Vec::new();
    for (label, at) in moments {
        if let Some(at) = at
            && known.last().is_none_or(|(_, before)| at >= *before)
            && at <= r.finished_at_ms
        {
            known.push((label, at));
        }
    }
    // Without a ready time, the agent's stretch begins when the sandbox was up.
    if ready.is_none()
        && let Some(last) = known.last_mut()
        && last.0 == "servers connecting"
    {
        last.0 = "agent";
    }
    known
        .iter()
        .enumerate()
        .map(|(i, (label, from))| Stretch {
            label,
            from_ms: *from,
            to_ms: known.get(i + 1).map_or(r.finished_at_ms, |(_, to)| *to),
        })
        .collect()
}

fn colour(label: &str) -> &'static str {
    match label {
        "queued" => "#9aa5b1",
        "preparing" => "#b8c2cc",
        "sandbox starting" => "#7b61c4",
        "servers connecting" => "#2f6fd0",
        _ => "#1f7a4a",
    }
}

/// The colour of a label written on a stretch: ink on the light greys, white on the rest, each
/// at 4.5:1 or more.
fn ink_on(label: &str) -> &'static str {
    match label {
        "queued" | "preparing" => "#1f2933",
        _ => "#fff",
    }
}

/// The run's timeline as a bar, each stretch coloured and labelled with its length, with a tick
/// where pi began each turn (tall) and each tool call (short); below it, the legend.
pub fn timeline(r: &Record) -> Markup {
    let parts = stretches(r);
    let start = parts.first().map_or(r.finished_at_ms, |p| p.from_ms);
    let total = r.finished_at_ms.saturating_sub(start).max(1) as f64;
    let x_of = |at: u64| at.saturating_sub(start) as f64 / total * WIDTH;
    let turns = r.activity.iter().filter(|a| a.kind == "turn").count();
    let calls = r.activity.len() - turns;
    html! {
        svg class="timeline" width=(WIDTH) height="84" viewBox={"0 0 " (WIDTH) " 84"}
            xmlns="http://www.w3.org/2000/svg" role="img" aria-label="the run's timeline" {
            @for p in &parts {
                @let x = x_of(p.from_ms);
                @let w = ((p.to_ms - p.from_ms) as f64 / total * WIDTH).max(1.0);
                rect x=(format!("{x:.1}")) y="8" width=(format!("{w:.1}")) height="24"
                    fill=(colour(p.label)) {
                    title { (p.label) ": " (p.to_ms - p.from_ms) " ms" }
                }
                @if w > 110.0 {
                    text x=(format!("{:.1}", x + 4.0)) y="24" font-size="12" fill=(ink_on(p.label)) {
                        (p.label) " " (p.to_ms - p.from_ms) " ms"
                    }
                }
            }
            @for a in r.activity.iter().filter(|a| a.at_ms >= start) {
                @let x = x_of(a.at_ms);
                @let (top, colour) = if a.kind == "turn" { (2.0, "#1f2933") } else { (30.0, "#c53030") };
                line x1=(format!("{x:.1}")) x2=(format!("{x:.1}")) y1=(top) y2="38"
                    stroke=(colour) stroke-width="1.5" {
                    title {
                        @if a.kind == "turn" { "turn" } @else { "tool call " (a.tool.as_deref().unwrap_or("?")) }
                        " at " (a.at_ms - start) " ms"
                    }
                }
            }
            @for (k, p) in parts.iter().enumerate() {
                rect x=(k * 130) y="48" width="10" height="10" fill=(colour(p.label)) {}
                text x=(k * 130 + 14) y="57" font-size="11" fill="#333" { (p.label) }
            }
            text x="0" y="76" font-size="12" fill="#333" {
                (total as u64) " ms from first to last; pi: " (count(turns, "turn")) ", "
                (count(calls, "tool call")) " (ticks: tall a turn, short a tool call)"
            }
        }
    }
}

fn outcome_colour(o: Outcome) -> &'static str {
    match o {
        Outcome::Completed => "#1f7a4a",
        Outcome::Failed => "#c53030",
        Outcome::Policy => "#f0b429",
        _ => "#9aa5b1",
    }
}

/// Jobs' outcomes, each with when its job ended, in `buckets` equal stretches of time up to
/// `now_ms`, as stacked bars.
pub fn outcomes(
    ended: impl IntoIterator<Item = (u64, Outcome)>,
    now_ms: u64,
    span_ms: u64,
    buckets: usize,
) -> Markup {
    let buckets = buckets.max(1);
    let from = now_ms.saturating_sub(span_ms);
    let width = span_ms.max(1) as f64 / buckets as f64;
    let order = [
        Outcome::Completed,
        Outcome::Failed,
        Outcome::Policy,
        Outcome::Cancelled,
    ];
    let mut counts = vec![[0u32; 4]; buckets];
    for (at, outcome) in ended {
        if at < from || at > now_ms {
            continue;
        }
        let b = (((at - from) as f64 / width) as usize).min(buckets - 1);
        let k = order.iter().position(|o| *o == outcome).unwrap_or(3);
        counts[b][k] += 1;
    }
    let most = counts
        .iter()
        .map(|c| c.iter().sum::<u32>())
        .max()
        .unwrap_or(0)
        .max(1);
    let bar = WIDTH / buckets as f64;
    html! {
        svg class="outcomes" width=(WIDTH) height="110" viewBox={"0 0 " (WIDTH) " 110"}
            xmlns="http://www.w3.org/2000/svg" role="img" aria-label="outcomes over time" {
            @for (i, c) in counts.iter().enumerate() {
                @let mut y = 90.0;
                @for (k, n) in c.iter().enumerate() {
                    @if *n > 0 {
                        @let h = f64::from(*n) / f64::from(most) * 80.0;
                        @let top = { y -= h; y };
                        rect x=(format!("{:.1}", i as f64 * bar + 1.0)) y=(format!("{top:.1}"))
                            width=(format!("{:.1}", (bar - 2.0).max(1.0))) height=(format!("{h:.1}"))
                            fill=(outcome_colour(order[k])) {
                            title { (n) " " (order[k].as_str()) }
                        }
                    }
                }
            }
            @for (k, o) in order.iter().enumerate() {
                rect x=(format!("{}", k * 110)) y="98" width="10" height="10" fill=(outcome_colour(*o)) {}
                text x=(format!("{}", k * 110 + 14)) y="107" font-size="11" fill="#333" { (o.as_str()) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::job::Job;
    use records::record::Record;

    fn record() -> Record {
        let mut r = Record::new(
            &Job::new("j", "cli", "local"),
            Outcome::Completed,
            None,
            1,
            10_000,
        );
        r.queued_at_ms = Some(1_000);
        r.admitted_at_ms = Some(1_500);
        r.started_at_ms = Some(2_000);
        r.sandbox_up_at_ms = Some(2_100);
        r.mcp.servers.push(protocol::exit_line::ServerState {
            name: "docs".into(),
            state: "ready".into(),
            ready_ms: Some(400),
            listing: None,
        });
        r.activity.push(records::record::Activity {
            at_ms: 3_000,
            kind: "tool".into(),
            tool: Some("<script>x</script>".into()),
        });
        r
    }

    fn labels(r: &Record) -> Vec<(&'static str, u64, u64)> {
        stretches(r)
            .into_iter()
            .map(|s| (s.label, s.from_ms, s.to_ms))
            .collect()
    }

    #[test]
    fn a_run_goes_from_the_queue_to_the_agent_in_order() {
        assert_eq!(
            labels(&record()),
            [
                ("queued", 1_000, 1_500),
                ("preparing", 1_500, 2_000),
                ("sandbox starting", 2_000, 2_100),
                ("servers connecting", 2_100, 2_500),
                ("agent", 2_500, 10_000),
            ]
        );
        let svg = timeline(&record()).into_string();
        assert!(
            svg.starts_with("<svg") && svg.contains("agent 7500 ms"),
            "{svg}"
        );
        // A tool's name is text, however it is spelled.
        assert!(
            svg.contains("tool call &lt;script&gt;x&lt;/script&gt; at 2000 ms"),
            "{svg}"
        );
        assert!(!svg.contains("<script>"));
    }

    #[test]
    fn what_a_record_does_not_hold_is_left_out() {
        // A refusal: queued, then the end.
        let mut refused = Record::new(
            &Job::new("j", "cli", "local"),
            Outcome::Policy,
            None,
            1,
            5_000,
        );
        refused.queued_at_ms = Some(4_000);
        assert_eq!(labels(&refused), [("queued", 4_000, 5_000)]);
        // No server: the agent from the sandbox's start.
        let mut plain = record();
        plain.mcp.servers.clear();
        assert_eq!(labels(&plain).last(), Some(&("agent", 2_100, 10_000)));
        // A moment out of order (a clock stepped back) is skipped, not drawn backwards.
        let mut odd = record();
        odd.started_at_ms = Some(1_200);
        assert!(
            labels(&odd)
                .windows(2)
                .all(|w| w[0].2 <= w[1].1 && w[0].1 <= w[0].2)
        );
    }

    #[test]
    fn outcomes_are_counted_in_their_stretch_of_time() {
        let done = record();
        let ended = [
            (done.finished_at_ms, done.outcome),
            (5_000, Outcome::Failed),
        ];
        let svg = outcomes(ended, 10_000, 10_000, 2).into_string();
        assert!(svg.contains("<title>1 completed</title>"), "{svg}");
        assert!(svg.contains("<title>1 failed</title>"), "{svg}");
    }
}
