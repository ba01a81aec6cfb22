//! The receiver under load (`--webhooks`): the release binary's `pi-dispatch receiver` on a loopback
//! port of a fresh deployment (a SQLite queue, one label trigger), sent signed GitHub "issue
//! labeled" webhooks at a fixed rate (open loop: each request leaves at its time, whether or not
//! the ones before were answered). Every tenth request sends a delivery already sent again, as a
//! forge retrying would. Afterwards the queue must hold exactly one job per distinct delivery: none
//! lost, none queued twice, or the bench fails.

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, ensure};
use queue::{Queue as _, SqliteQueue};
use serde_json::{Value, json};

use crate::stats::{median, percentile, round1, round3};

const SECRET: &str = "bench-webhook-secret";
/// Every this many requests, one re-sends a delivery sent before.
const REDELIVER_EVERY: u64 = 10;

pub struct Options<'a> {
    pub bin: &'a Path,
    pub rate: u32,
    pub seconds: u32,
}

pub struct WebhookFigures {
    rate: u32,
    seconds: u32,
    sent: usize,
    distinct: usize,
    queued_answers: usize,
    duplicate_answers: usize,
    other_answers: usize,
    jobs_in_queue: usize,
    /// How long sending took (the last request left at this offset).
    sending: Duration,
    latencies_ms: Vec<f64>,
}

/// The body of delivery `n`: issue `n` labeled `pi`.
fn body(n: u64) -> String {
    json!({
        "action": "labeled",
        "issue": {"number": n, "title": format!("Issue {n}"), "body": "Load.",
            "user": {"login": "reporter", "type": "User"},
            "labels": [{"name": "pi"}], "state": "open"},
        "label": {"name": "pi"},
        "repository": {"id": 1, "name": "hello", "full_name": "octo-org/hello",
            "private": false, "owner": {"login": "octo-org"}, "default_branch": "main"},
        "sender": {"login": "maintainer", "type": "User"},
        "installation": {"id": 1}
    })
    .to_string()
}

