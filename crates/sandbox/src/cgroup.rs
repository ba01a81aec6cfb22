//! A job's bounds, kept by the kernel: each job in control groups of its own, under the worker's,
//! limited in processes (`pids`) and memory (`memory`, which counts what the job's `/tmp` holds),
//! and accounted for CPU time (`cpuacct`, or `cpu` on cgroup v2). The worker reads what the kernel
//! counted (how often a fork was refused at the limit, how many processes the memory limit
//! killed, the CPU time used) and ends a job that reached a limit, with that limit as its reason.
//!
//! Both hierarchies are supported: cgroup v1 (a hierarchy per controller, as these test machines
//! have it) and cgroup v2 under systemd (one hierarchy; the worker's unit needs `Delegate=yes`, and
//! the worker moves itself into a leaf of its own so that its jobs' groups may have controllers).
//! Reading and parsing are pure functions over the files' text; the effects are `mkdir`, writes
//! and `rmdir` in the cgroup file system.

use std::path::{Path, PathBuf};

/// What a job may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Processes and threads at once.
    pub pids: u64,
    /// Memory, with what its `/tmp` holds, in bytes.
    pub memory_bytes: u64,
    /// CPU time of all its processes together, in seconds.
    pub cpu_secs: u64,
}

/// What the kernel counted for a job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Forks refused at the process limit.
    pub pids_refused: u64,
    /// Processes killed at the memory limit.
    pub oom_kills: u64,
    /// CPU time used, in nanoseconds.
    pub cpu_ns: u64,
}

/// The limit a job reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Breach {
    Pids(u64),
    Memory(u64),
    Cpu(u64),
    /// The job's disk ([`crate::disk`]) is full: its size in bytes.
    Disk(u64),
}

/// The limit `usage` shows a job reached, if any: a refused fork, a process killed for memory,
/// or CPU time at its limit. Pure.
pub fn breach(usage: &Usage, limits: &Limits) -> Option<Breach> {
    if usage.oom_kills > 0 {
        Some(Breach::Memory(limits.memory_bytes))
    } else if usage.pids_refused > 0 {
        Some(Breach::Pids(limits.pids))
    } else if usage.cpu_ns >= limits.cpu_secs.saturating_mul(1_000_000_000) {
        Some(Breach::Cpu(limits.cpu_secs))
    } else {
        None
    }
}

/// Which hierarchies there are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hierarchy {
    /// cgroup v1: the worker's own group in the `pids`, `memory` and `cpuacct` hierarchies.
    V1 {
        pids: PathBuf,
        memory: PathBuf,
        cpuacct: Option<PathBuf>,
    },
    /// cgroup v2: the group the worker's jobs' groups are made in.
    V2 { parent: PathBuf },
}

/// `/proc/self/cgroup`: each controller (`""` for v2) with the process's group. Pure.
pub fn parse_proc_cgroup(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if controllers.is_empty() {
            out.push((String::new(), path.to_owned()));
        }
        for c in controllers.split(',').filter(|c| !c.is_empty()) {
            out.push((c.to_owned(), path.to_owned()));
        }
    }
    out
}

/// `/proc/self/mountinfo`: the cgroup file systems, each with its mount point, its root, whether
/// it is v2, and its controllers (v1). Pure.
pub fn parse_mountinfo(text: &str) -> Vec<CgroupMount> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((before, after)) = line.split_once(" - ") else {
            continue;
        };
        let fields: Vec<&str> = before.split(' ').collect();
        let rest: Vec<&str> = after.split(' ').collect();
        let (Some(root), Some(point), Some(kind), Some(options)) =
            (fields.get(3), fields.get(4), rest.first(), rest.get(2))
        else {
            continue;
        };
        let v2 = *kind == "cgroup2";
        if *kind != "cgroup" && !v2 {
            continue;
        }
        out.push(CgroupMount {
            point: PathBuf::from(unescape(point)),
            root: unescape(root),
            v2,
            controllers: options
                .split(',')
                .filter(|o| !v2 && !matches!(*o, "rw" | "ro") && !o.contains('='))
                .map(str::to_owned)
                .collect(),
        });
    }
    out
}

