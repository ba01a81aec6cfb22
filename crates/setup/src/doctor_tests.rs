//! Unit tests of the doctor checks, on values.

use std::cell::RefCell;

use super::*;

/// The deployment folder every test resolves its settings in.
const DIR: &str = "/srv/d";

/// Two offered servers: one over HTTP on an allowlisted host, one over stdio.
const SERVERS: &str = r#"
    "docs": {"url": "https://docs.example.com/mcp", "description": "Docs"},
    "files": {"command": "/opt/pi-global/mcp/files", "description": "Files"}
"#;

fn settings(egress: bool) -> Settings {
    let get = move |name: &str| (!egress && name == "PI_EGRESS").then(|| "0".to_owned());
    config::settings::resolve(&get, Path::new(DIR)).unwrap()
}

/// An overlay `mcp.json` whose `mcpServers` holds `servers` (JSON members, without braces).
fn overlay(servers: &str) -> Read<Overlay> {
    overlay_file(&format!(r#"{{"mcpServers": {{{servers}}}}}"#))
}

fn overlay_file(text: &str) -> Read<Overlay> {
    Read::Parsed(mcp::parse_overlay(text.as_bytes()).unwrap())
}

fn allowlist(text: &str) -> Read<Allowlist> {
    Read::Parsed(egress::parse_allowlist(text).unwrap())
}

/// A `model-endpoints.json` declaring `endpoints` (JSON objects, without the brackets).
fn endpoints(endpoints: &str) -> Read<ModelEndpoints> {
    Read::Parsed(
        endpoints::parse_model_endpoints(&format!(
            r#"{{"version": 1, "endpoints": [{endpoints}]}}"#
        ))
        .unwrap(),
    )
}

fn models_file(text: &str) -> Read<Models> {
    Read::Parsed(models::check(text.as_bytes()).unwrap())
}

/// A healthy deployment: each test changes one thing.
fn healthy() -> Inputs {
    Inputs {
        settings: settings(true),
        overlay_kind: Ok(Kind::Dir),
        dotenv: true,
        triggers_file: true,
        auth_json: false,
        mcp_auth_json: false,
        mcp: overlay(SERVERS),
        models: models_file(
            r#"{"providers": {"openai": {"baseUrl": "https://api.openai.example/v1", "apiKey": "$OPENAI_API_KEY"}}}"#,
        ),
        allowlist: allowlist("# hosts\ndocs.example.com\n"),
        endpoints: endpoints(""),
        models_refused: false,
        bwrap: true,
        setpriv: Some(true),
        image_runner: true,
        image_pi_version: Some("1.6.0".into()),
        slirp4netns: true,
        sandbox: None,
        isolation: super::Isolation {
            root: true,
            ids_claimed: Vec::new(),
            cgroups: true,
            no_disk: None,
        },
        unknown_settings: Vec::new(),
    }
}

#[test]
fn a_misspelled_setting_is_a_warning_naming_the_one_meant() {
    let inputs = Inputs {
        unknown_settings: config::settings::unknown_names(["PI_WORKER_CONCURENCY"]),
        ..healthy()
    };
    let checks = run(&inputs, &Proving::default());
    assert!(
        !checks.iter().any(|c| c.label.contains("read cleanly")),
        "{checks:#?}"
    );
    let warned = checks
        .iter()
        .find(|c| c.label.contains("PI_WORKER_CONCURENCY"))
        .unwrap();
    assert_eq!(warned.level, Level::Warn);
    assert!(
        warned.label.contains("did you mean PI_WORKER_CONCURRENCY?"),
        "{warned:?}"
    );
}

#[test]
fn how_jobs_are_kept_apart_and_bounded_is_checked() {
    let find = |inputs: &Inputs, start: &str| {
        run(inputs, &Proving::default())
            .into_iter()
            .find(|c| c.label.starts_with(start))
    };
    let ids = find(&healthy(), "job ids").unwrap();
    assert_eq!(ids.level, Level::Ok, "{ids:?}");
    assert!(ids.label.contains("1879048192-1879048447"), "{ids:?}");
    let bounds = find(&healthy(), "job bounds").unwrap();
    assert_eq!(bounds.level, Level::Ok, "{bounds:?}");
    assert!(
        bounds.label.contains("1024 processes, 4096 MiB"),
        "{bounds:?}"
    );
    let claimed = Inputs {
        isolation: super::Isolation {
            ids_claimed: vec!["user builder (1879048200)".into()],
            ..healthy().isolation
        },
        ..healthy()
    };
    let bad = find(&claimed, "PI_JOB_UIDS").unwrap();
    assert_eq!(bad.level, Level::Fail, "{bad:?}");
    assert!(bad.label.contains("user builder (1879048200)"), "{bad:?}");
    let unbounded = Inputs {
        isolation: super::Isolation {
            cgroups: false,
            ..healthy().isolation
        },
        ..healthy()
    };
    assert_eq!(
        find(&unbounded, "no control groups").unwrap().level,
        Level::Warn
    );
    let disk = find(&healthy(), "job disk").unwrap();
    assert_eq!(disk.level, Level::Ok, "{disk:?}");
    assert!(disk.label.contains("4096 MiB"), "{disk:?}");
    let no_disk = Inputs {
        isolation: super::Isolation {
            no_disk: Some("the host has no loop devices (/dev/loop-control)".into()),
            ..healthy().isolation
        },
        ..healthy()
    };
    let warned = find(&no_disk, "the host has no loop devices").unwrap();
    assert_eq!(warned.level, Level::Warn, "{warned:?}");
    assert!(warned.label.contains("PI_JOB_DISK_MB"), "{warned:?}");
    let not_root = Inputs {
        isolation: super::Isolation::default(),
        ..healthy()
    };
    assert_eq!(
        find(&not_root, "the worker is not root").unwrap().level,
        Level::Warn
    );
    assert!(find(&not_root, "job ids").is_none());
}

#[test]
fn the_hosts_users_groups_and_ranges_that_claim_a_job_id_are_named() {
    let claimed = super::ids_claimed(
        (1_879_048_192, 1_879_048_447),
        [
            "root:x:0:0::/root:/bin/sh\nbuilder:x:1879048200:100::/home/b:/bin/sh\n",
            "wheel:x:1879048447:\n",
            "alice:1879048000:65536\nbob:100000:65536\n",
            "",
        ],
    );
    assert_eq!(
        claimed,
        [
            "user builder (1879048200)",
            "group wheel (1879048447)",
            "subuid range of alice (1879048000-1879113535)"
        ]
    );
}

#[test]
fn a_sandbox_that_does_not_start_fails_the_bubblewrap_check() {
    let tried = |sandbox| {
        run(
            &Inputs {
                sandbox: Some(sandbox),
                ..healthy()
            },
            &Proving::default(),
        )
        .into_iter()
        .find(|c| c.label.starts_with("bubblewrap"))
        .unwrap()
    };
    let started = tried(Ok(()));
    assert_eq!(started.level, Level::Ok, "{started:?}");
    assert!(started.label.contains("sandbox starts"), "{started:?}");
    let refused = tried(Err("bwrap: No permissions to create a new namespace".into()));
    assert_eq!(refused.level, Level::Fail, "{refused:?}");
    assert_eq!(refused.reason.as_deref(), Some("container-never-started"));
    assert!(refused.label.contains("No permissions"), "{refused:?}");
    assert!(refused.fix.as_deref().unwrap().contains("user namespaces"));
}

#[test]
fn what_running_jobs_needs_is_checked() {
    let ok = run(&healthy(), &Proving::default());
    let labels: Vec<&str> = ok.iter().map(|c| c.label.as_str()).collect();
    assert!(
        labels.contains(&"bubblewrap: /usr/bin/bwrap"),
        "{labels:#?}"
    );
    assert!(
        labels.contains(&"job image pi-job: pi 1.6.0"),
        "{labels:#?}"
    );
    let broken = Inputs {
        bwrap: false,
        setpriv: Some(false),
        image_runner: false,
        ..healthy()
    };
    let out = run(&broken, &Proving::default());
    let bwrap = out
        .iter()
        .find(|c| c.label.starts_with("bubblewrap"))
        .unwrap();
    assert_eq!(bwrap.level, Level::Fail);
    assert!(
        out.iter()
            .any(|c| c.level == Level::Fail && c.label.starts_with("setpriv is not installed")),
        "{out:#?}"
    );
    let image = out
        .iter()
        .find(|c| c.label.starts_with("job image"))
        .unwrap();
    // A job on it is refused (job-image-missing), so doctor fails as the worker would.
    assert_eq!(image.level, Level::Fail);
    assert_eq!(image.reason.as_deref(), Some("job-image-missing"));
    assert!(
        image
            .fix
            .as_deref()
            .unwrap()
            .contains("image install pi-job")
    );
}

/// A proof that always passes and records what it was asked.
#[derive(Default)]
struct Proving {
    asked: RefCell<Vec<(String, u16)>>,
}

impl RouteProof for Proving {
    fn prove(&self, host: &str, port: u16) -> Result<(), String> {
        self.asked.borrow_mut().push((host.to_owned(), port));
        Ok(())
    }
}

/// The checks, after asserting that exactly the checks that are not ok carry a fix.
fn run(inputs: &Inputs, proof: &dyn RouteProof) -> Vec<Check> {
    let out = checks(inputs, proof);
    assert_fixes(&out);
    out
}

fn assert_fixes(out: &[Check]) {
    for c in out {
        match c.level {
            Level::Ok => assert_eq!(c.fix, None, "{c:?}"),
            Level::Warn | Level::Fail => {
                assert!(c.fix.as_deref().is_some_and(|f| !f.is_empty()), "{c:?}");
            }
        }
    }
}

/// The one check whose label holds `words`.
fn the<'a>(out: &'a [Check], words: &str) -> &'a Check {
    let found: Vec<&Check> = out.iter().filter(|c| c.label.contains(words)).collect();
    assert_eq!(found.len(), 1, "{words:?} in {out:#?}");
    found[0]
}

