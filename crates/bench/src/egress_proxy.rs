//! `--egress`: what the egress proxy costs a job's connections, beside a raw loopback connection
//! and squid with the same rule.
//!
//! An upstream server on loopback (its own runtime, one thread) either echoes the first byte a
//! connection sends (`e`) or swallows a length-prefixed stream and answers how many bytes it took
//! (`s`). The client (blocking, on the calling thread) reaches it four ways:
//! - **raw**: straight to the upstream's port;
//! - **proxy socket**: `CONNECT` on the job's unix socket of an [`egress::Proxy`] (its own
//!   multi-thread runtime, as `pi-dispatch egress-proxy` has);
//! - **proxy forward**: `CONNECT` on the loopback port of [`egress::forward::serve`] (another
//!   runtime, as the job's runner has), which hands the connection to that socket
//!   ([`egress::handover`]) and carries nothing itself: a job's real path;
//! - **squid**: `CONNECT` on a squid the bench starts (`-N`, a config, pid file and log in a
//!   temporary folder, no cache, no access log), whose only rule allows `CONNECT` to the upstream's
//!   address and port, as the proxy's `model-endpoints.json` declares that address and port.
//!
//! Throughput: one tunnel carries `bytes` one way, from the first byte written to the upstream's
//! count read back; `runs` per way, the ways in turn. Connect latency: from `connect` to the echo
//! of the first byte through the tunnel (the `200` of the proxy read before that byte is sent),
//! `connects` per way after `warm_up` untimed ones, the ways in turn; *added* is a way's
//! percentile minus raw's. Each thread group's CPU time (`/proc/…/schedstat`) is summed over the
//! throughput runs, to show where the cores go: client, upstream, proxy and forwarder all share
//! the machine's.

use crate::stats::{median, round1, round3};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use serde_json::{Map, Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::mcp_hub::Latency;

/// A tunnel through the proxy should carry at least this share of a raw connection's throughput.
pub const GOAL_RATIO: f64 = 0.9;
/// The proxy should add at most this to a connect, µs (at p50).
pub const GOAL_ADDED_CONNECT_US: f64 = 100.0;
/// Debian's squid.
pub const SQUID: &str = "/usr/sbin/squid";
/// The client's writes: a TLS record's most, what a job's client sends through a tunnel at a time.
const WRITE: usize = 16 * 1024;
/// The upstream's reads.
const READ: usize = 64 * 1024;
/// The longest any read or write of the client may block.
const BOUND: Duration = Duration::from_secs(30);
/// The job id of the proxy's socket.
const JOB: &str = "bench";

/// What the egress measurement needs.
pub struct Options {
    /// Bytes one throughput run carries.
    pub bytes: u64,
    /// Timed throughput runs per way.
    pub runs: u32,
    /// Timed connects per way, after `warm_up` untimed ones.
    pub connects: u32,
    pub warm_up: u32,
    /// The squid program.
    pub squid: PathBuf,
}

/// The ways to the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Raw,
    Socket,
    Forward,
    Squid,
}

impl Way {
    fn key(self) -> &'static str {
        match self {
            Way::Raw => "raw",
            Way::Socket => "proxy_socket",
            Way::Forward => "proxy_forward",
            Way::Squid => "squid",
        }
    }

    /// The thread groups ([`GROUPS`]) that carry this way's bytes.
    fn groups(self) -> &'static [usize] {
        match self {
            Way::Raw => &[0, 1],
            Way::Socket => &[0, 1, 2],
            Way::Forward => &[0, 1, 2, 3],
            Way::Squid => &[0, 1, 4],
        }
    }

    fn label(self) -> &'static str {
        match self {
            Way::Raw => "raw loopback",
            Way::Socket => "pi-dispatch proxy, job socket",
            Way::Forward => "pi-dispatch proxy, through the forwarder",
            Way::Squid => "squid",
        }
    }
}

