//! A hijacked job against its own cost cap and an operator's narrowed policy, as real jobs through
//! the worker with real pi: pi's bash tool reads the stand-in key and the gateway's address, and
//! calls the model gateway itself with requests whose cost its fields multiply (`n`), extend (a
//! reasoning budget) or leave open (a provider-run tool); a rerun and a retry of a trigger's job
//! after the operator lowered its cap and took away one of its servers and models. The controls:
//! each probe's first request goes through and is billed (the probe reached the provider), and
//! the same job under the trigger as it was completes at a cost past today's cap.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use testkit::fake_model::Step;

use crate::worker::{Service, queued_id, stdio};

/// The probe: the stand-in key and the gateway's address as pi's tools find them (pi's agent
/// folder and its key variable), one request the cap allows (two answers of one token: the
/// control), then the attack's request; each answer's status is printed.
const SPEND: &str = r#"
import { readFileSync } from "node:fs";
const models = JSON.parse(readFileSync(`${process.env.PI_CODING_AGENT_DIR}/models.json`, "utf8"));
const base = models.providers.fake.baseUrl;
async function call(extra) {
  const body = { model: "fake-model", messages: [{ role: "user", content: "spend" }], ...extra };
  const r = await fetch(`${base}/chat/completions`, { method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${process.env.FAKE_API_KEY}` },
    body: JSON.stringify(body) });
  console.log(`status ${r.status}: ${(await r.text()).slice(0, 120)}`);
}
await call({ max_tokens: 1, n: 2 });
await call(JSON.parse(process.argv[2]));
"#;

/// The fake provider at `per_million` USD a million output tokens (input is free), 20 tokens an
/// answer at most (the fake's own answers are 20 tokens long).
fn priced_models(s: &Service, per_million: f64) -> String {
    let cost = json!({"input": 0, "output": per_million, "cacheRead": 0, "cacheWrite": 0});
    json!({"providers": {"fake": {"baseUrl": s.model.base_url(), "api": "openai-completions",
        "apiKey": "$FAKE_API_KEY", "compat": {"supportsDeveloperRole": false, "supportsReasoningEffort": false},
        "models": [{"id": "fake-model", "maxTokens": 20, "cost": cost},
                   {"id": "fake-other", "maxTokens": 20, "cost": cost}]}}})
    .to_string()
}

/// A cron trigger that does not fire while a test runs (the operator runs it with `run
/// --trigger 0`), on the service's repository, with these run fields over the base ones.
fn trigger(s: &Service, run: Value) -> Value {
    let mut base = json!({"kind": "local", "folder": s.repo.to_str().unwrap(), "task": "Spend.",
        "flow": "task", "provider": "fake", "model": "fake-model"});
    for (k, v) in run.as_object().unwrap() {
        base[k] = v.clone();
    }
    json!({"triggers": [{"on": {"type": "cron", "id": "spend", "pattern": "0 0 1 1 *"}, "run": base}]})
}

fn run_trigger(s: &Service) -> String {
    let run = s.cli(&["run", "--trigger", "0"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    queued_id(&run)
}

fn cost(record: &Value) -> f64 {
    record["costUsd"].as_f64().unwrap_or(0.0)
}

#[test]
fn a_jobs_own_calls_to_its_gateway_cannot_spend_past_its_cap() {
    // Each attack, and what the gateway says of it.
    let attacks = [
        (
            json!({"max_tokens": 1, "n": 128}),
            "cost-cap-reached",
            "could cost up to",
        ),
        (
            json!({"max_tokens": 1, "reasoning": {"max_tokens": 5000}}),
            "cost-cap-reached",
            "could cost up to",
        ),
        (
            json!({"max_tokens": 1, "web_search_options": {}}),
            "model-call-unbounded",
            "web_search_options",
        ),
    ];
    let script = attacks
        .iter()
        .flat_map(|(attack, _, _)| {
            [
                Step::call(
                    "bash",
                    json!({"command": format!("node /workspace/spend.mjs '{attack}'")}),
                ),
                Step::text("the control answered"),
            ]
        })
        .collect();
    let s = Service::new(script, |_| json!({"everything": stdio(None)}), "");
    // 0.1 USD an output token.
    s.d.write("pi-global/models.json", &priced_models(&s, 100_000.0));
    std::fs::write(s.repo.join("spend.mjs"), SPEND).unwrap();
    let cap = 10.0;
    s.d.write(
        "triggers.json",
        &trigger(&s, json!({"mcp": ["everything"], "maxCostUsd": cap})).to_string(),
    );
    s.seal();
    for (n, (attack, reason, said)) in attacks.iter().enumerate() {
        let id = run_trigger(&s);
        s.work();
        let record = s.record(&id);
        assert_eq!(record["reason"], *reason, "{record:#}\n{:#?}", s.results());
        assert_eq!(record["outcome"], "policy", "{record:#}");
        let why = record["detail"]["why"].as_str().unwrap_or_default();
        assert!(why.contains(said), "{why}");
        // pi's own turn (20 tokens) and the control (two answers of one token): 2.2 USD.
        assert!(cost(&record) <= cap, "{record:#}");
        assert!((cost(&record) - 2.2).abs() < 1e-9, "{record:#}");
        // The control reached the provider and was billed for both its answers; the attack
        // reached nothing.
        let requests = s.model.requests();
        let probes: Vec<&Value> = requests
            .iter()
            .map(|r| &r.body)
            .filter(|b| b["messages"][0]["content"] == "spend")
            .collect();
        assert_eq!(probes.len(), n + 1, "{attack}: {probes:#?}");
        assert_eq!(probes[n]["n"], 2, "{probes:#?}");
        assert_eq!(record["tokens"]["output"], 22, "{record:#}");
    }
}

/// The trigger's job, run under the trigger as it is, then narrowed: a rerun and a retry run
/// under the narrowed trigger, and a retry has only what its earlier attempt left of the cap.
#[test]
fn a_rerun_and_a_retry_run_under_the_trigger_as_it_is_now() {
    let s = Service::new(
        vec![
            // The first job, under the trigger as it was.
            Step::text("done, at 0.2 USD"),
            // The retried job: its first attempt is cut off after one turn.
            Step::call("bash", json!({"command": "echo first attempt"})),
            Step::DownForThisRun(502),
        ],
        |_| json!({"first": stdio(None), "second": stdio(None)}),
        "",
    );
    // 0.01 USD an output token: a turn of 20 tokens costs 0.2.
    s.d.write("pi-global/models.json", &priced_models(&s, 10_000.0));
    let policy = |cap: f64, mcp: Value| {
        trigger(
            &s,
            json!({"mcp": mcp, "models": ["fake/fake-model", "fake/fake-other"], "maxCostUsd": cap}),
        )
        .to_string()
    };
    let loose = policy(100.0, json!(["first", "second"]));
    s.d.write("triggers.json", &loose);
    s.seal();
    // The control: under the trigger as it was, the job completes at 0.2 USD.
    let first = run_trigger(&s);
    s.work();
    let record = s.record(&first);
    assert_eq!(record["outcome"], "completed", "{record:#}");
    assert!((cost(&record) - 0.2).abs() < 1e-9, "{record:#}");
    assert_eq!(servers(&record), ["first", "second"]);

    // The operator lowers the cap below that and takes a server away; the rerun runs under it.
    s.d.write("triggers.json", &policy(0.15, json!(["first"])));
    let rerun = s.cli(&["rerun", &first]);
    assert_eq!(rerun.code, 0, "{}", rerun.stderr);
    let again = rerun
        .stdout
        .split_whitespace()
        .nth(1)
        .unwrap()
        .trim_end_matches(',');
    s.work();
    let record = s.record(again);
    assert_eq!(record["reason"], "cost-cap-reached", "{record:#}");
    assert!(cost(&record) <= 0.15, "{record:#}");
    assert_eq!(servers(&record), ["first"], "{record:#}");
    assert_eq!(record["job"]["maxCostUsd"], 0.15, "{record:#}");
    assert_eq!(record["job"]["mcp"], json!(["first"]), "{record:#}");

    // A model the trigger no longer lists: the rerun is refused before it is queued.
    let other = trigger(
        &s,
        json!({"mcp": ["first"], "models": ["fake/fake-other"], "maxCostUsd": 100,
            "model": "fake-other"}),
    );
    s.d.write("triggers.json", &other.to_string());
    let refused = s.cli(&["rerun", &first]);
    assert_eq!(refused.code, 1, "{}", refused.stdout);
    assert!(
        refused.stderr.contains("model-not-allowed"),
        "{}",
        refused.stderr
    );
    // Another trigger in its place, then none: refused with the reason of its own.
    for file in [
        json!({"triggers": [{"on": {"type": "label", "any": ["pi"]},
            "run": {"kind": "github", "flow": "answer"}}]}),
        json!({"triggers": []}),
    ] {
        s.d.write("triggers.json", &file.to_string());
        let gone = s.cli(&["rerun", &first]);
        assert_eq!(gone.code, 1, "{}", gone.stdout);
        assert!(gone.stderr.contains("trigger-gone"), "{}", gone.stderr);
    }

    // A retry: queued under the loose trigger, which is narrowed while its first attempt runs
    // (after it spent 0.2 USD on its first turn).
    s.d.write("triggers.json", &loose);
    let retried = run_trigger(&s);
    let mut worker = s
        .worker_command(&[])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(120);
    let before = s.model.requests().len();
    while s.model.requests().len() < before + 2 {
        assert!(
            Instant::now() < until,
            "the first attempt never reached the model"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    s.d.write("triggers.json", &policy(0.35, json!(["first"])));
    assert!(worker.wait().unwrap().success());
    let record = s.record(&retried);
    assert_eq!(record["attempt"], 2, "{record:#}");
    let earlier = &record["earlierAttempts"][0];
    assert_eq!(earlier["reason"], "model-unreachable", "{record:#}");
    assert!((cost(earlier) - 0.2).abs() < 1e-9, "{record:#}");
    // The second attempt connected the one server left, and had 0.15 USD of the cap left: its
    // first turn could cost 0.2, so it stopped there, and both together stay within the cap.
    assert_eq!(servers(&record), ["first"], "{record:#}");
    assert_eq!(record["reason"], "cost-cap-reached", "{record:#}");
    assert!(cost(&record) <= 0.35, "{record:#}");
}

fn servers(record: &Value) -> Vec<String> {
    record["mcp"]["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_owned())
        .collect()
}
