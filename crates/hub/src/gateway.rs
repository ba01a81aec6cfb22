//! The job's model gateway: the one way pi (and whatever pi starts) reaches a model. It listens on
//! loopback; pi's `models.json` points every provider at it (`/p/<index>`), and pi holds a stand-in
//! for the provider's key. For each call the gateway finds the model the request names (pi's
//! catalog with the overlay's `models.json` on top, [`rules::Table`]), holds it to the job's model
//! list and cost cap ([`rules::Rules`]), puts the real key where the stand-in was (whatever header
//! the wire format uses), sends the request to the model's real base URL (through the egress proxy
//! when the runner has one), and passes the answer back as it comes while reading its usage
//! ([`wire::AnswerReader`]). A call it refuses stops the job: pi gets an error, and the runner is
//! told ([`Gateway::refused`]).
//!
//! pi's own calls come on `/p/<index>`, those of a pi a stdio server starts on `/c/<index>`. Of
//! pi's chat calls the gateway keeps how the last one ended and its text ([`Gateway::finish`]):
//! the job's outcome and final message are decided from that, never from what pi prints. An
//! agent's turn offers the model tools; a call that offers none (pi's summary of a long
//! conversation) is kept apart, and counts only when no call offered tools.

pub use config::model_rules as rules;
pub mod wire;

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, header};
use bytes::Bytes;
use futures::StreamExt as _;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use protocol::reason::Reason;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::job_file::Stop;
use config::worst_case::{self, Unbounded, Worst};
use protocol::model_answer::{Answer, Ending};
use rules::{Api, Bound, Found, Meter, Model, Refusal, RequestFacts, Rules, Table};
use wire::AnswerReader;

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// The largest request pi may send through the gateway (images included, as base64).
pub const MAX_REQUEST: usize = 64 * 1024 * 1024;

/// The job's provider key as the gateway holds it: pi has the stand-in under the same variable.
#[derive(Clone)]
pub struct HeldKey {
    /// The provider whose routes carry the key.
    pub provider: String,
    pub real: String,
    pub stand_in: String,
}

impl std::fmt::Debug for HeldKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldKey")
            .field("provider", &self.provider)
            .finish_non_exhaustive()
    }
}

impl HeldKey {
    /// A stand-in for `real`: random, and shaped like it where pi-ai reads the shape (an
    /// Anthropic OAuth token is sent as a bearer token, any other Anthropic key as `x-api-key`).
    pub fn new(provider: &str, real: String) -> std::io::Result<HeldKey> {
        let hex = protocol::ids::random_hex::<16>()?;
        let marker = if real.contains("sk-ant-oat") {
            "sk-ant-oat01-"
        } else {
            ""
        };
        Ok(HeldKey {
            provider: provider.to_owned(),
            stand_in: format!("{marker}pi-dispatch-stand-in-{hex}"),
            real,
        })
    }
}

/// What the gateway is started with.
#[derive(Debug, Clone)]
pub struct GatewayOptions {
    pub table: Table,
    pub rules: Rules,
    pub key: Option<HeldKey>,
    /// The egress proxy for `https` and for `http` base URLs (`HTTPS_PROXY`, `HTTP_PROXY`), when
    /// the runner has one; never any other proxy setting.
    pub https_proxy: Option<String>,
    pub http_proxy: Option<String>,
}

impl GatewayOptions {
    /// The proxies the runner's environment names, as the hub's HTTP servers use them.
    pub fn proxies(env: &dyn Fn(&str) -> Option<String>) -> (Option<String>, Option<String>) {
        let first = |names: [&str; 2]| {
            names
                .into_iter()
                .find_map(|n| env(n).filter(|v| !v.trim().is_empty()))
        };
        (
            first(["HTTPS_PROXY", "https_proxy"]),
            first(["HTTP_PROXY", "http_proxy"]),
        )
    }
}

/// Why the gateway did not start.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("the gateway cannot listen on 127.0.0.1 ({0})")]
    Bind(std::io::ErrorKind),
    #[error("the gateway's egress proxy setting cannot be read as a proxy URL")]
    Proxy,
    #[error("the gateway's HTTP client could not be built")]
    Client,
}

/// The running gateway; it stops listening when shut down or dropped.
pub struct Gateway {
    addr: SocketAddr,
    state: Arc<State>,
    refusals: tokio::sync::watch::Receiver<Option<Stop>>,
    ct: CancellationToken,
    accept: Option<JoinHandle<()>>,
}

struct State {
    table: Table,
    rules: Rules,
    key: Option<HeldKey>,
    https: reqwest::Client,
    http: reqwest::Client,
    meter: Mutex<Meter>,
    answers: Mutex<Answers>,
    refusal: tokio::sync::watch::Sender<Option<Stop>>,
    /// Each answer's reading, so that shutting down ends them.
    tasks: Mutex<JoinSet<()>>,
    /// Connections the gateway could not take (past [`MAX_CONNECTIONS`], or out of descriptors).
    turned_away: std::sync::atomic::AtomicU64,
}

/// The most connections the gateway keeps open at once: pi holds a few; a job's processes that
/// open more are turned away, and the gateway stays bounded.
pub const MAX_CONNECTIONS: usize = 256;

