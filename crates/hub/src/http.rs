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

use std::collections::HashMap;
use std::error::Error as StdError;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use config::mcp::RESERVED_HEADERS;
use futures::stream::{BoxStream, Stream, StreamExt};
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, StatusCode, Url};
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, ProtocolVersion, ServerJsonRpcMessage};
use rmcp::service::{ClientInitializeError, ServiceError};
use rmcp::transport::DynamicTransportError;
use rmcp::transport::common::client_side_sse::SseRetryPolicy;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpClientTransport,
    StreamableHttpClientTransportConfig, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};
use sse_stream::{Sse, SseStream};
use tokio::sync::watch;

use protocol::reason::Reason;

use crate::job_file::Stop;
use crate::raw::RawResults;
use crate::resolve::Secret;

/// The largest response body taken from a server: 16 MiB.
pub const MAX_BODY: u64 = 16 * 1024 * 1024;

/// The protocol version the job announces in `initialize`, whatever the client handler says.
pub const PROTOCOL_VERSION: ProtocolVersion = ProtocolVersion::V_2025_11_25;

const SESSION_HEADER: &str = "mcp-session-id";
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
/// (`StreamableHttpError::Client`). Its text names status codes and rules only.
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

    /// [`classify`], knowing this server: a 401 seen on any request wins, and an error that only
    /// says the connection closed takes the cause the client recorded.
    pub fn classify(&self, error: &(dyn StdError + 'static)) -> Failure {
        if self.is_unauthorized() {
            return Failure::Unauthorized;
        }
        judge(error)
            .or_else(|| self.last_refusal().map(|r| r.failure()))
            .unwrap_or_else(closed)
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

/// Sorts an error from connecting (`ClientInitializeError`) or from a request (`ServiceError`,
/// listing tools for one) into the spec's classes. Prefer [`Monitor::classify`], which also knows
/// a 401 seen on another request and the cause behind a closed connection.
pub fn classify(error: &(dyn StdError + 'static)) -> Failure {
    judge(error).unwrap_or_else(closed)
}

fn closed() -> Failure {
    Failure::Fatal("the connection to the server closed before it answered".to_owned())
}

fn fatal(words: &str) -> Option<Failure> {
    Some(Failure::Fatal(words.to_owned()))
}

/// The failure an error names; `None` when it only says the connection closed.
fn judge(error: &(dyn StdError + 'static)) -> Option<Failure> {
    if let Some(e) = error.downcast_ref::<ClientInitializeError>() {
        return judge_initialize(e);
    }
    if let Some(e) = error.downcast_ref::<ServiceError>() {
        return judge_service(e);
    }
    if let Some(e) = error.downcast_ref::<DynamicTransportError>() {
        return judge(e.error.as_ref());
    }
    if let Some(e) = error.downcast_ref::<StreamableHttpError<Refusal>>() {
        return judge_transport(e);
    }
    if let Some(r) = error.downcast_ref::<Refusal>() {
        return Some(r.failure());
    }
    if let Some(e) = error.downcast_ref::<SseError>() {
        return judge_sse(e);
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

fn judge_initialize(e: &ClientInitializeError) -> Option<Failure> {
    match e {
        ClientInitializeError::TransportError { error, .. } => judge(error.error.as_ref()),
        ClientInitializeError::LegacyFallbackFailed { fallback, .. } => judge_initialize(fallback),
        ClientInitializeError::ConnectionClosed(_) => None,
        ClientInitializeError::Cancelled => {
            Some(Failure::Retryable("the handshake was cancelled".to_owned()))
        }
        ClientInitializeError::JsonRpcError(error) => Some(Failure::Fatal(format!(
            "the server refused the handshake (JSON-RPC error {})",
            error.code.0
        ))),
        ClientInitializeError::NoCompatibleProtocolVersion { .. } => {
            fatal("the server speaks no protocol version the job does")
        }
        _ => fatal("the server failed the handshake"),
    }
}

fn judge_service(e: &ServiceError) -> Option<Failure> {
    match e {
        ServiceError::TransportSend(error) => judge(error.error.as_ref()),
        ServiceError::TransportClosed => None,
        ServiceError::McpError(error) => {
            let closed_marker = error
                .data
                .as_ref()
                .and_then(|d| d.get("io.modelcontextprotocol/transportClosed"))
                .is_some();
            if closed_marker {
                // The client's own note that the response stream closed early: it says no more.
                None
            } else {
                Some(Failure::Fatal(format!(
                    "the server answered with JSON-RPC error {}",
                    error.code.0
                )))
            }
        }
        ServiceError::Timeout { timeout } => Some(Failure::Retryable(format!(
            "no answer within {} ms",
            timeout.as_millis()
        ))),
        ServiceError::Cancelled { .. } => {
            Some(Failure::Retryable("the request was cancelled".to_owned()))
        }
        ServiceError::UnexpectedResponse => {
            fatal("the server answered with another kind of result")
        }
        _ => fatal("the request failed"),
    }
}

fn judge_transport(e: &StreamableHttpError<Refusal>) -> Option<Failure> {
    match e {
        StreamableHttpError::Client(refusal) => Some(refusal.failure()),
        StreamableHttpError::Sse(error) => judge_sse(error),
        StreamableHttpError::Io(error) => Some(Failure::Retryable(format!(
            "a network error ({})",
            error.kind()
        ))),
        StreamableHttpError::HttpStatus(status) => Some(Refusal::Status(status.status).failure()),
        StreamableHttpError::AuthRequired(_) => Some(Failure::Unauthorized),
        StreamableHttpError::InsufficientScope(_) => fatal("HTTP 403 Forbidden"),
        StreamableHttpError::ResponseBodyTooLarge { max_size } => Some(Failure::Fatal(format!(
            "a response body over {max_size} bytes, refused"
        ))),
        StreamableHttpError::TransportChannelClosed
        | StreamableHttpError::UnexpectedEndOfStream => None,
        StreamableHttpError::ControlRequestTimeout
        | StreamableHttpError::SessionRecoveryTimeout => {
            Some(Failure::Retryable("the request timed out".to_owned()))
        }
        StreamableHttpError::SessionExpired => fatal("HTTP 404: the server ended the session"),
        StreamableHttpError::Deserialize(_) => fatal("a response that is not a JSON-RPC message"),
        StreamableHttpError::UnexpectedContentType(_) => {
            fatal("a response that is neither JSON nor an event stream")
        }
        StreamableHttpError::MissingSessionIdInResponse => {
            fatal("the server answered the handshake without a session")
        }
        StreamableHttpError::ReinitializationFailed(error) => Some(Failure::Fatal(format!(
            "the server refused a new session (JSON-RPC error {})",
            error.code.0
        ))),
        StreamableHttpError::UnexpectedServerResponse(_) => {
            fatal("an answer the MCP client does not expect")
        }
        _ => fatal("the MCP transport failed"),
    }
}

fn judge_sse(e: &SseError) -> Option<Failure> {
    match e {
        SseError::Body(inner) => judge(inner.as_ref()),
        _ => fatal("a malformed event stream"),
    }
}

/// The transport to give rmcp's client (`().serve(transport)`), and what the runner watches.
pub type HttpTransport = StreamableHttpClientTransport<GuardedClient>;

/// A connection to one HTTP server, not yet started.
pub struct Upstream {
    pub transport: HttpTransport,
    pub monitor: Monitor,
    /// The server's results as it sent them, for the relay: connect with
    /// [`crate::relay::UpstreamEvents::reading`] this.
    pub raw: RawResults,
}

/// The transport for the server at `url` with `headers`, held to the spec's rules. Must be called
/// inside a Tokio runtime (the transport's worker is spawned at once; it sends nothing until the
/// client starts).
pub fn transport(
    url: &Secret,
    headers: &[(String, Secret)],
    policy: &HttpPolicy,
) -> Result<Upstream, HttpError> {
    let client = GuardedClient::new(url, headers, policy)?;
    let monitor = client.monitor.clone();
    let raw = client.raw.clone();
    let limit = usize::try_from(policy.max_body).unwrap_or(usize::MAX);
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.expose())
        .max_json_response_size(limit)
        .max_sse_event_size(limit);
    config.retry_config = Arc::new(Reconnect);
    Ok(Upstream {
        transport: StreamableHttpClientTransport::with_client(client, config),
        monitor,
        raw,
    })
}

/// An event stream that broke is reopened at most three times (0.5, 1 and 2 s apart).
#[derive(Debug)]
struct Reconnect;

impl SseRetryPolicy for Reconnect {
    fn retry(&self, current_times: usize) -> Option<Duration> {
        (current_times < 3).then(|| Duration::from_millis(500u64 << current_times))
    }
}

/// rmcp's HTTP backend for one server: a `reqwest::Client` with no redirects and no proxy but the
/// one given, which sends the server's headers on every request, answers only for the server's
/// origin, and counts each body as it streams.
#[derive(Clone)]
pub struct GuardedClient {
    http: reqwest::Client,
    url: Url,
    headers: Arc<Vec<(HeaderName, HeaderValue)>>,
    max_body: u64,
    monitor: Monitor,
    raw: RawResults,
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

type Refused = StreamableHttpError<Refusal>;

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
        let mut builder = reqwest::Client::builder()
            // Never the environment's proxy: only the one given, below.
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .referer(false)
            // As rmcp's own client: no idle connections kept (a body dropped early closes its own).
            .pool_max_idle_per_host(0);
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
            raw: RawResults::default(),
        })
    }

    /// The monitor of this client's server.
    pub fn monitor(&self) -> &Monitor {
        &self.monitor
    }

    fn refuse(&self, refusal: Refusal) -> Refused {
        self.monitor.record(&refusal);
        StreamableHttpError::Client(refusal)
    }

    /// The request's URL, which must be on the server's origin.
    fn target(&self, uri: &str) -> Result<Url, Refused> {
        match Url::parse(uri) {
            Ok(url) if url.origin() == self.url.origin() => Ok(url),
            _ => Err(self.refuse(Refusal::OtherOrigin)),
        }
    }

    /// A request with the server's own headers, then the protocol's (rmcp's `MCP-Protocol-Version`
    /// and the like, the session, and `fixed`: what this transport sends itself), which replace a
    /// server header of the same name.
    fn request(
        &self,
        method: Method,
        url: Url,
        session_id: Option<&str>,
        protocol_headers: HashMap<HeaderName, HeaderValue>,
        fixed: Vec<(HeaderName, HeaderValue)>,
    ) -> Result<reqwest::RequestBuilder, Refused> {
        let mut headers = HeaderMap::new();
        for (name, value) in self.headers.iter() {
            headers.append(name.clone(), value.clone());
        }
        for (name, value) in protocol_headers {
            headers.insert(name, value);
        }
        for (name, value) in fixed {
            headers.insert(name, value);
        }
        if let Some(session_id) = session_id {
            headers.insert(
                HeaderName::from_static(SESSION_HEADER),
                self.sendable(session_id)?,
            );
        }
        Ok(self.http.request(method, url).headers(headers))
    }

    fn sendable(&self, id: &str) -> Result<HeaderValue, Refused> {
        HeaderValue::from_str(id).map_err(|_| self.refuse(Refusal::Unsendable))
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<reqwest::Response, Refused> {
        request
            .send()
            .await
            .map_err(|e| self.refuse(Refusal::network(&e)))
    }

    /// A 401 (which ends the job) and a redirect are refused on every request; any other status
    /// that is not a success is an HTTP error.
    fn check_status(&self, status: StatusCode) -> Result<(), Refused> {
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

    fn event_stream(
        &self,
        response: reqwest::Response,
    ) -> BoxStream<'static, Result<Sse, SseError>> {
        let raw = self.raw.clone();
        SseStream::from_bytes_stream(self.bounded(response))
            .inspect(move |event| {
                if let Ok(Sse {
                    data: Some(data), ..
                }) = event
                {
                    raw.see(data.as_bytes());
                }
            })
            .boxed()
    }

    async fn json_body(&self, response: reqwest::Response) -> Result<Vec<u8>, Refused> {
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
            let chunk = chunk.map_err(StreamableHttpError::Client)?;
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

    async fn post(
        &self,
        uri: &str,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        protocol_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, Refused> {
        let url = self.target(uri)?;
        let message = announce(message);
        let awaits_no_response = !matches!(message, ClientJsonRpcMessage::Request(_));
        let body = serde_json::to_vec(&message)?;
        let fixed = vec![
            (ACCEPT, HeaderValue::from_static(ACCEPT_POST)),
            (CONTENT_TYPE, HeaderValue::from_static(JSON)),
        ];
        let request = self
            .request(
                Method::POST,
                url,
                session_id.as_deref(),
                protocol_headers,
                fixed,
            )?
            .body(body);
        let response = self.send(request).await?;
        let status = response.status();
        if status == StatusCode::NOT_FOUND && session_id.is_some() {
            // The session ended: rmcp starts a new one, once.
            return Err(StreamableHttpError::SessionExpired);
        }
        self.check_status(status)?;
        if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT)
            || (awaits_no_response && response.content_length() == Some(0))
        {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        let new_session = response
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        match media_type(&response).as_deref() {
            Some(EVENT_STREAM) => Ok(StreamableHttpPostResponse::Sse(
                self.event_stream(response),
                new_session,
            )),
            Some(JSON) => {
                let body = self.json_body(response).await?;
                self.raw.see(&body);
                match serde_json::from_slice::<ServerJsonRpcMessage>(&body) {
                    Ok(message) => Ok(StreamableHttpPostResponse::Json(message, new_session)),
                    Err(_) if awaits_no_response => Ok(StreamableHttpPostResponse::Accepted),
                    Err(_) => Err(self.refuse(Refusal::NotJsonRpc)),
                }
            }
            _ if awaits_no_response => Ok(StreamableHttpPostResponse::Accepted),
            _ => Err(self.refuse(Refusal::ContentType)),
        }
    }
}

/// The `initialize` request announces [`PROTOCOL_VERSION`], whatever the handler put there.
fn announce(mut message: ClientJsonRpcMessage) -> ClientJsonRpcMessage {
    if let ClientJsonRpcMessage::Request(request) = &mut message
        && let ClientRequest::InitializeRequest(initialize) = &mut request.request
    {
        initialize.params.protocol_version = PROTOCOL_VERSION;
    }
    message
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

impl StreamableHttpClient for GuardedClient {
    type Error = Refusal;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, Refused> {
        self.post(&uri, message, session_id, custom_headers).await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        _max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, Refused> {
        // The whole body is held to the policy's limit, which bounds each event too.
        self.post(&uri, message, session_id, custom_headers).await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        _limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, Refused> {
        self.post(&uri, message, session_id, custom_headers).await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), Refused> {
        let url = self.target(&uri)?;
        let request = self.request(
            Method::DELETE,
            url,
            Some(&session_id),
            custom_headers,
            Vec::new(),
        )?;
        let response = self.send(request).await?;
        if response.status() == StatusCode::METHOD_NOT_ALLOWED {
            return Ok(());
        }
        self.check_status(response.status())
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, Refused> {
        self.get_stream_with_max_sse_event_size(
            uri,
            session_id,
            last_event_id,
            auth_header,
            custom_headers,
            usize::MAX,
        )
        .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        _max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, Refused> {
        let url = self.target(&uri)?;
        let mut fixed = vec![(ACCEPT, HeaderValue::from_static(EVENT_STREAM))];
        if let Some(id) = last_event_id {
            fixed.push((
                HeaderName::from_static(LAST_EVENT_ID_HEADER),
                self.sendable(&id)?,
            ));
        }
        let request = self.request(
            Method::GET,
            url,
            session_id.as_deref(),
            custom_headers,
            fixed,
        )?;
        let response = self.send(request).await?;
        if response.status() == StatusCode::METHOD_NOT_ALLOWED {
            return Err(StreamableHttpError::ServerDoesNotSupportSse);
        }
        self.check_status(response.status())?;
        if media_type(&response).as_deref() != Some(EVENT_STREAM) {
            return Err(self.refuse(Refusal::ContentType));
        }
        Ok(self.event_stream(response))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn secret(v: &str) -> Secret {
        Secret::for_tests(v)
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

    #[test]
    fn initialize_announces_the_jobs_protocol_version() {
        let request = ClientJsonRpcMessage::request(
            ClientRequest::InitializeRequest(rmcp::model::InitializeRequest::new(
                rmcp::model::InitializeRequestParams::default()
                    .with_protocol_version(ProtocolVersion::V_2026_07_28),
            )),
            rmcp::model::RequestId::Number(0),
        );
        let sent = serde_json::to_value(announce(request)).unwrap();
        assert_eq!(sent["params"]["protocolVersion"], "2025-11-25");
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
