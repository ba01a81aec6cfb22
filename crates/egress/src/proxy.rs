//! The proxy itself: one listening socket per job (so every connection is known to be that job's),
//! a bounded read of each request's head, the decision of [`crate::rules`], then a tunnel or one
//! plain request to exactly the address that was checked. TLS is never terminated: a CONNECT
//! tunnel carries the job's bytes as they are.
//!
//! On a job's socket the bytes of a tunnel never come up to the proxy: `splice(2)` moves them from
//! one socket to a pipe and on to the other socket inside the kernel (see [`carry_both`]; the
//! forwarder in front of the socket does the same). [`Proxy::serve`], for any stream, copies them.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use config::egress::Route;
use config::url::Host;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest, ReadBuf};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::task::JoinHandle;

use crate::dns::Resolver;
use crate::files::{RuleFiles, WatchedRules};
use crate::handover::{self, Received};
use crate::rules::{self, Denial, OwnMachine, Target};

/// The bounds that keep one job, or a hostile client, from taking the proxy down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// The request line and headers, in bytes.
    pub max_head: usize,
    /// How long a client may take to send its request's head.
    pub head_timeout: Duration,
    /// How long a tunnel may carry nothing either way before it is closed.
    pub idle_timeout: Duration,
    /// How long a connection to the upstream may take.
    pub connect_timeout: Duration,
    /// Connections open at once for one job (tunnels, plain requests and heads still arriving).
    pub per_job: usize,
    /// Connections open at once in all.
    pub total: usize,
    /// The copy buffer of each direction of a tunnel, in bytes.
    pub buffer: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_head: 16 * 1024,
            head_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            connect_timeout: Duration::from_secs(10),
            per_job: 256,
            total: 4096,
            buffer: 64 * 1024,
        }
    }
}

/// A host and port a job was refused, and how many times (protocol's, as the record keeps it).
pub use protocol::egress::Denied as DeniedHost;

pub use protocol::egress::LEFT_OUT;

/// One job's connections: its counters, and what it was denied.
#[derive(Debug)]
pub struct JobState {
    id: String,
    open: AtomicUsize,
    denied: Mutex<BTreeMap<(String, u16), (Denial, u64)>>,
    /// Denials of hosts past the ones kept.
    left_out: AtomicU64,
}

impl JobState {
    pub fn new(id: &str) -> Arc<JobState> {
        Arc::new(JobState {
            id: id.to_owned(),
            open: AtomicUsize::new(0),
            denied: Mutex::new(BTreeMap::new()),
            left_out: AtomicU64::new(0),
        })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// At most this many distinct hosts are kept per job; denials of any other are counted
    /// apart, under [`LEFT_OUT`].
    const MAX_DENIED: usize = 256;

    fn deny(&self, host: &Host, port: u16, why: Denial) {
        let mut d = self.denied.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (host.to_string(), port);
        if d.len() >= Self::MAX_DENIED && !d.contains_key(&key) {
            self.left_out.fetch_add(1, Ordering::Relaxed);
            return;
        }
        d.entry(key).or_insert((why, 0)).1 += 1;
    }

    /// What the job was denied: each host it was kept for, then, when it asked for more hosts
    /// than are kept, one [`LEFT_OUT`] entry counting those denials (host `*`, port 0).
    pub fn denied(&self) -> Vec<DeniedHost> {
        let d = self.denied.lock().unwrap_or_else(PoisonError::into_inner);
        let mut list: Vec<DeniedHost> = d
            .iter()
            .map(|((host, port), (why, count))| DeniedHost {
                host: host.clone(),
                port: *port,
                reason: why.code().to_owned(),
                count: *count,
            })
            .collect();
        let left_out = self.left_out.load(Ordering::Relaxed);
        if left_out > 0 {
            list.push(DeniedHost {
                host: "*".to_owned(),
                port: 0,
                reason: LEFT_OUT.to_owned(),
                count: left_out,
            });
        }
        list
    }
}

struct JobHandle {
    socket: PathBuf,
    accept: JoinHandle<()>,
    state: Arc<JobState>,
}

struct Inner {
    rules: WatchedRules,
    resolver: Resolver,
    limits: Limits,
    own: Mutex<(Instant, Arc<OwnMachine>)>,
    total: AtomicUsize,
    jobs: Mutex<HashMap<String, JobHandle>>,
}

/// The proxy: cheap to clone, shared by every job's listener and the control socket.
#[derive(Clone)]
pub struct Proxy {
    inner: Arc<Inner>,
}

/// Why a job's socket could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("a job id is 1 to 128 letters, digits, '.', '_' or '-'")]
    JobId,
    #[error("the job already has a socket")]
    Open,
    #[error("the socket path must be absolute")]
    Path,
    #[error("the job's socket cannot be made: {0}")]
    Io(io::ErrorKind),
}

