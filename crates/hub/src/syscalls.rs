//! Inside a job: the system calls no process of the job may make, as seccomp filters built with
//! seccompiler (no hand-written BPF). Two filters, stacked:
//!
//! - the runner's, installed by the runner as it starts, before anything of the job runs, and so
//!   inherited by every process of the job: what container engines refuse by default and nothing
//!   of a job needs (io_uring, the kernel's keyrings, bpf, perf events, userfaultfd, tracing and
//!   reading other processes' memory, kernel modules, kexec, the clock, swap, reboot, accounting,
//!   quotas, file handles, I/O ports, fanotify);
//! - the confined one, added by each confinement's init (`job-confine`) once it made its
//!   namespaces and mounts, before it starts pi, a stdio server or a tool's command: no
//!   namespaces (`unshare`, `setns`, a `clone` asking for one; `clone3`, whose flags a filter
//!   cannot read, answers "not implemented" so the C library falls back to `clone`), no mounts,
//!   no `chroot` or `pivot_root`.
//!
//! A refused call fails with `EPERM` (`ENOSYS` for `clone3`), as under a container engine; the
//! process goes on. The runner keeps namespaces and mounts because it confines what it starts.

/// The calls refused to every process of the job, the runner included.
const EVERY_PROCESS: &[i64] = &[
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_keyctl,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_kcmp,
    libc::SYS_pidfd_getfd,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_acct,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_syslog,
    libc::SYS_lookup_dcookie,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_quotactl,
    libc::SYS_uselib,
    libc::SYS_ustat,
    libc::SYS_sysfs,
    libc::SYS_iopl,
    libc::SYS_ioperm,
    libc::SYS_fanotify_init,
    libc::SYS_move_pages,
    libc::SYS_vhangup,
];

/// The calls refused besides to what a confinement starts (pi, the servers, the tools' commands).
const CONFINED: &[i64] = &[
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
];

/// The `clone` flags that make a namespace.
const NEW_NAMESPACES: [u64; 7] = [
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWCGROUP as u64,
];

/// Which of the two filters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// The runner's: every process of the job.
    Runner,
    /// What a confinement adds for what it starts, over the runner's.
    Confined,
}

/// Why a filter could not be installed.
#[derive(Debug, thiserror::Error)]
#[error("the system-call filter: {0}")]
pub struct FilterError(String);

fn arch() -> Result<seccompiler::TargetArch, FilterError> {
    std::env::consts::ARCH
        .try_into()
        .map_err(|e| FilterError(format!("{e:?}")))
}

/// A filter that answers `errno` to each call of `calls` (with `rules` for those that have some:
/// any rule matching) and lets everything else through.
fn denying(
    calls: &[i64],
    rules: Vec<(i64, Vec<seccompiler::SeccompRule>)>,
    errno: i32,
) -> Result<seccompiler::BpfProgram, FilterError> {
    let mut map: std::collections::BTreeMap<i64, Vec<seccompiler::SeccompRule>> =
        calls.iter().map(|c| (*c, Vec::new())).collect();
    map.extend(rules);
    let filter = seccompiler::SeccompFilter::new(
        map,
        seccompiler::SeccompAction::Allow,
        seccompiler::SeccompAction::Errno(errno.unsigned_abs()),
        arch()?,
    )
    .map_err(|e| FilterError(e.to_string()))?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| FilterError(e.to_string()))
}

/// A `clone` that asks for any namespace.
fn clone_with_a_namespace() -> Result<Vec<seccompiler::SeccompRule>, FilterError> {
    use seccompiler::{SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompRule};
    NEW_NAMESPACES
        .iter()
        .map(|flag| {
            let flags = SeccompCondition::new(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(*flag),
                *flag,
            )
            .map_err(|e| FilterError(e.to_string()))?;
            SeccompRule::new(vec![flags]).map_err(|e| FilterError(e.to_string()))
        })
        .collect()
}

