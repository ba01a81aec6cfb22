//! Run records: one JSON file per job under `state/runs/`, written once when the job is over
//! (written whole to a temporary file, then renamed). A record holds outcomes, fixed reason tokens,
//! counts, names and times; never a secret, a header value or free text from the job. A reason the
//! runner reports is copied only when it is one of a closed set.

use std::path::{Path, PathBuf};

use hub::exit_line::{ExitLine, ServerState};
use hub::relay::ToolCallCount;
use pickup::job::Job;
use pickup::reason::{Reason, RunnerReason};
use serde::{Deserialize, Serialize};

/// `t` in Unix milliseconds, as records hold times.
pub fn unix_ms(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Now, in Unix milliseconds.
pub fn now_ms() -> u64 {
    unix_ms(std::time::SystemTime::now())
}

/// How a job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Completed,
    /// A rule or the configuration stopped it (code 2, or a refusal at pickup).
    Policy,
    /// Infrastructure, once retries are spent (code 1).
    Failed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Policy => "policy",
            Outcome::Failed => "failed",
        }
    }
}

/// Reasons of the worker's own, beside the pickup's and the runner's.
pub mod reasons {
    /// The agent exited with a failure.
    pub const AGENT_FAILED: &str = "agent-failed";
    /// The runner was told to stop (SIGTERM).
    pub const TERMINATED: &str = "terminated";
    /// The job ran past its time limit and was killed.
    pub const TIME_LIMIT: &str = "time-limit";
    /// A `run.secrets` reference was refused by its resolver (exit 2).
    pub const SECRET_UNRESOLVED: &str = "secret-unresolved";
    /// Egress is on and the egress proxy does not exist yet.
    pub const EGRESS_PROXY_MISSING: &str = "egress-proxy-missing";
    /// The sandbox did not start.
    pub const CONTAINER_NEVER_STARTED: &str = "container-never-started";
    /// The runner ended without an exit line the worker could verify.
    pub const NO_EXIT_LINE: &str = "runner-no-exit-line";
    /// The job's worker disappeared (its lease lapsed) once too often.
    pub const WORKER_LOST: &str = "worker-lost";
    /// The reason the runner gave is not one the worker knows.
    pub const RUNNER_REASON_UNKNOWN: &str = "runner-reason-unknown";
    /// A check before the sandbox could not be made (a read that may pass later), too often.
    pub const PICKUP_RETRIES_SPENT: &str = "pickup-retries-spent";
    /// A job in the queue the worker cannot read.
    pub const JOB_UNREADABLE: &str = "job-unreadable";
    /// The job's folder could not be written.
    pub const JOB_FOLDER_FAILED: &str = "job-folder-failed";
    /// The job's image (`images/NAME/` with its runner) is not there.
    pub const JOB_IMAGE_MISSING: &str = "job-image-missing";
    /// A local job's folder is gone.
    pub const WORKSPACE_MISSING: &str = "workspace-missing";
    /// A local job's folder belongs to root, and the worker runs as root: the job would run as
    /// root's mapping. Give the folder to the user the job should run as.
    pub const WORKSPACE_OWNED_BY_ROOT: &str = "workspace-owned-by-root";
    /// The job's environment could not be built from its parts (a name or value no environment
    /// can carry).
    pub const ENVIRONMENT_REFUSED: &str = "environment-refused";
    /// The secrets profile has no resolver (configuration).
    pub const SECRET_RESOLVER_MISSING: &str = "secret-resolver-missing";
    /// The resolver could not answer this time.
    pub const SECRET_RESOLVER_FAILED: &str = "secret-resolver-failed";

    pub const ALL: [&str; 18] = [
        AGENT_FAILED,
        TERMINATED,
        TIME_LIMIT,
        SECRET_UNRESOLVED,
        EGRESS_PROXY_MISSING,
        CONTAINER_NEVER_STARTED,
        NO_EXIT_LINE,
        WORKER_LOST,
        RUNNER_REASON_UNKNOWN,
        PICKUP_RETRIES_SPENT,
        JOB_UNREADABLE,
        JOB_FOLDER_FAILED,
        JOB_IMAGE_MISSING,
        WORKSPACE_MISSING,
        WORKSPACE_OWNED_BY_ROOT,
        ENVIRONMENT_REFUSED,
        SECRET_RESOLVER_MISSING,
        SECRET_RESOLVER_FAILED,
    ];
}

/// Whether `reason` is one a record may carry: the pickup's, the runner's, or the worker's own.
pub fn is_known_reason(reason: &str) -> bool {
    Reason::ALL.iter().any(|r| r.as_str() == reason)
        || RunnerReason::ALL.iter().any(|r| r.as_str() == reason)
        || reasons::ALL.contains(&reason)
}

/// Tokens and cost, as pi counted them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Tokens {
    pub input: u64,
    pub output: u64,
    pub total: u64,
}

/// The MCP part: each server's state and time to ready, and the tool calls.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct McpPart {
    pub servers: Vec<ServerState>,
    pub tool_calls: Vec<ToolCallCount>,
}

/// One job's record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Record {
    pub job_id: String,
    pub outcome: Outcome,
    /// A fixed token (see [`is_known_reason`]); `None` for a completed job.
    pub reason: Option<String>,
    /// The runner's exit code; `None` when no runner ran (a refusal) or none reported.
    pub exit_code: Option<u8>,
    pub turns: Option<u64>,
    pub tokens: Option<Tokens>,
    pub cost_usd: Option<f64>,
    pub provider: Option<String>,
    pub model: Option<String>,
    /// Whether the job got past the checks that cost nothing (a sandbox was started for it).
    pub budget_reserved: bool,
    pub attempt: u32,
    pub trigger_index: Option<usize>,
    pub trigger_type: String,
    pub kind: String,
    /// Unix milliseconds.
    pub queued_at_ms: Option<u64>,
    pub started_at_ms: Option<u64>,
    pub finished_at_ms: u64,
    pub mcp: McpPart,
}

