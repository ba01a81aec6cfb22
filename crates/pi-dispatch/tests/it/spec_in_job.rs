//! Rules of the MCP spec ("In the job", "The forge's own server") checked in real jobs: the worker,
//! bubblewrap, the runner, real pi driven by the scripted model, real MCP servers from the image.
//! Each refusal or absence is shown beside a control that proves the same setup otherwise works.

use serde_json::{Value, json};
use testkit::fake_forge::FakeForge;
use testkit::fake_model::{FakeModel, Step};

use crate::forge::{Kind, Site};
use crate::worker::{EVERYTHING, Service};

/// The description of the server the prompt must list, as the overlay writes it.
const LISTED: &str = "Answers questions about the warehouse, ref 7f2c";
/// The description of the hidden server, which the prompt must not carry.
const UNLISTED: &str = "Hidden warehouse tools, ref 91d4";

/// server-everything over stdio, with `extra` members.
fn everything(extra: Value) -> Value {
    let mut entry = json!({"command": "node", "args": [EVERYTHING, "stdio"]});
    for (k, v) in extra.as_object().unwrap() {
        entry[k] = v.clone();
    }
    entry
}

/// The system prompt of a request to the model.
fn system_prompt(request: &testkit::fake_model::Request) -> String {
    request.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "system")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_else(|| panic!("no system message: {}", request.body))
        .to_owned()
}

/// One job with four servers: `described` (codemode, listed in the prompt by its description),
/// `shown` (direct, its get-sum hidden by toolExposure), `hidden` (exposure hidden) and `started`
/// (a stdio server that notes the folder it started in). The model reaches `shown`'s resources
/// through pi's three resource tools, and tries the hidden tools by every route.
#[test]
fn a_jobs_servers_are_described_exposed_and_started_as_the_spec_says() {
    let codemode = "const out = {names: ALL_TOOLS.map((t) => t.name)};\n\
        out.described = (await tools.mcp__described__echo({message: 'scripted control'})).content[0].text;\n\
        for (const name of ['mcp__hidden__echo', 'mcp__shown__get_sum']) {\n\
          try { await tools[name]({message: 'probe', a: 1, b: 2}); out[name] = 'REACHED'; }\n\
          catch (e) { out[name] = 'refused: ' + String(e && e.message); }\n\
        }\n\
        return JSON.stringify(out);";
    let s = Service::new(
        vec![
            Step::call("mcp__shown__echo", json!({"message": "shown control"})),
            Step::call("mcp__hidden__echo", json!({"message": "hidden probe"})),
            Step::call("mcp__shown__get_sum", json!({"a": 2, "b": 3})),
            Step::call("codemode", json!({"code": codemode})),
            Step::call("list_mcp_resources", json!({"server": "shown"})),
            Step::call("list_mcp_resource_templates", json!({"server": "shown"})),
            Step::call(
                "read_mcp_resource",
                json!({"server": "shown", "uri": "demo://resource/dynamic/text/7"}),
            ),
            Step::call("mcp__started__get_env", json!({})),
            Step::text("done"),
        ],
        |_| {
            json!({
                "described": everything(json!({"description": LISTED})),
                "shown": everything(json!({"description": "Shown to the model", "exposure": "direct",
                    "toolExposure": {"get-sum": "hidden"}})),
                "hidden": everything(json!({"description": UNLISTED, "exposure": "hidden"})),
                "started": {"command": "sh", "args": ["-c",
                    format!("export STARTED_IN=\"$(pwd -P)\" CHECKOUT=\"$(cat README.md)\"; exec node {EVERYTHING} stdio")],
                    "description": "Notes where it started", "exposure": "direct"},
            })
        },
        "",
    );
    let (_, record, results, worked) =
        s.complete("Use the servers.", "described,shown,hidden,started");
    let requests = s.model.requests();
    assert_eq!(requests.len(), 9, "{results:#?}\n{}", worked.stderr);

    // 1. The description is the server's line in the prompt's list of servers; the hidden server
    // has none.
    let prompt = system_prompt(&requests[0]);
    let line = format!("- mcp__described (codemode): {LISTED}");
    assert!(prompt.lines().any(|l| l == line), "{prompt}");
    assert!(!prompt.contains(UNLISTED), "{prompt}");
    assert!(!prompt.contains("mcp__hidden"), "{prompt}");

    // 2. Hidden tools are neither declared to the model nor reachable; the direct ones are.
    for r in &requests {
        let tools = r.tools();
        assert!(tools.iter().any(|t| t == "mcp__shown__echo"), "{tools:?}");
        assert!(
            tools.iter().any(|t| t == "mcp__started__get_env"),
            "{tools:?}"
        );
        for t in &tools {
            assert!(
                !t.starts_with("mcp__hidden__") && t != "mcp__shown__get_sum",
                "{t} was declared: {tools:?}"
            );
        }
    }
    assert!(results[1].contains("Echo: shown control"), "{results:#?}");
    assert!(
        results[2].contains("Tool mcp__hidden__echo not found"),
        "{results:#?}"
    );
    assert!(
        results[3].contains("Tool mcp__shown__get_sum not found"),
        "{results:#?}"
    );
    // From a codemode script: the codemode server's tool answers, the hidden ones are not there.
    let script: Value = results[4]
        .lines()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("{results:#?}"));
    assert_eq!(script["described"], "Echo: scripted control", "{script:#}");
    let names = script["names"].as_array().unwrap();
    assert!(
        names.iter().any(|n| n == "mcp__described__echo"),
        "{script:#}"
    );
    for name in ["mcp__hidden__echo", "mcp__shown__get_sum"] {
        assert!(!names.iter().any(|n| n == name), "{script:#}");
        assert!(
            script[name]
                .as_str()
                .unwrap()
                .starts_with(&format!("refused: tools.{name} does not exist")),
            "{script:#}"
        );
    }
    // No call reached a hidden tool at the hub.
    let calls = record["mcp"]["toolCalls"].as_array().unwrap();
    assert!(
        !calls
            .iter()
            .any(|c| c["server"] == "hidden" || c["tool"] == "get-sum"),
        "{record:#}"
    );
    assert!(
        calls
            .iter()
            .any(|c| c["server"] == "shown" && c["tool"] == "echo" && c["ok"] == 1),
        "{record:#}"
    );

    // 3. The resource tools reach the server's resources.
    assert!(
        results[5].contains("demo://resource/static/document/instructions.md"),
        "{results:#?}"
    );
    assert!(
        results[6].contains("demo://resource/dynamic/text/{resourceId}"),
        "{results:#?}"
    );
    assert!(
        results[7].contains("Resource 7: This is a plaintext resource created at"),
        "{results:#?}"
    );

    // 4. The stdio server started in /workspace, the checkout.
    let env: Value = serde_json::from_str(&results[8]).unwrap_or_else(|_| panic!("{results:#?}"));
    assert_eq!(env["STARTED_IN"], "/workspace", "{env:#}");
    assert_eq!(env["CHECKOUT"], "a repository", "{env:#}");
}

