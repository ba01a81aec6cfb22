//! Real pi 1.6 in a job, behind the model gateway, driven by a scripted provider on loopback: the
//! provider's key (a canary) stays with the runner while pi's tools print pi's environment and read
//! its folder, the provider still gets the real key (OpenAI's and Anthropic's wire formats); and a
//! codemode script's `models.classify()` and `models.generateImages()` (pi's own OpenRouter models)
//! are metered into the exit line's usage, held to the job's model list and its cost cap, and stop
//! the job when refused. A pi that pi's bash tool starts is metered through the same gateway.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod runner_support;

use config::catalog::{self, ModelKind};
use protocol::exit_line::ExitLine;
use protocol::job_dir::RunnerInput;
use protocol::job_mcp::JobMcpFile;
use runner_support::job_file;
use runner_support::pi::{Folders, PiJob, folders, run_pi_job, walk};
use serde_json::{Value, json};
use testkit::fake_model::{
    CHAT_USAGE, CLASSIFIER_USAGE, FakeModel, IMAGE_USAGE, Kind, MODEL, PROVIDER, Step,
};

const CANARY: &str = "cnry-provider-key-8d3";

/// One stdio server-everything, so that codemode is on.
fn scripted() -> JobMcpFile {
    job_file(&[(
        "scripted",
        json!({"command": "node", "args": [testkit::everything().to_str().unwrap(), "stdio"],
            "description": "Everything, over stdio"}),
    )])
}

