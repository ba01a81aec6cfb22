//! The panel as WCAG 2.1 AA asks, judged in headless Chromium by axe-core (Deque's engine, pinned
//! in package.json): every page the panel serves, filled with runs of every outcome, jobs in every
//! state of the queue and doctor's checks, has no serious or critical violation. And the queue
//! page, which reloads itself, stops when the reader asks it to.
//!
//! The deployment needs no image: the runs are records written as the worker writes them, and the
//! jobs are put in the queue in the states the panel shows.

use std::time::{Duration, Instant, SystemTime};

use protocol::detail::Detail;
use protocol::exit_line::ServerState;
use protocol::job::Job;
use protocol::reason::{Outcome, Reason};
use protocol::usage::ToolCallCount;
use queue::Queue as _;
use records::record::{Activity, EgressDenial, Record, Tokens};
use serde_json::{Value, json};
use testkit::webdriver::{Browser, ENTER};

use crate::common::{Deployment, Listening};

const TOKEN: &str = "CNRY-panel-axe-4c1d88e02b7f";

/// The runs written, by outcome.
struct Runs {
    completed: String,
    policy: String,
    failed: String,
    cancelled: String,
}

/// What the completed run made of its servers' pins: docs pinned on first use, search's tools
/// withheld.
fn pin_reports() -> Vec<protocol::pins::PinReport> {
    use protocol::pins::{Drift, DriftKind, PinPolicy, PinReport};
    let drift = |tool: &str, kind: DriftKind| Drift {
        tool: tool.into(),
        kind,
        pinned: (kind != DriftKind::New).then(|| protocol::pins::digest("{}")),
        seen: protocol::pins::digest(r#"{"name":"x"}"#),
    };
    vec![
        PinReport {
            unpinnable: 0,
            server: "docs".into(),
            first_use: true,
            drift: Vec::new(),
            gone: Vec::new(),
            policy: PinPolicy::Withhold,
        },
        PinReport {
            unpinnable: 0,
            server: "search".into(),
            first_use: false,
            drift: vec![
                drift("query", DriftKind::Changed),
                drift("fetch", DriftKind::New),
            ],
            gone: vec!["index".into()],
            policy: PinPolicy::Withhold,
        },
    ]
}

/// A pin for docs and search in the queue's store, and drift of search's waiting for approval.
fn store_pins(q: &queue::SqliteQueue, now_ms: u64) {
    use protocol::pins::{Comparison, Listing, StoredDrift, StoredPin};
    let at = |ms: u64| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
    for server in ["docs", "search"] {
        let pin = StoredPin {
            definitions: Default::default(),
            listing: Listing::of(Default::default(), [("query", "{}"), ("index", "{}")]),
            pinned_at_ms: now_ms - 3_600_000,
            by: "job first-job".into(),
        };
        let text = serde_json::to_string(&pin).unwrap();
        assert!(
            q.put_pin(server, &text, false, at(now_ms - 3_600_000))
                .unwrap()
        );
    }
    let drift = StoredDrift {
        definitions: Default::default(),
        job_id: "run-completed".into(),
        seen_at_ms: now_ms - 60_000,
        listing: Listing::default(),
        comparison: Comparison {
            unpinnable: 0,
            first_use: false,
            drift: pin_reports().remove(1).drift,
            gone: vec!["index".into()],
        },
    };
    let text = serde_json::to_string(&drift).unwrap();
    q.put_pin_drift("search", &text, at(now_ms - 60_000))
        .unwrap();
}

/// An initialised deployment whose records hold a run of each outcome (the completed one with
/// servers in every state, tool calls, denied egress and a transcript), and whose queue holds a
/// job queued, waiting to retry, running, being cancelled and lost.
fn filled() -> (Deployment, Runs) {
    let d = Deployment::new();
    let init = d.run(&["init"]);
    assert_eq!(init.code, 0, "{}", init.stderr);
    // The token in the deployment's .env, as an operator keeps it: in no process's environment.
    let env = std::fs::read_to_string(d.path().join(".env")).unwrap();
    // Workers seen at the start stay live for the whole test (three heartbeats of 300 s).
    d.write(
        ".env",
        &format!("{env}\nPI_PANEL_TOKEN={TOKEN}\nPI_WORKER_HEARTBEAT_SECS=300\n"),
    );
    let now = SystemTime::now();
    let now_ms = records::record::unix_ms(now);
    let records = d.records();
    let job = |id: &str, task: &str| {
        let mut job = Job::new(id, "cli", "local");
        job.task = Some(task.to_owned());
        job.folder = Some("/srv/repos/website".to_owned());
        job
    };
    let write = |r: &Record| assert!(records.write(r).unwrap());

    let at = now_ms - 40 * 60_000;
    let mut done = Record::new(
        &job("run-completed", "Read the README and say what it says."),
        Outcome::Completed,
        None,
        1,
        at,
    );
    done.queued_at_ms = Some(at - 95_000);
    done.admitted_at_ms = Some(at - 93_000);
    done.started_at_ms = Some(at - 90_000);
    done.sandbox_up_at_ms = Some(at - 88_000);
    done.provider = Some("fake".into());
    done.model = Some("fake-model".into());
    done.turns = Some(3);
    done.tokens = Some(Tokens {
        input: 1200,
        output: 340,
        total: 1540,
    });
    done.cost_usd = Some(0.0123);
    done.spent = true;
    done.budget_reserved = true;
    done.worker = Some("host-a:4242".into());
    for (name, state, ready_ms) in [
        ("docs", "ready", Some(400)),
        ("search", "failed", None),
        ("slow", "waiting", None),
        ("unused", "skipped", None),
    ] {
        done.mcp.servers.push(ServerState {
            name: name.into(),
            state: state.into(),
            ready_ms,
            listing: None,
        });
    }
    done.mcp.tool_calls.push(ToolCallCount {
        server: "docs".into(),
        tool: "echo".into(),
        calls: 2,
        ok: 1,
        error: 1,
        refused: 0,
        total_ms: 31,
        result_bytes: 512,
    });
    for (k, kind) in ["turn", "tool", "turn"].iter().enumerate() {
        done.activity.push(Activity {
            at_ms: at - 80_000 + k as u64 * 20_000,
            kind: (*kind).into(),
            tool: (*kind == "tool").then(|| "mcp__docs__echo".into()),
        });
    }
    done.egress_denied.push(EgressDenial {
        host: "example.org".into(),
        port: 443,
        reason: "not-allowed".into(),
        count: 2,
    });
    done.mcp.pins = pin_reports();
    done.final_message = Some("All done: the README says hello.".into());
    done.transcript = true;
    d.write(
        "state/jobs/run-completed/transcript.jsonl",
        concat!(
            r#"{"type":"message_end","message":{"role":"user","content":[{"type":"text","text":"Read the README."}]}}"#,
            "\n",
            r#"{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":"All done: the README says hello."}]}}"#,
            "\n"
        ),
    );
    write(&done);

    let refused = Record::ended(
        &job("run-policy", "Use a server that goes away."),
        Reason::McpServerUnknown,
        1,
        now_ms - 30 * 60_000,
    )
    .with_detail(
        Detail {
            server: Some("gone".into()),
            why: "server gone is not offered to jobs".into(),
            ..Detail::default()
        },
        "offer gone in the overlay's mcp.json, or take it off the job",
    );
    write(&refused);
    let mut failed = Record::ended(
        &job("run-failed", "Summarise the open issues."),
        Reason::ModelError,
        2,
        now_ms - 20 * 60_000,
    );
    failed.queued_at_ms = Some(now_ms - 21 * 60_000);
    failed.started_at_ms = Some(now_ms - 20 * 60_000 - 30_000);
    write(&failed);
    write(&Record::ended(
        &job("run-cancelled", "Wait to be cancelled."),
        Reason::Cancelled,
        1,
        now_ms - 10 * 60_000,
    ));

    // A retried job waits an hour, not the default 5 s: it must still be waiting when the page is
    // read, however slowly the machine gets there.
    let an_hour = queue::Backoff {
        first: Duration::from_secs(3600),
        cap: Duration::from_secs(3600),
    };
    let config = queue::Config {
        backoff: an_hour,
        ..queue::Config::default()
    };
    let q = queue::SqliteQueue::open_with(&queue::sqlite_path(d.path()), config).unwrap();
    let put = |id: &str, at: SystemTime| {
        let payload = serde_json::to_string(&job(id, &format!("The job {id}."))).unwrap();
        assert!(q.enqueue(id, &payload, at).unwrap());
    };
    store_pins(&q, now_ms);
    let hour = Duration::from_secs(3600);
    // Each leased as soon as it is queued: a lease takes the oldest job available.
    put("job-running", now);
    let running = q.lease("host-a:1", hour, now).unwrap().unwrap();
    assert_eq!(running.job_id, "job-running");
    put("job-cancelling", now);
    let cancelling = q.lease("host-a:2", hour, now).unwrap().unwrap();
    assert!(matches!(
        q.cancel(&cancelling.job_id, now).unwrap(),
        queue::Cancel::Stopping { .. }
    ));
    put("job-waiting", now);
    let waiting = q.lease("host-a:3", hour, now).unwrap().unwrap();
    q.retry(&waiting, now).unwrap();
    // Leased two hours ago for a second: its lease has lapsed.
    let then = now - 2 * hour;
    put("job-lost", then);
    let lost = q.lease("host-b:9", Duration::from_secs(1), then).unwrap();
    assert_eq!(lost.unwrap().job_id, "job-lost");
    put("job-queued", now);
    // One that needs a label no live worker carries.
    let tpu = queue::NewJob {
        placement: queue::Placement {
            needs: vec!["tpu".to_owned()],
            ..queue::Placement::default()
        },
        ..queue::NewJob::plain(
            "job-no-host",
            &serde_json::to_string(&job("job-no-host", "Needs a TPU.")).unwrap(),
        )
    };
    assert!(q.enqueue_job(&tpu, now).unwrap());
    // Workers: one live, one draining, one gone two hours ago.
    let card = |id: &str, draining: bool| queue::WorkerCard {
        id: id.to_owned(),
        host: id.split(':').next().unwrap().to_owned(),
        pid: 1,
        version: "0.1.0".to_owned(),
        labels: vec![
            format!("host:{}", id.split(':').next().unwrap()),
            "gpu".to_owned(),
        ],
        concurrency: 2,
        started_ms: now_ms - 3_600_000,
        running: 1,
        draining,
    };
    q.announce(&card("host-a:1", false), now).unwrap();
    q.announce(&card("host-a:2", true), now).unwrap();
    q.announce(&card("host-b:9", false), then).unwrap();
    // What the running job shows live: its server, what pi began, its transcript so far.
    let mut so_far = Record::ended(
        &job("job-running", "The job job-running."),
        Reason::Cancelled,
        1,
        0,
    );
    so_far.queued_at_ms = Some(now_ms - 60_000);
    so_far.admitted_at_ms = Some(now_ms - 59_000);
    so_far.started_at_ms = Some(now_ms - 58_000);
    so_far.sandbox_up_at_ms = Some(now_ms - 57_000);
    let live = records::live::Snapshot {
        record: so_far,
        worker: "host-a:1".to_owned(),
        servers: vec![
            ServerState {
                name: "docs".into(),
                state: "ready".into(),
                ready_ms: Some(850),
                listing: None,
            },
            ServerState {
                name: "wiki".into(),
                state: "failed".into(),
                ready_ms: None,
                listing: None,
            },
        ],
        activity: vec![
            Activity {
                at_ms: now_ms - 50_000,
                kind: "turn".into(),
                tool: None,
            },
            Activity {
                at_ms: now_ms - 49_000,
                kind: "tool".into(),
                tool: Some("bash".into()),
            },
        ],
        turns: 1,
        tool_calls: 1,
        updated_at_ms: now_ms,
        lines: 2,
        cut: false,
    };
    q.live_put(
        "job-running",
        &serde_json::to_string(&live).unwrap(),
        &[
            r#"{"type":"turn_start"}"#.to_owned(),
            r#"{"type":"tool_execution_start","toolName":"bash","args":{"command":"ls"}}"#
                .to_owned(),
        ],
        now,
    )
    .unwrap();

    let runs = Runs {
        completed: done.job_id,
        policy: refused.job_id,
        failed: failed.job_id,
        cancelled: "run-cancelled".into(),
    };
    (d, runs)
}

/// `pi-dispatch panel` on a loopback port of its own.
fn start_panel(d: &Deployment) -> Listening {
    Listening::start(super::panel_command(d), "panel_listening")
}

/// Logs the browser in with the panel's token.
fn log_in(browser: &Browser, panel: &Listening) {
    browser.go(&format!("{}/login", panel.url));
    browser.find("#token").type_text(TOKEN);
    browser.find("form.login button").click();
    browser.wait_for("header form");
}

/// Runs axe-core on the page shown, with a line too faint to read added to it as a control: the
/// WCAG 2.0 and 2.1 A and AA rules. What comes back: how many rules passed, each violation but
/// the control's (rule, impact, where, why), whether the control was reported, and each badge or
/// muted text that the contrast rule did not judge (neither passed nor failed).
const AUDIT: &str = r#"
const done = arguments[arguments.length - 1];
const control = document.createElement('p');
control.id = 'axe-control';
control.textContent = 'A line too faint to read, which axe-core must report.';
control.style.color = '#c8c8c8';
control.style.backgroundColor = '#ffffff';
(document.querySelector('main') || document.body).appendChild(control);
const watched = Array.from(document.querySelectorAll('.pill, .muted'));
axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa']}})
  .then((r) => {
    const contrast = (list) => (list.find((rule) => rule.id === 'color-contrast') || {nodes: []}).nodes;
    const judged = new Set(contrast(r.passes).concat(contrast(r.violations))
      .map((n) => document.querySelector(n.target[0])));
    const isControl = (n) => n.target[0] === '#axe-control';
    const violations = [];
    for (const v of r.violations) {
      for (const n of v.nodes) {
        if (isControl(n)) { continue; }
        violations.push({rule: v.id, impact: n.impact || v.impact || '', target: n.target.join(' '),
          summary: (n.failureSummary || v.help).replace(/\s+/g, ' ').slice(0, 300)});
      }
    }
    const reported = contrast(r.violations).some(isControl);
    control.remove();
    done({passed: r.passes.length, violations, reported,
      unjudged: watched.filter((e) => !judged.has(e)).map((e) => e.outerHTML.slice(0, 160))});
  }, (e) => done({failed: String(e)}));
"#;

/// What is wrong with the page shown, as axe-core judges it, one line each.
fn audit(browser: &Browser, axe: &str, page: &str) -> Vec<String> {
    browser.execute(axe, &[]);
    let found = browser.execute_async(AUDIT, &[]);
    assert!(found.get("failed").is_none(), "{page}: axe-core: {found}");
    let mut wrong = Vec::new();
    // The probe ran: rules passed, and the faint line was reported.
    if found["passed"].as_u64().unwrap_or(0) == 0 {
        wrong.push(format!("{page}: axe-core passed no rule: {found}"));
    }
    if found["reported"] != true {
        wrong.push(format!(
            "{page}: axe-core did not report the faint control line"
        ));
    }
    for v in found["violations"].as_array().unwrap() {
        if matches!(v["impact"].as_str(), Some("serious" | "critical")) {
            wrong.push(format!(
                "{page}: {} ({}) at {}: {}",
                v["rule"].as_str().unwrap_or("?"),
                v["impact"].as_str().unwrap_or("?"),
                v["target"].as_str().unwrap_or("?"),
                v["summary"].as_str().unwrap_or("?"),
            ));
        }
    }
    for e in found["unjudged"].as_array().unwrap() {
        wrong.push(format!(
            "{page}: the contrast of {} was not judged",
            e.as_str().unwrap_or("?")
        ));
    }
    wrong
}

/// The page's own text of its content type.
fn content_type(browser: &Browser) -> String {
    browser
        .execute("return document.contentType;", &[])
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn every_page_of_the_panel_passes_axe_core_in_a_browser() {
    let axe = std::fs::read_to_string(testkit::node_modules().join("axe-core/axe.min.js"))
        .expect("axe-core is installed (npm ci; package.json pins it)");
    let (d, runs) = filled();
    let panel = start_panel(&d);
    let browser = Browser::start(1280, 1000);
    let shots = super::screenshots().join("axe");
    let mut wrong = Vec::new();
    let mut look = |name: &str, wanted: &[&str]| {
        let text = browser.text();
        for w in wanted {
            assert!(text.contains(w), "{name}: {w} is not shown:\n{text}");
        }
        browser.screenshot(&shots.join(format!("{name}.png")));
        wrong.extend(audit(&browser, &axe, name));
    };

    // Logged out: the login page, then with a wrong token refused.
    browser.go(&format!("{}/", panel.url));
    look("login", &["The panel's token"]);
    browser.find("#token").type_text("not-the-panels-token");
    browser.find("form.login button").click();
    browser.wait_for("p.error");
    look("login-refused", &["That is not the panel's token."]);
    log_in(&browser, &panel);

    // The queue, with a notice, jobs in each state and the runs of each outcome.
    browser.go(&format!("{}/?cancelled=job-gone&result=unknown", panel.url));
    browser.wait_for("#reload button:not([hidden])");
    look(
        "queue",
        &[
            "No job has the id job-gone.",
            "Pause refresh",
            "job-queued",
            "job-waiting",
            "job-running",
            "job-cancelling",
            "job-lost",
            &runs.cancelled,
        ],
    );
    for state in [
        "queued",
        "waiting",
        "waiting-for-host",
        "running",
        "cancelling",
        "lost",
    ] {
        let pills = browser.find_all(&format!("#open .pill.{state}"));
        assert_eq!(pills.len(), 1, "the queue shows no {state} job");
    }
    for state in ["live", "draining", "gone"] {
        let pills = browser.find_all(&format!("#workers .pill.{state}"));
        assert_eq!(pills.len(), 1, "the queue shows no {state} worker");
    }
    for outcome in ["completed", "policy", "failed", "cancelled"] {
        assert!(
            browser
                .try_find(&format!("table.runs .pill.{outcome}"))
                .is_some(),
            "the queue's runs show no {outcome} run"
        );
    }

    browser.go(&format!("{}/runs", panel.url));
    look("runs", &[&runs.completed, &runs.policy, &runs.failed]);
    for (name, id, wanted) in [
        (
            "run-completed",
            &runs.completed,
            "All done: the README says hello.",
        ),
        ("run-policy", &runs.policy, "mcp-server-unknown"),
        ("run-failed", &runs.failed, "model-error"),
        ("run-cancelled", &runs.cancelled, "cancelled"),
    ] {
        browser.go(&format!("{}/runs/{id}", panel.url));
        look(name, &[wanted]);
    }
    browser.go(&format!("{}/runs/{}", panel.url, runs.completed));
    for state in ["ready", "failed", "waiting", "skipped"] {
        assert!(
            browser
                .try_find(&format!("#servers .pill.{state}"))
                .is_some(),
            "no server is shown {state}"
        );
    }
    browser.go(&format!("{}/runs/no-such-run", panel.url));
    look("no-record", &["No job has the id"]);
    // A running job's page: it has not ended (its worker here writes no live view).
    browser.go(&format!("{}/runs/job-running", panel.url));
    look(
        "run-live",
        &["This job has not ended", "job-running", "Transcript so far"],
    );
    for wanted in [
        "#servers .pill.ready",
        "#servers .pill.failed",
        "#live-tools",
        "svg.timeline",
    ] {
        assert!(
            browser.try_find(wanted).is_some(),
            "the live page shows no {wanted}"
        );
    }
    browser.go(&format!("{}/runs/{}", panel.url, runs.completed));
    assert!(browser.try_find("#pins").is_some(), "the run shows no pins");
    browser.go(&format!("{}/pins", panel.url));
    look(
        "pins",
        &[
            "Drift waiting for approval",
            "first-job",
            "1 changed, 1 new",
        ],
    );
    browser.go(&format!("{}/health", panel.url));
    look("health", &["Doctor's checks"]);
    for level in ["ok", "fail"] {
        assert!(
            browser
                .try_find(&format!("#checks .pill.{level}"))
                .is_some(),
            "the health page shows no {level} check"
        );
    }

    // The rest the panel serves is plain text, not a page for axe-core to judge.
    for path in [
        format!("/runs/{}/transcript", runs.completed),
        "/no-such-page".to_owned(),
    ] {
        browser.go(&format!("{}{path}", panel.url));
        assert_eq!(content_type(&browser), "text/plain", "{path}");
    }

    assert!(
        wrong.is_empty(),
        "axe-core found {} problems:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// `performance.timeOrigin` of the page shown: a new value for each load.
fn loaded_at(browser: &Browser) -> Option<f64> {
    browser
        .try_execute("return performance.timeOrigin;", &[])
        .ok()
        .and_then(|v| v.as_f64())
}

/// Waits until the page shown is another load than the one of `before`.
fn until_reloaded(browser: &Browser, before: f64, why: &str) -> f64 {
    let until = Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(now) = loaded_at(browser).filter(|t| *t != before) {
            return now;
        }
        assert!(
            Instant::now() < until,
            "the queue page never reloaded {why}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits until the reload bar's button is shown and says `wanted`.
fn until_button_says(browser: &Browser, wanted: &str) {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let said = browser
            .try_execute(
                "const b = document.querySelector('#reload button'); return b && !b.hidden ? b.textContent : null;",
                &[],
            )
            .ok();
        if said.as_ref().and_then(Value::as_str) == Some(wanted) {
            return;
        }
        assert!(
            Instant::now() < until,
            "the reload button never said {wanted} (it says {said:?})"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_queue_page_reloads_itself_until_the_reader_pauses_it() {
    let (d, _runs) = filled();
    let panel = start_panel(&d);
    let browser = Browser::start(1280, 800);
    log_in(&browser, &panel);
    browser.go(&format!("{}/", panel.url));
    until_button_says(&browser, "Pause refresh");
    let every = browser
        .find("#reload")
        .attribute("data-every")
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap();
    assert_eq!(
        browser.find("#reload .reload-state").text(),
        format!("Reloads every {every} s")
    );

    // It reloads by itself.
    let first = loaded_at(&browser).unwrap();
    until_reloaded(&browser, first, "by itself");
    // Paused from the keyboard, right after a reload (the next one is `every` seconds away).
    browser.find("#reload button").type_text(ENTER);
    until_button_says(&browser, "Resume refresh");
    assert_eq!(
        browser.find("#reload .reload-state").text(),
        "Refresh paused"
    );
    let paused = loaded_at(&browser).unwrap();
    // Two periods and a second, waited in the page: a reload still planned would come first
    // (timers fire in the order they are due) and end the wait with an error, or show as a new
    // load after it.
    let waited = browser.execute_async(
        "const done = arguments[arguments.length - 1]; \
         setTimeout(() => done(performance.timeOrigin), arguments[0]);",
        &[json!((2 * every + 1) * 1000)],
    );
    assert_eq!(waited.as_f64(), Some(paused), "the page reloaded, paused");
    assert_eq!(
        loaded_at(&browser),
        Some(paused),
        "the page reloaded, paused"
    );

    // The pause holds when the page is opened again in the tab, until it is resumed.
    browser.go(&format!("{}/", panel.url));
    until_button_says(&browser, "Resume refresh");
    let opened = loaded_at(&browser).unwrap();
    browser.find("#reload button").click();
    until_button_says(&browser, "Pause refresh");
    until_reloaded(&browser, opened, "once resumed");
    until_button_says(&browser, "Pause refresh");
}
