//! The runner's step that connects every server of the plan at once, under the spec's wait: 15 s
//! or the longest server timeout, up to 120 s. A server that fails for good (a command that exits,
//! a 401, a redirect, a 403 or 501, a body too large, its own timeout) stops the job with
//! `mcp-unavailable`; one that has not answered when the wait runs out (still starting, or a 5xx or
//! 429 retried until then) stops it with `mcp-unreachable`, which the worker retries.

use std::path::Path;
use std::time::{Duration, Instant};

use protocol::job_mcp::FORGE_GITHUB_COMMAND;
use protocol::reason::Reason;
use tokio::task::JoinSet;

use crate::connect::{self, ConnectError, Upstream};
use crate::http::{self, HttpPolicy, Monitor};
use crate::job_file::{JobServer, Stop};
use crate::plan::{Connection, Plan};
use crate::relay::{GITHUB_WITHHELD, GITLAB_WITHHELD, UpstreamEvents, Withheld};
use crate::resolve::Resolved;
use crate::stdio;
use protocol::exit_line::ServerState;

/// Every server connected: what the hub serves, and each server's state for the exit line.
pub struct Connected {
    pub upstreams: Vec<(Upstream, Withheld)>,
    /// The HTTP servers' monitors: a 401 after the start ends the job.
    pub monitors: Vec<(String, Monitor)>,
    pub states: Vec<ServerState>,
}

/// The first pause before an HTTP server is asked again after a failure that may pass.
const FIRST_RETRY: Duration = Duration::from_millis(250);
const LAST_RETRY: Duration = Duration::from_secs(4);

enum ServerStart {
    Ready(Upstream, Option<Monitor>),
    Failed(Stop),
}

/// The runner's step that connects the job's servers: all at once under the one `wait`, in the
/// job's workspace with the runner's environment (each confined when the runner confines). The
/// worker is told the servers' states as soon as they are known.
pub(crate) async fn connect_servers(
    job: &crate::runner::JobOptions,
    plan: Plan,
    wait: Duration,
) -> Result<Connected, (Stop, Vec<ServerState>)> {
    let connected =
        connect_all_confined(plan, &job.env, &job.workspace, wait, job.confine.as_deref()).await;
    let states = match &connected {
        Ok(c) => c.states.clone(),
        Err((_, states)) => states.clone(),
    };
    crate::output::say_servers(job, states).await;
    connected
}

/// Connects every planned server, all at once, and waits as the spec says.
pub async fn connect_all(
    plan: Plan,
    runner_env: &[(String, String)],
    workspace: &Path,
    wait: Duration,
) -> Result<Connected, (Stop, Vec<ServerState>)> {
    connect_all_confined(plan, runner_env, workspace, wait, None).await
}

/// [`connect_all`], each stdio server started through `confine` (`pi-dispatch job-confine`) when
/// given: in namespaces of its own and with a `/tmp` of its own, where it sees neither pi nor the
/// other servers.
pub async fn connect_all_confined(
    plan: Plan,
    runner_env: &[(String, String)],
    workspace: &Path,
    wait: Duration,
    confine: Option<&Path>,
) -> Result<Connected, (Stop, Vec<ServerState>)> {
    let names: Vec<String> = plan.servers.iter().map(|p| p.name.clone()).collect();
    let starting = Starting {
        runner_env,
        workspace,
        confine,
        started: Instant::now(),
        last_failure: std::sync::Arc::new(std::sync::Mutex::new(vec![None; names.len()])),
    };
    let mut tasks: Attempts = JoinSet::new();
    let mut withheld: Vec<Withheld> = Vec::new();
    for (index, planned) in plan.servers.into_iter().enumerate() {
        withheld.push(withheld_of(&planned.server));
        starting.start(&mut tasks, index, planned);
    }
    let (ready, states) = wait_for_all(tasks, &names, wait, &starting.last_failure).await?;
    let mut upstreams = Vec::new();
    let mut monitors = Vec::new();
    for ((slot, withheld), name) in ready.into_iter().zip(withheld).zip(&names) {
        if let Some((upstream, monitor, _)) = slot {
            if let Some(m) = monitor {
                monitors.push((name.clone(), m));
            }
            upstreams.push((upstream, withheld));
        }
    }
    Ok(Connected {
        upstreams,
        monitors,
        states,
    })
}

/// The servers' connections under way: each says, by its index, how it started and after how long.
type Attempts = JoinSet<(usize, ServerStart, Duration)>;

