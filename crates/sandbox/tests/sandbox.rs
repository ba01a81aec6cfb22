#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The sandbox under real bubblewrap (Debian's `bubblewrap` package): what a job can see, write
//! and reach, who it runs as, its environment, and how it ends.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use sandbox::bwrap::{self, Bind, Ending, NOBODY, Sandbox, SandboxSpec};
use sandbox::env::JobEnv;
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// No test waits longer than this for a job.
mod common;
use common::{eventually, job_env, marker};

/// The id the jobs of this suite run under.
const JOB_ID: &str = "job-test";
const BOUND: Duration = Duration::from_secs(60);

fn bwrap_path() -> &'static Path {
    let path = Path::new(bwrap::BWRAP);
    assert!(
        path.is_file(),
        "{} is missing: install Debian's bubblewrap package",
        path.display()
    );
    path
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A job's host folders: `/job` (with a prompt), the overlay, the image (with a script), the
/// workspace (the job user's), and an extra read-only folder.
struct Fixture {
    _root: TempDir,
    job: PathBuf,
    overlay: PathBuf,
    image: PathBuf,
    workspace: PathBuf,
    extra: PathBuf,
}

impl Fixture {
    fn new(uid: u32, gid: u32) -> Fixture {
        Fixture::new_in(&std::env::temp_dir(), uid, gid)
    }

    fn new_in(parent: &Path, uid: u32, gid: u32) -> Fixture {
        let root = tempfile::tempdir_in(parent).unwrap();
        let open = |p: &Path| std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755));
        open(root.path()).unwrap();
        let dir = |name: &str| {
            let p = root.path().join(name);
            std::fs::create_dir(&p).unwrap();
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
        let hello = image.join("hello");
        std::fs::write(&hello, "#!/bin/sh\necho hello from the image\n").unwrap();
        std::fs::set_permissions(&hello, std::fs::Permissions::from_mode(0o755)).unwrap();
        let extra = dir("extra");
        std::fs::write(extra.join("note"), "extra\n").unwrap();
        let workspace = dir("workspace");
        if is_root() {
            std::os::unix::fs::chown(&workspace, Some(uid), Some(gid)).unwrap();
        }
        Fixture {
            _root: root,
            job,
            overlay,
            image,
            workspace,
            extra,
        }
    }

    /// `sh -c script` as the job, egress on (no network).
    fn spec(&self, script: &str) -> SandboxSpec {
        SandboxSpec {
            uid: NOBODY,
            gid: NOBODY,
            system: bwrap::host_system(),
            job_dir: self.job.clone(),
            overlay_dir: self.overlay.clone(),
            workspace: self.workspace.clone(),
            image_dir: self.image.clone(),
            image_commands: None,
            extra_ro: vec![Bind {
                host: self.extra.clone(),
                sandbox: "/opt/extra".into(),
            }],
            share_net: false,
            netns: None,
            host: None,
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            nested: false,
            tmp_bytes: None,
            prefix: Vec::new(),
        }
    }
}

