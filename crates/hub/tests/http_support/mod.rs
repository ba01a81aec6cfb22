//! Shared by the `http_*` tests: a hand-written HTTP/1.1 server on 127.0.0.1 whose behaviour is
//! chosen by the last segment of the request's path, and the job's own way to a resolved server
//! (its mcp.json entry, resolved from an environment).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hub::connect::{ConnectError, Upstream};
use hub::http::HttpTransport;
use hub::job_file;
use hub::relay::UpstreamEvents;
use hub::resolve::{Resolved, Secret, resolve};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// What the huge responses claim to be: 1 GiB, written lazily from one 64 KiB buffer.
pub const GIB: u64 = 1024 * 1024 * 1024;

/// One request as the server read it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    /// The request target as sent: a path, or an absolute URL when it came through a proxy.
    pub target: String,
    /// The last segment of the path: the behaviour asked for.
    pub kind: String,
    /// Header names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The JSON-RPC method of a POST, when it has one.
    pub fn rpc_method(&self) -> Option<String> {
        let v: Value = serde_json::from_str(&self.body).ok()?;
        v.get("method")?.as_str().map(str::to_owned)
    }
}

#[derive(Default)]
pub struct State {
    pub seen: Mutex<Vec<Seen>>,
    /// Bytes of huge bodies the server managed to write before the client went away.
    pub huge_written: AtomicU64,
    /// Requests to `flaky`, the first of which is answered 500.
    pub flaky_hits: AtomicUsize,
    /// Connections accepted.
    pub connections: AtomicUsize,
    /// `initialize` requests answered: each starts session `session-<n>`.
    pub sessions: AtomicUsize,
    /// `answer-elsewhere`: the answer to the last `tools/call`, which goes out on the session's
    /// own event stream rather than on the call's.
    pub elsewhere: Mutex<Option<String>>,
}

pub struct FaultServer {
    pub addr: SocketAddr,
    pub state: Arc<State>,
    task: JoinHandle<()>,
}

impl Drop for FaultServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FaultServer {
    pub async fn start() -> FaultServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State::default());
        let shared = state.clone();
        let task = tokio::spawn(async move {
            let mut connections = Vec::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    break;
                };
                shared.connections.fetch_add(1, Ordering::SeqCst);
                let state = shared.clone();
                connections.push(tokio::spawn(async move {
                    let _ = serve_one(stream, addr, state).await;
                }));
                connections.retain(|c: &JoinHandle<()>| !c.is_finished());
            }
        });
        FaultServer { addr, state, task }
    }

    /// `http://127.0.0.1:PORT`
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    pub fn huge_written(&self) -> u64 {
        self.state.huge_written.load(Ordering::SeqCst)
    }
}

/// Reads one request, answers it, and closes the connection.
async fn serve_one(stream: TcpStream, addr: SocketAddr, state: Arc<State>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).await?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let target = parts.next().unwrap_or_default().to_owned();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).await? == 0 {
            return Ok(());
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((n, v)) = h.split_once(':') {
            headers.push((n.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
    }
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).await?;
    let path = match target.split_once("://") {
        // Absolute form (through a proxy): drop scheme and authority.
        Some((_, rest)) => rest.find('/').map_or("/", |i| &rest[i..]).to_owned(),
        None => target.clone(),
    };
    let path = path.split('?').next().unwrap_or_default();
    let kind = path.rsplit('/').next().unwrap_or_default().to_owned();
    let seen = Seen {
        method,
        target,
        kind: kind.clone(),
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    };
    state.seen.lock().unwrap().push(seen.clone());
    let mut stream = reader.into_inner();

    if let Some(code) = kind.strip_prefix("status-") {
        let code: u16 = code.parse().unwrap_or(500);
        return respond(&mut stream, code, &[], "text/plain", b"no").await;
    }
    match kind.as_str() {
        "redirect" => {
            let location = format!("http://{addr}/x/followed");
            respond(
                &mut stream,
                302,
                &[("Location", &location)],
                "text/plain",
                b"",
            )
            .await
        }
        "unauthorized" => {
            respond(
                &mut stream,
                401,
                &[("WWW-Authenticate", "Bearer realm=\"mcp\"")],
                "application/json",
                br#"{"error":"sign in"}"#,
            )
            .await
        }
        "not-json" => respond(&mut stream, 200, &[], "text/html", b"<html></html>").await,
        "huge-json" => huge(&mut stream, &state, "application/json", None, b"", b' ').await,
        "huge-declared" => {
            huge(
                &mut stream,
                &state,
                "application/json",
                Some(GIB),
                b"",
                b' ',
            )
            .await
        }
        // One event that never ends.
        "huge-sse" => {
            huge(
                &mut stream,
                &state,
                "text/event-stream",
                None,
                b"data: ",
                b'a',
            )
            .await
        }
        // Many small events that are not the answer, each valid.
        "huge-sse-events" => huge_events(&mut stream, &state).await,
        "hang" => {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(())
        }
        "flaky" if state.flaky_hits.fetch_add(1, Ordering::SeqCst) == 0 => {
            respond(&mut stream, 500, &[], "text/plain", b"starting").await
        }
        "flaky" | "mcp" | "mcp-sse" | "revoke" | "followed" | "expire" | "answer-elsewhere" => {
            mcp(&mut stream, &seen, &kind, &state).await
        }
        _ => respond(&mut stream, 404, &[], "text/plain", b"").await,
    }
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        202 => "Accepted",
        302 => "Found",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

async fn respond(
    stream: &mut TcpStream,
    code: u16,
    headers: &[(&str, &str)],
    content_type: &str,
    body: &[u8],
) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {code} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n",
        reason(code),
        body.len()
    );
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    stream.flush().await?;
    let _ = stream.shutdown().await;
    Ok(())
}