/// The last failure each HTTP server gave before it was asked again, by index, for the cause of a
/// wait that ran out (a 429 is not a slow start).
type LastFailure = std::sync::Arc<std::sync::Mutex<Vec<Option<String>>>>;

/// A server's connection as it is ready or failed, by index.
type Ready = Vec<Option<(Upstream, Option<Monitor>, Duration)>>;

/// What every server's connection starts from.
struct Starting<'a> {
    runner_env: &'a [(String, String)],
    workspace: &'a Path,
    confine: Option<&'a Path>,
    started: Instant,
    last_failure: LastFailure,
}

impl Starting<'_> {
    /// Starts connecting `planned`, the server at `index`, under its own timeout.
    fn start(&self, tasks: &mut Attempts, index: usize, planned: crate::plan::Planned) {
        let own_timeout = planned
            .server
            .timeout()
            .map(|t| Duration::from_secs(u64::from(t)));
        let name = planned.name;
        let started = self.started;
        match planned.connection {
            Connection::Stdio {
                program,
                resolved: Resolved::Stdio { args, env: own, .. },
            } => {
                let env = stdio::environment(self.runner_env, &own);
                let args: Vec<String> = args.iter().map(|a| a.expose().to_owned()).collect();
                let (program, args) = match self.confine {
                    None => (program, args),
                    Some(runner) => confined(runner, &program, &args),
                };
                let cwd = self.workspace.to_owned();
                tasks.spawn(async move {
                    let attempt = connect::connect_stdio(
                        &name,
                        &program,
                        &args,
                        &env,
                        &cwd,
                        UpstreamEvents::new(),
                    );
                    let outcome = with_own_timeout(&name, own_timeout, async {
                        attempt
                            .await
                            .map(|u| ServerStart::Ready(u, None))
                            .unwrap_or_else(|e| ServerStart::Failed(unavailable(&name, &e)))
                    })
                    .await;
                    (index, outcome, started.elapsed())
                });
            }
            Connection::Http(Resolved::Http { url, headers }) => {
                let env_lookup = |name: &str| {
                    self.runner_env
                        .iter()
                        .find(|(k, _)| k == name)
                        .map(|(_, v)| v.clone())
                };
                let policy = HttpPolicy::for_url(&url, &env_lookup);
                let last = self.last_failure.clone();
                tasks.spawn(async move {
                    let outcome = with_own_timeout(&name, own_timeout, async {
                        connect_http(&name, &url, &headers, &policy, |why| {
                            if let Ok(mut l) = last.lock()
                                && let Some(slot) = l.get_mut(index)
                            {
                                *slot = Some(why);
                            }
                        })
                        .await
                    })
                    .await;
                    (index, outcome, started.elapsed())
                });
            }
            _ => {
                let stop = Stop::new(
                    Reason::McpConfigInvalid,
                    Some(&name),
                    "the plan does not match the server's transport",
                );
                tasks.spawn(async move { (index, ServerStart::Failed(stop), Duration::ZERO) });
            }
        }
    }
}

/// Waits, at most `wait`, until every server is ready; the first that fails, or the wait running
/// out, ends every attempt and every server connected, and says why, with each server's state.
async fn wait_for_all(
    mut tasks: Attempts,
    names: &[String],
    wait: Duration,
    last_failure: &LastFailure,
) -> Result<(Ready, Vec<ServerState>), (Stop, Vec<ServerState>)> {
    let mut ready: Ready = names.iter().map(|_| None).collect();
    let mut states: Vec<ServerState> = names
        .iter()
        .map(|n| ServerState {
            name: n.clone(),
            state: "waiting".to_owned(),
            ready_ms: None,
            listing: None,
        })
        .collect();
    let deadline = tokio::time::sleep(wait);
    tokio::pin!(deadline);
    let mut failure: Option<Stop> = None;
    while !tasks.is_empty() {
        tokio::select! {
            joined = tasks.join_next() => {
                let Some(Ok((index, outcome, after))) = joined else { continue };
                match outcome {
                    ServerStart::Ready(upstream, monitor) => {
                        states[index].state = "ready".to_owned();
                        states[index].ready_ms = Some(after.as_millis().try_into().unwrap_or(u64::MAX));
                        ready[index] = Some((upstream, monitor, after));
                    }
                    ServerStart::Failed(stop) => {
                        states[index].state = "failed".to_owned();
                        failure = Some(stop);
                        break;
                    }
                }
            }
            () = &mut deadline => {
                failure = Some(ran_out(&states, last_failure, wait));
                break;
            }
        }
    }
    match failure {
        Some(stop) => {
            give_up(tasks, ready).await;
            Err((stop, states))
        }
        None => Ok((ready, states)),
    }
}

