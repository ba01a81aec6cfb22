//! The runner's step that runs the agent on the job's path, once its servers are served: pi (or the
//! job's other command) started in the workspace when the serve step says it may, with none of the
//! servers' credentials in its environment, confined when the runner confines, and its events read
//! into the runner's output; ended with its whole group when it exits, a server or the gateway
//! stops the job, or the runner is told to stop.

use protocol::pi_events::PiEvents;
use protocol::reason::Reason;
use tokio::process::{Child, Command};

use crate::finish::AgentEnd;
use crate::gateway::PiGateway;
use crate::job_file::Stop;
use crate::pi_agent::AgentFolder;
use crate::pi_config;
use crate::runner::{Agent, JobOptions, Runner};
use crate::serve::{PiStart, PiStarts, StopWhen};

/// What ended the wait for the agent: its exit status (if it could be had), or a stop (`None`:
/// SIGTERM).
type Outcome = Result<Option<std::process::ExitStatus>, Option<Stop>>;

/// Runs the agent once pi may start, with the runner's environment less every variable an MCP
/// server references (`secrets`), and waits for it, for what stops it (a server that did not
/// connect, a 401 from an HTTP server, a call the gateway refused), or SIGTERM.
pub(crate) async fn run(
    runner: &Runner,
    folder: &AgentFolder,
    secrets: &[String],
    start: PiStart<'_>,
) -> AgentEnd {
    let stop_when = match pi_may_start(runner, start.when).await {
        Ok(stop_when) => stop_when,
        Err(end) => return end,
    };
    let hub_token = start.hub_token.as_deref();
    let mut child = match start_agent(runner, folder, secrets, hub_token) {
        Ok(Some(child)) => child,
        Ok(None) => return AgentEnd::Exited(true, None),
        Err(stop) => return AgentEnd::Stopped(stop, None),
    };
    // pi's events: read as they come (the pipe must not fill), and passed on to the runner's
    // own output, where the worker keeps them as the job's transcript.
    let reader = child
        .stdout
        .take()
        .map(|stdout| tokio::spawn(read_events(stdout)));
    let outcome = wait_for_end(runner, &mut child, stop_when).await;
    let events = match reader {
        Some(reader) => tokio::time::timeout(std::time::Duration::from_secs(2), reader)
            .await
            .ok()
            .and_then(Result::ok),
        None => None,
    };
    how_it_ended(runner, folder, outcome, events)
}

/// Waits, when the serve step says so, until every server is served (or SIGTERM): what stops pi
/// once it runs, or how the job ended before pi started.
async fn pi_may_start<'a>(runner: &Runner, when: PiStarts<'a>) -> Result<StopWhen<'a>, AgentEnd> {
    let served = match when {
        PiStarts::Now(stop_when) => return Ok(stop_when),
        PiStarts::Served(served) => served,
    };
    let served = tokio::select! {
        result = served => Some(result),
        _ = runner.told_to_stop() => None,
    };
    match served {
        None => Err(AgentEnd::Terminated),
        Some(Err(stop)) => Err(AgentEnd::Stopped(stop, None)),
        Some(Ok(stop_when)) => Ok(stop_when),
    }
}

/// The agent started (`None`: an empty command, nothing to start). pi gets its prompt on its
/// standard input, its own `pi` first on `PATH`, and the hub's token in its environment when
/// `hub_token` is given.
fn start_agent(
    runner: &Runner,
    folder: &AgentFolder,
    secrets: &[String],
    hub_token: Option<&str>,
) -> Result<Option<Child>, Stop> {
    let Some(mut cmd) = agent_process(runner, folder, secrets, hub_token)? else {
        return Ok(None);
    };
    let child = spawn::retry_busy(|| cmd.spawn()).map_err(|e| {
        Stop::new(
            Reason::AgentNeverStarted,
            None,
            format!("the agent did not start ({})", e.kind()),
        )
    })?;
    Ok(Some(child))
}

/// Waits for the agent to exit, for `stop_when`, for a call the gateway refused, or SIGTERM; then
/// ends the agent's whole group, with everything it started.
async fn wait_for_end(runner: &Runner, child: &mut Child, stop_when: StopWhen<'_>) -> Outcome {
    let gateway = runner.gateway.as_ref();
    let refused = async {
        match gateway {
            Some(g) => g.gateway.refused().await,
            None => std::future::pending().await,
        }
    };
    let group = child.id().and_then(|p| i32::try_from(p).ok());
    let outcome = tokio::select! {
        status = child.wait() => Ok(status.ok()),
        stop = refused => Err(Some(stop)),
        stop = stop_when => Err(Some(stop)),
        _ = runner.told_to_stop() => Err(None),
    };
    if let Some(pgid) = group {
        // The agent's whole group, with everything it started.
        crate::connect::kill_group(pgid);
    }
    let _ = child.kill().await;
    outcome
}

