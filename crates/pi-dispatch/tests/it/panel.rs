//! The panel in a real browser: real jobs run by the worker (real pi in bubblewrap, a real MCP
//! server, the scripted model), then `pi-dispatch panel` and headless Chromium driven by
//! chromedriver. An operator logs in, sees the completed and the refused run, opens each, reads
//! the deployment's health and cancels a queued job. A screenshot of each page is saved under the
//! target folder (`target/tmp/panel-screenshots/`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;
use testkit::fake_model::Step;
use testkit::webdriver::Browser;

use crate::common::{Listening, processes_with};

mod a11y;
use crate::worker::{MODEL_KEY, Service, stdio};

const TOKEN: &str = "CNRY-panel-9d2f61b0c4e87a13";

/// A running `pi-dispatch panel`, on a loopback port of its own, with the worker's environment
/// (the provider's key) as its service has it: its health page is doctor's view of the worker.
fn start_panel(s: &Service) -> Listening {
    let mut cmd = panel_command(&s.d);
    cmd.env("FAKE_API_KEY", MODEL_KEY);
    Listening::start(cmd, "panel_listening")
}

/// `pi-dispatch panel` of deployment `d`, on a loopback port of its own.
fn panel_command(d: &crate::common::Deployment) -> std::process::Command {
    d.command(&["panel", "--listen", "127.0.0.1:0", "--log-format", "json"])
}

fn screenshots() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("panel-screenshots")
}

