//! The job under bubblewrap: its arguments (pure), and the job started, limited and ended.
//!
//! The job gets its own user, pid, ipc, uts and mount namespaces (and its own network namespace
//! unless the spec shares the host's), runs as an unprivileged uid and gid (65534 by default) with no
//! capability, sees the host's system directories read-only, `/job`, the overlay and the image
//! read-only, `/workspace` writable, a private `/tmp`, its own `/proc` and `/dev`, and nothing else:
//! the root itself is read-only. It dies with the worker.
//!
//! The environment never appears in a process's arguments: bubblewrap is started with an empty
//! environment and reads `--setenv NAME VALUE` triples from a file descriptor (`--args 3`), so the
//! values live only in bubblewrap's memory and then in the job's own environment.
//!
//! The worker opens every folder the sandbox binds and hands bubblewrap the descriptors. bubblewrap
//! still resolves a descriptor to its path as the user it runs as, so a root worker, whose job's
//! bubblewrap runs as an unprivileged host user, goes through a stage (not the hub's relay): a
//! first bubblewrap, run as root with no capability but changing users, binds the descriptors in
//! a mount namespace of its own (under [`STAGE`]) and starts the job user's bubblewrap there,
//! which then needs no host path above those folders (a deployment under a 0700 folder works).

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io::{self, Seek, Write};
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::{Component, Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use command_fds::{CommandFdExt, FdMapping};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout};

use crate::env::JobEnv;

/// Where bubblewrap is on Debian (package `bubblewrap`).
pub const BWRAP: &str = "/usr/bin/bwrap";
/// The job's folder (prompt, event, `mcp.json`, the runner's input), read-only.
pub const JOB_DIR: &str = protocol::job_dir::JOB_DIR;
/// The repository the job works on, writable.
pub const WORKSPACE: &str = "/workspace";
/// The overlay (`PI_GLOBAL_PI_DIR`), read-only.
pub const OVERLAY: &str = "/opt/pi-global";
/// The job image's folder (Node, pi, the runner), read-only.
pub const IMAGE: &str = protocol::image::MOUNT;
/// Where a job sees its image's own commands, in place of the host's.
pub const IMAGE_COMMANDS: &str = "/usr/local/bin";
/// The job's uid and gid unless the spec says otherwise: the conventional `nobody`.
pub const NOBODY: u32 = 65534;
/// The host directories a job sees read-only, when the host has them.
pub const SYSTEM_DIRS: [&str; 6] = ["/usr", "/etc", "/bin", "/lib", "/lib64", "/sbin"];
/// The descriptor bubblewrap reads the environment from (`--args`).
pub const ARGS_FD: i32 = 3;
/// The descriptor bubblewrap writes the sandbox's first process id to (`--info-fd`).
pub const INFO_FD: i32 = 4;
/// The first descriptor of the folders bubblewrap binds, in their order: the job's folder, the
/// overlay, the image, the workspace, then the extra binds.
pub const FIRST_BIND_FD: i32 = 5;
/// util-linux's `setpriv`, which a stage changes to the host user with.
pub const SETPRIV: &str = "/usr/bin/setpriv";
/// In a stage: where the worker's folders are bound for the program it runs.
pub const STAGE: &str = "/stage";
/// How long ending a job may wait for the sandbox's namespace to empty before it kills bubblewrap.
const END_GRACE: Duration = Duration::from_secs(5);

/// The file that names the host's nameservers.
pub const RESOLV_CONF: &str = "/etc/resolv.conf";

/// A host system directory as the job sees it: bound read-only, or (a merged-`/usr` link such as
/// `/bin -> usr/bin`) made the same link; or the host's resolver configuration, which a job with no
/// network of its own sees empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SystemPath {
    Dir(PathBuf),
    Link {
        path: PathBuf,
        target: PathBuf,
    },
    /// [`RESOLV_CONF`] (or the file it links to) at its place under a bound directory: covered by
    /// an empty file unless the job shares the host's network, so that no nameserver is named
    /// inside (names are resolved by the egress proxy).
    Resolver(PathBuf),
}

/// The [`SYSTEM_DIRS`] this host has, each a directory or a link, and where under them the
/// resolver configuration is, when a job would see it.
pub fn host_system() -> Vec<SystemPath> {
    let mut system: Vec<SystemPath> = SYSTEM_DIRS
        .iter()
        .filter_map(|dir| {
            let path = PathBuf::from(dir);
            let meta = std::fs::symlink_metadata(&path).ok()?;
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).ok()?;
                Some(SystemPath::Link { path, target })
            } else if meta.is_dir() {
                Some(SystemPath::Dir(path))
            } else {
                None
            }
        })
        .collect();
    // A link to a file outside the bound directories (`/run/...`) names nothing inside.
    if let Ok(real) = std::fs::canonicalize(RESOLV_CONF)
        && std::fs::metadata(&real).is_ok_and(|m| m.is_file())
        && system
            .iter()
            .any(|p| matches!(p, SystemPath::Dir(d) if real.starts_with(d)))
    {
        system.push(SystemPath::Resolver(real));
    }
    system
}

/// A further read-only bind: a host path at a place in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    pub host: PathBuf,
    pub sandbox: PathBuf,
}

