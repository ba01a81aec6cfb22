//! A host step on what a job left, run where what the job planted cannot reach the host: a program
//! (git) with a folder bound read-only at `/workspace`, under bubblewrap with namespaces of its own
//! (user, pid, network, ipc, uts, cgroup), no capability, no user namespace of its own, the host's
//! system read-only, its own `/proc` and a small `/tmp`, an environment of fixed values only, and a
//! bound on its time and on what it prints.
//!
//! `pi-dispatch run` checks a repository for uncommitted changes this way: the repository's own
//! `.git/config` can name filters and hooks that git runs, so git runs where they can read nothing
//! but the repository, write nothing, reach no network and see no other process.
//!
//! When the caller is root, the step runs as the folder's owner through a stage
//! ([`crate::bwrap::stage_args`]), which binds the folder by descriptor, so that the folders above
//! it need not be open to that user.

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use command_fds::{CommandFdExt as _, FdMapping};

use crate::bwrap::{self, STAGE, SystemPath};

/// Where the folder is inside.
pub const FOLDER: &str = "/workspace";
/// The size of the step's `/tmp`.
const TMP_BYTES: u64 = 64 << 20;
/// What is kept of its standard error.
const STDERR_KEPT: usize = 4096;
/// The descriptor the folder is handed over on.
const FOLDER_FD: i32 = 3;

/// What to run, on which folder, and within what.
pub struct Step<'a> {
    pub bwrap: &'a Path,
    /// The folder (from [`bwrap::open_folder`]), bound read-only at [`FOLDER`].
    pub folder: OwnedFd,
    /// When the caller is root: the host user the step runs as (the folder's owner).
    pub user: Option<(u32, u32)>,
    /// A program found on the step's `PATH`, and its arguments.
    pub program: &'a OsStr,
    pub args: Vec<OsString>,
    /// The whole environment: fixed values, never a secret (they are on the command line).
    pub env: Vec<(&'a str, &'a str)>,
    /// How long it may run before it is killed with everything it started.
    pub time: Duration,
    /// How much of its standard output is kept (the rest is read and dropped).
    pub stdout_kept: usize,
}

/// How the step ended.
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    /// The first `stdout_kept` bytes it printed, and how many it printed in all.
    pub stdout: Vec<u8>,
    pub stdout_len: u64,
    /// The first few KiB of its standard error.
    pub stderr: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error("bubblewrap could not be started ({0})")]
    Start(std::io::ErrorKind),
    #[error("it ran longer than {} seconds and was stopped", .0.as_secs())]
    TimedOut(Duration),
}

/// The inner bubblewrap's command line: the folder from `source` (a descriptor, or a stage's
/// place), the program and its environment. Pure.
pub fn args(
    system: &[SystemPath],
    source: Source,
    program: &OsStr,
    args: &[OsString],
    env: &[(&str, &str)],
) -> Vec<OsString> {
    let mut a: Vec<OsString> = [
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
    ]
    .iter()
    .map(Into::into)
    .collect();
    a.extend(bwrap::system_args(system));
    for (flag, x) in [("--proc", "/proc"), ("--dev", "/dev")] {
        a.extend([flag.into(), x.into()]);
    }
    a.extend([
        "--size".into(),
        TMP_BYTES.to_string().into(),
        "--tmpfs".into(),
        "/tmp".into(),
    ]);
    match source {
        Source::Fd(fd) => a.extend(["--ro-bind-fd".into(), fd.to_string().into()]),
        Source::Stage => a.extend([
            "--ro-bind".into(),
            Path::new(STAGE).join("folder").into_os_string(),
        ]),
    }
    a.push(FOLDER.into());
    a.extend(["--remount-ro".into(), "/".into()]);
    a.extend(["--chdir".into(), FOLDER.into(), "--clearenv".into()]);
    for (name, value) in env {
        a.extend(["--setenv".into(), (*name).into(), (*value).into()]);
    }
    a.push("--".into());
    a.push(program.to_owned());
    a.extend(args.iter().cloned());
    a
}

/// Where the inner bubblewrap takes the folder from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A descriptor it inherited.
    Fd(i32),
    /// Its place in a stage.
    Stage,
}