/// Waits until the page at `url` (reloaded every 200 ms) shows `wanted`.
fn until_shown(browser: &Browser, url: &str, wanted: &str) {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        browser.go(url);
        if browser.text().contains(wanted) {
            return;
        }
        assert!(
            Instant::now() < until,
            "{wanted} never showed at {url}:\n{}",
            browser.text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn an_operator_logs_in_reads_the_runs_and_cancels_a_queued_job_in_a_browser() {
    let s = Service::new(
        vec![
            Step::call("mcp__docs__echo", json!({"message": "from the panel test"})),
            Step::text("All done: the README says hello."),
        ],
        |_| json!({"docs": stdio(Some("direct")), "gone": stdio(None)}),
        &format!("PI_PANEL_TOKEN={TOKEN}\n"),
    );
    // One job completes; one is refused at pickup, for a server no longer offered.
    let completed = s.queue("Read the README and say what it says.", "docs");
    let refused = s.queue("Use a server that goes away.", "docs,gone");
    s.d.write(
        "pi-global/mcp.json",
        &json!({"mcpServers": {"docs": stdio(Some("direct"))}}).to_string(),
    );
    s.work();
    assert_eq!(s.record(&completed)["outcome"], "completed");
    assert_eq!(s.record(&refused)["reason"], "mcp-server-unknown");
    // A third waits in the queue: no worker runs now.
    let waiting = s.queue("Wait to be cancelled.", "docs");

    let panel = start_panel(&s);
    let browser = Browser::start(1280, 1100);
    let shots = screenshots();

    // Without logging in, every page is the login page.
    browser.go(&format!("{}/runs/{completed}", panel.url));
    assert!(browser.url().ends_with("/login"), "{}", browser.url());
    assert_eq!(browser.title(), "Log in · pi-dispatch");
    browser.screenshot(&shots.join("login.png"));
    // A wrong token is refused.
    browser.find("#token").type_text("not-the-panels-token");
    browser.find("form.login button").click();
    assert_eq!(
        browser.wait_for("p.error").text(),
        "That is not the panel's token."
    );
    // The right one opens the queue, where the waiting job shows with its task.
    browser.find("#token").type_text(TOKEN);
    browser.find("form.login button").click();
    let queue = browser.wait_for("#open").text();
    assert_eq!(browser.url(), format!("{}/", panel.url));
    assert!(
        queue.contains(&waiting)
            && queue.contains("Wait to be cancelled.")
            && queue.contains("queued"),
        "{queue}"
    );
    browser.screenshot(&shots.join("queue.png"));

    // The runs: the completed one and the refused one, with its reason.
    until_shown(&browser, &format!("{}/runs", panel.url), &refused);
    let runs = browser.find("table.runs").text();
    for wanted in [
        completed.as_str(),
        refused.as_str(),
        "completed",
        "mcp-server-unknown",
    ] {
        assert!(runs.contains(wanted), "{wanted} not in:\n{runs}");
    }
    assert!(
        browser.try_find("svg.outcomes").is_some(),
        "no outcomes chart"
    );
    browser.screenshot(&shots.join("runs.png"));

    // The completed run, opened from the list.
    browser
        .find(&format!("a[href='/runs/{completed}']"))
        .click();
    let servers = browser.wait_for("#servers").text();
    assert!(browser.url().ends_with(&format!("/runs/{completed}")));
    let page = browser.text();
    assert!(page.contains("All done: the README says hello."), "{page}");
    assert!(
        servers.contains("docs") && servers.contains("ready"),
        "{servers}"
    );
    let tools = browser.find("#tools").text();
    assert!(tools.contains("docs") && tools.contains("echo"), "{tools}");
    // The timeline is drawn, with pi's tool call on it.
    let timeline = browser.find("svg.timeline");
    let label = timeline.attribute("aria-label").unwrap_or_default();
    assert!(label.contains("timeline"), "{label}");
    let drawn = browser.find_all("svg.timeline rect").len();
    assert!(drawn >= 4, "{drawn} shapes in the timeline");
    assert!(page.contains("1 tool call"), "{page}");
    assert!(page.contains("Transcript"), "{page}");
    browser.screenshot(&shots.join("run.png"));

    // The refused run says why, and what to do.
    browser.go(&format!("{}/runs/{refused}", panel.url));
    let page = browser.text();
    assert!(page.contains("mcp-server-unknown"), "{page}");
    assert!(page.contains("gone"), "{page}");
    assert!(page.contains("offer gone"), "{page}");
    browser.screenshot(&shots.join("run-refused.png"));

    // The health page: doctor's checks, rendered.
    browser.go(&format!("{}/health", panel.url));
    // Doctor's checks, as the worker would pass them: the jobs above ran. The one failure is the
    // workers': none runs now.
    let checks = browser.find("#checks").text();
    assert!(checks.contains("overlay"), "{checks}");
    assert!(
        browser.find("p.muted").text().ends_with(" 1 failed."),
        "{checks}"
    );
    assert!(
        checks.contains("no worker is taking jobs (0 gone, 0 draining)"),
        "{checks}"
    );
    browser.screenshot(&shots.join("health.png"));

    // Cancel the waiting job from the queue page.
    browser.go(&format!("{}/", panel.url));
    browser.find("#open button.danger").click();
    let notice = browser.wait_for("p.notice").text();
    assert_eq!(
        notice,
        format!("Cancelled {waiting}: it had not started; nothing was spent.")
    );
    assert!(
        browser
            .try_find("#open")
            .is_none_or(|t| !t.text().contains(&waiting)),
        "the cancelled job is still listed"
    );
    browser.screenshot(&shots.join("cancelled.png"));
    // The queue no longer holds it, and its record says it was cancelled.
    let status = s.d.run(&["status"]);
    assert!(status.stdout.starts_with("0 queued,"), "{}", status.stdout);
    assert!(
        status
            .stdout
            .lines()
            .any(|l| l.contains(&waiting) && l.contains("cancelled")),
        "{}",
        status.stdout
    );
    assert_eq!(s.record(&waiting)["outcome"], "cancelled");

    // The token is in no page the browser was given, no address, no log line, no command line.
    for page in ["/", "/runs", &format!("/runs/{completed}"), "/health"] {
        browser.go(&format!("{}{page}", panel.url));
        let source = browser.source();
        assert!(!source.contains(TOKEN), "the token is in {page}");
        assert!(
            !source.contains(MODEL_KEY),
            "the provider's key is in {page}"
        );
        assert!(!browser.url().contains(TOKEN));
    }
    assert_eq!(processes_with(TOKEN, 0), vec![]);
    let log = panel.log();
    assert!(log.contains("panel_token_refused"), "{log}");
    assert!(!log.contains(TOKEN), "the token is in the panel's log");
    assert!(
        !log.contains(MODEL_KEY),
        "the provider's key is in the panel's log"
    );
    for name in [
        "login",
        "queue",
        "runs",
        "run",
        "run-refused",
        "health",
        "cancelled",
    ] {
        let png = std::fs::read(shots.join(format!("{name}.png"))).unwrap();
        assert!(png.len() > 1000, "{name}.png is empty");
    }
}

/// Waits until the page in the browser (which reloads itself) shows `wanted`, without going
/// anywhere: the live page's own refresh brings it.
fn until_page_shows(browser: &Browser, wanted: &str, within: Duration) {
    let until = Instant::now() + within;
    // Read in one script call: the page may reload between finding an element and reading it.
    let text = || {
        browser
            .try_execute("return document.body ? document.body.innerText : '';", &[])
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default()
    };
    loop {
        let shown = text();
        if shown.contains(wanted) {
            return;
        }
        assert!(Instant::now() < until, "{wanted} never showed:\n{shown}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_operator_watches_a_running_job_and_the_workers_in_a_browser() {
    const SECRET: &str = "cnry-panel-live-7c3e";
    let s = Service::new(
        vec![
            Step::call("mcp__vault__get_env", json!({})),
            Step::call("bash", json!({"command": "sleep 1; echo one"})),
            // Long enough to be watched however slowly the browser gets there.
            Step::call("bash", json!({"command": "sleep 15; echo two"})),
            Step::text("Watched to the end."),
        ],
        |_| {
            json!({"vault": {"command": "node", "args": [crate::worker::EVERYTHING, "stdio"],
                "env": {"DOCS_TOKEN": "${DOCS_TOKEN}"}, "description": "Sees a secret", "exposure": "direct"}})
        },
        &format!("PI_PANEL_TOKEN={TOKEN}\nPI_FORWARD_ENV=DOCS_TOKEN\n"),
    );
    s.seal();
    let mut run = s.d.command(&[
        "run",
        s.repo.to_str().unwrap(),
        "--task",
        "Read the secret, then wait.",
        "--mcp",
        "vault",
    ]);
    run.env("FAKE_API_KEY", MODEL_KEY).env("DOCS_TOKEN", SECRET);
    let run = crate::common::Run::from(run.output().unwrap());
    assert_eq!(run.code, 0, "{}", run.stderr);
    let id = crate::worker::queued_id(&run);
    let panel = start_panel(&s);
    let browser = Browser::start(1280, 1400);
    let shots = screenshots();
    browser.go(&format!("{}/login", panel.url));
    browser.find("#token").type_text(TOKEN);
    browser.find("form.login button").click();
    browser.wait_for("#open");
    // No worker yet: the queue page says so, and the job is only queued.
    assert!(
        browser.text().contains("No worker is taking jobs"),
        "{}",
        browser.text()
    );

    // A worker that runs until told to stop.
    let mut worker = s.d.command(&["worker", "--poll-ms", "100"]);
    worker
        .env("FAKE_API_KEY", MODEL_KEY)
        .env("DOCS_TOKEN", SECRET)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut worker = worker.spawn().unwrap();

    // The queue page lists it live, and the job running; the job's id opens its live page.
    until_shown(
        &browser,
        &format!("{}/", panel.url),
        &format!(":{}", worker.id()),
    );
    let until = Instant::now() + Duration::from_secs(60);
    while browser.try_find("#open .pill.running").is_none() {
        assert!(
            Instant::now() < until,
            "the job never ran:\n{}",
            browser.text()
        );
        std::thread::sleep(Duration::from_millis(200));
        browser.go(&format!("{}/", panel.url));
    }
    let workers = browser.find("#workers").text();
    assert!(
        workers.contains(&format!(":{}", worker.id())) && workers.contains("live"),
        "{workers}"
    );
    browser.screenshot(&shots.join("workers.png"));
    browser.find(&format!("#open a[href='/runs/{id}']")).click();
    browser.wait_for("h1#live");
    assert!(browser.url().ends_with(&format!("/runs/{id}")));
    // The page follows the job on its own: its server, then the second bash call.
    until_page_shows(&browser, "vault", Duration::from_secs(60));
    until_page_shows(&browser, "3 tool calls", Duration::from_secs(60));
    // Paused (the bar's button, in one script call), the page holds still to be read.
    browser.execute(
        "const b = document.querySelector('#reload button'); if (b && b.textContent.includes('Pause')) { b.click(); }",
        &[],
    );
    let page = browser.text();
    assert!(page.contains("running"), "{page}");
    let servers = browser.find("#servers").text();
    assert!(servers.contains("ready"), "{servers}");
    let tools = browser.find("#live-tools").text();
    assert!(tools.contains("bash") && tools.contains('2'), "{tools}");
    // The timeline so far, with pi's turns and calls on it.
    let drawn = browser.find_all("svg.timeline rect").len();
    assert!(drawn >= 4, "{drawn} shapes in the timeline");
    // The transcript so far: the secret the agent read is redacted, never shown.
    let transcript = browser.find("#live-transcript").text();
    assert!(
        transcript.contains("[redacted:DOCS_TOKEN]"),
        "the secret was never read: {transcript}"
    );
    let source = browser.source();
    assert!(!source.contains(SECRET) && !source.contains(MODEL_KEY));
    browser.screenshot(&shots.join("live.png"));

    // The health page: a worker is live.
    browser.go(&format!("{}/health", panel.url));
    let checks = browser.find("#checks").text();
    assert!(checks.contains("1 workers live"), "{checks}");

    // Once the job has ended, its page is its record. The live page shows pi's last answer too,
    // as soon as pi gives it: the record's page is the one without the live heading.
    let until = Instant::now() + Duration::from_secs(90);
    loop {
        browser.go(&format!("{}/runs/{id}", panel.url));
        if browser.try_find("h1#live").is_none() && browser.text().contains("Watched to the end.") {
            break;
        }
        assert!(
            Instant::now() < until,
            "the record never replaced the live page"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(browser.try_find("h1#live").is_none());
    assert!(!browser.source().contains(SECRET));
    assert_eq!(s.record(&id)["outcome"], "completed");

    // Stopped, the worker leaves the list, and the health page fails again.
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &worker.id().to_string()])
        .status();
    assert!(worker.wait().unwrap().success());
    browser.go(&format!("{}/health", panel.url));
    let checks = browser.find("#checks").text();
    assert!(checks.contains("no worker is taking jobs"), "{checks}");
    for name in ["workers", "live"] {
        let png = std::fs::read(shots.join(format!("{name}.png"))).unwrap();
        assert!(png.len() > 1000, "{name}.png is empty");
    }
}
