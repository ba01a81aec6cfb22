#![allow(clippy::unwrap_used, clippy::expect_used)]

//! The panel over real HTTP on loopback, with a real SQLite queue and records in files: nothing
//! but the login page without the token, a wrong token refused, wrong tokens at the form and as a
//! bearer throttled together per client (another client's right token still opens), a login
//! posted from another site refused, the cookie `Secure` behind a named TLS proxy, the token
//! nowhere in what is served, hostile names and text shown as text, the cancel's CSRF check, and
//! `/metrics` read by a Prometheus text-format parser with counts that match the records.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use protocol::exit_line::ServerState;
use protocol::job::Job;
use protocol::reason::Reason;
use protocol::usage::ToolCallCount;
use queue::Queue as _;
use records::record::{EgressDenial, Outcome, Record, Tokens};
use records::store::Records;
use reqwest::StatusCode;
use serde_json::json;

const TOKEN: &str = "CNRY-panel-token-5b1e7c0d9a";

struct Served {
    addr: SocketAddr,
    dir: tempfile::TempDir,
    queue: Arc<queue::SqliteQueue>,
    records: Arc<Records>,
    http: reqwest::Client,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_again_needs_the_sessions_csrf_token_and_says_why_not() {
    let s = serve().await;
    s.records
        .write(&record(
            "run-good",
            Outcome::Completed,
            None,
            1_796_317_925_000,
        ))
        .unwrap();
    let cookie = s.login().await;
    let page = s.page_with("/runs/run-good", &cookie, "Run again").await;
    assert!(page.contains(r#"action="/runs/run-good/rerun""#), "{page}");
    let csrf = csrf_of(&page);
    for given in ["", "0123"] {
        let (status, headers, _) = s
            .post("/runs/run-good/rerun", Some(&cookie), &[("csrf", given)])
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{given:?}");
        assert!(!headers.contains_key("location"));
    }
    // Without a session, the login page.
    let (status, headers, _) = s
        .post("/runs/run-good/rerun", None, &[("csrf", &csrf)])
        .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(headers["location"], "/login");
    // The session's own: queued, and the new job's page opens.
    let (status, headers, _) = s
        .post("/runs/run-good/rerun", Some(&cookie), &[("csrf", &csrf)])
        .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(headers["location"], "/runs/rerun-of-good");
    // Refused: why, as text.
    let (status, _, page) = s
        .post("/runs/run-bad/rerun", Some(&cookie), &[("csrf", &csrf)])
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(page.contains("&lt;b&gt;run-bad&lt;/b&gt; stays"), "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_jobs_page_shows_what_it_wrote_as_text() {
    let s = serve().await;
    queued_job(
        &s,
        "job-live",
        "<script>alert('task')</script>",
        "/srv/repo",
    );
    let lease = s
        .queue
        .lease("host:1", Duration::from_secs(600), SystemTime::now())
        .unwrap()
        .unwrap();
    assert_eq!(lease.job_id, "job-live");
    // What a hijacked job's events put in its live view: markup in a tool's name, a server's
    // name and its transcript.
    let mut so_far = record("job-live", Outcome::Failed, None, 1_700_000_000_000);
    so_far.sandbox_up_at_ms = Some(1_700_000_000_000);
    let snapshot = records::live::Snapshot {
        record: so_far,
        worker: "host:1".into(),
        servers: vec![ServerState {
            name: "<img src=x onerror=alert(1)>".into(),
            state: "ready".into(),
            ready_ms: Some(5),
            listing: None,
        }],
        activity: vec![records::record::Activity {
            at_ms: 1_700_000_000_000,
            kind: "tool".into(),
            tool: Some("<script>alert('tool')</script>".into()),
        }],
        turns: 0,
        tool_calls: 1,
        updated_at_ms: 1_700_000_000_000,
        lines: 1,
        cut: false,
    };
    let line = json!({"type": "message_end", "message": {"role": "assistant",
        "content": [{"type": "text", "text": "</pre><script>alert('said')</script>"}]}});
    s.queue
        .live_put(
            "job-live",
            &serde_json::to_string(&snapshot).unwrap(),
            &[line.to_string()],
            SystemTime::now(),
        )
        .unwrap();
    let cookie = s.login().await;
    let (status, _, page) = s.get("/runs/job-live", Some(&cookie)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("This job has not ended"), "{page}");
    assert!(!page.contains("<script>alert"), "{page}");
    assert!(!page.contains("<img src=x"), "{page}");
    for shown in [
        "&lt;script&gt;alert('tool')",
        "&lt;img src=x onerror=alert(1)&gt;",
    ] {
        assert!(page.contains(shown), "{shown} not in {page}");
    }
    // The page reloads itself through the panel's script only.
    assert!(page.contains(r#"data-every="2""#), "{page}");
}

impl Served {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn get(
        &self,
        path: &str,
        cookie: Option<&str>,
    ) -> (StatusCode, HashMap<String, String>, String) {
        let mut req = self.http.get(self.url(path));
        if let Some(c) = cookie {
            req = req.header("cookie", c);
        }
        let resp = req.send().await.unwrap();
        answer(resp).await
    }

    async fn post(
        &self,
        path: &str,
        cookie: Option<&str>,
        form: &[(&str, &str)],
    ) -> (StatusCode, HashMap<String, String>, String) {
        let mut req = self.http.post(self.url(path)).form(form);
        if let Some(c) = cookie {
            req = req.header("cookie", c);
        }
        answer(req.send().await.unwrap()).await
    }

    /// Logs in; the session's cookie.
    async fn login(&self) -> String {
        let (status, headers, _) = self.post("/login", None, &[("token", TOKEN)]).await;
        assert_eq!(status, StatusCode::SEE_OTHER);
        let cookie = &headers["set-cookie"];
        assert!(
            cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
            "{cookie}"
        );
        cookie.split(';').next().unwrap().to_owned()
    }

    /// The page at `path` once `wanted` is in it (the records are read every little while).
    async fn page_with(&self, path: &str, cookie: &str, wanted: &str) -> String {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let (status, _, body) = self.get(path, Some(cookie)).await;
            if status == StatusCode::OK && body.contains(wanted) {
                return body;
            }
            assert!(
                Instant::now() < until,
                "{wanted} never came in {path}: {body}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn answer(resp: reqwest::Response) -> (StatusCode, HashMap<String, String>, String) {
    let status = resp.status();
    let headers = resp
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    (status, headers, resp.text().await.unwrap())
}

/// How long a worker may go unseen here before it is gone.
const GONE_AFTER: Duration = Duration::from_secs(30);

fn card(id: &str, labels: &[&str], running: u32) -> queue::WorkerCard {
    queue::WorkerCard {
        id: id.to_owned(),
        host: id.split(':').next().unwrap().to_owned(),
        pid: 4242,
        version: "9.9.9".to_owned(),
        labels: labels.iter().map(|l| (*l).to_owned()).collect(),
        concurrency: 2,
        started_ms: 1_796_317_925_000,
        running,
        draining: false,
    }
}

async fn serve() -> Served {
    serve_behind(Vec::new()).await
}

/// The panel, believing `trusted_proxies` about the client and TLS.
async fn serve_behind(trusted_proxies: Vec<std::net::IpAddr>) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let queue = Arc::new(queue::SqliteQueue::open(&dir.path().join("queue.sqlite")).unwrap());
    let records = Arc::new(Records::sqlite(&dir.path().join("queue.sqlite")).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let config = panel::Config {
        token: TOKEN.to_owned(),
        queue: queue.clone(),
        records: records.clone(),
        jobs_dir: dir.path().join("jobs"),
        health: Arc::new(|| {
            vec![panel::Health {
                level: "warn".into(),
                label: "<b>a check</b>".into(),
                fix: Some("do <i>this</i>".into()),
            }]
        }),
        state_dir: dir.path().to_owned(),
        worker_gone_after: GONE_AFTER,
        rerun: Arc::new(|id: &str| match id {
            "run-good" => Ok("rerun-of-good".to_owned()),
            _ => Err(format!("the job would be refused: <b>{id}</b> stays")),
        }),
        trusted_proxies,
    };
    tokio::spawn(panel::serve(listener, config, std::future::pending()));
    Served {
        addr,
        dir,
        queue,
        records,
        http: reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap(),
    }
}

fn queued_job(s: &Served, id: &str, task: &str, folder: &str) {
    let mut job = Job::new(id, "cli", "local");
    job.task = Some(task.to_owned());
    job.folder = Some(folder.to_owned());
    let payload = serde_json::to_string(&job).unwrap();
    assert!(s.queue.enqueue(id, &payload, SystemTime::now()).unwrap());
}

fn record(id: &str, outcome: Outcome, reason: Option<Reason>, at: u64) -> Record {
    let mut r = Record::new(&Job::new(id, "cli", "local"), outcome, reason, 1, at);
    r.queued_at_ms = Some(at - 3_000);
    r.started_at_ms = Some(at - 2_000);
    r
}

const ROUTES: [&str; 8] = [
    "/",
    "/runs",
    "/runs/run-1",
    "/runs/run-1/transcript",
    "/health",
    "/pins",
    "/no-such-page",
    "/runs?outcome=completed",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_token_only_the_login_page_is_served_and_a_wrong_token_is_refused() {
    let s = serve().await;
    let mut r = record("run-1", Outcome::Completed, None, 1_700_000_000_000);
    r.final_message = Some("CNRY-answer-text".into());
    s.records.write(&r).unwrap();
    queued_job(&s, "job-q", "CNRY-queued-task", "/srv/repo");
    for path in ROUTES {
        let (status, headers, body) = s.get(path, None).await;
        assert_eq!(status, StatusCode::SEE_OTHER, "{path}");
        assert_eq!(headers["location"], "/login", "{path}");
        assert!(!body.contains("CNRY"), "{path}: {body}");
    }
    // A made-up session is none.
    let (status, _, _) = s.get("/", Some("pi_panel=0000")).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    // The one action, without a session: nothing happens.
    let (status, _, _) = s.post("/jobs/job-q/cancel", None, &[("csrf", "x")]).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(
        s.queue.status(SystemTime::now(), 0).unwrap().counts.queued,
        1
    );
    // Metrics without the token, or with a wrong one.
    let (status, _, body) = s.get("/metrics", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(!body.contains("pi_dispatch_jobs_total"));
    let resp = s
        .http
        .get(s.url("/metrics"))
        .bearer_auth("CNRY-panel-token-wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    // The login page is served, and it holds no data.
    let (status, _, body) = s.get("/login", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        body.contains("name=\"token\"") && !body.contains("CNRY"),
        "{body}"
    );
    // A wrong token: refused, no session.
    for wrong in [
        "CNRY-panel-token-5b1e7c0d9b",
        "",
        "CNRY-panel-token-5b1e7c0d9a ",
    ] {
        let (status, headers, body) = s.post("/login", None, &[("token", wrong)]).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{wrong:?}");
        assert!(!headers.contains_key("set-cookie"));
        assert!(body.contains("not the panel"), "{body}");
    }
    // The token itself opens it, by POST: it is never in a URL.
    let cookie = s.login().await;
    let (status, _, body) = s.get("/", Some(&cookie)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("CNRY-queued-task"), "{body}");
    // Logging out ends the session (with the session's CSRF token only).
    let csrf = csrf_of(&body);
    let (status, _, _) = s.post("/logout", Some(&cookie), &[("csrf", "wrong")]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, headers, _) = s.post("/logout", Some(&cookie), &[("csrf", &csrf)]).await;
    assert_eq!(
        (status, headers["location"].as_str()),
        (StatusCode::SEE_OTHER, "/login")
    );
    let (status, _, _) = s.get("/", Some(&cookie)).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_shows_a_running_job_with_its_host_and_a_waiting_one_with_its_task() {
    let s = serve().await;
    queued_job(&s, "job-run", "fix the parser", "/srv/parser");
    queued_job(&s, "job-wait", "update the docs", "/srv/docs");
    let lease = s
        .queue
        .lease(
            "build-host-2:4242",
            Duration::from_secs(600),
            SystemTime::now(),
        )
        .unwrap()
        .unwrap();
    assert_eq!(lease.job_id, "job-run");
    let cookie = s.login().await;
    let page = s.page_with("/", &cookie, "job-wait").await;
    let open = page.split(r#"<table id="open">"#).nth(1).unwrap();
    let open = open.split("</table>").next().unwrap();
    let rows: Vec<&str> = open.split("<tr>").skip(2).collect();
    assert_eq!(rows.len(), 2, "{page}");
    let running = rows.iter().find(|r| r.contains("job-run")).unwrap();
    for shown in [
        "running",
        "fix the parser",
        "/srv/parser",
        "build-host-2:4242",
        "running 0 ms",
    ] {
        assert!(running.contains(shown), "{shown} not in {running}");
    }
    let waiting = rows.iter().find(|r| r.contains("job-wait")).unwrap();
    for shown in ["queued", "update the docs", "/srv/docs", "waiting "] {
        assert!(waiting.contains(shown), "{shown} not in {waiting}");
    }
    // The page asks the panel's script to reload it every 5 s.
    assert!(
        page.contains(r#"<p class="reload" id="reload" data-every="5">"#),
        "{page}"
    );
}

/// The health page's first row (the workers'): its level and its words.
fn workers_row(health: &str) -> (String, String) {
    let rows = health.split(r#"<table id="checks">"#).nth(1).unwrap();
    let row = rows.split("<tr>").nth(2).unwrap();
    let level = row.split(r#"class="pill "#).nth(1).unwrap();
    let level = level.split('"').next().unwrap().to_owned();
    (level, row.split("</td>").nth(1).unwrap().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workers_are_listed_and_the_health_page_fails_when_none_is_live() {
    let s = serve().await;
    let cookie = s.login().await;
    // No worker ever seen: the health page fails, and the queue page says so.
    let (_, _, health) = s.get("/health", Some(&cookie)).await;
    let (level, words) = workers_row(&health);
    assert_eq!(level, "fail", "{words}");
    assert!(words.contains("no worker is taking jobs"), "{words}");
    let (_, _, page) = s.get("/", Some(&cookie)).await;
    assert!(page.contains("No worker is taking jobs"), "{page}");
    // Two workers: one live, with labels; one unseen for longer than the bound.
    let now = SystemTime::now();
    s.queue
        .announce(&card("build-1:4242", &["host:build-1", "gpu"], 1), now)
        .unwrap();
    s.queue
        .announce(
            &card("build-2:77", &["host:build-2"], 0),
            now - GONE_AFTER - Duration::from_secs(5),
        )
        .unwrap();
    // A job that needs a label no live worker carries waits for a host.
    let needs_tpu = queue::NewJob {
        placement: queue::Placement {
            needs: vec!["tpu".to_owned()],
            ..queue::Placement::default()
        },
        ..queue::NewJob::plain("job-tpu", "{}")
    };
    s.queue.enqueue_job(&needs_tpu, now).unwrap();
    let (_, _, page) = s.get("/", Some(&cookie)).await;
    let workers = page.split(r#"<table id="workers">"#).nth(1).unwrap();
    let workers = workers.split("</table>").next().unwrap();
    let rows: Vec<&str> = workers.split("<tr>").skip(2).collect();
    assert_eq!(rows.len(), 2, "{workers}");
    for (row, shown) in [
        (
            rows[0],
            &[
                "build-1:4242",
                "live",
                "1 / 2",
                "host:build-1, gpu",
                "9.9.9",
            ][..],
        ),
        (
            rows[1],
            &["build-2:77", "gone", "0 / 2", "host:build-2"][..],
        ),
    ] {
        for s in shown {
            assert!(row.contains(s), "{s} not in {row}");
        }
    }
    let open = page.split(r#"<table id="open">"#).nth(1).unwrap();
    assert!(open.contains("waiting-for-host"), "{open}");
    let (_, _, health) = s.get("/health", Some(&cookie)).await;
    let (level, words) = workers_row(&health);
    assert_eq!(level, "warn", "{words}");
    assert!(words.contains("1 workers live, 1 gone"), "{words}");
    // The metrics say the same.
    let scrape = s.scrape().await;
    assert_eq!(
        sample_sum(&scrape, "pi_dispatch_workers", &[("state", "live")]),
        1.0
    );
    assert_eq!(
        sample_sum(&scrape, "pi_dispatch_workers", &[("state", "gone")]),
        1.0
    );
    assert_eq!(
        sample_sum(
            &scrape,
            "pi_dispatch_worker_jobs_running",
            &[("worker", "build-1:4242")]
        ),
        1.0
    );
    assert!(
        sample_sum(
            &scrape,
            "pi_dispatch_worker_seen_seconds",
            &[("worker", "build-2:77")]
        ) >= 35.0
    );
    assert_eq!(
        sample_sum(&scrape, "pi_dispatch_jobs_waiting_for_host", &[]),
        1.0
    );
    // The live one leaves: none is live, and the health page fails again.
    s.queue.leave("build-1:4242").unwrap();
    let (_, _, health) = s.get("/health", Some(&cookie)).await;
    assert_eq!(workers_row(&health).0, "fail");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_wrong_tokens_in_a_minute_close_the_login_to_their_client() {
    let s = serve().await;
    for n in 0..20 {
        let (status, _, _) = s
            .post("/login", None, &[("token", &format!("guess-{n}"))])
            .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "guess {n}");
    }
    // Now even the right token is not looked at from that client, and no session opens.
    let (status, headers, body) = s.post("/login", None, &[("token", TOKEN)]).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(!headers.contains_key("set-cookie"));
    assert!(body.contains("Too many wrong tokens"), "{body}");
}

fn csrf_of(page: &str) -> String {
    let at = page.find("name=\"csrf\" value=\"").unwrap() + "name=\"csrf\" value=\"".len();
    page[at..].split('"').next().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_answer_and_header_is_free_of_the_token() {
    let s = serve().await;
    s.records
        .write(&record(
            "run-1",
            Outcome::Completed,
            None,
            1_700_000_000_000,
        ))
        .unwrap();
    let cookie = s.login().await;
    let mut seen = String::new();
    for path in ROUTES.iter().chain(&["/metrics", "/login", "/panel.css"]) {
        let (_, headers, body) = s.get(path, Some(&cookie)).await;
        seen.push_str(&format!("{headers:?}\n{body}\n"));
    }
    let (_, headers, body) = s.post("/login", None, &[("token", TOKEN)]).await;
    seen.push_str(&format!("{headers:?}\n{body}\n"));
    assert!(seen.contains("run-1"));
    assert!(!seen.contains(TOKEN), "the token was served");
    // Every answer forbids script and framing.
    let (_, headers, _) = s.get("/runs", Some(&cookie)).await;
    assert!(headers["content-security-policy"].contains("default-src 'none'"));
    assert_eq!(headers["x-frame-options"], "DENY");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_tasks_names_and_transcripts_are_shown_as_text() {
    let s = serve().await;
    queued_job(
        &s,
        "job-q",
        "<script>alert('task')</script>",
        "/srv/<img src=x onerror=alert(1)>",
    );
    let mut r = record(
        "run-h",
        Outcome::Policy,
        Some(Reason::McpUnavailable),
        1_700_000_000_000,
    );
    r.mcp.servers.push(ServerState {
        name: "<script>alert(\"server\")</script>".into(),
        state: "failed".into(),
        ready_ms: None,
        listing: None,
    });
    r.mcp.tool_calls.push(ToolCallCount {
        server: "docs".into(),
        tool: "<b>tool</b>".into(),
        calls: 1,
        ok: 1,
        error: 0,
        refused: 0,
        total_ms: 5,
        result_bytes: 10,
    });
    r.detail = Some(protocol::detail::Detail::new("<iframe src=//x></iframe>").server("docs"));
    r.final_message = Some("</pre><script>alert('answer')</script>".into());
    r.task = Some("<script>alert('record task')</script>".into());
    r.item = Some("o/r#<i>7</i>".into());
    r.url = Some("javascript:alert('url')".into());
    r.transcript = true;
    s.records.write(&r).unwrap();
    let transcript_dir = s.dir.path().join("jobs").join("run-h");
    std::fs::create_dir_all(&transcript_dir).unwrap();
    std::fs::write(
        transcript_dir.join("transcript.jsonl"),
        concat!(
            r#"{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":"<script>alert('transcript')</script>"}]}}"#,
            "\n<script>alert('line')</script>\n"
        ),
    )
    .unwrap();
    let cookie = s.login().await;
    let queue_page = s.page_with("/", &cookie, "job-q").await;
    let run_page = s.page_with("/runs/run-h", &cookie, "run-h").await;
    let runs_page = s.page_with("/runs", &cookie, "run-h").await;
    let (_, _, health) = s.get("/health", Some(&cookie)).await;
    for (page, shown) in [
        (&queue_page, "&lt;script&gt;alert('task')&lt;/script&gt;"),
        (&queue_page, "/srv/&lt;img src=x onerror=alert(1)&gt;"),
        (
            &run_page,
            "&lt;script&gt;alert(&quot;server&quot;)&lt;/script&gt;",
        ),
        (
            &runs_page,
            "&lt;script&gt;alert(&quot;server&quot;)&lt;/script&gt;",
        ),
        (&run_page, "&lt;b&gt;tool&lt;/b&gt;"),
        (&run_page, "&lt;iframe src=//x&gt;&lt;/iframe&gt;"),
        (
            &run_page,
            "&lt;/pre&gt;&lt;script&gt;alert('answer')&lt;/script&gt;",
        ),
        (
            &run_page,
            "&lt;script&gt;alert('transcript')&lt;/script&gt;",
        ),
        (&run_page, "&lt;script&gt;alert('line')&lt;/script&gt;"),
        (
            &run_page,
            "&lt;script&gt;alert('record task')&lt;/script&gt;",
        ),
        (
            &runs_page,
            "&lt;script&gt;alert('record task')&lt;/script&gt;",
        ),
        (&run_page, "o/r#&lt;i&gt;7&lt;/i&gt;"),
        (&health, "&lt;b&gt;a check&lt;/b&gt;"),
    ] {
        assert!(
            page.contains(shown),
            "{shown} is not shown as text in:\n{page}"
        );
    }
    for page in [&queue_page, &run_page, &runs_page, &health] {
        // The queue page's one script is the panel's own file.
        let lower = page.replace(PANEL_SCRIPT, "").to_lowercase();
        for markup in ["<script", "<img", "<iframe", "<b>", "<i>", "javascript:"] {
            assert!(!lower.contains(markup), "{markup} in:\n{page}");
        }
    }
    // The transcript as stored is plain text, never a page.
    let (status, headers, body) = s.get("/runs/run-h/transcript", Some(&cookie)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers["content-type"].starts_with("text/plain"));
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert!(body.contains("alert('line')"));
}

/// How a page that reloads itself loads the panel's script.
const PANEL_SCRIPT: &str = r#"<script src="/panel.js" defer></script>"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_page_reloads_only_through_the_panels_own_script() {
    let s = serve().await;
    let cookie = s.login().await;
    let (status, headers, queue_page) = s.get("/", Some(&cookie)).await;
    assert_eq!(status, StatusCode::OK);
    // No reload the reader cannot stop: no meta refresh, and without script a link instead.
    assert!(
        !queue_page.to_lowercase().contains("http-equiv"),
        "{queue_page}"
    );
    assert!(
        queue_page.contains(r#"<a href="">Refresh</a>"#),
        "{queue_page}"
    );
    assert!(queue_page.contains(r#"data-every="5""#), "{queue_page}");
    assert_eq!(queue_page.matches("<script").count(), 1, "{queue_page}");
    assert!(queue_page.contains(PANEL_SCRIPT), "{queue_page}");
    // Script from the panel only, none inline, none evaluated.
    let csp = &headers["content-security-policy"];
    assert!(csp.contains("script-src 'self'"), "{csp}");
    assert!(!csp.contains("unsafe"), "{csp}");
    // Pages that do not reload have no script.
    for path in ["/runs", "/health"] {
        let (_, _, page) = s.get(path, Some(&cookie)).await;
        assert!(!page.contains("<script"), "{path}: {page}");
        assert!(!page.contains("id=\"reload\""), "{path}: {page}");
    }
    let (status, headers, script) = s.get("/panel.js", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers["content-type"].starts_with("text/javascript"));
    assert!(script.contains("sessionStorage") && script.contains("location.reload()"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_needs_the_sessions_csrf_token_and_records_the_cancelled_job() {
    let s = serve().await;
    queued_job(&s, "job-c", "cancel me", "/srv/repo");
    let cookie = s.login().await;
    let other = s.login().await;
    let page = s.page_with("/", &cookie, "job-c").await;
    let csrf = csrf_of(&page);
    let other_csrf = csrf_of(&s.page_with("/", &other, "job-c").await);
    assert_ne!(csrf, other_csrf);
    // No CSRF token, a wrong one, another session's: refused, and the job stays.
    for given in ["", "0123", other_csrf.as_str()] {
        let (status, _, _) = s
            .post("/jobs/job-c/cancel", Some(&cookie), &[("csrf", given)])
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{given:?}");
    }
    assert_eq!(
        s.queue.status(SystemTime::now(), 0).unwrap().counts.queued,
        1
    );
    assert!(s.records.read("job-c").is_err());
    // The session's own: cancelled, recorded, and said so.
    let (status, headers, _) = s
        .post("/jobs/job-c/cancel", Some(&cookie), &[("csrf", &csrf)])
        .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(headers["location"], "/?cancelled=job-c&result=removed");
    let (_, _, page) = s.get(&headers["location"], Some(&cookie)).await;
    assert!(
        page.contains("Cancelled job-c: it had not started"),
        "{page}"
    );
    assert_eq!(
        s.queue.status(SystemTime::now(), 0).unwrap().counts.queued,
        0
    );
    let r = s.records.read("job-c").unwrap();
    assert_eq!(
        (r.outcome, r.reason),
        (Outcome::Cancelled, Some(Reason::Cancelled))
    );
    s.page_with("/runs/job-c", &cookie, "cancelled").await;
    // Cancelling it again changes nothing.
    let (_, headers, _) = s
        .post("/jobs/job-c/cancel", Some(&cookie), &[("csrf", &csrf)])
        .await;
    assert_eq!(headers["location"], "/?cancelled=job-c&result=done");
}

/// Records of every kind, with what each metric should count.
fn mixed_records(s: &Served) {
    let at = 1_700_000_000_000;
    for i in 0..3 {
        let mut r = record(&format!("ok-{i}"), Outcome::Completed, None, at + i);
        r.provider = Some("openai".into());
        r.model = Some("gpt-x".into());
        r.tokens = Some(Tokens {
            input: 100,
            output: 10,
            total: 110,
        });
        r.cost_usd = Some(0.25);
        r.mcp.servers.push(ServerState {
            name: "docs".into(),
            state: "ready".into(),
            ready_ms: Some(300 + i),
            listing: None,
        });
        r.mcp.tool_calls.push(ToolCallCount {
            server: "docs".into(),
            tool: "search".into(),
            calls: 4,
            ok: 2,
            error: 1,
            refused: 1,
            total_ms: 1500,
            result_bytes: 2048,
        });
        s.records.write(&r).unwrap();
    }
    for i in 0..2 {
        let mut r = record(
            &format!("refused-{i}"),
            Outcome::Policy,
            Some(Reason::McpUnavailable),
            at + 10 + i,
        );
        // A name with every character the format escapes.
        r.mcp.servers.push(ServerState {
            name: "odd\"name\\with\nbreak".into(),
            state: "failed".into(),
            ready_ms: None,
            listing: None,
        });
        s.records.write(&r).unwrap();
    }
    let mut failed = record(
        "failed-0",
        Outcome::Failed,
        Some(Reason::AgentFailed),
        at + 20,
    );
    failed.egress_denied.push(EgressDenial {
        host: "example.invalid".into(),
        port: 443,
        reason: "not-allowed".into(),
        count: 3,
    });
    s.records.write(&failed).unwrap();
}

impl Served {
    /// `/metrics` with the token, parsed as Prometheus parses it.
    async fn scrape(&self) -> prometheus_parse::Scrape {
        let text = self
            .http
            .get(self.url("/metrics"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap()
    }
}

fn sample_sum(scrape: &prometheus_parse::Scrape, metric: &str, filter: &[(&str, &str)]) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric)
        .filter(|s| filter.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match &s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => *v,
            other => panic!("{metric} is {other:?}"),
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_as_prometheus_text_and_count_what_the_records_hold() {
    let s = serve().await;
    mixed_records(&s);
    queued_job(&s, "waiting-1", "t", "/srv/a");
    queued_job(&s, "waiting-2", "t", "/srv/b");
    // The metrics are the store's: the records written are counted at once.
    let scrape = s.scrape().await;
    assert_eq!(sample_sum(&scrape, "pi_dispatch_records", &[]), 6.0);
    // What the records hold, counted here from the records themselves.
    let listing = s.records.list().unwrap();
    let count = |o: Outcome, reason: &str| {
        listing
            .records
            .iter()
            .filter(|r| r.outcome == o && r.reason.map_or("none", |r| r.as_str()) == reason)
            .count() as f64
    };
    assert_eq!(listing.records.len(), 6);
    for (outcome, reason) in [
        (Outcome::Completed, "none"),
        (Outcome::Policy, "mcp-unavailable"),
        (Outcome::Failed, "agent-failed"),
    ] {
        assert_eq!(
            sample_sum(
                &scrape,
                "pi_dispatch_jobs_total",
                &[("outcome", outcome.as_str()), ("reason", reason)]
            ),
            count(outcome, reason),
            "{outcome:?} {reason}"
        );
    }
    assert_eq!(sample_sum(&scrape, "pi_dispatch_jobs_total", &[]), 6.0);
    let calls = |field: fn(&ToolCallCount) -> u64| -> f64 {
        listing
            .records
            .iter()
            .flat_map(|r| &r.mcp.tool_calls)
            .map(|c| field(c) as f64)
            .sum()
    };
    assert_eq!(
        sample_sum(
            &scrape,
            "pi_dispatch_tool_calls_total",
            &[("server", "docs"), ("tool", "search")]
        ),
        calls(|c| c.calls)
    );
    assert_eq!(
        sample_sum(
            &scrape,
            "pi_dispatch_tool_calls_total",
            &[("result", "refused")]
        ),
        calls(|c| c.refused)
    );
    assert_eq!(
        sample_sum(&scrape, "pi_dispatch_tool_result_bytes_total", &[]),
        calls(|c| c.result_bytes)
    );
    assert_eq!(
        sample_sum(
            &scrape,
            "pi_dispatch_model_tokens_total",
            &[("direction", "input")]
        ),
        300.0
    );
    assert!((sample_sum(&scrape, "pi_dispatch_model_cost_usd_total", &[]) - 0.75).abs() < 1e-9);
    assert_eq!(
        sample_sum(
            &scrape,
            "pi_dispatch_egress_denials_total",
            &[("reason", "not-allowed")]
        ),
        3.0
    );
    // By reason only: no series names a host a job chose.
    assert!(
        !scrape
            .samples
            .iter()
            .any(|s| s.metric == "pi_dispatch_egress_denials_total"
                && (s.labels.get("host").is_some() || s.labels.get("port").is_some())),
        "a denial's series names a host"
    );
    // The odd name came through escaped as the format says (this parser keeps a label value's
    // escapes as written).
    assert_eq!(
        sample_sum(
            &scrape,
            "pi_dispatch_mcp_server_connections_total",
            &[("server", r#"odd\"name\\with\nbreak"#), ("state", "failed")]
        ),
        2.0
    );
    assert_eq!(sample_sum(&scrape, "pi_dispatch_queue_depth", &[]), 2.0);
    assert_eq!(sample_sum(&scrape, "pi_dispatch_jobs_running", &[]), 0.0);
    // Histograms: every job that started, and each ready time.
    let histogram = |metric: &str| {
        scrape
            .samples
            .iter()
            .filter(|s| s.metric == metric)
            .map(|s| match &s.value {
                prometheus_parse::Value::Histogram(buckets) => {
                    buckets.iter().map(|b| b.count).fold(0.0, f64::max)
                }
                other => panic!("{metric} is {other:?}"),
            })
            .sum::<f64>()
    };
    assert_eq!(histogram("pi_dispatch_job_duration_seconds"), 6.0);
    assert_eq!(histogram("pi_dispatch_mcp_server_ready_seconds"), 3.0);
    // The disk: the state folder's bytes and the room left on its file system.
    assert!(sample_sum(&scrape, "pi_dispatch_state_bytes", &[]) > 0.0);
    assert!(sample_sum(&scrape, "pi_dispatch_state_free_bytes", &[]) > 0.0);
    // Every record pruned: the counters stay as they were (Prometheus sees no reset), and only
    // the gauge of records kept falls.
    assert_eq!(s.records.prune(u64::MAX, 100).unwrap().len(), 6);
    let after = s.scrape().await;
    assert_eq!(sample_sum(&after, "pi_dispatch_records", &[]), 0.0);
    for metric in [
        "pi_dispatch_jobs_total",
        "pi_dispatch_tool_calls_total",
        "pi_dispatch_model_cost_usd_total",
        "pi_dispatch_egress_denials_total",
    ] {
        assert_eq!(
            sample_sum(&after, metric, &[]),
            sample_sum(&scrape, metric, &[]),
            "{metric}"
        );
    }
    // A session reads them too.
    let cookie = s.login().await;
    let (status, headers, _) = s.get("/metrics", Some(&cookie)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers["content-type"].starts_with("text/plain; version=0.0.4"));
}

/// A client whose connections come from `ip` (a loopback address of its own).
fn client_from(ip: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .local_address(ip.parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap()
}

/// What the panel logged, for the tests that look (one subscriber for the test binary).
fn logged() -> String {
    use std::sync::{Mutex, OnceLock};
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    let log = LOG.get_or_init(|| {
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || Sink(sink.clone()))
            .finish();
        let _ = tracing::subscriber::set_global_default(subscriber);
        log
    });
    String::from_utf8_lossy(&log.lock().unwrap()).into_owned()
}

struct Sink(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_tokens_count_per_client_at_the_form_and_as_a_bearer_alike() {
    logged();
    let s = serve().await;
    let guesser = client_from("127.0.0.1");
    let metrics = |client: &reqwest::Client, token: &str| {
        client
            .get(s.url("/metrics"))
            .header("authorization", format!("Bearer {token}"))
            .send()
    };
    // The control: the right bearer reads the metrics.
    assert_eq!(
        metrics(&guesser, TOKEN).await.unwrap().status(),
        StatusCode::OK
    );
    // Twenty wrong guesses as a bearer, each refused and logged.
    for n in 0..20 {
        let guess = format!("wrong-{n}");
        assert_eq!(
            metrics(&guesser, &guess).await.unwrap().status(),
            StatusCode::UNAUTHORIZED
        );
    }
    assert!(
        logged().contains("panel_token_refused") && logged().contains("bearer"),
        "{}",
        logged()
    );
    // Then that client is throttled at every way in, the right token included.
    assert_eq!(
        metrics(&guesser, TOKEN).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let form = guesser
        .post(s.url("/login"))
        .form(&[("token", TOKEN)])
        .send()
        .await
        .unwrap();
    assert_eq!(form.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(logged().contains("panel_token_throttled"), "{}", logged());
    // Another client's right token still opens the panel.
    let operator = client_from("127.0.0.2");
    let login = operator
        .post(s.url("/login"))
        .form(&[("token", TOKEN)])
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        metrics(&operator, TOKEN).await.unwrap().status(),
        StatusCode::OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_posted_from_another_site_is_refused_and_counts_for_nothing() {
    let s = serve().await;
    for _ in 0..25 {
        let cross = s
            .http
            .post(s.url("/login"))
            .header("origin", "https://evil.example")
            .form(&[("token", "a-guess")])
            .send()
            .await
            .unwrap();
        assert_eq!(cross.status(), StatusCode::FORBIDDEN);
        assert!(!cross.headers().contains_key("set-cookie"));
    }
    // The right token from another site is refused too (no session it could plant).
    let planted = s
        .http
        .post(s.url("/login"))
        .header("referer", "https://evil.example/page")
        .form(&[("token", TOKEN)])
        .send()
        .await
        .unwrap();
    assert_eq!(planted.status(), StatusCode::FORBIDDEN);
    // The control: the panel's own page, named as the origin, logs in.
    let own = s
        .http
        .post(s.url("/login"))
        .header("origin", format!("http://{}", s.addr))
        .form(&[("token", TOKEN)])
        .send()
        .await
        .unwrap();
    assert_eq!(own.status(), StatusCode::SEE_OTHER);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cookie_is_secure_behind_a_tls_proxy_the_operator_names() {
    let s = serve_behind(vec!["127.0.0.1".parse().unwrap()]).await;
    let login = |client: reqwest::Client| {
        let url = s.url("/login");
        async move {
            client
                .post(url)
                .header("x-forwarded-proto", "https")
                .header("x-forwarded-for", "198.51.100.7")
                .form(&[("token", TOKEN)])
                .send()
                .await
                .unwrap()
        }
    };
    let through_proxy = login(client_from("127.0.0.1")).await;
    assert_eq!(through_proxy.status(), StatusCode::SEE_OTHER);
    let cookie = through_proxy.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(cookie.contains("; Secure"), "{cookie}");
    // A peer that is not the named proxy is not believed.
    let direct = login(client_from("127.0.0.2")).await;
    let cookie = direct.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(!cookie.contains("Secure"), "{cookie}");
}

/// A tool's name as a hostile server could send it: markup, a terminal's escapes, a line end.
const HOSTILE_TOOL: &str = "<script>alert('pin')</script>\u{1b}[2J\nx";

fn pin_drift(tool: &str, kind: protocol::pins::DriftKind) -> protocol::pins::Drift {
    protocol::pins::Drift {
        tool: tool.into(),
        kind,
        pinned: (kind != protocol::pins::DriftKind::New)
            .then(|| format!("sha256:{}", "ab".repeat(32))),
        seen: format!("sha256:{}", "cd".repeat(32)),
    }
}

fn pin_report(
    server: &str,
    policy: protocol::pins::PinPolicy,
    drift: Vec<protocol::pins::Drift>,
) -> protocol::pins::PinReport {
    protocol::pins::PinReport {
        unpinnable: 0,
        server: server.into(),
        first_use: false,
        drift,
        gone: Vec::new(),
        policy,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_pins_show_first_use_and_each_tool_that_differed_as_text() {
    use protocol::pins::{DriftKind, PinPolicy};
    let s = serve().await;
    let mut r = record("run-pins", Outcome::Completed, None, 1_796_317_925_000);
    let mut first = pin_report("docs", PinPolicy::Withhold, Vec::new());
    first.first_use = true;
    r.mcp.pins = vec![
        first,
        pin_report(
            "wiki",
            PinPolicy::Withhold,
            vec![
                pin_drift(HOSTILE_TOOL, DriftKind::New),
                pin_drift("page", DriftKind::Changed),
            ],
        ),
        pin_report(
            "trusted",
            PinPolicy::Accept,
            vec![pin_drift("edit", DriftKind::ServerChanged)],
        ),
    ];
    r.mcp.pins[1].gone.push("old_tool".into());
    s.records.write(&r).unwrap();
    // The control: a run whose servers all matched.
    s.records
        .write(&record(
            "run-plain",
            Outcome::Completed,
            None,
            1_796_317_925_000,
        ))
        .unwrap();
    let cookie = s.login().await;
    let page = s.page_with("/runs/run-plain", &cookie, "Pins").await;
    assert!(
        page.contains("every tool listed matched its pin") && !page.contains("id=\"pins\""),
        "{page}"
    );

    let page = s.page_with("/runs/run-pins", &cookie, "id=\"pins\"").await;
    let table = &page[page.find("id=\"pins\"").unwrap()..];
    let table = &table[..table.find("</table>").unwrap()];
    for shown in [
        "first use: pinned by this job",
        // Escaped, without its control characters.
        "&lt;script&gt;alert('pin')&lt;/script&gt;[2Jx",
        "withheld: kept from pi",
        "accepted: offered, and the pin follows the server",
        "server-changed",
        // Both digests, cut short.
        "sha256:abababababab…",
        "sha256:cdcdcdcdcdcd…",
        "old_tool",
        "nothing to keep from pi",
    ] {
        assert!(table.contains(shown), "{shown} not in {table}");
    }
    assert!(!page.contains("<script>alert('pin')"), "{page}");
    assert!(!page.contains('\u{1b}'), "{page}");
    assert!(!page.contains(&"ab".repeat(32)), "a whole digest: {page}");
    // The new tool had no pinned digest; the changed one did.
    assert_eq!(table.matches("sha256:abababababab…").count(), 2, "{table}");
}

/// Puts what a worker stores: a pin, or drift, each as its JSON.
fn store_pin(s: &Served, server: &str, tools: usize, at: u64) {
    let pin = protocol::pins::StoredPin {
        definitions: Default::default(),
        listing: protocol::pins::Listing {
            unpinnable: 0,
            server: protocol::pins::ServerInfo::default(),
            tools: (0..tools)
                .map(|i| (format!("tool{i}"), format!("sha256:{i:064}")))
                .collect(),
        },
        pinned_at_ms: at,
        by: "job job-first".into(),
    };
    let text = serde_json::to_string(&pin).unwrap();
    let when = SystemTime::UNIX_EPOCH + Duration::from_millis(at);
    assert!(s.queue.put_pin(server, &text, false, when).unwrap());
}

fn store_drift(s: &Served, server: &str, job: &str, drift: Vec<protocol::pins::Drift>, at: u64) {
    let stored = protocol::pins::StoredDrift {
        definitions: Default::default(),
        job_id: job.into(),
        seen_at_ms: at,
        listing: protocol::pins::Listing::default(),
        comparison: protocol::pins::Comparison {
            unpinnable: 0,
            first_use: false,
            drift,
            gone: Vec::new(),
        },
    };
    let text = serde_json::to_string(&stored).unwrap();
    let when = SystemTime::UNIX_EPOCH + Duration::from_millis(at);
    s.queue.put_pin_drift(server, &text, when).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pins_page_lists_drift_waiting_with_the_job_that_saw_it() {
    use protocol::pins::DriftKind;
    let s = serve().await;
    let cookie = s.login().await;
    // Nothing stored: nothing waits, and the queue page says nothing of pins.
    let (_, _, page) = s.get("/pins", Some(&cookie)).await;
    assert!(
        page.contains("No server has drift waiting for approval."),
        "{page}"
    );
    let (_, _, queue_page) = s.get("/", Some(&cookie)).await;
    assert!(!queue_page.contains("pins-waiting"), "{queue_page}");
    assert!(
        queue_page.contains(r#"href="/pins""#),
        "no link to the pins"
    );
    assert_eq!(
        sample_sum(
            &s.scrape().await,
            "pi_dispatch_pin_drift_waiting_servers",
            &[]
        ),
        0.0
    );

    let t = 1_796_317_925_000;
    store_pin(&s, "docs", 3, t);
    store_pin(&s, "wiki", 2, t);
    store_drift(
        &s,
        "wiki",
        "job-saw-it",
        vec![
            pin_drift(HOSTILE_TOOL, DriftKind::New),
            pin_drift("tool1", DriftKind::Changed),
        ],
        t + 60_000,
    );
    // Drift older than its pin (the pin replaced while that job ran) does not wait.
    store_pin(&s, "old", 1, t + 60_000);
    store_drift(
        &s,
        "old",
        "job-stale",
        vec![pin_drift("tool0", DriftKind::Changed)],
        t,
    );
    // Entries no worker wrote: not JSON, and huge.
    assert!(
        s.queue
            .put_pin("memory", "{not json", false, SystemTime::now())
            .unwrap()
    );
    let huge = format!("\"{}\"", "x".repeat(2 << 20));
    s.queue
        .put_pin_drift("big", &huge, SystemTime::now())
        .unwrap();

    let (status, _, page) = s.get("/pins", Some(&cookie)).await;
    assert_eq!(status, StatusCode::OK);
    let pending = &page[page.find("id=\"pending\"").expect(&page)..];
    let pending = &pending[..pending.find("</table>").unwrap()];
    for shown in [
        "wiki",
        "1 changed, 1 new",
        "&lt;script&gt;alert('pin')&lt;/script&gt;[2Jx",
        r#"<a href="/runs/job-saw-it"><code>job-saw-it</code></a>"#,
        "2026-12-03 17:13:05 UTC",
        "big",
        &format!("The drift noted cannot be read: it is {} bytes", huge.len()),
    ] {
        assert!(pending.contains(shown), "{shown} not in {pending}");
    }
    assert!(
        !pending.contains("job-stale") && !pending.contains(">old<"),
        "{pending}"
    );
    assert!(
        !page.contains("<script>alert('pin')") && !page.contains('\u{1b}'),
        "{page}"
    );
    assert!(!page.contains("xxxxxxxx"), "the entry's text was shown");
    let pinned = &page[page.find("id=\"pinned\"").expect(&page)..];
    for shown in [
        ">docs<",
        ">old<",
        "job job-first",
        "The pin cannot be read: it is not JSON",
    ] {
        assert!(pinned.contains(shown), "{shown} not in {pinned}");
    }
    // The queue page points there, and /metrics counts the servers whose drift waits.
    let (_, _, queue_page) = s.get("/", Some(&cookie)).await;
    assert!(
        queue_page.contains("2 servers with tools that differ from their pins"),
        "{queue_page}"
    );
    assert_eq!(
        sample_sum(
            &s.scrape().await,
            "pi_dispatch_pin_drift_waiting_servers",
            &[]
        ),
        2.0
    );
    // Approved: wiki's drift goes with the pin stored again.
    store_pin(&s, "wiki", 3, t + 120_000);
    let (_, _, page) = s.get("/pins", Some(&cookie)).await;
    let pending = &page[page.find("id=\"pending\"").expect(&page)..];
    assert!(!pending.contains("job-saw-it"), "{pending}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_the_tools_withheld_by_pins_from_the_records() {
    use protocol::pins::{DriftKind, PinPolicy};
    let s = serve().await;
    let mut r = record("run-withheld", Outcome::Completed, None, 1_796_317_925_000);
    r.mcp.pins = vec![
        pin_report(
            "wiki",
            PinPolicy::Withhold,
            vec![
                pin_drift(HOSTILE_TOOL, DriftKind::New),
                pin_drift("page", DriftKind::Changed),
                pin_drift("edit", DriftKind::Changed),
            ],
        ),
        // Offered under accept: not withheld.
        pin_report(
            "trusted",
            PinPolicy::Accept,
            vec![pin_drift("any", DriftKind::New)],
        ),
        // Past a pin's bounds: withheld under every policy, accept too.
        protocol::pins::PinReport {
            unpinnable: 4,
            ..pin_report("huge", PinPolicy::Accept, Vec::new())
        },
    ];
    s.records.write(&r).unwrap();
    let scrape = s.scrape().await;
    let withheld = |filter: &[(&str, &str)]| {
        sample_sum(&scrape, "pi_dispatch_pin_withheld_tools_total", filter)
    };
    assert_eq!(withheld(&[("server", "wiki"), ("kind", "changed")]), 2.0);
    assert_eq!(withheld(&[("server", "wiki"), ("kind", "new")]), 1.0);
    assert_eq!(withheld(&[("server", "trusted")]), 0.0);
    assert_eq!(withheld(&[("server", "huge"), ("kind", "unpinnable")]), 4.0);
    assert_eq!(withheld(&[]), 7.0);
    // A tool's name is the server's to choose: no label carries it.
    assert!(
        scrape
            .samples
            .iter()
            .filter(|x| x.metric == "pi_dispatch_pin_withheld_tools_total")
            .all(|x| x.labels.get("tool").is_none()),
    );
}
