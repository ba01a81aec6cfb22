//! Inside a job: each process the runner starts (pi, every stdio MCP server) gets pid, mount and
//! ipc namespaces of its own, so that it cannot see, trace or signal the runner, the hub, the
//! other servers or pi, and a `/proc` that shows only its own processes.
//!
//! Three processes make one confinement (`pi-dispatch job-confine`):
//!
//! - the *outer* one, in the runner's namespaces, makes the new namespaces (its children are
//!   born in them), starts the init, waits for it and exits as it did: it is what the runner
//!   holds, kills and waits for;
//! - the *init*, process 1 of the new pid namespace, makes the mounts private, mounts a `/proc`
//!   of the namespace (and, for a server, a `/tmp` of its own), limits user namespaces to none
//!   for the whole job, gives up every capability, installs the confined system-call filter
//!   (`crate::syscalls`), starts the program and reaps what is orphaned
//!   until the program ends; when it exits, the kernel ends everything left in the namespace;
//! - the program.
//!
//! The runner holds the capabilities this takes (`sandbox::bwrap::NESTED_CAPS`) in the job's
//! user namespace only. pi alone keeps one of them, `CAP_WAKE_ALARM`, which grants nothing outside
//! the host's first user namespace: the kernel lets a process trace another of the same user, or
//! read its `/proc/PID/environ`, `mem` and `fd`, only when it holds every capability the other
//! holds, so pi's tools (which give it up, see [`drop_all`]) cannot reach into pi.

use std::ffi::OsString;
use std::process::{Command, ExitCode};

use rustix::mount::{MountFlags, MountPropagationFlags};
use rustix::process::{Signal, WaitOptions, WaitStatus};
use rustix::thread::{CapabilitySet, CapabilitySets};

/// What a confinement keeps and hides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Confinement {
    /// Keep `CAP_WAKE_ALARM` (pi): processes without it cannot trace the program or read its
    /// memory or environment.
    pub keep_marker: bool,
    /// An empty `/tmp` of its own (a stdio server: pi's agent folder and files stay out of its
    /// sight).
    pub private_tmp: bool,
    /// Folders bound onto themselves for the program and everything it starts: a mount point,
    /// which no process of the job can rename, remove or unmount, so that its path keeps naming it
    /// (pi's agent folder and the folders above it in `/tmp`). Bound first, in order.
    pub pinned: Vec<std::path::PathBuf>,
    /// Folders and files made read-only for the program and everything it starts (pi: what it runs
    /// and reads as its configuration, so that nothing its tools write is run by pi). Each is a
    /// mount point too.
    pub read_only: Vec<std::path::PathBuf>,
}

impl Confinement {
    /// The command-line flags that carry it.
    pub fn flags(&self) -> Vec<OsString> {
        let mut flags = Vec::new();
        if self.keep_marker {
            flags.push("--keep-marker".into());
        }
        if self.private_tmp {
            flags.push("--private-tmp".into());
        }
        for folder in &self.pinned {
            flags.push("--pin".into());
            flags.push(folder.clone().into_os_string());
        }
        for folder in &self.read_only {
            flags.push("--read-only".into());
            flags.push(folder.clone().into_os_string());
        }
        flags
    }

    /// The arguments after `pi-dispatch` that run `program` confined.
    pub fn command_line(&self, program: &OsString, args: &[OsString]) -> Vec<OsString> {
        let mut line: Vec<OsString> = vec!["job-confine".into()];
        line.extend(self.flags());
        line.push("--".into());
        line.push(program.clone());
        line.extend(args.iter().cloned());
        line
    }
}

/// A step that failed, named for the message (never a value).
#[derive(Debug, thiserror::Error)]
#[error("the job's confinement failed: {step} ({source})")]
pub struct ConfineError {
    step: &'static str,
    source: std::io::Error,
}

fn step<T>(step: &'static str, r: rustix::io::Result<T>) -> Result<T, ConfineError> {
    r.map_err(|e| ConfineError {
        step,
        source: e.into(),
    })
}

/// The exit status a shell would give for `status`.
fn code_of(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(255),
        _ => 1,
    }
}

