//! The HTTP side: `POST /github` and `POST /gitlab` take webhooks, `GET /healthz` says the
//! receiver runs. Each delivery is checked (its signature or token over the raw body, first), read,
//! matched against `triggers.json` as the file is now, and its jobs queued with the delivery in one
//! step; the receiver never runs a job. Every delivery gets one log line and an answer that says
//! what happened:
//!
//! | answer | when |
//! | --- | --- |
//! | 202 `queued` | the jobs of the matching triggers are queued (their ids in `jobs`) |
//! | 200 `unmatched` | no trigger matches the event: nothing is queued |
//! | 200 `duplicate` | the delivery was seen before: nothing is queued |
//! | 200 `ignored` | an event no trigger can name (a push, a closed issue, a bot's comment) |
//! | 200 `pong` | GitHub's ping |
//! | 400 | a header is missing or malformed, or the body is not the event's JSON (the field is named) |
//! | 401 | the signature (GitHub) or the token (GitLab) is wrong or missing |
//! | 404 | the forge has no secret set here, so its webhooks are not taken |
//! | 408 | the request took longer than the receiver waits |
//! | 413 | the body is larger than the receiver reads |
//! | 503 | `triggers.json` cannot be read or is refused, or the queue cannot be written: send again |

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use protocol::forge_event::Forge;
use queue::Queue;
use serde_json::json;

use crate::payload::{self, Parsed};
use crate::{github, gitlab, matching, signature};

/// The largest body read by default (GitHub's own deliveries are capped at 25 MB, but the events
/// the triggers name are far smaller).
pub const DEFAULT_MAX_BODY: usize = 1024 * 1024;
/// How long one request may take, body included, by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

pub use protocol::secret::Secret;

/// What the receiver runs with.
#[derive(Clone)]
pub struct Config {
    pub queue: Arc<dyn Queue>,
    pub triggers_file: PathBuf,
    /// `PI_GITHUB_WEBHOOK_SECRET`: GitHub's webhooks are taken only with it.
    pub github_secret: Option<Secret>,
    /// `PI_GITLAB_WEBHOOK_TOKEN`: GitLab's webhooks are taken only with it.
    pub gitlab_token: Option<Secret>,
    pub max_body: usize,
    pub timeout: Duration,
}

/// The receiver's routes, with the body limit and the timeout.
pub fn router(config: Config) -> Router {
    let (max_body, timeout) = (config.max_body, config.timeout);
    Router::new()
        .route("/github", post(github_delivery))
        .route("/gitlab", post(gitlab_delivery))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(Arc::new(config))
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(tower_http::limit::RequestBodyLimitLayer::new(max_body))
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            timeout,
        ))
        // Outermost, so that the limit's and the timeout's answers are logged too.
        .layer(axum::middleware::map_response(log_unanswered))
}

/// Serves the receiver on `listener` until `shutdown` completes, then answers the requests in
/// flight and returns.
pub async fn serve(
    listener: tokio::net::TcpListener,
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(config))
        .with_graceful_shutdown(shutdown)
        .await
}

/// Marks a response the handler logged already.
#[derive(Clone, Copy)]
struct Logged;

/// One log line for a refusal the layers made before any handler answered (a body over the
/// limit, a request that took too long), or an extractor's.
async fn log_unanswered(response: Response) -> Response {
    if response.extensions().get::<Logged>().is_none() && !response.status().is_success() {
        tracing::warn!(event = "webhook_refused", status = response.status().as_u16(),
            why = %refusal_why(response.status()));
    }
    response
}

fn refusal_why(status: StatusCode) -> &'static str {
    match status {
        StatusCode::PAYLOAD_TOO_LARGE => "the body is larger than the receiver reads",
        StatusCode::REQUEST_TIMEOUT => "the request took longer than the receiver waits",
        StatusCode::METHOD_NOT_ALLOWED => "only POST takes webhooks",
        StatusCode::NOT_FOUND => "no such path: webhooks go to /github or /gitlab",
        _ => "the request was refused",
    }
}

/// The answer to one delivery, and its log line.
struct Answer {
    status: StatusCode,
    outcome: &'static str,
    why: String,
    jobs: Vec<String>,
}

impl Answer {
    fn new(status: StatusCode, outcome: &'static str, why: impl Into<String>) -> Answer {
        Answer {
            status,
            outcome,
            why: why.into(),
            jobs: Vec::new(),
        }
    }

    fn respond(self, forge: Forge, delivery: Option<&str>) -> Response {
        let event = match self.outcome {
            "queued" => "webhook_queued",
            "unmatched" | "duplicate" | "ignored" | "pong" => "webhook_taken",
            _ => "webhook_refused",
        };
        if self.status.is_success() {
            tracing::info!(event, forge = %forge, delivery, status = self.status.as_u16(),
                outcome = self.outcome, why = %self.why, jobs = self.jobs.len());
        } else {
            tracing::warn!(event, forge = %forge, delivery, status = self.status.as_u16(),
                outcome = self.outcome, why = %self.why);
        }
        let body = json!({"outcome": self.outcome, "why": self.why, "jobs": self.jobs});
        let mut response = (self.status, axum::Json(body)).into_response();
        response.extensions_mut().insert(Logged);
        response
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &'static str) -> Result<&'a str, Answer> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| {
            Answer::new(
                StatusCode::BAD_REQUEST,
                "bad-request",
                format!("the {name} header is missing or not text"),
            )
        })
}

