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
use crate::client::Client;

/// The session cookie's name.
pub const COOKIE: &str = "pi_panel";
/// How long a session lasts.
const SESSION_FOR: Duration = Duration::from_secs(12 * 3600);

/// Wrong tokens taken from one client in a minute before the panel refuses to look at its next.
const WRONG_PER_MINUTE: usize = 20;
/// The most clients whose wrong tokens are remembered; past it, the one seen longest ago is
/// forgotten first.
const MAX_CLIENTS: usize = 10_000;

/// The token's digest and the open sessions.
pub struct Sessions {
    digest: [u8; 32],
    open: Mutex<HashMap<String, Session>>,
    /// When each client last gave wrong tokens, at the login form or as a bearer alike.
    wrong: Mutex<HashMap<std::net::IpAddr, std::collections::VecDeque<Instant>>>,
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
            wrong: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `client` gave too many wrong tokens in the last minute (forgetting older ones).
    fn too_many_wrong(&self, client: &Client) -> bool {
        let mut wrong = self.wrong.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(times) = wrong.get_mut(&client.key) else {
            return false;
        };
        while times
            .front()
            .is_some_and(|t| t.elapsed() > Duration::from_secs(60))
        {
            times.pop_front();
        }
        times.len() >= WRONG_PER_MINUTE
    }

    /// Counts a wrong token of `client`.
    fn note_wrong(&self, client: &Client) {
        let mut wrong = self.wrong.lock().unwrap_or_else(PoisonError::into_inner);
        if wrong.len() >= MAX_CLIENTS && !wrong.contains_key(&client.key) {
            let minute = Duration::from_secs(60);
            wrong.retain(|_, t| t.back().is_some_and(|t| t.elapsed() <= minute));
            if wrong.len() >= MAX_CLIENTS
                && let Some(oldest) = wrong
                    .iter()
                    .min_by_key(|(_, t)| t.back().copied())
                    .map(|(k, _)| *k)
            {
                wrong.remove(&oldest);
            }
        }
        let times = wrong.entry(client.key).or_default();
        times.push_back(Instant::now());
        if times.len() > WRONG_PER_MINUTE {
            times.pop_front();
        }
    }

    /// Checks `given` as the token for `client`, through the one throttle of every way in (`via`:
    /// the login form, or a bearer): `Throttled` without looking when the client gave too many
    /// wrong ones in the last minute; a wrong one counted and logged.
    pub fn check(&self, client: &Client, given: &str, via: &'static str) -> Checked {
        if self.too_many_wrong(client) {
            tracing::warn!(event = "panel_token_throttled", via, client = %client.key);
            return Checked::Throttled;
        }
        if self.is_token(given) {
            return Checked::Right;
        }
        self.note_wrong(client);
        tracing::warn!(event = "panel_token_refused", via, client = %client.key);
        Checked::Wrong
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

/// What a token given at a way in was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    Right,
    Wrong,
    /// Not looked at: the client gave too many wrong ones in the last minute.
    Throttled,
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

/// Whether the request may read the metrics: a session, or the token as a bearer (counted with
/// the login form's wrong tokens, per client).
pub fn may_read_metrics(panel: &Panel, headers: &HeaderMap, client: &Client) -> Checked {
    if session_id(headers).is_some_and(|id| panel.sessions.csrf_of(&id).is_some()) {
        return Checked::Right;
    }
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match bearer {
        Some(token) => panel.sessions.check(client, token, "bearer"),
        None => Checked::Wrong,
    }
}

/// The session cookie's attributes: `Secure` when the panel was reached over TLS.
fn cookie_attributes(client: &Client) -> &'static str {
    if client.tls {
        "HttpOnly; SameSite=Strict; Secure; Path=/"
    } else {
        "HttpOnly; SameSite=Strict; Path=/"
    }
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

pub async fn login(
    State(panel): State<Arc<Panel>>,
    client: Client,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    let refused = |status: StatusCode, why: &str| {
        (
            status,
            axum::response::Html(crate::view::login(Some(why)).into_string()),
        )
            .into_response()
    };
    // A form posted from another site's page (which could lock the operator out, or log them in
    // to a session of the attacker's choosing) is not looked at.
    if !crate::client::same_site(&headers) {
        tracing::warn!(event = "panel_login_cross_site", client = %client.key);
        return refused(
            StatusCode::FORBIDDEN,
            "This form was posted from another site's page.",
        );
    }
    match panel.sessions.check(&client, &form.token, "login") {
        Checked::Throttled => {
            return refused(
                StatusCode::TOO_MANY_REQUESTS,
                "Too many wrong tokens in the last minute: try again in a minute.",
            );
        }
        Checked::Wrong => {
            return refused(StatusCode::UNAUTHORIZED, "That is not the panel's token.");
        }
        Checked::Right => {}
    }
    let Some((id, _)) = panel.sessions.open() else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    tracing::info!(event = "panel_login", client = %client.key);
    (
        [(
            header::SET_COOKIE,
            format!("{COOKIE}={id}; {}", cookie_attributes(&client)),
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
        let client = |ip: &str| Client {
            key: ip.parse().unwrap(),
            tls: false,
        };
        let (guesser, operator) = (client("192.0.2.1"), client("192.0.2.2"));
        for _ in 0..WRONG_PER_MINUTE {
            assert_eq!(s.check(&guesser, "wrong", "login"), Checked::Wrong);
        }
        // Counted for the one client, at every way in; the other's right token still opens.
        assert_eq!(
            s.check(&guesser, "CNRY-panel-token-1", "bearer"),
            Checked::Throttled
        );
        assert_eq!(
            s.check(&operator, "CNRY-panel-token-1", "login"),
            Checked::Right
        );
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            format!("a=b; {COOKIE}={other}").parse().unwrap(),
        );
        assert_eq!(session_id(&headers).as_deref(), Some(other.as_str()));
    }
}
