//! The pages: the queue and the running jobs, the runs (filtered, with a chart of their outcomes),
//! one run whole, the deployment's health, and the one action, cancelling a job.

use std::sync::Arc;
use std::time::SystemTime;

use axum::Form;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use protocol::reason::Reason;
use records::open_jobs::Shown;
use records::workers::WorkerShown;

use crate::Health;
use records::record::{Outcome, Record, now_ms};
use serde::Deserialize;

use crate::auth::{Authed, CsrfForm, csrf_ok};
use crate::view::{Section, count, dollars, frame, pill, took, when};
use crate::{Panel, charts, pins_view, transcript_view};

/// Runs on one page of the list.
pub const PAGE: usize = 100;
/// Seconds between the queue page's reloads, while the reader lets it reload.
const QUEUE_REFRESH: u32 = 5;

fn page(status: StatusCode, markup: Markup) -> Response {
    (status, axum::response::Html(markup.into_string())).into_response()
}

/// A page of the records `query` finds, from after `after`, asked of the index off the runtime.
async fn find(
    panel: &Arc<Panel>,
    query: records::query::Query,
    after: Option<queue::Cursor>,
) -> Result<records::store::Page, String> {
    let p = panel.clone();
    tokio::task::spawn_blocking(move || {
        p.records
            .find(&query, after.as_ref())
            .map_err(|e| e.to_string())
    })
    .await
    .unwrap_or_else(|_| Err("the records could not be read".to_owned()))
}

/// When the jobs `query` finds ended, and how, asked of the index off the runtime.
async fn ended(
    panel: &Arc<Panel>,
    query: records::query::Query,
) -> Result<Vec<(u64, Outcome)>, String> {
    let p = panel.clone();
    tokio::task::spawn_blocking(move || p.records.outcomes(&query).map_err(|e| e.to_string()))
        .await
        .unwrap_or_else(|_| Err("the records could not be read".to_owned()))
}

/// The queue as it stands, from the queue itself (not the records).
struct Open {
    jobs: Vec<Shown>,
    done: usize,
    workers: Vec<WorkerShown>,
}

/// The queue's open jobs (those no live worker can take marked so) and its workers.
async fn open_jobs(panel: &Arc<Panel>) -> Result<Open, String> {
    let (queue, gone_after) = (panel.queue.clone(), panel.worker_gone_after);
    tokio::task::spawn_blocking(move || {
        let now = SystemTime::now();
        let status = queue.status(now, 0).map_err(|e| e.to_string())?;
        let seen = queue.workers().map_err(|e| e.to_string())?;
        let workers = records::workers::shown(&seen, now, gone_after);
        let mut jobs: Vec<Shown> = status
            .open
            .iter()
            .map(|j| records::open_jobs::shown(j, now))
            .collect();
        records::open_jobs::place(&mut jobs, &workers);
        Ok(Open {
            jobs,
            done: status.counts.done,
            workers,
        })
    })
    .await
    .unwrap_or_else(|_| Err("the queue could not be read".to_owned()))
}

/// The health page's row for the workers: it fails when none is live.
fn workers_health(workers: &Result<Open, String>) -> Health {
    let row = |level: &str, label: String, fix: Option<&str>| Health {
        level: level.to_owned(),
        label,
        fix: fix.map(str::to_owned),
    };
    match workers {
        Err(e) => row(
            "fail",
            format!("the workers cannot be read from the queue: {e}"),
            Some("pi-dispatch doctor says what is wrong with the queue"),
        ),
        Ok(open) => {
            let live = open.workers.iter().filter(|w| w.takes_jobs()).count();
            let gone = open.workers.iter().filter(|w| w.state == "gone").count();
            if live == 0 {
                row(
                    "fail",
                    format!(
                        "no worker is taking jobs ({} gone, {} draining): queued jobs wait",
                        gone,
                        open.workers.len() - gone
                    ),
                    Some("start one: pi-dispatch worker (docs/worker.md)"),
                )
            } else if gone > 0 {
                row(
                    "warn",
                    format!("{live} workers live, {gone} gone (killed, or their host is down)"),
                    Some(
                        "a gone worker's jobs are run again when its leases lapse; see the queue page",
                    ),
                )
            } else {
                row("ok", format!("{live} workers live"), None)
            }
        }
    }
}

