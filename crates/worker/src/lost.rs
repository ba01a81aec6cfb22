//! The records of jobs no worker can finish, before or beside the job's path: a job whose worker
//! was lost (or that was cancelled or replaced while it waited in the queue) and a queued payload
//! that is not a job. Each is made by the same builder as every other record ([`Draft`]).

use protocol::detail::Detail;
use protocol::reason::Reason;
use queue::{Lease, LostJob};
use records::record::{Draft, Ending, Record, job_of, stub};

/// The record of a job the queue found lost: its worker went away (`worker-lost`), or it was
/// cancelled before a worker finished it. `worker` is the worker that writes the record.
pub(crate) fn lost_record(lost: &LostJob, worker: &str) -> Record {
    let job = job_of(&lost.job_id, &lost.payload).unwrap_or_else(|| stub(&lost.job_id));
    let mut draft = Draft::new(&job, lost.attempt);
    draft.written_by(worker);
    // A job that was never leased spent nothing: a newer job of its issue replaced it while it
    // was queued.
    draft.reserved(lost.attempt > 0);
    let ending = match (lost.cancelled, lost.attempt) {
        (true, 0) => Ending::of(Reason::Cancelled).with_detail(
            Detail::new(
                "a newer job for the same issue replaced it before it started (\"sameIssue\": \"cancel-older\")",
            ),
            Reason::Cancelled.fix(),
        ),
        (true, _) => Ending::of(Reason::Cancelled),
        (false, _) => Ending::of(Reason::WorkerLost),
    };
    draft.finish(ending)
}

/// The record of a leased payload that is not a job (`job-unreadable`), by its id alone.
pub(crate) fn unreadable_record(lease: &Lease, worker: &str) -> Record {
    let mut draft = Draft::new(&stub(&lease.job_id), lease.attempt);
    draft.written_by(worker);
    draft.ended(Reason::JobUnreadable)
}
