//! What a job could leave on the host once the workers have settled: processes (by the pool's ids
//! or the deployment's path), mounts and loop devices under the deployment, control groups of the
//! pool's ids, ids whose lock is still held, and folders of jobs.

use std::path::Path;

/// Everything found; empty when nothing is left.
#[derive(Debug, Default)]
pub struct Leftovers {
    pub processes: Vec<String>,
    pub mounts: Vec<String>,
    pub loop_devices: Vec<String>,
    pub cgroups: Vec<String>,
    pub pool_ids: Vec<u32>,
    pub folders: Vec<String>,
}

impl Leftovers {
    pub fn is_empty(&self) -> bool {
        self.processes.is_empty()
            && self.mounts.is_empty()
            && self.loop_devices.is_empty()
            && self.cgroups.is_empty()
            && self.pool_ids.is_empty()
            && self.folders.is_empty()
    }

    /// One line: how many of each.
    pub fn summary(&self) -> String {
        format!(
            "processes {}, mounts {}, loop devices {}, cgroups {}, pool ids held {}, folders {}",
            self.processes.len(),
            self.mounts.len(),
            self.loop_devices.len(),
            self.cgroups.len(),
            self.pool_ids.len(),
            self.folders.len()
        )
    }
}

/// Looks for what the deployment at `dir` (its state a file system of its own at `state`, which
/// is not a leftover) and the pool `uids` left; `ids` are the soak's jobs.
pub fn find(dir: &Path, state: &Path, uids: (u32, u32), ids: &[String]) -> Leftovers {
    Leftovers {
        processes: processes(dir, uids),
        mounts: mounts(dir, state),
        loop_devices: loop_devices(dir),
        cgroups: cgroups(uids),
        pool_ids: held_ids(uids),
        folders: folders(state, ids),
    }
}

fn processes(dir: &Path, (first, last): (u32, u32)) -> Vec<String> {
    let me = std::process::id().to_string();
    let path = dir.display().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().filter_map(Result::ok) {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) || pid == me {
            continue;
        }
        let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let pool = (first..=last).any(|id| sandbox::identity::status_uses(&status, id));
        // A zombie has no command line and holds nothing.
        if pool || (cmdline.contains(&path) && !status.contains("State:\tZ")) {
            found.push(format!("{pid}: {}", cmdline.trim()));
        }
    }
    found
}

fn mounts(dir: &Path, state: &Path) -> Vec<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    text.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|point| Path::new(point).starts_with(dir) && Path::new(point) != state)
        .map(str::to_owned)
        .collect()
}

fn loop_devices(dir: &Path) -> Vec<String> {
    let path = dir.display().to_string();
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let backing = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
            backing
                .contains(&path)
                .then(|| format!("{}: {}", e.file_name().to_string_lossy(), backing.trim()))
        })
        .collect()
}

fn cgroups((first, last): (u32, u32)) -> Vec<String> {
    let names: Vec<String> = (first..=last).map(sandbox::cgroup::group_name).collect();
    let mut found = Vec::new();
    let mut stack = vec![(std::path::PathBuf::from("/sys/fs/cgroup"), 0)];
    while let Some((dir, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.filter_map(Result::ok) {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if names.iter().any(|n| e.file_name() == n.as_str()) {
                found.push(e.path().display().to_string());
            } else if depth < 8 {
                stack.push((e.path(), depth + 1));
            }
        }
    }
    found
}

/// The pool's ids whose lock someone still holds.
fn held_ids((first, last): (u32, u32)) -> Vec<u32> {
    let dir = Path::new(sandbox::identity::LOCK_DIR);
    (first..=last)
        .filter(|id| {
            let lock = dir.join(format!("{id}.lock"));
            lock.exists() && sandbox::identity::try_lock(&lock).is_ok_and(|l| l.is_none())
        })
        .collect()
}

/// What a job's folder holds but its transcript (which is kept: everything else goes once the
/// job is settled), the workers' disks, and anything in `/tmp` named after a job.
fn folders(state: &Path, ids: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    let list = |dir: &Path| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(dir)
            .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    for job in list(&state.join("jobs")) {
        let inside = list(&job);
        if !job.is_dir() {
            found.push(job.display().to_string());
        }
        found.extend(
            inside
                .iter()
                .filter(|p| !p.ends_with("transcript.jsonl"))
                .map(|p| p.display().to_string()),
        );
    }
    found.extend(
        list(&state.join("disks"))
            .iter()
            .map(|p| p.display().to_string()),
    );
    if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
        for e in entries.filter_map(Result::ok) {
            let name = e.file_name().to_string_lossy().into_owned();
            if ids.iter().any(|id| name.contains(id.as_str())) {
                found.push(e.path().display().to_string());
            }
        }
    }
    found
}
