//! The runner's checks before anything connects, in the spec's order: the job file is the worker's
//! (digest, shape), every stdio command is in the image, every referenced variable is set. The result
//! is what to connect, with every reference filled in.

use std::path::PathBuf;

use protocol::reason::Reason;

use crate::job_file::{self, JobFile, JobServer, Stop};
use crate::resolve::{self, Resolved};
use crate::stdio;

/// One server, ready to connect.
#[derive(Debug)]
pub struct Planned {
    pub name: String,
    pub server: JobServer,
    pub connection: Connection,
}

#[derive(Debug)]
pub enum Connection {
    Http(Resolved),
    Stdio {
        /// The command as found in the image.
        program: PathBuf,
        resolved: Resolved,
    },
}

/// The whole plan: the servers and whether codemode scripts may call models.
#[derive(Debug)]
pub struct Plan {
    pub servers: Vec<Planned>,
    pub codemode_models: bool,
}

/// Checks `bytes` (the job's `mcp.json`) against `digest` and plans every connection, reading
/// variables and `PATH` from `env` (the runner's own environment).
pub fn plan(
    bytes: &[u8],
    digest: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Plan, Stop> {
    let JobFile {
        servers,
        codemode_models,
    } = job_file::read(bytes, digest)?;
    let path = env("PATH");
    // Every command first: a missing one is the image's fault, whatever else is wrong.
    let mut programs = Vec::new();
    for server in &servers {
        let command = match server {
            JobServer::Overlay(s) => match &s.transport {
                config::mcp::Transport::Stdio(st) => Some(st.command.as_str().to_owned()),
                config::mcp::Transport::Http(_) => None,
            },
            JobServer::Forge(f) => Some(f.command.clone()),
        };
        programs.push(match command {
            None => None,
            Some(c) => Some(stdio::find_command(&c, path.as_deref()).ok_or_else(|| {
                Stop::new(
                    Reason::McpCommandMissing,
                    Some(server.name()),
                    format!("the command {c} is not in the image"),
                )
            })?),
        });
    }
    let mut planned = Vec::new();
    for (server, program) in servers.into_iter().zip(programs) {
        let resolved = resolve::resolve(&server, env)?;
        let connection = match program {
            Some(program) => Connection::Stdio { program, resolved },
            None => Connection::Http(resolved),
        };
        planned.push(Planned {
            name: server.name().to_owned(),
            server,
            connection,
        });
    }
    Ok(Plan {
        servers: planned,
        codemode_models,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::job_mcp::{self, JobMcpFile};

    fn file(entries: &[(&str, &str)]) -> JobMcpFile {
        let entries: Vec<(String, config::json::Json)> = entries
            .iter()
            .map(|(n, e)| (n.to_string(), config::json::parse(e).unwrap()))
            .collect();
        JobMcpFile::new(&entries, None, true)
    }

    #[test]
    fn plans_every_server_with_its_command_found_and_references_filled() {
        let f = file(&[
            (
                "docs",
                r#"{"url": "https://h.example.com/mcp", "headers": {"A": "${T}"}, "description": "d"}"#,
            ),
            (
                "shell",
                r#"{"command": "sh", "args": ["-c", "${T}"], "description": "d"}"#,
            ),
        ]);
        let env = |k: &str| match k {
            "PATH" => Some("/usr/bin:/bin".to_owned()),
            "T" => Some("v".to_owned()),
            _ => None,
        };
        let plan = plan(f.text.as_bytes(), Some(&f.digest), &env).unwrap();
        assert_eq!(plan.servers.len(), 2);
        assert!(matches!(plan.servers[0].connection, Connection::Http(_)));
        let Connection::Stdio { program, .. } = &plan.servers[1].connection else {
            panic!()
        };
        assert!(program.ends_with("sh"));
    }

    #[test]
    fn stops_with_the_specs_reasons() {
        let f = file(&[(
            "tool",
            r#"{"command": "no-such-command-here", "env": {"K": "${MISSING}"}, "description": "d"}"#,
        )]);
        let env = |k: &str| (k == "PATH").then(|| "/usr/bin:/bin".to_owned());
        let stop = plan(f.text.as_bytes(), Some(&f.digest), &env).unwrap_err();
        assert_eq!(
            stop.reason,
            Reason::McpCommandMissing,
            "the command is checked first"
        );
        let f = file(&[(
            "tool",
            r#"{"command": "sh", "env": {"K": "${MISSING}"}, "description": "d"}"#,
        )]);
        let stop = plan(f.text.as_bytes(), Some(&f.digest), &env).unwrap_err();
        assert_eq!(stop.reason, Reason::McpSecretMissing);
        let stop = plan(f.text.as_bytes(), Some(&job_mcp::digest(b"other")), &env).unwrap_err();
        assert_eq!(stop.reason, Reason::McpConfigMismatch);
    }
}