fn fix(c: &Check) -> &str {
    c.fix.as_deref().unwrap()
}

fn not_ok(out: &[Check]) -> Vec<&Check> {
    out.iter().filter(|c| c.level != Level::Ok).collect()
}

fn labels(out: &[Check]) -> Vec<&str> {
    out.iter().map(|c| c.label.as_str()).collect()
}

#[test]
fn a_healthy_deployment_is_all_ok_and_names_the_offered_servers() {
    let out = run(&healthy(), &NoRouteProof);
    assert!(not_ok(&out).is_empty(), "{out:#?}");
    assert_eq!(
        labels(&out),
        [
            "settings: the environment and .env read cleanly",
            "overlay folder: /srv/d/pi-global",
            "no auth.json in the overlay",
            "no mcp-auth.json in the overlay",
            "mcp.json reads: 2 servers offered (docs, files)",
            "models.json in the overlay holds no credential",
            "egress-allowlist.conf reads: 1 host",
            "model-endpoints.json reads: 0 endpoints declared",
            "bubblewrap: /usr/bin/bwrap",
            "job ids: each job runs as an id of 1879048192-1879048447 (PI_JOB_UIDS), which no user or group of this host has",
            "job bounds: 1024 processes, 4096 MiB of memory, 7200 s of CPU time (PI_JOB_PIDS, PI_JOB_MEMORY_MB, PI_JOB_CPU_SECS)",
            "job disk: each job writes at most 4096 MiB, on a disk of its own (PI_JOB_DISK_MB)",
            "job image pi-job: pi 1.6.0",
        ]
    );
}

