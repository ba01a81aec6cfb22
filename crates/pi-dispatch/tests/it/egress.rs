//! The worker with egress on, as by default: it makes sure an egress proxy serves its jobs (its own
//! child, started again when it ends and stopped with the worker, or one already serving the
//! folder), and a job runs with no network but the way out through that proxy. The job's model and
//! its HTTP MCP server are on a test host (a network namespace of the test's own), declared in
//! model-endpoints.json; from inside the sandbox a direct connection to anything fails, and what the
//! proxy refused the job is in its record.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use testkit::EverythingHttp;
use testkit::fake_model::{FakeModel, Step};
use testkit::netns::TestHost;

use crate::common::{Deployment, Run, git, processes_with};
use crate::worker::{MODEL_KEY, give_to_nobody, queued_id};

/// The control socket of a deployment's proxy (the default `PI_EGRESS_PROXY_DIR`).
fn control(d: &Deployment) -> egress::control::Client {
    egress::control::Client::new(d.path().join("state/egress/control.sock"))
}

/// The pid of the proxy answering on `d`'s control socket, if one answers.
fn proxy_pid(d: &Deployment) -> Option<u32> {
    control(d).ping().ok().and_then(|r| r.pid)
}

fn wait_for(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < until, "{what} did not happen");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
}

fn signal(pid: u32, signal: &str) {
    let ok = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

/// A deployment with egress on (init's files as they are) and nothing to run.
fn egress_on() -> Deployment {
    let d = Deployment::new();
    assert_eq!(d.run(&["init"]).code, 0);
    d.write(".env", "PI_PROVIDER=fake\nPI_MODEL=fake-model\n");
    d
}

/// A process started with its standard error read line by line as it comes.
struct Logged {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Logged {
    fn start(mut cmd: std::process::Command) -> Logged {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Logged {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a log line holding `text`.
    fn wait_for(&mut self, text: &str) -> String {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(l) = self.seen.iter().find(|l| l.contains(text)) {
                return l.clone();
            }
            let left = until.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => panic!("no log line with {text}: {:#?}", self.seen),
            }
        }
    }

    /// Waits for the process to end, and keeps the rest of its log.
    fn finish(mut self) -> (std::process::ExitStatus, Vec<String>) {
        let status = self.child.wait().unwrap();
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(line);
        }
        (status, std::mem::take(&mut self.seen))
    }
}

impl Drop for Logged {
    /// A test that failed leaves nothing running.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_worker_starts_its_proxy_starts_it_again_and_stops_it() {
    let d = egress_on();
    assert_eq!(proxy_pid(&d), None);
    let mut worker = Logged::start(d.command(&["worker", "--poll-ms", "100"]));
    worker.wait_for("egress_proxy_ready");
    // A proxy answers before the worker takes a job: the worker's own child.
    let first = proxy_pid(&d).expect("a proxy answers once the worker has started");
    assert!(
        worker
            .wait_for("egress_proxy_child_started")
            .contains(&first.to_string())
    );
    // Killed, it is started again (and the worker says so).
    signal(first, "KILL");
    worker.wait_for("egress_proxy_exited");
    worker.wait_for("egress_proxy_restarted");
    let mut second = None;
    wait_for(Duration::from_secs(15), "a new proxy", || {
        second = proxy_pid(&d).filter(|p| *p != first);
        second.is_some()
    });
    let second = second.unwrap();
    // The worker stopped, its proxy stops with it.
    signal(worker.child.id(), "TERM");
    let (status, log) = worker.finish();
    assert!(status.success(), "{log:#?}");
    assert!(!alive(second), "the proxy outlived its worker: {log:#?}");
    assert_eq!(proxy_pid(&d), None);
    assert!(
        log.iter().any(|l| l.contains("egress_proxy_stopping")),
        "the proxy said nothing of stopping: {log:#?}"
    );
}

#[test]
fn a_worker_killed_outright_takes_its_proxy_with_it() {
    let d = egress_on();
    // Canaries in the worker's environment: a provider's key, a variable forwarded to jobs. The
    // proxy the worker starts is started with neither.
    let mut cmd = d.command(&["worker", "--poll-ms", "100"]);
    cmd.env("OPENAI_API_KEY", "cnry-worker-key-41")
        .env("DOCS_TOKEN", "cnry-forwarded-42");
    let mut worker = Logged::start(cmd);
    worker.wait_for("egress_proxy_child_started");
    let proxy = proxy_pid(&d).unwrap();
    let environ = std::fs::read(format!("/proc/{proxy}/environ")).unwrap();
    let environ = String::from_utf8_lossy(&environ);
    assert!(
        environ.contains("PATH="),
        "the control: the proxy's environment was read"
    );
    assert!(!environ.contains("cnry-"), "{environ}");
    signal(worker.child.id(), "KILL");
    let _ = worker.finish();
    wait_for(Duration::from_secs(10), "the proxy's end", || !alive(proxy));
}

#[test]
fn a_proxy_already_serving_the_folder_is_used_and_left_running() {
    let d = egress_on();
    let mut standalone = Logged::start(d.command(&["egress-proxy"]));
    standalone.wait_for("egress_proxy_started");
    let pid = proxy_pid(&d).unwrap();
    let run = Run::from(
        d.command(&["worker", "--until-empty", "--poll-ms", "100"])
            .output()
            .unwrap(),
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stderr.contains("egress_proxy_shared"), "{}", run.stderr);
    assert!(
        !run.stderr.contains("egress_proxy_child_started"),
        "{}",
        run.stderr
    );
    // Still the same proxy, still serving.
    assert_eq!(proxy_pid(&d), Some(pid));
    signal(standalone.child.id(), "TERM");
    let (status, _) = standalone.finish();
    assert!(status.success());
}

/// A stand-in for a proxy on a control socket: it answers pings and refuses every job's socket.
fn refusing_proxy(dir: &std::path::Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::create_dir_all(dir).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let path = dir.join("control.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut line = String::new();
            if BufReader::new(&stream).read_line(&mut line).is_err() {
                continue;
            }
            let reply = if line.contains("\"ping\"") {
                json!({"ok": true, "pid": 1, "jobs": 0, "connections": 0})
            } else {
                json!({"ok": false, "error": "no sockets today"})
            };
            let _ = writeln!(stream, "{reply}");
        }
    });
    path
}

