//! Run records: one JSON file per job under `state/runs/`, written once when the job is over
//! (written whole to a temporary file, then renamed). A record holds outcomes, fixed reason tokens,
//! counts, names and times; never a secret, a header value or free text from the job. A reason the
//! runner reports is copied only when it is one of a closed set.

use protocol::detail::Detail;
use protocol::exit_line::{ExitLine, ServerState};
use protocol::job::Job;
use protocol::pi_events::PiEvent;
pub use protocol::reason::{Outcome, Reason};
use protocol::usage::ToolCallCount;
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

/// Unix milliseconds as a UTC time, to the second (`2026-12-05 21:04:09 UTC`).
pub fn utc(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map_or_else(
            || "?".to_owned(),
            |t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
        )
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
    /// Each server pinned by this job, or whose tools differed from their pin ([`PinReport`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pins: Vec<protocol::pins::PinReport>,
}

/// A host and port the egress proxy refused the job (protocol's, as the proxy says it).
pub use protocol::egress::Denied as EgressDenial;

/// Something pi began while the job ran, and when (Unix ms), as its events said at the time: a
/// turn, or a tool call (with the tool's name). A record keeps the first [`MAX_ACTIVITY`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Activity {
    pub at_ms: u64,
    /// `turn` or `tool`.
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
}

/// The most activity a record keeps.
pub const MAX_ACTIVITY: usize = 1000;

impl Activity {
    /// What pi's event `event` began at `at_ms`: a turn or a tool call; `None` for any other event.
    pub fn of_event(event: &PiEvent, at_ms: u64) -> Option<Activity> {
        let (kind, tool) = match event {
            PiEvent::TurnStart => ("turn", None),
            PiEvent::ToolStart { tool } => ("tool", tool.clone()),
            PiEvent::Answer(_) => return None,
        };
        Some(Activity {
            at_ms,
            kind: kind.to_owned(),
            tool,
        })
    }
}

/// The most of a local job's task a record keeps, in characters.
pub const MAX_TASK_CHARS: usize = 1000;

/// `text`'s first `max` characters, with `…` when something was left out.
fn cut_chars(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// One job's record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Record {
    pub job_id: String,
    /// What the job was for: a local job's task (its first [`MAX_TASK_CHARS`] characters), or
    /// the title of a forge job's issue or pull (merge) request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// A local job's repository folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub folder: Option<String>,
    /// A forge job's issue or pull (merge) request: `owner/name#N`, `group/project!N` for a GitLab
    /// merge request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item: Option<String>,
    /// Its web address on the forge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    pub outcome: Outcome,
    /// `None` for a completed job.
    pub reason: Option<Reason>,
    /// What the reason concerns, by name (server, field, variable, host, path), never a value.
    #[serde(default)]
    pub detail: Option<Detail>,
    /// What to do about it, in one line.
    #[serde(default)]
    pub fix: Option<String>,
    /// The runner's exit code; `None` when no runner ran (a refusal) or none reported.
    pub exit_code: Option<u8>,
    pub turns: Option<u64>,
    pub tokens: Option<Tokens>,
    pub cost_usd: Option<f64>,
    pub provider: Option<String>,
    pub model: Option<String>,
    /// Whether the job got past the checks that cost nothing (a sandbox was started for it).
    pub budget_reserved: bool,
    /// Whether the model provider counted anything (tokens or cost) for the job.
    #[serde(default)]
    pub spent: bool,
    pub attempt: u32,
    pub trigger_index: Option<usize>,
    pub trigger_type: String,
    pub kind: String,
    /// Unix milliseconds.
    pub queued_at_ms: Option<u64>,
    /// When the admission let it through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admitted_at_ms: Option<u64>,
    /// When its sandbox was asked for, and when it was up.
    pub started_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_up_at_ms: Option<u64>,
    pub finished_at_ms: u64,
    /// What pi began, and when.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub activity: Vec<Activity>,
    pub mcp: McpPart,
    /// The agent's last answer, with every secret the worker knows redacted.
    #[serde(default)]
    pub final_message: Option<String>,
    /// Whether the job's transcript is kept (`state/jobs/ID/transcript.jsonl`).
    #[serde(default)]
    pub transcript: bool,
    /// What the egress proxy refused the job (egress on), by host and port.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress_denied: Vec<EgressDenial>,
    /// The pull (merge) request a `fix` job proposed, by its web address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_request: Option<String>,
    /// The worker that wrote the record (`HOST:PID`): where the job's transcript and folder are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// On the record of an attempt that was run again: the job's id (this record's own id is
    /// [`Record::attempt_id`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_of: Option<String>,
    /// On a job's record: each earlier attempt that ran (a sandbox was started for it), by its own
    /// record. The record's turns, tokens and cost are then the whole run's: every attempt's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub earlier_attempts: Vec<EarlierAttempt>,
    /// The job this one ran again (`pi-dispatch rerun`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerun_of: Option<String>,
    /// The job as it was queued (what `rerun` queues again); `None` in records of earlier
    /// versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<Job>,
}

