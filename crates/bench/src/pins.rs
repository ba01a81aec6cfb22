//! `--pins`: what holding a server to its pin adds to a job's time to ready and to a tool call
//! through the hub. The server is the tests' own (`testkit::listed_server`) listing many tools (50
//! and 256, each with a description, an input schema of four fields and annotations), connected
//! the runner's way (`mcp_hub::connect`) and held by the runner's own step (`hub::pins::hold`)
//! with its pin given in the runner's input, every tool matching, side by side with the same
//! server held with no pin (its first job's way: every tool digested, nothing compared).
//!
//! - **ready**: one server started until its tool list is in (`connect_all`), then held to its
//!   pin, held with no pin, or not held at all (the runner before pins): the three ways take
//!   turns, each going first in turn, after one untimed start that makes the pin. The hold step
//!   is also timed alone.
//! - **calls**: two such servers connected together, one held to its pin and one with none, and
//!   served by one hub (`relay::serve`); `echo` through the hub on each and directly on their
//!   upstream clients (one and the other in turn), one by one, in each of the six orders in turn.
//!   *paired* is the median of the differences between the pinned server's call and the other's
//!   in each round.
//! - **worker**: the pin read from the queue's store (a SQLite file) by `worker::pins::read`, as
//!   every job naming the server reads it before its folder is written, and the size of the
//!   runner's input with the pin in it.
//!
//! On the job's path: not on it: a benchmark of the runner's pins step.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, ensure};
use hub::connect_all::Connected;
use protocol::job_dir::RunnerInput;
use protocol::pins::Listing;
use rmcp::{Peer, RoleClient};
use serde_json::{Value, json};

use crate::mcp_hub::{self, Latency, Peers, path_str};
use crate::stats::{median, percentile, round1};

/// The sizes of server measured: tools it lists.
pub const SIZES: [usize; 2] = [50, 256];
/// The orders of a round of calls (no pin, pinned, direct), each in turn: every kind goes before
/// and after every other as often, so that neither hub server gains from its place.
const ORDERS: [[usize; 3]; 6] = [
    [0, 1, 2],
    [1, 2, 0],
    [2, 0, 1],
    [0, 2, 1],
    [2, 1, 0],
    [1, 0, 2],
];
/// The longest one `echo` call may take.
const CALL_BOUND: Duration = Duration::from_secs(30);

/// What the pins measurement needs.
pub struct Options {
    pub node_modules: std::path::PathBuf,
    /// Timed starts of each way (after one untimed start).
    pub runs: u32,
    /// Timed `echo` calls of each kind (after the warm-up).
    pub calls: u32,
    pub warm_up: u32,
}

/// One size's figures.
pub struct SizeFigures {
    tools: usize,
    ready: Ready,
    calls: CallFigures,
    worker: WorkerFigures,
}

/// The worker's side of a job with the server's pin: the pin read from the queue's store (SQLite)
/// as a job's start reads it, µs, and the runner's input it is written into, bytes.
struct WorkerFigures {
    read_us: Vec<f64>,
    /// The server's definitions line checked (its signature, then each definition's digest
    /// against the listing), as the worker keeps a pin's definitions after a job, µs.
    definitions_us: Vec<f64>,
    input_bytes: usize,
    input_bytes_no_pin: usize,
}

/// Each way's starts: connect alone (the runner before pins: `unheld`), connect and hold with no
/// pin, connect and hold with the pin, ms; the hold step alone, µs.
#[derive(Default)]
struct Ready {
    unheld: Vec<f64>,
    no_pin: Vec<f64>,
    pinned: Vec<f64>,
    hold_no_pin: Vec<f64>,
    hold_pinned: Vec<f64>,
    /// The servers' signed definitions lines made, which the runner does off the job's path, µs.
    lines: Vec<f64>,
}

struct CallFigures {
    no_pin: Latency,
    pinned: Latency,
    direct: Latency,
    paired_p50: f64,
    paired_p99: f64,
}

/// Everything `--pins` measured.
pub struct PinFigures {
    runs: u32,
    calls: u32,
    warm_up: u32,
    sizes: Vec<SizeFigures>,
}

/// The median of each run's difference between two ways (their starts taken in turn).
fn paired(pinned: &[f64], plain: &[f64]) -> f64 {
    let differences: Vec<f64> = pinned.iter().zip(plain).map(|(p, n)| p - n).collect();
    median(&differences)
}

