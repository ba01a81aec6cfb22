#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The sandbox's contract, one suite run on both backends through the `Backend` trait: bubblewrap,
//! and Podman (Debian's podman with runc, the test's base image from `scripts/install-tests`). What a job
//! can see, write and reach, who it runs as, its exact environment, that no value of it is on a
//! command line or in the engine's record of the container, and how it ends: at its time limit,
//! when dropped, and with its worker.

use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sandbox::backend::{Backend, Bubblewrap, JobSpec, Network, RunningJob};
use sandbox::bwrap::{self, Ending};
use sandbox::env::JobEnv;
use sandbox::podman::{Limits, Podman};
use tempfile::TempDir;
use tokio::io::AsyncReadExt;

/// No test waits longer than this for a job.
mod common;
use common::{eventually, job_env, marker};

/// The id the jobs of this suite run under.
const JOB_ID: &str = "job-contract";
const BOUND: Duration = Duration::from_secs(90);

/// The user a job's files belong to on the host.
const JOB_USER: (u32, u32) = (4242, 4242);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Bubblewrap,
    Podman,
}

fn backend(kind: Kind) -> Box<dyn Backend> {
    match kind {
        Kind::Bubblewrap => Box::new(Bubblewrap {
            bwrap: bwrap::BWRAP.into(),
            limits: Vec::new(),
        }),
        Kind::Podman => Box::new(Podman {
            program: config::settings::PODMAN.into(),
            runtime: Some("runc".into()),
            limits: Limits {
                pids: 256,
                memory_mib: 512,
                nofile: 1024,
                nproc: 1024,
            },
            base_image: Some(testkit::podman_base_image()),
            launcher: vec!["/opt/pi-dispatch-image/bin/sandbox-job-env".into()],
        }),
    }
}

/// A job's host folders: `/job` (with a prompt), the overlay, the image (with a script and the
/// container launcher) and the workspace (the job user's).
struct Fixture {
    _root: TempDir,
    job: PathBuf,
    overlay: PathBuf,
    image: PathBuf,
    workspace: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        Fixture::new_in(&std::env::temp_dir())
    }

    fn new_in(parent: &Path) -> Fixture {
        let root = tempfile::tempdir_in(parent).unwrap();
        let open = |p: &Path| std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755));
        open(root.path()).unwrap();
        let dir = |name: &str| {
            let p = root.path().join(name);
            std::fs::create_dir_all(&p).unwrap();
            open(&p).unwrap();
            p
        };
        let job = dir("job");
        let prompt = job.join("prompt.md");
        std::fs::write(&prompt, "the prompt\n").unwrap();
        std::fs::set_permissions(&prompt, std::fs::Permissions::from_mode(0o444)).unwrap();
        let overlay = dir("overlay");
        std::fs::write(overlay.join("mcp.json"), "{}\n").unwrap();
        let image = dir("image");
        dir("image/bin");
        let hello = image.join("hello");
        std::fs::write(&hello, "#!/bin/sh\necho hello from the image\n").unwrap();
        std::fs::set_permissions(&hello, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::copy(
            env!("CARGO_BIN_EXE_sandbox-job-env"),
            image.join("bin/sandbox-job-env"),
        )
        .unwrap();
        let workspace = dir("workspace");
        std::os::unix::fs::chown(&workspace, Some(JOB_USER.0), Some(JOB_USER.1)).unwrap();
        Fixture {
            _root: root,
            job,
            overlay,
            image,
            workspace,
        }
    }

    /// `sh -c script` as the job, with no network of its own unless `network` says so.
    fn spec(&self, script: &str, network: Network) -> JobSpec {
        JobSpec {
            job_dir: self.job.clone(),
            overlay_dir: self.overlay.clone(),
            image_dir: self.image.clone(),
            image_name: "pi-job".into(),
            workspace: self.workspace.clone(),
            host_user: Some(JOB_USER),
            network,
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            nested: false,
            bounds: None,
        }
    }
}

struct Output {
    ending: Ending,
    stdout: String,
    stderr: String,
}

impl Output {
    fn success(&self) -> bool {
        matches!(self.ending, Ending::Exited(s) if s.success())
    }
}

/// Runs a job to its end (at most `limit`), its input closed once the backend has written
/// whatever it writes first.
async fn run_for(kind: Kind, spec: &JobSpec, env: &JobEnv, limit: Duration) -> Output {
    let backend = backend(kind);
    let mut job = backend.start(spec, env).await.unwrap();
    drop(job.stdin());
    finish(job.as_mut(), limit).await
}

