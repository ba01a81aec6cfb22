//! The panel under 10,000 records (`--panel`): a fresh deployment holds that many records of
//! mixed outcomes (each with servers, tool calls and pi's activity, as real jobs leave them) and
//! 20 queued jobs; the release binary's `pi-dispatch panel` serves it on a loopback port. After a
//! login, each page is fetched again and again, one request at a time, and its latency taken
//! from the request's start to the last byte of the answer: the queue, the runs, a filtered runs
//! list, one run, and `/metrics`. Beside it, in the same run, the commands an operator would use
//! instead on the same deployment: `pi-dispatch status`, `runs`, `runs show ID` and `runs --json`,
//! each a whole process. The panel's own peak memory (`VmHWM`) is read at the end.

use std::path::Path;
use std::process::Command;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, ensure};
use protocol::exit_line::ServerState;
use protocol::job::Job;
use protocol::reason::Reason;
use protocol::usage::ToolCallCount;
use queue::Queue as _;
use records::record::{Activity, EgressDenial, Outcome, Record, Tokens};
use records::store::Records;
use serde_json::{Value, json};

use crate::stats::{percentile, round3};

pub(crate) const TOKEN: &str = "bench-panel-token-0123456789";
/// The goal: every page under this at p99.
const GOAL_P99_MS: f64 = 50.0;

pub struct Options<'a> {
    pub bin: &'a Path,
    pub records: u32,
    pub requests: u32,
    pub cli_runs: u32,
}

/// One page's or one command's latencies, in ms.
pub(crate) struct Timed {
    pub(crate) what: String,
    pub(crate) ms: Vec<f64>,
    pub(crate) bytes: usize,
}

pub struct PanelFigures {
    records: u32,
    pages: Vec<Timed>,
    commands: Vec<Timed>,
    panel_peak_rss_kib: u64,
    /// From the panel's start to its first answer (the login).
    ready_ms: f64,
}

/// Record `n` of the deployment: outcomes and reasons spread as a busy deployment has them.
pub(crate) fn record(n: u32, now_ms: u64) -> Record {
    let id = format!("cli-bench-{n:05}");
    let reason = match n % 10 {
        0..=5 => None,
        6 => Some(Reason::AgentFailed),
        7 => Some(Reason::McpUnavailable),
        8 => Some(Reason::McpServerUnknown),
        _ => Some(Reason::TimeLimit),
    };
    let outcome = reason.map_or(Outcome::Completed, Reason::outcome);
    let mut job = Job::new(
        id.as_str(),
        if n.is_multiple_of(3) { "cron" } else { "cli" },
        "local",
    );
    job.provider = Some("fake".into());
    job.model = Some("fake-model".into());
    // Spread over the last 30 days, the newest last.
    let finished = now_ms - u64::from(10_000 - n.min(10_000)) * 259_000;
    let mut r = Record::new(&job, outcome, reason, 1, finished);
    r.queued_at_ms = Some(finished - 60_000);
    r.admitted_at_ms = Some(finished - 59_800);
    r.started_at_ms = Some(finished - 59_790);
    r.sandbox_up_at_ms = Some(finished - 59_700);
    r.worker = Some(format!("host-{}:{}", n % 3, 1000 + n % 7));
    if reason != Some(Reason::McpServerUnknown) {
        r.turns = Some(6);
        r.tokens = Some(Tokens {
            input: 12_000,
            output: 900,
            total: 12_900,
        });
        r.cost_usd = Some(0.031);
        r.spent = true;
        r.budget_reserved = true;
        for (k, server) in ["docs", "tracker", "search"].into_iter().enumerate() {
            r.mcp.servers.push(ServerState {
                name: server.into(),
                state: "ready".into(),
                ready_ms: Some(200 + 50 * k as u64),
                listing: None,
            });
            r.mcp.tool_calls.push(ToolCallCount {
                server: server.into(),
                tool: "search".into(),
                calls: 4,
                ok: 3,
                error: 1,
                refused: 0,
                total_ms: 420,
                result_bytes: 18_000,
            });
        }
        for turn in 0..6u64 {
            let at = finished - 59_000 + turn * 9_000;
            r.activity.push(Activity {
                at_ms: at,
                kind: "turn".into(),
                tool: None,
            });
            r.activity.push(Activity {
                at_ms: at + 2_000,
                kind: "tool".into(),
                tool: Some("mcp__docs__search".into()),
            });
        }
        r.final_message = Some("Done: the change is in place and the tests pass.".into());
    }
    if n.is_multiple_of(25) {
        r.egress_denied.push(EgressDenial {
            host: "tracker.example.org".into(),
            port: 443,
            reason: "not-allowlisted".into(),
            count: 2,
        });
    }
    r
}