#[test]
fn a_folder_with_none_of_a_deployments_files_fails_and_says_how_to_make_one() {
    let inputs = Inputs {
        dotenv: false,
        triggers_file: false,
        overlay_kind: Ok(Kind::Missing),
        ..healthy()
    };
    let out = run(&inputs, &NoRouteProof);
    assert_eq!(out.len(), 2, "{out:#?}");
    let c = &out[1];
    assert_eq!(c.level, Level::Fail);
    assert_eq!(
        c.label,
        "/srv/d is not a pi-dispatch deployment: it has no .env, no triggers file (/srv/d/triggers.json) and no overlay folder (/srv/d/pi-global)"
    );
    assert!(fix(c).contains("`pi-dispatch init /srv/d`"), "{c:?}");
}

#[test]
fn a_deployment_missing_one_file_warns_for_it() {
    let out = run(
        &Inputs {
            dotenv: false,
            ..healthy()
        },
        &NoRouteProof,
    );
    let c = the(&out, "no .env in /srv/d");
    assert_eq!(c.level, Level::Warn);
    assert!(fix(c).contains("`pi-dispatch init /srv/d`"), "{c:?}");
    assert_eq!(not_ok(&out), [c]);

    let out = run(
        &Inputs {
            triggers_file: false,
            ..healthy()
        },
        &NoRouteProof,
    );
    let c = the(
        &out,
        "the triggers file /srv/d/triggers.json does not exist",
    );
    assert_eq!(c.level, Level::Warn);
    assert!(fix(c).contains("`pi-dispatch init /srv/d`"), "{c:?}");
    assert_eq!(not_ok(&out), [c]);

    // With .env and triggers.json but no overlay folder, the overlay check alone says so.
    let out = run(
        &Inputs {
            overlay_kind: Ok(Kind::Missing),
            ..healthy()
        },
        &NoRouteProof,
    );
    assert_eq!(not_ok(&out).len(), 1, "{out:#?}");
    assert_eq!(
        the(&out, "overlay folder /srv/d/pi-global does not exist").level,
        Level::Warn
    );
    // Two files missing are two warnings, not the failure.
    let out = run(
        &Inputs {
            dotenv: false,
            triggers_file: false,
            ..healthy()
        },
        &NoRouteProof,
    );
    assert_eq!(not_ok(&out).len(), 2, "{out:#?}");
    assert!(out.iter().all(|c| c.level != Level::Fail), "{out:#?}");
}

#[test]
fn an_overlay_folder_that_is_not_a_folder_fails_and_stops_the_checks() {
    for (kind, words, level) in [
        (Ok(Kind::Missing), "does not exist", Level::Warn),
        (Ok(Kind::Link), "is a link", Level::Fail),
        (Ok(Kind::File), "is not a folder", Level::Fail),
        (Ok(Kind::Other), "is not a folder", Level::Fail),
        (
            Err(std::io::ErrorKind::PermissionDenied),
            "cannot be checked",
            Level::Fail,
        ),
    ] {
        let inputs = Inputs {
            overlay_kind: kind,
            // Would fail on their own: they must not be looked at.
            auth_json: true,
            mcp_auth_json: true,
            mcp: Read::Failed("mcp.json is not JSON".into()),
            ..healthy()
        };
        let out = run(&inputs, &NoRouteProof);
        assert_eq!(out.len(), 2, "{kind:?}: {out:#?}");
        assert_eq!(out[0].level, Level::Ok);
        let last = &out[1];
        assert_eq!(last.level, level, "{kind:?}");
        assert!(
            last.label.contains("overlay folder /srv/d/pi-global") && last.label.contains(words),
            "{kind:?}: {last:?}"
        );
        for c in &out {
            assert!(!c.label.contains("mcp.json"), "{kind:?}: {c:?}");
            assert!(!c.label.contains("auth.json"), "{kind:?}: {c:?}");
        }
    }
}

#[test]
fn auth_json_in_the_overlay_fails() {
    let out = run(
        &Inputs {
            auth_json: true,
            ..healthy()
        },
        &NoRouteProof,
    );
    let c = the(&out, "auth.json is in the overlay");
    assert_eq!(c.level, Level::Fail);
    assert!(
        fix(c).contains("delete /srv/d/pi-global/auth.json"),
        "{c:?}"
    );
    assert_eq!(not_ok(&out), [c]);
    assert_eq!(
        the(&out, "no mcp-auth.json in the overlay").level,
        Level::Ok
    );
}

