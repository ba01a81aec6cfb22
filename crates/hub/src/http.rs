//! A streamable-HTTP server of the job, reached as the spec has it (mcp.md, "In the job", HTTP
//! servers): every request to the server's own origin, with its own headers and nothing else of the
//! job's; through the egress proxy when one is given, never one found in the environment; a redirect
//! refused rather than followed; an HTTP 401 ending the job; a body over 16 MiB refused as it
//! streams, never held whole. [`Monitor::classify`] sorts what went wrong into the spec's classes:
//! retried (408, 429, a 5xx other than 501, the network) or not, and [`Monitor::unauthorized`]
//! wakes the runner on a 401 that comes after connecting.
//!
//! Nothing here prints a header value, the URL's path or query, or what the server sent: the URL
//! may hold a key, so only its `scheme://host:port` ([`Monitor::origin`]) is ever shown.

use std::error::Error as StdError;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use bytes::Bytes;
use config::mcp::RESERVED_HEADERS;
use futures::stream::{BoxStream, Stream, StreamExt};
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, StatusCode, Url};
use sse_stream::{Error as SseError, Sse, SseStream};
use tokio::sync::{oneshot, watch};

use protocol::reason::Reason;

use crate::job_file::Stop;
use crate::raw::Message;
use crate::resolve::Secret;

/// The largest response body taken from a server: 16 MiB.
pub const MAX_BODY: u64 = 16 * 1024 * 1024;

/// How many idle connections to one server are kept for later requests.
const IDLE_CONNECTIONS: usize = 8;

/// The protocol version the job announces in `initialize`.
pub const PROTOCOL_VERSION: &str = crate::upstream::CLIENT_PROTOCOL_VERSION;

const SESSION_HEADER: &str = "mcp-session-id";
const VERSION_HEADER: &str = "mcp-protocol-version";
const LAST_EVENT_ID_HEADER: &str = "last-event-id";
const EVENT_STREAM: &str = "text/event-stream";
const JSON: &str = "application/json";
const ACCEPT_POST: &str = "application/json, text/event-stream";

/// How the job reaches its HTTP servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpPolicy {
    /// The egress proxy every request goes through (`http://host:port`), when the job has one.
    /// `None` is a direct connection: the environment's proxy variables are never read here.
    pub proxy: Option<String>,
    /// The largest response body taken, in bytes ([`MAX_BODY`]).
    pub max_body: u64,
}

impl Default for HttpPolicy {
    fn default() -> Self {
        HttpPolicy {
            proxy: None,
            max_body: MAX_BODY,
        }
    }
}

impl HttpPolicy {
    /// The policy for a server at `url`: the proxy the job's environment names for its scheme
    /// (`HTTPS_PROXY` or `https_proxy` for https, `HTTP_PROXY` or `http_proxy` for http). `NO_PROXY`
    /// is not read: with the egress proxy on, every request goes through it.
    pub fn for_url(url: &Secret, env: &dyn Fn(&str) -> Option<String>) -> HttpPolicy {
        let names: [&str; 2] = if url.expose().starts_with("https:") {
            ["HTTPS_PROXY", "https_proxy"]
        } else {
            ["HTTP_PROXY", "http_proxy"]
        };
        HttpPolicy {
            proxy: names
                .into_iter()
                .find_map(|n| env(n).filter(|v| !v.trim().is_empty())),
            max_body: MAX_BODY,
        }
    }
}

/// Why a transport could not be built. Names a header, never its value; never the URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    #[error("the server's URL cannot be read as an absolute http or https URL")]
    Url,
    #[error("the server's URL holds a user name or password")]
    UserInfo,
    #[error("header {0} is not a valid HTTP header name")]
    HeaderName(String),
    #[error("the value for header {0} cannot be sent in an HTTP header")]
    HeaderValue(String),
    #[error("header {0} is one the MCP transport sets itself")]
    ReservedHeader(String),
    #[error("the egress proxy setting cannot be read as a proxy URL")]
    Proxy,
    #[error("the HTTP client could not be built")]
    Client,
}

/// What a failure means for the job (the spec's table): `Retryable` is a server that has not
/// answered yet (the network, 408, 429, a 5xx other than 501) and is retried until the wait runs
/// out, then `mcp-unreachable`; `Fatal` and `Unauthorized` are `mcp-unavailable` at once. Each
/// message is for the worker's log: status codes and words, never a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    Retryable(String),
    Fatal(String),
    /// An HTTP 401: the job ends, whenever it comes.
    Unauthorized,
}

