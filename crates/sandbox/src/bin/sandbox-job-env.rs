//! `sandbox-job-env PROGRAM [ARGS...]`: the container job's launcher ([`sandbox::job_env`]), as
//! `pi-dispatch job-env` is in the product, for the sandbox's own tests.

fn main() -> std::process::ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    sandbox::launcher::main(&args)
}
