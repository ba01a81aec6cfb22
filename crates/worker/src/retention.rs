//! What jobs leave, kept as long as the settings say (`PI_KEEP_*_DAYS`) and no longer: a job's
//! folder (its forge clone, its `/job`, what it wrote) goes once the job is settled, but for its
//! transcript, unless a job that did not complete is kept for a look; its transcript goes after
//! `PI_KEEP_TRANSCRIPTS_DAYS`; its record after `PI_KEEP_RECORDS_DAYS` (the metrics' counters keep
//! what it counted), with the queue's entry of the done job.
//!
//! Nothing a job may still need is touched: a folder is judged by its job's record, and a job has
//! a record only once it is over (a folder without one is kept). A removal never follows a link,
//! never enters another file system, and refuses a folder any mount is in or under. Each pass
//! does a bounded amount of work, so the worker's own pass never holds anything long; the clock is
//! always passed in.
//!
//! On the job's path: after its end, once its record is written: a settled job's folder is tidied
//! at once ([`Retention::after_job`]), and the worker's retention thread ([`run_retention`]) prunes
//! the rest in passes.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use config::settings::Keep;
use records::record::{Outcome, Record};
use records::store::{RecordError, Records};
use std::time::Duration;

use crate::control::Control;

pub const DAY_MS: u64 = 86_400_000;

/// What a job's folder comes to, by its record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tidy {
    /// The job is not over (no record), or it did not complete and is kept for a look.
    Keep,
    /// Everything but the transcript.
    AllButTranscript,
    /// The whole folder, the transcript too.
    All,
}

/// What becomes of the folder of the job `record` is of, at `now_ms`. Pure.
pub fn tidy(record: Option<&Record>, keep: &Keep, now_ms: u64) -> Tidy {
    let Some(r) = record else {
        return Tidy::Keep;
    };
    let age = now_ms.saturating_sub(r.finished_at_ms);
    if age >= keep.transcripts_days.saturating_mul(DAY_MS) {
        Tidy::All
    } else if r.outcome != Outcome::Completed && age < keep.failed_jobs_days.saturating_mul(DAY_MS)
    {
        Tidy::Keep
    } else {
        Tidy::AllButTranscript
    }
}

/// What a pass removed (or, dry, would remove).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pruned {
    pub records: u64,
    /// Done jobs the queue forgot (their ids may be queued again).
    pub done_jobs: u64,
    pub transcripts: u64,
    /// Job folders emptied (all but the transcript) or removed.
    pub folders: u64,
    /// Bytes those took on disk.
    pub bytes: u64,
    /// Folders left alone because a mount is in them.
    pub mounted: Vec<PathBuf>,
    /// Folders that could not be removed (the error kind), tried again at the next pass.
    pub failed: Vec<(PathBuf, std::io::ErrorKind)>,
}

impl Pruned {
    /// Whether the pass found nothing to do.
    pub fn is_empty(&self) -> bool {
        self.records == 0 && self.done_jobs == 0 && self.folders == 0 && self.transcripts == 0
    }
}

/// How much one pass does at most.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub records: usize,
    pub folders: usize,
}

impl Default for Budget {
    fn default() -> Budget {
        Budget {
            records: 20_000,
            folders: 200,
        }
    }
}

