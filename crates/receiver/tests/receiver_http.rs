#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The receiver on a loopback socket, with a real SQLite queue: what each delivery is answered,
//! what it queues, and the one log line it writes.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use protocol::Job;
use queue::{Queue, SqliteQueue};
use receiver::server::{self, Config, Secret};
use receiver::signature::github_signature;

const SECRET: &str = "CANARY-WEBHOOK-SECRET-9f2c";
const GITLAB_TOKEN: &str = "CANARY-GITLAB-HOOK-TOKEN-77a1";

const TRIGGERS: &str = r#"{"triggers": [
  {"on": {"type": "label", "any": ["docs"]}, "run": {"kind": "github", "flow": "answer", "mcp": ["forge"]}},
  {"on": {"type": "comment", "phrase": "/pi answer"}, "run": {"kind": "github", "flow": "answer"}},
  {"on": {"type": "label", "any": ["docs"]}, "run": {"kind": "gitlab", "flow": "fix"}}
]}"#;

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    fn lines(&self) -> Vec<serde_json::Value> {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

struct Receiver {
    url: String,
    queue: Arc<dyn Queue>,
    dir: tempfile::TempDir,
    log: Log,
    _guard: tracing::subscriber::DefaultGuard,
    client: reqwest::Client,
}

async fn start(timeout: Duration) -> Receiver {
    let dir = tempfile::tempdir().unwrap();
    let queue = Arc::new(SqliteQueue::open(&dir.path().join("queue.sqlite3")).unwrap());
    start_on(timeout, dir, queue).await
}

async fn start_on(timeout: Duration, dir: tempfile::TempDir, queue: Arc<dyn Queue>) -> Receiver {
    let log = Log::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_writer(move || writer.clone())
        .finish();
    let guard = tracing::subscriber::set_default(subscriber);
    std::fs::write(dir.path().join("triggers.json"), TRIGGERS).unwrap();
    let app = server::router(Config {
        queue: queue.clone(),
        triggers_file: dir.path().join("triggers.json"),
        github_secret: Some(Secret::new(SECRET)),
        gitlab_token: Some(Secret::new(GITLAB_TOKEN)),
        max_body: 64 * 1024,
        timeout,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    Receiver {
        url,
        queue,
        dir,
        log,
        _guard: guard,
        client: reqwest::Client::new(),
    }
}

impl Receiver {
    async fn github(
        &self,
        event: &str,
        delivery: &str,
        body: &[u8],
        signature: Option<String>,
    ) -> (u16, serde_json::Value) {
        let mut req = self
            .client
            .post(format!("{}/github", self.url))
            .header("X-GitHub-Event", event)
            .header("X-GitHub-Delivery", delivery)
            .header("Content-Type", "application/json")
            .body(body.to_vec());
        if let Some(sig) = signature {
            req = req.header("X-Hub-Signature-256", sig);
        }
        answer(req.send().await.unwrap()).await
    }

    async fn signed(&self, event: &str, delivery: &str, body: &[u8]) -> (u16, serde_json::Value) {
        self.github(
            event,
            delivery,
            body,
            Some(github_signature(SECRET.as_bytes(), body)),
        )
        .await
    }

    async fn gitlab(
        &self,
        event: &str,
        uuid: &str,
        body: &[u8],
        token: &str,
    ) -> (u16, serde_json::Value) {
        let req = self
            .client
            .post(format!("{}/gitlab", self.url))
            .header("X-Gitlab-Event", event)
            .header("X-Gitlab-Event-UUID", uuid)
            .header("X-Gitlab-Token", token)
            .body(body.to_vec());
        answer(req.send().await.unwrap()).await
    }

    fn queued(&self) -> Vec<Job> {
        let status = self.queue.status(SystemTime::now(), 0).unwrap();
        status
            .open
            .iter()
            .map(|j| serde_json::from_str(&j.payload).unwrap())
            .collect()
    }
}

async fn answer(response: reqwest::Response) -> (u16, serde_json::Value) {
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}

#[tokio::test]
async fn a_signed_label_event_queues_its_trigger_job_once() {
    let r = start(Duration::from_secs(10)).await;
    let body = fixture("github-issues-labeled.json");
    let (status, a) = r.signed("issues", "1f0e-aa01", &body).await;
    assert_eq!(status, 202, "{a}");
    assert_eq!(a["outcome"], "queued");
    assert_eq!(a["jobs"], serde_json::json!(["gh-1f0e-aa01-t0"]));
    let jobs = r.queued();
    assert_eq!(jobs.len(), 1);
    let job = &jobs[0];
    assert_eq!(
        (job.kind.as_str(), job.flow.as_deref()),
        ("github", Some("answer"))
    );
    assert_eq!(job.trigger_index, Some(0));
    assert_eq!(job.mcp_names(), Some(&["forge".to_owned()][..]));
    let event = job.event.as_ref().unwrap();
    assert_eq!(
        (event.repository.as_str(), event.number),
        ("octo-org/hello", 42)
    );
    // Sent again (GitHub's redeliver): nothing more.
    let (status, a) = r.signed("issues", "1f0e-aa01", &body).await;
    assert_eq!((status, a["outcome"].as_str()), (200, Some("duplicate")));
    assert_eq!(r.queued().len(), 1);
    // One log line a delivery, with no secret in any.
    let lines = r.log.lines();
    assert_eq!(lines.len(), 2, "{}", r.log.text());
    assert_eq!(lines[0]["fields"]["event"], "webhook_queued");
    assert_eq!(lines[1]["fields"]["outcome"], "duplicate");
    assert!(!r.log.text().contains(SECRET));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_queue_in_redis_a_delivery_is_queued_once_for_every_host() {
    let server = testkit::redis::RedisServer::start();
    let target = queue::RedisTarget {
        url: server.url(),
        password: None,
    };
    let queue = Arc::new(queue::RedisQueue::open(&target).unwrap());
    let r = start_on(Duration::from_secs(10), tempfile::tempdir().unwrap(), queue).await;
    let body = fixture("github-issues-labeled.json");
    let (status, a) = r.signed("issues", "3c1d-bb02", &body).await;
    assert_eq!(
        (status, a["outcome"].as_str()),
        (202, Some("queued")),
        "{a}"
    );
    let (status, a) = r.signed("issues", "3c1d-bb02", &body).await;
    assert_eq!(
        (status, a["outcome"].as_str()),
        (200, Some("duplicate")),
        "{a}"
    );
    // Another host's handle on the queue sees the job, once.
    let other = queue::RedisQueue::open(&target).unwrap();
    let open = other.status(SystemTime::now(), 0).unwrap().open;
    assert_eq!(
        open.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(),
        ["gh-3c1d-bb02-t0"]
    );
    let lease = other
        .lease("another-host", Duration::from_secs(60), SystemTime::now())
        .unwrap()
        .unwrap();
    let job: Job = serde_json::from_str(&lease.payload).unwrap();
    assert_eq!(job.event.unwrap().number, 42);
}

#[tokio::test]
async fn a_wrong_or_missing_signature_is_refused_and_queues_nothing() {
    let r = start(Duration::from_secs(10)).await;
    let body = fixture("github-issues-labeled.json");
    let wrong = github_signature(b"another secret", &body);
    let (status, a) = r.github("issues", "d-1", &body, Some(wrong)).await;
    assert_eq!(
        (status, a["outcome"].as_str()),
        (401, Some("bad-signature"))
    );
    let (status, _) = r.github("issues", "d-1", &body, None).await;
    assert_eq!(status, 401);
    // Signed for another body.
    let other = github_signature(SECRET.as_bytes(), b"{}");
    let (status, _) = r.github("issues", "d-1", &body, Some(other)).await;
    assert_eq!(status, 401);
    assert!(r.queued().is_empty());
    // The refused delivery was not remembered: signed, it queues.
    let (status, _) = r.signed("issues", "d-1", &body).await;
    assert_eq!(status, 202);
    assert_eq!(r.log.lines().len(), 4);
    assert!(
        r.log.lines()[..3]
            .iter()
            .all(|l| l["fields"]["event"] == "webhook_refused")
    );
}

#[tokio::test]
async fn a_label_no_trigger_names_and_a_comment_with_the_phrase() {
    let r = start(Duration::from_secs(10)).await;
    let mut v: serde_json::Value =
        serde_json::from_slice(&fixture("github-issues-labeled.json")).unwrap();
    v["label"]["name"] = "question".into();
    v["issue"]["labels"] = serde_json::json!([{"name": "question"}]);
    let body = serde_json::to_vec(&v).unwrap();
    let (status, a) = r.signed("issues", "d-2", &body).await;
    assert_eq!((status, a["outcome"].as_str()), (200, Some("unmatched")));
    assert!(r.queued().is_empty());
    let (status, a) = r
        .signed(
            "issue_comment",
            "d-3",
            &fixture("github-issue-comment.json"),
        )
        .await;
    assert_eq!((status, a["outcome"].as_str()), (202, Some("queued")));
    assert_eq!(a["jobs"], serde_json::json!(["gh-d-3-t1"]));
    let jobs = r.queued();
    assert_eq!(jobs[0].trigger_type, "comment");
    assert!(
        jobs[0]
            .event
            .as_ref()
            .unwrap()
            .comment
            .as_ref()
            .unwrap()
            .body
            .contains("/pi answer")
    );
}

#[tokio::test]
async fn bad_requests_get_clear_answers_and_one_log_line_each() {
    let r = start(Duration::from_secs(10)).await;
    // Not JSON, signed.
    let (status, a) = r.signed("issues", "d-4", b"{not json").await;
    assert_eq!((status, a["outcome"].as_str()), (400, Some("bad-payload")));
    // A field missing: named.
    let (status, a) = r.signed("issues", "d-5", br#"{"action":"labeled"}"#).await;
    assert_eq!(status, 400);
    assert!(a["why"].as_str().unwrap().contains("/issue/number"), "{a}");
    // An event no trigger names.
    let (status, a) = r.signed("push", "d-6", b"{}").await;
    assert_eq!((status, a["outcome"].as_str()), (200, Some("ignored")));
    // GitHub's ping.
    let (status, a) = r.signed("ping", "d-7", br#"{"zen":"hi"}"#).await;
    assert_eq!((status, a["outcome"].as_str()), (200, Some("pong")));
    // A delivery id that cannot name a job.
    let (status, a) = r
        .signed(
            "issues",
            "../../etc",
            &fixture("github-issues-labeled.json"),
        )
        .await;
    assert_eq!(status, 400);
    assert!(
        a["why"].as_str().unwrap().contains("x-github-delivery"),
        "{a}"
    );
    // Too large: the body limit answers before anything reads it.
    let big = vec![b' '; 65 * 1024];
    let (status, _) = r.signed("issues", "d-8", &big).await;
    assert_eq!(status, 413);
    // Not a POST, and a path that is not a forge's.
    let get = r
        .client
        .get(format!("{}/github", r.url))
        .send()
        .await
        .unwrap();
    assert_eq!(get.status().as_u16(), 405);
    let other = r
        .client
        .post(format!("{}/forgejo", r.url))
        .send()
        .await
        .unwrap();
    assert_eq!(other.status().as_u16(), 404);
    assert!(r.queued().is_empty());
    assert_eq!(r.log.lines().len(), 8, "{}", r.log.text());
}

#[tokio::test]
async fn a_request_that_takes_too_long_is_answered_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let r = start(Duration::from_millis(300)).await;
    let addr = r.url.trim_start_matches("http://").to_owned();
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    // The headers promise a body that never comes.
    stream
        .write_all(b"POST /github HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\nX-GitHub-Event: issues\r\n\r\n{")
        .await
        .unwrap();
    let mut reply = vec![0u8; 1024];
    let n = stream.read(&mut reply).await.unwrap();
    assert!(String::from_utf8_lossy(&reply[..n]).starts_with("HTTP/1.1 408"));
    assert_eq!(r.log.lines().len(), 1);
}

#[tokio::test]
async fn gitlab_deliveries_are_taken_with_the_token_only() {
    let r = start(Duration::from_secs(10)).await;
    let body = fixture("gitlab-issue-labeled.json");
    let (status, a) = r.gitlab("Issue Hook", "u-1", &body, "wrong").await;
    assert_eq!((status, a["outcome"].as_str()), (401, Some("bad-token")));
    assert!(r.queued().is_empty());
    let (status, a) = r.gitlab("Issue Hook", "u-1", &body, GITLAB_TOKEN).await;
    assert_eq!(
        (status, a["outcome"].as_str()),
        (202, Some("queued")),
        "{a}"
    );
    assert_eq!(a["jobs"], serde_json::json!(["gl-u-1-t2"]));
    let (status, a) = r.gitlab("Issue Hook", "u-1", &body, GITLAB_TOKEN).await;
    assert_eq!((status, a["outcome"].as_str()), (200, Some("duplicate")));
    let jobs = r.queued();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].flow.as_deref(), Some("fix"));
    assert!(!r.log.text().contains(GITLAB_TOKEN));
}

#[tokio::test]
async fn a_refused_triggers_file_is_a_503_and_the_delivery_may_come_again() {
    let r = start(Duration::from_secs(10)).await;
    let file = r.dir.path().join("triggers.json");
    std::fs::write(&file, b"{\"triggers\": [{}]}").unwrap();
    let body = fixture("github-issues-labeled.json");
    let (status, a) = r.signed("issues", "d-9", &body).await;
    assert_eq!((status, a["outcome"].as_str()), (503, Some("unavailable")));
    assert!(a["why"].as_str().unwrap().contains("triggers.json"));
    std::fs::write(&file, TRIGGERS).unwrap();
    let (status, _) = r.signed("issues", "d-9", &body).await;
    assert_eq!(status, 202);
}

#[tokio::test]
async fn a_forge_without_its_secret_takes_no_webhook() {
    let dir = tempfile::tempdir().unwrap();
    let queue = Arc::new(SqliteQueue::open(&dir.path().join("q.sqlite3")).unwrap());
    let app = server::router(Config {
        queue: queue.clone(),
        triggers_file: dir.path().join("triggers.json"),
        github_secret: None,
        gitlab_token: None,
        max_body: server::DEFAULT_MAX_BODY,
        timeout: server::DEFAULT_TIMEOUT,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let response = reqwest::Client::new()
        .post(format!("{url}/github"))
        .header("X-GitHub-Event", "issues")
        .header("X-GitHub-Delivery", "d")
        .body(fixture("github-issues-labeled.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 404);
    assert!(
        response
            .text()
            .await
            .unwrap()
            .contains("PI_GITHUB_WEBHOOK_SECRET")
    );
    assert!(queue.status(SystemTime::now(), 0).unwrap().open.is_empty());
}

#[tokio::test]
async fn a_repository_name_outside_the_forges_grammar_is_refused_with_its_field_named() {
    let r = start(Duration::from_secs(10)).await;
    let body = fixture("github-issues-labeled.json");
    let mut event: serde_json::Value = serde_json::from_slice(&body).unwrap();
    for (n, name) in [
        "octo-org/hello-world/../../../app/installations",
        "../../octo-org/hello-world",
        "octo-org/hello\nworld",
        "octo-org/hello world",
    ]
    .iter()
    .enumerate()
    {
        event["repository"]["full_name"] = serde_json::json!(name);
        let odd = serde_json::to_vec(&event).unwrap();
        let (status, a) = r.signed("issues", &format!("d-odd-{n}"), &odd).await;
        assert_eq!(
            (status, a["outcome"].as_str()),
            (400, Some("bad-payload")),
            "{a}"
        );
        let why = a["why"].as_str().unwrap();
        assert!(why.contains("repository.full_name"), "{why}");
        assert!(
            !why.contains("installations") && !why.contains(".."),
            "{why}"
        );
    }
    // A default branch git would not take, and an item numbered zero.
    event["repository"]["full_name"] = serde_json::json!("octo-org/hello");
    event["repository"]["default_branch"] = serde_json::json!("main..x");
    let (status, a) = r
        .signed(
            "issues",
            "d-odd-branch",
            &serde_json::to_vec(&event).unwrap(),
        )
        .await;
    assert_eq!(status, 400, "{a}");
    assert!(a["why"].as_str().unwrap().contains("default branch"), "{a}");
    assert!(r.queued().is_empty());
    // The control: the real name queues.
    let (status, a) = r.signed("issues", "d-real", &body).await;
    assert_eq!(status, 202, "{a}");
    assert_eq!(r.queued().len(), 1);
}
