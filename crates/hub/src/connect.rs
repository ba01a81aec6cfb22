//! Connecting one server: a stdio server started the way the job starts it (a closed environment, its
//! own process group, its stderr kept in memory), or an HTTP one ([`crate::http`]); then the
//! handshake (protocol `2025-11-25`, client `pi-dispatch-hub`) and the whole tool list, over the
//! hub's own JSON-RPC client ([`crate::rpc`]). A server has answered once its tools are listed.
//!
//! What fails is said in words for the worker's log ([`ConnectFailure`]): never a value of the
//! server's environment or arguments, never the server's own error text (which could echo them).

use std::collections::VecDeque;
use std::fmt;
use std::ops::Range;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use spawn::signal::{self, End};
use tokio::io::AsyncReadExt;

use crate::http::{Failure, HttpTransport, Monitor, Refusal};
use crate::raw::{self, LineReader};
use crate::rpc::{self, Core, Peer, RpcError, Sent, Wire};
use crate::upstream::{CLIENT_NAME, CLIENT_PROTOCOL_VERSION, UpstreamEvents};

/// How much of a stdio server's stderr is kept: the last 16 KiB.
pub const STDERR_TAIL_BYTES: usize = 16 * 1024;

/// The longest line of a stdio server's output that is read (a longer one is dropped, and the
/// request it answers fails): the HTTP servers' body limit.
pub const MAX_LINE: usize = 16 * 1024 * 1024;

/// How long [`Upstream::shutdown`] lets the server go by itself (stdin closed, then `SIGTERM`) before
/// its whole process group is killed.
pub const POLITE_SHUTDOWN: Duration = Duration::from_secs(4);

/// The protocol versions the hub accepts from a server, oldest first.
const SERVER_VERSIONS: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// How many pages of tools are read at most.
const MAX_TOOL_PAGES: usize = 1000;

/// One tool a server listed, as it wrote it.
#[derive(Debug, Clone)]
pub struct Tool {
    pub name: String,
    pub definition: Box<RawValue>,
}

impl Tool {
    /// The tool's definition, read whole.
    pub fn to_value(&self) -> Value {
        serde_json::from_str(self.definition.get()).unwrap_or(Value::Null)
    }
}

/// One connected server: the client of its session, its tools as listed at connect, and (for a
/// stdio server) its process group, killed when this is dropped or shut down.
pub struct Upstream {
    pub name: String,
    /// Every tool the server listed at connect, all pages.
    pub tools: Vec<Tool>,
    /// The client side of the session, to send requests to the server.
    pub peer: Peer,
    /// From the start of the connection to the tool list.
    pub ready_after: Duration,
    /// Boxed: an `Upstream` is moved about whole, and this is most of it.
    inner: Box<Inner>,
    // Last: dropped after the session, so the group is killed once the session has let go of it.
    group: Option<ProcessGroup>,
}

struct Inner {
    /// The server's `initialize` result, read whole.
    info: Value,
    /// The same as the server wrote it, and where its protocol version is.
    info_raw: Bytes,
    version: (String, Range<usize>),
    events: UpstreamEvents,
    stderr: Option<StderrTail>,
    child: Option<tokio::process::Child>,
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

    /// The server's `initialize` result as it sent it: protocol version, capabilities,
    /// serverInfo, instructions, and whatever else it wrote.
    pub fn info(&self) -> &Value {
        &self.inner.info
    }

    /// The protocol version the server answered with.
    pub fn protocol_version(&self) -> &str {
        &self.inner.version.0
    }

