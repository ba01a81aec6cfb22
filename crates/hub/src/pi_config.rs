//! pi's own `mcp.json`, written by the runner in pi's private agent folder: only the hub, each server
//! with its description, exposure, toolExposure and timeout. MCP credentials never appear in it.
//! pi reaches the hub through the relay it starts for each server (a stdio server to pi, see
//! [`crate::pi_relay`]), or, when the runner has no relay to offer, over HTTP with the per-job
//! token.

use std::path::Path;

use config::json::{self, Json, Object};
use config::mcp::Exposure;

use crate::job_file::JobServer;

/// How pi reaches the hub.
#[derive(Debug, Clone, Copy)]
pub enum Reach<'a> {
    /// Over streamable HTTP, server `name` at `<base>/mcp/<name>`, with the token.
    Http { base: &'a str, token: HubToken<'a> },
    /// Through `<program> job-relay --socket <socket> <name>`, which takes the token from pi's
    /// environment ([`HUB_TOKEN_VARIABLE`]).
    Relay { program: &'a Path, socket: &'a Path },
}

/// The arguments after the relay's program that reach server `name`.
pub fn relay_args(socket: &Path, name: &str) -> Vec<String> {
    vec![
        "job-relay".to_owned(),
        "--socket".to_owned(),
        socket.to_string_lossy().into_owned(),
        name.to_owned(),
    ]
}

fn s(v: &str) -> Json {
    Json::String(v.to_owned())
}

fn exposure(e: Exposure) -> Json {
    s(e.as_str())
}

/// The variable of pi's environment that holds the hub's token in a confined job: pi's
/// `mcp.json` names it (pi expands `${NAME}` in header values), so no file holds the token, and
/// pi's shell removes it before a tool's command runs.
pub const HUB_TOKEN_VARIABLE: &str = "PI_DISPATCH_HUB_TOKEN";

/// How pi's `mcp.json` gives pi the hub's token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HubToken<'a> {
    /// Written in the file (an unconfined runner, for tests and hand runs). Only letters and
    /// digits: pi expands `$` and runs a leading `!` in header values.
    Literal(&'a str),
    /// A reference to [`HUB_TOKEN_VARIABLE`], which only pi's environment holds.
    FromEnvironment,
}

/// How pi connects to server `name`: the members that say it.
fn connection(reach: &Reach, name: &str) -> Vec<(String, Json)> {
    match reach {
        Reach::Http { base, token } => {
            let authorization = match token {
                HubToken::Literal(t) => format!("Bearer {t}"),
                HubToken::FromEnvironment => format!("Bearer ${{{HUB_TOKEN_VARIABLE}}}"),
            };
            vec![
                ("type".to_owned(), s("streamable-http")),
                ("url".to_owned(), s(&format!("{base}/mcp/{name}"))),
                (
                    "headers".to_owned(),
                    Json::Object(Object::from_members(vec![(
                        "Authorization".to_owned(),
                        s(&authorization),
                    )])),
                ),
            ]
        }
        Reach::Relay { program, socket } => vec![
            ("type".to_owned(), s("stdio")),
            ("command".to_owned(), s(&program.to_string_lossy())),
            (
                "args".to_owned(),
                Json::Array(relay_args(socket, name).iter().map(|a| s(a)).collect()),
            ),
        ],
    }
}

/// The file's text.
pub fn mcp_json(servers: &[JobServer], reach: Reach) -> String {
    let servers = servers
        .iter()
        .map(|server| {
            let mut members = connection(&reach, server.name());
            match server {
                JobServer::Overlay(srv) => {
                    members.push(("description".to_owned(), s(&srv.description)));
                    if let Some(x) = srv.exposure {
                        members.push(("exposure".to_owned(), exposure(x)));
                    }
                    if !srv.tool_exposure.is_empty() {
                        let map = srv
                            .tool_exposure
                            .iter()
                            .map(|(k, v)| (k.clone(), exposure(*v)))
                            .collect();
                        members.push((
                            "toolExposure".to_owned(),
                            Json::Object(Object::from_members(map)),
                        ));
                    }
                    if let Some(t) = srv.timeout {
                        members.push(("timeout".to_owned(), Json::Number(u64::from(t).into())));
                    }
                }
                JobServer::Forge(f) => {
                    members.push(("description".to_owned(), s(&f.description)));
                }
            }
            (
                server.name().to_owned(),
                Json::Object(Object::from_members(members)),
            )
        })
        .collect();
    let root = Object::from_members(vec![(
        "mcpServers".to_owned(),
        Json::Object(Object::from_members(servers)),
    )]);
    json::to_pretty(&Json::Object(root))
}