pub fn valid_job_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && !id.starts_with('.')
}

impl Proxy {
    pub fn new(files: RuleFiles, resolver: Resolver, limits: Limits) -> Proxy {
        Proxy {
            inner: Arc::new(Inner {
                rules: WatchedRules::new(files),
                resolver,
                limits,
                own: Mutex::new((Instant::now(), Arc::new(own_machine()))),
                total: AtomicUsize::new(0),
                jobs: Mutex::new(HashMap::new()),
            }),
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }

    /// Makes `socket` (a path that must not exist yet) job `job`'s way to the proxy: everything
    /// that connects there is that job's. The socket is mode 0666; who reaches it is decided by
    /// the folder it is in, which the sandbox binds.
    pub fn open_job(&self, job: &str, socket: &Path) -> Result<(), OpenError> {
        if !valid_job_id(job) {
            return Err(OpenError::JobId);
        }
        if !socket.is_absolute() {
            return Err(OpenError::Path);
        }
        let mut jobs = self
            .inner
            .jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if jobs.contains_key(job) {
            return Err(OpenError::Open);
        }
        let listener = UnixListener::bind(socket).map_err(|e| OpenError::Io(e.kind()))?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o666))
                .map_err(|e| OpenError::Io(e.kind()))?;
        }
        let state = JobState::new(job);
        let accept = tokio::spawn(self.clone().accept_loop(listener, state.clone()));
        jobs.insert(
            job.to_owned(),
            JobHandle {
                socket: socket.to_owned(),
                accept,
                state,
            },
        );
        tracing::info!(event = "egress_job_open", job_id = %job);
        Ok(())
    }

    /// Closes job `job`'s socket (its open tunnels end with the job's sandbox) and says what it was
    /// denied; `None` for a job with no socket.
    pub fn close_job(&self, job: &str) -> Option<Vec<DeniedHost>> {
        let handle = self
            .inner
            .jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(job)?;
        handle.accept.abort();
        let _ = std::fs::remove_file(&handle.socket);
        tracing::info!(event = "egress_job_closed", job_id = %job);
        Some(handle.state.denied())
    }

    /// What job `job` was denied so far.
    pub fn denied(&self, job: &str) -> Option<Vec<DeniedHost>> {
        let jobs = self
            .inner
            .jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        jobs.get(job).map(|h| h.state.denied())
    }

    /// Jobs with a socket now.
    pub fn jobs(&self) -> usize {
        self.inner
            .jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Connections open now, in all.
    pub fn connections(&self) -> usize {
        self.inner.total.load(Ordering::Relaxed)
    }

    /// Closes every job's socket (at shutdown).
    pub fn close_all(&self) {
        let ids: Vec<String> = {
            let jobs = self
                .inner
                .jobs
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            jobs.keys().cloned().collect()
        };
        for id in ids {
            self.close_job(&id);
        }
    }

    async fn accept_loop(self, listener: UnixListener, job: Arc<JobState>) {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let proxy = self.clone();
                    let job = job.clone();
                    tokio::spawn(async move { proxy.serve_socket(stream, &job).await });
                }
                Err(e) => {
                    // Out of descriptors, say: wait rather than spin, and go on serving.
                    tracing::warn!(event = "egress_accept_failed", job_id = %job.id, detail = %e.kind());
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn own(&self) -> Arc<OwnMachine> {
        let mut own = self
            .inner
            .own
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if own.0.elapsed() > Duration::from_secs(10) {
            *own = (Instant::now(), Arc::new(own_machine()));
        }
        own.1.clone()
    }

    /// Serves one connection of `job`: a CONNECT tunnel or one plain request.
    pub async fn serve<S>(&self, mut client: S, job: &JobState)
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let counts = match self.admit(job) {
            Ok(counts) => counts,
            Err((status, code)) => {
                let _ = answer(&mut client, status, code).await;
                return;
            }
        };
        let head_by = tokio::time::Instant::now() + self.inner.limits.head_timeout;
        if let Some(open) = self.open(client, job, counts, head_by).await {
            tunnel(open.client, open.upstream, &self.inner.limits).await;
        }
    }

    /// [`Proxy::serve`] for a connection to a job's socket: a request on the socket itself, or a
    /// connection the job's forwarder hands over ([`handover`]); the tunnel's bytes spliced, not
    /// copied. The connection counts from its accept, so a job cannot hold more than its share of
    /// the proxy's descriptors by sending nothing.
    async fn serve_socket(&self, mut socket: UnixStream, job: &JobState) {
        let limits = &self.inner.limits;
        let counts = match self.admit(job) {
            Ok(counts) => counts,
            Err((status, code)) => return refuse_socket(socket, status, code).await,
        };
        let head_by = tokio::time::Instant::now() + limits.head_timeout;
        let received = match tokio::time::timeout_at(head_by, handover::receive(&socket)).await {
            Ok(Ok(received)) => received,
            Ok(Err(_)) => return,
            Err(_) => {
                tracing::info!(event = "egress_refused", job_id = %job.id, verdict = "denied", reason = "head-timeout");
                let _ = answer(&mut socket, 408, "head-timeout").await;
                return;
            }
        };
        match received {
            Received::Closed => {}
            Received::Refused => {
                tracing::warn!(event = "egress_refused", job_id = %job.id, verdict = "denied", reason = "bad-handover");
                let _ = answer(&mut socket, 400, "bad-handover").await;
            }
            Received::Byte(first) => {
                let client = Prefixed {
                    first: Some(first),
                    inner: socket,
                };
                if let Some(open) = self.open(client, job, counts, head_by).await {
                    match open.client {
                        Prefixed { first: None, inner } => {
                            splice_tunnel(End::Unix(&inner), &open.upstream, limits).await;
                        }
                        // A head is longer than a byte, so this is never so; copied if it were.
                        client => tunnel(client, open.upstream, limits).await,
                    }
                }
            }
            Received::Handed { marker, connection } => {
                let Ok(connection) = handover::tcp_stream(connection) else {
                    return;
                };
                if marker == handover::REQUEST_HERE {
                    // The head and its answer on the socket; the bytes on the connection.
                    if let Some(open) = self.open(socket, job, counts, head_by).await {
                        splice_tunnel(End::Tcp(&connection), &open.upstream, limits).await;
                    }
                } else {
                    // The socket has served its turn: only the connection is kept.
                    drop(socket);
                    if let Some(open) = self.open(connection, job, counts, head_by).await {
                        splice_tunnel(End::Tcp(&open.client), &open.upstream, limits).await;
                    }
                }
            }
        }
    }

    /// Counts a new connection of `job`, or says why it is refused: a job past its own bound is
    /// refused before it counts in all, so its extra connections never take the places of other
    /// jobs.
    fn admit<'a>(&'a self, job: &'a JobState) -> Result<Counts<'a>, (u16, &'static str)> {
        let limits = &self.inner.limits;
        let mine = Count::enter(&job.open);
        if mine.0 > limits.per_job {
            tracing::warn!(event = "egress_refused", job_id = %job.id, verdict = "denied", reason = "too-many-connections-for-job");
            return Err((429, "too-many-connections-for-job"));
        }
        let total = Count::enter(&self.inner.total);
        if total.0 > limits.total {
            tracing::warn!(event = "egress_refused", job_id = %job.id, verdict = "denied", reason = "too-many-connections");
            return Err((503, "too-many-connections"));
        }
        Ok(Counts {
            _total: total,
            _job: mine,
        })
    }

    /// Reads and judges the request, connects to the checked address and sends on what belongs
    /// to the upstream: the client and upstream of a tunnel ready to carry bytes, or `None` once
    /// the client had its answer.
    async fn open<'a, S>(
        &'a self,
        mut client: S,
        job: &'a JobState,
        counts: Counts<'a>,
        head_by: tokio::time::Instant,
    ) -> Option<Open<'a, S>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let limits = &self.inner.limits;
        let (head, request) = request_of(&mut client, job, limits, head_by).await?;
        let target = match &request.kind {
            Kind::Connect(t) | Kind::Plain(t, _) => t.clone(),
        };
        let decided = self.decide(&target).await;
        let (addrs, route) = match decided {
            Ok(ok) => ok,
            Err(why) => {
                job.deny(&target.host, target.port, why);
                tracing::info!(
                    event = "egress_decision", job_id = %job.id, host = %target.host,
                    port = target.port, verdict = "denied", reason = why.code()
                );
                let _ = answer(&mut client, 403, why.code()).await;
                return None;
            }
        };
        let upstream = connect(&addrs, target.port, limits.connect_timeout).await;
        let route_text = match &route {
            Route::Allowlisted => "allowlist".to_owned(),
            Route::DeclaredEndpoint { id } => format!("endpoint:{id}"),
        };
        let mut upstream = match upstream {
            Ok(s) => {
                tracing::info!(
                    event = "egress_decision", job_id = %job.id, host = %target.host,
                    port = target.port, verdict = "allowed", route = %route_text, upstream = "connected"
                );
                s
            }
            Err(e) => {
                tracing::info!(
                    event = "egress_decision", job_id = %job.id, host = %target.host,
                    port = target.port, verdict = "allowed", route = %route_text, upstream = e.code()
                );
                let _ = answer(&mut client, e.status(), e.code()).await;
                return None;
            }
        };
        let _ = upstream.set_nodelay(true);
        let rest = &head.bytes[head.len..];
        let sent = send_start(&mut client, &mut upstream, &request.kind, rest).await;
        if sent.is_err() {
            return None;
        }
        Some(Open {
            client,
            upstream,
            _counts: counts,
        })
    }

    /// The addresses `target` may be connected to, and by which route; or why not.
    async fn decide(&self, target: &Target) -> Result<(Vec<IpAddr>, Route), Denial> {
        let rules = self
            .inner
            .rules
            .current()
            .map_err(|_| Denial::RulesUnreadable)?;
        let route = rules::judge(target, &rules)?;
        let resolved: Vec<IpAddr> = match &target.host {
            Host::Ipv4(a) => vec![IpAddr::V4(*a)],
            Host::Ipv6(a) => vec![IpAddr::V6(*a)],
            Host::Name(n) => self.inner.resolver.lookup(n).await,
        };
        let addrs = rules::addresses_for(&route, target, &resolved, &self.own())?;
        Ok((addrs, route))
    }
}

