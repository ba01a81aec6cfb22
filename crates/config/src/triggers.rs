//! `triggers.json`: which events start which jobs, and what each job may do.
//!
//! ```json
//! {"triggers": [
//!   {"on": {"type": "label", "any": ["docs"]},
//!    "run": {"kind": "github", "flow": "answer", "mcp": ["docs"],
//!            "secrets": {"DOCS_TOKEN": "op://ci/docs/token"}, "secretsProfile": "ci"}}
//! ]}
//! ```
//!
//! One file, read by the worker (cron) and the receiver (forges) with this one validator. It is read
//! strictly and whole: a duplicate key anywhere, a wrong top level, or any error in any trigger refuses
//! the file, and every error found is reported at once. Nothing is repaired: no trimming, a boolean is
//! a boolean and a number a number, and a field accepted where it would do nothing is refused.
//!
//! Every message names the trigger's index and the field (`triggers[2].run.mcp[1]`), never the value
//! written there. A key is named only when it is plain (see [`printable_key`]), as in `mcp.json`.

use std::collections::HashMap;
use std::fmt;

use unicode_general_category::{GeneralCategory, get_general_category};

use crate::json::{self, Json, JsonError, Object};
use crate::mcp::{self, ServerName};
use crate::problem::printable_key;
pub use protocol::pins::PinPolicy;

/// The largest file read; a larger one is refused whole rather than held in memory.
pub const MAX_FILE_BYTES: usize = 8 * 1024 * 1024;
/// `on.id` of a cron trigger: a name of [`mcp::is_name_shape`]'s shape, at most 32 characters.
pub const MAX_CRON_ID_CHARS: usize = mcp::MAX_NAME_CHARS;
pub const MAX_LABEL_CHARS: usize = 100;
pub const MAX_PHRASE_CHARS: usize = 200;
pub const MAX_FLOW_CHARS: usize = 64;
pub const MAX_COMMAND_CHARS: usize = 1000;
pub const MAX_TASK_CHARS: usize = 10_000;
pub const MAX_MCP_NAMES: usize = 8;
pub const MAX_SECRETS: usize = 16;
pub const MAX_SECRET_REFERENCE_CHARS: usize = 500;
/// The resolver profile of `run.secrets` when the trigger names none.
pub const DEFAULT_SECRETS_PROFILE: &str = "default";

/// `run.secretsProfile`: a name of [`mcp::is_name_shape`]'s shape, at most 32 characters.
pub const MAX_SECRETS_PROFILE_CHARS: usize = mcp::MAX_NAME_CHARS;
pub const MAX_MODEL_CHARS: usize = 200;
pub const MAX_MODELS: usize = 16;
/// `run.maxCostUsd` is more than zero and at most this.
pub const MAX_COST_USD: f64 = 10_000.0;
pub const MAX_EXCLUDE_TOOLS: usize = 64;
pub const MAX_TOOL_CHARS: usize = 128;
pub const MAX_IMAGE_CHARS: usize = 64;

pub const PULL_REQUEST_ACTIONS: [&str; 6] = [
    "opened",
    "reopened",
    "synchronize",
    "edited",
    "labeled",
    "ready_for_review",
];
pub const ISSUE_ACTIONS: [&str; 4] = ["opened", "reopened", "edited", "labeled"];

/// Names a trigger's `run.secrets` may not bind, besides every name starting with
/// [`RESERVED_SECRET_PREFIX`] and the [`PROXY_VARIABLES`] in any letter case: the job's runner and
/// usage meter, and the forge's token and host variables.
pub const RESERVED_SECRET_NAMES: [&str; 12] = [
    "NODE_OPTIONS",
    "HOME",
    "PATH",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "GITHUB_TOKEN",
    "GH_TOKEN",
    "GH_HOST",
    "GITLAB_TOKEN",
    "GL_TOKEN",
    "GITLAB_HOST",
    "GITLAB_URL",
];
/// Names starting with this belong to pi and pi-dispatch.
pub const RESERVED_SECRET_PREFIX: &str = "PI_";
/// The egress proxy's variables, reserved in any letter case (programs read both spellings).
pub const PROXY_VARIABLES: [&str; 4] = ["HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "ALL_PROXY"];

/// Whether `run.secrets` may not bind `name`.
pub fn is_reserved_secret_name(name: &str) -> bool {
    reserved_secret_reason(name).is_some()
}

fn reserved_secret_reason(name: &str) -> Option<&'static str> {
    if name.starts_with(RESERVED_SECRET_PREFIX) {
        return Some(
            "a name starting with PI_ belongs to pi and pi-dispatch; a trigger cannot bind it",
        );
    }
    if PROXY_VARIABLES.iter().any(|p| p.eq_ignore_ascii_case(name)) {
        return Some(
            "the proxy variables (in any letter case) are set by the worker; a trigger cannot bind them",
        );
    }
    match name {
        "NODE_OPTIONS" => {
            Some("NODE_OPTIONS belongs to the job's usage meter; a trigger cannot bind it")
        }
        "HOME" | "PATH" | "LD_PRELOAD" | "LD_LIBRARY_PATH" => {
            Some("this variable is set by the job's runner; a trigger cannot bind it")
        }
        n if RESERVED_SECRET_NAMES.contains(&n) => Some(
            "the forge's token and host variables are set by the worker for the job; a trigger cannot bind them",
        ),
        _ => None,
    }
}

/// The whole file, every trigger valid.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Triggers {
    pub triggers: Vec<Trigger>,
}

impl Triggers {
    /// Whether any trigger names a server of the overlay (anything but `forge`) in `run.mcp`: only
    /// then do its jobs need the overlay's `mcp.json`.
    pub fn names_overlay_servers(&self) -> bool {
        self.triggers.iter().any(|t| {
            t.run
                .mcp
                .iter()
                .flatten()
                .any(|n| matches!(n, McpName::Server(_)))
        })
    }

    /// Every name in a trigger's `run.mcp` that `overlay` does not offer, in file order: a job of
    /// that trigger is refused at pickup (`mcp-server-unknown`). `forge` is never one.
    pub fn unoffered(&self, overlay: &mcp::Overlay) -> Vec<Unoffered<'_>> {
        let mut out = Vec::new();
        for t in &self.triggers {
            for (i, name) in t.run.mcp.iter().flatten().enumerate() {
                let McpName::Server(name) = name else {
                    continue;
                };
                let why = match overlay.entry(name.as_str()) {
                    None => NotOffered::Missing,
                    Some(e) if e.verdict.is_err() => NotOffered::Refused,
                    Some(e) if e.offered().is_none() => NotOffered::TurnedOff,
                    Some(_) => continue,
                };
                out.push(Unoffered {
                    path: format!("triggers[{}].run.mcp[{i}]", t.index),
                    name,
                    why,
                });
            }
        }
        out
    }
}