#[test]
fn mcp_auth_json_in_the_overlay_fails_and_points_at_fix() {
    let out = run(
        &Inputs {
            mcp_auth_json: true,
            ..healthy()
        },
        &NoRouteProof,
    );
    let c = the(&out, "mcp-auth.json is in the overlay");
    assert_eq!(c.level, Level::Fail);
    assert!(fix(c).contains("/srv/d/pi-global/mcp-auth.json"), "{c:?}");
    assert!(fix(c).contains("--fix"), "{c:?}");
    assert_eq!(not_ok(&out), [c]);
    assert_eq!(the(&out, "no auth.json in the overlay").level, Level::Ok);
}

#[test]
fn no_mcp_json_is_ok_and_means_no_servers() {
    let out = run(
        &Inputs {
            mcp: Read::Missing,
            ..healthy()
        },
        &NoRouteProof,
    );
    assert!(not_ok(&out).is_empty(), "{out:#?}");
    assert_eq!(the(&out, "mcp.json: none in the overlay").level, Level::Ok);
    assert!(
        !labels(&out).iter().any(|l| l.contains("offered")),
        "{out:#?}"
    );
}

#[test]
fn an_unreadable_mcp_json_fails() {
    let out = run(
        &Inputs {
            mcp: Read::Failed("mcp.json is not JSON [not-json]".into()),
            ..healthy()
        },
        &NoRouteProof,
    );
    let c = the(
        &out,
        "mcp.json cannot be read: mcp.json is not JSON [not-json]",
    );
    assert_eq!(c.level, Level::Fail);
    assert!(fix(c).contains("pi-dispatch mcp check"), "{c:?}");
    assert_eq!(not_ok(&out), [c]);
}

#[test]
fn a_refused_server_warns_with_its_problems_and_never_quotes_a_value() {
    let inputs = Inputs {
        mcp: overlay(
            r#"
            "docs": {"url": "https://docs.example.com/mcp", "description": "Docs"},
            "forge": {"url": "https://docs.example.com/mcp", "description": "Mine"},
            "leaky": {"url": "https://docs.example.com/mcp", "description": "Leaky",
                      "headers": {"Authorization": "Bearer CNRY-1"}},
            "CNRY-2 name": {"url": "https://docs.example.com/mcp", "description": "Odd"}
            "#,
        ),
        ..healthy()
    };
    let out = run(&inputs, &NoRouteProof);

    let forge = the(&out, "server forge is refused");
    assert_eq!(forge.level, Level::Warn);
    assert!(fix(forge).contains("[name-reserved]"), "{forge:?}");

    let leaky = the(&out, "server leaky is refused");
    assert_eq!(leaky.level, Level::Warn);
    assert!(fix(leaky).contains("headers.Authorization"), "{leaky:?}");
    assert!(fix(leaky).contains("[header-literal]"), "{leaky:?}");

    let odd = the(&out, "server (a server whose name is not plain) is refused");
    assert_eq!(odd.level, Level::Warn);
    assert!(fix(odd).contains("[name-invalid]"), "{odd:?}");

    // Only the valid server is offered, and nothing else is wrong.
    assert_eq!(
        the(&out, "mcp.json reads").label,
        "mcp.json reads: 1 server offered (docs)"
    );
    assert_eq!(not_ok(&out), [forge, leaky, odd]);

    for c in &out {
        for text in [Some(c.label.as_str()), c.fix.as_deref()]
            .into_iter()
            .flatten()
        {
            assert!(!text.contains("CNRY"), "a value is quoted: {c:?}");
        }
    }
}

#[test]
fn a_turned_off_server_is_listed_as_not_offered() {
    let out = run(
        &Inputs {
            mcp: overlay(
                r#"
                "docs": {"url": "https://docs.example.com/mcp", "description": "Docs"},
                "files": {"command": "/opt/pi-global/mcp/files", "description": "Files", "enabled": false}
                "#,
            ),
            ..healthy()
        },
        &NoRouteProof,
    );
    assert!(not_ok(&out).is_empty(), "{out:#?}");
    assert_eq!(
        the(&out, "mcp.json reads").label,
        "mcp.json reads: 1 server offered (docs)"
    );
    let off = the(&out, "turned off (not offered)");
    assert_eq!(off.level, Level::Ok);
    assert_eq!(off.label, "turned off (not offered): files");
    // The healthy deployment has no such line.
    let healthy = run(&healthy(), &NoRouteProof);
    assert!(!labels(&healthy).iter().any(|l| l.contains("turned off")));
}

#[test]
fn codemode_models_false_is_reported() {
    let out = run(
        &Inputs {
            mcp: overlay_file(&format!(
                r#"{{"mcpServers": {{{SERVERS}}}, "codemodeModels": false}}"#
            )),
            ..healthy()
        },
        &NoRouteProof,
    );
    assert!(not_ok(&out).is_empty(), "{out:#?}");
    assert_eq!(the(&out, "codemodeModels is false").level, Level::Ok);
    let healthy = run(&healthy(), &NoRouteProof);
    assert!(
        !labels(&healthy)
            .iter()
            .any(|l| l.contains("codemodeModels"))
    );
}

