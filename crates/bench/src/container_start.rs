//! `--containers`: what a job's start costs in a Podman container against bubblewrap, side by side.
//!
//! The same `JobSpec` (`/bin/true`, egress off, a temporary job folder, overlay, workspace and an
//! image folder holding the runner, whose `job-env` is the container's launcher) is started through
//! each backend's `Backend::start` as the worker starts a job, waited for, and ended, the two
//! backends taking turns one run at a time after a few untimed runs each. A run is timed from just
//! before `start` to the end of the wait (for Podman, the container removed too). The container's
//! system is the test base image (`testkit::podman_base_image`, from `scripts/install-tests`'s Debian root
//! filesystem), run with runc.
//!
//! Beside them, taking the same turns, is what a user would type instead: `podman run --rm` of the
//! same image and command, as the same user, with the same runtime, network, process, memory and
//! ulimit bounds, but without the job's folders mounted (so it is, if anything, the faster of the
//! two), timed from the spawn of `podman` to its exit.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use sandbox::backend::{Backend, Bubblewrap, JobSpec, Network};
use sandbox::bwrap::{self, Ending};
use sandbox::env::{JobEnv, Parts};
use sandbox::podman::{LAUNCHER, Limits, Podman};
use serde_json::{Value, json};

use crate::mcp_hub::Latency;

const BOUND: Duration = Duration::from_secs(60);

pub struct Options {
    pub runs: u32,
    pub warm_up: u32,
    /// The release runner, put in the image folder as the container's launcher.
    pub bin: PathBuf,
}

pub struct ContainerFigures {
    runs: u32,
    warm_up: u32,
    bubblewrap: Latency,
    podman: Latency,
    podman_run: Latency,
}

/// The most the backend's start may take, as a multiple of `podman run --rm`'s, at p50 (issue 32).
const GOAL_OVER_PODMAN_RUN: f64 = 1.05;

/// `podman run --rm` of the image and command the backend runs, with its bounds; how long it took.
fn podman_run(limits: &Limits) -> anyhow::Result<Duration> {
    let (nofile, nproc) = (limits.nofile, limits.nproc);
    let args = [
        "run".to_owned(),
        "--rm".to_owned(),
        "--runtime".to_owned(),
        "runc".to_owned(),
        "--network".to_owned(),
        "host".to_owned(),
        "--user".to_owned(),
        format!("{}:{}", bwrap::NOBODY, bwrap::NOBODY),
        "--pids-limit".to_owned(),
        limits.pids.to_string(),
        "--memory".to_owned(),
        format!("{}m", limits.memory_mib),
        "--ulimit".to_owned(),
        format!("nofile={nofile}:{nofile}"),
        "--ulimit".to_owned(),
        format!("nproc={nproc}:{nproc}"),
        testkit::podman_base_image(),
        "/bin/true".to_owned(),
    ];
    let start = Instant::now();
    let status = std::process::Command::new(config::settings::PODMAN)
        .args(&args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .status()
        .context("cannot run podman")?;
    let took = start.elapsed();
    ensure!(
        status.success(),
        "podman run --rm /bin/true failed: {status}"
    );
    Ok(took)
}

/// Starts `spec` through `backend`, waits for it and ends it; how long that took.
async fn once(backend: &dyn Backend, spec: &JobSpec, env: &JobEnv) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let mut job = backend.start(spec, env).await?;
    drop(job.stdin());
    let ending = job.wait_with_limit(BOUND).await?;
    let took = start.elapsed();
    ensure!(
        matches!(ending, Ending::Exited(s) if s.success()),
        "/bin/true did not succeed: {ending:?}"
    );
    Ok(took)
}