struct Output {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Runs a job to its end, its standard input closed at once.
async fn run(spec: &SandboxSpec, env: &JobEnv) -> Output {
    let mut sandbox = bwrap::spawn(bwrap_path(), spec, env).await.unwrap();
    drop(sandbox.stdin());
    finish(&mut sandbox).await
}

async fn finish(sandbox: &mut Sandbox) -> Output {
    let mut out = sandbox.stdout().unwrap();
    let mut err = sandbox.stderr().unwrap();
    let work = async {
        let mut stdout = String::new();
        let mut stderr = String::new();
        let (a, b, status) = tokio::join!(
            out.read_to_string(&mut stdout),
            err.read_to_string(&mut stderr),
            sandbox.wait()
        );
        a.unwrap();
        b.unwrap();
        Output {
            status: status.unwrap(),
            stdout,
            stderr,
        }
    };
    tokio::time::timeout(BOUND, work)
        .await
        .expect("the job ends")
}

/// Live host processes whose environment holds `NAME=value`.
fn processes_with(name: &str, value: &str) -> Vec<u32> {
    testkit::processes_with(&format!("{name}={value}"))
        .into_iter()
        .map(|(pid, _)| pid)
        .collect()
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .collect()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Whether, within 5 s, no process marked `mark` is left.
async fn all_gone(mark: &str) -> bool {
    eventually(Duration::from_secs(5), || {
        processes_with("SANDBOX_TEST_MARK", mark).is_empty()
    })
    .await
}

/// Whether, within [`BOUND`], at least `n` processes marked `mark` run.
async fn running(mark: &str, n: usize) -> bool {
    eventually(BOUND, || {
        processes_with("SANDBOX_TEST_MARK", mark).len() >= n
    })
    .await
}

/// Polls until `f` holds, for at most `within`.
#[tokio::test]
async fn the_system_and_job_folders_are_read_only_and_the_workspace_writable() {
    let fx = Fixture::new(NOBODY, NOBODY);
    let script = r#"
        for p in /usr /etc /bin /job /opt/pi-global /opt/pi-dispatch-image /opt/extra / ; do
            if touch "$p/written" 2>/dev/null; then echo "$p writable"; else echo "$p read-only"; fi
        done
        echo job > /workspace/out && echo "/workspace writable"
        cat /job/prompt.md /opt/pi-global/mcp.json /opt/extra/note
        /opt/pi-dispatch-image/hello
        pwd
    "#;
    let out = run(&fx.spec(script), &job_env(JOB_ID, &[])).await;
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(
        out.stdout,
        "/usr read-only\n/etc read-only\n/bin read-only\n/job read-only\n/opt/pi-global read-only\n\
         /opt/pi-dispatch-image read-only\n/opt/extra read-only\n/ read-only\n/workspace writable\n\
         the prompt\n{}\nextra\nhello from the image\n/workspace\n"
    );
    let written = fx.workspace.join("out");
    assert_eq!(std::fs::read_to_string(&written).unwrap(), "job\n");
    assert!(!fx.job.join("written").exists());
    if is_root() {
        // The job is the unprivileged user on the host too.
        let meta = std::fs::metadata(&written).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (NOBODY, NOBODY));
    }
}

#[tokio::test]
async fn a_deployment_under_a_folder_the_job_user_cannot_enter_still_runs() {
    // A root worker's job runs as nobody, who cannot enter the 0700 folder above the deployment:
    // the worker's descriptors, not host paths, bring the folders into the sandbox.
    if !is_root() {
        eprintln!("skipped: only a root worker runs the job as another user");
        return;
    }
    let closed = tempfile::tempdir().unwrap();
    std::fs::set_permissions(closed.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let meta = std::fs::metadata(closed.path()).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o700));
    let fx = Fixture::new_in(closed.path(), NOBODY, NOBODY);
    let script = "id -u; cat /job/prompt.md /opt/pi-global/mcp.json /opt/extra/note; \
                  /opt/pi-dispatch-image/hello; echo job > /workspace/out && echo written";
    let out = run(&fx.spec(script), &job_env(JOB_ID, &[])).await;
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(
        out.stdout,
        "65534\nthe prompt\n{}\nextra\nhello from the image\nwritten\n"
    );
    let written = fx.workspace.join("out");
    assert_eq!(std::fs::read_to_string(&written).unwrap(), "job\n");
    let meta = std::fs::metadata(&written).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (NOBODY, NOBODY));
}