/// The retention of one deployment's state.
#[derive(Debug, Clone)]
pub struct Retention {
    pub keep: Keep,
    /// `state/jobs`.
    pub jobs_dir: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum PruneError {
    #[error(transparent)]
    Records(#[from] RecordError),
    #[error(transparent)]
    Queue(#[from] queue::QueueError),
    #[error("the jobs' folder cannot be read ({0})")]
    Folder(std::io::ErrorKind),
}

/// How long a job's live view outlives its last change.
pub const LIVE_KEPT_MS: u64 = 3600 * 1000;

impl Retention {
    /// After a job is settled (its record written, its delivery done): its folder but the
    /// transcript is removed now, unless the job did not complete and such jobs are kept.
    pub fn after_job(&self, record: &Record, now_ms: u64) -> Pruned {
        let mut pruned = Pruned::default();
        if record.attempt_of.is_some() || !records::store::is_plain_id(&record.job_id) {
            return pruned;
        }
        let folder = self.jobs_dir.join(&record.job_id);
        if folder.exists() {
            // What a worker that is gone left mounted in it (a job lost with its worker) goes
            // first; a live worker's is left.
            sandbox::identity::sweep_job(&folder);
            let mounts = mount_points();
            self.apply(
                &folder,
                tidy(Some(record), &self.keep, now_ms),
                &mounts,
                false,
                &mut pruned,
            );
        }
        pruned
    }

    /// One pass over the jobs' folders, the records and the queue's done jobs, doing at most
    /// `budget` (the records wait for a pass that looked at every folder); with `dry`, only
    /// counting what it would do.
    pub fn pass(
        &self,
        records: &Records,
        queue: &dyn queue::Queue,
        now_ms: u64,
        budget: Budget,
        dry: bool,
    ) -> Result<Pruned, PruneError> {
        let mut pruned = Pruned::default();
        // The folders first, and the records only once every folder was looked at: a folder is
        // judged by its record, and one whose record went first would be kept for good.
        if !self.folders(records, now_ms, budget, dry, &mut pruned)? {
            return Ok(pruned);
        }
        let cutoff = now_ms.saturating_sub(self.keep.records_days.saturating_mul(DAY_MS));
        if dry {
            pruned.records = records.count_before(cutoff)?;
        } else {
            let mut left = budget.records;
            while left > 0 {
                let gone = records.prune(cutoff, left.min(1_000))?.len();
                pruned.records += gone as u64;
                left -= gone.min(left);
                if gone == 0 {
                    break;
                }
            }
            let before = std::time::UNIX_EPOCH + std::time::Duration::from_millis(cutoff);
            pruned.done_jobs = queue.prune_done(before)? as u64;
            // What jobs showed live, once they have been quiet for an hour: over, or their worker
            // long gone (the record and the transcript keep what matters).
            let quiet = std::time::UNIX_EPOCH
                + std::time::Duration::from_millis(now_ms.saturating_sub(LIVE_KEPT_MS));
            queue.live_prune(quiet)?;
        }
        Ok(pruned)
    }

    fn folders(
        &self,
        records: &Records,
        now_ms: u64,
        budget: Budget,
        dry: bool,
        pruned: &mut Pruned,
    ) -> Result<bool, PruneError> {
        let entries = match std::fs::read_dir(&self.jobs_dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(true),
            Err(e) => return Err(PruneError::Folder(e.kind())),
        };
        let mounts = mount_points();
        for entry in entries.filter_map(Result::ok) {
            if !dry && pruned.folders as usize >= budget.folders {
                return Ok(false);
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            let is_folder = entry.file_type().is_ok_and(|t| t.is_dir());
            if !is_folder || !records::store::is_plain_id(&name) {
                continue;
            }
            let record = match records.read(&name) {
                Ok(r) => Some(r),
                Err(RecordError::NotFound | RecordError::Invalid) => None,
                Err(e) => return Err(e.into()),
            };
            let what = tidy(record.as_ref(), &self.keep, now_ms);
            self.apply(&entry.path(), what, &mounts, dry, pruned);
        }
        Ok(true)
    }

    /// Carries out `what` on `folder` (or counts it, with `dry`).
    fn apply(&self, folder: &Path, what: Tidy, mounts: &[PathBuf], dry: bool, pruned: &mut Pruned) {
        if what == Tidy::Keep {
            return;
        }
        let mounted = |mounts: &[PathBuf]| mounts.iter().any(|m| m.starts_with(folder));
        let swept;
        let mounts = if !dry && mounted(mounts) {
            // The job is over: what a worker that is gone (killed outright) left mounted in its
            // folder goes first. A folder a live worker holds keeps its mounts.
            sandbox::identity::sweep_job(folder);
            swept = mount_points();
            &swept[..]
        } else {
            mounts
        };
        if mounted(mounts) {
            tracing::warn!(event = "job_folder_mounted", folder = %folder.display());
            pruned.mounted.push(folder.to_owned());
            return;
        }
        let transcript = folder.join(records::transcripts::FILE);
        let keeps_transcript = what == Tidy::AllButTranscript;
        let mut bytes = 0u64;
        let mut removed_any = false;
        let entries: Vec<PathBuf> = match std::fs::read_dir(folder) {
            Ok(e) => e.filter_map(Result::ok).map(|e| e.path()).collect(),
            Err(e) => {
                pruned.failed.push((folder.to_owned(), e.kind()));
                return;
            }
        };
        for path in entries {
            if keeps_transcript && path == transcript {
                continue;
            }
            if path == transcript {
                pruned.transcripts += 1;
            }
            removed_any = true;
            let result = if dry {
                Ok(config::files::used_bytes(&path))
            } else {
                remove_tree(&path)
            };
            match result {
                Ok(b) => bytes += b,
                Err(e) => pruned.failed.push((path, e.kind())),
            }
        }
        if !keeps_transcript && !dry {
            match std::fs::remove_dir(folder) {
                Ok(()) => removed_any = true,
                Err(e) => pruned.failed.push((folder.to_owned(), e.kind())),
            }
        }
        if removed_any {
            pruned.folders += 1;
            pruned.bytes += bytes;
        }
    }
}

/// The mount points of this process's mount namespace (where the worker mounts its jobs' views
/// and disks); none when they cannot be read, and then a folder is judged by its device alone.
fn mount_points() -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|text| sandbox::cgroup::mount_points(&text))
        .unwrap_or_default()
}

/// Removes `path` and everything under it, as it is: a link is removed, never followed; a folder
/// on another file system than `path`'s is left (and the removal fails there); a folder its job
/// closed is opened to its owner first. Returns the bytes the removed files took.
pub fn remove_tree(path: &Path) -> std::io::Result<u64> {
    let top = std::fs::symlink_metadata(path)?;
    if !top.is_dir() {
        std::fs::remove_file(path)?;
        return Ok(top.blocks() * 512);
    }
    let mut bytes = 0u64;
    // Depth first, without recursion: a folder is removed once everything in it is.
    let mut stack: Vec<(PathBuf, bool)> = vec![(path.to_owned(), false)];
    while let Some((dir, emptied)) = stack.pop() {
        if emptied {
            std::fs::remove_dir(&dir)?;
            continue;
        }
        let meta = std::fs::symlink_metadata(&dir)?;
        if meta.dev() != top.dev() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::CrossesDevices,
                "another file system is mounted in the folder",
            ));
        }
        // No process of the job is left to change it meanwhile: the job is over.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        bytes += meta.blocks() * 512;
        stack.push((dir.clone(), true));
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let m = entry.metadata()?;
            if m.is_dir() {
                stack.push((entry.path(), false));
            } else {
                std::fs::remove_file(entry.path())?;
                bytes += m.blocks() * 512;
            }
        }
    }
    Ok(bytes)
}