/// An overlay extension registering `name` as it loads, whose tool says that it ran.
fn extension(name: &str) -> String {
    format!(
        "export default function (pi) {{ pi.registerTool({{ name: {name:?}, label: 'probe', description: 'A probe', parameters: {{ type: 'object', properties: {{}} }}, async execute() {{ return {{ content: [{{ type: 'text', text: 'extension tool ran: ' + {name:?} }}] }}; }} }}); }}\n"
    )
}

/// An extension that takes a resource tool or an `mcp__` name as it loads ends the job before its
/// prompt (mcp-shadowed); the same extension with an innocent name loads, and its job runs and
/// calls it.
#[test]
fn an_extension_taking_a_resource_tool_or_an_mcp_name_ends_the_job_before_its_prompt() {
    let s = Service::new(
        vec![Step::call("extension_probe", json!({})), Step::text("done")],
        |_| json!({"everything": everything(json!({"description": "Everything", "exposure": "direct"}))}),
        "",
    );
    for name in ["read_mcp_resource", "mcp__extension__probe"] {
        s.d.write("pi-global/extensions/probe.js", &extension(name));
        let id = s.queue("Anything.", "everything");
        let worked = s.work();
        let record = s.record(&id);
        assert_eq!(
            (record["outcome"].as_str(), record["reason"].as_str()),
            (Some("policy"), Some("mcp-shadowed")),
            "{name}: {record:#}\n{}",
            worked.stderr
        );
        assert_eq!(record["exitCode"], 2, "{record:#}");
        assert!(s.model.requests().is_empty(), "{name}: the prompt went out");
    }
    // The control: the same extension, an innocent name.
    s.d.write(
        "pi-global/extensions/probe.js",
        &extension("extension_probe"),
    );
    let (_, _, results, _) = s.complete("Anything.", "everything");
    assert!(
        results[1].contains("extension tool ran: extension_probe"),
        "{results:#?}"
    );
    assert!(
        s.model.requests()[0]
            .tools()
            .iter()
            .any(|t| t == "read_mcp_resource"),
        "the job's own resource tools are there"
    );
}

const ANSWER: &str = "The forge's server was there.";

