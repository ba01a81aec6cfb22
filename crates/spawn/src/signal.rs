//! Ending processes: the one way pi-dispatch signals a process or a whole process group.

use rustix::process::{Pid, Signal, kill_process, kill_process_group};

/// The signals pi-dispatch sends to end a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// SIGTERM: asked to stop.
    Term,
    /// SIGKILL: stopped.
    Kill,
}

impl End {
    fn signal(self) -> Signal {
        match self {
            End::Term => Signal::TERM,
            End::Kill => Signal::KILL,
        }
    }
}

fn pid(id: u32) -> Option<Pid> {
    Pid::from_raw(i32::try_from(id).ok()?)
}

/// Sends `end` to every process of the group `pgid` (its leader's pid); false when the group has
/// no process left (or `pgid` cannot be one).
pub fn group(pgid: u32, end: End) -> bool {
    pid(pgid).is_some_and(|p| kill_process_group(p, end.signal()).is_ok())
}

/// Sends `end` to the process `id`; false when it is gone (or `id` cannot be one).
pub fn process(id: u32, end: End) -> bool {
    pid(id).is_some_and(|p| kill_process(p, end.signal()).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt as _;

    #[test]
    fn a_group_is_ended_whole_and_then_is_gone() {
        let mut leader = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & sleep 30"])
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = leader.id();
        assert!(group(pgid, End::Kill));
        leader.wait().unwrap();
        // The leader is reaped; its child, killed with it, leaves the group empty once init
        // reaps it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while group(pgid, End::Kill) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!group(pgid, End::Kill));
        // 0 would be this process's own group to kill(2): never sent.
        assert!(!process(0, End::Term));
        assert!(!group(u32::MAX, End::Kill));
    }
}