/// Whether a token is safe to put in pi's header values.
pub fn token_is_plain(token: &str) -> bool {
    !token.is_empty() && token.bytes().all(|b| b.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job_file;
    use protocol::job_mcp::{self, Forge, JobMcpFile};

    #[test]
    fn names_only_hub_endpoints_with_the_servers_own_settings() {
        let docs = config::json::parse(r#"{"url": "https://h.example.com/mcp", "headers": {"Authorization": "Bearer ${DOCS_TOKEN}"}, "description": "Docs", "exposure": "deferred", "toolExposure": {"search": "direct"}, "timeout": 30}"#).unwrap();
        let f = JobMcpFile::new(
            &[("docs".to_owned(), docs)],
            Some(&Forge::Github { host: None }),
            true,
        );
        let job =
            job_file::read(f.text.as_bytes(), Some(&job_mcp::digest(f.text.as_bytes()))).unwrap();
        let http = |token| Reach::Http {
            base: "http://127.0.0.1:9",
            token,
        };
        let text = mcp_json(&job.servers, http(HubToken::Literal("abc123")));
        let parsed = config::json::parse(&text).unwrap();
        let servers = parsed
            .as_object()
            .unwrap()
            .get("mcpServers")
            .unwrap()
            .as_object()
            .unwrap();
        assert_eq!(servers.keys().collect::<Vec<_>>(), ["docs", "forge"]);
        let docs = servers.get("docs").unwrap().as_object().unwrap();
        assert_eq!(
            docs.get("url").unwrap().as_str(),
            Some("http://127.0.0.1:9/mcp/docs")
        );
        assert_eq!(docs.get("exposure").unwrap().as_str(), Some("deferred"));
        assert!(text.contains("\"search\": \"direct\""));
        assert!(text.contains("\"timeout\": 30"));
        assert!(
            !text.contains("DOCS_TOKEN") && !text.contains("h.example.com"),
            "{text}"
        );
        assert!(token_is_plain("abc123") && !token_is_plain("a$b") && !token_is_plain(""));
        assert!(text.contains("\"Bearer abc123\""), "{text}");
        let hidden = mcp_json(&job.servers, http(HubToken::FromEnvironment));
        assert!(
            hidden.contains("\"Bearer ${PI_DISPATCH_HUB_TOKEN}\"") && !hidden.contains("abc123"),
            "{hidden}"
        );

        // Through the relay: a stdio server to pi, with neither the token nor its variable.
        let relayed = mcp_json(
            &job.servers,
            Reach::Relay {
                program: Path::new("/opt/i/bin/pi-dispatch"),
                socket: Path::new("/home/job/agent/pi-dispatch/hub.sock"),
            },
        );
        let parsed = config::json::parse(&relayed).unwrap();
        let docs = parsed
            .as_object()
            .unwrap()
            .get("mcpServers")
            .unwrap()
            .as_object()
            .unwrap()
            .get("docs")
            .unwrap()
            .as_object()
            .unwrap();
        assert_eq!(docs.get("type").unwrap().as_str(), Some("stdio"));
        assert_eq!(
            docs.get("command").unwrap().as_str(),
            Some("/opt/i/bin/pi-dispatch")
        );
        let Some(Json::Array(args)) = docs.get("args") else {
            panic!("{relayed}")
        };
        let args: Vec<_> = args.iter().filter_map(Json::as_str).collect();
        assert_eq!(
            args,
            [
                "job-relay",
                "--socket",
                "/home/job/agent/pi-dispatch/hub.sock",
                "docs"
            ]
        );
        assert_eq!(docs.get("exposure").unwrap().as_str(), Some("deferred"));
        assert!(
            docs.get("url").is_none() && docs.get("headers").is_none() && docs.get("env").is_none()
        );
        assert!(
            !relayed.contains("PI_DISPATCH_HUB_TOKEN") && !relayed.contains("DOCS_TOKEN"),
            "{relayed}"
        );
    }
}