#[tokio::test]
async fn a_folder_that_is_a_link_is_not_followed() {
    let fx = Fixture::new(NOBODY, NOBODY);
    let link = fx.job.with_file_name("job-link");
    std::os::unix::fs::symlink(&fx.job, &link).unwrap();
    let spec = SandboxSpec {
        job_dir: link,
        ..fx.spec("true")
    };
    match bwrap::spawn(bwrap_path(), &spec, &job_env(JOB_ID, &[])).await {
        Err(e @ bwrap::SpawnError::Open { .. }) => {
            assert!(
                e.to_string().starts_with("the job folder cannot be opened"),
                "{e}"
            );
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a link was followed"),
    }
}

#[tokio::test]
async fn tmp_is_empty_and_private() {
    let fx = Fixture::new(NOBODY, NOBODY);
    let mark = marker("tmp");
    let host_file = Path::new("/tmp").join(format!("host-{mark}"));
    std::fs::write(&host_file, "host").unwrap();
    let script = format!(
        "ls -A /tmp; echo end; echo inside > /tmp/inside-{mark} && echo wrote; test -e /tmp/host-{mark} || echo no-host-file"
    );
    let out = run(&fx.spec(&script), &job_env(JOB_ID, &[])).await;
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(out.stdout, "end\nwrote\nno-host-file\n");
    assert!(!Path::new("/tmp").join(format!("inside-{mark}")).exists());
    std::fs::remove_file(host_file).unwrap();
}

#[tokio::test]
async fn the_job_runs_unprivileged_with_no_capabilities() {
    let fx = Fixture::new(NOBODY, NOBODY);
    let script = "id -u; id -g; grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status";
    let out = run(&fx.spec(script), &job_env(JOB_ID, &[])).await;
    assert!(out.status.success(), "{}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines[..2], ["65534", "65534"]);
    let status: BTreeMap<&str, &str> = lines[2..]
        .iter()
        .map(|l| {
            let (k, v) = l.split_once(':').unwrap();
            (k, v.trim())
        })
        .collect();
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(status[cap], "0000000000000000", "{cap}");
    }
    assert_eq!(status["NoNewPrivs"], "1");
}

#[tokio::test]
async fn the_job_user_is_configurable() {
    let (uid, gid) = (4242, 4343);
    let fx = Fixture::new(uid, gid);
    let spec = SandboxSpec {
        uid,
        gid,
        ..fx.spec("id -u; id -g; touch /workspace/mine")
    };
    let out = run(&spec, &job_env(JOB_ID, &[])).await;
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(out.stdout, "4242\n4343\n");
    if is_root() {
        let meta = std::fs::metadata(fx.workspace.join("mine")).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (uid, gid));
    }
}

#[tokio::test]
async fn the_job_has_its_own_pid_namespace() {
    let fx = Fixture::new(NOBODY, NOBODY);
    let script = "echo $$; for p in /proc/[0-9]*; do echo ${p#/proc/}; done";
    let mut sandbox = bwrap::spawn(bwrap_path(), &fx.spec(script), &job_env(JOB_ID, &[]))
        .await
        .unwrap();
    let init = sandbox
        .init_pid()
        .expect("bubblewrap reports its first process");
    assert_ne!(Some(init), sandbox.id());
    let out = finish(&mut sandbox).await;
    assert!(out.status.success(), "{}", out.stderr);
    let pids: Vec<u32> = out.stdout.lines().map(|l| l.parse().unwrap()).collect();
    // The job's shell is the second process of its namespace (bubblewrap's init is the first),
    // and it sees only the namespace's few processes, none of the host's.
    assert_eq!(pids[0], 2);
    let seen = &pids[1..];
    assert!(seen.contains(&1) && seen.contains(&2), "{seen:?}");
    assert!(seen.iter().all(|p| *p < 10), "{seen:?}");
    assert!(all_pids().len() > seen.len());
}

