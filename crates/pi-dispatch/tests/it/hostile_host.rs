//! A job's processes are apart from every other process on the host: a root worker runs the job
//! as an id of its own pool, never as its repository's owner, so that the owner's other processes
//! (here `nobody`'s, the owner of the tests' repositories) can neither read a job process's
//! environment nor signal it, while root, the control, sees the server's canary. What the job
//! writes is still the owner's on disk.

use std::os::unix::fs::MetadataExt as _;
use std::time::{Duration, Instant};

use serde_json::json;
use testkit::fake_model::Step;

use crate::common::Run;
use crate::worker::{EVERYTHING, Service, queued_id};

const KEEPER_TOKEN: &str = "cnry-keeper-pool-4d2";

/// Every process's environment with the canary, and a signal to each process running with an id
/// of the pool, as `who` (`setpriv` arguments, or none for root).
fn probe(who: &[&str]) -> String {
    let script = format!(
        "for f in /proc/[0-9]*/environ; do grep -l {KEEPER_TOKEN} \"$f\" 2>/dev/null && echo FOUND; done; \
         for s in /proc/[0-9]*/status; do \
           u=$(awk '/^Uid:/ {{print $2}}' \"$s\" 2>/dev/null); \
           if [ -n \"$u\" ] && [ \"$u\" -ge 1879048192 ] && [ \"$u\" -le 1879048447 ]; then \
             p=${{s#/proc/}}; p=${{p%/status}}; \
             if kill -0 \"$p\" 2>/dev/null; then echo SIGNALLED; else echo refused; fi; \
           fi; \
         done; echo probed"
    );
    let out = if who.is_empty() {
        std::process::Command::new("sh")
            .args(["-c", &script])
            .output()
    } else {
        std::process::Command::new("setpriv")
            .args(who)
            .args(["sh", "-c", &script])
            .output()
    }
    .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_owners_other_processes_cannot_reach_a_running_job() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: only a root worker gives jobs ids of their own");
        return;
    }
    let s = Service::new(
        vec![
            Step::call("mcp__keeper__echo", json!({"message": "keeper answers"})),
            Step::call(
                "bash",
                json!({"command": "id -u > /workspace/job-uid; echo written > /workspace/written; sleep 8"}),
            ),
            Step::text("done"),
        ],
        |_| {
            json!({"keeper": {"command": "node", "args": [EVERYTHING, "stdio"],
                "env": {"KEEPER_TOKEN": "${KEEPER_TOKEN}"},
                "description": "Holds a token", "exposure": "direct"}})
        },
        "PI_FORWARD_ENV=KEEPER_TOKEN\n",
    );
    s.seal();
    let queued = Run::from(
        s.d.command(&[
            "run",
            s.repo.to_str().unwrap(),
            "--task",
            "Work.",
            "--mcp",
            "keeper",
        ])
        .env("FAKE_API_KEY", crate::worker::MODEL_KEY)
        .env("KEEPER_TOKEN", KEEPER_TOKEN)
        .output()
        .unwrap(),
    );
    assert_eq!(queued.code, 0, "{}", queued.stderr);
    let id = queued_id(&queued);
    let mut worker = s.worker_command(&[]);
    worker.env("KEEPER_TOKEN", KEEPER_TOKEN);
    let mut worker = worker
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // While it runs, what the job writes is on its own disk (the repository has it once it ends).
    let running =
        s.d.path()
            .join("state/jobs")
            .join(&id)
            .join("merged/job-uid");
    let started = Instant::now();
    while !running.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the job never ran its command"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let as_owner = probe(&["--reuid", "65534", "--regid", "65534", "--clear-groups"]);
    let as_root = probe(&[]);
    let status = worker.wait().unwrap();
    assert!(status.success());
    let record = s.record(&id);
    assert_eq!(record["outcome"], "completed", "{record:#}");

    // The control: root finds the server's canary, and the job's processes, by their pool id.
    assert!(
        as_root.contains("FOUND"),
        "root's probe found no canary: {as_root}"
    );
    assert!(
        as_root.contains("SIGNALLED"),
        "no job process ran with a pool id: {as_root}"
    );
    // The owner's other processes find nothing, and signal nothing.
    assert!(as_owner.contains("probed"), "{as_owner}");
    assert!(
        !as_owner.contains("FOUND"),
        "the owner read a job's environment: {as_owner}"
    );
    assert!(
        !as_owner.contains("SIGNALLED"),
        "the owner signalled the job: {as_owner}"
    );
    assert!(as_owner.contains("refused"), "{as_owner}");
    // The job ran as an id of the pool; what it wrote is the owner's.
    let uid: u32 = std::fs::read_to_string(s.repo.join("job-uid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!((1_879_048_192..=1_879_048_447).contains(&uid), "{uid}");
    let written = std::fs::metadata(s.repo.join("written")).unwrap();
    assert_eq!((written.uid(), written.gid()), (65534, 65534));
}
