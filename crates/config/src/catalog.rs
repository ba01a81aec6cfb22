//! The pinned pi's built-in providers and models, and the lookup that tells, before a job starts,
//! whether its provider and model exist and which variables pi reads for the key. Every model of
//! every type also carries its wire format, base URL, prices and largest output, for the job's
//! model gateway.
//!
//! `pi-catalog.json` is printed by `scripts/pi-catalog.mjs` from the installed
//! `@earendil-works/pi-ai` (a test checks that it still is); docs/pi-facts.md says how to
//! regenerate it. It is read here once, with the strict JSON reader.

use std::sync::OnceLock;

use crate::json::{self, Json, JsonError, Object};
use crate::models::Models;

const EMBEDDED: &str = include_str!("pi-catalog.json");

/// One built-in provider of the pinned pi.
#[derive(Debug, Clone, PartialEq)]
pub struct Provider {
    pub id: String,
    /// The variables pi's key resolver for this provider reads, in the order it tries them (empty
    /// when the key cannot come from the environment, as for an OAuth-only provider). Some count
    /// only together (an access key id with its secret, an account id with its key).
    pub key_variables: Vec<String>,
    /// The variables the resolver still reads when `models.json` gives the key (an account id).
    pub with_configured_key: Vec<String>,
    /// The ids of its chat models (the ones `--model` selects), sorted.
    pub models: Vec<String>,
    /// The wire formats and base URLs its models use, as `entries` index them.
    pub endpoints: Vec<Endpoint>,
    /// Every model of every type (chat, classifier, image), sorted by type and id.
    pub entries: Vec<Entry>,
}

impl Provider {
    /// The model of this type and id.
    pub fn entry(&self, kind: ModelKind, id: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.kind == kind && e.id == id)
    }

    /// Where `entry` is served: its wire format and base URL.
    pub fn endpoint_of(&self, entry: &Entry) -> Option<&Endpoint> {
        self.endpoints.get(entry.endpoint)
    }
}

/// A wire format (pi-ai's `api`, such as `openai-completions`) at a base URL (empty when pi
/// builds it from the environment, as for Azure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub api: String,
    pub base_url: String,
}

/// What a model is for: chat (`--model`), or one of the kinds only codemode reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ModelKind {
    Chat,
    Classifier,
    Image,
}

impl ModelKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ModelKind::Chat => "chat",
            ModelKind::Classifier => "classifier",
            ModelKind::Image => "image",
        }
    }

    fn parse(text: &str) -> Option<ModelKind> {
        match text {
            "chat" => Some(ModelKind::Chat),
            "classifier" => Some(ModelKind::Classifier),
            "image" => Some(ModelKind::Image),
            _ => None,
        }
    }
}

pub use crate::prices::{Prices, Tier};

/// One model of a provider.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub id: String,
    pub kind: ModelKind,
    /// An index into the provider's `endpoints`.
    pub endpoint: usize,
    pub cost: Prices,
    pub tiers: Vec<Tier>,
    /// The largest output in tokens, when pi-ai gives one.
    pub max_tokens: Option<u64>,
}

/// The catalog as the generator prints it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Catalog {
    /// The version of `@earendil-works/pi-ai` it was read from (pi's own version: they are released
    /// together).
    pub pi_ai: String,
    pub providers: Vec<Provider>,
}

impl Catalog {
    pub fn provider(&self, id: &str) -> Option<&Provider> {
        self.providers.iter().find(|p| p.id == id)
    }
}

/// Why a catalog text is refused. Names the field, never the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    #[error("the catalog is {0}")]
    Json(JsonError),
    #[error("the catalog's {0} is missing or not what the generator writes")]
    Shape(String),
    #[error("the catalog names a provider twice")]
    DuplicateProvider,
}

/// Reads a catalog in the generator's shape; any other key or type is refused.
pub fn parse(text: &str) -> Result<Catalog, CatalogError> {
    let root = json::parse(text).map_err(CatalogError::Json)?;
    let root = exact_object(&root, &["pi_ai", "providers"], "top level")?;
    let pi_ai = string(root, "pi_ai", "pi_ai")?;
    let Some(Json::Array(items)) = root.get("providers") else {
        return Err(shape("providers"));
    };
    let mut providers: Vec<Provider> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("providers[{i}]");
        let fields = [
            "id",
            "key_variables",
            "with_configured_key",
            "models",
            "endpoints",
            "entries",
        ];
        let object = exact_object(item, &fields, &at)?;
        let endpoints = endpoints(object, &at)?;
        let provider = Provider {
            id: string(object, "id", &format!("{at}.id"))?,
            key_variables: strings(object, "key_variables", &at)?,
            with_configured_key: strings(object, "with_configured_key", &at)?,
            models: strings(object, "models", &at)?,
            entries: entries(object, endpoints.len(), &at)?,
            endpoints,
        };
        if providers.iter().any(|p| p.id == provider.id) {
            return Err(CatalogError::DuplicateProvider);
        }
        providers.push(provider);
    }
    Ok(Catalog { pi_ai, providers })
}

