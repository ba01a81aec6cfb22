//! The job's runner and its MCP hub, inside the sandbox. Its decisions (is the job file the worker's,
//! what each reference resolves to, what a stdio server may see, how long to wait, what the exit line
//! says) are pure functions here; the connections are built on them.
//!
//! On the job's path: inside the sandbox: the runner connects the job's MCP servers, starts pi,
//! holds every model call and signs the exit line.

mod agent;
mod calls;
pub mod confine;
pub mod connect;
pub mod connect_all;
mod endpoint;
mod finish;
/// The private readers, reached by the fuzz targets only (`fuzz/`, built with `--cfg fuzzing`).
#[cfg(fuzzing)]
pub mod fuzz;
pub mod gateway;
pub mod guard;
mod hold;
pub mod http;
pub mod job;
pub mod job_file;
mod output;
pub mod pi_agent;
pub mod pi_config;
pub mod pi_relay;
pub mod pins;
pub mod plan;
pub mod raw;
pub mod relay;
pub mod resolve;
pub mod rpc;
mod runner;
mod serve;
mod session;
pub mod stdio;
pub mod syscalls;
pub mod tools;
mod upstream;
pub mod wait;
