//! The operator's pager (`PI_ON_FAILURE`), at the end of the job's path: once a job's record is
//! written, a stop that cost something is paged; so is a worker whose disk is nearly full.

use std::time::Duration;

use protocol::reason::{Outcome, Reason};
use records::record::Record;

use crate::options::LoopOptions;

/// Runs `PI_ON_FAILURE` for a stop that cost something (also when its record could not be
/// written: the page is how the operator hears of it).
pub(crate) fn page(record: &Record, options: &LoopOptions) {
    if let Some(program) = &options.on_failure
        && record.budget_reserved
        && !matches!(record.outcome, Outcome::Completed | Outcome::Cancelled)
    {
        let reason = record.reason.unwrap_or(Reason::RunnerReasonUnknown);
        on_failure(program, &record.job_id, record.outcome, reason);
    }
}

/// `PROGRAM JOB_ID OUTCOME REASON HOST` (`-` for the job of a page about the worker itself), with
/// the worker's environment, its output discarded, at most 30 s.
pub(crate) fn on_failure(
    program: &std::path::Path,
    job_id: &str,
    outcome: Outcome,
    reason: Reason,
) {
    // Every token is plain (`^[a-z0-9-]{1,40}$`, tested with the reasons).
    let host = egress::proxy::host_name();
    let mut command = std::process::Command::new(program);
    command
        .args([job_id, outcome.as_str(), reason.as_str(), &host])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let child = spawn::retry_busy(|| command.spawn());
    let Ok(mut child) = child else {
        tracing::warn!(event = "on_failure_failed", job_id = %job_id);
        return;
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return,
            Ok(None) if std::time::Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}