/// Runs the step and waits for it, at most `step.time`.
pub fn run(step: Step<'_>) -> Result<Output, StepError> {
    let mut command = step_command(&step);
    command
        .fd_mappings(vec![FdMapping {
            parent_fd: step.folder,
            child_fd: FOLDER_FD,
        }])
        .map_err(|_| StepError::Start(std::io::ErrorKind::InvalidInput))?;
    let mut child = command.spawn().map_err(|e| StepError::Start(e.kind()))?;
    drop(command);
    let out_reader = read_kept(child.stdout.take(), step.stdout_kept);
    let err_reader = read_kept(child.stderr.take(), STDERR_KEPT);
    let deadline = Instant::now() + step.time;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            _ => break None,
        }
    };
    let Some(status) = status else {
        // bubblewrap leads its process group; the sandbox's first process dies with it
        // (--die-with-parent), and everything in the sandbox with that.
        spawn::signal::group(child.id(), spawn::signal::End::Kill);
        let _ = child.kill();
        let _ = child.wait();
        return Err(StepError::TimedOut(step.time));
    };
    let (stdout, stdout_len) = out_reader.join().unwrap_or_default();
    let (stderr, _) = err_reader.join().unwrap_or_default();
    Ok(Output {
        status,
        stdout,
        stdout_len,
        stderr,
    })
}

/// bubblewrap's command for the step: as root, through a stage that binds the folder for the
/// step's user; otherwise with the folder on its descriptor.
fn step_command(step: &Step<'_>) -> std::process::Command {
    let system = bwrap::host_system();
    let mut command = std::process::Command::new(step.bwrap);
    match step.user {
        Some(user) => {
            let inner = Path::new(STAGE).join("bwrap");
            let folders = [bwrap::StageFolder {
                fd: FOLDER_FD,
                place: Path::new(STAGE).join("folder"),
                writable: false,
            }];
            command
                .args(bwrap::stage_args(
                    &system,
                    user,
                    &folders,
                    &[(step.bwrap.to_owned(), inner.clone())],
                    None,
                ))
                .arg(inner)
                .args(args(
                    &system,
                    Source::Stage,
                    step.program,
                    &step.args,
                    &step.env,
                ));
        }
        None => {
            command.args(args(
                &system,
                Source::Fd(FOLDER_FD),
                step.program,
                &step.args,
                &step.env,
            ));
        }
    }
    command
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    command
}

/// Reads `from` to its end on a thread of its own (the pipe must not fill): its first `kept`
/// bytes, and how many it gave in all.
fn read_kept(
    from: Option<impl Read + Send + 'static>,
    kept: usize,
) -> std::thread::JoinHandle<(Vec<u8>, u64)> {
    std::thread::spawn(move || {
        let mut kept_bytes = Vec::new();
        let mut total = 0u64;
        if let Some(mut from) = from {
            let mut buf = [0u8; 8192];
            while let Ok(n @ 1..) = from.read(&mut buf) {
                total += n as u64;
                let room = kept.saturating_sub(kept_bytes.len());
                kept_bytes.extend_from_slice(&buf[..n.min(room)]);
            }
        }
        (kept_bytes, total)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_has_namespaces_of_its_own_and_the_folder_read_only() {
        let system = vec![
            SystemPath::Dir("/usr".into()),
            SystemPath::Link {
                path: "/bin".into(),
                target: "usr/bin".into(),
            },
        ];
        let text = |a: Vec<OsString>| {
            a.iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        };
        let a = text(args(
            &system,
            Source::Fd(3),
            OsStr::new("git"),
            &["status".into()],
            &[("PATH", "/usr/bin:/bin")],
        ));
        assert_eq!(
            a,
            "--unshare-all --unshare-user --disable-userns --die-with-parent --new-session --cap-drop ALL \
             --ro-bind /usr /usr --symlink usr/bin /bin --proc /proc --dev /dev \
             --size 67108864 --tmpfs /tmp --ro-bind-fd 3 /workspace --remount-ro / \
             --chdir /workspace --clearenv --setenv PATH /usr/bin:/bin -- git status"
        );
        let staged = text(args(&system, Source::Stage, OsStr::new("git"), &[], &[]));
        assert!(
            staged.contains("--ro-bind /stage/folder /workspace"),
            "{staged}"
        );
    }
}
