//! What a job leaves for the operator once the worker is done with it, read by the commands and
//! the panel without the worker: the run record (`record`: what the job was, how it ended, what it
//! used, written once), where the records and transcripts are kept (files under `state/`, or
//! beside the queue in Redis), and the queue's open jobs and workers as they are shown
//! (`open_jobs`, `workers`).
//!
//! On the job's path: the last stop, after the exit line; `runs`, the panel and the metrics read it.

pub mod counts;
pub mod live;
pub mod open_jobs;
pub mod query;
pub mod record;
pub mod store;
pub mod transcripts;
pub mod workers;