async fn run(kind: Kind, spec: &JobSpec, env: &JobEnv) -> Output {
    run_for(kind, spec, env, BOUND).await
}

async fn finish(job: &mut dyn RunningJob, limit: Duration) -> Output {
    let mut out = job.stdout().unwrap();
    let mut err = job.stderr().unwrap();
    let work = async {
        let mut stdout = String::new();
        let mut stderr = String::new();
        let (a, b, ending) = tokio::join!(
            out.read_to_string(&mut stdout),
            err.read_to_string(&mut stderr),
            job.wait_with_limit(limit)
        );
        a.unwrap();
        b.unwrap();
        Output {
            ending: ending.unwrap(),
            stdout,
            stderr,
        }
    };
    tokio::time::timeout(BOUND + Duration::from_secs(30), work)
        .await
        .expect("the job ends")
}

/// Live host processes whose environment holds `CONTRACT_MARK=mark`.
fn marked(mark: &str) -> Vec<u32> {
    testkit::processes_with(&format!("CONTRACT_MARK={mark}"))
        .into_iter()
        .map(|(pid, _)| pid)
        .collect()
}

/// Each test, once a backend.
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod on_bubblewrap {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
              async fn $name() { super::$name(super::Kind::Bubblewrap).await })*
        }
        mod on_podman {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
              async fn $name() { super::$name(super::Kind::Podman).await })*
        }
    };
}

both_backends!(
    the_root_and_job_folders_are_read_only_and_the_workspace_writable,
    the_job_is_unprivileged_with_no_capability,
    the_job_has_its_own_pid_namespace_and_no_network,
    with_egress_off_the_job_reaches_out_but_never_the_host,
    the_environment_is_exactly_the_map_and_on_no_command_line,
    the_time_limit_kills_the_whole_tree,
    a_dropped_job_is_ended,
    the_job_dies_with_its_worker,
);

