//! The pickup gates: every check that costs nothing, run before anything is spent, as pure functions
//! over the job, the deployment and small reader traits.
//!
//! On the job's path: the admission, between the lease and the sandbox: the last point where a
//! refusal costs nothing.

pub mod admission;
pub mod fs;
pub mod reach;
mod routes;
