//! The pickup gates: every check that costs nothing, run before anything is spent, as pure functions
//! over the job, the deployment and small reader traits.

pub mod fs;
pub mod gates;
pub mod job;
pub mod job_mcp;
pub mod providers;
pub mod reason;