async fn the_root_and_job_folders_are_read_only_and_the_workspace_writable(kind: Kind) {
    let fx = Fixture::new();
    let script = r#"
        for p in /usr /etc /job /opt/pi-global /opt/pi-dispatch-image / ; do
            if touch "$p/written" 2>/dev/null; then echo "WROTE $p"; fi
        done
        cat /job/prompt.md
        /opt/pi-dispatch-image/hello
        echo work > /workspace/made && echo "workspace ok"
        echo t > /tmp/t && ls -A /tmp
    "#;
    let out = run(kind, &fx.spec(script, Network::None), &job_env(JOB_ID, &[])).await;
    assert!(out.success(), "{:?} {}", out.ending, out.stderr);
    assert!(!out.stdout.contains("WROTE"), "{}", out.stdout);
    assert!(out.stdout.contains("the prompt"), "{}", out.stdout);
    assert!(
        out.stdout.contains("hello from the image"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("workspace ok"), "{}", out.stdout);
    // /tmp is the job's own and empty but for what it wrote.
    assert!(out.stdout.trim_end().ends_with("\nt"), "{}", out.stdout);
    // What it wrote is the job user's on the host.
    let made = std::fs::metadata(fx.workspace.join("made")).unwrap();
    assert_eq!((made.uid(), made.gid()), JOB_USER);
}

async fn the_job_is_unprivileged_with_no_capability(kind: Kind) {
    let fx = Fixture::new();
    let script = "id -u; grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs):' /proc/self/status";
    let out = run(kind, &fx.spec(script, Network::None), &job_env(JOB_ID, &[])).await;
    assert!(out.success(), "{}", out.stderr);
    let mut lines = out.stdout.lines();
    assert_ne!(lines.next(), Some("0"), "the job runs as root");
    for line in lines {
        let (name, value) = line.split_once(':').unwrap();
        let value = value.trim();
        if name == "NoNewPrivs" {
            assert_eq!(value, "1", "{line}");
        } else {
            assert_eq!(value, "0000000000000000", "{line}");
        }
    }
}

async fn the_job_has_its_own_pid_namespace_and_no_network(kind: Kind) {
    let fx = Fixture::new();
    let script = "ls /proc | grep -c '^[0-9][0-9]*$'; tail -n +3 /proc/net/dev | cut -d: -f1";
    let out = run(kind, &fx.spec(script, Network::None), &job_env(JOB_ID, &[])).await;
    assert!(out.success(), "{}", out.stderr);
    let mut lines = out.stdout.lines();
    let pids: usize = lines.next().unwrap().trim().parse().unwrap();
    assert!(pids < 10, "the job sees {pids} processes");
    let interfaces: Vec<&str> = lines.map(str::trim).collect();
    assert_eq!(interfaces, ["lo"], "{}", out.stdout);
    // Sharing the host's network, it sees the host's interfaces.
    let out = run(kind, &fx.spec(script, Network::Host), &job_env(JOB_ID, &[])).await;
    let host_interfaces = std::fs::read_to_string("/proc/net/dev")
        .unwrap()
        .lines()
        .count()
        - 2;
    assert_eq!(
        out.stdout.lines().count() - 1,
        host_interfaces,
        "{}",
        out.stdout
    );
}

/// Egress off: the job's own network reaches a host outside (a test host in a network namespace),
/// and neither the host's loopback nor any of the host's own addresses; its resolver is
/// slirp4netns's.
async fn with_egress_off_the_job_reaches_out_but_never_the_host(kind: Kind) {
    let outside = testkit::netns::TestHost::new();
    let far = outside.tcp(0);
    let far_port = far.local_addr().unwrap().port();
    // Every address of the host, loopback included, each answering the host (the control).
    let near = testkit::netns::HostListener::new();
    let (near_port, host_v4) = (near.port, near.v4.clone());
    let mut probes = vec![
        ("far".to_owned(), format!("{}:{far_port}", outside.v4)),
        ("slirp-host".to_owned(), format!("10.0.2.2:{near_port}")),
        ("slirp-dns".to_owned(), format!("10.0.2.3:{near_port}")),
    ];
    for a in &host_v4 {
        probes.push((format!("host {a}"), format!("{a}:{near_port}")));
    }
    let script: String = probes
        .iter()
        .map(|(name, addr)| {
            let (ip, port) = addr.rsplit_once(':').unwrap();
            format!(
                "if timeout 5 bash -c 'exec 3<>/dev/tcp/{ip}/{port}' 2>/dev/null; then echo '{name} reached'; else echo '{name} refused'; fi; "
            )
        })
        .collect::<String>()
        + "cat /etc/resolv.conf; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '";
    let network = sandbox::outside::Outside::start(Path::new(sandbox::outside::SLIRP4NETNS), &[])
        .expect("the job's network is made");
    // slirp4netns unmounts nothing of the host's: the test host's namespace, a mount under the
    // shared /run/netns, is still there to enter.
    drop(outside.tcp(0));
    let spec = fx_spec(
        &script,
        Network::Outside {
            netns: std::os::fd::AsRawFd::as_raw_fd(&network.netns()),
        },
    );
    let out = run(kind, &spec.1, &job_env(JOB_ID, &[])).await;
    drop(near);
    assert!(out.success(), "{}", out.stderr);
    let said: Vec<&str> = out.stdout.lines().collect();
    assert!(
        said.contains(&"far reached"),
        "the probe ran: {}",
        out.stdout
    );
    assert!(said.contains(&"slirp-host refused"), "{}", out.stdout);
    for a in &host_v4 {
        assert!(
            said.contains(&format!("host {a} refused").as_str()),
            "{}",
            out.stdout
        );
    }
    assert!(said.contains(&"slirp-dns refused"), "{}", out.stdout);
    // Its resolver: the host's nameservers it can reach, never one on loopback or slirp4netns's.
    let servers: Vec<&str> = said
        .iter()
        .filter_map(|l| l.strip_prefix("nameserver "))
        .collect();
    let expected = sandbox::outside::nameservers(&sandbox::outside::resolver_conf());
    assert_eq!(
        servers,
        expected.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "{}",
        out.stdout
    );
    let interfaces: BTreeSet<&str> = said.iter().rev().take(2).copied().collect();
    assert_eq!(interfaces, BTreeSet::from(["lo", "tap0"]), "{}", out.stdout);
}

/// A fixture and a spec of it (the fixture must outlive the job).
fn fx_spec(script: &str, network: Network) -> (Fixture, JobSpec) {
    let fx = Fixture::new();
    let spec = fx.spec(script, network);
    (fx, spec)
}

async fn the_environment_is_exactly_the_map_and_on_no_command_line(kind: Kind) {
    const CANARY: &str = "CNRY-contract-value-71c4";
    // A job id of its own: the engine is asked about this test's container alone, never about
    // one another test is removing meanwhile.
    const ID: &str = "job-contract-environment";
    let fx = Fixture::new();
    let env = job_env(ID, &[("DOCS_TOKEN", CANARY)]);
    let backend = backend(kind);
    // While it runs: every command line on the host, and the engine's record of the container.
    let mut job = backend
        .start(
            &fx.spec("cat /proc/self/environ; sleep 4", Network::None),
            &env,
        )
        .await
        .unwrap();
    drop(job.stdin());
    if kind == Kind::Podman {
        // `start` returns once the engine was asked to run the job; the container is the
        // engine's to make, within moments, and is looked at while it runs.
        let asked = std::time::Instant::now();
        while containers_of(ID).is_empty() {
            assert!(asked.elapsed() < BOUND, "no container was made");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let mut leaks: Vec<String> = Vec::new();
    for pid in std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
    {
        if let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline"))
            && String::from_utf8_lossy(&cmdline).contains(CANARY)
        {
            leaks.push(format!("pid {pid}"));
        }
    }
    if kind == Kind::Podman {
        let inspect = std::process::Command::new("podman")
            .args(["inspect", "--type", "container"])
            .args(containers_of(ID))
            .output()
            .unwrap();
        assert!(
            inspect.status.success(),
            "{}",
            String::from_utf8_lossy(&inspect.stderr)
        );
        let text = String::from_utf8_lossy(&inspect.stdout);
        assert!(text.contains(ID), "no container was inspected");
        if text.contains(CANARY) {
            leaks.push("podman inspect".to_owned());
        }
        // Nor in any file the engine keeps for the container (its config.json among them).
        let dirs = std::process::Command::new("podman")
            .args([
                "inspect",
                "--type",
                "container",
                "--format",
                "{{.StaticDir}}\n{{.ConmonPidFile}}",
            ])
            .args(containers_of(ID))
            .output()
            .unwrap();
        let mut scanned = 0;
        for line in String::from_utf8_lossy(&dirs.stdout).lines() {
            let path = Path::new(line.trim());
            let dir = if path.is_dir() {
                path
            } else {
                path.parent().unwrap_or(path)
            };
            for file in files_under(dir) {
                scanned += 1;
                if std::fs::read(&file).is_ok_and(|b| String::from_utf8_lossy(&b).contains(CANARY))
                {
                    leaks.push(file.display().to_string());
                }
            }
        }
        assert!(scanned > 0, "no file of the engine's was read");
    }
    let out = finish(job.as_mut(), BOUND).await;
    assert_eq!(
        leaks,
        Vec::<String>::new(),
        "a value was seen outside the job"
    );
    assert!(out.success(), "{}", out.stderr);
    let seen: BTreeSet<String> = out
        .stdout
        .split('\0')
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect();
    let mut expected: BTreeSet<String> = env
        .iter()
        .map(|(n, v)| format!("{n}={}", v.expose()))
        .collect();
    // Both set PWD to the working directory; nothing else is added.
    expected.insert("PWD=/workspace".to_owned());
    assert_eq!(seen, expected);
}

/// Every file under `dir` (links not followed).
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match entry.file_type() {
                Ok(t) if t.is_dir() => stack.push(entry.path()),
                Ok(t) if t.is_file() => out.push(entry.path()),
                _ => {}
            }
        }
    }
    out
}

