//! The egress proxy of jobs with egress on, and the two small pieces around it: its control socket
//! and the forwarder the runner puts on the job's loopback.
//!
//! - [`rules`]: the decision, pure (the rule is [`config::egress::route`], shared with the pickup
//!   gate and doctor; the proxy adds what only a lookup can tell).
//! - [`proxy`]: the server: a socket per job, bounded request heads, tunnels to checked addresses.
//! - [`control`]: `open`/`close`/`ping` for the worker, one JSON line each way.
//! - [`service`]: the proxy as a process (`pi-dispatch egress-proxy`).
//! - [`forward`]: the job side: a loopback port whose connections are handed to the job's socket
//!   ([`handover`]), so the proxy carries their bytes itself.
//!
//! On the job's path: beside the sandbox: the only way out of a job with egress on.

pub mod control;
pub mod dns;
pub mod files;
pub mod forward;
/// The private readers, reached by the fuzz targets only (`fuzz/`, built with `--cfg fuzzing`).
#[cfg(fuzzing)]
pub mod fuzz;
pub mod handover;
pub mod proxy;
pub mod rules;
pub mod service;

pub use proxy::{DeniedHost, LEFT_OUT, Limits, Proxy};
