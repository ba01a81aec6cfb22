//! Egress off gives a job the outside, never the host: a hijacked job's tool tries a listener on
//! the host's loopback (where the panel, the receiver or a Redis queue would be), the same
//! listener on each of the host's own addresses, and the model gateway and every other listener of
//! another job running beside it; the outside (a test host in a network namespace) answers it.
//! Controls: from the host, the listener answers on each address; from inside the other job's
//! network, its listeners answer.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::json;
use testkit::fake_model::Step;

use crate::worker::{Service, give_to_nobody, queued_id, stdio};

/// What the probing job's tool does: each line of `probe-targets` in its workspace (`NAME IP
/// PORT`) tried once, as `NAME reached` or `NAME refused`.
const PROBE: &str = "while read -r name ip port; do \
    if timeout 5 bash -c \"exec 3<>/dev/tcp/$ip/$port\" 2>/dev/null; \
    then echo \"$name reached\"; else echo \"$name refused\"; fi; \
    done < probe-targets; echo probed";

/// The ports a process's network namespace listens on at 127.0.0.1 (its `/proc/PID/net/tcp`).
fn loopback_listeners(pid: u32) -> Vec<u16> {
    let Ok(table) = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")) else {
        return Vec::new();
    };
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            let (addr, port) = fields.get(1)?.split_once(':')?;
            (addr == "0100007F" && fields.get(3) == Some(&"0A"))
                .then(|| u16::from_str_radix(port, 16).ok())?
        })
        .collect()
}

/// A process of job `id` (its environment names the job) and the ports its network listens on
/// at 127.0.0.1, once its gateway listens.
fn a_jobs_listeners(id: &str) -> Option<(u32, Vec<u16>)> {
    testkit::processes_with(&format!("PI_JOB_ID={id}"))
        .into_iter()
        .map(|(pid, _)| (pid, loopback_listeners(pid)))
        .find(|(_, ports)| !ports.is_empty())
}

#[test]
fn with_egress_off_a_job_reaches_the_outside_and_never_the_host_or_another_job() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: only a root worker gives a job with egress off a network of its own");
        return;
    }
    let s = Service::new(
        vec![
            // The first job waits in its tool while the second probes.
            Step::call("bash", json!({"command": "sleep 40; echo waited"})),
            Step::call("bash", json!({"command": PROBE})),
            Step::text("Probed."),
            Step::text("Waited."),
        ],
        |_| json!({"everything": stdio(None)}),
        "PI_WORKER_CONCURRENCY=2\n",
    );
    // A listener on every address of the host, loopback included.
    let near = testkit::netns::HostListener::new();
    let (near_port, host_v4) = (near.port, near.v4.clone());
    // The outside: a listener on the service's test host.
    let far = s.host.tcp(0);
    let far_port = far.local_addr().unwrap().port();

    let waiting = s.queue("Wait.", "everything");
    let mut worker = s
        .worker_command(&[])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let (pid, ports) = loop {
        if !s.model.requests().is_empty()
            && let Some(found) = a_jobs_listeners(&waiting)
        {
            break found;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the first job's gateway never listened"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // The control: inside the first job's network, its listeners answer.
    let netns = std::fs::File::open(format!("/proc/{pid}/ns/net")).unwrap();
    let answered = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                rustix::thread::move_into_link_name_space(
                    std::os::fd::AsFd::as_fd(&netns),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .unwrap();
                ports
                    .iter()
                    .all(|p| TcpStream::connect(("127.0.0.1", *p)).is_ok())
            })
            .join()
            .unwrap()
    });
    assert!(
        answered,
        "the first job's listeners {ports:?} did not answer inside its network"
    );

    // The second job, on a repository of its own, with its targets.
    let mut targets = format!(
        "far {} {far_port}\nhost-loopback 127.0.0.1 {near_port}\nslirp-host 10.0.2.2 {near_port}\nslirp-dns 10.0.2.3 {near_port}\n",
        s.host.v4
    );
    for a in &host_v4 {
        targets.push_str(&format!("host-{a} {a} {near_port}\n"));
    }
    for p in &ports {
        targets.push_str(&format!("other-job-{p} 127.0.0.1 {p}\n"));
        for a in &host_v4 {
            targets.push_str(&format!("other-job-{p}-at-{a} {a} {p}\n"));
        }
    }
    let repo = s.d.path().join("probing");
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::write(repo.join("probe-targets"), &targets).unwrap();
    let git = |args: &[&str]| crate::common::git(&repo, args);
    git(&["init", "-q"]);
    git(&["add", "."]);
    git(&["commit", "-qm", "targets"]);
    give_to_nobody(&repo);
    let queued = s.cli(&[
        "run",
        repo.to_str().unwrap(),
        "--task",
        "Probe.",
        "--mcp",
        "everything",
    ]);
    assert_eq!(queued.code, 0, "{}", queued.stderr);
    let probing = queued_id(&queued);
    let status = worker.wait().unwrap();
    assert!(status.success());
    drop((near, far));

    for id in [&waiting, &probing] {
        let record = s.record(id);
        assert_eq!(record["outcome"], "completed", "{id}: {record:#}");
    }
    let said = s
        .results()
        .into_iter()
        .find(|r| r.contains("probed"))
        .expect("the probing job's tool ran");
    let lines: Vec<&str> = said.lines().map(str::trim).collect();
    assert!(
        lines.contains(&"far reached"),
        "the probe reached nothing: {said}"
    );
    for (name, _) in targets
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(name, _)| *name != "far")
    {
        assert!(
            lines.contains(&format!("{name} refused").as_str()),
            "{name} was not refused: {said}"
        );
    }
}
