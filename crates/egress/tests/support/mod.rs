//! What the proxy's traffic tests share: a proxy with its two files in a scratch folder and its log
//! caught, servers of the test's on test hosts and on this machine, and a job's client on the job's
//! socket.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use egress::dns::Resolver;
use egress::files::RuleFiles;
use egress::{DeniedHost, Limits, Proxy};
use testkit::dns::FakeDns;
use testkit::netns::TestHost;

/// No answer in these tests takes longer than this.
pub const BOUND: Duration = Duration::from_secs(20);

/// The address `a` names, an IPv4 address inside IPv6 as itself.
pub fn plain_ip(a: IpAddr) -> IpAddr {
    match a {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// A server of the test's, and how many connections it accepted.
#[derive(Clone)]
pub struct Server {
    pub port: u16,
    accepted: Arc<AtomicUsize>,
    /// The request heads (and bodies) an HTTP server read, in order.
    seen: Arc<Mutex<Vec<String>>>,
}

impl Server {
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    pub fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }

    fn new(port: u16) -> Server {
        Server {
            port,
            accepted: Arc::new(AtomicUsize::new(0)),
            seen: Arc::new(Mutex::new(Vec::new())),
        }
    }
}

/// The greeting a greeter named `name` sends on a connection it accepted on `ip`.
pub fn greeting(name: &str, ip: IpAddr) -> String {
    format!("{name} at {ip}\n")
}

/// Serves `listener`: each connection gets the greeting of `name` (with the address it came in
/// on), then an echo of whatever it sends.
pub fn greeter_on(listener: TcpListener, name: &str) -> Server {
    let server = Server::new(listener.local_addr().unwrap().port());
    greet_into(listener, name, &server);
    server
}

/// Serves `listener` as [`greeter_on`] does, counting its connections in `server`'s count.
fn greet_into(listener: TcpListener, name: &str, server: &Server) {
    let (accepted, name) = (server.accepted.clone(), name.to_owned());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { return };
            accepted.fetch_add(1, Ordering::SeqCst);
            let hello = greeting(&name, plain_ip(s.local_addr().unwrap().ip()));
            std::thread::spawn(move || {
                let _ = s.write_all(hello.as_bytes());
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
}

/// A greeter on `port` of every address of the test host.
pub fn greeter(host: &TestHost, port: u16, name: &str) -> Server {
    greeter_on(host.tcp(port), name)
}

/// An HTTP origin server on `listener`: it reads one request (head and `Content-Length` body),
/// keeps it, answers `200` with the greeting of `name` and closes.
pub fn http_on(listener: TcpListener, name: &str) -> Server {
    let server = Server::new(listener.local_addr().unwrap().port());
    let (accepted, seen, name) = (
        server.accepted.clone(),
        server.seen.clone(),
        name.to_owned(),
    );
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { return };
            accepted.fetch_add(1, Ordering::SeqCst);
            let body = greeting(&name, plain_ip(s.local_addr().unwrap().ip()));
            let seen = seen.clone();
            std::thread::spawn(move || {
                let Some(request) = read_request(&mut s) else {
                    return;
                };
                seen.lock().unwrap().push(request);
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    server
}

/// An HTTP server on `port` of every address of the test host.
pub fn http(host: &TestHost, port: u16, name: &str) -> Server {
    http_on(host.tcp(port), name)
}

/// One request's head and body as text.
fn read_request(s: &mut TcpStream) -> Option<String> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        let n = s.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        got.extend_from_slice(&buf[..n]);
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&got[..head_end]).to_string();
    let length = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    while got.len() < head_end + length {
        let n = s.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    Some(String::from_utf8_lossy(&got).to_string())
}

/// This machine's `127.0.0.1:443` and `[::1]:443`, where no job may go: one greeter for the whole
/// test binary, held under a lock so that test binaries run at once take turns for the port.
pub fn loopback_443() -> &'static Server {
    static LOOPBACK: OnceLock<(Server, nix::fcntl::Flock<std::fs::File>)> = OnceLock::new();
    &LOOPBACK
        .get_or_init(|| {
            let path = std::env::temp_dir().join("pi-dispatch-egress-loopback-443.lock");
            let file = std::fs::File::options()
                .create(true)
                .truncate(false)
                .write(true)
                .open(path)
                .unwrap();
            let lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
                .map_err(|(_, e)| e)
                .unwrap();
            let v4 = TcpListener::bind("127.0.0.1:443").expect("127.0.0.1:443 is free");
            let v6 = TcpListener::bind("[::1]:443").expect("[::1]:443 is free");
            let server = greeter_on(v4, "loopback");
            greet_into(v6, "loopback", &server);
            (server, lock)
        })
        .0
}

/// Two listeners on consecutive free ports of `ip` in this namespace: `(port, port + 1)`.
pub fn neighbouring_ports(ip: IpAddr) -> (TcpListener, TcpListener) {
    for _ in 0..100 {
        let first = TcpListener::bind((ip, 0)).unwrap();
        let port = first.local_addr().unwrap().port();
        if port == u16::MAX {
            continue;
        }
        if let Ok(second) = TcpListener::bind((ip, port + 1)) {
            return (first, second);
        }
    }
    panic!("no two consecutive free ports on {ip}");
}

/// Log lines caught from the proxy's runtime, as JSON objects.
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).to_string()
    }

    pub fn lines(&self) -> Vec<serde_json::Value> {
        self.text()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a log line is JSON"))
            .collect()
    }

    /// The proxy's decisions for `job`.
    pub fn decisions(&self, job: &str) -> Vec<serde_json::Value> {
        self.lines()
            .into_iter()
            .filter(|l| l["event"] == "egress_decision" && l["job_id"] == job)
            .collect()
    }
}

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;
    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

