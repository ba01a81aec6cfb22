//! The worker with egress on, as by default: it makes sure an egress proxy serves its jobs (its own
//! child, started again when it ends and stopped with the worker, or one already serving the
//! folder).

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::common::{Deployment, Run};

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
        (status, self.seen)
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
    let mut worker = Logged::start(d.command(&["worker", "--poll-ms", "100"]));
    worker.wait_for("egress_proxy_child_started");
    let proxy = proxy_pid(&d).unwrap();
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
