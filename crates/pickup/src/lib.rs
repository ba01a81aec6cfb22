//! The pickup gates: every check that costs nothing, run before anything is spent, as pure functions
//! over the job, the deployment and small reader traits.

pub mod admission;
pub mod fs;
pub mod reach;
mod routes;