/// Starts the panel on the deployment in `dir`; its address and process.
pub(crate) fn start_panel(bin: &Path, dir: &Path) -> anyhow::Result<(String, std::process::Child)> {
    let mut cmd = Command::new(bin);
    cmd.args(["panel", "--listen", "127.0.0.1:0", "--log-format", "json"])
        .arg("--dir")
        .arg(dir)
        .env_clear()
        .env("PATH", "/usr/bin:/bin");
    let (addr, panel) = crate::listening::start(cmd, "panel_listening")?;
    Ok((format!("http://{addr}"), panel))
}

/// A session of the panel at `base`, logged in with the token.
pub(crate) struct Session {
    http: reqwest::blocking::Client,
    base: String,
    cookie: String,
}

impl Session {
    pub(crate) fn log_in(base: &str) -> anyhow::Result<Session> {
        let http = reqwest::blocking::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        let login = http
            .post(format!("{base}/login"))
            .form(&[("token", TOKEN)])
            .send()?;
        ensure!(login.status().as_u16() == 303, "the login was refused");
        let cookie = login
            .headers()
            .get("set-cookie")
            .and_then(|c| c.to_str().ok())
            .and_then(|c| c.split(';').next())
            .context("no session cookie")?
            .to_owned();
        Ok(Session {
            http,
            base: base.to_owned(),
            cookie,
        })
    }

    /// Page `path`: how long it took to its last byte, its size and its status.
    fn get(&self, path: &str) -> anyhow::Result<(f64, usize)> {
        let start = Instant::now();
        let answer = self
            .http
            .get(format!("{}{path}", self.base))
            .header("cookie", &self.cookie)
            .send()?;
        let status = answer.status();
        let body = answer.bytes()?;
        let ms = start.elapsed().as_secs_f64() * 1000.0;
        ensure!(status.is_success(), "{path}: {status}");
        Ok((ms, body.len()))
    }

    /// Each of `pages` (path, what) fetched `requests` times, one at a time, after `warm` warm-ups.
    pub(crate) fn time_pages(
        &self,
        pages: &[(&str, &str)],
        warm: u32,
        requests: u32,
    ) -> anyhow::Result<Vec<Timed>> {
        let mut timed = Vec::new();
        for (path, what) in pages {
            for _ in 0..warm {
                self.get(path)?;
            }
            let mut ms = Vec::new();
            let mut bytes = 0;
            for _ in 0..requests {
                let (took, len) = self.get(path)?;
                ms.push(took);
                bytes = len;
            }
            timed.push(Timed {
                what: format!("{what} ({path})"),
                ms,
                bytes,
            });
        }
        Ok(timed)
    }

    pub(crate) fn text(&self, path: &str) -> anyhow::Result<String> {
        Ok(self
            .http
            .get(format!("{}{path}", self.base))
            .header("cookie", &self.cookie)
            .send()?
            .text()?)
    }
}

/// Peak resident memory of process `pid`, KiB.
pub(crate) fn peak_rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmHWM")
}