/// Says what became of a settled job's folder.
pub(crate) fn tidied(job_id: &str, pruned: &Pruned) {
    if pruned.folders > 0 {
        tracing::info!(event = "job_folder_tidied", job_id, bytes = pruned.bytes);
    }
    for (path, kind) in &pruned.failed {
        tracing::warn!(event = "job_folder_not_tidied", job_id, path = %path.display(),
        why = ?kind);
    }
}

/// One retention pass every `every`, on a thread of its own, until the worker drains: bounded
/// work each time, so a pass never holds the store long.
pub fn run_retention(
    retention: &Retention,
    records: &Records,
    queue: &dyn queue::Queue,
    every: Duration,
    control: &Control,
) {
    loop {
        match retention.pass(
            records,
            queue,
            records::record::now_ms(),
            Budget::default(),
            false,
        ) {
            Ok(p) if !p.is_empty() => tracing::info!(
                event = "pruned",
                records = p.records,
                transcripts = p.transcripts,
                folders = p.folders,
                bytes = p.bytes,
                done_jobs = p.done_jobs
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(event = "prune_failed", detail = %e),
        }
        let until = std::time::Instant::now() + every;
        while std::time::Instant::now() < until {
            if control.is_draining() {
                return;
            }
            std::thread::sleep(Duration::from_secs(1).min(every));
        }
    }
}

#[cfg(test)]
#[path = "retention_tests.rs"]
mod tests;
