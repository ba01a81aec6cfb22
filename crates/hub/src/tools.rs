//! pi's tools, apart from pi: each command of pi's bash tool runs in process, mount and ipc
//! namespaces of its own, started by the runner rather than by pi, so that no tool can see pi,
//! signal it or change its limits.
//!
//! pi's shell (`job-shell`, pi's child) does not run the command itself: it connects to the
//! runner's socket in pi's agent folder ([`SOCKET_VARIABLE`] names it), hands over its standard
//! input, output and error (`SCM_RIGHTS`), its arguments, working folder and environment (less the
//! hub's token), and waits for the exit status. The runner starts the command through
//! `job-confine` (no capability, the agent folder pinned and read-only as pi sees it) with those
//! streams, and kills it, with everything it started, as soon as the shell's connection closes: pi
//! ending its shell (a timeout, an abort) ends the command.

use std::io::{IoSlice, IoSliceMut, Read as _, Write as _};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The variable that names the runner's socket for pi's shell.
pub const SOCKET_VARIABLE: &str = "PI_DISPATCH_TOOLS_SOCKET";

/// The largest request the runner reads.
const MAX_REQUEST: u32 = 4 << 20;

/// What pi's shell asks the runner to run.
#[derive(Debug, Serialize, Deserialize)]
pub struct Request {
    pub argv: Vec<String>,
    pub cwd: String,
    pub env: Vec<(String, String)>,
}

/// Runs `request` through the runner at `socket` with this process's standard streams, and
/// returns its exit status (128 + a signal that ended it).
pub fn run(socket: &Path, request: &Request) -> std::io::Result<i32> {
    let mut stream = UnixStream::connect(socket)?;
    let body = serde_json::to_vec(request).map_err(std::io::Error::other)?;
    let len = u32::try_from(body.len())
        .map_err(|_| std::io::Error::other("the request is too large"))?
        .to_le_bytes();
    let fds: [BorrowedFd<'_>; 3] = [
        rustix::stdio::stdin(),
        rustix::stdio::stdout(),
        rustix::stdio::stderr(),
    ];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
    control.push(rustix::net::SendAncillaryMessage::ScmRights(&fds));
    rustix::net::sendmsg(
        &stream,
        &[IoSlice::new(&len)],
        &mut control,
        rustix::net::SendFlags::empty(),
    )?;
    stream.write_all(&body)?;
    let mut status = [0u8; 4];
    stream.read_exact(&mut status)?;
    Ok(i32::from_le_bytes(status))
}

/// Serves pi's shell on `listener` until the runner ends: each command started through `runner
/// job-confine` with `confinement`'s flags, in a thread of its own.
pub fn serve(listener: UnixListener, runner: PathBuf, confinement: crate::confine::Confinement) {
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let runner = runner.clone();
            let confinement = confinement.clone();
            std::thread::spawn(move || {
                let _ = one(stream, &runner, &confinement);
            });
        }
    });
}

/// One command: its request read, started, watched, its status written back.
fn one(
    mut stream: UnixStream,
    runner: &Path,
    confinement: &crate::confine::Confinement,
) -> std::io::Result<()> {
    let mut len = [0u8; 4];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut control = rustix::net::RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        &stream,
        &mut [IoSliceMut::new(&mut len)],
        &mut control,
        rustix::net::RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for message in control.drain() {
        if let rustix::net::RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    if got.bytes != 4 || fds.len() != 3 {
        return Err(std::io::Error::other("a request without its streams"));
    }
    let len = u32::from_le_bytes(len);
    if len > MAX_REQUEST {
        return Err(std::io::Error::other("a request too large"));
    }
    let mut body = vec![0u8; len as usize];
    stream.read_exact(&mut body)?;
    let request: Request = serde_json::from_slice(&body).map_err(std::io::Error::other)?;
    let Some((program, args)) = request.argv.split_first() else {
        return Err(std::io::Error::other("a request without a program"));
    };
    let line = confinement.command_line(
        &program.into(),
        &args.iter().map(Into::into).collect::<Vec<_>>(),
    );
    let mut fds = fds.into_iter();
    let (Some(stdin), Some(stdout), Some(stderr)) = (fds.next(), fds.next(), fds.next()) else {
        return Err(std::io::Error::other("a request without its streams"));
    };
    let mut command = std::process::Command::new(runner);
    command
        .args(line)
        .env_clear()
        .envs(request.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&request.cwd)
        .stdin(stdin)
        .stdout(stdout)
        .stderr(stderr);
    let mut child = spawn::retry_busy(|| command.spawn())?;
    drop(command);
    // The shell's connection closing (pi ended it) ends the command with everything it started:
    // the confinement's first process is killed through a pidfd, never a reused pid.
    let pid = rustix::process::Pid::from_raw(i32::try_from(child.id()).unwrap_or(0));
    let pidfd =
        pid.and_then(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok());
    if let (Some(pidfd), Ok(mut watch)) = (pidfd, stream.try_clone()) {
        std::thread::spawn(move || {
            let mut byte = [0u8; 1];
            let _ = watch.read(&mut byte);
            let _ = rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL);
        });
    }
    let status = child.wait()?;
    let code = {
        use std::os::unix::process::ExitStatusExt as _;
        match (status.code(), status.signal()) {
            (Some(c), _) => c,
            (None, Some(sig)) => 128 + sig,
            _ => 1,
        }
    };
    stream.write_all(&code.to_le_bytes())?;
    let _ = stream.shutdown(std::net::Shutdown::Write);
    Ok(())
}
