//! One job, start to end: the job file checked and planned, every server connected under the wait,
//! the hub serving them to the agent, pi's config written, the agent started without any MCP
//! credential in its environment, and everything ended when the job ends. The result is the exit
//! line's content.

use std::path::PathBuf;

use protocol::job_dir::{self, RunnerInput};
use protocol::reason::Reason;
use tokio::process::Command;

use crate::connect_all::{self, Connected};
use crate::gateway::PiGateway;
use crate::job_file::{JobServer, Stop};
use crate::pi_agent::{AgentFolder, write_private};
use crate::{pi_config, plan, relay, wait};
use protocol::exit_line::{ExitLine, ServerState};
use protocol::pi_events::PiEvents;

/// Where the job's parts are (configurable so that tests run without a sandbox).
pub struct JobOptions {
    pub job_id: String,
    /// `/job`: `mcp.json` (read-only) and the rest of the job's files.
    pub job_dir: PathBuf,
    /// What the worker told the runner about the job (`/job/runner.json`).
    pub input: RunnerInput,
    /// `/workspace`: where stdio servers and the agent run.
    pub workspace: PathBuf,
    /// pi's private agent folder, where the runner writes pi's `mcp.json`.
    pub agent_dir: PathBuf,
    /// The agent the job runs.
    pub agent: Agent,
    /// The runner's own environment.
    pub env: Vec<(String, String)>,
    /// A program that provides `job-guard` (pi-dispatch itself), to end the job's processes if
    /// the runner is killed outright; `None` runs without one.
    pub guard: Option<PathBuf>,
    /// A program that provides `job-confine` and `job-shell` (pi-dispatch itself): pi and each
    /// stdio server then run in namespaces of their own (`sandbox::confine`). `None` starts them
    /// as the runner's children, as tests outside a sandbox do.
    pub confine: Option<PathBuf>,
    /// A program that provides `job-relay` (pi-dispatch itself): pi then reaches the hub through
    /// the relay it starts for each server, over a unix socket in its agent folder, and starts
    /// while the servers connect. `None`: pi reaches the hub over loopback HTTP, started once every
    /// server is connected.
    pub relay: Option<PathBuf>,
    /// The job's key, which signs the runner's lines to the worker: with it, the runner says the
    /// servers' states as soon as they have connected (`None`: it says them only at the end).
    pub key: Option<String>,
}

/// The hub's socket, in pi's own part of its agent folder.
pub const HUB_SOCKET: &str = "hub.sock";

/// What the runner starts once the servers are served.
#[derive(Debug, Clone)]
pub enum Agent {
    /// Real pi: the runner writes its private agent folder and reads its usage.
    Pi(crate::pi_agent::PiOptions),
    /// Any other command (tests drive the hub with an SDK client this way); empty for none.
    Command(Vec<String>),
}

fn line(job_id: &str, code: u8, stop: Option<&Stop>, servers: Vec<ServerState>) -> ExitLine {
    ExitLine {
        event: "exit".to_owned(),
        job_id: job_id.to_owned(),
        code,
        reason: stop.map(|s| s.reason.as_str().to_owned()),
        server: stop.and_then(|s| s.server.clone()),
        cause: stop.map(|s| s.cause.clone()),
        servers,
        tool_calls: Vec::new(),
        usage: None,
        final_message: None,
    }
}

/// The exit line of a runner that cannot begin the job: its input from the worker unusable.
pub fn setup_failed(job_id: &str, cause: String) -> ExitLine {
    let stop = Stop::new(Reason::RunnerSetupFailed, None, cause);
    line(
        job_id,
        stop.reason.code().unwrap_or(2),
        Some(&stop),
        Vec::new(),
    )
}

fn stopped(job: &JobOptions, stop: &Stop, servers: Vec<ServerState>) -> ExitLine {
    line(
        &job.job_id,
        stop.reason.code().unwrap_or(2),
        Some(stop),
        servers,
    )
}

/// Adds to what the hub withholds from each server the tools `exclude` takes away, so that they
/// are neither listed to pi nor callable.
fn withhold_excluded(
    upstreams: &mut [(crate::connect::Upstream, relay::Withheld)],
    exclude: &[String],
) {
    for (upstream, withheld) in upstreams {
        for tool in &upstream.tools {
            if config::tools::excludes(exclude, &upstream.name, &tool.name)
                && !withheld.contains(&tool.name)
            {
                withheld.0.push(tool.name.to_string());
            }
        }
    }
}

