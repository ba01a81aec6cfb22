//! The runner's first check: `/job/mcp.json` is the file the worker wrote for this job (its digest
//! is the one the job's environment carries) and it reads whole, before anything connects.

use config::json::{self, Json};
use config::mcp::{self, McpServer};
use protocol::job_mcp::{self, FORGE_GITHUB_COMMAND, FORGE_GITLAB_COMMAND};
use protocol::reason::Reason;

/// One server the job connects, as the worker named it.
#[derive(Debug, Clone, PartialEq)]
pub enum JobServer {
    /// An overlay entry, checked again by the overlay's rules.
    Overlay(McpServer),
    /// The worker's own forge entry.
    Forge(ForgeServer),
}

impl JobServer {
    pub fn name(&self) -> &str {
        match self {
            JobServer::Overlay(s) => s.name.as_str(),
            JobServer::Forge(_) => mcp::FORGE,
        }
    }

    /// The server's own timeout in seconds, when it sets one.
    pub fn timeout(&self) -> Option<u16> {
        match self {
            JobServer::Overlay(s) => s.timeout,
            JobServer::Forge(_) => None,
        }
    }
}

/// The forge entry: the image's wrapper, with the job's token by reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForgeServer {
    pub command: String,
    /// `(name, value)`: a `${NAME}` reference, or a literal the worker wrote (the GitLab API address).
    pub env: Vec<(String, String)>,
    pub description: String,
}

/// The job's servers, in the file's order.
#[derive(Debug, Clone, PartialEq)]
pub struct JobFile {
    pub servers: Vec<JobServer>,
    pub codemode_models: bool,
}

/// Why the runner stops before anything connects.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {cause}", reason = .reason.as_str())]
pub struct Stop {
    pub reason: Reason,
    /// The server concerned, when there is one.
    pub server: Option<String>,
    /// For the worker's log: names and rules, never a value.
    pub cause: String,
}

impl Stop {
    pub fn new(reason: Reason, server: Option<&str>, cause: impl Into<String>) -> Stop {
        Stop {
            reason,
            server: server.map(str::to_owned),
            cause: cause.into(),
        }
    }
}

/// Checks the file's digest against the one the job carries, then reads it.
pub fn read(bytes: &[u8], expected_digest: Option<&str>) -> Result<JobFile, Stop> {
    let digest = job_mcp::digest(bytes);
    if expected_digest != Some(digest.as_str()) {
        return Err(Stop::new(
            Reason::McpConfigMismatch,
            None,
            match expected_digest {
                None => "the job carries no digest of /job/mcp.json".to_owned(),
                Some(_) => "/job/mcp.json is not the file the worker wrote for this job".to_owned(),
            },
        ));
    }
    parse(bytes)
}

fn invalid(server: Option<&str>, cause: impl Into<String>) -> Stop {
    Stop::new(Reason::McpConfigInvalid, server, cause)
}

/// Reads the file as the worker writes it: `mcpServers` and `codemodeModels`, overlay entries valid
/// by the overlay's rules, and `forge` exactly as the worker writes it.
pub fn parse(bytes: &[u8]) -> Result<JobFile, Stop> {
    let text = std::str::from_utf8(bytes).map_err(|_| invalid(None, "not UTF-8"))?;
    let root = json::parse(text).map_err(|e| invalid(None, e.to_string()))?;
    let root = root
        .as_object()
        .ok_or_else(|| invalid(None, "not an object"))?;
    if root
        .keys()
        .any(|k| k != "mcpServers" && k != "codemodeModels")
    {
        return Err(invalid(None, "a top-level key the worker does not write"));
    }
    let codemode_models = match root.get("codemodeModels") {
        Some(Json::Bool(b)) => *b,
        _ => return Err(invalid(None, "codemodeModels is missing or not a boolean")),
    };
    let servers = root
        .get("mcpServers")
        .and_then(Json::as_object)
        .ok_or_else(|| invalid(None, "mcpServers is missing or not an object"))?;
    let mut out = Vec::new();
    for (name, entry) in servers.iter() {
        if name == mcp::FORGE {
            out.push(JobServer::Forge(forge(entry)?));
            continue;
        }
        match mcp::validate_entry(name, entry).verdict {
            Ok(server) if server.enabled => out.push(JobServer::Overlay(server)),
            Ok(_) => return Err(invalid(Some(name), "a turned-off server in the job's file")),
            Err(problems) => {
                let codes: Vec<&str> = problems.iter().map(|p| p.code.as_str()).collect();
                return Err(invalid(
                    mcp::is_name_shape(name).then_some(name),
                    format!(
                        "the entry breaks the overlay's rules ({})",
                        codes.join(", ")
                    ),
                ));
            }
        }
    }
    if out.is_empty() || out.len() > 8 {
        return Err(invalid(None, "the file names no server, or more than 8"));
    }
    Ok(JobFile {
        servers: out,
        codemode_models,
    })
}

