//! The product's one vocabulary for why a job was refused, stopped or failed: every reason the
//! pickup, the worker and the job's runner can give, each with what follows from it (the outcome a
//! record shows, the runner's exit code, whether the worker runs the job again) and its fixed public
//! sentence. A sentence names no server, host, variable or value; the record's detail and the
//! worker's log carry names.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// How a job ended, as its record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// The agent finished its task: its last answer ended normally.
    Completed,
    /// A rule or the configuration stopped it: refused before anything was spent, or stopped by
    /// the runner with code 2.
    Policy,
    /// It did not get done: the model, the agent or the infrastructure failed.
    Failed,
    /// The operator cancelled it.
    Cancelled,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Policy => "policy",
            Outcome::Failed => "failed",
            Outcome::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a reason is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Before anything is spent: the admission (the spec's pickup table and the product's own
    /// checks). A refusal spends nothing and pages nobody.
    Admission,
    /// After admission, on the host, before the sandbox (secrets, the job's folder).
    Preparation,
    /// Inside the job, on the runner's exit line.
    Job,
    /// The worker, around the sandbox (time limit, lost workers, cancellation).
    Worker,
}

macro_rules! reasons {
    ($( $variant:ident = $token:literal, $stage:ident, $outcome:ident, $code:expr, $retried:literal, $sentence:literal, $fix:literal; )*) => {
        /// Every reason a job can end with (but `completed`, which has none).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Reason { $( $variant, )* }

        impl Reason {
            pub const ALL: &'static [Reason] = &[ $( Reason::$variant, )* ];

            /// The token, as records, logs and `PI_ON_FAILURE` carry it.
            pub fn as_str(self) -> &'static str {
                match self { $( Reason::$variant => $token, )* }
            }

            /// The reason a token names, when it is one of ours.
            pub fn parse(token: &str) -> Option<Reason> {
                match token { $( $token => Some(Reason::$variant), )* _ => None }
            }

            pub fn stage(self) -> Stage {
                match self { $( Reason::$variant => Stage::$stage, )* }
            }

            /// The outcome a record with this reason shows.
            pub fn outcome(self) -> Outcome {
                match self { $( Reason::$variant => Outcome::$outcome, )* }
            }

            /// The runner's exit code for a reason it reports (0 done, 1 infrastructure, 2 policy
            /// or configuration); `None` for a reason no runner reports.
            pub fn code(self) -> Option<u8> {
                match self { $( Reason::$variant => $code, )* }
            }

            /// Whether the worker runs the job again (while attempts remain).
            pub fn retried(self) -> bool {
                match self { $( Reason::$variant => $retried, )* }
            }

            /// The fixed public sentence: what happened, naming no server, host or variable.
            pub fn sentence(self) -> &'static str {
                match self { $( Reason::$variant => $sentence, )* }
            }

            /// What to do about it, in one line, when nothing more precise is known (a
            /// refusal's own fix names the server, file or variable).
            pub fn fix(self) -> &'static str {
                match self { $( Reason::$variant => $fix, )* }
            }
        }
    };
}