/// How the agent's part ended, from what ended the wait, the gateway's refusal and the report of
/// the runner's extension inside pi.
fn how_it_ended(
    runner: &Runner,
    folder: &AgentFolder,
    outcome: Outcome,
    events: Option<PiEvents>,
) -> AgentEnd {
    // A call the gateway refused stops the job, even when pi ended first on the error it got.
    if let Some(stop) = runner.gateway.as_ref().and_then(|g| g.gateway.refusal())
        && !matches!(outcome, Err(None))
    {
        return AgentEnd::Stopped(stop, events);
    }
    match outcome {
        Err(None) => AgentEnd::Terminated,
        Err(Some(stop)) => AgentEnd::Stopped(stop, events),
        Ok(status) => {
            if let Some(stop) = reported_stop(folder) {
                return AgentEnd::Stopped(stop, events);
            }
            AgentEnd::Exited(status.is_some_and(|s| s.success()), events)
        }
    }
}

/// The value pi gets for `name`: the stand-in for the provider's key, else the runner's own.
fn for_pi<'a>(gateway: Option<&'a PiGateway>, name: &str, value: &'a str) -> &'a str {
    match gateway.and_then(|g| g.stand_in.as_ref()) {
        Some((variable, stand_in)) if variable == name => stand_in,
        _ => value,
    }
}

/// The agent's process, ready to start (`None`: an empty command, nothing to start): the command,
/// or pi on Node, confined through `job-confine` where pi keeps the one capability that keeps its
/// tools out of its memory and environment; its environment less every variable a server
/// references; for pi, its prompt on its standard input, its own `pi` first on `PATH`, and the
/// hub's token when it is given.
fn agent_process(
    runner: &Runner,
    folder: &AgentFolder,
    secrets: &[String],
    hub_token: Option<&str>,
) -> Result<Option<Command>, Stop> {
    let (job, gateway) = (&runner.job, runner.gateway.as_ref());
    let env = job.env.iter().filter(|(k, _)| {
        !secrets.contains(k) && !crate::gateway::SERVERS_ONLY.contains(&k.as_str())
    });
    let Some((program, args, is_pi)) = program_and_args(job) else {
        return Ok(None);
    };
    let mut cmd = agent_command(job, folder, &program, &args, is_pi);
    cmd.env_clear();
    match &job.agent {
        Agent::Command(_) => {
            cmd.envs(env.map(|(k, v)| (k, v)));
        }
        Agent::Pi(pi) => {
            let prompt = std::fs::File::open(&pi.prompt).map_err(|e| {
                Stop::new(
                    Reason::JobPromptUnreadable,
                    None,
                    format!("the job's prompt cannot be read ({})", e.kind()),
                )
            })?;
            let path = job
                .env
                .iter()
                .find(|(k, _)| k == "PATH")
                .map_or("/usr/bin:/bin", |(_, v)| v.as_str());
            cmd.envs(
                env.filter(|(k, _)| k != "PATH")
                    .map(|(k, v)| (k, for_pi(gateway, k, v))),
            )
            .env("PATH", format!("{}:{path}", folder.bin().display()))
            .stdin(prompt)
            .stdout(std::process::Stdio::piped());
            if let Some(token) = hub_token {
                cmd.env(pi_config::HUB_TOKEN_VARIABLE, token);
            }
            if pi.compile_cache.is_some() && folder.compile_cache().is_dir() {
                cmd.env("NODE_COMPILE_CACHE", folder.compile_cache());
            }
        }
    }
    // Confined, pi's tools run apart from pi: its shell asks the runner to start each command in
    // namespaces of its own (`crate::tools`), on a socket in the runner's part of the folder.
    if let (Some(confine), true) = (&job.confine, is_pi) {
        serve_tools(confine, folder, &mut cmd)?;
    }
    cmd.env("PI_CODING_AGENT_DIR", &job.agent_dir)
        .current_dir(&job.workspace)
        .process_group(0)
        .kill_on_drop(true);
    Ok(Some(cmd))
}