/// Everything the sandbox is made of, but the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxSpec {
    /// The job's uid and gid inside the sandbox; when the worker is root, also the host user
    /// bubblewrap runs as (see [`host_user`]).
    pub uid: u32,
    pub gid: u32,
    /// The host's system directories ([`host_system`]).
    pub system: Vec<SystemPath>,
    /// Host folders: the job's files, the overlay, the workspace, the image.
    pub job_dir: PathBuf,
    pub overlay_dir: PathBuf,
    pub workspace: PathBuf,
    pub image_dir: PathBuf,
    /// The image's own commands (its `usr/local/bin`, see `protocol::image::COMMANDS`), bound
    /// read-only at [`IMAGE_COMMANDS`] over the host's: the forge servers' wrappers are there.
    pub image_commands: Option<PathBuf>,
    pub extra_ro: Vec<Bind>,
    /// Keep the network bubblewrap starts in: the host's, or with `netns` the one open on that
    /// descriptor of the caller's, which bubblewrap joins before it starts (egress off: the job's
    /// own, see [`crate::outside`]). Otherwise the job has only its own loopback.
    pub share_net: bool,
    pub netns: Option<i32>,
    /// When the worker is root: the host user bubblewrap runs as, if not the job's own uid and gid
    /// (a local job runs as the owner of its folder, so that what it writes is theirs).
    pub host: Option<(u32, u32)>,
    /// What runs inside: a path in the sandbox (or a name looked up in the job's `PATH`).
    pub program: OsString,
    pub args: Vec<OsString>,
    /// The program confines what it starts (the job's runner, `pi-dispatch job --confine`): it
    /// keeps [`NESTED_CAPS`] in the job's own user namespace to give each process it starts pid,
    /// mount and ipc namespaces of its own, and shuts user namespaces itself. The job's uid then
    /// must be the host user bubblewrap runs as (one user namespace, whose mounts the runner may
    /// copy), and bubblewrap's `--disable-userns` (a second namespace) is left out.
    pub nested: bool,
    /// The size of the job's `/tmp`, when bounded.
    pub tmp_bytes: Option<u64>,
    /// A command bubblewrap is started through (the job's limits, `pi-dispatch job-limits ...
    /// --`), which becomes bubblewrap; empty for none.
    pub prefix: Vec<OsString>,
}

/// What a nesting program keeps, in the job's user namespace only: to make namespaces and mount
/// a proc for them, to limit user namespaces to none, to drop the bounding set, and a capability
/// that grants nothing outside the first user namespace (alarms that wake the machine), kept by pi
/// alone so that processes without it cannot trace pi or read its memory or environment.
pub const NESTED_CAPS: [&str; 4] = [
    "CAP_SYS_ADMIN",
    "CAP_SYS_RESOURCE",
    "CAP_SETPCAP",
    "CAP_WAKE_ALARM",
];

/// The host user bubblewrap runs as for a worker running as `euid`/`egid`: a root worker's job
/// runs as `host` (its folder's owner) or `nobody`, any other worker's as the worker itself. Pure.
pub fn runs_as(euid: u32, egid: u32, host: Option<(u32, u32)>) -> (u32, u32) {
    if euid == 0 {
        host.unwrap_or((NOBODY, NOBODY))
    } else {
        (euid, egid)
    }
}

/// A spec that cannot make a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("the {what} folder must be an absolute host path")]
    NotAbsolute { what: &'static str },
    #[error(
        "extra bind {index}: {why}; give an absolute host path and an absolute place in the sandbox, away from the sandbox's own mounts"
    )]
    ExtraBind { index: usize, why: &'static str },
    #[error("the program to run is empty")]
    NoProgram,
}

/// The places the sandbox mounts itself besides [`SYSTEM_DIRS`]; an extra bind may not be one of
/// them, inside one, or hold one.
const OWN_PLACES: [&str; 7] = ["/proc", "/dev", "/tmp", JOB_DIR, WORKSPACE, OVERLAY, IMAGE];

impl SandboxSpec {
    /// Checks what [`args`] takes for granted. Pure.
    pub fn check(&self) -> Result<(), SpecError> {
        for (what, path) in [
            ("job", &self.job_dir),
            ("overlay", &self.overlay_dir),
            ("workspace", &self.workspace),
            ("image", &self.image_dir),
        ] {
            if !path.is_absolute() {
                return Err(SpecError::NotAbsolute { what });
            }
        }
        for (index, bind) in self.extra_ro.iter().enumerate() {
            let why = if !bind.host.is_absolute() {
                Some("the host path is not absolute")
            } else if !is_plain_absolute(&bind.sandbox) {
                Some("the place in the sandbox is not a plain absolute path (no '.' or '..')")
            } else if bind.sandbox == Path::new("/") {
                Some("the place in the sandbox is its root")
            } else if SYSTEM_DIRS.iter().chain(&OWN_PLACES).any(|own| {
                let own = Path::new(own);
                bind.sandbox.starts_with(own) || own.starts_with(&bind.sandbox)
            }) {
                Some("the place in the sandbox is one of its own mounts, inside one, or holds one")
            } else {
                None
            };
            if let Some(why) = why {
                return Err(SpecError::ExtraBind { index, why });
            }
        }
        if self.program.is_empty() {
            return Err(SpecError::NoProgram);
        }
        Ok(())
    }
}

fn is_plain_absolute(path: &Path) -> bool {
    path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

/// Where the job's bubblewrap takes the folders it binds from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sources {
    /// Descriptors the worker opened, numbered from [`FIRST_BIND_FD`] in bind order.
    Fds,
    /// Their places in a stage (`/stage/job`, ...), where the stage bound those descriptors.
    Stage,
}

