//! The systemd units of `examples/systemd`: `systemd-analyze verify` has nothing to say about
//! either; the worker's stops the worker the way the worker drains, restarts it, and leaves
//! bubblewrap what it needs; the receiver's runs the receiver of the same deployment with no
//! capability and write access to the state folder only; the panel's runs the panel of the same
//! deployment, seeing the worker's environment so that its health page is doctor's.

use std::path::Path;
use std::process::Command;

const UNIT: &str = include_str!("../../../../examples/systemd/pi-dispatch-worker.service");
const UNIT_NAME: &str = "pi-dispatch-worker.service";
const RECEIVER_UNIT: &str =
    include_str!("../../../../examples/systemd/pi-dispatch-receiver.service");
const RECEIVER_UNIT_NAME: &str = "pi-dispatch-receiver.service";
const RECEIVER_ENV_FILE: &str = "/etc/pi-dispatch/receiver.env";
const PANEL_UNIT: &str = include_str!("../../../../examples/systemd/pi-dispatch-panel.service");
const PANEL_UNIT_NAME: &str = "pi-dispatch-panel.service";
const PANEL_ENV_FILE: &str = "/etc/pi-dispatch/panel.env";

/// The layout the unit and docs/service.md assume.
const BINARY: &str = "/usr/local/bin/pi-dispatch";
const DEPLOYMENT: &str = "/srv/pi-dispatch";
const ENV_FILE: &str = "/etc/pi-dispatch/worker.env";

/// The worker's default `PI_WORKER_DRAIN_LIMIT`, in seconds.
const DEFAULT_DRAIN_LIMIT_SECS: u64 = 120;

/// The unit's `Key=value` lines as (section, key, value), in order; comments and blank lines are
/// left out.
fn entries(unit: &str) -> Vec<(String, String, String)> {
    let mut section = String::new();
    let mut out = Vec::new();
    for line in unit.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        assert!(!line.ends_with('\\'), "a continued line: {line}");
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_owned();
            continue;
        }
        let (key, value) = line.split_once('=').expect("a Key=value line");
        out.push((
            section.clone(),
            key.trim().to_owned(),
            value.trim().to_owned(),
        ));
    }
    out
}

/// The value `key` has in `section`: the last one set, as systemd reads single-valued keys.
fn value(unit: &str, section: &str, key: &str) -> Option<String> {
    entries(unit)
        .into_iter()
        .filter(|(s, k, _)| s == section && k == key)
        .map(|(_, _, v)| v)
        .next_back()
}

fn service(key: &str) -> Option<String> {
    value(UNIT, "Service", key)
}

/// Seconds in a systemd time span such as `180`, `180s`, `3min` or `2min 30s`.
fn seconds(span: &str) -> u64 {
    span.split_whitespace()
        .map(|part| {
            let digits = part
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(part.len());
            let (n, unit) = part.split_at(digits);
            let n: u64 = n.parse().expect("a number of seconds");
            match unit {
                "" | "s" | "sec" => n,
                "m" | "min" => n * 60,
                "h" | "hr" => n * 3600,
                other => panic!("a time unit this test does not read: {other}"),
            }
        })
        .sum()
}

#[test]
fn systemd_analyze_verify_has_nothing_to_say() {
    verify(UNIT, UNIT_NAME, ENV_FILE);
    verify(RECEIVER_UNIT, RECEIVER_UNIT_NAME, RECEIVER_ENV_FILE);
    verify(
        &PANEL_UNIT.replace(ENV_FILE, PANEL_ENV_FILE),
        PANEL_UNIT_NAME,
        PANEL_ENV_FILE,
    );
}

fn verify(text: &str, name: &str, env: &str) {
    // verify checks that the executable exists: the unit is rewritten to the built binary and a
    // scratch deployment, under its own name.
    let root = tempfile::tempdir().unwrap();
    let deployment = root.path().join("srv");
    std::fs::create_dir_all(deployment.join("state")).unwrap();
    let env_file = root.path().join("service.env");
    std::fs::write(&env_file, "").unwrap();
    let unit = text
        .replace(BINARY, env!("CARGO_BIN_EXE_pi-dispatch"))
        .replace(DEPLOYMENT, path(&deployment))
        .replace(env, path(&env_file));
    let unit_path = root.path().join(name);
    std::fs::write(&unit_path, &unit).unwrap();

    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&unit_path)
        .current_dir(root.path())
        .env_remove("SYSTEMD_LOG_LEVEL")
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "systemd-analyze cannot run ({e}): scripts/install-tests installs Debian's systemd"
            )
        });
    // verify exits 0 even for an unknown key or a value it cannot parse: any line it prints is a
    // complaint.
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success() && said.is_empty(), "{name}: {said}");
}