impl Failure {
    /// The words for the worker's log.
    pub fn message(&self) -> &str {
        match self {
            Failure::Retryable(m) | Failure::Fatal(m) => m,
            Failure::Unauthorized => UNAUTHORIZED,
        }
    }

    pub fn is_retryable(&self) -> bool {
        matches!(self, Failure::Retryable(_))
    }

    /// The runner's reason once this failure ends the job: a retryable one ends it only when the
    /// wait runs out (`mcp-unreachable`), the others at once (`mcp-unavailable`).
    pub fn reason(&self) -> Reason {
        match self {
            Failure::Retryable(_) => Reason::McpUnreachable,
            Failure::Fatal(_) | Failure::Unauthorized => Reason::McpUnavailable,
        }
    }

    /// The job's stop for `server`, whose origin is `origin` ([`Monitor::origin`]).
    pub fn stop(&self, server: &str, origin: &str) -> Stop {
        Stop::new(
            self.reason(),
            Some(server),
            format!("{origin}: {}", self.message()),
        )
    }
}

const UNAUTHORIZED: &str = "HTTP 401: the server asks for a sign-in, and a job never signs in";

/// What the HTTP client refused or could not do: the error the transport carries
/// (`RpcError::Transport`). Its text names status codes and rules only.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{UNAUTHORIZED}")]
    Unauthorized,
    #[error("{}: a redirect, refused rather than followed", status_words(*.0))]
    Redirect(u16),
    #[error("{}", status_words(*.0))]
    Status(u16),
    #[error("a response body over {0} bytes, refused")]
    BodyTooLarge(u64),
    #[error("a request for another origin than the server's, refused")]
    OtherOrigin,
    #[error("a response that is neither JSON nor an event stream")]
    ContentType,
    #[error("a JSON response that is not a JSON-RPC message")]
    NotJsonRpc,
    #[error("a session or event id from the server that cannot be sent back in a header")]
    Unsendable,
    #[error("{words}")]
    Network { words: String, retryable: bool },
}

impl Refusal {
    /// The class of this refusal.
    pub fn failure(&self) -> Failure {
        match self {
            Refusal::Unauthorized => Failure::Unauthorized,
            Refusal::Status(code) if status_is_retryable(*code) => {
                Failure::Retryable(self.to_string())
            }
            Refusal::Network {
                retryable: true, ..
            } => Failure::Retryable(self.to_string()),
            _ => Failure::Fatal(self.to_string()),
        }
    }

    /// A request that got no response: words from the error's kind, never its text (reqwest's
    /// text holds the URL).
    fn network(error: &reqwest::Error) -> Refusal {
        let io = io_kind(error);
        let (what, retryable) = if error.is_timeout() {
            ("the request timed out", true)
        } else if io == Some(std::io::ErrorKind::InvalidData) {
            // tokio-rustls reports a failed TLS handshake (a certificate refused) this way.
            ("the TLS handshake failed", false)
        } else if error.is_connect() {
            ("could not connect", true)
        } else if error.is_body() || error.is_decode() {
            ("the connection broke during the response", true)
        } else if error.is_builder() {
            ("the request could not be built", false)
        } else {
            ("the request failed", true)
        };
        let words = match io {
            Some(kind) => format!("{what} ({kind})"),
            None => what.to_owned(),
        };
        Refusal::Network { words, retryable }
    }
}

/// 408, 429 and a 5xx other than 501 are a server not answering yet; any other error is an answer.
fn status_is_retryable(code: u16) -> bool {
    code == 408 || code == 429 || ((500..600).contains(&code) && code != 501)
}

fn status_words(code: u16) -> String {
    match StatusCode::from_u16(code)
        .ok()
        .and_then(|s| s.canonical_reason())
    {
        Some(reason) => format!("HTTP {code} {reason}"),
        None => format!("HTTP {code}"),
    }
}