/// A server a trigger names that the overlay does not offer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unoffered<'a> {
    /// Where, as `triggers[2].run.mcp[1]`.
    pub path: String,
    pub name: &'a ServerName,
    pub why: NotOffered,
}

/// Why the overlay does not offer a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotOffered {
    /// The overlay's `mcp.json` has no entry of that name.
    Missing,
    /// It has one, and refuses it (`mcp check` says why).
    Refused,
    /// It has a valid one with `"enabled": false`.
    TurnedOff,
}

impl NotOffered {
    pub fn as_str(self) -> &'static str {
        match self {
            NotOffered::Missing => "has no such server",
            NotOffered::Refused => "refuses it (`pi-dispatch mcp check` says why)",
            NotOffered::TurnedOff => "turns it off (\"enabled\": false)",
        }
    }
}

/// One trigger: the event that starts it and the job it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Trigger {
    /// Its place in the file's `triggers` array, from 0.
    pub index: usize,
    pub on: On,
    pub run: Run,
}

impl Trigger {
    /// The job this trigger queues now.
    pub fn job(&self, id: impl Into<String>) -> protocol::job::Job {
        let trigger = self;
        let run = &trigger.run;
        let (flow, command) = match &run.action {
            Action::Flow(f) => (Some(f.clone()), None),
            Action::Command(c) => (None, Some(c.clone())),
        };
        protocol::job::Job {
            id: id.into(),
            trigger_index: Some(trigger.index),
            trigger_type: trigger.on.type_name().to_owned(),
            kind: run.kind.as_str().to_owned(),
            flow,
            command,
            mcp: run
                .mcp
                .as_ref()
                .map(|names| protocol::job::McpField::names(names.iter().map(|n| n.as_str()))),
            secrets: run.secrets.iter().map(|(name, _)| name.clone()).collect(),
            provider: run.provider.clone(),
            model: run.model.clone(),
            models: run.models.clone(),
            max_cost_usd: run.max_cost_usd,
            exclude_tools: run.exclude_tools.clone(),
            image: run.image.clone(),
            folder: run.folder.clone(),
            task: run.task.clone(),
            secrets_profile: run.secrets_profile.clone(),
            event: None,
            labels: run.labels.clone(),
            host: None,
            rerun_of: None,
            pins: (run.pins != PinPolicy::default()).then_some(run.pins),
        }
    }
}

/// What starts a trigger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum On {
    /// `id` is unique among the file's cron triggers; `pattern` is one the worker's scheduler
    /// takes ([`cron_schedule`]).
    Cron {
        id: String,
        pattern: String,
    },
    /// Each list is empty when the file leaves it out; `any` and `all` are not both empty.
    Label {
        any: Vec<String>,
        all: Vec<String>,
        none: Vec<String>,
    },
    Comment {
        phrase: String,
    },
    /// One of [`PULL_REQUEST_ACTIONS`].
    PullRequest {
        action: String,
    },
    /// One of [`ISSUE_ACTIONS`].
    Issue {
        action: String,
    },
}

impl On {
    /// The `on.type` written in the file: `cron`, `label`, `comment`, `pull_request` or `issue`.
    pub fn type_name(&self) -> &'static str {
        self.on_type().as_str()
    }

    fn on_type(&self) -> OnType {
        match self {
            On::Cron { .. } => OnType::Cron,
            On::Label { .. } => OnType::Label,
            On::Comment { .. } => OnType::Comment,
            On::PullRequest { .. } => OnType::PullRequest,
            On::Issue { .. } => OnType::Issue,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnType {
    Cron,
    Label,
    Comment,
    PullRequest,
    Issue,
}

impl OnType {
    const ALL: [OnType; 5] = [
        OnType::Cron,
        OnType::Label,
        OnType::Comment,
        OnType::PullRequest,
        OnType::Issue,
    ];

    fn as_str(self) -> &'static str {
        match self {
            OnType::Cron => "cron",
            OnType::Label => "label",
            OnType::Comment => "comment",
            OnType::PullRequest => "pull_request",
            OnType::Issue => "issue",
        }
    }

    fn parse(s: &str) -> Option<OnType> {
        OnType::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// The keys of `on` for this type, `type` first.
    fn keys(self) -> &'static [&'static str] {
        match self {
            OnType::Cron => &["type", "id", "pattern"],
            OnType::Label => &["type", "any", "all", "none"],
            OnType::Comment => &["type", "phrase"],
            OnType::PullRequest | OnType::Issue => &["type", "action"],
        }
    }
}

/// Every key of `on`, whatever its type.
const ON_KEYS: [&str; 8] = [
    "type", "id", "pattern", "any", "all", "none", "phrase", "action",
];

pub use protocol::job::Kind;

/// What the job does: a named flow, or a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Flow(String),
    Command(String),
}

/// A name in `run.mcp`: the forge's own server, or a server the overlay's `mcp.json` may offer.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum McpName {
    Forge,
    Server(ServerName),
}

impl McpName {
    pub fn as_str(&self) -> &str {
        match self {
            McpName::Forge => mcp::FORGE,
            McpName::Server(name) => name.as_str(),
        }
    }
}

impl fmt::Display for McpName {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The job a trigger runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub kind: Kind,
    pub action: Action,
    /// Present exactly for [`Kind::Local`]: an absolute path.
    pub folder: Option<String>,
    /// Present exactly for [`Kind::Local`].
    pub task: Option<String>,
    /// 1 to 8 distinct names when present; [`McpName::Forge`] only on github and gitlab jobs.
    pub mcp: Option<Vec<McpName>>,
    /// `(ENV_NAME, reference)` in file order; empty when the file has no `secrets`.
    pub secrets: Vec<(String, String)>,
    /// Present exactly when `secrets` is.
    pub secrets_profile: Option<String>,
    pub provider: Option<String>,
    /// Only with `provider`.
    pub model: Option<String>,
    /// `provider/model` entries, 1 to 16, distinct.
    pub models: Option<Vec<String>>,
    pub max_cost_usd: Option<f64>,
    /// Empty when the file has no `excludeTools`.
    pub exclude_tools: Vec<String>,
    pub image: Option<String>,
    /// The labels a worker must carry to take the job; empty when the file has no `labels`.
    pub labels: Vec<String>,
    /// What a forge job does when another job for its issue is not done yet.
    pub same_issue: SameIssue,
    /// `run.pins`: what the job does with a server's tools that no longer match their pin.
    pub pins: PinPolicy,
}