reasons! {
    // The spec's pickup table.
    McpListInvalid = "mcp-list-invalid", Admission, Policy, None, false,
        "The list of MCP servers the job carries is not one pi-dispatch writes.",
        "queue the job again from its trigger or with `pi-dispatch run`; upgrade the receiver and the worker together";
    McpConfigInvalid = "mcp-config-invalid", Admission, Policy, Some(2), false,
        "The MCP configuration (the overlay's mcp.json, or the job's copy of it) is missing or cannot be read.",
        "fix the overlay's mcp.json (`pi-dispatch mcp check` shows what is wrong)";
    McpServerUnknown = "mcp-server-unknown", Admission, Policy, None, false,
        "An MCP server the job names is not offered to jobs.",
        "offer the server in the overlay's mcp.json (`pi-dispatch mcp check` says why it is refused), or leave it out of the job's servers (its trigger's run.mcp, or --mcp of `pi-dispatch run`)";
    McpSecretReserved = "mcp-secret-reserved", Admission, Policy, None, false,
        "An MCP server the job names references a credential reserved for the job itself.",
        "give the server its own variable, or give the trigger a model list without that provider";
    McpSecretUnmapped = "mcp-secret-unmapped", Admission, Policy, None, false,
        "An MCP server the job names references a variable the job will not have.",
        "map the variable in the trigger's run.secrets, or forward it with PI_FORWARD_ENV from the worker's environment";
    McpEgressUnreachable = "mcp-egress-unreachable", Admission, Policy, None, false,
        "The egress policy would not let the job reach an MCP server it names.",
        "allowlist the server's host in egress-allowlist.conf (https on port 443), or declare its host and port in model-endpoints.json";
    McpPackageRunner = "mcp-package-runner", Admission, Policy, None, false,
        "The egress policy would not let an MCP server's package runner reach its registry.",
        "declare the runner's registry in PI_PACKAGE_REGISTRIES and allowlist it, or install the server in the job image";
    McpExcluded = "mcp-excluded", Admission, Policy, None, false,
        "The trigger's excluded tools leave an MCP server it names no way in.",
        "leave the server a way in: do not exclude codemode, tool_search or all of its tools in run.excludeTools";
    JobImageMcpUnsupported = "job-image-mcp-unsupported", Admission, Policy, None, false,
        "The job image does not declare the mcp capability.",
        "use a job image that declares the mcp capability (`pi-dispatch image install`)";
    JobImageForgeMcpUnsupported = "job-image-forge-mcp-unsupported", Admission, Policy, None, false,
        "The job image does not declare the forgeMcp capability.",
        "use a job image that declares the forgeMcp capability";
    TriggerSkew = "trigger-skew", Admission, Policy, None, false,
        "The trigger narrows what its jobs may do in a way the queued job does not carry.",
        "queue the job again from the trigger as it is now; upgrade the receiver and the worker together";
    // The product's own admission checks.
    TriggerGone = "trigger-gone", Admission, Policy, None, false,
        "The trigger that queued the job is no longer in triggers.json.",
        "run the trigger as it is now (pi-dispatch run --trigger N), or queue the job anew with run";
    JobUnreadable = "job-unreadable", Admission, Policy, None, false,
        "The queued job cannot be read.",
        "queue the job again with this version of pi-dispatch";
    JobKindUnsupported = "job-kind-unsupported", Admission, Policy, None, false,
        "This version runs local, github and gitlab jobs only.",
        "use run.kind local, github or gitlab: forgejo and azure jobs are not run yet";
    JobFlowUnsupported = "job-flow-unsupported", Admission, Policy, None, false,
        "The trigger's flow is not one a forge job can follow.",
        "give the trigger run.flow \"answer\" (the agent's answer is posted on the issue) or \"fix\" (its changes become a pull request)";
    ForgeUnconfigured = "forge-unconfigured", Admission, Policy, None, false,
        "The worker is not set up to act on this forge.",
        "set PI_GITHUB_APP_ID and PI_GITHUB_APP_KEY_FILE for GitHub, GITLAB_URL and PI_GITLAB_TOKEN for GitLab (docs/forges.md)";
    JobImageMissing = "job-image-missing", Admission, Policy, None, false,
        "The job image is not installed.",
        "install the job image: `pi-dispatch image install`";
    WorkspaceMissing = "workspace-missing", Admission, Policy, None, false,
        "The job's repository folder does not exist or is not a folder.",
        "point the job at an existing repository folder";
    WorkspaceOwnedByRoot = "workspace-owned-by-root", Admission, Policy, None, false,
        "The job's repository folder belongs to root, and a job never runs as root.",
        "give the folder to the user the job should run as (chown)";
    WorkspaceUnreachable = "workspace-unreachable", Admission, Policy, None, false,
        "The user the job runs as cannot use the job's repository folder.",
        "let the folder's owner read, write and enter it (chmod u+rwx)";
    EgressProxyMissing = "egress-proxy-missing", Admission, Policy, None, false,
        "The egress policy is on and this pi-dispatch has no egress proxy yet.",
        "set PI_EGRESS=0 to run jobs on the host's network until the egress proxy exists";
    ModelsConfigInvalid = "models-config-invalid", Admission, Policy, None, false,
        "The overlay's models.json cannot be read or holds what a job may not.",
        "fix the overlay's models.json (`pi-dispatch doctor` shows what is wrong)";
    ModelUnset = "model-unset", Admission, Policy, None, false,
        "The job names no provider and model, and the deployment sets no default.",
        "set PI_PROVIDER and PI_MODEL in .env, or run.provider and run.model in the trigger";
    ModelProviderUnknown = "model-provider-unknown", Admission, Policy, None, false,
        "The job's model provider is neither one pi knows nor one the overlay's models.json defines.",
        "name a provider pi knows, or define it in the overlay's models.json";
    ModelUnknown = "model-unknown", Admission, Policy, None, false,
        "The job's provider has no model of that name.",
        "name a model the provider has (pi's catalog, or the overlay's models.json)";
    ModelNotAllowed = "model-not-allowed", Admission, Policy, None, false,
        "The job's model is not on its trigger's model list.",
        "add provider/model to the trigger's run.models, or use a model on it";
    ModelKeyMissing = "model-key-missing", Admission, Policy, None, false,
        "The worker holds no key for the job's model provider.",
        "set the provider's key variable in the worker's environment";
    ModelUnsupported = "model-unsupported", Admission, Policy, None, false,
        "The job's model speaks a wire format the job's model gateway cannot check and meter.",
        "choose a model whose provider speaks a wire format the gateway reads (OpenAI chat completions or responses, Anthropic messages), or give the overlay's models.json such an api for it";
    // After admission, before the sandbox.
    SecretUnresolved = "secret-unresolved", Preparation, Policy, None, false,
        "A secret the trigger names was refused by its resolver.",
        "check the trigger's run.secrets references against its resolver";
    SecretResolverMissing = "secret-resolver-missing", Preparation, Policy, None, false,
        "The trigger's secrets profile has no resolver.",
        "install the secrets profile's resolver (see docs/sandbox.md)";
    SecretResolverFailed = "secret-resolver-failed", Preparation, Failed, None, true,
        "The secrets resolver could not answer.",
        "check the secrets resolver; the job is tried again";
    EnvironmentRefused = "environment-refused", Preparation, Policy, None, false,
        "The job's environment could not be built from its parts.",
        "check PI_FORWARD_ENV and run.secrets for names or values an environment cannot carry";
    JobFolderFailed = "job-folder-failed", Preparation, Failed, None, true,
        "The job's folder could not be written.",
        "check that the worker can write its state folder";
    PickupRetriesSpent = "pickup-retries-spent", Preparation, Failed, None, true,
        "A check before the job could not be made, too many times.",
        "check that the worker can read the deployment's files (a disk or mount error)";
    PinsUnreadable = "pins-unreadable", Preparation, Failed, None, true,
        "The pins of the job's servers could not be read from the queue's store.",
        "check the queue's store with pi-dispatch doctor; the job is tried again";
    ForgeTokenFailed = "forge-token-failed", Preparation, Failed, None, true,
        "The job's forge token could not be minted.",
        "check the GitHub App's id, key file and installation (or the GitLab token); the job is tried again";
    ForgeCloneFailed = "forge-clone-failed", Preparation, Failed, None, true,
        "The job's repository could not be cloned.",
        "check that the forge serves the repository to the job's token; the job is tried again";
    ForgeRefused = "forge-refused", Preparation, Failed, None, false,
        "The forge refused what the job needs from it: its token, its pull request or its repository.",
        "check that the GitHub App is installed on the repository with its permissions (or that the GitLab token reaches the project); the worker's log has the forge's answer";
    // The spec's in-job table.
    McpUnavailable = "mcp-unavailable", Job, Policy, Some(2), false,
        "An MCP server refused: it did not start, failed its handshake or its tool list, or answered with an error.",
        "check the server named in the record: its command, its URL and its credentials";
    McpUnreachable = "mcp-unreachable", Job, Failed, Some(1), true,
        "An MCP server had not answered when the wait ran out.",
        "check that the server answers in time; the job is tried again";
    McpShadowed = "mcp-shadowed", Job, Policy, Some(2), false,
        "An extension registers a name only the job's MCP may.",
        "remove the extension that registers the reserved name from the overlay";
    McpCommandMissing = "mcp-command-missing", Job, Policy, Some(2), false,
        "A stdio MCP server's command is not in the job image.",
        "install the server's command in the job image or the overlay";
    McpSecretMissing = "mcp-secret-missing", Job, Policy, Some(2), false,
        "A variable an MCP server references is not set in the job.",
        "give the job the variable (run.secrets, or PI_FORWARD_ENV with a value in the worker's environment)";
    McpConfigMismatch = "mcp-config-mismatch", Job, Policy, Some(2), false,
        "The job's mcp.json is not the one the worker wrote for it.",
        "run the job with a worker and an image of the same version";
    // The agent and its model, on the exit line.
    AgentFailed = "agent-failed", Job, Failed, Some(1), false,
        "The agent exited with a failure.",
        "read the job's transcript (`pi-dispatch runs show ID --transcript`)";
    AgentAborted = "agent-aborted", Job, Failed, Some(1), false,
        "The agent's run was aborted before it finished.",
        "read the job's transcript (`pi-dispatch runs show ID --transcript`)";
    AgentNoTurn = "agent-no-turn", Job, Failed, Some(1), false,
        "The agent ended without a single answer from its model.",
        "read the job's transcript (`pi-dispatch runs show ID --transcript`)";
    ModelUnreachable = "model-unreachable", Job, Failed, Some(1), true,
        "The model provider could not be reached.",
        "check that the model provider is reachable from the job (its host, the egress policy); the job is tried again";
    ModelUnauthorized = "model-unauthorized", Job, Failed, Some(2), false,
        "The model provider refused the job's key.",
        "check the provider's key in the worker's environment";
    ModelRateLimited = "model-rate-limited", Job, Failed, Some(1), true,
        "The model provider kept refusing for its rate limit.",
        "wait for the provider's rate limit, or lower PI_WORKER_CONCURRENCY; the job is tried again";
    ModelError = "model-error", Job, Failed, Some(1), false,
        "The model provider answered with an error.",
        "read the provider's error in the job's transcript";
    ModelLengthLimit = "model-length-limit", Job, Failed, Some(1), false,
        "The model's last answer was cut off at its length limit.",
        "give the model a larger output limit in models.json, or a smaller task";
    AgentReportMismatch = "agent-report-mismatch", Job, Failed, Some(1), false,
        "The agent reported an ending its model never gave (something inside pi wrote its output), so nothing it made was published.",
        "check the overlay's extensions and what the job read (its transcript): something inside pi wrote its events";
    // The job's model gateway, on the exit line: a call it refuses stops the whole job.
    ModelCallNotAllowed = "model-call-not-allowed", Job, Policy, Some(2), false,
        "A model call named a model the job may not use.",
        "add the model to the trigger's run.models, or tell the job to use a model on it";
    ModelCallUnbounded = "model-call-unbounded", Job, Policy, Some(2), false,
        "Under the job's cost cap, a model call whose cost has no bound was refused.",
        "drop run.maxCostUsd for jobs that generate images, or keep their scripts to chat and classifier models without an output price";
    ToolDrift = "tool-drift", Job, Policy, Some(2), false,
        "A server's tools differ from the ones approved for it, and the trigger refuses such a job.",
        "see what changed with pi-dispatch mcp pins diff NAME, then approve it with pi-dispatch mcp pin NAME";
    CostCapReached = "cost-cap-reached", Job, Policy, Some(2), false,
        "A model call could have taken the job past its cost cap, so it was refused.",
        "raise the trigger's run.maxCostUsd, or give the job a smaller task or a model with a smaller output limit";
    ModelCallUnsupported = "model-call-unsupported", Job, Policy, Some(2), false,
        "A model call used a wire format the job's model gateway cannot check and meter.",
        "use a provider whose wire format the gateway reads (OpenAI chat completions or responses, Anthropic messages)";
    ModelRulesInvalid = "model-rules-invalid", Job, Policy, Some(2), false,
        "The job's model list or cost cap, as the worker passed them, cannot be read.",
        "run the job with a worker and an image of the same version";
    Terminated = "terminated", Job, Failed, Some(1), true,
        "The job's runner was told to stop.",
        "the job is tried again";
    // The runner's own faults: infrastructure, whatever servers the job names.
    RunnerSetupFailed = "runner-setup-failed", Job, Failed, Some(1), true,
        "The job's runner could not set up the agent's side of the job.",
        "the job is tried again; the worker's log names the step that failed (a full disk, a missing bubblewrap)";
    JobPromptUnreadable = "job-prompt-unreadable", Job, Failed, Some(1), true,
        "The job's prompt could not be read inside its sandbox.",
        "the job is tried again; check that the worker can write its state folder";
    AgentNeverStarted = "agent-never-started", Job, Failed, Some(1), true,
        "The agent's process could not be started.",
        "the job is tried again; check the job image (`pi-dispatch image install`)";
    // The worker, around the sandbox.
    TimeLimit = "time-limit", Worker, Failed, None, false,
        "The job ran past its time limit and was stopped.",
        "raise PI_JOB_TIME_LIMIT, or give the job a smaller task";
    JobPidsLimit = "job-pids-limit", Worker, Failed, None, false,
        "The job tried to run more processes at once than its limit allows, and was stopped.",
        "raise PI_JOB_PIDS, or give the job a smaller task";
    JobMemoryLimit = "job-memory-limit", Worker, Failed, None, false,
        "The job used more memory than its limit allows (what its /tmp holds counts), and was stopped.",
        "raise PI_JOB_MEMORY_MB, or give the job a smaller task (and less to keep in /tmp)";
    JobCpuLimit = "job-cpu-limit", Worker, Failed, None, false,
        "The job used more CPU time than its limit allows, and was stopped.",
        "raise PI_JOB_CPU_SECS, or give the job a smaller task";
    JobDiskLimit = "job-disk-limit", Worker, Failed, None, false,
        "The job filled the disk it may write its workspace on, and was stopped; what it wrote was not kept.",
        "raise PI_JOB_DISK_MB, or have the job write less into its workspace (build outputs, caches)";
    JobWriteBackFailed = "job-write-back-failed", Worker, Failed, None, false,
        "What the job wrote could not be copied from its own disk into its workspace.",
        "check the host's free space and the workspace folder (the worker's log names the error); the job's writes were not kept";
    JobWriteBackTooLarge = "job-write-back-too-large", Worker, Policy, None, false,
        "What the job wrote is more than its workspace takes back: more data than its disk held, or more names than the write-back carries.",
        "the record names the bound; have the job write less into its workspace (build output and caches outside it, or removed before it ends)";
    Cancelled = "cancelled", Worker, Cancelled, None, false,
        "The job was cancelled.",
        "queue it again if it should run";
    DiskNearlyFull = "disk-nearly-full", Worker, Failed, None, true,
        "The deployment's disk was nearly full, so no job was started; the jobs wait in the queue.",
        "free space on the state folder's file system (or lower PI_DISK_MIN_MB); the worker starts jobs again by itself";
    ContainerNeverStarted = "container-never-started", Worker, Failed, None, true,
        "The job's sandbox did not start.",
        "run `pi-dispatch doctor`: bubblewrap and the job image must work on this host";
    RunnerNoExitLine = "runner-no-exit-line", Worker, Failed, None, true,
        "The job's runner ended without saying how.",
        "run the worker with --runner-stderr to see the runner's own output";
    RunnerReasonUnknown = "runner-reason-unknown", Worker, Failed, None, false,
        "The job's runner gave a reason this worker does not know.",
        "run a worker and a job image of the same version";
    WorkerLost = "worker-lost", Worker, Failed, None, false,
        "The job's worker disappeared while it ran, on its last attempt.",
        "check why the worker stopped (its log, the host's memory)";
    ForgeDeliveryFailed = "forge-delivery-failed", Worker, Failed, None, false,
        "The agent finished, but its changes could not be pushed or proposed on the forge.",
        "check that the job's token may push a branch and open a pull request (the App's contents and pull request permissions)";
    JobOutputRefused = "job-output-refused", Worker, Policy, None, false,
        "The job left something in its repository that pi-dispatch does not publish: a special file, a nested repository, or a link out of it.",
        "the record names the path: have the job leave only files, folders and links inside the repository (its own work tree, no FIFO, device or nested .git)";
    JobOutputTooLarge = "job-output-too-large", Worker, Policy, None, false,
        "What the job left in its repository is larger than pi-dispatch publishes.",
        "the record names the limit: have the job ignore its build output in .gitignore, or raise PI_JOB_PUBLISH_FILE_MB or PI_JOB_PUBLISH_MB";
    JobOutputSecret = "job-output-secret", Worker, Policy, None, false,
        "What the job left in its repository holds a secret the job was given (as it is or encoded), so nothing was pushed.",
        "the record names the file and the variable: read the job's transcript for how the value got there, and rotate it if the job's clone left the host";
}