/// One host path the sandbox binds: what it is (for messages), its host path, its place in a
/// stage and in the sandbox, whether the job may write it, and whether it must be a folder (an
/// extra bind may be a file).
struct Bound<'a> {
    what: String,
    host: &'a Path,
    stage: PathBuf,
    sandbox: &'a OsStr,
    writable: bool,
    folder: bool,
}

/// The host paths `spec` binds, in bind order (that of the descriptors from [`FIRST_BIND_FD`]).
fn bound(spec: &SandboxSpec) -> Vec<Bound<'_>> {
    let own = |what: &str, host, sandbox, writable| Bound {
        what: format!("{what} folder"),
        host,
        stage: Path::new(STAGE).join(what),
        sandbox: OsStr::new(sandbox),
        writable,
        folder: true,
    };
    let mut all = vec![
        own("job", &spec.job_dir, JOB_DIR, false),
        own("overlay", &spec.overlay_dir, OVERLAY, false),
        own("image", &spec.image_dir, IMAGE, false),
        own("workspace", &spec.workspace, WORKSPACE, true),
    ];
    if let Some(commands) = &spec.image_commands {
        all.push(own("commands", commands, IMAGE_COMMANDS, false));
    }
    for (index, bind) in spec.extra_ro.iter().enumerate() {
        all.push(Bound {
            what: format!("host path of extra bind {index}"),
            host: &bind.host,
            stage: Path::new(STAGE).join(format!("extra-{index}")),
            sandbox: bind.sandbox.as_os_str(),
            writable: false,
            folder: false,
        });
    }
    all
}

/// The descriptor of the `index`th folder bound.
fn bind_fd(index: usize) -> i32 {
    FIRST_BIND_FD.saturating_add(i32::try_from(index).unwrap_or(i32::MAX))
}

/// bubblewrap's command line for `spec`, its folders taken from the descriptors the worker opened
/// ([`FIRST_BIND_FD`] on): no value of the environment is in it (that comes on [`ARGS_FD`], see
/// [`env_args`]). Pure.
pub fn args(spec: &SandboxSpec) -> Vec<OsString> {
    job_args(spec, Sources::Fds)
}

/// The same command line for the job's bubblewrap in a stage (see [`stage_args`]): its folders
/// taken from their places under [`STAGE`], and no `--info-fd` (the stage reports its own first
/// process). Pure.
pub fn args_in_stage(spec: &SandboxSpec) -> Vec<OsString> {
    job_args(spec, Sources::Stage)
}

fn job_args(spec: &SandboxSpec, from: Sources) -> Vec<OsString> {
    let mut a: Vec<OsString> = Vec::new();
    let mut push = |items: &[&OsStr]| a.extend(items.iter().map(|s| s.to_os_string()));
    let s = |x: &'static str| OsStr::new(x);
    let uid = OsString::from(spec.uid.to_string());
    let gid = OsString::from(spec.gid.to_string());

    // Namespaces and the user the job runs as.
    push(&[s("--unshare-user"), s("--uid"), &uid, s("--gid"), &gid]);
    push(&[s("--unshare-pid"), s("--unshare-ipc"), s("--unshare-uts")]);
    if !spec.share_net {
        push(&[s("--unshare-net")]);
    }
    // No nested user namespace: the job cannot gain capabilities anywhere. A nesting program
    // shuts them itself, before anything it starts runs.
    if !spec.nested {
        push(&[s("--disable-userns")]);
    }
    push(&[s("--die-with-parent"), s("--new-session")]);
    push(&[s("--cap-drop"), s("ALL")]);
    if spec.nested {
        for cap in NESTED_CAPS {
            push(&[s("--cap-add"), s(cap)]);
        }
    }

    // The system, read-only; merged-/usr links made again as links; with no network of its own,
    // no nameserver named.
    let system = system_args(&spec.system);
    push(&system.iter().map(OsString::as_os_str).collect::<Vec<_>>());
    if let Some(file) = hidden_resolver(spec) {
        let fd = OsString::from(resolver_fd(spec).to_string());
        push(&[s("--ro-bind-data"), &fd, file.as_os_str()]);
    }
    push(&[s("--proc"), s("/proc"), s("--dev"), s("/dev")]);
    if let Some(bytes) = spec.tmp_bytes {
        let bytes = OsString::from(bytes.to_string());
        push(&[s("--size"), &bytes]);
    }
    push(&[s("--perms"), s("1777"), s("--tmpfs"), s("/tmp")]);

    // The job's own folders, then the extra binds.
    for (index, b) in bound(spec).iter().enumerate() {
        match from {
            Sources::Fds => {
                let flag = if b.writable {
                    "--bind-fd"
                } else {
                    "--ro-bind-fd"
                };
                let fd = OsString::from(bind_fd(index).to_string());
                push(&[s(flag), &fd, b.sandbox]);
            }
            Sources::Stage => {
                let flag = if b.writable { "--bind" } else { "--ro-bind" };
                push(&[s(flag), b.stage.as_os_str(), b.sandbox]);
            }
        }
    }
    // The root (a tmpfs holding the mount points) read-only too, once every mount point is made.
    push(&[s("--remount-ro"), s("/")]);
    push(&[s("--chdir"), s(WORKSPACE)]);

    // Through a stage, the stage reports its own first process, whose end ends this sandbox too.
    if from == Sources::Fds {
        let info_fd = OsString::from(INFO_FD.to_string());
        push(&[s("--info-fd"), &info_fd]);
    }
    let args_fd = OsString::from(ARGS_FD.to_string());
    push(&[s("--clearenv"), s("--args"), &args_fd]);
    push(&[s("--"), &spec.program]);
    a.extend(spec.args.iter().cloned());
    a
}