/// A repository of the job's user, committed.
fn repository(d: &Deployment) -> PathBuf {
    let repo = d.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q"]);
    std::fs::write(repo.join("README.md"), "a repository\n").unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-qm", "init"]);
    give_to_nobody(&repo);
    repo
}

/// Queues a job ("Anything.") on a repository of its own and runs the worker until the queue is
/// empty: the job's id and the worker's run.
fn run_one_job(d: &Deployment) -> (String, Run) {
    let repo = repository(d);
    let queued = Run::from(
        d.command(&["run", repo.to_str().unwrap(), "--task", "Anything."])
            .env("FAKE_API_KEY", MODEL_KEY)
            .output()
            .unwrap(),
    );
    assert_eq!(queued.code, 0, "{}", queued.stderr);
    (queued_id(&queued), work_until_empty(d))
}

/// Runs the worker with the provider's key until the queue is empty; it must exit well.
fn work_until_empty(d: &Deployment) -> Run {
    let worked = Run::from(
        d.command(&["worker", "--until-empty", "--poll-ms", "100"])
            .env("FAKE_API_KEY", MODEL_KEY)
            .output()
            .unwrap(),
    );
    assert_eq!(worked.code, 0, "{}", worked.stderr);
    worked
}

#[test]
fn a_job_whose_socket_the_proxy_will_not_open_never_runs_and_is_retried() {
    let d = Deployment::with_image(&[]);
    let model = FakeModel::start(vec![Step::text("done")]);
    d.write("pi-global/models.json", &model.models_json("FAKE_API_KEY"));
    let proxy_dir = d.path().join("fake-proxy");
    refusing_proxy(&proxy_dir);
    d.write(
        ".env",
        &format!(
            "PI_PROVIDER=fake\nPI_MODEL=fake-model\nPI_EGRESS_PROXY_DIR={}\n",
            proxy_dir.display()
        ),
    );
    let (id, run) = run_one_job(&d);
    // Tried on every attempt, each an infrastructure fault said in the log; no sandbox started.
    assert!(run.stderr.contains("egress_open_failed"), "{}", run.stderr);
    assert!(run.stderr.contains("job_retried"), "{}", run.stderr);
    assert!(!run.stderr.contains("job_started"), "{}", run.stderr);
    assert!(model.requests().is_empty());
    let record: Value = d.record(&id).unwrap();
    assert_eq!(record["reason"], "container-never-started", "{record:#}");
    assert_eq!(record["attempt"], queue::MAX_ATTEMPTS, "{record:#}");
    assert!(
        record["detail"]["why"]
            .as_str()
            .unwrap()
            .contains("the egress proxy did not open the job's socket"),
        "{record:#}"
    );
}