impl SizeFigures {
    fn json(&self) -> Value {
        let latency = |l: &Latency| json!({"p50_us": round1(l.p50), "p99_us": round1(l.p99)});
        let all = |ms: &[f64]| ms.iter().map(|x| round1(*x)).collect::<Vec<_>>();
        let r = &self.ready;
        json!({
            "tools": self.tools,
            "ready": {
                "unheld_median_ms": round1(median(&r.unheld)),
                "no_pin_median_ms": round1(median(&r.no_pin)),
                "pinned_median_ms": round1(median(&r.pinned)),
                "paired_pinned_unheld_ms": round1(paired(&r.pinned, &r.unheld)),
                "paired_pinned_no_pin_ms": round1(paired(&r.pinned, &r.no_pin)),
                "unheld_ms": all(&r.unheld),
                "no_pin_ms": all(&r.no_pin),
                "pinned_ms": all(&r.pinned),
                "hold_no_pin_median_us": round1(median(&r.hold_no_pin)),
                "hold_pinned_median_us": round1(median(&r.hold_pinned)),
                "definitions_lines_median_us": round1(median(&r.lines)),
            },
            "worker": {
                "pin_read_median_us": round1(median(&self.worker.read_us)),
                "definitions_check_median_us": round1(median(&self.worker.definitions_us)),
                "reads": self.worker.read_us.len(),
                "runner_input_bytes": self.worker.input_bytes,
                "runner_input_bytes_no_pin": self.worker.input_bytes_no_pin,
            },
            "calls": {
                "no_pin": latency(&self.calls.no_pin),
                "pinned": latency(&self.calls.pinned),
                "direct": latency(&self.calls.direct),
                "paired_p50_us": round1(self.calls.paired_p50),
                "paired_p99_us": round1(self.calls.paired_p99),
            },
        })
    }

    fn print(&self) {
        let r = &self.ready;
        println!(
            "pins, a server of {} tools: ready, median: {:.1} ms connected alone, {:.1} ms held with no pin, {:.1} ms held to its pin (paired with alone {:+.1} ms); the hold step alone: {:.1} µs with no pin, {:.1} µs pinned",
            self.tools,
            median(&r.unheld),
            median(&r.no_pin),
            median(&r.pinned),
            paired(&r.pinned, &r.unheld),
            median(&r.hold_no_pin),
            median(&r.hold_pinned),
        );
        println!(
            "pins, a server of {} tools: echo through the hub, p50 / p99: {:.1} / {:.1} µs with no pin, {:.1} / {:.1} µs pinned (paired {:+.1} / {:+.1} µs), directly {:.1} / {:.1} µs",
            self.tools,
            self.calls.no_pin.p50,
            self.calls.no_pin.p99,
            self.calls.pinned.p50,
            self.calls.pinned.p99,
            self.calls.paired_p50,
            self.calls.paired_p99,
            self.calls.direct.p50,
            self.calls.direct.p99,
        );
        println!(
            "pins, a server of {} tools: the worker reads its pin in {:.1} µs (median), and the runner's input is {} bytes with it, {} without",
            self.tools,
            median(&self.worker.read_us),
            self.worker.input_bytes,
            self.worker.input_bytes_no_pin,
        );
    }
}

impl PinFigures {
    pub fn json(&self) -> Value {
        json!({
            "runs": self.runs,
            "calls": self.calls,
            "warm_up": self.warm_up,
            "sizes": self.sizes.iter().map(SizeFigures::json).collect::<Vec<_>>(),
        })
    }

    pub fn print(&self) {
        println!(
            "pins: {} starts of each way, {} echo calls of each kind after {} untimed",
            self.runs, self.calls, self.warm_up
        );
        self.sizes.iter().for_each(SizeFigures::print);
    }
}

/// The definition of tool `i` of a server of many: a description of a couple of hundred bytes,
/// four fields, annotations; tool 0 is `echo`, which the bench calls.
fn tool(i: usize) -> Value {
    let name = if i == 0 {
        "echo".to_owned()
    } else {
        format!("tool_{i:03}")
    };
    json!({
        "name": name,
        "title": format!("Tool {i}"),
        "description": format!("Tool {i} of a server of many: it reads the item named by `id` from the \
            project's store, filters it by `query`, and returns at most `limit` entries, newest \
            first unless `reverse` is set. Read-only."),
        "inputSchema": {"type": "object", "properties": {
            "message": {"type": "string", "description": "What to echo (echo only)"},
            "id": {"type": "string", "description": "The item's id"},
            "query": {"type": "string", "description": "A filter, as the store's query language has it"},
            "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20},
            "reverse": {"type": "boolean", "default": false}},
            "required": ["id"], "additionalProperties": false},
        "annotations": {"readOnlyHint": true, "openWorldHint": false},
    })
}

