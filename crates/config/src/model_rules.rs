//! The model gateway's rules, pure: which models a job's pi can reach and where each really is
//! (pi's catalog with the overlay's `models.json` on top, composed as pi composes them), which wire
//! format a request speaks, whether a call may go out (the job's model list and its cost cap), and
//! what a call cost.
//!
//! A call whose cost has no bound is refused under a cap: every image call (its output is not
//! counted in tokens the request can limit), a classifier with an output price (nothing in its
//! request limits its output), and a request with a field whose cost is unknown
//! ([`crate::worst_case`]). A chat call is bounded by its request's worst case: its input, from
//! the request's size, and its output (every answer it asks for, each up to its largest limit and
//! reasoning budget, the model's own limit where it sets none), each at the model's highest price.

use crate::catalog::{Catalog, ModelKind, Prices, Tier};
use crate::models::Models;
pub use crate::wire_format::Api;
use crate::worst_case::{Unbounded, Worst};
use protocol::reason::Reason;

/// The largest output pi gives a model the overlay defines without `maxTokens` (pi-ai's default).
pub const OVERLAY_MAX_TOKENS: u64 = 16_384;

/// One model the job's pi can reach, where it really is and what it costs.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    pub provider: String,
    pub id: String,
    pub kind: ModelKind,
    /// pi-ai's name of its wire format (one the gateway may not read).
    pub api: String,
    /// Its real base URL (what pi would call without the gateway).
    pub base_url: String,
    pub cost: Prices,
    pub tiers: Vec<Tier>,
    pub max_tokens: Option<u64>,
}

impl Model {
    /// `provider/id`, as a trigger's `run.models` names it.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.provider, self.id)
    }

    /// The wire format, when the gateway reads it and the base URL is one it can call (pi fills
    /// `{PLACEHOLDERS}` and an empty base URL from the environment, which the gateway does not).
    pub fn wire(&self) -> Option<Api> {
        let callable = !self.base_url.is_empty() && !self.base_url.contains('{');
        Api::parse(&self.api).filter(|_| callable)
    }

    /// The highest price of an input token and of an output token, over every tier.
    fn highest(&self) -> (f64, f64) {
        let prices = std::iter::once(&self.cost).chain(self.tiers.iter().map(|t| &t.prices));
        prices.fold((0.0, 0.0), |(i, o), p| {
            (
                i.max(p.input).max(p.cache_read).max(p.cache_write),
                o.max(p.output),
            )
        })
    }
}

/// Every provider the gateway routes, each with its models: pi's built-in providers, then the
/// overlay's own, in a fixed order (the gateway's routes are their indexes).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Table {
    pub providers: Vec<(String, Vec<Model>)>,
}