/// `run.sameIssue`: a forge job's issue (or pull request) has one job at a time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SameIssue {
    /// `"wait"` (the default): the newer job waits until the older ones are done.
    #[default]
    Wait,
    /// `"cancel-older"`: the older jobs are cancelled, and the newer runs once they have stopped.
    CancelOlder,
}

/// The keys of `run`: every field a trigger gives its job (the receiver's forwarding test is derived from it).
pub const RUN_KEYS: [&str; 17] = [
    "kind",
    "flow",
    "command",
    "folder",
    "task",
    "mcp",
    "secrets",
    "secretsProfile",
    "provider",
    "model",
    "models",
    "maxCostUsd",
    "excludeTools",
    "image",
    "labels",
    "sameIssue",
    "pins",
];

/// One reason the file is refused: where (`triggers[2].run.mcp[1]`, or empty for the file as a
/// whole) and why. Neither ever holds a value from the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", located(.path, .message))]
pub struct TriggerError {
    pub path: String,
    pub message: String,
}

impl TriggerError {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> TriggerError {
        TriggerError {
            path: path.into(),
            message: message.into(),
        }
    }
}

fn located(path: &str, message: &str) -> String {
    if path.is_empty() {
        message.to_owned()
    } else {
        format!("{path}: {message}")
    }
}

/// Why `triggers.json` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TriggersError {
    #[error("triggers.json is larger than {} MiB", MAX_FILE_BYTES / (1024 * 1024))]
    TooLarge,
    #[error("triggers.json is not UTF-8 text")]
    NotUtf8,
    /// Not strict JSON, or a key written twice in one object.
    #[error("triggers.json is {0}")]
    Json(JsonError),
    /// Read as JSON, but the top level or some triggers are wrong: every error found, in file order.
    #[error("triggers.json is refused: {}", joined(.0))]
    Invalid(Vec<TriggerError>),
}