/// Writes the server's file of `tools` tools in `dir`; its overlay entry.
fn server_of(dir: &Path, tools: usize) -> anyhow::Result<Value> {
    let file = dir.join(format!("listed-{tools}.json"));
    let said = json!({"serverInfo": {"name": "many", "version": "1.0.0"},
        "tools": (0..tools).map(tool).collect::<Vec<_>>()});
    std::fs::write(&file, said.to_string()).context("cannot write the server's tools")?;
    Ok(json!({
        "command": "node",
        "args": [path_str(&testkit::listed_server())?, path_str(&file)?],
        "description": "a server of many tools",
    }))
}

/// The runner's input holding `servers` to `pin` (none for an empty list).
fn input(servers: &[&str], pin: &Listing) -> RunnerInput {
    RunnerInput {
        pins: servers
            .iter()
            .map(|s| ((*s).to_owned(), pin.clone()))
            .collect::<BTreeMap<_, _>>(),
        ..RunnerInput::default()
    }
}

/// The runner's pins step over `connected`, timed (µs): the listings taken and held, on the job's
/// path; and, timed apart, the definitions' signed lines made, which the runner does beside it.
/// Every tool must be offered.
fn hold(connected: Connected, input: &RunnerInput) -> anyhow::Result<(Connected, f64, f64)> {
    let started = Instant::now();
    let listed = hub::pins::listings(&connected);
    let listed_at = started.elapsed();
    let lines_started = Instant::now();
    let lines = hub::pins::definitions_lines("job-bench", b"bench-key", &connected, &listed);
    let lines_us = lines_started.elapsed().as_secs_f64() * 1e6;
    ensure!(
        lines.len() == connected.upstreams.len(),
        "a server's definitions line was not made"
    );
    let held_started = Instant::now();
    let held = hub::pins::hold_listed(connected, input, listed)
        .map_err(|(stop, _)| anyhow!("the runner's pins step stopped: {stop}"))?;
    let took = (listed_at + held_started.elapsed()).as_secs_f64() * 1e6;
    for (upstream, withheld) in &held.upstreams {
        ensure!(
            withheld.0.is_empty(),
            "{} had {} tools withheld",
            upstream.name,
            withheld.0.len()
        );
    }
    Ok((held, took, lines_us))
}

/// One start of the server, connected and, given an input, held under it: (ready, ms; the hold
/// step, µs; the definitions lines, µs), and what it listed (none when not held).
async fn start_once(
    peers: &Peers,
    entry: &Value,
    input: Option<&RunnerInput>,
) -> anyhow::Result<(f64, f64, f64, Option<Listing>)> {
    let dir = tempfile::tempdir().context("cannot make a temporary folder")?;
    let servers = vec![("many".to_owned(), entry.clone())];
    let (connected, took) = mcp_hub::connect(peers, &servers, dir.path()).await?;
    let (held, hold_us, lines_us) = match input {
        Some(input) => hold(connected, input)?,
        None => (connected, 0.0, 0.0),
    };
    let listing = held.states.first().and_then(|s| s.listing.clone());
    mcp_hub::shut_down(held.upstreams.into_iter().map(|(u, _)| u).collect()).await;
    Ok((
        took.as_secs_f64() * 1e3 + hold_us / 1e3,
        hold_us,
        lines_us,
        listing,
    ))
}

/// The ready measurement of one size: each way `runs` times, taking turns (each goes first in
/// turn), after the untimed start that makes the pin; the figures and the pin.
async fn measure_ready(
    peers: &Peers,
    entry: &Value,
    tools: usize,
    runs: u32,
) -> anyhow::Result<(Ready, Listing)> {
    let (_, _, _, pin) = start_once(peers, entry, Some(&RunnerInput::default())).await?;
    let pin = pin.context("the pins step left no listing")?;
    ensure!(
        pin.tools.len() == tools,
        "the pin holds {} tools",
        pin.tools.len()
    );
    let none = RunnerInput::default();
    let pinned = input(&["many"], &pin);
    let mut ready = Ready::default();
    for run in 0..runs {
        for turn in 0..3 {
            let way = (run as usize + turn) % 3;
            let input = [None, Some(&none), Some(&pinned)][way];
            let (r, h, lines, listing) = start_once(peers, entry, input).await?;
            ensure!(
                input.is_none() || listing.as_ref() == Some(&pin),
                "the server listed otherwise than its pin"
            );
            match way {
                0 => ready.unheld.push(r),
                1 => {
                    ready.no_pin.push(r);
                    ready.hold_no_pin.push(h);
                }
                _ => {
                    ready.pinned.push(r);
                    ready.hold_pinned.push(h);
                    ready.lines.push(lines);
                }
            }
        }
    }
    Ok((ready, pin))
}