fn client(proxy: Option<&String>) -> Result<reqwest::Client, GatewayError> {
    let mut builder = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .referer(false)
        .connect_timeout(Duration::from_secs(30));
    if let Some(proxy) = proxy {
        builder = builder.proxy(reqwest::Proxy::all(proxy).map_err(|_| GatewayError::Proxy)?);
    }
    builder.build().map_err(|_| GatewayError::Client)
}

impl Gateway {
    pub async fn start(options: GatewayOptions) -> Result<Gateway, GatewayError> {
        let https = client(options.https_proxy.as_ref())?;
        let http = client(options.http_proxy.as_ref())?;
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(|e| GatewayError::Bind(e.kind()))?;
        let addr = listener
            .local_addr()
            .map_err(|e| GatewayError::Bind(e.kind()))?;
        let (refusal, refusals) = tokio::sync::watch::channel(None);
        let state = Arc::new(State {
            table: options.table,
            rules: options.rules,
            key: options.key,
            https,
            http,
            meter: Mutex::new(Meter::default()),
            answers: Mutex::new(Answers::default()),
            refusal,
            tasks: Mutex::new(JoinSet::new()),
            turned_away: std::sync::atomic::AtomicU64::new(0),
        });
        let ct = CancellationToken::new();
        let accept = tokio::spawn(accept_loop(listener, state.clone(), ct.clone()));
        Ok(Gateway {
            addr,
            state,
            refusals,
            ct,
            accept: Some(accept),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL pi is given for provider `name`, when the gateway routes it.
    pub fn base_url(&self, name: &str) -> Option<String> {
        self.route_url(Caller::Pi, name)
    }

    /// The base URL a pi a stdio server starts is given for provider `name`.
    pub fn child_base_url(&self, name: &str) -> Option<String> {
        self.route_url(Caller::Child, name)
    }

    fn route_url(&self, caller: Caller, name: &str) -> Option<String> {
        self.state
            .table
            .index(name)
            .map(|i| format!("http://{}/{}/{i}", self.addr, caller.prefix()))
    }

    /// The providers the gateway routes.
    pub fn providers(&self) -> impl Iterator<Item = &str> {
        self.state.table.providers.iter().map(|(p, _)| p.as_str())
    }

    /// What every call so far used.
    pub fn meter(&self) -> Meter {
        self.state
            .meter
            .lock()
            .map(|m| m.clone())
            .unwrap_or_default()
    }

    /// The first call the gateway refused, if one was.
    pub fn refusal(&self) -> Option<Stop> {
        self.refusals.borrow().clone()
    }

    /// Waits for the first refused call.
    pub async fn refused(&self) -> Stop {
        let mut rx = self.refusals.clone();
        match rx.wait_for(Option::is_some).await {
            Ok(stop) => stop.clone().unwrap_or_else(unreachable_stop),
            // The sender lives as long as the gateway: this never ends.
            Err(_) => std::future::pending().await,
        }
    }

    /// Stops listening and ends every answer still passing through.
    pub async fn shutdown(self) {
        self.finish().await;
    }

    /// Stops listening, lets the answers still being read end (for at most two seconds), ends the
    /// rest, and gives what every call used and the last answer to pi.
    pub async fn finish(mut self) -> Seen {
        self.ct.cancel();
        crate::relay::stop_accepting(self.accept.take(), Duration::from_secs(2)).await;
        let tasks = self.state.tasks.lock().map(|mut t| std::mem::take(&mut *t));
        if let Ok(mut tasks) = tasks {
            let _ =
                tokio::time::timeout(SETTLE, async { while tasks.join_next().await.is_some() {} })
                    .await;
            tasks.shutdown().await;
        }
        Seen {
            turned_away: self
                .state
                .turned_away
                .load(std::sync::atomic::Ordering::Relaxed),
            meter: self.meter(),
            last_answer: self
                .state
                .answers
                .lock()
                .ok()
                .and_then(|a| a.last().cloned()),
        }
    }
}

/// How long [`Gateway::finish`] waits for answers still being read: pi has them whole once it
/// exits, so only an answer pi left is still running.
const SETTLE: Duration = Duration::from_secs(2);

/// What the gateway saw of a job, once it is finished.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    pub meter: Meter,
    /// Connections the gateway turned away (see [`MAX_CONNECTIONS`]).
    pub turned_away: u64,
    /// How pi's last chat call ended, and its answer's text.
    pub last_answer: Option<Answer>,
}

/// Who makes a call, by its route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Caller {
    /// The job's pi (`/p/`).
    Pi,
    /// A pi a stdio server starts (`/c/`).
    Child,
}

impl Caller {
    fn prefix(self) -> &'static str {
        match self {
            Caller::Pi => "p",
            Caller::Child => "c",
        }
    }
}

/// pi's chat calls as they end: the last agent's turn (a call offering tools) and the last of
/// any, each with the order it was made in.
#[derive(Debug, Default)]
struct Answers {
    made: u64,
    turn: Option<(u64, Answer)>,
    any: Option<(u64, Answer)>,
}

impl Answers {
    /// A number for a call as it is made.
    fn number(&mut self) -> u64 {
        self.made += 1;
        self.made
    }

    fn ended(&mut self, number: u64, turn: bool, answer: Answer) {
        let later = |slot: &Option<(u64, Answer)>| slot.as_ref().is_none_or(|(n, _)| *n < number);
        if turn && later(&self.turn) {
            self.turn = Some((number, answer.clone()));
        }
        if later(&self.any) {
            self.any = Some((number, answer));
        }
    }

