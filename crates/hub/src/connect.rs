//! Connecting one server: a stdio server started the way the job starts it (a closed environment, its
//! own process group, its stderr kept in memory), or any other rmcp client transport; then the
//! handshake (protocol `2025-11-25`, client `pi-dispatch-hub`) and the whole tool list. A server has
//! answered once its tools are listed.
//!
//! What fails is said in words for the worker's log ([`ConnectFailure`]): never a value of the
//! server's environment or arguments, never the server's own error text (which could echo them).

use std::collections::VecDeque;
use std::fmt;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use rmcp::model::{Implementation, InitializeResult, ServerPeerInfo, Tool};
use rmcp::service::{ClientInitializeError, RunningService, ServiceError};
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::{IntoTransport, Transport};
use rmcp::{Peer, RoleClient, ServiceExt};
use tokio::io::AsyncReadExt;

use crate::raw::LineTap;
use crate::upstream::UpstreamEvents;

/// How much of a stdio server's stderr is kept: the last 16 KiB.
pub const STDERR_TAIL_BYTES: usize = 16 * 1024;

/// The longest line of a stdio server's output whose result is relayed as the server wrote it (a
/// longer one is relayed as rmcp read it): the HTTP servers' body limit.
const MAX_RAW_LINE: usize = 16 * 1024 * 1024;

/// How long [`Upstream::shutdown`] lets the server go by itself (stdin closed, then `SIGTERM`) before
/// its whole process group is killed.
pub const POLITE_SHUTDOWN: Duration = Duration::from_secs(4);

/// One connected server: the running client session, its tools as listed at connect, and (for a
/// stdio server) its process group, killed when this is dropped or shut down.
pub struct Upstream {
    pub name: String,
    /// Every tool the server listed at connect, all pages.
    pub tools: Vec<Tool>,
    /// The client side of the session, to send requests to the server.
    pub peer: Peer<RoleClient>,
    /// From the start of the connection to the tool list.
    pub ready_after: Duration,
    /// Boxed: an `Upstream` is moved about whole, and this is most of it.
    inner: Box<Inner>,
    // Last: dropped after the session, so the group is killed once the session has let go of it.
    group: Option<ProcessGroup>,
}

struct Inner {
    info: InitializeResult,
    /// The same answer as the server wrote it, when its transport kept it.
    raw_info: Option<serde_json::Value>,
    events: UpstreamEvents,
    service: RunningService<RoleClient, UpstreamEvents>,
    stderr: Option<StderrTail>,
}

impl fmt::Debug for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Upstream")
            .field("name", &self.name)
            .field("tools", &self.tools.len())
            .field("ready_after", &self.ready_after)
            .field("process_group", &self.process_group())
            .finish_non_exhaustive()
    }
}

impl Upstream {
    /// The stdio server's process group (its leader's pid), which [`Upstream::shutdown`] and drop
    /// kill whole; `None` for a server that is not a child process.
    pub fn process_group(&self) -> Option<i32> {
        self.group.as_ref().map(|g| g.0)
    }

    /// The last [`STDERR_TAIL_BYTES`] of the stdio server's stderr, for the diagnosis only (it may
    /// hold anything the server printed, values included): empty for other servers.
    pub fn stderr_tail(&self) -> String {
        self.inner
            .stderr
            .as_ref()
            .map(StderrTail::text)
            .unwrap_or_default()
    }

    /// The server's `initialize` answer as received: protocol version, capabilities, serverInfo,
    /// instructions.
    pub fn info(&self) -> &InitializeResult {
        &self.inner.info
    }

    /// The server's `initialize` result as the server wrote it (fields rmcp does not know
    /// included), when the transport kept it.
    pub fn raw_info(&self) -> Option<&serde_json::Value> {
        self.inner.raw_info.as_ref()
    }

    /// The handler the session was connected with: where its notifications and requests go.
    pub fn events(&self) -> &UpstreamEvents {
        &self.inner.events
    }

    /// Whether the session has ended (the server exited or closed its connection).
    pub fn is_closed(&self) -> bool {
        self.inner.service.is_closed() || self.peer.is_transport_closed()
    }

    /// Ends the session: stdin closed (or the HTTP session deleted), the server given
    /// [`POLITE_SHUTDOWN`] to exit (rmcp sends `SIGTERM` on the way), then its whole process group
    /// killed.
    pub async fn shutdown(mut self) {
        let _ = self.inner.service.close_with_timeout(POLITE_SHUTDOWN).await;
        if let Some(group) = self.group.take() {
            group.end().await;
        }
    }
}

