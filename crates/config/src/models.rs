//! pi's `models.json`, as far as pi-dispatch must judge it: the overlay's copy is read by every job, so
//! it may not hold a credential, and the variables it references are the job's own spending
//! credentials (which no MCP server may reference).
//!
//! pi (1.6) sends an `apiKey` or header value literally unless it is written `$NAME`/`${NAME}`, and runs
//! a value starting with `!` as a shell command. So an `apiKey` is accepted only as exactly one
//! reference, a credential-like header only as a reference (optionally after an auth scheme), and no
//! `!` command anywhere.

use std::collections::BTreeSet;

use crate::json::{self, Json, JsonError, Object};
use crate::mcp::AuthScheme;
use crate::prices::{Prices, Tier};
use crate::problem::printable_key;

/// One reason the file may not be staged. The message names the place, never the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {why}")]
pub struct ModelsProblem {
    pub field: String,
    pub why: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelsError {
    #[error("models.json is not UTF-8 text")]
    NotUtf8,
    #[error(
        "models.json is {0} (pi-dispatch reads it as plain JSON: no comments or trailing commas)"
    )]
    Json(JsonError),
    #[error("models.json must be an object whose 'providers' is an object")]
    Shape,
    #[error("models.json holds a credential or a command: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Refused(Vec<ModelsProblem>),
}

/// What pi-dispatch needs to know of an accepted `models.json`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Models {
    pub providers: Vec<String>,
    /// Every variable the file references (`$NAME` or `${NAME}` in an `apiKey` or header value).
    pub references: BTreeSet<String>,
    /// Every `baseUrl` written, provider- or model-level, as written.
    pub base_urls: Vec<String>,
    /// What the file says of each provider, in file order (one entry per name in `providers`).
    pub entries: Vec<ProviderEntry>,
}

/// One provider of `models.json`: enough to tell whether a job's model exists and where its key is.
///
/// pi (1.6) treats a name that is a built-in provider's as a change to that provider: its built-in
/// models stay (with `baseUrl`, when written, in front of them) and each `models` entry adds a model
/// or replaces the built-in one of the same id. Any other name is a new provider whose models are
/// exactly its `models` entries.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ProviderEntry {
    pub name: String,
    /// The variable `apiKey` references (`$NAME` or `${NAME}`), when `apiKey` is written.
    pub api_key_variable: Option<String>,
    /// The provider's `baseUrl`, when written.
    pub base_url: Option<String>,
    /// The provider's `api` (its models' wire format), when written.
    pub api: Option<String>,
    /// The `models` entries that have an `id`, in file order.
    pub models: Vec<ModelEntry>,
    /// The `modelOverrides` entries, in file order (pi applies them to chat models only).
    pub overrides: Vec<ModelOverride>,
}

/// One entry of a provider's `models` array.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ModelEntry {
    pub id: String,
    /// The model's own `baseUrl`, when written (it overrides the provider's).
    pub base_url: Option<String>,
    /// The model's own `api`, when written.
    pub api: Option<String>,
    /// `cost`, when written (a price it leaves out counts as 0, as in pi-ai).
    pub cost: Option<Prices>,
    /// `cost.tiers`.
    pub tiers: Vec<Tier>,
    /// `maxTokens`, when written.
    pub max_tokens: Option<u64>,
}

/// One entry of `modelOverrides`: the fields that change what a call of the model may cost.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ModelOverride {
    pub id: String,
    /// Each price of `cost` it writes (pi merges them field by field).
    pub input: Option<f64>,
    pub output: Option<f64>,
    pub cache_read: Option<f64>,
    pub cache_write: Option<f64>,
    /// `cost.tiers`, when written (it replaces the model's).
    pub tiers: Option<Vec<Tier>>,
    pub max_tokens: Option<u64>,
}

impl Models {
    /// What the file says of the provider `name`, when it names it.
    pub fn entry(&self, name: &str) -> Option<&ProviderEntry> {
        self.entries.iter().find(|e| e.name == name)
    }
}

const LITERAL_KEY: &str =
    "the key is written in the file: write it as $NAME (a variable the job is given) instead";
