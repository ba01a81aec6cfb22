//! The container backend: a job in a Podman container (Docker takes the same arguments), with the
//! contract of the bubblewrap backend: pid, network, ipc and mount namespaces of its own; the root
//! read-only, `/job` and the overlay read-only, `/workspace` writable, a private `/tmp`; every
//! capability dropped and no new privileges; a pids and a memory limit; no log kept by the engine
//! (the job's output is the worker's to keep); killed at the time limit, and with the worker.
//!
//! The closed environment never reaches the engine: the container starts the image's launcher
//! (`pi-dispatch job-env`, [`crate::job_env`]) with none of the engine's defaults, and the worker
//! writes the environment to the job's input before anything else; the launcher sets it and becomes
//! the job's program. So no value is on a command line, in `podman inspect`, or in a file.
//!
//! A job is one `podman run --rm --interactive`, whose standard streams are the job's: the engine
//! creates, starts, attaches and, once the job's program has ended, removes the container in one
//! process, as an operator typing it would. Beside it runs a reaper, a shell in a session of its
//! own that waits for its input to close and then removes the container: the worker holds that
//! input, so when the worker dies however it dies, its containers go with it. A job stopped early
//! (its time limit, a cancel) is removed with `podman rm --force`, which ends the `run` too.
//!
//! `podman run` exits 125 when the engine itself failed (an image missing, an option refused):
//! that ending is the sandbox's failure, not the job's (the runner never exits 125).

use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};

use crate::backend::{Backend, BoxFuture, JobSpec, Network, RunningJob, StartError};
use crate::bwrap::{Ending, IMAGE, JOB_DIR, OVERLAY, WORKSPACE};
use crate::env::JobEnv;

/// util-linux's `setpriv`, which a job's `podman run` is started through to die with the worker.
const SETPRIV: &str = "/usr/bin/setpriv";

/// The label every job container carries, with the job's id as its value.
pub const JOB_LABEL: &str = "dev.pi-dispatch.job";

/// The engine and how it runs jobs.
#[derive(Debug, Clone)]
pub struct Podman {
    /// `podman` (or `docker`).
    pub program: PathBuf,
    /// The OCI runtime (`runc`, `crun`); the engine's default when `None`.
    pub runtime: Option<String>,
    pub limits: Limits,
    /// A container image whose root filesystem every job sees (in place of the host's system,
    /// which the bubblewrap backend shows), the job's image folder bound at [`IMAGE`] over it;
    /// without one, a job runs the container image of its image
    /// (`protocol::image::container_ref`).
    pub base_image: Option<String>,
    /// The launcher in the container and its arguments before the job's program: [`LAUNCHER`].
    pub launcher: Vec<OsString>,
}

/// The image's launcher: the runner's `job-env`.
pub const LAUNCHER: [&str; 2] = ["/opt/pi-dispatch-image/bin/pi-dispatch", "job-env"];

/// What one job may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub pids: u32,
    pub memory_mib: u64,
    /// Open files and processes (`--ulimit`, soft and hard alike): no higher than the engine's own
    /// limits, which a container cannot raise.
    pub nofile: u64,
    pub nproc: u64,
}

impl Podman {
    /// Whether the engine is Docker (the program is named `docker`): the few options only Podman
    /// has are given in Docker's words.
    pub fn is_docker(&self) -> bool {
        self.program.file_name().is_some_and(|n| n == "docker")
    }

    /// `rm` of a container at once, in the engine's words.
    fn rm_args(&self, name: &str) -> Vec<String> {
        let mut a = vec!["rm".to_owned(), "--force".to_owned()];
        if !self.is_docker() {
            a.extend(["--time".to_owned(), "0".to_owned()]);
        }
        a.push(name.to_owned());
        a
    }
}

