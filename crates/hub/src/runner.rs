//! The job's runner as each of its steps sees it: where the job's parts are ([`JobOptions`]), the
//! agent it starts, and what it holds from its first step to its last (the model gateway, the
//! watch for SIGTERM, the way out and the guard). On the job's path: inside the sandbox, from the
//! runner's first step (`hold`) to the exit line (`finish`); every step takes the [`Runner`], and
//! none is defined here.

use std::path::PathBuf;

use protocol::job_dir::RunnerInput;

use crate::gateway::PiGateway;

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

/// The forwarder's tasks, ended with the job.
pub(crate) struct Forwarding(pub(crate) Vec<tokio::task::JoinHandle<()>>);

impl Drop for Forwarding {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// What the runner holds from its first moment to its last, apart from the gateway and the watch
/// for SIGTERM: the way out and the guard.
pub(crate) struct Held {
    pub(crate) _forwarding: Option<Forwarding>,
    pub(crate) _guard: Option<crate::guard::Guard>,
}

/// The job's runner: the job's options, the model gateway (with pi), and the watch for SIGTERM,
/// held from the runner's first step to its last.
pub struct Runner {
    pub(crate) job: JobOptions,
    pub(crate) gateway: Option<PiGateway>,
    pub(crate) term: tokio::sync::Mutex<tokio::signal::unix::Signal>,
    pub(crate) _held: Held,
    /// The servers' definitions lines being signed and written off the job's path
    /// (`pins::say_definitions`): the runner waits for them before its exit line.
    pub(crate) saying: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Runner {
    /// pi's options, when the agent is pi.
    pub(crate) fn pi(&self) -> Option<&crate::pi_agent::PiOptions> {
        match &self.job.agent {
            Agent::Pi(pi) => Some(pi),
            Agent::Command(_) => None,
        }
    }

    /// Waits for the definitions lines still being said.
    pub(crate) async fn said(&self) {
        let saying = std::mem::take(&mut *self.saying.lock().unwrap_or_else(|e| e.into_inner()));
        for handle in saying {
            let _ = handle.await;
        }
    }

    /// Resolves when the runner is told to stop (SIGTERM).
    pub(crate) async fn told_to_stop(&self) {
        self.term.lock().await.recv().await;
    }
}
