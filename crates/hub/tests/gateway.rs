//! The model gateway against a scripted provider on loopback, driven by a bare HTTP client as pi's
//! would drive it: OpenAI chat completions and Anthropic messages, streamed and not, the provider
//! key put where the stand-in was and nowhere else, every call metered; OpenRouter's classifiers
//! and image models from pi's own catalog; the job's model list and cost cap refusing calls before
//! they reach the provider (and stopping the job); the egress proxy used when the runner has one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use hub::gateway::rules::{Rules, Table};
use hub::gateway::{Gateway, GatewayOptions, HeldKey};
use protocol::reason::Reason;
use serde_json::{Value, json};
use testkit::fake_model::{
    CHAT_USAGE, CLASSIFIER_USAGE, FakeModel, IMAGE_USAGE, Kind, MODEL, PROVIDER, Step,
};

const REAL_KEY: &str = "cnry-gw-real-key-5e2";

/// The gateway over pi's catalog and an overlay `models.json`, holding `fake`'s key.
async fn gateway(overlay: &Value, rules: Rules, key_provider: &str) -> (Gateway, HeldKey) {
    let models = config::models::check(overlay.to_string().as_bytes()).unwrap();
    let table = Table::build(config::catalog::builtin(), Some(&models));
    let key = HeldKey::new(key_provider, REAL_KEY.to_owned()).unwrap();
    let gateway = Gateway::start(GatewayOptions {
        table,
        rules,
        key: Some(key.clone()),
        https_proxy: None,
        http_proxy: None,
    })
    .await
    .unwrap();
    (gateway, key)
}

/// An OpenAI-compatible `fake` provider with prices: 1 and 2 USD per million tokens; and a free
/// `other-model`.
fn openai_overlay(model: &FakeModel) -> Value {
    json!({"providers": {PROVIDER: {"baseUrl": model.base_url(), "api": "openai-completions",
        "apiKey": "$FAKE_KEY", "models": [{"id": MODEL, "maxTokens": 1000,
            "cost": {"input": 1, "output": 2, "cacheRead": 0, "cacheWrite": 0}}, {"id": "other-model"}]}}})
}

fn anthropic_overlay(model: &FakeModel) -> Value {
    json!({"providers": {PROVIDER: {"baseUrl": model.anthropic_base_url(), "api": "anthropic-messages",
        "apiKey": "$FAKE_KEY", "models": [{"id": MODEL, "maxTokens": 1000,
            "cost": {"input": 1, "output": 2, "cacheRead": 0, "cacheWrite": 0}}]}}})
}

fn chat_cost() -> f64 {
    (CHAT_USAGE.0 as f64 * 1.0 + CHAT_USAGE.1 as f64 * 2.0) / 1e6
}