#[tokio::test]
async fn the_network_is_the_hosts_only_when_shared() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accept = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut got = String::new();
        s.read_to_string(&mut got).await.unwrap();
        got
    });
    let fx = Fixture::new(NOBODY, NOBODY);
    let script = format!(
        "grep -c : /proc/net/dev; if bash -c 'echo hello > /dev/tcp/127.0.0.1/{port}' 2>/dev/null; then echo reached; else echo unreachable; fi"
    );

    let own = run(&fx.spec(&script), &job_env(JOB_ID, &[])).await;
    assert!(own.status.success(), "{}", own.stderr);
    // Only the sandbox's own loopback, and the host's listener out of reach.
    assert_eq!(own.stdout, "1\nunreachable\n");

    let shared = SandboxSpec {
        share_net: true,
        netns: None,
        host: None,
        ..fx.spec(&script)
    };
    let out = run(&shared, &job_env(JOB_ID, &[])).await;
    assert!(out.status.success(), "{}", out.stderr);
    assert!(out.stdout.ends_with("reached\n"), "{}", out.stdout);
    let got = tokio::time::timeout(BOUND, accept).await.unwrap().unwrap();
    assert_eq!(got, "hello\n");
}

#[tokio::test]
async fn with_no_network_of_its_own_the_job_has_loopback_no_nameserver_and_its_socket() {
    // The way out a job with egress on has: a socket in its folder, mode 0666 (the proxy's).
    let fx = Fixture::new(NOBODY, NOBODY);
    let path = fx.job.join("egress.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let serve = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        s.write_all(b"through the socket\n").await.unwrap();
    });
    // Loopback answers inside (a listener and a connection of the job's own), no nameserver is
    // named, and the job's user reaches the socket bound at /job.
    let script = r#"perl -MIO::Socket::INET -MIO::Socket::UNIX -e '
        my $l = IO::Socket::INET->new(Listen => 1, LocalAddr => "127.0.0.1:0") or die "listen: $!";
        my $c = IO::Socket::INET->new(PeerAddr => "127.0.0.1:" . $l->sockport) or die "connect: $!";
        my $a = $l->accept; print $c "over loopback\n"; close $c; print scalar <$a>;
        my $u = IO::Socket::UNIX->new(Peer => "/job/egress.sock") or die "unix: $!";
        print scalar <$u>;'
        printf 'resolv.conf: %s bytes\n' "$(wc -c < /etc/resolv.conf)""#;
    let out = run(&fx.spec(script), &job_env(JOB_ID, &[])).await;
    assert!(out.status.success(), "{}", out.stderr);
    let system = bwrap::host_system();
    let hidden = system
        .iter()
        .any(|p| matches!(p, bwrap::SystemPath::Resolver(_)));
    let resolver = if hidden {
        "resolv.conf: 0 bytes\n"
    } else {
        // This host's resolv.conf links outside the bound folders: there is none inside.
        "resolv.conf:  bytes\n"
    };
    assert_eq!(
        out.stdout,
        format!("over loopback\nthrough the socket\n{resolver}"),
        "{}",
        out.stderr
    );
    tokio::time::timeout(BOUND, serve).await.unwrap().unwrap();

    // Sharing the host's network, the job reads the host's nameservers.
    if hidden {
        let shared = SandboxSpec {
            share_net: true,
            netns: None,
            host: None,
            ..fx.spec("cat /etc/resolv.conf")
        };
        let out = run(&shared, &job_env(JOB_ID, &[])).await;
        assert!(out.status.success(), "{}", out.stderr);
        assert_eq!(
            out.stdout,
            std::fs::read_to_string(bwrap::RESOLV_CONF).unwrap()
        );
    }
}

#[tokio::test]
async fn the_environment_is_exactly_the_map() {
    let fx = Fixture::new(NOBODY, NOBODY);
    let env = job_env(
        JOB_ID,
        &[
            ("DOCS_TOKEN", "a value with spaces, = signs and 'quotes'"),
            ("MULTI_LINE", "line one\nline two"),
            ("UNICODE", "clé ✓"),
            ("DASHES", "--setenv X y"),
        ],
    );
    let out = run(&fx.spec("env -0"), &env).await;
    assert!(out.status.success(), "{}", out.stderr);
    let inside: BTreeMap<String, String> = out
        .stdout
        .split('\0')
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (k, v) = e.split_once('=').unwrap();
            (k.to_owned(), v.to_owned())
        })
        .collect();
    let mut expected: BTreeMap<String, String> = env
        .iter()
        .map(|(n, v)| (n.to_owned(), v.expose().to_owned()))
        .collect();
    // bubblewrap sets PWD to the working directory; nothing else is added.
    expected.insert("PWD".into(), "/workspace".into());
    assert_eq!(inside, expected);
}