#[test]
fn the_receiver_unit_runs_the_receiver_of_the_same_deployment_with_nothing_more() {
    let receiver = |key: &str| value(RECEIVER_UNIT, "Service", key);
    let exec = receiver("ExecStart").unwrap();
    assert_eq!(exec, format!("{BINARY} receiver --dir {DEPLOYMENT}"));
    assert_eq!(receiver("WorkingDirectory").as_deref(), Some(DEPLOYMENT));
    assert_eq!(
        receiver("EnvironmentFile").as_deref(),
        Some(RECEIVER_ENV_FILE)
    );
    // It writes the queue, in the state folder, and nothing else.
    assert_eq!(receiver("ProtectSystem").as_deref(), Some("strict"));
    assert_eq!(
        receiver("ReadWritePaths"),
        Some(format!("{DEPLOYMENT}/state"))
    );
    // No capability, no namespace.
    assert_eq!(receiver("CapabilityBoundingSet").as_deref(), Some(""));
    assert_eq!(receiver("RestrictNamespaces").as_deref(), Some("yes"));
    assert_eq!(receiver("NoNewPrivileges").as_deref(), Some("yes"));
}

#[test]
fn the_panel_unit_runs_the_panel_of_the_same_deployment_seeing_what_the_worker_sees() {
    let panel = |key: &str| value(PANEL_UNIT, "Service", key);
    assert_eq!(
        panel("ExecStart"),
        Some(format!("{BINARY} panel --dir {DEPLOYMENT}"))
    );
    assert_eq!(panel("WorkingDirectory").as_deref(), Some(DEPLOYMENT));
    // Its health page is doctor's, so it reads the worker's environment, then its own token.
    let files: Vec<String> = entries(PANEL_UNIT)
        .into_iter()
        .filter(|(section, key, _)| section == "Service" && key == "EnvironmentFile")
        .map(|(_, _, v)| v)
        .collect();
    assert_eq!(files, [ENV_FILE, PANEL_ENV_FILE]);
    // No more than the worker may: its namespaces for doctor's sandbox, not its signals.
    assert_eq!(panel("RestrictNamespaces"), service("RestrictNamespaces"));
    assert_eq!(
        panel("CapabilityBoundingSet").as_deref(),
        Some("CAP_SETUID CAP_SETGID CAP_DAC_READ_SEARCH")
    );
    assert_eq!(panel("NoNewPrivileges").as_deref(), Some("yes"));
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn the_unit_runs_the_worker_of_the_documented_layout() {
    let exec = service("ExecStart").expect("ExecStart");
    let words: Vec<&str> = exec.split_whitespace().collect();
    assert_eq!(
        words,
        [BINARY, "worker", "--dir", DEPLOYMENT],
        "ExecStart runs the worker, with no prefix that lifts the sandboxing"
    );
    assert_eq!(service("WorkingDirectory").as_deref(), Some(DEPLOYMENT));
    // The key file is apart from the deployment folder, whose .env holds only settings.
    assert_eq!(service("EnvironmentFile").as_deref(), Some(ENV_FILE));
    assert_eq!(
        value(UNIT, "Install", "WantedBy").as_deref(),
        Some("multi-user.target")
    );
}

#[test]
fn stopping_drains_the_worker_and_a_failure_restarts_it() {
    // SIGTERM to the worker alone, which drains; SIGKILL to what is left only at the timeout.
    // control-group (the default) would send SIGTERM to every sandbox and end the jobs instead.
    assert_eq!(service("KillMode").as_deref(), Some("mixed"));
    assert!(
        matches!(
            service("KillSignal").as_deref(),
            None | Some("SIGTERM" | "TERM" | "SIGINT" | "INT")
        ),
        "the worker drains on SIGTERM or SIGINT only"
    );
    let timeout = seconds(&service("TimeoutStopSec").expect("TimeoutStopSec"));
    assert!(
        timeout > DEFAULT_DRAIN_LIMIT_SECS,
        "TimeoutStopSec is {timeout} s, not above the drain limit of {DEFAULT_DRAIN_LIMIT_SECS} s"
    );
    assert_ne!(service("SendSIGKILL").as_deref(), Some("no"));
    assert!(
        matches!(service("Restart").as_deref(), Some("on-failure" | "always")),
        "Restart restarts a worker that failed"
    );
}

#[test]
fn the_hardening_leaves_bubblewrap_what_it_needs() {
    // The namespaces bubblewrap is asked for, egress on (the most of them); a mount namespace
    // always.
    let spec = sandbox::bwrap::SandboxSpec {
        uid: sandbox::bwrap::NOBODY,
        gid: sandbox::bwrap::NOBODY,
        system: sandbox::bwrap::host_system(),
        job_dir: "/state/jobs/j/job".into(),
        overlay_dir: "/srv/overlay".into(),
        workspace: "/home/u/repo".into(),
        image_dir: "/srv/images/pi-job".into(),
        image_commands: None,
        extra_ro: Vec::new(),
        share_net: false,
        netns: None,
        host: Some((1000, 1000)),
        program: "pi-dispatch".into(),
        args: Vec::new(),
        nested: false,
        tmp_bytes: None,
        prefix: Vec::new(),
    };
    let mut needed = vec!["mnt".to_owned()];
    for arg in sandbox::bwrap::args(&spec) {
        if let Some(kind) = arg.to_str().and_then(|a| a.strip_prefix("--unshare-")) {
            needed.push(kind.trim_end_matches("-try").to_owned());
        }
    }
    assert!(needed.len() > 4, "{needed:?}");
    let allowed = service("RestrictNamespaces").expect("RestrictNamespaces");
    assert!(
        !allowed.starts_with('~'),
        "RestrictNamespaces lists what is allowed"
    );
    let allowed: Vec<&str> = allowed.split_whitespace().collect();
    for kind in &needed {
        assert!(allowed.contains(&kind.as_str()), "{kind} is not allowed");
    }
    // bubblewrap sets up a sandbox's loopback over netlink.
    let families = service("RestrictAddressFamilies").expect("RestrictAddressFamilies");
    assert!(families.split_whitespace().any(|f| f == "AF_NETLINK"));

    // Each of these, set, breaks a job.
    for (key, why) in [
        (
            "ProtectKernelTunables",
            "a read-only /proc/sys: bubblewrap cannot mount /proc",
        ),
        (
            "ProtectKernelLogs",
            "/proc/kmsg covered: bubblewrap cannot mount /proc",
        ),
        (
            "ProtectHostname",
            "a read-only /proc/sys/kernel/hostname in newer systemd",
        ),
        (
            "ProtectProc",
            "a /proc with other options than the sandbox's",
        ),
        (
            "ProcSubset",
            "a /proc with other options than the sandbox's",
        ),
        ("ProtectHome", "repositories under /home read-only or gone"),
        ("MemoryDenyWriteExecute", "Node's JIT needs writable code"),
        (
            "SystemCallFilter",
            "bubblewrap needs mount, pivot_root and unshare",
        ),
        ("PrivateUsers", "no host user to start bubblewrap as"),
        ("PrivateNetwork", "no way to the provider"),
    ] {
        assert_eq!(service(key), None, "{key}: {why}");
    }
    assert_ne!(
        service("ProtectSystem").as_deref(),
        Some("strict"),
        "repositories, wherever they are, read-only"
    );
    // Each job's disk is mounted from a loop device: the device controller lets the worker have
    // them, and no private /dev hides them.
    assert_eq!(service("PrivateDevices"), None, "loop devices hidden");
    let devices: Vec<String> = entries(UNIT)
        .into_iter()
        .filter(|(s, k, _)| s == "Service" && k == "DeviceAllow")
        .map(|(_, _, v)| v)
        .collect();
    assert_eq!(devices, ["/dev/loop-control rw", "block-loop rw"]);
    assert_eq!(service("DevicePolicy").as_deref(), Some("closed"));
    // What a root worker needs, and no more: start bubblewrap as a repository's owner, reach a
    // repository under a folder only its owner may enter, end another user's sandbox, and mount
    // each job's view of its repository, its disk and the overlay over them.
    let mut caps: Vec<String> = service("CapabilityBoundingSet")
        .expect("CapabilityBoundingSet")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    caps.sort();
    assert_eq!(
        caps,
        [
            "CAP_DAC_READ_SEARCH",
            "CAP_KILL",
            "CAP_SETGID",
            "CAP_SETUID",
            "CAP_SYS_ADMIN"
        ]
    );
}

#[test]
fn time_spans_are_read_as_systemd_reads_them() {
    assert_eq!(seconds("180"), 180);
    assert_eq!(seconds("90s"), 90);
    assert_eq!(seconds("3min"), 180);
    assert_eq!(seconds("2min 30s"), 150);
}