/// Why a server did not answer, in words for the worker's log; the caller maps it to
/// `mcp-unavailable`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectFailure {
    #[error("its command did not start ({0})")]
    NotStarted(String),
    #[error("it exited or closed its connection before it {0}")]
    Exited(&'static str),
    #[error("it asks for authorization (HTTP 401 or 403)")]
    AuthorizationRequired,
    #[error("the handshake failed: {0}")]
    Handshake(String),
    #[error("its tool list failed: {0}")]
    ToolsList(String),
}

/// A server that did not answer. Its `Display` is the failure in words; the stderr tail and the
/// transport's own error are kept apart, for the diagnosis and for classification, and are never
/// part of `Display` or `Debug` (either may hold a value).
#[derive(thiserror::Error)]
#[error("{failure}")]
pub struct ConnectError {
    pub server: String,
    pub failure: ConnectFailure,
    stderr_tail: String,
    transport: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl fmt::Debug for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectError")
            .field("server", &self.server)
            .field("failure", &self.failure)
            .field("stderr_tail_bytes", &self.stderr_tail.len())
            .finish_non_exhaustive()
    }
}

impl ConnectError {
    fn new(server: &str, failure: ConnectFailure) -> ConnectError {
        ConnectError {
            server: server.to_owned(),
            failure,
            stderr_tail: String::new(),
            transport: None,
        }
    }

    /// The last of a stdio server's stderr when it failed (empty otherwise): for the diagnosis only.
    pub fn stderr_tail(&self) -> &str {
        &self.stderr_tail
    }

    /// The transport's own error, when the transport failed: to classify (downcast, e.g. to an HTTP
    /// status error), never to print — its text may carry the server's URL.
    pub fn transport_error(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        self.transport.as_deref()
    }
}

/// Starts a stdio server and connects it: `command` with `args`, exactly `env` (nothing inherited),
/// in `cwd`, in its own process group, stdin and stdout for MCP, stderr kept in memory (the last
/// [`STDERR_TAIL_BYTES`]). A dropped future kills the server's whole group.
pub async fn connect_stdio(
    name: &str,
    command: &Path,
    args: &[String],
    env: &[(String, String)],
    cwd: &Path,
    events: UpstreamEvents,
) -> Result<Upstream, ConnectError> {
    let started = Instant::now();
    let mut cmd = tokio::process::Command::new(command);
    cmd.args(args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let not_started = |e: std::io::Error| {
        ConnectError::new(name, ConnectFailure::NotStarted(e.kind().to_string()))
    };
    let mut child = spawn::retry_busy(|| cmd.spawn()).map_err(not_started)?;
    // With `process_group(0)` the child leads a group whose id is its pid.
    let group = child
        .id()
        .and_then(|pid| i32::try_from(pid).ok())
        .map(ProcessGroup);
    let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
        return Err(not_started(std::io::ErrorKind::BrokenPipe.into()));
    };
    let stderr = child.stderr.take();
    let stdout = LineTap::new(stdout, events.raw().clone(), MAX_RAW_LINE);
    let transport = ChildTransport {
        messages: AsyncRwTransport::new(stdout, stdin),
        child,
    };
    let tail = StderrTail::default();
    let collector = stderr.map(|stderr| tokio::spawn(tail.clone().collect(stderr)));
    match handshake(name, transport, events, started).await {
        Ok(mut upstream) => {
            upstream.inner.stderr = Some(tail);
            upstream.group = group;
            Ok(upstream)
        }
        Err(mut error) => {
            if let Some(group) = group {
                group.end().await; // kills what is left of the group
            }
            // Read what the server printed up to its end (bounded: a process outside the group
            // could hold the pipe open).
            if let Some(collector) = collector {
                let _ = tokio::time::timeout(Duration::from_millis(500), collector).await;
            }
            error.stderr_tail = tail.text();
            Err(error)
        }
    }
}

/// Connects a server over any rmcp client transport (the HTTP one, for instance).
pub async fn connect_transport<T, E, A>(
    name: &str,
    transport: T,
    events: UpstreamEvents,
) -> Result<Upstream, ConnectError>
where
    T: IntoTransport<RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    handshake(name, transport, events, Instant::now()).await
}