/// The thread groups whose CPU time is counted.
const GROUPS: [&str; 5] = ["client", "upstream", "proxy", "forward", "squid"];

/// One way's figures.
struct WayFigures {
    way: Way,
    /// MB/s (10^6 bytes) of each timed run.
    mb_s: Vec<f64>,
    /// CPU time of each group over the timed runs, ns.
    cpu_ns: [u64; 5],
    /// Connect to first echoed byte, µs.
    connect: Latency,
    /// Each round's connect minus raw's of the same round, µs.
    paired: Vec<f64>,
}

impl WayFigures {
    fn median_mb_s(&self) -> f64 {
        median(&self.mb_s)
    }
}

pub struct EgressFigures {
    bytes: u64,
    runs: u32,
    connects: u32,
    warm_up: u32,
    squid_version: Option<String>,
    ways: Vec<WayFigures>,
    /// Why squid was left out, if it was.
    squid_skipped: Option<String>,
}

impl EgressFigures {
    fn way(&self, way: Way) -> Option<&WayFigures> {
        self.ways.iter().find(|w| w.way == way)
    }

    fn raw(&self) -> Option<&WayFigures> {
        self.way(Way::Raw)
    }

    fn ratio(&self, w: &WayFigures) -> f64 {
        self.raw()
            .map_or(0.0, |raw| w.median_mb_s() / raw.median_mb_s())
    }

    fn added_p50(&self, w: &WayFigures) -> f64 {
        self.raw()
            .map_or(0.0, |raw| w.connect.p50 - raw.connect.p50)
    }

    fn added_p99(&self, w: &WayFigures) -> f64 {
        self.raw()
            .map_or(0.0, |raw| w.connect.p99 - raw.connect.p99)
    }

    /// The goals, for one of the proxy's ways: throughput, connect, ahead of squid on each (`None`
    /// without squid).
    fn goals(&self, w: &WayFigures) -> (bool, bool, Option<bool>, Option<bool>) {
        let squid = self.way(Way::Squid);
        (
            self.ratio(w) >= GOAL_RATIO,
            self.added_p50(w) <= GOAL_ADDED_CONNECT_US,
            squid.map(|s| w.median_mb_s() > s.median_mb_s()),
            squid.map(|s| w.connect.p50 < s.connect.p50),
        )
    }

    pub fn json(&self) -> Value {
        let gib = self.bytes as f64 * f64::from(self.runs) / f64::from(1u32 << 30);
        let mut ways = Map::new();
        for w in &self.ways {
            let mut cpu = Map::new();
            for &g in w.way.groups() {
                cpu.insert(
                    GROUPS[g].to_owned(),
                    json!(round1(w.cpu_ns[g] as f64 / 1e6 / gib)),
                );
            }
            let mut out = json!({
                "throughput": {
                    "median_mb_s": round1(w.median_mb_s()),
                    "runs_mb_s": w.mb_s.iter().map(|x| round1(*x)).collect::<Vec<_>>(),
                    "cpu_ms_per_gib": cpu,
                },
                "connect": {
                    "min_us": round1(w.connect.min),
                    "p50_us": round1(w.connect.p50),
                    "p99_us": round1(w.connect.p99),
                },
            });
            if w.way != Way::Raw
                && let Some(o) = out.as_object_mut()
            {
                if let Some(t) = o.get_mut("throughput").and_then(Value::as_object_mut) {
                    t.insert("ratio_to_raw".to_owned(), json!(round3(self.ratio(w))));
                }
                if let Some(c) = o.get_mut("connect").and_then(Value::as_object_mut) {
                    c.insert("added_p50_us".to_owned(), json!(round1(self.added_p50(w))));
                    c.insert("added_p99_us".to_owned(), json!(round1(self.added_p99(w))));
                    c.insert(
                        "paired_added_p50_us".to_owned(),
                        json!(round1(median(&w.paired))),
                    );
                }
                if matches!(w.way, Way::Socket | Way::Forward) {
                    let (ratio, connect, squid_t, squid_c) = self.goals(w);
                    o.insert(
                        "goals".to_owned(),
                        json!({
                            "throughput_ratio": ratio,
                            "added_connect": connect,
                            "ahead_of_squid_throughput": squid_t,
                            "ahead_of_squid_connect": squid_c,
                        }),
                    );
                }
            }
            ways.insert(w.way.key().to_owned(), out);
        }
        let mut out = json!({
            "bytes": self.bytes,
            "runs": self.runs,
            "connects": self.connects,
            "warm_up": self.warm_up,
            "goal_ratio": GOAL_RATIO,
            "goal_added_connect_us": GOAL_ADDED_CONNECT_US,
            "ways": ways,
        });
        if let Some(o) = out.as_object_mut() {
            if let Some(v) = &self.squid_version {
                o.insert("squid_version".to_owned(), json!(v));
            }
            if let Some(why) = &self.squid_skipped {
                o.insert("squid_skipped".to_owned(), json!(why));
            }
        }
        out
    }