/// An earlier attempt of a job, as its own record says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EarlierAttempt {
    /// The attempt's own record.
    pub record: String,
    pub attempt: u32,
    pub outcome: Outcome,
    pub reason: Option<Reason>,
    pub turns: Option<u64>,
    pub tokens: Option<Tokens>,
    pub cost_usd: Option<f64>,
}

impl Record {
    /// A record for `job` with nothing spent yet: the caller fills in the rest.
    pub fn new(
        job: &Job,
        outcome: Outcome,
        reason: Option<Reason>,
        attempt: u32,
        now_ms: u64,
    ) -> Record {
        let event = job.event.as_ref();
        Record {
            job_id: job.id.clone(),
            task: match event {
                Some(e) => Some(cut_chars(&e.title, MAX_TASK_CHARS)),
                None => job.task.as_deref().map(|t| cut_chars(t, MAX_TASK_CHARS)),
            },
            folder: job.folder.clone(),
            item: event.map(|e| {
                let mark = match (e.forge, e.pull_request) {
                    (protocol::forge_event::Forge::Gitlab, true) => '!',
                    _ => '#',
                };
                format!("{}{mark}{}", e.repository, e.number)
            }),
            url: None,
            outcome,
            reason,
            detail: None,
            fix: None,
            exit_code: None,
            turns: None,
            tokens: None,
            cost_usd: None,
            provider: job.provider.clone(),
            model: job.model.clone(),
            budget_reserved: false,
            spent: false,
            attempt,
            trigger_index: job.trigger_index,
            trigger_type: job.trigger_type.clone(),
            kind: job.kind.clone(),
            queued_at_ms: None,
            admitted_at_ms: None,
            started_at_ms: None,
            sandbox_up_at_ms: None,
            finished_at_ms: now_ms,
            activity: Vec::new(),
            mcp: McpPart::default(),
            final_message: None,
            transcript: false,
            egress_denied: Vec::new(),
            pull_request: None,
            worker: None,
            attempt_of: None,
            earlier_attempts: Vec::new(),
            rerun_of: job.rerun_of.clone(),
            job: Some(job.clone()),
        }
    }

    /// The id of attempt `attempt`'s own record, for a job run again after it.
    pub fn attempt_id(job_id: &str, attempt: u32) -> String {
        format!("{job_id}.attempt-{attempt}")
    }

    /// This record as the record of an attempt that is run again: under its own id, linked to the
    /// job.
    pub fn as_earlier_attempt(&self) -> Record {
        Record {
            job_id: Record::attempt_id(&self.job_id, self.attempt),
            attempt_of: Some(self.job_id.clone()),
            ..self.clone()
        }
    }

    /// The job's record: this, its last attempt's, with the records of the earlier attempts
    /// `earlier` (oldest first) linked to it and what each spent added to its totals.
    pub fn with_earlier_attempts(mut self, earlier: Vec<Record>) -> Record {
        for e in earlier {
            if let Some(t) = &e.tokens {
                let mine = self.tokens.get_or_insert(Tokens {
                    input: 0,
                    output: 0,
                    total: 0,
                });
                mine.input += t.input;
                mine.output += t.output;
                mine.total += t.total;
            }
            if let Some(turns) = e.turns {
                self.turns = Some(self.turns.unwrap_or(0) + turns);
            }
            if let Some(cost) = e.cost_usd {
                self.cost_usd = Some(self.cost_usd.unwrap_or(0.0) + cost);
            }
            self.spent |= e.spent;
            self.budget_reserved |= e.budget_reserved;
            self.earlier_attempts.push(EarlierAttempt {
                record: e.job_id.clone(),
                attempt: e.attempt,
                outcome: e.outcome,
                reason: e.reason,
                turns: e.turns,
                tokens: e.tokens.clone(),
                cost_usd: e.cost_usd,
            });
        }
        self
    }