fn io_kind(error: &(dyn StdError + 'static)) -> Option<std::io::ErrorKind> {
    let mut current: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(e) = current {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        current = e.source();
    }
    None
}

/// What the runner watches on a server after connecting: a 401 on any request (which ends the job,
/// mid-job too) and the last refusal the client made (which explains an error that only says the
/// connection closed). Clones share one state.
#[derive(Debug, Clone)]
pub struct Monitor {
    inner: Arc<MonitorState>,
}

#[derive(Debug)]
struct MonitorState {
    origin: String,
    unauthorized: watch::Sender<bool>,
    last: Mutex<Option<Refusal>>,
}

impl Monitor {
    fn new(origin: String) -> Monitor {
        Monitor {
            inner: Arc::new(MonitorState {
                origin,
                unauthorized: watch::Sender::new(false),
                last: Mutex::new(None),
            }),
        }
    }

    /// The server's `scheme://host:port`: all of its URL the log may show.
    pub fn origin(&self) -> &str {
        &self.inner.origin
    }

    /// Whether the server has answered any request with HTTP 401.
    pub fn is_unauthorized(&self) -> bool {
        *self.inner.unauthorized.borrow()
    }

    /// Resolves once the server answers any request with HTTP 401 (at once if it already has):
    /// the runner selects on this to end the job.
    pub async fn unauthorized(&self) {
        let mut rx = self.inner.unauthorized.subscribe();
        // The sender lives in `self`, so this only returns once the flag is set.
        let _ = rx.wait_for(|set| *set).await;
    }

    /// The last refusal the client made, if any.
    pub fn last_refusal(&self) -> Option<Refusal> {
        self.inner
            .last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn record(&self, refusal: &Refusal) {
        if *refusal == Refusal::Unauthorized {
            self.inner.unauthorized.send_replace(true);
        }
        *self
            .inner
            .last
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(refusal.clone());
    }
}

/// Where the messages a server sends over HTTP go: the connection's JSON-RPC client, which routes
/// each one.
pub(crate) trait Inbound: Send + Sync {
    /// Routes one message; returns the id of the request it answered, if it answered one.
    fn route(&self, message: Message) -> Option<u64>;
}

/// Why a message posted got no answer from the HTTP side: what the client refused, or a connection
/// that ended first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HttpFault {
    Refused(Refusal),
    Closed,
}

impl From<Refusal> for HttpFault {
    fn from(refusal: Refusal) -> HttpFault {
        HttpFault::Refused(refusal)
    }
}

/// A connection to one HTTP server, not yet started.
pub struct HttpServer {
    /// What [`crate::connect::connect_transport`] connects.
    pub transport: HttpTransport,
    pub monitor: Monitor,
}

/// The transport for the server at `url` with `headers`, held to the spec's rules. Nothing is sent
/// until it is connected.
pub fn transport(
    url: &Secret,
    headers: &[(String, Secret)],
    policy: &HttpPolicy,
) -> Result<HttpServer, HttpError> {
    let client = GuardedClient::new(url, headers, policy)?;
    let monitor = client.monitor.clone();
    Ok(HttpServer {
        transport: HttpTransport {
            client,
            session: Arc::new(Mutex::new(Session::default())),
            renewing: tokio::sync::Mutex::new(()),
            listening: Mutex::new(None),
        },
        monitor,
    })
}

/// A broken event stream is reopened at most three times in a row, 0.5, 1 and 2 s apart (or after
/// the server's own `retry`, when it is longer; after a stream that ended by itself, the server's
/// `retry` alone).
fn reconnect_after(failures: usize) -> Option<Duration> {
    (failures < 3).then(|| Duration::from_millis(500u64 << failures))
}

/// One HTTP server's session: its id and protocol version (sent on every request once known), and
/// the server's own event stream, read from a task of its own.
pub struct HttpTransport {
    client: GuardedClient,
    /// Shared with the task reading the session's own stream.
    session: Arc<Mutex<Session>>,
    /// One new session at a time.
    renewing: tokio::sync::Mutex<()>,
    /// The task that reads the session's own event stream (`GET`).
    listening: Mutex<Option<tokio::task::AbortHandle>>,
}

impl std::fmt::Debug for HttpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpTransport")
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

impl Drop for HttpTransport {
    fn drop(&mut self) {
        if let Some(task) = lock(&self.listening).take() {
            task.abort();
        }
    }
}

/// What identifies the session on each request.
#[derive(Debug, Clone, Default)]
struct Session {
    id: Option<HeaderValue>,
    version: Option<HeaderValue>,
    /// The `initialize` request, sent again when the server has ended the session.
    initialize: Option<Bytes>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An event stream as it is read.
type Events = BoxStream<'static, Result<Sse, SseError>>;

impl HttpTransport {
    /// The monitor of this server.
    pub fn monitor(&self) -> &Monitor {
        &self.client.monitor
    }

    fn session(&self) -> Session {
        lock(&self.session).clone()
    }

    /// The protocol version the server answered `initialize` with: every later request says it.
    pub(crate) fn set_protocol_version(&self, version: &str) {
        lock(&self.session).version = HeaderValue::from_str(version).ok();
    }

    /// Posts one message. A request's answer (`awaiting` is its id) is routed to `inbound` when
    /// it comes on the response (as JSON, or in an event stream, resumed with `Last-Event-ID` if it
    /// breaks first); so is anything else the response carries. The answer to `initialize` opens
    /// the session. A session the server has ended (404) is started anew once, as the protocol
    /// says, and the message posted again.
    pub(crate) async fn post(
        &self,
        inbound: &Arc<dyn Inbound>,
        body: Bytes,
        awaiting: Option<u64>,
        initialize: bool,
    ) -> Result<(), HttpFault> {
        if initialize {
            lock(&self.session).initialize = Some(body.clone());
        }
        let mut renewed = false;
        loop {
            let session = if initialize {
                Session::default()
            } else {
                self.session()
            };
            let response = self
                .client
                .send(self.client.post(body.clone(), &session))
                .await?;
            let status = response.status();
            if status == StatusCode::NOT_FOUND && session.id.is_some() && !renewed {
                drop(response);
                self.renew(inbound, session.id.as_ref()).await?;
                renewed = true;
                continue;
            }
            self.client.check_status(status)?;
            if initialize {
                let id = self.client.session_id(&response)?;
                lock(&self.session).id = id;
            }
            return self.read_response(inbound, response, awaiting).await;
        }
    }

    async fn read_response(
        &self,
        inbound: &Arc<dyn Inbound>,
        response: reqwest::Response,
        awaiting: Option<u64>,
    ) -> Result<(), HttpFault> {
        let status = response.status();
        if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT)
            || (awaiting.is_none() && response.content_length() == Some(0))
        {
            return Ok(());
        }
        match media_type(&response).as_deref() {
            Some(EVENT_STREAM) => {
                let events = self.client.event_stream(response);
                self.read_events(inbound, events, awaiting).await
            }
            Some(JSON) => {
                let body = self.client.json_body(response).await?;
                let message = Message::parse(Bytes::from(body));
                let answered = message.and_then(|m| inbound.route(m));
                if awaiting.is_some() && answered != awaiting {
                    return Err(self.client.refuse(Refusal::NotJsonRpc).into());
                }
                Ok(())
            }
            _ if awaiting.is_none() => Ok(()),
            _ => Err(self.client.refuse(Refusal::ContentType).into()),
        }
    }

    /// Routes each message of a response's event stream until the answer `awaiting` is in; a
    /// stream that ends or breaks first is resumed from its last event id.
    async fn read_events(
        &self,
        inbound: &Arc<dyn Inbound>,
        mut events: Events,
        awaiting: Option<u64>,
    ) -> Result<(), HttpFault> {
        let mut last_id: Option<String> = None;
        let mut server_retry: Option<Duration> = None;
        let mut failures = 0;
        loop {
            let mut broke = false;
            while let Some(item) = events.next().await {
                let sse = match item {
                    Ok(sse) => sse,
                    Err(e) => {
                        if let Some(refusal) = refusal_of(&e)
                            && !refusal.failure().is_retryable()
                        {
                            return Err(refusal.into());
                        }
                        broke = true;
                        break;
                    }
                };
                note(&sse, &mut last_id, &mut server_retry);
                if let Some(data) = message_data(sse) {
                    let message = Message::parse(Bytes::from(data));
                    let answered = message.and_then(|m| inbound.route(m));
                    if awaiting.is_some() && answered == awaiting {
                        return Ok(());
                    }
                }
            }
            if awaiting.is_none() {
                return Ok(());
            }
            // The answer has not come: resume the stream where it stopped, if it said where.
            let Some(resume_from) = last_id.clone() else {
                return Err(HttpFault::Closed);
            };
            loop {
                let delay = match (broke || failures > 0, server_retry) {
                    (false, Some(retry)) => Some(retry),
                    (_, retry) => reconnect_after(failures).map(|d| retry.map_or(d, |r| r.max(d))),
                };
                let Some(delay) = delay else {
                    return Err(HttpFault::Closed);
                };
                tokio::time::sleep(delay).await;
                match self
                    .client
                    .open_stream(&self.session(), Some(&resume_from))
                    .await
                {
                    Ok(Some(resumed)) => {
                        events = resumed;
                        break;
                    }
                    Ok(None) => return Err(HttpFault::Closed),
                    Err(refusal) if !refusal.failure().is_retryable() => {
                        return Err(refusal.into());
                    }
                    Err(_) => failures += 1,
                }
            }
        }
    }

    /// Starts a new session after the server ended the one in use (`seen`), unless another request
    /// already did.
    async fn renew(
        &self,
        inbound: &Arc<dyn Inbound>,
        seen: Option<&HeaderValue>,
    ) -> Result<(), HttpFault> {
        let _turn = self.renewing.lock().await;
        let current = self.session();
        if current.id.as_ref() != seen {
            return Ok(());
        }
        let Some(initialize) = current.initialize.clone() else {
            return Err(HttpFault::Closed);
        };
        let fresh = Session::default();
        let response = self
            .client
            .send(self.client.post(initialize, &fresh))
            .await?;
        self.client.check_status(response.status())?;
        let id = self.client.session_id(&response)?;
        let answer = self.read_answer(response).await?;
        // The server refused a new session: the connection has ended.
        if answer.result().is_none() {
            return Err(HttpFault::Closed);
        }
        lock(&self.session).id = id;
        let initialized =
            Bytes::from_static(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        let response = self
            .client
            .send(self.client.post(initialized, &self.session()))
            .await?;
        self.client.check_status(response.status())?;
        self.listen(Arc::downgrade(inbound));
        Ok(())
    }

    /// The one answer a response carries (the new session's `initialize`), not routed.
    async fn read_answer(&self, response: reqwest::Response) -> Result<Message, HttpFault> {
        match media_type(&response).as_deref() {
            Some(JSON) => {
                let body = self.client.json_body(response).await?;
                Message::parse(Bytes::from(body))
                    .filter(Message::is_answer)
                    .ok_or_else(|| self.client.refuse(Refusal::NotJsonRpc).into())
            }
            Some(EVENT_STREAM) => {
                let mut events = self.client.event_stream(response);
                while let Some(Ok(sse)) = events.next().await {
                    let message = message_data(sse).and_then(|d| Message::parse(Bytes::from(d)));
                    if let Some(message) = message.filter(Message::is_answer) {
                        return Ok(message);
                    }
                }
                Err(HttpFault::Closed)
            }
            _ => Err(self.client.refuse(Refusal::ContentType).into()),
        }
    }

    /// Opens the session's own event stream (`GET`), read from a task of its own and reopened
    /// when it ends, until the connection goes; a server that offers none (405) has none.
    pub(crate) fn listen(&self, inbound: Weak<dyn Inbound>) {
        drop(self.listen_opened(inbound));
    }

    /// [`HttpTransport::listen`], and what says when the server first answered the stream's
    /// request (or the first try failed): a caller that waits for it before its next request
    /// has the session's stream open first, as a server that answers there expects.
    pub(crate) fn listen_opened(&self, inbound: Weak<dyn Inbound>) -> oneshot::Receiver<()> {
        let (opened, first) = oneshot::channel();
        if self.session().id.is_none() {
            return first;
        }
        let task = tokio::spawn(listen(
            inbound,
            self.client.clone(),
            self.session.clone(),
            Some(opened),
        ));
        if let Some(old) = lock(&self.listening).replace(task.abort_handle()) {
            old.abort();
        }
        first
    }

    /// Ends the session: its event stream closed, the session deleted at the server.
    pub(crate) async fn close(&self) {
        if let Some(task) = lock(&self.listening).take() {
            task.abort();
        }
        let session = self.session();
        if session.id.is_some() {
            let request = self.client.request(Method::DELETE, &session, Vec::new());
            if let Ok(response) = self.client.send(request).await
                && response.status() != StatusCode::METHOD_NOT_ALLOWED
            {
                let _ = self.client.check_status(response.status());
            }
        }
    }
}

/// The session's own event stream, read until the connection goes (holding the connection's
/// client only while routing a message), and reopened when it ends or breaks.
async fn listen(
    inbound: Weak<dyn Inbound>,
    client: GuardedClient,
    session: Arc<Mutex<Session>>,
    mut opened: Option<oneshot::Sender<()>>,
) {
    let mut last_id: Option<String> = None;
    let mut server_retry: Option<Duration> = None;
    let mut failures = 0;
    loop {
        let current = lock(&session).clone();
        let mut ended_by_itself = false;
        let stream = client.open_stream(&current, last_id.as_deref()).await;
        if let Some(opened) = opened.take() {
            let _ = opened.send(());
        }
        match stream {
            Ok(Some(mut events)) => {
                failures = 0;
                ended_by_itself = true;
                while let Some(item) = events.next().await {
                    let Ok(sse) = item else {
                        ended_by_itself = false;
                        break;
                    };
                    note(&sse, &mut last_id, &mut server_retry);
                    if let Some(data) = message_data(sse) {
                        let Some(inbound) = inbound.upgrade() else {
                            return;
                        };
                        if let Some(message) = Message::parse(Bytes::from(data)) {
                            inbound.route(message);
                        }
                    }
                }
            }
            Ok(None) | Err(Refusal::Unauthorized) => return,
            Err(_) => failures += 1,
        }
        if inbound.strong_count() == 0 {
            return;
        }
        let delay = match (ended_by_itself, server_retry) {
            (true, Some(retry)) => Some(retry),
            (_, retry) => reconnect_after(failures).map(|d| retry.map_or(d, |r| r.max(d))),
        };
        let Some(delay) = delay else { return };
        tokio::time::sleep(delay).await;
    }
}

/// Keeps an event's id and `retry`.
fn note(sse: &Sse, last_id: &mut Option<String>, server_retry: &mut Option<Duration>) {
    if let Some(retry) = sse.retry {
        *server_retry = Some(Duration::from_millis(retry));
    }
    if let Some(id) = &sse.id
        && !id.is_empty()
    {
        *last_id = Some(id.clone());
    }
}

/// The data of a `message` event (or one without a name), if it has any.
fn message_data(sse: Sse) -> Option<String> {
    if !matches!(sse.event.as_deref(), None | Some("") | Some("message")) {
        return None;
    }
    sse.data.filter(|d| !d.trim().is_empty())
}

/// The refusal behind an event stream's error, when the body was refused (cut off, or broken).
fn refusal_of(error: &SseError) -> Option<Refusal> {
    match error {
        SseError::Body(inner) => inner.downcast_ref::<Refusal>().cloned(),
        _ => None,
    }
}

/// The HTTP side of one server: a `reqwest::Client` with no redirects and no proxy but the one
/// given, which sends the server's headers on every request, and counts each body as it streams.
#[derive(Clone)]
pub struct GuardedClient {
    http: reqwest::Client,
    url: Url,
    headers: Arc<Vec<(HeaderName, HeaderValue)>>,
    max_body: u64,
    monitor: Monitor,
}

impl std::fmt::Debug for GuardedClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardedClient")
            .field("origin", &self.monitor.origin())
            .field("headers", &self.headers.len())
            .field("max_body", &self.max_body)
            .finish_non_exhaustive()
    }
}