/// A hub token safe in pi's header values: 128 random bits as hex (letters and digits only).
fn new_token() -> Result<String, Stop> {
    protocol::ids::random_hex::<16>().map_err(|e| {
        Stop::new(
            Reason::RunnerSetupFailed,
            None,
            format!("the hub's token cannot be made ({e})"),
        )
    })
}

/// The exit line of a runner told to stop (SIGTERM): code 1, the worker decides what follows.
fn terminated(job: &JobOptions, servers: Vec<ServerState>) -> ExitLine {
    ExitLine {
        reason: Some(TERMINATED.to_owned()),
        cause: Some("the runner was told to stop (SIGTERM)".to_owned()),
        ..line(&job.job_id, 1, None, servers)
    }
}

/// The reason of a runner stopped by SIGTERM.
pub const TERMINATED: &str = "terminated";

/// The worker threads of the runner's runtime: one. Everything the runner does is relaying
/// (pi's requests to each server, the model gateway, the egress forwarder), and a message that
/// hops between two workers waits for the other to wake: on one thread a call through the hub
/// adds about half as much (docs/benchmarks.md, "One worker thread").
pub const RUNTIME_WORKERS: usize = 1;

/// The forwarder's tasks, ended with the job.
struct Forwarding(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Forwarding {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// With egress on (the job's folder holds its socket to the proxy): the proxy variables' loopback
/// port, and each of the job's endpoints on the worker's own machine at its own address and port,
/// carried to the proxy. Nothing else of the job starts until they listen; a port that cannot be
/// had fails the job (it would reach nothing, its model included), which is tried again.
async fn start_egress(job: &JobOptions) -> Result<Option<Forwarding>, Stop> {
    let socket = job.job_dir.join(job_dir::EGRESS_SOCKET);
    if !egress::forward::has_socket(&socket) {
        return Ok(None);
    }
    let cannot = |what: String, e: std::io::Error| {
        Stop::new(
            Reason::ModelUnreachable,
            None,
            format!(
                "the egress forwarder cannot listen on {what} inside the sandbox ({}), so the job would reach nothing",
                e.kind()
            ),
        )
    };
    let listener = egress::forward::bind()
        .await
        .map_err(|e| cannot(format!("127.0.0.1:{}", egress::forward::PORT), e))?;
    let mut tasks = vec![tokio::spawn(egress::forward::serve(
        listener,
        socket.clone(),
    ))];
    let declared = egress::forward::loopback_endpoints(&job.input.loopback);
    for endpoint in declared {
        let listeners = egress::forward::bind_endpoint(&endpoint)
            .await
            .map_err(|e| cannot(endpoint.authority.clone(), e))?;
        for l in listeners {
            tasks.push(tokio::spawn(egress::forward::serve_endpoint(
                l,
                socket.clone(),
                endpoint.authority.clone(),
            )));
        }
    }
    Ok(Some(Forwarding(tasks)))
}

/// What the runner holds from its first moment to its last: the way out, the guard, the watch
/// for SIGTERM.
struct Held {
    _forwarding: Option<Forwarding>,
    _guard: Option<crate::guard::Guard>,
    term: tokio::signal::unix::Signal,
}

/// The runner's first steps, before anything of the job starts: with egress on, the way out;
/// the runner's pid on every process it starts (the meter's variable), so the guard can find them
/// if the runner is killed outright; the guard; and, from the first moment, the watch for SIGTERM,
/// which then ends everything in order and still says so on the exit line.
async fn hold(job: &mut JobOptions) -> Result<Held, Stop> {
    let forwarding = start_egress(job).await?;
    let me = std::process::id();
    job.env.retain(|(k, _)| k != crate::guard::MARK);
    job.env
        .push((crate::guard::MARK.to_owned(), me.to_string()));
    let setup = |why: String| Stop::new(Reason::RunnerSetupFailed, None, why);
    let guard = match job.guard.as_deref().map(|p| crate::guard::start(p, me)) {
        None => None,
        Some(Ok(g)) => Some(g),
        Some(Err(e)) => {
            return Err(setup(format!(
                "the runner's guard did not start ({})",
                e.kind()
            )));
        }
    };
    let term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(|e| {
            setup(format!(
                "the runner cannot watch for SIGTERM ({})",
                e.kind()
            ))
        })?;
    Ok(Held {
        _forwarding: forwarding,
        _guard: guard,
        term,
    })
}

/// The job's servers as `/job/mcp.json` and the runner's input say (`None`: the job names none),
/// checked before anything connects.
fn read_plan(job: &JobOptions) -> Result<Option<plan::Plan>, Stop> {
    let lookup = |name: &str| {
        job.env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .filter(|v| !v.is_empty())
    };
    let digest = job.input.mcp_digest.as_deref();
    match std::fs::read(job.job_dir.join(job_dir::MCP)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && digest.is_none() => Ok(None),
        Err(_) => Err(Stop::new(
            Reason::McpConfigMismatch,
            None,
            "the job carries a digest but /job/mcp.json cannot be read",
        )),
        Ok(bytes) => plan::plan(&bytes, digest, &lookup).map(Some),
    }
}

/// Runs the job and says how it ended.
pub async fn run(mut job: JobOptions) -> ExitLine {
    let mut held = match hold(&mut job).await {
        Ok(h) => h,
        Err(stop) => return stopped(&job, &stop, Vec::new()),
    };
    let term = &mut held.term;
    let gateway = match start_gateway(&mut job).await {
        Ok(g) => g,
        Err(stop) => return stopped(&job, &stop, Vec::new()),
    };
    let plan = match read_plan(&job) {
        Ok(Some(plan)) => plan,
        // No server: the overlay's codemodeModels comes in the runner's input.
        Ok(None) => {
            let codemode_models = job.input.codemode_models;
            return run_agent(&job, None, &[], codemode_models, gateway, term).await;
        }
        Err(stop) => return stopped(&job, &stop, Vec::new()),
    };
    let job_plan = JobPlan::of(&plan);
    if let (Agent::Pi(_), Some(relay)) = (&job.agent, job.relay.clone()) {
        return run_alongside(&job, plan, job_plan, &relay, gateway, term).await;
    }
    let connecting = connect_servers(&job, plan, job_plan.wait);
    let connected = tokio::select! {
        result = connecting => match result {
            Ok(c) => c,
            Err((stop, states)) => return stopped(&job, &stop, states),
        },
        _ = term.recv() => return terminated(&job, Vec::new()),
    };
    let servers = Some((connected, job_plan.servers, job_plan.began));
    let (secrets, codemode_models) = (&job_plan.secrets, job_plan.codemode_models);
    run_agent(&job, servers, secrets, codemode_models, gateway, term).await
}

/// A file of pi's configuration that could not be written: the runner's own fault.
fn unwritten(e: &std::io::Error) -> Stop {
    Stop::new(
        Reason::RunnerSetupFailed,
        None,
        format!("pi's configuration could not be written ({})", e.kind()),
    )
}

/// What the runner takes from the job's plan before the servers connect.
struct JobPlan {
    servers: Vec<JobServer>,
    /// Every variable an overlay server references: kept from pi.
    secrets: Vec<String>,
    codemode_models: bool,
    /// How long the servers may take to connect and pi to list their tools, in all.
    wait: std::time::Duration,
    /// When that wait began: as the runner started connecting.
    began: std::time::SystemTime,
}

impl JobPlan {
    fn of(plan: &plan::Plan) -> JobPlan {
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
            wait: wait::budget(plan.servers.iter().map(|s| s.server.timeout())),
            began: std::time::SystemTime::now(),
        }
    }
}

/// What pi must have listed before its prompt: every tool the hub lists of each server.
fn listing(upstreams: &[(crate::connect::Upstream, relay::Withheld)]) -> Vec<(String, usize)> {
    upstreams
        .iter()
        .map(|(u, withheld)| {
            let listed = u
                .tools
                .iter()
                .filter(|t| !withheld.contains(&t.name))
                .count();
            (u.name.clone(), listed)
        })
        .collect()
}

/// Writes pi's agent folder (its settings, the runner's extension, pi's `mcp.json` with no server
/// yet).
fn prepare_pi(job: &JobOptions, folder: &AgentFolder, codemode_models: bool) -> Result<(), Stop> {
    let Agent::Pi(pi) = &job.agent else {
        return Ok(());
    };
    crate::pi_agent::prepare(folder, pi, codemode_models, job.confine.as_deref())
        .and_then(|()| write_private(&job.agent_dir, "mcp.json", b"{\"mcpServers\": {}}\n"))
        .map_err(|e| {
            Stop::new(
                Reason::RunnerSetupFailed,
                None,
                format!("pi's agent folder could not be written ({})", e.kind()),
            )
        })
}

/// pi with the relay: the hub's socket is bound and pi's `mcp.json` written before anything
/// connects, and pi starts while the servers do. A connection pi's relay opens waits, unaccepted,
/// until every server is connected and `listed.json` written; pi's prompt waits for that file. A
/// server that does not connect ends pi and the job, for the server's reason.
async fn run_alongside(
    job: &JobOptions,
    plan: plan::Plan,
    job_plan: JobPlan,
    relay_program: &std::path::Path,
    gateway: Option<PiGateway>,
    term: &mut tokio::signal::unix::Signal,
) -> ExitLine {
    let folder = AgentFolder {
        dir: job.agent_dir.clone(),
    };
    if let Err(stop) = prepare_pi(job, &folder, job_plan.codemode_models) {
        return stopped(job, &stop, Vec::new());
    }
    let own = folder.own();
    let socket = own.join(HUB_SOCKET);
    let listener = match relay_socket(job, &job_plan, relay_program, &socket) {
        Ok(l) => l,
        Err(stop) => return stopped(job, &stop, Vec::new()),
    };
    let token = match new_token() {
        Ok(t) => t,
        Err(stop) => return stopped(job, &stop, Vec::new()),
    };
    let serving = Serving::default();
    // Every server connected and served, or why not.
    let connecting = connect_and_serve(job, plan, &job_plan, &own, listener, &token, &serving);
    let timeouts: Vec<Option<u16>> = job_plan.servers.iter().map(JobServer::timeout).collect();
    let result = if wait::pi_may_start_alongside(&timeouts) {
        // Resolves only to stop the job: a server that did not connect, a hub that did not
        // start, or an HTTP server's 401 later on.
        let stop_when = async {
            match connecting.await {
                Ok(monitors) => unauthorized(&monitors).await,
                Err(stop) => stop,
            }
        };
        agent(
            job,
            &folder,
            &job_plan.secrets,
            stop_when,
            gateway.as_ref(),
            term,
            Some(&token),
        )
        .await
    } else {
        // A server of pi's would give up waiting before the runner does: pi starts once every
        // server is served, as over HTTP.
        let connected = tokio::select! {
            result = connecting => Some(result),
            _ = term.recv() => None,
        };
        match connected {
            None => AgentEnd::Terminated,
            Some(Err(stop)) => AgentEnd::Stopped(stop, None),
            Some(Ok(monitors)) => {
                agent(
                    job,
                    &folder,
                    &job_plan.secrets,
                    unauthorized(&monitors),
                    gateway.as_ref(),
                    term,
                    Some(&token),
                )
                .await
            }
        }
    };
    let (hub, states) = serving.into_parts();
    let _ = std::fs::remove_file(&socket);
    finish(job, result, hub, states, gateway).await
}

/// Connects the plan's servers, all at once under the one `wait`, in the job's workspace with the
/// runner's environment (each confined when the runner confines).
async fn connect_servers(
    job: &JobOptions,
    plan: plan::Plan,
    wait: std::time::Duration,
) -> Result<Connected, (Stop, Vec<ServerState>)> {
    let connected = connect_all::connect_all_confined(
        plan,
        &job.env,
        &job.workspace,
        wait,
        job.confine.as_deref(),
    )
    .await;
    let states = match &connected {
        Ok(c) => c.states.clone(),
        Err((_, states)) => states.clone(),
    };
    say_servers(job, states).await;
    connected
}

/// One line of the runner's output at a time: pi's events and the servers' line never mix.
static OUTPUT: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Writes `line` (with its line end) to the runner's output whole.
async fn write_output(line: &[u8]) {
    use tokio::io::AsyncWriteExt as _;
    let _one = OUTPUT.lock().await;
    let mut out = tokio::io::stdout();
    let _ = out.write_all(line).await;
    let _ = out.flush().await;
}

/// Tells the worker the servers' states as they connected, in a line signed with the job's key
/// (when the runner has one), for the job's live view.
async fn say_servers(job: &JobOptions, servers: Vec<ServerState>) {
    let Some(key) = &job.key else {
        return;
    };
    let line = ExitLine {
        event: protocol::exit_line::SERVERS_EVENT.to_owned(),
        ..line(&job.job_id, 0, None, servers)
    };
    if let Ok(text) = protocol::exit_line::sign(&line, key.as_bytes()) {
        write_output(format!("{text}\n").as_bytes()).await;
    }
}

/// What the relayed hub holds as its servers connect, for the exit line: the hub once it serves,
/// and the servers' states.
#[derive(Default)]
struct Serving {
    hub: std::sync::Mutex<Option<relay::Hub>>,
    states: std::sync::Mutex<Vec<ServerState>>,
}

impl Serving {
    fn keep_states(&self, states: Vec<ServerState>) {
        *self
            .states
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = states;
    }

    fn keep_hub(&self, hub: relay::Hub) {
        *self
            .hub
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(hub);
    }

    fn into_parts(self) -> (Option<relay::Hub>, Vec<ServerState>) {
        let hub = self
            .hub
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let states = self
            .states
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        (hub, states)
    }
}

/// Connects every server of the plan, writes `listed.json` into pi's own folder `own`, and serves
/// them on the relay's `listener` with `token`; the HTTP servers' monitors, or why not.
async fn connect_and_serve(
    job: &JobOptions,
    plan: plan::Plan,
    job_plan: &JobPlan,
    own: &std::path::Path,
    listener: tokio::net::UnixListener,
    token: &str,
    serving: &Serving,
) -> Result<Vec<(String, crate::http::Monitor)>, Stop> {
    let connected = connect_servers(job, plan, job_plan.wait).await;
    let Connected {
        mut upstreams,
        monitors,
        states,
    } = match connected {
        Ok(c) => c,
        Err((stop, failed)) => {
            serving.keep_states(failed);
            return Err(stop);
        }
    };
    serving.keep_states(states);
    withhold_excluded(&mut upstreams, &job.input.exclude_tools);
    let expected =
        crate::pi_agent::expected_json(&listing(&upstreams), job_plan.began, job_plan.wait);
    write_private(own, "listed.json", expected.as_bytes()).map_err(|e| unwritten(&e))?;
    let listeners = relay::Listeners {
        loopback: false,
        socket: Some(listener),
    };
    let hub = relay::serve_on(upstreams, token.to_owned(), listeners)
        .await
        .map_err(|e| {
            Stop::new(
                Reason::RunnerSetupFailed,
                None,
                format!("the hub could not start ({e})"),
            )
        })?;
    serving.keep_hub(hub);
    Ok(monitors)
}

/// The hub's socket, where pi's relay for each server reaches it, and pi's `mcp.json` naming the
/// relay for every server of the job.
fn relay_socket(
    job: &JobOptions,
    job_plan: &JobPlan,
    relay_program: &std::path::Path,
    socket: &std::path::Path,
) -> Result<tokio::net::UnixListener, Stop> {
    let _ = std::fs::remove_file(socket);
    let listener = tokio::net::UnixListener::bind(socket).map_err(|e| {
        Stop::new(
            Reason::RunnerSetupFailed,
            None,
            format!("the hub's socket could not be made ({})", e.kind()),
        )
    })?;
    let text = pi_config::mcp_json(
        &job_plan.servers,
        pi_config::Reach::Relay {
            program: relay_program,
            socket,
        },
    );
    write_private(&job.agent_dir, "mcp.json", text.as_bytes()).map_err(|e| unwritten(&e))?;
    Ok(listener)
}

/// Resolves when one of the HTTP servers answers 401 (a job never signs in): the job stops.
async fn unauthorized(monitors: &[(String, crate::http::Monitor)]) -> Stop {
    let waits: Vec<_> = monitors
        .iter()
        .map(|(name, m)| {
            let name = name.clone();
            let m = m.clone();
            Box::pin(async move {
                m.unauthorized().await;
                name
            })
        })
        .collect();
    let name = if waits.is_empty() {
        std::future::pending::<String>().await
    } else {
        futures::future::select_all(waits).await.0
    };
    Stop::new(
        Reason::McpUnavailable,
        Some(&name),
        "HTTP 401 during the job: a job never signs in",
    )
}

/// How the agent's part ended: exited (well or not), stopped by the runner, or told to stop. pi's
/// events are there when the agent was pi.
enum AgentEnd {
    Exited(bool, Option<PiEvents>),
    Stopped(Stop, Option<PiEvents>),
    Terminated,
}

async fn run_agent(
    job: &JobOptions,
    connected: Option<(Connected, Vec<JobServer>, std::time::SystemTime)>,
    secrets: &[String],
    codemode_models: bool,
    gateway: Option<PiGateway>,
    term: &mut tokio::signal::unix::Signal,
) -> ExitLine {
    let folder = AgentFolder {
        dir: job.agent_dir.clone(),
    };
    if let Err(stop) = prepare_pi(job, &folder, codemode_models) {
        return stopped(job, &stop, Vec::new());
    }
    let is_pi = matches!(job.agent, Agent::Pi(_));
    let (hub, monitors, states, token) = match connected {
        None => {
            // No server: pi's prompt need wait for none.
            let none = crate::pi_agent::expected_json(
                &[],
                std::time::UNIX_EPOCH,
                std::time::Duration::ZERO,
            );
            if is_pi && let Err(e) = write_private(&folder.own(), "listed.json", none.as_bytes()) {
                let stop = unwritten(&e);
                return stopped(job, &stop, Vec::new());
            }
            (None, Vec::new(), Vec::new(), None)
        }
        Some((c, servers, began)) => {
            match serve_over_http(job, &folder, c, &servers, began, is_pi).await {
                Ok((hub, monitors, states, token)) => (Some(hub), monitors, states, Some(token)),
                Err(line) => return *line,
            }
        }
    };
    // Confined, pi's mcp.json names the token; only pi's environment holds it.
    let token_for_pi = token.as_deref().filter(|_| job.confine.is_some());
    let result = agent(
        job,
        &folder,
        secrets,
        unauthorized(&monitors),
        gateway.as_ref(),
        term,
        token_for_pi,
    )
    .await;
    finish(job, result, hub, states, gateway).await
}

/// The connected servers served over loopback HTTP (a runner with no relay to offer): the hub
/// started with a fresh token, pi's `mcp.json` and `listed.json` written; the exit line when that
/// cannot be done.
async fn serve_over_http(
    job: &JobOptions,
    folder: &AgentFolder,
    c: Connected,
    servers: &[JobServer],
    began: std::time::SystemTime,
    is_pi: bool,
) -> Result<Served, Box<ExitLine>> {
    let token = match new_token() {
        Ok(t) => t,
        Err(stop) => return Err(Box::new(stopped(job, &stop, c.states.clone()))),
    };
    let Connected {
        mut upstreams,
        monitors,
        states,
    } = c;
    withhold_excluded(&mut upstreams, &job.input.exclude_tools);
    let listing = listing(&upstreams);
    let hub = match relay::serve(upstreams, token.clone()).await {
        Ok(h) => h,
        Err(e) => {
            let stop = Stop::new(
                Reason::RunnerSetupFailed,
                None,
                format!("the hub could not start ({e})"),
            );
            return Err(Box::new(stopped(job, &stop, states)));
        }
    };
    let base = hub
        .addr()
        .map(|addr| format!("http://{addr}"))
        .unwrap_or_default();
    let hub_token = match job.confine {
        Some(_) => pi_config::HubToken::FromEnvironment,
        None => pi_config::HubToken::Literal(&token),
    };
    let text = pi_config::mcp_json(
        servers,
        pi_config::Reach::Http {
            base: &base,
            token: hub_token,
        },
    );
    let wait = wait::budget(servers.iter().map(JobServer::timeout));
    let expected = crate::pi_agent::expected_json(&listing, began, wait);
    let written =
        write_private(&job.agent_dir, "mcp.json", text.as_bytes()).and_then(|()| match is_pi {
            true => write_private(&folder.own(), "listed.json", expected.as_bytes()),
            false => Ok(()),
        });
    if let Err(e) = written {
        hub.shutdown().await;
        let stop = unwritten(&e);
        return Err(Box::new(stopped(job, &stop, states)));
    }
    Ok((hub, monitors, states, token))
}

/// What serves the agent: the hub, the HTTP servers' monitors, the servers' states and the hub's
/// token.
type Served = (
    relay::Hub,
    Vec<(String, crate::http::Monitor)>,
    Vec<ServerState>,
    String,
);

/// The exit line once the agent's part has ended: the hub's and the gateway's counts taken and
/// both stopped, and the verdict on how the agent ended.
async fn finish(
    job: &JobOptions,
    result: AgentEnd,
    hub: Option<relay::Hub>,
    states: Vec<ServerState>,
    gateway: Option<PiGateway>,
) -> ExitLine {
    let mut tool_calls = Vec::new();
    if let Some(hub) = hub {
        tool_calls = hub.tool_calls();
        hub.shutdown().await;
    }
    let seen = match gateway {
        Some(g) => Some(g.gateway.finish().await),
        None => None,
    };
    let last_answer = seen.as_ref().and_then(|s| s.last_answer.as_ref());
    let (done, events) = match result {
        // pi: the task is done only when the gateway saw its model's last answer end normally,
        // and pi's account agrees.
        AgentEnd::Exited(ok, Some(events)) => {
            match protocol::model_answer::verdict(&events, ok, last_answer) {
                Ok(_) => (line(&job.job_id, 0, None, states), Some(events)),
                Err(failure) => {
                    let turned_away = seen.as_ref().map_or(0, |s| s.turned_away);
                    let (reason, cause) = protocol::model_answer::own_gateway_turned_away(
                        failure,
                        turned_away,
                        crate::gateway::MAX_CONNECTIONS,
                    );
                    let stop = Stop::new(reason, None, cause);
                    (stopped(job, &stop, states), Some(events))
                }
            }
        }
        // Another agent: its exit status says.
        AgentEnd::Exited(true, None) => (line(&job.job_id, 0, None, states), None),
        AgentEnd::Exited(false, None) => {
            let stop = Stop::new(Reason::AgentFailed, None, "the agent exited with a failure");
            (stopped(job, &stop, states), None)
        }
        AgentEnd::Stopped(stop, events) => (stopped(job, &stop, states), events),
        AgentEnd::Terminated => (terminated(job, states), None),
    };
    // The final message is the model's, as the gateway read it (whatever pi printed); an agent
    // other than pi has none. Only a completed job's is ever posted.
    let final_message = last_answer
        .map(|a| a.text.clone())
        .filter(|t| !t.is_empty());
    ExitLine {
        tool_calls,
        final_message,
        usage: merged_usage(events.as_ref(), seen.as_ref().map(|s| &s.meter)),
        ..done
    }
}

/// With pi, the model gateway: started before the servers (a pi a stdio server starts is pointed
/// at it by the meter's variables, which the servers get from the runner's environment) and
/// before pi, whose `models.json` points at it.
async fn start_gateway(job: &mut JobOptions) -> Result<Option<PiGateway>, Stop> {
    let Agent::Pi(pi) = &job.agent else {
        return Ok(None);
    };
    let gateway = crate::gateway::start_for_pi(pi, &job.input, &job.env, &job.agent_dir).await?;
    for (name, value) in &gateway.meter {
        job.env.retain(|(k, _)| k != name);
        job.env.push((name.clone(), value.clone()));
    }
    Ok(Some(gateway))
}

/// What the exit line says was used: the turns, provider and model from pi's events, the tokens
/// and cost from the gateway, which saw every call (pi's own, codemode's, a nested pi's).
fn merged_usage(
    events: Option<&PiEvents>,
    meter: Option<&crate::gateway::rules::Meter>,
) -> Option<protocol::usage::Usage> {
    let Some(meter) = meter else {
        return events.map(|e| e.usage.clone());
    };
    let from_pi = events.map(|e| e.usage.clone()).unwrap_or_default();
    Some(protocol::usage::Usage {
        input_tokens: meter.input_tokens,
        output_tokens: meter.output_tokens,
        total_tokens: meter.total_tokens,
        cost_usd: meter.cost_usd,
        ..from_pi
    })
}

/// The value pi gets for `name`: the stand-in for the provider's key, else the runner's own.
fn for_pi<'a>(gateway: Option<&'a PiGateway>, name: &str, value: &'a str) -> &'a str {
    match gateway.and_then(|g| g.stand_in.as_ref()) {
        Some((variable, stand_in)) if variable == name => stand_in,
        _ => value,
    }
}

/// Starts the agent in the workspace, with the runner's environment less every variable an MCP
/// server references, and waits for it, for `stop_when` (a server that did not connect, a 401 from
/// an HTTP server), or SIGTERM. pi gets its prompt on its standard input, its own `pi` first on
/// `PATH`, the hub's token in its environment when `hub_token` is given, and its event stream read
/// for usage.
async fn agent(
    job: &JobOptions,
    folder: &AgentFolder,
    secrets: &[String],
    stop_when: impl Future<Output = Stop>,
    gateway: Option<&PiGateway>,
    term: &mut tokio::signal::unix::Signal,
    hub_token: Option<&str>,
) -> AgentEnd {
    let mut cmd = match agent_process(job, folder, secrets, gateway, hub_token) {
        Ok(Some(cmd)) => cmd,
        Ok(None) => return AgentEnd::Exited(true, None),
        Err(stop) => return AgentEnd::Stopped(stop, None),
    };
    let mut child = match spawn::retry_busy(|| cmd.spawn()) {
        Ok(c) => c,
        Err(e) => {
            return AgentEnd::Stopped(
                Stop::new(
                    Reason::AgentNeverStarted,
                    None,
                    format!("the agent did not start ({})", e.kind()),
                ),
                None,
            );
        }
    };
    // pi's events: read as they come (the pipe must not fill), and passed on to the runner's
    // own output, where the worker keeps them as the job's transcript.
    let reader = child
        .stdout
        .take()
        .map(|stdout| tokio::spawn(read_events(stdout)));
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
        _ = term.recv() => Err(None),
    };
    if let Some(pgid) = group {
        // The agent's whole group, with everything it started.
        crate::connect::kill_group(pgid);
    }
    let _ = child.kill().await;
    let usage = match reader {
        Some(reader) => tokio::time::timeout(std::time::Duration::from_secs(2), reader)
            .await
            .ok()
            .and_then(Result::ok),
        None => None,
    };
    // A call the gateway refused stops the job, even when pi ended first on the error it got.
    if let Some(stop) = gateway.and_then(|g| g.gateway.refusal())
        && !matches!(outcome, Err(None))
    {
        return AgentEnd::Stopped(stop, usage);
    }
    match outcome {
        Err(None) => AgentEnd::Terminated,
        Err(Some(stop)) => AgentEnd::Stopped(stop, usage),
        Ok(status) => {
            if let Some(stop) = reported_stop(folder) {
                return AgentEnd::Stopped(stop, usage);
            }
            AgentEnd::Exited(status.is_some_and(|s| s.success()), usage)
        }
    }
}