/// A model found for a request, or why none is.
#[derive(Debug, Clone, PartialEq)]
pub enum Found<'a> {
    Model(&'a Model, Api),
    /// The provider has the model, in a wire format or at a base URL the gateway cannot carry.
    Unsupported(&'a Model),
    /// Neither pi's catalog nor the overlay has it for this provider.
    Unknown,
}

impl Table {
    /// The table pi composes: each built-in provider's models, with the overlay's `baseUrl` in front
    /// of all of them, its `models` entries adding or replacing chat models, and its
    /// `modelOverrides` changing chat models' prices and limits; then the overlay's own providers.
    pub fn build(catalog: &Catalog, overlay: Option<&Models>) -> Table {
        Table::compose(catalog, overlay, None)
    }

    /// The same table with `provider` alone (the job's own model needs no more).
    pub fn of_provider(catalog: &Catalog, overlay: Option<&Models>, provider: &str) -> Table {
        Table::compose(catalog, overlay, Some(provider))
    }

    fn compose(catalog: &Catalog, overlay: Option<&Models>, only: Option<&str>) -> Table {
        let wanted = |name: &str| only.is_none_or(|o| o == name);
        let mut providers = Vec::new();
        for builtin in catalog.providers.iter().filter(|p| wanted(&p.id)) {
            let mut models: Vec<Model> = builtin
                .entries
                .iter()
                .filter_map(|e| {
                    let endpoint = builtin.endpoint_of(e)?;
                    Some(Model {
                        provider: builtin.id.clone(),
                        id: e.id.clone(),
                        kind: e.kind,
                        api: endpoint.api.clone(),
                        base_url: endpoint.base_url.clone(),
                        cost: e.cost,
                        tiers: e.tiers.clone(),
                        max_tokens: e.max_tokens,
                    })
                })
                .collect();
            if let Some(entry) = overlay.and_then(|o| o.entry(&builtin.id)) {
                if let Some(url) = &entry.base_url {
                    for m in &mut models {
                        m.base_url = url.clone();
                    }
                }
                apply_overlay(&builtin.id, &mut models, entry);
            }
            providers.push((builtin.id.clone(), models));
        }
        for entry in overlay.map_or(&[][..], |o| &o.entries) {
            if catalog.provider(&entry.name).is_some() || !wanted(&entry.name) {
                continue;
            }
            let mut models = Vec::new();
            apply_overlay(&entry.name, &mut models, entry);
            providers.push((entry.name.clone(), models));
        }
        Table { providers }
    }

    /// The index of provider `name` (its route).
    pub fn index(&self, name: &str) -> Option<usize> {
        self.providers.iter().position(|(p, _)| p == name)
    }

    /// The model a request to provider `index` names, in one of the wire formats its path allows.
    /// Of a chat and an image model of the same id, a request asking for images is the image one.
    pub fn find(&self, index: usize, id: &str, apis: &[Api], wants_image: bool) -> Found<'_> {
        let Some((_, models)) = self.providers.get(index) else {
            return Found::Unknown;
        };
        let mut named = models.iter().filter(|m| m.id == id).collect::<Vec<_>>();
        if named.is_empty() {
            return Found::Unknown;
        }
        named.sort_by_key(|m| (m.kind == ModelKind::Image) != wants_image);
        for m in &named {
            if let Some(api) = m.wire().filter(|a| apis.contains(a)) {
                return Found::Model(m, api);
            }
        }
        Found::Unsupported(named[0])
    }

    /// The job's own chat model, when the table has it.
    pub fn chat_model(&self, provider: &str, id: &str) -> Option<&Model> {
        let (_, models) = self.providers.get(self.index(provider)?)?;
        models
            .iter()
            .find(|m| m.kind == ModelKind::Chat && m.id == id)
    }
}

/// The job's own chat model `provider/id` when the gateway could not carry its calls (a wire
/// format it does not read, or a base URL pi fills in from the environment); `None` when it can,
/// or when the table has no such model. The admission refuses such a job before anything is spent
/// (`model-unsupported`), and the runner stops one that got past a worker of another version
/// (`model-call-unsupported`). Pure.
pub fn uncarried_chat_model(
    catalog: &Catalog,
    overlay: Option<&Models>,
    provider: &str,
    id: &str,
) -> Option<Model> {
    Table::of_provider(catalog, overlay, provider)
        .chat_model(provider, id)
        .filter(|m| m.wire().is_none())
        .cloned()
}

/// The overlay's `models` entries (chat models, added or replacing one of the same id) and then its
/// `modelOverrides` (chat models' prices and limits), as pi-ai composes them.
fn apply_overlay(provider: &str, models: &mut Vec<Model>, entry: &crate::models::ProviderEntry) {
    for def in &entry.models {
        let api = def.api.clone().or_else(|| entry.api.clone());
        let defaults = defaults_for(models, &def.id, api.as_deref());
        let Some(api) = api.or_else(|| defaults.map(|d| d.api.clone())) else {
            continue; // pi refuses the provider: no wire format
        };
        let Some(base_url) = def
            .base_url
            .clone()
            .or_else(|| entry.base_url.clone())
            .or_else(|| defaults.map(|d| d.base_url.clone()))
        else {
            continue; // pi refuses the provider: nowhere to send it
        };
        let model = Model {
            provider: provider.to_owned(),
            id: def.id.clone(),
            kind: ModelKind::Chat,
            api,
            base_url,
            cost: def.cost.unwrap_or_default(),
            tiers: def.tiers.clone(),
            max_tokens: Some(def.max_tokens.unwrap_or(OVERLAY_MAX_TOKENS)),
        };
        match models
            .iter()
            .position(|m| m.kind == ModelKind::Chat && m.id == def.id)
        {
            Some(i) => models[i] = model,
            None => models.push(model),
        }
    }
    for over in &entry.overrides {
        for m in models
            .iter_mut()
            .filter(|m| m.kind == ModelKind::Chat && m.id == over.id)
        {
            m.cost.input = over.input.unwrap_or(m.cost.input);
            m.cost.output = over.output.unwrap_or(m.cost.output);
            m.cost.cache_read = over.cache_read.unwrap_or(m.cost.cache_read);
            m.cost.cache_write = over.cache_write.unwrap_or(m.cost.cache_write);
            if let Some(tiers) = &over.tiers {
                m.tiers = tiers.clone();
            }
            if let Some(max) = over.max_tokens {
                m.max_tokens = Some(max);
            }
        }
    }
}