/// What the job's bash tool runs inside the sandbox: a direct TCP connection to the test host, a
/// UDP datagram to it, DNS questions to a resolver on it and elsewhere and to the system's, and a
/// request through the proxy to a host no list names; what happened to each is written to
/// /workspace/probe.json.
fn probe(peer: &str, port: u16) -> String {
    let script = format!(
        r#"
const net = require("node:net"), dgram = require("node:dgram"), dns = require("node:dns");
const out = {{}};
const settle = (p) => Promise.race([p, new Promise((r) => setTimeout(() => r("timeout"), 5000))]);
const tcp = (host, port) => settle(new Promise((resolve) => {{
  const s = net.connect({{ host, port }});
  s.on("connect", () => {{ s.destroy(); resolve("connected"); }});
  s.on("error", (e) => resolve(e.code || String(e)));
}}));
const udp = (host, port) => settle(new Promise((resolve) => {{
  const s = dgram.createSocket("udp4");
  s.send(Buffer.from("hello"), port, host, (e) => {{ s.close(); resolve(e ? (e.code || String(e)) : "sent"); }});
}}));
const ask = (servers) => settle(new Promise((resolve) => {{
  const r = new dns.Resolver({{ timeout: 1000, tries: 1 }});
  r.setServers(servers);
  r.resolve4("example.com", (e, a) => resolve(e ? (e.code || String(e)) : "answered " + a));
}}));
(async () => {{
  out.tcpPeer = await tcp("{peer}", {port});
  out.tcpElsewhere = await tcp("1.1.1.1", 443);
  out.udpPeer = await udp("{peer}", 53);
  out.dnsPeer = await ask(["{peer}"]);
  out.dnsElsewhere = await ask(["1.1.1.1"]);
  out.lookup = await settle(new Promise((resolve) => dns.lookup("example.com", (e, a) => resolve(e ? e.code : "found " + a))));
  out.proxy = await settle(fetch("https://unlisted.example/").then((r) => "status " + r.status, (e) => String(e.cause && (e.cause.code || e.cause.message) || e)));
  out.env = {{ https: process.env.HTTPS_PROXY, noProxy: process.env.NO_PROXY, node: process.env.NODE_USE_ENV_PROXY }};
  // 300 hosts the job makes up, one CONNECT each: the proxy's status for each.
  const connect = (host) => settle(new Promise((resolve) => {{
    const s = net.connect({{ host: "127.0.0.1", port: 3128 }});
    s.on("connect", () => s.write(`CONNECT ${{host}}:443 HTTP/1.1\r\nHost: ${{host}}:443\r\n\r\n`));
    s.on("data", (d) => {{ s.destroy(); resolve(String(d).split(" ")[1]); }});
    s.on("error", (e) => resolve(e.code || String(e)));
  }}));
  out.madeUp = [];
  for (let i = 0; i < 300; i++) out.madeUp.push(await connect(`made-up-${{i}}.invalid`));
  require("node:fs").writeFileSync("/workspace/probe.json", JSON.stringify(out));
}})();
"#
    );
    format!("node -e '{}'", script.replace('\'', "'\\''"))
}

#[test]
fn a_job_with_egress_on_reaches_its_model_and_server_through_the_proxy_and_nothing_directly() {
    egress_on_reaches_through_the_proxy_and_nothing_directly("");
}

/// The same in a Podman container (`PI_SANDBOX=podman`).
#[test]
fn in_a_podman_container_egress_on_reaches_through_the_proxy_and_nothing_directly() {
    egress_on_reaches_through_the_proxy_and_nothing_directly(&format!(
        "PI_SANDBOX=podman\nPI_PODMAN_IMAGE={}\nPI_PODMAN_RUNTIME=runc\n",
        testkit::podman_base_image()
    ));
}