impl Limits {
    /// The default limits, the open files and processes lowered to this process's own (hard)
    /// limits where those are lower: a container cannot be given more.
    pub fn within_own() -> Limits {
        let d = Limits::default();
        let own = |r: rustix::process::Resource, want: u64| {
            rustix::process::getrlimit(r)
                .maximum
                .map_or(want, |max| want.min(max))
        };
        Limits {
            nofile: own(rustix::process::Resource::Nofile, d.nofile),
            nproc: own(rustix::process::Resource::Nproc, d.nproc),
            ..d
        }
    }
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            pids: 1024,
            memory_mib: 4096,
            nofile: 4096,
            nproc: 4096,
        }
    }
}

/// The status of `podman run` when the engine, not the container, failed.
pub const ENGINE_FAILED: i32 = 125;

/// `podman run`'s arguments for `spec` and the container named `name`. No value of the
/// environment is among them (it comes on the job's input). Pure.
pub fn run_args(podman: &Podman, spec: &JobSpec, job_id: &str, name: &str) -> Vec<OsString> {
    let mut a: Vec<OsString> = Vec::new();
    let mut push = |items: &[&OsStr]| a.extend(items.iter().map(|s| s.to_os_string()));
    let s = OsStr::new;
    push(&[s("run"), s("--rm"), s("--name"), s(name)]);
    let label = format!("{JOB_LABEL}={job_id}");
    push(&[s("--label"), s(&label)]);
    if let Some(runtime) = &podman.runtime {
        push(&[s("--runtime"), s(runtime)]);
    }
    // Its input stays open for the job's key; its output is read by the worker alone.
    push(&[s("--interactive"), s("--log-driver"), s("none")]);
    // The image is installed before any job (`image install`): a job never makes the engine fetch.
    push(&[s("--pull"), s("never")]);
    // A small init as process 1 reaps what the job orphans; when the job's program ends, the
    // container ends with everything in it.
    push(&[s("--init")]);
    push(
        &confinement_args(podman, spec)
            .iter()
            .map(OsString::as_os_str)
            .collect::<Vec<_>>(),
    );
    let volume = |host: &Path, place: &str, mode: &str| {
        let mut v = OsString::from(host.as_os_str());
        v.push(format!(":{place}:{mode}"));
        v
    };
    let job = volume(&spec.job_dir, JOB_DIR, "ro");
    let overlay = volume(&spec.overlay_dir, OVERLAY, "ro");
    let workspace = volume(&spec.workspace, WORKSPACE, "rw");
    push(&[s("--volume"), &job, s("--volume"), &overlay]);
    push(&[s("--volume"), &workspace]);
    let image = match &podman.base_image {
        Some(base) => {
            let folder = volume(&spec.image_dir, IMAGE, "ro");
            push(&[s("--volume"), &folder]);
            base.clone()
        }
        None => protocol::image::container_ref(&spec.image_name),
    };
    push(&[s("--workdir"), s(WORKSPACE)]);
    push(&[s(&image)]);
    a.extend(podman.launcher.iter().cloned());
    a.push(spec.program.clone());
    a.extend(spec.args.iter().cloned());
    a
}