const COMMAND: &str = "a value starting with '!' is a command pi would run in every job: pass the value through a variable and write $NAME";
const LITERAL_HEADER: &str = "this header carries a credential written in the file: write $NAME, or a scheme, one space and $NAME";

/// Checks the bytes of a `models.json`.
pub fn check(bytes: &[u8]) -> Result<Models, ModelsError> {
    let text = std::str::from_utf8(bytes).map_err(|_| ModelsError::NotUtf8)?;
    let root = json::parse(text).map_err(ModelsError::Json)?;
    let providers = root
        .as_object()
        .and_then(|o| o.get("providers"))
        .and_then(Json::as_object)
        .ok_or(ModelsError::Shape)?;
    let mut models = Models::default();
    let mut problems = Vec::new();
    for (name, provider) in providers.iter() {
        let at = format!(
            "providers.{}",
            printable_key(name).unwrap_or("(a provider)")
        );
        models.providers.push(name.to_owned());
        let mut entry = ProviderEntry {
            name: name.to_owned(),
            ..ProviderEntry::default()
        };
        let Some(provider) = provider.as_object() else {
            models.entries.push(entry);
            continue;
        };
        if let Some(key) = provider.get("apiKey") {
            entry.api_key_variable =
                check_api_key(key, &format!("{at}.apiKey"), &mut models, &mut problems);
        }
        entry.base_url = string(provider, "baseUrl");
        entry.api = string(provider, "api");
        entry.models = model_entries(provider);
        entry.overrides = model_overrides(provider);
        models.entries.push(entry);
        check_headers(
            provider.get("headers"),
            &format!("{at}.headers"),
            &mut models,
            &mut problems,
        );
        check_base_url(provider, &at, &mut models, &mut problems);
        for (list, label) in [("models", "models"), ("modelOverrides", "modelOverrides")] {
            for (i, model) in entries(provider.get(list)) {
                let at = format!("{at}.{label}[{i}]");
                check_headers(
                    model.get("headers"),
                    &format!("{at}.headers"),
                    &mut models,
                    &mut problems,
                );
                check_base_url(model, &at, &mut models, &mut problems);
            }
        }
    }
    if problems.is_empty() {
        Ok(models)
    } else {
        Err(ModelsError::Refused(problems))
    }
}

fn string(object: &Object, key: &str) -> Option<String> {
    object.get(key).and_then(Json::as_str).map(str::to_owned)
}

/// The entries of a provider's `models` array that have a non-empty string `id` (pi's schema
/// requires one).
fn model_entries(provider: &Object) -> Vec<ModelEntry> {
    let Some(Json::Array(items)) = provider.get("models") else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(Json::as_object)
        .filter_map(|model| {
            let id = string(model, "id").filter(|id| !id.is_empty())?;
            let cost = model.get("cost").and_then(Json::as_object);
            Some(ModelEntry {
                id,
                base_url: string(model, "baseUrl"),
                api: string(model, "api"),
                cost: cost.map(|c| Prices {
                    input: price(c, "input").unwrap_or(0.0),
                    output: price(c, "output").unwrap_or(0.0),
                    cache_read: price(c, "cacheRead").unwrap_or(0.0),
                    cache_write: price(c, "cacheWrite").unwrap_or(0.0),
                }),
                tiers: cost.and_then(tiers).unwrap_or_default(),
                max_tokens: count(model, "maxTokens"),
            })
        })
        .collect()
}

/// The `modelOverrides` entries (an object keyed by model id).
fn model_overrides(provider: &Object) -> Vec<ModelOverride> {
    let Some(Json::Object(items)) = provider.get("modelOverrides") else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|(id, o)| {
            let o = o.as_object()?;
            let cost = o.get("cost").and_then(Json::as_object);
            Some(ModelOverride {
                id: id.to_owned(),
                input: cost.and_then(|c| price(c, "input")),
                output: cost.and_then(|c| price(c, "output")),
                cache_read: cost.and_then(|c| price(c, "cacheRead")),
                cache_write: cost.and_then(|c| price(c, "cacheWrite")),
                tiers: cost.and_then(tiers),
                max_tokens: count(o, "maxTokens"),
            })
        })
        .collect()
}

