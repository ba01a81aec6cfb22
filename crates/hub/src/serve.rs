//! The runner's step that serves the job's servers to pi, on the job's path between connecting
//! them and running pi. One choice says how pi reaches the hub: through the relay pi starts for
//! each server (pi then starts while the servers connect), over loopback HTTP once every server is
//! connected (a runner with no relay to offer), or not at all (a job with no server). pi's
//! `mcp.json` naming the hub and `listed.json` are written here.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use futures::future::BoxFuture;
use protocol::exit_line::ServerState;
use protocol::reason::Reason;

use crate::connect_all::Connected;
use crate::finish::{Ended, Stopped};
use crate::job_file::{JobServer, Stop};
use crate::pi_agent::{AgentFolder, expected_json, write_private};
use crate::plan::JobPlan;
use crate::runner::{Agent, Runner};
use crate::{pi_config, relay, wait};

/// The hub's socket, in pi's own part of its agent folder.
pub const HUB_SOCKET: &str = "hub.sock";

/// The servers as they connect: what the connect step resolves to.
pub(crate) type Connecting<'a> = BoxFuture<'a, Result<Connected, (Stop, Vec<ServerState>)>>;

/// The HTTP servers' monitors: a 401 after the start ends the job.
type Monitors = Vec<(String, crate::http::Monitor)>;

/// What resolves only to stop the job while pi runs.
pub(crate) type StopWhen<'a> = BoxFuture<'a, Stop>;

/// When pi may start, as the serve step hands it on.
pub(crate) enum PiStarts<'a> {
    /// At once; what stops it while it runs.
    Now(StopWhen<'a>),
    /// Once every server is connected and served (then, what stops it while it runs), or never,
    /// for the stop that ended the servers' start.
    Served(BoxFuture<'a, Result<StopWhen<'a>, Stop>>),
}

/// What the serve step hands on to the agent's step: when pi starts, and the hub's token for pi's
/// environment (`None`: pi's environment holds none).
pub(crate) struct PiStart<'a> {
    pub(crate) when: PiStarts<'a>,
    pub(crate) hub_token: Option<String>,
}

/// How pi reaches the hub: the one choice of the serve step, with the servers as they connect.
enum Way<'a> {
    /// The job names no server.
    NoServer,
    /// pi with the relay (`job-relay`'s program): through the hub's socket, pi starting while the
    /// servers connect.
    Relay(&'a Path, Connecting<'a>),
    /// Over loopback HTTP, once every server is connected.
    Http(Connecting<'a>),
}

impl<'a> Way<'a> {
    /// With the relay when the agent is pi and the runner has one to offer.
    fn of(runner: &'a Runner, connecting: Option<Connecting<'a>>) -> Way<'a> {
        let Some(connecting) = connecting else {
            return Way::NoServer;
        };
        match (&runner.job.agent, runner.job.relay.as_deref()) {
            (Agent::Pi(_), Some(program)) => Way::Relay(program, connecting),
            _ => Way::Http(connecting),
        }
    }
}

/// Serves the job's servers to pi, as they connect (`connecting`; `None`: the job names none).
pub(crate) async fn serve<'a>(
    runner: &'a Runner,
    folder: &AgentFolder,
    plan: &'a JobPlan,
    connecting: Option<Connecting<'a>>,
) -> Result<(PiStart<'a>, Serving), Stopped> {
    match Way::of(runner, connecting) {
        Way::NoServer => without_servers(runner, folder, plan),
        Way::Relay(program, connecting) => over_relay(runner, program, folder, plan, connecting),
        Way::Http(connecting) => over_http(runner, folder, plan, connecting).await,
    }
}

/// No server: pi's prompt need wait for none.
fn without_servers<'a>(
    runner: &'a Runner,
    folder: &AgentFolder,
    plan: &JobPlan,
) -> Result<(PiStart<'a>, Serving), Stopped> {
    if matches!(runner.job.agent, Agent::Pi(_)) {
        let none = expected_json(&[], plan.began, plan.wait);
        write_private(&folder.own(), "listed.json", none.as_bytes()).map_err(|e| unwritten(&e))?;
    }
    let start = PiStart {
        when: PiStarts::Now(Box::pin(std::future::pending())),
        hub_token: None,
    };
    Ok((start, Serving::default()))
}

