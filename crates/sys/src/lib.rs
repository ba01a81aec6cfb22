//! `mount_setattr(2)` with `MOUNT_ATTR_IDMAP`: a detached mount (from `open_tree` with
//! `OPEN_TREE_CLONE`) given the id mapping of a user namespace, plus `nosuid` and `nodev`. rustix
//! has `open_tree` and `move_mount` but not this call, so it is made here, the one `unsafe` block
//! of the workspace.
//!
//! On the job's path: under the sandbox: the job's idmapped workspace.

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
            libc::AT_EMPTY_PATH,
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