/// A proxy with its files in a scratch folder, its runtime, and its log.
pub struct World {
    pub dir: tempfile::TempDir,
    pub proxy: Proxy,
    pub rt: tokio::runtime::Runtime,
    pub logs: Logs,
}

pub const JOB: &str = "job-1";

impl World {
    /// A proxy with `allowlist` and `endpoints` (none when empty) asking `dns`, and job [`JOB`]'s
    /// socket open.
    pub fn new(allowlist: &str, endpoints: &str, dns: &FakeDns) -> World {
        World::with_limits(allowlist, endpoints, dns, Limits::default())
    }

    pub fn with_limits(allowlist: &str, endpoints: &str, dns: &FakeDns, limits: Limits) -> World {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("egress-allowlist.conf"), allowlist).unwrap();
        if !endpoints.is_empty() {
            std::fs::write(dir.path().join("model-endpoints.json"), endpoints).unwrap();
        }
        let logs = Logs::default();
        let dispatch = tracing::Dispatch::new(
            tracing_subscriber::fmt()
                .json()
                .flatten_event(true)
                .with_writer(logs.clone())
                .finish(),
        );
        let on_start = dispatch.clone();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .on_thread_start(move || {
                // Every thread of the proxy's runtime logs to this world's lines, for good.
                std::mem::forget(tracing::dispatcher::set_default(&on_start));
            })
            .build()
            .unwrap();
        let files = RuleFiles {
            allowlist: dir.path().join("egress-allowlist.conf"),
            endpoints: dir.path().join("model-endpoints.json"),
        };
        let proxy = {
            let _guard = rt.enter();
            let _log = tracing::dispatcher::set_default(&dispatch);
            Proxy::new(files, Resolver::Nameserver(dns.addr), limits)
        };
        let world = World {
            dir,
            proxy,
            rt,
            logs,
        };
        world.open(JOB);
        world
    }

    /// Opens `job`'s socket; its path.
    pub fn open(&self, job: &str) -> PathBuf {
        let socket = self.socket_of(job);
        let _guard = self.rt.enter();
        self.proxy.open_job(job, &socket).unwrap();
        socket
    }

    pub fn socket_of(&self, job: &str) -> PathBuf {
        self.dir.path().join(format!("{job}.sock"))
    }

    pub fn socket(&self) -> PathBuf {
        self.socket_of(JOB)
    }

    pub fn write_allowlist(&self, text: &str) {
        std::fs::write(self.dir.path().join("egress-allowlist.conf"), text).unwrap();
    }

    pub fn allowlist_path(&self) -> PathBuf {
        self.dir.path().join("egress-allowlist.conf")
    }

    pub fn write_endpoints(&self, text: &str) {
        std::fs::write(self.dir.path().join("model-endpoints.json"), text).unwrap();
    }

    /// What job [`JOB`] was denied, as `(host, port, count, reason)`.
    pub fn denied(&self) -> Vec<(String, u16, u64, String)> {
        self.denied_of(JOB)
    }

    pub fn denied_of(&self, job: &str) -> Vec<(String, u16, u64, String)> {
        let mut out: Vec<_> = self
            .proxy
            .denied(job)
            .unwrap()
            .into_iter()
            .map(
                |DeniedHost {
                     host,
                     port,
                     reason,
                     count,
                 }| (host, port, count, reason),
            )
            .collect();
        out.sort();
        out
    }

    /// Sends `request` on job [`JOB`]'s socket.
    pub fn ask(&self, request: &str) -> Reply {
        ask(&self.socket(), request.as_bytes())
    }

    /// `CONNECT authority` on job [`JOB`]'s socket.
    pub fn connect(&self, authority: &str) -> Reply {
        self.ask(&format!(
            "CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n"
        ))
    }
}