/// Every mount point `/proc/self/mountinfo` lists (its fifth field), unescaped.
pub fn mount_points(mountinfo: &str) -> Vec<std::path::PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|point| std::path::PathBuf::from(unescape(point)))
        .collect()
}

/// mountinfo's octal escapes (`\040` for a space).
fn unescape(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && let Ok(n) = u8::from_str_radix(&text[i + 1..i + 4], 8)
        {
            out.push(n);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A cgroup file system as mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    pub point: PathBuf,
    pub root: String,
    pub v2: bool,
    pub controllers: Vec<String>,
}

/// Where the process's group of `controller` (`""` for v2) is in the file system. Pure.
fn group_dir(
    groups: &[(String, String)],
    mounts: &[CgroupMount],
    controller: &str,
) -> Option<PathBuf> {
    let path = &groups.iter().find(|(c, _)| c == controller)?.1;
    let mount = mounts.iter().find(|m| {
        if controller.is_empty() {
            m.v2
        } else {
            !m.v2 && m.controllers.iter().any(|c| c == controller)
        }
    })?;
    let inside = path
        .strip_prefix(mount.root.trim_end_matches('/'))
        .unwrap_or(path);
    Some(mount.point.join(inside.trim_start_matches('/')))
}

/// The hierarchy the worker makes its jobs' groups in, from `/proc/self/cgroup` and
/// `/proc/self/mountinfo`: v1 when `pids` and `memory` are v1 controllers, else v2 when the
/// worker's v2 group offers `pids` and `memory`. Pure but for reading `cgroup.controllers`
/// through `controllers_of`.
pub fn choose(
    proc_cgroup: &str,
    mountinfo: &str,
    controllers_of: &dyn Fn(&Path) -> Option<String>,
) -> Option<Hierarchy> {
    let groups = parse_proc_cgroup(proc_cgroup);
    let mounts = parse_mountinfo(mountinfo);
    if let (Some(pids), Some(memory)) = (
        group_dir(&groups, &mounts, "pids"),
        group_dir(&groups, &mounts, "memory"),
    ) {
        return Some(Hierarchy::V1 {
            pids,
            memory,
            cpuacct: group_dir(&groups, &mounts, "cpuacct"),
        });
    }
    let parent = group_dir(&groups, &mounts, "")?;
    let offered = controllers_of(&parent)?;
    let words: Vec<&str> = offered.split_whitespace().collect();
    (words.contains(&"pids") && words.contains(&"memory")).then_some(Hierarchy::V2 { parent })
}

/// This host's hierarchy, for the worker's own group; `None` where there is none it can use.
pub fn detect() -> Option<Hierarchy> {
    let proc_cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    choose(&proc_cgroup, &mountinfo, &|dir| {
        std::fs::read_to_string(dir.join("cgroup.controllers")).ok()
    })
}

/// A value of a flat keyed file (`pids.events`, `memory.events`, `memory.oom_control`,
/// `cpu.stat`): the number after `key`. Pure.
pub fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

/// A job's groups: joined by its sandbox's first process and read while it runs. Making and
/// removing a group costs about a millisecond in each hierarchy, so the groups are kept and used
/// again: each belongs to one id of the worker's pool (`pi-dispatch-id-UID`), which only one job
/// runs as at a time. The kernel's counters only grow, so a job's usage is what they gained since
/// it took the groups.
#[derive(Debug)]
pub struct JobCgroup {
    hierarchy: Hierarchy,
    /// The job's group in each hierarchy (one for v2).
    dirs: Vec<PathBuf>,
    /// The counters when the job took the groups.
    baseline: Usage,
}

/// The name of the groups of the jobs that run as pool id `uid`.
pub fn group_name(uid: u32) -> String {
    format!("pi-dispatch-id-{uid}")
}

/// The groups of pool id `uid`: one a controller on v1 (`pids`, `memory`, and `cpuacct` where
/// there is one), one on v2.
fn group_dirs(hierarchy: &Hierarchy, uid: u32) -> Vec<PathBuf> {
    let name = group_name(uid);
    match hierarchy {
        Hierarchy::V1 {
            pids,
            memory,
            cpuacct,
        } => {
            let mut dirs = vec![pids.join(&name), memory.join(&name)];
            if let Some(cpu) = cpuacct {
                dirs.push(cpu.join(&name));
            }
            dirs
        }
        Hierarchy::V2 { parent } => vec![parent.join(&name)],
    }
}

/// Removes the groups of the pool's ids that no job holds (their id's lock in `lock_dir` free;
/// the lock is held while they go, so no job takes the id meanwhile): a worker that stops leaves
/// no group behind. The groups of an id another worker's job holds are left, and so is a group
/// the kernel will not remove (a process still in it).
pub fn remove_idle(hierarchy: &Hierarchy, ids: std::ops::RangeInclusive<u32>, lock_dir: &Path) {
    for uid in ids {
        let dirs = group_dirs(hierarchy, uid);
        if !dirs.iter().any(|d| d.exists()) {
            continue;
        }
        let lock = crate::identity::try_lock(&lock_dir.join(format!("{uid}.lock")));
        if let Ok(Some(_held)) = lock {
            for dir in &dirs {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
}

impl JobCgroup {
    /// Takes the groups of pool id `uid` under the worker's (made the first time), empties them of
    /// anything an earlier job left (its worker killed outright), and sets `limits` in them.
    pub fn take(hierarchy: &Hierarchy, uid: u32, limits: &Limits) -> std::io::Result<JobCgroup> {
        let write = |dir: &Path, file: &str, value: String| std::fs::write(dir.join(file), value);
        if let Hierarchy::V2 { parent } = hierarchy {
            enable_controllers(parent)?;
        }
        let dirs = group_dirs(hierarchy, uid);
        for dir in &dirs {
            match std::fs::create_dir(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => empty(dir),
                Err(e) => return Err(e),
            }
        }
        match hierarchy {
            Hierarchy::V1 { .. } => {
                write(&dirs[0], "pids.max", limits.pids.to_string())?;
                // With swap accounting, swap counts too. The kernel keeps memory+swap's limit at
                // least memory's, so memory+swap is lifted first (an earlier job of the id may
                // have had a smaller limit) and set after.
                let memsw = dirs[1].join("memory.memsw.limit_in_bytes");
                let swap = memsw.exists();
                if swap {
                    std::fs::write(&memsw, "-1")?;
                }
                write(
                    &dirs[1],
                    "memory.limit_in_bytes",
                    limits.memory_bytes.to_string(),
                )?;
                if swap {
                    std::fs::write(&memsw, limits.memory_bytes.to_string())?;
                }
            }
            Hierarchy::V2 { .. } => {
                write(&dirs[0], "pids.max", limits.pids.to_string())?;
                write(&dirs[0], "memory.max", limits.memory_bytes.to_string())?;
                let _ = write(&dirs[0], "memory.swap.max", "0".to_owned());
                // The memory limit kills the whole job, not one process of it.
                let _ = write(&dirs[0], "memory.oom.group", "1".to_owned());
            }
        }
        let mut job = JobCgroup {
            hierarchy: hierarchy.clone(),
            dirs,
            baseline: Usage::default(),
        };
        job.baseline = job.counters();
        Ok(job)
    }

    /// The files a process writes `0` to to join the job's groups: on v1 `tasks`, which moves
    /// only the writing thread (the joining process has one), and so spares the kernel the global
    /// lock a move of a whole process takes, whose first taking after a quiet spell waits for an
    /// RCU grace period (some 10 ms); on v2 `cgroup.procs`.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        let file = match self.hierarchy {
            Hierarchy::V1 { .. } => "tasks",
            Hierarchy::V2 { .. } => "cgroup.procs",
        };
        self.dirs.iter().map(|d| d.join(file)).collect()
    }

    /// What the kernel counted for this job so far.
    pub fn usage(&self) -> Usage {
        let now = self.counters();
        Usage {
            pids_refused: now.pids_refused.saturating_sub(self.baseline.pids_refused),
            oom_kills: now.oom_kills.saturating_sub(self.baseline.oom_kills),
            cpu_ns: now.cpu_ns.saturating_sub(self.baseline.cpu_ns),
        }
    }

    /// The groups' counters as they are.
    fn counters(&self) -> Usage {
        let read =
            |dir: &Path, file: &str| std::fs::read_to_string(dir.join(file)).unwrap_or_default();
        match &self.hierarchy {
            Hierarchy::V1 { .. } => Usage {
                pids_refused: keyed(&read(&self.dirs[0], "pids.events"), "max").unwrap_or(0),
                oom_kills: keyed(&read(&self.dirs[1], "memory.oom_control"), "oom_kill")
                    .unwrap_or(0),
                cpu_ns: self
                    .dirs
                    .get(2)
                    .and_then(|d| read(d, "cpuacct.usage").trim().parse().ok())
                    .unwrap_or(0),
            },
            Hierarchy::V2 { .. } => {
                let dir = &self.dirs[0];
                Usage {
                    pids_refused: keyed(&read(dir, "pids.events"), "max").unwrap_or(0),
                    oom_kills: keyed(&read(dir, "memory.events"), "oom_kill").unwrap_or(0),
                    cpu_ns: keyed(&read(dir, "cpu.stat"), "usage_usec")
                        .unwrap_or(0)
                        .saturating_mul(1000),
                }
            }
        }
    }

    /// Kills every process left in the job's groups.
    pub fn kill(&self) {
        for dir in &self.dirs {
            kill_members(dir);
        }
    }
}

impl Drop for JobCgroup {
    /// Whatever the job left in its groups is killed: the next job of the id finds them empty.
    fn drop(&mut self) {
        self.kill();
    }
}

/// Kills what is in `dir`'s group until it is empty (a moment at most: the killed go at once).
fn empty(dir: &Path) {
    for _ in 0..300 {
        let left = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        if left.trim().is_empty() {
            return;
        }
        kill_members(dir);
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// SIGKILLs every process in `dir`'s group (`cgroup.kill` where the kernel has it).
fn kill_members(dir: &Path) {
    if std::fs::write(dir.join("cgroup.kill"), "1").is_ok() {
        return;
    }
    let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) else {
        return;
    };
    for pid in text.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
        spawn::signal::process(pid, spawn::signal::End::Kill);
    }
}

/// On v2: `pids`, `memory` and `cpu` handed down from `parent` to its groups. A group with
/// processes of its own cannot hand controllers down, so the worker first moves every process of
/// `parent` (itself among them) into a leaf, `pi-dispatch-worker`.
fn enable_controllers(parent: &Path) -> std::io::Result<()> {
    let wanted = "+pids +memory +cpu";
    let control = parent.join("cgroup.subtree_control");
    let have = std::fs::read_to_string(&control).unwrap_or_default();
    if ["pids", "memory"]
        .iter()
        .all(|c| have.split_whitespace().any(|h| h == *c))
    {
        return Ok(());
    }
    if std::fs::write(&control, wanted).is_ok() {
        return Ok(());
    }
    let leaf = parent.join("pi-dispatch-worker");
    if !leaf.exists() {
        std::fs::create_dir(&leaf)?;
    }
    let procs = std::fs::read_to_string(parent.join("cgroup.procs"))?;
    for pid in procs.lines() {
        let _ = std::fs::write(leaf.join("cgroup.procs"), pid);
    }
    std::fs::write(&control, wanted)
}

/// `pi-dispatch job-limits [--join FILE]... [--cpu SECONDS] -- PROGRAM ARGS...` (hidden), which
/// the worker starts each job's sandbox through: joins the job's groups, lowers the core-file
/// limit to zero and the CPU time of each process to the job's, then becomes the program, with
/// its descriptors and environment as they are. Exits 125 when a step fails.
pub fn limits_main(args: &[std::ffi::OsString]) -> std::process::ExitCode {
    use std::os::unix::process::CommandExt as _;
    let mut join: Vec<PathBuf> = Vec::new();
    let mut cpu: Option<u64> = None;
    let mut rest = args.iter();
    let usage = || {
        eprintln!(
            "pi-dispatch: job-limits takes --join FILE, --cpu SECONDS, then -- and a program"
        );
        std::process::ExitCode::from(125)
    };
    while let Some(arg) = rest.next() {
        match arg.to_str() {
            Some("--join") => match rest.next() {
                Some(file) => join.push(file.into()),
                None => return usage(),
            },
            Some("--cpu") => match rest.next().and_then(|v| v.to_str()?.parse().ok()) {
                Some(secs) => cpu = Some(secs),
                None => return usage(),
            },
            Some("--") => break,
            _ => return usage(),
        }
    }
    let rest: Vec<&std::ffi::OsString> = rest.collect();
    let Some((program, program_args)) = rest.split_first() else {
        return usage();
    };
    let failed = |what: &str, e: std::io::Error| {
        eprintln!(
            "pi-dispatch: the job's limits could not be set: {what} ({})",
            e.kind()
        );
        std::process::ExitCode::from(125)
    };
    for file in &join {
        if let Err(e) = std::fs::write(file, "0") {
            return failed("joining its control group", e);
        }
    }
    let set = |resource, value: u64| {
        rustix::process::setrlimit(
            resource,
            rustix::process::Rlimit {
                current: Some(value),
                maximum: Some(value),
            },
        )
    };
    if let Err(e) = set(rustix::process::Resource::Core, 0) {
        return failed("the core-file limit", e.into());
    }
    if let Some(secs) = cpu
        && let Err(e) = set(rustix::process::Resource::Cpu, secs)
    {
        return failed("the CPU time limit", e.into());
    }
    let e = std::process::Command::new(program)
        .args(program_args)
        .exec();
    failed("starting the sandbox", e)
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1_CGROUP: &str =
        "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/ac36\n2:cpuacct:/\n0::/\n";
    const V1_MOUNTS: &str = "\
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn v1_hierarchies_are_found_under_the_workers_own_groups() {
        let h = choose(V1_CGROUP, V1_MOUNTS, &|_| None).unwrap();
        assert_eq!(
            h,
            Hierarchy::V1 {
                pids: "/sys/fs/cgroup/pids".into(),
                memory: "/sys/fs/cgroup/memory/process_api/ac36".into(),
                cpuacct: Some("/sys/fs/cgroup/cpuacct".into()),
            }
        );
    }

    #[test]
    fn v2_under_systemd_needs_the_controllers_handed_down() {
        let cgroup = "0::/system.slice/pi-dispatch.service\n";
        let mounts = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        let offered = |dir: &Path| {
            (dir == Path::new("/sys/fs/cgroup/system.slice/pi-dispatch.service"))
                .then(|| "cpuset cpu io memory pids\n".to_owned())
        };
        assert_eq!(
            choose(cgroup, mounts, &offered),
            Some(Hierarchy::V2 {
                parent: "/sys/fs/cgroup/system.slice/pi-dispatch.service".into()
            })
        );
        // A delegation without memory is not one a job can be bounded in.
        assert_eq!(choose(cgroup, mounts, &|_| Some("cpu pids".into())), None);
        // A group inside a container's own root.
        let nested = "31 23 0:26 /kubepods/x /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            choose("0::/kubepods/x/worker\n", nested, &|_| Some(
                "memory pids".into()
            )),
            Some(Hierarchy::V2 {
                parent: "/sys/fs/cgroup/worker".into()
            })
        );
    }

    #[test]
    fn counters_are_read_from_the_kernels_files() {
        assert_eq!(keyed("max 3\n", "max"), Some(3));
        assert_eq!(
            keyed("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n", "oom_kill"),
            Some(2)
        );
        assert_eq!(
            keyed("usage_usec 1500\nuser_usec 1000\n", "usage_usec"),
            Some(1500)
        );
        assert_eq!(keyed("low 0\n", "max"), None);
        assert_eq!(unescape("/a\\040b"), "/a b");
    }

    #[test]
    fn the_first_limit_reached_is_the_jobs_reason() {
        let limits = Limits {
            pids: 64,
            memory_bytes: 1 << 30,
            cpu_secs: 10,
        };
        assert_eq!(breach(&Usage::default(), &limits), None);
        let fork = Usage {
            pids_refused: 1,
            ..Usage::default()
        };
        assert_eq!(breach(&fork, &limits), Some(Breach::Pids(64)));
        let oom = Usage {
            oom_kills: 1,
            pids_refused: 5,
            ..Usage::default()
        };
        assert_eq!(breach(&oom, &limits), Some(Breach::Memory(1 << 30)));
        let cpu = Usage {
            cpu_ns: 10_000_000_000,
            ..Usage::default()
        };
        assert_eq!(breach(&cpu, &limits), Some(Breach::Cpu(10)));
        assert_eq!(group_name(1_879_048_192), "pi-dispatch-id-1879048192");
    }
}
