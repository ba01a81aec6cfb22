//! The runner with egress on: when the job's folder holds its socket to the egress proxy, the
//! runner listens on the loopback port the proxy variables name (and on each of the job's endpoints
//! on the worker's own machine) before anything else of the job starts, and hands each connection
//! made there to that socket. Each case runs in a network namespace of its own (a test host), as a job's
//! sandbox has one, so the fixed port is the test's alone. Needs root, as CI has.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use hub::job::{Agent, JobOptions, run};
use protocol::exit_line::ExitLine;
use protocol::job_dir::{EGRESS_SOCKET, RunnerInput};
use testkit::netns::TestHost;

/// A stand-in for the proxy on the job's socket: it takes the connection the runner hands over
/// (`egress::handover`), reports each request head it reads (from the connection, or from the
/// socket for a declared endpoint's tunnel) and answers `200`, then echoes what the connection
/// sends after a greeting.
fn fake_proxy(socket: &Path) -> std::sync::mpsc::Receiver<String> {
    let listener = std::os::unix::net::UnixListener::bind(socket).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(s) = stream else { return };
            let tx = tx.clone();
            std::thread::spawn(move || serve_handed(s, &tx));
        }
    });
    rx
}

fn serve_handed(mut socket: std::os::unix::net::UnixStream, tx: &std::sync::mpsc::Sender<String>) {
    use egress::handover::{REQUEST_HERE, REQUEST_ON_IT};
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    use std::io::{Read, Write};
    let mut marker = [0u8; 1];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        &socket,
        &mut [std::io::IoSliceMut::new(&mut marker)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    );
    let handed = control.drain().find_map(|m| match m {
        RecvAncillaryMessage::ScmRights(mut fds) => fds.next(),
        _ => None,
    });
    let (Ok(_), Some(fd)) = (got, handed) else {
        return;
    };
    // The forwarder's socket is non-blocking, and the handed descriptor shares that: this
    // stand-in reads it blocking, as the agent's bytes may come after the handover.
    let mut connection = std::net::TcpStream::from(fd);
    connection.set_nonblocking(false).unwrap();
    let read_head = |from: &mut dyn Read| {
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if from.read(&mut b).unwrap_or(0) == 0 {
                return None;
            }
            head.push(b[0]);
        }
        Some(String::from_utf8_lossy(&head).into_owned())
    };
    let established = b"HTTP/1.1 200 Connection established\r\n\r\n";
    match marker[0] {
        REQUEST_ON_IT => {
            let Some(head) = read_head(&mut connection) else {
                return;
            };
            let _ = tx.send(head);
            let _ = connection.write_all(established);
        }
        REQUEST_HERE => {
            let Some(head) = read_head(&mut socket) else {
                return;
            };
            let _ = tx.send(head);
            let _ = socket.write_all(established);
        }
        _ => return,
    }
    let _ = connection.write_all(b"proxied:");
    let mut rest = Vec::new();
    let mut chunk = [0u8; 256];
    while let Ok(n @ 1..) = connection.read(&mut chunk) {
        rest.extend_from_slice(&chunk[..n]);
        if rest.ends_with(b"\n") {
            let _ = connection.write_all(&rest);
            return;
        }
    }
}

/// A job whose agent is `script` under bash, in a folder of `dir`, with its routes on the host
/// `loopback` (`host:port`).
fn job(dir: &Path, script: &str, loopback: &[&str]) -> JobOptions {
    let job_dir = dir.join("job");
    let workspace = dir.join("workspace");
    std::fs::create_dir_all(&job_dir).unwrap();
    std::fs::create_dir_all(&workspace).unwrap();
    let env = vec![
        ("PATH".to_owned(), "/usr/bin:/bin".to_owned()),
        ("HOME".to_owned(), dir.to_str().unwrap().to_owned()),
    ];
    JobOptions {
        job_id: "job-egress".to_owned(),
        input: RunnerInput {
            loopback: loopback.iter().map(|a| (*a).to_owned()).collect(),
            ..RunnerInput::default()
        },
        job_dir,
        workspace,
        agent_dir: dir.join("agent"),
        agent: Agent::Command(vec!["bash".into(), "-c".into(), script.into()]),
        env,
        guard: None,
        confine: None,
        relay: None,
        key: None,
    }
}

