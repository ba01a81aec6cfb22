//! Where a job's transcript is kept: `state/jobs/ID/transcript.jsonl` (the worker writes it, with
//! every secret it knows redacted; `runs show --transcript` and the panel read it).

use std::path::{Path, PathBuf};

/// The transcript's file name in the job's folder.
pub const FILE: &str = "transcript.jsonl";

/// Where job `id`'s transcript is kept, under the jobs' folder (`state/jobs`).
pub fn path(jobs_dir: &Path, id: &str) -> PathBuf {
    jobs_dir.join(id).join(FILE)
}