/// The calls measurement of one size: a pinned and an unpinned copy of the server behind one hub.
async fn measure_calls(
    peers: &Peers,
    entry: &Value,
    pin: &Listing,
    options: &Options,
) -> anyhow::Result<CallFigures> {
    let dir = tempfile::tempdir().context("cannot make a temporary folder")?;
    let servers = vec![
        ("plain".to_owned(), entry.clone()),
        ("pinned".to_owned(), entry.clone()),
    ];
    let (connected, _) = mcp_hub::connect(peers, &servers, dir.path()).await?;
    let (held, _, _) = hold(connected, &input(&["pinned"], pin))?;
    let direct: Vec<hub::rpc::Peer> = held.upstreams.iter().map(|(u, _)| u.peer.clone()).collect();
    let hub = hub::relay::serve(held.upstreams, mcp_hub::TOKEN.to_owned())
        .await
        .context("the hub did not start")?;
    let plain_url = hub.url("plain").context("the hub serves HTTP")?;
    let pinned_url = hub.url("pinned").context("the hub serves HTTP")?;
    let (warm_up, calls) = (options.warm_up, options.calls);
    // pi's side on a thread and runtime of its own, as in `--hub`.
    let client = std::thread::spawn(move || -> anyhow::Result<CallFigures> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the client's runtime")?;
        runtime.block_on(alternate(&plain_url, &pinned_url, &direct, warm_up, calls))
    });
    let figures = tokio::task::spawn_blocking(move || client.join())
        .await
        .context("the client thread was lost")?
        .map_err(|_| anyhow!("the client thread panicked"))?;
    hub.shutdown().await;
    figures
}

/// `echo` on the unpinned server through the hub, on the pinned one through the hub, and on one
/// of the two's upstream clients (each in turn, so that both servers answer as many calls), one
/// after the other, in each order in turn ([`ORDERS`]).
async fn alternate(
    plain_url: &str,
    pinned_url: &str,
    direct: &[hub::rpc::Peer],
    warm_up: u32,
    calls: u32,
) -> anyhow::Result<CallFigures> {
    let plain = mcp_hub::hub_client(plain_url).await?;
    let pinned = mcp_hub::hub_client(pinned_url).await?;
    let mut times: [Vec<f64>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    let mut differences = Vec::new();
    for i in 0..warm_up + calls {
        let message = format!("pi-dispatch-bench {i}");
        let mut round = [0.0; 3];
        for which in ORDERS[i as usize % ORDERS.len()] {
            round[which] = match which {
                0 => timed_echo(plain.peer(), &message).await?,
                1 => timed_echo(pinned.peer(), &message).await?,
                _ => timed_direct_echo(&direct[i as usize % direct.len()], &message).await?,
            };
        }
        if i >= warm_up {
            for (kept, took) in times.iter_mut().zip(round) {
                kept.push(took);
            }
            differences.push(round[1] - round[0]);
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), plain.cancel()).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), pinned.cancel()).await;
    let paired_p50 = median(&differences);
    differences.sort_by(f64::total_cmp);
    let [no_pin, pinned, direct] = times;
    Ok(CallFigures {
        no_pin: Latency::of(no_pin),
        pinned: Latency::of(pinned),
        direct: Latency::of(direct),
        paired_p50,
        paired_p99: percentile(&differences, 99),
    })
}