#[test]
fn a_package_runner_server_warns() {
    let out = run(
        &Inputs {
            mcp: overlay(&format!(
                r#"{SERVERS}, "runner": {{"command": "npx", "args": ["-y", "some-mcp"], "description": "Runner", "allowPackageRunner": true}}"#
            )),
            ..healthy()
        },
        &NoRouteProof,
    );
    assert_eq!(
        the(&out, "mcp.json reads").label,
        "mcp.json reads: 3 servers offered (docs, files, runner)"
    );
    let c = the(&out, "server runner uses the package runner npx");
    assert_eq!(c.level, Level::Warn);
    assert!(fix(c).contains("install the server"), "{c:?}");
    assert_eq!(not_ok(&out), [c]);
}

#[test]
fn an_http_server_sending_headers_warns_that_they_travel_in_plain_text() {
    let out = run(
        &Inputs {
            mcp: overlay(&format!(
                r#"{SERVERS},
                "intranet": {{"url": "http://wiki.corp.example:8080/mcp", "description": "Wiki", "headers": {{"Authorization": "Bearer ${{WIKI_TOKEN}}"}}}},
                "local": {{"url": "http://127.0.0.1:3000/mcp", "description": "Local", "headers": {{"X-Api-Key": "${{LOCAL_KEY}}"}}}},
                "plain": {{"url": "http://other.example.com:8080/mcp", "description": "No headers"}}"#
            )),
            settings: settings(false),
            ..healthy()
        },
        &NoRouteProof,
    );
    let c = the(&out, "server intranet: the url is http://");
    assert_eq!(c.level, Level::Warn);
    assert!(
        c.label.contains("(Authorization) would be sent in plain text across the network to wiki.corp.example port 8080"),
        "{c:?}"
    );
    assert!(c.label.ends_with("[plain-http-credentials]"), "{c:?}");
    assert!(fix(c).contains("https://"), "{c:?}");
    let local = the(&out, "server local: the url is http://");
    assert_eq!(local.level, Level::Warn);
    assert!(
        local
            .label
            .contains("to 127.0.0.1 port 3000, the loopback of the machine the job runs on"),
        "{local:?}"
    );
    assert!(
        !labels(&out).iter().any(|l| l.contains("server plain")),
        "{out:#?}"
    );
    // With egress off, the only other warning is that one.
    let egress_off = the(&out, "egress policy off");
    assert_eq!(not_ok(&out), [c, local, egress_off]);
}

#[test]
fn an_unreadable_models_json_fails() {
    let why = "models.json holds a credential or a command: providers.x.apiKey: the key is written in the file";
    let out = run(
        &Inputs {
            models: Read::Failed(why.into()),
            models_refused: true,
            ..healthy()
        },
        &NoRouteProof,
    );
    let c = the(&out, &format!("models.json in the overlay: {why}"));
    assert_eq!(c.level, Level::Fail);
    assert!(fix(c).contains("$NAME"), "{c:?}");
    assert_eq!(not_ok(&out), [c]);
    // A file that cannot be read at all gets a fix about the file, not about keys.
    let out = run(
        &Inputs {
            models: Read::Failed("models.json is not JSON".into()),
            ..healthy()
        },
        &NoRouteProof,
    );
    let c = the(&out, "models.json in the overlay cannot be read");
    assert_eq!(c.level, Level::Fail);
    assert!(fix(c).contains("plain JSON"), "{c:?}");
}

#[test]
fn a_parsed_models_json_is_ok_and_a_missing_one_is_not_mentioned() {
    let out = run(&healthy(), &NoRouteProof);
    assert_eq!(
        the(&out, "models.json in the overlay holds no credential").level,
        Level::Ok
    );
    let out = run(
        &Inputs {
            models: Read::Missing,
            ..healthy()
        },
        &NoRouteProof,
    );
    assert!(not_ok(&out).is_empty(), "{out:#?}");
    assert!(!labels(&out).iter().any(|l| l.contains("models.json")));
}

/// The checks for a healthy deployment whose only server is `docs` at `url`.
fn with_docs_at(url: &str, allow: &str) -> Vec<Check> {
    let inputs = Inputs {
        mcp: overlay(&format!(
            r#""docs": {{"url": "{url}", "description": "Docs"}}"#
        )),
        allowlist: allowlist(allow),
        ..healthy()
    };
    run(&inputs, &NoRouteProof)
}

#[test]
fn egress_on_a_server_on_a_host_not_allowlisted_warns() {
    let out = with_docs_at("https://other.example.net/mcp", "docs.example.com\n");
    let c = the(&out, "server docs is out of the egress proxy's reach");
    assert_eq!(c.level, Level::Warn);
    assert!(c.label.contains("other.example.net on port 443"), "{c:?}");
    assert!(
        fix(c).contains("add other.example.net to /srv/d/egress-allowlist.conf"),
        "{c:?}"
    );
    assert_eq!(not_ok(&out), [c]);
}

#[test]
fn egress_on_an_allowlisted_server_does_not_warn() {
    for allow in ["docs.example.com\n", ".example.com\n"] {
        let out = with_docs_at("https://docs.example.com/mcp", allow);
        assert!(not_ok(&out).is_empty(), "{allow:?}: {out:#?}");
        assert!(
            !labels(&out)
                .iter()
                .any(|l| l.contains("out of the egress proxy's reach")),
            "{allow:?}"
        );
    }
}