#[tokio::test]
async fn no_value_is_in_any_command_line() {
    let fx = Fixture::new(NOBODY, NOBODY);
    let canary = format!("cnry-{}", marker("cmdline"));
    let env = job_env(JOB_ID, &[("DOCS_TOKEN", &canary)]);
    // The job starts a child of its own, so that every level of the tree is looked at.
    let spec = fx.spec("sleep 30 & echo started; wait");
    let mut sandbox = bwrap::spawn(bwrap_path(), &spec, &env).await.unwrap();
    let mut stdout = sandbox.stdout().unwrap();
    let mut first = [0u8; 8];
    stdout.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"started\n");

    let holders = processes_with("DOCS_TOKEN", &canary);
    // The job (its shell and its sleep) holds the value, in its environment only.
    assert!(holders.len() >= 2, "{holders:?}");
    let mut looked = 0;
    for pid in all_pids() {
        if let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            looked += 1;
            assert!(
                !contains(&cmdline, canary.as_bytes()),
                "the value is in the command line of {pid}"
            );
        }
    }
    assert!(looked > holders.len());
    // bubblewrap runs with an empty environment (nothing of the worker's reaches its loader).
    let bwrap_env = std::fs::read(format!("/proc/{}/environ", sandbox.id().unwrap())).unwrap();
    assert_eq!(String::from_utf8_lossy(&bwrap_env), "");
    // bubblewrap and the sandbox's first process hold it nowhere readable either.
    let bwrap_pid = sandbox.id().unwrap();
    let init = sandbox.init_pid().unwrap();
    for pid in [bwrap_pid, init] {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        assert!(!contains(&environ, canary.as_bytes()), "{pid}");
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        assert!(contains(&cmdline, b"--args\x003\x00"), "{pid}");
    }
    sandbox.kill().await.unwrap();
}

#[tokio::test]
async fn the_time_limit_kills_the_whole_tree() {
    let fx = Fixture::new(NOBODY, NOBODY);
    let mark = marker("limit");
    let env = job_env(JOB_ID, &[("SANDBOX_TEST_MARK", &mark)]);
    // Background sleeps, one in a session of its own (out of the job's process group).
    let spec = fx.spec("sleep 1000 & setsid -f sleep 1000; sleep 1000");
    let mut sandbox = bwrap::spawn(bwrap_path(), &spec, &env).await.unwrap();
    let started = Instant::now();
    let limit = Duration::from_secs(2);
    let (ending, seen) = tokio::join!(sandbox.wait_with_limit(limit), async {
        // Every process is there before the limit: the three sleeps (and the shell, unless it
        // replaced itself with the last one).
        eventually(limit, || {
            processes_with("SANDBOX_TEST_MARK", &mark).len() >= 3
        })
        .await
    });
    assert!(seen, "the job's processes were never all seen");
    assert_eq!(ending.unwrap(), Ending::KilledAtLimit);
    let took = started.elapsed();
    assert!(
        took >= limit && took < limit + Duration::from_secs(8),
        "{took:?}"
    );
    // Nothing of the job is left, right after the call returns.
    assert_eq!(
        processes_with("SANDBOX_TEST_MARK", &mark),
        Vec::<u32>::new()
    );
    let init = sandbox.init_pid().unwrap();
    assert!(!Path::new(&format!("/proc/{init}")).exists());
}

