//! The relay: each connected server served to pi over streamable HTTP, on one loopback listener at
//! `/mcp/<name>`, behind a bearer token. Everything passes through as it is, both ways — requests
//! (their `_meta` and progress tokens kept, a cancellation passed on), results, errors,
//! notifications, and the server's own requests of the client (sampling, roots, elicitation, ping) —
//! except that:
//!
//! - `initialize` is answered by the relay, with the server's own answer at connect (capabilities,
//!   instructions, serverInfo), at a protocol version both sides speak;
//! - `tools/list` shows only the tools the server listed at connect and the job does not withhold;
//! - `tools/call` to a withheld tool, or to one the server did not list at connect, is refused
//!   before it reaches the server.
//!
//! All sessions of one server share its one upstream connection. The server's notifications go to
//! the most recently initialized session still open, and so do its requests of the client: pi opens
//! one session per server, so the latest is the live one (a reconnect replaces the old one). A
//! progress notification goes instead to the session whose request it reports on, with that
//! request's own token.
//!
//! Both sides are the hub's own code: the server's side is its JSON-RPC client ([`crate::rpc`]),
//! pi's side its streamable-HTTP endpoint ([`crate::endpoint`]). A message is kept as its sender
//! wrote it ([`crate::raw`]); only ids, progress tokens and the `tools/list` result's tools are
//! changed on the way.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ::http::{Request, Response, StatusCode, header};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::calls::ToolCalls;
pub use crate::calls::{GITHUB_WITHHELD, GITLAB_WITHHELD, Withheld};
use crate::connect::Upstream;
use crate::endpoint::{Endpoint, HttpBody, Served};
pub use crate::upstream::{CLIENT_NAME, CLIENT_PROTOCOL_VERSION, UpstreamEvents};
pub use protocol::usage::ToolCallCount;

/// Why the hub did not start. The upstreams it was given are dropped, which kills the stdio ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    #[error("the hub's token is empty")]
    EmptyToken,
    #[error("server name {0:?} cannot be a path segment of the hub")]
    BadName(String),
    #[error("server {0} is given twice")]
    DuplicateName(String),
    #[error("the hub cannot listen on 127.0.0.1 ({0})")]
    Bind(String),
}

/// The running hub: a loopback listener, each server at `/mcp/<name>`, and or a unix socket.
pub struct Hub {
    addr: Option<SocketAddr>,
    ct: CancellationToken,
    accept: Option<JoinHandle<()>>,
    upstreams: Vec<Upstream>,
    calls: Arc<ToolCalls>,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("addr", &self.addr)
            .field("upstreams", &self.upstreams)
            .finish_non_exhaustive()
    }
}

impl Hub {
    /// The loopback address the hub listens on (127.0.0.1, a port of its own), if it does.
    pub fn addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    /// Where pi reaches server `name` over HTTP, if the hub listens on loopback.
    pub fn url(&self, name: &str) -> Option<String> {
        self.addr.map(|addr| format!("http://{addr}/mcp/{name}"))
    }

    /// The servers the hub serves.
    pub fn upstreams(&self) -> &[Upstream] {
        &self.upstreams
    }

    /// Every tool called so far, by server and tool.
    pub fn tool_calls(&self) -> Vec<ToolCallCount> {
        self.calls.snapshot()
    }

    /// Stops listening, ends pi's sessions, then shuts every server down (its process group killed).
    pub async fn shutdown(mut self) {
        self.ct.cancel();
        stop_accepting(self.accept.take(), Duration::from_secs(3)).await;
        let mut shutdowns = JoinSet::new();
        for upstream in self.upstreams.drain(..) {
            shutdowns.spawn(upstream.shutdown());
        }
        while shutdowns.join_next().await.is_some() {}
    }
}

/// Waits up to `grace` for an accept loop told to stop (its token cancelled) to end, then aborts it.
pub(crate) async fn stop_accepting(accept: Option<tokio::task::JoinHandle<()>>, grace: Duration) {
    if let Some(accept) = accept {
        let abort = accept.abort_handle();
        if tokio::time::timeout(grace, accept).await.is_err() {
            abort.abort();
        }
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.ct.cancel();
        if let Some(accept) = self.accept.take() {
            accept.abort();
        }
        // The upstreams drop with the hub: their process groups are killed.
    }
}

