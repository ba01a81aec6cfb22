//! The model gateway's reading of a request from pi or a child (crates/hub gateway.rs and
//! crates/config worst_case.rs, model_rules.rs): a line with the path, a line with `Host`, a line
//! with `Origin` (empty: none), then the body.
//!
//! - a route read is written back to the same route;
//! - a request is taken from loopback only when its `Host` names loopback;
//! - the worst case of a body is bounded from below by its size, a body with a key written twice
//!   has none, and what leaves it unbounded is named as a field, never a planted value;
//! - under a cap the bound held is a finite cost within the cap, or the call is refused with a
//!   cause that never repeats the request.
#![no_main]

use config::catalog::ModelKind;
use config::model_rules::{Model, RequestFacts, Rules};
use config::prices::Prices;
use config::wire_format::Api;
use libfuzzer_sys::fuzz_target;

const CANARY: &str = "CANARY";
const ALL: [Api; 6] = [
    Api::OpenAiCompletions,
    Api::OpenAiResponses,
    Api::AnthropicMessages,
    Api::OpenAiDecisions,
    Api::SystemOne,
    Api::OpenRouterImages,
];

fn model(kind: ModelKind) -> Model {
    Model {
        provider: "anthropic".into(),
        id: "claude-x".into(),
        kind,
        api: "anthropic-messages".into(),
        base_url: "https://api.anthropic.com".into(),
        cost: Prices {
            input: 3.0,
            output: 15.0,
            cache_read: 0.3,
            cache_write: 3.75,
        },
        tiers: Vec::new(),
        max_tokens: Some(64_000),
    }
}

fn line<'a>(rest: &mut &'a [u8]) -> &'a [u8] {
    let end = rest.iter().position(|b| *b == b'\n').unwrap_or(rest.len());
    let line = &rest[..end];
    *rest = rest.get(end + 1..).unwrap_or_default();
    line
}

/// Whether no key of the body holds the canary.
fn in_values_only(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::Object(o) => o
            .iter()
            .all(|(k, v)| !k.contains(CANARY) && in_values_only(v)),
        serde_json::Value::Array(items) => items.iter().all(in_values_only),
        _ => true,
    }
}

fn routes(path: &str) -> &'static [Api] {
    let Some((pi, index, rest)) = hub::fuzz::gateway_route(path) else {
        return &[];
    };
    let written = format!("/{}/{index}{rest}", if pi { "p" } else { "c" });
    assert_eq!(hub::fuzz::gateway_route(&written), Some((pi, index, rest)));
    Api::for_path(rest)
}

fn loopback(host: &[u8], origin: &[u8]) {
    let origin = (!origin.is_empty()).then_some(origin);
    if hub::fuzz::gateway_loopback(Some(host), origin) {
        let host = String::from_utf8_lossy(host).to_ascii_lowercase();
        let name = match host.rsplit_once(':') {
            Some((name, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
                name
            }
            _ => host.as_str(),
        };
        assert!(
            ["localhost", "127.0.0.1", "[::1]", "::1"].contains(&name),
            "{host:?}"
        );
    }
    assert!(
        !hub::fuzz::gateway_loopback(None, origin),
        "no Host taken as loopback"
    );
}

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    let path = String::from_utf8_lossy(line(&mut rest)).into_owned();
    let (host, origin) = (line(&mut rest), line(&mut rest));
    let body = rest;
    loopback(host, origin);
    let apis = match routes(&path) {
        [] => &ALL[..],
        some => some,
    };
    let json: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let _ = RequestFacts::read(&json);
    let values_only = in_values_only(&json);
    let strict = std::str::from_utf8(body).is_ok_and(|t| protocol::json::parse(t).is_ok());
    let rules = Rules::new(None, Some(1.0)).unwrap();
    for &api in apis {
        let worst = hub::fuzz::gateway_worst_case(body, api);
        match &worst {
            Ok(w) => {
                assert!(strict, "a body that is not strict JSON has a bound");
                assert!(w.input >= body.len() as u64 && w.choices >= 1);
            }
            Err(u) => assert!(!values_only || !u.field.contains(CANARY), "{:?}", u.field),
        }
        for kind in [ModelKind::Chat, ModelKind::Classifier, ModelKind::Image] {
            match rules.bound(&model(kind), worst.clone(), 0.25) {
                Ok(bound) => {
                    assert!(bound.usd.is_finite() && bound.usd >= 0.0 && bound.usd + 0.25 <= 1.0);
                }
                Err(refusal) => {
                    assert!(
                        !values_only || !refusal.cause.contains(CANARY),
                        "{:?}",
                        refusal.cause
                    );
                }
            }
        }
    }
});