    fn last(&self) -> Option<&Answer> {
        self.turn.as_ref().or(self.any.as_ref()).map(|(_, a)| a)
    }
}

/// What the gateway knows of a provider's answer before it reads it: its status, the egress
/// proxy's code, its wire format and whether it streams, the call's model and hold, and, for one of
/// pi's chat calls, where its ending is kept.
struct Answered {
    status: StatusCode,
    proxy: Option<String>,
    api: Api,
    stream: bool,
    model: Model,
    bound: Bound,
    kept: Option<Kept>,
}

/// A call of pi's the gateway keeps the ending of: its number, whether it was an agent's turn,
/// and the provider's host.
struct Kept {
    number: u64,
    turn: bool,
    host: String,
}

fn unreachable_stop() -> Stop {
    Stop::new(
        Reason::ModelCallNotAllowed,
        None,
        "the gateway refused a call",
    )
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.ct.cancel();
        if let Some(accept) = self.accept.take() {
            accept.abort();
        }
    }
}

/// The request could not be carried to the provider: pi's connection is closed without an answer,
/// as the provider's would have been, so pi sees the connection fail (and retries as it would).
#[derive(Debug, thiserror::Error)]
#[error("the provider could not be reached")]
struct Unreachable;

async fn accept_loop(listener: TcpListener, state: Arc<State>, ct: CancellationToken) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = ct.cancelled() => break,
            accepted = listener.accept() => {
                let turned_away = || state.turned_away.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Ok((stream, _)) = accepted else {
                    // Out of descriptors, say: counted, and a pause rather than a spin.
                    turned_away();
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                if connections.len() >= MAX_CONNECTIONS {
                    turned_away();
                    drop(stream);
                    continue;
                }
                let _ = stream.set_nodelay(true);
                let state = state.clone();
                let ct = ct.clone();
                connections.spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let state = state.clone();
                        async move { state.handle(request).await }
                    });
                    let connection = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service);
                    tokio::select! {
                        _ = connection => {}
                        () = ct.cancelled() => {}
                    }
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    connections.shutdown().await;
}

fn json_answer(status: StatusCode, body: serde_json::Value) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// An error body both OpenAI's and Anthropic's clients read.
fn error_answer(status: StatusCode, kind: &str, message: &str) -> Response<Body> {
    json_answer(
        status,
        serde_json::json!({"type": "error", "error": {"type": kind, "code": kind, "message": message}}),
    )
}

/// Headers that belong to one connection, never passed on; and `accept-encoding`, so that the
/// provider answers in plain bytes the gateway can read.
const HOP_BY_HOP: [&str; 10] = [
    "host",
    "connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
];

fn passed_on(name: &HeaderName) -> bool {
    !HOP_BY_HOP.contains(&name.as_str()) && name != header::ACCEPT_ENCODING
}

impl State {
    async fn handle(
        self: &Arc<Self>,
        request: Request<Incoming>,
    ) -> Result<Response<Body>, Unreachable> {
        let call = match self.take_call(request).await {
            Ok(call) => call,
            Err(answer) => return Ok(answer),
        };
        let provider = call.provider.as_str();
        let apis = Api::for_path(&call.rest);
        if apis.is_empty() {
            return Ok(self.refuse(Refusal::new(
                Reason::ModelCallUnsupported,
                format!("a call to {provider} at a path of no wire format the gateway reads"),
            )));
        }
        let json: serde_json::Value = serde_json::from_slice(&call.body).unwrap_or_default();
        let facts = RequestFacts::read(&json);
        let (model, api) = match self.model_for(call.index, provider, apis, &facts) {
            Ok(found) => found,
            Err(refusal) => return Ok(self.refuse(refusal)),
        };
        if !self.rules.allows(model) {
            return Ok(self.refuse(Refusal::new(
                Reason::ModelCallNotAllowed,
                format!("{} is not on the job's model list", model.full_name()),
            )));
        }
        // Without a cap nothing is bounded, and the request is not read for it.
        let worst = self.rules.cap.map(|_| worst_case(&call.body, &json, api));
        let bound = match self.hold_bound(model, worst)? {
            Ok(bound) => bound,
            Err(refusal) => return Ok(self.refuse(refusal)),
        };
        let kept = self.kept(call.caller, api, model, &facts);
        // The real key goes only to its own provider's models.
        let key = self.key.as_ref().filter(|k| k.provider == provider);
        let (client, url, headers) =
            self.to_provider(model, &call.rest, call.query, key, &call.headers);
        let sent = client
            .post(&url)
            .headers(headers)
            .body(call.body)
            .send()
            .await;
        let upstream = match sent {
            Ok(r) => r,
            Err(e) => {
                self.settle(&bound, None, false);
                self.keep(kept, Some(unreached(&e)), String::new(), false);
                return Err(Unreachable);
            }
        };
        self.relay_answer(upstream, api, model, bound, kept)
    }

    /// Holds the most the call can cost (`worst`, with a cap) against what is spent or held:
    /// the hold, or the refusal of a call that could take the job past its cap.
    fn hold_bound(
        &self,
        model: &Model,
        worst: Option<Result<Worst, Unbounded>>,
    ) -> Result<Result<Bound, Refusal>, Unreachable> {
        let Ok(mut meter) = self.meter.lock() else {
            return Err(Unreachable);
        };
        let bounded = worst.map(|w| self.rules.bound(model, w, meter.committed()));
        let bound = bounded.unwrap_or(Ok(Bound::default()));
        if let Ok(bound) = &bound {
            meter.hold(bound.usd);
        }
        Ok(bound)
    }