/// The containers labelled with job `id`.
fn containers_of(id: &str) -> Vec<String> {
    let out = std::process::Command::new("podman")
        .args(["ps", "--all", "--quiet", "--filter"])
        .arg(format!("label={}={id}", sandbox::podman::JOB_LABEL))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

async fn the_time_limit_kills_the_whole_tree(kind: Kind) {
    let fx = Fixture::new();
    let mark = marker("limit");
    let env = job_env(JOB_ID, &[("CONTRACT_MARK", &mark)]);
    let out = run_for(
        kind,
        &fx.spec("sleep 300 & sleep 300", Network::None),
        &env,
        Duration::from_secs(2),
    )
    .await;
    assert_eq!(out.ending, Ending::KilledAtLimit);
    assert!(
        eventually(Duration::from_secs(10), || marked(&mark).is_empty()).await,
        "a process outlived the time limit"
    );
}

async fn a_dropped_job_is_ended(kind: Kind) {
    let fx = Fixture::new();
    let mark = marker("dropped");
    let env = job_env(JOB_ID, &[("CONTRACT_MARK", &mark)]);
    let backend = backend(kind);
    let job = backend
        .start(&fx.spec("sleep 300 & sleep 300", Network::None), &env)
        .await
        .unwrap();
    assert!(eventually(BOUND, || marked(&mark).len() >= 2).await);
    drop(job);
    assert!(
        eventually(Duration::from_secs(10), || marked(&mark).is_empty()).await,
        "the job outlived its handle"
    );
}

/// The worker `the_job_dies_with_its_worker` starts and kills outright: it starts a job and waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a helper: run by the_job_dies_with_its_worker in a process of its own"]
async fn helper_worker_holding_a_job() {
    let (Ok(mark), Ok(dir), Ok(kind)) = (
        std::env::var("CONTRACT_HELPER_MARK"),
        std::env::var("CONTRACT_HELPER_DIR"),
        std::env::var("CONTRACT_HELPER_KIND"),
    ) else {
        return;
    };
    let kind = if kind == "podman" {
        Kind::Podman
    } else {
        Kind::Bubblewrap
    };
    let fx = Fixture::new_in(Path::new(&dir));
    let env = job_env(JOB_ID, &[("CONTRACT_MARK", &mark)]);
    let backend = backend(kind);
    let _job = backend
        .start(&fx.spec("sleep 1000 & sleep 1000", Network::None), &env)
        .await
        .unwrap();
    tokio::time::sleep(BOUND).await;
}

async fn the_job_dies_with_its_worker(kind: Kind) {
    let mark = marker("worker");
    let dir = tempfile::tempdir().unwrap();
    let mut worker = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "helper_worker_holding_a_job",
            "--ignored",
            "--test-threads=1",
        ])
        .env("CONTRACT_HELPER_MARK", &mark)
        .env("CONTRACT_HELPER_DIR", dir.path())
        .env(
            "CONTRACT_HELPER_KIND",
            if kind == Kind::Podman {
                "podman"
            } else {
                "bubblewrap"
            },
        )
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        eventually(BOUND, || marked(&mark).len() >= 2).await,
        "the helper's job never started"
    );
    // SIGKILL: nothing in the worker runs to clean up.
    worker.kill().unwrap();
    worker.wait().unwrap();
    assert!(
        eventually(Duration::from_secs(20), || marked(&mark).is_empty()).await,
        "the job outlived its worker"
    );
}