/// The outer process: new namespaces for its children, the init started in them with the same
/// flags, and its exit status passed on.
pub fn outer(c: &Confinement, program: &OsString, args: &[OsString]) -> Result<u8, ConfineError> {
    use rustix::thread::UnshareFlags;
    // `unshare` is only unsafe with `FILES`, which is not asked for; this process has one thread.
    #[allow(deprecated)]
    let made =
        rustix::thread::unshare(UnshareFlags::NEWPID | UnshareFlags::NEWNS | UnshareFlags::NEWIPC);
    step("new namespaces", made)?;
    // This very program, by the kernel's own link to it: its path as `current_exe` reads it back
    // can be one that does not resolve (a program on a container's volume).
    let mut init = Command::new("/proc/self/exe");
    init.arg("job-confine")
        .arg("--init")
        .args(c.flags())
        .arg("--")
        .arg(program)
        .args(args);
    let status = init.status().map_err(|e| ConfineError {
        step: "the init",
        source: e,
    })?;
    Ok(code_of(status))
}

/// The init, process 1 of the new pid namespace: the mounts, the limit, the capabilities, then the
/// program, reaping until it ends.
pub fn init(c: &Confinement, program: &OsString, args: &[OsString]) -> Result<u8, ConfineError> {
    // Its parent (the outer process) ending ends it, and so the namespace.
    step(
        "parent death signal",
        rustix::process::set_parent_process_death_signal(Some(Signal::KILL)),
    )?;
    own_mounts(c)?;
    // No user namespace for anyone in the job from now on: one would give back capabilities.
    std::fs::write("/proc/sys/user/max_user_namespaces", "0\n").map_err(|e| ConfineError {
        step: "the limit on user namespaces",
        source: e,
    })?;
    give_up_capabilities(c.keep_marker)?;
    // What the program may not call: no namespace and no mount from now on, besides what the
    // runner refuses every process of the job.
    crate::syscalls::install(crate::syscalls::Filter::Confined).map_err(|e| ConfineError {
        step: "the system-call filter",
        source: std::io::Error::other(e),
    })?;
    // No process of the namespace may trace its first process (a stopped one would hold the
    // program's end, and the job, for ever): it is not dumpable, which only a capability it
    // does not give them overrides.
    step(
        "not dumpable",
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable),
    )?;
    let mut child = Command::new(program);
    child.args(args);
    let child = child.spawn().map_err(|e| ConfineError {
        step: "the program",
        source: e,
    })?;
    let pid = child.id();
    // Reap everything: the program, and whatever is orphaned in the namespace.
    loop {
        match rustix::process::wait(WaitOptions::empty()) {
            Ok(Some((p, status))) if p.as_raw_nonzero().get().unsigned_abs() == pid => {
                return Ok(wait_code(status));
            }
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return step("waiting", Err(e)),
        }
    }
}

/// The namespace's own mounts: private, its own `/proc`, a `/tmp` of its own when asked, the
/// pinned folders bound over themselves, and the read-only ones made so.
fn own_mounts(c: &Confinement) -> Result<(), ConfineError> {
    step(
        "private mounts",
        rustix::mount::mount_change(
            "/",
            MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
        ),
    )?;
    let hidden = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
    step(
        "its own /proc",
        rustix::mount::mount("proc", "/proc", "proc", hidden, None),
    )?;
    if c.private_tmp {
        step(
            "its own /tmp",
            rustix::mount::mount(
                "tmpfs",
                "/tmp",
                "tmpfs",
                MountFlags::NOSUID | MountFlags::NODEV,
                c"mode=1777",
            ),
        )?;
    }
    for folder in &c.pinned {
        step(
            "a pinned folder",
            rustix::mount::mount_bind(folder.as_path(), folder.as_path()),
        )?;
    }
    for folder in &c.read_only {
        step(
            "a read-only folder",
            rustix::mount::mount_bind(folder.as_path(), folder.as_path()),
        )?;
        step(
            "a read-only folder",
            rustix::mount::mount_remount(
                folder.as_path(),
                MountFlags::BIND | MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
                c"",
            ),
        )?;
    }
    Ok(())
}

fn wait_code(status: WaitStatus) -> u8 {
    if let Some(code) = status.exit_status() {
        u8::try_from(code).unwrap_or(1)
    } else if let Some(sig) = status.terminating_signal() {
        u8::try_from(128 + sig).unwrap_or(255)
    } else {
        1
    }
}