/// The programs of `filter`, in the order they are installed. A confinement runs under the
/// runner's filter already, so its own adds only what it refuses besides.
pub fn programs(filter: Filter) -> Result<Vec<seccompiler::BpfProgram>, FilterError> {
    match filter {
        Filter::Runner => Ok(vec![denying(EVERY_PROCESS, Vec::new(), libc::EPERM)?]),
        Filter::Confined => {
            let clone = vec![(libc::SYS_clone, clone_with_a_namespace()?)];
            Ok(vec![
                denying(CONFINED, clone, libc::EPERM)?,
                denying(&[libc::SYS_clone3], Vec::new(), libc::ENOSYS)?,
            ])
        }
    }
}

/// Installs `filter` on every thread of this process and whatever it starts from now on (the
/// process may make no new privileges from then on either, which bubblewrap set already).
pub fn install(filter: Filter) -> Result<(), FilterError> {
    for program in programs(filter)? {
        seccompiler::apply_filter_all_threads(&program).map_err(|e| FilterError(e.to_string()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_filters_compile_for_this_machine() {
        assert_eq!(programs(Filter::Runner).unwrap().len(), 1);
        let confined = programs(Filter::Confined).unwrap();
        assert_eq!(confined.len(), 2);
        assert!(confined.iter().all(|p| !p.is_empty()));
    }

    /// A process that installs a filter, makes the calls, and says how each went (the test's
    /// own process keeps no filter): each refused call is refused, and the control is not.
    #[test]
    fn a_filtered_process_is_refused_what_the_filter_names_and_nothing_else() {
        let Ok(exe) = std::env::current_exe() else {
            return;
        };
        if std::env::var_os("PI_DISPATCH_SYSCALLS_CHILD").is_some() {
            return;
        }
        let out = std::process::Command::new(exe)
            .args([
                "--exact",
                "syscalls::tests::child_probe",
                "--nocapture",
                "--ignored",
            ])
            .env("PI_DISPATCH_SYSCALLS_CHILD", "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("probe: getpid ok"), "{text}");
        assert!(text.contains("probe: add_key EPERM"), "{text}");
        assert!(text.contains("probe: io_uring_setup EPERM"), "{text}");
        assert!(text.contains("probe: unshare EPERM"), "{text}");
    }

    /// The filtered child (run by the test above only).
    #[test]
    #[ignore = "run by a_filtered_process_is_refused_what_the_filter_names_and_nothing_else"]
    fn child_probe() {
        if std::env::var_os("PI_DISPATCH_SYSCALLS_CHILD").is_none() {
            return;
        }
        install(Filter::Runner).unwrap();
        install(Filter::Confined).unwrap();
        let said = |name: &str, r: rustix::io::Result<()>| match r {
            Ok(()) => println!("probe: {name} ok"),
            Err(rustix::io::Errno::PERM) => println!("probe: {name} EPERM"),
            Err(e) => println!("probe: {name} {e:?}"),
        };
        said("getpid", {
            let _ = rustix::process::getpid();
            Ok(())
        });
        // Made through rustix where it has the call; the rest through the test's own shell-out.
        #[allow(deprecated)]
        let unshared = rustix::thread::unshare(rustix::thread::UnshareFlags::NEWUTS);
        said("unshare", unshared);
        let perl = |code: &str| {
            std::process::Command::new("perl")
                .args(["-e", code])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default()
        };
        // perl's syscall(): add_key("user", "k", "v", 1, KEY_SPEC_PROCESS_KEYRING) and
        // io_uring_setup(8, params); it prints the errno's number.
        let add_key = perl(
            r#"my ($t, $d, $v) = ("user", "k", "v"); syscall(248, $t, $d, $v, 1, -2); print $!+0"#,
        );
        println!(
            "probe: add_key {}",
            if add_key == "1" { "EPERM" } else { &add_key }
        );
        let uring = perl(r#"my $p = "\0" x 120; syscall(425, 8, $p); print $!+0"#);
        println!(
            "probe: io_uring_setup {}",
            if uring == "1" { "EPERM" } else { &uring }
        );
    }
}