    /// pi's chat calls: how each ends is kept, under the number it is made with.
    fn kept(&self, caller: Caller, api: Api, model: &Model, facts: &RequestFacts) -> Option<Kept> {
        let chat = matches!(
            api,
            Api::OpenAiCompletions | Api::OpenAiResponses | Api::AnthropicMessages
        );
        (caller == Caller::Pi && chat)
            .then(|| self.answers.lock().ok().map(|mut a| a.number()))
            .flatten()
            .map(|number| Kept {
                number,
                turn: facts.offers_tools,
                host: reqwest::Url::parse(&model.base_url)
                    .ok()
                    .and_then(|u| u.host_str().map(str::to_owned))
                    .unwrap_or_default(),
            })
    }

    /// A request the gateway takes as one of the job's model calls: on loopback, to a provider's
    /// route, a POST, carrying the job's stand-in when a key is held, while no call was refused,
    /// and no larger than it carries. Anything else is answered here.
    async fn take_call(&self, request: Request<Incoming>) -> Result<Call, Response<Body>> {
        if !loopback_host(request.headers()) {
            return Err(error_answer(
                StatusCode::FORBIDDEN,
                "forbidden",
                "the Host or Origin is not loopback",
            ));
        }
        let no_route = || error_answer(StatusCode::NOT_FOUND, "not_found", "no such route");
        let query = request.uri().query().map(str::to_owned);
        let (caller, index, rest) = route(request.uri().path()).ok_or_else(no_route)?;
        let rest = rest.to_owned();
        let Some((provider, _)) = self.table.providers.get(index) else {
            return Err(no_route());
        };
        if request.method() != ::http::Method::POST {
            // Listing models and the like: not a model call, and nothing the job needs.
            return Err(error_answer(
                StatusCode::NOT_FOUND,
                "not_found",
                "only model calls pass",
            ));
        }
        // With a key held, only what carries its stand-in is the job's (pi has keys for no other
        // provider); anything else on loopback is turned away before it can stop the job.
        if let Some(held) = &self.key {
            let in_query = query.as_deref().is_some_and(|q| q.contains(&held.stand_in));
            if !in_query && !request.headers().values().any(|v| holds(v, &held.stand_in)) {
                return Err(error_answer(
                    StatusCode::UNAUTHORIZED,
                    "authentication_error",
                    "the request does not carry the job's key",
                ));
            }
        }
        // Once a call is refused the job is stopping: nothing more goes out while pi is ended.
        if let Some(stop) = self.refusal.borrow().as_ref() {
            return Err(error_answer(
                StatusCode::FORBIDDEN,
                stop.reason.as_str(),
                "pi-dispatch's model gateway refused a call, and the job is stopping",
            ));
        }
        let (parts, body) = request.into_parts();
        let body = match Limited::new(body, MAX_REQUEST).collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => {
                return Err(error_answer(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "request_too_large",
                    "the request is larger than the gateway carries",
                ));
            }
        };
        Ok(Call {
            caller,
            index,
            provider: provider.clone(),
            rest,
            query,
            headers: parts.headers,
            body,
        })
    }

    /// The provider's answer, passed on to pi as it comes while it is read for the job: what it
    /// used (metered, and the call's hold settled) and, for pi's chat calls, how it ended and its
    /// text.
    fn relay_answer(
        self: &Arc<Self>,
        upstream: reqwest::Response,
        api: Api,
        model: &Model,
        bound: Bound,
        kept: Option<Kept>,
    ) -> Result<Response<Body>, Unreachable> {
        let status = upstream.status();
        // The egress proxy's own answer names its decision (a short code, never a host).
        let proxy = upstream
            .headers()
            .get("x-pi-dispatch-egress")
            .and_then(|v| v.to_str().ok())
            .filter(|c| c.len() <= 64 && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
            .map(str::to_owned);
        let stream = upstream
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("text/event-stream"));
        let mut response = Response::builder().status(status);
        for (name, value) in upstream.headers() {
            if passed_on(name) && name != header::CONTENT_ENCODING {
                response = response.header(name, value);
            }
        }
        let (tx, rx) = futures::channel::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(16);
        let answer = Answered {
            status,
            proxy,
            api,
            stream,
            model: model.clone(),
            bound,
            kept,
        };
        let reading = self.clone().read_answer(upstream, answer, tx);
        if let Ok(mut tasks) = self.tasks.lock() {
            tasks.spawn(reading);
        }
        response
            .body(BodyExt::boxed(StreamBody::new(rx)))
            .map_err(|_| Unreachable)
    }

    /// Reads the provider's answer to its end, passing each chunk on to pi through `tx` (pi may
    /// have gone: it is still read for its usage), then meters it, settles the call's hold, stops
    /// the job if it went past the cap, and keeps how it ended.
    async fn read_answer(
        self: Arc<Self>,
        upstream: reqwest::Response,
        answer: Answered,
        mut tx: futures::channel::mpsc::Sender<Result<Frame<Bytes>, Infallible>>,
    ) {
        let Answered {
            status,
            proxy,
            api,
            stream,
            model,
            bound,
            kept,
        } = answer;
        let mut reader = AnswerReader::new(api, stream);
        let mut chunks = upstream.bytes_stream();
        let mut whole = true;
        while let Some(chunk) = chunks.next().await {
            let Ok(chunk) = chunk else {
                whole = false;
                break;
            };
            reader.feed(&chunk);
            let _ = futures::SinkExt::send(&mut tx, Ok(Frame::data(chunk))).await;
        }
        drop(tx);
        let answered = status.is_success();
        let read = reader.finish();
        let used = read
            .usage
            .filter(|_| answered)
            .map(|tokens| (tokens, rules::cost(&model, &tokens)));
        self.settle(&bound, used, answered && whole);
        if let Some((tokens, _)) = used
            && let Err(past) = self.rules.within(&model, &bound, &tokens)
        {
            self.refuse(past);
        }
        let ending = if !answered {
            Some(Ending::Status {
                status: status.as_u16(),
                proxy,
            })
        } else if !whole {
            Some(Ending::Unreachable {
                cause: "the answer was cut off".to_owned(),
            })
        } else {
            read.ending
        };
        let (text, cut) = match answered {
            true => (read.text, read.cut),
            false => (String::new(), false),
        };
        self.keep(kept, ending, text, cut);
    }

    /// The model a call names, in pi's catalog or the overlay's models.json, with the wire format
    /// the gateway reads it in; a refusal when it names none the gateway can check and meter.
    fn model_for(
        &self,
        index: usize,
        provider: &str,
        apis: &[Api],
        facts: &RequestFacts,
    ) -> Result<(&Model, Api), Refusal> {
        let found = match &facts.model {
            None => Found::Unknown,
            Some(id) => self.table.find(index, id, apis, facts.wants_image),
        };
        match found {
            Found::Model(m, api) => Ok((m, api)),
            Found::Unsupported(m) => Err(Refusal::new(
                Reason::ModelCallUnsupported,
                format!(
                    "{} speaks {}, which the gateway cannot check and meter",
                    m.full_name(),
                    m.api
                ),
            )),
            Found::Unknown => {
                // The request's own text is never repeated: it could be anything.
                Err(Refusal::new(
                    Reason::ModelCallNotAllowed,
                    format!(
                        "a call named a model {provider} does not have in pi's catalog or the overlay's models.json"
                    ),
                ))
            }
        }
    }

    /// The call as the provider gets it: its URL (the model's base and pi's path and query), and
    /// pi's headers but the hop-by-hop ones, with the stand-in swapped for the real key where it is
    /// the provider's own.
    fn to_provider<'a>(
        &'a self,
        model: &Model,
        rest: &str,
        query: Option<String>,
        key: Option<&HeldKey>,
        from_pi: &HeaderMap,
    ) -> (&'a reqwest::Client, String, HeaderMap) {
        let mut url = format!("{}{rest}", model.base_url.trim_end_matches('/'));
        if let Some(q) = query {
            url.push('?');
            match key {
                Some(k) => url.push_str(&q.replace(&k.stand_in, &k.real)),
                None => url.push_str(&q),
            }
        }
        let client = if url.starts_with("https:") {
            &self.https
        } else {
            &self.http
        };
        let mut headers = HeaderMap::new();
        for (name, value) in from_pi {
            if !passed_on(name) {
                continue;
            }
            let value = match key {
                Some(k) if holds(value, &k.stand_in) => {
                    let swapped =
                        String::from_utf8_lossy(value.as_bytes()).replace(&k.stand_in, &k.real);
                    match HeaderValue::from_str(&swapped) {
                        Ok(mut v) => {
                            v.set_sensitive(true);
                            v
                        }
                        Err(_) => continue,
                    }
                }
                _ => value.clone(),
            };
            headers.append(name.clone(), value);
        }
        (client, url, headers)
    }

    /// Keeps how one of pi's chat calls ended.
    fn keep(&self, kept: Option<Kept>, ending: Option<Ending>, text: String, cut: bool) {
        let Some(kept) = kept else { return };
        if let Ok(mut answers) = self.answers.lock() {
            let answer = Answer {
                ending,
                text,
                cut,
                host: kept.host,
            };
            answers.ended(kept.number, kept.turn, answer);
        }
    }

    fn settle(&self, bound: &Bound, used: Option<(rules::Tokens, f64)>, answered: bool) {
        if let Ok(mut meter) = self.meter.lock() {
            meter.settle(bound.usd, used, answered);
        }
    }

    /// Refuses a call: the job stops with its reason (the first refusal is the one reported), and
    /// pi is answered with an error.
    fn refuse(&self, refusal: Refusal) -> Response<Body> {
        let stop = Stop::new(refusal.reason, None, refusal.cause);
        self.refusal.send_if_modified(|slot| {
            if slot.is_none() {
                *slot = Some(stop);
                true
            } else {
                false
            }
        });
        error_answer(
            StatusCode::FORBIDDEN,
            refusal.reason.as_str(),
            &format!(
                "pi-dispatch's model gateway refused this call, and the job stops: {}",
                refusal.reason.sentence()
            ),
        )
    }
}