fn joined(errors: &[TriggerError]) -> String {
    errors
        .iter()
        .map(TriggerError::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl TriggersError {
    /// What is wrong, after the file's name (`is refused: ...`, `is not UTF-8 text`), for a message
    /// that names the file by its own path.
    pub fn what(&self) -> String {
        let text = self.to_string();
        text.strip_prefix("triggers.json ")
            .map_or_else(|| text.clone(), str::to_owned)
    }

    /// A stable token for the kind of refusal.
    pub fn code(&self) -> &'static str {
        match self {
            TriggersError::TooLarge => "file-too-large",
            TriggersError::NotUtf8 => "not-utf8",
            TriggersError::Json(JsonError::DuplicateKey { .. }) => "duplicate-key",
            TriggersError::Json(JsonError::Syntax { .. }) => "not-json",
            TriggersError::Invalid(_) => "triggers-invalid",
        }
    }

    /// The errors of an [`TriggersError::Invalid`] file; empty for the other kinds.
    pub fn errors(&self) -> &[TriggerError] {
        match self {
            TriggersError::Invalid(errors) => errors,
            _ => &[],
        }
    }
}

/// Reads `triggers.json` from its bytes.
pub fn parse_triggers(bytes: &[u8]) -> Result<Triggers, TriggersError> {
    if bytes.len() > MAX_FILE_BYTES {
        return Err(TriggersError::TooLarge);
    }
    let text = std::str::from_utf8(bytes).map_err(|_| TriggersError::NotUtf8)?;
    let root = json::parse(text).map_err(TriggersError::Json)?;
    let mut check = Check::default();
    let triggers = check.file(&root);
    if check.errors.is_empty() {
        Ok(Triggers { triggers })
    } else {
        Err(TriggersError::Invalid(check.errors))
    }
}

/// A run's model: `run.provider`, `run.model` and `run.models` as read.
struct ModelChoice {
    provider: Option<String>,
    model: Option<String>,
    models: Option<Vec<String>>,
}

#[derive(Default)]
struct Check {
    errors: Vec<TriggerError>,
    /// The cron ids seen so far, with the index of the trigger that has each.
    cron_ids: HashMap<String, usize>,
}

impl Check {
    fn err(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.errors.push(TriggerError::new(path, message));
    }

    fn file(&mut self, root: &Json) -> Vec<Trigger> {
        let Json::Object(root) = root else {
            self.err(
                "",
                format!(
                    "triggers.json must be an object with a 'triggers' array, not {}",
                    root.kind()
                ),
            );
            return Vec::new();
        };
        self.unknown_keys("", root, &["triggers"], |_| None);
        let items = match root.get("triggers") {
            None => {
                self.err("", "triggers.json has no 'triggers' array");
                return Vec::new();
            }
            Some(Json::Array(items)) => items,
            Some(other) => {
                self.err(
                    "triggers",
                    format!("must be an array of triggers, not {}", other.kind()),
                );
                return Vec::new();
            }
        };
        items
            .iter()
            .enumerate()
            .filter_map(|(index, item)| self.trigger(index, item))
            .collect()
    }

    fn trigger(&mut self, index: usize, item: &Json) -> Option<Trigger> {
        let path = format!("triggers[{index}]");
        let Json::Object(o) = item else {
            self.err(
                path,
                format!(
                    "a trigger must be an object with 'on' and 'run', not {}",
                    item.kind()
                ),
            );
            return None;
        };
        let before = self.errors.len();
        self.unknown_keys(&path, o, &["on", "run"], |_| None);
        let on = match o.get("on") {
            None => {
                self.err(format!("{path}.on"), "a trigger needs 'on': what starts it");
                None
            }
            Some(value) => self.on(index, &format!("{path}.on"), value),
        };
        let (on_type, on) = match on {
            Some(Ok(on)) => (Some(on.on_type()), Some(on)),
            Some(Err(t)) => (t, None),
            None => (None, None),
        };
        let run = match o.get("run") {
            None => {
                self.err(
                    format!("{path}.run"),
                    "a trigger needs 'run': the job it starts",
                );
                None
            }
            Some(value) => self.run(&format!("{path}.run"), value, on_type),
        };
        if self.errors.len() != before {
            return None;
        }
        Some(Trigger {
            index,
            on: on?,
            run: run?,
        })
    }

    /// `on`, or the type it names when that much is valid (for the checks of `run` against it).
    fn on(&mut self, index: usize, path: &str, value: &Json) -> Option<Result<On, Option<OnType>>> {
        let Json::Object(o) = value else {
            self.err(
                path,
                format!("'on' must be an object, not {}", value.kind()),
            );
            return None;
        };
        let before = self.errors.len();
        let Some(on_type) = self.on_type(path, o) else {
            // Without a type only the keys no type knows can be told wrong.
            self.unknown_keys(path, o, &ON_KEYS, |_| None);
            return Some(Err(None));
        };
        self.unknown_keys(path, o, on_type.keys(), |key| {
            OnType::ALL
                .into_iter()
                .find(|t| t.keys().contains(&key))
                .map(|owner| {
                    format!(
                        "a {} trigger has no '{key}' (it belongs to {} triggers)",
                        on_type.as_str(),
                        owner.as_str()
                    )
                })
        });
        let on = match on_type {
            OnType::Cron => self.cron(index, path, o),
            OnType::Label => self.label(path, o),
            OnType::Comment => {
                let phrase = self
                    .required(path, o, "phrase")
                    .and_then(|(p, v)| self.text(&p, v, MAX_PHRASE_CHARS, Lines::One));
                phrase.map(|phrase| On::Comment { phrase })
            }
            OnType::PullRequest => self
                .action(path, o, &PULL_REQUEST_ACTIONS)
                .map(|action| On::PullRequest { action }),
            OnType::Issue => self
                .action(path, o, &ISSUE_ACTIONS)
                .map(|action| On::Issue { action }),
        };
        match on {
            Some(on) if self.errors.len() == before => Some(Ok(on)),
            _ => Some(Err(Some(on_type))),
        }
    }

    /// `on.type`: one of the trigger types.
    fn on_type(&mut self, path: &str, o: &Object) -> Option<OnType> {
        let p = format!("{path}.type");
        match o.get("type") {
            None => {
                self.err(
                    p,
                    "'on' needs a type: cron, label, comment, pull_request or issue",
                );
                None
            }
            Some(Json::String(t)) => {
                let parsed = OnType::parse(t);
                if parsed.is_none() {
                    self.err(p, "must be cron, label, comment, pull_request or issue");
                }
                parsed
            }
            Some(other) => {
                self.err(
                    p,
                    format!(
                        "must be the string cron, label, comment, pull_request or issue, not {}",
                        other.kind()
                    ),
                );
                None
            }
        }
    }

    fn cron(&mut self, index: usize, path: &str, o: &Object) -> Option<On> {
        let id = self.required(path, o, "id").and_then(|(p, v)| {
            let id = self.string(&p, v)?;
            if !mcp::is_name_shape(id) {
                self.err(
                    p,
                    format!(
                        "a cron id is lowercase letters and digits, words joined by single '-', at most {MAX_CRON_ID_CHARS} characters"
                    ),
                );
                return None;
            }
            if let Some(first) = self.cron_ids.get(id) {
                self.err(
                    p,
                    format!("is also the id of triggers[{first}]: cron ids are unique in the file"),
                );
                return None;
            }
            self.cron_ids.insert(id.to_owned(), index);
            Some(id.to_owned())
        });
        let pattern = self.required(path, o, "pattern").and_then(|(p, v)| {
            let pattern = self.string(&p, v)?;
            if !is_cron_pattern(pattern) {
                self.err(
                    p,
                    "a cron pattern is 5 or 6 fields separated by single spaces, each of digits, letters and * / , - ? # only",
                );
                return None;
            }
            if cron_schedule(pattern).is_err() {
                self.err(
                    p,
                    "the cron pattern names a time that does not exist (minutes 0-59, hours 0-23, days 1-31, months 1-12, weekdays 0-7, a step of at least 1)",
                );
                return None;
            }
            Some(pattern.to_owned())
        });
        Some(On::Cron {
            id: id?,
            pattern: pattern?,
        })
    }

    fn label(&mut self, path: &str, o: &Object) -> Option<On> {
        let before = self.errors.len();
        let list = |check: &mut Check, key: &str| -> Vec<String> {
            let Some(value) = o.get(key) else {
                return Vec::new();
            };
            let p = format!("{path}.{key}");
            check
                .array(&p, value, 1, usize::MAX, "labels")
                .map(|items| {
                    check.distinct_texts(&p, items, |check, item_path, item| {
                        check.text(item_path, item, MAX_LABEL_CHARS, Lines::One)
                    })
                })
                .unwrap_or_default()
        };
        let any = list(self, "any");
        let all = list(self, "all");
        let none = list(self, "none");
        if o.get("any").is_none() && o.get("all").is_none() {
            self.err(
                path,
                "a label trigger needs 'any' or 'all': 'none' alone would start a job on every label change",
            );
        }
        // A label both wanted and refused makes the trigger never fire, or its mention do nothing.
        for (k, label) in none.iter().enumerate() {
            if any.contains(label) || all.contains(label) {
                self.err(
                    format!("{path}.none[{k}]"),
                    "this label is also named in 'any' or 'all'",
                );
            }
        }
        (self.errors.len() == before).then_some(On::Label { any, all, none })
    }

    fn action(&mut self, path: &str, o: &Object, allowed: &[&str]) -> Option<String> {
        let (p, v) = self.required(path, o, "action")?;
        let action = self.string(&p, v)?;
        if !allowed.contains(&action) {
            self.err(p, format!("must be one of {}", allowed.join(", ")));
            return None;
        }
        Some(action.to_owned())
    }

    fn run(&mut self, path: &str, value: &Json, on_type: Option<OnType>) -> Option<Run> {
        let Json::Object(o) = value else {
            self.err(
                path,
                format!("'run' must be an object, not {}", value.kind()),
            );
            return None;
        };
        let before = self.errors.len();
        let field = |key: &str| format!("{path}.{key}");
        self.unknown_keys(path, o, &RUN_KEYS, |_| None);
        let kind = self.kind(path, o, on_type);
        let action = self.flow_or_command(path, o);
        let folder = self
            .local_only(path, o, "folder", kind)
            .and_then(|v| self.folder(&field("folder"), v));
        let task = self
            .local_only(path, o, "task", kind)
            .and_then(|v| self.text(&field("task"), v, MAX_TASK_CHARS, Lines::Many));
        let mcp = o.get("mcp").and_then(|v| self.mcp(&field("mcp"), v, kind));
        let secrets = o
            .get("secrets")
            .and_then(|v| self.secrets(&field("secrets"), v));
        let secrets_profile = self.secrets_profile(path, o);
        let model = self.model_choice(path, o);
        let max_cost_usd = o
            .get("maxCostUsd")
            .and_then(|v| self.max_cost_usd(&field("maxCostUsd"), v));
        let exclude_tools = o
            .get("excludeTools")
            .and_then(|v| self.exclude_tools(&field("excludeTools"), v))
            .unwrap_or_default();
        let image = o.get("image").and_then(|v| self.image(&field("image"), v));
        let labels = o
            .get("labels")
            .and_then(|v| self.worker_labels(&field("labels"), v))
            .unwrap_or_default();
        let same_issue = self.same_issue(path, o, kind);
        let pins = self.pins(path, o);
        if self.errors.len() != before {
            return None;
        }
        Some(Run {
            kind: kind?,
            action: action?,
            folder,
            task,
            mcp,
            secrets: secrets.unwrap_or_default(),
            secrets_profile,
            provider: model.provider,
            model: model.model,
            models: model.models,
            max_cost_usd,
            exclude_tools,
            image,
            labels,
            same_issue,
            pins,
        })
    }

    /// `run.kind`, and whether the trigger's type may start a job of that kind (a cron trigger runs
    /// local jobs only, and only a cron trigger does).
    fn kind(&mut self, path: &str, o: &Object, on_type: Option<OnType>) -> Option<Kind> {
        let field = format!("{path}.kind");
        let kind = match o.get("kind") {
            None => {
                self.err(
                    &field,
                    "a run needs a kind: local, github, gitlab, forgejo or azure",
                );
                None
            }
            Some(v) => self.string(&field, v).and_then(|k| {
                let kind = Kind::parse(k);
                if kind.is_none() {
                    self.err(&field, "must be local, github, gitlab, forgejo or azure");
                }
                kind
            }),
        };
        match (on_type, kind) {
            (Some(OnType::Cron), Some(k)) if k != Kind::Local => self.err(
                field,
                "a cron trigger runs a local job: a cron job holds no forge token",
            ),
            (Some(t), Some(Kind::Local)) if t != OnType::Cron => {
                self.err(field, "a local job is started by a cron trigger only")
            }
            _ => {}
        }
        kind
    }

    /// What the job does: a flow or a command, exactly one of them.
    fn flow_or_command(&mut self, path: &str, o: &Object) -> Option<Action> {
        let flow = o.get("flow").and_then(|v| {
            let p = format!("{path}.flow");
            let flow = self.string(&p, v)?;
            if !is_slug(flow, Some(MAX_FLOW_CHARS)) {
                self.err(
                    p,
                    format!(
                        "a flow is lowercase letters and digits, words joined by single '-', at most {MAX_FLOW_CHARS} characters"
                    ),
                );
                return None;
            }
            Some(flow.to_owned())
        });
        let command = o
            .get("command")
            .and_then(|v| self.text(&format!("{path}.command"), v, MAX_COMMAND_CHARS, Lines::One));
        match (o.get("flow").is_some(), o.get("command").is_some()) {
            (true, true) => {
                self.err(path, "a run has either 'flow' or 'command', not both");
                None
            }
            (false, false) => {
                self.err(path, "a run needs a 'flow' or a 'command'");
                None
            }
            _ => flow.map(Action::Flow).or(command.map(Action::Command)),
        }
    }

    /// A local job's folder: an absolute path on one line.
    fn folder(&mut self, path: &str, value: &Json) -> Option<String> {
        let folder = self.string(path, value)?;
        if !folder.starts_with('/') || folder.chars().any(breaks_line) {
            self.err(
                path,
                "a folder is an absolute path (starting with '/') without control characters",
            );
            return None;
        }
        Some(folder.to_owned())
    }

    /// `run.secretsProfile`: the default profile when the run names secrets without one, and none
    /// without secrets.
    fn secrets_profile(&mut self, path: &str, o: &Object) -> Option<String> {
        let p = format!("{path}.secretsProfile");
        match (o.get("secrets"), o.get("secretsProfile")) {
            // The spec's own example names secrets without a profile: they go to the default one.
            (Some(_), None) => Some(DEFAULT_SECRETS_PROFILE.to_owned()),
            (None, Some(_)) => {
                self.err(
                    p,
                    "a secretsProfile without 'secrets' does nothing; leave it out",
                );
                None
            }
            (_, Some(v)) => self.string(&p, v).and_then(|s| {
                if mcp::is_name_shape(s) {
                    Some(s.to_owned())
                } else {
                    self.err(
                        p,
                        format!(
                            "a secrets profile is lowercase letters and digits, words joined by single '-', at most {MAX_SECRETS_PROFILE_CHARS} characters"
                        ),
                    );
                    None
                }
            }),
            (None, None) => None,
        }
    }

    /// `run.provider`, `run.model` and `run.models`: a model only with its provider, and on the
    /// list when the run gives one.
    fn model_choice(&mut self, path: &str, o: &Object) -> ModelChoice {
        let field = |key: &str| format!("{path}.{key}");
        let provider = o.get("provider").and_then(|v| {
            let p = field("provider");
            let provider = self.string(&p, v)?;
            if !is_slug(provider, None) {
                self.err(
                    p,
                    "a provider is lowercase letters and digits, words joined by single '-'",
                );
                return None;
            }
            Some(provider.to_owned())
        });
        let model = o
            .get("model")
            .and_then(|v| self.text(&field("model"), v, MAX_MODEL_CHARS, Lines::One));
        if o.get("model").is_some() && o.get("provider").is_none() {
            self.err(
                field("model"),
                "a model needs a provider: give 'provider' too",
            );
        }
        let models = o
            .get("models")
            .and_then(|v| self.models(&field("models"), v));
        if let (Some(provider), Some(model), Some(models)) = (&provider, &model, &models)
            && !models.contains(&format!("{provider}/{model}"))
        {
            self.err(
                field("model"),
                "provider/model is not on the trigger's 'models' list",
            );
        }
        ModelChoice {
            provider,
            model,
            models,
        }
    }

    /// `run.maxCostUsd`: US dollars, more than 0 and at most [`MAX_COST_USD`].
    fn max_cost_usd(&mut self, path: &str, value: &Json) -> Option<f64> {
        let cost = match value {
            Json::Number(n) => n.as_f64().filter(|c| *c > 0.0 && *c <= MAX_COST_USD),
            _ => None,
        };
        if cost.is_none() {
            let not = match value {
                Json::Number(_) => String::new(),
                other => format!(", not {}", other.kind()),
            };
            self.err(
                path,
                format!(
                    "must be a number of US dollars more than 0 and at most {MAX_COST_USD}{not}"
                ),
            );
        }
        cost
    }

    /// `run.excludeTools`: distinct tool names or patterns, each able to match a tool of pi's.
    fn exclude_tools(&mut self, path: &str, value: &Json) -> Option<Vec<String>> {
        let items = self.array(path, value, 1, MAX_EXCLUDE_TOOLS, "tool names")?;
        Some(self.distinct_texts(path, items, |check, item_path, item| {
            let tool = check.string(item_path, item)?;
            if !is_tool_pattern(tool) {
                check.err(
                    item_path,
                    format!(
                        "a tool name or pattern is 1 to {MAX_TOOL_CHARS} characters of letters, digits, '_', '.', '*' and '-'"
                    ),
                );
                return None;
            }
            // pi names MCP tools with every character outside [A-Za-z0-9_] turned into '_':
            // an mcp__ pattern holding one could never match, and would exclude nothing.
            if tool.starts_with("mcp__")
                && !tool.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'*')
            {
                check.err(
                    item_path,
                    "pi writes MCP tool names with '_' for every other character (mcp__my_server__tool): this pattern would match nothing",
                );
                return None;
            }
            Some(tool.to_owned())
        }))
    }

    /// `run.image`: an image name.
    fn image(&mut self, path: &str, value: &Json) -> Option<String> {
        let image = self.string(path, value)?;
        if !is_image_name(image) {
            self.err(
                path,
                format!(
                    "an image is lowercase letters and digits, words joined by single '.', '_' or '-', at most {MAX_IMAGE_CHARS} characters"
                ),
            );
            return None;
        }
        Some(image.to_owned())
    }

    /// `run.labels`: the distinct labels a worker must carry to take the job.
    fn worker_labels(&mut self, path: &str, value: &Json) -> Option<Vec<String>> {
        let items = self.array(path, value, 1, protocol::job::MAX_LABELS, "labels")?;
        Some(self.distinct_texts(path, items, |check, item_path, item| {
            let label = check.string(item_path, item)?;
            if !protocol::job::is_label(label) {
                check.err(
                    item_path,
                    "a label is 1 to 63 lowercase letters, digits, '.', '_' and '-', or two such words joined by ':' (zone:eu)",
                );
                return None;
            }
            Some(label.to_owned())
        }))
    }

    /// `run.sameIssue`, for forge jobs only: `wait` (the default) or `cancel-older`.
    fn same_issue(&mut self, path: &str, o: &Object, kind: Option<Kind>) -> SameIssue {
        let p = format!("{path}.sameIssue");
        match o.get("sameIssue") {
            None => SameIssue::Wait,
            Some(_) if kind == Some(Kind::Local) => {
                self.err(
                    p,
                    "'sameIssue' is only for forge jobs; a local job has no issue",
                );
                SameIssue::Wait
            }
            Some(v) => match v.as_str() {
                Some("wait") => SameIssue::Wait,
                Some("cancel-older") => SameIssue::CancelOlder,
                _ => {
                    self.err(p, "must be \"wait\" or \"cancel-older\"");
                    SameIssue::Wait
                }
            },
        }
    }

    /// `run.pins`: `withhold` (the default), `refuse` or `accept`.
    fn pins(&mut self, path: &str, o: &Object) -> PinPolicy {
        let Some(value) = o.get("pins") else {
            return PinPolicy::default();
        };
        value
            .as_str()
            .and_then(PinPolicy::parse)
            .unwrap_or_else(|| {
                self.err(
                    format!("{path}.pins"),
                    "must be \"withhold\", \"refuse\" or \"accept\"",
                );
                PinPolicy::default()
            })
    }

    /// `folder` and `task`: required for a local job, refused for any other (when the kind is known).
    fn local_only<'a>(
        &mut self,
        path: &str,
        o: &'a Object,
        key: &str,
        kind: Option<Kind>,
    ) -> Option<&'a Json> {
        let value = o.get(key);
        match (kind, value) {
            (Some(Kind::Local), None) => {
                self.err(
                    format!("{path}.{key}"),
                    format!("a local job needs '{key}'"),
                );
            }
            (Some(k), Some(_)) if k != Kind::Local => {
                self.err(
                    format!("{path}.{key}"),
                    format!("'{key}' is only for local jobs; a {k} job does nothing with it"),
                );
                return None;
            }
            _ => {}
        }
        value
    }

    fn mcp(&mut self, path: &str, value: &Json, kind: Option<Kind>) -> Option<Vec<McpName>> {
        let before = self.errors.len();
        let items = self.array(path, value, 1, MAX_MCP_NAMES, "server names")?;
        let mut names: Vec<McpName> = Vec::new();
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for (k, item) in items.iter().enumerate() {
            let p = format!("{path}[{k}]");
            let Some(name) = self.string(&p, item) else {
                continue;
            };
            if let Some(first) = seen.get(name) {
                self.err(p, format!("names the same server as mcp[{first}]"));
                continue;
            }
            seen.insert(name, k);
            if name == mcp::FORGE {
                match kind {
                    Some(k) if !k.allows_forge_mcp() => {
                        let why = if k == Kind::Local {
                            " (a cron job holds no forge token)"
                        } else {
                            ""
                        };
                        self.err(
                            p,
                            format!(
                                "the forge's own server is only for github and gitlab jobs, not {k} ones{why}"
                            ),
                        );
                    }
                    _ => names.push(McpName::Forge),
                }
                continue;
            }
            match ServerName::parse(name) {
                Ok(server) => names.push(McpName::Server(server)),
                // ServerName's messages name the rule, never the name.
                Err(problem) => self.err(p, problem.message),
            }
        }
        (self.errors.len() == before).then_some(names)
    }

    fn secrets(&mut self, path: &str, value: &Json) -> Option<Vec<(String, String)>> {
        let Json::Object(o) = value else {
            self.err(
                path,
                format!(
                    "must be an object of variable names to references, not {}",
                    value.kind()
                ),
            );
            return None;
        };
        let before = self.errors.len();
        if o.is_empty() {
            self.err(path, "is empty; leave the field out instead");
        } else if o.len() > MAX_SECRETS {
            self.err(
                path,
                format!("has {} entries; at most {MAX_SECRETS}", o.len()),
            );
        }
        let mut secrets = Vec::new();
        for (name, reference) in o.iter() {
            if let Some(why) = reserved_secret_reason(name) {
                let p = match printable_key(name) {
                    Some(name) => format!("{path}.{name}"),
                    None => path.to_owned(),
                };
                self.err(p, why);
                continue;
            }
            if !is_env_name(name) {
                self.err(
                    path,
                    "a key of secrets is not a variable name: uppercase letters, digits and '_', not starting with a digit",
                );
                continue;
            }
            let p = format!("{path}.{name}");
            if let Some(reference) =
                self.text(&p, reference, MAX_SECRET_REFERENCE_CHARS, Lines::One)
            {
                secrets.push((name.to_owned(), reference));
            }
        }
        (self.errors.len() == before).then_some(secrets)
    }

    fn models(&mut self, path: &str, value: &Json) -> Option<Vec<String>> {
        let before = self.errors.len();
        let items = self.array(path, value, 1, MAX_MODELS, "provider/model entries")?;
        let models = self.distinct_texts(path, items, |check, item_path, item| {
            let entry = check.string(item_path, item)?;
            let valid = entry.split_once('/').is_some_and(|(provider, model)| {
                is_slug(provider, None)
                    && !model.is_empty()
                    && !model.chars().any(|c| c.is_whitespace() || breaks_line(c))
            });
            if !valid {
                check.err(
                    item_path,
                    "an entry is PROVIDER/MODEL: a provider name, '/', and a model without spaces or control characters",
                );
                return None;
            }
            Some(entry.to_owned())
        });
        (self.errors.len() == before).then_some(models)
    }

    /// The value of a required key, with its path; an error when it is missing.
    fn required<'a>(&mut self, path: &str, o: &'a Object, key: &str) -> Option<(String, &'a Json)> {
        let p = format!("{path}.{key}");
        match o.get(key) {
            Some(v) => Some((p, v)),
            None => {
                self.err(p, "is missing");
                None
            }
        }
    }

    fn string<'a>(&mut self, path: &str, value: &'a Json) -> Option<&'a str> {
        match value {
            Json::String(s) => Some(s),
            other => {
                self.err(path, format!("must be a string, not {}", other.kind()));
                None
            }
        }
    }

    /// A string that is not empty nor only whitespace, at most `max` characters, and without control
    /// characters (a line break is allowed only in [`Lines::Many`]).
    fn text(&mut self, path: &str, value: &Json, max: usize, lines: Lines) -> Option<String> {
        let text = self.string(path, value)?;
        if text.is_empty() {
            self.err(path, "is empty");
            return None;
        }
        if text.chars().all(char::is_whitespace) {
            self.err(path, "is only whitespace");
            return None;
        }
        let chars = text.chars().count();
        if chars > max {
            self.err(path, format!("is {chars} characters; at most {max}"));
            return None;
        }
        if lines == Lines::One && text.chars().any(breaks_line) {
            self.err(path, "must be one line without control characters");
            return None;
        }
        if lines == Lines::Many && text.contains('\0') {
            self.err(path, "may not hold a NUL character");
            return None;
        }
        Some(text.to_owned())
    }

    /// An array of `min` to `max` items.
    fn array<'a>(
        &mut self,
        path: &str,
        value: &'a Json,
        min: usize,
        max: usize,
        of: &str,
    ) -> Option<&'a [Json]> {
        let Json::Array(items) = value else {
            self.err(
                path,
                format!("must be an array of {of}, not {}", value.kind()),
            );
            return None;
        };
        if items.is_empty() && min > 0 {
            self.err(path, "is an empty array; leave the field out instead");
        } else if items.len() > max {
            self.err(path, format!("has {} entries; at most {max}", items.len()));
        }
        // The items are checked even when their count is wrong, so that every error shows at once.
        Some(items)
    }

    /// Each item through `item`, refusing one written twice.
    fn distinct_texts(
        &mut self,
        path: &str,
        items: &[Json],
        mut item: impl FnMut(&mut Check, &str, &Json) -> Option<String>,
    ) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let mut seen: HashMap<String, usize> = HashMap::new();
        let field = path.rsplit('.').next().unwrap_or(path).to_owned();
        for (k, value) in items.iter().enumerate() {
            let p = format!("{path}[{k}]");
            let Some(text) = item(self, &p, value) else {
                continue;
            };
            if let Some(first) = seen.get(&text) {
                self.err(p, format!("is written twice (also {field}[{first}])"));
                continue;
            }
            seen.insert(text.clone(), k);
            out.push(text);
        }
        out
    }

    /// Refuses every key of `o` not in `known`; `elsewhere` may say more of a key known elsewhere,
    /// and a near miss of a known key is named.
    fn unknown_keys(
        &mut self,
        path: &str,
        o: &Object,
        known: &[&str],
        elsewhere: impl Fn(&str) -> Option<String>,
    ) {
        for key in o.keys() {
            if known.contains(&key) {
                continue;
            }
            let key_path = match (path, printable_key(key)) {
                (_, None) => path.to_owned(),
                ("", Some(k)) => k.to_owned(),
                (p, Some(k)) => format!("{p}.{k}"),
            };
            let message = if let Some(message) = elsewhere(key) {
                message
            } else {
                let what = if printable_key(key).is_some() {
                    "a key pi-dispatch does not know"
                } else {
                    "has a key pi-dispatch does not know"
                };
                match near_miss(key, known) {
                    Some(meant) => format!("{what}; did you mean '{meant}'?"),
                    None => what.to_owned(),
                }
            };
            self.err(key_path, message);
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lines {
    One,
    Many,
}

/// Cc (control characters, NUL, tab and line breaks among them), and the line and paragraph
/// separators.
fn breaks_line(c: char) -> bool {
    matches!(
        get_general_category(c),
        GeneralCategory::Control
            | GeneralCategory::LineSeparator
            | GeneralCategory::ParagraphSeparator
    )
}

/// `^[a-z0-9]+(-[a-z0-9]+)*$`, at most `max` characters when given.
fn is_slug(s: &str, max: Option<usize>) -> bool {
    max.is_none_or(|m| s.len() <= m)
        && s.split('-').all(|w| {
            !w.is_empty()
                && w.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
}

/// `^[a-z0-9]+([._-][a-z0-9]+)*$`, at most [`MAX_IMAGE_CHARS`].
fn is_image_name(s: &str) -> bool {
    s.len() <= MAX_IMAGE_CHARS
        && s.split(['.', '_', '-']).all(|w| {
            !w.is_empty()
                && w.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
}

/// `^[A-Z_][A-Z0-9_]*$`.
fn is_env_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_uppercase() || b == b'_')
        && bytes.all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

/// 1 to 128 characters of `[A-Za-z0-9_.*-]`.
fn is_tool_pattern(s: &str) -> bool {
    (1..=MAX_TOOL_CHARS).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.*-".contains(&b))
}

/// A cron pattern as the worker schedules it (UTC; an optional leading seconds field), or why
/// not: the one parser the loader and the worker share.
pub fn cron_schedule(pattern: &str) -> Result<croner::Cron, croner::errors::CronError> {
    croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Optional)
        .build()
        .parse(pattern)
}

/// The shape of a pattern: 5 or 6 fields separated by single spaces, each of digits, letters and
/// `* / , - ? #` (`L` and `W` are letters); [`cron_schedule`] checks the rest.
fn is_cron_pattern(s: &str) -> bool {
    let fields: Vec<&str> = s.split(' ').collect();
    (5..=6).contains(&fields.len())
        && fields.iter().all(|f| {
            !f.is_empty()
                && f.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"*/,-?#".contains(&b))
        })
}

/// The known key `key` probably meant: the same once lowercased without `_` and `-`, a prefix of
/// one (at least 4 characters), or within edit distance 2 (1 for names of 3 or 4 characters, none
/// for shorter ones). The closest wins; none when nothing is near.
pub(crate) fn near_miss<'k>(key: &str, known: &[&'k str]) -> Option<&'k str> {
    // No known key or setting name is longer than 32 characters: a much longer key is near none.
    if key.chars().count() > 64 {
        return None;
    }
    let norm = |s: &str| -> Vec<char> {
        s.chars()
            .filter(|c| *c != '_' && *c != '-')
            .flat_map(char::to_lowercase)
            .collect()
    };
    let key_norm = norm(key);
    known
        .iter()
        .filter_map(|k| {
            let k_norm = norm(k);
            let distance = edit_distance(&key_norm, &k_norm);
            let allowed = match k_norm.len() {
                0..=2 => 0,
                3..=4 => 1,
                _ => 2,
            };
            let prefix = key_norm.len() >= 4 && k_norm.starts_with(&key_norm);
            (distance <= allowed || prefix).then_some((distance, *k))
        })
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, k)| k)
}