/// pi-ai's defaults for a `models` entry: the chat model of that id, else one of that wire format,
/// else an OpenAI chat completions one, else the first chat model.
fn defaults_for<'a>(models: &'a [Model], id: &str, api: Option<&str>) -> Option<&'a Model> {
    let chat = || models.iter().filter(|m| m.kind == ModelKind::Chat);
    chat()
        .find(|m| m.id == id)
        .or_else(|| api.and_then(|a| chat().find(|m| m.api == a)))
        .or_else(|| chat().find(|m| m.api == "openai-completions"))
        .or_else(|| chat().next())
}

/// What a request says of itself, read from its JSON body.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestFacts {
    /// The model it names (`model`).
    pub model: Option<String>,
    /// Whether it asks for images (`modalities` holding `image`).
    pub wants_image: bool,
    /// Whether it offers the model tools (`tools`, not empty): an agent's turn, where a summary
    /// or a title asked on the side offers none.
    pub offers_tools: bool,
}

impl RequestFacts {
    pub fn read(body: &serde_json::Value) -> RequestFacts {
        RequestFacts {
            model: body
                .get("model")
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned),
            wants_image: body
                .get("modalities")
                .and_then(serde_json::Value::as_array)
                .is_some_and(|m| m.iter().any(|v| v.as_str() == Some("image"))),
            offers_tools: body
                .get("tools")
                .and_then(serde_json::Value::as_array)
                .is_some_and(|t| !t.is_empty()),
        }
    }
}

/// The job's model rules, as the worker passes them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Rules {
    /// `run.models` (`provider/model`); `None` is any model the table has, as the admission allows.
    pub list: Option<Vec<String>>,
    /// `run.maxCostUsd`.
    pub cap: Option<f64>,
}

impl Rules {
    /// The rules the runner's input carries; a cap that is not a cost above zero is refused.
    pub fn new(list: Option<Vec<String>>, cap: Option<f64>) -> Result<Rules, String> {
        if cap.is_some_and(|c| !(c.is_finite() && c > 0.0)) {
            return Err("the runner's maxCostUsd is not a cost above zero".to_owned());
        }
        Ok(Rules { list, cap })
    }

    /// Whether the job may call `model`.
    pub fn allows(&self, model: &Model) -> bool {
        self.list
            .as_ref()
            .is_none_or(|l| l.contains(&model.full_name()))
    }

    /// Whether a call of `model` may go out when `committed` dollars are spent or held by calls
    /// under way: with a cap, the most it can cost (`worst`, its request's worst case, to be held
    /// until it ends), else 0.
    pub fn bound(
        &self,
        model: &Model,
        worst: Result<Worst, Unbounded>,
        committed: f64,
    ) -> Result<Bound, Refusal> {
        let Some(cap) = self.cap else {
            return Ok(Bound::default());
        };
        let name = model.full_name();
        let (input_price, output_price) = model.highest();
        let unbounded = |why: String| Err(Refusal::new(Reason::ModelCallUnbounded, why));
        let worst = match worst {
            Ok(w) => w,
            Err(u) => {
                return unbounded(format!(
                    "a call of {name} has {}, whose cost the gateway cannot bound under the cost cap",
                    u.field
                ));
            }
        };
        let output = match model.kind {
            ModelKind::Image => {
                return unbounded(format!(
                    "{name} is an image model, whose cost has no bound under the cost cap"
                ));
            }
            ModelKind::Classifier if output_price > 0.0 => {
                return unbounded(format!(
                    "{name} is a classifier with an output price, whose cost has no bound under the cost cap"
                ));
            }
            ModelKind::Classifier => 0,
            ModelKind::Chat => match worst.output_tokens(model.max_tokens) {
                Some(n) => n,
                None => {
                    return unbounded(format!(
                        "a call of {name} sets no output limit and the model has none"
                    ));
                }
            },
        };
        let input = worst.input;
        let worst = per_token(input, input_price) + per_token(output, output_price);
        if committed + worst > cap {
            return Err(Refusal::new(
                Reason::CostCapReached,
                format!(
                    "a call of {name} could cost up to {worst:.6} USD with {committed:.6} USD spent or held, past the cap of {cap} USD"
                ),
            ));
        }
        Ok(Bound {
            usd: worst,
            input,
            output,
        })
    }