/// A tunnel ready to carry bytes, counted while it lives.
struct Open<'a, S> {
    client: S,
    upstream: TcpStream,
    _counts: Counts<'a>,
}

/// A connection counted in all and for its job, while it lives.
struct Counts<'a> {
    _total: Count<'a>,
    _job: Count<'a>,
}

/// A counter held up while a connection is open.
struct Count<'a>(usize, &'a AtomicUsize);

impl<'a> Count<'a> {
    fn enter(c: &'a AtomicUsize) -> Count<'a> {
        Count(c.fetch_add(1, Ordering::AcqRel) + 1, c)
    }
}

impl Drop for Count<'_> {
    fn drop(&mut self) {
        self.1.fetch_sub(1, Ordering::AcqRel);
    }
}

/// This machine's name (the kernel's node name), as the worker names itself and the proxy knows
/// its own machine: the one place it is read.
pub fn host_name() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

/// This machine's name and interface addresses.
pub fn own_machine() -> OwnMachine {
    let names = Some(host_name().to_ascii_lowercase())
        .filter(|n| !n.is_empty())
        .into_iter()
        .collect();
    let addresses = nix::ifaddrs::getifaddrs()
        .map(|ifs| {
            ifs.filter_map(|i| i.address)
                .filter_map(|a| {
                    if let Some(v4) = a.as_sockaddr_in() {
                        Some(IpAddr::V4(v4.ip()))
                    } else {
                        a.as_sockaddr_in6()
                            .map(|v6| rules::canonical(IpAddr::V6(v6.ip())))
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    OwnMachine { names, addresses }
}

/// What starts the exchange once the upstream is connected: for a tunnel, the client told it is
/// established and what it sent past its head passed on; for a plain request, the request as
/// rewritten, then what followed its head.
async fn send_start<S>(
    client: &mut S,
    upstream: &mut TcpStream,
    kind: &Kind,
    rest: &[u8],
) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    match kind {
        Kind::Connect(_) => {
            client
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await?;
            if rest.is_empty() {
                Ok(())
            } else {
                upstream.write_all(rest).await
            }
        }
        Kind::Plain(_, rewritten) => {
            let mut out = Vec::with_capacity(rewritten.len() + rest.len());
            out.extend_from_slice(rewritten);
            out.extend_from_slice(rest);
            upstream.write_all(&out).await
        }
    }
}

/// Reads the request's head, within its time and size, and parses it; `None` once the client had
/// its answer (or went away).
async fn request_of<S>(
    client: &mut S,
    job: &JobState,
    limits: &Limits,
    head_by: tokio::time::Instant,
) -> Option<(Head, Request)>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let head = match tokio::time::timeout_at(head_by, read_head(client, limits.max_head)).await {
        Err(_) => {
            tracing::info!(event = "egress_refused", job_id = %job.id, verdict = "denied", reason = "head-timeout");
            let _ = answer(client, 408, "head-timeout").await;
            return None;
        }
        Ok(Err(HeadError::TooLarge)) => {
            tracing::info!(event = "egress_refused", job_id = %job.id, verdict = "denied", reason = "head-too-large");
            let _ = answer(client, 431, "head-too-large").await;
            return None;
        }
        Ok(Err(HeadError::Malformed)) => {
            tracing::info!(event = "egress_refused", job_id = %job.id, verdict = "denied", reason = "bad-request");
            let _ = answer(client, 400, "bad-request").await;
            return None;
        }
        Ok(Err(HeadError::Closed)) => return None,
        Ok(Ok(head)) => head,
    };
    let Some(request) = parse_request(&head.bytes[..head.len]) else {
        tracing::info!(event = "egress_refused", job_id = %job.id, verdict = "denied", reason = "bad-request");
        let _ = answer(client, 400, "bad-request").await;
        return None;
    };
    Some((head, request))
}

pub(crate) struct Head {
    pub(crate) bytes: Vec<u8>,
    /// Where the head ends (after its blank line); what follows is the body or tunnel's start.
    pub(crate) len: usize,
}

pub(crate) enum HeadError {
    TooLarge,
    /// Not the start of an HTTP request, however much more comes.
    Malformed,
    Closed,
}

/// The most header fields a request may have; more is a head too large.
const MAX_HEADERS: usize = 100;

/// How much of a request head is read at a time: a head is never held past its limit by more.
pub(crate) const HEAD_CHUNK: usize = 4096;

pub(crate) async fn read_head<S: AsyncRead + Unpin>(
    s: &mut S,
    max: usize,
) -> Result<Head, HeadError> {
    let mut bytes = Vec::with_capacity(1024);
    let mut chunk = [0u8; HEAD_CHUNK];
    loop {
        let n = s.read(&mut chunk).await.map_err(|_| HeadError::Closed)?;
        if n == 0 {
            return Err(HeadError::Closed);
        }
        let from = bytes.len().saturating_sub(3);
        bytes.extend_from_slice(&chunk[..n]);
        if let Some(i) = bytes[from..].windows(4).position(|w| w == b"\r\n\r\n") {
            let len = from + i + 4;
            if len > max {
                return Err(HeadError::TooLarge);
            }
            check_head(&bytes[..len])?;
            return Ok(Head { bytes, len });
        }
        if bytes.len() > max {
            return Err(HeadError::TooLarge);
        }
        // Garbage (a TLS hello sent to the proxy itself, say) is told at once, not waited on.
        check_head(&bytes)?;
    }
}

/// Whether `bytes` are (the start of) a request head.
fn check_head(bytes: &[u8]) -> Result<(), HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    match httparse::Request::new(&mut headers).parse(bytes) {
        Ok(_) => Ok(()),
        Err(httparse::Error::TooManyHeaders) => Err(HeadError::TooLarge),
        Err(_) => Err(HeadError::Malformed),
    }
}

pub(crate) enum Kind {
    Connect(Target),
    /// A plain request and its head as sent on: origin-form, no proxy headers, one request only.
    Plain(Target, Vec<u8>),
}

pub(crate) struct Request {
    pub(crate) kind: Kind,
}

/// Headers a proxy consumes or that would keep a plain connection open for another request (and
/// every `Proxy-*` header, below); `Host` is written anew from the request's target.
const DROPPED: [&str; 4] = ["connection", "keep-alive", "upgrade", "host"];

pub(crate) fn parse_request(head: &[u8]) -> Option<Request> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return None,
    }
    let method = req.method?;
    let uri = req.path?;
    if method.eq_ignore_ascii_case("CONNECT") {
        return rules::connect_target(uri).map(|t| Request {
            kind: Kind::Connect(t),
        });
    }
    let target = rules::plain_target(uri)?;
    let after = &uri[7..];
    let authority = &after[..after.find(['/', '?', '#']).unwrap_or(after.len())];
    let origin = after.find(['/', '?']).map_or("/", |i| &after[i..]);
    let origin = if origin.starts_with('?') {
        format!("/{origin}")
    } else {
        origin.to_owned()
    };
    let mut out = format!("{method} {origin} HTTP/1.{}\r\n", req.version.unwrap_or(1)).into_bytes();
    // A proxy sends the target's host, whatever `Host` the client wrote (RFC 9112, 3.2.2).
    out.extend_from_slice(format!("Host: {authority}\r\n").as_bytes());
    for h in req.headers.iter() {
        let dropped = DROPPED.iter().any(|d| h.name.eq_ignore_ascii_case(d))
            || h.name
                .get(..6)
                .is_some_and(|p| p.eq_ignore_ascii_case("proxy-"));
        if dropped {
            continue;
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    Some(Request {
        kind: Kind::Plain(target, out),
    })
}

/// How long, and for how many bytes, a refused client is still read after its answer.
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 64 * 1024;

/// The text of a short answer with the decision's code (never the host).
fn answer_text(status: u16, code: &str) -> String {
    let reason = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        408 => "Request Timeout",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    };
    let body = format!("pi-dispatch egress proxy: {code}\n");
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nX-Pi-Dispatch-Egress: {code}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// A short answer that ends the connection, with the decision's code (never the host). The client
/// is then read until it is done, for a short while: closing on bytes it sent that were never read
/// would reset the connection, and the answer with it (a request sent after a refusal at accept, the
/// rest of a head too large).
async fn answer<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    status: u16,
    code: &str,
) -> io::Result<()> {
    let text = answer_text(status, code);
    s.write_all(text.as_bytes()).await?;
    s.shutdown().await?;
    linger(s).await;
    Ok(())
}

/// [`answer`] to a connection to a job's socket refused as it is accepted: on the socket at once
/// (a client there may wait for it before it sends), and on the connection the forwarder hands
/// over, if one comes.
async fn refuse_socket(mut socket: UnixStream, status: u16, code: &str) {
    let _ = socket.write_all(answer_text(status, code).as_bytes()).await;
    let _ = socket.shutdown().await;
    match tokio::time::timeout(LINGER, handover::receive(&socket)).await {
        Ok(Ok(Received::Handed { marker, connection })) if marker == handover::REQUEST_ON_IT => {
            if let Ok(mut connection) = handover::tcp_stream(connection) {
                let _ = answer(&mut connection, status, code).await;
            }
        }
        Ok(Ok(Received::Byte(_))) => linger(&mut socket).await,
        _ => {}
    }
}

/// Reads what the client still sends, up to a bound and for a short while, so that closing does
/// not reset the connection (and the answer with it).
async fn linger<S: AsyncRead + Unpin>(s: &mut S) {
    let drain = async {
        let mut buf = [0u8; 4096];
        let mut left = LINGER_BYTES;
        while left > 0 {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

enum ConnectError {
    Refused,
    Timeout,
}

impl ConnectError {
    fn code(&self) -> &'static str {
        match self {
            ConnectError::Refused => "upstream-unreachable",
            ConnectError::Timeout => "upstream-timeout",
        }
    }
    fn status(&self) -> u16 {
        match self {
            ConnectError::Refused => 502,
            ConnectError::Timeout => 504,
        }
    }
}

/// Connects to the checked addresses in order, never to anything looked up again.
async fn connect(
    addrs: &[IpAddr],
    port: u16,
    timeout: Duration,
) -> Result<TcpStream, ConnectError> {
    let mut last = ConnectError::Refused;
    for a in addrs {
        match tokio::time::timeout(timeout, TcpStream::connect(SocketAddr::new(*a, port))).await {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(_)) => last = ConnectError::Refused,
            Err(_) => last = ConnectError::Timeout,
        }
    }
    Err(last)
}

/// When a tunnel last carried anything.
pub(crate) struct Activity {
    start: Instant,
    /// Microseconds after `start` (milliseconds, floored, made a tunnel look idle up to a
    /// millisecond before it was).
    last: AtomicU64,
}

impl Activity {
    pub(crate) fn new() -> Activity {
        Activity {
            start: Instant::now(),
            last: AtomicU64::new(0),
        }
    }

    fn moved(&self) {
        let us = u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.last.store(us, Ordering::Relaxed);
    }

    /// Returns once nothing has moved for `idle`.
    async fn idle(&self, idle: Duration) {
        loop {
            let since = self
                .start
                .elapsed()
                .saturating_sub(Duration::from_micros(self.last.load(Ordering::Relaxed)));
            if since >= idle {
                return;
            }
            tokio::time::sleep(idle - since).await;
        }
    }
}

/// Carries bytes both ways until both sides are done, or nothing moves for the idle time.
async fn tunnel<A, B>(a: A, b: B, limits: &Limits)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let activity = Arc::new(Activity::new());
    let mut a = Active {
        inner: a,
        activity: activity.clone(),
    };
    let mut b = Active {
        inner: b,
        activity: activity.clone(),
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional_with_sizes(&mut a, &mut b, limits.buffer, limits.buffer) => {}
        () = activity.idle(limits.idle_timeout) => {}
    }
}

/// [`tunnel`] between the job's end and the upstream, with the bytes spliced.
async fn splice_tunnel(client: End<'_>, upstream: &TcpStream, limits: &Limits) {
    let activity = Activity::new();
    tokio::select! {
        _ = carry_both(client, End::Tcp(upstream), limits.buffer, &activity) => {}
        () = activity.idle(limits.idle_timeout) => {}
    }
}

/// One socket of a tunnel whose bytes are spliced.
#[derive(Clone, Copy)]
pub(crate) enum End<'a> {
    Tcp(&'a TcpStream),
    Unix(&'a UnixStream),
}

impl<'a> End<'a> {
    async fn ready(self, interest: Interest) -> io::Result<()> {
        match self {
            End::Tcp(s) => s.ready(interest).await.map(drop),
            End::Unix(s) => s.ready(interest).await.map(drop),
        }
    }

    /// `f` on the socket; its readiness for `interest` is cleared when `f` would block.
    fn try_io<R>(self, interest: Interest, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        match self {
            End::Tcp(s) => s.try_io(interest, f),
            End::Unix(s) => s.try_io(interest, f),
        }
    }

    fn fd(self) -> BorrowedFd<'a> {
        match self {
            End::Tcp(s) => s.as_fd(),
            End::Unix(s) => s.as_fd(),
        }
    }

    fn try_read(self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            End::Tcp(s) => s.try_read(buf),
            End::Unix(s) => s.try_read(buf),
        }
    }

    fn try_write(self, buf: &[u8]) -> io::Result<usize> {
        match self {
            End::Tcp(s) => s.try_write(buf),
            End::Unix(s) => s.try_write(buf),
        }
    }

    /// Ends what this side sends (the peer reads its end), as a copy does when the other side
    /// ended.
    fn shutdown_write(self) {
        let _ = rustix::net::shutdown(self.fd(), rustix::net::Shutdown::Write);
    }
}

