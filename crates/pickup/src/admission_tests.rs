//! Each reason: a job that is admitted, and the one change that refuses it with that reason.

use std::path::Path;

use config::triggers::parse_triggers;

use super::*;

const OVERLAY: &str = r#"{"mcpServers": {
  "docs": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer ${DOCS_TOKEN}"}, "description": "Docs"},
  "files": {"command": "/opt/pi-global/mcp/files", "env": {"FILES_TOKEN": "${FILES_TOKEN}"}, "description": "Files", "exposure": "deferred"},
  "memory": {"command": "npx", "args": ["-y", "m"], "allowPackageRunner": true, "description": "Memory"},
  "old": {"url": "https://old.example.com/mcp", "description": "Old", "enabled": false}
}}"#;

#[derive(Clone)]
struct FakeFiles {
    triggers: Read,
    mcp: Read,
    models: Read,
    allowlist: Read,
    endpoints: Read,
}

impl Files for FakeFiles {
    fn triggers(&self) -> Read {
        self.triggers.clone()
    }
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

/// Images: what every image is, or (with a name) what only that image is; others are missing.
struct FakeImages(Image, Option<&'static str>);

impl Images for FakeImages {
    fn image(&self, name: &str) -> Image {
        match self.1 {
            Some(only) if only != name => Image::Missing,
            _ => self.0.clone(),
        }
    }
}

struct FakeFolders(Folder);

impl Folders for FakeFolders {
    fn folder(&self, _path: &str) -> Folder {
        self.0.clone()
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
    settings: Settings,
    files: FakeFiles,
    images: FakeImages,
    folders: FakeFolders,
    env: FakeEnv,
    host: Host,
    /// Whether the trigger on file takes the job's narrowing fields when it is decided (see
    /// [`loosen`]).
    agree: bool,
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

/// A cron job on a local repository naming three overlay servers, egress on, that is admitted.
const TRIGGERS: &str = r#"{"triggers": [{
  "on": {"type": "cron", "id": "nightly", "pattern": "0 3 * * *"},
  "run": {"kind": "local", "folder": "/srv/repo", "task": "t", "flow": "task",
          "mcp": ["docs", "files", "memory"],
          "secrets": {"DOCS_TOKEN": "op://ci/docs"}, "provider": "openai", "model": "gpt-4o",
          "models": ["openai/gpt-4o"], "maxCostUsd": 5}
}]}"#;

/// The same job as a github job naming forge too, with its event and a GitHub App: admitted.
const GITHUB_TRIGGERS: &str = r#"{"triggers": [{
  "on": {"type": "label", "any": ["pi"]},
  "run": {"kind": "github", "flow": "fix", "mcp": ["forge", "docs", "files", "memory"],
          "secrets": {"DOCS_TOKEN": "op://ci/docs"}, "provider": "openai", "model": "gpt-4o",
          "models": ["openai/gpt-4o"], "maxCostUsd": 5}
}]}"#;

fn world_of(triggers: &str, id: &str) -> World {
    let trigger = parse_triggers(triggers.as_bytes())
        .unwrap()
        .triggers
        .remove(0);
    World {
        job: trigger.job(id),
        settings: settings(&[
            ("PI_FORWARD_ENV", "FILES_TOKEN"),
            ("PI_PACKAGE_REGISTRIES", "npx=registry.example.org"),
            ("PI_JOB_IMAGE", "pi-job"),
        ]),
        files: FakeFiles {
            triggers: bytes(triggers),
            mcp: bytes(OVERLAY),
            models: bytes(r#"{"providers": {"local": {"apiKey": "$LOCAL_KEY"}}}"#),
            allowlist: bytes("mcp.example.com\napi.github.com\nregistry.example.org\n"),
            endpoints: Read::Missing,
        },
        images: FakeImages(
            Image::Installed {
                capabilities: vec!["mcp".into(), "forgeMcp".into()],
            },
            None,
        ),
        folders: FakeFolders(Folder::Folder {
            uid: 1000,
            gid: 1000,
            mode: 0o40755,
        }),
        env: FakeEnv(vec!["FILES_TOKEN", "OPENAI_API_KEY"]),
        host: Host {
            root: true,
            user: reach::User {
                uid: 0,
                gid: 0,
                groups: Vec::new(),
            },
            passwd: Some(
                "root:x:0:0::/root:/bin/sh\nmaint:x:1000:1000::/home/maint:/bin/sh\n".into(),
            ),
            egress_proxy: true,
            github_key: None,
        },
        agree: false,
    }
}

fn world() -> World {
    world_of(TRIGGERS, "cron-nightly-1")
}

fn github() -> World {
    let mut w = world_of(GITHUB_TRIGGERS, "job-1");
    w.job.event = Some(forge_event(protocol::forge_event::Forge::Github));
    w.settings = settings(&[
        ("PI_FORWARD_ENV", "FILES_TOKEN"),
        ("PI_PACKAGE_REGISTRIES", "npx=registry.example.org"),
        ("PI_JOB_IMAGE", "pi-job"),
        ("PI_GITHUB_APP_ID", "4242"),
        ("PI_GITHUB_APP_KEY_FILE", "app-key.pem"),
    ]);
    w
}

fn forge_event(forge: protocol::forge_event::Forge) -> protocol::forge_event::ForgeEvent {
    protocol::forge_event::ForgeEvent {
        forge,
        delivery: "d-1".into(),
        action: "labeled".into(),
        repository: "octo-org/hello".into(),
        repository_id: 7,
        installation: Some(9),
        default_branch: "main".into(),
        number: 42,
        pull_request: false,
        title: "t".into(),
        body: "b".into(),
        labels: vec!["pi".into()],
        added_labels: vec!["pi".into()],
        comment: None,
        head: None,
        sender: "maint".into(),
    }
}

fn inputs(w: &World) -> Inputs<'_> {
    Inputs {
        job: &w.job,
        settings: &w.settings,
        files: &w.files,
        images: &w.images,
        folders: &w.folders,
        env: &w.env,
        host: &w.host,
    }
}

fn decide_in(w: &World) -> Decision {
    let files = agreed(w);
    decide(&Inputs {
        files: &files,
        ..inputs(w)
    })
}

/// The world's files, with the trigger on file carrying the job's own `mcp`, `models` (with its
/// provider and model), `maxCostUsd` and `excludeTools` when the world says so and the file can hold them.
fn agreed(w: &World) -> FakeFiles {
    let mut files = w.files.clone();
    let Read::Bytes(b) = &w.files.triggers else {
        return files;
    };
    if !w.agree {
        return files;
    }
    let mut all: serde_json::Value = serde_json::from_slice(b).unwrap();
    let run = all["triggers"][0]["run"].as_object_mut().unwrap();
    let mut set = |key: &str, value: Option<serde_json::Value>| match value {
        Some(v) => {
            run.insert(key.to_owned(), v);
        }
        None => {
            run.remove(key);
        }
    };
    let job = &w.job;
    set("mcp", job.mcp_names().map(|n| serde_json::json!(n)));
    set("models", job.models.as_ref().map(|m| serde_json::json!(m)));
    set(
        "provider",
        job.provider.as_ref().map(|p| serde_json::json!(p)),
    );
    set("model", job.model.as_ref().map(|m| serde_json::json!(m)));
    set("maxCostUsd", job.max_cost_usd.map(|c| serde_json::json!(c)));
    set(
        "excludeTools",
        (!job.exclude_tools.is_empty()).then(|| serde_json::json!(job.exclude_tools)),
    );
    let text = all.to_string();
    if parse_triggers(text.as_bytes()).is_ok() {
        files.triggers = bytes(&text);
    }
    files
}

fn admitted(w: &World) -> Admitted {
    match decide_in(w) {
        Decision::Admit(a) => *a,
        other => panic!("not admitted: {other:?}"),
    }
}

/// What the MCP gates make of a world (for a forge job, which the admission refuses later).
fn mcp_of(w: &World) -> Result<McpAdmitted, Box<Decision>> {
    let files = agreed(w);
    let i = Inputs {
        files: &files,
        ..inputs(w)
    };
    mcp_gates(&i, w.job.mcp_names().unwrap())
}

/// Checks that a refusal says nothing in its public sentence or comment that its detail names
/// (a variable or a host).
fn names_nothing_publicly(r: &Refusal) {
    let public = format!("{} {}", r.sentence(), r.comment());
    for v in &r.detail.variables {
        assert!(!public.contains(v.as_str()), "{v} in {public}");
    }
    if let Some(h) = &r.detail.host {
        assert!(!public.contains(h.as_str()), "{h} in {public}");
    }
    assert!(!r.fix.is_empty());
}

