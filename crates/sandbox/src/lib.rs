//! The job's sandbox, and what goes into it.
//!
//! - [`secrets`]: a trigger's `run.secrets` resolved on the host by the operator's resolver, before
//!   anything is spent; values held in a type that never prints them.
//! - [`env`]: the job's closed environment, built in a fixed order from its parts (pure).
//! - [`bwrap`]: bubblewrap's arguments for a job (pure), and the job started, limited in time and
//!   killed with its whole process tree.
//! - [`podman`]: the same contract in a Podman (or Docker) container.
//! - [`masked`]: a job's read-only folders as overlays named by descriptor, so its mount table
//!   names no path of the host.
//! - [`outside`]: egress off, a network namespace of the job's own with user-mode networking to
//!   the outside and the host's own addresses refused.
//!
//! `docs/sandbox.md` says what a job gets, for the operator.
//!
//! On the job's path: the walls the worker puts around the runner, and the job's environment that
//! crosses them.

pub mod backend;
pub mod bwrap;
pub mod cgroup;
pub mod disk;
pub mod env;
pub mod identity;
pub mod isolated;
pub mod launcher;
pub mod masked;
pub mod outside;
pub mod podman;
pub mod secrets;

/// A command line as one line of text, for the tests that compare one.
#[cfg(test)]
pub(crate) fn args_text(a: &[std::ffi::OsString]) -> String {
    a.iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}