impl Reason {
    /// The spec's pickup table, in its order.
    pub const PICKUP_TABLE: [Reason; 11] = [
        Reason::McpListInvalid,
        Reason::McpConfigInvalid,
        Reason::McpServerUnknown,
        Reason::McpSecretReserved,
        Reason::McpSecretUnmapped,
        Reason::McpEgressUnreachable,
        Reason::McpPackageRunner,
        Reason::McpExcluded,
        Reason::JobImageMcpUnsupported,
        Reason::JobImageForgeMcpUnsupported,
        Reason::TriggerSkew,
    ];

    /// The spec's in-job table, in its order.
    pub const JOB_TABLE: [Reason; 7] = [
        Reason::McpUnavailable,
        Reason::McpUnreachable,
        Reason::McpShadowed,
        Reason::McpCommandMissing,
        Reason::McpSecretMissing,
        Reason::McpConfigMismatch,
        Reason::McpConfigInvalid,
    ];

    /// Whether the runner reports this reason before the agent started, so nothing was spent (the
    /// record says `budgetReserved: false`, and nobody is paged).
    pub fn before_the_agent(self) -> bool {
        matches!(
            self,
            Reason::RunnerSetupFailed
                | Reason::JobPromptUnreadable
                | Reason::AgentNeverStarted
                | Reason::ModelRulesInvalid
        )
    }