/// What confines the container: no capability and no new privileges, the engine's masks off for a
/// nesting runner, a read-only root with a tmpfs `/tmp`, the limits, the job's user and network,
/// and none of the engine's own variables.
fn confinement_args(podman: &Podman, spec: &JobSpec) -> Vec<OsString> {
    let mut a: Vec<OsString> = Vec::new();
    let mut push = |items: &[&OsStr]| a.extend(items.iter().map(|s| s.to_os_string()));
    let s = OsStr::new;
    push(&[
        s("--cap-drop=all"),
        s("--security-opt"),
        s("no-new-privileges"),
    ]);
    // A nesting program (the runner) mounts a /proc of its own for each process it confines, which
    // the kernel allows only where no part of /proc is covered: the engine's masks come off. The job
    // still holds no capability, and the runner's own user namespace holds nothing on the host.
    let docker = podman.is_docker();
    if spec.nested {
        let unmask = if docker {
            "systempaths=unconfined"
        } else {
            "unmask=ALL"
        };
        push(&[s("--security-opt"), s(unmask)]);
    }
    // The root read-only; /tmp (and /run, /var/tmp) a tmpfs of its own.
    if docker {
        push(&[s("--read-only"), s("--tmpfs"), s("/tmp:rw,mode=1777")]);
    } else {
        push(&[s("--read-only"), s("--read-only-tmpfs=true")]);
    }
    let l = &podman.limits;
    let pids = l.pids.to_string();
    let memory = format!("{}m", l.memory_mib);
    let nofile = format!("nofile={0}:{0}", l.nofile);
    let nproc = format!("nproc={0}:{0}", l.nproc);
    push(&[s("--pids-limit"), s(&pids)]);
    push(&[s("--memory"), s(&memory), s("--memory-swap"), s(&memory)]);
    push(&[s("--ulimit"), s(&nofile), s("--ulimit"), s(&nproc)]);
    let (uid, gid) = spec
        .host_user
        .unwrap_or((crate::bwrap::NOBODY, crate::bwrap::NOBODY));
    let user = format!("{uid}:{gid}");
    push(&[s("--user"), s(&user)]);
    let network = match spec.network {
        Network::Host => "host".to_owned(),
        Network::None => "none".to_owned(),
        // The worker's descriptor, as the engine (root, as the worker is) opens it.
        Network::Outside { netns } => format!("ns:/proc/{}/fd/{netns}", std::process::id()),
    };
    push(&[s("--network"), s(&network)]);
    if let Network::Outside { .. } = spec.network {
        let servers = crate::outside::nameservers(&crate::outside::resolver_conf());
        if servers.is_empty() {
            push(&[s("--dns"), s("none")]);
        }
        for server in servers {
            push(&[s("--dns"), s(&server.to_string())]);
        }
    }
    // None of the engine's own variables: the launcher sets the job's, and only those (Docker
    // has no such option; its few defaults never reach the job, whose launcher clears them).
    if !docker {
        push(&[s("--unsetenv-all")]);
    }
    a
}

/// A fresh container name.
fn container_name() -> std::io::Result<String> {
    Ok(format!("pi-dispatch-{}", protocol::ids::random_hex::<8>()?))
}

impl Podman {
    fn command(&self) -> Command {
        let mut c = Command::new(&self.program);
        // The engine's own output never reaches the job, and its environment is the worker's.
        c.stdin(Stdio::null());
        c
    }

    /// The command of a job's `podman run`: through `setpriv --pdeathsig KILL` where util-linux's
    /// `setpriv` is, so that the worker's death ends the `run` with it and the reaper's removal
    /// comes after the last thing the `run` did (a container created after it would be left).
    fn run_command(&self) -> Command {
        if !Path::new(SETPRIV).is_file() {
            return self.command();
        }
        let mut c = Command::new(SETPRIV);
        c.args(["--pdeathsig", "KILL", "--"])
            .arg(&self.program)
            .stdin(Stdio::null());
        c
    }

    /// Removes the container at once, whatever runs in it.
    async fn remove(&self, name: &str) {
        let mut c = self.command();
        c.args(self.rm_args(name))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let _ = c.status().await;
    }