fn workers_table(workers: &[WorkerShown]) -> Markup {
    html! {
        table #workers {
            thead { tr {
                th { "Worker" } th { "State" } th.num { "Jobs" } th { "Labels" } th { "Version" }
                th.num { "Last seen" } th { "Started" }
            } }
            tbody {
                @for w in workers {
                    tr {
                        td { code { (w.card.id) } }
                        td { (pill(w.state)) }
                        td.num { (w.card.running) " / " (w.card.concurrency) }
                        td { (w.card.labels.join(", ")) }
                        td { (w.card.version) }
                        td.num { (took(w.seen_secs_ago * 1000)) " ago" }
                        td { (when(w.card.started_ms)) }
                    }
                }
            }
        }
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct QueueQuery {
    /// The job a cancel was asked for, and what came of it.
    cancelled: Option<String>,
    result: Option<String>,
}

fn cancel_notice(id: &str, result: &str) -> Option<String> {
    Some(match result {
        "removed" => format!("Cancelled {id}: it had not started; nothing was spent."),
        "stopping" => format!("Cancelling {id}: its worker is stopping it and will record it."),
        "done" => format!("{id} had already ended; nothing was changed."),
        "unknown" => format!("No job has the id {id}."),
        _ => return None,
    })
}

pub async fn queue(
    State(panel): State<Arc<Panel>>,
    authed: Authed,
    Query(q): Query<QueueQuery>,
) -> Response {
    let open = open_jobs(&panel).await;
    let newest = records::query::Query {
        limit: 10,
        ..records::query::Query::default()
    };
    let recent = find(&panel, newest, None).await;
    let drift = pins_view::waiting(&panel).await;
    let notice = q
        .cancelled
        .as_deref()
        .zip(q.result.as_deref())
        .and_then(|(id, r)| cancel_notice(id, r));
    let body = html! {
        h1 { "Queue" }
        @if let Some(n) = &notice { p.notice { (n) } }
        @match drift {
            Some(0) => {},
            Some(n) => p.error #pins-waiting {
                (count(n, "server")) " with tools that differ from their pins, waiting for approval: "
                a href="/pins" { "see the pins" }
            },
            None => p.error #pins-waiting { "The servers' pins cannot be read: " a href="/pins" { "see the pins" } },
        }
        @match &open {
            Err(e) => p.error { "The queue cannot be read: " (e) },
            Ok(Open { jobs, done, workers }) => {
                @let running = jobs.iter().filter(|j| matches!(j.state, "running" | "cancelling")).count();
                p.muted {
                    (running) " running, " (jobs.len() - running) " waiting or lost, "
                    (done) " done"
                }
                @if jobs.is_empty() {
                    p { "Nothing is queued or running." }
                } @else {
                    (open_table(jobs, &authed.csrf))
                }
                h2 { "Workers" }
                @if !workers.iter().any(WorkerShown::takes_jobs) {
                    p.error { "No worker is taking jobs: queued jobs wait until one starts (pi-dispatch worker)." }
                }
                @if !workers.is_empty() {
                    (workers_table(workers))
                }
            }
        }
        h2 { "Recently ended" }
        @match &recent {
            Ok(page) => (runs_table(page.records.iter())),
            Err(e) => p.error { "The records cannot be read: " (e) },
        }
        p { a href="/runs" { "All runs →" } }
    };
    page(
        StatusCode::OK,
        frame(
            "Queue",
            Some(Section::Queue),
            &authed.csrf,
            Some(QUEUE_REFRESH),
            &body,
        ),
    )
}