/// Runs the job in `host`'s network namespace (the runner, and the agent it starts); `before`
/// runs there first and what it returns is held while the job runs.
fn run_in<T>(host: &TestHost, options: JobOptions, before: impl FnOnce() -> T + Send) -> ExitLine {
    host.run(move || {
        let held = before();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let line = runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(60), run(options))
                .await
                .expect("the job ends")
        });
        drop(held);
        line
    })
}

/// What the agent wrote in the file `name` of the workspace.
fn written(options_dir: &Path, name: &str) -> String {
    std::fs::read_to_string(options_dir.join("workspace").join(name)).unwrap_or_default()
}

#[test]
fn with_its_socket_the_job_reaches_the_proxy_on_loopback_and_its_own_machines_endpoint() {
    let host = TestHost::new();
    let dir = tempfile::tempdir().unwrap();
    // The agent asks the proxy port for a tunnel by hand, and talks to the declared endpoint on
    // the machine's loopback as if it were there.
    let script = r#"
        exec 3<>/dev/tcp/127.0.0.1/3128
        printf 'CONNECT api.example:443 HTTP/1.1\r\nHost: api.example:443\r\n\r\n' >&3
        head -c 39 <&3 > forwarded
        exec 4<>/dev/tcp/127.0.0.1/8000
        echo ping >&4
        head -n 1 <&4 > endpoint
    "#;
    let options = job(dir.path(), script, &["127.0.0.1:8000"]);
    let heads = fake_proxy(&options.job_dir.join(EGRESS_SOCKET));
    let line = run_in(&host, options, || ());
    assert_eq!(line.code, 0, "{line:?}");
    // The forwarder hands the client's connection over: the proxy reads its own bytes as they are.
    assert_eq!(
        heads.recv_timeout(Duration::from_secs(5)).unwrap(),
        "CONNECT api.example:443 HTTP/1.1\r\nHost: api.example:443\r\n\r\n"
    );
    assert_eq!(
        written(dir.path(), "forwarded"),
        "HTTP/1.1 200 Connection established\r\n\r\n"
    );
    // The endpoint's port is a tunnel to exactly it, the proxy's answer not passed on.
    assert_eq!(
        heads.recv_timeout(Duration::from_secs(5)).unwrap(),
        "CONNECT 127.0.0.1:8000 HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n\r\n"
    );
    assert_eq!(written(dir.path(), "endpoint"), "proxied:ping\n");
}

#[test]
fn without_a_socket_nothing_listens_for_the_job() {
    let host = TestHost::new();
    let dir = tempfile::tempdir().unwrap();
    let script =
        "if exec 3<>/dev/tcp/127.0.0.1/3128; then echo open > port; else echo closed > port; fi";
    let options = job(dir.path(), script, &[]);
    let line = run_in(&host, options, || ());
    assert_eq!(line.code, 0, "{line:?}");
    assert_eq!(written(dir.path(), "port"), "closed\n");
}

#[test]
fn a_forwarder_port_that_cannot_be_had_fails_the_job_before_it_starts() {
    for (taken, loopback) in [(3128, ""), (8000, "127.0.0.1:8000")] {
        // A host for each case: the listener a case holds is copied into any child another test
        // of this process spawns meanwhile, until that child execs, so the port can outlive the
        // case for a moment.
        let host = TestHost::new();
        let dir = tempfile::tempdir().unwrap();
        let options = job(
            dir.path(),
            "echo started > started",
            &loopback.split(',').collect::<Vec<_>>(),
        );
        let _heads = fake_proxy(&options.job_dir.join(EGRESS_SOCKET));
        let line = run_in(&host, options, || {
            std::net::TcpListener::bind(("127.0.0.1", taken)).unwrap()
        });
        assert_eq!(
            line.reason.as_deref(),
            Some("model-unreachable"),
            "{line:?}"
        );
        assert_eq!(line.code, 1, "{line:?}");
        let cause = line.cause.unwrap_or_default();
        assert!(cause.contains(&format!("127.0.0.1:{taken}")), "{cause}");
        assert_eq!(written(dir.path(), "started"), "", "the agent started");
    }
}
