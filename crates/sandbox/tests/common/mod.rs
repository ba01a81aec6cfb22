//! What the sandbox's test suites share (`sandbox.rs`, bubblewrap itself; `contract.rs`, both
//! backends through the `Backend` trait).

use std::time::{Duration, Instant};

use sandbox::env::{self, JobEnv, Parts};
use sandbox::secrets::Secret;

/// A job environment for job `job_id`: `PATH` and the given variables (as `run.secrets`), besides
/// the base ones.
pub fn job_env(job_id: &str, vars: &[(&str, &str)]) -> JobEnv {
    let secrets: Vec<(String, Secret)> = vars
        .iter()
        .map(|(n, v)| ((*n).to_owned(), Secret::new(*v)))
        .collect();
    let computed = vec![("PATH".to_owned(), "/usr/bin:/bin".to_owned())];
    env::build(
        &Parts {
            provider: Some("openai"),
            model: Some("gpt-test"),
            secrets: &secrets,
            computed: &computed,
            ..Parts::new(job_id, "/tmp")
        },
        &|_| None,
    )
    .unwrap()
}

/// A marker no other test uses, for finding a job's processes by their environment.
pub fn marker(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{test}-{}-{nanos}", std::process::id())
}

/// Whether `f` holds within `within` (asked every 20 ms).
pub async fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