    /// The worker's log event of a refusal: `refused_mcp` for the spec's pickup table (the spec's
    /// name; the reason rides in the line's `reason` field), else `refused_<reason>`.
    pub fn log_event(self) -> String {
        if Reason::PICKUP_TABLE.contains(&self) {
            "refused_mcp".to_owned()
        } else {
            format!("refused_{}", self.as_str().replace('-', "_"))
        }
    }

    /// The fixed comment a forge issue gets for a refusal at pickup. `server` is the server the
    /// rule concerns, when there is one (a validated name, or `forge`); nothing else is put in.
    pub fn comment(self, server: Option<&str>) -> String {
        let subject = match server {
            Some(name) => format!("the MCP server `{name}`"),
            None => "an MCP server it names".to_owned(),
        };
        let why = match self {
            Reason::McpServerUnknown => format!("{subject} is not offered to jobs"),
            Reason::McpSecretReserved => format!(
                "{subject} references a credential reserved for the job itself (a provider key, the forge token, or a proxy or runner variable)"
            ),
            Reason::McpSecretUnmapped => {
                format!("{subject} references a variable the job will not have")
            }
            Reason::McpEgressUnreachable => {
                format!("the egress policy would not let the job reach {subject}")
            }
            Reason::McpPackageRunner => format!(
                "the egress policy would not let the package runner of {subject} reach its registry"
            ),
            Reason::McpExcluded => {
                format!("the trigger's excludeTools leaves {subject} no way in")
            }
            other => lowercase_first(other.sentence().trim_end_matches('.')),
        };
        format!(
            "pi-dispatch did not start this job: {why} (rule {}). Nothing was spent; the worker's log has the details.",
            self.as_str()
        )
    }
}