impl Record {
    /// A record for `job` with nothing spent yet: the caller fills in the rest.
    pub fn new(
        job: &Job,
        outcome: Outcome,
        reason: Option<&str>,
        attempt: u32,
        now_ms: u64,
    ) -> Record {
        Record {
            job_id: job.id.clone(),
            outcome,
            reason: reason.map(str::to_owned),
            exit_code: None,
            turns: None,
            tokens: None,
            cost_usd: None,
            provider: job.provider.clone(),
            model: job.model.clone(),
            budget_reserved: false,
            attempt,
            trigger_index: job.trigger_index,
            trigger_type: job.trigger_type.clone(),
            kind: job.kind.clone(),
            queued_at_ms: None,
            started_at_ms: None,
            finished_at_ms: now_ms,
            mcp: McpPart::default(),
        }
    }

    /// The record of a job whose runner reported `line`: code 0 completed, 2 policy, anything
    /// else failed. The runner's reason is copied only when it is a known one.
    pub fn from_exit_line(job: &Job, line: &ExitLine, attempt: u32, now_ms: u64) -> Record {
        let outcome = match line.code {
            0 => Outcome::Completed,
            2 => Outcome::Policy,
            _ => Outcome::Failed,
        };
        let reason = match (&line.reason, outcome) {
            (_, Outcome::Completed) => None,
            (Some(r), _) if is_known_reason(r) => Some(r.as_str()),
            _ => Some(reasons::RUNNER_REASON_UNKNOWN),
        };
        let mut record = Record::new(job, outcome, reason, attempt, now_ms);
        record.exit_code = Some(line.code);
        record.budget_reserved = true;
        record.mcp = McpPart {
            servers: line.servers.clone(),
            tool_calls: line.tool_calls.clone(),
        };
        if let Some(usage) = &line.usage {
            record.turns = Some(usage.turns);
            record.tokens = Some(Tokens {
                input: usage.input_tokens,
                output: usage.output_tokens,
                total: usage.total_tokens,
            });
            record.cost_usd = Some(usage.cost_usd);
            if usage.provider.is_some() {
                record.provider.clone_from(&usage.provider);
            }
            if usage.model.is_some() {
                record.model.clone_from(&usage.model);
            }
        }
        record
    }
}

/// The folder of records (`state/runs`).
pub struct Records {
    dir: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("the records folder cannot be written ({0})")]
    Write(std::io::ErrorKind),
    #[error("the records folder cannot be read ({0})")]
    Read(std::io::ErrorKind),
    #[error("no record has the id given")]
    NotFound,
    #[error("a record is not valid JSON of the record's shape")]
    Invalid,
}

/// Job ids become file names: only these characters.
pub fn is_plain_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

impl Records {
    pub fn new(dir: impl Into<PathBuf>) -> Records {
        Records { dir: dir.into() }
    }

    fn path(&self, id: &str) -> Option<PathBuf> {
        is_plain_id(id).then(|| self.dir.join(format!("{id}.json")))
    }

    /// Writes `record` (once: a job has one record; a second write for the same id replaces
    /// nothing and says so).
    pub fn write(&self, record: &Record) -> Result<bool, RecordError> {
        use std::io::Write as _;
        let path = self.path(&record.job_id).ok_or(RecordError::Invalid)?;
        std::fs::create_dir_all(&self.dir).map_err(|e| RecordError::Write(e.kind()))?;
        let text = serde_json::to_string_pretty(record).map_err(|_| RecordError::Invalid)? + "\n";
        let mut tmp = tempfile::Builder::new()
            .prefix(".record-")
            .tempfile_in(&self.dir)
            .map_err(|e| RecordError::Write(e.kind()))?;
        tmp.write_all(text.as_bytes())
            .and_then(|()| tmp.as_file().sync_all())
            .map_err(|e| RecordError::Write(e.kind()))?;
        // Never replaces: a record that exists stays as it is.
        match tmp.persist_noclobber(&path) {
            Ok(_) => Ok(true),
            Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(RecordError::Write(e.error.kind())),
        }
    }

    pub fn read(&self, id: &str) -> Result<Record, RecordError> {
        let path = self.path(id).ok_or(RecordError::NotFound)?;
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(RecordError::NotFound);
            }
            Err(e) => return Err(RecordError::Read(e.kind())),
        };
        serde_json::from_slice(&bytes).map_err(|_| RecordError::Invalid)
    }

    /// Every record, oldest first (by finish time, then id). Files that are not records are
    /// skipped.
    pub fn list(&self) -> Result<Vec<Record>, RecordError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(RecordError::Read(e.kind())),
        };
        let mut all: Vec<Record> = entries
            .filter_map(Result::ok)
            .filter(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.ends_with(".json") && !name.starts_with('.')
            })
            .filter_map(|e| std::fs::read(e.path()).ok())
            .filter_map(|b| serde_json::from_slice(&b).ok())
            .collect();
        all.sort_by(|a: &Record, b: &Record| {
            (a.finished_at_ms, &a.job_id).cmp(&(b.finished_at_ms, &b.job_id))
        });
        Ok(all)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

#[cfg(test)]
#[path = "record_tests.rs"]
mod tests;
