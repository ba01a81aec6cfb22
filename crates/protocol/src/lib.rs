//! What crosses a process boundary in pi-dispatch: the queued job, the admitted job, the job's
//! `mcp.json` and its digest, the one vocabulary of reasons, the runner's signed exit line with what
//! the job used, and where the parts of a job image are. The queue, the worker, the runner and the
//! command line all speak these types, so two versions meet on them or refuse each other clearly.
//!
//! On the job's path: the types each step hands to the next, from the queue through the worker, the
//! sandbox, the runner and pi to the exit line and the record.

pub mod admitted;
pub mod detail;
pub mod egress;
pub mod exit_line;
pub mod forge_event;
pub mod forge_names;
pub mod ids;
pub mod image;
pub mod job;
pub mod job_dir;
pub mod job_mcp;
pub mod json;
pub mod model_answer;
pub mod pi_events;
pub mod pins;
pub mod reason;
pub mod secret;
pub mod usage;

pub use job::Job;
pub use reason::{Outcome, Reason};
