//! The worker's egress proxy, with egress on: before the worker takes a job, a proxy answers on the
//! control socket. One already serving the folder (run on its own, or another worker's) is used as
//! it is; otherwise the worker starts `pi-dispatch egress-proxy` as its child and watches it: a
//! child that ends is started again (unless another proxy has taken the folder meanwhile), and a
//! proxy the worker used that stops answering is replaced by a child of its own. When the worker
//! stops, its child is told to stop (SIGTERM) and waited for.
//!
//! The child is started from the watching thread, which lives as long as the worker: the child
//! asks the kernel for SIGTERM when that thread ends, so a worker killed outright takes its proxy
//! with it.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use egress::control::Client;

/// How long a proxy the worker started has to answer its first ping.
pub const START_WAIT: Duration = Duration::from_secs(10);
/// How often the watch looks at the proxy.
const CHECK: Duration = Duration::from_millis(200);
/// How long a child told to stop has before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// Pauses between starts of a child that keeps ending: from the first to the last, doubling; a
/// child that ran this long resets them.
const FIRST_PAUSE: Duration = Duration::from_millis(250);
const LAST_PAUSE: Duration = Duration::from_secs(10);
const STEADY: Duration = Duration::from_secs(30);

/// How to start the proxy.
#[derive(Debug, Clone)]
pub struct ProxyCommand {
    /// The control socket a proxy answers on (`PI_EGRESS_PROXY_DIR/control.sock`).
    pub control: PathBuf,
    /// The program (the worker's own executable) and its arguments, which make it serve the folder
    /// of `control`.
    pub program: PathBuf,
    pub args: Vec<OsString>,
}

/// Why the worker has no proxy.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the egress proxy could not be started ({0})")]
    Spawn(std::io::ErrorKind),
    #[error("the egress proxy exited before it answered ({0})")]
    Exited(ExitStatus),
    #[error("the egress proxy did not answer on its control socket within {} s", START_WAIT.as_secs())]
    Timeout,
    #[error("the egress proxy's watch could not be started")]
    Thread,
}

/// The watch over the proxy: stopped (with the worker's child) by [`Supervisor::stop`] or when
/// dropped.
pub struct Supervisor {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Where the proxy that answers comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Another process serves the folder.
    Shared,
    /// The worker's own child.
    Child(u32),
}

impl Supervisor {
    /// Makes sure a proxy answers on `command.control`, and watches it from then on.
    pub fn start(command: ProxyCommand) -> Result<(Supervisor, Source), StartError> {
        let stop = Arc::new(AtomicBool::new(false));
        let (tell, told) = mpsc::channel();
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("egress-proxy".into())
            .spawn(move || watch(&command, &flag, &tell))
            .map_err(|_| StartError::Thread)?;
        match told.recv() {
            Ok(Ok(source)) => Ok((
                Supervisor {
                    stop,
                    thread: Some(thread),
                },
                source,
            )),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(StartError::Thread)
            }
        }
    }

    /// Stops the watch, and the worker's child with it (SIGTERM, then SIGKILL after a grace).
    pub fn stop(mut self) {
        self.end();
    }

    fn end(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.end();
    }
}

/// The names of the worker's environment its egress proxy is started with: the deployment's
/// settings (which the proxy reads as the worker does) but the secret ones, and what a program
/// needs to run and log. Nothing else of the worker's (the provider's key, what `PI_FORWARD_ENV`
/// forwards to jobs, the forges' tokens) reaches the proxy's environment.
fn proxy_environment(
    env: &dyn Fn(&str) -> Option<std::ffi::OsString>,
) -> Vec<(&'static str, std::ffi::OsString)> {
    use config::settings as s;
    const PROCESS: [&str; 7] = ["PATH", "HOME", "LANG", "LC_ALL", "TZ", "RUST_LOG", "PI_DIR"];
    let secret = [s::GITLAB_TOKEN_SETTING, s::QUEUE_PASSWORD_SETTING];
    s::ALL
        .iter()
        .filter(|name| !secret.contains(name))
        .chain(PROCESS.iter())
        .filter_map(|name| env(name).map(|value| (*name, value)))
        .collect()
}

fn answers(client: &Client) -> bool {
    client.ping().is_ok()
}