async fn post(url: &str, headers: &[(&str, &str)], body: &Value) -> (u16, String) {
    let mut request = reqwest::Client::new().post(url).json(body);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

fn chat_body(stream: bool) -> Value {
    json!({"model": MODEL, "stream": stream, "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "hello"}]})
}

#[tokio::test]
async fn openai_chat_streamed_and_not_carries_the_real_key_and_is_metered() {
    let model = FakeModel::start(vec![Step::text("one"), Step::text("two")]);
    let (gw, key) = gateway(&openai_overlay(&model), Rules::default(), PROVIDER).await;
    let url = format!("{}/chat/completions", gw.base_url(PROVIDER).unwrap());
    let bearer = format!("Bearer {}", key.stand_in);
    let (status, text) = post(&url, &[("authorization", &bearer)], &chat_body(true)).await;
    assert_eq!(status, 200, "{text}");
    assert!(
        text.contains("data: [DONE]") && text.contains("\"one\""),
        "{text}"
    );
    let (status, text) = post(&url, &[("authorization", &bearer)], &chat_body(false)).await;
    assert_eq!(status, 200, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(answer["choices"][0]["message"]["content"], "two");
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    for r in &requests {
        assert_eq!(r.path, "/v1/chat/completions");
        assert_eq!(
            r.authorization.as_deref(),
            Some(format!("Bearer {REAL_KEY}").as_str())
        );
        assert!(
            !r.headers.iter().any(|(_, v)| v.contains(&key.stand_in)),
            "the stand-in reached the provider"
        );
        // Asked for plain bytes, which the gateway can read.
        assert_eq!(r.header("accept-encoding"), None);
    }
    assert!(!requests[1].stream());
    // Shortly after the answers end, both calls are metered.
    let meter = settled(&gw, 2).await;
    assert_eq!(meter.input_tokens, 2 * CHAT_USAGE.0);
    assert_eq!(meter.output_tokens, 2 * CHAT_USAGE.1);
    assert_eq!(meter.total_tokens, 2 * (CHAT_USAGE.0 + CHAT_USAGE.1));
    assert!(
        (meter.cost_usd - 2.0 * chat_cost()).abs() < 1e-12,
        "{meter:?}"
    );
    assert_eq!(gw.refusal(), None);
    gw.shutdown().await;
}

/// The meter once `calls` calls have ended (an answer is counted when its last byte has passed).
async fn settled(gw: &Gateway, calls: u64) -> hub::gateway::rules::Meter {
    for _ in 0..100 {
        let meter = gw.meter();
        if meter.calls >= calls {
            return meter;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("the calls were not metered: {:?}", gw.meter());
}

#[tokio::test]
async fn anthropic_messages_streamed_and_not_carry_the_key_as_x_api_key() {
    let model = FakeModel::start(vec![
        Step::call("bash", json!({"command": "ls"})),
        Step::text("done"),
    ]);
    let (gw, key) = gateway(&anthropic_overlay(&model), Rules::default(), PROVIDER).await;
    let url = format!("{}/v1/messages", gw.base_url(PROVIDER).unwrap());
    let body = |stream: bool| {
        json!({"model": MODEL, "max_tokens": 100, "stream": stream,
            "messages": [{"role": "user", "content": "hello"}]})
    };
    let headers = [
        ("x-api-key", key.stand_in.as_str()),
        ("anthropic-version", "2023-06-01"),
    ];
    let (status, text) = post(&url, &headers, &body(true)).await;
    assert_eq!(status, 200, "{text}");
    assert!(
        text.contains("event: message_delta") && text.contains("tool_use"),
        "{text}"
    );
    let (status, text) = post(&url, &headers, &body(false)).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["stop_reason"],
        "end_turn"
    );
    for r in model.requests() {
        assert_eq!(r.kind(), Kind::AnthropicChat);
        assert_eq!(r.header("x-api-key"), Some(REAL_KEY));
        assert_eq!(r.header("anthropic-version"), Some("2023-06-01"));
    }
    let meter = settled(&gw, 2).await;
    assert_eq!(
        (meter.input_tokens, meter.output_tokens),
        (2 * CHAT_USAGE.0, 2 * CHAT_USAGE.1)
    );
    assert!(
        (meter.cost_usd - 2.0 * chat_cost()).abs() < 1e-12,
        "{meter:?}"
    );
}

#[tokio::test]
async fn a_call_without_the_stand_in_is_turned_away_and_reaches_nothing() {
    let model = FakeModel::start(vec![]);
    let (gw, _) = gateway(&openai_overlay(&model), Rules::default(), PROVIDER).await;
    let url = format!("{}/chat/completions", gw.base_url(PROVIDER).unwrap());
    for auth in ["Bearer not-the-stand-in", &format!("Bearer {REAL_KEY}")] {
        let (status, _) = post(&url, &[("authorization", auth)], &chat_body(true)).await;
        assert_eq!(status, 401);
    }
    let (status, _) = post(&url, &[], &chat_body(true)).await;
    assert_eq!(status, 401);
    // Nor on another provider's route, where a call it refused would stop the job.
    let other = format!("{}/chat/completions", gw.base_url("openai").unwrap());
    let unknown = json!({"model": "no-such-model", "messages": []});
    let (status, _) = post(&other, &[], &unknown).await;
    assert_eq!(status, 401);
    assert!(model.requests().is_empty());
    // Not a refused call: pi's calls still go.
    assert_eq!(gw.refusal(), None);
}

#[tokio::test]
async fn a_stand_in_in_the_query_is_swapped_there() {
    let model = FakeModel::start(vec![Step::text("one")]);
    let (gw, key) = gateway(&openai_overlay(&model), Rules::default(), PROVIDER).await;
    let url = format!(
        "{}/chat/completions?key={}&alt=sse",
        gw.base_url(PROVIDER).unwrap(),
        key.stand_in
    );
    let (status, text) = post(&url, &[], &chat_body(true)).await;
    assert_eq!(status, 200, "{text}");
    let seen = &model.requests()[0];
    assert_eq!(
        seen.path,
        format!("/v1/chat/completions?key={REAL_KEY}&alt=sse")
    );
}

#[tokio::test]
async fn a_model_off_the_list_is_refused_and_stops_the_job() {
    let model = FakeModel::start(vec![]);
    let rules = Rules {
        list: Some(vec!["fake/other-model".to_owned()]),
        cap: None,
    };
    let (gw, key) = gateway(&openai_overlay(&model), rules, PROVIDER).await;
    let url = format!("{}/chat/completions", gw.base_url(PROVIDER).unwrap());
    let bearer = format!("Bearer {}", key.stand_in);
    let (status, text) = post(&url, &[("authorization", &bearer)], &chat_body(true)).await;
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("model-call-not-allowed"), "{text}");
    let stop = gw.refusal().expect("the job is told");
    assert_eq!(stop.reason, Reason::ModelCallNotAllowed);
    assert!(stop.cause.contains("fake/fake-model"), "{}", stop.cause);
    assert!(model.requests().is_empty());
    // While the job stops, no call goes out, not even one the rules allow, and the first refusal
    // stays the one the job reports.
    let allowed = json!({"model": "other-model", "messages": []});
    let (status, text) = post(&url, &[("authorization", &bearer)], &allowed).await;
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("the job is stopping"), "{text}");
    assert!(model.requests().is_empty());
    let google = format!(
        "{}/models/x:streamGenerateContent",
        gw.base_url(PROVIDER).unwrap()
    );
    let (status, _) = post(&google, &[("authorization", &bearer)], &json!({})).await;
    assert_eq!(status, 403);
    assert_eq!(gw.refusal().unwrap().reason, Reason::ModelCallNotAllowed);
}

#[tokio::test]
async fn unknown_models_and_unread_wire_formats_are_refused() {
    let model = FakeModel::start(vec![]);
    // A model neither the catalog nor the overlay has; the request's own text is not repeated.
    let (gw, key) = gateway(&openai_overlay(&model), Rules::default(), PROVIDER).await;
    let bearer = format!("Bearer {}", key.stand_in);
    let url = format!("{}/chat/completions", gw.base_url(PROVIDER).unwrap());
    let body = json!({"model": "cnry-made-up", "messages": []});
    let (status, text) = post(&url, &[("authorization", &bearer)], &body).await;
    assert_eq!(status, 403, "{text}");
    let stop = gw.refusal().unwrap();
    assert_eq!(stop.reason, Reason::ModelCallNotAllowed);
    assert!(!stop.cause.contains("cnry"), "{}", stop.cause);
    // A wire format the gateway does not read.
    let (gw, key) = gateway(&openai_overlay(&model), Rules::default(), PROVIDER).await;
    let bearer = format!("Bearer {}", key.stand_in);
    let google = format!(
        "{}/models/x:streamGenerateContent",
        gw.base_url(PROVIDER).unwrap()
    );
    let (status, text) = post(&google, &[("authorization", &bearer)], &json!({})).await;
    assert_eq!(status, 403);
    assert!(text.contains("model-call-unsupported"), "{text}");
    assert_eq!(gw.refusal().unwrap().reason, Reason::ModelCallUnsupported);
    assert!(model.requests().is_empty());
}

/// A gateway over the OpenAI-compatible overlay under `cap`, with the stand-in's header.
async fn capped(model: &FakeModel, cap: f64) -> (Gateway, String, String) {
    let rules = Rules {
        list: None,
        cap: Some(cap),
    };
    let (gw, key) = gateway(&openai_overlay(model), rules, PROVIDER).await;
    let url = format!("{}/chat/completions", gw.base_url(PROVIDER).unwrap());
    (gw, url, format!("Bearer {}", key.stand_in))
}

/// The input a request of `body` is bounded by, in USD at the overlay's 1 USD a million tokens:
/// one token a byte, and the provider's overhead.
fn input_bound(body: &Value) -> f64 {
    (body.to_string().len() as u64 + config::worst_case::OVERHEAD_TOKENS) as f64 / 1e6
}

#[tokio::test]
async fn a_chat_call_whose_worst_case_passes_the_cap_is_refused() {
    let model = FakeModel::start(vec![Step::text("one")]);
    // The request's input (about 0.0022) and the model's 1,000 output tokens at 2 USD per million
    // (0.002) pass a cap of 0.004.
    let (gw, url, bearer) = capped(&model, 0.004).await;
    let (status, text) = post(&url, &[("authorization", &bearer)], &chat_body(true)).await;
    assert_eq!(status, 403, "{text}");
    assert_eq!(gw.refusal().unwrap().reason, Reason::CostCapReached);
    assert!(model.requests().is_empty());
    // The request's own output limit bounds it: 100 tokens.
    let (gw, url, bearer) = capped(&model, 0.004).await;
    let mut body = chat_body(true);
    body["max_completion_tokens"] = json!(100);
    assert!(input_bound(&body) + 100.0 * 2.0 / 1e6 < 0.004);
    let (status, text) = post(&url, &[("authorization", &bearer)], &body).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(gw.refusal(), None);
    assert_eq!(model.requests().len(), 1);
    assert!((settled(&gw, 1).await.cost_usd - chat_cost()).abs() < 1e-12);
}

#[tokio::test]
async fn every_answer_a_request_asks_for_counts_against_the_cap() {
    let model = FakeModel::start(vec![Step::text("two answers")]);
    let cap = 0.004;
    let (gw, url, bearer) = capped(&model, cap).await;
    // The control: two answers of one token each go out, and are billed as two.
    let mut two = chat_body(false);
    two["max_tokens"] = json!(1);
    two["n"] = json!(2);
    let (status, text) = post(&url, &[("authorization", &bearer)], &two).await;
    assert_eq!(status, 200, "{text}");
    let meter = settled(&gw, 1).await;
    assert_eq!(meter.output_tokens, 2, "{meter:?}");
    // A thousand answers of one token could cost 0.002 more: past the cap with what is spent.
    let mut many = two.clone();
    many["n"] = json!(1000);
    let (status, text) = post(&url, &[("authorization", &bearer)], &many).await;
    assert_eq!(status, 403, "{text}");
    assert_eq!(gw.refusal().unwrap().reason, Reason::CostCapReached);
    assert_eq!(model.requests().len(), 1, "the refused call went nowhere");
    assert!(gw.meter().cost_usd <= cap);
    // The smaller of two output limits does not hide the larger.
    let (gw, url, bearer) = capped(&model, cap).await;
    let mut split = chat_body(false);
    split["max_completion_tokens"] = json!(1);
    split["max_tokens"] = json!(100_000);
    let (status, _) = post(&url, &[("authorization", &bearer)], &split).await;
    assert_eq!(status, 403);
    assert_eq!(gw.refusal().unwrap().reason, Reason::CostCapReached);
    assert_eq!(model.requests().len(), 1);
}

#[tokio::test]
async fn a_field_of_unknown_cost_is_refused_under_a_cap_and_named() {
    let model = FakeModel::start(vec![Step::text("searched")]);
    let mut search = chat_body(false);
    search["max_tokens"] = json!(1);
    search["web_search_options"] = json!({});
    let (gw, url, bearer) = capped(&model, 1.0).await;
    let (status, text) = post(&url, &[("authorization", &bearer)], &search).await;
    assert_eq!(status, 403, "{text}");
    let stop = gw.refusal().unwrap();
    assert_eq!(stop.reason, Reason::ModelCallUnbounded);
    assert!(stop.cause.contains("web_search_options"), "{}", stop.cause);
    assert!(model.requests().is_empty());
    // A key written twice could be read one way here and another by the provider.
    let (gw, url, bearer) = capped(&model, 1.0).await;
    let twice = r#"{"model": "fake-model", "messages": [], "max_tokens": 1, "max_tokens": 100000}"#;
    let response = reqwest::Client::new()
        .post(&url)
        .header("authorization", &bearer)
        .header("content-type", "application/json")
        .body(twice)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 403);
    assert_eq!(gw.refusal().unwrap().reason, Reason::ModelCallUnbounded);
    assert!(model.requests().is_empty());
    // The control: without a cap nothing is bounded, and the same request goes out.
    let (gw, key) = gateway(&openai_overlay(&model), Rules::default(), PROVIDER).await;
    let url = format!("{}/chat/completions", gw.base_url(PROVIDER).unwrap());
    let bearer = format!("Bearer {}", key.stand_in);
    let (status, text) = post(&url, &[("authorization", &bearer)], &search).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(model.requests().len(), 1);
}

#[tokio::test]
async fn a_provider_that_bills_past_the_worst_case_stops_the_job() {
    // The scripted Anthropic provider bills 20 output tokens whatever the request's limit.
    let model = FakeModel::start(vec![Step::text("long"), Step::text("never")]);
    let rules = Rules {
        list: None,
        cap: Some(1.0),
    };
    let (gw, key) = gateway(&anthropic_overlay(&model), rules, PROVIDER).await;
    let url = format!("{}/v1/messages", gw.base_url(PROVIDER).unwrap());
    let body = json!({"model": MODEL, "max_tokens": 5, "stream": false,
        "messages": [{"role": "user", "content": "hello"}]});
    let (status, text) = post(&url, &[("x-api-key", &key.stand_in)], &body).await;
    assert_eq!(status, 200, "{text}");
    settled(&gw, 1).await;
    let stop = gw.refusal().expect("the bill past the bound stops the job");
    assert_eq!(stop.reason, Reason::ModelCallUnbounded);
    assert!(stop.cause.contains("past its worst case"), "{}", stop.cause);
    // Nothing more goes out.
    let (status, _) = post(&url, &[("x-api-key", &key.stand_in)], &body).await;
    assert_eq!(status, 403);
    assert_eq!(model.requests().len(), 1);
}

/// pi's own OpenRouter: its chat, classifier and image models, at the fake's address.
fn openrouter_overlay(model: &FakeModel) -> Value {
    json!({"providers": {"openrouter": {"baseUrl": format!("{}", model.base_url())}}})
}

/// An OpenRouter model of `kind` and its prices, from pi's catalog.
fn openrouter_model(
    kind: config::catalog::ModelKind,
    priced: bool,
) -> (String, config::catalog::Prices) {
    let p = config::catalog::builtin_provider("openrouter").unwrap();
    let e = p
        .entries
        .iter()
        .find(|e| e.kind == kind && (e.cost.input > 0.0) == priced && e.tiers.is_empty())
        .unwrap();
    (e.id.clone(), e.cost)
}

#[tokio::test]
async fn classifier_and_image_calls_are_metered_and_held_to_the_cap() {
    use config::catalog::ModelKind;
    let model = FakeModel::start(vec![]);
    let (classifier, c_price) = openrouter_model(ModelKind::Classifier, true);
    let (image, i_price) = openrouter_model(ModelKind::Image, true);
    let (free_image, _) = openrouter_model(ModelKind::Image, false);
    let (gw, key) = gateway(&openrouter_overlay(&model), Rules::default(), "openrouter").await;
    let base = gw.base_url("openrouter").unwrap();
    let bearer = format!("Bearer {}", key.stand_in);
    let auth = [("authorization", bearer.as_str())];
    let classify = json!({"model": classifier, "state": {"m": "ok"},
        "questions": {"good": {"type": "noul", "instructions": "good?", "criteria": {"true": "y", "false": "n"}}}});
    let (status, text) = post(&format!("{base}/systemone"), &auth, &classify).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["answers"]["good"]["noul"],
        0.9
    );
    let paint = |id: &str| {
        json!({"model": id, "stream": false, "modalities": ["image"],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "a fox"}]}]})
    };
    for id in [&image, &free_image] {
        let (status, text) = post(&format!("{base}/chat/completions"), &auth, &paint(id)).await;
        assert_eq!(status, 200, "{text}");
        assert!(text.contains("data:image/png;base64,"), "{text}");
    }
    let kinds: Vec<Kind> = model.requests().iter().map(|r| r.kind()).collect();
    assert_eq!(kinds, [Kind::SystemOne, Kind::Images, Kind::Images]);
    let meter = settled(&gw, 3).await;
    let expected = (CLASSIFIER_USAGE.0 as f64 * c_price.input
        + IMAGE_USAGE.0 as f64 * i_price.input
        + IMAGE_USAGE.1 as f64 * i_price.output)
        / 1e6;
    // The image model priced at zero counts its tokens at nothing.
    assert!(
        (meter.cost_usd - expected).abs() < 1e-12,
        "{meter:?} {expected}"
    );
    assert_eq!(meter.input_tokens, CLASSIFIER_USAGE.0 + 2 * IMAGE_USAGE.0);
    assert_eq!(meter.output_tokens, CLASSIFIER_USAGE.1 + 2 * IMAGE_USAGE.1);

    // Under a cap: the classifier (no output price) is bounded by its input and goes; an image
    // call, even of a model priced at zero, is refused.
    let capped = Rules {
        list: None,
        cap: Some(1.0),
    };
    let (gw, key) = gateway(&openrouter_overlay(&model), capped, "openrouter").await;
    let base = gw.base_url("openrouter").unwrap();
    let bearer = format!("Bearer {}", key.stand_in);
    let auth = [("authorization", bearer.as_str())];
    let (status, _) = post(&format!("{base}/systemone"), &auth, &classify).await;
    assert_eq!(status, 200);
    let (status, text) = post(
        &format!("{base}/chat/completions"),
        &auth,
        &paint(&free_image),
    )
    .await;
    assert_eq!(status, 403, "{text}");
    let stop = gw.refusal().unwrap();
    assert_eq!(stop.reason, Reason::ModelCallUnbounded);
    assert!(stop.cause.contains(&free_image), "{}", stop.cause);
    assert_eq!(model.requests().len(), 4);
}