fn shape(field: &str) -> CatalogError {
    CatalogError::Shape(field.to_owned())
}

fn exact_object<'a>(value: &'a Json, keys: &[&str], at: &str) -> Result<&'a Object, CatalogError> {
    value
        .as_object()
        .filter(|o| o.len() == keys.len() && keys.iter().all(|k| o.get(k).is_some()))
        .ok_or_else(|| shape(at))
}

fn string(object: &Object, key: &str, at: &str) -> Result<String, CatalogError> {
    object
        .get(key)
        .and_then(Json::as_str)
        .map(str::to_owned)
        .ok_or_else(|| shape(at))
}

fn strings(object: &Object, key: &str, at: &str) -> Result<Vec<String>, CatalogError> {
    let Some(Json::Array(items)) = object.get(key) else {
        return Err(shape(&format!("{at}.{key}")));
    };
    items
        .iter()
        .map(|item| {
            item.as_str()
                .map(str::to_owned)
                .ok_or_else(|| shape(&format!("{at}.{key}")))
        })
        .collect()
}

fn array<'a>(value: Option<&'a Json>, at: &str) -> Result<&'a [Json], CatalogError> {
    match value {
        Some(Json::Array(items)) => Ok(items),
        _ => Err(shape(at)),
    }
}

fn number(value: &Json, at: &str) -> Result<f64, CatalogError> {
    match value {
        Json::Number(n) => n
            .as_f64()
            .filter(|f| f.is_finite())
            .ok_or_else(|| shape(at)),
        _ => Err(shape(at)),
    }
}

fn count(value: &Json, at: &str) -> Result<u64, CatalogError> {
    match value {
        Json::Number(n) => n.as_u64().ok_or_else(|| shape(at)),
        _ => Err(shape(at)),
    }
}

fn endpoints(object: &Object, at: &str) -> Result<Vec<Endpoint>, CatalogError> {
    let at = format!("{at}.endpoints");
    array(object.get("endpoints"), &at)?
        .iter()
        .map(|pair| match array(Some(pair), &at)? {
            [Json::String(api), Json::String(base_url)] => Ok(Endpoint {
                api: api.clone(),
                base_url: base_url.clone(),
            }),
            _ => Err(shape(&at)),
        })
        .collect()
}

/// `[input, output, cacheRead, cacheWrite]`.
fn prices(value: &Json, at: &str) -> Result<Prices, CatalogError> {
    match array(Some(value), at)? {
        [input, output, cache_read, cache_write] => Ok(Prices {
            input: number(input, at)?,
            output: number(output, at)?,
            cache_read: number(cache_read, at)?,
            cache_write: number(cache_write, at)?,
        }),
        _ => Err(shape(at)),
    }
}

fn entries(object: &Object, endpoints: usize, at: &str) -> Result<Vec<Entry>, CatalogError> {
    let at = format!("{at}.entries");
    let fields = ["id", "type", "endpoint", "cost", "tiers", "maxTokens"];
    array(object.get("entries"), &at)?
        .iter()
        .map(|item| {
            let o = exact_object(item, &fields, &at)?;
            let field = |k: &str| o.get(k).ok_or_else(|| shape(&at));
            let endpoint = usize::try_from(count(field("endpoint")?, &at)?)
                .ok()
                .filter(|i| *i < endpoints)
                .ok_or_else(|| shape(&at))?;
            let tiers = array(Some(field("tiers")?), &at)?
                .iter()
                .map(|t| match array(Some(t), &at)? {
                    [above, rest @ ..] => Ok(Tier {
                        above: count(above, &at)?,
                        prices: prices(&Json::Array(rest.to_vec()), &at)?,
                    }),
                    _ => Err(shape(&at)),
                })
                .collect::<Result<_, _>>()?;
            Ok(Entry {
                id: string(o, "id", &at)?,
                kind: o
                    .get("type")
                    .and_then(Json::as_str)
                    .and_then(ModelKind::parse)
                    .ok_or_else(|| shape(&at))?,
                endpoint,
                cost: prices(field("cost")?, &at)?,
                tiers,
                max_tokens: match field("maxTokens")? {
                    Json::Null => None,
                    n => Some(count(n, &at)?),
                },
            })
        })
        .collect()
}