/// The container's limits are the kernel's: its pids and memory cgroups say what the backend asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_podman_jobs_pids_and_memory_are_limited() {
    let fx = Fixture::new();
    let script = "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max; \
                  cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max; \
                  grep -E '^Max (open files|processes)' /proc/self/limits | tr -s ' ' | cut -d' ' -f4";
    let out = run(
        Kind::Podman,
        &fx.spec(script, Network::None),
        &job_env(JOB_ID, &[]),
    )
    .await;
    assert!(out.success(), "{}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(
        lines,
        ["256", &(512u64 * 1024 * 1024).to_string(), "1024", "1024"],
        "{}",
        out.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_podman_job_the_engine_cannot_run_is_the_sandboxs_failure_not_the_jobs() {
    const ID: &str = "job-contract-engine-failed";
    let fx = Fixture::new();
    let podman = Podman {
        program: config::settings::PODMAN.into(),
        runtime: Some("runc".into()),
        limits: Limits::within_own(),
        base_image: Some("localhost/pi-dispatch-no-such-image:absent".into()),
        launcher: vec!["/opt/pi-dispatch-image/bin/sandbox-job-env".into()],
    };
    let mut job = podman
        .start(&fx.spec("echo ran", Network::None), &job_env(ID, &[]))
        .await
        .unwrap();
    drop(job.stdin());
    let ending = job.wait_with_limit(BOUND).await;
    assert!(ending.is_err(), "{ending:?}");
    assert!(containers_of(ID).is_empty(), "a container was left");
    // The control: the same start with the test's image runs the script.
    let out = run(
        Kind::Podman,
        &fx.spec("echo ran", Network::None),
        &job_env(ID, &[]),
    )
    .await;
    assert!(out.success(), "{}", out.stderr);
    assert_eq!(out.stdout, "ran\n");
}