    pub fn print(&self) {
        let gib = self.bytes as f64 * f64::from(self.runs) / f64::from(1u32 << 30);
        println!(
            "egress: {} MiB one way per tunnel, {} runs per way; connect to first echoed byte, {} connects per way after {} warm-ups; the ways in turn",
            self.bytes >> 20,
            self.runs,
            self.connects,
            self.warm_up
        );
        for w in &self.ways {
            let cpu: Vec<String> = w
                .way
                .groups()
                .iter()
                .map(|&g| format!("{} {:.0}", GROUPS[g], w.cpu_ns[g] as f64 / 1e6 / gib))
                .collect();
            let mut line = format!(
                "egress, {}: throughput median {:.0} MB/s (runs {}); CPU ms per GiB: {}; connect min {:.1} µs, p50 {:.1} µs, p99 {:.1} µs",
                w.way.label(),
                w.median_mb_s(),
                w.mb_s
                    .iter()
                    .map(|x| format!("{x:.0}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                cpu.join(", "),
                w.connect.min,
                w.connect.p50,
                w.connect.p99,
            );
            if w.way != Way::Raw {
                line.push_str(&format!(
                    "; {:.3}× raw throughput, added p50 {:.1} µs (paired {:.1}), p99 {:.1} µs",
                    self.ratio(w),
                    self.added_p50(w),
                    median(&w.paired),
                    self.added_p99(w)
                ));
            }
            println!("{line}");
        }
        if let Some(why) = &self.squid_skipped {
            println!("egress, squid: skipped: {why}");
        }
        for way in [Way::Socket, Way::Forward] {
            let Some(w) = self.way(way) else { continue };
            let (ratio, connect, squid_t, squid_c) = self.goals(w);
            let yes = |b: bool| if b { "within" } else { "OVER" };
            let ahead = |b: Option<bool>| match b {
                Some(true) => "ahead of squid",
                Some(false) => "BEHIND squid",
                None => "squid not measured",
            };
            println!(
                "goal, {}: throughput {:.3}× raw against ≥ {GOAL_RATIO}×: {} ({}); added connect p50 {:.1} µs against ≤ {GOAL_ADDED_CONNECT_US} µs: {} ({})",
                way.label(),
                self.ratio(w),
                yes(ratio),
                ahead(squid_t),
                self.added_p50(w),
                yes(connect),
                ahead(squid_c),
            );
        }
    }
}

/// Runs every way (squid's only when it is there and starts).
pub fn measure(options: &Options) -> anyhow::Result<EgressFigures> {
    let dir = tempfile::tempdir().context("cannot make a temporary folder")?;
    let upstream = Upstream::start()?;
    let port = upstream.addr.port();

    // The proxy's rules: an empty allowlist and one declared endpoint, the upstream's address and
    // port.
    let files = egress::files::RuleFiles {
        allowlist: dir.path().join("egress-allowlist.conf"),
        endpoints: dir.path().join("model-endpoints.json"),
    };
    std::fs::write(&files.allowlist, "# nothing but the declared endpoint\n")
        .context("cannot write egress-allowlist.conf")?;
    let endpoints = json!({
        "version": 1,
        "endpoints": [{ "id": "bench", "host": "127.0.0.1", "port": port, "keyless": true }],
    });
    std::fs::write(&files.endpoints, endpoints.to_string())
        .context("cannot write model-endpoints.json")?;

    let proxy_rt = runtime("egress-proxy", None)?;
    let proxy = egress::Proxy::new(
        files,
        egress::dns::Resolver::System,
        egress::Limits::default(),
    );
    let socket = dir.path().join("job.sock");
    proxy_rt
        .block_on(async { proxy.open_job(JOB, &socket) })
        .context("the proxy cannot open the job's socket")?;

    let forward_rt = runtime("egress-forward", None)?;
    let forward_listener = forward_rt
        .block_on(tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .context("cannot bind the forwarder's port")?;
    let forward = forward_listener
        .local_addr()
        .context("the forwarder's port has no address")?;
    forward_rt.spawn(egress::forward::serve(forward_listener, socket.clone()));

    let (squid, squid_skipped) = match Squid::start(&options.squid, port) {
        Ok(s) => (Some(s), None),
        Err(why) => (None, Some(format!("{why:#}"))),
    };

    let target = Target {
        upstream: upstream.addr,
        socket,
        forward,
        squid: squid.as_ref().map(|s| s.addr),
    };
    let mut ways = vec![Way::Raw, Way::Socket, Way::Forward];
    if squid.is_some() {
        ways.push(Way::Squid);
    }

    // The rule holds on both proxies: the upstream's neighbouring port is refused.
    for &way in &ways[1..] {
        let status = target.refused(way, port.wrapping_add(1).max(1))?;
        ensure!(
            status == 403,
            "{} answered {status} to a CONNECT to a port it must refuse, not 403",
            way.label()
        );
    }

    let squid_pid = squid.as_ref().map(|s| s.child.id());
    let cpu = Cpu::new(squid_pid)?;

    // Throughput: one untimed run of each way (a sixteenth of the bytes), then the timed ones.
    let mut mb_s: Vec<Vec<f64>> = vec![Vec::new(); ways.len()];
    let mut cpu_ns = vec![[0u64; 5]; ways.len()];
    for &way in &ways {
        target.throughput(way, (options.bytes / 16).max(1))?;
    }
    for _ in 0..options.runs {
        for (i, &way) in ways.iter().enumerate() {
            let before = cpu.read()?;
            let elapsed = target.throughput(way, options.bytes)?;
            let after = cpu.read()?;
            for g in 0..GROUPS.len() {
                cpu_ns[i][g] += after[g].saturating_sub(before[g]);
            }
            mb_s[i].push(options.bytes as f64 / 1e6 / elapsed.as_secs_f64());
        }
    }

    // Connects, the ways in turn.
    let mut us: Vec<Vec<f64>> = vec![Vec::new(); ways.len()];
    for round in 0..options.warm_up + options.connects {
        let mut this = Vec::with_capacity(ways.len());
        for &way in &ways {
            this.push(target.connect_once(way)?.as_secs_f64() * 1e6);
        }
        if round >= options.warm_up {
            for (i, t) in this.into_iter().enumerate() {
                us[i].push(t);
            }
        }
    }

    let raw = us[0].clone();
    let figures = ways
        .iter()
        .enumerate()
        .map(|(i, &way)| WayFigures {
            way,
            mb_s: mb_s[i].clone(),
            cpu_ns: cpu_ns[i],
            connect: Latency::of(us[i].clone()),
            paired: us[i].iter().zip(&raw).map(|(a, b)| a - b).collect(),
        })
        .collect();

    let squid_version = squid.as_ref().and_then(|_| squid_version(&options.squid));
    drop(squid);
    proxy.close_job(JOB);
    drop(forward_rt);
    drop(proxy_rt);
    drop(upstream);
    Ok(EgressFigures {
        bytes: options.bytes,
        runs: options.runs,
        connects: options.connects,
        warm_up: options.warm_up,
        squid_version,
        ways: figures,
        squid_skipped,
    })
}

fn runtime(name: &str, workers: Option<usize>) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    b.enable_all().thread_name(name);
    if let Some(n) = workers {
        b.worker_threads(n);
    }
    b.build().context("cannot start a Tokio runtime")
}

/// Where each way starts.
struct Target {
    upstream: SocketAddr,
    socket: PathBuf,
    forward: SocketAddr,
    squid: Option<SocketAddr>,
}

impl Target {
    /// A connection that reaches the upstream's `port` on `way`, its tunnel established; or the
    /// status a proxy answered instead.
    fn open(&self, way: Way, port: u16) -> anyhow::Result<Result<Conn, u16>> {
        let tcp = |addr: SocketAddr| -> anyhow::Result<Conn> {
            let s =
                TcpStream::connect(addr).with_context(|| format!("{}: connect", way.label()))?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(BOUND))?;
            s.set_write_timeout(Some(BOUND))?;
            Ok(Conn::Tcp(s))
        };
        let conn = match way {
            Way::Raw => return tcp(self.upstream).map(Ok),
            Way::Socket => {
                let s = UnixStream::connect(&self.socket)
                    .with_context(|| format!("{}: connect", way.label()))?;
                s.set_read_timeout(Some(BOUND))?;
                s.set_write_timeout(Some(BOUND))?;
                Conn::Unix(s)
            }
            Way::Forward => tcp(self.forward)?,
            Way::Squid => tcp(self.squid.context("squid is not running")?)?,
        };
        connect_through(conn, port).with_context(|| format!("{}: CONNECT", way.label()))
    }

    /// The status `way` answers a CONNECT to the upstream's address on `port`.
    fn refused(&self, way: Way, port: u16) -> anyhow::Result<u16> {
        match self.open(way, port)? {
            Ok(_) => Ok(200),
            Err(status) => Ok(status),
        }
    }

    fn tunnel(&self, way: Way) -> anyhow::Result<Conn> {
        match self.open(way, self.upstream.port())? {
            Ok(conn) => Ok(conn),
            Err(status) => bail!("{} refused the tunnel: {status}", way.label()),
        }
    }

    /// Carries `bytes` to the upstream's sink: from the first byte to the upstream's count.
    fn throughput(&self, way: Way, bytes: u64) -> anyhow::Result<Duration> {
        let mut conn = self.tunnel(way)?;
        let mut head = [0u8; 9];
        head[0] = b's';
        head[1..].copy_from_slice(&bytes.to_be_bytes());
        conn.write_all(&head)?;
        let data = vec![0x5au8; WRITE];
        let start = Instant::now();
        let mut left = bytes;
        while left > 0 {
            let n = usize::try_from(left.min(WRITE as u64))?;
            conn.write_all(&data[..n])
                .with_context(|| format!("{}: writing", way.label()))?;
            left -= n as u64;
        }
        let mut count = [0u8; 8];
        conn.read_exact(&mut count)
            .with_context(|| format!("{}: reading the upstream's count", way.label()))?;
        let elapsed = start.elapsed();
        let count = u64::from_be_bytes(count);
        ensure!(
            count == bytes,
            "{}: the upstream took {count} bytes of {bytes}",
            way.label()
        );
        Ok(elapsed)
    }

    /// From connect to the first byte echoed through the tunnel.
    fn connect_once(&self, way: Way) -> anyhow::Result<Duration> {
        let start = Instant::now();
        let mut conn = self.tunnel(way)?;
        conn.write_all(b"e")?;
        let mut echo = [0u8; 1];
        conn.read_exact(&mut echo)
            .with_context(|| format!("{}: reading the echo", way.label()))?;
        let elapsed = start.elapsed();
        ensure!(
            echo == *b"e",
            "{}: the echo is not the byte sent",
            way.label()
        );
        Ok(elapsed)
    }
}

/// Sends `CONNECT 127.0.0.1:port` and reads the answer's head: the tunnel on a 200, else the status.
fn connect_through(mut conn: Conn, port: u16) -> anyhow::Result<Result<Conn, u16>> {
    let request = format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    conn.write_all(request.as_bytes())?;
    let mut head = Vec::with_capacity(128);
    let mut buf = [0u8; 512];
    let end = loop {
        let n = conn.read(&mut buf)?;
        ensure!(n > 0, "the proxy closed before answering");
        head.extend_from_slice(&buf[..n]);
        if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        ensure!(head.len() <= 16 * 1024, "the proxy's answer has no end");
    };
    let status = std::str::from_utf8(&head[..end])
        .ok()
        .and_then(|h| h.split(' ').nth(1))
        .and_then(|s| s.parse::<u16>().ok())
        .context("the proxy's answer has no status")?;
    if status != 200 {
        return Ok(Err(status));
    }
    // Nothing was sent through the tunnel yet, so nothing may follow the head.
    ensure!(end == head.len(), "bytes came through the tunnel unasked");
    Ok(Ok(conn))
}

/// A client connection.
enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.read(buf),
            Conn::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.write(buf),
            Conn::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The upstream server: echo (`e`) or sink (`s` and a length).
struct Upstream {
    addr: SocketAddr,
    _runtime: tokio::runtime::Runtime,
}

impl Upstream {
    fn start() -> anyhow::Result<Upstream> {
        let runtime = runtime("bench-upstream", Some(1))?;
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
            .context("cannot bind the upstream's port")?;
        let addr = listener.local_addr()?;
        runtime.spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve_upstream(stream));
            }
        });
        Ok(Upstream {
            addr,
            _runtime: runtime,
        })
    }
}