/// The embedded catalog. Were it unreadable (a test proves it is not), it would be empty, so
/// every lookup would refuse rather than admit.
pub fn builtin() -> &'static Catalog {
    static CATALOG: OnceLock<Catalog> = OnceLock::new();
    CATALOG.get_or_init(|| parse(EMBEDDED).unwrap_or_default())
}

/// The version of pi the embedded catalog was read from.
pub fn pi_version() -> &'static str {
    &builtin().pi_ai
}

/// A built-in provider of the pinned pi.
pub fn builtin_provider(id: &str) -> Option<&'static Provider> {
    builtin().provider(id)
}

/// Where the job's model comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A `models` entry of the overlay's `models.json`.
    Overlay,
    /// pi's built-in catalog.
    Builtin,
}

/// A provider and model the job may name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The variables pi reads for the key, in its order: with an overlay `apiKey`, its variable and
    /// what the built-in resolver still reads beside a given key; otherwise the built-in ones.
    pub key_variables: Vec<String>,
    /// The endpoint the overlay sets for this model, when it sets one (otherwise pi's own).
    pub base_url: Option<String>,
    pub source: Source,
}

/// Why a job's provider or model is refused. The message does not repeat the name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotFound {
    #[error(
        "the provider is neither one of the pinned pi's built-in providers nor in the overlay's models.json"
    )]
    ProviderUnknown,
    #[error("the provider has no chat model of this id, built in or in the overlay's models.json")]
    ModelUnknown,
}

/// Looks up a job's `provider` and `model` (exact ids) in the pinned pi's catalog with the
/// overlay's `models.json` on top, as pi composes them.
pub fn find(overlay: Option<&Models>, provider: &str, model: &str) -> Result<Found, NotFound> {
    find_in(builtin(), overlay, provider, model)
}