/// pi's `models.json` for the job: the overlay's as it is (its keys as references, its headers,
/// models and overrides), with every provider the gateway routes pointed at the gateway (the
/// provider's `baseUrl` and every model's own), built-in providers the overlay does not name
/// included. pi puts a provider's `baseUrl` in front of all its models, classifiers and image
/// models too, so every call pi or its codemode makes goes through the gateway.
pub fn pi_models_json(overlay: Option<&serde_json::Value>, routes: &[(String, String)]) -> String {
    use serde_json::{Map, Value};
    let mut root = overlay
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let providers = root
        .entry("providers")
        .or_insert_with(|| Value::Object(Map::new()));
    if !providers.is_object() {
        *providers = Value::Object(Map::new());
    }
    if let Value::Object(providers) = providers {
        for (name, url) in routes {
            let entry = providers
                .entry(name.clone())
                .or_insert_with(|| Value::Object(Map::new()));
            let Value::Object(entry) = entry else {
                continue;
            };
            entry.insert("baseUrl".to_owned(), Value::String(url.clone()));
            if let Some(Value::Array(models)) = entry.get_mut("models") {
                for model in models.iter_mut().filter_map(Value::as_object_mut) {
                    if model.contains_key("baseUrl") {
                        model.insert("baseUrl".to_owned(), Value::String(url.clone()));
                    }
                }
            }
        }
    }
    format!("{:#}\n", Value::Object(root))
}