/// Carries bytes both ways between `a` and `b`, each way through a pipe of `buffer` bytes, until
/// both ways have ended (or one fails).
pub(crate) async fn carry_both(
    a: End<'_>,
    b: End<'_>,
    buffer: usize,
    activity: &Activity,
) -> io::Result<()> {
    tokio::try_join!(
        carry(a, b, buffer, activity, true),
        carry(b, a, buffer, activity, true)
    )
    .map(drop)
}

/// What a pipe holds by default (16 pages).
const PIPE_DEFAULT: usize = 64 * 1024;

/// The pipe of one way of a tunnel: what `splice` takes from one socket waits here for the other.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    fn new(size: usize) -> io::Result<Pipe> {
        use rustix::pipe::{PipeFlags, fcntl_setpipe_size, pipe_with};
        let (read, write) = pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
        if size > PIPE_DEFAULT {
            // A bigger pipe if the system grants one; the default one works too.
            let _ = fcntl_setpipe_size(&write, size);
        }
        Ok(Pipe { read, write })
    }
}

fn splice(from: BorrowedFd<'_>, to: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
    use rustix::pipe::SpliceFlags;
    let flags = SpliceFlags::MOVE | SpliceFlags::NONBLOCK;
    Ok(rustix::pipe::splice(from, None, to, None, len, flags)?)
}

