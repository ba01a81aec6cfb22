//! Starting a program that was written a moment ago.
//!
//! On Linux, `execve` fails with "text file busy" while any process holds the file open for
//! writing. A file this process just wrote and closed can still be open for writing in a child
//! forked by another thread in the instant before that child's `exec` closes it. The window is
//! short, so a start that fails this way is tried again a few times before the failure counts.
//!
//! On the job's path: under the sandbox and the runner: starting programs and ending them.

pub mod signal;

use std::io;
use std::time::Duration;

/// How often a busy program is tried in all.
const TRIES: u32 = 6;

/// Runs `start` until it succeeds, fails for another reason, or the program stayed busy for
/// every try (about 60 ms of waiting in all). Only [`io::ErrorKind::ExecutableFileBusy`] is tried
/// again; any other error is returned at once.
pub fn retry_busy<T>(mut start: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let mut wait = Duration::from_millis(2);
    let mut tries = 1;
    loop {
        match start() {
            Err(e) if e.kind() == io::ErrorKind::ExecutableFileBusy && tries < TRIES => {
                std::thread::sleep(wait);
                wait *= 2;
                tries += 1;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_start_is_tried_again_until_it_succeeds() {
        let mut calls = 0;
        let r = retry_busy(|| {
            calls += 1;
            if calls < 3 {
                Err(io::Error::from(io::ErrorKind::ExecutableFileBusy))
            } else {
                Ok(calls)
            }
        });
        assert_eq!(r.unwrap(), 3);
    }

    #[test]
    fn a_program_busy_every_time_fails_after_the_last_try() {
        let mut calls = 0;
        let r: io::Result<()> = retry_busy(|| {
            calls += 1;
            Err(io::Error::from(io::ErrorKind::ExecutableFileBusy))
        });
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::ExecutableFileBusy);
        assert_eq!(calls, TRIES);
    }

    #[test]
    fn any_other_failure_is_returned_at_once() {
        let mut calls = 0;
        let r: io::Result<()> = retry_busy(|| {
            calls += 1;
            Err(io::Error::from(io::ErrorKind::NotFound))
        });
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::NotFound);
        assert_eq!(calls, 1);
    }

    /// The real thing: a script is written and closed while another thread keeps forking
    /// children that inherit whatever is open; every start of the script still succeeds.
    #[test]
    fn a_script_written_while_other_threads_fork_starts() {
        use std::os::unix::fs::PermissionsExt;
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let forker = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let _ = std::process::Command::new("/bin/true").status();
                }
            })
        };
        for i in 0..200 {
            let path = dir.path().join(format!("s{i}"));
            std::fs::write(&path, "#!/bin/sh\nexit 0\n").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            let status = retry_busy(|| std::process::Command::new(&path).status()).unwrap();
            assert!(status.success());
        }
        stop.store(true, Ordering::Relaxed);
        forker.join().unwrap();
    }
}