async fn handshake<T, E, A>(
    name: &str,
    transport: T,
    events: UpstreamEvents,
    started: Instant,
) -> Result<Upstream, ConnectError>
where
    T: IntoTransport<RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    let ordered = events.ordered(transport.into_transport());
    let service = events
        .clone()
        .serve(ordered)
        .await
        .map_err(|e| initialize_failed(name, e))?;
    let peer = service.peer().clone();
    let info = peer
        .peer_info()
        .map(|info| initialize_result(&info))
        .ok_or_else(|| {
            ConnectError::new(
                name,
                ConnectFailure::Handshake("no initialize result was kept".to_owned()),
            )
        })?;
    // A server that offers no tools has none to list.
    let tools = if info.capabilities.tools.is_some() {
        peer.list_all_tools()
            .await
            .map_err(|e| tools_failed(name, e))?
    } else {
        Vec::new()
    };
    // The server's own `initialize` answer, for the relay to answer pi with; the rest of the
    // handshake's results are not pi's to have.
    let raw_info = events.raw().take_where(|result| {
        result.get("protocolVersion").is_some() && result.get("capabilities").is_some()
    });
    events.raw().clear();
    Ok(Upstream {
        name: name.to_owned(),
        tools,
        peer,
        ready_after: started.elapsed(),
        inner: Box::new(Inner {
            info,
            raw_info,
            events,
            service,
            stderr: None,
        }),
        group: None,
    })
}

fn initialize_result(info: &ServerPeerInfo) -> InitializeResult {
    let mut result = InitializeResult::new(info.capabilities.clone())
        .with_protocol_version(info.protocol_version.clone())
        .with_server_info(
            info.server_info
                .clone()
                .unwrap_or_else(|| Implementation::new("", "")),
        );
    result.instructions = info.instructions.clone();
    result.meta = info.meta.clone();
    result
}

fn initialize_failed(name: &str, e: ClientInitializeError) -> ConnectError {
    if e.is_authorization_required() {
        let mut error = ConnectError::new(name, ConnectFailure::AuthorizationRequired);
        if let ClientInitializeError::TransportError { error: t, .. } = e {
            error.transport = Some(Box::new(t));
        }
        return error;
    }
    let words = match e {
        ClientInitializeError::ConnectionClosed(_) => {
            return ConnectError::new(name, ConnectFailure::Exited("answered initialize"));
        }
        ClientInitializeError::TransportError { error, .. } if closed(&error) => {
            return ConnectError::new(name, ConnectFailure::Exited("answered initialize"));
        }
        ClientInitializeError::TransportError { error, context } => {
            let mut failure = ConnectError::new(
                name,
                ConnectFailure::Handshake(format!("the transport failed ({context})")),
            );
            failure.transport = Some(Box::new(error));
            return failure;
        }
        ClientInitializeError::JsonRpcError(e) => {
            format!("the server answered initialize with error {}", e.code.0)
        }
        ClientInitializeError::ExpectedInitResponse(_)
        | ClientInitializeError::ExpectedInitResult(_) => {
            "the server answered initialize with something other than its result".to_owned()
        }
        ClientInitializeError::ConflictInitResponseId(..)
        | ClientInitializeError::UncorrelatedErrorResponse { .. } => {
            "the server answered with another request's id".to_owned()
        }
        ClientInitializeError::Cancelled => "cancelled".to_owned(),
        _ => "the server's answer was not usable".to_owned(),
    };
    ConnectError::new(name, ConnectFailure::Handshake(words))
}

fn tools_failed(name: &str, e: ServiceError) -> ConnectError {
    if e.is_authorization_required() {
        return ConnectError::new(name, ConnectFailure::AuthorizationRequired);
    }
    let words = match e {
        ServiceError::TransportClosed => {
            return ConnectError::new(name, ConnectFailure::Exited("listed its tools"));
        }
        ServiceError::TransportSend(error) if closed(&error) => {
            return ConnectError::new(name, ConnectFailure::Exited("listed its tools"));
        }
        ServiceError::TransportSend(error) => {
            let mut failure = ConnectError::new(
                name,
                ConnectFailure::ToolsList("the transport failed".to_owned()),
            );
            failure.transport = Some(Box::new(error));
            return failure;
        }
        ServiceError::McpError(e) => format!("the server answered with error {}", e.code.0),
        ServiceError::UnexpectedResponse => {
            "the server answered with something other than a tool list".to_owned()
        }
        ServiceError::Timeout { .. } => "it timed out".to_owned(),
        _ => "the request failed".to_owned(),
    };
    ConnectError::new(name, ConnectFailure::ToolsList(words))
}

