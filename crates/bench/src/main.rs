//! `pi-dispatch-bench`: how long `pi-dispatch mcp check` takes on a large overlay.
//!
//! It writes an overlay of 500 valid servers to a temporary folder, then measures two things:
//! - the whole process: the release binary run as `mcp check --overlay DIR --json`, wall-clock per
//!   run, and the peak resident memory of those children (`getrusage(RUSAGE_CHILDREN)`);
//! - the parse alone: `config::mcp::parse_overlay` on the same bytes in this process, and this
//!   process's own peak resident memory (`VmHWM`).
//!
//! On Linux a child's peak memory starts from its spawner's peak at exec (the kernel records the
//! spawner's memory as the child's before replacing it), so the children are spawned by a fresh,
//! small copy of this program (`--process-runner`), and that copy's own peak is reported beside
//! theirs as the floor of the figure.
//!
//! The goal is a process median under 50 ms.
//!
//! It also times the pickup decision (`pickup::admission::decide`) in process: a github job naming 8
//! servers of a 200-server overlay, with egress on, every file and label read from memory. Each
//! decision parses the overlay bytes, as the worker does for every job. The goal is a median under
//! 1 ms.
//!
//! With `--hub` it also measures the job's MCP hub against real servers from the workspace's
//! `node_modules` (see [`mcp_hub`]): the latency the hub adds to a tool call, the time to ready of 8
//! servers against the official TypeScript SDK client, and the runner's memory with 8 servers
//! served.
//!
//! With `--queue` it also measures the worker's job queue (see [`queue`]): 1,000 jobs enqueued, then
//! drained by worker threads, each finished exactly once.
//!
//! With `--sandbox` it also measures what the job's sandbox adds to a process's start (see
//! [`sandbox_start`]): `/bin/true`, and Node's `-e 0`, bare and through bubblewrap.
//!
//! With `--egress` it also measures the egress proxy's tunnels (see [`egress_proxy`]): throughput and
//! connect latency beside a raw loopback connection and a squid with the same rule.
//!
//! With `--containers` it also sets a job's start in a Podman container beside bubblewrap's (see
//! [`container_start`]).
//!
//! With `--queues` it also sets the queue's backends side by side (see [`queues`]): SQLite and
//! Redis, enqueue and drain with 1, 2 and 4 workers.
//!
//! With `--webhooks` it also loads the receiver (see [`webhooks`]): signed GitHub webhooks at a
//! fixed rate, and every delivery queued exactly once.
//!
//! With `--panel` it also measures the panel's pages over 10,000 records (see [`panel`]), beside
//! the CLI commands that show the same.
//!
//! With `--records` it also measures the records' index at a million records on SQLite and on
//! Redis (see [`record_store`]): the commands, the panel's pages and memory, and a prune of a
//! year, beside reading a file per record as earlier versions did.
//!
//! `--pins` measures only what holding a server to its pin adds to a job's time to ready and to a
//! tool call through the hub (see [`pins`]): a server of 50 and of 256 tools, pinned and not.
//!
//! `--egress-off` measures only a job's start with egress off: on the host's network, as it was,
//! and on a network of its own through slirp4netns, as it is (see
//! [`sandbox_start::measure_egress_off`]).

mod container_start;
mod egress_proxy;
mod job;
mod listening;
mod mcp_hub;
mod panel;
mod pi_calls;
mod pins;
mod queue;
mod queues;
mod record_store;
mod sandbox_start;
mod stats;
mod syscalls;
mod webhooks;

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use clap::Parser;
use nix::sys::resource::{UsageWho, getrusage};
use pickup::admission::{self as gates, Decision, Folder, Host, Image, Read};
use protocol::job::Job;
use serde_json::{Map, Value, json};

/// The number of servers in the generated overlay.
const SERVERS: usize = 500;
/// Runs of the binary before the timed ones, to warm the page cache.
const WARM_UP_RUNS: u32 = 3;
/// The whole-process median the command should stay under.
const GOAL_MS: f64 = 50.0;
/// The number of servers in the pickup measurement's overlay.
const PICKUP_SERVERS: usize = 200;
/// How many of them the pickup job names (all overlay servers; the job does not name `forge`).
const PICKUP_NAMED: usize = 8;
/// The median a pickup decision should stay under, µs.
const PICKUP_GOAL_US: u32 = 1000;

