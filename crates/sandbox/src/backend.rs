//! The sandbox backends behind one trait: a job is started from a backend-neutral [`JobSpec`] and
//! its environment; the running job offers its standard streams, a wait under the time limit, and
//! kill. bubblewrap ([`Bubblewrap`]) is the embedded default; a container backend implements the
//! same trait.

use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use tokio::process::{ChildStderr, ChildStdin, ChildStdout};

use crate::bwrap::{self, Ending, SandboxSpec};
use crate::env::JobEnv;

/// A future a backend returns.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a job's sandbox is made of, whatever runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSpec {
    /// The host folders the job sees: its files (read-only), the overlay (read-only), the image
    /// (read-only) and the workspace (writable).
    pub job_dir: PathBuf,
    pub overlay_dir: PathBuf,
    pub image_dir: PathBuf,
    /// The image's name (`images/NAME`, or the container image `image build NAME` made).
    pub image_name: String,
    pub workspace: PathBuf,
    /// The host user whose files the job writes (a root worker runs a local job as its folder's
    /// owner); `None` runs it as the worker's own user.
    pub host_user: Option<(u32, u32)>,
    pub network: Network,
    /// What runs inside (a path in the sandbox) and its arguments.
    pub program: OsString,
    pub args: Vec<OsString>,
    /// The program confines what it starts (the runner): see [`SandboxSpec::nested`].
    pub nested: bool,
    /// The job's bounds kept by the kernel, when the worker has control groups to keep them in.
    pub bounds: Option<Bounds>,
}

/// What bounds a job: the control groups its first process joins (the files it writes `0` to), the CPU
/// time each of its processes may use, and the size of its `/tmp`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bounds {
    pub join: Vec<PathBuf>,
    pub cpu_secs: u64,
    pub tmp_bytes: u64,
}

/// The job's network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Network {
    /// The host's network: never a job's (the benchmarks' comparison with an engine's default).
    Host,
    /// Its own loopback only (egress on: the proxy is reached through a socket in its folder).
    None,
    /// Egress off: the network namespace the worker made for it ([`crate::outside::Outside`]),
    /// open on this descriptor of the worker's while the job runs.
    Outside { netns: i32 },
}

/// A sandbox backend.
pub trait Backend: Send + Sync {
    /// Starts `spec` with exactly the environment `env`. Call it from a thread that outlives the
    /// job (bubblewrap dies with the thread that started it).
    fn start<'a>(
        &'a self,
        spec: &'a JobSpec,
        env: &'a JobEnv,
    ) -> BoxFuture<'a, Result<Box<dyn RunningJob>, StartError>>;
}

/// A job that runs: its streams, taken once each; a wait; and kill. Dropping it ends the job with
/// every process in it.
pub trait RunningJob: Send {
    fn stdin(&mut self) -> Option<ChildStdin>;
    fn stdout(&mut self) -> Option<ChildStdout>;
    fn stderr(&mut self) -> Option<ChildStderr>;
    /// Waits for the job at most `limit`, then ends it with every process in it.
    fn wait_with_limit(&mut self, limit: Duration) -> BoxFuture<'_, io::Result<Ending>>;
    /// Ends every process of the job and waits until they are gone.
    fn kill(&mut self) -> BoxFuture<'_, io::Result<()>>;
}

/// The sandbox did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Bubblewrap(#[from] bwrap::SpawnError),
    /// What the container engine or the worker said (names and paths, never a value).
    #[error("{0}")]
    Container(String),
}

/// The embedded backend: bubblewrap, with the host's system directories read-only.
#[derive(Debug, Clone)]
pub struct Bubblewrap {
    pub bwrap: PathBuf,
    /// The command that sets a job's limits and becomes bubblewrap (`pi-dispatch job-limits`):
    /// a job with bounds starts through it. Empty: bubblewrap is started directly, and a job's
    /// bounds are not kept.
    pub limits: Vec<OsString>,
}

impl Bubblewrap {
    /// bubblewrap's spec for a job: the job runs as the conventional `nobody` inside, or, when
    /// its program nests (see [`SandboxSpec::nested`]), as the host user bubblewrap runs as.
    pub fn spec(&self, job: &JobSpec) -> SandboxSpec {
        let (uid, gid) = if job.nested {
            bwrap::runs_as(
                rustix::process::geteuid().as_raw(),
                rustix::process::getegid().as_raw(),
                job.host_user,
            )
        } else {
            (bwrap::NOBODY, bwrap::NOBODY)
        };
        SandboxSpec {
            uid,
            gid,
            nested: job.nested,
            system: bwrap::host_system(),
            job_dir: job.job_dir.clone(),
            overlay_dir: job.overlay_dir.clone(),
            workspace: job.workspace.clone(),
            image_dir: job.image_dir.clone(),
            image_commands: image_commands(&job.image_dir),
            extra_ro: Vec::new(),
            share_net: job.network != Network::None,
            netns: match job.network {
                Network::Outside { netns } => Some(netns),
                Network::Host | Network::None => None,
            },
            host: job.host_user,
            program: job.program.clone(),
            args: job.args.clone(),
            tmp_bytes: job.bounds.as_ref().map(|b| b.tmp_bytes),
            prefix: match (&job.bounds, self.limits.is_empty()) {
                (Some(b), false) => {
                    let mut prefix = self.limits.clone();
                    for file in &b.join {
                        prefix.push("--join".into());
                        prefix.push(file.clone().into_os_string());
                    }
                    prefix.extend(["--cpu".into(), b.cpu_secs.to_string().into(), "--".into()]);
                    prefix
                }
                _ => Vec::new(),
            },
        }
    }
}

/// The image's own commands folder, when it has one and the host has the place it goes (a mount
/// point cannot be made in the host's read-only `/usr`).
fn image_commands(image_dir: &std::path::Path) -> Option<PathBuf> {
    let commands = image_dir.join(protocol::image::COMMANDS);
    let place = std::path::Path::new(bwrap::IMAGE_COMMANDS);
    (std::fs::symlink_metadata(&commands).is_ok_and(|m| m.is_dir()) && place.is_dir())
        .then_some(commands)
}

impl Backend for Bubblewrap {
    fn start<'a>(
        &'a self,
        spec: &'a JobSpec,
        env: &'a JobEnv,
    ) -> BoxFuture<'a, Result<Box<dyn RunningJob>, StartError>> {
        Box::pin(async move {
            let sandbox = bwrap::spawn(&self.bwrap, &self.spec(spec), env).await?;
            Ok(Box::new(sandbox) as Box<dyn RunningJob>)
        })
    }
}

impl RunningJob for bwrap::Sandbox {
    fn stdin(&mut self) -> Option<ChildStdin> {
        bwrap::Sandbox::stdin(self)
    }

    fn stdout(&mut self) -> Option<ChildStdout> {
        bwrap::Sandbox::stdout(self)
    }

    fn stderr(&mut self) -> Option<ChildStderr> {
        bwrap::Sandbox::stderr(self)
    }

    fn wait_with_limit(&mut self, limit: Duration) -> BoxFuture<'_, io::Result<Ending>> {
        Box::pin(bwrap::Sandbox::wait_with_limit(self, limit))
    }

    fn kill(&mut self) -> BoxFuture<'_, io::Result<()>> {
        Box::pin(bwrap::Sandbox::kill(self))
    }
}