    /// The `initialize` result's bytes as the server wrote them, and where its protocol version is.
    pub(crate) fn info_raw(&self) -> (&Bytes, &(String, Range<usize>)) {
        (&self.inner.info_raw, &self.inner.version)
    }

    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.peer.0
    }

    /// The client side the session was connected with: where its notifications and requests go.
    pub fn events(&self) -> &UpstreamEvents {
        &self.inner.events
    }

    /// Whether the session has ended (the server exited or closed its connection).
    pub fn is_closed(&self) -> bool {
        self.peer.is_closed()
    }

    /// Ends the session: a stdio server's stdin closed, [`POLITE_SHUTDOWN`] for it to exit
    /// (`SIGTERM` halfway), then its whole process group killed; an HTTP server's session deleted.
    pub async fn shutdown(mut self) {
        let core = self.peer.0.clone();
        match self.inner.child.take() {
            Some(mut child) => {
                core.close_stdin().await;
                let wait = POLITE_SHUTDOWN / 2;
                if tokio::time::timeout(wait, child.wait()).await.is_err() {
                    if let Some(pid) = child.id() {
                        signal::process(pid, End::Term);
                    }
                    if tokio::time::timeout(wait, child.wait()).await.is_err() {
                        let _ = child.kill().await;
                    }
                }
            }
            None => {
                if let Some(http) = core.http() {
                    let _ = tokio::time::timeout(POLITE_SHUTDOWN, http.close()).await;
                }
            }
        }
        core.close();
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

/// Sorts an error from connecting ([`ConnectError`]) or from a request ([`RpcError`]) into the
/// spec's classes. Prefer [`Monitor::classify`], which also knows a 401 seen on another request and
/// the cause behind a closed connection.
pub fn classify(error: &(dyn std::error::Error + 'static)) -> Failure {
    judge(error).unwrap_or_else(closed)
}

impl Monitor {
    /// [`classify`], knowing this server: a 401 seen on any request wins, and an error that only
    /// says the connection closed takes the cause the client recorded.
    pub fn classify(&self, error: &(dyn std::error::Error + 'static)) -> Failure {
        if self.is_unauthorized() {
            return Failure::Unauthorized;
        }
        judge(error)
            .or_else(|| self.last_refusal().map(|r| r.failure()))
            .unwrap_or_else(closed)
    }
}

fn closed() -> Failure {
    Failure::Fatal("the connection to the server closed before it answered".to_owned())
}

fn fatal(words: &str) -> Option<Failure> {
    Some(Failure::Fatal(words.to_owned()))
}

/// The failure an error names; `None` when it only says the connection closed.
fn judge(error: &(dyn std::error::Error + 'static)) -> Option<Failure> {
    if let Some(e) = error.downcast_ref::<ConnectError>() {
        if let Some(transport) = e.transport_error() {
            return judge(transport);
        }
        return match &e.failure {
            ConnectFailure::AuthorizationRequired => Some(Failure::Unauthorized),
            ConnectFailure::Exited(_) => None,
            other => Some(Failure::Fatal(other.to_string())),
        };
    }
    if let Some(e) = error.downcast_ref::<RpcError>() {
        return match e {
            RpcError::Transport(refusal) => Some(refusal.failure()),
            RpcError::Closed => None,
            RpcError::Server { code } => Some(Failure::Fatal(format!(
                "the server answered with JSON-RPC error {code}"
            ))),
            RpcError::Cancelled => Some(Failure::Retryable("the request was cancelled".to_owned())),
            RpcError::Malformed => {
                fatal("the server answered with something other than a JSON-RPC answer")
            }
        };
    }
    if let Some(r) = error.downcast_ref::<Refusal>() {
        return Some(r.failure());
    }
    if let Some(e) = error.downcast_ref::<std::io::Error>() {
        return Some(Failure::Retryable(format!(
            "a network error ({})",
            e.kind()
        )));
    }
    match error.source() {
        Some(source) => judge(source),
        None => fatal("the MCP client failed"),
    }
}

/// How long connecting waits for an HTTP server to answer the session stream's `GET`.
const STREAM_OPEN_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

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
    let core = Core::new(
        Wire::Stdio(tokio::sync::Mutex::new(Some(stdin))),
        events.clone(),
    );
    tokio::spawn(rpc::read_stdio(
        Arc::downgrade(&core),
        LineReader::new(stdout, MAX_LINE),
        MAX_LINE,
    ));
    let tail = StderrTail::default();
    let collector = stderr.map(|stderr| tokio::spawn(tail.clone().collect(stderr)));
    match handshake(name, core, events, started).await {
        Ok(mut upstream) => {
            upstream.inner.stderr = Some(tail);
            upstream.inner.child = Some(child);
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

/// Connects a server over streamable HTTP ([`crate::http::transport`]).
pub async fn connect_transport(
    name: &str,
    transport: HttpTransport,
    events: UpstreamEvents,
) -> Result<Upstream, ConnectError> {
    let core = Core::new(Wire::Http(Box::new(transport)), events.clone());
    handshake(name, core, events, Instant::now()).await
}

/// Where the handshake was when it failed.
#[derive(Clone, Copy)]
enum Stage {
    Initialize,
    Tools,
}

/// Asks the server to `initialize` and reads its answer: its result as read and as it wrote it,
/// and the protocol version it speaks, which must be one the job does.
async fn initialize(
    name: &str,
    core: &Arc<Core>,
    events: &UpstreamEvents,
) -> Result<(Value, Bytes, (String, std::ops::Range<usize>)), ConnectError> {
    let id = core.next_id();
    let initialize = json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": "initialize",
        "params": {
            "protocolVersion": CLIENT_PROTOCOL_VERSION,
            "capabilities": events.capabilities(),
            "clientInfo": {"name": CLIENT_NAME, "version": env!("CARGO_PKG_VERSION")},
        },
    });
    let failed = |e: RpcError| failed(name, Stage::Initialize, e);
    let answer = core
        .call_as(
            Sent::Initialize(id),
            id,
            Bytes::from(initialize.to_string()),
            None,
        )
        .await
        .map_err(failed)?;
    let info = rpc::result_of(&answer).map_err(failed)?;
    let not_a_result = || {
        ConnectError::new(
            name,
            ConnectFailure::Handshake(
                "the server answered initialize with something other than its result".to_owned(),
            ),
        )
    };
    let result = answer.result().ok_or_else(not_a_result)?;
    let version = raw::string_member(result, "protocolVersion").ok_or_else(not_a_result)?;
    if !info.get("capabilities").is_some_and(Value::is_object) {
        return Err(not_a_result());
    }
    if !SERVER_VERSIONS.contains(&version.0.as_str()) {
        return Err(ConnectError::new(
            name,
            ConnectFailure::Handshake("the server speaks no protocol version the job does".into()),
        ));
    }
    let info_raw = answer.bytes().slice_ref(result);
    if let Some(http) = core.http() {
        http.set_protocol_version(&version.0);
    }
    Ok((info, info_raw, version))
}

/// The MCP handshake with a server its transport reached: `initialize`, then `initialized`, the
/// session's stream opened (over HTTP), and the server's tools listed.
async fn handshake(
    name: &str,
    core: Arc<Core>,
    events: UpstreamEvents,
    started: Instant,
) -> Result<Upstream, ConnectError> {
    let failed = |e: RpcError| failed(name, Stage::Initialize, e);
    let (info, info_raw, version) = initialize(name, &core, &events).await?;
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    core.send(Bytes::from(initialized.to_string()))
        .await
        .map_err(failed)?;
    if let Some(http) = core.http() {
        let weak: std::sync::Weak<Core> = Arc::downgrade(&core);
        // The session's stream is opened before the tool list is asked for (a server may answer
        // a later request there); a server slow to answer its GET holds the connect up to
        // `STREAM_OPEN_WAIT`, and its stream opens whenever it answers.
        let opened = http.listen_opened(weak);
        let _ = tokio::time::timeout(STREAM_OPEN_WAIT, opened).await;
    }
    // A server that offers no tools has none to list.
    let offers_tools = info["capabilities"]
        .get("tools")
        .is_some_and(|t| !t.is_null());
    let tools = if offers_tools {
        list_tools(&core).await.map_err(|e| failed_tools(name, e))?
    } else {
        Vec::new()
    };
    Ok(Upstream {
        name: name.to_owned(),
        tools,
        peer: Peer(core),
        ready_after: started.elapsed(),
        inner: Box::new(Inner {
            info,
            info_raw,
            version,
            events,
            stderr: None,
            child: None,
        }),
        group: None,
    })
}

/// Why listing the tools failed: the request's error, or an answer that is not a tool list.
enum ToolsError {
    Rpc(RpcError),
    NotAList,
}

/// Every page of the server's tools.
async fn list_tools(core: &Arc<Core>) -> Result<Vec<Tool>, ToolsError> {
    #[derive(Deserialize)]
    struct Page {
        tools: Vec<Box<RawValue>>,
        #[serde(default, rename = "nextCursor")]
        next_cursor: Option<String>,
    }
    #[derive(Deserialize)]
    struct Named {
        name: String,
    }
    let mut tools = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..MAX_TOOL_PAGES {
        let id = core.next_id();
        let params = match &cursor {
            Some(cursor) => json!({"cursor": cursor}),
            None => json!({}),
        };
        let request = json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": params});
        let answer = core
            .call(id, Bytes::from(request.to_string()), None)
            .await
            .map_err(ToolsError::Rpc)?;
        if let Some(error) = answer.error() {
            let code = raw::error_code(error).unwrap_or(0);
            return Err(ToolsError::Rpc(RpcError::Server { code }));
        }
        let page: Page = answer
            .result()
            .and_then(|r| serde_json::from_slice(r).ok())
            .ok_or(ToolsError::NotAList)?;
        for definition in page.tools {
            let named: Named =
                serde_json::from_str(definition.get()).map_err(|_| ToolsError::NotAList)?;
            tools.push(Tool {
                name: named.name,
                definition,
            });
        }
        match page.next_cursor {
            Some(next) if !next.is_empty() && cursor.as_ref() != Some(&next) => {
                cursor = Some(next);
            }
            _ => return Ok(tools),
        }
    }
    Ok(tools)
}

fn failed(name: &str, stage: Stage, e: RpcError) -> ConnectError {
    let (exited, words) = match stage {
        Stage::Initialize => ("answered initialize", "initialize"),
        Stage::Tools => ("listed its tools", "tools/list"),
    };
    let (failure, transport) = match e {
        RpcError::Closed => (ConnectFailure::Exited(exited), None),
        RpcError::Transport(Refusal::Unauthorized) => (
            ConnectFailure::AuthorizationRequired,
            Some(Refusal::Unauthorized),
        ),
        RpcError::Transport(refusal) => {
            let failure = "the transport failed".to_owned();
            let failure = match stage {
                Stage::Initialize => ConnectFailure::Handshake(failure),
                Stage::Tools => ConnectFailure::ToolsList(failure),
            };
            (failure, Some(refusal))
        }
        RpcError::Server { code } => {
            let failure = match stage {
                Stage::Initialize => ConnectFailure::Handshake(format!(
                    "the server answered {words} with error {code}"
                )),
                Stage::Tools => {
                    ConnectFailure::ToolsList(format!("the server answered with error {code}"))
                }
            };
            (failure, None)
        }
        RpcError::Malformed => {
            let failure = match stage {
                Stage::Initialize => ConnectFailure::Handshake(
                    "the server answered initialize with something other than its result"
                        .to_owned(),
                ),
                Stage::Tools => ConnectFailure::ToolsList(
                    "the server answered with something other than a tool list".to_owned(),
                ),
            };
            (failure, None)
        }
        RpcError::Cancelled => (ConnectFailure::Handshake("cancelled".to_owned()), None),
    };
    let mut error = ConnectError::new(name, failure);
    error.transport = transport.map(|r| Box::new(r) as Box<dyn std::error::Error + Send + Sync>);
    error
}

fn failed_tools(name: &str, e: ToolsError) -> ConnectError {
    match e {
        ToolsError::Rpc(e) => failed(name, Stage::Tools, e),
        ToolsError::NotAList => failed(name, Stage::Tools, RpcError::Malformed),
    }
}

/// A process group, killed (`SIGKILL` to every member) when dropped; [`ProcessGroup::end`] also
/// waits until it is gone.
#[derive(Debug)]
struct ProcessGroup(i32);

/// Kills the group `pgid`; false when it had no process left.
pub(crate) fn kill_group(pgid: i32) -> bool {
    u32::try_from(pgid).is_ok_and(|pgid| signal::group(pgid, End::Kill))
}

/// How long ending a group waits for its killed members to be gone.
const GROUP_GONE_WAIT: Duration = Duration::from_millis(500);

impl ProcessGroup {
    /// Kills the group and waits, briefly and boundedly, until no member is alive, so that the
    /// caller can say it is gone. The wait yields to the runtime; it never blocks a worker thread.
    async fn end(self) {
        let pgid = self.0;
        std::mem::forget(self);
        // ESRCH (nobody left) is the usual answer once the server has exited by itself.
        if !kill_group(pgid) {
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
        if !kill_group(self.0) {
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