pub fn measure(options: &Options) -> anyhow::Result<PanelFigures> {
    let dir = tempfile::tempdir().context("cannot make a temporary folder")?;
    std::fs::write(
        dir.path().join(".env"),
        format!("PI_PANEL_TOKEN={TOKEN}\nPI_EGRESS=0\n"),
    )?;
    let now_ms = u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis())?;
    let records = Records::sqlite(&queue::sqlite_path(dir.path()))?;
    for n in 0..options.records {
        records.write(&record(n, now_ms))?;
    }
    let queue = queue::SqliteQueue::open(&dir.path().join("state/queue.sqlite3"))?;
    for n in 0..20 {
        let mut job = Job::new(format!("cli-waiting-{n:02}"), "cli", "local");
        job.task = Some(format!("Task {n}: fix the flaky test in the parser."));
        job.folder = Some(format!("/srv/repos/project-{n}"));
        queue.enqueue(&job.id, &serde_json::to_string(&job)?, SystemTime::now())?;
    }
    drop(queue);

    let started = Instant::now();
    let (base, mut panel) = start_panel(options.bin, dir.path())?;
    let result = (|| {
        let session = Session::log_in(&base)?;
        let ready_ms = started.elapsed().as_secs_f64() * 1000.0;
        let one = format!("/runs/cli-bench-{:05}", options.records / 2);
        let pages = [
            ("/", "queue"),
            ("/runs", "runs"),
            (
                "/runs?outcome=failed&reason=agent-failed&trigger=cron&since=7d",
                "runs, filtered",
            ),
            (one.as_str(), "one run"),
            ("/metrics", "metrics"),
        ];
        let timed = session.time_pages(&pages, 20, options.requests)?;
        // The metrics count every record.
        let metrics = session.text("/metrics")?;
        ensure!(
            metrics.contains(&format!("pi_dispatch_records {}", options.records)),
            "the panel did not read every record"
        );
        let peak = peak_rss_kib(panel.id())?;
        Ok((timed, peak, ready_ms))
    })();
    let _ = panel.kill();
    let _ = panel.wait();
    let (pages, panel_peak_rss_kib, ready_ms) = result?;

    let one = format!("cli-bench-{:05}", options.records / 2);
    // Every record as JSON: `runs` lists the newest 50 unless told.
    let all = options.records.to_string();
    let mut commands = Vec::new();
    for args in [
        vec!["status"],
        vec!["runs"],
        vec!["runs", "show", one.as_str()],
        vec!["runs", "--json", "--limit", all.as_str()],
    ] {
        let mut ms = Vec::new();
        let mut bytes = 0;
        for _ in 0..options.cli_runs {
            let start = Instant::now();
            let output = Command::new(options.bin)
                .args(&args)
                .arg("--dir")
                .arg(dir.path())
                .env_clear()
                .env("PATH", "/usr/bin:/bin")
                .env("NO_COLOR", "1")
                .output()?;
            ms.push(start.elapsed().as_secs_f64() * 1000.0);
            ensure!(
                output.status.success(),
                "pi-dispatch {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr)
            );
            bytes = output.stdout.len();
        }
        commands.push(Timed {
            what: format!("pi-dispatch {}", args.join(" ")),
            ms,
            bytes,
        });
    }
    Ok(PanelFigures {
        records: options.records,
        pages,
        commands,
        panel_peak_rss_kib,
        ready_ms,
    })
}

impl Timed {
    fn sorted(&self) -> Vec<f64> {
        let mut s = self.ms.clone();
        s.sort_by(f64::total_cmp);
        s
    }

    pub(crate) fn json(&self) -> Value {
        let s = self.sorted();
        json!({
            "what": self.what,
            "runs": s.len(),
            "bytes": self.bytes,
            "median_ms": round3(percentile(&s, 50)),
            "p99_ms": round3(percentile(&s, 99)),
            "max_ms": round3(s.last().copied().unwrap_or(0.0)),
        })
    }

    pub(crate) fn line(&self) -> String {
        let s = self.sorted();
        format!(
            "{}: {} runs, {} bytes, median {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            self.what,
            s.len(),
            self.bytes,
            percentile(&s, 50),
            percentile(&s, 99),
            s.last().copied().unwrap_or(0.0)
        )
    }

    pub(crate) fn p99(&self) -> f64 {
        percentile(&self.sorted(), 99)
    }
}

impl PanelFigures {
    fn within_goal(&self) -> bool {
        self.pages.iter().all(|p| p.p99() < GOAL_P99_MS)
    }

    pub fn json(&self) -> Value {
        json!({
            "records": self.records,
            "panel_ready_after_ms": round3(self.ready_ms),
            "panel_peak_rss_kib": self.panel_peak_rss_kib,
            "pages": self.pages.iter().map(Timed::json).collect::<Vec<_>>(),
            "commands": self.commands.iter().map(Timed::json).collect::<Vec<_>>(),
            "goal_p99_ms": GOAL_P99_MS,
            "within_goal": self.within_goal(),
        })
    }

    pub fn print(&self) {
        println!(
            "panel: {} records; first answer {:.0} ms after its start, peak RSS {} KiB",
            self.records, self.ready_ms, self.panel_peak_rss_kib
        );
        for p in &self.pages {
            println!("panel page {}", p.line());
        }
        for c in &self.commands {
            println!("command {}", c.line());
        }
        println!(
            "goal: every page under {GOAL_P99_MS} ms at p99: {}",
            if self.within_goal() { "within" } else { "OVER" }
        );
    }
}