async fn serve_upstream(mut s: tokio::net::TcpStream) {
    let _ = s.set_nodelay(true);
    let mut mode = [0u8; 1];
    if s.read_exact(&mut mode).await.is_err() {
        return;
    }
    match mode[0] {
        b'e' => {
            if s.write_all(b"e").await.is_err() {
                return;
            }
            // Wait for the client to close first.
            let mut rest = [0u8; 64];
            while matches!(s.read(&mut rest).await, Ok(n) if n > 0) {}
        }
        b's' => {
            let mut len = [0u8; 8];
            if s.read_exact(&mut len).await.is_err() {
                return;
            }
            let want = u64::from_be_bytes(len);
            let mut buf = vec![0u8; READ];
            let mut got = 0u64;
            while got < want {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got += n as u64,
                }
            }
            let _ = s.write_all(&got.to_be_bytes()).await;
        }
        _ => {}
    }
}

/// A squid of the bench's own: `-N` (no daemon), a config in a temporary folder with its pid file
/// and cache log there, no access log, no cache, and a service name of its own (squid names its
/// shared memory segments in `/dev/shm` after it, so they are not a system squid's); stopped when
/// dropped.
struct Squid {
    child: Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
    name: String,
}

impl Squid {
    fn start(program: &Path, upstream_port: u16) -> anyhow::Result<Squid> {
        if !program.is_file() {
            bail!(
                "{} is missing: install Debian's package (`apt-get install -y squid`; its service need not run) or pass --squid PATH",
                program.display()
            );
        }
        let dir = tempfile::tempdir().context("cannot make squid's temporary folder")?;
        // A free loopback port for squid, found by binding one and letting it go.
        let port = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .context("cannot find a free port for squid")?
            .port();
        let root = rustix::process::geteuid().is_root();
        // As root squid becomes its effective user before it writes its files: that user owns the
        // folder then.
        let user = if root {
            let user = ["proxy", "nobody"]
                .into_iter()
                .find_map(|n| nix::unistd::User::from_name(n).ok().flatten())
                .context("squid needs a user to run as (proxy or nobody); neither exists")?;
            std::os::unix::fs::chown(dir.path(), Some(user.uid.as_raw()), None)
                .context("cannot hand squid's folder to its user")?;
            Some(user.name)
        } else {
            None
        };
        let d = dir.path().display();
        let mut conf = format!(
            "http_port 127.0.0.1:{port}\n\
             pid_filename {d}/squid.pid\n\
             cache_log {d}/cache.log\n\
             access_log none\n\
             cache_store_log none\n\
             coredump_dir {d}\n\
             netdb_filename none\n\
             logfile_rotate 0\n\
             cache deny all\n\
             cache_mem 0 MB\n\
             memory_cache_shared off\n\
             digest_generation off\n\
             pinger_enable off\n\
             shutdown_lifetime 0 seconds\n\
             visible_hostname pi-dispatch-bench\n\
             acl upstream_host dst 127.0.0.1/32\n\
             acl upstream_port port {upstream_port}\n\
             acl CONNECT method CONNECT\n\
             http_access allow CONNECT upstream_host upstream_port\n\
             http_access deny all\n"
        );
        if let Some(user) = &user {
            conf.push_str(&format!("cache_effective_user {user}\n"));
        }
        let conf_path = dir.path().join("squid.conf");
        std::fs::write(&conf_path, conf).context("cannot write squid.conf")?;
        let out = std::fs::File::create(dir.path().join("squid.out"))
            .context("cannot make squid's output file")?;
        let name = format!("pidispatchbench{}", std::process::id());
        let child = Command::new(program)
            .arg("-N")
            .arg("-n")
            .arg(&name)
            .arg("-f")
            .arg(&conf_path)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("cannot start {}", program.display()))?;
        let mut squid = Squid {
            child,
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            dir,
            name,
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = squid.child.try_wait()? {
                bail!(
                    "squid exited ({status}) before it listened; its log:\n{}",
                    squid.log()
                );
            }
            if TcpStream::connect(squid.addr).is_ok() {
                return Ok(squid);
            }
            if Instant::now() > deadline {
                bail!(
                    "squid did not listen within 15 s; its log:\n{}",
                    squid.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self) -> String {
        let mut text = String::new();
        for f in ["squid.out", "cache.log"] {
            if let Ok(t) = std::fs::read_to_string(self.dir.path().join(f)) {
                text.push_str(&t);
            }
        }
        text
    }
}

impl Drop for Squid {
    /// Stops squid (SIGTERM, so that it removes its shared memory; SIGKILL if it is still there
    /// after 10 s) and waits for it; then removes any segment of its name left behind. Its folder
    /// goes after it.
    fn drop(&mut self) {
        use rustix::process::{Pid, Signal, kill_process};
        let pid = i32::try_from(self.child.id()).ok().and_then(Pid::from_raw);
        if let Some(pid) = pid {
            let _ = kill_process(pid, Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let prefix = format!("{}-", self.name);
        if let Ok(entries) = std::fs::read_dir("/dev/shm") {
            for entry in entries.flatten() {
                if entry.file_name().to_string_lossy().starts_with(&prefix) {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
    }
}

/// `squid -v`'s first line.
fn squid_version(program: &Path) -> Option<String> {
    let out = Command::new(program).arg("-v").output().ok()?;
    String::from_utf8(out.stdout)
        .ok()?
        .lines()
        .next()
        .map(str::to_owned)
}

/// The CPU time of the bench's thread groups and squid's, from `schedstat` (ns on a CPU).
struct Cpu {
    client_tid: String,
    squid: Option<u32>,
}

impl Cpu {
    fn new(squid: Option<u32>) -> anyhow::Result<Cpu> {
        let link =
            std::fs::read_link("/proc/thread-self").context("cannot read /proc/thread-self")?;
        let client_tid = link
            .file_name()
            .and_then(|n| n.to_str())
            .context("/proc/thread-self names no thread")?
            .to_owned();
        Ok(Cpu { client_tid, squid })
    }

    /// ns of client, upstream, proxy, forward and squid, in [`GROUPS`]' order.
    fn read(&self) -> anyhow::Result<[u64; 5]> {
        let mut out = [0u64; 5];
        for entry in std::fs::read_dir("/proc/self/task").context("cannot list /proc/self/task")? {
            let path = entry?.path();
            let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
            let tid = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let group = match comm.trim() {
                _ if tid == self.client_tid => 0,
                "bench-upstream" => 1,
                "egress-proxy" => 2,
                "egress-forward" => 3,
                _ => continue,
            };
            out[group] += schedstat(&path);
        }
        if let Some(pid) = self.squid {
            let tasks = format!("/proc/{pid}/task");
            for entry in
                std::fs::read_dir(&tasks).with_context(|| format!("cannot list {tasks}"))?
            {
                out[4] += schedstat(&entry?.path());
            }
        }
        Ok(out)
    }
}

fn schedstat(task: &Path) -> u64 {
    std::fs::read_to_string(task.join("schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segments(name: &str) -> Vec<String> {
        std::fs::read_dir("/dev/shm")
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&format!("{name}-")))
            .collect()
    }

    /// Where squid is installed (this machine, not CI): the bench's squid keeps its files to its
    /// folder and its own shared memory names, and leaves nothing when it stops.
    #[test]
    fn the_benchs_squid_keeps_to_its_folder_and_leaves_nothing_behind() {
        let program = Path::new(SQUID);
        if !program.is_file() {
            eprintln!("skipped: {SQUID} is missing");
            return;
        }
        let squid = Squid::start(program, 9).unwrap();
        let (pid, name, dir) = (
            squid.child.id(),
            squid.name.clone(),
            squid.dir.path().to_owned(),
        );
        assert!(dir.join("squid.pid").is_file());
        assert!(dir.join("cache.log").is_file());
        assert!(
            !segments(&name).is_empty(),
            "squid's segments carry its own name"
        );
        drop(squid);
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "squid is gone"
        );
        assert_eq!(segments(&name), Vec::<String>::new());
        assert!(!dir.exists());
    }

    /// Every way but squid carries its bytes and echoes; a missing squid is named with the way to
    /// get it, and the rest still runs.
    #[test]
    fn the_ways_carry_their_bytes_and_a_missing_squid_is_said() {
        let figures = measure(&Options {
            bytes: 3 << 20,
            runs: 2,
            connects: 20,
            warm_up: 2,
            squid: PathBuf::from("/nonexistent/squid"),
        })
        .unwrap();
        let json = figures.json();
        let ways = json["ways"].as_object().unwrap();
        assert_eq!(
            ways.keys().collect::<Vec<_>>(),
            ["proxy_forward", "proxy_socket", "raw"]
        );
        for (name, way) in ways {
            assert_eq!(
                way["throughput"]["runs_mb_s"].as_array().unwrap().len(),
                2,
                "{name}"
            );
            assert!(way["connect"]["p50_us"].as_f64().unwrap() > 0.0, "{name}");
        }
        // The proxy's own threads did the copying of its tunnels.
        assert!(
            ways["proxy_socket"]["throughput"]["cpu_ms_per_gib"]["proxy"]
                .as_f64()
                .unwrap()
                > 0.0
        );
        // On a job's path the forwarder hands each connection over: the proxy carries the bytes,
        // and the forwarder spends less than it does.
        let job_path = &ways["proxy_forward"]["throughput"]["cpu_ms_per_gib"];
        let (proxy, forward) = (
            job_path["proxy"].as_f64().unwrap(),
            job_path["forward"].as_f64().unwrap(),
        );
        assert!(proxy > 0.0 && forward < proxy, "{job_path}");
        let skipped = json["squid_skipped"].as_str().unwrap();
        assert!(skipped.contains("apt-get install -y squid"), "{skipped}");
    }
}