/// The worker's side: `pin` stored in a SQLite queue of its own, then read `reads` times by
/// `worker::pins::read` as a job's start reads it.
fn measure_worker(pin: &Listing, reads: u32) -> anyhow::Result<WorkerFigures> {
    use ::queue::Queue as _;
    let dir = tempfile::tempdir().context("cannot make a temporary folder")?;
    let store = ::queue::SqliteQueue::open(&dir.path().join("queue.sqlite3"))
        .context("cannot open the queue")?;
    // As a job stores it: with each tool's definition (as far as they fit), which a read parses.
    let texts: std::collections::BTreeMap<String, String> = (0..pin.tools.len())
        .map(|i| {
            let t = tool(i);
            let name = t["name"].as_str().unwrap_or_default().to_owned();
            (
                name,
                protocol::pins::canonical_text(&t.to_string()).unwrap_or_default(),
            )
        })
        .collect();
    let stored = protocol::pins::StoredPin {
        listing: pin.clone(),
        pinned_at_ms: 0,
        by: "pi-dispatch-bench".to_owned(),
        definitions: protocol::pins::verified_definitions(pin, &texts),
    };
    ensure!(
        !stored.definitions.is_empty(),
        "the definitions are not those digested"
    );
    let text = serde_json::to_string(&stored).context("the pin does not serialize")?;
    store
        .put_pin("many", &text, true, std::time::SystemTime::now())
        .context("cannot store the pin")?;
    let servers = ["many".to_owned()];
    let mut read_us = Vec::new();
    for _ in 0..reads {
        let started = Instant::now();
        let read = worker::pins::read(&store, &servers);
        read_us.push(started.elapsed().as_secs_f64() * 1e6);
        let read = read.map_err(|e| anyhow!("the pin was not read: {}", e.0))?;
        ensure!(read.get("many") == Some(pin), "the pin read back otherwise");
    }
    let line = protocol::exit_line::Definitions {
        event: protocol::exit_line::DEFINITIONS_EVENT.to_owned(),
        job_id: "job-bench".to_owned(),
        server: "many".to_owned(),
        tools: texts,
    }
    .sign(b"bench-key")
    .context("the definitions line does not serialize")?;
    let mut definitions_us = Vec::new();
    for _ in 0..reads.min(200) {
        let started = Instant::now();
        let said = protocol::exit_line::Definitions::verify(&line, b"bench-key")
            .context("the definitions line does not verify")?;
        let kept = protocol::pins::verified_definitions(pin, &said.tools);
        definitions_us.push(started.elapsed().as_secs_f64() * 1e6);
        ensure!(kept == stored.definitions, "the definitions kept differ");
    }
    Ok(WorkerFigures {
        read_us,
        definitions_us,
        input_bytes: input(&["many"], pin).to_text().len(),
        input_bytes_no_pin: RunnerInput::default().to_text().len(),
    })
}

/// What the server answers `echo` with.
fn echoed(message: &str) -> String {
    format!("called echo {}", json!({"message": message}))
}

/// One `echo` through the hub, timed from sending to the result; checked after the clock stops.
async fn timed_echo(peer: &Peer<RoleClient>, message: &str) -> anyhow::Result<f64> {
    let params = mcp_hub::echo_params(message);
    let started = Instant::now();
    let result = tokio::time::timeout(CALL_BOUND, peer.call_tool(params)).await;
    let took = started.elapsed();
    let result = result
        .context("echo did not answer in time")?
        .context("echo failed")?;
    let text = mcp_hub::text_of(&result);
    ensure!(
        result.is_error != Some(true) && text == echoed(message),
        "echo answered {text:?}"
    );
    Ok(took.as_secs_f64() * 1e6)
}

/// One `echo` on the hub's own upstream client, straight to the server.
async fn timed_direct_echo(peer: &hub::rpc::Peer, message: &str) -> anyhow::Result<f64> {
    let params = json!({"name": "echo", "arguments": {"message": message}});
    let started = Instant::now();
    let result = tokio::time::timeout(CALL_BOUND, peer.request("tools/call", params)).await;
    let took = started.elapsed();
    let result = result
        .context("echo did not answer in time")?
        .context("echo failed")?;
    let text = result["content"][0]["text"].as_str().unwrap_or_default();
    ensure!(
        result["isError"] != true && text == echoed(message),
        "echo answered {result}"
    );
    Ok(took.as_secs_f64() * 1e6)
}

/// Runs the whole pins measurement, each size in turn.
pub fn measure(options: &Options) -> anyhow::Result<PinFigures> {
    let peers = Peers::find(&options.node_modules)?;
    let dir = tempfile::tempdir().context("cannot make a temporary folder")?;
    let runtime = mcp_hub::runner_runtime()?;
    let mut sizes = Vec::new();
    for tools in SIZES {
        let entry = server_of(dir.path(), tools)?;
        let (ready, pin) = runtime.block_on(measure_ready(&peers, &entry, tools, options.runs))?;
        let calls = runtime.block_on(measure_calls(&peers, &entry, &pin, options))?;
        let worker = measure_worker(&pin, options.calls)?;
        sizes.push(SizeFigures {
            tools,
            ready,
            calls,
            worker,
        });
    }
    runtime.shutdown_timeout(Duration::from_secs(2));
    Ok(PinFigures {
        runs: options.runs,
        calls: options.calls,
        warm_up: options.warm_up,
        sizes,
    })
}
