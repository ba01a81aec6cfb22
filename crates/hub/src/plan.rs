//! The runner's step that plans the job's servers, before anything connects: the checks in the
//! spec's order (the job file is the worker's (digest, shape), every stdio command is in the image,
//! every referenced variable is set). The result is what to connect, with every reference filled
//! in, and what the runner keeps of it ([`JobPlan`]).

use std::path::PathBuf;

use protocol::reason::Reason;

use protocol::job_dir;

use crate::job_file::{self, JobFile, JobServer, Stop};
use crate::resolve::{self, Resolved};
use crate::runner::JobOptions;
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

/// The job's servers as `/job/mcp.json` and the runner's input say, checked before anything
/// connects (no plan: the job names no server), and what the runner keeps of them.
pub fn read(job: &JobOptions) -> Result<(Option<Plan>, JobPlan), Stop> {
    let lookup = |name: &str| {
        job.env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .filter(|v| !v.is_empty())
    };
    let digest = job.input.mcp_digest.as_deref();
    match std::fs::read(job.job_dir.join(job_dir::MCP)) {
        // No server: the overlay's codemodeModels comes in the runner's input.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && digest.is_none() => {
            Ok((None, JobPlan::without_servers(job.input.codemode_models)))
        }
        Err(_) => Err(Stop::new(
            Reason::McpConfigMismatch,
            None,
            "the job carries a digest but /job/mcp.json cannot be read",
        )),
        Ok(bytes) => {
            let plan = plan(&bytes, digest, &lookup)?;
            let kept = JobPlan::of(&plan);
            Ok((Some(plan), kept))
        }
    }
}

/// What the runner keeps of the job's plan as its servers connect.
pub struct JobPlan {
    pub servers: Vec<JobServer>,
    /// Every variable an overlay server references: kept from pi.
    pub secrets: Vec<String>,
    pub codemode_models: bool,
    /// How long the servers may take to connect and pi to list their tools, in all.
    pub wait: std::time::Duration,
    /// When that wait began: as the runner started connecting.
    pub began: std::time::SystemTime,
}

impl JobPlan {
    fn of(plan: &Plan) -> JobPlan {
        JobPlan {
            servers: plan.servers.iter().map(|p| p.server.clone()).collect(),
            secrets: plan
                .servers
                .iter()
                .filter_map(|p| match &p.server {
                    JobServer::Overlay(s) => Some(s.references()),
                    JobServer::Forge(_) => None,
                })
                .flatten()
                .map(|n| n.to_string())
                .collect(),
            codemode_models: plan.codemode_models,
            wait: crate::wait::budget(plan.servers.iter().map(|s| s.server.timeout())),
            began: std::time::SystemTime::now(),
        }
    }

    /// A job with no server: pi's prompt waits for none (a wait of nothing, long over).
    fn without_servers(codemode_models: bool) -> JobPlan {
        JobPlan {
            servers: Vec::new(),
            secrets: Vec::new(),
            codemode_models,
            wait: std::time::Duration::ZERO,
            began: std::time::UNIX_EPOCH,
        }
    }
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
