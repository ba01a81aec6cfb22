//! The job's wait for its servers is one wait: 15 s, or a server's own timeout when longer (up to
//! 120), counted from when the runner starts connecting, for the runner's part and pi's together.
//! A server that takes seconds to answer its handshake leaves pi that much less of the wait; it
//! does not start pi's part afresh.

use serde_json::json;
use testkit::fake_model::Step;

use crate::worker::{EVERYTHING, Service};

/// server-everything over stdio, after six seconds of silence.
fn slow() -> String {
    format!(
        "await new Promise((resolve) => setTimeout(resolve, 6000));\n\
         process.argv = [process.argv[0], {EVERYTHING:?}, \"stdio\"];\n\
         await import({EVERYTHING:?});\n"
    )
}

/// A tool that reads when pi's wait for the tools ends, from the runner's `listed.json`.
const DEADLINE: &str = r#"
import { readFileSync } from "node:fs";
export default function (pi) {
  pi.registerTool({ name: "deadline", label: "deadline", description: "When the wait ends",
    parameters: { type: "object", properties: {} },
    async execute() {
      const listed = JSON.parse(readFileSync(process.env.PI_CODING_AGENT_DIR + "/pi-dispatch/listed.json", "utf8"));
      return { content: [{ type: "text", text: `deadline ${listed.deadlineMs}` }] };
    } });
}
"#;

#[test]
fn a_slow_server_shortens_pis_part_of_the_one_wait() {
    let timeout_secs = 40;
    let s = Service::new(
        vec![Step::call("deadline", json!({})), Step::text("done")],
        |_| {
            json!({"slow": {"command": "node", "args": ["/opt/pi-global/slow.mjs"],
                "timeout": timeout_secs,
                "description": "Everything, slow to start", "exposure": "direct"}})
        },
        "",
    );
    s.d.write("pi-global/slow.mjs", &slow());
    s.d.write("pi-global/extensions/deadline.js", DEADLINE);
    let (_, record, results, _) = s.complete("When does the wait end?", "slow");
    // The probe ran: the tool read the runner's file.
    let deadline: u64 = results[1]
        .split_whitespace()
        .find_map(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("{results:#?}"));
    let began = deadline - timeout_secs * 1000;
    let started = record["startedAtMs"].as_u64().unwrap();
    let up = record["sandboxUpAtMs"].as_u64().unwrap();
    // The wait is the server's own timeout, and began once the sandbox was up, as the runner
    // started connecting: not six seconds later, when the slow server had answered.
    assert!(
        began >= started,
        "the wait began {began}, the job {started}"
    );
    assert!(
        began < up + 3000,
        "the wait began {} ms after the sandbox was up: pi's part was counted from the server's answer",
        began - up
    );
}
