//! Whether a delivery comes from the forge: GitHub signs the raw body with the webhook's secret
//! (`X-Hub-Signature-256: sha256=<hex of HMAC-SHA256>`); GitLab sends the webhook's secret token
//! itself (`X-Gitlab-Token`). Both are compared in constant time, over the bytes as they arrived.

use hmac::{KeyInit, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The prefix of GitHub's signature header.
const SHA256_PREFIX: &str = "sha256=";

/// Whether `header` (the value of `X-Hub-Signature-256`) is the signature of `body` under
/// `secret`. A header that is not `sha256=` and 64 hex digits is no signature.
pub fn github_signature_ok(secret: &[u8], body: &[u8], header: &str) -> bool {
    let Some(hex) = header.strip_prefix(SHA256_PREFIX) else {
        return false;
    };
    let Some(given) = decode_hex(hex) else {
        return false;
    };
    let Ok(mut mac) = hmac::Hmac::<Sha256>::new_from_slice(secret) else {
        return false;
    };
    mac.update(body);
    // `verify_slice` compares in constant time.
    mac.verify_slice(&given).is_ok()
}

/// The `X-Hub-Signature-256` value for `body` under `secret` (for tests and the load bench).
pub fn github_signature(secret: &[u8], body: &[u8]) -> String {
    let Ok(mut mac) = hmac::Hmac::<Sha256>::new_from_slice(secret) else {
        return String::new();
    };
    mac.update(body);
    format!(
        "{SHA256_PREFIX}{}",
        protocol::ids::hex(mac.finalize().into_bytes())
    )
}

/// Whether `given` (the value of `X-Gitlab-Token`) is `secret`. Both are hashed first, so the
/// comparison takes the same time whatever their lengths.
pub fn gitlab_token_ok(secret: &[u8], given: &[u8]) -> bool {
    let a = Sha256::digest(secret);
    let b = Sha256::digest(given);
    bool::from(a.as_slice().ct_eq(b.as_slice()))
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if text.len() != 64 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    text.as_bytes()
        .chunks(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn github_signatures_are_checked_over_the_raw_body() {
        // The example of GitHub's documentation on validating deliveries.
        let secret = b"It's a Secret to Everybody";
        let body = b"Hello, World!";
        let expected = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        assert_eq!(github_signature(secret, body), expected);
        assert!(github_signature_ok(secret, body, expected));
        assert!(github_signature_ok(
            secret,
            body,
            &expected
                .to_ascii_uppercase()
                .replacen("SHA256=", "sha256=", 1)
        ));
        // Another body, another secret, a cut or bent header: no.
        assert!(!github_signature_ok(secret, b"Hello, World!\n", expected));
        assert!(!github_signature_ok(b"another", body, expected));
        assert!(!github_signature_ok(secret, body, &expected[..70]));
        assert!(!github_signature_ok(
            secret,
            body,
            &expected.replacen("sha256=", "sha1=", 1)
        ));
        assert!(!github_signature_ok(
            secret,
            body,
            &expected.replacen('7', "g", 1)
        ));
        assert!(!github_signature_ok(secret, body, ""));
    }

    #[test]
    fn gitlab_tokens_must_be_the_same_bytes() {
        assert!(gitlab_token_ok(b"s3cret", b"s3cret"));
        assert!(!gitlab_token_ok(b"s3cret", b"s3cret "));
        assert!(!gitlab_token_ok(b"s3cret", b"S3cret"));
        assert!(!gitlab_token_ok(b"s3cret", b""));
    }
}
