//! Credentials: the job's token (never shown), the GitHub App's key and the JWT it signs.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};

/// The job's token: a [`Secret`](protocol::secret::Secret), never shown.
pub use protocol::secret::Secret;

/// A GitHub App's private key (the PEM file GitHub hands out: PKCS#1, or PKCS#8).
pub struct AppKey(ring::signature::RsaKeyPair);

impl fmt::Debug for AppKey {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("AppKey(***)")
    }
}

/// Why a key file cannot be used; never any of its bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("it is not a PEM file holding an RSA private key")]
    NotPem,
    #[error("its RSA key cannot sign (it is damaged, or shorter than 2048 bits)")]
    Unusable,
}

impl AppKey {
    /// Reads a PEM text: `RSA PRIVATE KEY` (PKCS#1, as GitHub gives it) or `PRIVATE KEY` (PKCS#8).
    pub fn from_pem(text: &str) -> Result<AppKey, KeyError> {
        let (label, der) = pem_body(text).ok_or(KeyError::NotPem)?;
        let pair = match label {
            "RSA PRIVATE KEY" => ring::signature::RsaKeyPair::from_der(&der),
            "PRIVATE KEY" => ring::signature::RsaKeyPair::from_pkcs8(&der),
            _ => return Err(KeyError::NotPem),
        };
        pair.map(AppKey).map_err(|_| KeyError::Unusable)
    }

    /// The public half, as PKCS#1 `RSAPublicKey` DER (what a test forge checks signatures with).
    pub fn public_der(&self) -> Vec<u8> {
        use ring::signature::KeyPair as _;
        self.0.public_key().as_ref().to_vec()
    }

    /// The App's JWT: RS256, issued by `app_id`, from a minute before `now` (clock drift) to nine
    /// minutes after it (GitHub takes ten at most).
    pub fn jwt(&self, app_id: u64, now_unix: u64) -> Result<String, KeyError> {
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"RS256","typ":"JWT"}"#);
        let claims = serde_json::json!({
            "iat": now_unix.saturating_sub(60),
            "exp": now_unix + 540,
            "iss": app_id.to_string(),
        });
        let claims = URL_SAFE_NO_PAD.encode(claims.to_string());
        let signing_input = format!("{header}.{claims}");
        let mut signature = vec![0u8; self.0.public().modulus_len()];
        let rng = ring::rand::SystemRandom::new();
        self.0
            .sign(
                &ring::signature::RSA_PKCS1_SHA256,
                &rng,
                signing_input.as_bytes(),
                &mut signature,
            )
            .map_err(|_| KeyError::Unusable)?;
        Ok(format!(
            "{signing_input}.{}",
            URL_SAFE_NO_PAD.encode(signature)
        ))
    }
}

/// The label and the bytes of the first PEM block.
fn pem_body(text: &str) -> Option<(&str, Vec<u8>)> {
    let start = text.find("-----BEGIN ")?;
    let rest = &text[start + "-----BEGIN ".len()..];
    let (label, rest) = rest.split_once("-----")?;
    let end = rest.find(&format!("-----END {label}-----"))?;
    let body: String = rest[..end].split_whitespace().collect();
    Some((label, STANDARD.decode(body).ok()?))
}

/// `Basic` credentials for git over HTTPS: `user:token`, as the forges take a token.
pub fn basic_auth(user: &str, token: &Secret) -> String {
    format!(
        "Basic {}",
        STANDARD.encode(format!("{user}:{}", token.expose()))
    )
}
