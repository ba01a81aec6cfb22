//! The system calls the workspace makes that rustix does not offer as safe functions, or that run
//! in a child before its program (`pre_exec`, unsafe however they are made), each in one small
//! `unsafe` block here (the workspace forbids unsafe code everywhere else). Each is rustix's where
//! rustix has it; `libc` only for the number of the one it lacks:
//!
//! - `mount_setattr(2)` with `MOUNT_ATTR_IDMAP`: a detached mount (from `open_tree` with
//!   `OPEN_TREE_CLONE`) given the id mapping of a user namespace, plus `nosuid` and `nodev`.
//!   rustix has `open_tree` and `move_mount` but not this call.
//! - `unshare(CLONE_NEWNET)` on a thread, and `setns(2)` into a network namespace in a child
//!   before it runs its program: the network of its own a job with egress off gets; and a mount
//!   namespace of slaves for the child that carries that network out (slirp4netns).
//!
//! On the job's path: under the sandbox: the job's idmapped workspace and its network.

use std::os::fd::{AsRawFd, BorrowedFd};

/// `MOUNT_ATTR_*` from `<linux/mount.h>`.
const MOUNT_ATTR_NOSUID: u64 = 0x0000_0002;
const MOUNT_ATTR_NODEV: u64 = 0x0000_0004;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// `struct mount_attr`, version 0 (its size is what the kernel reads).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Gives the detached mount `tree` the id mapping of the user namespace `userns`, and makes it
/// `nosuid` and `nodev`.
pub fn idmap(tree: BorrowedFd<'_>, userns: BorrowedFd<'_>) -> std::io::Result<()> {
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        attr_clr: 0,
        propagation: 0,
        userns_fd: u64::try_from(userns.as_raw_fd()).map_err(|_| std::io::Error::other("fd"))?,
    };
    let empty = c"";
    #[allow(unsafe_code)]
    // SAFETY: the path is a NUL-terminated string that lives through the call, `attr` is a
    // `struct mount_attr` the kernel only reads, its size is passed, and both descriptors are
    // borrowed open descriptors.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            rustix::fs::AtFlags::EMPTY_PATH.bits() as libc::c_int,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Moves the calling thread (only it) into a new network namespace of its own, with nothing in
/// it but a loopback that is down. Needs `CAP_SYS_ADMIN`.
pub fn unshare_network() -> std::io::Result<()> {
    #[allow(unsafe_code)]
    // SAFETY: `unshare(CLONE_NEWNET)` changes the calling thread's network namespace and nothing
    // else: no descriptor table, memory or other thread is touched (the reason rustix marks
    // `unshare` unsafe is `CLONE_FILES`, which is not passed).
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNET) }?;
    Ok(())
}

/// Makes the child `command` starts join the network namespace open on `fd` (a descriptor of the
/// caller's that must stay open until the child has started) before it runs its program. Needs
/// `CAP_SYS_ADMIN`; a child that cannot join fails to start.
pub fn join_network_on_exec(command: &mut std::process::Command, fd: std::os::fd::RawFd) {
    use std::os::unix::process::CommandExt as _;
    #[allow(unsafe_code)]
    // SAFETY: the closure runs in the forked child before `exec`, where only async-signal-safe
    // calls are allowed: `setns(2)` is a plain system call (rustix makes it directly, its error a
    // number). Nothing is allocated. The descriptor is the caller's, open until the child has
    // started; one that is not open (or not a namespace) fails the start.
    unsafe {
        command.pre_exec(move || {
            let fd = std::os::fd::BorrowedFd::borrow_raw(fd);
            rustix::thread::move_into_link_name_space(
                fd,
                Some(rustix::thread::LinkNameSpaceType::Network),
            )?;
            Ok(())
        });
    }
}

/// Gives the child `command` starts a mount namespace of its own in which every mount of the
/// caller's is a slave: what the child mounts or unmounts there never reaches the caller's (a
/// program that unmounts its copy of the host's tree, as slirp4netns's `--enable-sandbox` does,
/// would otherwise take mounts of the host's with it where they are shared). Needs
/// `CAP_SYS_ADMIN`; a child that cannot have it fails to start.
pub fn own_mounts_on_exec(command: &mut std::process::Command) {
    use std::os::unix::process::CommandExt as _;
    #[allow(unsafe_code)]
    // SAFETY: the closure runs in the forked child before `exec`: `unshare(2)` and `mount(2)` are
    // plain system calls (rustix makes them directly), the path is a static NUL-terminated
    // string, and nothing is allocated. `unshare` is unsafe in rustix for `CLONE_FILES`, which is
    // not passed.
    unsafe {
        command.pre_exec(|| {
            use rustix::mount::MountPropagationFlags;
            rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS)?;
            rustix::mount::mount_change(
                c"/",
                MountPropagationFlags::REC | MountPropagationFlags::DOWNSTREAM,
            )?;
            Ok(())
        });
    }
}
