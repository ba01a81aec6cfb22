//! The worker: it takes jobs from the durable queue, runs the pickup gates, starts the sandbox and
//! writes one record per job.

pub mod cron;
pub mod pipeline;
pub mod queue;
pub mod record;
pub mod service;