#[test]
fn egress_on_plain_http_on_port_443_warns() {
    let out = with_docs_at("http://docs.example.com:443/mcp", "docs.example.com\n");
    let c = the(&out, "server docs is out of the egress proxy's reach");
    assert_eq!(c.level, Level::Warn);
    assert!(c.label.contains("http:// url on port 443"), "{c:?}");
    assert!(fix(c).contains("https://"), "{c:?}");
    assert_eq!(not_ok(&out), [c]);
}

#[test]
fn egress_on_an_allowlisted_loopback_server_warns() {
    for (url, host) in [
        ("https://localhost/mcp", "localhost"),
        ("https://127.0.0.1/mcp", "127.0.0.1"),
    ] {
        let out = with_docs_at(url, "localhost\n127.0.0.1\n");
        let c = the(&out, "server docs is out of the egress proxy's reach");
        assert_eq!(c.level, Level::Warn, "{url}");
        assert!(c.label.contains(&format!("{host} on port 443")), "{c:?}");
        assert!(c.label.contains("its own machine"), "{c:?}");
        assert!(fix(c).contains("cannot be reached from a job"), "{c:?}");
        assert_eq!(not_ok(&out), [c], "{url}");
    }
}

#[test]
fn egress_on_an_allowlisted_host_on_another_port_must_be_declared() {
    let out = with_docs_at("https://docs.example.com:8443/mcp", "docs.example.com\n");
    let c = the(&out, "server docs is out of the egress proxy's reach");
    assert_eq!(c.level, Level::Warn);
    assert!(c.label.contains("docs.example.com on port 8443"), "{c:?}");
    assert!(
        fix(c).contains("declare docs.example.com port 8443 in /srv/d/model-endpoints.json"),
        "{c:?}"
    );
    assert!(fix(c).contains("port 443 only"), "{c:?}");
    assert_eq!(not_ok(&out), [c]);
}

#[test]
fn egress_on_a_missing_allowlist_fails() {
    let out = run(
        &Inputs {
            allowlist: Read::Missing,
            ..healthy()
        },
        &NoRouteProof,
    );
    let c = the(
        &out,
        "/srv/d/egress-allowlist.conf does not exist, and the egress policy is on",
    );
    assert_eq!(c.level, Level::Fail);
    assert!(fix(c).contains("pi-dispatch init"), "{c:?}");
    assert_eq!(not_ok(&out), [c]);
}