fn number(value: &Json) -> Option<f64> {
    match value {
        Json::Number(n) => n.as_f64().filter(|f| f.is_finite()),
        _ => None,
    }
}

/// A price of a `cost` object, in USD per million tokens.
fn price(cost: &Object, key: &str) -> Option<f64> {
    cost.get(key).and_then(number)
}

fn count(object: &Object, key: &str) -> Option<u64> {
    match object.get(key) {
        Some(Json::Number(n)) => n.as_u64(),
        _ => None,
    }
}

/// `cost.tiers`: each `{inputTokensAbove, input, output, cacheRead, cacheWrite}`.
fn tiers(cost: &Object) -> Option<Vec<Tier>> {
    let Some(Json::Array(items)) = cost.get("tiers") else {
        return None;
    };
    Some(
        items
            .iter()
            .filter_map(Json::as_object)
            .filter_map(|t| {
                Some(Tier {
                    above: count(t, "inputTokensAbove")?,
                    prices: Prices {
                        input: price(t, "input").unwrap_or(0.0),
                        output: price(t, "output").unwrap_or(0.0),
                        cache_read: price(t, "cacheRead").unwrap_or(0.0),
                        cache_write: price(t, "cacheWrite").unwrap_or(0.0),
                    },
                })
            })
            .collect(),
    )
}

/// The objects of a `models` array or a `modelOverrides` object, numbered.
fn entries(value: Option<&Json>) -> Vec<(usize, &Object)> {
    match value {
        Some(Json::Array(items)) => items
            .iter()
            .enumerate()
            .filter_map(|(i, m)| m.as_object().map(|o| (i, o)))
            .collect(),
        Some(Json::Object(o)) => o
            .iter()
            .enumerate()
            .filter_map(|(i, (_, m))| m.as_object().map(|o| (i, o)))
            .collect(),
        _ => Vec::new(),
    }
}

fn check_base_url(
    object: &Object,
    at: &str,
    models: &mut Models,
    problems: &mut Vec<ModelsProblem>,
) {
    let Some(url) = object.get("baseUrl").and_then(Json::as_str) else {
        return;
    };
    if let Some(why) = base_url_problem(url) {
        problems.push(ModelsProblem {
            field: format!("{at}.baseUrl"),
            why,
        });
        return;
    }
    models.references.extend(references_in(url));
    models.base_urls.push(url.to_owned());
}

/// Checks an `apiKey`; gives the variable it references when it is accepted.
fn check_api_key(
    value: &Json,
    field: &str,
    models: &mut Models,
    problems: &mut Vec<ModelsProblem>,
) -> Option<String> {
    let text = value.as_str()?;
    if text.starts_with('!') {
        problems.push(ModelsProblem {
            field: field.to_owned(),
            why: COMMAND,
        });
    } else if let Some(name) = whole_reference(text) {
        models.references.insert(name.to_owned());
        return Some(name.to_owned());
    } else {
        problems.push(ModelsProblem {
            field: field.to_owned(),
            why: LITERAL_KEY,
        });
    }
    None
}

fn check_headers(
    value: Option<&Json>,
    at: &str,
    models: &mut Models,
    problems: &mut Vec<ModelsProblem>,
) {
    let Some(Json::Object(headers)) = value else {
        return;
    };
    for (name, value) in headers.iter() {
        let Some(text) = value.as_str() else {
            continue;
        };
        let field = match printable_key(name) {
            Some(n) => format!("{at}.{n}"),
            None => at.to_owned(),
        };
        if text.starts_with('!') {
            problems.push(ModelsProblem {
                field,
                why: COMMAND,
            });
            continue;
        }
        let refs = references_in(text);
        if is_credential_header(name) && !is_credential_reference(text) {
            problems.push(ModelsProblem {
                field,
                why: LITERAL_HEADER,
            });
            continue;
        }
        models.references.extend(refs);
    }
}

