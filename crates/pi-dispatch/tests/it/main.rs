//! Integration tests: each drives the compiled `pi-dispatch` binary, one file per command.

// Test code fails loudly on purpose; the workspace denies unwrap only in product code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod admission;
mod attempts;
mod cli;
mod common;
mod control;
mod disk_full;
mod doctor;
mod egress;
mod egress_agree;
mod egress_proxy;
mod explain;
mod forge;
mod hostile;
mod hostile_bounds;
mod hostile_host;
mod hostile_pi;
mod hostile_post;
mod hostile_publish;
mod hostile_report;
mod hostile_spend;
mod hostile_syscalls;
mod hostile_token;
mod import_pi;
mod init;
mod job;
mod job_signals;
mod layout;
mod live;
mod many_hosts;
mod mcp_check;
mod one_wait;
mod outcomes;
mod package;
mod panel;
mod rerun;
mod retention;
mod run;
mod scripts;
mod service;
mod spec_in_job;
mod terminal;
mod triggers_check;
mod worker;