/// Ends every attempt still running and every server already connected, and waits until they are
/// gone: each kills its server's process group as it goes, so nothing the runner gave up on is
/// still running when it reports.
async fn give_up(mut tasks: Attempts, ready: Ready) {
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    for (upstream, _, _) in ready.into_iter().flatten() {
        upstream.shutdown().await;
    }
}

/// The tools of a server the job withholds: the forge's own servers' merge and approval tools.
fn withheld_of(server: &JobServer) -> Withheld {
    match server {
        JobServer::Forge(f) if f.command == FORGE_GITHUB_COMMAND => Withheld::new(GITHUB_WITHHELD),
        JobServer::Forge(_) => Withheld::new(GITLAB_WITHHELD),
        JobServer::Overlay(_) => Withheld::none(),
    }
}

/// A stdio server's command started through `job-confine`: in namespaces of its own, with a
/// `/tmp` of its own.
fn confined(runner: &Path, program: &Path, args: &[String]) -> (std::path::PathBuf, Vec<String>) {
    let confinement = crate::confine::Confinement {
        private_tmp: true,
        ..Default::default()
    };
    let line = confinement.command_line(
        &program.as_os_str().to_owned(),
        &args.iter().map(Into::into).collect::<Vec<_>>(),
    );
    (
        runner.to_owned(),
        line.into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
    )
}

/// The wait ran out: the first server still waiting is unreachable, with the last failure it gave
/// before it was asked again (a 429 is not a slow start).
fn ran_out(
    states: &[ServerState],
    last_failure: &std::sync::Mutex<Vec<Option<String>>>,
    wait: Duration,
) -> Stop {
    let waiting = states.iter().position(|s| s.state == "waiting");
    let last = waiting.and_then(|i| {
        last_failure
            .lock()
            .ok()
            .and_then(|l| l.get(i).cloned().flatten())
    });
    let mut cause = format!(
        "it had not listed its tools when the wait of {} s ran out",
        wait.as_secs()
    );
    if let Some(last) = last {
        cause.push_str(&format!(" (last: {last})"));
    }
    Stop::new(
        Reason::McpUnreachable,
        waiting.map(|i| states[i].name.as_str()),
        cause,
    )
}

/// Runs `attempt` under the server's own timeout, when it sets one: running out is
/// `mcp-unavailable` (the server had its own say on how long it may take).
async fn with_own_timeout(
    name: &str,
    own: Option<Duration>,
    attempt: impl std::future::Future<Output = ServerStart>,
) -> ServerStart {
    match own {
        None => attempt.await,
        Some(limit) => match tokio::time::timeout(limit, attempt).await {
            Ok(outcome) => outcome,
            Err(_) => ServerStart::Failed(Stop::new(
                Reason::McpUnavailable,
                Some(name),
                format!(
                    "its own timeout of {} s ran out before it answered",
                    limit.as_secs()
                ),
            )),
        },
    }
}

fn unavailable(name: &str, error: &ConnectError) -> Stop {
    Stop::new(Reason::McpUnavailable, Some(name), error.to_string())
}

/// Connects an HTTP server, asking again after failures that may pass (408, 429, 5xx other than
/// 501, a refused connection) until it answers, fails for good, or the caller's wait ends.
async fn connect_http(
    name: &str,
    url: &crate::resolve::Secret,
    headers: &[(String, crate::resolve::Secret)],
    policy: &HttpPolicy,
    note_retry: impl Fn(String),
) -> ServerStart {
    let mut pause = FIRST_RETRY;
    loop {
        let upstream = match http::transport(url, headers, policy) {
            Ok(u) => u,
            Err(e) => {
                return ServerStart::Failed(Stop::new(
                    Reason::McpUnavailable,
                    Some(name),
                    format!("its connection cannot be set up ({e})"),
                ));
            }
        };
        let monitor = upstream.monitor.clone();
        match connect::connect_transport(name, upstream.transport, UpstreamEvents::new()).await {
            Ok(connected) => return ServerStart::Ready(connected, Some(monitor)),
            Err(error) => {
                let failure = match error.transport_error() {
                    Some(e) => monitor.classify(e),
                    None => match monitor.last_refusal() {
                        Some(r) => r.failure(),
                        None => {
                            return ServerStart::Failed(unavailable(name, &error));
                        }
                    },
                };
                if !failure.is_retryable() {
                    return ServerStart::Failed(failure.stop(name, monitor.origin()));
                }
                note_retry(failure.message().to_owned());
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(LAST_RETRY);
            }
        }
    }
}