/// The agent's program and arguments, and whether it is pi (`None`: an empty command).
fn program_and_args(
    job: &JobOptions,
) -> Option<(std::ffi::OsString, Vec<std::ffi::OsString>, bool)> {
    match &job.agent {
        Agent::Command(argv) => {
            let (program, args) = argv.split_first()?;
            Some((program.into(), args.iter().map(Into::into).collect(), false))
        }
        Agent::Pi(pi) => Some((
            pi.node.clone().into_os_string(),
            crate::pi_agent::args(pi, &job.input.exclude_tools)
                .into_iter()
                .map(Into::into)
                .collect(),
            true,
        )),
    }
}

/// The agent's command: the program itself, or, confined, `job-confine` starting it (pi keeps the
/// one capability that keeps its tools out of its memory and environment, and its folder pinned).
fn agent_command(
    job: &JobOptions,
    folder: &AgentFolder,
    program: &std::ffi::OsString,
    args: &[std::ffi::OsString],
    is_pi: bool,
) -> Command {
    match &job.confine {
        None => {
            let mut cmd = Command::new(program);
            cmd.args(args);
            cmd
        }
        Some(runner) => {
            let confinement = crate::confine::Confinement {
                keep_marker: is_pi,
                private_tmp: false,
                pinned: if is_pi { folder.pinned() } else { Vec::new() },
                read_only: if is_pi {
                    folder.read_only()
                } else {
                    Vec::new()
                },
            };
            let mut cmd = Command::new(runner);
            cmd.args(confinement.command_line(program, args));
            cmd
        }
    }
}

/// Serves pi's tools on a socket in the runner's part of the folder: confined, pi's shell asks the
/// runner to start each command in namespaces of its own (`crate::tools`).
fn serve_tools(
    runner: &std::path::Path,
    folder: &AgentFolder,
    cmd: &mut Command,
) -> Result<(), Stop> {
    let socket = folder.own().join("tools.sock");
    let _ = std::fs::remove_file(&socket);
    let listener = std::os::unix::net::UnixListener::bind(&socket).map_err(|e| {
        Stop::new(
            Reason::RunnerSetupFailed,
            None,
            format!("the socket of pi's tools could not be made ({})", e.kind()),
        )
    })?;
    crate::tools::serve(
        listener,
        runner.to_owned(),
        crate::confine::Confinement {
            pinned: folder.pinned(),
            read_only: folder.read_only(),
            ..Default::default()
        },
    );
    cmd.env(crate::tools::SOCKET_VARIABLE, &socket);
    Ok(())
}

/// What the runner's extension inside pi reported when it ended pi: a server pi refused or had not
/// listed in time, or an extension that took a name only the job's MCP may have.
fn reported_stop(folder: &AgentFolder) -> Option<Stop> {
    let report = crate::pi_agent::read_report(folder)?;
    let server = (!report.name.is_empty()).then_some(report.name.as_str());
    Some(match report.reason.as_str() {
        "mcp-unavailable" => Stop::new(
            Reason::McpUnavailable,
            server,
            "pi refused it: its MCP client did not take the server's answer",
        ),
        "mcp-unreachable" => Stop::new(
            Reason::McpUnreachable,
            server,
            "pi had not listed its tools when the wait ran out",
        ),
        _ => Stop::new(
            Reason::McpShadowed,
            None,
            format!(
                "an extension registers {}, which only the job's MCP may",
                report.name
            ),
        ),
    })
}

/// Reads pi's event stream to its end: each line is taken into account and written to the runner's
/// standard output, where the worker keeps it as the job's transcript. A line longer than the exit
/// line's limit (an answer of over a mebibyte) is neither held nor passed on: it is taken into
/// account from its first and last bytes, and the transcript gets a marker where it was.
async fn read_events(stdout: tokio::process::ChildStdout) -> PiEvents {
    use protocol::exit_line::{Line, Lines};
    let mut events = PiEvents::default();
    let mut lines = Lines::new(stdout);
    let mut whole = Vec::new();
    while let Some(line) = lines.next().await {
        whole.clear();
        match line {
            Line::Text(text) => {
                if let Ok(text) = std::str::from_utf8(text) {
                    events.observe(text);
                }
                whole.extend_from_slice(text);
            }
            Line::Overlong { head, tail, bytes } => {
                let kind = events.observe_overlong(head, tail);
                let marker = serde_json::json!({"type": CUT_MARKER, "event": kind, "bytes": bytes});
                whole.extend_from_slice(marker.to_string().as_bytes());
            }
        }
        whole.push(b'\n');
        crate::output::write_output(&whole).await;
    }
    events
}

/// The type of the transcript's line that stands where one of pi's lines was too long to keep.
pub const CUT_MARKER: &str = "pi_dispatch_line_cut";