/// `$NAME`, `${NAME}`, or one of the overlay's auth schemes, one space and such a reference.
fn is_credential_reference(text: &str) -> bool {
    whole_reference(text).is_some()
        || text.split_once(' ').is_some_and(|(scheme, rest)| {
            AuthScheme::ALL.iter().any(|s| s.as_str() == scheme) && whole_reference(rest).is_some()
        })
}

/// What is wrong with a `baseUrl` that carries a credential: a user name or password, a query
/// value that is not a reference, or a fragment.
fn base_url_problem(url: &str) -> Option<&'static str> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    if rest[..authority_end].contains('@') {
        return Some(
            "the baseUrl holds a user name or password: put the credential in apiKey or a header as $NAME",
        );
    }
    if url.contains('#') {
        return Some("the baseUrl has a fragment ('#...'), which may hold a credential");
    }
    if let Some((_, query)) = url.split_once('?') {
        let literal = query.split('&').any(|param| match param.split_once('=') {
            Some((_, value)) => whole_reference(value).is_none(),
            None => true,
        });
        if literal {
            return Some(
                "the baseUrl's query has a value that is not a reference: write each value as $NAME",
            );
        }
    }
    None
}

/// Header names that carry a credential: the usual ones, and any name that speaks of a key, token,
/// secret, password, session, signature or credential.
fn is_credential_header(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    ["authorization", "cookie", "auth"].contains(&lower.as_str())
        || [
            "key",
            "token",
            "secret",
            "passw",
            "session",
            "signature",
            "credential",
            "auth",
        ]
        .iter()
        .any(|w| lower.contains(w))
}

/// `$NAME` or `${NAME}` as the whole value, with pi's name rule (a letter or `_`, then letters,
/// digits and `_`).
fn whole_reference(text: &str) -> Option<&str> {
    let name = text
        .strip_prefix("${")
        .and_then(|t| t.strip_suffix('}'))
        .or_else(|| text.strip_prefix('$'))?;
    is_pi_name(name).then_some(name)
}

