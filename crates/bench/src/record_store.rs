//! A year of records and more (`--records`, a million by default) in the records' index, on
//! SQLite and on Redis (Debian's redis-server), side by side in one run with what earlier versions
//! did, a JSON file a record read whole by every command (at 100,000 files, in this process).
//!
//! Each backend's deployment gets the records written in batches (their jobs' ends spread over 400
//! days, outcomes mixed as in `--panel`), then:
//! - the commands an operator runs, each a whole process of the release binary: `runs` (the
//!   newest 50), `runs show ID`, and two filtered `runs`;
//! - the panel: the time from its start to its first answer, every page's latency (p99 over the
//!   requests), and its peak memory (`VmHWM`);
//! - `pi-dispatch prune`, a whole process, removing what is older than a year (about 35 days'
//!   worth of the records).

use std::path::Path;
use std::process::Command;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, ensure};
use records::record::Record;
use records::store::Records;
use serde_json::{Value, json};

use crate::panel::{Session, TOKEN, Timed, peak_rss_kib, record, start_panel};
use crate::stats::round3;

/// The goals the issue sets, in ms (and MiB for the panel's memory).
const GOAL_RUNS_MS: f64 = 20.0;
const GOAL_SHOW_MS: f64 = 10.0;
const GOAL_FILTERED_MS: f64 = 50.0;
const GOAL_PAGE_P99_MS: f64 = 50.0;
const GOAL_PANEL_MIB: f64 = 100.0;
const GOAL_FIRST_ANSWER_MS: f64 = 1000.0;
const GOAL_PRUNE_MS: f64 = 60_000.0;
/// The span the records' ends are spread over, in days.
const SPAN_DAYS: u64 = 400;
const DAY_MS: u64 = 86_400_000;

pub struct Options<'a> {
    pub bin: &'a Path,
    pub records: u32,
    pub baseline: u32,
    pub cli_runs: u32,
    pub requests: u32,
}

struct Backend {
    name: &'static str,
    write_ms: f64,
    commands: Vec<Timed>,
    pages: Vec<Timed>,
    first_answer_ms: f64,
    panel_rss_kib: u64,
    prune_ms: f64,
    pruned: u64,
}

struct Baseline {
    files: u32,
    newest_50: Timed,
    show: Timed,
}

pub struct Figures {
    records: u32,
    backends: Vec<Backend>,
    baseline: Baseline,
}

/// Record `n` of `total`, its job's end spread evenly over the last [`SPAN_DAYS`] days.
fn spread(n: u32, total: u32, now_ms: u64) -> Record {
    let mut r = record(n, now_ms);
    r.job_id = format!("cli-bench-{n:07}");
    let back = (u64::from(total - n) * SPAN_DAYS * DAY_MS) / u64::from(total.max(1));
    let shift = r.finished_at_ms - (now_ms - back);
    r.finished_at_ms -= shift;
    for t in [
        &mut r.queued_at_ms,
        &mut r.admitted_at_ms,
        &mut r.started_at_ms,
        &mut r.sandbox_up_at_ms,
    ] {
        *t = t.map(|t| t - shift);
    }
    for a in &mut r.activity {
        a.at_ms -= shift;
    }
    r
}

fn write_all(records: &Records, total: u32, now_ms: u64) -> anyhow::Result<f64> {
    let start = Instant::now();
    let mut batch = Vec::with_capacity(10_000);
    for n in 0..total {
        batch.push(spread(n, total, now_ms));
        if batch.len() == 10_000 || n + 1 == total {
            let stored = records.write_many(&batch)?;
            ensure!(stored == batch.len(), "a record was not stored");
            batch.clear();
        }
    }
    Ok(start.elapsed().as_secs_f64() * 1000.0)
}