impl GuardedClient {
    fn new(
        url: &Secret,
        headers: &[(String, Secret)],
        policy: &HttpPolicy,
    ) -> Result<GuardedClient, HttpError> {
        let url = Url::parse(url.expose()).map_err(|_| HttpError::Url)?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(HttpError::Url);
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(HttpError::UserInfo);
        }
        let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
            return Err(HttpError::Url);
        };
        let origin = format!("{}://{host}:{port}", url.scheme());
        let mut own = Vec::new();
        for (name, value) in headers {
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| HttpError::HeaderName(name.clone()))?;
            if RESERVED_HEADERS.contains(&header.as_str()) {
                return Err(HttpError::ReservedHeader(name.clone()));
            }
            let mut value = HeaderValue::from_bytes(value.expose().as_bytes())
                .map_err(|_| HttpError::HeaderValue(name.clone()))?;
            value.set_sensitive(true);
            own.push((header, value));
        }
        let plain_through_proxy = policy.proxy.is_some() && url.scheme() == "http";
        let mut builder = reqwest::Client::builder()
            // Never the environment's proxy: only the one given, below.
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .referer(false)
            // A few idle connections kept for the next request (one whose body was dropped early
            // is closed, never reused): a call then needs no new connection, nor a task for it.
            // Not for a plain-http server through the proxy: the egress proxy carries one plain
            // request per connection, and what follows on it would reach the server unread.
            .pool_max_idle_per_host(if plain_through_proxy {
                0
            } else {
                IDLE_CONNECTIONS
            });
        if let Some(proxy) = &policy.proxy {
            builder = builder.proxy(reqwest::Proxy::all(proxy).map_err(|_| HttpError::Proxy)?);
        }
        let http = builder.build().map_err(|_| HttpError::Client)?;
        Ok(GuardedClient {
            http,
            url,
            headers: Arc::new(own),
            max_body: policy.max_body,
            monitor: Monitor::new(origin),
        })
    }

    /// The monitor of this client's server.
    pub fn monitor(&self) -> &Monitor {
        &self.monitor
    }

    fn refuse(&self, refusal: Refusal) -> Refusal {
        self.monitor.record(&refusal);
        refusal
    }

    /// A request to the server's URL with the server's own headers, then the protocol's (the
    /// session, its protocol version, and `fixed`: what this transport sends itself), which replace
    /// a server header of the same name.
    fn request(
        &self,
        method: Method,
        session: &Session,
        fixed: Vec<(HeaderName, HeaderValue)>,
    ) -> reqwest::RequestBuilder {
        let mut headers = HeaderMap::with_capacity(self.headers.len() + fixed.len() + 2);
        for (name, value) in self.headers.iter() {
            headers.append(name.clone(), value.clone());
        }
        for (name, value) in fixed {
            headers.insert(name, value);
        }
        if let Some(id) = &session.id {
            headers.insert(HeaderName::from_static(SESSION_HEADER), id.clone());
        }
        if let Some(version) = &session.version {
            headers.insert(HeaderName::from_static(VERSION_HEADER), version.clone());
        }
        self.http.request(method, self.url.clone()).headers(headers)
    }

    fn post(&self, body: Bytes, session: &Session) -> reqwest::RequestBuilder {
        let fixed = vec![
            (ACCEPT, HeaderValue::from_static(ACCEPT_POST)),
            (CONTENT_TYPE, HeaderValue::from_static(JSON)),
        ];
        self.request(Method::POST, session, fixed).body(body)
    }

    /// The session id a response gives, if any; one that cannot be sent back is refused.
    fn session_id(&self, response: &reqwest::Response) -> Result<Option<HeaderValue>, Refusal> {
        match response.headers().get(SESSION_HEADER) {
            None => Ok(None),
            Some(id) if id.to_str().is_ok_and(|t| !t.is_empty()) => Ok(Some(id.clone())),
            Some(_) => Err(self.refuse(Refusal::Unsendable)),
        }
    }

    /// The session's event stream (`GET`), from `last_event_id` on when given; `None` when the
    /// server offers none (405).
    async fn open_stream(
        &self,
        session: &Session,
        last_event_id: Option<&str>,
    ) -> Result<Option<Events>, Refusal> {
        let mut fixed = vec![(ACCEPT, HeaderValue::from_static(EVENT_STREAM))];
        if let Some(id) = last_event_id {
            let value = HeaderValue::from_str(id).map_err(|_| self.refuse(Refusal::Unsendable))?;
            fixed.push((HeaderName::from_static(LAST_EVENT_ID_HEADER), value));
        }
        let response = self.send(self.request(Method::GET, session, fixed)).await?;
        if response.status() == StatusCode::METHOD_NOT_ALLOWED {
            return Ok(None);
        }
        self.check_status(response.status())?;
        if media_type(&response).as_deref() != Some(EVENT_STREAM) {
            return Err(self.refuse(Refusal::ContentType));
        }
        Ok(Some(self.event_stream(response)))
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<reqwest::Response, Refusal> {
        request
            .send()
            .await
            .map_err(|e| self.refuse(Refusal::network(&e)))
    }

    /// A 401 (which ends the job) and a redirect are refused on every request; any other status
    /// that is not a success is an HTTP error.
    fn check_status(&self, status: StatusCode) -> Result<(), Refusal> {
        if status == StatusCode::UNAUTHORIZED {
            return Err(self.refuse(Refusal::Unauthorized));
        }
        if status.is_redirection() {
            return Err(self.refuse(Refusal::Redirect(status.as_u16())));
        }
        if !status.is_success() {
            return Err(self.refuse(Refusal::Status(status.as_u16())));
        }
        Ok(())
    }

    /// The body as it streams, ended with an error once it passes the limit (the response is then
    /// dropped, which closes its connection).
    fn bounded(&self, response: reqwest::Response) -> BoxStream<'static, Result<Bytes, Refusal>> {
        bounded_body(response.bytes_stream(), self.max_body, self.monitor.clone())
    }

    fn event_stream(&self, response: reqwest::Response) -> Events {
        SseStream::from_bytes_stream(self.bounded(response)).boxed()
    }

    async fn json_body(&self, response: reqwest::Response) -> Result<Vec<u8>, Refusal> {
        let declared = response.content_length();
        if declared.is_some_and(|n| n > self.max_body) {
            return Err(self.refuse(Refusal::BodyTooLarge(self.max_body)));
        }
        let limit = usize::try_from(self.max_body).unwrap_or(usize::MAX);
        let first = declared
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(8 * 1024)
            .min(limit);
        let mut body = Vec::with_capacity(first);
        let mut stream = self.bounded(response);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            let needed = body.len().saturating_add(chunk.len());
            if needed > body.capacity() {
                // Grow as a Vec does, but never past the limit.
                let target = needed.max(body.capacity().saturating_mul(2)).min(limit);
                body.reserve_exact(target.saturating_sub(body.len()));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }
}