/// `(host, port, count, reason)` as [`World::denied`] has it, sorted.
pub fn denied(rows: &[(&str, u16, u64, &str)]) -> Vec<(String, u16, u64, String)> {
    let mut out: Vec<_> = rows
        .iter()
        .map(|(h, p, c, r)| (h.to_string(), *p, *c, r.to_string()))
        .collect();
    out.sort();
    out
}

/// What the proxy answered.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    /// The proxy's code (`X-Pi-Dispatch-Egress`), on its own refusals.
    pub code: Option<String>,
    pub head: String,
    /// What came after the head: a tunnel's greeting, a response's body, the refusal's text.
    pub body: String,
}

impl Reply {
    /// Whether this is the proxy's refusal with `status` and `code`.
    pub fn refused(&self, status: u16, code: &str) -> bool {
        self.status == status && self.code.as_deref() == Some(code)
    }
}

/// Sends `request` on `socket` and reads the answer: up to the end for a refusal or a plain
/// response, up to the first line of the tunnel for an open CONNECT.
pub fn ask(socket: &Path, request: &[u8]) -> Reply {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(BOUND)).unwrap();
    s.write_all(request).unwrap();
    read_reply(&mut s, request.starts_with(b"CONNECT"))
}

/// Reads a reply from `s`; for a CONNECT, stops once the tunnel's first line came.
pub fn read_reply(s: &mut impl Read, connect: bool) -> Reply {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + BOUND;
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                assert!(Instant::now() < deadline, "no answer within {BOUND:?}");
                // A reset after the answer (the proxy closed with bytes unread): keep what came.
                assert!(
                    e.kind() == std::io::ErrorKind::ConnectionReset,
                    "reading the answer: {e}"
                );
                break;
            }
        }
        if connect
            && got.starts_with(b"HTTP/1.1 200")
            && let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n")
            && got[i + 4..].contains(&b'\n')
        {
            break;
        }
    }
    let (head, body) = match got.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(i) => (&got[..i + 4], &got[i + 4..]),
        None => (&got[..], &[][..]),
    };
    let head = String::from_utf8_lossy(head).to_string();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let code = head.lines().find_map(|l| {
        l.strip_prefix("X-Pi-Dispatch-Egress: ")
            .map(|c| c.trim().to_owned())
    });
    Reply {
        status,
        code,
        head,
        body: String::from_utf8_lossy(body).to_string(),
    }
}

/// An open tunnel through the proxy to `authority`, its greeting read.
pub fn tunnel(socket: &Path, authority: &str) -> (UnixStream, String) {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(BOUND)).unwrap();
    write!(
        s,
        "CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n"
    )
    .unwrap();
    let reply = read_reply(&mut s, true);
    assert_eq!(reply.status, 200, "{reply:?}");
    (s, reply.body)
}

/// The header lines of a request head as the server read it, lower-cased names.
pub fn header_names(request: &str) -> BTreeSet<String> {
    request
        .split("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':').map(|(n, _)| n.to_ascii_lowercase()))
        .collect()
}

/// `addr` reached directly from this test, not through the proxy: its greeting.
pub fn direct(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect_timeout(&addr, BOUND).unwrap();
    s.set_read_timeout(Some(BOUND)).unwrap();
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\n") {
        match s.read(&mut byte) {
            Ok(1) => got.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&got).to_string()
}

/// A greeter as [`greeter_on`], served by tasks of `rt` rather than a thread a connection: for
/// tests that hold many connections at once.
pub fn async_greeter_on(rt: &tokio::runtime::Runtime, listener: TcpListener, name: &str) -> Server {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = Server::new(listener.local_addr().unwrap().port());
    listener.set_nonblocking(true).unwrap();
    let (accepted, name) = (server.accepted.clone(), name.to_owned());
    rt.spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            accepted.fetch_add(1, Ordering::SeqCst);
            let hello = greeting(&name, plain_ip(s.local_addr().unwrap().ip()));
            tokio::spawn(async move {
                let _ = s.write_all(hello.as_bytes()).await;
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    server
}

/// Raises this process's soft limit of open files to its hard limit.
pub fn raise_open_files() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    hard
}

/// Waits until `done` holds, looking again each few milliseconds; panics after [`BOUND`].
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + BOUND;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {BOUND:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}
