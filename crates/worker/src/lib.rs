//! The worker: it takes jobs from the durable queue, decides each with the admission, starts the
//! sandbox, and writes one record (and a transcript) per job; it drains on a signal and stops a
//! cancelled job. With egress on, it makes sure an egress proxy serves its jobs (`egress`).
//!
//! On the job's path: from the lease to the record: admission, secrets, token, sandbox, the
//! runner's exit line, the record and the comment.

mod control;
pub mod cron;
pub mod egress;
pub mod forge_job;
mod lost;
mod options;
mod page;
pub mod pins;
pub mod pipeline;
pub mod retention;
pub mod sandboxed;
pub mod service;
mod slot;
pub mod transcript;
pub mod verdict;