/// Levenshtein distance.
fn edit_distance(a: &[char], b: &[char]) -> usize {
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut current = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitute = previous[j] + usize::from(ca != cb);
            current[j + 1] = substitute.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        previous = current;
    }
    previous[b.len()]
}

/// `triggers.json` as every reader takes it: the worker, the receiver, the admission, doctor,
/// explain, `run --trigger` and `triggers check`. A file that is not there holds no trigger (a
/// deployment may have none); one that cannot be read, or is refused, gives no trigger either,
/// and says why by its own path.
#[derive(Debug, Clone, PartialEq)]
pub struct TriggersFile {
    pub path: std::path::PathBuf,
    /// Whether the file is there (a missing one is read as holding no trigger).
    pub exists: bool,
    pub triggers: Triggers,
}

/// Why `triggers.json` gives no triggers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileRefusal {
    #[error("{} {error}", .path.display())]
    Unreadable {
        path: std::path::PathBuf,
        error: crate::files::ReadError,
    },
    #[error("{} {}", .path.display(), .error.what())]
    Refused {
        path: std::path::PathBuf,
        error: TriggersError,
    },
}

impl FileRefusal {
    /// Whether reading again may succeed (a transient I/O error), rather than needing a fix.
    pub fn may_pass_on_retry(&self) -> bool {
        matches!(self, FileRefusal::Unreadable { error, .. } if error.may_pass_on_retry())
    }