    /// Starts `spec` with exactly the environment `env`, written first to the job's input; the
    /// container is labelled with the job's id (`PI_JOB_ID`).
    pub async fn start_job(&self, spec: &JobSpec, env: &JobEnv) -> Result<PodmanJob, StartError> {
        use tokio::io::AsyncWriteExt as _;
        if self.is_docker() && matches!(spec.network, Network::Outside { .. }) {
            return Err(StartError::Container(
                "with egress off a job runs in a network namespace made for it, which Docker cannot \
                 join: use Podman or bubblewrap, or turn egress on"
                    .to_owned(),
            ));
        }
        let job_id = env
            .get(crate::env::JOB_ID)
            .map(|v| v.expose().to_owned())
            .unwrap_or_default();
        let name = container_name()
            .map_err(|e| StartError::Container(format!("no container name: {e}")))?;
        let mut run = self.run_command();
        run.args(run_args(self, spec, &job_id, &name))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let child = match spawn::retry_busy(|| run.spawn()) {
            Ok(c) => c,
            Err(e) => {
                return Err(StartError::Container(format!(
                    "{} cannot be run ({})",
                    self.program.display(),
                    e.kind()
                )));
            }
        };
        // The reaper while the engine starts up: no container exists before the engine has
        // started, which takes far longer than this.
        let reaper = self.reaper(&name).ok();
        let mut job = PodmanJob {
            podman: self.clone(),
            name,
            child,
            reaper,
            removed: false,
        };
        // The environment before anything else on the job's input; the rest is the caller's.
        let written = match job.child.stdin.as_mut() {
            Some(input) => input.write_all(&crate::launcher::block(env)).await,
            None => Err(io::Error::other("the job has no input")),
        };
        if let Err(e) = written {
            job.end().await;
            return Err(StartError::Container(format!(
                "the job's environment could not be handed over ({})",
                e.kind()
            )));
        }
        Ok(job)
    }

    /// A shell in a session of its own that removes the container once its input closes with
    /// nothing said: the worker holds that input, so the container goes when the worker does. A
    /// line on it (the worker saw the container gone) lets it exit without running the engine.
    fn reaper(&self, name: &str) -> io::Result<(Child, ChildStdin)> {
        let mut c = Command::new("/bin/sh");
        c.args([
            "-c",
            "if read -r _; then exit 0; fi; exec \"$0\" \"$@\" >/dev/null 2>&1",
        ])
        .arg(&self.program)
        .args(self.rm_args(name))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
        let mut child = spawn::retry_busy(|| c.spawn())?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| io::Error::other("the reaper has no input"))?;
        Ok((child, stdin))
    }
}

impl Backend for Podman {
    fn start<'a>(
        &'a self,
        spec: &'a JobSpec,
        env: &'a JobEnv,
    ) -> BoxFuture<'a, Result<Box<dyn RunningJob>, StartError>> {
        Box::pin(async move {
            let job = self.start_job(spec, env).await?;
            Ok(Box::new(job) as Box<dyn RunningJob>)
        })
    }
}

/// A job in its container.
pub struct PodmanJob {
    podman: Podman,
    name: String,
    child: Child,
    reaper: Option<(Child, ChildStdin)>,
    removed: bool,
}

impl PodmanJob {
    /// The container's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    async fn end(&mut self) {
        if !self.removed {
            // The `run` first, so that nothing is created after the removal; then the container,
            // whatever state the `run` got it to.
            let _ = self.child.start_kill();
            let _ = self.child.wait().await;
            self.podman.remove(&self.name).await;
            self.removed = true;
        }
        let _ = self.child.wait().await;
        self.release_reaper().await;
    }

    /// Tells the reaper the container is gone (a line on its input): it exits, removing nothing.
    /// It is not waited for: Tokio reaps a child dropped unwaited.
    async fn release_reaper(&mut self) {
        use tokio::io::AsyncWriteExt as _;
        if let Some((_reaper, mut input)) = self.reaper.take() {
            let _ = input.write_all(b"done\n").await;
        }
    }
}

impl RunningJob for PodmanJob {
    fn stdin(&mut self) -> Option<ChildStdin> {
        self.child.stdin.take()
    }

    fn stdout(&mut self) -> Option<ChildStdout> {
        self.child.stdout.take()
    }

    fn stderr(&mut self) -> Option<ChildStderr> {
        self.child.stderr.take()
    }