/// The agent's process, ready to start (`None`: an empty command, nothing to start): the command,
/// or pi on Node, confined through `job-confine` where pi keeps the one capability that keeps its
/// tools out of its memory and environment; its environment less every variable a server
/// references; for pi, its prompt on its standard input, its own `pi` first on `PATH`, and the
/// hub's token when it is given.
fn agent_process(
    job: &JobOptions,
    folder: &AgentFolder,
    secrets: &[String],
    gateway: Option<&PiGateway>,
    hub_token: Option<&str>,
) -> Result<Option<Command>, Stop> {
    let env = job.env.iter().filter(|(k, _)| {
        !secrets.contains(k) && !crate::gateway::SERVERS_ONLY.contains(&k.as_str())
    });
    let (program, args, is_pi): (std::ffi::OsString, Vec<std::ffi::OsString>, bool) =
        match &job.agent {
            Agent::Command(argv) => {
                let Some((program, args)) = argv.split_first() else {
                    return Ok(None);
                };
                (program.into(), args.iter().map(Into::into).collect(), false)
            }
            Agent::Pi(pi) => (
                pi.node.clone().into_os_string(),
                crate::pi_agent::args(pi, &job.input.exclude_tools)
                    .into_iter()
                    .map(Into::into)
                    .collect(),
                true,
            ),
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
    if let (Some(runner), true) = (&job.confine, is_pi) {
        serve_tools(runner, folder, &mut cmd)?;
    }
    cmd.env("PI_CODING_AGENT_DIR", &job.agent_dir)
        .current_dir(&job.workspace)
        .process_group(0)
        .kill_on_drop(true);
    Ok(Some(cmd))
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
        write_output(&whole).await;
    }
    events
}

/// The type of the transcript's line that stands where one of pi's lines was too long to keep.
pub const CUT_MARKER: &str = "pi_dispatch_line_cut";
