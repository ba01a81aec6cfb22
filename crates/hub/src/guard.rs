//! The guard: what ends the job's processes when the runner itself is killed outright (SIGKILL),
//! which no handler inside the runner can see.
//!
//! The runner marks every process it starts with `PI_DISPATCH_RUNNER_PID=<its pid>` (the usage
//! meter's variable, which the runner owns) and starts the guard with a pipe on its standard input.
//! When the pipe closes — the runner ended, however — the guard kills every process still carrying
//! the mark, and exits. Inside the sandbox, the sandbox's own end does the same for everything.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The variable that marks the runner's processes.
pub const MARK: &str = "PI_DISPATCH_RUNNER_PID";

/// A started guard; dropping it closes the pipe, which ends it (after it checks that nothing with
/// the mark is left).
pub struct Guard {
    _child: Child,
}

/// Starts `program job-guard --runner-pid PID` in its own process group (so that nothing aimed at
/// the runner's group reaches it), its standard input a pipe the runner keeps open.
pub fn start(program: &Path, runner_pid: u32) -> std::io::Result<Guard> {
    use std::os::unix::process::CommandExt;
    let child = Command::new(program)
        .args(["job-guard", "--runner-pid", &runner_pid.to_string()])
        // It needs nothing of the job's: none of its variables, no credential.
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()?;
    Ok(Guard { _child: child })
}

/// The guard's own work: wait until standard input closes, then kill every process marked with
/// `runner_pid`, a few times over (a dying process may have started another), for at most a second.
pub fn watch(runner_pid: u32) {
    let mut sink = [0u8; 64];
    let mut stdin = std::io::stdin().lock();
    while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let marked = marked_processes(runner_pid);
        if marked.is_empty() || Instant::now() > deadline {
            return;
        }
        for pid in marked {
            spawn::signal::process(pid, spawn::signal::End::Kill);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The processes (other than this one) whose environment carries `MARK=runner_pid`.
pub fn marked_processes(runner_pid: u32) -> Vec<u32> {
    let needle = format!("{MARK}={runner_pid}\0");
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| String::from_utf8_lossy(&env).contains(&needle))
        })
        .collect()
}