/// Where the hub listens for pi.
#[derive(Debug, Default)]
pub struct Listeners {
    /// 127.0.0.1, a port of its own: each server at `/mcp/<name>` over streamable HTTP.
    pub loopback: bool,
    /// A unix socket, bound by the caller: each connection one session with one server, in the
    /// stdio framing, opened by a line that names the server and the token
    /// ([`crate::pi_relay::hello`]); the relay pi starts for each server opens them.
    pub socket: Option<tokio::net::UnixListener>,
}

/// Serves `upstreams` to pi: one listener on 127.0.0.1 (a port of its own), each server at
/// `/mcp/<name>` over streamable HTTP, every request without `Authorization: Bearer <token>`
/// refused with 401.
pub async fn serve(upstreams: Vec<(Upstream, Withheld)>, token: String) -> Result<Hub, ServeError> {
    let listeners = Listeners {
        loopback: true,
        socket: None,
    };
    serve_on(upstreams, token, listeners).await
}

/// Serves `upstreams` to pi where `listeners` say, every session behind the token.
pub async fn serve_on(
    upstreams: Vec<(Upstream, Withheld)>,
    token: String,
    listeners: Listeners,
) -> Result<Hub, ServeError> {
    if token.is_empty() {
        return Err(ServeError::EmptyToken);
    }
    let calls = Arc::new(ToolCalls::default());
    let ct = CancellationToken::new();
    let mut routes = HashMap::new();
    let mut kept = Vec::new();
    for (upstream, withheld) in upstreams {
        let name = upstream.name.clone();
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            || name == "."
            || name == ".."
        {
            return Err(ServeError::BadName(name));
        }
        if routes.contains_key(&name) {
            return Err(ServeError::DuplicateName(name));
        }
        let allowed = upstream
            .tools
            .iter()
            .map(|t| t.name.clone())
            .filter(|t| !withheld.contains(t))
            .collect();
        let (info, version) = upstream.info_raw();
        let served = Served {
            name: name.clone(),
            peer: upstream.core().clone(),
            info: info.clone(),
            version: version.clone(),
            allowed,
            withheld,
            events: upstream.events().clone(),
            calls: calls.clone(),
        };
        // pi may leave a server idle for the whole job: its sessions last until the hub stops.
        routes.insert(name, Endpoint::new(served, ct.child_token()));
        kept.push(upstream);
    }
    let tcp = match listeners.loopback {
        false => None,
        true => Some(
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .await
                .map_err(|e| ServeError::Bind(e.kind().to_string()))?,
        ),
    };
    let addr = match &tcp {
        None => None,
        Some(l) => Some(
            l.local_addr()
                .map_err(|e| ServeError::Bind(e.kind().to_string()))?,
        ),
    };
    let router = Arc::new(Router {
        routes,
        expected: Sha256::digest(format!("Bearer {token}").as_bytes()).to_vec(),
    });
    let accept = tokio::spawn(accept_loop(tcp, listeners.socket, router, ct.clone()));
    Ok(Hub {
        addr,
        ct,
        accept: Some(accept),
        upstreams: kept,
        calls,
    })
}

struct Router {
    routes: HashMap<String, Endpoint>,
    /// SHA-256 of the one `Authorization` value accepted.
    expected: Vec<u8>,
}

impl Router {
    fn authorized(&self, request: &Request<Incoming>) -> bool {
        request
            .headers()
            .get(header::AUTHORIZATION)
            .is_some_and(|given| self.accepts(given.as_bytes()))
    }

    /// Whether `given` is the one `Authorization` value accepted.
    fn accepts(&self, given: &[u8]) -> bool {
        // Digests compared in full, whatever differs: the time does not tell how much matched.
        let given = Sha256::digest(given);
        given.len() == self.expected.len()
            && given
                .iter()
                .zip(&self.expected)
                .fold(0u8, |diff, (a, b)| diff | (a ^ b))
                == 0
    }

    async fn handle(&self, request: Request<Incoming>) -> Response<HttpBody> {
        // A page in a browser that reaches the loopback address under a name of its own (DNS
        // rebinding) is turned away before anything else.
        if !loopback_host(&request) {
            return plain(
                StatusCode::FORBIDDEN,
                "Forbidden: the Host or Origin is not loopback",
            );
        }
        if !self.authorized(&request) {
            return plain(StatusCode::UNAUTHORIZED, "Unauthorized");
        }
        let route = request
            .uri()
            .path()
            .strip_prefix("/mcp/")
            .and_then(|name| self.routes.get(name));
        match route {
            Some(service) => service.handle(request).await,
            None => plain(StatusCode::NOT_FOUND, "Not Found"),
        }
    }
}