/// The resolver configuration a job sees in place of the host's, if it would see one: a job with
/// no network but its loopback, or in a network of its own, never sees the host's. Pure.
fn hidden_resolver(spec: &SandboxSpec) -> Option<&Path> {
    if spec.share_net && spec.netns.is_none() {
        return None;
    }
    spec.system.iter().find_map(|p| match p {
        SystemPath::Resolver(file) => Some(file.as_path()),
        _ => None,
    })
}

/// What the job's resolver configuration says in its place: nothing, for a job with no network but
/// its loopback; the host's nameservers it can reach, for a job in a network of its own.
fn resolver_content(spec: &SandboxSpec) -> String {
    match spec.netns {
        Some(_) => crate::outside::resolver_conf(),
        None => String::new(),
    }
}

/// The descriptor bubblewrap reads the hidden resolver configuration's (empty) content from: the
/// first after the folders bound.
fn resolver_fd(spec: &SandboxSpec) -> i32 {
    bind_fd(bound(spec).len())
}

/// `--ro-bind DIR DIR` and `--symlink TARGET PATH` for the host's system directories.
pub(crate) fn system_args(system: &[SystemPath]) -> Vec<OsString> {
    let mut a = Vec::new();
    for p in system {
        let (flag, from, to) = match p {
            SystemPath::Dir(dir) => ("--ro-bind", dir.as_os_str(), dir.as_os_str()),
            SystemPath::Link { path, target } => {
                ("--symlink", target.as_os_str(), path.as_os_str())
            }
            SystemPath::Resolver(_) => continue,
        };
        a.extend([OsString::from(flag), from.to_owned(), to.to_owned()]);
    }
    a
}

/// A folder a stage binds from a descriptor: the descriptor's number in the stage's bubblewrap,
/// its place under [`STAGE`], and whether the program may write it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageFolder {
    pub fd: i32,
    pub place: PathBuf,
    pub writable: bool,
}

/// The stage's bubblewrap command line, up to and with `-- setpriv ... --`: the program to run
/// (and its arguments) follow it. The stage runs as root in mount and pid namespaces of its own,
/// with no capability but `CAP_SETUID` and `CAP_SETGID`: the host's system directories read-only,
/// the host's `/proc`, a minimal `/dev`, an empty `/tmp` folder, `folders` bound by descriptor and
/// `files` (host path, place) bound read-only; then `setpriv` becomes `user`, with no supplementary
/// group and so no capability left, and runs the program, which reaches the folders at their places
/// whatever the host's folders above them let that user do. The stage reports its first process on
/// `info_fd`: when that process ends, the kernel ends every process the stage started.
///
/// The pid namespace is what ties the program to the stage: a parent-death signal from root's
/// bubblewrap, which holds no capability, would not reach a process of another user. Pure.
pub fn stage_args(
    system: &[SystemPath],
    user: (u32, u32),
    folders: &[StageFolder],
    files: &[(PathBuf, PathBuf)],
    info_fd: Option<i32>,
) -> Vec<OsString> {
    let mut a: Vec<OsString> = Vec::new();
    let mut push = |items: &[&OsStr]| a.extend(items.iter().map(|s| s.to_os_string()));
    let s = |x: &'static str| OsStr::new(x);
    push(&[s("--unshare-pid"), s("--die-with-parent")]);
    if let Some(fd) = info_fd {
        let fd = OsString::from(fd.to_string());
        push(&[s("--info-fd"), &fd]);
    }
    push(&[s("--cap-drop"), s("ALL")]);
    push(&[
        s("--cap-add"),
        s("CAP_SETUID"),
        s("--cap-add"),
        s("CAP_SETGID"),
    ]);
    let system = system_args(system);
    push(&system.iter().map(OsString::as_os_str).collect::<Vec<_>>());
    // The job user's bubblewrap writes its own uid map in /proc, mounts a proc of its own (which
    // needs a full one in view) and makes its root on /tmp.
    push(&[s("--bind"), s("/proc"), s("/proc"), s("--dev"), s("/dev")]);
    push(&[
        s("--dir"),
        s("/tmp"),
        s("--perms"),
        s("0755"),
        s("--dir"),
        s(STAGE),
    ]);
    for folder in folders {
        let flag = if folder.writable {
            "--bind-fd"
        } else {
            "--ro-bind-fd"
        };
        let fd = OsString::from(folder.fd.to_string());
        push(&[s(flag), &fd, folder.place.as_os_str()]);
    }
    for (host, place) in files {
        push(&[s("--ro-bind"), host.as_os_str(), place.as_os_str()]);
    }
    push(&[s("--remount-ro"), s("/"), s("--chdir"), s("/")]);
    let uid = OsString::from(user.0.to_string());
    let gid = OsString::from(user.1.to_string());
    push(&[s("--"), s(SETPRIV), s("--reuid"), &uid, s("--regid"), &gid]);
    push(&[s("--clear-groups"), s("--")]);
    a
}