/// Measures `pi-dispatch mcp check` on a generated overlay of 500 servers.
#[derive(Debug, Parser)]
#[command(name = "pi-dispatch-bench", about)]
struct Args {
    /// Timed runs of the binary (after 3 warm-up runs).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    /// Timed calls of `parse_overlay` in this process.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
    iterations: u32,
    /// Timed admission decisions (`pickup::admission::decide`) in this process.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(1..))]
    pickup_iterations: u32,
    /// The pi-dispatch binary [default: target/release/pi-dispatch in the workspace]
    #[arg(long, value_name = "PATH")]
    bin: Option<PathBuf>,
    /// Print the figures as one JSON object.
    #[arg(long)]
    json: bool,
    /// Also measure the MCP hub against real servers (needs the workspace's node_modules; about
    /// a minute).
    #[arg(long)]
    hub: bool,
    /// Timed `echo` calls through the hub and directly, each, per upstream (after the warm-up).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(1..))]
    hub_calls: u32,
    /// Untimed `echo` calls of each kind before the timed ones.
    #[arg(long, default_value_t = 100)]
    hub_warm_up: u32,
    /// Timed starts of 8 servers, by the runner and by the TypeScript SDK each (after one warm-up).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    hub_ready_runs: u32,
    /// The folder holding Node, server-everything and the TypeScript SDK [default: node_modules in
    /// the workspace]
    #[arg(long, value_name = "DIR")]
    node_modules: Option<PathBuf>,
    /// Also measure the worker's job queue: enqueue jobs, then drain them with worker threads.
    #[arg(long)]
    queue: bool,
    /// Jobs the queue measurement enqueues and drains.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    queue_jobs: u32,
    /// Worker threads draining the queue, each with its own handle on the file.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    queue_workers: u32,
    /// Measure only what the job's system-call filters add to a program's start (`/bin/true` and
    /// `node -e 0`, filtered and not), then stop.
    #[arg(long)]
    syscalls: bool,
    /// Measure only what holding a server to its pin adds to a job's time to ready and to a tool
    /// call through the hub (servers of 50 and 256 tools, pinned and not), then stop (needs the
    /// workspace's node_modules).
    #[arg(long)]
    pins: bool,
    /// Timed starts of each way, per size, in the pins measurement (after one untimed start).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pins_runs: u32,
    /// Timed `echo` calls of each kind, per size, in the pins measurement (after the warm-up).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(1..))]
    pins_calls: u32,
    /// Untimed `echo` calls of each kind before the timed ones, in the pins measurement.
    #[arg(long, default_value_t = 100)]
    pins_warm_up: u32,
    /// Measure only a job's start with egress off, on the host's network as it was and on a
    /// network of its own through slirp4netns as it is, then stop (root only).
    #[arg(long)]
    egress_off: bool,
    /// Timed runs of each side of the egress-off measurement.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    egress_off_runs: u32,
    /// Timed runs of each side of the filters' measurement (after as many untimed as
    /// `--sandbox-warm-up`).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    syscalls_runs: u32,
    /// The filters' measurement's child: start the program after `--` (with the filters when
    /// `--syscalls-filtered`).
    #[arg(long, hide = true)]
    syscalls_child: bool,
    #[arg(long, hide = true)]
    syscalls_filtered: bool,
    #[arg(last = true, hide = true)]
    program: Vec<std::ffi::OsString>,
    /// Also measure the sandbox's start: `/bin/true` and `node -e 0`, bare and in bubblewrap.
    #[arg(long)]
    sandbox: bool,
    /// Timed runs of each program, bare and sandboxed each (after the warm-up).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    sandbox_runs: u32,
    /// Untimed runs of each kind before the timed ones.
    #[arg(long, default_value_t = 5)]
    sandbox_warm_up: u32,
    /// Also measure the egress proxy: tunnel throughput and connect latency, beside a raw loopback
    /// connection and squid (Debian's package; left out, and said so, when it is missing).
    #[arg(long)]
    egress: bool,
    /// Bytes one egress throughput run carries one way.
    #[arg(long, default_value_t = 1 << 30, value_parser = clap::value_parser!(u64).range(1..))]
    egress_bytes: u64,
    /// Timed throughput runs per way.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    egress_runs: u32,
    /// Timed connects per way (after the warm-up).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(1..))]
    egress_connects: u32,
    /// Untimed connects per way before the timed ones.
    #[arg(long, default_value_t = 100)]
    egress_warm_up: u32,
    /// The squid program the egress measurement compares with.
    #[arg(long, value_name = "PATH", default_value = egress_proxy::SQUID)]
    squid: PathBuf,
    /// Also measure the demo job through the worker, with and without the separation inside the
    /// job (needs the workspace's node_modules and bubblewrap; about a minute).
    #[arg(long)]
    job: bool,
    /// Timed jobs of each side (after one untimed job each).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    job_runs: u32,
    /// Also measure a tool call as pi sees it: pi's own MCP client calling server-everything
    /// directly over stdio, through the relay a job's pi starts, and over the hub's HTTP (needs
    /// the workspace's node_modules).
    #[arg(long)]
    pi_calls: bool,
    /// Timed calls per way (after the warm-up).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(1..))]
    pi_calls_count: u32,
    /// Untimed rounds before the timed ones.
    #[arg(long, default_value_t = 200)]
    pi_calls_warm_up: u32,
    /// Also set a job's start in a Podman container beside bubblewrap's (needs podman and the
    /// tests' base image from scripts/install-tests).
    #[arg(long)]
    containers: bool,
    /// Timed starts of each backend (after 3 warm-ups each).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..))]
    containers_runs: u32,
    /// Also set the queue's backends side by side: SQLite and Redis (Debian's redis-server), with
    /// 1, 2 and 4 workers.
    #[arg(long)]
    queues: bool,
    /// Jobs each backend enqueues and drains with the no-op runner.
    #[arg(long, default_value_t = 3000, value_parser = clap::value_parser!(u32).range(1..))]
    queues_jobs: u32,
    /// Jobs each backend drains with the runner that holds a job 5 ms.
    #[arg(long, default_value_t = 800, value_parser = clap::value_parser!(u32).range(1..))]
    queues_held_jobs: u32,
    /// Also load the webhook receiver: signed GitHub deliveries at --webhooks-rate a second for
    /// --webhooks-seconds, each queued exactly once.
    #[arg(long)]
    webhooks: bool,
    /// Webhooks a second.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
    webhooks_rate: u32,
    /// Seconds of load.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..))]
    webhooks_seconds: u32,
    /// Also measure the panel: its pages over --panel-records records, beside the CLI.
    #[arg(long)]
    panel: bool,
    /// Records in the panel's deployment.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    panel_records: u32,
    /// Requests to each page.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..))]
    panel_requests: u32,
    /// Runs of each CLI command beside them.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    panel_cli_runs: u32,
    /// Also measure the records' index at --records-count records on SQLite and on Redis: the
    /// commands, the panel and prune, beside reading a file per record.
    #[arg(long)]
    records: bool,
    /// Records in each backend's deployment.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u32).range(1..))]
    records_count: u32,
    /// Record files read the way earlier versions read them, for the comparison.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u32).range(2..))]
    records_files: u32,
    /// Internal: run the binary on the overlay in DIR and print the process figures as JSON.
    #[arg(long, value_name = "DIR", hide = true)]
    process_runner: Option<PathBuf>,
    /// Internal: hold 8 servers and the hub serving them, and report this process's memory.
    #[arg(long, hide = true)]
    hub_memory_runner: bool,
}

/// What the process runner measured.
struct ProcessFigures {
    ms: Vec<f64>,
    /// The children's peak resident memory, KiB.
    children_rss_kib: u64,
    /// The runner's own peak when it spawned them, KiB: the children's figure is never below it.
    runner_rss_kib: u64,
}