    /// Whether what a call's provider reported it used stays within the worst case it was let
    /// out with: under a cap, a provider that bills past it is one the gateway can no longer hold
    /// to the cap.
    pub fn within(&self, model: &Model, bound: &Bound, used: &Tokens) -> Result<(), Refusal> {
        let input = used.input_all();
        if self.cap.is_none() || (input <= bound.input && used.output <= bound.output) {
            return Ok(());
        }
        Err(Refusal::new(
            Reason::ModelCallUnbounded,
            format!(
                "the provider reported a call of {} using {input} input and {} output tokens, past its worst case of {} and {}",
                model.full_name(),
                used.output,
                bound.input,
                bound.output
            ),
        ))
    }
}

/// The most a call let out can cost, held against the cap while it runs, and the tokens that worst
/// case allows (what the provider reports is held to them).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Bound {
    pub usd: f64,
    pub input: u64,
    pub output: u64,
}

fn per_token(tokens: u64, price_per_million: f64) -> f64 {
    // Token counts stay far below 2^53, where the conversion is exact.
    #[allow(clippy::cast_precision_loss)]
    let tokens = tokens as f64;
    tokens * price_per_million / 1_000_000.0
}

/// Why the gateway refused a call: the job's reason and a cause for the worker's log (names and
/// rules, never a value).
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub reason: Reason,
    pub cause: String,
}

impl Refusal {
    pub fn new(reason: Reason, cause: impl Into<String>) -> Refusal {
        Refusal {
            reason,
            cause: cause.into(),
        }
    }
}

/// What a call used, as its provider reported it: input not read from a cache, output, and the
/// cache's reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tokens {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_write: u64,
}

impl Tokens {
    /// Every token counted. The counts are the provider's word: a sum past u64 stays at its most
    /// (a wrapped sum could pass for a small call).
    pub fn total(&self) -> u64 {
        self.input_all().saturating_add(self.output)
    }

    /// The input, cache reads and writes included (what a price tier and the worst case count).
    pub fn input_all(&self) -> u64 {
        self.input
            .saturating_add(self.cache_read)
            .saturating_add(self.cache_write)
    }
}

/// What a call cost, as pi-ai prices it: the highest tier whose threshold the request's whole input
/// (cache included) passes, else the model's own prices.
pub fn cost(model: &Model, tokens: &Tokens) -> f64 {
    let input = tokens.input_all();
    let mut rates = model.cost;
    let mut threshold = None;
    for tier in &model.tiers {
        if input > tier.above && threshold.is_none_or(|t| tier.above > t) {
            rates = tier.prices;
            threshold = Some(tier.above);
        }
    }
    per_token(tokens.input, rates.input)
        + per_token(tokens.output, rates.output)
        + per_token(tokens.cache_read, rates.cache_read)
        + per_token(tokens.cache_write, rates.cache_write)
}

/// Everything the job's model calls used, and what the cap counts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Meter {
    pub calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub total_tokens: u64,
    /// What the calls cost, priced from their usage.
    pub cost_usd: f64,
    /// The bounds of calls that ended well without saying what they used: counted against the
    /// cap, not in the cost.
    unknown: f64,
    /// The bounds held by calls under way.
    held: f64,
}

impl Meter {
    /// What the cap counts: the cost, the unknown and the held.
    pub fn committed(&self) -> f64 {
        self.cost_usd + self.unknown + self.held
    }

    /// Holds a call's bound while it runs.
    pub fn hold(&mut self, bound: f64) {
        self.held += bound;
    }

