//! `sandbox-job-limits [--join FILE]... [--cpu SECONDS] -- PROGRAM ARGS...`: a job's limits set
//! before its sandbox starts ([`sandbox::cgroup::limits_main`]), as `pi-dispatch job-limits` is in
//! the product, for the sandbox's own tests.

fn main() -> std::process::ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    sandbox::cgroup::limits_main(&args)
}