/// pi with the relay: the hub's socket is bound and pi's `mcp.json` written before anything
/// connects, and pi starts while the servers do. A connection pi's relay opens waits, unaccepted,
/// until every server is connected and `listed.json` written; pi's prompt waits for that file. A
/// server that does not connect ends pi and the job, for the server's reason.
fn over_relay<'a>(
    runner: &'a Runner,
    program: &Path,
    folder: &AgentFolder,
    plan: &'a JobPlan,
    connecting: Connecting<'a>,
) -> Result<(PiStart<'a>, Serving), Stopped> {
    let own = folder.own();
    let socket = own.join(HUB_SOCKET);
    let listener = relay_socket(runner, plan, program, &socket)?;
    let token = new_token()?;
    let serving = Serving {
        socket: Some(socket),
        ..Serving::default()
    };
    let kept = serving.kept.clone();
    let hub_token = token.clone();
    // Every server connected and served, or why not.
    let served = async move {
        let exclude = &runner.job.input.exclude_tools;
        let at = Relayed {
            own,
            listener,
            token: hub_token,
        };
        serve_when_connected(connecting, plan, exclude, at, kept).await
    };
    let timeouts: Vec<Option<u16>> = plan.servers.iter().map(JobServer::timeout).collect();
    let when = if wait::pi_may_start_alongside(&timeouts) {
        // Resolves only to stop the job: a server that did not connect, a hub that did not
        // start, or an HTTP server's 401 later on.
        PiStarts::Now(Box::pin(async move {
            match served.await {
                Ok(monitors) => unauthorized(monitors).await,
                Err(stop) => stop,
            }
        }))
    } else {
        // A server of pi's would give up waiting before the runner does: pi starts once every
        // server is served, as over HTTP.
        PiStarts::Served(Box::pin(async move {
            let monitors = served.await?;
            Ok(Box::pin(unauthorized(monitors)) as StopWhen<'a>)
        }))
    };
    let start = PiStart {
        when,
        hub_token: Some(token),
    };
    Ok((start, serving))
}

/// The hub's socket, where pi's relay for each server reaches it, and pi's `mcp.json` naming the
/// relay for every server of the job.
fn relay_socket(
    runner: &Runner,
    plan: &JobPlan,
    program: &Path,
    socket: &Path,
) -> Result<tokio::net::UnixListener, Stop> {
    let _ = std::fs::remove_file(socket);
    let listener = tokio::net::UnixListener::bind(socket).map_err(|e| {
        Stop::new(
            Reason::RunnerSetupFailed,
            None,
            format!("the hub's socket could not be made ({})", e.kind()),
        )
    })?;
    let text = pi_config::mcp_json(&plan.servers, pi_config::Reach::Relay { program, socket });
    write_private(&runner.job.agent_dir, "mcp.json", text.as_bytes()).map_err(|e| unwritten(&e))?;
    Ok(listener)
}

/// Where the relayed hub serves: pi's own part of its folder, the hub's socket bound there, and the
/// hub's token.
struct Relayed {
    own: PathBuf,
    listener: tokio::net::UnixListener,
    token: String,
}

/// Once every server is connected: `listed.json` written into pi's own folder, and the hub
/// serving on the relay's socket, kept with the servers' states in `kept`; the HTTP servers'
/// monitors, or why not.
async fn serve_when_connected(
    connecting: Connecting<'_>,
    plan: &JobPlan,
    exclude: &[String],
    at: Relayed,
    kept: Arc<Kept>,
) -> Result<Monitors, Stop> {
    let Connected {
        mut upstreams,
        monitors,
        states,
    } = match connecting.await {
        Ok(c) => c,
        Err((stop, failed)) => {
            kept.states(failed);
            return Err(stop);
        }
    };
    kept.states(states);
    withhold_excluded(&mut upstreams, exclude);
    let expected = expected_json(&listing(&upstreams), plan.began, plan.wait);
    write_private(&at.own, "listed.json", expected.as_bytes()).map_err(|e| unwritten(&e))?;
    let listeners = relay::Listeners {
        loopback: false,
        socket: Some(at.listener),
    };
    let hub = relay::serve_on(upstreams, at.token, listeners)
        .await
        .map_err(hub_not_started)?;
    kept.hub(hub);
    Ok(monitors)
}

/// The connected servers served over loopback HTTP (a runner with no relay to offer), pi starting
/// once every server is connected: the hub started with a fresh token, pi's `mcp.json` and
/// `listed.json` written.
async fn over_http<'a>(
    runner: &'a Runner,
    folder: &AgentFolder,
    plan: &JobPlan,
    connecting: Connecting<'a>,
) -> Result<(PiStart<'a>, Serving), Stopped> {
    let connected = tokio::select! {
        result = connecting => result.map_err(|(stop, states)| Stopped::by(stop, states))?,
        _ = runner.told_to_stop() => return Err(Stopped::terminated(Vec::new())),
    };
    let token = new_token().map_err(|stop| Stopped::by(stop, connected.states.clone()))?;
    let Connected {
        mut upstreams,
        monitors,
        states,
    } = connected;
    withhold_excluded(&mut upstreams, &runner.job.input.exclude_tools);
    let listing = listing(&upstreams);
    let hub = match relay::serve(upstreams, token.clone()).await {
        Ok(h) => h,
        Err(e) => return Err(Stopped::by(hub_not_started(e), states)),
    };
    let base = hub
        .addr()
        .map(|addr| format!("http://{addr}"))
        .unwrap_or_default();
    if let Err(e) = write_http_config(runner, folder, plan, &base, &token, &listing) {
        hub.shutdown().await;
        return Err(Stopped::by(unwritten(&e), states));
    }
    // Confined, pi's mcp.json names the token; only pi's environment holds it.
    let start = PiStart {
        when: PiStarts::Now(Box::pin(unauthorized(monitors))),
        hub_token: Some(token).filter(|_| runner.job.confine.is_some()),
    };
    Ok((start, Serving::served(hub, states)))
}