    /// A call ended: its bound is let go, and what it used counted. A call answered well whose
    /// usage could not be read keeps its bound against the cap.
    pub fn settle(&mut self, bound: f64, used: Option<(Tokens, f64)>, answered: bool) {
        self.held = (self.held - bound).max(0.0);
        self.calls += 1;
        match used {
            Some((tokens, cost)) => {
                self.input_tokens = self.input_tokens.saturating_add(tokens.input);
                self.output_tokens = self.output_tokens.saturating_add(tokens.output);
                self.total_tokens = self.total_tokens.saturating_add(tokens.total());
                self.cost_usd += cost;
            }
            None if answered => self.unknown += bound,
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog;

    /// Found by the `gateway_stream` fuzz target: a provider's counts that add past u64 were an
    /// overflow in a checked build, and otherwise a wrapped sum that could pass the worst case.
    #[test]
    fn counts_past_u64_are_held_to_the_worst_case_not_wrapped() {
        let m = model(ModelKind::Chat, [1.0, 2.0, 0.1, 1.0], Some(100));
        let used = Tokens {
            input: 2,
            output: 1,
            cache_read: u64::MAX,
            cache_write: 2,
        };
        assert_eq!(used.total(), u64::MAX);
        let rules = Rules::new(None, Some(5.0)).unwrap();
        let bound = Bound {
            usd: 1.0,
            input: 100,
            output: 100,
        };
        assert!(rules.within(&m, &bound, &used).is_err());
        assert!(cost(&m, &used).is_finite());
        let mut meter = Meter::default();
        meter.settle(0.0, Some((used, 1.0)), true);
        meter.settle(0.0, Some((used, 1.0)), true);
        assert_eq!(meter.total_tokens, u64::MAX);
    }

    fn model(kind: ModelKind, cost: [f64; 4], max: Option<u64>) -> Model {
        Model {
            provider: "p".into(),
            id: "m".into(),
            kind,
            api: "openai-completions".into(),
            base_url: "https://llm.example.com/v1".into(),
            cost: Prices {
                input: cost[0],
                output: cost[1],
                cache_read: cost[2],
                cache_write: cost[3],
            },
            tiers: Vec::new(),
            max_tokens: max,
        }
    }

    fn capped(cap: f64) -> Rules {
        Rules {
            list: None,
            cap: Some(cap),
        }
    }

    /// A request's worst case: `input` tokens, answers of up to `output` each.
    fn worst(output: Option<u64>, input: u64) -> Result<Worst, Unbounded> {
        Ok(Worst {
            input,
            output,
            budget: 0,
            budget_within: false,
            choices: 1,
        })
    }

    const SMALL: &str = r#"{"pi_ai":"9","providers":[
{"id":"alpha","key_variables":["ALPHA_KEY"],"with_configured_key":[],"models":["a-1","a-2","pic"],
 "endpoints":[["openai-completions","https://alpha.example.com/v1"],["openrouter-images","https://alpha.example.com/v1"],
              ["anthropic-messages","https://alpha.example.com"],["google-generative-ai","https://g.example.com"],
              ["openai-completions","https://{ACCOUNT}.example.com/v1"]],
 "entries":[{"id":"a-1","type":"chat","endpoint":0,"cost":[1,2,0,0],"tiers":[],"maxTokens":1000},
            {"id":"a-2","type":"chat","endpoint":2,"cost":[3,15,0.3,3.75],"tiers":[],"maxTokens":8000},
            {"id":"g-1","type":"chat","endpoint":3,"cost":[1,1,0,0],"tiers":[],"maxTokens":10},
            {"id":"t-1","type":"chat","endpoint":4,"cost":[1,1,0,0],"tiers":[],"maxTokens":10},
            {"id":"pic","type":"chat","endpoint":0,"cost":[1,1,0,0],"tiers":[],"maxTokens":10},
            {"id":"pic","type":"image","endpoint":1,"cost":[0,0,0,0],"tiers":[],"maxTokens":null}]}
]}"#;

    fn table(overlay: Option<&str>) -> Table {
        let catalog = catalog::parse(SMALL).unwrap();
        let models = overlay.map(|t| crate::models::check(t.as_bytes()).unwrap());
        Table::build(&catalog, models.as_ref())
    }

    #[test]
    fn a_request_finds_its_model_by_provider_id_and_wire_format() {
        let t = table(None);
        let chat = Api::for_path("/v1/chat/completions");
        match t.find(0, "a-1", chat, false) {
            Found::Model(m, Api::OpenAiCompletions) => {
                assert_eq!(m.base_url, "https://alpha.example.com/v1");
            }
            other => panic!("{other:?}"),
        }
        // The same id as a chat and an image model: a request for images is the image one.
        assert!(matches!(
            t.find(0, "pic", chat, true),
            Found::Model(m, Api::OpenRouterImages) if m.kind == ModelKind::Image
        ));
        assert!(matches!(
            t.find(0, "pic", chat, false),
            Found::Model(m, Api::OpenAiCompletions) if m.kind == ModelKind::Chat
        ));
        // Anthropic's path reaches the Anthropic model, not through the chat completions path.
        assert!(matches!(
            t.find(0, "a-2", Api::for_path("/v1/messages"), false),
            Found::Model(_, Api::AnthropicMessages)
        ));
        assert!(matches!(
            t.find(0, "a-2", chat, false),
            Found::Unsupported(_)
        ));
        // A wire format the gateway does not read, a base URL pi would fill in: unsupported.
        assert!(matches!(
            t.find(
                0,
                "g-1",
                Api::for_path("/v1beta/models/g-1:streamGenerateContent"),
                false
            ),
            Found::Unsupported(_)
        ));
        assert!(matches!(
            t.find(0, "t-1", chat, false),
            Found::Unsupported(_)
        ));
        assert_eq!(t.find(0, "nope", chat, false), Found::Unknown);
        assert_eq!(t.find(9, "a-1", chat, false), Found::Unknown);
        assert_eq!(Api::for_path("/v1/models"), &[] as &[Api]);
    }