#[tokio::test]
async fn the_gateway_goes_through_the_runners_proxy() {
    // The "proxy" is the scripted provider itself: a plain-http request through a proxy carries
    // the whole URL, here one of an address that answers nothing.
    let proxy = FakeModel::start(vec![Step::text("via the proxy")]);
    let overlay = json!({"providers": {PROVIDER: {"baseUrl": "http://127.0.0.1:9/v1", "api": "openai-completions",
        "apiKey": "$FAKE_KEY", "models": [{"id": MODEL}]}}});
    let models = config::models::check(overlay.to_string().as_bytes()).unwrap();
    let key = HeldKey::new(PROVIDER, REAL_KEY.to_owned()).unwrap();
    let proxy_url = format!("http://127.0.0.1:{}", proxy.port);
    let env = |name: &str| (name == "HTTP_PROXY").then(|| proxy_url.clone());
    let (https_proxy, http_proxy) = GatewayOptions::proxies(&env);
    assert_eq!(https_proxy, None);
    let gw = Gateway::start(GatewayOptions {
        table: Table::build(config::catalog::builtin(), Some(&models)),
        rules: Rules::default(),
        key: Some(key.clone()),
        https_proxy,
        http_proxy,
    })
    .await
    .unwrap();
    let url = format!("{}/chat/completions", gw.base_url(PROVIDER).unwrap());
    let bearer = format!("Bearer {}", key.stand_in);
    let (status, text) = post(&url, &[("authorization", &bearer)], &chat_body(true)).await;
    assert_eq!(status, 200, "{text}");
    let seen = proxy.requests();
    assert_eq!(seen[0].path, "http://127.0.0.1:9/v1/chat/completions");
    assert_eq!(
        seen[0].authorization.as_deref(),
        Some(format!("Bearer {REAL_KEY}").as_str())
    );
}