#[tokio::test]
async fn a_job_that_ends_takes_its_background_processes_with_it() {
    let fx = Fixture::new(NOBODY, NOBODY);
    let mark = marker("ends");
    let env = job_env(JOB_ID, &[("SANDBOX_TEST_MARK", &mark)]);
    let spec = fx.spec("setsid -f sleep 1000; sleep 1000 & exit 3");
    let out = run(&spec, &env).await;
    assert_eq!(out.status.code(), Some(3));
    assert!(all_gone(&mark).await);
}

#[tokio::test]
async fn a_dropped_sandbox_is_ended() {
    let fx = Fixture::new(NOBODY, NOBODY);
    let mark = marker("drop");
    let env = job_env(JOB_ID, &[("SANDBOX_TEST_MARK", &mark)]);
    let sandbox = bwrap::spawn(bwrap_path(), &fx.spec("sleep 1000 & sleep 1000"), &env)
        .await
        .unwrap();
    assert!(running(&mark, 2).await);
    drop(sandbox);
    assert!(all_gone(&mark).await);
}

#[tokio::test]
async fn the_job_holds_only_its_standard_streams() {
    // Neither the environment's file, bubblewrap's info pipe, nor a descriptor the worker holds
    // without close-on-exec (as one it inherited would be) reaches the job.
    let fx = Fixture::new(NOBODY, NOBODY);
    let inherited = std::fs::File::open(&fx.extra).unwrap();
    rustix::io::fcntl_setfd(&inherited, rustix::io::FdFlags::empty()).unwrap();
    let out = run(&fx.spec("ls /proc/$$/fd"), &job_env(JOB_ID, &[])).await;
    drop(inherited);
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(out.stdout, "0\n1\n2\n");
}

#[tokio::test]
async fn the_caller_writes_the_jobs_input_and_reads_its_output() {
    let fx = Fixture::new(NOBODY, NOBODY);
    let spec = fx.spec("read key; echo \"key:$key\"; echo problem >&2; exit 5");
    let mut sandbox = bwrap::spawn(bwrap_path(), &spec, &job_env(JOB_ID, &[]))
        .await
        .unwrap();
    let mut stdin = sandbox.stdin().unwrap();
    stdin.write_all(b"k-123\n").await.unwrap();
    drop(stdin);
    let out = finish(&mut sandbox).await;
    assert_eq!(out.status.code(), Some(5));
    assert_eq!(out.stdout, "key:k-123\n");
    assert_eq!(out.stderr, "problem\n");
}

/// The worker that `the_sandbox_dies_with_the_worker` starts and then kills outright: it starts a
/// sandbox and waits.
#[tokio::test]
#[ignore = "a helper: run by the_sandbox_dies_with_the_worker in a process of its own"]
async fn helper_worker_holding_a_sandbox() {
    let (Ok(mark), Ok(dir)) = (
        std::env::var("SANDBOX_TEST_HELPER_MARK"),
        std::env::var("SANDBOX_TEST_HELPER_DIR"),
    ) else {
        return;
    };
    let fx = Fixture::new_in(Path::new(&dir), NOBODY, NOBODY);
    let env = job_env(JOB_ID, &[("SANDBOX_TEST_MARK", &mark)]);
    let _sandbox = bwrap::spawn(bwrap_path(), &fx.spec("sleep 1000 & sleep 1000"), &env)
        .await
        .unwrap();
    tokio::time::sleep(BOUND).await;
}

#[tokio::test]
async fn the_sandbox_dies_with_the_worker() {
    let mark = marker("worker");
    let dir = tempfile::tempdir().unwrap();
    let mut worker = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "helper_worker_holding_a_sandbox",
            "--ignored",
            "--test-threads=1",
        ])
        .env("SANDBOX_TEST_HELPER_MARK", &mark)
        .env("SANDBOX_TEST_HELPER_DIR", dir.path())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        running(&mark, 2).await,
        "the helper's sandbox never started"
    );
    // SIGKILL: nothing in the worker runs to clean up; only --die-with-parent can end the job.
    worker.kill().unwrap();
    worker.wait().unwrap();
    assert!(all_gone(&mark).await, "the job outlived its worker");
}