pub fn measure(options: &Options) -> anyhow::Result<WebhookFigures> {
    let dir = tempfile::tempdir().context("cannot make a temporary folder")?;
    let triggers = r#"{"triggers": [{"on": {"type": "label", "any": ["pi"]}, "run": {"kind": "github", "flow": "answer"}}]}"#;
    std::fs::write(dir.path().join("triggers.json"), triggers)?;
    let mut cmd = Command::new(options.bin);
    cmd.args([
        "receiver",
        "--listen",
        "127.0.0.1:0",
        "--log-format",
        "json",
    ])
    .arg("--dir")
    .arg(dir.path())
    .env_clear()
    .env("PATH", "/usr/bin:/bin")
    .env("PI_GITHUB_WEBHOOK_SECRET", SECRET);
    let (addr, mut receiver) = crate::listening::start(cmd, "receiver_listening")?;
    let url = format!("http://{addr}/github");

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let total = u64::from(options.rate) * u64::from(options.seconds);
    let interval = Duration::from_secs_f64(1.0 / f64::from(options.rate));
    let (answers, sending) = runtime.block_on(async {
        let client = reqwest::Client::builder().no_proxy().build()?;
        let client = Arc::new(client);
        let start = tokio::time::Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        let mut distinct = 0u64;
        for i in 0..total {
            tokio::time::sleep_until(start + interval.mul_f64(i as f64)).await;
            // A re-sent delivery, or the next new one.
            let delivery = if i % REDELIVER_EVERY == REDELIVER_EVERY - 1 && distinct > 5 {
                distinct - 5
            } else {
                distinct += 1;
                distinct
            };
            let body = body(delivery);
            let signature =
                receiver::signature::github_signature(SECRET.as_bytes(), body.as_bytes());
            let client = client.clone();
            let url = url.clone();
            tasks.spawn(async move {
                let sent = Instant::now();
                let answer = client
                    .post(&url)
                    .header("Content-Type", "application/json")
                    .header("X-GitHub-Event", "issues")
                    .header("X-GitHub-Delivery", format!("load-{delivery}"))
                    .header("X-Hub-Signature-256", signature)
                    .body(body)
                    .send()
                    .await;
                let status = match answer {
                    Ok(r) => {
                        let status = r.status().as_u16();
                        let v: Value = r.json().await.unwrap_or_default();
                        (status, v["outcome"].as_str().unwrap_or_default().to_owned())
                    }
                    Err(_) => (0, "unanswered".to_owned()),
                };
                (status, sent.elapsed())
            });
        }
        let sending = start.elapsed();
        let mut answers = Vec::new();
        while let Some(done) = tasks.join_next().await {
            answers.push(done?);
        }
        Ok::<_, anyhow::Error>((answers, sending))
    })?;
    let _ = receiver.kill();
    let _ = receiver.wait();

    let distinct = usize::try_from(total - total / REDELIVER_EVERY)?;
    let queued_answers = answers
        .iter()
        .filter(|((s, o), _)| *s == 202 && o == "queued")
        .count();
    let duplicate_answers = answers
        .iter()
        .filter(|((s, o), _)| *s == 200 && o == "duplicate")
        .count();
    let other_answers = answers.len() - queued_answers - duplicate_answers;
    let queue = SqliteQueue::open(&dir.path().join("state/queue.sqlite3"))?;
    let status = queue.status(SystemTime::now(), 0)?;
    let ids: HashSet<&str> = status.open.iter().map(|j| j.id.as_str()).collect();
    ensure!(
        ids.len() == status.open.len(),
        "a job id is in the queue twice"
    );
    let expected: HashSet<String> = (1..=distinct as u64)
        .map(|n| format!("gh-load-{n}-t0"))
        .collect();
    let missing = expected
        .iter()
        .filter(|e| !ids.contains(e.as_str()))
        .count();
    ensure!(
        missing == 0 && ids.len() == distinct,
        "{missing} deliveries were lost; the queue holds {} jobs for {distinct} deliveries",
        ids.len()
    );
    ensure!(
        queued_answers == distinct && other_answers == 0,
        "{queued_answers} queued answers for {distinct} deliveries, {other_answers} other answers"
    );
    Ok(WebhookFigures {
        rate: options.rate,
        seconds: options.seconds,
        sent: answers.len(),
        distinct,
        queued_answers,
        duplicate_answers,
        other_answers,
        jobs_in_queue: ids.len(),
        sending,
        latencies_ms: answers
            .iter()
            .map(|(_, took)| took.as_secs_f64() * 1000.0)
            .collect(),
    })
}

impl WebhookFigures {
    fn sorted(&self) -> Vec<f64> {
        let mut s = self.latencies_ms.clone();
        s.sort_by(f64::total_cmp);
        s
    }

    pub fn json(&self) -> Value {
        let s = self.sorted();
        json!({
            "rate_per_s": self.rate,
            "seconds": self.seconds,
            "requests": self.sent,
            "distinct_deliveries": self.distinct,
            "answered_queued": self.queued_answers,
            "answered_duplicate": self.duplicate_answers,
            "answered_otherwise": self.other_answers,
            "jobs_in_queue": self.jobs_in_queue,
            "lost": self.distinct - self.jobs_in_queue.min(self.distinct),
            "sent_in_s": round3(self.sending.as_secs_f64()),
            "latency_ms": {
                "median": round3(median(&self.latencies_ms)),
                "p99": round3(percentile(&s, 99)),
                "max": round3(s.last().copied().unwrap_or(0.0)),
            },
        })
    }

    pub fn print(&self) {
        let s = self.sorted();
        println!(
            "webhooks: {} signed GitHub deliveries a second for {} s ({} requests, {} distinct, every {REDELIVER_EVERY}th a re-delivery), sent in {:.1} s: {} queued, {} duplicate, {} other; {} jobs in the queue, none lost or twice; latency median {:.2} ms, p99 {:.2} ms, max {:.1} ms",
            self.rate,
            self.seconds,
            self.sent,
            self.distinct,
            self.sending.as_secs_f64(),
            self.queued_answers,
            self.duplicate_answers,
            self.other_answers,
            self.jobs_in_queue,
            median(&self.latencies_ms),
            percentile(&s, 99),
            round1(s.last().copied().unwrap_or(0.0)),
        );
    }
}
