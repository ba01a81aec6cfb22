//! Logging in: the operator's token, posted once, against its digest in constant time; then a
//! session cookie, and a CSRF token per session for the forms that act.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::Form;
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq as _;

use crate::Panel;

/// The session cookie's name.
pub const COOKIE: &str = "pi_panel";
/// How long a session lasts.
const SESSION_FOR: Duration = Duration::from_secs(12 * 3600);

/// Wrong tokens taken in a minute before the login refuses to look.
const WRONG_PER_MINUTE: usize = 20;

/// The token's digest and the open sessions.
pub struct Sessions {
    digest: [u8; 32],
    open: Mutex<HashMap<String, Session>>,
    /// When the last wrong tokens were given.
    wrong: Mutex<std::collections::VecDeque<Instant>>,
}

struct Session {
    csrf: String,
    since: Instant,
}

/// 32 random bytes as hex; without randomness there is no session to hand out.
fn random_hex() -> Option<String> {
    protocol::ids::random_hex::<32>().ok()
}

impl Sessions {
    pub fn new(token: &str) -> Sessions {
        Sessions {
            digest: Sha256::digest(token.as_bytes()).into(),
            open: Mutex::new(HashMap::new()),
            wrong: Mutex::new(std::collections::VecDeque::new()),
        }
    }

    /// Whether too many wrong tokens came in the last minute (forgetting older ones).
    fn too_many_wrong(&self) -> bool {
        let mut wrong = self.wrong.lock().unwrap_or_else(PoisonError::into_inner);
        while wrong
            .front()
            .is_some_and(|t| t.elapsed() > Duration::from_secs(60))
        {
            wrong.pop_front();
        }
        wrong.len() >= WRONG_PER_MINUTE
    }

    /// Counts a wrong token.
    fn note_wrong(&self) {
        self.wrong
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back(Instant::now());
    }

    /// Whether `given` is the token (digests compared in constant time; an empty token is none).
    pub fn is_token(&self, given: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(given.as_bytes()).into();
        !given.is_empty() && bool::from(digest.ct_eq(&self.digest))
    }

    /// A new session: its id and its CSRF token.
    fn open(&self) -> Option<(String, String)> {
        let (id, csrf) = (random_hex()?, random_hex()?);
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.retain(|_, s| s.since.elapsed() < SESSION_FOR);
        open.insert(
            id.clone(),
            Session {
                csrf: csrf.clone(),
                since: Instant::now(),
            },
        );
        Some((id, csrf))
    }

    /// The CSRF token of session `id`, while it lasts.
    fn csrf_of(&self, id: &str) -> Option<String> {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.get(id)
            .filter(|s| s.since.elapsed() < SESSION_FOR)
            .map(|s| s.csrf.clone())
    }

    fn close(&self, id: &str) {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
    }
}

/// The session cookie of a request.
fn session_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_owned())
}

/// A request from a logged-in operator, with the session's CSRF token for the page's forms.
pub struct Authed {
    pub csrf: String,
}

impl FromRequestParts<Arc<Panel>> for Authed {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, panel: &Arc<Panel>) -> Result<Authed, Response> {
        session_id(&parts.headers)
            .and_then(|id| panel.sessions.csrf_of(&id))
            .map(|csrf| Authed { csrf })
            .ok_or_else(|| Redirect::to("/login").into_response())
    }
}

/// Whether the request may read the metrics: a session, or the token as a bearer.
pub fn may_read_metrics(panel: &Panel, headers: &HeaderMap) -> bool {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    bearer.is_some_and(|t| panel.sessions.is_token(t))
        || session_id(headers).is_some_and(|id| panel.sessions.csrf_of(&id).is_some())
}

#[derive(serde::Deserialize)]
pub struct LoginForm {
    token: String,
}

#[derive(serde::Deserialize)]
pub struct CsrfForm {
    pub csrf: String,
}

pub async fn login_page() -> Response {
    axum::response::Html(crate::view::login(None).into_string()).into_response()
}

pub async fn login(State(panel): State<Arc<Panel>>, Form(form): Form<LoginForm>) -> Response {
    if panel.sessions.too_many_wrong() {
        tracing::warn!(event = "panel_login_throttled");
        return (
            StatusCode::TOO_MANY_REQUESTS,
            axum::response::Html(
                crate::view::login(Some(
                    "Too many wrong tokens in the last minute: try again in a minute.",
                ))
                .into_string(),
            ),
        )
            .into_response();
    }
    if !panel.sessions.is_token(&form.token) {
        panel.sessions.note_wrong();
        tracing::warn!(event = "panel_login_refused");
        return (
            StatusCode::UNAUTHORIZED,
            axum::response::Html(
                crate::view::login(Some("That is not the panel's token.")).into_string(),
            ),
        )
            .into_response();
    }
    let Some((id, _)) = panel.sessions.open() else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    tracing::info!(event = "panel_login");
    (
        [(
            header::SET_COOKIE,
            format!("{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/"),
        )],
        Redirect::to("/"),
    )
        .into_response()
}

/// Whether `given` is the session's CSRF token (compared in constant time).
pub fn csrf_ok(authed: &Authed, given: &str) -> bool {
    !given.is_empty() && bool::from(authed.csrf.as_bytes().ct_eq(given.as_bytes()))
}

pub async fn logout(
    State(panel): State<Arc<Panel>>,
    headers: HeaderMap,
    authed: Authed,
    Form(form): Form<CsrfForm>,
) -> Response {
    if !csrf_ok(&authed, &form.csrf) {
        return StatusCode::FORBIDDEN.into_response();
    }
    if let Some(id) = session_id(&headers) {
        panel.sessions.close(&id);
    }
    (
        [(
            header::SET_COOKIE,
            format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
        )],
        Redirect::to("/login"),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_token_opens_a_session_and_a_session_has_its_own_csrf() {
        let s = Sessions::new("CNRY-panel-token-1");
        assert!(s.is_token("CNRY-panel-token-1"));
        assert!(!s.is_token("CNRY-panel-token-2") && !s.is_token(""));
        let (id, csrf) = s.open().unwrap();
        let (other, other_csrf) = s.open().unwrap();
        assert_ne!(id, other);
        assert_ne!(csrf, other_csrf);
        assert_eq!(s.csrf_of(&id).as_deref(), Some(csrf.as_str()));
        s.close(&id);
        assert_eq!(s.csrf_of(&id), None);
        for _ in 0..WRONG_PER_MINUTE {
            assert!(!s.too_many_wrong());
            s.note_wrong();
        }
        assert!(s.too_many_wrong());
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            format!("a=b; {COOKIE}={other}").parse().unwrap(),
        );
        assert_eq!(session_id(&headers).as_deref(), Some(other.as_str()));
    }
}
