//! A hostile job: pi's bash tool (scripted by the model) tries every way it has to read a
//! credential that is not its own (a stdio server's environment, an HTTP server's header value, the
//! hub's token), to trace another process, to make a user namespace, and to open a hub session as
//! a process of its own or as a pi started by hand; a stdio server looks for everything the other
//! processes of the job hold, the provider's key among them. Canaries mark each value (the
//! provider's key too, which only the runner's model gateway holds): none may turn up.

use serde_json::json;
use testkit::fake_model::Step;

use crate::common::Run;
use crate::worker::{EVERYTHING, Service, queued_id};

const KEEPER_TOKEN: &str = "cnry-stdio-7f3a";
const WEB_HEADER: &str = "cnry-header-91b2";

#[test]
fn a_hostile_job_reads_no_credential_but_its_own() {
    let s = Service::new(
        vec![
            Step::call("mcp__keeper__echo", json!({"message": "keeper answers"})),
            Step::call("bash", json!({"command": "sh /workspace/attack.sh"})),
            Step::text("done"),
        ],
        |http| {
            json!({
                "keeper": {"command": "node", "args": [EVERYTHING, "stdio"],
                    "env": {"KEEPER_TOKEN": "${KEEPER_TOKEN}"},
                    "description": "Holds a token", "exposure": "direct"},
                "web": {"url": http, "headers": {"X-Canary": "${WEB_HEADER}"},
                    "description": "Everything over HTTP", "exposure": "direct"},
                "spy": {"command": "node", "args": ["/workspace/spy.mjs", EVERYTHING],
                    "description": "Looks around", "exposure": "direct"},
            })
        },
        "PI_FORWARD_ENV=KEEPER_TOKEN,WEB_HEADER\n",
    );
    for name in ["attack.sh", "hub.mjs", "spy.mjs"] {
        let text = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/it/hostile")
                .join(name),
        )
        .unwrap();
        std::fs::write(s.repo.join(name), text).unwrap();
    }
    s.seal();
    let canaries = |cmd: &mut std::process::Command| {
        cmd.env("KEEPER_TOKEN", KEEPER_TOKEN)
            .env("WEB_HEADER", WEB_HEADER);
    };
    let mut queue = s.d.command(&[
        "run",
        s.repo.to_str().unwrap(),
        "--task",
        "Look around.",
        "--mcp",
        "keeper,web,spy",
    ]);
    queue.env("FAKE_API_KEY", crate::worker::MODEL_KEY);
    canaries(&mut queue);
    let queued = Run::from(queue.output().unwrap());
    assert_eq!(queued.code, 0, "{}", queued.stderr);
    let id = queued_id(&queued);
    let mut work = s.worker_command(&[]);
    canaries(&mut work);
    let worked = Run::from(work.output().unwrap());
    assert_eq!(worked.code, 0, "{}", worked.stderr);

    let record = s.record(&id);
    let results = s.results();
    assert_eq!(record["outcome"], "completed", "{record:#}\n{results:#?}");
    // The keeper has its token: the canary is real.
    let attack = &results[2];
    if std::env::var_os("HOSTILE_SHOW").is_some() {
        eprintln!(
            "{attack}\n{}",
            std::fs::read_to_string(s.repo.join("spy.json")).unwrap()
        );
    }
    assert!(
        attack.contains("== end"),
        "the attack ran to its end: {attack}"
    );
    for canary in [KEEPER_TOKEN, WEB_HEADER, crate::worker::MODEL_KEY] {
        assert!(
            !attack.contains(canary),
            "pi's tools read {canary}:\n{attack}"
        );
    }
    for success in ["ATTACHED", "HUB-SESSION-OPENED", "USERNS-MADE", "token:"] {
        assert!(!attack.contains(success), "{success}:\n{attack}");
    }
    // What pi's tools see of the job: pi's own namespace, never the runner or a server.
    let cmdlines = attack
        .split("== cmdline")
        .nth(1)
        .and_then(|r| r.split("== files").next())
        .unwrap_or_default();
    assert!(
        !cmdlines.contains("bin/pi-dispatch job ") && !cmdlines.contains("server-everything"),
        "{cmdlines}"
    );
    // Nor pi itself: pi's tools run in a namespace of their own, which holds the attack only.
    assert!(
        cmdlines.contains("sh /workspace/attack.sh"),
        "the attack itself: {cmdlines}"
    );
    assert!(!cmdlines.contains("dist/bundle/cli.js"), "{cmdlines}");
    // A pi started by hand lists no server's tools.
    let by_hand = attack.split("== pi by hand").nth(1).unwrap_or_default();
    assert!(!by_hand.contains("\"echo\""), "{by_hand}");
    assert!(
        attack.contains("hub keeper:"),
        "the hub was tried: {attack}"
    );
    // pi reaches the hub through the relays it starts, out of the tools' sight; the hub's socket
    // was reached and refused the tokens tried.
    assert!(!cmdlines.contains("job-relay --socket"), "{cmdlines}");
    assert!(
        attack.contains("Unauthorized: the hub refused the connection"),
        "the socket was tried: {attack}"
    );

    // The spy server saw only its own namespace: no canary, no pi, no runner, no other server.
    let spy: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(s.repo.join("spy.json")).unwrap()).unwrap();
    assert_eq!(spy["found"], json!([]), "{spy:#}");
    for seen in spy["seen"].as_array().unwrap() {
        let seen = seen.as_str().unwrap();
        assert!(
            !seen.contains("/cli.js")
                && !seen.contains("pi-dispatch job ")
                && !seen.contains(&format!("{EVERYTHING} stdio")),
            "the spy saw {seen}: {spy:#}"
        );
    }
    assert!(
        !worked.stderr.contains(KEEPER_TOKEN) && !worked.stderr.contains(WEB_HEADER),
        "the worker's log"
    );
    // The provider still got the real key, from the gateway.
    assert!(
        s.model
            .requests()
            .iter()
            .all(|r| r.authorization.as_deref()
                == Some(&format!("Bearer {}", crate::worker::MODEL_KEY))),
        "the provider got the key on every call"
    );
}