fn delivery_id<'a>(headers: &'a HeaderMap, names: &[&'static str]) -> Result<&'a str, Answer> {
    let name = names[0];
    let id = names
        .iter()
        .find_map(|n| headers.get(*n))
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| {
            Answer::new(
                StatusCode::BAD_REQUEST,
                "bad-request",
                format!("the {name} header is missing"),
            )
        })?;
    if payload::is_delivery_id(id) {
        Ok(id)
    } else {
        Err(Answer::new(
            StatusCode::BAD_REQUEST,
            "bad-request",
            format!("the {name} header is not a delivery id (1 to 100 of letters, digits, . _ -)"),
        ))
    }
}

fn not_configured(forge: Forge, setting: &str) -> Answer {
    Answer::new(
        StatusCode::NOT_FOUND,
        "not-configured",
        format!("{forge} webhooks are not taken here: {setting} is not set"),
    )
}

async fn github_delivery(
    State(config): State<Arc<Config>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let delivery = delivery_id(&headers, &[github::DELIVERY_HEADER]).ok();
    let answer = match github_answer(&config, &headers, &body).await {
        Ok(a) | Err(a) => a,
    };
    answer.respond(Forge::Github, delivery)
}

async fn github_answer(
    config: &Config,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Answer, Answer> {
    let secret = config
        .github_secret
        .as_ref()
        .ok_or_else(|| not_configured(Forge::Github, crate::GITHUB_SECRET_SETTING))?;
    // The signature first: nothing of an unsigned body is read.
    let signed = headers
        .get(github::SIGNATURE_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|sig| signature::github_signature_ok(secret.expose().as_bytes(), body, sig));
    if !signed {
        return Err(Answer::new(
            StatusCode::UNAUTHORIZED,
            "bad-signature",
            "the X-Hub-Signature-256 header is missing or is not the body's signature under the webhook's secret",
        ));
    }
    let event = header(headers, github::EVENT_HEADER)?;
    let delivery = delivery_id(headers, &[github::DELIVERY_HEADER])?;
    let parsed = github::parse(event, delivery, body).map_err(unreadable)?;
    queue_parsed(config, Forge::Github, delivery, parsed).await
}

async fn gitlab_delivery(
    State(config): State<Arc<Config>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let delivery = delivery_id(
        &headers,
        &[gitlab::IDEMPOTENCY_HEADER, gitlab::DELIVERY_HEADER],
    )
    .ok();
    let answer = match gitlab_answer(&config, &headers, &body).await {
        Ok(a) | Err(a) => a,
    };
    answer.respond(Forge::Gitlab, delivery)
}

async fn gitlab_answer(
    config: &Config,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Answer, Answer> {
    let secret = config
        .gitlab_token
        .as_ref()
        .ok_or_else(|| not_configured(Forge::Gitlab, crate::GITLAB_TOKEN_SETTING))?;
    let token_ok = headers.get(gitlab::TOKEN_HEADER).is_some_and(|given| {
        signature::gitlab_token_ok(secret.expose().as_bytes(), given.as_bytes())
    });
    if !token_ok {
        return Err(Answer::new(
            StatusCode::UNAUTHORIZED,
            "bad-token",
            "the X-Gitlab-Token header is missing or is not the webhook's secret token",
        ));
    }
    let event = header(headers, gitlab::EVENT_HEADER)?;
    let delivery = delivery_id(
        headers,
        &[gitlab::IDEMPOTENCY_HEADER, gitlab::DELIVERY_HEADER],
    )?;
    let parsed = gitlab::parse(event, delivery, body).map_err(unreadable)?;
    queue_parsed(config, Forge::Gitlab, delivery, parsed).await
}

fn unreadable(e: payload::Unreadable) -> Answer {
    Answer::new(StatusCode::BAD_REQUEST, "bad-payload", e.to_string())
}

fn unavailable(why: String) -> Answer {
    Answer::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", why)
}

async fn queue_parsed(
    config: &Config,
    forge: Forge,
    delivery: &str,
    parsed: Parsed,
) -> Result<Answer, Answer> {
    let event = match parsed {
        Parsed::Ping => {
            return Ok(Answer::new(
                StatusCode::OK,
                "pong",
                "the webhook reaches the receiver",
            ));
        }
        Parsed::Ignored(why) => return Ok(Answer::new(StatusCode::OK, "ignored", why)),
        Parsed::Event(e) => e,
    };
    let file = config.triggers_file.clone();
    let queue = config.queue.clone();
    let key = format!("{forge}:{delivery}");
    let done = tokio::task::spawn_blocking(move || -> Result<Answer, Answer> {
        let triggers = read_triggers(&file)?;
        let rows = matching::queued(&triggers, &event)
            .map_err(|_| unavailable("a job could not be written as JSON".to_owned()))?;
        let new = queue
            .enqueue_delivery(&key, &rows, SystemTime::now())
            .map_err(|e| unavailable(format!("the queue cannot be written: {e}")))?;
        Ok(if !new {
            Answer::new(
                StatusCode::OK,
                "duplicate",
                "this delivery was taken before",
            )
        } else if rows.is_empty() {
            Answer::new(StatusCode::OK, "unmatched", "no trigger matches this event")
        } else {
            Answer {
                jobs: rows.into_iter().map(|job| job.id).collect(),
                ..Answer::new(StatusCode::ACCEPTED, "queued", "queued for the worker")
            }
        })
    })
    .await;
    done.unwrap_or_else(|_| Err(unavailable("the delivery could not be handled".to_owned())))
}

/// `triggers.json` as the worker reads it; a file that is missing holds no trigger.
fn read_triggers(file: &std::path::Path) -> Result<config::triggers::Triggers, Answer> {
    config::triggers::TriggersFile::read(file)
        .map(|all| all.triggers)
        .map_err(|e| unavailable(e.to_string()))
}
