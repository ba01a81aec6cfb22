//! `pi-dispatch egress-proxy` as a process: started with the soft open-files limit a service gets
//! by default (1024), it holds 1,000 tunnels at once to a test host, each passing data, and its
//! memory stays bounded. The figures are printed (`--nocapture`) for the docs.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, TcpListener};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use egress::control::Client;
use testkit::dns::FakeDns;
use testkit::netns::TestHost;

use crate::common::Deployment;

const BOUND: Duration = Duration::from_secs(30);

/// Answers each connection with a line, then echoes: a thread a connection, small stacks.
fn echo(listener: TcpListener) {
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { return };
            std::thread::Builder::new()
                .stack_size(64 * 1024)
                .spawn(move || {
                    let _ = s.write_all(b"hello\n");
                    let mut buf = [0u8; 16 * 1024];
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 || s.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                })
                .unwrap();
        }
    });
}

struct Proxy {
    child: Child,
    control: Client,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The proxy of deployment `d`, started as a service is (soft limit of open files 1024), and
/// answering on its control socket.
fn start(d: &Deployment, dns: &FakeDns) -> Proxy {
    let mut cmd = Command::new("sh");
    cmd.args([
        "-c",
        "ulimit -Sn 1024 && exec \"$0\" egress-proxy",
        env!("CARGO_BIN_EXE_pi-dispatch"),
    ]);
    d.isolate(&mut cmd);
    let log = std::fs::File::create(d.path().join("proxy.log")).unwrap();
    let mut child = cmd
        .env("PI_EGRESS_NAMESERVER", dns.addr.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let socket = line
        .trim()
        .strip_prefix("egress proxy: control socket ")
        .unwrap_or_else(|| panic!("the proxy did not start: {line:?}"));
    let control = Client::new(socket);
    control.ping().unwrap();
    Proxy { child, control }
}

/// `VmRSS` and `VmHWM` of `pid`, in KiB.
fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
            .unwrap()
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// A tunnel to `allowed.test:443` on `socket`, its greeting read.
fn tunnel(socket: &Path) -> UnixStream {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(BOUND)).unwrap();
    s.write_all(b"CONNECT allowed.test:443 HTTP/1.1\r\n\r\n")
        .unwrap();
    let want = b"HTTP/1.1 200 Connection established\r\n\r\nhello\n";
    let mut got = vec![0u8; want.len()];
    s.read_exact(&mut got)
        .unwrap_or_else(|e| panic!("no tunnel: {e}"));
    if got != want {
        let mut rest = String::new();
        let _ = s.read_to_string(&mut rest);
        panic!("no tunnel: {}{rest}", String::from_utf8_lossy(&got));
    }
    s
}

/// Each stream sends `size` bytes and reads them back (sending and reading at once, so that no
/// buffer on the way has to hold it all).
fn pass(streams: &mut [UnixStream], size: usize) {
    let chunk = vec![b'x'; size];
    let mut back = vec![0u8; size];
    for s in streams.iter_mut() {
        std::thread::scope(|scope| {
            let writer: &UnixStream = s;
            let chunk = &chunk;
            scope.spawn(move || {
                let mut w = writer;
                w.write_all(chunk).unwrap();
            });
            let mut r: &UnixStream = s;
            r.read_exact(&mut back).unwrap();
        });
    }
}

#[test]
fn a_thousand_tunnels_through_the_proxy_process_in_bounded_memory() {
    // The test's own side holds 2,000 files.
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let hard = getrlimit(Resource::Nofile).maximum;
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: hard,
            maximum: hard,
        },
    )
    .unwrap();
    let host = TestHost::new();
    echo(host.tcp(443));
    let dns = FakeDns::start();
    dns.set("allowed.test", &[IpAddr::V4(host.v4)]);
    let d = Deployment::new();
    d.write("egress-allowlist.conf", "allowed.test\n");
    let proxy = start(&d, &dns);
    let pid = proxy.child.id();

    let jobs = ["job-a", "job-b", "job-c", "job-d"];
    let sockets: Vec<PathBuf> = jobs
        .iter()
        .map(|job| {
            let socket = d.path().join(format!("{job}.sock"));
            proxy.control.open(job, &socket).unwrap();
            socket
        })
        .collect();
    let mut first = tunnel(&sockets[0]);
    pass(std::slice::from_mut(&mut first), 64);
    drop(first);
    let started = memory(pid);

    let mut tunnels: Vec<UnixStream> = Vec::new();
    for socket in &sockets {
        tunnels.extend((0..250).map(|_| tunnel(socket)));
    }
    assert_eq!(tunnels.len(), 1000);
    pass(&mut tunnels, 64);
    let reply = proxy.control.ping().unwrap();
    assert_eq!(reply.connections, Some(1000));
    let open = memory(pid);
    // Then each tunnel carries 256 KiB each way: every copy buffer is used in full.
    pass(&mut tunnels, 256 * 1024);
    let busy = memory(pid);
    // And a new request is still served.
    let mut more = tunnel(&sockets[1]);
    pass(std::slice::from_mut(&mut more), 64);
    drop(more);
    drop(tunnels);

    eprintln!(
        "egress-proxy memory (KiB): started VmRSS {} VmHWM {}; 1,000 tunnels open VmRSS {} VmHWM {}; after 256 KiB each way through each VmRSS {} VmHWM {}",
        started.0, started.1, open.0, open.1, busy.0, busy.1
    );
    for job in jobs {
        assert_eq!(proxy.control.denied(job).unwrap(), []);
    }
    // Bounded: a tunnel takes at most its two copy buffers and some, however much it carried
    // (256 KiB each way here; a buffer growing with traffic would take that much and more).
    let buffer_kib = u64::try_from(egress::Limits::default().buffer / 1024).unwrap();
    let per_tunnel_kib = busy.1.saturating_sub(started.1) / 1000;
    assert!(
        per_tunnel_kib <= 2 * buffer_kib + 64,
        "{per_tunnel_kib} KiB a tunnel"
    );
}