/// A folder opened to be bound, by the worker, without following a link at its end.
pub fn open_folder(path: &Path) -> io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(rustix::fs::open(path, flags, Mode::empty())?)
}

/// An extra bind's host path opened to be bound (a folder or a file), without following a link
/// at its end.
fn open_bind(path: &Path) -> io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(rustix::fs::open(path, flags, Mode::empty())?)
}

/// The environment as bubblewrap reads it on [`ARGS_FD`]: `--setenv`, name, value, each ended by
/// a NUL byte. `Debug` never shows it.
pub struct EnvArgs(Vec<u8>);

impl EnvArgs {
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for EnvArgs {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "EnvArgs({} bytes)", self.0.len())
    }
}

/// The job's environment for [`ARGS_FD`]. Pure. ([`JobEnv`] holds no NUL byte and no `=` in a
/// name, so the triples cannot run into each other.)
pub fn env_args(env: &JobEnv) -> EnvArgs {
    let mut out = Vec::new();
    for (name, value) in env.iter() {
        for part in [
            b"--setenv".as_slice(),
            name.as_bytes(),
            value.expose().as_bytes(),
        ] {
            out.extend_from_slice(part);
            out.push(0);
        }
    }
    EnvArgs(out)
}

/// The host user the job's bubblewrap runs as: when the worker is root, the spec's `host` user,
/// else the job's own uid and gid, so that the job is unprivileged on the host too (files it writes
/// are that user's, root's files are not its own), started through a stage; otherwise bubblewrap
/// runs as the worker, and the job's uid maps to the worker's. Pure.
pub fn host_user(worker_euid: u32, spec: &SandboxSpec) -> Option<(u32, u32)> {
    (worker_euid == 0).then_some(spec.host.unwrap_or((spec.uid, spec.gid)))
}

/// Starting a sandbox failed.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("the {what} cannot be opened to be bound in the sandbox ({source})")]
    Open {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("could not start bubblewrap: {0}")]
    Io(#[from] io::Error),
}

/// A running sandbox: bubblewrap, its standard streams (the job's), and the sandbox's first
/// process, whose end ends every process in the sandbox.
pub struct Sandbox {
    child: Child,
    /// A pidfd of the pid namespace's first process, when bubblewrap reported it.
    init: Option<OwnedFd>,
    init_pid: Option<u32>,
}

/// How a job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// bubblewrap's status: the job's exit code, or 128 + a signal that ended the job.
    Exited(ExitStatus),
    /// The time limit was reached, and every process of the sandbox was killed.
    KilledAtLimit,
}

/// Starts `spec` under bubblewrap at `bwrap` with exactly the environment `env`, its standard
/// input, output and error piped to the caller, and no other descriptor.
///
/// bubblewrap dies with the thread that calls this (`--die-with-parent` follows the spawning
/// thread): call it from a thread that outlives the job, such as a runtime's worker thread, not
/// from a short-lived blocking task.
pub async fn spawn(bwrap: &Path, spec: &SandboxSpec, env: &JobEnv) -> Result<Sandbox, SpawnError> {
    spec.check()?;
    // A descriptor the worker inherited without close-on-exec would pass through bubblewrap into
    // the job: every one is marked close-on-exec (the worker's own children never needed them).
    close_fds::set_fds_cloexec_threadsafe(3, &[]);
    let bound = bound(spec);
    let mut mappings = bound_descriptors(spec, &bound)?;
    let env_fd = env_file(&env_args(env))?;
    let (info_read, info_write) = io::pipe()?;

    let mut command = bwrap_command(bwrap, spec, &bound);
    if let Some(fd) = spec.netns {
        // The caller keeps the namespace's descriptor open while the job runs.
        sys::join_network_on_exec(&mut command, fd);
    }
    command
        // bubblewrap itself runs with nothing of the worker's environment (no LD_*, no secret).
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    mappings.push(FdMapping {
        parent_fd: env_fd,
        child_fd: ARGS_FD,
    });
    mappings.push(FdMapping {
        parent_fd: info_write.into(),
        child_fd: INFO_FD,
    });
    command
        .fd_mappings(mappings)
        .map_err(|e| io::Error::other(e.to_string()))?;
    let mut command = tokio::process::Command::from(command);
    command.kill_on_drop(true);
    let child = command.spawn()?;
    // Our copies of the folders, the environment's file and the info pipe's write end close here.
    drop(command);

    let bwrap_pid = child.id();
    let init_pid = read_init_pid(info_read.into()).await;
    let init = init_pid.zip(bwrap_pid).and_then(|(i, b)| open_init(i, b));
    Ok(Sandbox {
        child,
        init_pid: init.as_ref().and(init_pid),
        init,
    })
}

/// The folders and files the sandbox binds, each opened on the host (never followed again by
/// path), at the descriptor bubblewrap takes it from; and, when the host's resolver configuration
/// is hidden, the empty file put in its place.
fn bound_descriptors(spec: &SandboxSpec, bound: &[Bound]) -> Result<Vec<FdMapping>, SpawnError> {
    let mut mappings = Vec::new();
    for (index, b) in bound.iter().enumerate() {
        let opened = if b.folder {
            open_folder(b.host)
        } else {
            open_bind(b.host)
        };
        let folder = opened.map_err(|source| SpawnError::Open {
            what: b.what.clone(),
            source,
        })?;
        mappings.push(FdMapping {
            parent_fd: folder,
            child_fd: bind_fd(index),
        });
    }
    // The content of the resolver configuration, from a memory file (a device such as /dev/null
    // cannot be opened where the job's binds are).
    if hidden_resolver(spec).is_some() {
        mappings.push(FdMapping {
            parent_fd: memory_file("pi-dispatch-resolver", resolver_content(spec).as_bytes())?,
            child_fd: resolver_fd(spec),
        });
    }
    Ok(mappings)
}

