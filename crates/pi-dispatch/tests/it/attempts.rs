//! What a job reports cannot push it into a second attempt, and an attempt that ran is never run
//! again silently. Real jobs through the worker with real pi:
//!
//! - an extension inside pi (which holds the hub's token) floods the hub with 400 calls of tools
//!   whose names are 3,000 characters long; the job ends on its first attempt with its real
//!   outcome, the calls counted together under one name;
//! - the model answers once (a tool call) and is then down for the rest of that run: the first
//!   attempt ends `model-unreachable`, the second completes, and its record links the first's
//!   (which stands on its own) and adds what it spent.

use serde_json::{Value, json};
use testkit::fake_model::{CHAT_USAGE, Step};

use crate::worker::Service;

/// A tool that opens the hub's socket as pi's relay does (the socket and the token are pi's) and
/// calls 400 tools no server listed, each name 3,000 characters long.
const FLOOD: &str = r#"
import { readFileSync } from "node:fs";
import net from "node:net";
export default function (pi) {
  pi.registerTool({ name: "flood", label: "flood", description: "Flood the hub",
    parameters: { type: "object", properties: {} },
    async execute() {
      const config = JSON.parse(readFileSync(process.env.PI_CODING_AGENT_DIR + "/mcp.json", "utf8"));
      const [name, server] = Object.entries(config.mcpServers)[0];
      const socket = server.args[server.args.indexOf("--socket") + 1];
      const answered = await new Promise((resolve, reject) => {
        const s = net.connect(socket);
        let buffer = "", answers = 0, refused = 0;
        s.on("data", (d) => {
          buffer += d;
          const lines = buffer.split("\n");
          buffer = lines.pop();
          for (const line of lines) {
            answers += 1;
            if (line.includes("did not list")) refused += 1;
          }
          if (answers >= 401) { s.end(); resolve(`${answers} answers, ${refused} refused`); }
        });
        s.on("error", reject);
        s.write(`${name} Bearer ${process.env.PI_DISPATCH_HUB_TOKEN}\n`);
        s.write(JSON.stringify({ jsonrpc: "2.0", id: 0, method: "initialize", params: {
          protocolVersion: "2025-11-25", capabilities: {}, clientInfo: { name: "flood", version: "1" } } }) + "\n");
        s.write(JSON.stringify({ jsonrpc: "2.0", method: "notifications/initialized" }) + "\n");
        for (let i = 1; i <= 400; i++) {
          s.write(JSON.stringify({ jsonrpc: "2.0", id: i, method: "tools/call",
            params: { name: "x".repeat(3000) + i, arguments: {} } }) + "\n");
        }
      });
      return { content: [{ type: "text", text: `flooded: ${answered}` }] };
    } });
}
"#;

#[test]
fn a_flood_of_long_tool_names_ends_the_job_on_its_first_attempt() {
    let s = Service::new(
        vec![Step::call("flood", json!({})), Step::text("done")],
        |_| json!({"everything": crate::worker::stdio(Some("direct"))}),
        "",
    );
    s.d.write("pi-global/extensions/flood.js", FLOOD);
    let (_, record, results, worked) = s.complete("Flood.", "everything");
    // The probe ran: every call reached the hub and was refused there.
    assert!(
        results[1].contains("flooded: 401 answers, 400 refused"),
        "{results:#?}"
    );
    assert_eq!(record["attempt"], 1, "{record:#}");
    assert!(!worked.stderr.contains("job_retried"), "{}", worked.stderr);
    let calls = record["mcp"]["toolCalls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{calls:#?}");
    assert_eq!(calls[0]["server"], "everything");
    assert_eq!(calls[0]["tool"], "(other)");
    assert_eq!(calls[0]["refused"], 400);
}

#[test]
fn an_attempt_that_ran_keeps_its_record_and_the_next_adds_what_it_spent() {
    let s = Service::new(
        vec![
            Step::call("bash", json!({"command": "echo first attempt"})),
            Step::DownForThisRun(502),
            Step::text("Done on the second attempt."),
        ],
        |_| json!({"everything": crate::worker::stdio(Some("direct"))}),
        "",
    );
    let (id, record, _, worked) = s.complete("Do it.", "everything");
    assert!(worked.stderr.contains("job_retried"), "{}", worked.stderr);
    // The first attempt's record stands on its own, linked to the job.
    let first = s.record(&format!("{id}.attempt-1"));
    assert_eq!(first["attemptOf"], id.as_str(), "{first:#}");
    assert_eq!(first["attempt"], 1);
    assert_eq!(first["reason"], "model-unreachable", "{first:#}");
    assert_eq!(first["tokens"]["input"], CHAT_USAGE.0, "{first:#}");
    // The job's record is the second attempt's, naming the first, its totals both attempts'.
    assert_eq!(record["attempt"], 2, "{record:#}");
    let earlier = record["earlierAttempts"].as_array().unwrap();
    assert_eq!(earlier.len(), 1, "{record:#}");
    assert_eq!(earlier[0]["record"], format!("{id}.attempt-1"));
    assert_eq!(earlier[0]["reason"], "model-unreachable");
    assert_eq!(record["tokens"]["input"], 2 * CHAT_USAGE.0, "{record:#}");
    assert_eq!(record["tokens"]["output"], 2 * CHAT_USAGE.1, "{record:#}");
    let shown = s.d.run(&["runs", "show", &id]);
    assert!(
        shown.stdout.contains(&format!(
            "earlier attempt 1: failed model-unreachable, tokens {} in",
            CHAT_USAGE.0
        )),
        "{}",
        shown.stdout
    );
    let listed: Value = serde_json::from_str(&s.d.run(&["runs", "--json"]).stdout).unwrap();
    assert!(
        listed.to_string().contains(&format!("{id}.attempt-1")),
        "{listed:#}"
    );
}