/// The gateway of a job that runs pi, and what pi gets for it.
pub struct PiGateway {
    pub gateway: Gateway,
    /// The provider key's variable and the stand-in pi has under it instead.
    pub stand_in: Option<(String, String)>,
    /// The usage meter's variables for the stdio servers (`NODE_OPTIONS`,
    /// `PI_DISPATCH_CHILD_LEDGER`), which point a pi a server starts at the gateway.
    pub meter: Vec<(String, String)>,
}

/// The meter's variables that only the stdio servers get: pi has its own agent folder and stand-in.
pub const SERVERS_ONLY: [&str; 2] = ["NODE_OPTIONS", CHILD_LEDGER];

/// The agent folder of a pi a stdio server starts, as the meter tells it to that pi.
pub const CHILD_LEDGER: &str = "PI_DISPATCH_CHILD_LEDGER";

/// The meter each Node.js program a stdio server starts imports first.
const METER_MJS: &str = include_str!("gateway/meter.mjs");

/// The agent folder the runner keeps for a pi a stdio server starts, inside pi's own.
fn child_folder(agent_dir: &std::path::Path) -> std::path::PathBuf {
    agent_dir.join("pi-dispatch").join("child")
}

/// Starts the gateway for a job running pi and writes pi's `models.json` into `agent_dir`, every
/// provider pointed at it; then the meter for the stdio servers: a child agent folder with the same
/// `models.json` and the stand-in, and the preload that points a pi a server starts at it. The key
/// the gateway holds is the one the admission chose: the first of the variables pi reads for the
/// provider's key that the job has.
pub async fn start_for_pi(
    pi: &crate::pi_agent::PiOptions,
    input: &protocol::job_dir::RunnerInput,
    env: &[(String, String)],
    agent_dir: &std::path::Path,
) -> Result<PiGateway, Stop> {
    let lookup = |name: &str| {
        env.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .filter(|v| !v.is_empty())
    };
    let invalid = |cause: String| Stop::new(Reason::ModelRulesInvalid, None, cause);
    let (text, models) = overlay_models(pi.overlay.as_deref())?;
    let rules = Rules::new(input.models.clone(), input.max_cost_usd).map_err(invalid)?;
    let table = Table::build(config::catalog::builtin(), models.as_ref());
    let key = held_key(pi.model.as_deref(), models.as_ref(), &lookup)?;
    let (https_proxy, http_proxy) = GatewayOptions::proxies(&lookup);
    let stand_in = key.as_ref().map(|(v, k)| (v.clone(), k.stand_in.clone()));
    let gateway = Gateway::start(GatewayOptions {
        table,
        rules,
        key: key.map(|(_, k)| k),
        https_proxy,
        http_proxy,
    })
    .await
    .map_err(|e| Stop::new(Reason::RunnerSetupFailed, None, e.to_string()))?;
    let routes = |url: &dyn Fn(&str) -> Option<String>| -> Vec<(String, String)> {
        gateway
            .providers()
            .filter_map(|p| url(p).map(|u| (p.to_owned(), u)))
            .collect()
    };
    let overlay_json = text.and_then(|t| serde_json::from_slice(&t).ok());
    let models_json = pi_models_json(
        overlay_json.as_ref(),
        &routes(&|p: &str| gateway.base_url(p)),
    );
    let child_json = pi_models_json(
        overlay_json.as_ref(),
        &routes(&|p: &str| gateway.child_base_url(p)),
    );
    let unwritten = |e: std::io::Error| {
        Stop::new(
            Reason::RunnerSetupFailed,
            None,
            format!("pi's models.json could not be written ({})", e.kind()),
        )
    };
    crate::pi_agent::write_private(agent_dir, "models.json", models_json.as_bytes())
        .map_err(unwritten)?;
    let meter =
        write_meter(agent_dir, &pi.package, stand_in.as_ref(), &child_json).map_err(unwritten)?;
    Ok(PiGateway {
        gateway,
        stand_in,
        meter,
    })
}