/// Drops every capability from the bounding set (what an exec could give back), then keeps none,
/// or only the marker (permitted, effective, inheritable and ambient, so that it survives pi's
/// exec), and sets no-new-privileges.
fn give_up_capabilities(keep_marker: bool) -> Result<(), ConfineError> {
    for bit in 0..64u32 {
        let cap = CapabilitySet::from_bits_retain(1u64 << bit);
        match rustix::thread::remove_capability_from_bounding_set(cap) {
            Ok(()) | Err(rustix::io::Errno::INVAL) => {}
            Err(e) => return step("the bounding set", Err(e)),
        }
    }
    let kept = if keep_marker {
        CapabilitySet::WAKE_ALARM
    } else {
        CapabilitySet::empty()
    };
    step(
        "the capabilities",
        rustix::thread::set_capabilities(
            None,
            CapabilitySets {
                effective: kept,
                permitted: kept,
                inheritable: kept,
            },
        ),
    )?;
    if keep_marker {
        step(
            "the marker",
            rustix::thread::configure_capability_in_ambient_set(CapabilitySet::WAKE_ALARM, true),
        )?;
    }
    step("no new privileges", rustix::thread::set_no_new_privs(true))
}

/// What the runner must hold to confine what it starts (bubblewrap's `NESTED_CAPS`).
const NESTED: CapabilitySet = CapabilitySet::SYS_ADMIN
    .union(CapabilitySet::SYS_RESOURCE)
    .union(CapabilitySet::SETPCAP)
    .union(CapabilitySet::WAKE_ALARM);

/// For a runner started without what confining takes (a container job: the engine grants no
/// capability): a user namespace of its own, its uid and gid mapped to themselves (so what the job
/// writes stays its user's), in which it holds exactly what bubblewrap's nested job holds, kept
/// across exec as bubblewrap keeps them. Nothing when it holds them already. Call it while the
/// process has one thread.
pub fn own_user_namespace() -> Result<(), ConfineError> {
    let held = rustix::thread::capabilities(None).map_err(|e| ConfineError {
        step: "its capabilities",
        source: e.into(),
    })?;
    if held.effective.contains(NESTED) {
        return Ok(());
    }
    let uid = rustix::process::getuid().as_raw();
    let gid = rustix::process::getgid().as_raw();
    #[allow(deprecated)]
    let made = rustix::thread::unshare(rustix::thread::UnshareFlags::NEWUSER);
    step("a user namespace of its own", made)?;
    let write = |file: &'static str, text: String| {
        std::fs::write(file, text).map_err(|e| ConfineError {
            step: file,
            source: e,
        })
    };
    write("/proc/self/setgroups", "deny\n".to_owned())?;
    write("/proc/self/uid_map", format!("{uid} {uid} 1\n"))?;
    write("/proc/self/gid_map", format!("{gid} {gid} 1\n"))?;
    for bit in 0..64u32 {
        let cap = CapabilitySet::from_bits_retain(1u64 << bit);
        if NESTED.contains(cap) {
            continue;
        }
        match rustix::thread::remove_capability_from_bounding_set(cap) {
            Ok(()) | Err(rustix::io::Errno::INVAL) => {}
            Err(e) => return step("the bounding set", Err(e)),
        }
    }
    step(
        "the capabilities",
        rustix::thread::set_capabilities(
            None,
            CapabilitySets {
                effective: NESTED,
                permitted: NESTED,
                inheritable: NESTED,
            },
        ),
    )?;
    for cap in [
        CapabilitySet::SYS_ADMIN,
        CapabilitySet::SYS_RESOURCE,
        CapabilitySet::SETPCAP,
        CapabilitySet::WAKE_ALARM,
    ] {
        step(
            "the capabilities kept across exec",
            rustix::thread::configure_capability_in_ambient_set(cap, true),
        )?;
    }
    Ok(())
}

/// Gives up every capability this process holds (a process may always lower its own), so that
/// nothing it starts can reach into pi: pi's shell does this before it runs a tool's command.
pub fn drop_all() -> Result<(), ConfineError> {
    step(
        "the capabilities",
        rustix::thread::set_capabilities(
            None,
            CapabilitySets {
                effective: CapabilitySet::empty(),
                permitted: CapabilitySet::empty(),
                inheritable: CapabilitySet::empty(),
            },
        ),
    )?;
    step("no new privileges", rustix::thread::set_no_new_privs(true))
}

/// An exit code for a confinement that could not be made: the message on stderr names the step.
pub fn failed(e: &ConfineError) -> ExitCode {
    eprintln!("pi-dispatch: {e}");
    ExitCode::from(125)
}