/// A 200 whose body is 1 GiB, written from one 64 KiB buffer until the client goes away.
async fn huge(
    stream: &mut TcpStream,
    state: &State,
    content_type: &str,
    declared: Option<u64>,
    prefix: &[u8],
    fill: u8,
) -> std::io::Result<()> {
    let length = declared.map_or(String::new(), |n| format!("Content-Length: {n}\r\n"));
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\n{length}Connection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(prefix).await?;
    let chunk = vec![fill; 64 * 1024];
    let mut written = prefix.len() as u64;
    while written < GIB {
        stream.write_all(&chunk).await?;
        written += chunk.len() as u64;
        state.huge_written.store(written, Ordering::SeqCst);
    }
    Ok(())
}

async fn huge_events(stream: &mut TcpStream, state: &State) -> std::io::Result<()> {
    let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n";
    stream.write_all(head.as_bytes()).await?;
    let event = b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"info\",\"data\":\"x\"}}\n\n";
    let chunk: Vec<u8> = event
        .iter()
        .copied()
        .cycle()
        .take(event.len() * 512)
        .collect();
    let mut written = 0u64;
    while written < GIB {
        stream.write_all(&chunk).await?;
        written += chunk.len() as u64;
        state.huge_written.store(written, Ordering::SeqCst);
    }
    Ok(())
}

/// A minimal MCP server, by hand: `initialize`, `tools/list` and `tools/call` (an echo); a GET has
/// no event stream (405). `revoke` answers `tools/call` with 401; `mcp-sse` answers as event streams;
/// `expire` has forgotten its first session by the first `tools/call` (404).
async fn mcp(
    stream: &mut TcpStream,
    seen: &Seen,
    kind: &str,
    state: &State,
) -> std::io::Result<()> {
    match seen.method.as_str() {
        "GET" if kind == "answer-elsewhere" => return session_stream(stream, seen, state).await,
        "GET" => return respond(stream, 405, &[], "text/plain", b"").await,
        "DELETE" => return respond(stream, 200, &[], "text/plain", b"").await,
        _ => {}
    }
    let request: Value = serde_json::from_str(&seen.body).unwrap_or(Value::Null);
    let Some(id) = request.get("id").cloned() else {
        return respond(stream, 202, &[], "text/plain", b"").await;
    };
    let method = request
        .get("method")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let session = if method == "initialize" {
        format!(
            "session-{}",
            state.sessions.fetch_add(1, Ordering::SeqCst) + 1
        )
    } else {
        seen.header("mcp-session-id").unwrap_or_default().to_owned()
    };
    if kind == "expire" && method == "tools/call" && session == "session-1" {
        return respond(stream, 404, &[], "text/plain", b"").await;
    }
    let result = match method {
        "initialize" => json!({
            "protocolVersion": "2025-11-25",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "fault", "version": "1.0.0"}
        }),
        "tools/call" if kind == "revoke" => {
            return respond(stream, 401, &[], "text/plain", b"").await;
        }
        "tools/list" => json!({"tools": [{
            "name": "echo",
            "description": "Echoes its message",
            "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}}
        }]}),
        "tools/call" => {
            let text = request
                .pointer("/params/arguments/message")
                .and_then(Value::as_str)
                .unwrap_or_default();
            json!({"content": [{"type": "text", "text": format!("Echo: {text}")}]})
        }
        _ => {
            let error =
                json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "no"}});
            return respond(
                stream,
                200,
                &[],
                "application/json",
                error.to_string().as_bytes(),
            )
            .await;
        }
    };
    let answer = json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string();
    let session = [("Mcp-Session-Id", session.as_str())];
    if kind == "answer-elsewhere" && method == "tools/call" {
        // The call's own stream ends with no answer; the session's stream carries it.
        *state.elsewhere.lock().unwrap() = Some(answer);
        let body = "id: p1\nretry: 100\ndata: \n\n";
        return respond(stream, 200, &session, "text/event-stream", body.as_bytes()).await;
    }
    if kind == "mcp-sse" {
        let body = format!("event: message\nid: 1\ndata: {answer}\n\n");
        respond(stream, 200, &session, "text/event-stream", body.as_bytes()).await
    } else {
        respond(stream, 200, &session, "application/json", answer.as_bytes()).await
    }
}