/// The overlay's `models.json`, as its text and as read (`None` without one); a file that cannot
/// be read, or is not one the admission accepts, stops the job.
fn overlay_models(
    overlay: Option<&std::path::Path>,
) -> Result<(Option<Vec<u8>>, Option<config::models::Models>), Stop> {
    let invalid = |cause: &str| Stop::new(Reason::ModelRulesInvalid, None, cause.to_owned());
    let text = match overlay.map(|o| std::fs::read(o.join("models.json"))) {
        None => None,
        Some(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => None,
        Some(Err(e)) => {
            return Err(invalid(&format!(
                "the overlay's models.json cannot be read ({})",
                e.kind()
            )));
        }
        Some(Ok(bytes)) => Some(bytes),
    };
    let models =
        match &text {
            None => None,
            Some(bytes) => Some(config::models::check(bytes).map_err(|_| {
                invalid("the overlay's models.json is not one the admission accepts")
            })?),
        };
    Ok((text, models))
}

/// The provider's key the gateway holds for pi's `model` (`provider/id`): the first of the
/// variables pi reads for the provider's key that the job has, with its stand-in. A chat model the
/// gateway cannot check and meter stops the job.
fn held_key(
    model: Option<&str>,
    models: Option<&config::models::Models>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<(String, HeldKey)>, Stop> {
    let Some((provider, id)) = model.and_then(|m| m.split_once('/')) else {
        return Ok(None);
    };
    if let Some(own) = rules::uncarried_chat_model(config::catalog::builtin(), models, provider, id)
    {
        return Err(Stop::new(
            Reason::ModelCallUnsupported,
            None,
            format!(
                "{} speaks {}, which the gateway cannot check and meter",
                own.full_name(),
                own.api
            ),
        ));
    }
    config::catalog::find(models, provider, id)
        .ok()
        .and_then(|found| {
            found
                .key_variables
                .into_iter()
                .find_map(|v| lookup(&v).map(|value| (v, value)))
        })
        .map(|(variable, value)| HeldKey::new(provider, value).map(|k| (variable, k)))
        .transpose()
        .map_err(|e| {
            Stop::new(
                Reason::RunnerSetupFailed,
                None,
                format!("the gateway has no stand-in for the key ({})", e.kind()),
            )
        })
}

/// Writes the child's agent folder (for a server that sees pi's folder) and gives the servers'
/// meter variables: `NODE_OPTIONS` importing the meter as a data: URL, which carries pi's package,
/// the key's variable, its stand-in and the child's `models.json` (the gateway's child routes; for a
/// server with a `/tmp` of its own, where the meter makes the folder itself), and
/// `PI_DISPATCH_CHILD_LEDGER`.
fn write_meter(
    agent_dir: &std::path::Path,
    package: &std::path::Path,
    stand_in: Option<&(String, String)>,
    models_json: &str,
) -> std::io::Result<Vec<(String, String)>> {
    let child = child_folder(agent_dir);
    crate::pi_agent::write_private(&child, "models.json", models_json.as_bytes())?;
    Ok(meter_variables(&child, package, stand_in, models_json))
}

/// The meter's variables for the servers (pure).
pub fn meter_variables(
    child: &std::path::Path,
    package: &std::path::Path,
    stand_in: Option<&(String, String)>,
    models_json: &str,
) -> Vec<(String, String)> {
    use base64::Engine as _;
    // The package as the meter will see it: every link followed.
    let package = std::fs::canonicalize(package).unwrap_or_else(|_| package.to_owned());
    let note = serde_json::json!({
        "package": package.to_string_lossy(),
        "variable": stand_in.map(|(v, _)| v),
        "standIn": stand_in.map(|(_, s)| s),
        "models": models_json,
    });
    let script = METER_MJS.replace("__METER__", &note.to_string());
    let url = base64::engine::general_purpose::STANDARD.encode(script);
    vec![
        (
            "NODE_OPTIONS".to_owned(),
            format!("--import=data:text/javascript;base64,{url}"),
        ),
        (
            CHILD_LEDGER.to_owned(),
            child.to_string_lossy().into_owned(),
        ),
    ]
}

/// A model call the gateway took: who made it, to which provider (by index and name), the rest of
/// its path and its query, its headers and body.
struct Call {
    caller: Caller,
    index: usize,
    provider: String,
    rest: String,
    query: Option<String>,
    headers: HeaderMap,
    body: Bytes,
}

/// The worst case of a request under a cap ([`worst_case::read`]), read from its body as the
/// strict reader reads it: a key written twice could be read one way here and another by the
/// provider, so such a body has no bound.
pub(crate) fn worst_case(
    body: &[u8],
    json: &serde_json::Value,
    api: Api,
) -> Result<Worst, Unbounded> {
    let strict = std::str::from_utf8(body)
        .ok()
        .map(protocol::json::parse)
        .is_some_and(|parsed| parsed.is_ok());
    if !strict {
        return Err(Unbounded {
            field: "a body that is not strict JSON (a key written twice, or not JSON)".to_owned(),
        });
    }
    worst_case::read(json, body.len(), api)
}

/// `/p/<index><rest>` (pi's) or `/c/<index><rest>` (a child's): who calls, the provider's index
/// and the path after its base URL.
pub(crate) fn route(path: &str) -> Option<(Caller, usize, &str)> {
    let (caller, rest) = match path.strip_prefix("/p/") {
        Some(rest) => (Caller::Pi, rest),
        None => (Caller::Child, path.strip_prefix("/c/")?),
    };
    let (index, rest) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((caller, index.parse().ok()?, rest))
}

/// Why a call got no answer, in fixed words (an error's text could quote the URL, and with it a
/// key in its query).
fn unreached(e: &reqwest::Error) -> Ending {
    let cause = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "the connection failed"
    } else {
        "the request failed"
    };
    Ending::Unreachable {
        cause: cause.to_owned(),
    }
}

fn holds(value: &HeaderValue, stand_in: &str) -> bool {
    value
        .to_str()
        .is_ok_and(|v| !stand_in.is_empty() && v.contains(stand_in))
}

/// Whether the request's `Host` (required) and `Origin` (when sent) name this machine's loopback:
/// a web page reaching the loopback port under a name of its own is turned away.
pub(crate) fn loopback_host(headers: &HeaderMap) -> bool {
    let is_loopback = |host: &str| {
        matches!(
            host.to_ascii_lowercase().as_str(),
            "localhost" | "127.0.0.1" | "[::1]" | "::1"
        )
    };
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return false;
    };
    let name = match host.rsplit_once(':') {
        Some((name, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    is_loopback(name)
        && headers.get(header::ORIGIN).is_none_or(|origin| {
            origin
                .to_str()
                .ok()
                .and_then(|o| reqwest::Url::parse(o).ok())
                .and_then(|url| url.host_str().map(is_loopback))
                .unwrap_or(false)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pi_is_pointed_at_the_gateway_for_every_provider() {
        let overlay = serde_json::json!({"providers": {
            "fake": {"baseUrl": "http://127.0.0.1:9/v1", "api": "openai-completions", "apiKey": "$FAKE_KEY",
                     "headers": {"X-Title": "t"},
                     "models": [{"id": "a"}, {"id": "b", "baseUrl": "http://127.0.0.1:10/v1"}]},
            "openai": {"modelOverrides": {"gpt-x": {"maxTokens": 5}}}
        }, "$schema": "kept"});
        let routes = [
            ("openai".to_owned(), "http://127.0.0.1:7/p/0".to_owned()),
            ("anthropic".to_owned(), "http://127.0.0.1:7/p/1".to_owned()),
            ("fake".to_owned(), "http://127.0.0.1:7/p/2".to_owned()),
        ];
        let text = pi_models_json(Some(&overlay), &routes);
        let out: serde_json::Value = serde_json::from_str(&text).unwrap();
        let p = &out["providers"];
        assert_eq!(p["openai"]["baseUrl"], "http://127.0.0.1:7/p/0");
        assert_eq!(p["openai"]["modelOverrides"]["gpt-x"]["maxTokens"], 5);
        assert_eq!(
            p["anthropic"],
            serde_json::json!({"baseUrl": "http://127.0.0.1:7/p/1"})
        );
        assert_eq!(p["fake"]["baseUrl"], "http://127.0.0.1:7/p/2");
        assert_eq!(p["fake"]["apiKey"], "$FAKE_KEY");
        assert_eq!(p["fake"]["headers"]["X-Title"], "t");
        assert_eq!(p["fake"]["models"][0], serde_json::json!({"id": "a"}));
        assert_eq!(p["fake"]["models"][1]["baseUrl"], "http://127.0.0.1:7/p/2");
        assert_eq!(out["$schema"], "kept");
        assert!(!text.contains("127.0.0.1:9") && !text.contains("127.0.0.1:10"));
        // Without an overlay file, the built-in providers alone.
        let bare: serde_json::Value = serde_json::from_str(&pi_models_json(None, &routes)).unwrap();
        assert_eq!(bare["providers"].as_object().unwrap().len(), 3);
    }

    #[test]
    fn routes_are_a_provider_index_and_the_rest() {
        assert_eq!(
            route("/p/3/v1/messages"),
            Some((Caller::Pi, 3, "/v1/messages"))
        );
        assert_eq!(
            route("/c/0/chat/completions"),
            Some((Caller::Child, 0, "/chat/completions"))
        );
        assert_eq!(route("/p/12"), Some((Caller::Pi, 12, "")));
        for bad in [
            "/p/",
            "/p//x",
            "/p/a/x",
            "/q/1/x",
            "/p/+1/x",
            "/p/99999999999999999999999/x",
        ] {
            assert_eq!(route(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_stand_in_keeps_only_the_shape_pi_reads() {
        let plain = HeldKey::new("openai", "sk-cnry-real".into()).unwrap();
        assert!(plain.stand_in.starts_with("pi-dispatch-stand-in-"));
        assert!(!plain.stand_in.contains("cnry"));
        let oauth = HeldKey::new("anthropic", "sk-ant-oat01-cnry".into()).unwrap();
        assert!(
            oauth
                .stand_in
                .starts_with("sk-ant-oat01-pi-dispatch-stand-in-")
        );
        assert!(!oauth.stand_in.contains("cnry"));
        assert_ne!(
            plain.stand_in,
            HeldKey::new("openai", "x".into()).unwrap().stand_in
        );
        assert!(!format!("{plain:?}").contains("cnry"));
    }

    #[test]
    fn only_loopback_hosts_and_origins() {
        let with = |host: &str, origin: Option<&str>| {
            let mut h = HeaderMap::new();
            h.insert(header::HOST, HeaderValue::from_str(host).unwrap());
            if let Some(o) = origin {
                h.insert(header::ORIGIN, HeaderValue::from_str(o).unwrap());
            }
            loopback_host(&h)
        };
        assert!(with("127.0.0.1:4000", None));
        assert!(with("localhost", Some("http://127.0.0.1:9")));
        assert!(!with("evil.example:4000", None));
        assert!(!with("127.0.0.1:4000", Some("https://evil.example")));
        assert!(!loopback_host(&HeaderMap::new()));
    }
}
