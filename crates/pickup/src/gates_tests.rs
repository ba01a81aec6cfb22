//! Each reason: a job that is admitted, and the one change that refuses it with that reason.

use std::path::Path;

use config::triggers::parse_triggers;

use super::*;
use crate::reason::Reason;

const OVERLAY: &str = r#"{"mcpServers": {
  "docs": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer ${DOCS_TOKEN}"}, "description": "Docs"},
  "files": {"command": "/opt/pi-global/mcp/files", "env": {"FILES_TOKEN": "${FILES_TOKEN}"}, "description": "Files", "exposure": "deferred"},
  "memory": {"command": "npx", "args": ["-y", "m"], "allowPackageRunner": true, "description": "Memory"},
  "old": {"url": "https://old.example.com/mcp", "description": "Old", "enabled": false}
}}"#;

struct FakeFiles {
    mcp: Read,
    models: Read,
    allowlist: Read,
    endpoints: Read,
}

impl Files for FakeFiles {
    fn overlay_mcp(&self) -> Read {
        self.mcp.clone()
    }
    fn overlay_models(&self) -> Read {
        self.models.clone()
    }
    fn allowlist(&self) -> Read {
        self.allowlist.clone()
    }
    fn endpoints(&self) -> Read {
        self.endpoints.clone()
    }
}

/// Image labels: what every image declares, or (with a name) what only that image declares.
struct FakeImages(Capabilities, Option<&'static str>);

impl ImageLabels for FakeImages {
    fn capabilities(&self, image: &str) -> Capabilities {
        match self.1 {
            Some(only) if only != image => Capabilities::Declared(Vec::new()),
            _ => self.0.clone(),
        }
    }
}

struct FakeEnv(Vec<&'static str>);

impl WorkerEnv for FakeEnv {
    fn has_value(&self, name: &str) -> bool {
        self.0.contains(&name)
    }
}

/// Everything a decision reads, owned, so each test changes one thing.
struct World {
    job: Job,
    trigger_now: Option<Trigger>,
    settings: Settings,
    files: FakeFiles,
    images: FakeImages,
    env: FakeEnv,
}

fn bytes(s: &str) -> Read {
    Read::Bytes(s.as_bytes().to_vec())
}

fn settings(pairs: &[(&str, &str)]) -> Settings {
    let pairs: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    config::settings::resolve(
        &|n| pairs.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone()),
        Path::new("/srv/d"),
    )
    .unwrap()
}

const TRIGGERS: &str = r#"{"triggers": [{
  "on": {"type": "label", "any": ["pi"]},
  "run": {"kind": "github", "flow": "fix", "mcp": ["forge", "docs", "files", "memory"],
          "secrets": {"DOCS_TOKEN": "op://ci/docs"}, "provider": "openai", "model": "gpt",
          "models": ["openai/gpt"], "maxCostUsd": 5}
}]}"#;