#[test]
fn an_unreadable_allowlist_fails() {
    let out = run(
        &Inputs {
            allowlist: Read::Failed("egress-allowlist.conf line 2: a path is not allowed".into()),
            // Unreachable, but not judged without an allowlist.
            mcp: overlay(r#""docs": {"url": "https://other.example.net/mcp", "description": "D"}"#),
            ..healthy()
        },
        &NoRouteProof,
    );
    let c = the(
        &out,
        "egress-allowlist.conf cannot be read: egress-allowlist.conf line 2",
    );
    assert_eq!(c.level, Level::Fail);
    assert!(fix(c).contains("fix /srv/d/egress-allowlist.conf"), "{c:?}");
    assert_eq!(not_ok(&out), [c]);
}

#[test]
fn unreadable_endpoints_fail() {
    let out = run(
        &Inputs {
            endpoints: Read::Failed("model-endpoints.json: version must be the number 1".into()),
            ..healthy()
        },
        &NoRouteProof,
    );
    let c = the(
        &out,
        "model-endpoints.json cannot be read: model-endpoints.json: version",
    );
    assert_eq!(c.level, Level::Fail);
    assert!(fix(c).contains("fix /srv/d/model-endpoints.json"), "{c:?}");
    assert_eq!(not_ok(&out), [c]);
}

/// A healthy deployment whose `llm` server is on the declared endpoint `gpu-1`.
fn on_declared_endpoint() -> Inputs {
    Inputs {
        mcp: overlay(&format!(
            r#"{SERVERS}, "llm": {{"url": "https://llm.example.com:8443/mcp", "description": "LLM tools"}}"#
        )),
        endpoints: endpoints(r#"{"id": "gpu-1", "host": "llm.example.com", "port": 8443}"#),
        ..healthy()
    }
}

#[test]
fn a_server_on_a_declared_endpoint_no_model_uses_warns_when_not_proven() {
    let out = run(&on_declared_endpoint(), &NoRouteProof);
    let c = the(
        &out,
        "server llm is on declared endpoint gpu-1 (llm.example.com:8443)",
    );
    assert_eq!(c.level, Level::Warn);
    assert!(c.label.contains("which no overlay model uses"), "{c:?}");
    assert!(c.label.contains("not proven"), "{c:?}");
    assert_eq!(not_ok(&out), [c]);
    assert_eq!(
        the(&out, "model-endpoints.json reads").label,
        "model-endpoints.json reads: 1 endpoint declared"
    );
}

#[test]
fn a_server_on_a_declared_endpoint_is_ok_when_the_route_is_proven() {
    let proof = Proving::default();
    let out = run(&on_declared_endpoint(), &proof);
    assert!(not_ok(&out).is_empty(), "{out:#?}");
    let c = the(&out, "server llm: the route to declared endpoint gpu-1");
    assert_eq!(c.level, Level::Ok);
    assert!(
        c.label.contains("(llm.example.com:8443) is proven"),
        "{c:?}"
    );
    assert_eq!(
        *proof.asked.borrow(),
        [("llm.example.com".to_owned(), 8443)]
    );
}

#[test]
fn a_server_on_an_endpoint_an_overlay_model_uses_needs_no_proof() {
    let inputs = Inputs {
        models: models_file(
            r#"{"providers": {"local": {"baseUrl": "https://llm.example.com:8443/v1", "apiKey": "$LOCAL_KEY"}}}"#,
        ),
        ..on_declared_endpoint()
    };
    let proof = Proving::default();
    let out = run(&inputs, &proof);
    assert!(
        proof.asked.borrow().is_empty(),
        "{:?}",
        proof.asked.borrow()
    );
    assert!(not_ok(&out).is_empty(), "{out:#?}");
    assert!(
        !labels(&out).iter().any(|l| l.contains("server llm")),
        "{out:#?}"
    );
    // Nor is a line added without a proof.
    let out = run(&inputs, &NoRouteProof);
    assert!(not_ok(&out).is_empty(), "{out:#?}");
    assert_eq!(out.len(), run(&healthy(), &NoRouteProof).len());
}

#[test]
fn a_model_base_url_written_another_way_still_uses_its_endpoint() {
    // The endpoint on 443, and the server on it; each baseUrl names that host and port, not plainly.
    for base_url in [
        "https://LLM.example.com:443/v1",
        "HTTPS://llm.example.com/v1",
        "https://llm.example.com.:0443/v1",
    ] {
        let inputs = Inputs {
            mcp: overlay(r#""llm": {"url": "https://llm.example.com/mcp", "description": "LLM"}"#),
            endpoints: endpoints(r#"{"id": "gpu-1", "host": "llm.example.com", "port": 443}"#),
            models: models_file(&format!(
                r#"{{"providers": {{"local": {{"baseUrl": "{base_url}", "apiKey": "$LOCAL_KEY"}}}}}}"#
            )),
            ..healthy()
        };
        let proof = Proving::default();
        let out = run(&inputs, &proof);
        assert!(proof.asked.borrow().is_empty(), "{base_url}");
        assert!(not_ok(&out).is_empty(), "{base_url}: {out:#?}");
    }
    // Another port is another endpoint: the route to the server's still wants its proof.
    let inputs = Inputs {
        mcp: overlay(r#""llm": {"url": "https://llm.example.com/mcp", "description": "LLM"}"#),
        endpoints: endpoints(r#"{"id": "gpu-1", "host": "llm.example.com", "port": 443}"#),
        models: models_file(
            r#"{"providers": {"local": {"baseUrl": "HTTPS://LLM.example.com:8443/v1", "apiKey": "$K"}}}"#,
        ),
        ..healthy()
    };
    let out = run(&inputs, &NoRouteProof);
    let c = the(&out, "server llm is on declared endpoint gpu-1");
    assert_eq!(c.level, Level::Warn);
}

#[test]
fn egress_off_warns_once_and_judges_no_reach() {
    let inputs = Inputs {
        settings: settings(false),
        mcp: overlay(
            r#"
            "other": {"url": "https://other.example.net/mcp", "description": "Other"},
            "plain": {"url": "http://docs.example.com:443/mcp", "description": "Plain"},
            "own": {"url": "https://localhost/mcp", "description": "Own"}
            "#,
        ),
        // Without the policy, no allowlist is needed.
        allowlist: Read::Missing,
        ..on_declared_endpoint()
    };
    let out = run(&inputs, &NoRouteProof);
    let c = the(&out, "egress policy off (PI_EGRESS=0)");
    assert_eq!(c.level, Level::Warn);
    assert!(fix(c).contains("PI_EGRESS=1"), "{c:?}");
    assert_eq!(not_ok(&out), [c]);
    assert!(
        !labels(&out)
            .iter()
            .any(|l| l.contains("out of the egress proxy's reach")),
        "{out:#?}"
    );
    // The healthy deployment has the policy on.
    assert!(
        labels(&out)
            .iter()
            .any(|l| l.starts_with("egress off: each job gets a network of its own")),
        "{out:#?}"
    );
    // No slirp4netns, or a worker that is not root: no job with egress off can start.
    let off = || Inputs {
        settings: settings(false),
        allowlist: Read::Missing,
        ..healthy()
    };
    let missing = run(
        &Inputs {
            slirp4netns: false,
            ..off()
        },
        &NoRouteProof,
    );
    let c = the(
        &missing,
        "egress off: /usr/bin/slirp4netns is not installed",
    );
    assert_eq!(c.level, Level::Fail);
    assert!(fix(c).contains("slirp4netns"), "{c:?}");
    let not_root = run(
        &Inputs {
            isolation: super::Isolation {
                root: false,
                ..off().isolation
            },
            ..off()
        },
        &NoRouteProof,
    );
    let c = the(
        &not_root,
        "egress off: a job's network of its own is made by a worker running as root",
    );
    assert_eq!(c.level, Level::Fail);
    assert!(fix(c).contains("as root"), "{c:?}");
    let healthy = run(&healthy(), &NoRouteProof);
    assert!(
        !labels(&healthy)
            .iter()
            .any(|l| l.contains("egress policy off"))
    );
}

#[test]
fn settings_that_fail_give_one_failure_each_naming_the_env_file() {
    let get = |name: &str| match name {
        "PI_GLOBAL_PI_DIR" => Some("relative".to_owned()),
        "PI_EGRESS" => Some("yes".to_owned()),
        _ => None,
    };
    let errors: Vec<String> = config::settings::resolve(&get, Path::new(DIR))
        .unwrap_err()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(errors.len(), 2);
    let out = settings_failed(&errors, Path::new(DIR));
    assert_fixes(&out);
    assert_eq!(out.len(), 2);
    for (c, e) in out.iter().zip(&errors) {
        assert_eq!(c.level, Level::Fail);
        assert_eq!(c.label, format!("settings: {e}"));
        assert!(fix(c).contains("/srv/d/.env"), "{c:?}");
    }
    assert!(out[0].label.contains("PI_GLOBAL_PI_DIR"));
    assert!(out[1].label.contains("PI_EGRESS"));
    assert!(settings_failed(&[], Path::new(DIR)).is_empty());
}

#[test]
fn plain_http_to_an_allowlisted_host_is_told_to_use_https() {
    let out = with_docs_at("http://docs.example.com/mcp", "docs.example.com\n");
    let c = the(&out, "server docs is out of the egress proxy's reach");
    assert_eq!(c.level, Level::Warn);
    assert!(fix(c).contains("https://"), "{}", fix(c));
    // A loopback server is told it can never be reached, not to edit a file.
    let out = with_docs_at("http://localhost:8080/mcp", "docs.example.com\n");
    let c = the(&out, "server docs is out of the egress proxy's reach");
    assert!(c.label.contains("its own machine"), "{}", c.label);
    assert!(!fix(c).contains("model-endpoints.json"), "{}", fix(c));
}

#[test]
fn an_endpoint_shared_by_servers_is_proven_once() {
    let inputs = Inputs {
        mcp: overlay(
            r#""a": {"url": "https://llm.example.com:8443/a", "description": "A"},
               "b": {"url": "https://llm.example.com:8443/b", "description": "B"}"#,
        ),
        endpoints: endpoints(r#"{"id": "llm", "host": "llm.example.com", "port": 8443}"#),
        ..healthy()
    };
    let proof = Proving::default();
    let out = run(&inputs, &proof);
    assert_eq!(
        *proof.asked.borrow(),
        [("llm.example.com".to_owned(), 8443)]
    );
    assert_eq!(
        out.iter().filter(|c| c.label.contains("is proven")).count(),
        2
    );
}

/// A proxy as doctor might find it.
struct Found {
    proxy: ProxyFound,
    canary: Result<(), String>,
}

impl RouteProof for Found {
    fn proxy(&self) -> ProxyFound {
        self.proxy.clone()
    }
    fn prove(&self, _host: &str, _port: u16) -> Result<(), String> {
        Ok(())
    }
    fn canary(&self) -> Result<(), String> {
        self.canary.clone()
    }
}

#[test]
fn the_proxy_answers_and_refuses_a_host_on_no_list() {
    let running = Found {
        proxy: ProxyFound::Running { pid: 42, jobs: 1 },
        canary: Ok(()),
    };
    let out = run(&healthy(), &running);
    assert_eq!(the(&out, "egress proxy: running").level, Level::Ok);
    assert_eq!(the(&out, "pid 42, 1 job open").level, Level::Ok);
    assert_eq!(the(&out, "a host on no list is refused").level, Level::Ok);
    assert!(not_ok(&out).is_empty(), "{out:#?}");

    let own = Found {
        proxy: ProxyFound::StartedForDoctor,
        canary: Ok(()),
    };
    let out = run(&healthy(), &own);
    assert_eq!(the(&out, "egress proxy: none running").level, Level::Ok);

    // A proxy that lets the canary through is not one jobs can trust.
    let open = Found {
        proxy: ProxyFound::Running { pid: 42, jobs: 0 },
        canary: Err("it answered 200".into()),
    };
    let out = run(&healthy(), &open);
    assert_eq!(the(&out, "was not refused").level, Level::Fail);

    let none = Found {
        proxy: ProxyFound::Unavailable("the folder cannot be made".into()),
        canary: Ok(()),
    };
    let out = run(&healthy(), &none);
    let c = the(&out, "none answers and none can be started");
    assert_eq!(c.level, Level::Fail);
    assert!(fix(c).contains("pi-dispatch egress-proxy"), "{c:?}");
    // No canary without a proxy.
    assert!(
        !labels(&out).iter().any(|l| l.contains("no list")),
        "{out:#?}"
    );

    // With egress off there is no proxy to check.
    let off = Inputs {
        settings: settings(false),
        ..healthy()
    };
    let out = run(&off, &none);
    assert!(
        !labels(&out).iter().any(|l| l.starts_with("egress proxy")),
        "{out:#?}"
    );
}

#[test]
fn a_declared_endpoint_on_this_machine_is_said() {
    let inputs = Inputs {
        endpoints: endpoints(r#"{"id": "local", "host": "127.0.0.1", "port": 8000}"#),
        ..healthy()
    };
    let out = run(&inputs, &NoRouteProof);
    let c = the(
        &out,
        "declared endpoint local is on this machine (127.0.0.1:8000)",
    );
    assert_eq!(c.level, Level::Ok);
    assert!(
        c.label.contains("that port of it and nothing else"),
        "{c:?}"
    );
}