impl Reason {
    /// The fixed comment a forge issue gets when its job ended without finishing (a stop inside the
    /// job, a failure, the time limit): which rule stopped it, naming no server, host or variable.
    pub fn stop_comment(self) -> String {
        let said = lowercase_first(self.sentence().trim_end_matches('.'));
        format!(
            "pi-dispatch stopped this job: {said} (rule {}). The worker's log has the details.",
            self.as_str()
        )
    }
}

fn lowercase_first(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Reason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Reason {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Reason, D::Error> {
        let token = String::deserialize(d)?;
        Reason::parse(&token).ok_or_else(|| serde::de::Error::custom("an unknown reason"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spec's two tables of reasons as the repository keeps them (`spec_reason_tables.txt`):
    /// the pickup's tokens, and the job's tokens with their exit codes, in the spec's order.
    fn spec_rows() -> (Vec<String>, Vec<(String, u8)>) {
        let mut pickup = Vec::new();
        let mut job = Vec::new();
        for line in include_str!("spec_reason_tables.txt").lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                [] => {}
                [first, ..] if first.starts_with('#') => {}
                ["pickup", token] => pickup.push(token.to_string()),
                ["job", token, code] => job.push((token.to_string(), code.parse().unwrap())),
                _ => panic!("spec_reason_tables.txt: a line is neither a pickup nor a job row"),
            }
        }
        assert!(!pickup.is_empty() && !job.is_empty());
        (pickup, job)
    }

    #[test]
    fn tokens_match_the_spec_tables() {
        let (pickup, job) = spec_rows();
        let ours: Vec<&str> = Reason::PICKUP_TABLE.iter().map(|r| r.as_str()).collect();
        assert_eq!(ours, pickup);
        let ours: Vec<(String, u8)> = Reason::JOB_TABLE
            .iter()
            .map(|r| (r.as_str().to_owned(), r.code().unwrap()))
            .collect();
        assert_eq!(ours, job);
    }

    #[test]
    fn every_token_is_plain_unique_and_reads_back() {
        for (i, r) in Reason::ALL.iter().enumerate() {
            let t = r.as_str();
            // PI_ON_FAILURE's contract: ^[a-z0-9-]{1,40}$.
            assert!(
                !t.is_empty()
                    && t.len() <= 40
                    && t.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
                "{t}"
            );
            assert_eq!(Reason::parse(t), Some(*r));
            assert!(!Reason::ALL[..i].contains(r), "{t} twice");
            assert_eq!(serde_json::to_value(r).unwrap(), t);
            assert_eq!(serde_json::from_value::<Reason>(t.into()).unwrap(), *r);
            assert!(r.sentence().ends_with('.'), "{t}");
        }
        assert!(serde_json::from_value::<Reason>("no-such-reason".into()).is_err());
    }

    #[test]
    fn outcomes_codes_and_retries_follow_the_stage() {
        for r in Reason::ALL {
            match r.stage() {
                // Nothing was spent: a refusal is never retried and has no runner code (but
                // mcp-config-invalid, which is in both of the spec's tables).
                Stage::Admission => {
                    assert_eq!(r.outcome(), Outcome::Policy, "{r}");
                    assert!(!r.retried(), "{r}");
                }
                Stage::Job => assert!(r.code().is_some(), "{r}"),
                Stage::Preparation | Stage::Worker => assert_eq!(r.code(), None, "{r}"),
            }
            if r.code() == Some(2) {
                assert!(!r.retried(), "{r}: code 2 is never retried");
            }
        }
        assert!(Reason::McpUnreachable.retried());
        assert_eq!(Reason::ModelUnreachable.outcome(), Outcome::Failed);
        assert_eq!(Reason::Cancelled.outcome(), Outcome::Cancelled);
    }

    /// The repository's copy of the spec's tables is the spec's: read from `shared/spec/mcp.md`
    /// beside the repository, where the workplace lays it. Where it is not there (a clone elsewhere),
    /// the copy still holds the code to the tables (`tokens_match_the_spec_tables`); this test then
    /// checks the copy against the code's own tables again, and says that the spec was not read.
    #[test]
    fn the_rows_above_are_the_spec_tables() {
        let spec =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/spec/mcp.md");
        let (copy_pickup, copy_job) = spec_rows();
        let Ok(text) = std::fs::read_to_string(&spec) else {
            eprintln!(
                "spec not found at {}; the repository's copy of its tables was checked against the code only",
                spec.display()
            );
            assert_eq!(copy_pickup.len(), Reason::PICKUP_TABLE.len());
            assert_eq!(copy_job.len(), Reason::JOB_TABLE.len());
            return;
        };
        let pickup_start = text.find("Reason Why").unwrap();
        let pickup_end = text[pickup_start..]
            .find("The comment on the issue")
            .unwrap()
            + pickup_start;
        let pickup: Vec<&str> = text[pickup_start..pickup_end]
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert_eq!(pickup, copy_pickup);
        let job_start = text.find("Reason Code Why").unwrap();
        let job_end = text[job_start..].find("Each reason with code 2").unwrap() + job_start;
        let mut job: Vec<(String, u8)> = Vec::new();
        for line in text[job_start..job_end].lines().skip(1) {
            let words: Vec<&str> = line.split_whitespace().collect();
            // "mcp-config-mismatch, mcp-config-invalid 2 ..." names two tokens in one row.
            if let Some(at) = words.iter().position(|w| *w == "1" || *w == "2") {
                for w in &words[..at] {
                    job.push((
                        w.trim_end_matches(',').to_owned(),
                        words[at].parse().unwrap(),
                    ));
                }
            }
        }
        assert_eq!(job, copy_job);
    }

    #[test]
    fn sentences_and_comments_name_no_value() {
        for r in Reason::ALL {
            for text in [r.sentence().to_owned(), r.comment(Some("docs"))] {
                assert!(!text.contains('$') && !text.contains("://"), "{text}");
            }
            let c = r.comment(Some("docs"));
            assert!(c.contains(r.as_str()), "{c}");
            assert!(c.starts_with("pi-dispatch did not start this job"), "{c}");
        }
        assert_eq!(Reason::McpSecretUnmapped.log_event(), "refused_mcp");
        assert_eq!(
            Reason::ModelKeyMissing.log_event(),
            "refused_model_key_missing"
        );
    }
}