/// A github job naming forge and three overlay servers, egress on, that is admitted.
fn world() -> World {
    let trigger = parse_triggers(TRIGGERS.as_bytes())
        .unwrap()
        .triggers
        .remove(0);
    World {
        job: Job::from_trigger("job-1", &trigger),
        trigger_now: Some(trigger),
        settings: settings(&[
            ("PI_FORWARD_ENV", "FILES_TOKEN"),
            ("PI_PACKAGE_REGISTRIES", "npx=registry.example.org"),
            ("PI_JOB_IMAGE", "pi-job"),
        ]),
        files: FakeFiles {
            mcp: bytes(OVERLAY),
            models: bytes(r#"{"providers": {"local": {"apiKey": "$LOCAL_KEY"}}}"#),
            allowlist: bytes("mcp.example.com\napi.github.com\nregistry.example.org\n"),
            endpoints: Read::Missing,
        },
        images: FakeImages(
            Capabilities::Declared(vec!["mcp".into(), "forgeMcp".into()]),
            None,
        ),
        env: FakeEnv(vec!["FILES_TOKEN"]),
    }
}

fn decide_in(w: &World) -> Decision {
    decide(&Inputs {
        job: &w.job,
        trigger_now: w.trigger_now.as_ref(),
        settings: &w.settings,
        files: &w.files,
        images: &w.images,
        env: &w.env,
    })
}

/// Applies `change` to an admitted world and checks it is refused for `reason`, naming `server`.
fn refused_by(reason: Reason, server: Option<&str>, change: impl FnOnce(&mut World)) -> Refusal {
    assert!(
        matches!(decide_in(&world()), Decision::Admit { .. }),
        "the base world is admitted"
    );
    let mut w = world();
    change(&mut w);
    match decide_in(&w) {
        Decision::Refuse(r) => {
            assert_eq!(r.reason, reason, "{r:?}");
            assert_eq!(r.server.as_deref(), server, "{r:?}");
            assert_eq!(r.log.event, "refused_mcp");
            assert_eq!(r.log.reason, reason);
            // The comment names the server and the rule, never a variable or host the detail has.
            for word in r
                .log
                .detail
                .split(|c: char| c.is_whitespace() || c == ',' || c == ':')
            {
                let variable =
                    word.len() > 2 && word.bytes().all(|b| b.is_ascii_uppercase() || b == b'_');
                let file = [".json", ".conf"].iter().any(|e| word.ends_with(e));
                let host = !file
                    && word.contains('.')
                    && word
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
                if variable || host {
                    assert!(!r.comment.contains(word), "{word} in {}", r.comment);
                }
            }
            assert_eq!(r.record(&w.job)["budgetReserved"], false);
            assert_eq!(r.record(&w.job)["outcome"], "policy");
            r
        }
        other => panic!("wanted {reason}, got {other:?}"),
    }
}

fn set_mcp(w: &mut World, names: &[&str]) {
    w.job.mcp = Some(names.iter().map(|n| n.to_string()).collect());
}

#[test]
fn the_base_job_is_admitted_with_its_servers_as_written() {
    let Decision::Admit { mcp: Some(file) } = decide_in(&world()) else {
        panic!("not admitted")
    };
    let parsed = config::json::parse(&file.text).unwrap();
    let servers = parsed
        .as_object()
        .unwrap()
        .get("mcpServers")
        .unwrap()
        .as_object()
        .unwrap();
    assert_eq!(
        servers.keys().collect::<Vec<_>>(),
        ["docs", "files", "memory", "forge"]
    );
    assert!(file.text.contains("Bearer ${DOCS_TOKEN}"));
    assert!(!file.text.contains("\"old\""));
}

#[test]
fn a_job_naming_no_server_is_admitted_without_an_mcp_json() {
    let mut w = world();
    w.job.mcp = None;
    w.trigger_now = None;
    assert_eq!(decide_in(&w), Decision::Admit { mcp: None });
}

#[test]
fn mcp_list_invalid() {
    for names in [
        &[][..],
        &["docs", "docs"][..],
        &["Docs"][..],
        &["a", "b", "c", "d", "e", "f", "g", "h", "i"][..],
    ] {
        refused_by(Reason::McpListInvalid, None, |w| set_mcp(w, names));
    }
}

#[test]
fn mcp_config_invalid() {
    for read in [
        Read::Missing,
        Read::Failed("is a link".into()),
        bytes("{,}"),
    ] {
        refused_by(Reason::McpConfigInvalid, None, |w| w.files.mcp = read);
    }
    // Missing is fine when the only name is forge.
    let mut w = world();
    set_mcp(&mut w, &["forge"]);
    w.files.mcp = Read::Missing;
    assert!(matches!(decide_in(&w), Decision::Admit { mcp: Some(_) }));
}

#[test]
fn mcp_server_unknown() {
    refused_by(Reason::McpServerUnknown, Some("wiki"), |w| {
        set_mcp(w, &["wiki"])
    });
    refused_by(Reason::McpServerUnknown, Some("old"), |w| {
        set_mcp(w, &["old"])
    });
    refused_by(Reason::McpServerUnknown, Some("docs"), |w| {
        w.files.mcp = bytes(
            r#"{"mcpServers": {"docs": {"url": "https://h.example.com/mcp", "headers": {"A": "lit"}, "description": "d"}}}"#,
        );
        set_mcp(w, &["docs"]);
    });
    refused_by(Reason::McpServerUnknown, Some("forge"), |w| {
        w.job.kind = "forgejo".into();
        w.trigger_now = None;
    });
    // A gitlab job with a GITLAB_URL that is not plain.
    for url in [
        None,
        Some("https://u:p@gitlab.example.com"),
        Some("https://gitlab.example.com/?a=${B}"),
        Some("https://gitlab.example.com/a,b"),
    ] {
        refused_by(Reason::McpServerUnknown, Some("forge"), |w| {
            w.job.kind = "gitlab".into();
            w.trigger_now = None;
            w.settings.gitlab_url = url.map(str::to_owned);
            w.files.allowlist =
                bytes("mcp.example.com\ngitlab.example.com\nregistry.example.org\n");
        });
    }
}

#[test]
fn a_gitlab_job_gets_its_forge_entry_with_the_api_url() {
    let mut w = world();
    w.job.kind = "gitlab".into();
    w.trigger_now = None;
    w.settings.gitlab_url = Some("https://gitlab.example.com/api/v4/".into());
    w.files.allowlist = bytes("mcp.example.com\ngitlab.example.com\nregistry.example.org\n");
    let Decision::Admit { mcp: Some(file) } = decide_in(&w) else {
        panic!("not admitted")
    };
    assert!(
        file.text
            .contains("\"GITLAB_API_URL\": \"https://gitlab.example.com/api/v4\""),
        "{}",
        file.text
    );
}

#[test]
fn mcp_secret_reserved() {
    for var in [
        "OPENAI_API_KEY",
        "LOCAL_KEY",
        "GH_TOKEN",
        "GITLAB_TOKEN",
        "HTTPS_PROXY",
        "PI_JOB_ID",
        "NODE_OPTIONS",
    ] {
        let r = refused_by(Reason::McpSecretReserved, Some("docs"), |w| {
            w.files.mcp = bytes(&OVERLAY.replace("${DOCS_TOKEN}", &format!("${{{var}}}")));
            w.job.secrets.push(var.to_owned());
        });
        assert!(r.log.detail.contains(var));
        assert!(!r.comment.contains(var), "{}", r.comment);
    }
    // A provider's key on purpose: a model list without that provider frees it.
    let mut w = world();
    w.files.mcp = bytes(&OVERLAY.replace("${DOCS_TOKEN}", "${HF_TOKEN}"));
    w.job.secrets.push("HF_TOKEN".into());
    assert!(matches!(decide_in(&w), Decision::Admit { .. }));
    // Without a list, every provider's key is reserved.
    refused_by(Reason::McpSecretReserved, Some("docs"), |w| {
        w.files.mcp = bytes(&OVERLAY.replace("${DOCS_TOKEN}", "${HF_TOKEN}"));
        w.job.secrets.push("HF_TOKEN".into());
        w.job.models = None;
        w.trigger_now = None;
    });
}

#[test]
fn mcp_secret_unmapped() {
    refused_by(Reason::McpSecretUnmapped, Some("docs"), |w| {
        w.job.secrets.clear()
    });
    // A forwarded name counts only when the worker holds a value for it.
    refused_by(Reason::McpSecretUnmapped, Some("files"), |w| {
        w.env.0.clear()
    });
    refused_by(Reason::McpSecretUnmapped, Some("files"), |w| {
        w.settings.forward_env.clear();
    });
}

#[test]
fn mcp_egress_unreachable() {
    refused_by(Reason::McpEgressUnreachable, Some("docs"), |w| {
        w.files.allowlist = bytes("api.github.com\nregistry.example.org\n");
    });
    refused_by(Reason::McpEgressUnreachable, Some("docs"), |w| {
        w.files.allowlist = Read::Failed("is a link".into());
    });
    refused_by(Reason::McpEgressUnreachable, Some("docs"), |w| {
        w.files.allowlist = bytes("https://not a host\n");
    });
    refused_by(Reason::McpEgressUnreachable, Some("docs"), |w| {
        w.files.mcp = bytes(&OVERLAY.replace(
            "https://mcp.example.com/mcp",
            "http://mcp.example.com:443/mcp",
        ));
    });
    refused_by(Reason::McpEgressUnreachable, Some("docs"), |w| {
        w.files.mcp =
            bytes(&OVERLAY.replace("https://mcp.example.com/mcp", "https://localhost/mcp"));
        w.files.allowlist = bytes("localhost\napi.github.com\nregistry.example.org\n");
    });
    refused_by(Reason::McpEgressUnreachable, Some("forge"), |w| {
        w.files.allowlist = bytes("mcp.example.com\nregistry.example.org\n");
    });
    // A declared endpoint reaches exactly its host and port.
    let mut w = world();
    w.files.mcp = bytes(&OVERLAY.replace(
        "https://mcp.example.com/mcp",
        "http://llm.internal.example:8000/mcp",
    ));
    w.files.endpoints = bytes(
        r#"{"version": 1, "endpoints": [{"id": "llm", "host": "llm.internal.example", "port": 8000}]}"#,
    );
    assert!(matches!(decide_in(&w), Decision::Admit { .. }));
    // With egress off, nothing of this is looked at.
    let mut w = world();
    w.settings.egress = false;
    w.files.allowlist = Read::Failed("is a link".into());
    assert!(matches!(decide_in(&w), Decision::Admit { .. }));
}

#[test]
fn mcp_package_runner() {
    refused_by(Reason::McpPackageRunner, Some("memory"), |w| {
        w.settings.package_registries.clear();
    });
    refused_by(Reason::McpPackageRunner, Some("memory"), |w| {
        w.files.allowlist = bytes("mcp.example.com\napi.github.com\n");
    });
}

#[test]
fn mcp_excluded() {
    // `files` is deferred (tool_search only); `docs` is codemode (codemode or tool_search).
    for (exclude, server) in [
        (&["mcp__files__*"][..], "files"),
        (&["mcp__fi*"][..], "files"),
        (&["tool_search"][..], "files"),
        (&["mcp__*"][..], "docs"),
        (&["*"][..], "docs"),
        (&["codemode", "tool_search"][..], "docs"),
    ] {
        refused_by(Reason::McpExcluded, Some(server), |w| {
            w.job.exclude_tools = exclude.iter().map(|e| e.to_string()).collect();
        });
    }
    // Excluding one tool, or codemode for a deferred server, leaves a way in.
    let mut w = world();
    w.job.exclude_tools = vec!["mcp__files__delete".into(), "codemode".into()];
    set_mcp(&mut w, &["files"]);
    assert!(matches!(decide_in(&w), Decision::Admit { .. }));
}

#[test]
fn job_image_mcp_unsupported() {
    refused_by(Reason::JobImageMcpUnsupported, None, |w| {
        w.images = FakeImages(Capabilities::Declared(vec!["forgeMcp".into()]), None);
    });
    // Without PI_JOB_IMAGE, the labels are those of the default image, and only its.
    refused_by(Reason::JobImageMcpUnsupported, None, |w| {
        w.settings.job_image = None;
        w.images.1 = Some("another-image");
    });
    let mut w = world();
    w.settings.job_image = None;
    w.images.1 = Some(config::settings::DEFAULT_JOB_IMAGE);
    assert!(matches!(decide_in(&w), Decision::Admit { .. }));
}

#[test]
fn job_image_forge_mcp_unsupported() {
    refused_by(Reason::JobImageForgeMcpUnsupported, Some("forge"), |w| {
        w.images = FakeImages(Capabilities::Declared(vec!["mcp".into()]), None);
    });
}

#[test]
fn trigger_skew() {
    refused_by(Reason::TriggerSkew, None, |w| w.job.mcp = None);
    refused_by(Reason::TriggerSkew, None, |w| w.job.models = None);
    refused_by(Reason::TriggerSkew, None, |w| w.job.max_cost_usd = None);
}

#[test]
fn a_read_that_may_pass_is_a_retry_never_a_refusal() {
    let cases: [fn(&mut World); 5] = [
        |w| w.files.mcp = Read::Transient("Input/output error".into()),
        |w| w.files.models = Read::Transient("Input/output error".into()),
        |w| w.files.allowlist = Read::Transient("Input/output error".into()),
        |w| w.files.endpoints = Read::Transient("Input/output error".into()),
        |w| w.images = FakeImages(Capabilities::Transient("Input/output error".into()), None),
    ];
    for change in cases {
        let mut w = world();
        change(&mut w);
        assert!(
            matches!(decide_in(&w), Decision::Retry { .. }),
            "{:?}",
            decide_in(&w)
        );
    }
}

#[test]
fn no_comment_holds_a_host_a_variable_or_a_value() {
    let forbidden = [
        "mcp.example.com",
        "api.github.com",
        "registry.example.org",
        "DOCS_TOKEN",
        "FILES_TOKEN",
        "GH_TOKEN",
        "literal-value",
        "localhost",
    ];
    for reason in Reason::ALL {
        for server in [None, Some("docs"), Some("forge")] {
            let c = reason.comment(server);
            for f in forbidden {
                assert!(!c.contains(f), "{reason}: {c}");
            }
        }
    }
}

#[test]
fn forge_is_judged_against_exclude_tools_too() {
    for exclude in [
        &["mcp__*"][..],
        &["mcp__forge__*"][..],
        &["codemode", "tool_search"][..],
    ] {
        refused_by(Reason::McpExcluded, Some("forge"), |w| {
            set_mcp(w, &["forge"]);
            w.trigger_now = None;
            w.job.exclude_tools = exclude.iter().map(|e| e.to_string()).collect();
        });
    }
}

#[test]
fn a_forge_only_job_needs_no_overlay_at_all() {
    let mut w = world();
    set_mcp(&mut w, &["forge"]);
    w.trigger_now = None;
    w.files.mcp = Read::Missing;
    w.files.models = bytes(r#"{"providers": {"p": {"apiKey": "literal"}}}"#);
    assert!(
        matches!(decide_in(&w), Decision::Admit { mcp: Some(_) }),
        "{:?}",
        decide_in(&w)
    );
}

#[test]
fn the_runner_and_forge_variables_the_loader_reserves_are_reserved_here_too() {
    for var in ["HOME", "PATH", "LD_PRELOAD", "GITLAB_URL", "https_proxy"] {
        let var_ref = var.to_ascii_uppercase();
        let r = refused_by(Reason::McpSecretReserved, Some("files"), |w| {
            w.files.mcp = bytes(&OVERLAY.replace("${FILES_TOKEN}", &format!("${{{var_ref}}}")));
            w.settings.forward_env.push(var_ref.clone());
            w.env.0.push(Box::leak(var_ref.clone().into_boxed_str()));
        });
        assert!(r.log.detail.contains(&var_ref));
    }
}

#[test]
fn exclude_tools_is_a_narrowing_field() {
    let mut w = world();
    let text = TRIGGERS.replace(
        r#""maxCostUsd": 5"#,
        r#""maxCostUsd": 5, "excludeTools": ["bash"]"#,
    );
    w.trigger_now = Some(parse_triggers(text.as_bytes()).unwrap().triggers.remove(0));
    match decide_in(&w) {
        Decision::Refuse(r) => {
            assert_eq!(r.reason, Reason::TriggerSkew);
            assert!(r.log.detail.contains("excludeTools"), "{}", r.log.detail);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_tool_exposed_by_name_loses_its_route_when_excluded_by_name() {
    let overlay = r#"{"mcpServers": {"docs": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer ${DOCS_TOKEN}"}, "description": "Docs", "exposure": "hidden", "toolExposure": {"search-all": "direct"}}}}"#;
    let mut w = world();
    w.files.mcp = bytes(overlay);
    set_mcp(&mut w, &["docs"]);
    w.trigger_now = None;
    assert!(matches!(decide_in(&w), Decision::Admit { .. }));
    w.job.exclude_tools = vec!["mcp__docs__search_all".into()];
    assert!(matches!(decide_in(&w), Decision::Refuse(r) if r.reason == Reason::McpExcluded));
}

#[test]
fn a_model_list_the_loader_would_not_write_narrows_nothing() {
    for models in [vec![], vec!["gpt".to_owned()]] {
        refused_by(Reason::McpSecretReserved, Some("docs"), |w| {
            w.files.mcp = bytes(&OVERLAY.replace("${DOCS_TOKEN}", "${HF_TOKEN}"));
            w.job.secrets.push("HF_TOKEN".into());
            w.job.models = Some(models.clone());
        });
    }
}

#[test]
fn a_gitlab_url_with_a_dollar_is_not_plain() {
    refused_by(Reason::McpServerUnknown, Some("forge"), |w| {
        w.job.kind = "gitlab".into();
        w.trigger_now = None;
        w.settings.gitlab_url = Some("https://gitlab.example.com/$GH_TOKEN".into());
    });
}