/// bubblewrap's command line (after the spec's prefix). As root, the stage binds the folders and
/// starts the job user's bubblewrap (bound at /stage/bwrap), to which it passes the environment's
/// descriptor on; the stage's first process is the sandbox's.
fn bwrap_command(bwrap: &Path, spec: &SandboxSpec, bound: &[Bound]) -> std::process::Command {
    let mut command = match spec.prefix.split_first() {
        Some((program, args)) => {
            let mut c = std::process::Command::new(program);
            c.args(args).arg(bwrap);
            c
        }
        None => std::process::Command::new(bwrap),
    };
    match host_user(rustix::process::geteuid().as_raw(), spec) {
        Some(user) => {
            let folders: Vec<StageFolder> = bound
                .iter()
                .enumerate()
                .map(|(index, b)| StageFolder {
                    fd: bind_fd(index),
                    place: b.stage.clone(),
                    writable: b.writable,
                })
                .collect();
            let inner = Path::new(STAGE).join("bwrap");
            command
                .args(stage_args(
                    &spec.system,
                    user,
                    &folders,
                    &[(bwrap.to_owned(), inner.clone())],
                    Some(INFO_FD),
                ))
                .arg(inner)
                .args(args_in_stage(spec));
        }
        None => {
            command.args(args(spec));
        }
    }
    command
}

/// The environment in an anonymous memory file, at its start, for bubblewrap to read.
fn env_file(env: &EnvArgs) -> io::Result<OwnedFd> {
    memory_file("pi-dispatch-job-env", env.as_bytes())
}

/// `content` in an anonymous memory file, at its start.
fn memory_file(name: &str, content: &[u8]) -> io::Result<OwnedFd> {
    let fd = rustix::fs::memfd_create(name, rustix::fs::MemfdFlags::CLOEXEC)?;
    let mut file = std::fs::File::from(fd);
    file.write_all(content)?;
    file.rewind()?;
    Ok(file.into())
}

/// The sandbox's first process, from bubblewrap's `--info-fd` report (`"child-pid": N`); `None`
/// when bubblewrap ended before reporting it.
async fn read_init_pid(fd: OwnedFd) -> Option<u32> {
    let mut pipe = tokio::net::unix::pipe::Receiver::from_owned_fd(fd).ok()?;
    let mut text = String::new();
    let read = pipe.read_to_string(&mut text);
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .ok()?
        .ok()?;
    parse_child_pid(&text)
}

/// `"child-pid": 1234` in bubblewrap's info. Pure.
pub fn parse_child_pid(info: &str) -> Option<u32> {
    let rest = &info[info.find("\"child-pid\"")? + "\"child-pid\"".len()..];
    let rest = rest.trim_start().strip_prefix(':')?.trim_start();
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// A pidfd of `pid`, kept only when that process is bubblewrap's child (so not a reused pid).
fn open_init(pid: u32, bwrap_pid: u32) -> Option<OwnedFd> {
    let raw = rustix::process::Pid::from_raw(i32::try_from(pid).ok()?)?;
    let fd = rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty()).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let parent = status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))?
        .trim()
        .parse::<u32>()
        .ok()?;
    (parent == bwrap_pid).then_some(fd)
}

impl Sandbox {
    /// The job's standard input (the runner reads its key here), once.
    pub fn stdin(&mut self) -> Option<ChildStdin> {
        self.child.stdin.take()
    }

    pub fn stdout(&mut self) -> Option<ChildStdout> {
        self.child.stdout.take()
    }

    pub fn stderr(&mut self) -> Option<ChildStderr> {
        self.child.stderr.take()
    }

    /// bubblewrap's process id, while it runs.
    pub fn id(&self) -> Option<u32> {
        self.child.id()
    }

    /// The host process id of the sandbox's first process, when bubblewrap reported it.
    pub fn init_pid(&self) -> Option<u32> {
        self.init_pid
    }

    /// Waits for the job to end by itself. When the job's command ends, the sandbox's first
    /// process ends, and with it every process left in the sandbox.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        self.child.wait().await
    }

    /// Waits for the job at most `limit`, then ends it with every process in it.
    pub async fn wait_with_limit(&mut self, limit: Duration) -> io::Result<Ending> {
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(status) => Ok(Ending::Exited(status?)),
            Err(_) => {
                self.kill().await?;
                Ok(Ending::KilledAtLimit)
            }
        }
    }

    /// Ends every process of the sandbox and waits until they are gone.
    ///
    /// Killing the pid namespace's first process makes the kernel kill every other process in it,
    /// and that first process is reaped (and bubblewrap ends) only once they all are; bubblewrap's
    /// process group is killed too when that does not happen within a few seconds, or when the
    /// first process is unknown.
    pub async fn kill(&mut self) -> io::Result<()> {
        if self.child.try_wait()?.is_some() {
            return Ok(());
        }
        if let Some(init) = &self.init {
            let _ = rustix::process::pidfd_send_signal(init, rustix::process::Signal::KILL);
            if tokio::time::timeout(END_GRACE, self.child.wait())
                .await
                .is_ok()
            {
                return Ok(());
            }
        }
        self.kill_group();
        self.child.wait().await.map(|_| ())
    }

    fn kill_group(&mut self) {
        if let Some(pid) = self.child.id() {
            spawn::signal::group(pid, spawn::signal::End::Kill);
        }
        let _ = self.child.start_kill();
    }
}

