//! The hub's upstream client, as a command the MCP conformance suite can run
//! (`conformance client --command <this> --scenario <name>`; `tests/conformance.rs` does). The suite
//! appends its test server's URL as the last argument: this connects to it exactly as the runner
//! connects an HTTP server of the job (`hub::http::transport`, then `connect_transport`, which
//! initializes and lists the tools), calls the tools the client scenarios ask for (`add_numbers`,
//! `test_reconnection`), closes the session and exits 0; or exits 1 with the reason on stderr.

use std::process::ExitCode;
use std::time::Duration;

use hub::connect::connect_transport;
use hub::http::{HttpPolicy, transport};
use hub::job_file;
use hub::relay::UpstreamEvents;
use hub::resolve::{Resolved, resolve};
use serde_json::json;

/// The whole run, bounded (the suite's own timeout is 30 s).
const BOUND: Duration = Duration::from_secs(25);

#[tokio::main]
async fn main() -> ExitCode {
    match tokio::time::timeout(BOUND, run()).await {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(why)) => {
            eprintln!("hub-conformance-client: {why}");
            ExitCode::FAILURE
        }
        Err(_) => {
            eprintln!("hub-conformance-client: no end within {BOUND:?}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), String> {
    let url = std::env::args()
        .skip(1)
        .last()
        .ok_or("usage: hub-conformance-client <server URL>")?;
    // The suite's test servers listen on every interface but name themselves `localhost`: the
    // client goes to 127.0.0.1 only.
    let url = url.replacen("://localhost:", "://127.0.0.1:", 1);
    // The URL made a job's server entry and resolved as the runner resolves one.
    let file = json!({
        "mcpServers": {"conformance": {"url": url, "description": "the suite's test server"}},
        "codemodeModels": false
    });
    let job = job_file::parse(file.to_string().as_bytes()).map_err(|stop| stop.cause)?;
    let server = job.servers.first().ok_or("the job file lists no server")?;
    let Resolved::Http { url, headers } = resolve(server, &|_| None).map_err(|s| s.cause)? else {
        return Err("the server resolved as a stdio server".to_owned());
    };
    let http = transport(&url, &headers, &HttpPolicy::default()).map_err(|e| e.to_string())?;
    let upstream = connect_transport("conformance", http.transport, UpstreamEvents::new())
        .await
        .map_err(|e| format!("connect: {e}"))?;
    println!("connected; tools: {}", upstream.tools.len());
    for tool in &upstream.tools {
        let arguments = match tool.name.as_str() {
            "add_numbers" => json!({"a": 2, "b": 3}),
            "test_reconnection" => json!({}),
            _ => continue,
        };
        let result = upstream
            .peer
            .request(
                "tools/call",
                json!({"name": tool.name, "arguments": arguments}),
            )
            .await
            .map_err(|e| format!("tools/call {}: {e}", tool.name))?;
        println!("{}: {}", tool.name, result["content"]);
        if result["isError"] == true {
            return Err(format!("tools/call {} answered with an error", tool.name));
        }
    }
    upstream.shutdown().await;
    Ok(())
}