/// A gitlab job naming `forge`, with the egress policy on and the fake GitLab and the model on a
/// test host: refused (mcp-egress-unreachable) while GITLAB_URL's host and port are neither
/// allowlisted nor declared; admitted and run once declared; and refused (mcp-server-unknown, the
/// cause in the worker's log) when GITLAB_URL carries a fragment.
#[test]
fn a_gitlab_jobs_forge_server_needs_its_host_reachable_and_a_plain_gitlab_url() {
    let triggers = json!({"triggers": [
        {"on": {"type": "label", "any": ["triage"]}, "run": {"kind": "gitlab", "flow": "answer", "mcp": ["forge"]}}
    ]});
    let forge_mcp = testkit::forge_mcp_source();
    let mut site = Site::start(
        FakeForge::start_in,
        Vec::new(),
        triggers,
        &["--forge-mcp", forge_mcp.to_str().unwrap()],
    );
    // The model on the test host too, declared; the egress policy on (the default).
    let address = site.s.host.v4;
    site.s.model = FakeModel::start_in(&site.s.host, vec![Step::text(ANSWER)]);
    let d = &site.s.d;
    d.write(
        "pi-global/models.json",
        &site.s.model.models_json("FAKE_API_KEY"),
    );
    let env = std::fs::read_to_string(d.path().join(".env")).unwrap();
    assert!(env.contains("PI_EGRESS=0\n"));
    d.write(".env", &env.replace("PI_EGRESS=0\n", ""));
    let endpoint =
        |id: &str, port: u16| json!({"id": id, "host": address.to_string(), "port": port});
    d.write(
        "model-endpoints.json",
        &json!({"version": 1, "endpoints": [endpoint("model", site.s.model.port)]}).to_string(),
    );
    let gitlab_url = site.fake.gitlab_url();
    assert!(
        gitlab_url.starts_with(&format!("http://{address}:")),
        "{gitlab_url}"
    );

    let job = |number: u64| {
        let a = site.label(
            Kind::Gitlab,
            number,
            "triage",
            &format!("d-triage-{number}"),
        );
        assert_eq!(a["status"], 202, "{a}");
        let id = a["answer"]["jobs"][0].as_str().unwrap().to_owned();
        let worked = site.work();
        (site.s.record(&id), worked, id)
    };

    // Neither allowlisted nor declared: refused before anything is spent.
    let (record, worked, _) = job(1);
    assert_eq!(
        (record["outcome"].as_str(), record["reason"].as_str()),
        (Some("policy"), Some("mcp-egress-unreachable")),
        "{record:#}\n{}",
        worked.stderr
    );
    assert_eq!(record["detail"]["server"], "forge", "{record:#}");
    assert_eq!(
        (
            record["detail"]["host"].as_str(),
            record["detail"]["port"].as_u64()
        ),
        (
            Some(address.to_string().as_str()),
            Some(u64::from(site.fake.port()))
        ),
        "{record:#}"
    );
    assert_eq!(record["budgetReserved"], false);
    assert!(site.s.model.requests().is_empty());
    let comments = site.fake.comments(&Kind::Gitlab.issue_key(1));
    assert!(
        comments.len() == 1
            && comments[0].contains("mcp-egress-unreachable")
            && !comments[0].contains(&address.to_string()),
        "{comments:#?}"
    );

    // The control: its host and port declared, the same job is admitted and runs.
    d.write(
        "model-endpoints.json",
        &json!({"version": 1, "endpoints": [endpoint("model", site.s.model.port), endpoint("gitlab", site.fake.port())]})
            .to_string(),
    );
    let (record, worked, _) = job(2);
    assert_eq!(
        record["outcome"], "completed",
        "{record:#}\n{}",
        worked.stderr
    );
    assert_eq!(record["mcp"]["servers"][0]["name"], "forge", "{record:#}");
    let comments = site.fake.comments(&Kind::Gitlab.issue_key(2));
    assert!(
        comments.len() == 1 && comments[0].starts_with(ANSWER),
        "{comments:#?}"
    );

    // The same GITLAB_URL with a fragment: forge is refused, the cause in the worker's log.
    let env = std::fs::read_to_string(d.path().join(".env")).unwrap();
    let line = format!("GITLAB_URL={gitlab_url}\n");
    assert!(env.contains(&line), "{env}");
    d.write(
        ".env",
        &env.replace(&line, &format!("GITLAB_URL={gitlab_url}#x\n")),
    );
    let (record, worked, id) = job(3);
    assert_eq!(
        (record["outcome"].as_str(), record["reason"].as_str()),
        (Some("policy"), Some("mcp-server-unknown")),
        "{record:#}\n{}",
        worked.stderr
    );
    assert_eq!(record["detail"]["server"], "forge", "{record:#}");
    assert_eq!(record["budgetReserved"], false);
    let logged = worked
        .stderr
        .lines()
        .find(|l| l.contains("refused_mcp") && l.contains(&id))
        .unwrap_or_else(|| panic!("no refused_mcp line: {}", worked.stderr));
    assert!(
        logged.contains("mcp-server-unknown")
            && logged.contains("GITLAB_URL")
            && logged.contains("fragment"),
        "{logged}"
    );
    assert_eq!(
        site.s.model.requests().len(),
        1,
        "only the control's job asked the model"
    );
}