    /// The record of a job that ended for `reason`, with nothing spent yet: its outcome is the
    /// reason's.
    pub fn ended(job: &Job, reason: Reason, attempt: u32, now_ms: u64) -> Record {
        Record::new(job, reason.outcome(), Some(reason), attempt, now_ms)
    }

    /// With its detail and fix.
    pub fn with_detail(mut self, detail: Detail, fix: impl Into<String>) -> Record {
        self.detail = Some(detail);
        self.fix = Some(fix.into());
        self
    }

    /// What the record is found by in the store.
    pub fn keys(&self) -> queue::RecordKeys {
        queue::RecordKeys {
            finished_at_ms: self.finished_at_ms,
            outcome: self.outcome.as_str().to_owned(),
            reason: self.reason.map(|r| r.as_str().to_owned()),
            trigger_index: self.trigger_index.map(|i| i as u64),
            trigger_type: self.trigger_type.clone(),
            repo: self.repo().map(str::to_owned),
            folder: self.folder.clone(),
        }
    }

    /// A forge job's repository: its item without the number.
    pub fn repo(&self) -> Option<&str> {
        self.item
            .as_deref()
            .and_then(|i| i.split(['#', '!']).next())
    }

    /// What the model spent, as pi counted it.
    pub fn set_usage(&mut self, usage: &protocol::usage::Usage) {
        self.spent = usage.spent();
        self.turns = Some(usage.turns);
        self.tokens = Some(Tokens {
            input: usage.input_tokens,
            output: usage.output_tokens,
            total: usage.total_tokens,
        });
        self.cost_usd = Some(usage.cost_usd);
        if usage.provider.is_some() {
            self.provider.clone_from(&usage.provider);
        }
        if usage.model.is_some() {
            self.model.clone_from(&usage.model);
        }
    }
}

/// How a job ended: its outcome and, for any job but a completed one, its reason, what the reason
/// concerns and what to do about it. A record's ending is written from this in one place
/// ([`Draft::finish`]); a later step that ends the job otherwise (its writes not kept, its delivery
/// failed) makes a new `Ending`, never a change to a record.
#[derive(Debug, Clone, PartialEq)]
pub struct Ending {
    pub outcome: Outcome,
    pub reason: Option<Reason>,
    pub detail: Option<Detail>,
    pub fix: Option<String>,
}

impl Ending {
    /// The job did what it was asked.
    pub fn completed() -> Ending {
        Ending {
            outcome: Outcome::Completed,
            reason: None,
            detail: None,
            fix: None,
        }
    }

    /// The job ended for `reason`, with no detail: its outcome is the reason's.
    pub fn of(reason: Reason) -> Ending {
        Ending {
            outcome: reason.outcome(),
            reason: Some(reason),
            detail: None,
            fix: None,
        }
    }

    /// The job ended for `reason`, with what it concerns and the reason's own fix.
    pub fn failed(reason: Reason, detail: Detail) -> Ending {
        Ending::of(reason).with_detail(detail, reason.fix())
    }

    /// With its detail and fix.
    pub fn with_detail(self, detail: Detail, fix: impl Into<String>) -> Ending {
        Ending {
            detail: Some(detail),
            fix: Some(fix.into()),
            ..self
        }
    }

    /// How the runner's exit line says the job ended: code 0 completed; otherwise the outcome of
    /// the reason it gave, which is copied only when it is one of the product's, with the runner's
    /// cause (or the reason's sentence) and server as its detail.
    pub fn of_exit_line(line: &ExitLine) -> Ending {
        let reason = match (line.code, line.known_reason()) {
            (0, _) => return Ending::completed(),
            (_, Some(r)) => r,
            (_, None) => Reason::RunnerReasonUnknown,
        };
        let mut detail = Detail::new(
            line.cause
                .clone()
                .unwrap_or_else(|| reason.sentence().to_owned()),
        );
        detail.server.clone_from(&line.server);
        Ending::of(reason).with_detail(detail, reason.fix())
    }

    pub fn is_completed(&self) -> bool {
        self.outcome == Outcome::Completed
    }
}