/// pi's `mcp.json` naming the hub at `base` over HTTP (its token written in it, or, confined,
/// named from pi's environment), and, for pi, `listed.json`.
fn write_http_config(
    runner: &Runner,
    folder: &AgentFolder,
    plan: &JobPlan,
    base: &str,
    token: &str,
    listing: &[(String, usize)],
) -> std::io::Result<()> {
    let token = match runner.job.confine {
        Some(_) => pi_config::HubToken::FromEnvironment,
        None => pi_config::HubToken::Literal(token),
    };
    let text = pi_config::mcp_json(&plan.servers, pi_config::Reach::Http { base, token });
    let expected = expected_json(listing, plan.began, plan.wait);
    write_private(&runner.job.agent_dir, "mcp.json", text.as_bytes())?;
    match runner.job.agent {
        Agent::Pi(_) => write_private(&folder.own(), "listed.json", expected.as_bytes()),
        Agent::Command(_) => Ok(()),
    }
}

/// What serves pi, for the exit line: the hub once it serves and the servers' states (kept as the
/// servers connect, with the relay), and the hub's socket, removed once pi has ended.
#[derive(Default)]
pub(crate) struct Serving {
    kept: Arc<Kept>,
    socket: Option<PathBuf>,
}

/// The hub and the servers' states, as the relayed hub keeps them while pi runs.
#[derive(Default)]
struct Kept {
    hub: Mutex<Option<relay::Hub>>,
    states: Mutex<Vec<ServerState>>,
}

impl Kept {
    fn states(&self, states: Vec<ServerState>) {
        *self.states.lock().unwrap_or_else(PoisonError::into_inner) = states;
    }

    fn hub(&self, hub: relay::Hub) {
        *self.hub.lock().unwrap_or_else(PoisonError::into_inner) = Some(hub);
    }
}

impl Serving {
    fn served(hub: relay::Hub, states: Vec<ServerState>) -> Serving {
        let serving = Serving::default();
        serving.kept.hub(hub);
        serving.kept.states(states);
        serving
    }

    /// How the job's part that pi ran ended, with what served it; the hub's socket removed.
    pub(crate) fn ended(self, agent: crate::finish::AgentEnd) -> Ended {
        let hub = self
            .kept
            .hub
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let states = std::mem::take(
            &mut *self
                .kept
                .states
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        if let Some(socket) = &self.socket {
            let _ = std::fs::remove_file(socket);
        }
        Ended { agent, hub, states }
    }
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

fn hub_not_started(e: relay::ServeError) -> Stop {
    Stop::new(
        Reason::RunnerSetupFailed,
        None,
        format!("the hub could not start ({e})"),
    )
}

/// A file of pi's configuration that could not be written: the runner's own fault.
fn unwritten(e: &std::io::Error) -> Stop {
    Stop::new(
        Reason::RunnerSetupFailed,
        None,
        format!("pi's configuration could not be written ({})", e.kind()),
    )
}

/// Resolves when one of the HTTP servers answers 401 (a job never signs in): the job stops.
async fn unauthorized(monitors: Monitors) -> Stop {
    let waits: Vec<_> = monitors
        .into_iter()
        .map(|(name, m)| {
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