/// Whether the transport failed because the other end is gone (a stdio server that exited before
/// it read what was sent: a broken pipe, or a pipe rmcp had already closed).
fn closed(error: &rmcp::transport::DynamicTransportError) -> bool {
    error
        .error
        .downcast_ref::<std::io::Error>()
        .is_some_and(|e| {
            matches!(
                e.kind(),
                std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::NotConnected
                    | std::io::ErrorKind::ConnectionReset
            )
        })
}

/// A stdio server's connection: its messages over its standard input and output (the output also
/// read by the [`LineTap`]), and the server itself. Closing it is the stdio shutdown the protocol
/// describes: standard input closed, a while to exit, then `SIGTERM`, a while more, then `SIGKILL`.
struct ChildTransport {
    messages: AsyncRwTransport<
        RoleClient,
        LineTap<tokio::process::ChildStdout>,
        tokio::process::ChildStdin,
    >,
    child: tokio::process::Child,
}

impl Transport<RoleClient> for ChildTransport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: rmcp::service::TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.messages.send(item)
    }

    fn receive(
        &mut self,
    ) -> impl Future<Output = Option<rmcp::service::RxJsonRpcMessage<RoleClient>>> + Send {
        self.messages.receive()
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        let _ = self.messages.close().await;
        let wait = POLITE_SHUTDOWN / 2;
        if tokio::time::timeout(wait, self.child.wait()).await.is_ok() {
            return Ok(());
        }
        if let Some(pid) = self.child.id().and_then(|p| i32::try_from(p).ok()) {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        if tokio::time::timeout(wait, self.child.wait()).await.is_ok() {
            return Ok(());
        }
        self.child.kill().await
    }
}

/// A process group, killed (`SIGKILL` to every member) when dropped; [`ProcessGroup::end`] also
/// waits until it is gone.
#[derive(Debug)]
struct ProcessGroup(i32);

/// How long ending a group waits for its killed members to be gone.
const GROUP_GONE_WAIT: Duration = Duration::from_millis(500);

impl ProcessGroup {
    /// Kills the group and waits, briefly and boundedly, until no member is alive, so that the
    /// caller can say it is gone. The wait yields to the runtime; it never blocks a worker thread.
    async fn end(self) {
        let pgid = self.0;
        std::mem::forget(self);
        // ESRCH (nobody left) is the usual answer once the server has exited by itself.
        if killpg(Pid::from_raw(pgid), Signal::SIGKILL).is_err() {
            return;
        }
        // SIGKILL takes effect when each process next runs.
        let deadline = tokio::time::Instant::now() + GROUP_GONE_WAIT;
        while live_members(pgid) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if killpg(Pid::from_raw(self.0), Signal::SIGKILL).is_err() {
            return;
        }
        // Dropped with its connection (a connection given up on, a panic unwinding): wait as
        // `end` does, so that whoever dropped it can say it is gone. On a multi-thread runtime the
        // wait is handed off with `block_in_place`, so the worker's other tasks go on elsewhere; a
        // current-thread runtime cannot do that, and there the kill is sent without the wait.
        let pgid = self.0;
        let wait = move || {
            let deadline = std::time::Instant::now() + GROUP_GONE_WAIT;
            while live_members(pgid) > 0 && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
            }
        };
        match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Err(_) => wait(),
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(wait),
            Ok(_) => {}
        }
    }
}

/// How many processes of group `pgid` are alive (zombies, already dead, do not count).
fn live_members(pgid: i32) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            // After the command name in parentheses: state, ppid, pgrp, ...
            let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
                return false;
            };
            let fields: Vec<&str> = rest.split_whitespace().collect();
            fields.len() > 2
                && fields[0] != "Z"
                && fields[0] != "X"
                && fields[2] == pgid.to_string()
        })
        .count()
}

/// The last [`STDERR_TAIL_BYTES`] a server wrote to stderr.
#[derive(Debug, Clone, Default)]
struct StderrTail(Arc<Mutex<VecDeque<u8>>>);

impl StderrTail {
    async fn collect(self, mut stderr: tokio::process::ChildStderr) {
        let mut chunk = [0u8; 4096];
        loop {
            match stderr.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let mut tail = self.0.lock().unwrap_or_else(PoisonError::into_inner);
                    tail.extend(chunk.iter().take(n));
                    let excess = tail.len().saturating_sub(STDERR_TAIL_BYTES);
                    tail.drain(..excess);
                }
            }
        }
    }

    fn text(&self) -> String {
        let tail = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let bytes: Vec<u8> = tail.iter().copied().collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}