/// A job's record as the worker builds it, once: what the job is (its id, trigger, task, item) is
/// taken from the job when it is picked up, the times are set as the job reaches them, and every
/// way the job can end makes its record from this, so no record is patched afterwards.
#[derive(Debug, Clone)]
pub struct Draft {
    base: Record,
    /// What the job shows while it runs, when someone may look.
    live: Option<std::sync::Arc<dyn Watched>>,
    /// What the job's earlier attempts spent, in USD: a later attempt has what they left of the
    /// job's cost cap.
    spent_before: f64,
    /// The worker that runs the job (`HOST:PID`): the finished record names it.
    worker: Option<String>,
    /// What each ready server listed, as the runner reported it: the worker holds it to the
    /// server's pin; the record keeps only what differed.
    listings: Vec<(String, protocol::pins::Listing)>,
    /// Each server's tools' definitions the runner signed, by server name (not yet held to the
    /// listings: [`protocol::pins::verified_definitions`] does that).
    definitions: std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
}

/// Where a running job is shown as it goes ([`crate::live::LiveFeed`]): told its record as it
/// stands, the servers' states once the runner says them, what pi began, and each line of its
/// transcript, redacted.
pub trait Watched: Send + Sync + std::fmt::Debug {
    fn record(&self, record: &Record);
    fn servers(&self, servers: Vec<ServerState>);
    fn activity(&self, activity: &Activity);
    fn line(&self, text: &str);
}

impl Draft {
    pub fn new(job: &Job, attempt: u32) -> Draft {
        Draft {
            base: Record::new(job, Outcome::Failed, None, attempt, 0),
            live: None,
            spent_before: 0.0,
            worker: None,
            listings: Vec::new(),
            definitions: Default::default(),
        }
    }

    /// What the job's earlier attempts spent (their records' costs), in USD.
    pub fn spent_before(&mut self, usd: f64) {
        self.spent_before = usd;
    }

    /// [`Draft::spent_before`], as set.
    pub fn earlier_spending(&self) -> f64 {
        self.spent_before
    }

    /// Shows the job live through `feed` from now on.
    pub fn show_live(&mut self, feed: std::sync::Arc<dyn Watched>) {
        feed.record(&self.base);
        self.live = Some(feed);
    }

    /// The record as it stands.
    pub fn record_now(&self) -> Record {
        self.base.clone()
    }

    /// Where the job is shown live, if it is.
    pub fn live(&self) -> Option<std::sync::Arc<dyn Watched>> {
        self.live.clone()
    }

    /// The record as it stands, to the live view.
    fn shown(&self) {
        if let Some(feed) = &self.live {
            feed.record(&self.base);
        }
    }

    pub fn job_id(&self) -> &str {
        &self.base.job_id
    }

    pub fn attempt(&self) -> u32 {
        self.base.attempt
    }

    /// When the job was queued.
    pub fn queued_at(&mut self, ms: u64) {
        self.base.queued_at_ms = Some(ms);
        self.shown();
    }

    /// A forge job's issue on the forge, by its web address.
    pub fn url(&mut self, url: Option<String>) {
        self.base.url = url;
        self.shown();
    }

    /// When the admission let the job through.
    pub fn admitted(&mut self, ms: u64) {
        self.base.admitted_at_ms = Some(ms);
        self.shown();
    }

    /// When its sandbox was asked for: from here on, a record says a sandbox was started.
    pub fn started(&mut self, ms: u64) {
        self.base.started_at_ms = Some(ms);
        self.base.budget_reserved = true;
        self.shown();
    }

    /// When its sandbox was up.
    pub fn sandbox_up(&mut self, ms: u64) {
        self.base.sandbox_up_at_ms = Some(ms);
        self.shown();
    }

    /// What pi began, and whether the job's transcript is kept, once its output is read.
    pub fn ran(&mut self, activity: Vec<Activity>, transcript: bool) {
        self.base.activity = activity;
        self.base.transcript = transcript;
    }

    /// What the egress proxy refused the job.
    pub fn egress_denied(&mut self, denied: Vec<EgressDenial>) {
        self.base.egress_denied = denied;
    }

    /// The worker that runs the job, which its record names (shown live apart).
    pub fn written_by(&mut self, worker: &str) {
        self.worker = Some(worker.to_owned());
    }

