//! The panel: a web page for the queue, the runs and why each ended, the deployment's health, and
//! Prometheus metrics. Pages are rendered on the server (maud, which escapes every value it is
//! given), with nothing fetched from elsewhere and one small script of the panel's own: it reloads
//! the queue page every few seconds until the reader pauses it (without it, the page has a
//! "Refresh" link and never reloads by itself). Everything but the login page needs
//! the operator's token (`PI_PANEL_TOKEN`): it is posted once to `/login`, compared in constant
//! time with its digest (the panel keeps no copy of the token), and a session cookie (HttpOnly,
//! SameSite=Strict, and Secure behind a TLS proxy the operator names) stands for it afterwards.
//! The actions also need the session's CSRF token in their forms. `/metrics` takes the session or
//! the token as a bearer. Wrong tokens at either way in count together, per client, and a login
//! form posted from another site is refused.
//!
//! On the job's path: after it: the operator watches the queue and reads the records.

mod auth;
mod charts;
pub mod client;
mod metrics;
mod pages;
pub mod pins;
mod pins_view;
mod transcript_view;
mod view;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

/// The setting that holds the operator's token.
pub const TOKEN_SETTING: &str = "PI_PANEL_TOKEN";
/// The setting of the address to listen on.
pub const LISTEN_SETTING: &str = "PI_PANEL_LISTEN";
/// Loopback only, unless the operator says otherwise.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8790";
/// The shortest token taken.
pub const MIN_TOKEN: usize = 16;

/// One of doctor's checks, as the health page shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// `ok`, `warn` or `fail`.
    pub level: String,
    pub label: String,
    pub fix: Option<String>,
}

/// What the panel shows and acts on.
pub struct Config {
    /// The operator's token (`PI_PANEL_TOKEN`): only its digest is kept.
    pub token: String,
    pub queue: Arc<dyn queue::Queue>,
    pub records: Arc<records::store::Records>,
    /// `state/jobs`, where the jobs' transcripts are.
    pub jobs_dir: PathBuf,
    /// Doctor's checks, run when the health page is asked for.
    pub health: Arc<dyn Fn() -> Vec<Health> + Send + Sync>,
    /// The state folder, whose file system's free space `/metrics` shows.
    pub state_dir: PathBuf,
    /// How long a worker may go unseen before it is shown as gone.
    pub worker_gone_after: std::time::Duration,
    /// Queues a job that runs an ended job again (through the admission): the new job's id, or
    /// why not.
    pub rerun: Rerun,
    /// The proxies believed about the client and TLS (`PI_PANEL_TRUSTED_PROXIES`).
    pub trusted_proxies: Vec<std::net::IpAddr>,
}

/// What the panel's "Run again" button does.
pub type Rerun = Arc<dyn Fn(&str) -> Result<String, String> + Send + Sync>;

/// The panel's state, shared by every request.
pub(crate) struct Panel {
    sessions: auth::Sessions,
    queue: Arc<dyn queue::Queue>,
    records: Arc<records::store::Records>,
    jobs_dir: PathBuf,
    health: Arc<dyn Fn() -> Vec<Health> + Send + Sync>,
    state_dir: PathBuf,
    disk: metrics::DiskGauges,
    worker_gone_after: std::time::Duration,
    rerun: Rerun,
    trusted_proxies: Vec<std::net::IpAddr>,
}

/// The one style sheet.
async fn css() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        view::CSS,
    )
        .into_response()
}

/// The one script.
async fn js() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        view::JS,
    )
        .into_response()
}

/// Every answer: nothing runs in the page but what it is (the panel's own script file and style
/// sheet, nothing inline, images from the panel only, forms only to it), it is never framed,
/// sniffed, cached or referred elsewhere (a browser names the panel's own origin on its own
/// forms, which the login checks, and nothing to other sites).
async fn guard(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// Serves the panel on `listener` until `shutdown` resolves. Each page asks the records' index for
/// what it shows, so the panel holds no records between requests and answers at once after start.
pub async fn serve(
    listener: tokio::net::TcpListener,
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let panel = Arc::new(Panel {
        sessions: auth::Sessions::new(&config.token),
        queue: config.queue,
        records: config.records,
        jobs_dir: config.jobs_dir,
        health: config.health,
        state_dir: config.state_dir,
        disk: metrics::DiskGauges::default(),
        worker_gone_after: config.worker_gone_after,
        rerun: config.rerun,
        trusted_proxies: config.trusted_proxies,
    });
    let service = router(panel).into_make_service_with_connect_info::<std::net::SocketAddr>();
    axum::serve(listener, service)
        .with_graceful_shutdown(shutdown)
        .await
}

/// The panel's routes.
fn router(panel: Arc<Panel>) -> Router {
    Router::new()
        .route("/login", get(auth::login_page).post(auth::login))
        .route("/logout", post(auth::logout))
        .route("/", get(pages::queue))
        .route("/runs", get(pages::runs))
        .route("/runs/{id}", get(pages::run))
        .route("/runs/{id}/transcript", get(pages::transcript))
        .route("/panel.css", get(css))
        .route("/panel.js", get(js))
        .route("/health", get(pages::health))
        .route("/pins", get(pins_view::page))
        .route("/jobs/{id}/cancel", post(pages::cancel))
        .route("/runs/{id}/rerun", post(pages::rerun))
        .route("/metrics", get(metrics::metrics))
        .fallback(pages::not_found)
        .layer(axum::middleware::map_response(guard))
        .layer(tower_http::limit::RequestBodyLimitLayer::new(64 * 1024))
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(
            axum::http::StatusCode::REQUEST_TIMEOUT,
            Duration::from_secs(10),
        ))
        .with_state(panel)
}
