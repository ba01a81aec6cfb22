//! One job, start to end, as one [`Runner`] going through its steps, each in a module of its own:
//! the runner's first step (`hold`: the way out, the guard, the watch for SIGTERM, the model
//! gateway), the job's servers planned (`plan`), pi's folder prepared (`pi_agent`), the servers
//! connected (`connect_all`) and served to pi (`serve`: over the relay or over HTTP), the agent run
//! (`agent`), and the exit line (`finish`). [`Runner::run`] is the one place that comes back
//! between steps; a step that stops the job says so as a value, which `finish` turns into the exit
//! line.

use std::path::PathBuf;

use protocol::exit_line::ExitLine;
use protocol::job_dir::RunnerInput;

use crate::finish::{self, Ended, Stopped};
use crate::gateway::PiGateway;
use crate::{agent, connect_all, hold, pi_agent, plan, serve};

pub use crate::agent::CUT_MARKER;
pub use crate::finish::{TERMINATED, setup_failed};
pub use crate::serve::HUB_SOCKET;

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

/// What the runner starts once the servers are served.
#[derive(Debug, Clone)]
pub enum Agent {
    /// Real pi: the runner writes its private agent folder and reads its usage.
    Pi(crate::pi_agent::PiOptions),
    /// Any other command (tests drive the hub with an SDK client this way); empty for none.
    Command(Vec<String>),
}

/// The worker threads of the runner's runtime: one. Everything the runner does is relaying
/// (pi's requests to each server, the model gateway, the egress forwarder), and a message that
/// hops between two workers waits for the other to wake: on one thread a call through the hub
/// adds about half as much (docs/benchmarks.md, "One worker thread").
pub const RUNTIME_WORKERS: usize = 1;

/// Runs the job and says how it ended.
pub async fn run(job: JobOptions) -> ExitLine {
    let job_id = job.job_id.clone();
    match hold::start(job).await {
        Ok(runner) => runner.run().await,
        Err(stopped) => stopped.line(&job_id),
    }
}

/// The job's runner: the job's options, the model gateway (with pi), and the watch for SIGTERM,
/// held from the runner's first step to its last.
pub struct Runner {
    pub(crate) job: JobOptions,
    pub(crate) gateway: Option<PiGateway>,
    pub(crate) term: tokio::sync::Mutex<tokio::signal::unix::Signal>,
    pub(crate) _held: hold::Held,
}

impl Runner {
    /// Takes the job through its steps and says how it ended: the exit line of the step that
    /// stopped it, or of how the agent ended.
    pub async fn run(mut self) -> ExitLine {
        match self.steps().await {
            Ok(ended) => finish::finish(&self.job.job_id, ended, self.gateway.take()).await,
            Err(stopped) => stopped.line(&self.job.job_id),
        }
    }

    /// The job's path, one step after another: its servers planned, pi's folder prepared, the
    /// servers connected and served to pi, the agent run.
    async fn steps(&self) -> Result<Ended, Stopped> {
        let (planned, plan) = plan::read(&self.job)?;
        let folder = pi_agent::prepare_folder(&self.job, plan.codemode_models)?;
        let connecting = planned.map(|planned| {
            Box::pin(connect_all::connect_servers(&self.job, planned, plan.wait))
                as serve::Connecting<'_>
        });
        let (start, serving) = serve::serve(self, &folder, &plan, connecting).await?;
        let ended = agent::run(self, &folder, &plan.secrets, start).await;
        Ok(serving.ended(ended))
    }

    /// Resolves when the runner is told to stop (SIGTERM).
    pub(crate) async fn told_to_stop(&self) {
        self.term.lock().await.recv().await;
    }
}