fn open_table(jobs: &[Shown], csrf: &str) -> Markup {
    html! {
        table #open {
            thead { tr {
                th { "Job" } th { "State" } th { "Task" } th { "Folder or issue" } th { "Trigger" }
                th.num { "Elapsed" } th { "Host" } th.num { "Attempt" } th {}
            } }
            tbody {
                @for j in jobs {
                    tr {
                        td { a href={"/runs/" (j.id)} { code { (j.id) } } }
                        td { (pill(j.state)) }
                        td { (j.task.as_deref().unwrap_or("")) }
                        td { (j.issue.as_deref().or(j.folder.as_deref()).unwrap_or("")) }
                        td { (j.trigger_type.as_deref().unwrap_or("")) }
                        td.num {
                            @match j.running_secs {
                                Some(s) => { "running " (took(s * 1000)) },
                                None => { "waiting " (took(j.waited_secs * 1000)) },
                            }
                        }
                        td { (j.worker.as_deref().unwrap_or("")) }
                        td.num { (j.attempt) }
                        td {
                            @if j.cancellable() {
                                form method="post" action={"/jobs/" (j.id) "/cancel"} {
                                    input type="hidden" name="csrf" value=(csrf);
                                    button.danger type="submit" { "Cancel" }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `text` on one line, at most `max` characters.
fn short(text: &str, max: usize) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out: String = line.chars().take(max).collect();
    if out.len() < line.len() {
        out.push('…');
    }
    out
}

fn reason_word(r: &Record) -> &'static str {
    r.reason.map_or("", |r| r.as_str())
}

fn runs_table<'a>(records: impl Iterator<Item = &'a Record>) -> Markup {
    html! {
        table.runs {
            thead { tr {
                th { "Job" } th { "Outcome" } th { "Reason" } th { "For" } th { "Trigger" } th { "Ended" }
                th.num { "Took" } th.num { "Cost" } th { "Servers" }
            } }
            tbody {
                @for r in records {
                    tr {
                        td { a href={"/runs/" (r.job_id)} { code { (r.job_id) } } }
                        td { (pill(r.outcome.as_str())) }
                        td { (reason_word(r)) }
                        td.for {
                            (r.item.as_deref().or(r.folder.as_deref()).unwrap_or(""))
                            @if let Some(t) = &r.task { br; span.muted { (short(t, 60)) } }
                        }
                        td { (r.trigger_type) }
                        td { (when(r.finished_at_ms)) }
                        td.num {
                            @if let Some(from) = r.queued_at_ms.or(r.started_at_ms) {
                                (took(r.finished_at_ms.saturating_sub(from)))
                            }
                        }
                        td.num { @if let Some(c) = r.cost_usd { (dollars(c)) } }
                        td {
                            @for (i, s) in r.mcp.servers.iter().enumerate() {
                                @if i > 0 { ", " }
                                (s.name)
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The runs' filters, as the form sends them.
#[derive(Debug, Default, Deserialize)]
pub struct RunsQuery {
    outcome: Option<String>,
    reason: Option<String>,
    trigger: Option<String>,
    /// `1h`, `24h`, `7d`, `30d`; anything else is all time.
    since: Option<String>,
    /// Where the page starts: after the run that ended at this time (Unix ms), with this id
    /// (`MS-ID`).
    after: Option<String>,
}

const SPANS: [(&str, &str, u64); 4] = [
    ("1h", "the last hour", 3_600_000),
    ("24h", "the last day", 86_400_000),
    ("7d", "the last week", 7 * 86_400_000),
    ("30d", "the last 30 days", 30 * 86_400_000),
];

fn span_ms(since: Option<&str>) -> Option<u64> {
    SPANS
        .iter()
        .find(|(key, _, _)| Some(*key) == since)
        .map(|(_, _, ms)| *ms)
}

fn chosen(value: Option<&str>) -> Option<&str> {
    value.filter(|v| !v.is_empty())
}

impl RunsQuery {
    /// The records query these filters ask for, the newest first, every match (the page is cut
    /// here); `None` when a filter names something no record can have, so nothing matches.
    fn query(&self, now_ms: u64) -> Option<records::query::Query> {
        use records::query::Query as Q;
        let word = |v: &Option<String>| chosen(v.as_deref()).map(str::to_owned);
        Some(Q {
            limit: records::query::MAX_LIMIT,
            outcome: word(&self.outcome)
                .map(|o| Q::outcome(&o))
                .transpose()
                .ok()?,
            reason: word(&self.reason).map(|r| Q::reason(&r)).transpose().ok()?,
            trigger: word(&self.trigger).map(records::query::TriggerIs::Type),
            repo: None,
            folder: None,
            since_ms: span_ms(self.since.as_deref()).map(|span| now_ms.saturating_sub(span)),
        })
    }

    /// Where the page starts, when the link said.
    fn cursor(&self) -> Option<queue::Cursor> {
        let (ms, id) = self.after.as_deref()?.split_once('-')?;
        Some(queue::Cursor {
            finished_at_ms: ms.parse().ok()?,
            id: id.to_owned(),
        })
    }

    /// The query string of these filters on the page after `after` (the first without).
    fn with_after(&self, after: Option<&queue::Cursor>) -> String {
        let after = after.map(|c| format!("{}-{}", c.finished_at_ms, c.id));
        url_pairs(&[
            ("outcome", self.outcome.as_deref()),
            ("reason", self.reason.as_deref()),
            ("trigger", self.trigger.as_deref()),
            ("since", self.since.as_deref()),
            ("after", after.as_deref()),
        ])
        .join("&")
    }
}

/// `key=value` pairs with each value percent-encoded.
fn url_pairs(pairs: &[(&str, Option<&str>)]) -> Vec<String> {
    pairs
        .iter()
        .filter_map(|(k, v)| chosen(*v).map(|v| format!("{k}={}", percent(v))))
        .collect()
}

fn percent(value: &str) -> String {
    value
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn select(name: &str, label: &str, options: &[String], current: Option<&str>) -> Markup {
    html! {
        label {
            (label)
            select name=(name) {
                option value="" { "all" }
                @for o in options {
                    option value=(o) selected[Some(o.as_str()) == current] { (o) }
                }
            }
        }
    }
}

/// The trigger types a record can have: `run`'s, and `triggers.json`'s.
const TRIGGER_TYPES: [&str; 6] = ["cli", "comment", "cron", "issue", "label", "pull_request"];
/// The most runs of each outcome the chart counts: past this it draws the newest this many, and
/// says so. Only when each ended is read, never a record.
const CHART_MAX: usize = 20_000;

/// The page of runs the filters find, and when each run they find ended (for the chart over
/// `span`).
type RunsFound = (
    Result<records::store::Page, String>,
    Result<Vec<(u64, Outcome)>, String>,
);

impl RunsQuery {
    /// Asks the index for the page these filters show and for the chart's endings.
    async fn find(&self, panel: &Arc<Panel>, now: u64, span: u64) -> RunsFound {
        let Some(query) = self.query(now) else {
            return (Ok(records::store::Page::default()), Ok(Vec::new()));
        };
        let listed = records::query::Query {
            limit: PAGE,
            ..query.clone()
        };
        let drawn = records::query::Query {
            limit: CHART_MAX,
            since_ms: Some(query.since_ms.unwrap_or(0).max(now.saturating_sub(span))),
            ..query
        };
        (
            find(panel, listed, self.cursor()).await,
            ended(panel, drawn).await,
        )
    }

    /// The filters' form: outcome, reason, trigger and when the runs ended.
    fn form(&self) -> Markup {
        let reasons: Vec<String> = std::iter::once("none")
            .chain(Reason::ALL.iter().map(|r| r.as_str()))
            .map(str::to_owned)
            .collect();
        let triggers: Vec<String> = TRIGGER_TYPES.iter().map(|t| (*t).to_owned()).collect();
        let outcomes: Vec<String> = [
            Outcome::Completed,
            Outcome::Failed,
            Outcome::Policy,
            Outcome::Cancelled,
        ]
        .iter()
        .map(|o| o.as_str().to_owned())
        .collect();
        html! {
            form.filters method="get" action="/runs" {
                (select("outcome", "Outcome", &outcomes, chosen(self.outcome.as_deref())))
                (select("reason", "Reason", &reasons, chosen(self.reason.as_deref())))
                (select("trigger", "Trigger", &triggers, chosen(self.trigger.as_deref())))
                label {
                    "Ended in"
                    select name="since" {
                        option value="" { "all time" }
                        @for (key, words, _) in SPANS {
                            option value=(key) selected[self.since.as_deref() == Some(key)] { (words) }
                        }
                    }
                }
                button type="submit" { "Show" }
            }
        }
    }
}

/// What the filters found: the chart of outcomes over `span`, the page of runs and the links to
/// the pages beside it.
fn runs_found(q: &RunsQuery, (shown, charted): &RunsFound, now: u64, span: u64) -> Markup {
    html! {
        @match (shown, charted) {
            (Ok(listed), Ok(ended)) => {
                @if !listed.unreadable.is_empty() {
                    p.muted { (listed.unreadable.len()) " records on this page cannot be read (pi-dispatch runs lists them)" }
                }
                (charts::outcomes(ended.iter().copied(), now, span, 24))
                p.muted {
                    "Outcomes over " (SPANS.iter().find(|s| s.2 == span).map_or("the last day", |s| s.1)) ", in 24 bars"
                    @if ended.len() >= CHART_MAX { " (at most the newest " (CHART_MAX) " of each outcome)" }
                    "."
                }
                (runs_table(listed.records.iter()))
                nav.pages {
                    @if q.after.is_some() { a href={"/runs?" (q.with_after(None))} { "← newest" } }
                    @if let Some(next) = &listed.next { a href={"/runs?" (q.with_after(Some(next)))} { "older →" } }
                    @if listed.records.is_empty() { span.muted { "No run matches." } }
                }
            },
            (Err(e), _) | (_, Err(e)) => p.error { "The records cannot be read: " (e) },
        }
    }
}

pub async fn runs(
    State(panel): State<Arc<Panel>>,
    authed: Authed,
    Query(q): Query<RunsQuery>,
) -> Response {
    let now = now_ms();
    let span = span_ms(q.since.as_deref()).unwrap_or(86_400_000);
    let found = q.find(&panel, now, span).await;
    let body = html! {
        h1 { "Runs" }
        (q.form())
        (runs_found(&q, &found, now, span))
    };
    page(
        StatusCode::OK,
        frame("Runs", Some(Section::Runs), &authed.csrf, None, &body),
    )
}

/// A run's record, read from the index now.
async fn record_of(panel: &Arc<Panel>, id: &str) -> Option<Record> {
    if !records::store::is_plain_id(id) {
        return None;
    }
    let (p, id) = (panel.clone(), id.to_owned());
    tokio::task::spawn_blocking(move || p.records.read(&id).ok())
        .await
        .ok()
        .flatten()
}

pub async fn run(
    State(panel): State<Arc<Panel>>,
    authed: Authed,
    Path(id): Path<String>,
) -> Response {
    let Some(r) = record_of(&panel, &id).await else {
        return not_ended(&panel, &authed, &id).await;
    };
    let transcript = transcript_of(&panel, &r).await;
    let (queue, of) = (panel.queue.clone(), r.job_id.clone());
    let reruns = tokio::task::spawn_blocking(move || queue.reruns(&of).unwrap_or_default())
        .await
        .unwrap_or_default();
    let body = html! {
        (run_body(&r, &transcript))
        h2 { "Run it again" }
        @if !reruns.is_empty() {
            p #reruns { "Run again as: "
                @for (i, again) in reruns.iter().enumerate() {
                    @if i > 0 { ", " }
                    a href={"/runs/" (again)} { code { (again) } }
                }
            }
        }
        @if r.job.is_some() {
            form.rerun method="post" action={"/runs/" (r.job_id) "/rerun"} {
                input type="hidden" name="csrf" value=(authed.csrf);
                button type="submit" { "Run again" }
                " "
                span.muted { "A new job, as this one was queued, through the same checks." }
            }
        } @else {
            p.muted { "This record was written by an earlier version and keeps no job to run again." }
        }
    };
    page(
        StatusCode::OK,
        frame(
            &format!("Run {}", r.job_id),
            Some(Section::Runs),
            &authed.csrf,
            None,
            &body,
        ),
    )
}

/// The page of a job with no record: live while the queue has it (queued or running), else not
/// found.
async fn not_ended(panel: &Arc<Panel>, authed: &Authed, id: &str) -> Response {
    if let Some(live) = live_of(panel, id).await {
        return page(
            StatusCode::OK,
            frame(
                &format!("Run {id}"),
                Some(Section::Runs),
                &authed.csrf,
                Some(LIVE_REFRESH_SECS),
                &live_body(&live),
            ),
        );
    }
    let body = html! {
        h1 { "No record" }
        p { "No job has the id " code { (id) } ": it is neither queued, running nor recorded (see the "
            a href="/" { "queue" } ")." }
    };
    page(
        StatusCode::NOT_FOUND,
        frame("No record", Some(Section::Runs), &authed.csrf, None, &body),
    )
}

/// The transcript a record says its job left, read off the runtime for the page (`None`: it left
/// none).
async fn transcript_of(
    panel: &Arc<Panel>,
    r: &Record,
) -> Result<Option<transcript_view::View>, std::io::ErrorKind> {
    if !r.transcript {
        return Ok(None);
    }
    let path = records::transcripts::path(&panel.jobs_dir, &r.job_id);
    tokio::task::spawn_blocking(move || {
        std::fs::File::open(&path)
            .map(|f| transcript_view::read(std::io::BufReader::new(f)))
            .map_err(|e| e.kind())
    })
    .await
    .unwrap_or(Err(std::io::ErrorKind::Other))
    .map(Some)
}

/// How often a job's page reloads itself while the job has not ended.
const LIVE_REFRESH_SECS: u32 = 2;

/// The transcript lines a live page shows: the newest.
const LIVE_LINES: u64 = 400;

/// A job that has not ended, as its page shows it.
struct Live {
    job: Shown,
    /// What it shows live, once its worker has written it.
    snapshot: Option<records::live::Snapshot>,
    /// The newest lines of its transcript so far, and how many came in all.
    transcript: transcript_view::View,
    lines: u64,
}

/// Job `id` from the queue, with what it shows live: `None` when the queue has no such job open.
async fn live_of(panel: &Arc<Panel>, id: &str) -> Option<Live> {
    let (open, queue, id) = (
        open_jobs(panel).await.ok()?,
        panel.queue.clone(),
        id.to_owned(),
    );
    let job = open.jobs.into_iter().find(|j| j.id == id)?;
    tokio::task::spawn_blocking(move || {
        let (snapshot, _, total) = match records::live::read(&*queue, &id, 0, 0) {
            Ok(Some(found)) => found,
            _ => {
                return Some(Live {
                    job,
                    snapshot: None,
                    transcript: transcript_view::View::default(),
                    lines: 0,
                });
            }
        };
        let from = total.saturating_sub(LIVE_LINES);
        let lines = records::live::read(&*queue, &id, from, LIVE_LINES as usize)
            .ok()
            .flatten()
            .map(|(_, lines, _)| lines)
            .unwrap_or_default();
        let text = lines.join("\n");
        Some(Live {
            job,
            snapshot: Some(snapshot),
            transcript: transcript_view::read(std::io::Cursor::new(text.into_bytes())),
            lines: total,
        })
    })
    .await
    .ok()
    .flatten()
}

/// The page of a job that has not ended: where it stands, its timeline so far, its servers, what pi
/// began and its transcript so far (redacted). It reloads itself until the job's record replaces it.
fn live_body(live: &Live) -> Markup {
    let job = &live.job;
    let tools = live
        .snapshot
        .as_ref()
        .map(records::live::Snapshot::tools_begun)
        .unwrap_or_default();
    let so_far = live.snapshot.as_ref().map(|s| {
        let mut r = s.record.clone();
        r.activity.clone_from(&s.activity);
        r.mcp.servers.clone_from(&s.servers);
        r.finished_at_ms = records::record::now_ms();
        r
    });
    html! {
        h1 #live { "Run " code { (job.id) } " " (pill(job.state)) }
        p.muted { "This job has not ended: the page follows it, and its record replaces it when it ends." }
        dl.facts {
            dt { "State" } dd {
                (job.state)
                @if let Some(w) = &job.worker { " on " (w) }
                @if let Some(s) = job.running_secs { ", for " (took(s * 1000)) }
                @if job.running_secs.is_none() { ", queued " (took(job.waited_secs * 1000)) " ago" }
            }
            @if let Some(s) = &live.snapshot { dt { "Phase" } dd { (s.phase()) } }
            @if !job.needs.is_empty() { dt { "Needs" } dd { (job.needs.join(", ")) } }
            @if let Some(issue) = &job.issue { dt { "For" } dd { (issue) } }
            @if let Some(folder) = &job.folder { dt { "Folder" } dd { code { (folder) } } }
            @if let Some(task) = &job.task { dt { "Task" } dd { (task) } }
            @if let Some(t) = &job.trigger_type { dt { "Trigger" } dd { (t) ", attempt " (job.attempt) } }
            @if let Some(of) = &job.rerun_of { dt { "Runs again" } dd { a href={"/runs/" (of)} { (of) } } }
            @if let Some(s) = &live.snapshot {
                dt { "So far" } dd #so-far { (count(s.turns as usize, "turn")) ", " (count(s.tool_calls as usize, "tool call")) " (as pi says)" }
            }
        }
        @if let Some(r) = &so_far {
            h2 { "Timeline so far" }
            (charts::timeline(r))
            h2 { "MCP servers" }
            @if r.mcp.servers.is_empty() {
                p.muted { "None has said its state yet (they are connecting, or the job names none)." }
            } @else {
                (servers_table(&r.mcp.servers))
            }
            h2 { "Tool calls so far" }
            @if tools.is_empty() {
                p.muted { "None yet." }
            } @else {
                table #live-tools {
                    thead { tr { th { "Tool" } th.num { "Calls begun" } } }
                    tbody { @for (t, n) in &tools { tr { td { (t) } td.num { (n) } } } }
                }
            }
            h2 { "Transcript so far" }
            @if s_cut(live) { p.muted { "The live view keeps no more lines: the whole transcript is kept with the record." } }
            p.muted { "Redacted as it is stored. " (live.lines) " lines in all; the newest " (live.transcript.entries.len()) " entries shown." }
            ol.transcript #live-transcript {
                @for e in &live.transcript.entries {
                    li { span.kind { (e.kind) } @if !e.text.is_empty() { pre { (e.text) } } }
                }
            }
        }
    }
}

fn s_cut(live: &Live) -> bool {
    live.snapshot.as_ref().is_some_and(|s| s.cut)
}

fn run_body(
    r: &Record,
    transcript: &Result<Option<transcript_view::View>, std::io::ErrorKind>,
) -> Markup {
    html! {
        h1 { "Run " code { (r.job_id) } " " (pill(r.outcome.as_str())) }
        @if let Some(of) = &r.rerun_of {
            p #rerun-of { "Runs " a href={"/runs/" (of)} { code { (of) } } " again." }
        }
        (run_facts(r))
        h2 { "Timeline" }
        (charts::timeline(r))
        (run_mcp(r))
        (pins_view::run_pins(r))
        h2 { "Egress denied" }
        @if r.egress_denied.is_empty() {
            p.muted { "Nothing was denied (or egress was off)." }
        } @else {
            table #egress {
                thead { tr { th { "Host" } th.num { "Port" } th { "Why" } th.num { "Attempts" } } }
                tbody {
                    @for d in &r.egress_denied {
                        tr { td { (d.host) } td.num { (d.port) } td { (d.reason) } td.num { (d.count) } }
                    }
                }
            }
        }
        @if let Some(m) = &r.final_message {
            h2 { "The agent's last answer" }
            pre.final { (m) }
        }
        (run_transcript(r, transcript))
    }
}

/// What a run was for, when each step came, and what it spent.
fn run_facts(r: &Record) -> Markup {
    let since = |at: Option<u64>| at.and_then(|a| r.queued_at_ms.map(|q| a.saturating_sub(q)));
    html! {
        dl.facts {
            dt { "Outcome" } dd { (r.outcome.as_str()) }
            @if let Some(reason) = r.reason {
                dt { "Reason" } dd { code { (reason.as_str()) } " — " (reason.sentence()) }
            }
            @if let Some(d) = &r.detail {
                dt { "Detail" } dd { (d.why) }
                @let concerns = d.concerns();
                @if !concerns.is_empty() { dt { "Concerns" } dd { (concerns.join("; ")) } }
            }
            @if let Some(fix) = &r.fix { dt { "Fix" } dd { (fix) } }
            @if let Some(item) = &r.item {
                dt { "For" } dd {
                    @match &r.url {
                        Some(url) if url.starts_with("https://") || url.starts_with("http://") => {
                            a href=(url) rel="noreferrer noopener" { (item) }
                        }
                        _ => { (item) }
                    }
                }
            }
            @if let Some(folder) = &r.folder { dt { "Folder" } dd { code { (folder) } } }
            @if let Some(task) = &r.task { dt { "Task" } dd { pre.task { (task) } } }
            dt { "Trigger" } dd {
                (r.trigger_type)
                @if let Some(i) = r.trigger_index { " (trigger " (i) ")" }
                ", kind " (r.kind) ", attempt " (r.attempt)
            }
            @if let Some(q) = r.queued_at_ms { dt { "Queued" } dd { (when(q)) } }
            @if let Some(ms) = since(r.admitted_at_ms) { dt { "Admitted" } dd { "after " (took(ms)) } }
            @if let Some(ms) = since(r.started_at_ms) { dt { "Sandbox asked for" } dd { "after " (took(ms)) } }
            @if let Some(ms) = since(r.sandbox_up_at_ms) { dt { "Sandbox up" } dd { "after " (took(ms)) } }
            dt { "Ended" } dd {
                (when(r.finished_at_ms))
                @if let Some(ms) = since(Some(r.finished_at_ms)) { ", " (took(ms)) " after it was queued" }
            }
            @if let Some(w) = &r.worker { dt { "Worker" } dd { (w) } }
            dt { "Model" } dd {
                (r.provider.as_deref().unwrap_or("-")) "/" (r.model.as_deref().unwrap_or("-"))
                @if let Some(t) = r.turns { ", " (t) " turns" }
            }
            dt { "Tokens" } dd {
                @match &r.tokens {
                    Some(t) => { (t.input) " in, " (t.output) " out, " (t.total) " in all" },
                    None => "none counted",
                }
            }
            dt { "Cost" } dd {
                (r.cost_usd.map_or("none counted".to_owned(), dollars))
                " · spent: " (if r.spent { "yes" } else { "no" })
                " · budget reserved: " (if r.budget_reserved { "yes" } else { "no" })
            }
            @if let Some(pr) = &r.pull_request { dt { "Proposed" } dd { (pr) } }
        }
    }
}

/// Each server's state, and how long it took to be ready.
fn servers_table(servers: &[protocol::exit_line::ServerState]) -> Markup {
    html! {
        table #servers {
            thead { tr { th { "Server" } th { "State" } th.num { "Ready after" } } }
            tbody {
                @for s in servers {
                    tr {
                        td { (s.name) }
                        td { (pill(&s.state)) }
                        td.num { @if let Some(ms) = s.ready_ms { (took(ms)) } }
                    }
                }
            }
        }
    }
}

/// The run's MCP servers and their tool calls.
fn run_mcp(r: &Record) -> Markup {
    html! {
        h2 { "MCP servers" }
        @if r.mcp.servers.is_empty() {
            p.muted { "No server was connected." }
        } @else {
            (servers_table(&r.mcp.servers))
        }
        h2 { "Tool calls" }
        @if r.mcp.tool_calls.is_empty() {
            p.muted { "No MCP tool was called." }
        } @else {
            table #tools {
                thead { tr {
                    th { "Server" } th { "Tool" } th.num { "Calls" } th.num { "Errors" }
                    th.num { "Refused" } th.num { "Total ms" } th.num { "Bytes" }
                } }
                tbody {
                    @for c in &r.mcp.tool_calls {
                        tr {
                            td { (c.server) } td { (c.tool) } td.num { (c.calls) } td.num { (c.error) }
                            td.num { (c.refused) } td.num { (c.total_ms) } td.num { (c.result_bytes) }
                        }
                    }
                }
            }
        }
    }
}

/// The run's transcript, as stored (redacted), or why there is none here.
fn run_transcript(
    r: &Record,
    transcript: &Result<Option<transcript_view::View>, std::io::ErrorKind>,
) -> Markup {
    html! {
        h2 { "Transcript" }
        @match transcript {
            Ok(None) => p.muted { "No transcript was kept (the job did not start, transcripts are off, or it could not be written)." },
            Err(std::io::ErrorKind::NotFound) => p.muted {
                "The transcript is kept on the host of the worker that ran the job"
                @if let Some(w) = &r.worker { " (" (w) ")" }
                "."
            },
            Err(kind) => p.error { "The transcript cannot be read (" (kind) ")." },
            Ok(Some(view)) => {
                p.muted {
                    "As stored (redacted). " (view.entries.len()) " entries"
                    @if view.deltas > 0 { "; " (view.deltas) " streaming updates left out" }
                    @if view.cut { "; the rest is in the full transcript" }
                    ". " a href={"/runs/" (r.job_id) "/transcript"} { "Full transcript" }
                }
                ol.transcript {
                    @for e in &view.entries {
                        li { span.kind { (e.kind) } @if !e.text.is_empty() { pre { (e.text) } } }
                    }
                }
            }
        }
    }
}

/// The transcript's file as stored (redacted), as plain text.
pub async fn transcript(
    State(panel): State<Arc<Panel>>,
    _authed: Authed,
    Path(id): Path<String>,
) -> Response {
    let Some(r) = record_of(&panel, &id).await.filter(|r| r.transcript) else {
        return (StatusCode::NOT_FOUND, "no transcript has that id\n").into_response();
    };
    let path = records::transcripts::path(&panel.jobs_dir, &r.job_id);
    match tokio::fs::read(&path).await {
        Ok(bytes) => ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], bytes).into_response(),
        Err(e) => (
            StatusCode::NOT_FOUND,
            format!("the transcript cannot be read here ({})\n", e.kind()),
        )
            .into_response(),
    }
}

pub async fn health(State(panel): State<Arc<Panel>>, authed: Authed) -> Response {
    let checks = panel.health.clone();
    let mut checks = tokio::task::spawn_blocking(move || checks())
        .await
        .unwrap_or_default();
    // The workers are looked at on every visit: a worker killed a moment ago shows at once.
    checks.insert(0, workers_health(&open_jobs(&panel).await));
    let at = |level: &str| checks.iter().filter(|c| c.level == level).count();
    let body = html! {
        h1 { "Health" }
        p.muted {
            "Doctor's checks (run again at most every 30 s): " (at("ok")) " ok, "
            (count(at("warn"), "warning")) ", " (at("fail")) " failed."
        }
        table #checks {
            thead { tr { th {} th { "Check" } th { "Fix" } } }
            tbody {
                @for c in &checks {
                    tr {
                        td { (pill(&c.level)) }
                        td { (c.label) }
                        td { @if let Some(f) = &c.fix { pre { (f) } } }
                    }
                }
            }
        }
    };
    page(
        StatusCode::OK,
        frame("Health", Some(Section::Health), &authed.csrf, None, &body),
    )
}

/// A form posted without this session's CSRF token is refused, and nothing changes.
fn stale_form(authed: &Authed, form: &CsrfForm) -> Option<Response> {
    if csrf_ok(authed, &form.csrf) {
        return None;
    }
    tracing::warn!(event = "panel_csrf_refused");
    Some(
        (
            StatusCode::FORBIDDEN,
            "the form is stale: reload the page\n",
        )
            .into_response(),
    )
}

pub async fn cancel(
    State(panel): State<Arc<Panel>>,
    authed: Authed,
    Path(id): Path<String>,
    Form(form): Form<CsrfForm>,
) -> Response {
    if let Some(refused) = stale_form(&authed, &form) {
        return refused;
    }
    let p = panel.clone();
    let job = id.clone();
    let answer = tokio::task::spawn_blocking(move || {
        records::store::cancel(&*p.queue, &p.records, &job, SystemTime::now())
    })
    .await;
    let result = match answer {
        Ok(Ok(queue::Cancel::Removed { .. })) => "removed",
        Ok(Ok(queue::Cancel::Stopping { .. })) => "stopping",
        Ok(Ok(queue::Cancel::AlreadyDone)) => "done",
        Ok(Ok(queue::Cancel::Unknown)) => "unknown",
        Ok(Err(e)) => {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the queue cannot be changed now: {e}\n"),
            )
                .into_response();
        }
        Err(_) => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    };
    tracing::info!(event = "panel_cancel", job_id = %id, result);
    // The record of a job cancelled before it started is read at the next refresh.
    Redirect::to(&format!(
        "/?{}",
        url_pairs(&[("cancelled", Some(&id)), ("result", Some(result))]).join("&")
    ))
    .into_response()
}

pub async fn rerun(
    State(panel): State<Arc<Panel>>,
    authed: Authed,
    Path(id): Path<String>,
    Form(form): Form<CsrfForm>,
) -> Response {
    if let Some(refused) = stale_form(&authed, &form) {
        return refused;
    }
    let (rerun, of) = (panel.rerun.clone(), id.clone());
    let answer = tokio::task::spawn_blocking(move || rerun(&of))
        .await
        .unwrap_or_else(|_| Err("the job could not be queued again".to_owned()));
    match answer {
        Ok(new) => {
            tracing::info!(event = "panel_rerun", job_id = %new, rerun_of = %id);
            Redirect::to(&format!("/runs/{new}")).into_response()
        }
        Err(why) => {
            let body = html! {
                h1 { "Not run again" }
                p.error #not-rerun { (why) }
                p { a href={"/runs/" (id)} { "Back to the run" } }
            };
            page(
                StatusCode::CONFLICT,
                frame(
                    "Not run again",
                    Some(Section::Runs),
                    &authed.csrf,
                    None,
                    &body,
                ),
            )
        }
    }
}

pub async fn not_found(_authed: Authed) -> Response {
    (StatusCode::NOT_FOUND, "nothing is here\n").into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_become_the_query_of_the_index_and_pages_follow_a_cursor() {
        use records::query::{ReasonIs, TriggerIs};
        let now = 100 * 86_400_000;
        let q = |o: &str, re: &str, t: &str, s: &str| RunsQuery {
            outcome: Some(o.into()),
            reason: Some(re.into()),
            trigger: Some(t.into()),
            since: Some(s.into()),
            after: None,
        };
        let all = q("", "", "", "").query(now).unwrap();
        assert_eq!(all.filter(), queue::RecordFilter::default());
        let some = q("policy", "mcp-unavailable", "cron", "24h")
            .query(now)
            .unwrap();
        assert_eq!(some.outcome, Some(Outcome::Policy));
        assert_eq!(some.reason, Some(ReasonIs::Is(Reason::McpUnavailable)));
        assert_eq!(some.trigger, Some(TriggerIs::Type("cron".into())));
        assert_eq!(some.since_ms, Some(now - 86_400_000));
        assert_eq!(
            q("", "none", "", "").query(now).unwrap().reason,
            Some(ReasonIs::None)
        );
        // A word that names no outcome or reason matches nothing, rather than everything.
        assert_eq!(q("bogus", "", "", "").query(now), None);
        assert_eq!(q("", "bogus", "", "").query(now), None);
        let cursor = queue::Cursor {
            finished_at_ms: 42,
            id: "job-1.attempt-1".into(),
        };
        let link = q("policy", "", "a b&c", "").with_after(Some(&cursor));
        assert_eq!(
            link,
            "outcome=policy&trigger=a%20b%26c&after=42-job-1.attempt-1"
        );
        let back = RunsQuery {
            after: Some("42-job-1.attempt-1".into()),
            ..RunsQuery::default()
        };
        assert_eq!(back.cursor(), Some(cursor));
        assert_eq!(q("", "", "", "").with_after(None), "");
    }
}