    fn wait_with_limit(&mut self, limit: Duration) -> BoxFuture<'_, io::Result<Ending>> {
        Box::pin(async move {
            match tokio::time::timeout(limit, self.child.wait()).await {
                Ok(status) => {
                    let status = status?;
                    // `run --rm` removed the container before it exited; killed by a signal, it
                    // may not have.
                    if status.code().is_some() {
                        self.removed = true;
                    }
                    self.end().await;
                    if status.code() == Some(ENGINE_FAILED) {
                        return Err(io::Error::other(
                            "the container engine failed to run the job",
                        ));
                    }
                    Ok(Ending::Exited(status))
                }
                Err(_) => {
                    self.end().await;
                    Ok(Ending::KilledAtLimit)
                }
            }
        })
    }

    fn kill(&mut self) -> BoxFuture<'_, io::Result<()>> {
        Box::pin(async move {
            self.end().await;
            Ok(())
        })
    }
}

impl Drop for PodmanJob {
    fn drop(&mut self) {
        if !self.removed {
            // Synchronously: a dropped job must not outlive the call that dropped it. The `run`
            // is killed first (it dies before the engine's `rm` has started up).
            let _ = self.child.start_kill();
            let _ = std::process::Command::new(&self.podman.program)
                .args(self.podman.rm_args(&self.name))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> JobSpec {
        JobSpec {
            job_dir: "/srv/state/jobs/j1/job".into(),
            overlay_dir: "/srv/pi-global".into(),
            image_dir: "/srv/images/pi-job".into(),
            image_name: "pi-job".into(),
            workspace: "/srv/repo".into(),
            host_user: Some((1000, 1000)),
            network: Network::None,
            program: "/opt/pi-dispatch-image/bin/pi-dispatch".into(),
            args: vec!["job".into(), "--job-id".into(), "j1".into()],
            nested: false,
            bounds: None,
        }
    }

    use crate::args_text as text;

    #[test]
    fn docker_is_given_the_options_only_podman_has_in_its_own_words() {
        let docker = Podman {
            program: "/usr/bin/docker".into(),
            runtime: None,
            limits: Limits::default(),
            base_image: None,
            launcher: LAUNCHER.iter().map(Into::into).collect(),
        };
        let nested = JobSpec {
            nested: true,
            ..spec()
        };
        let a = text(&run_args(&docker, &nested, "j1", "pi-dispatch-00"));
        assert!(a.contains("--security-opt systempaths=unconfined"), "{a}");
        assert!(a.contains("--read-only --tmpfs /tmp:rw,mode=1777"), "{a}");
        assert!(
            !a.contains("unsetenv") && !a.contains("read-only-tmpfs"),
            "{a}"
        );
        assert!(a.contains("localhost/pi-dispatch-pi-job:latest"), "{a}");
        assert_eq!(docker.rm_args("c"), ["rm", "--force", "c"]);
    }

    #[test]
    fn the_command_line_of_a_job_container() {
        let podman = Podman {
            program: config::settings::PODMAN.into(),
            runtime: Some("runc".into()),
            limits: Limits::default(),
            base_image: Some("localhost/pi-dispatch-base:latest".into()),
            launcher: LAUNCHER.iter().map(Into::into).collect(),
        };
        assert_eq!(
            text(&run_args(&podman, &spec(), "j1", "pi-dispatch-00",)),
            "run --rm --name pi-dispatch-00 --label dev.pi-dispatch.job=j1 --runtime runc \
             --interactive --log-driver none --pull never --init --cap-drop=all --security-opt no-new-privileges \
             --read-only --read-only-tmpfs=true --pids-limit 1024 --memory 4096m --memory-swap 4096m \
             --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 --user 1000:1000 --network none \
             --unsetenv-all --volume /srv/state/jobs/j1/job:/job:ro \
             --volume /srv/pi-global:/opt/pi-global:ro --volume /srv/repo:/workspace:rw \
             --volume /srv/images/pi-job:/opt/pi-dispatch-image:ro \
             --workdir /workspace localhost/pi-dispatch-base:latest \
             /opt/pi-dispatch-image/bin/pi-dispatch job-env \
             /opt/pi-dispatch-image/bin/pi-dispatch job --job-id j1"
        );
    }
}
