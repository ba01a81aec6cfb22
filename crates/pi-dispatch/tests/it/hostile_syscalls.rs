//! A hijacked job against the kernel's less travelled system calls, as real jobs through the
//! worker with real pi, in both backends: pi's bash tool calls io_uring, the kernel's keyrings,
//! userfaultfd, perf events, bpf, ptrace, a new namespace and a mount, through perl's `syscall`.
//! Each is refused (the job's system-call filter, `hub::syscalls`, on top of the container
//! engine's own profile in Podman); the controls: `getpid` answers in the job, and the same probe
//! outside the job makes io_uring and a key.

use serde_json::json;
use testkit::fake_model::Step;

use crate::worker::{Service, stdio};

/// Each call (x86_64 numbers) with arguments that work for an ordinary process of the host, and
/// the errno it ended with (0: it worked).
const PROBE: &str = r#"
my %calls = (
  getpid => sub { syscall(39) },
  io_uring_setup => sub { my $p = "\0" x 120; syscall(425, 8, $p) },
  add_key => sub { my ($t, $d, $v) = ("user", "k", "v"); syscall(248, $t, $d, $v, 1, -2) },
  keyctl => sub { syscall(250, 0, -2, 1) },
  userfaultfd => sub { syscall(323, 1) },
  perf_event_open => sub { my $a = pack("LLQ", 1, 128, 0) . ("\0" x 112); syscall(298, $a, 0, -1, -1, 0) },
  bpf => sub { my $a = "\0" x 128; syscall(321, 0, $a, 128) },
  ptrace => sub { syscall(101, 0, 0, 0, 0) },
  unshare => sub { syscall(272, 0x04000000) },
  mount => sub { my ($s, $t, $f) = ("none", "/tmp", "tmpfs"); syscall(165, $s, $t, $f, 0, 0) },
);
for my $name (sort keys %calls) { $! = 0; my $r = $calls{$name}->(); printf "%s=%d\n", $name, $r < 0 ? $!+0 : 0; }
open(my $s, "<", "/proc/self/status"); while (<$s>) { print if /^Seccomp/ }
"#;

/// The errno of `name` in the probe's output.
fn errno(said: &str, name: &str) -> i64 {
    said.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not probed: {said}"))
}

/// Runs the probe as a job's bash tool under `env`; what it printed.
fn probed(env: &str) -> String {
    let s = Service::new(
        vec![
            Step::call("bash", json!({"command": "perl /workspace/probe.pl"})),
            Step::text("probed"),
        ],
        |_| json!({"everything": stdio(None)}),
        env,
    );
    std::fs::write(s.repo.join("probe.pl"), PROBE).unwrap();
    let (_, _, results, _) = s.complete("Probe the kernel.", "everything");
    results[1].clone()
}

/// How many filters the probe's process has.
fn filters(said: &str) -> u32 {
    said.lines()
        .find_map(|l| l.strip_prefix("Seccomp_filters:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no filter count: {said}"))
}

fn refused_in_a_job(said: &str) {
    const EPERM: i64 = 1;
    // The control: the probe ran, and a call of no concern answered.
    assert_eq!(errno(said, "getpid"), 0, "{said}");
    for name in [
        "io_uring_setup",
        "add_key",
        "keyctl",
        "userfaultfd",
        "perf_event_open",
        "bpf",
        "ptrace",
        "unshare",
        "mount",
    ] {
        assert_eq!(errno(said, name), EPERM, "{name}: {said}");
    }
    // A filter is on (mode 2), and more than one for what pi's tools run.
    assert!(said.contains("Seccomp:\t2"), "{said}");
}

/// What the control outside a job calls: nothing that changes the host (no mount, no namespace),
/// as an ordinary user.
const HOST_PROBE: &str = r#"
my %calls = (
  io_uring_setup => sub { my $p = "\0" x 120; syscall(425, 8, $p) },
  add_key => sub { my ($t, $d, $v) = ("user", "k", "v"); syscall(248, $t, $d, $v, 1, -2) },
);
for my $name (sort keys %calls) { $! = 0; my $r = $calls{$name}->(); printf "%s=%d\n", $name, $r < 0 ? $!+0 : 0; }
"#;

/// The control outside any job: the host lets an ordinary process (nobody) set up io_uring and
/// add a key to its own keyring, so the refusals in the job are the job's.
fn host_allows() {
    let out = std::process::Command::new("setpriv")
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "perl",
            "-e",
        ])
        .arg(HOST_PROBE)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(errno(&said, "io_uring_setup"), 0, "{said}");
    assert_eq!(errno(&said, "add_key"), 0, "{said}");
}

#[test]
fn a_jobs_tools_are_refused_the_calls_container_engines_refuse_under_bubblewrap() {
    host_allows();
    let said = probed("");
    refused_in_a_job(&said);
    // The runner's filter and the confined ones, no engine's.
    assert_eq!(filters(&said), 3, "{said}");
}

#[test]
fn a_jobs_tools_are_refused_the_same_calls_in_a_podman_container() {
    host_allows();
    let said = probed(&format!(
        "PI_SANDBOX=podman\nPI_PODMAN_IMAGE={}\nPI_PODMAN_RUNTIME=runc\n",
        testkit::podman_base_image()
    ));
    refused_in_a_job(&said);
    // The engine's own profile is on too: one filter more than under bubblewrap.
    assert_eq!(filters(&said), 4, "{said}");
}