fn is_pi_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The names of every `$NAME` and `${NAME}` in `text`, skipping the `$$` escape.
fn references_in(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        let after = &rest[i + 1..];
        if let Some(stripped) = after.strip_prefix('$') {
            rest = stripped;
            continue;
        }
        if let Some(inner) = after.strip_prefix('{')
            && let Some(end) = inner.find('}')
        {
            if is_pi_name(&inner[..end]) {
                names.push(inner[..end].to_owned());
            }
            rest = &inner[end + 1..];
            continue;
        }
        let len = after
            .bytes()
            .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_')
            .count();
        if len > 0 && is_pi_name(&after[..len]) {
            names.push(after[..len].to_owned());
        }
        rest = &after[len..];
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused_fields(text: &str) -> Vec<String> {
        match check(text.as_bytes()) {
            Err(ModelsError::Refused(p)) => p.into_iter().map(|p| p.field).collect(),
            other => panic!("{text}: {other:?}"),
        }
    }

    #[test]
    fn accepts_references_and_collects_them() {
        let m = check(
            br#"{"providers": {
                "fake": {"baseUrl": "http://127.0.0.1:9/v1", "api": "openai-completions", "apiKey": "$FAKE_KEY",
                         "headers": {"Authorization": "Bearer ${FAKE_TOKEN}", "X-Title": "pi-dispatch"},
                         "models": [{"id": "m", "baseUrl": "https://llm.example.com/v1", "headers": {"X-Api-Key": "${K2}"}}]},
                "openai": {"modelOverrides": {"gpt": {"headers": {"Cookie": "$C"}}}}
            }}"#,
        )
        .unwrap();
        assert_eq!(m.providers, ["fake", "openai"]);
        assert_eq!(
            m.references.iter().map(String::as_str).collect::<Vec<_>>(),
            ["C", "FAKE_KEY", "FAKE_TOKEN", "K2"]
        );
        assert_eq!(
            m.base_urls,
            ["http://127.0.0.1:9/v1", "https://llm.example.com/v1"]
        );
    }

    #[test]
    fn tells_each_providers_key_variable_base_url_and_models() {
        let m = check(
            br#"{"providers": {
                "anthropic": {"baseUrl": "https://proxy.example.com/v1"},
                "local": {"baseUrl": "http://127.0.0.1:9/v1", "api": "openai-completions", "apiKey": "${LOCAL_KEY}",
                          "models": [{"id": "a"}, {"id": "b", "baseUrl": "http://127.0.0.1:10/v1"},
                                     {"name": "no id"}, {"id": ""}, {"id": 7}, "c"]},
                "openai": {"apiKey": "$OPENAI_KEY_2", "modelOverrides": {"gpt-x": {"name": "X"}}},
                "odd": 1
            }}"#,
        )
        .unwrap();
        let entry =
            |name: &str, key: Option<&str>, url: Option<&str>, models: &[(&str, Option<&str>)]| {
                ProviderEntry {
                    name: name.to_owned(),
                    api_key_variable: key.map(str::to_owned),
                    base_url: url.map(str::to_owned),
                    models: models
                        .iter()
                        .map(|(id, url)| ModelEntry {
                            id: (*id).to_owned(),
                            base_url: url.map(str::to_owned),
                            ..ModelEntry::default()
                        })
                        .collect(),
                    ..ProviderEntry::default()
                }
            };
        assert_eq!(
            m.entries,
            [
                entry("anthropic", None, Some("https://proxy.example.com/v1"), &[]),
                ProviderEntry {
                    api: Some("openai-completions".into()),
                    ..entry(
                        "local",
                        Some("LOCAL_KEY"),
                        Some("http://127.0.0.1:9/v1"),
                        &[("a", None), ("b", Some("http://127.0.0.1:10/v1"))]
                    )
                },
                ProviderEntry {
                    overrides: vec![ModelOverride {
                        id: "gpt-x".into(),
                        ..ModelOverride::default()
                    }],
                    ..entry("openai", Some("OPENAI_KEY_2"), None, &[])
                },
                entry("odd", None, None, &[]),
            ]
        );
        assert_eq!(m.entry("openai"), Some(&m.entries[2]));
        assert_eq!(m.entry("missing"), None);
        // What was there before stays.
        assert_eq!(m.providers, ["anthropic", "local", "openai", "odd"]);
    }

    #[test]
    fn reads_what_a_call_may_cost() {
        let m = check(
            br#"{"providers": {
                "local": {"baseUrl": "http://127.0.0.1:9/v1", "api": "anthropic-messages", "models": [
                    {"id": "a", "api": "openai-completions", "maxTokens": 2048,
                     "cost": {"input": 1, "output": 4.5, "cacheRead": 0.1, "cacheWrite": 1.25,
                              "tiers": [{"inputTokensAbove": 200000, "input": 2, "output": 9, "cacheRead": 0.2, "cacheWrite": 2.5}]}},
                    {"id": "b", "cost": {"output": 3}}]},
                "openai": {"modelOverrides": {"gpt-x": {"cost": {"output": 12}, "maxTokens": 100}}}
            }}"#,
        )
        .unwrap();
        let local = m.entry("local").unwrap();
        assert_eq!(local.api.as_deref(), Some("anthropic-messages"));
        let a = &local.models[0];
        assert_eq!(a.api.as_deref(), Some("openai-completions"));
        assert_eq!(a.max_tokens, Some(2048));
        assert_eq!(
            a.cost,
            Some(Prices {
                input: 1.0,
                output: 4.5,
                cache_read: 0.1,
                cache_write: 1.25
            })
        );
        assert_eq!(a.tiers.len(), 1);
        assert_eq!(a.tiers[0].above, 200_000);
        assert_eq!(a.tiers[0].prices.output, 9.0);
        // A price left out is 0, as pi-ai counts it.
        assert_eq!(local.models[1].cost.unwrap().input, 0.0);
        assert_eq!(local.models[1].max_tokens, None);
        let over = &m.entry("openai").unwrap().overrides[0];
        assert_eq!(
            (over.id.as_str(), over.output, over.input, over.max_tokens),
            ("gpt-x", Some(12.0), None, Some(100))
        );
    }

    #[test]
    fn refuses_a_literal_key_or_command() {
        for key in [
            "sk-cnry",
            "OPENAI_API_KEY",
            "dummy",
            "$",
            "${A",
            "x$A",
            "$A x",
            "!op read cnry",
        ] {
            let text = format!(r#"{{"providers": {{"p": {{"apiKey": "{key}"}}}}}}"#);
            assert_eq!(refused_fields(&text), ["providers.p.apiKey"], "{key}");
        }
    }

    #[test]
    fn refuses_literal_credential_headers_anywhere() {
        let text = r#"{"providers": {"p": {
            "headers": {"Authorization": "Bearer cnry", "X-Title": "fine", "x-goog-api-key": "cnry"},
            "models": [{"id": "a"}, {"id": "b", "headers": {"X-Session-Id": "cnry", "X-Other": "!cmd"}}],
            "modelOverrides": {"m": {"headers": {"Cookie": "cnry"}}}
        }}}"#;
        assert_eq!(
            refused_fields(text),
            [
                "providers.p.headers.Authorization",
                "providers.p.headers.x-goog-api-key",
                "providers.p.models[1].headers.X-Session-Id",
                "providers.p.models[1].headers.X-Other",
                "providers.p.modelOverrides[0].headers.Cookie",
            ]
        );
        let err = check(text.as_bytes()).unwrap_err().to_string();
        assert!(!err.contains("cnry") && !err.contains("cmd"), "{err}");
    }

    #[test]
    fn a_credential_header_takes_only_a_known_scheme_before_its_reference() {
        for ok in [
            "$T",
            "${T}",
            "Bearer $T",
            "Bearer ${T}",
            "ApiKey ${T}",
            "Token $T",
        ] {
            let text =
                format!(r#"{{"providers": {{"p": {{"headers": {{"Authorization": "{ok}"}}}}}}}}"#);
            assert!(check(text.as_bytes()).is_ok(), "{ok}");
        }
        for bad in [
            "cnry-1 ${X}",
            "cnry-2 $X",
            "session=cnry-3; $X",
            "bearer $T",
            "Bearer  $T",
        ] {
            let text =
                format!(r#"{{"providers": {{"p": {{"headers": {{"X-Api-Key": "{bad}"}}}}}}}}"#);
            assert_eq!(
                refused_fields(&text),
                ["providers.p.headers.X-Api-Key"],
                "{bad}"
            );
        }
    }

    #[test]
    fn a_base_url_may_not_carry_a_credential() {
        for bad in [
            "https://user:cnry@llm.example.com/v1",
            "https://llm.example.com/v1?key=cnry",
            "https://llm.example.com/v1?cnry",
            "https://llm.example.com/v1#cnry",
        ] {
            let text = format!(
                r#"{{"providers": {{"p": {{"baseUrl": "{bad}", "models": [{{"id": "m", "baseUrl": "{bad}"}}]}}}}}}"#
            );
            assert_eq!(
                refused_fields(&text),
                ["providers.p.baseUrl", "providers.p.models[0].baseUrl"],
                "{bad}"
            );
            assert!(
                !check(text.as_bytes())
                    .unwrap_err()
                    .to_string()
                    .contains("cnry")
            );
        }
        let m = check(
            br#"{"providers": {"p": {"baseUrl": "https://llm.example.com/v1?key=$LLM_KEY"}}}"#,
        )
        .unwrap();
        assert!(m.references.contains("LLM_KEY"));
    }

    #[test]
    fn refuses_what_cannot_be_read_whole() {
        assert!(matches!(
            check(b"{\"providers\": {},}"),
            Err(ModelsError::Json(_))
        ));
        assert!(matches!(
            check(br#"{"providers": {"p": {"apiKey": "$A", "apiKey": "cnry"}}}"#),
            Err(ModelsError::Json(JsonError::DuplicateKey { .. }))
        ));
        assert!(matches!(check(b"[]"), Err(ModelsError::Shape)));
        assert!(matches!(check(b"{}"), Err(ModelsError::Shape)));
    }

    #[test]
    fn finds_references_inside_text() {
        assert_eq!(
            references_in("a $A b ${B_1} $$C $ ${bad-name} $9"),
            ["A", "B_1"]
        );
    }
}