/// A job with egress on, its deployment's `.env` given `settings` besides the model.
fn egress_on_reaches_through_the_proxy_and_nothing_directly(settings: &str) {
    let peer = TestHost::new();
    // A listener and a UDP socket on the test host that no job must reach directly.
    let sentinel = peer.tcp(0);
    let sentinel_port = sentinel.local_addr().unwrap().port();
    sentinel.set_nonblocking(true).unwrap();
    let dns = peer.udp(53);
    dns.set_nonblocking(true).unwrap();
    let address = peer.v4.to_string();

    let d = Deployment::with_image(&[]);
    let model = FakeModel::serve(
        peer.tcp(0),
        peer.v4.into(),
        vec![
            Step::call("mcp__web__echo", json!({"message": "through the proxy"})),
            Step::call("bash", json!({"command": probe(&address, sentinel_port)})),
            Step::text("done"),
        ],
    );
    let http = EverythingHttp::start_in(&peer);
    d.write("pi-global/models.json", &model.models_json("FAKE_API_KEY"));
    d.write(
        "pi-global/mcp.json",
        &json!({"mcpServers": {"web": {"url": http.url(), "description": "Everything over HTTP", "exposure": "direct"}}})
            .to_string(),
    );
    // Both declared by their host and port; the allowlist as init wrote it.
    d.write(
        "model-endpoints.json",
        &json!({"version": 1, "endpoints": [
            {"id": "model", "host": address, "port": model.port},
            {"id": "mcp", "host": address, "port": http.port},
        ]})
        .to_string(),
    );
    d.write(
        ".env",
        &format!("PI_PROVIDER=fake\nPI_MODEL=fake-model\n{settings}"),
    );
    let repo = repository(&d);
    let queued = Run::from(
        d.command(&[
            "run",
            repo.to_str().unwrap(),
            "--task",
            "Probe.",
            "--mcp",
            "web",
        ])
        .env("FAKE_API_KEY", MODEL_KEY)
        .output()
        .unwrap(),
    );
    assert_eq!(queued.code, 0, "{}", queued.stderr);
    let id = queued_id(&queued);
    let worked = work_until_empty(&d);
    let record: Value = d
        .record(&id)
        .unwrap_or_else(|| panic!("no record: {}", worked.stderr));
    let results: Vec<String> = model.requests().iter().map(|r| r.last_text()).collect();

    // The job completed, its MCP call answered by the server on the test host.
    assert_eq!(
        record["outcome"], "completed",
        "{record:#}\n{results:#?}\n{}",
        worked.stderr
    );
    assert!(
        results[1].contains("Echo: through the proxy"),
        "{results:#?}"
    );
    let call = record["mcp"]["toolCalls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["server"] == "web" && c["tool"] == "echo")
        .cloned()
        .unwrap_or_default();
    assert_eq!(call["ok"], 1, "{record:#}");
    // The model and the server were reached through the proxy, each by its declared endpoint.
    for endpoint in ["endpoint:model", "endpoint:mcp"] {
        assert!(
            worked
                .stderr
                .lines()
                .any(|l| l.contains("egress_decision") && l.contains(endpoint) && l.contains(&id)),
            "no decision by {endpoint}: {}",
            worked.stderr
        );
    }

    // From inside, nothing direct worked.
    let probe: Value = serde_json::from_str(
        &std::fs::read_to_string(repo.join("probe.json"))
            .unwrap_or_else(|_| panic!("the probe wrote nothing: {results:#?}")),
    )
    .unwrap();
    eprintln!("what the probe saw: {probe:#}");
    for attempt in ["tcpPeer", "tcpElsewhere", "udpPeer"] {
        assert_eq!(probe[attempt], "ENETUNREACH", "{attempt}: {probe:#}");
    }
    // No question leaves (c-ares says ECONNREFUSED when it cannot send), and the system's
    // resolver has no nameserver to ask.
    for question in ["dnsPeer", "dnsElsewhere"] {
        assert_eq!(probe[question], "ECONNREFUSED", "{question}: {probe:#}");
    }
    assert_eq!(probe["lookup"], "EAI_AGAIN", "{probe:#}");
    assert_eq!(probe["env"]["https"], "http://127.0.0.1:3128", "{probe:#}");
    assert_eq!(probe["env"]["node"], "1", "{probe:#}");
    // The request through the proxy was refused, and the record says so.
    assert!(
        !probe["proxy"].as_str().unwrap().starts_with("status 2"),
        "{probe:#}"
    );
    let denied = record["egressDenied"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        denied.iter().any(|d| d["host"] == "unlisted.example"
            && d["port"] == 443
            && d["reason"] == "not-allowed"
            && d["count"].as_u64().unwrap_or(0) >= 1),
        "{record:#}"
    );
    // The 300 made-up hosts were each refused (the probe ran); the record keeps 256 hosts and
    // says how many denials it left out; the metrics count them by reason, naming no host.
    let refused = probe["madeUp"].as_array().unwrap();
    assert_eq!(refused.len(), 300, "{probe:#}");
    assert!(refused.iter().all(|s| s == "403"), "{probe:#}");
    let left_out = denied
        .iter()
        .find(|d| d["reason"] == egress::LEFT_OUT)
        .unwrap_or_else(|| panic!("{record:#}"));
    assert_eq!(denied.len(), 257, "{record:#}");
    assert_eq!(left_out["count"], 45, "{record:#}");
    let metrics = records::counts::render(&d.records().counters().unwrap());
    let series: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("pi_dispatch_egress_denials_total{"))
        .collect();
    assert!(!series.is_empty(), "{metrics}");
    assert!(
        series
            .iter()
            .all(|l| !l.contains("made-up") && !l.contains("host=")),
        "{series:#?}"
    );
    assert!(
        series.len() <= protocol::egress::REASONS.len(),
        "{series:#?}"
    );
    // And nothing arrived at the test host but through the proxy.
    assert!(
        matches!(sentinel.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "a direct connection reached the test host"
    );
    let mut buf = [0u8; 512];
    assert!(
        matches!(dns.recv_from(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "a datagram reached the test host"
    );
    // The job's socket was opened before its sandbox and closed after it.
    for event in ["egress_job_open", "egress_job_closed"] {
        assert!(
            worked
                .stderr
                .lines()
                .any(|l| l.contains(event) && l.contains(&id)),
            "no {event}: {}",
            worked.stderr
        );
    }
    // Nothing of the job, nor the worker's proxy, is left running.
    assert_eq!(processes_with(&id, 0), vec![]);
    assert_eq!(proxy_pid(&d), None);
}

/// The job's model is on a test host that is down (nothing listens on its port): the egress proxy
/// answers pi's calls through the gateway with 502 `upstream-unreachable`. The job ends
/// `model-unreachable`, an outage, tried again on its second attempt, never `model-error`; its
/// record names the host and what the proxy said. The control: the proxy logged its decision for
/// the model's endpoint with the upstream refusing.
#[test]
fn a_model_that_is_down_behind_the_proxy_is_unreachable_and_tried_again() {
    let peer = TestHost::new();
    let address = peer.v4.to_string();
    let port = peer.tcp(0).local_addr().unwrap().port();
    let d = Deployment::with_image(&[]);
    d.write(
        "pi-global/models.json",
        &json!({"providers": {"fake": {
            "baseUrl": format!("http://{address}:{port}/v1"),
            "api": "openai-completions",
            "apiKey": "$FAKE_API_KEY",
            "compat": {"supportsDeveloperRole": false, "supportsReasoningEffort": false},
            "models": [{"id": "fake-model"}],
        }}})
        .to_string(),
    );
    d.write(
        "model-endpoints.json",
        &json!({"version": 1, "endpoints": [{"id": "model", "host": address, "port": port}]})
            .to_string(),
    );
    d.write(".env", "PI_PROVIDER=fake\nPI_MODEL=fake-model\n");
    let (id, worked) = run_one_job(&d);
    assert!(
        worked.stderr.lines().any(|l| l.contains("egress_decision")
            && l.contains("endpoint:model")
            && l.contains("upstream-unreachable")),
        "the proxy was not asked: {}",
        worked.stderr
    );
    let retried = worked
        .stderr
        .lines()
        .find(|l| l.contains("job_retried"))
        .unwrap_or_else(|| panic!("not tried again: {}", worked.stderr));
    assert!(retried.contains("model-unreachable"), "{retried}");
    let record: Value = d.record(&id).unwrap();
    assert_eq!(record["outcome"], "failed", "{record:#}");
    assert_eq!(record["reason"], "model-unreachable", "{record:#}");
    assert_eq!(record["attempt"], queue::MAX_ATTEMPTS, "{record:#}");
    let why = record["detail"]["why"].as_str().unwrap();
    assert!(
        why.contains("502") && why.contains("upstream-unreachable") && why.contains(&address),
        "{why}"
    );
    assert!(!record.to_string().contains(MODEL_KEY));
}
