//! One decision: for each job of a table, `run` (at queue time), `explain --json`, `doctor --json`
//! and the worker reach the same decision and reason, because they ask the same admission.

use serde_json::{Value, json};
use testkit::fake_model::Step;

use crate::common::Run;
use crate::worker::{MODEL_KEY, Service, give_to_nobody, stdio};

/// What each of the four said of one job: `None` for admitted (the worker: completed).
#[derive(Debug, PartialEq)]
struct Said {
    run: Option<String>,
    explain: Option<String>,
    doctor: Option<String>,
    worker: Option<String>,
}

impl Said {
    /// All four saying `reason`.
    fn alike(reason: Option<&str>) -> Said {
        let r = reason.map(str::to_owned);
        Said {
            run: r.clone(),
            explain: r.clone(),
            doctor: r.clone(),
            worker: r,
        }
    }
}

/// The reason `run` gave when it refused (it prints the token first on its refusal line).
fn run_reason(run: &Run) -> Option<String> {
    if run.code == 0 {
        return None;
    }
    let line = run
        .stderr
        .lines()
        .find(|l| l.contains("would be refused"))
        .unwrap_or_else(|| panic!("no refusal: {}", run.stderr));
    let after = line.split("not queued: ").nth(1).unwrap();
    Some(after.split_whitespace().next().unwrap().to_owned())
}

fn env_cli(s: &Service, args: &[&str]) -> Run {
    s.cli(args)
}

fn json_of(run: &Run) -> Value {
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {}", run.stdout))
}

/// A local repository of the job's user, committed and clean.
fn repo(s: &Service, name: &str, owner: Option<&str>) -> String {
    let path = s.d.path().join(name);
    std::fs::create_dir_all(&path).unwrap();
    let git = |args: &[&str]| crate::common::git(&path, args);
    git(&["init", "-q"]);
    std::fs::write(path.join("README.md"), "r\n").unwrap();
    git(&["add", "."]);
    git(&["commit", "-qm", "r"]);
    match owner {
        Some("root") => {}
        _ => give_to_nobody(&path),
    }
    path.to_str().unwrap().to_owned()
}

/// Asks all four about trigger `index` of the deployment (`round` keeps the worker's job ids apart).
fn said(s: &Service, index: usize, round: &str) -> Said {
    let n = index.to_string();
    let explain = json_of(&env_cli(s, &["explain", "--trigger", &n, "--json"]));
    let doctor = json_of(&env_cli(s, &["doctor", "--json"]));
    let label = format!("trigger {index} ");
    let check = doctor["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["label"].as_str().unwrap().starts_with(&label))
        .unwrap_or_else(|| panic!("doctor has no check of trigger {index}: {doctor:#}"))
        .clone();
    let run = env_cli(s, &["run", "--trigger", &n]);
    // The worker: the job the trigger queues, put on the queue as its cron schedule would (the
    // schedule does not ask before it queues).
    let bytes = std::fs::read(s.d.path().join("triggers.json")).unwrap();
    let trigger = config::triggers::parse_triggers(&bytes)
        .unwrap()
        .triggers
        .remove(index);
    let config::triggers::On::Cron { id, .. } = &trigger.on else {
        panic!("the table's triggers are cron triggers")
    };
    let job_id = format!("cron-{id}-table-{round}");
    let job = trigger.job(job_id.clone());
    enqueue(s, &job_id, &serde_json::to_string(&job).unwrap());
    s.work();
    let record = s.record(&job_id);
    Said {
        run: run_reason(&run),
        explain: explain["reason"].as_str().map(str::to_owned),
        doctor: check["reason"].as_str().map(str::to_owned),
        worker: record["reason"].as_str().map(str::to_owned),
    }
}

fn enqueue(s: &Service, id: &str, payload: &str) {
    use queue::Queue as _;
    let q = queue::SqliteQueue::open(&queue::sqlite_path(s.d.path())).unwrap();
    assert!(
        q.enqueue(id, payload, std::time::SystemTime::now())
            .unwrap()
    );
}

#[test]
fn run_explain_doctor_and_the_worker_decide_alike() {
    let s = Service::new(
        vec![Step::text("done"); 4],
        |_| json!({"direct": stdio(None)}),
        "",
    );
    let good = repo(&s, "good", None);
    let roots = repo(&s, "roots", Some("root"));
    let trigger = |id: &str, folder: &str, extra: Value| {
        let mut run = json!({"kind": "local", "folder": folder, "task": "Do it.", "flow": "task", "mcp": ["direct"]});
        for (k, v) in extra.as_object().unwrap() {
            run[k] = v.clone();
        }
        json!({"on": {"type": "cron", "id": id, "pattern": "0 3 1 1 *"}, "run": run})
    };
    let table: Vec<(&str, Value, Option<&str>)> = vec![
        ("good", trigger("good", &good, json!({})), None),
        (
            "unknown-server",
            trigger("unknown", &good, json!({"mcp": ["direct", "nosuch"]})),
            Some("mcp-server-unknown"),
        ),
        (
            "root-folder",
            trigger("roots", &roots, json!({})),
            rustix::process::geteuid()
                .is_root()
                .then_some("workspace-owned-by-root"),
        ),
        (
            "unknown-model",
            trigger(
                "model",
                &good,
                json!({"provider": "openai", "model": "gpt-none"}),
            ),
            Some("model-unknown"),
        ),
        (
            "missing-key",
            trigger(
                "key",
                &good,
                json!({"provider": "openai", "model": "gpt-4o"}),
            ),
            Some("model-key-missing"),
        ),
    ];
    let triggers = json!({"triggers": table.iter().map(|(_, t, _)| t.clone()).collect::<Vec<_>>()});
    s.d.write("triggers.json", &triggers.to_string());
    for (index, (name, _, expected)) in table.iter().enumerate() {
        assert_eq!(said(&s, index, "1"), Said::alike(*expected), "{name}");
    }

    // Egress on (the default), the model declared as an endpoint on this machine: all four admit
    // the good job alike, and the worker's job reaches its model through the egress proxy.
    let env = std::fs::read_to_string(s.d.path().join(".env")).unwrap();
    s.d.write(".env", &env.replace("PI_EGRESS=0\n", ""));
    s.d.write(
        "model-endpoints.json",
        &json!({"version": 1, "endpoints": [{"id": "fake", "host": s.model.address().to_string(), "port": s.model.port}]})
            .to_string(),
    );
    assert_eq!(said(&s, 0, "egress"), Said::alike(None));
    s.d.write(".env", &env);

    // A badly typed list cannot be written in triggers.json (the loader refuses it): `run` refuses
    // a bad name at once, and the worker a hand-written job, both as mcp-list-invalid.
    let run = env_cli(&s, &["run", &good, "--task", "x", "--mcp", "Not_A_Name"]);
    assert_eq!(
        run_reason(&run).as_deref(),
        Some("mcp-list-invalid"),
        "{}",
        run.stderr
    );
    for (n, bad) in [json!("direct"), json!([1])].into_iter().enumerate() {
        let id = format!("cli-bad-list-{n}");
        let job = json!({"id": id, "triggerType": "cli", "kind": "local", "folder": good,
            "task": "x", "mcp": bad, "provider": "fake", "model": "fake-model"});
        enqueue(&s, &id, &job.to_string());
        s.work();
        assert_eq!(s.record(&id)["reason"], "mcp-list-invalid", "{bad}");
    }
    // The good job really ran, with the model's key from the worker's environment.
    assert!(
        s.model
            .requests()
            .iter()
            .all(|r| r.authorization.as_deref() == Some(format!("Bearer {MODEL_KEY}").as_str()))
    );
}