/// `--syscalls`: the filters' measurement alone, printed or as JSON.
fn syscall_figures(args: &Args, node_modules: &Path) -> anyhow::Result<()> {
    let mut figures = vec![syscalls::measure(
        &["/bin/true"],
        args.syscalls_runs,
        args.sandbox_warm_up,
    )?];
    if let Some(node) = syscalls::node(node_modules) {
        figures.push(syscalls::measure(
            &[&node, "-e", "0"],
            args.syscalls_runs,
            args.sandbox_warm_up,
        )?);
    }
    if args.json {
        let all: Vec<Value> = figures.iter().map(syscalls::SyscallFigures::json).collect();
        println!("{}", json!({ "syscalls": all }));
    } else {
        figures.iter().for_each(syscalls::SyscallFigures::print);
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(&Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pi-dispatch-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> anyhow::Result<()> {
    let node_modules = match &args.node_modules {
        Some(dir) => dir.clone(),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../node_modules"),
    };
    if args.hub_memory_runner {
        return mcp_hub::memory_runner(&node_modules);
    }
    if args.syscalls_child {
        return syscalls::child(args.syscalls_filtered, &args.program);
    }
    if args.syscalls {
        return syscall_figures(args, &node_modules);
    }
    if args.pins {
        let figures = pins::measure(&pins::Options {
            node_modules,
            runs: args.pins_runs,
            calls: args.pins_calls,
            warm_up: args.pins_warm_up,
        })?;
        if args.json {
            println!("{}", json!({ "pins": figures.json() }));
        } else {
            figures.print();
        }
        return Ok(());
    }
    if args.egress_off {
        let figures =
            sandbox_start::measure_egress_off(args.egress_off_runs, args.sandbox_warm_up)?;
        if args.json {
            println!("{}", json!({ "egress_off": figures.json() }));
        } else {
            figures.print();
        }
        return Ok(());
    }
    let bin = match &args.bin {
        Some(path) => path.clone(),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/release/pi-dispatch"),
    };
    if !bin.is_file() {
        bail!(
            "{} does not exist: run `cargo build --release -p pi-dispatch` first (or pass --bin PATH)",
            bin.display()
        );
    }
    let bin = bin.canonicalize().unwrap_or(bin);
    if let Some(dir) = &args.process_runner {
        let figures = measure_process(&bin, dir, args.runs)?;
        let out = json!({
            "ms": figures.ms,
            "children_rss_kib": figures.children_rss_kib,
            "runner_rss_kib": figures.runner_rss_kib,
        });
        println!("{out}");
        return Ok(());
    }

    let text = overlay_json()?;
    let bytes = text.as_bytes();
    let overlay =
        config::mcp::parse_overlay(bytes).context("the generated overlay is unreadable")?;
    ensure!(
        overlay.servers.len() == SERVERS && overlay.all_valid(),
        "the generated overlay must hold {SERVERS} valid servers (it holds {}, all valid: {})",
        overlay.servers.len(),
        overlay.all_valid()
    );
    drop(overlay);

    let dir = tempfile::tempdir().context("cannot make a temporary folder")?;
    std::fs::write(dir.path().join("mcp.json"), bytes).context("cannot write mcp.json")?;
    let figures = process_in_runner(&bin, dir.path(), args.runs)?;

    let mut parse_us = Vec::new();
    for _ in 0..args.iterations {
        let start = Instant::now();
        let overlay = config::mcp::parse_overlay(black_box(bytes));
        let elapsed = start.elapsed();
        black_box(overlay).context("the overlay stopped parsing")?;
        parse_us.push(elapsed.as_secs_f64() * 1e6);
    }
    let parse_rss_kib = own_peak_rss_kib()?;

    let pickup = Summary::of(time_pickup(args.pickup_iterations)?);
    let pickup_within_goal = pickup.median < f64::from(PICKUP_GOAL_US);

    let hub = if args.hub {
        Some(mcp_hub::measure(&mcp_hub::Options {
            node_modules: node_modules.clone(),
            calls: args.hub_calls,
            warm_up: args.hub_warm_up,
            ready_runs: args.hub_ready_runs,
        })?)
    } else {
        None
    };

    let queue = if args.queue {
        let jobs = queue_jobs(args.queue_jobs)?;
        Some((
            queue::measure(&jobs, args.queue_workers)?,
            queue::measure_service(&jobs, args.queue_workers)?,
        ))
    } else {
        None
    };

    let job = if args.job {
        Some(job::measure(&job::Options {
            bin: bin.clone(),
            node_modules: node_modules.clone(),
            runs: args.job_runs,
        })?)
    } else {
        None
    };

    let pi_calls = if args.pi_calls {
        Some(pi_calls::measure(&pi_calls::Options {
            bin: bin.clone(),
            node_modules: node_modules.clone(),
            calls: args.pi_calls_count,
            warm_up: args.pi_calls_warm_up,
        })?)
    } else {
        None
    };

    let sandbox = if args.sandbox {
        Some(sandbox_start::measure(&sandbox_start::Options {
            runs: args.sandbox_runs,
            warm_up: args.sandbox_warm_up,
            node_modules,
        })?)
    } else {
        None
    };

    let egress = if args.egress {
        Some(egress_proxy::measure(&egress_proxy::Options {
            bytes: args.egress_bytes,
            runs: args.egress_runs,
            connects: args.egress_connects,
            warm_up: args.egress_warm_up,
            squid: args.squid.clone(),
        })?)
    } else {
        None
    };

    let containers = if args.containers {
        Some(container_start::measure(&container_start::Options {
            runs: args.containers_runs,
            warm_up: 3,
            bin: bin.clone(),
        })?)
    } else {
        None
    };

    let queues = if args.queues {
        let jobs = queue_jobs(args.queues_jobs.max(args.queues_held_jobs))?;
        Some(queues::measure(
            &jobs[..usize::try_from(args.queues_jobs)?],
            usize::try_from(args.queues_held_jobs)?,
        )?)
    } else {
        None
    };

    let webhooks = if args.webhooks {
        Some(webhooks::measure(&webhooks::Options {
            bin: &bin,
            rate: args.webhooks_rate,
            seconds: args.webhooks_seconds,
        })?)
    } else {
        None
    };

    let panel = if args.panel {
        Some(panel::measure(&panel::Options {
            bin: &bin,
            records: args.panel_records,
            requests: args.panel_requests,
            cli_runs: args.panel_cli_runs,
        })?)
    } else {
        None
    };

    let records = if args.records {
        Some(record_store::measure(&record_store::Options {
            bin: &bin,
            records: args.records_count,
            baseline: args.records_files,
            cli_runs: args.panel_cli_runs,
            requests: args.panel_requests.min(200),
        })?)
    } else {
        None
    };

    let process = Summary::of(figures.ms);
    let parse = Summary::of(parse_us);
    let within_goal = process.median < GOAL_MS;
    if args.json {
        let mut report = json!({
            "servers": SERVERS,
            "file_bytes": bytes.len(),
            "process": {
                "runs": args.runs,
                "min_ms": round(process.min, 3),
                "median_ms": round(process.median, 3),
                "p95_ms": round(process.p95, 3),
                "max_ms": round(process.max, 3),
                "max_rss_kib": figures.children_rss_kib,
                "spawner_rss_kib": figures.runner_rss_kib,
            },
            "parse": {
                "iterations": args.iterations,
                "min_us": round(parse.min, 1),
                "median_us": round(parse.median, 1),
                "p95_us": round(parse.p95, 1),
                "max_rss_kib": parse_rss_kib,
            },
            "goal_ms": GOAL_MS,
            "within_goal": within_goal,
            "pickup": {
                "servers": PICKUP_SERVERS,
                "named": PICKUP_NAMED,
                "iterations": args.pickup_iterations,
                "min_us": round(pickup.min, 1),
                "median_us": round(pickup.median, 1),
                "p95_us": round(pickup.p95, 1),
                "goal_us": PICKUP_GOAL_US,
                "within_goal": pickup_within_goal,
            },
        });
        if let (Some(hub), Some(object)) = (&hub, report.as_object_mut()) {
            object.insert("hub".to_owned(), hub.json());
        }
        if let (Some((queue, service)), Some(object)) = (&queue, report.as_object_mut()) {
            let mut figures = queue.json();
            if let Some(f) = figures.as_object_mut() {
                f.insert("worker_loop".to_owned(), service.json());
            }
            object.insert("queue".to_owned(), figures);
        }
        if let (Some(sandbox), Some(object)) = (&sandbox, report.as_object_mut()) {
            object.insert("sandbox".to_owned(), sandbox.json());
        }
        if let (Some(egress), Some(object)) = (&egress, report.as_object_mut()) {
            object.insert("egress".to_owned(), egress.json());
        }
        if let (Some(job), Some(object)) = (&job, report.as_object_mut()) {
            object.insert("job".to_owned(), job.json());
        }
        if let (Some(calls), Some(object)) = (&pi_calls, report.as_object_mut()) {
            object.insert("pi_calls".to_owned(), calls.json());
        }
        if let (Some(containers), Some(object)) = (&containers, report.as_object_mut()) {
            object.insert("containers".to_owned(), containers.json());
        }
        if let (Some(queues), Some(object)) = (&queues, report.as_object_mut()) {
            object.insert("queues".to_owned(), queues.json());
        }
        if let (Some(webhooks), Some(object)) = (&webhooks, report.as_object_mut()) {
            object.insert("webhooks".to_owned(), webhooks.json());
        }
        if let (Some(panel), Some(object)) = (&panel, report.as_object_mut()) {
            object.insert("panel".to_owned(), panel.json());
        }
        if let (Some(records), Some(object)) = (&records, report.as_object_mut()) {
            object.insert("records".to_owned(), records.json());
        }
        println!("{report}");
    } else {
        println!(
            "overlay: {SERVERS} servers, {} bytes, all valid",
            bytes.len()
        );
        println!(
            "process: {} mcp check --json, {} runs after {WARM_UP_RUNS} warm-ups: min {:.2} ms, median {:.2} ms, p95 {:.2} ms, max {:.2} ms",
            bin.display(),
            args.runs,
            process.min,
            process.median,
            process.p95,
            process.max
        );
        println!(
            "process: peak RSS of the children {} KiB (their spawner's own peak was {} KiB)",
            figures.children_rss_kib, figures.runner_rss_kib
        );
        println!(
            "parse: parse_overlay, {} iterations: min {:.1} µs, median {:.1} µs, p95 {:.1} µs; bench peak RSS {parse_rss_kib} KiB",
            args.iterations, parse.min, parse.median, parse.p95
        );
        println!(
            "goal: process median {:.2} ms against {GOAL_MS} ms: {}",
            process.median,
            if within_goal { "within" } else { "OVER" }
        );
        println!(
            "pickup: gates::decide, a github job naming {PICKUP_NAMED} of {PICKUP_SERVERS} overlay servers (no forge), egress on, {} iterations: min {:.1} µs, median {:.1} µs, p95 {:.1} µs; goal median under {PICKUP_GOAL_US} µs: {}",
            args.pickup_iterations,
            pickup.min,
            pickup.median,
            pickup.p95,
            if pickup_within_goal { "within" } else { "OVER" }
        );
        if let Some(hub) = &hub {
            hub.print();
        }
        if let Some((queue, service)) = &queue {
            queue.print();
            service.print();
        }
        if let Some(sandbox) = &sandbox {
            sandbox.print();
        }
        if let Some(egress) = &egress {
            egress.print();
        }
        if let Some(job) = &job {
            job.print();
        }
        if let Some(calls) = &pi_calls {
            calls.print();
        }
        if let Some(containers) = &containers {
            containers.print();
        }
        if let Some(queues) = &queues {
            queues.print();
        }
        if let Some(webhooks) = &webhooks {
            webhooks.print();
        }
        if let Some(panel) = &panel {
            panel.print();
        }
        if let Some(records) = &records {
            records.print();
        }
    }
    Ok(())
}

/// Runs the process measurement in a fresh copy of this program, whose memory is still small.
fn process_in_runner(bin: &Path, overlay: &Path, runs: u32) -> anyhow::Result<ProcessFigures> {
    let me = std::env::current_exe().context("cannot find this program's own path")?;
    let output = Command::new(&me)
        .arg("--process-runner")
        .arg(overlay)
        .arg("--bin")
        .arg(bin)
        .arg("--runs")
        .arg(runs.to_string())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", me.display()))?;
    ensure!(
        output.status.success(),
        "the process measurement failed ({}); see above",
        output.status
    );
    let out: Value = serde_json::from_slice(&output.stdout)
        .context("the process runner did not print its figures")?;
    let ms = out["ms"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect::<Vec<_>>())
        .unwrap_or_default();
    ensure!(
        ms.len() == usize::try_from(runs)?,
        "the process runner timed {} runs, not {runs}",
        ms.len()
    );
    let kib = |key: &str| {
        out[key]
            .as_u64()
            .with_context(|| format!("the process runner gave no {key}"))
    };
    Ok(ProcessFigures {
        ms,
        children_rss_kib: kib("children_rss_kib")?,
        runner_rss_kib: kib("runner_rss_kib")?,
    })
}

/// Checks the overlay in `dir` once, warms up, then times `runs` runs of the binary.
fn measure_process(bin: &Path, dir: &Path, runs: u32) -> anyhow::Result<ProcessFigures> {
    check_all_valid(bin, dir)?;
    for _ in 0..WARM_UP_RUNS {
        run_once(bin, dir)?;
    }
    let mut ms = Vec::new();
    for _ in 0..runs {
        ms.push(run_once(bin, dir)?.as_secs_f64() * 1e3);
    }
    let runner_rss_kib = own_peak_rss_kib()?;
    let children_rss_kib = getrusage(UsageWho::RUSAGE_CHILDREN)
        .context("getrusage(RUSAGE_CHILDREN) failed")?
        .max_rss();
    Ok(ProcessFigures {
        ms,
        children_rss_kib: u64::try_from(children_rss_kib)?,
        runner_rss_kib,
    })
}

/// Runs the check once with its output kept, and fails loudly unless it exits 0 with every server.
fn check_all_valid(bin: &Path, overlay: &Path) -> anyhow::Result<()> {
    let output = check_command(bin, overlay)
        .output()
        .with_context(|| format!("cannot run {}", bin.display()))?;
    if !output.status.success() {
        bail!(
            "`pi-dispatch mcp check` refused the generated overlay ({}); every server must be valid\n--- stdout ---\n{}\n--- stderr ---\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let report: Value = serde_json::from_slice(&output.stdout)
        .context("`pi-dispatch mcp check --json` did not print JSON")?;
    let servers = report["servers"].as_array().map_or(0, Vec::len);
    ensure!(
        servers == SERVERS,
        "`pi-dispatch mcp check` reported {servers} servers, not {SERVERS}"
    );
    Ok(())
}

/// One run of the check with its output thrown away: the wall-clock time from spawn to exit.
fn run_once(bin: &Path, overlay: &Path) -> anyhow::Result<Duration> {
    let mut command = check_command(bin, overlay);
    command.stdout(Stdio::null()).stderr(Stdio::null());
    let start = Instant::now();
    let status = command
        .status()
        .with_context(|| format!("cannot run {}", bin.display()))?;
    let elapsed = start.elapsed();
    ensure!(
        status.success(),
        "`pi-dispatch mcp check` exited with {status}"
    );
    Ok(elapsed)
}

fn check_command(bin: &Path, overlay: &Path) -> Command {
    let mut command = Command::new(bin);
    command
        .args(["mcp", "check", "--json", "--overlay"])
        .arg(overlay)
        .current_dir(overlay)
        .stdin(Stdio::null());
    command
}

/// This process's peak resident memory so far, `VmHWM` in KiB.
fn own_peak_rss_kib() -> anyhow::Result<u64> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("cannot read /proc/self/status")?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|n| n.trim().parse().ok())
        .context("/proc/self/status has no VmHWM line")
}

/// Min, median, 95th percentile (nearest rank) and max of some samples.
struct Summary {
    min: f64,
    median: f64,
    p95: f64,
    max: f64,
}

impl Summary {
    /// `samples` must not be empty (the flags ask for at least one).
    fn of(mut samples: Vec<f64>) -> Summary {
        samples.sort_by(f64::total_cmp);
        let n = samples.len();
        let at = |i: usize| {
            samples
                .get(i.min(n.saturating_sub(1)))
                .copied()
                .unwrap_or(0.0)
        };
        let median = if n % 2 == 1 {
            at(n / 2)
        } else {
            (at(n / 2 - 1) + at(n / 2)) / 2.0
        };
        Summary {
            min: at(0),
            median,
            p95: at((n * 95).div_ceil(100).saturating_sub(1)),
            max: at(n.saturating_sub(1)),
        }
    }
}

fn round(x: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (x * scale).round() / scale
}

/// What the generated servers are named after; none holds `dispatch` or is `forge`.
const SERVICES: [&str; 25] = [
    "github",
    "gitlab",
    "jira",
    "linear",
    "sentry",
    "datadog",
    "grafana",
    "postgres",
    "mysql",
    "redis",
    "slack",
    "notion",
    "confluence",
    "docs",
    "search",
    "files",
    "browser",
    "kubernetes",
    "terraform",
    "aws",
    "gcp",
    "stripe",
    "figma",
    "pagerduty",
    "snowflake",
];

const EXPOSURES: [&str; 4] = ["codemode", "deferred", "direct", "hidden"];

/// The overlay's `mcp.json` with [`SERVERS`] servers, every one valid: even ones streamable HTTP
/// (headers, references in path and query), odd ones stdio (args, env, some `toolExposure`), and a
/// handful turned off.
fn overlay_json() -> anyhow::Result<String> {
    let mut servers = Map::new();
    for i in 0..SERVERS {
        let service = SERVICES[i % SERVICES.len()];
        let var = service.to_ascii_uppercase();
        let k = i / 2;
        let mut entry = if i.is_multiple_of(2) {
            http_entry(service, &var, k)
        } else {
            stdio_entry(service, &var, k)
        };
        entry.insert(
            "description".into(),
            json!(format!(
                "{service} tools for the team's {} work, server {i} of the shared overlay",
                ["review", "triage", "release", "research"][k % 4]
            )),
        );
        entry.insert("exposure".into(), json!(EXPOSURES[i % EXPOSURES.len()]));
        if k.is_multiple_of(4) {
            entry.insert("timeout".into(), json!(10 + k % 120));
        }
        if i % 97 == 13 {
            entry.insert("enabled".into(), json!(false));
        }
        servers.insert(format!("{service}-{i:03}"), Value::Object(entry));
    }
    let overlay = json!({ "codemodeModels": true, "mcpServers": servers });
    Ok(serde_json::to_string_pretty(&overlay)?)
}

fn http_entry(service: &str, var: &str, k: usize) -> Map<String, Value> {
    let url = match k % 4 {
        0 => format!("https://mcp.{service}.example.com/mcp"),
        1 => format!("https://{service}.example.net:8443/v1/mcp?tenant=${{{var}_TENANT}}"),
        2 => format!(
            "https://api.example.org/{service}/orgs/${{{var}_ORG}}/mcp?region=${{{var}_REGION}}&project=${{{var}_PROJECT}}"
        ),
        _ => format!("http://mcp-{service}.internal:8080/mcp"),
    };
    let headers = match k % 3 {
        0 => json!({ "Authorization": format!("Bearer ${{{var}_TOKEN}}") }),
        1 => json!({
            "Authorization": format!("ApiKey ${{{var}_API_KEY}}"),
            "X-Tenant": format!("${{{var}_TENANT}}"),
        }),
        _ => json!({ "X-Api-Key": format!("${{{var}_API_KEY}}") }),
    };
    let mut entry = Map::new();
    entry.insert("url".into(), json!(url));
    entry.insert("headers".into(), headers);
    match k % 5 {
        0 => {
            entry.insert("type".into(), json!("streamable-http"));
        }
        1 => {
            entry.insert("type".into(), json!("http"));
        }
        _ => {}
    }
    if k.is_multiple_of(6) {
        entry.insert(
            "toolExposure".into(),
            json!({ "search": "direct", "get_*": "codemode" }),
        );
    }
    entry
}

fn stdio_entry(service: &str, var: &str, k: usize) -> Map<String, Value> {
    let (command, args) = match k % 5 {
        0 => (
            format!("/opt/pi-global/mcp/{service}-server"),
            json!(["--root", "/workspace", format!("--token=${{{var}_TOKEN}}")]),
        ),
        1 => (
            "node".to_owned(),
            json!([format!("/app/mcp/{service}/dist/index.js"), "--stdio"]),
        ),
        2 => (
            "python3".to_owned(),
            json!(["-m", format!("{service}_mcp"), "--workspace", "/workspace"]),
        ),
        3 => (
            format!("/usr/local/bin/{service}-mcp"),
            json!([
                "serve",
                "--config",
                format!("/opt/pi-global/mcp/{service}.toml"),
                format!("--org=${{{var}_ORG}}"),
            ]),
        ),
        _ => (
            format!("/opt/pi-global/bin/{service}-mcp"),
            json!(["--read-only"]),
        ),
    };
    let mut entry = Map::new();
    entry.insert("command".into(), json!(command));
    entry.insert("args".into(), args);
    let env = if k.is_multiple_of(2) {
        json!({
            format!("{var}_TOKEN"): format!("${{{var}_TOKEN}}"),
            "LOG_LEVEL": "${MCP_LOG_LEVEL}",
        })
    } else {
        json!({ format!("{var}_TOKEN"): format!("${{{var}_TOKEN}}") })
    };
    entry.insert("env".into(), env);
    if k.is_multiple_of(3) {
        entry.insert(
            "toolExposure".into(),
            json!({
                "search": "direct",
                "read_*": "codemode",
                "delete_*": "hidden",
                "*": "deferred",
            }),
        );
    }
    if k % 25 == 7 {
        entry.insert("type".into(), json!("stdio"));
    }
    entry
}

/// Times `gates::decide` on the pickup fixture `iterations` times, in µs, after checking once
/// that it admits the job with its `/job/mcp.json`.
fn time_pickup(iterations: u32) -> anyhow::Result<Vec<f64>> {
    let fixture = PickupFixture::new()?;
    let inputs = fixture.inputs();
    match gates::decide(&inputs) {
        Decision::Admit(a) if a.mcp.is_some() => {
            let file = a.mcp.unwrap_or_else(|| unreachable!());
            let missing: Vec<&String> = fixture
                .named
                .iter()
                .filter(|name| !file.text.contains(&format!("\"{name}\":")))
                .collect();
            ensure!(
                missing.is_empty(),
                "the pickup job's mcp.json lacks {missing:?}:\n{}",
                file.text
            );
        }
        other => bail!(
            "the pickup fixture must be admitted with an mcp.json, but the gates decided {other:?}"
        ),
    }
    let mut us = Vec::new();
    for _ in 0..iterations {
        let start = Instant::now();
        let decision = gates::decide(black_box(&inputs));
        let elapsed = start.elapsed();
        ensure!(
            matches!(black_box(&decision), Decision::Admit(a) if a.mcp.is_some()),
            "the pickup decision changed: {decision:?}"
        );
        us.push(elapsed.as_secs_f64() * 1e6);
    }
    Ok(us)
}

/// `n` jobs for the queue measurement: the pickup fixture's job under ids of their own, serialized
/// as the worker stores them.
fn queue_jobs(n: u32) -> anyhow::Result<Vec<(String, String)>> {
    let job = PickupFixture::new()?.job;
    (0..n)
        .map(|i| {
            let id = format!("bench-job-{i}");
            let payload = serde_json::to_string(&Job {
                id: id.clone(),
                ..job.clone()
            })?;
            Ok((id, payload))
        })
        .collect()
}

/// Deployment files held in memory. Each call hands out a copy of the bytes, as a reader of the
/// real files returns fresh bytes for every job.
struct MemoryFiles {
    triggers: Vec<u8>,
    mcp: Vec<u8>,
    allowlist: Vec<u8>,
}

impl gates::Files for MemoryFiles {
    fn triggers(&self) -> Read {
        Read::Bytes(self.triggers.clone())
    }
    fn overlay_mcp(&self) -> Read {
        Read::Bytes(self.mcp.clone())
    }
    fn overlay_models(&self) -> Read {
        Read::Missing
    }
    fn allowlist(&self) -> Read {
        Read::Bytes(self.allowlist.clone())
    }
    fn endpoints(&self) -> Read {
        Read::Missing
    }
}

/// Every image declares the same capabilities.
struct MemoryImages(Vec<String>);

impl gates::Images for MemoryImages {
    fn image(&self, _name: &str) -> Image {
        Image::Installed {
            capabilities: self.0.clone(),
        }
    }
}

/// The job's repository folder: a folder of an ordinary user.
struct MemoryFolders;

impl gates::Folders for MemoryFolders {
    fn folder(&self, _path: &str) -> Folder {
        Folder::Folder {
            uid: 1000,
            gid: 1000,
            mode: 0o40755,
        }
    }
}

/// A worker environment that holds the provider's key and nothing else: the job's secrets map
/// every reference.
struct EmptyEnv;

impl gates::WorkerEnv for EmptyEnv {
    fn has_value(&self, name: &str) -> bool {
        name == "OPENAI_API_KEY"
    }
}

/// Everything one admission reads: a local job from a cron trigger naming
/// [`PICKUP_NAMED`] servers of a [`PICKUP_SERVERS`]-server overlay, with `run.secrets` for their
/// variables, egress on and an allowlist naming every HTTP host, and an image declaring
/// `mcp,forgeMcp`.
struct PickupFixture {
    host: Host,
    job: Job,
    settings: config::settings::Settings,
    files: MemoryFiles,
    images: MemoryImages,
    env: EmptyEnv,
    /// The names the job lists, in its order.
    named: Vec<String>,
}

impl PickupFixture {
    fn new() -> anyhow::Result<PickupFixture> {
        let named: Vec<usize> = (0..PICKUP_NAMED).map(pickup_named_index).collect();
        let mut secrets = Map::new();
        for &i in &named {
            for var in pickup_variables(i) {
                secrets.insert(var, json!(format!("op://ci/mcp/{i:03}")));
            }
        }
        let names: Vec<String> = named.iter().map(|&i| pickup_server_name(i)).collect();
        let triggers = json!({ "triggers": [{
            "on": { "type": "cron", "id": "bench", "pattern": "0 3 * * *" },
            "run": {
                "kind": "local",
                "folder": "/srv/repo",
                "task": "Measure the admission.",
                "flow": "task",
                "mcp": names,
                "secrets": secrets,
                "provider": "openai",
                "model": "gpt-4o",
                "models": ["openai/gpt-4o"],
                "maxCostUsd": 5,
            },
        }]});
        let triggers_bytes = serde_json::to_vec(&triggers)?;
        let trigger = config::triggers::parse_triggers(&triggers_bytes)
            .map_err(|e| anyhow::anyhow!("the pickup trigger is refused: {e}"))?
            .triggers
            .into_iter()
            .next()
            .context("the pickup triggers.json holds no trigger")?;
        let job = trigger.job("cron-bench-1");

        let pairs = [("PI_EGRESS", "1"), ("PI_JOB_IMAGE", "pi-job")];
        let settings = config::settings::resolve(
            &|name| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            },
            Path::new("/srv/pi-dispatch"),
        )
        .map_err(|errors| {
            let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
            anyhow::anyhow!("the pickup settings are refused: {}", errors.join("; "))
        })?;

        let allowlist: String = (0..PICKUP_SERVERS)
            .filter(|i| i.is_multiple_of(2))
            .map(|i| format!("{}\n", pickup_http_host(i)))
            .collect();
        Ok(PickupFixture {
            // Egress on, with a proxy: every gate of the decision is taken.
            host: Host {
                root: true,
                user: pickup::reach::User {
                    uid: 0,
                    gid: 0,
                    groups: Vec::new(),
                },
                passwd: None,
                egress_proxy: true,
                github_key: None,
            },
            job,
            settings,
            files: MemoryFiles {
                triggers: triggers_bytes,
                mcp: pickup_overlay_json()?.into_bytes(),
                allowlist: allowlist.into_bytes(),
            },
            images: MemoryImages(vec!["mcp".to_owned(), "forgeMcp".to_owned()]),
            env: EmptyEnv,
            named: names,
        })
    }

    fn inputs(&self) -> gates::Inputs<'_> {
        gates::Inputs {
            job: &self.job,
            settings: &self.settings,
            files: &self.files,
            images: &self.images,
            folders: &MemoryFolders,
            env: &self.env,
            host: &self.host,
        }
    }
}

/// The overlay index of the `k`th named server: spread over the overlay, HTTP and stdio in turn,
/// none of them turned off.
fn pickup_named_index(k: usize) -> usize {
    23 * k + 5
}

fn pickup_server_name(i: usize) -> String {
    format!("{}-{i:03}", SERVICES[i % SERVICES.len()])
}

fn pickup_http_host(i: usize) -> String {
    format!("mcp-{i:03}.{}.example.com", SERVICES[i % SERVICES.len()])
}

/// The two variables server `i` references.
fn pickup_variables(i: usize) -> [String; 2] {
    let second = if i.is_multiple_of(2) { "TENANT" } else { "ORG" };
    [format!("TOKEN_{i:03}"), format!("{second}_{i:03}")]
}

/// The pickup overlay's `mcp.json` with [`PICKUP_SERVERS`] servers, every one valid and each
/// referencing exactly two variables: even ones streamable HTTP on their own host
/// (`Authorization: Bearer ${TOKEN_N}`, and `${TENANT_N}` in a header or the query), odd ones
/// stdio (`${TOKEN_N}` and `${ORG_N}` in env or arguments), and two turned off.
fn pickup_overlay_json() -> anyhow::Result<String> {
    let mut servers = Map::new();
    for i in 0..PICKUP_SERVERS {
        let service = SERVICES[i % SERVICES.len()];
        let [token, second] = pickup_variables(i);
        let k = i / 2;
        let mut entry = Map::new();
        if i.is_multiple_of(2) {
            let host = pickup_http_host(i);
            let (url, headers) = if k.is_multiple_of(2) {
                (
                    format!("https://{host}/mcp"),
                    json!({
                        "Authorization": format!("Bearer ${{{token}}}"),
                        "X-Tenant": format!("${{{second}}}"),
                    }),
                )
            } else {
                (
                    format!("https://{host}/v1/mcp?tenant=${{{second}}}"),
                    json!({ "Authorization": format!("Bearer ${{{token}}}") }),
                )
            };
            entry.insert("url".into(), json!(url));
            entry.insert("headers".into(), headers);
            if k % 3 == 1 {
                entry.insert("type".into(), json!("streamable-http"));
            }
        } else {
            entry.insert(
                "command".into(),
                json!(format!("/opt/pi-global/mcp/{service}-server")),
            );
            if k.is_multiple_of(2) {
                entry.insert("args".into(), json!(["--root", "/workspace"]));
                entry.insert(
                    "env".into(),
                    json!({
                        "MCP_TOKEN": format!("${{{token}}}"),
                        "MCP_ORG": format!("${{{second}}}"),
                    }),
                );
            } else {
                entry.insert(
                    "args".into(),
                    json!(["--root", "/workspace", format!("--org=${{{second}}}")]),
                );
                entry.insert(
                    "env".into(),
                    json!({ "MCP_TOKEN": format!("${{{token}}}") }),
                );
            }
            if k.is_multiple_of(3) {
                entry.insert(
                    "toolExposure".into(),
                    json!({ "search": "direct", "read_*": "codemode", "delete_*": "hidden" }),
                );
            }
        }
        entry.insert(
            "description".into(),
            json!(format!(
                "{service} tools for the team's {} work, server {i} of the shared overlay",
                ["review", "triage", "release", "research"][k % 4]
            )),
        );
        entry.insert("exposure".into(), json!(EXPOSURES[i % EXPOSURES.len()]));
        if i % 97 == 13 {
            entry.insert("enabled".into(), json!(false));
        }
        servers.insert(pickup_server_name(i), Value::Object(entry));
    }
    let overlay = json!({ "codemodeModels": true, "mcpServers": servers });
    Ok(serde_json::to_string_pretty(&overlay)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generated_overlay_holds_500_valid_servers() {
        let text = overlay_json().unwrap();
        let overlay = config::mcp::parse_overlay(text.as_bytes()).unwrap();
        assert_eq!(overlay.servers.len(), 500);
        assert!(
            overlay.all_valid(),
            "{:#?}",
            overlay
                .servers
                .iter()
                .filter(|s| s.verdict.is_err())
                .collect::<Vec<_>>()
        );
        let kinds = |kind| {
            overlay
                .servers
                .iter()
                .filter(|s| s.transport == Some(kind))
                .count()
        };
        assert_eq!(kinds(config::mcp::TransportKind::Http), 250);
        assert_eq!(kinds(config::mcp::TransportKind::Stdio), 250);
        let off = overlay.servers.iter().filter(|s| !s.enabled).count();
        assert!((1..=10).contains(&off), "{off} servers turned off");
    }

    #[test]
    fn the_pickup_overlay_holds_200_valid_servers() {
        let text = pickup_overlay_json().unwrap();
        let overlay = config::mcp::parse_overlay(text.as_bytes()).unwrap();
        assert_eq!(overlay.servers.len(), PICKUP_SERVERS);
        assert!(overlay.all_valid());
        let http = overlay
            .servers
            .iter()
            .filter(|s| s.transport == Some(config::mcp::TransportKind::Http))
            .count();
        assert_eq!(http, PICKUP_SERVERS / 2);
        let off = overlay.servers.iter().filter(|s| !s.enabled).count();
        assert_eq!(off, 2);
    }

    #[test]
    fn the_pickup_fixture_is_admitted_with_its_eight_servers() {
        let fixture = PickupFixture::new().unwrap();
        assert_eq!(fixture.named.len(), PICKUP_NAMED);
        assert!(!fixture.named.iter().any(|n| n == "forge"));
        assert_eq!(fixture.job.secrets.len(), 2 * PICKUP_NAMED);
        assert!(fixture.settings.egress);
        let Decision::Admit(admitted) = gates::decide(&fixture.inputs()) else {
            panic!("not admitted: {:?}", gates::decide(&fixture.inputs()))
        };
        let file = admitted.mcp.unwrap();
        let parsed = config::json::parse(&file.text).unwrap();
        let servers = parsed
            .as_object()
            .unwrap()
            .get("mcpServers")
            .unwrap()
            .as_object()
            .unwrap();
        assert_eq!(
            servers.keys().collect::<Vec<_>>(),
            fixture.named.iter().collect::<Vec<_>>()
        );
        let http = fixture
            .named
            .iter()
            .filter(|n| {
                file.text
                    .contains(&format!("Bearer ${{TOKEN_{}}}", &n[n.len() - 3..]))
            })
            .count();
        assert_eq!(http, PICKUP_NAMED / 2, "{}", file.text);
    }

    #[test]
    fn the_pickup_fixture_runs_the_secret_and_egress_gates() {
        use protocol::reason::Reason;
        let refused = |change: fn(&mut PickupFixture)| {
            let mut fixture = PickupFixture::new().unwrap();
            change(&mut fixture);
            match gates::decide(&fixture.inputs()) {
                Decision::Refuse(r) => r.reason,
                other => panic!("not refused: {other:?}"),
            }
        };
        assert_eq!(
            refused(|f| {
                f.job.secrets.pop();
            }),
            Reason::McpSecretUnmapped
        );
        assert_eq!(
            refused(|f| {
                let host = pickup_http_host(pickup_named_index(1));
                let text = String::from_utf8(f.files.allowlist.clone()).unwrap();
                assert!(text.contains(&host));
                f.files.allowlist = text.replace(&format!("{host}\n"), "").into_bytes();
            }),
            Reason::McpEgressUnreachable
        );
    }

    #[test]
    fn the_summary_takes_nearest_ranks() {
        let s = Summary::of((1..=100).rev().map(f64::from).collect());
        assert_eq!((s.min, s.median, s.p95, s.max), (1.0, 50.5, 95.0, 100.0));
    }
}