    /// A stable token for the kind of refusal.
    pub fn code(&self) -> &'static str {
        match self {
            FileRefusal::Unreadable { error, .. } => error.code(),
            FileRefusal::Refused { error, .. } => error.code(),
        }
    }
}

impl TriggersFile {
    /// Reads and checks the file at `path` (links are not followed, the size is bounded).
    pub fn read(path: &std::path::Path) -> Result<TriggersFile, FileRefusal> {
        TriggersFile::from_read(path, crate::files::read_file(path, MAX_FILE_BYTES))
    }

    /// The file at `path` from the outcome of reading it, for a caller that read it itself.
    pub fn from_read(
        path: &std::path::Path,
        read: Result<Vec<u8>, crate::files::ReadError>,
    ) -> Result<TriggersFile, FileRefusal> {
        let path = path.to_path_buf();
        let bytes = match read {
            Ok(bytes) => bytes,
            Err(crate::files::ReadError::Missing) => {
                return Ok(TriggersFile {
                    path,
                    exists: false,
                    triggers: Triggers::default(),
                });
            }
            Err(error) => return Err(FileRefusal::Unreadable { path, error }),
        };
        match parse_triggers(&bytes) {
            Ok(triggers) => Ok(TriggersFile {
                path,
                exists: true,
                triggers,
            }),
            Err(error) => Err(FileRefusal::Refused { path, error }),
        }
    }

    /// Trigger `index`, or why there is none, naming the file.
    pub fn trigger(&self, index: usize) -> Result<&Trigger, String> {
        let path = self.path.display();
        if !self.exists {
            return Err(format!(
                "{path} does not exist, so it has no trigger {index}"
            ));
        }
        self.triggers.triggers.get(index).ok_or_else(|| {
            format!(
                "{path} has no trigger {index} (it has {})",
                self.triggers.triggers.len()
            )
        })
    }
}

#[cfg(test)]
#[path = "triggers_tests.rs"]
mod tests;