/// Applies `change` to the admitted `base` world and checks it is refused for `reason`, naming
/// `server`.
fn refused_in(
    base: fn() -> World,
    reason: Reason,
    server: Option<&str>,
    change: impl FnOnce(&mut World),
) -> Refusal {
    let mut w = base();
    change(&mut w);
    match decide_in(&w) {
        Decision::Refuse(r) => {
            assert_eq!(r.reason, reason, "{r:?}");
            assert_eq!(r.detail.server.as_deref(), server, "{r:?}");
            let log = r.log(&w.job);
            if Reason::PICKUP_TABLE.contains(&reason) {
                assert_eq!(log["event"], "refused_mcp");
            }
            assert_eq!(log["reason"], reason.as_str());
            names_nothing_publicly(&r);
            *r
        }
        other => panic!("wanted {reason}, got {other:?}"),
    }
}

fn refused_by(reason: Reason, server: Option<&str>, change: impl FnOnce(&mut World)) -> Refusal {
    assert!(
        matches!(decide_in(&world()), Decision::Admit(_)),
        "the base world is admitted: {:?}",
        decide_in(&world())
    );
    refused_in(world, reason, server, change)
}

/// A change to the admitted github world, refused for `reason`.
fn github_refused_by(
    reason: Reason,
    server: Option<&str>,
    change: impl FnOnce(&mut World),
) -> Refusal {
    assert!(
        matches!(decide_in(&github()), Decision::Admit(_)),
        "the github world is admitted: {:?}",
        decide_in(&github())
    );
    refused_in(github, reason, server, change)
}

fn set_mcp(w: &mut World, names: &[&str]) {
    w.job.mcp = Some(McpField::names(names.iter().copied()));
    w.agree = true;
}

/// The trigger on file takes the job's own narrowing fields (as they are when the job is
/// decided), so that a test may change the job's: the job is then judged under a trigger that
/// agrees with it, not narrowed by the one the world began with.
fn loosen(w: &mut World) {
    w.agree = true;
}

#[test]
fn the_base_job_is_admitted_with_everything_it_runs_with() {
    let a = admitted(&world());
    assert_eq!(a.image, "pi-job");
    assert_eq!(
        a.workspace,
        Workspace {
            path: "/srv/repo".into(),
            uid: 1000,
            gid: 1000
        }
    );
    assert_eq!(a.servers, ["docs", "files", "memory"]);
    assert_eq!(
        a.secrets,
        [SecretRef {
            name: "DOCS_TOKEN".into(),
            reference: "op://ci/docs".into()
        }]
    );
    assert_eq!(a.model.provider, "openai");
    assert_eq!(a.model.model, "gpt-4o");
    assert_eq!(a.model.key_variable.as_deref(), Some("OPENAI_API_KEY"));
    let Egress::On { routes, .. } = &a.egress else {
        panic!("{:?}", a.egress)
    };
    let routes: Vec<(&str, &str, u16)> = routes
        .iter()
        .map(|r| (r.for_.as_str(), r.host.as_str(), r.port))
        .collect();
    assert_eq!(
        routes,
        [
            ("docs", "mcp.example.com", 443),
            ("memory", "registry.example.org", 443)
        ]
    );
    let file = a.mcp.unwrap();
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
        ["docs", "files", "memory"]
    );
    // A github job naming forge gets the worker's own entry last.
    let file = mcp_of(&github()).ok().unwrap().file;
    let parsed = config::json::parse(&file.text).unwrap();
    let names: Vec<String> = parsed
        .as_object()
        .unwrap()
        .get("mcpServers")
        .unwrap()
        .as_object()
        .unwrap()
        .keys()
        .map(str::to_owned)
        .collect();
    assert_eq!(names, ["docs", "files", "memory", "forge"]);
    assert!(file.text.contains("Bearer ${DOCS_TOKEN}"));
    assert!(!file.text.contains("\"old\""));
}

#[test]
fn a_job_naming_no_server_is_admitted_without_an_mcp_json() {
    let mut w = world();
    w.job.mcp = None;
    loosen(&mut w);
    let a = admitted(&w);
    assert_eq!(a.mcp, None);
    assert!(a.servers.is_empty());
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
    let mut w = github();
    set_mcp(&mut w, &["forge"]);
    loosen(&mut w);
    w.files.mcp = Read::Missing;
    assert!(mcp_of(&w).is_ok());
    assert!(matches!(decide_in(&w), Decision::Admit(_)));
    // ... and only missing: a file there that cannot be read whole refuses a forge-only job, and a
    // job that names no server, as it would any other.
    for read in [Read::Failed("is a link".into()), bytes("{,}")] {
        github_refused_by(Reason::McpConfigInvalid, None, |w| {
            set_mcp(w, &["forge"]);
            w.files.mcp = read.clone();
        });
        refused_by(Reason::McpConfigInvalid, None, |w| {
            loosen(w);
            w.job.mcp = None;
            w.files.mcp = read;
        });
    }
}