/// Whether `splice` is refused for these sockets (a kernel without it, or a filter), so the way
/// must copy instead.
fn cannot_splice(e: &io::Error) -> bool {
    use rustix::io::Errno;
    [Errno::INVAL, Errno::NOSYS, Errno::PERM, Errno::OPNOTSUPP]
        .iter()
        .any(|no| e.raw_os_error() == Some(no.raw_os_error()))
}

/// Moves what `from` sends to `to` until `from` ends, then ends what `to` is sent. The bytes go
/// through a pipe by `splice`, so they stay in the kernel; through a buffer of `buffer` bytes
/// instead when `spliced` is false, when no pipe can be had (the descriptors run out, say), or
/// when the first `splice` is refused. The pipe is made once `from` is first ready, so a tunnel
/// holds its two descriptors per way only once it carries something. Says whether the bytes were
/// spliced.
async fn carry(
    from: End<'_>,
    to: End<'_>,
    buffer: usize,
    activity: &Activity,
    spliced: bool,
) -> io::Result<bool> {
    let buffer = buffer.max(4096);
    let mut splicing = spliced;
    let mut pipe: Option<Pipe> = None;
    let mut copy = Vec::new();
    let mut carried = false;
    loop {
        let n = loop {
            from.ready(Interest::READABLE).await?;
            if splicing && pipe.is_none() {
                pipe = Pipe::new(buffer).ok();
                splicing = pipe.is_some();
            }
            if !splicing && copy.is_empty() {
                copy = vec![0u8; buffer];
            }
            let got = match &pipe {
                Some(p) if splicing => from.try_io(Interest::READABLE, || {
                    splice(from.fd(), p.write.as_fd(), buffer)
                }),
                _ => from.try_read(&mut copy),
            };
            match got {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if splicing && !carried && cannot_splice(&e) => {
                    splicing = false;
                    pipe = None;
                }
                Err(e) => return Err(e),
            }
        };
        if n == 0 {
            to.shutdown_write();
            return Ok(splicing);
        }
        carried = true;
        activity.moved();
        let mut left = n;
        while left > 0 {
            to.ready(Interest::WRITABLE).await?;
            let put = match &pipe {
                Some(p) if splicing => {
                    to.try_io(Interest::WRITABLE, || splice(p.read.as_fd(), to.fd(), left))
                }
                _ => to.try_write(&copy[n - left..n]),
            };
            match put {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(m) => left -= m,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// A stream whose first byte was read before it: that byte, then the stream.
struct Prefixed<S> {
    first: Option<u8>,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if buf.remaining() > 0
            && let Some(b) = self.first.take()
        {
            buf.put_slice(&[b]);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

/// `AsyncWrite` for a wrapper whose writes go to its `inner` stream as they are.
macro_rules! writes_through {
    ($wrapper:ident) => {
        impl<S: AsyncWrite + Unpin> AsyncWrite for $wrapper<S> {
            fn poll_write(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                Pin::new(&mut self.inner).poll_write(cx, buf)
            }
            fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Pin::new(&mut self.inner).poll_flush(cx)
            }
            fn poll_shutdown(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<io::Result<()>> {
                Pin::new(&mut self.inner).poll_shutdown(cx)
            }
        }
    };
}

writes_through!(Prefixed);

/// A stream that notes when it last read anything.
struct Active<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Active<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.moved();
        }
        r
    }
}

writes_through!(Active);

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    fn numbered(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8 ^ seed).collect()
    }

    /// A unix socket pair and a TCP connection, near end first. The near ends take little at a
    /// time (a small send buffer), so that writes to them are cut short.
    async fn ends() -> ((UnixStream, UnixStream), (TcpStream, TcpStream)) {
        use rustix::net::sockopt::set_socket_send_buffer_size;
        let unix = UnixStream::pair().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let far = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (near, _) = listener.accept().await.unwrap();
        set_socket_send_buffer_size(&unix.0, 8192).unwrap();
        set_socket_send_buffer_size(&near, 8192).unwrap();
        (unix, (near, far))
    }

    /// A unix socket and a TCP connection joined by [`carry`] both ways, as the job's socket and
    /// the upstream are: the far ends each send 3 MiB, then end their sending, and each must read
    /// the other's bytes exactly, then the end.
    async fn joined(spliced: bool) {
        let ((near_unix, mut far_unix), (near_tcp, mut far_tcp)) = ends().await;
        let (to_tcp, to_unix) = (numbered(3 << 20, 1), numbered(3 << 20, 2));
        let activity = Activity::new();
        let (unix, tcp) = (End::Unix(&near_unix), End::Tcp(&near_tcp));
        let carried = async {
            tokio::try_join!(
                carry(unix, tcp, 64 * 1024, &activity, spliced),
                carry(tcp, unix, 64 * 1024, &activity, spliced)
            )
        };
        let far = async {
            let (mut unix_read, mut unix_write) = far_unix.split();
            let (mut tcp_read, mut tcp_write) = far_tcp.split();
            let (mut at_tcp, mut at_unix) = (Vec::new(), Vec::new());
            tokio::join!(
                async {
                    unix_write.write_all(&to_tcp).await.unwrap();
                    unix_write.shutdown().await.unwrap();
                },
                async {
                    tcp_write.write_all(&to_unix).await.unwrap();
                    tcp_write.shutdown().await.unwrap();
                },
                async { tcp_read.read_to_end(&mut at_tcp).await.unwrap() },
                async { unix_read.read_to_end(&mut at_unix).await.unwrap() },
            );
            (at_tcp, at_unix)
        };
        let (carried, (at_tcp, at_unix)) = tokio::time::timeout(Duration::from_secs(30), async {
            tokio::join!(carried, far)
        })
        .await
        .expect("the tunnel ends once both sides have ended");
        assert_eq!(carried.unwrap(), (spliced, spliced), "spliced both ways");
        assert!(
            at_tcp == to_tcp,
            "the TCP side got {} other bytes",
            at_tcp.len()
        );
        assert!(
            at_unix == to_unix,
            "the unix side got {} other bytes",
            at_unix.len()
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_spliced_tunnel_carries_both_ways_and_passes_each_end_on() {
        joined(true).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_copied_tunnel_carries_both_ways_and_passes_each_end_on() {
        joined(false).await;
    }

    /// One way ends, the other goes on: what the TCP side sends after the unix side ended still
    /// arrives, and the tunnel ends once both have.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_half_closed_tunnel_still_carries_the_other_way() {
        tokio::time::timeout(Duration::from_secs(30), half_closed())
            .await
            .expect("the tunnel carries the answer and ends");
    }

    async fn half_closed() {
        let ((near_unix, mut far_unix), (near_tcp, mut far_tcp)) = ends().await;
        let tunnel = tokio::spawn(async move {
            let activity = Activity::new();
            carry_both(
                End::Unix(&near_unix),
                End::Tcp(&near_tcp),
                64 * 1024,
                &activity,
            )
            .await
        });
        far_unix.write_all(b"request").await.unwrap();
        far_unix.shutdown().await.unwrap();
        let mut request = Vec::new();
        far_tcp.read_to_end(&mut request).await.unwrap();
        assert_eq!(request, b"request");
        far_tcp
            .write_all(b"answer, after the request ended")
            .await
            .unwrap();
        far_tcp.shutdown().await.unwrap();
        let mut answer = Vec::new();
        far_unix.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer, b"answer, after the request ended");
        tokio::time::timeout(Duration::from_secs(10), tunnel)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
}