/// The response's media type, lower-cased, without parameters.
fn media_type(response: &reqwest::Response) -> Option<String> {
    let value = response.headers().get(CONTENT_TYPE)?.to_str().ok()?;
    let essence = value.split(';').next().unwrap_or_default().trim();
    Some(essence.to_ascii_lowercase())
}

/// Passes `body` on until more than `limit` bytes have come, then yields one error and stops
/// (dropping the body). A network error is yielded once too, in words.
fn bounded_body<S>(
    body: S,
    limit: u64,
    monitor: Monitor,
) -> BoxStream<'static, Result<Bytes, Refusal>>
where
    S: Stream<Item = reqwest::Result<Bytes>> + Send + 'static,
{
    let start = Some((body.boxed(), 0u64));
    futures::stream::unfold(start, move |state| {
        let monitor = monitor.clone();
        async move {
            let (mut body, seen) = state?;
            let refusal = match body.next().await? {
                Ok(chunk) => {
                    let seen = seen.saturating_add(chunk.len() as u64);
                    if seen <= limit {
                        return Some((Ok(chunk), Some((body, seen))));
                    }
                    Refusal::BodyTooLarge(limit)
                }
                Err(error) => Refusal::network(&error),
            };
            monitor.record(&refusal);
            Some((Err(refusal), None))
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn secret(v: &str) -> Secret {
        Secret::new(v)
    }

    #[tokio::test]
    async fn a_header_the_transport_sets_itself_is_refused() {
        for name in [
            "Mcp-Session-Id",
            "Host",
            "content-length",
            "Proxy-Authorization",
        ] {
            let error = transport(
                &secret("http://127.0.0.1:9/mcp"),
                &[(name.to_owned(), secret("v"))],
                &HttpPolicy::default(),
            )
            .err();
            assert_eq!(error, Some(HttpError::ReservedHeader(name.to_owned())));
        }
    }

    #[tokio::test]
    async fn a_url_the_transport_cannot_use_is_refused_without_showing_it() {
        for (url, expected) in [
            ("ftp://h.example.com/k-secret", HttpError::Url),
            ("not a url k-secret", HttpError::Url),
            ("http://user:k-secret@h.example.com/", HttpError::UserInfo),
        ] {
            let error = transport(&secret(url), &[], &HttpPolicy::default()).err();
            assert_eq!(error.as_ref(), Some(&expected));
            assert!(!expected.to_string().contains("k-secret"));
        }
        let error = transport(
            &secret("http://h.example.com/"),
            &[("X-Key".to_owned(), secret("line\u{7f}k-secret"))],
            &HttpPolicy::default(),
        )
        .err();
        assert_eq!(error, Some(HttpError::HeaderValue("X-Key".to_owned())));
    }

    #[test]
    fn statuses_are_sorted_as_the_spec_says() {
        for code in [408, 429, 500, 502, 503, 504, 599] {
            assert!(Refusal::Status(code).failure().is_retryable(), "{code}");
        }
        for code in [400, 403, 404, 405, 409, 410, 422, 501] {
            assert!(
                matches!(Refusal::Status(code).failure(), Failure::Fatal(_)),
                "{code}"
            );
        }
        assert_eq!(Refusal::Unauthorized.failure(), Failure::Unauthorized);
        assert_eq!(
            Refusal::Status(503).failure().reason(),
            Reason::McpUnreachable
        );
        let stop = Refusal::Unauthorized
            .failure()
            .stop("docs", "https://h.example.com:443");
        assert_eq!(stop.reason, Reason::McpUnavailable);
        assert_eq!(stop.server.as_deref(), Some("docs"));
        assert!(
            stop.cause
                .starts_with("https://h.example.com:443: HTTP 401")
        );
        assert!(matches!(
            Refusal::Redirect(307).failure(),
            Failure::Fatal(m) if m == "HTTP 307 Temporary Redirect: a redirect, refused rather than followed"
        ));
        assert!(matches!(
            Refusal::BodyTooLarge(MAX_BODY).failure(),
            Failure::Fatal(m) if m == "a response body over 16777216 bytes, refused"
        ));
    }

    #[tokio::test]
    async fn a_body_is_cut_off_past_the_limit_and_recorded() {
        let monitor = Monitor::new("http://h:80".to_owned());
        let chunks = (0..10).map(|_| Ok::<_, reqwest::Error>(Bytes::from_static(&[b'x'; 100])));
        let mut body = bounded_body(futures::stream::iter(chunks), 250, monitor.clone());
        let mut passed = 0;
        let mut refused = None;
        while let Some(item) = body.next().await {
            match item {
                Ok(chunk) => passed += chunk.len(),
                Err(r) => refused = Some(r),
            }
        }
        assert_eq!(passed, 200);
        assert_eq!(refused, Some(Refusal::BodyTooLarge(250)));
        assert_eq!(monitor.last_refusal(), Some(Refusal::BodyTooLarge(250)));
        assert!(!monitor.is_unauthorized());
    }
}