    #[test]
    fn the_overlay_moves_a_builtin_provider_and_adds_its_own() {
        let t = table(Some(
            r#"{"providers": {
                "alpha": {"baseUrl": "https://proxy.example.com/v1",
                          "models": [{"id": "a-3", "cost": {"input": 1, "output": 9, "cacheRead": 0, "cacheWrite": 0}},
                                     {"id": "a-1", "baseUrl": "https://own.example.com/v1", "maxTokens": 50}],
                          "modelOverrides": {"a-2": {"cost": {"output": 30}, "maxTokens": 99}, "pic": {"maxTokens": 5}}},
                "local": {"baseUrl": "http://127.0.0.1:9/v1", "api": "openai-completions", "apiKey": "$LOCAL_KEY",
                          "models": [{"id": "l-1"}]},
                "broken": {"models": [{"id": "b-1"}]}
            }}"#,
        ));
        let alpha = &t.providers[0].1;
        let get = |kind, id: &str| alpha.iter().find(|m| m.kind == kind && m.id == id).unwrap();
        // The provider's baseUrl is in front of every built-in model, of every kind.
        assert_eq!(
            get(ModelKind::Image, "pic").base_url,
            "https://proxy.example.com/v1"
        );
        assert_eq!(
            get(ModelKind::Chat, "a-2").base_url,
            "https://proxy.example.com/v1"
        );
        // A models entry replaces the built-in one, with its own base URL and pi's defaults.
        let a1 = get(ModelKind::Chat, "a-1");
        assert_eq!(a1.base_url, "https://own.example.com/v1");
        assert_eq!((a1.max_tokens, a1.cost.input), (Some(50), 0.0));
        let a3 = get(ModelKind::Chat, "a-3");
        assert_eq!(a3.api, "openai-completions");
        assert_eq!(
            (a3.cost.output, a3.max_tokens),
            (9.0, Some(OVERLAY_MAX_TOKENS))
        );
        // Overrides change chat models only, field by field.
        let a2 = get(ModelKind::Chat, "a-2");
        assert_eq!(
            (a2.cost.input, a2.cost.output, a2.max_tokens),
            (3.0, 30.0, Some(99))
        );
        assert_eq!(get(ModelKind::Image, "pic").max_tokens, None);
        assert_eq!(get(ModelKind::Chat, "pic").max_tokens, Some(5));
        // An overlay provider: exactly its models; one pi would refuse has none.
        let local = t.index("local").unwrap();
        assert!(matches!(
            t.find(local, "l-1", Api::for_path("/chat/completions"), false),
            Found::Model(m, _) if m.base_url == "http://127.0.0.1:9/v1"
        ));
        assert!(t.providers[t.index("broken").unwrap()].1.is_empty());
        assert_eq!(
            t.chat_model("alpha", "a-3").map(|m| m.id.as_str()),
            Some("a-3")
        );
        assert_eq!(t.chat_model("alpha", "nope"), None);
    }

    #[test]
    fn the_list_holds_calls_to_its_models() {
        let m = model(ModelKind::Classifier, [0.0; 4], None);
        assert!(Rules::default().allows(&m));
        let listed = Rules {
            list: Some(vec!["p/m".into()]),
            cap: None,
        };
        assert!(listed.allows(&m));
        let other = Rules {
            list: Some(vec!["p/other".into(), "q/m".into()]),
            cap: None,
        };
        assert!(!other.allows(&m));
    }

    #[test]
    fn without_a_cap_every_call_goes_out() {
        for kind in [ModelKind::Chat, ModelKind::Classifier, ModelKind::Image] {
            let m = model(kind, [100.0, 100.0, 0.0, 0.0], None);
            assert_eq!(
                Rules::default().bound(&m, worst(None, 10_000), 1e9),
                Ok(Bound::default())
            );
        }
    }

    #[test]
    fn under_a_cap_image_calls_and_priced_classifiers_have_no_bound() {
        let free_image = model(ModelKind::Image, [0.0; 4], None);
        let refused = capped(100.0).bound(&free_image, worst(None, 1), 0.0);
        assert_eq!(refused.unwrap_err().reason, Reason::ModelCallUnbounded);
        let priced = model(ModelKind::Classifier, [0.1, 0.5, 0.0, 0.0], None);
        let refused = capped(100.0).bound(&priced, worst(None, 1), 0.0);
        assert_eq!(refused.unwrap_err().reason, Reason::ModelCallUnbounded);
        // An output price in a tier counts as well.
        let mut tiered = model(ModelKind::Classifier, [0.1, 0.0, 0.0, 0.0], None);
        tiered.tiers.push(Tier {
            above: 1000,
            prices: Prices {
                output: 1.0,
                ..Prices::default()
            },
        });
        assert!(capped(100.0).bound(&tiered, worst(None, 1), 0.0).is_err());
        // A classifier priced by its input only is bounded by its input.
        let classifier = model(ModelKind::Classifier, [2.0, 0.0, 0.0, 0.0], None);
        let bound = capped(1.0)
            .bound(&classifier, worst(None, 250_000), 0.0)
            .unwrap()
            .usd;
        assert!((bound - 0.5).abs() < 1e-12, "{bound:?}");
        let refused = capped(1.0).bound(&classifier, worst(None, 250_000), 0.6);
        assert_eq!(refused.unwrap_err().reason, Reason::CostCapReached);
    }

    #[test]
    fn a_chat_call_is_bounded_by_its_input_and_largest_output() {
        // 1 USD and 10 USD per million tokens; the model gives at most 1,000 output tokens.
        let m = model(ModelKind::Chat, [1.0, 10.0, 0.0, 0.0], Some(1000));
        let rules = capped(0.02);
        // 4,000 input tokens (0.004) and the model's 1,000 output tokens (0.01): 0.014.
        let bound = rules.bound(&m, worst(None, 4000), 0.0).unwrap().usd;
        assert!((bound - 0.014).abs() < 1e-12, "{bound:?}");
        // What is spent or held counts: 0.007 + 0.014 passes 0.02.
        let refused = rules.bound(&m, worst(None, 4000), 0.007).unwrap_err();
        assert_eq!(refused.reason, Reason::CostCapReached);
        assert!(refused.cause.contains("p/m"), "{}", refused.cause);
        // The request's own limit replaces the model's.
        let bound = rules.bound(&m, worst(Some(100), 4000), 0.007).unwrap().usd;
        assert!((bound - 0.005).abs() < 1e-12, "{bound:?}");
        // The highest price of any tier and of the cache is the one counted.
        let mut dear = m.clone();
        dear.cost.cache_write = 2.0;
        dear.tiers.push(Tier {
            above: 100_000,
            prices: Prices {
                input: 1.5,
                output: 20.0,
                ..Prices::default()
            },
        });
        let bound = capped(1.0)
            .bound(&dear, worst(Some(100), 1000), 0.0)
            .unwrap()
            .usd;
        assert!((bound - (0.002 + 0.002)).abs() < 1e-12, "{bound:?}");
        // No limit anywhere: no bound.
        let open = model(ModelKind::Chat, [1.0, 1.0, 0.0, 0.0], None);
        let refused = rules.bound(&open, worst(None, 1), 0.0).unwrap_err();
        assert_eq!(refused.reason, Reason::ModelCallUnbounded);
        assert!(rules.bound(&open, worst(Some(10), 1), 0.0).is_ok());
    }

    #[test]
    fn a_model_priced_at_zero_costs_nothing() {
        let free = model(ModelKind::Image, [0.0; 4], None);
        let tokens = Tokens {
            input: 1000,
            output: 5000,
            ..Tokens::default()
        };
        assert_eq!(cost(&free, &tokens), 0.0);
    }

    #[test]
    fn cost_follows_pi_ai_with_its_tiers() {
        let mut m = model(ModelKind::Chat, [1.0, 10.0, 0.1, 1.25], Some(10));
        let tokens = Tokens {
            input: 1_000_000,
            output: 100_000,
            cache_read: 2_000_000,
            cache_write: 400_000,
        };
        let base = 1.0 + 1.0 + 0.2 + 0.5;
        assert!((cost(&m, &tokens) - base).abs() < 1e-9);
        m.tiers = vec![
            Tier {
                above: 200_000,
                prices: Prices {
                    input: 2.0,
                    output: 20.0,
                    cache_read: 0.2,
                    cache_write: 2.5,
                },
            },
            Tier {
                above: 10_000_000,
                prices: Prices::default(),
            },
        ];
        // 3.4 million input tokens (cache included) pass the first tier only.
        assert!((cost(&m, &tokens) - 2.0 * base).abs() < 1e-9);
        let small = Tokens {
            input: 100,
            ..Tokens::default()
        };
        assert!((cost(&m, &small) - 0.0001).abs() < 1e-12);
        assert_eq!(tokens.total(), 3_500_000);
    }

    #[test]
    fn the_meter_holds_bounds_while_calls_run() {
        let mut meter = Meter::default();
        meter.hold(0.5);
        meter.hold(0.25);
        assert!((meter.committed() - 0.75).abs() < 1e-12);
        let used = Tokens {
            input: 10,
            output: 2,
            cache_read: 3,
            cache_write: 0,
        };
        meter.settle(0.5, Some((used, 0.1)), true);
        assert!((meter.committed() - 0.35).abs() < 1e-12);
        // Answered without a usage the gateway could read: its bound stays against the cap.
        meter.settle(0.25, None, true);
        assert!((meter.committed() - 0.35).abs() < 1e-12);
        assert!((meter.cost_usd - 0.1).abs() < 1e-12);
        // Refused by the provider: nothing spent.
        meter.hold(1.0);
        meter.settle(1.0, None, false);
        assert!((meter.committed() - 0.35).abs() < 1e-12);
        assert_eq!(
            (
                meter.calls,
                meter.input_tokens,
                meter.output_tokens,
                meter.total_tokens
            ),
            (3, 10, 2, 15)
        );
    }

    #[test]
    fn requests_say_their_model_and_whether_they_want_images() {
        let body = serde_json::json!({"model": "m", "max_completion_tokens": 7, "max_tokens": 9,
            "modalities": ["image", "text"]});
        assert_eq!(
            RequestFacts::read(&body),
            RequestFacts {
                model: Some("m".into()),
                wants_image: true,
                offers_tools: false,
            }
        );
        let turn = serde_json::json!({"model": "m", "tools": [{"type": "function"}]});
        assert!(RequestFacts::read(&turn).offers_tools);
        let aside = serde_json::json!({"model": "m", "tools": []});
        assert!(!RequestFacts::read(&aside).offers_tools);
        assert_eq!(
            RequestFacts::read(&serde_json::json!([])),
            RequestFacts::default()
        );
    }

    #[test]
    fn a_request_of_unknown_cost_is_refused_under_a_cap_and_a_bill_past_its_bound_stops_the_job() {
        let m = model(ModelKind::Chat, [1.0, 10.0, 0.0, 0.0], Some(1000));
        let unknown = Err(Unbounded {
            field: "best_of".into(),
        });
        let refused = capped(100.0).bound(&m, unknown.clone(), 0.0).unwrap_err();
        assert_eq!(refused.reason, Reason::ModelCallUnbounded);
        assert!(refused.cause.contains("best_of"), "{}", refused.cause);
        assert_eq!(
            Rules::default().bound(&m, unknown, 0.0),
            Ok(Bound::default())
        );
        // n answers of one token each, at 10 USD a million.
        let many = Ok(Worst {
            input: 0,
            output: Some(1),
            budget: 0,
            budget_within: false,
            choices: 128,
        });
        let bound = capped(100.0).bound(&m, many, 0.0).unwrap().usd;
        assert!((bound - 128.0 * 10.0 / 1e6).abs() < 1e-12, "{bound:?}");
        // What the provider reports is held to the worst case's tokens, input and output apart.
        let bound = Bound {
            usd: 1.0,
            input: 100,
            output: 10,
        };
        let used = |input, cache_read, output| Tokens {
            input,
            output,
            cache_read,
            cache_write: 0,
        };
        assert_eq!(capped(1.0).within(&m, &bound, &used(60, 40, 10)), Ok(()));
        for past in [used(60, 41, 0), used(1, 0, 11)] {
            let refused = capped(1.0).within(&m, &bound, &past).unwrap_err();
            assert_eq!(refused.reason, Reason::ModelCallUnbounded);
        }
        assert_eq!(Rules::default().within(&m, &bound, &used(9, 9, 99)), Ok(()));
    }

    #[test]
    fn a_cap_must_be_a_cost_above_zero() {
        assert_eq!(Rules::new(None, None), Ok(Rules::default()));
        let list = vec!["openai/gpt-x".to_owned()];
        let r = Rules::new(Some(list.clone()), Some(2.5)).unwrap();
        assert_eq!((r.list, r.cap), (Some(list), Some(2.5)));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(Rules::new(None, Some(bad)).is_err(), "{bad}");
        }
    }
}