#[test]
fn codemode_models_off_reaches_every_job() {
    let off = |w: &mut World| {
        let Read::Bytes(b) = &w.files.mcp else {
            panic!("the world has an overlay mcp.json")
        };
        let text = String::from_utf8(b.clone()).unwrap();
        let text = text.replacen('{', r#"{"codemodeModels": false, "#, 1);
        w.files.mcp = bytes(&text);
    };
    // A job with the overlay's servers, one naming only forge, and one naming none.
    let mut named = world();
    off(&mut named);
    assert!(!admitted(&named).codemode_models);
    let mut forge = github();
    set_mcp(&mut forge, &["forge"]);
    loosen(&mut forge);
    off(&mut forge);
    let a = mcp_of(&forge).unwrap();
    assert!(!a.codemode_models);
    assert!(
        a.file.text.contains(r#""codemodeModels": false"#),
        "{}",
        a.file.text
    );
    let mut none = world();
    loosen(&mut none);
    none.job.mcp = None;
    off(&mut none);
    let a = admitted(&none);
    assert!(a.mcp.is_none() && !a.codemode_models);
    // The control: without the switch they are on.
    none.files.mcp = Read::Missing;
    assert!(admitted(&none).codemode_models);
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
    // forge on a local job (from the command line: no trigger could name it).
    refused_by(Reason::McpServerUnknown, Some("forge"), |w| {
        set_mcp(w, &["forge"]);
        w.job.trigger_index = None;
        w.job.trigger_type = "cli".into();
        w.job.secrets.clear();
    });
    github_refused_by(Reason::McpServerUnknown, Some("forge"), |w| {
        w.job.kind = "forgejo".into();
    });
    // A gitlab job with a GITLAB_URL that is not plain.
    for url in [
        None,
        Some("https://u:p@gitlab.example.com"),
        Some("https://gitlab.example.com/?a=${B}"),
        Some("https://gitlab.example.com/a,b"),
        Some("https://gitlab.example.com/#x"),
    ] {
        github_refused_by(Reason::McpServerUnknown, Some("forge"), |w| {
            w.job.kind = "gitlab".into();
            w.settings.gitlab_url = url.map(str::to_owned);
            w.files.allowlist =
                bytes("mcp.example.com\ngitlab.example.com\nregistry.example.org\n");
        });
    }
}

#[test]
fn every_unknown_server_is_named() {
    let r = refused_by(Reason::McpServerUnknown, Some("wiki"), |w| {
        set_mcp(w, &["docs", "wiki", "old", "blog"])
    });
    assert_eq!(r.detail.servers, ["wiki", "old", "blog"]);
    assert!(r.detail.why.contains("wiki, old, blog"), "{}", r.detail.why);
}

#[test]
fn a_gitlab_job_gets_its_forge_entry_with_the_api_url() {
    let mut w = github();
    w.job.kind = "gitlab".into();
    w.settings.gitlab_url = Some("https://gitlab.example.com/api/v4/".into());
    w.files.allowlist = bytes("mcp.example.com\ngitlab.example.com\nregistry.example.org\n");
    let file = mcp_of(&w).ok().unwrap().file;
    assert!(
        file.text
            .contains("\"GITLAB_API_URL\": \"https://gitlab.example.com/api/v4\""),
        "{}",
        file.text
    );
}

#[test]
fn a_github_job_gets_github_host_only_for_an_enterprise_server() {
    let w = github();
    let file = mcp_of(&w).ok().unwrap().file;
    assert!(!file.text.contains("GITHUB_HOST"), "{}", file.text);
    let mut w = github();
    w.settings.github_api_url = "https://ghe.example.com/api/v3".into();
    w.files.allowlist = bytes("mcp.example.com\nghe.example.com\nregistry.example.org\n");
    let file = mcp_of(&w).ok().unwrap().file;
    assert!(
        file.text
            .contains("\"GITHUB_HOST\": \"https://ghe.example.com\""),
        "{}",
        file.text
    );
    // An API address github-mcp-server cannot be pointed at refuses forge.
    for url in [
        "https://ghe.example.com/api",
        "https://ghe.example.com/v3",
        "https://ghe.example.com/api/v3?x=${A}",
        "https://u:p@ghe.example.com/api/v3",
    ] {
        github_refused_by(Reason::McpServerUnknown, Some("forge"), |w| {
            w.settings.github_api_url = url.to_owned();
            w.files.allowlist = bytes("mcp.example.com\nghe.example.com\nregistry.example.org\n");
        });
    }
    assert_eq!(github_host("https://api.github.com/"), Some(None));
    assert_eq!(
        github_host("http://127.0.0.9/api/v3"),
        Some(Some("http://127.0.0.9".to_owned()))
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
        assert_eq!(r.detail.variables, [var]);
        assert!(!r.comment().contains(var), "{}", r.comment());
    }
    // A provider's key on purpose: a model list without that provider frees it.
    let mut w = world();
    w.files.mcp = bytes(&OVERLAY.replace("${DOCS_TOKEN}", "${HF_TOKEN}"));
    w.job.secrets.push("HF_TOKEN".into());
    assert!(mcp_of(&w).is_ok());
    // Without a list, every provider's key is reserved.
    refused_by(Reason::McpSecretReserved, Some("docs"), |w| {
        w.files.mcp = bytes(&OVERLAY.replace("${DOCS_TOKEN}", "${HF_TOKEN}"));
        w.job.secrets.push("HF_TOKEN".into());
        w.job.models = None;
        loosen(w);
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
    github_refused_by(Reason::McpEgressUnreachable, Some("forge"), |w| {
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
    admitted(&w);
    // With egress off, nothing of this is looked at.
    let mut w = world();
    w.settings.egress = false;
    w.files.allowlist = Read::Failed("is a link".into());
    assert_eq!(admitted(&w).egress, Egress::Off);
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
    admitted(&w);
}

#[test]
fn job_image_mcp_unsupported() {
    refused_by(Reason::JobImageMcpUnsupported, None, |w| {
        w.images = FakeImages(
            Image::Installed {
                capabilities: vec!["forgeMcp".into()],
            },
            None,
        );
    });
    // A job that names no server needs no capability.
    let mut w = world();
    w.images.0 = Image::Installed {
        capabilities: Vec::new(),
    };
    w.job.mcp = None;
    loosen(&mut w);
    admitted(&w);
}

#[test]
fn job_image_missing() {
    // Without PI_JOB_IMAGE, the job's image is the default one, and only it.
    refused_by(Reason::JobImageMissing, None, |w| {
        w.settings.job_image = None;
        w.images.1 = Some("another-image");
    });
    refused_by(Reason::JobImageMissing, None, |w| {
        w.images.0 = Image::Missing
    });
    refused_by(Reason::JobImageMissing, None, |w| {
        w.job.image = Some("../x".into())
    });
    let mut w = world();
    w.settings.job_image = None;
    w.images.1 = Some(config::settings::DEFAULT_JOB_IMAGE);
    assert_eq!(admitted(&w).image, config::settings::DEFAULT_JOB_IMAGE);
}

#[test]
fn job_image_forge_mcp_unsupported() {
    github_refused_by(Reason::JobImageForgeMcpUnsupported, Some("forge"), |w| {
        w.images = FakeImages(
            Image::Installed {
                capabilities: vec!["mcp".into()],
            },
            None,
        );
    });
}

#[test]
fn trigger_skew() {
    refused_by(Reason::TriggerSkew, None, |w| w.job.mcp = None);
    refused_by(Reason::TriggerSkew, None, |w| w.job.models = None);
    refused_by(Reason::TriggerSkew, None, |w| w.job.max_cost_usd = None);
    // The secrets: only the job's own names, from its own trigger.
    let r = refused_by(Reason::TriggerSkew, None, |w| {
        w.job.secrets.push("WIKI_TOKEN".into());
    });
    assert_eq!(r.detail.variables, ["WIKI_TOKEN"]);
    refused_by(Reason::TriggerSkew, None, |w| w.job.trigger_index = None);
    refused_by(Reason::TriggerSkew, None, |w| {
        w.job.secrets_profile = Some("other".into());
    });
}

#[test]
fn a_job_whose_trigger_is_gone_or_another_is_refused() {
    // Another cron trigger, another type of trigger, or none at the job's index.
    let r = refused_by(Reason::TriggerGone, None, |w| {
        w.job.id = "cron-weekly-1".into()
    });
    assert_eq!(r.detail.field.as_deref(), Some("triggers[0]"));
    refused_by(Reason::TriggerGone, None, |w| {
        w.job.trigger_type = "label".into()
    });
    let r = refused_by(Reason::TriggerGone, None, |w| w.job.trigger_index = Some(3));
    assert!(r.detail.why.contains("no trigger 3"), "{r:?}");
    refused_by(Reason::TriggerGone, None, |w| {
        w.files.triggers = bytes(r#"{"triggers": []}"#)
    });
}

#[test]
fn a_job_runs_under_its_triggers_policy_as_it_is_now() {
    // The job as queued was looser than its trigger is now: the stricter of the two is kept.
    let mut w = world();
    w.job.max_cost_usd = Some(100.0);
    w.job.models = Some(vec!["openai/gpt-4o".into(), "openai/gpt-4.1".into()]);
    w.job.mcp = Some(McpField::names(["docs", "files", "memory", "wiki"]));
    w.job.exclude_tools = vec!["mcp__files__delete".into()];
    let a = admitted(&w);
    assert_eq!(a.model_rules.max_cost_usd, Some(5.0));
    assert_eq!(a.model_rules.models, Some(vec!["openai/gpt-4o".to_owned()]));
    assert_eq!(a.servers, ["docs", "files", "memory"]);
    assert_eq!(a.exclude_tools, ["mcp__files__delete"]);
    // The trigger narrowed since: a lower cap, fewer servers and models, more excluded tools.
    let narrowed = |w: &mut World| {
        let Read::Bytes(b) = &w.files.triggers else {
            panic!()
        };
        let text = String::from_utf8(b.clone())
            .unwrap()
            .replace(
                r#""mcp": ["docs", "files", "memory"]"#,
                r#""mcp": ["files"], "excludeTools": ["codemode"]"#,
            )
            .replace(r#""maxCostUsd": 5"#, r#""maxCostUsd": 0.5"#);
        parse_triggers(text.as_bytes()).unwrap();
        w.files.triggers = bytes(&text);
    };
    let mut w = world();
    w.job.exclude_tools = vec!["mcp__files__delete".into()];
    narrowed(&mut w);
    let a = admitted(&w);
    assert_eq!(a.model_rules.max_cost_usd, Some(0.5));
    assert_eq!(a.servers, ["files"]);
    assert_eq!(a.exclude_tools, ["mcp__files__delete", "codemode"]);
    // The pin policy: the job's unless the trigger's is now stricter.
    for (queued, now, want) in [
        (None, None, PinPolicy::Withhold),
        (None, Some("accept"), PinPolicy::Accept),
        (Some(PinPolicy::Refuse), Some("accept"), PinPolicy::Refuse),
        (Some(PinPolicy::Accept), None, PinPolicy::Withhold),
        (Some(PinPolicy::Withhold), Some("refuse"), PinPolicy::Refuse),
    ] {
        let mut w = world();
        w.job.pins = queued;
        if let Some(now) = now {
            w.files.triggers = bytes(&TRIGGERS.replace(
                r#""maxCostUsd": 5"#,
                &format!(r#""maxCostUsd": 5, "pins": "{now}""#),
            ));
        }
        assert_eq!(admitted(&w).pins, want, "{queued:?} then {now:?}");
    }
    // A trigger that now names no server leaves the job none.
    let mut w = world();
    w.files.triggers = bytes(&TRIGGERS.replace(r#""mcp": ["docs", "files", "memory"],"#, ""));
    let a = admitted(&w);
    assert!(a.servers.is_empty() && a.mcp.is_none(), "{a:?}");
    // A label the trigger asks for now, which the job was placed without.
    let r = refused_by(Reason::TriggerSkew, None, |w| {
        w.files.triggers = bytes(&TRIGGERS.replace(
            r#""maxCostUsd": 5"#,
            r#""maxCostUsd": 5, "labels": ["gpu"]"#,
        ));
    });
    assert_eq!(r.detail.field.as_deref(), Some("run.labels"));
    // A command-line job is its own policy.
    let mut w = world();
    w.job.trigger_index = None;
    w.job.trigger_type = "cli".into();
    w.job.secrets.clear();
    w.job.mcp = Some(McpField::names(["files"]));
    w.job.max_cost_usd = Some(100.0);
    assert_eq!(admitted(&w).model_rules.max_cost_usd, Some(100.0));
}

#[test]
fn a_badly_typed_list_is_mcp_list_invalid() {
    for bad in [
        serde_json::json!("docs"),
        serde_json::json!([1]),
        serde_json::json!({}),
    ] {
        let job: Job = serde_json::from_value(serde_json::json!({
            "id": "cli-1", "triggerType": "cli", "kind": "local", "mcp": bad,
        }))
        .unwrap();
        let r = refused_by(Reason::McpListInvalid, None, |w| w.job = job);
        assert_eq!(r.detail.field.as_deref(), Some("run.mcp"));
    }
}

#[test]
fn a_read_that_may_pass_is_a_retry_never_a_refusal() {
    let cases: [fn(&mut World); 8] = [
        |w| w.files.triggers = Read::Transient("Input/output error".into()),
        // A triggers.json refused now: the job's trigger cannot be told, so it waits.
        |w| w.files.triggers = bytes("{"),
        |w| w.folders.0 = Folder::Transient("Input/output error".into()),
        |w| w.files.mcp = Read::Transient("Input/output error".into()),
        |w| w.files.models = Read::Transient("Input/output error".into()),
        |w| w.files.allowlist = Read::Transient("Input/output error".into()),
        |w| w.files.endpoints = Read::Transient("Input/output error".into()),
        |w| w.images = FakeImages(Image::Transient("Input/output error".into()), None),
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
        github_refused_by(Reason::McpExcluded, Some("forge"), |w| {
            set_mcp(w, &["forge"]);
            loosen(w);
            w.job.exclude_tools = exclude.iter().map(|e| e.to_string()).collect();
        });
    }
}

#[test]
fn a_forge_only_job_needs_no_overlay_at_all() {
    let mut w = github();
    set_mcp(&mut w, &["forge"]);
    loosen(&mut w);
    w.files.mcp = Read::Missing;
    w.files.models = Read::Missing;
    assert!(mcp_of(&w).is_ok());
    // A models.json problem is its own reason, never the MCP file's.
    w.files.models = bytes(r#"{"providers": {"p": {"apiKey": "literal"}}}"#);
    assert!(mcp_of(&w).is_ok());
    assert_eq!(decide_in(&w).reason(), Some(Reason::ModelsConfigInvalid));
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
        assert_eq!(r.detail.variables, std::slice::from_ref(&var_ref));
    }
}

#[test]
fn exclude_tools_is_a_narrowing_field() {
    let mut w = world();
    let text = TRIGGERS.replace(
        r#""maxCostUsd": 5"#,
        r#""maxCostUsd": 5, "excludeTools": ["bash"]"#,
    );
    w.files.triggers = bytes(&text);
    match decide_in(&w) {
        Decision::Refuse(r) => {
            assert_eq!(r.reason, Reason::TriggerSkew);
            assert_eq!(r.detail.field.as_deref(), Some("run.excludeTools"));
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
    loosen(&mut w);
    admitted(&w);
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
    github_refused_by(Reason::McpServerUnknown, Some("forge"), |w| {
        w.job.kind = "gitlab".into();
        w.settings.gitlab_url = Some("https://gitlab.example.com/$GH_TOKEN".into());
    });
}

#[test]
fn the_model_is_checked_before_anything_is_spent() {
    let r = refused_by(Reason::ModelUnset, None, |w| {
        w.job.provider = None;
        w.job.model = None;
    });
    assert_eq!(r.detail.variables, ["PI_PROVIDER", "PI_MODEL"]);
    // The deployment's default stands in for the job's.
    let mut w = world();
    w.job.provider = None;
    w.job.model = None;
    w.settings.provider = Some("openai".into());
    w.settings.model = Some("gpt-4o".into());
    assert_eq!(admitted(&w).model.model, "gpt-4o");
    let r = refused_by(Reason::ModelProviderUnknown, None, |w| {
        w.job.provider = Some("nope".into());
        w.job.models = Some(vec!["nope/gpt-4o".into()]);
        loosen(w);
    });
    assert_eq!(r.detail.model.as_deref(), Some("nope/gpt-4o"));
    refused_by(Reason::ModelUnknown, None, |w| {
        w.job.model = Some("gpt-none".into());
        w.job.models = Some(vec!["openai/gpt-none".into()]);
    });
    refused_by(Reason::ModelNotAllowed, None, |w| {
        w.job.model = Some("gpt-4.1".into());
    });
    let r = refused_by(Reason::ModelKeyMissing, None, |w| {
        w.env.0.retain(|v| *v != "OPENAI_API_KEY")
    });
    assert_eq!(r.detail.variables, ["OPENAI_API_KEY"]);
    assert!(r.fix.contains("OPENAI_API_KEY"));
    refused_by(Reason::ModelsConfigInvalid, None, |w| {
        w.files.models = bytes("{,}")
    });
    refused_by(Reason::ModelsConfigInvalid, None, |w| {
        w.files.models = Read::Failed("is a link".into())
    });
}

#[test]
fn a_provider_of_the_overlay_uses_its_own_key_and_a_keyless_endpoint_needs_none() {
    let models = r#"{"providers": {"local": {"baseUrl": "http://llm.internal.example:8000/v1", "api": "openai-completions", "apiKey": "$LOCAL_KEY", "models": [{"id": "small"}]}}}"#;
    let local = |w: &mut World| {
        w.files.models = bytes(models);
        w.job.provider = Some("local".into());
        w.job.model = Some("small".into());
        w.job.models = Some(vec!["local/small".into()]);
        loosen(w);
    };
    let r = refused_by(Reason::ModelKeyMissing, None, local);
    assert_eq!(r.detail.variables, ["LOCAL_KEY"]);
    let mut w = world();
    local(&mut w);
    w.env.0.push("LOCAL_KEY");
    let a = admitted(&w);
    assert_eq!(a.model.key_variable.as_deref(), Some("LOCAL_KEY"));
    assert_eq!(a.model.source, "overlay");
    let Egress::On { routes, .. } = &a.egress else {
        panic!()
    };
    assert!(
        routes
            .iter()
            .any(|r| r.for_ == "model" && r.host == "llm.internal.example" && r.port == 8000)
    );
    // Declared keyless: no key is needed.
    let mut w = world();
    local(&mut w);
    w.files.endpoints = bytes(
        r#"{"version": 1, "endpoints": [{"id": "llm", "host": "llm.internal.example", "port": 8000, "keyless": true}]}"#,
    );
    assert_eq!(admitted(&w).model.key_variable, None);
}

#[test]
fn the_default_provider_counts_for_reserved_keys_when_the_trigger_names_a_list_only() {
    // run.models without run.provider: the deployment's PI_PROVIDER is the job's own provider,
    // and its key is reserved though the list names another provider only.
    let r = refused_by(Reason::McpSecretReserved, Some("docs"), |w| {
        w.job.provider = None;
        w.job.models = Some(vec![
            "anthropic/claude-haiku-4-5".into(),
            "openai/gpt-4o".into(),
        ]);
        w.settings.provider = Some("google".into());
        w.files.mcp = bytes(&OVERLAY.replace("${DOCS_TOKEN}", "${GEMINI_API_KEY}"));
        w.job.secrets.push("GEMINI_API_KEY".into());
        loosen(w);
    });
    assert_eq!(r.detail.variables, ["GEMINI_API_KEY"]);
}

#[test]
fn egress_on_without_a_proxy_is_refused() {
    let r = refused_by(Reason::EgressProxyMissing, None, |w| {
        w.host.egress_proxy = false
    });
    assert_eq!(r.detail.variables, ["PI_EGRESS"]);
    let mut w = world();
    w.host.egress_proxy = false;
    w.settings.egress = false;
    admitted(&w);
}

#[test]
fn the_workspace_must_be_a_folder_its_owner_can_use_and_not_roots() {
    let r = refused_by(Reason::WorkspaceMissing, None, |w| {
        w.folders.0 = Folder::Missing
    });
    assert_eq!(r.detail.path.as_deref(), Some("/srv/repo"));
    refused_by(Reason::WorkspaceMissing, None, |w| {
        w.folders.0 = Folder::NotAFolder
    });
    refused_by(Reason::WorkspaceOwnedByRoot, None, |w| {
        w.folders.0 = Folder::Folder {
            uid: 0,
            gid: 0,
            mode: 0o40755,
        }
    });
    // A worker that is not root runs the job as itself: a folder of root's is then its own
    // business (it could not write it).
    let mut w = world();
    w.host.root = false;
    w.folders.0 = Folder::Folder {
        uid: 0,
        gid: 0,
        mode: 0o40755,
    };
    admitted(&w);
    let r = refused_by(Reason::WorkspaceUnreachable, None, |w| {
        w.folders.0 = Folder::Folder {
            uid: 1000,
            gid: 1000,
            mode: 0o40500,
        }
    });
    assert_eq!(r.detail.uid, Some(1000));
    assert!(r.detail.why.contains("/srv/repo") && r.fix.contains("/srv/repo"));
    refused_by(Reason::WorkspaceUnreachable, None, |w| {
        w.folders.0 = Folder::Failed("cannot be reached".into())
    });
    refused_by(Reason::JobUnreadable, None, |w| w.job.folder = None);
}

#[test]
fn a_forge_job_works_in_a_clone_of_its_own_as_the_forge_job_user() {
    let a = admitted(&github());
    assert_eq!(a.workspace.path, "/srv/d/state/jobs/job-1/workspace");
    // A root worker runs it as nobody unless told otherwise; never as root.
    assert_eq!((a.workspace.uid, a.workspace.gid), (65534, 65534));
    let mut w = github();
    w.settings.forge_job_user = Some((1500, 1500));
    assert_eq!(admitted(&w).workspace.uid, 1500);
    // A worker that is not root runs it as itself.
    let mut w = github();
    w.host.root = false;
    w.host.user.uid = 1000;
    w.host.user.gid = 1000;
    assert_eq!(
        (admitted(&w).workspace.uid, admitted(&w).workspace.gid),
        (1000, 1000)
    );
}

#[test]
fn a_forge_job_needs_its_event_a_forge_flow_and_the_forge_set_up() {
    let r = github_refused_by(Reason::JobUnreadable, None, |w| w.job.event = None);
    assert_eq!(r.detail.field.as_deref(), Some("event"));
    // A name the worker would build a URL or a path from, outside the forge's grammar.
    let r = github_refused_by(Reason::JobUnreadable, None, |w| {
        w.job.event.as_mut().unwrap().repository = "octo-org/hello/../../app".into();
    });
    assert_eq!(
        r.detail.field.as_deref(),
        Some("event.repository.full_name")
    );
    assert!(!r.detail.why.contains(".."), "{r:?}");
    // An event of the other forge is not this job's.
    github_refused_by(Reason::JobUnreadable, None, |w| {
        w.job.event = Some(forge_event(protocol::forge_event::Forge::Gitlab));
    });
    let r = github_refused_by(Reason::JobFlowUnsupported, None, |w| {
        w.job.flow = Some("triage".into());
    });
    assert_eq!(r.detail.field.as_deref(), Some("run.flow"));
    let r = github_refused_by(Reason::JobFlowUnsupported, None, |w| {
        w.job.flow = None;
        w.job.command = Some("make".into());
    });
    assert_eq!(r.detail.field.as_deref(), Some("run.command"));
    let r = github_refused_by(Reason::ForgeUnconfigured, None, |w| {
        w.settings.github_app_key_file = None;
    });
    assert!(
        r.detail
            .variables
            .contains(&"PI_GITHUB_APP_KEY_FILE".to_owned())
    );
    github_refused_by(Reason::ForgeUnconfigured, None, |w| {
        w.job.event.as_mut().unwrap().installation = None;
    });
    // A key file set that cannot sign (as the worker read it): refused here, as the worker's
    // mint would fail; a key that signs, or none read, is no refusal.
    let r = github_refused_by(Reason::ForgeUnconfigured, None, |w| {
        w.host.github_key = Some(false);
    });
    assert!(
        r.detail
            .variables
            .contains(&"PI_GITHUB_APP_KEY_FILE".to_owned())
    );
    let mut signing = github();
    signing.host.github_key = Some(true);
    assert!(matches!(decide_in(&signing), Decision::Admit(_)));
    // GitLab: its URL and the worker's token.
    let gitlab = |w: &mut World| {
        w.job.kind = "gitlab".into();
        w.job.mcp = Some(McpField::names(["docs"]));
        w.job.event = Some(forge_event(protocol::forge_event::Forge::Gitlab));
        w.settings.gitlab_url = Some("https://gitlab.example.com".into());
    };
    let r = github_refused_by(Reason::ForgeUnconfigured, None, gitlab);
    assert_eq!(r.detail.variables, ["PI_GITLAB_TOKEN"]);
    let mut w = github();
    gitlab(&mut w);
    w.env.0.push("PI_GITLAB_TOKEN");
    assert_eq!(
        admitted(&w).workspace.path,
        "/srv/d/state/jobs/job-1/workspace"
    );
    // Forgejo and Azure jobs are not run.
    refused_in(github, Reason::JobKindUnsupported, None, |w| {
        w.job.kind = "forgejo".into();
        w.job.mcp = None;
        w.job.trigger_index = None;
    });
}

#[test]
fn every_refusal_has_a_fix_and_the_log_line_names_only() {
    let r = refused_by(Reason::McpSecretUnmapped, Some("docs"), |w| {
        w.job.secrets.clear()
    });
    let log = r.log(&world().job);
    assert_eq!(log["event"], "refused_mcp");
    assert_eq!(log["detail"]["server"], "docs");
    assert_eq!(log["detail"]["variables"][0], "DOCS_TOKEN");
    assert!(log["fix"].as_str().unwrap().contains("DOCS_TOKEN"));
}

#[test]
fn a_model_the_gateway_cannot_meter_is_refused_before_anything_is_spent() {
    // An overlay provider in a wire format the gateway does not read.
    let models = r#"{"providers": {"vertex": {"baseUrl": "https://llm.internal.example/v1", "api": "google-generative-ai", "apiKey": "$VERTEX_KEY", "models": [{"id": "gem"}]}}}"#;
    let r = refused_by(Reason::ModelUnsupported, None, |w| {
        w.files.models = bytes(models);
        w.env.0.push("VERTEX_KEY");
        w.job.provider = Some("vertex".into());
        w.job.model = Some("gem".into());
        w.job.models = Some(vec!["vertex/gem".into()]);
        loosen(w);
    });
    assert_eq!(r.detail.model.as_deref(), Some("vertex/gem"));
    assert!(r.detail.why.contains("google-generative-ai"), "{r:?}");
    assert!(r.fix.contains("openai-completions"), "{r:?}");
    // The same provider speaking a format the gateway reads is admitted.
    let mut w = world();
    w.files.models = bytes(&models.replace("google-generative-ai", "openai-completions"));
    w.env.0.push("VERTEX_KEY");
    w.job.provider = Some("vertex".into());
    w.job.model = Some("gem".into());
    w.job.models = Some(vec!["vertex/gem".into()]);
    loosen(&mut w);
    assert_eq!(admitted(&w).model.model, "gem");
    // The runner's own check agrees on every chat model of pi's catalog: the admission refuses
    // exactly the models the runner would stop.
    for provider in &config::catalog::builtin().providers {
        for entry in &provider.entries {
            let uncarried = config::model_rules::uncarried_chat_model(
                config::catalog::builtin(),
                None,
                &provider.id,
                &entry.id,
            );
            let table = config::model_rules::Table::build(config::catalog::builtin(), None);
            let runner = table
                .chat_model(&provider.id, &entry.id)
                .filter(|m| m.wire().is_none());
            assert_eq!(uncarried.as_ref(), runner, "{}/{}", provider.id, entry.id);
        }
    }
}

/// A decision as one line: a refusal as the JSON `explain --json` shows, a retry with its detail,
/// an admission by its workspace, model and egress; pi's version written `{pi}`.
fn pinned(d: &Decision) -> String {
    let line = match d {
        Decision::Refuse(r) => serde_json::to_string(r).unwrap(),
        Decision::Retry { detail } => format!("retry: {detail}"),
        Decision::Admit(a) => format!("admit: {:?} {:?} {:?}", a.workspace, a.model, a.egress),
    };
    line.replace(config::catalog::pi_version(), "{pi}")
}

/// Each way the model, the egress gate and the workspaces end a decision, pinned whole (reason,
/// detail, fix) before the functions that decide them are split.
fn pinned_cases() -> Vec<(&'static str, Decision)> {
    let local_models = r#"{"providers": {"local": {"baseUrl": "http://llm.internal.example:8000/v1", "api": "openai-completions", "apiKey": "$LOCAL_KEY", "models": [{"id": "small"}]}}}"#;
    let use_local = |w: &mut World, models: &str| {
        w.files.models = bytes(models);
        w.job.provider = Some("local".into());
        w.job.model = Some("small".into());
        w.job.models = Some(vec!["local/small".into()]);
        loosen(w);
    };
    let gitlab = |w: &mut World| {
        w.job.kind = "gitlab".into();
        w.job.mcp = Some(McpField::names(["docs"]));
        w.job.event = Some(forge_event(protocol::forge_event::Forge::Gitlab));
        w.settings.gitlab_url = Some("https://gitlab.example.com".into());
    };
    type Case = (&'static str, fn() -> World, Box<dyn Fn(&mut World)>);
    let cases: Vec<Case> = vec![
        (
            "model unset",
            world,
            Box::new(|w| {
                w.job.provider = None;
                w.job.model = None;
            }),
        ),
        (
            "provider unknown",
            world,
            Box::new(|w| {
                w.job.provider = Some("nope".into());
                w.job.models = Some(vec!["nope/gpt-4o".into()]);
                loosen(w);
            }),
        ),
        (
            "model unknown",
            world,
            Box::new(|w| {
                w.job.model = Some("gpt-none".into());
                w.job.models = Some(vec!["openai/gpt-none".into()]);
            }),
        ),
        (
            "model not allowed",
            world,
            Box::new(|w| w.job.model = Some("gpt-4.1".into())),
        ),
        (
            "model unsupported",
            world,
            Box::new(move |w| {
                use_local(
                    w,
                    &local_models.replace("openai-completions", "google-generative-ai"),
                );
                w.env.0.push("LOCAL_KEY");
            }),
        ),
        (
            "key missing",
            world,
            Box::new(|w| w.env.0.retain(|v| *v != "OPENAI_API_KEY")),
        ),
        (
            "overlay key missing",
            world,
            Box::new(move |w| use_local(w, local_models)),
        ),
        (
            "sign-in only",
            world,
            Box::new(move |w| {
                use_local(w, &local_models.replace(r#", "apiKey": "$LOCAL_KEY""#, ""));
            }),
        ),
        (
            "overlay key held",
            world,
            Box::new(move |w| {
                use_local(w, local_models);
                w.env.0.push("LOCAL_KEY");
            }),
        ),
        (
            "keyless",
            world,
            Box::new(move |w| {
                use_local(w, local_models);
                w.files.endpoints = bytes(
                    r#"{"version": 1, "endpoints": [{"id": "llm", "host": "llm.internal.example", "port": 8000, "keyless": true}]}"#,
                );
            }),
        ),
        (
            "keyless, egress off",
            world,
            Box::new(move |w| {
                use_local(w, local_models);
                w.settings.egress = false;
                w.files.endpoints = bytes(
                    r#"{"version": 1, "endpoints": [{"id": "llm", "host": "llm.internal.example", "port": 8000, "keyless": true}]}"#,
                );
            }),
        ),
        (
            "server not allowlisted",
            world,
            Box::new(|w| {
                w.files.allowlist = bytes("api.github.com\nregistry.example.org\n");
            }),
        ),
        (
            "server on another port",
            world,
            Box::new(|w| {
                w.files.mcp = bytes(&OVERLAY.replace(
                    "https://mcp.example.com/mcp",
                    "https://mcp.example.com:8443/mcp",
                ));
            }),
        ),
        (
            "allowlist missing",
            world,
            Box::new(|w| w.files.allowlist = Read::Missing),
        ),
        (
            "allowlist failed",
            world,
            Box::new(|w| {
                w.files.allowlist = Read::Failed("is a link".into());
            }),
        ),
        (
            "allowlist transient",
            world,
            Box::new(|w| {
                w.files.allowlist = Read::Transient("EIO".into());
            }),
        ),
        (
            "allowlist not text",
            world,
            Box::new(|w| {
                w.files.allowlist = Read::Bytes(vec![0xff, 0xfe]);
            }),
        ),
        (
            "allowlist invalid",
            world,
            Box::new(|w| {
                w.files.allowlist = bytes("https://not a host\n");
            }),
        ),
        (
            "endpoints failed",
            world,
            Box::new(|w| {
                w.files.endpoints = Read::Failed("is a link".into());
            }),
        ),
        (
            "endpoints transient",
            world,
            Box::new(|w| {
                w.files.endpoints = Read::Transient("EIO".into());
            }),
        ),
        (
            "endpoints invalid",
            world,
            Box::new(|w| w.files.endpoints = bytes("{}")),
        ),
        (
            "no registry",
            world,
            Box::new(|w| w.settings.package_registries.clear()),
        ),
        (
            "registry not allowlisted",
            world,
            Box::new(|w| {
                w.files.allowlist = bytes("mcp.example.com\napi.github.com\n");
            }),
        ),
        ("github admitted", github, Box::new(|_| {})),
        (
            "github api not allowlisted",
            github,
            Box::new(|w| {
                w.files.allowlist = bytes("mcp.example.com\nregistry.example.org\n");
            }),
        ),
        (
            "enterprise api",
            github,
            Box::new(|w| {
                w.settings.github_api_url = "https://ghe.example.com/api/v3".into();
                w.files.allowlist =
                    bytes("mcp.example.com\nregistry.example.org\nghe.example.com\n");
            }),
        ),
        (
            "gitlab admitted",
            github,
            Box::new(move |w| {
                gitlab(w);
                w.job.mcp = Some(McpField::names(["forge", "docs"]));
                w.env.0.push("PI_GITLAB_TOKEN");
                w.files.allowlist = bytes("mcp.example.com\ngitlab.example.com\n");
            }),
        ),
        (
            "gitlab api not allowlisted",
            github,
            Box::new(move |w| {
                gitlab(w);
                w.job.mcp = Some(McpField::names(["forge", "docs"]));
                w.env.0.push("PI_GITLAB_TOKEN");
            }),
        ),
        ("no event", github, Box::new(|w| w.job.event = None)),
        (
            "bad event name",
            github,
            Box::new(|w| {
                w.job.event.as_mut().unwrap().repository = "octo-org/hello/../../app".into();
            }),
        ),
        (
            "other forge's event",
            github,
            Box::new(|w| {
                w.job.event = Some(forge_event(protocol::forge_event::Forge::Gitlab));
            }),
        ),
        (
            "unknown flow",
            github,
            Box::new(|w| w.job.flow = Some("triage".into())),
        ),
        ("no flow", github, Box::new(|w| w.job.flow = None)),
        (
            "a command",
            github,
            Box::new(|w| {
                w.job.flow = None;
                w.job.command = Some("make".into());
            }),
        ),
        (
            "no app",
            github,
            Box::new(|w| w.settings.github_app_id = None),
        ),
        (
            "key cannot sign",
            github,
            Box::new(|w| w.host.github_key = Some(false)),
        ),
        (
            "no installation",
            github,
            Box::new(|w| {
                w.job.event.as_mut().unwrap().installation = None;
            }),
        ),
        (
            "gitlab without url",
            github,
            Box::new(move |w| {
                gitlab(w);
                w.settings.gitlab_url = None;
                w.job.mcp = None;
                w.job.trigger_index = None;
            }),
        ),
        ("gitlab without token", github, Box::new(gitlab)),
        (
            "forge user",
            github,
            Box::new(|w| w.settings.forge_job_user = Some((1500, 1501))),
        ),
        (
            "not root",
            github,
            Box::new(|w| {
                w.host.root = false;
                w.host.user.uid = 1000;
                w.host.user.gid = 1001;
            }),
        ),
        (
            "kind unsupported",
            github,
            Box::new(|w| {
                w.job.kind = "forgejo".into();
                w.job.mcp = None;
                w.job.trigger_index = None;
            }),
        ),
        ("no folder", world, Box::new(|w| w.job.folder = None)),
        (
            "folder missing",
            world,
            Box::new(|w| w.folders.0 = Folder::Missing),
        ),
        (
            "not a folder",
            world,
            Box::new(|w| w.folders.0 = Folder::NotAFolder),
        ),
        (
            "folder failed",
            world,
            Box::new(|w| {
                w.folders.0 = Folder::Failed("permission denied".into());
            }),
        ),
        (
            "folder transient",
            world,
            Box::new(|w| w.folders.0 = Folder::Transient("EIO".into())),
        ),
        (
            "root's folder",
            world,
            Box::new(|w| {
                w.folders.0 = Folder::Folder {
                    uid: 0,
                    gid: 0,
                    mode: 0o40755,
                };
            }),
        ),
        (
            "folder closed",
            world,
            Box::new(|w| {
                w.folders.0 = Folder::Folder {
                    uid: 1000,
                    gid: 1000,
                    mode: 0o40500,
                };
            }),
        ),
        (
            "not root, folder closed",
            world,
            Box::new(|w| {
                w.host.root = false;
                w.host.user.uid = 1001;
                w.host.user.gid = 1001;
                w.folders.0 = Folder::Folder {
                    uid: 1000,
                    gid: 1000,
                    mode: 0o40700,
                };
            }),
        ),
    ];
    cases
        .into_iter()
        .map(|(name, base, change)| {
            let mut w = base();
            change(&mut w);
            (name, decide_in(&w))
        })
        .collect()
}

/// What [`pinned_cases`] decided before the model, the egress gate and the workspaces were split.
const PINNED: &str = r##"model unset: {"reason":"model-unset","detail":{"variables":["PI_PROVIDER","PI_MODEL"],"why":"neither the job nor PI_PROVIDER and PI_MODEL name a provider and model"},"fix":"set PI_PROVIDER and PI_MODEL in .env, or run.provider and run.model in the trigger"}
provider unknown: {"reason":"model-provider-unknown","detail":{"model":"nope/gpt-4o","why":"nope is neither a provider of pi {pi} nor in the overlay's models.json"},"fix":"name a provider pi knows, or define nope in /srv/d/pi-global/models.json"}
model unknown: {"reason":"model-unknown","detail":{"model":"openai/gpt-none","why":"openai has no chat model gpt-none (pi {pi}'s catalog and the overlay's models.json)"},"fix":"name one of openai's models, or add gpt-none to openai's models in the overlay's models.json"}
model not allowed: {"reason":"model-not-allowed","detail":{"field":"run.models","model":"openai/gpt-4.1","why":"openai/gpt-4.1 is not on the trigger's model list"},"fix":"add openai/gpt-4.1 to the trigger's run.models, or choose a model on it"}
model unsupported: {"reason":"model-unsupported","detail":{"model":"local/small","why":"local/small speaks google-generative-ai, which the job's model gateway cannot check and meter"},"fix":"choose a model whose provider speaks openai-completions, openai-responses or anthropic-messages, or set such an api for local in /srv/d/pi-global/models.json"}
key missing: {"reason":"model-key-missing","detail":{"variables":["OPENAI_API_KEY"],"model":"openai/gpt-4o","why":"the worker's environment sets none of the variables pi reads for openai's key"},"fix":"set OPENAI_API_KEY in the worker's environment"}
overlay key missing: {"reason":"model-key-missing","detail":{"variables":["LOCAL_KEY"],"model":"local/small","why":"the worker's environment sets none of the variables pi reads for local's key"},"fix":"set LOCAL_KEY in the worker's environment"}
sign-in only: {"reason":"model-key-missing","detail":{"model":"local/small","why":"pi takes local's key only from a sign-in, which a job cannot make"},"fix":"give local an apiKey variable in the overlay's models.json, or use another provider"}
overlay key held: admit: Workspace { path: "/srv/repo", uid: 1000, gid: 1000 } ModelChoice { provider: "local", model: "small", key_variable: Some("LOCAL_KEY"), source: "overlay" } On { routes: [Route { for_: "docs", host: "mcp.example.com", port: 443 }, Route { for_: "memory", host: "registry.example.org", port: 443 }, Route { for_: "model", host: "llm.internal.example", port: 8000 }], loopback: [] }
keyless: admit: Workspace { path: "/srv/repo", uid: 1000, gid: 1000 } ModelChoice { provider: "local", model: "small", key_variable: None, source: "overlay" } On { routes: [Route { for_: "docs", host: "mcp.example.com", port: 443 }, Route { for_: "memory", host: "registry.example.org", port: 443 }, Route { for_: "model", host: "llm.internal.example", port: 8000 }], loopback: [] }
keyless, egress off: admit: Workspace { path: "/srv/repo", uid: 1000, gid: 1000 } ModelChoice { provider: "local", model: "small", key_variable: None, source: "overlay" } Off
server not allowlisted: {"reason":"mcp-egress-unreachable","detail":{"server":"docs","host":"mcp.example.com","port":443,"why":"mcp.example.com port 443: the host is neither in egress-allowlist.conf (which opens https on port 443 only) nor, with this port, declared in model-endpoints.json"},"fix":"add mcp.example.com to /srv/d/egress-allowlist.conf, or declare mcp.example.com port 443 in /srv/d/model-endpoints.json"}
server on another port: {"reason":"mcp-egress-unreachable","detail":{"server":"docs","host":"mcp.example.com","port":8443,"why":"mcp.example.com port 8443: the host is neither in egress-allowlist.conf (which opens https on port 443 only) nor, with this port, declared in model-endpoints.json"},"fix":"declare mcp.example.com port 8443 in /srv/d/model-endpoints.json (the allowlist opens port 443 only)"}
allowlist missing: {"reason":"mcp-egress-unreachable","detail":{"server":"docs","path":"/srv/d/egress-allowlist.conf","why":"egress-allowlist.conf does not exist"},"fix":"fix /srv/d/egress-allowlist.conf (`pi-dispatch doctor` reads it)"}
allowlist failed: {"reason":"mcp-egress-unreachable","detail":{"server":"docs","path":"/srv/d/egress-allowlist.conf","why":"egress-allowlist.conf is a link"},"fix":"fix /srv/d/egress-allowlist.conf (`pi-dispatch doctor` reads it)"}
allowlist transient: retry: egress-allowlist.conf: EIO
allowlist not text: {"reason":"mcp-egress-unreachable","detail":{"server":"docs","path":"/srv/d/egress-allowlist.conf","why":"egress-allowlist.conf cannot be read: it is not UTF-8 text"},"fix":"fix /srv/d/egress-allowlist.conf (`pi-dispatch doctor` reads it)"}
allowlist invalid: {"reason":"mcp-egress-unreachable","detail":{"server":"docs","path":"/srv/d/egress-allowlist.conf","why":"egress-allowlist.conf cannot be read: egress-allowlist.conf line 1: a scheme such as https:// is not allowed; write the bare host"},"fix":"fix /srv/d/egress-allowlist.conf (`pi-dispatch doctor` reads it)"}
endpoints failed: {"reason":"mcp-egress-unreachable","detail":{"server":"docs","path":"/srv/d/model-endpoints.json","why":"model-endpoints.json is a link"},"fix":"fix /srv/d/model-endpoints.json (`pi-dispatch doctor` reads it)"}
endpoints transient: retry: model-endpoints.json: EIO
endpoints invalid: {"reason":"mcp-egress-unreachable","detail":{"server":"docs","path":"/srv/d/model-endpoints.json","why":"model-endpoints.json cannot be read: model-endpoints.json has no 'version'"},"fix":"fix /srv/d/model-endpoints.json (`pi-dispatch doctor` reads it)"}
no registry: {"reason":"mcp-package-runner","detail":{"server":"memory","variables":["PI_PACKAGE_REGISTRIES"],"why":"no registry host is declared for npx in PI_PACKAGE_REGISTRIES"},"fix":"declare npx=HOST in PI_PACKAGE_REGISTRIES and allowlist HOST, or install the server in the job image"}
registry not allowlisted: {"reason":"mcp-package-runner","detail":{"server":"memory","host":"registry.example.org","port":443,"why":"npx fetches from registry.example.org: the host is neither in egress-allowlist.conf (which opens https on port 443 only) nor, with this port, declared in model-endpoints.json"},"fix":"add registry.example.org to /srv/d/egress-allowlist.conf, or declare registry.example.org port 443 in /srv/d/model-endpoints.json"}
github admitted: admit: Workspace { path: "/srv/d/state/jobs/job-1/workspace", uid: 65534, gid: 65534 } ModelChoice { provider: "openai", model: "gpt-4o", key_variable: Some("OPENAI_API_KEY"), source: "builtin" } On { routes: [Route { for_: "docs", host: "mcp.example.com", port: 443 }, Route { for_: "memory", host: "registry.example.org", port: 443 }, Route { for_: "forge", host: "api.github.com", port: 443 }], loopback: [] }
github api not allowlisted: {"reason":"mcp-egress-unreachable","detail":{"server":"forge","host":"api.github.com","port":443,"why":"the forge API api.github.com port 443: the host is neither in egress-allowlist.conf (which opens https on port 443 only) nor, with this port, declared in model-endpoints.json"},"fix":"add api.github.com to /srv/d/egress-allowlist.conf, or declare api.github.com port 443 in /srv/d/model-endpoints.json"}
enterprise api: admit: Workspace { path: "/srv/d/state/jobs/job-1/workspace", uid: 65534, gid: 65534 } ModelChoice { provider: "openai", model: "gpt-4o", key_variable: Some("OPENAI_API_KEY"), source: "builtin" } On { routes: [Route { for_: "docs", host: "mcp.example.com", port: 443 }, Route { for_: "memory", host: "registry.example.org", port: 443 }, Route { for_: "forge", host: "ghe.example.com", port: 443 }], loopback: [] }
gitlab admitted: admit: Workspace { path: "/srv/d/state/jobs/job-1/workspace", uid: 65534, gid: 65534 } ModelChoice { provider: "openai", model: "gpt-4o", key_variable: Some("OPENAI_API_KEY"), source: "builtin" } On { routes: [Route { for_: "docs", host: "mcp.example.com", port: 443 }, Route { for_: "forge", host: "gitlab.example.com", port: 443 }], loopback: [] }
gitlab api not allowlisted: {"reason":"mcp-egress-unreachable","detail":{"server":"forge","host":"gitlab.example.com","port":443,"why":"the forge API gitlab.example.com port 443: the host is neither in egress-allowlist.conf (which opens https on port 443 only) nor, with this port, declared in model-endpoints.json"},"fix":"add gitlab.example.com to /srv/d/egress-allowlist.conf, or declare gitlab.example.com port 443 in /srv/d/model-endpoints.json"}
no event: {"reason":"job-unreadable","detail":{"field":"event","why":"a github job without its forge event"},"fix":"queue the job again with this version of pi-dispatch"}
bad event name: {"reason":"job-unreadable","detail":{"field":"event.repository.full_name","why":"the event's repository.full_name is not one the forge makes"},"fix":"queue the job again with this version of pi-dispatch"}
other forge's event: {"reason":"job-unreadable","detail":{"field":"event","why":"a github job without its forge event"},"fix":"queue the job again with this version of pi-dispatch"}
unknown flow: {"reason":"job-flow-unsupported","detail":{"field":"run.flow","why":"a forge job's flow is answer or fix"},"fix":"give the trigger run.flow \"answer\" (the agent's answer is posted on the issue) or \"fix\" (its changes become a pull request)"}
no flow: {"reason":"job-flow-unsupported","detail":{"field":"run.flow","why":"a forge job's flow is answer or fix"},"fix":"give the trigger run.flow \"answer\" (the agent's answer is posted on the issue) or \"fix\" (its changes become a pull request)"}
a command: {"reason":"job-flow-unsupported","detail":{"field":"run.command","why":"a forge job follows a flow; it does not run a command"},"fix":"give the trigger run.flow \"answer\" (the agent's answer is posted on the issue) or \"fix\" (its changes become a pull request)"}
no app: {"reason":"forge-unconfigured","detail":{"variables":["PI_GITHUB_APP_ID","PI_GITHUB_APP_KEY_FILE"],"why":"no GitHub App is set up to mint the job's token"},"fix":"set PI_GITHUB_APP_ID and PI_GITHUB_APP_KEY_FILE for GitHub, GITLAB_URL and PI_GITLAB_TOKEN for GitLab (docs/forges.md)"}
key cannot sign: {"reason":"forge-unconfigured","detail":{"variables":["PI_GITHUB_APP_KEY_FILE"],"why":"the GitHub App's key cannot be read or cannot sign, so no token can be minted for the job"},"fix":"set PI_GITHUB_APP_ID and PI_GITHUB_APP_KEY_FILE for GitHub, GITLAB_URL and PI_GITLAB_TOKEN for GitLab (docs/forges.md)"}
no installation: {"reason":"forge-unconfigured","detail":{"why":"the event came through no GitHub App installation, so no token can be minted for it"},"fix":"set PI_GITHUB_APP_ID and PI_GITHUB_APP_KEY_FILE for GitHub, GITLAB_URL and PI_GITLAB_TOKEN for GitLab (docs/forges.md)"}
gitlab without url: {"reason":"forge-unconfigured","detail":{"variables":["GITLAB_URL"],"why":"GITLAB_URL is unset or not a plain http(s) URL"},"fix":"set PI_GITHUB_APP_ID and PI_GITHUB_APP_KEY_FILE for GitHub, GITLAB_URL and PI_GITLAB_TOKEN for GitLab (docs/forges.md)"}
gitlab without token: {"reason":"forge-unconfigured","detail":{"variables":["PI_GITLAB_TOKEN"],"why":"the worker holds no GitLab token to act with"},"fix":"set PI_GITHUB_APP_ID and PI_GITHUB_APP_KEY_FILE for GitHub, GITLAB_URL and PI_GITLAB_TOKEN for GitLab (docs/forges.md)"}
forge user: admit: Workspace { path: "/srv/d/state/jobs/job-1/workspace", uid: 1500, gid: 1501 } ModelChoice { provider: "openai", model: "gpt-4o", key_variable: Some("OPENAI_API_KEY"), source: "builtin" } On { routes: [Route { for_: "docs", host: "mcp.example.com", port: 443 }, Route { for_: "memory", host: "registry.example.org", port: 443 }, Route { for_: "forge", host: "api.github.com", port: 443 }], loopback: [] }
not root: admit: Workspace { path: "/srv/d/state/jobs/job-1/workspace", uid: 1000, gid: 1001 } ModelChoice { provider: "openai", model: "gpt-4o", key_variable: Some("OPENAI_API_KEY"), source: "builtin" } On { routes: [Route { for_: "docs", host: "mcp.example.com", port: 443 }, Route { for_: "memory", host: "registry.example.org", port: 443 }, Route { for_: "forge", host: "api.github.com", port: 443 }], loopback: [] }
kind unsupported: {"reason":"job-kind-unsupported","detail":{"field":"run.kind","why":"this version does not run forgejo jobs"},"fix":"use run.kind local, github or gitlab: forgejo and azure jobs are not run yet"}
no folder: {"reason":"job-unreadable","detail":{"field":"folder","why":"a local job without a folder"},"fix":"queue the job again with this version of pi-dispatch"}
folder missing: {"reason":"workspace-missing","detail":{"path":"/srv/repo","why":"/srv/repo does not exist"},"fix":"point the job at an existing repository folder"}
not a folder: {"reason":"workspace-missing","detail":{"path":"/srv/repo","why":"/srv/repo is not a folder"},"fix":"point the job at an existing repository folder"}
folder failed: {"reason":"workspace-unreachable","detail":{"path":"/srv/repo","why":"/srv/repo permission denied"},"fix":"let the worker's user reach /srv/repo"}
folder transient: retry: /srv/repo EIO
root's folder: {"reason":"workspace-owned-by-root","detail":{"path":"/srv/repo","uid":0,"why":"/srv/repo belongs to root"},"fix":"give /srv/repo to the user the job should run as: chown -R USER /srv/repo"}
folder closed: {"reason":"workspace-unreachable","detail":{"path":"/srv/repo","uid":1000,"why":"the job's user maint (uid 1000) cannot write /srv/repo (mode 0500, owner uid 1000, group gid 1000)"},"fix":"let uid 1000 write /srv/repo (chown or chmod), or run the job on a folder it can use"}
not root, folder closed: {"reason":"workspace-unreachable","detail":{"path":"/srv/repo","uid":1001,"why":"the job's user (uid 1001) cannot read, write or enter /srv/repo (mode 0700, owner uid 1000, group gid 1000)"},"fix":"let uid 1001 read and write and enter /srv/repo (chown or chmod), or run the job on a folder it can use"}"##;

#[test]
fn the_model_the_egress_gate_and_the_workspaces_decide_as_pinned() {
    assert_ne!(config::catalog::pi_version(), "");
    let got: Vec<String> = pinned_cases()
        .iter()
        .map(|(name, d)| format!("{name}: {}", pinned(d)))
        .collect();
    let want: Vec<&str> = PINNED.lines().collect();
    assert_eq!(got.len(), want.len());
    for (got, want) in got.iter().zip(want) {
        assert_eq!(got, want);
    }
}