    /// Whether a sandbox may have been started for the job, for a job this worker did not run (a
    /// lost one); [`Draft::started`] says it for a job it runs.
    pub fn reserved(&mut self, reserved: bool) {
        self.base.budget_reserved = reserved;
    }

    /// What the model spent, as pi counted it.
    pub fn usage(&mut self, usage: &protocol::usage::Usage) {
        self.base.set_usage(usage);
    }

    /// The servers' states and the tool calls the runner reported in `line`. What each server
    /// listed is kept apart ([`Draft::listings`]): the record says only what differed from a pin.
    pub fn mcp_reported(&mut self, line: &ExitLine) {
        let mut servers = line.servers.clone();
        self.listings = servers
            .iter_mut()
            .filter_map(|s| Some((s.name.clone(), s.listing.take()?)))
            .collect();
        self.base.mcp = McpPart {
            servers,
            tool_calls: line.tool_calls.clone(),
            pins: Vec::new(),
        };
    }

    /// What each ready server listed, as the runner reported it (by server name).
    pub fn listings(&self) -> &[(String, protocol::pins::Listing)] {
        &self.listings
    }

    /// The servers' tools' definitions the runner said, by server name.
    pub fn definitions_said(
        &mut self,
        definitions: std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
    ) {
        self.definitions = definitions;
    }

    /// The definitions `server`'s tools were said to have (empty when none were).
    pub fn definitions(&self, server: &str) -> std::collections::BTreeMap<String, String> {
        self.definitions.get(server).cloned().unwrap_or_default()
    }

    /// What the job's servers made of their pins.
    pub fn pins_reported(&mut self, reports: Vec<protocol::pins::PinReport>) {
        self.base.mcp.pins = reports;
    }

    /// What the runner reported in `line` but how the job ended ([`Ending::of_exit_line`]): its
    /// code, whether anything was spent (the runner's own faults come before the agent starts),
    /// the MCP part, the final message (through `redact`) and the usage.
    pub fn reported(&mut self, line: &ExitLine, redact: impl Fn(&str) -> String) {
        let reason = Ending::of_exit_line(line).reason;
        self.base.exit_code = Some(line.code);
        self.base.budget_reserved = !reason.is_some_and(Reason::before_the_agent);
        self.mcp_reported(line);
        self.base.final_message = line.final_message.as_deref().map(redact);
        if let Some(usage) = &line.usage {
            self.usage(usage);
        }
    }

    /// The pull (merge) request a `fix` job proposed.
    pub fn proposed(&mut self, url: String) {
        self.base.pull_request = Some(url);
    }

    /// The record, finished now as `ending` says.
    pub fn finish(&self, ending: Ending) -> Record {
        self.finish_at(ending, now_ms())
    }

    /// The record, finished at `ms` (when the job's run ended, before a delivery after it) as
    /// `ending` says: the one place a record's ending is written.
    pub fn finish_at(&self, ending: Ending, ms: u64) -> Record {
        let Ending {
            outcome,
            reason,
            detail,
            fix,
        } = ending;
        Record {
            outcome,
            reason,
            detail,
            fix,
            finished_at_ms: ms,
            worker: self.worker.clone(),
            ..self.base.clone()
        }
    }

    /// The record of a job that ended for `reason` now, with no detail.
    pub fn ended(&self, reason: Reason) -> Record {
        self.finish(Ending::of(reason))
    }

    /// The record of a job that ended for `reason` now, with what it concerns and the reason's
    /// own fix.
    pub fn failed(&self, reason: Reason, detail: Detail) -> Record {
        self.finish(Ending::failed(reason, detail))
    }

    /// The record of a job whose runner reported `line`: code 0 completed; otherwise the outcome
    /// of the reason it gave, which is copied only when it is one of the product's.
    pub fn from_exit_line(&self, line: &ExitLine) -> Record {
        let mut draft = self.clone();
        draft.reported(line, str::to_owned);
        draft.finish(Ending::of_exit_line(line))
    }
}

/// The queued job, when its payload is one (and for the id it was queued under).
pub fn job_of(id: &str, payload: &str) -> Option<Job> {
    serde_json::from_str::<Job>(payload)
        .ok()
        .filter(|j| j.id == id)
}

/// A job that holds only its id, for the record of a payload that is not a job.
pub fn stub(id: &str) -> Job {
    Job::new(id, "unknown", "unknown")
}

#[cfg(test)]
#[path = "record_tests.rs"]
mod tests;