fn forge(entry: &Json) -> Result<ForgeServer, Stop> {
    let bad = || {
        invalid(
            Some(mcp::FORGE),
            "the forge entry is not as the worker writes it",
        )
    };
    let o = entry.as_object().ok_or_else(bad)?;
    if o.keys().collect::<Vec<_>>() != ["type", "command", "env", "description"]
        || o.get("type").and_then(Json::as_str) != Some("stdio")
    {
        return Err(bad());
    }
    let command = o.get("command").and_then(Json::as_str).ok_or_else(bad)?;
    // GitHub's entry names `GITHUB_HOST` for a GitHub Enterprise Server only.
    let expected_env: &[&[&str]] = match command {
        FORGE_GITHUB_COMMAND => &[
            &["GITHUB_PERSONAL_ACCESS_TOKEN"],
            &["GITHUB_PERSONAL_ACCESS_TOKEN", "GITHUB_HOST"],
        ],
        FORGE_GITLAB_COMMAND => &[&["GITLAB_PERSONAL_ACCESS_TOKEN", "GITLAB_API_URL"]],
        _ => return Err(bad()),
    };
    let env = o.get("env").and_then(Json::as_object).ok_or_else(bad)?;
    let keys = env.keys().collect::<Vec<_>>();
    if !expected_env.iter().any(|e| keys == *e) {
        return Err(bad());
    }
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| v.as_str().map(|v| (k.to_owned(), v.to_owned())))
        .collect::<Option<_>>()
        .ok_or_else(bad)?;
    let description = o
        .get("description")
        .and_then(Json::as_str)
        .ok_or_else(bad)?
        .to_owned();
    Ok(ForgeServer {
        command: command.to_owned(),
        env,
        description,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::job_mcp::{Forge, JobMcpFile};

    fn written() -> JobMcpFile {
        let docs = json::parse(r#"{"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer ${DOCS_TOKEN}"}, "description": "Docs", "timeout": 30}"#).unwrap();
        JobMcpFile::new(
            &[("docs".to_owned(), docs)],
            Some(&Forge::Github { host: None }),
            false,
        )
    }

    #[test]
    fn reads_the_file_the_worker_wrote() {
        let file = written();
        let job = read(file.text.as_bytes(), Some(&file.digest)).unwrap();
        assert_eq!(job.servers.len(), 2);
        assert_eq!(job.servers[0].name(), "docs");
        assert_eq!(job.servers[0].timeout(), Some(30));
        assert_eq!(job.servers[1].name(), "forge");
        assert!(!job.codemode_models);
    }

    #[test]
    fn a_github_enterprise_entry_carries_its_host() {
        let file = JobMcpFile::new(
            &[],
            Some(&Forge::Github {
                host: Some("https://ghe.example.com".into()),
            }),
            false,
        );
        let job = read(file.text.as_bytes(), Some(&file.digest)).unwrap();
        let JobServer::Forge(forge) = &job.servers[0] else {
            panic!("{job:?}")
        };
        assert_eq!(
            forge.env,
            [
                (
                    "GITHUB_PERSONAL_ACCESS_TOKEN".to_owned(),
                    "${GH_TOKEN}".to_owned()
                ),
                (
                    "GITHUB_HOST".to_owned(),
                    "https://ghe.example.com".to_owned()
                )
            ]
        );
    }

    #[test]
    fn a_tampered_file_or_a_missing_digest_is_a_mismatch() {
        let file = written();
        let tampered = file.text.replace("mcp.example.com", "evil.example.com");
        let stop = read(tampered.as_bytes(), Some(&file.digest)).unwrap_err();
        assert_eq!(stop.reason, Reason::McpConfigMismatch);
        assert_eq!(
            read(file.text.as_bytes(), None).unwrap_err().reason,
            Reason::McpConfigMismatch
        );
    }

    #[test]
    fn a_file_the_worker_would_not_write_is_invalid() {
        for text in [
            "{",
            r#"{"mcpServers": {}, "codemodeModels": true}"#,
            r#"{"mcpServers": {"docs": {"url": "https://h/mcp", "headers": {"A": "cnry-lit"}, "description": "d"}}, "codemodeModels": true}"#,
            r#"{"mcpServers": {"forge": {"type": "stdio", "command": "/tmp/evil", "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "${GH_TOKEN}"}, "description": "d"}}, "codemodeModels": true}"#,
            r#"{"mcpServers": {"forge": {"type": "stdio", "command": "/usr/local/bin/forge-mcp-github", "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "${GH_TOKEN}", "EXTRA": "x"}, "description": "d"}}, "codemodeModels": true}"#,
            r#"{"mcpServers": {"docs": {"url": "https://h/mcp", "description": "d"}}}"#,
        ] {
            let digest = job_mcp::digest(text.as_bytes());
            let stop = read(text.as_bytes(), Some(&digest)).unwrap_err();
            assert_eq!(stop.reason, Reason::McpConfigInvalid, "{text}");
            assert!(!stop.cause.contains("cnry"), "{}", stop.cause);
        }
    }
}
