//! The proxy as a process: a control socket in a folder of the worker's user, one proxy for every
//! worker of the deployment on this host (a lock beside the socket keeps it to one), its jobs'
//! sockets closed when it stops.

use std::io;
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

use crate::control;
use crate::dns::Resolver;
use crate::files::RuleFiles;
use crate::proxy::{Limits, Proxy};

/// What the process needs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The folder of the control socket (made 0700 if missing).
    pub dir: PathBuf,
    pub files: RuleFiles,
    pub resolver: Resolver,
    pub limits: Limits,
}

/// Why the proxy cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("another egress proxy already serves this folder")]
    Running,
    #[error("the egress proxy's folder cannot be prepared: {0}")]
    Folder(io::ErrorKind),
    #[error("the control socket cannot be made: {0}")]
    Socket(io::ErrorKind),
}

/// A started proxy: its control socket is answering once this exists.
pub struct Started {
    pub proxy: Proxy,
    pub socket: PathBuf,
    /// The service's lock file, held (flock) while the proxy runs.
    _lock: std::fs::File,
    control: tokio::task::JoinHandle<()>,
}

impl Started {
    /// Stops answering and closes every job's socket.
    pub fn stop(self) {
        self.control.abort();
        self.proxy.close_all();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Prepares the folder, takes the lock and binds the control socket.
pub fn start(options: Options) -> Result<Started, StartError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let dir = &options.dir;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| StartError::Folder(e.kind()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| StartError::Folder(e.kind()))?;
    let lock = lock(&dir.join("proxy.lock"))?;
    let socket = dir.join(control::SOCKET);
    // The lock is ours, so a socket left here is a dead proxy's.
    match std::fs::remove_file(&socket) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(StartError::Socket(e.kind())),
    }
    let listener = UnixListener::bind(&socket).map_err(|e| StartError::Socket(e.kind()))?;
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| StartError::Socket(e.kind()))?;
    raise_open_files(&options.limits);
    let proxy = Proxy::new(options.files, options.resolver, options.limits);
    let control = tokio::spawn(control::serve(proxy.clone(), listener));
    tracing::info!(event = "egress_proxy_started", pid = std::process::id());
    Ok(Started {
        proxy,
        socket,
        _lock: lock,
        control,
    })
}

fn lock(path: &Path) -> Result<std::fs::File, StartError> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| StartError::Folder(e.kind()))?;
    rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive)
        .map_err(|_| StartError::Running)?;
    Ok(file)
}

/// Raises the soft limit of open files to the hard one. A tunnel holds two and a lookup one more:
/// at the soft limit a service gets by default (1024) the proxy would fail near 500 tunnels, far
/// below its total. Says so when even the hard limit is short of the total.
fn raise_open_files(limits: &Limits) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let Rlimit {
        current: Some(soft),
        maximum,
    } = getrlimit(Resource::Nofile)
    else {
        return; // no soft limit at all
    };
    let hard = maximum.unwrap_or(u64::MAX);
    let raised = Rlimit {
        current: maximum,
        maximum,
    };
    let now = if soft < hard && setrlimit(Resource::Nofile, raised).is_ok() {
        hard
    } else {
        soft
    };
    let needed = u64::try_from(limits.total)
        .unwrap_or(u64::MAX)
        .saturating_mul(3)
        .saturating_add(64);
    if now < needed {
        tracing::warn!(
            event = "egress_open_files_short",
            limit = now,
            needed,
            "the open-files limit is below what the proxy's total of connections needs"
        );
    }
}
