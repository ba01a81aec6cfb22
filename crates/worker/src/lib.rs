//! The worker: it takes jobs from the queue, runs the pickup gates, starts the sandbox and writes
//! one record per job.

pub mod pipeline;
pub mod record;