fn find_in(
    catalog: &Catalog,
    overlay: Option<&Models>,
    provider: &str,
    model: &str,
) -> Result<Found, NotFound> {
    let entry = overlay.and_then(|m| m.entry(provider));
    let builtin = catalog.provider(provider);
    if entry.is_none() && builtin.is_none() {
        return Err(NotFound::ProviderUnknown);
    }
    // A `models` entry replaces the built-in model of its id; of two equal ids the later wins.
    let own = entry.and_then(|e| e.models.iter().rev().find(|m| m.id == model));
    let provider_url = entry.and_then(|e| e.base_url.clone());
    let (source, base_url) = match own {
        Some(m) => (Source::Overlay, m.base_url.clone().or(provider_url)),
        None if builtin.is_some_and(|b| b.models.iter().any(|m| m == model)) => {
            (Source::Builtin, provider_url)
        }
        None => return Err(NotFound::ModelUnknown),
    };
    // pi resolves a models.json apiKey and hands it to the built-in resolver as the key, so the
    // built-in variables are no longer tried (a missing variable is an error, not a fallback).
    let key_variables = match (entry.and_then(|e| e.api_key_variable.as_ref()), builtin) {
        (Some(name), builtin) => {
            let mut names = vec![name.clone()];
            for other in builtin.map_or(&[][..], |b| &b.with_configured_key) {
                if !names.contains(other) {
                    names.push(other.clone());
                }
            }
            names
        }
        (None, Some(b)) => b.key_variables.clone(),
        (None, None) => Vec::new(),
    };
    Ok(Found {
        key_variables,
        base_url,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models;

    const SMALL: &str = r#"{"pi_ai":"9.9.9","providers":[
{"id":"alpha","key_variables":["ALPHA_TOKEN","ALPHA_KEY"],"with_configured_key":[],"models":["a-1","a-2"],
 "endpoints":[["openai-completions","https://alpha.example.com/v1"],["openai-decisions","https://alpha.example.com/v1"]],
 "entries":[{"id":"a-1","type":"chat","endpoint":0,"cost":[1,2,0.1,0],"tiers":[[1000,2,4,0.2,0]],"maxTokens":4096},
            {"id":"a-2","type":"chat","endpoint":0,"cost":[0,0,0,0],"tiers":[],"maxTokens":null},
            {"id":"a-c","type":"classifier","endpoint":1,"cost":[0.1,0,0,0],"tiers":[],"maxTokens":null}]},
{"id":"cloud","key_variables":["CLOUD_KEY","CLOUD_ACCOUNT"],"with_configured_key":["CLOUD_ACCOUNT"],"models":["c-1"],"endpoints":[],"entries":[]},
{"id":"oauth-only","key_variables":[],"with_configured_key":[],"models":["o-1"],"endpoints":[],"entries":[]}
]}"#;

    fn small() -> Catalog {
        parse(SMALL).unwrap()
    }

    fn overlay(text: &str) -> Models {
        models::check(text.as_bytes()).unwrap()
    }

    fn vars(found: &Found) -> Vec<&str> {
        found.key_variables.iter().map(String::as_str).collect()
    }

    #[test]
    fn the_embedded_catalog_reads_and_holds_the_pinned_pi() {
        let catalog = parse(EMBEDDED).unwrap();
        assert_eq!(&catalog, builtin());
        assert_eq!(pi_version(), "1.6.0");
        let openai = builtin_provider("openai").unwrap();
        assert_eq!(openai.key_variables, ["OPENAI_API_KEY"]);
        assert!(!openai.models.is_empty());
        let mut sorted = openai.models.clone();
        sorted.sort();
        assert_eq!(openai.models, sorted);
        assert_eq!(
            builtin_provider("openai-codex").unwrap().key_variables,
            Vec::<String>::new()
        );
        assert_eq!(builtin_provider("no-such-provider"), None);
    }

    #[test]
    fn every_model_carries_its_wire_format_endpoint_and_prices() {
        let c = small();
        let alpha = c.provider("alpha").unwrap();
        let a1 = alpha.entry(ModelKind::Chat, "a-1").unwrap();
        assert_eq!(
            alpha.endpoint_of(a1),
            Some(&Endpoint {
                api: "openai-completions".into(),
                base_url: "https://alpha.example.com/v1".into()
            })
        );
        assert_eq!(a1.max_tokens, Some(4096));
        assert_eq!(a1.cost.cache_read, 0.1);
        assert_eq!(
            a1.tiers,
            [Tier {
                above: 1000,
                prices: Prices {
                    input: 2.0,
                    output: 4.0,
                    cache_read: 0.2,
                    cache_write: 0.0
                }
            }]
        );
        assert_eq!(
            alpha.entry(ModelKind::Chat, "a-2").unwrap().max_tokens,
            None
        );
        let classifier = alpha.entry(ModelKind::Classifier, "a-c").unwrap();
        assert_eq!(
            alpha.endpoint_of(classifier).unwrap().api,
            "openai-decisions"
        );
        assert_eq!(alpha.entry(ModelKind::Chat, "a-c"), None);
        // The embedded catalog holds pi's classifiers and image models as well.
        let openai = builtin_provider("openai").unwrap();
        let luna = openai.entry(ModelKind::Classifier, "gpt-6-luna").unwrap();
        assert_eq!(openai.endpoint_of(luna).unwrap().api, "openai-decisions");
        let openrouter = builtin_provider("openrouter").unwrap();
        assert!(
            openrouter
                .entries
                .iter()
                .any(|e| e.kind == ModelKind::Image)
        );
        for p in &builtin().providers {
            for id in &p.models {
                assert!(p.entry(ModelKind::Chat, id).is_some(), "{}/{id}", p.id);
            }
        }
    }

    #[test]
    fn find_reads_the_embedded_catalog() {
        let model = &builtin_provider("anthropic").unwrap().models[0];
        let found = find(None, "anthropic", model).unwrap();
        assert_eq!(found.source, Source::Builtin);
        assert_eq!(
            vars(&found)[..3],
            [
                "ANTHROPIC_AUTH_TOKEN",
                "ANTHROPIC_OAUTH_TOKEN",
                "ANTHROPIC_API_KEY"
            ]
        );
        assert_eq!(
            find(None, "anthropic", "no-such-model"),
            Err(NotFound::ModelUnknown)
        );
    }

    #[test]
    fn a_builtin_model_without_overlay() {
        let found = find_in(&small(), None, "alpha", "a-2").unwrap();
        assert_eq!(
            found,
            Found {
                key_variables: vec!["ALPHA_TOKEN".into(), "ALPHA_KEY".into()],
                base_url: None,
                source: Source::Builtin,
            }
        );
    }

    #[test]
    fn unknown_provider_and_unknown_model() {
        let c = small();
        assert_eq!(
            find_in(&c, None, "beta", "a-1"),
            Err(NotFound::ProviderUnknown)
        );
        assert_eq!(
            find_in(&c, None, "alpha", "c-1"),
            Err(NotFound::ModelUnknown)
        );
        // Ids are exact: pi's fuzzy and case-blind matching is not repeated here.
        assert_eq!(
            find_in(&c, None, "Alpha", "a-1"),
            Err(NotFound::ProviderUnknown)
        );
        assert_eq!(
            find_in(&c, None, "alpha", "A-1"),
            Err(NotFound::ModelUnknown)
        );
        assert_eq!(find_in(&c, None, "alpha", "a"), Err(NotFound::ModelUnknown));
        // An overlay that names other providers changes nothing for these.
        let o = overlay(
            r#"{"providers": {"local": {"baseUrl": "http://127.0.0.1:9/v1", "api": "openai-completions", "models": [{"id": "a-1"}]}}}"#,
        );
        assert_eq!(
            find_in(&c, Some(&o), "beta", "a-1"),
            Err(NotFound::ProviderUnknown)
        );
        assert_eq!(
            find_in(&c, Some(&o), "alpha", "l-1"),
            Err(NotFound::ModelUnknown)
        );
    }

    #[test]
    fn an_overlay_only_provider_has_exactly_its_models_and_its_key() {
        let o = overlay(
            r#"{"providers": {"local": {"baseUrl": "http://127.0.0.1:9/v1", "api": "openai-completions",
                "apiKey": "$LOCAL_KEY", "models": [{"id": "l-1"}, {"id": "l-2", "baseUrl": "http://127.0.0.1:10/v1"}]}}}"#,
        );
        let c = small();
        let found = find_in(&c, Some(&o), "local", "l-1").unwrap();
        assert_eq!(
            found,
            Found {
                key_variables: vec!["LOCAL_KEY".into()],
                base_url: Some("http://127.0.0.1:9/v1".into()),
                source: Source::Overlay,
            }
        );
        let found = find_in(&c, Some(&o), "local", "l-2").unwrap();
        assert_eq!(found.base_url.as_deref(), Some("http://127.0.0.1:10/v1"));
        assert_eq!(
            find_in(&c, Some(&o), "local", "a-1"),
            Err(NotFound::ModelUnknown)
        );
        // Without an apiKey there is no key variable (pi sends no key; headers may carry one).
        let o = overlay(
            r#"{"providers": {"local": {"baseUrl": "http://127.0.0.1:9/v1", "api": "openai-completions", "models": [{"id": "l-1"}]}}}"#,
        );
        assert_eq!(
            vars(&find_in(&c, Some(&o), "local", "l-1").unwrap()),
            Vec::<&str>::new()
        );
        // No models entry: the provider exists and has no model.
        let o = overlay(r#"{"providers": {"local": {"baseUrl": "http://127.0.0.1:9/v1"}}}"#);
        assert_eq!(
            find_in(&c, Some(&o), "local", "l-1"),
            Err(NotFound::ModelUnknown)
        );
    }

    #[test]
    fn an_overlay_base_url_alone_keeps_the_builtin_models_and_keys() {
        let o = overlay(r#"{"providers": {"alpha": {"baseUrl": "https://proxy.example.com/v1"}}}"#);
        let found = find_in(&small(), Some(&o), "alpha", "a-1").unwrap();
        assert_eq!(
            found,
            Found {
                key_variables: vec!["ALPHA_TOKEN".into(), "ALPHA_KEY".into()],
                base_url: Some("https://proxy.example.com/v1".into()),
                source: Source::Builtin,
            }
        );
    }

    #[test]
    fn overlay_models_extend_a_builtin_provider_and_replace_equal_ids() {
        let o = overlay(
            r#"{"providers": {"alpha": {"models": [
                {"id": "a-new", "baseUrl": "https://one.example.com/v1"},
                {"id": "a-1", "baseUrl": "https://two.example.com/v1"},
                {"id": "a-1", "baseUrl": "https://three.example.com/v1"}]}}}"#,
        );
        let c = small();
        let added = find_in(&c, Some(&o), "alpha", "a-new").unwrap();
        assert_eq!(added.source, Source::Overlay);
        assert_eq!(
            added.base_url.as_deref(),
            Some("https://one.example.com/v1")
        );
        // The built-in keys stay when the overlay gives no apiKey.
        assert_eq!(vars(&added), ["ALPHA_TOKEN", "ALPHA_KEY"]);
        let replaced = find_in(&c, Some(&o), "alpha", "a-1").unwrap();
        assert_eq!(replaced.source, Source::Overlay);
        assert_eq!(
            replaced.base_url.as_deref(),
            Some("https://three.example.com/v1")
        );
        // The other built-in models stay.
        let kept = find_in(&c, Some(&o), "alpha", "a-2").unwrap();
        assert_eq!((kept.source, kept.base_url), (Source::Builtin, None));
    }

    #[test]
    fn an_overlay_api_key_replaces_the_builtin_variables() {
        let o = overlay(
            r#"{"providers": {"alpha": {"apiKey": "${MY_ALPHA}"}, "cloud": {"apiKey": "$MY_CLOUD"}, "oauth-only": {"apiKey": "$MY_O"}}}"#,
        );
        let c = small();
        assert_eq!(
            vars(&find_in(&c, Some(&o), "alpha", "a-1").unwrap()),
            ["MY_ALPHA"]
        );
        // What the built-in resolver reads beside a given key still comes after it.
        assert_eq!(
            vars(&find_in(&c, Some(&o), "cloud", "c-1").unwrap()),
            ["MY_CLOUD", "CLOUD_ACCOUNT"]
        );
        // An OAuth-only provider becomes usable with a key from the environment.
        assert_eq!(
            vars(&find_in(&c, Some(&o), "oauth-only", "o-1").unwrap()),
            ["MY_O"]
        );
        assert_eq!(
            vars(&find_in(&c, None, "oauth-only", "o-1").unwrap()),
            Vec::<&str>::new()
        );
    }

    #[test]
    fn refuses_a_catalog_not_in_the_generators_shape() {
        for (text, field) in [
            (r#"{"pi_ai":"1","providers":[],"extra":1}"#, "top level"),
            (r#"{"pi_ai":1,"providers":[]}"#, "pi_ai"),
            (r#"{"pi_ai":"1","providers":{}}"#, "providers"),
            (
                r#"{"pi_ai":"1","providers":[{"id":"a","key_variables":[],"models":[]}]}"#,
                "providers[0]",
            ),
            (
                r#"{"pi_ai":"1","providers":[{"id":"a","key_variables":[1],"with_configured_key":[],"models":[],"endpoints":[],"entries":[]}]}"#,
                "providers[0].key_variables",
            ),
            (
                r#"{"pi_ai":"1","providers":[{"id":"a","key_variables":[],"with_configured_key":[],"models":[],"endpoints":[["x"]],"entries":[]}]}"#,
                "providers[0].endpoints",
            ),
            // An entry naming an endpoint the provider does not have, or a type pi-ai has not.
            (
                r#"{"pi_ai":"1","providers":[{"id":"a","key_variables":[],"with_configured_key":[],"models":[],"endpoints":[],
                    "entries":[{"id":"m","type":"chat","endpoint":0,"cost":[0,0,0,0],"tiers":[],"maxTokens":null}]}]}"#,
                "providers[0].entries",
            ),
            (
                r#"{"pi_ai":"1","providers":[{"id":"a","key_variables":[],"with_configured_key":[],"models":[],"endpoints":[["x","y"]],
                    "entries":[{"id":"m","type":"video","endpoint":0,"cost":[0,0,0,0],"tiers":[],"maxTokens":null}]}]}"#,
                "providers[0].entries",
            ),
            (
                r#"{"pi_ai":"1","providers":[{"id":"a","key_variables":[],"with_configured_key":[],"models":[],"endpoints":[["x","y"]],
                    "entries":[{"id":"m","type":"chat","endpoint":0,"cost":[0,0,0],"tiers":[],"maxTokens":null}]}]}"#,
                "providers[0].entries",
            ),
        ] {
            assert_eq!(
                parse(text),
                Err(CatalogError::Shape(field.to_owned())),
                "{text}"
            );
        }
        let twice = r#"{"pi_ai":"1","providers":[
            {"id":"a","key_variables":[],"with_configured_key":[],"models":[],"endpoints":[],"entries":[]},
            {"id":"a","key_variables":[],"with_configured_key":[],"models":[],"endpoints":[],"entries":[]}]}"#;
        assert_eq!(parse(twice), Err(CatalogError::DuplicateProvider));
        assert!(matches!(parse("{"), Err(CatalogError::Json(_))));
    }
}