/// `answer-elsewhere`'s session stream: the first one (no `Last-Event-ID`) carries the answer
/// to the call once there is one; a resumed one carries nothing. Each stays open until the client
/// goes.
async fn session_stream(stream: &mut TcpStream, seen: &Seen, state: &State) -> std::io::Result<()> {
    stream
        .write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n",
        )
        .await?;
    if seen.header("last-event-id").is_some() {
        stream.write_all(b"id: g2\nretry: 100\ndata: \n\n").await?;
    } else {
        let until = tokio::time::Instant::now() + std::time::Duration::from_secs(15);
        let answer = loop {
            if let Some(answer) = state.elsewhere.lock().unwrap().take() {
                break answer;
            }
            if tokio::time::Instant::now() > until {
                return Ok(());
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        };
        stream
            .write_all(format!("id: g1\ndata: {answer}\n\n").as_bytes())
            .await?;
    }
    stream.flush().await?;
    tokio::time::sleep(std::time::Duration::from_secs(30)).await;
    Ok(())
}

/// Connects `transport` as the runner connects an HTTP server: the handshake, then the tool list.
pub async fn connect(transport: HttpTransport) -> Result<Upstream, ConnectError> {
    hub::connect::connect_transport("upstream", transport, UpstreamEvents::new()).await
}

/// The server `url` with `headers` (name, value template) as the job resolves it: through its
/// mcp.json entry and the job's environment `env`.
pub fn resolved(
    url: &str,
    headers: &[(&str, &str)],
    env: &[(&str, &str)],
) -> (Secret, Vec<(String, Secret)>) {
    let headers: serde_json::Map<String, Value> = headers
        .iter()
        .map(|(n, v)| (n.to_string(), Value::from(*v)))
        .collect();
    let file = json!({
        "mcpServers": {"upstream": {"url": url, "headers": headers, "description": "test server"}},
        "codemodeModels": false
    });
    let job = job_file::parse(file.to_string().as_bytes())
        .unwrap_or_else(|stop| panic!("the test's mcp.json is refused: {}", stop.cause));
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let lookup = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    match resolve(&job.servers[0], &lookup) {
        Ok(Resolved::Http { url, headers }) => (url, headers),
        Ok(Resolved::Stdio { .. }) => panic!("an http entry resolved as stdio"),
        Err(stop) => panic!("the test server does not resolve: {}", stop.cause),
    }
}

/// The test process's resident memory now, and at its peak, in bytes (`/proc/self/status`).
pub fn memory() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |name: &str| -> u64 {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} is not in /proc/self/status"));
        let kb: u64 = line
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap();
        kb * 1024
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The error `attempt` ends with, within `bound`; panics if it succeeds or takes longer.
pub async fn error_of<T, E>(
    what: &str,
    bound: Duration,
    attempt: impl std::future::Future<Output = Result<T, E>>,
) -> E {
    match tokio::time::timeout(bound, attempt).await {
        Err(_) => panic!("{what}: no answer within {bound:?}"),
        Ok(Ok(_)) => panic!("{what}: succeeded"),
        Ok(Err(error)) => error,
    }
}