/// Starts the proxy, and waits for it to answer (or for another one to answer instead).
fn start_child(command: &ProxyCommand, client: &Client) -> Result<Option<Child>, StartError> {
    use std::os::unix::process::CommandExt as _;
    let mut cmd = Command::new(&command.program);
    cmd.env_clear()
        .envs(proxy_environment(&|name| std::env::var_os(name)))
        .args(&command.args)
        // A group of its own: a Ctrl-C at the worker's terminal drains the worker, whose jobs
        // still need the proxy, and does not reach the proxy too.
        .process_group(0)
        .stdin(Stdio::null())
        // It says where its socket is on its output; its log lines go to the worker's own.
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let mut child = spawn::retry_busy(|| cmd.spawn()).map_err(|e| StartError::Spawn(e.kind()))?;
    let deadline = Instant::now() + START_WAIT;
    loop {
        if answers(client) {
            return Ok(Some(child));
        }
        match child.try_wait() {
            Ok(Some(status)) => {
                // Another proxy took the folder's lock first: use it.
                return if answers(client) {
                    Ok(None)
                } else {
                    Err(StartError::Exited(status))
                };
            }
            Ok(None) => {}
            Err(e) => return Err(StartError::Spawn(e.kind())),
        }
        if Instant::now() >= deadline {
            stop_child(&mut child);
            return Err(StartError::Timeout);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SIGTERM, a grace, then SIGKILL; reaped either way.
fn stop_child(child: &mut Child) {
    if matches!(child.try_wait(), Ok(Some(_))) {
        return;
    }
    spawn::signal::process(child.id(), spawn::signal::End::Term);
    let deadline = Instant::now() + STOP_GRACE;
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_)) | Err(_)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    tracing::warn!(
        event = "egress_proxy_killed",
        pid = child.id(),
        why = "it did not stop on SIGTERM"
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// The watch: the first start (reported on `tell`), then a look every [`CHECK`] until `stop`.
fn watch(
    command: &ProxyCommand,
    stop: &AtomicBool,
    tell: &mpsc::Sender<Result<Source, StartError>>,
) {
    let client = Client::new(&command.control);
    let mut child: Option<Child> = None;
    let first = if answers(&client) {
        tracing::info!(event = "egress_proxy_shared", control = %command.control.display());
        Ok(Source::Shared)
    } else {
        start_child(command, &client).map(|c| match c {
            Some(c) => {
                let pid = c.id();
                tracing::info!(event = "egress_proxy_child_started", pid);
                child = Some(c);
                Source::Child(pid)
            }
            None => {
                tracing::info!(event = "egress_proxy_shared", control = %command.control.display());
                Source::Shared
            }
        })
    };
    let failed = first.is_err();
    let _ = tell.send(first);
    if failed {
        return;
    }
    let mut started_at = Instant::now();
    let mut pause = FIRST_PAUSE;
    let mut next_start = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(CHECK);
        if stop.load(Ordering::SeqCst) {
            break;
        }
        if let Some(c) = child.as_mut() {
            match c.try_wait() {
                Ok(None) => continue,
                Ok(Some(status)) => {
                    tracing::warn!(event = "egress_proxy_exited", pid = c.id(), status = %status);
                }
                Err(e) => {
                    tracing::warn!(event = "egress_proxy_exited", pid = c.id(), detail = %e.kind());
                }
            }
            child = None;
            if started_at.elapsed() >= STEADY {
                pause = FIRST_PAUSE;
            }
            next_start = Instant::now() + pause;
            pause = (pause * 2).min(LAST_PAUSE);
        }
        if answers(&client) || Instant::now() < next_start {
            continue;
        }
        // No proxy answers: the worker's own child (again), or one of its own in place of a
        // shared one that stopped.
        match start_child(command, &client) {
            Ok(Some(c)) => {
                tracing::warn!(event = "egress_proxy_restarted", pid = c.id());
                started_at = Instant::now();
                child = Some(c);
            }
            Ok(None) => {
                tracing::info!(event = "egress_proxy_shared", control = %command.control.display());
            }
            Err(e) => {
                tracing::error!(event = "egress_proxy_failed", detail = %e);
                next_start = Instant::now() + pause;
                pause = (pause * 2).min(LAST_PAUSE);
            }
        }
    }
    if let Some(mut c) = child {
        tracing::info!(event = "egress_proxy_stopping", pid = c.id());
        stop_child(&mut c);
    }
}

#[cfg(test)]
mod tests {
    use super::proxy_environment;

    #[test]
    fn the_proxy_gets_the_settings_and_none_of_the_workers_secrets() {
        let worker = |name: &str| -> Option<std::ffi::OsString> {
            match name {
                "PATH" => Some("/usr/bin".into()),
                "PI_EGRESS_PROXY_DIR" => Some("/run/egress".into()),
                "PI_GITLAB_TOKEN" | "PI_QUEUE_PASSWORD" | "OPENAI_API_KEY" | "DOCS_TOKEN" => {
                    Some("cnry-secret".into())
                }
                _ => None,
            }
        };
        let env = proxy_environment(&worker);
        let names: Vec<&str> = env.iter().map(|(n, _)| *n).collect();
        assert!(
            names.contains(&"PATH") && names.contains(&"PI_EGRESS_PROXY_DIR"),
            "{names:?}"
        );
        assert!(env.iter().all(|(_, v)| v != "cnry-secret"), "{names:?}");
    }
}