/// A job of pi with `model` (`provider/id`), the overlay's `models_json`, the provider's key
/// `CANARY` under `key_variable`, and the job's model rules: `models` (a JSON list) and `cap`.
async fn run_pi(
    f: &Folders,
    model: &str,
    models_json: &str,
    key_variable: &str,
    (models, cap): (Option<&str>, Option<f64>),
) -> ExitLine {
    let file = scripted();
    let vars = [(key_variable, CANARY)];
    run_pi_job(
        f,
        PiJob {
            id: "job-gw",
            file: &file,
            prompt: "Do the task, then say done.\n",
            models_json,
            model,
            vars: &vars,
            input: RunnerInput {
                models: models.map(|m| serde_json::from_str(m).unwrap()),
                max_cost_usd: cap,
                ..RunnerInput::default()
            },
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn the_providers_key_never_reaches_pi_and_still_reaches_the_provider() {
    let f = folders();
    // pi's bash tool writes everything it can see of the key: pi's environment and its parent's,
    // every process's value of the key's variable, and each file of pi's folder.
    let dump = "{ env; echo ---parent; tr '\\0' '\\n' < /proc/$PPID/environ; echo ---all; \
        for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ 2>/dev/null | grep -a '^FAKE_API_KEY='; done; \
        echo ---files; grep -ra . \"$PI_CODING_AGENT_DIR\"; } > dump.txt 2>&1; \
        grep -c . dump.txt; grep '^FAKE_API_KEY=' dump.txt; cat \"$PI_CODING_AGENT_DIR/models.json\"";
    let model = FakeModel::start(vec![
        Step::call("bash", json!({"command": dump})),
        Step::text("done"),
    ]);
    let line = run_pi(
        &f,
        &format!("{PROVIDER}/{MODEL}"),
        &model.models_json("FAKE_API_KEY"),
        "FAKE_API_KEY",
        (None, None),
    )
    .await;
    let requests = model.requests();
    assert_eq!(line.code, 0, "{line:?}");
    assert_eq!(requests.len(), 2);
    let seen = requests[1].last_text();
    // pi has a stand-in under the key's variable, and its models.json points at the gateway.
    assert!(
        seen.contains("FAKE_API_KEY=pi-dispatch-stand-in-"),
        "{seen}"
    );
    assert!(seen.contains("/p/"), "{seen}");
    assert!(
        !seen.contains(&format!("127.0.0.1:{}", model.port)),
        "{seen}"
    );
    let dumped = std::fs::read_to_string(f.workspace.join("dump.txt")).unwrap();
    assert!(dumped.contains("---files"), "{dumped}");
    // The canary is in nothing pi or its tools saw, sent or wrote.
    assert!(!dumped.contains(CANARY), "pi's tools found the key");
    for r in &requests {
        assert!(
            !r.body.to_string().contains(CANARY),
            "the key is in what pi sent"
        );
        // ... and the provider got it all the same.
        assert_eq!(
            r.authorization.as_deref(),
            Some(format!("Bearer {CANARY}").as_str())
        );
    }
    for file in walk(&f.agent) {
        let text = std::fs::read(&file).unwrap();
        assert!(
            !String::from_utf8_lossy(&text).contains(CANARY),
            "{} holds the key",
            file.display()
        );
    }
    assert!(!serde_json::to_string(&line).unwrap().contains(CANARY));
    // Both calls went through the gateway and were metered.
    let usage = line.usage.unwrap();
    assert_eq!(usage.input_tokens, 2 * CHAT_USAGE.0, "{usage:?}");
    assert_eq!(usage.turns, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_anthropic_provider_gets_the_real_key_as_x_api_key() {
    let f = folders();
    let model = FakeModel::start(vec![
        Step::call("bash", json!({"command": "env | grep '^FAKE_API_KEY='"})),
        Step::text("done"),
    ]);
    let line = run_pi(
        &f,
        &format!("{PROVIDER}/{MODEL}"),
        &model.anthropic_models_json("FAKE_API_KEY"),
        "FAKE_API_KEY",
        (None, None),
    )
    .await;
    let requests = model.requests();
    assert_eq!(line.code, 0, "{line:?}");
    assert_eq!(requests.len(), 2);
    for r in &requests {
        assert_eq!(r.kind(), Kind::AnthropicChat);
        assert!(r.stream());
        assert_eq!(r.header("x-api-key"), Some(CANARY));
    }
    let seen = requests[1].last_text();
    assert!(
        seen.contains("FAKE_API_KEY=pi-dispatch-stand-in-"),
        "{seen}"
    );
    assert!(!seen.contains(CANARY));
    let usage = line.usage.unwrap();
    assert_eq!(
        (usage.input_tokens, usage.output_tokens),
        (2 * CHAT_USAGE.0, 2 * CHAT_USAGE.1)
    );
}

/// pi's OpenRouter, moved to the scripted provider by the overlay.
fn openrouter(model: &FakeModel) -> String {
    json!({"providers": {"openrouter": {"baseUrl": model.base_url()}}}).to_string()
}

/// An OpenRouter model of `kind` from pi's catalog: priced or free, without price tiers, and for
/// chat one pi sends over chat completions.
fn pick(kind: ModelKind, priced: bool) -> (String, catalog::Prices, Option<u64>) {
    let p = catalog::builtin_provider("openrouter").unwrap();
    let e = p
        .entries
        .iter()
        .filter(|e| e.kind == kind && e.tiers.is_empty() && (e.cost.input > 0.0) == priced)
        .filter(|e| {
            kind != ModelKind::Chat || p.endpoint_of(e).unwrap().api == "openai-completions"
        })
        .min_by(|a, b| {
            let worst = |e: &catalog::Entry| e.cost.output * e.max_tokens.unwrap_or(0) as f64;
            worst(a).total_cmp(&worst(b))
        })
        .unwrap();
    (e.id.clone(), e.cost, e.max_tokens)
}

/// A codemode script calling `models.<call>(model, context)` and returning how it ended.
fn script(calls: &[(&str, &str)]) -> Value {
    let body: Vec<String> = calls
        .iter()
        .map(|(call, id)| {
            let context = if *call == "classify" {
                r#"{state: {message: "it works"}, questions: {good: {type: "bool", instructions: "Is it good?", criteria: {true: "yes", false: "no"}}}}"#
            } else {
                r#"{input: [{type: "text", text: "a red fox"}]}"#
            };
            format!(
                "{{ const r = await models.{call}({{provider: 'openrouter', id: {id:?}}}, {context}); \
                 out.push(r.stopReason + ':' + (r.answers ? JSON.stringify(r.answers) : r.output.filter(b => b.type === 'image').length)); }}"
            )
        })
        .collect();
    json!({"code": format!("// @options: {{\"timeout_ms\": 60000}}\nconst out = []; {} return out.join(' | ');", body.join(" "))})
}

fn usd(tokens: u64, price: f64) -> f64 {
    tokens as f64 * price / 1e6
}

#[tokio::test(flavor = "multi_thread")]
async fn codemode_models_are_metered_held_to_the_list_and_stop_the_job_when_refused() {
    let f = folders();
    let (chat, chat_price, _) = pick(ModelKind::Chat, true);
    let (classifier, c_price, _) = pick(ModelKind::Classifier, true);
    let (image, i_price, _) = pick(ModelKind::Image, true);
    let (unlisted, _, _) = pick(ModelKind::Classifier, false);
    let model = FakeModel::start(vec![
        Step::call(
            "codemode",
            script(&[("classify", &classifier), ("generateImages", &image)]),
        ),
        Step::call("codemode", script(&[("classify", &unlisted)])),
        Step::text("never asked"),
    ]);
    let list = json!([
        format!("openrouter/{chat}"),
        format!("openrouter/{classifier}"),
        format!("openrouter/{image}")
    ]);
    let line = run_pi(
        &f,
        &format!("openrouter/{chat}"),
        &openrouter(&model),
        "OPENROUTER_API_KEY",
        (Some(&list.to_string()), None),
    )
    .await;
    let requests = model.requests();
    let kinds: Vec<Kind> = requests.iter().map(|r| r.kind()).collect();
    // The script's two calls reached the provider; the second script's classifier never did.
    assert_eq!(
        kinds,
        [
            Kind::OpenAiChat,
            Kind::SystemOne,
            Kind::Images,
            Kind::OpenAiChat
        ],
        "{line:?}"
    );
    let result = requests[3].last_text();
    assert!(result.contains("stop:{"), "{result}");
    assert!(result.contains("stop:1"), "{result}");
    for r in &requests {
        assert_eq!(
            r.authorization.as_deref(),
            Some(format!("Bearer {CANARY}").as_str())
        );
    }
    assert_eq!(line.code, 2, "{line:?}");
    assert_eq!(line.reason.as_deref(), Some("model-call-not-allowed"));
    assert!(
        line.cause.as_deref().unwrap().contains(&unlisted),
        "{line:?}"
    );
    // Every call is in the usage: two chat answers, the classifier and the image model.
    let usage = line.usage.clone().unwrap();
    assert_eq!(
        usage.input_tokens,
        2 * CHAT_USAGE.0 + CLASSIFIER_USAGE.0 + IMAGE_USAGE.0,
        "{usage:?}"
    );
    assert_eq!(
        usage.output_tokens,
        2 * CHAT_USAGE.1 + CLASSIFIER_USAGE.1 + IMAGE_USAGE.1
    );
    let cost = usd(2 * CHAT_USAGE.0, chat_price.input)
        + usd(2 * CHAT_USAGE.1, chat_price.output)
        + usd(CLASSIFIER_USAGE.0, c_price.input)
        + usd(IMAGE_USAGE.0, i_price.input)
        + usd(IMAGE_USAGE.1, i_price.output);
    assert!((usage.cost_usd - cost).abs() < 1e-12, "{usage:?} {cost}");
    assert_eq!(usage.turns, 2);
    assert!(!serde_json::to_string(&line).unwrap().contains(CANARY));
}

#[tokio::test(flavor = "multi_thread")]
async fn under_a_cost_cap_an_image_call_is_refused_and_stops_the_job() {
    let f = folders();
    let (chat, chat_price, max) = pick(ModelKind::Chat, true);
    let (classifier, c_price, _) = pick(ModelKind::Classifier, true);
    // Priced at zero, and refused all the same: its cost has no bound.
    let (image, _, _) = pick(ModelKind::Image, false);
    let model = FakeModel::start(vec![
        Step::call(
            "codemode",
            script(&[("classify", &classifier), ("generateImages", &image)]),
        ),
        Step::text("never asked"),
    ]);
    // Room for a few chat calls at their worst: the largest output at the output price.
    let cap = 10.0 * usd(max.unwrap(), chat_price.output) + 0.01;
    let line = run_pi(
        &f,
        &format!("openrouter/{chat}"),
        &openrouter(&model),
        "OPENROUTER_API_KEY",
        (None, Some(cap)),
    )
    .await;
    let kinds: Vec<Kind> = model.requests().iter().map(|r| r.kind()).collect();
    // The classifier (no output price) is bounded by its input and went; the image call did not.
    assert_eq!(kinds, [Kind::OpenAiChat, Kind::SystemOne], "{line:?}");
    assert_eq!(line.code, 2, "{line:?}");
    assert_eq!(line.reason.as_deref(), Some("model-call-unbounded"));
    assert!(line.cause.as_deref().unwrap().contains(&image), "{line:?}");
    let usage = line.usage.unwrap();
    assert_eq!(usage.input_tokens, CHAT_USAGE.0 + CLASSIFIER_USAGE.0);
    let cost = usd(CHAT_USAGE.0, chat_price.input)
        + usd(CHAT_USAGE.1, chat_price.output)
        + usd(CLASSIFIER_USAGE.0, c_price.input);
    assert!((usage.cost_usd - cost).abs() < 1e-12, "{usage:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chat_call_that_could_pass_the_cap_never_leaves() {
    let f = folders();
    let (chat, _, _) = pick(ModelKind::Chat, true);
    let model = FakeModel::start(vec![Step::text("never asked")]);
    let line = run_pi(
        &f,
        &format!("openrouter/{chat}"),
        &openrouter(&model),
        "OPENROUTER_API_KEY",
        (None, Some(0.000001)),
    )
    .await;
    assert!(model.requests().is_empty());
    assert_eq!(line.code, 2, "{line:?}");
    assert_eq!(line.reason.as_deref(), Some("cost-cap-reached"));
    let usage = line.usage.unwrap();
    assert_eq!((usage.input_tokens, usage.cost_usd), (0, 0.0));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pi_that_pis_bash_starts_is_metered_through_the_same_gateway() {
    let f = folders();
    let model = FakeModel::start(vec![
        Step::call(
            "bash",
            json!({"command": "pi --mode json --no-session --model fake/fake-model -p hello > /dev/null; echo nested-rc=$?"}),
        ),
        Step::text("nested done"),
        Step::text("done"),
    ]);
    let line = run_pi(
        &f,
        &format!("{PROVIDER}/{MODEL}"),
        &model.models_json("FAKE_API_KEY"),
        "FAKE_API_KEY",
        (None, None),
    )
    .await;
    let requests = model.requests();
    assert_eq!(line.code, 0, "{line:?}");
    assert_eq!(requests.len(), 3);
    assert!(requests[2].last_text().contains("nested-rc=0"));
    // The nested pi's call reached the provider with the real key, through the gateway.
    assert_eq!(
        requests[1].authorization.as_deref(),
        Some(format!("Bearer {CANARY}").as_str())
    );
    let usage = line.usage.unwrap();
    // Two turns are the job's pi's own; three calls were metered.
    assert_eq!(usage.turns, 2);
    assert_eq!(usage.input_tokens, 3 * CHAT_USAGE.0, "{usage:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_workers_model_rules_never_reach_pi() {
    let f = folders();
    let model = FakeModel::start(vec![
        Step::call(
            "bash",
            json!({"command": "env | grep -c '^PI_DISPATCH_M' ; echo counted"}),
        ),
        Step::text("done"),
    ]);
    let list = json!([format!("{PROVIDER}/{MODEL}")]).to_string();
    let line = run_pi(
        &f,
        &format!("{PROVIDER}/{MODEL}"),
        &model.models_json("FAKE_API_KEY"),
        "FAKE_API_KEY",
        (Some(&list), Some(5.0)),
    )
    .await;
    assert_eq!(line.code, 0, "{line:?}");
    let seen = model.requests()[1].last_text();
    assert!(
        seen.contains("0\\ncounted") || seen.contains("0\ncounted"),
        "{seen}"
    );
    // A value the worker does not write stops the job before pi starts.
    let f = folders();
    let line = run_pi(
        &f,
        &format!("{PROVIDER}/{MODEL}"),
        &model.models_json("FAKE_API_KEY"),
        "FAKE_API_KEY",
        (None, Some(-1.0)),
    )
    .await;
    assert_eq!(
        line.reason.as_deref(),
        Some("model-rules-invalid"),
        "{line:?}"
    );
    assert_eq!(model.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pi_that_a_stdio_server_starts_is_metered_through_the_same_gateway() {
    let f = folders();
    let cli = testkit::pi_package().join("dist/cli.js");
    // The server runs pi once as it starts (before the job's pi has its prompt), then serves.
    let start = format!(
        "node '{}' --mode json --no-session --model {PROVIDER}/{MODEL} -p hello < /dev/null > '{}' 2>&1; exec node '{}' stdio",
        cli.display(),
        f.workspace.join("child.out").display(),
        testkit::everything().display()
    );
    let file = job_file(&[(
        "starter",
        json!({"command": "sh", "args": ["-c", start], "description": "starts a pi"}),
    )]);
    let model = FakeModel::start(vec![Step::text("child done"), Step::text("done")]);
    let line = run_pi_job(
        &f,
        PiJob {
            id: "job-child",
            file: &file,
            prompt: "Say done.\n",
            models_json: &model.models_json("FAKE_API_KEY"),
            model: &format!("{PROVIDER}/{MODEL}"),
            vars: &[("FAKE_API_KEY", CANARY)],
            input: RunnerInput::default(),
        },
    )
    .await;
    let requests = model.requests();
    let child = std::fs::read_to_string(f.workspace.join("child.out")).unwrap_or_default();
    assert_eq!(line.code, 0, "{line:?}\n{child}");
    assert_eq!(requests.len(), 2, "{child}");
    // The child's call went through the gateway: the provider has the real key, and the child
    // connected no MCP server (it got --no-mcp).
    assert_eq!(
        requests[0].authorization.as_deref(),
        Some(format!("Bearer {CANARY}").as_str())
    );
    assert!(
        requests[0].last_text().contains("hello"),
        "{:?}",
        requests[0].body
    );
    assert!(!requests[0].tools().iter().any(|t| t.starts_with("mcp__")));
    assert!(child.contains("child done"), "{child}");
    let usage = line.usage.unwrap();
    assert_eq!(usage.turns, 1);
    assert_eq!(usage.input_tokens, 2 * CHAT_USAGE.0, "{usage:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_nested_pi_on_a_model_off_the_list_stops_the_job() {
    let f = folders();
    let model = FakeModel::start(vec![
        Step::call(
            "bash",
            json!({"command": "pi --mode json --no-session --model fake/fake-other -p hi < /dev/null > /dev/null; echo rc=$?"}),
        ),
        Step::text("never asked"),
    ]);
    let models = json!({"providers": {PROVIDER: {"baseUrl": model.base_url(), "api": "openai-completions",
        "apiKey": "$FAKE_API_KEY", "compat": {"supportsDeveloperRole": false, "supportsReasoningEffort": false},
        "models": [{"id": MODEL}, {"id": "fake-other"}]}}});
    let list = json!([format!("{PROVIDER}/{MODEL}")]).to_string();
    let line = run_pi(
        &f,
        &format!("{PROVIDER}/{MODEL}"),
        &models.to_string(),
        "FAKE_API_KEY",
        (Some(&list), None),
    )
    .await;
    assert_eq!(
        line.reason.as_deref(),
        Some("model-call-not-allowed"),
        "{line:?}"
    );
    assert!(
        line.cause.as_deref().unwrap().contains("fake/fake-other"),
        "{line:?}"
    );
    assert_eq!(model.requests().len(), 1);
    assert_eq!(line.usage.unwrap().input_tokens, CHAT_USAGE.0);
}