/// Whether the request's `Host` (required) and `Origin` (when sent) name this machine's loopback.
fn loopback_host(request: &Request<Incoming>) -> bool {
    let is_loopback = |host: &str| {
        let host = host.to_ascii_lowercase();
        matches!(host.as_str(), "localhost" | "127.0.0.1" | "[::1]" | "::1")
    };
    let Some(host) = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
    else {
        return false;
    };
    let name = match host.rsplit_once(':') {
        Some((name, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    if !is_loopback(name) {
        return false;
    }
    match request.headers().get(header::ORIGIN) {
        None => true,
        Some(origin) => origin
            .to_str()
            .ok()
            .and_then(|o| reqwest::Url::parse(o).ok())
            .and_then(|url| url.host_str().map(is_loopback))
            .unwrap_or(false),
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response<HttpBody> {
    let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())).boxed());
    *response.status_mut() = status;
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
    }
    response
}

async fn accept_loop(
    tcp: Option<TcpListener>,
    socket: Option<tokio::net::UnixListener>,
    router: Arc<Router>,
    ct: CancellationToken,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = ct.cancelled() => break,
            Some(accepted) = accept(tcp.as_ref()), if tcp.is_some() => {
                if let Ok((stream, _)) = accepted {
                    connections.spawn(serve_connection(stream, router.clone(), ct.clone()));
                }
            }
            Some(accepted) = accept_socket(socket.as_ref()), if socket.is_some() => {
                if let Ok((stream, _)) = accepted {
                    connections.spawn(serve_stream(stream, router.clone()));
                }
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    // Sessions end with the token; what is still open after a grace period is cut.
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    connections.shutdown().await;
}

async fn accept(
    listener: Option<&TcpListener>,
) -> Option<std::io::Result<(tokio::net::TcpStream, SocketAddr)>> {
    Some(listener?.accept().await)
}

async fn accept_socket(
    listener: Option<&tokio::net::UnixListener>,
) -> Option<std::io::Result<(tokio::net::UnixStream, tokio::net::unix::SocketAddr)>> {
    Some(listener?.accept().await)
}

/// One connection to the hub's socket. Its first message is a line that names the server and
/// carries the token ([`crate::pi_relay::hello`]), with the relay's standard input and output
/// passed along: the session is then served on those, pi's own streams. Without them, the session
/// is the connection itself. A first line that is not right gets one refusal, and the connection
/// is closed.
async fn serve_stream(stream: tokio::net::UnixStream, router: Arc<Router>) {
    use tokio::io::AsyncReadExt as _;
    let first = tokio::time::timeout(crate::pi_relay::HELLO_WITHIN, first_message(&stream)).await;
    let Ok(Ok((initial, streams))) = first else {
        return;
    };
    let (read, write) = stream.into_split();
    let mut lines = crate::raw::LineReader::new(
        std::io::Cursor::new(initial).chain(read),
        crate::pi_relay::MAX_HELLO,
    );
    let hello = tokio::time::timeout(crate::pi_relay::HELLO_WITHIN, lines.next()).await;
    let route = match hello {
        Ok(Some(crate::raw::Line::Whole(line))) => crate::pi_relay::read_hello(&line)
            .filter(|(_, authorization)| router.accepts(authorization))
            .and_then(|(name, _)| router.routes.get(name)),
        _ => None,
    };
    let mut streams = streams.into_iter();
    match (streams.next(), streams.next(), streams.next()) {
        // The relay's: pi writes to its input and reads its output.
        (Some(input), Some(output), None) => {
            let (Ok(input), Ok(output)) = (passed_reader(input), passed_writer(output)) else {
                return;
            };
            match route {
                Some(endpoint) => {
                    let pi = crate::raw::LineReader::new(input, crate::endpoint::MAX_POST_BODY);
                    endpoint.serve_lines(pi, output).await;
                }
                None => refuse(output).await,
            }
            // Dropping the connection ends the relay.
        }
        (None, _, _) => match route {
            Some(endpoint) => {
                lines.set_max_line(crate::endpoint::MAX_POST_BODY);
                endpoint.serve_lines(lines, write).await;
            }
            None => {
                refuse(write).await;
                // What the other side sent meanwhile is read and dropped (briefly), so that
                // closing does not reset the connection before the refusal is read.
                let _ = tokio::time::timeout(Duration::from_secs(1), async {
                    while lines.next().await.is_some() {}
                })
                .await;
            }
        },
        _ => {}
    }
}

/// Writes the one refusal and closes.
async fn refuse(mut out: impl tokio::io::AsyncWrite + Unpin) {
    use tokio::io::AsyncWriteExt as _;
    let refusal = crate::rpc::error_bytes(b"null", -32600, crate::pi_relay::REFUSED);
    let _ = out.write_all(&refusal).await;
    let _ = out.write_all(b"\n").await;
    let _ = out.shutdown().await;
}

/// The first message of a connection: its bytes (up to the longest first line) and the streams
/// passed with it.
async fn first_message(
    stream: &tokio::net::UnixStream,
) -> std::io::Result<(Vec<u8>, Vec<std::os::fd::OwnedFd>)> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    use std::mem::MaybeUninit;
    let mut bytes = vec![0u8; crate::pi_relay::MAX_HELLO];
    loop {
        stream.readable().await?;
        let mut space = [MaybeUninit::uninit();
            rustix::cmsg_space!(ScmRights(crate::pi_relay::PASSED_STREAMS))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let got = stream.try_io(tokio::io::Interest::READABLE, || {
            rustix::net::recvmsg(
                stream,
                &mut [std::io::IoSliceMut::new(&mut bytes)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            )
            .map_err(std::io::Error::from)
        });
        match got {
            Ok(message) => {
                let mut streams = Vec::new();
                for passed in control.drain() {
                    if let RecvAncillaryMessage::ScmRights(fds) = passed {
                        streams.extend(fds);
                    }
                }
                bytes.truncate(message.bytes);
                return Ok((bytes, streams));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
}

type PassedReader = Box<dyn tokio::io::AsyncRead + Send + Unpin>;
type PassedWriter = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;

/// A passed stream's kind: pi's Node gives its children sockets, other clients pipes.
fn passed_kind(fd: &std::os::fd::OwnedFd) -> std::io::Result<rustix::fs::FileType> {
    let stat = rustix::fs::fstat(fd)?;
    Ok(rustix::fs::FileType::from_raw_mode(stat.st_mode))
}

fn passed_reader(fd: std::os::fd::OwnedFd) -> std::io::Result<PassedReader> {
    match passed_kind(&fd)? {
        rustix::fs::FileType::Socket => Ok(Box::new(passed_socket(fd)?)),
        rustix::fs::FileType::Fifo => Ok(Box::new(
            tokio::net::unix::pipe::Receiver::from_owned_fd(fd)?,
        )),
        _ => Err(std::io::ErrorKind::InvalidInput.into()),
    }
}

fn passed_writer(fd: std::os::fd::OwnedFd) -> std::io::Result<PassedWriter> {
    match passed_kind(&fd)? {
        rustix::fs::FileType::Socket => Ok(Box::new(passed_socket(fd)?)),
        rustix::fs::FileType::Fifo => {
            Ok(Box::new(tokio::net::unix::pipe::Sender::from_owned_fd(fd)?))
        }
        _ => Err(std::io::ErrorKind::InvalidInput.into()),
    }
}

fn passed_socket(fd: std::os::fd::OwnedFd) -> std::io::Result<tokio::net::UnixStream> {
    let socket = std::os::unix::net::UnixStream::from(fd);
    socket.set_nonblocking(true)?;
    tokio::net::UnixStream::from_std(socket)
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    router: Arc<Router>,
    ct: CancellationToken,
) {
    // An answer goes out in several writes: without this, each later write waits for a delayed
    // acknowledgement, some 40 ms per call.
    let _ = stream.set_nodelay(true);
    let service = hyper::service::service_fn(move |request| {
        let router = router.clone();
        async move { Ok::<_, Infallible>(router.handle(request).await) }
    });
    let connection =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => {}
        () = ct.cancelled() => {
            connection.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(1), connection).await;
        }
    }
}