#[tokio::test]
async fn a_provider_that_cannot_be_reached_is_a_connection_that_fails() {
    let overlay = json!({"providers": {PROVIDER: {"baseUrl": "http://127.0.0.1:9/v1", "api": "openai-completions",
        "apiKey": "$FAKE_KEY", "models": [{"id": MODEL}]}}});
    let (gw, key) = gateway(&overlay, Rules::default(), PROVIDER).await;
    let url = format!("{}/chat/completions", gw.base_url(PROVIDER).unwrap());
    let sent = reqwest::Client::new()
        .post(&url)
        .header("authorization", format!("Bearer {}", key.stand_in))
        .json(&chat_body(true))
        .send()
        .await;
    // pi sees what it would have seen without the gateway: no answer at all.
    assert!(sent.is_err(), "{sent:?}");
    assert_eq!(gw.refusal(), None);
}

/// A job's processes that hold the gateway's connections open cannot grow it: past its bound,
/// each new one is turned away and counted (so that a pi that then cannot reach it is recorded as
/// its model unreachable, not as an agent failure); the control: below the bound, a call is
/// answered.
#[tokio::test]
async fn connections_past_the_bound_are_turned_away_and_counted() {
    use hub::gateway::MAX_CONNECTIONS;
    let model = FakeModel::start(vec![Step::text("hello")]);
    let (gw, key) = gateway(&openai_overlay(&model), Rules::default(), PROVIDER).await;
    let url = format!("{}/chat/completions", gw.base_url(PROVIDER).unwrap());
    let auth = format!("Bearer {}", key.stand_in);
    let (status, _) = post(&url, &[("authorization", &auth)], &chat_body(false)).await;
    assert_eq!(status, 200, "the control: a call is answered");
    let mut held = Vec::new();
    for _ in 0..MAX_CONNECTIONS + 20 {
        held.push(tokio::net::TcpStream::connect(gw.addr()).await.unwrap());
    }
    // The turned-away ones are closed by the gateway: reading them ends at once.
    let mut closed = 0;
    for stream in held.iter_mut().rev().take(20) {
        use tokio::io::AsyncReadExt as _;
        let mut byte = [0u8; 1];
        let read =
            tokio::time::timeout(std::time::Duration::from_secs(5), stream.read(&mut byte)).await;
        if matches!(read, Ok(Ok(0)) | Ok(Err(_))) {
            closed += 1;
        }
    }
    assert!(closed >= 19, "{closed} of the last 20 were closed");
    drop(held);
    let seen = gw.finish().await;
    assert!(seen.turned_away >= 19, "{}", seen.turned_away);
}