impl Drop for Sandbox {
    /// A sandbox dropped while it runs is ended: its first process and bubblewrap are killed (the
    /// kernel then ends the rest).
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            if let Some(init) = &self.init {
                let _ = rustix::process::pidfd_send_signal(init, rustix::process::Signal::KILL);
            }
            self.kill_group();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::Secret;

    fn spec() -> SandboxSpec {
        SandboxSpec {
            uid: NOBODY,
            gid: NOBODY,
            system: vec![
                SystemPath::Dir("/usr".into()),
                SystemPath::Dir("/etc".into()),
                SystemPath::Link {
                    path: "/bin".into(),
                    target: "usr/bin".into(),
                },
                SystemPath::Resolver("/etc/resolv.conf".into()),
            ],
            job_dir: "/srv/state/jobs/j1/job".into(),
            overlay_dir: "/srv/pi-global".into(),
            workspace: "/srv/state/jobs/j1/workspace".into(),
            image_dir: "/srv/images/default".into(),
            image_commands: None,
            extra_ro: vec![Bind {
                host: "/srv/cache".into(),
                sandbox: "/opt/cache".into(),
            }],
            share_net: false,
            netns: None,
            host: None,
            program: "/opt/pi-dispatch-image/bin/pi-dispatch".into(),
            args: vec!["job".into(), "--".into(), "pi".into()],
            nested: false,
            tmp_bytes: None,
            prefix: Vec::new(),
        }
    }

    use crate::args_text as text;

    #[test]
    fn the_command_line_of_a_job() {
        assert_eq!(
            text(&args(&spec())),
            "--unshare-user --uid 65534 --gid 65534 --unshare-pid --unshare-ipc --unshare-uts \
             --unshare-net --disable-userns --die-with-parent --new-session --cap-drop ALL \
             --ro-bind /usr /usr --ro-bind /etc /etc --symlink usr/bin /bin \
             --ro-bind-data 10 /etc/resolv.conf \
             --proc /proc --dev /dev --perms 1777 --tmpfs /tmp \
             --ro-bind-fd 5 /job --ro-bind-fd 6 /opt/pi-global --ro-bind-fd 7 /opt/pi-dispatch-image \
             --bind-fd 8 /workspace --ro-bind-fd 9 /opt/cache \
             --remount-ro / --chdir /workspace --info-fd 4 --clearenv --args 3 \
             -- /opt/pi-dispatch-image/bin/pi-dispatch job -- pi"
        );
    }

    #[test]
    fn an_images_own_commands_cover_the_hosts_usr_local_bin() {
        let with = SandboxSpec {
            image_commands: Some("/srv/images/default/usr/local/bin".into()),
            ..spec()
        };
        let a = text(&args(&with));
        assert!(
            a.contains(
                "--ro-bind /usr /usr --ro-bind /etc /etc --symlink usr/bin /bin \
                 --ro-bind-data 11 /etc/resolv.conf"
            ) && a.contains(
                "--bind-fd 8 /workspace --ro-bind-fd 9 /usr/local/bin --ro-bind-fd 10 /opt/cache"
            ),
            "{a}"
        );
        let staged = text(&args_in_stage(&with));
        assert!(
            staged.contains("--ro-bind /stage/commands /usr/local/bin --ro-bind /stage/extra-0"),
            "{staged}"
        );
    }

    #[test]
    fn through_a_stage_the_folders_are_the_stages_places() {
        let a = text(&args_in_stage(&spec()));
        assert!(
            a.contains(
                "--tmpfs /tmp --ro-bind /stage/job /job --ro-bind /stage/overlay /opt/pi-global \
                 --ro-bind /stage/image /opt/pi-dispatch-image --bind /stage/workspace /workspace \
                 --ro-bind /stage/extra-0 /opt/cache --remount-ro / --chdir /workspace \
                 --clearenv --args 3 --"
            ),
            "{a}"
        );
        assert!(!a.contains("/srv"), "{a}");
    }

    #[test]
    fn the_stage_binds_the_descriptors_and_becomes_the_user() {
        let folders = [
            StageFolder {
                fd: 5,
                place: "/stage/job".into(),
                writable: false,
            },
            StageFolder {
                fd: 6,
                place: "/stage/workspace".into(),
                writable: true,
            },
        ];
        let files = [("/usr/bin/bwrap".into(), "/stage/bwrap".into())];
        assert_eq!(
            text(&stage_args(
                &spec().system,
                (1000, 1001),
                &folders,
                &files,
                Some(4)
            )),
            "--unshare-pid --die-with-parent --info-fd 4 --cap-drop ALL \
             --cap-add CAP_SETUID --cap-add CAP_SETGID \
             --ro-bind /usr /usr --ro-bind /etc /etc --symlink usr/bin /bin \
             --bind /proc /proc --dev /dev --dir /tmp --perms 0755 --dir /stage \
             --ro-bind-fd 5 /stage/job --bind-fd 6 /stage/workspace \
             --ro-bind /usr/bin/bwrap /stage/bwrap --remount-ro / --chdir / \
             -- /usr/bin/setpriv --reuid 1000 --regid 1001 --clear-groups --"
        );
    }