/// `pi-dispatch ARGS` on the deployment `dir`, `runs` times after 3 warm-ups.
fn command(bin: &Path, dir: &Path, args: &[&str], runs: u32) -> anyhow::Result<Timed> {
    let mut ms = Vec::new();
    let mut bytes = 0;
    for i in 0..runs + 3 {
        let start = Instant::now();
        let output = Command::new(bin)
            .args(args)
            .arg("--dir")
            .arg(dir)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("NO_COLOR", "1")
            .output()?;
        let took = start.elapsed().as_secs_f64() * 1000.0;
        ensure!(
            output.status.success(),
            "pi-dispatch {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
        if i >= 3 {
            ms.push(took);
        }
        bytes = output.stdout.len();
    }
    Ok(Timed {
        what: format!("pi-dispatch {}", args.join(" ")),
        ms,
        bytes,
    })
}

/// The panel's first answer, its pages and its peak memory.
fn panel(
    options: &Options,
    dir: &Path,
    one: &str,
    one_ended: u64,
) -> anyhow::Result<(f64, Vec<Timed>, u64)> {
    let started = Instant::now();
    let (base, mut panel) = start_panel(options.bin, dir)?;
    let result = (|| {
        let session = Session::log_in(&base)?;
        let first_answer_ms = started.elapsed().as_secs_f64() * 1000.0;
        // Half-way down the list: the page after the record of the middle.
        let middle = format!("/runs?after={one_ended}-{one}");
        let run = format!("/runs/{one}");
        let pages = [
            ("/", "queue"),
            ("/runs", "runs"),
            (
                "/runs?outcome=failed&reason=agent-failed&trigger=cron&since=7d",
                "runs, filtered",
            ),
            (middle.as_str(), "runs, a page deep in the list"),
            (run.as_str(), "one run"),
            ("/metrics", "metrics"),
        ];
        let timed = session.time_pages(&pages, 10, options.requests)?;
        let metrics = session.text("/metrics")?;
        ensure!(
            metrics.contains(&format!(
                "pi_dispatch_jobs_total{{outcome=\"completed\",reason=\"none\"}} {}",
                (0..options.records).filter(|n| n % 10 <= 5).count()
            )),
            "the metrics do not count every record"
        );
        Ok((first_answer_ms, timed, peak_rss_kib(panel.id())?))
    })();
    let _ = panel.kill();
    let _ = panel.wait();
    result
}

fn backend(
    options: &Options,
    name: &'static str,
    env: &str,
    open: &dyn Fn(&Path) -> anyhow::Result<Records>,
) -> anyhow::Result<Backend> {
    let dir = tempfile::tempdir().context("cannot make a temporary folder")?;
    std::fs::write(
        dir.path().join(".env"),
        format!("PI_PANEL_TOKEN={TOKEN}\nPI_EGRESS=0\n{env}"),
    )?;
    let now_ms = u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis())?;
    let records = open(dir.path())?;
    let write_ms = write_all(&records, options.records, now_ms)?;
    drop(records);
    let one = format!("cli-bench-{:07}", options.records / 2);
    let d = dir.path();
    let runs = options.cli_runs;
    let commands = vec![
        command(options.bin, d, &["runs"], runs)?,
        command(options.bin, d, &["runs", "show", &one], runs)?,
        command(
            options.bin,
            d,
            &["runs", "--outcome", "failed", "--reason", "time-limit"],
            runs,
        )?,
        command(
            options.bin,
            d,
            &[
                "runs",
                "--trigger",
                "cron",
                "--since",
                "7d",
                "--reason",
                "none",
            ],
            runs,
        )?,
    ];
    let middle = spread(options.records / 2, options.records, now_ms).finished_at_ms;
    let (first_answer_ms, pages, panel_rss_kib) = panel(options, d, &one, middle)?;
    let before = open(d)?.count()?;
    let start = Instant::now();
    let output = Command::new(options.bin)
        .args(["prune", "--dir"])
        .arg(d)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .output()?;
    let prune_ms = start.elapsed().as_secs_f64() * 1000.0;
    ensure!(
        output.status.success(),
        "pi-dispatch prune: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let after = open(d)?.count()?;
    Ok(Backend {
        name,
        write_ms,
        commands,
        pages,
        first_answer_ms,
        panel_rss_kib,
        prune_ms,
        pruned: before - after,
    })
}

/// What earlier versions did: every record a file, read whole for the newest 50.
fn baseline(files: u32) -> anyhow::Result<Baseline> {
    let dir = tempfile::tempdir().context("cannot make a temporary folder")?;
    let now_ms = u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis())?;
    for n in 0..files {
        let r = spread(n, files, now_ms);
        let text = serde_json::to_string_pretty(&r)? + "\n";
        std::fs::write(dir.path().join(format!("{}.json", r.job_id)), text)?;
    }
    let read_all = || -> anyhow::Result<Vec<Record>> {
        let mut all = Vec::new();
        for entry in std::fs::read_dir(dir.path())? {
            let bytes = std::fs::read(entry?.path())?;
            all.push(serde_json::from_slice::<Record>(&bytes)?);
        }
        all.sort_by(|a, b| (b.finished_at_ms, &b.job_id).cmp(&(a.finished_at_ms, &a.job_id)));
        all.truncate(50);
        Ok(all)
    };
    read_all()?;
    let mut ms = Vec::new();
    for _ in 0..3 {
        let start = Instant::now();
        ensure!(read_all()?.len() == 50, "the newest 50 were not found");
        ms.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    let one = dir.path().join(format!("cli-bench-{:07}.json", files / 2));
    let mut show = Vec::new();
    for _ in 0..20 {
        let start = Instant::now();
        serde_json::from_slice::<Record>(&std::fs::read(&one)?)?;
        show.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(Baseline {
        files,
        newest_50: Timed {
            what: format!("every file read for the newest 50, in process ({files} files)"),
            ms,
            bytes: 0,
        },
        show: Timed {
            what: "one file read, in process".to_owned(),
            ms: show,
            bytes: 0,
        },
    })
}

pub fn measure(options: &Options) -> anyhow::Result<Figures> {
    let sqlite = backend(options, "sqlite", "", &|dir| {
        Ok(Records::sqlite(&queue::sqlite_path(dir))?)
    })?;
    let server = testkit::redis::RedisServer::start();
    let url = server.url();
    let redis = backend(options, "redis", &format!("PI_QUEUE={url}\n"), &|_| {
        let target = queue::RedisTarget {
            url: url.clone(),
            password: None,
        };
        Ok(Records::redis(std::sync::Arc::new(
            queue::RedisQueue::open(&target)?,
        )))
    })?;
    drop(server);
    Ok(Figures {
        records: options.records,
        backends: vec![sqlite, redis],
        baseline: baseline(options.baseline)?,
    })
}

impl Backend {
    fn median(&self, i: usize) -> f64 {
        let mut s = self.commands[i].ms.clone();
        s.sort_by(f64::total_cmp);
        crate::stats::percentile(&s, 50)
    }

    fn goals(&self) -> Vec<(&'static str, f64, f64)> {
        let worst_page = self.pages.iter().map(Timed::p99).fold(0.0, f64::max);
        vec![
            ("runs (newest 50), median ms", self.median(0), GOAL_RUNS_MS),
            ("runs show ID, median ms", self.median(1), GOAL_SHOW_MS),
            (
                "filtered runs, median ms (the slower)",
                self.median(2).max(self.median(3)),
                GOAL_FILTERED_MS,
            ),
            (
                "every panel page, p99 ms (the worst)",
                worst_page,
                GOAL_PAGE_P99_MS,
            ),
            (
                "panel peak RSS, MiB",
                self.panel_rss_kib as f64 / 1024.0,
                GOAL_PANEL_MIB,
            ),
            (
                "panel's first answer after its start, ms",
                self.first_answer_ms,
                GOAL_FIRST_ANSWER_MS,
            ),
            ("prune of a year, ms", self.prune_ms, GOAL_PRUNE_MS),
        ]
    }

    fn json(&self) -> Value {
        json!({
            "backend": self.name,
            "write_ms": round3(self.write_ms),
            "commands": self.commands.iter().map(Timed::json).collect::<Vec<_>>(),
            "pages": self.pages.iter().map(Timed::json).collect::<Vec<_>>(),
            "panel_first_answer_ms": round3(self.first_answer_ms),
            "panel_peak_rss_kib": self.panel_rss_kib,
            "prune_ms": round3(self.prune_ms),
            "pruned": self.pruned,
            "goals": self.goals().iter().map(|(what, got, goal)| json!({
                "what": what, "got": round3(*got), "goal": goal, "within": got <= goal,
            })).collect::<Vec<_>>(),
        })
    }

    fn print(&self, records: u32) {
        println!(
            "records on {}: {records} written in {:.1} s; panel first answer {:.0} ms, peak RSS {} KiB; prune removed {} in {:.1} s",
            self.name,
            self.write_ms / 1000.0,
            self.first_answer_ms,
            self.panel_rss_kib,
            self.pruned,
            self.prune_ms / 1000.0
        );
        for c in &self.commands {
            println!("records on {}: command {}", self.name, c.line());
        }
        for p in &self.pages {
            println!("records on {}: panel page {}", self.name, p.line());
        }
        for (what, got, goal) in self.goals() {
            println!(
                "records on {}: goal {what}: {got:.2} against {goal}: {}",
                self.name,
                if got <= goal { "within" } else { "OVER" }
            );
        }
    }
}

impl Figures {
    pub fn json(&self) -> Value {
        json!({
            "records": self.records,
            "backends": self.backends.iter().map(Backend::json).collect::<Vec<_>>(),
            "files_baseline": {
                "files": self.baseline.files,
                "newest_50": self.baseline.newest_50.json(),
                "show": self.baseline.show.json(),
            },
        })
    }

    pub fn print(&self) {
        for b in &self.backends {
            b.print(self.records);
        }
        println!(
            "records as files (earlier versions): {}",
            self.baseline.newest_50.line()
        );
        println!(
            "records as files (earlier versions): {}",
            self.baseline.show.line()
        );
    }
}