pub fn measure(options: &Options) -> anyhow::Result<ContainerFigures> {
    let root = tempfile::tempdir().context("cannot make a temporary folder")?;
    let dir = |name: &str| -> anyhow::Result<PathBuf> {
        let p = root.path().join(name);
        std::fs::create_dir_all(&p)?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))?;
        Ok(p)
    };
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755))?;
    let image = dir("image/bin")?;
    std::fs::copy(&options.bin, image.join("pi-dispatch"))
        .with_context(|| format!("cannot copy {}", options.bin.display()))?;
    let workspace = dir("workspace")?;
    std::os::unix::fs::chown(&workspace, Some(bwrap::NOBODY), Some(bwrap::NOBODY))?;
    let spec = JobSpec {
        job_dir: dir("job")?,
        overlay_dir: dir("overlay")?,
        image_dir: root.path().join("image"),
        image_name: "pi-job".into(),
        workspace,
        host_user: Some((bwrap::NOBODY, bwrap::NOBODY)),
        network: Network::Host,
        program: "/bin/true".into(),
        args: Vec::new(),
        nested: false,
        bounds: None,
    };
    let computed = vec![("PATH".to_owned(), "/usr/bin:/bin".to_owned())];
    let env = sandbox::env::build(
        &Parts {
            computed: &computed,
            ..Parts::new("bench-container", "/tmp")
        },
        &|_| None,
    )?;
    let bubblewrap = Bubblewrap {
        bwrap: Path::new(bwrap::BWRAP).to_owned(),
        limits: Vec::new(),
    };
    let podman = Podman {
        program: config::settings::PODMAN.into(),
        runtime: Some("runc".to_owned()),
        limits: Limits::within_own(),
        base_image: Some(testkit::podman_base_image()),
        launcher: LAUNCHER.iter().map(Into::into).collect(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (b, p, r) = runtime.block_on(async {
        for _ in 0..options.warm_up {
            once(&bubblewrap, &spec, &env).await?;
            once(&podman, &spec, &env).await?;
            podman_run(&podman.limits)?;
        }
        let (mut b, mut p, mut r) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..options.runs {
            b.push(once(&bubblewrap, &spec, &env).await?.as_secs_f64() * 1e3);
            p.push(once(&podman, &spec, &env).await?.as_secs_f64() * 1e3);
            r.push(podman_run(&podman.limits)?.as_secs_f64() * 1e3);
        }
        Ok::<_, anyhow::Error>((b, p, r))
    })?;
    Ok(ContainerFigures {
        runs: options.runs,
        warm_up: options.warm_up,
        bubblewrap: Latency::of(b),
        podman: Latency::of(p),
        podman_run: Latency::of(r),
    })
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

impl ContainerFigures {
    pub fn json(&self) -> Value {
        let side = |l: &Latency| json!({"min_ms": round2(l.min), "p50_ms": round2(l.p50), "p99_ms": round2(l.p99)});
        json!({
            "runs": self.runs,
            "warm_up": self.warm_up,
            "bubblewrap": side(&self.bubblewrap),
            "podman": side(&self.podman),
            "podman_run_rm": side(&self.podman_run),
            "podman_added_p50_ms": round2(self.podman.p50 - self.bubblewrap.p50),
            "podman_over_run_rm_p50": round2(self.podman.p50 / self.podman_run.p50),
            "goal_over_run_rm": GOAL_OVER_PODMAN_RUN,
            "within_goal": self.podman.p50 <= GOAL_OVER_PODMAN_RUN * self.podman_run.p50,
        })
    }

    pub fn print(&self) {
        println!(
            "containers, /bin/true as a job, {} runs each after {} warm-ups, taking turns: bubblewrap p50 {:.2} ms, p99 {:.2} ms; podman (runc) p50 {:.2} ms, p99 {:.2} ms; podman adds {:.2} ms at p50; podman run --rm p50 {:.2} ms, p99 {:.2} ms (the backend {:.2}x of it; goal at most {GOAL_OVER_PODMAN_RUN}x)",
            self.runs,
            self.warm_up,
            self.bubblewrap.p50,
            self.bubblewrap.p99,
            self.podman.p50,
            self.podman.p99,
            self.podman.p50 - self.bubblewrap.p50,
            self.podman_run.p50,
            self.podman_run.p99,
            self.podman.p50 / self.podman_run.p50
        );
    }
}