    #[test]
    fn a_nested_job_keeps_the_runners_capabilities_and_one_user_namespace() {
        let plain = text(&args(&spec()));
        assert!(
            plain.contains("--disable-userns") && !plain.contains("--cap-add"),
            "{plain}"
        );
        let nested = text(&args(&SandboxSpec {
            nested: true,
            ..spec()
        }));
        assert!(!nested.contains("--disable-userns"), "{nested}");
        assert!(
            nested.contains(
                "--cap-drop ALL --cap-add CAP_SYS_ADMIN --cap-add CAP_SYS_RESOURCE \
                 --cap-add CAP_SETPCAP --cap-add CAP_WAKE_ALARM"
            ),
            "{nested}"
        );
        // The job's uid inside is the host user bubblewrap runs as.
        assert_eq!(runs_as(0, 0, Some((1000, 1001))), (1000, 1001));
        assert_eq!(runs_as(0, 0, None), (NOBODY, NOBODY));
        assert_eq!(runs_as(1234, 4321, Some((1000, 1001))), (1234, 4321));
    }

    #[test]
    fn a_shared_network_keeps_the_host_namespace_and_the_uid_is_the_specs() {
        let a = text(&args(&SandboxSpec {
            share_net: true,
            netns: None,
            uid: 1234,
            gid: 4321,
            ..spec()
        }));
        assert!(!a.contains("--unshare-net"), "{a}");
        // The host's nameservers, as the host has them.
        assert!(!a.contains("resolv.conf"), "{a}");
        assert!(a.contains("--uid 1234 --gid 4321"), "{a}");
        assert!(a.contains("--unshare-pid"), "{a}");
    }

    #[test]
    fn the_environment_goes_on_the_descriptor_never_the_command_line() {
        let secrets = [("DOCS_TOKEN".to_owned(), Secret::new("cnry-9"))];
        let env = crate::env::build(
            &crate::env::Parts {
                secrets: &secrets,
                ..crate::env::Parts::new("j1", "/tmp/home")
            },
            &|_| None,
        )
        .unwrap();
        let payload = env_args(&env);
        assert_eq!(
            payload.as_bytes(),
            b"--setenv\0PI_JOB_ID\0j1\0--setenv\0PI_OFFLINE\x001\0--setenv\0DOCS_TOKEN\0cnry-9\0\
              --setenv\0HOME\0/tmp/home\0"
        );
        assert!(!format!("{payload:?}").contains("cnry"));
        assert!(!text(&args(&spec())).contains("--setenv"));
    }

    #[test]
    fn bubblewrap_runs_as_the_job_user_when_the_worker_is_root() {
        assert_eq!(host_user(0, &spec()), Some((NOBODY, NOBODY)));
        assert_eq!(host_user(1000, &spec()), None);
        let owned = SandboxSpec {
            host: Some((1000, 1001)),
            ..spec()
        };
        assert_eq!(host_user(0, &owned), Some((1000, 1001)));
        assert_eq!(host_user(1000, &owned), None);
    }

    #[test]
    fn a_spec_is_checked() {
        assert_eq!(spec().check(), Ok(()));
        let relative = SandboxSpec {
            workspace: "ws".into(),
            ..spec()
        };
        assert_eq!(
            relative.check(),
            Err(SpecError::NotAbsolute { what: "workspace" })
        );
        for (host, place) in [
            ("rel", "/opt/x"),
            ("/h", "opt/x"),
            ("/h", "/opt/../etc"),
            ("/h", "/"),
            ("/h", "/workspace/sub"),
            ("/h", "/opt"),
            ("/h", "/opt/pi-global"),
            ("/h", "/tmp/x"),
            ("/h", "/usr/local/x"),
        ] {
            let s = SandboxSpec {
                extra_ro: vec![Bind {
                    host: host.into(),
                    sandbox: place.into(),
                }],
                ..spec()
            };
            assert!(
                matches!(s.check(), Err(SpecError::ExtraBind { index: 0, .. })),
                "{host} {place}"
            );
        }
        let no_program = SandboxSpec {
            program: OsString::new(),
            ..spec()
        };
        assert_eq!(no_program.check(), Err(SpecError::NoProgram));
    }

    #[test]
    fn the_first_process_from_bubblewraps_info() {
        let info = "{\n    \"child-pid\": 28819,\n    \"mnt-namespace\": 4026532178\n}\n";
        assert_eq!(parse_child_pid(info), Some(28819));
        assert_eq!(parse_child_pid("{\"child-pid\":7}"), Some(7));
        assert_eq!(parse_child_pid(""), None);
        assert_eq!(parse_child_pid("{\"child-pid\": x}"), None);
    }

    #[test]
    fn the_host_system_is_read_as_dirs_and_links() {
        let system = host_system();
        assert!(system.contains(&SystemPath::Dir("/usr".into())));
        for p in &system {
            match p {
                SystemPath::Dir(p) | SystemPath::Link { path: p, .. } => {
                    assert!(SYSTEM_DIRS.contains(&p.to_str().unwrap()))
                }
                // Only a file a job would see: one under a bound directory.
                SystemPath::Resolver(file) => assert!(
                    system
                        .iter()
                        .any(|d| matches!(d, SystemPath::Dir(d) if file.starts_with(d))),
                    "{file:?}"
                ),
            }
        }
    }
}
