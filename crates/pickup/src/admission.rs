//! The admission: one pure function that decides, for a queued job, before anything is spent,
//! whether it starts. It admits the job with everything it will run with ([`Admitted`]), refuses it
//! with a reason, the detail (names only) and a fix, or asks for a retry when a read failed in a way
//! that may pass.
//!
//! `run` (at queue time), `explain`, `doctor` and the worker all call [`decide`], so what an
//! operator is told before is what the worker does. Files, image labels, folders and the worker's
//! environment come through small traits, so every rule is tested on values; [`crate::fs`] has the
//! readers of a real deployment.

use config::catalog;
use config::egress::{self, Allowlist};
use config::endpoints::{self, ModelEndpoints};
use config::json::Json;
use config::mcp::{self, Exposure, McpServer, Overlay, ServerName, Transport};
use config::models::Models;
use config::settings::Settings;
use config::triggers::{self, Kind, On, PinPolicy, Trigger};
use config::url::{Host as UrlHost, Scheme};
use protocol::admitted::{
    Admitted, Egress, Flow, ForgeTarget, ModelChoice, Route, SecretRef, Work, Workspace,
};
use protocol::detail::Detail;
use protocol::job::{Job, McpField};
use protocol::job_mcp::{Forge, JobMcpFile};
use protocol::reason::Reason;
use serde::Serialize;

use crate::reach;
use crate::routes::{Routes, has_way_in};

/// A file as a reader found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    Missing,
    Bytes(Vec<u8>),
    /// A failure that will not pass by itself (a link, permission denied, too large).
    Failed(String),
    /// A failure that may pass on a retry (EIO and the like).
    Transient(String),
}

/// The deployment files the admission reads.
pub trait Files {
    fn triggers(&self) -> Read;
    fn overlay_mcp(&self) -> Read;
    fn overlay_models(&self) -> Read;
    fn allowlist(&self) -> Read;
    fn endpoints(&self) -> Read;
}

/// An image as the backend knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Image {
    /// Not installed (no such image, or no runner in it).
    Missing,
    /// Installed, with the capabilities its labels declare (none when it has no label).
    Installed { capabilities: Vec<String> },
    /// It could not be told in a way that may pass.
    Transient(String),
}

/// Reads images; the embedded backend reads `images/NAME/`, a container backend asks its engine.
pub trait Images {
    fn image(&self, name: &str) -> Image;
}

/// A folder as the worker sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Folder {
    Missing,
    NotAFolder,
    Folder { uid: u32, gid: u32, mode: u32 },
    Failed(String),
    Transient(String),
}

/// Reads the job's repository folder.
pub trait Folders {
    fn folder(&self, path: &str) -> Folder;
}

/// The worker's own environment, by name only: whether a variable holds a value.
pub trait WorkerEnv {
    fn has_value(&self, name: &str) -> bool;
}

/// What the host running the job can do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// The worker runs as root (a job then runs as its folder's owner, never as root).
    pub root: bool,
    /// The worker's own user: a worker that is not root runs a job as itself.
    pub user: reach::User,
    /// The text of `/etc/passwd`, to name users in messages.
    pub passwd: Option<String>,
    /// An egress proxy is there for jobs with egress on.
    pub egress_proxy: bool,
    /// Whether the GitHub App's key (`PI_GITHUB_APP_KEY_FILE`) can sign, as the worker reads it:
    /// `None` when the caller did not read it (no key file set, or a caller that does not mint).
    pub github_key: Option<bool>,
}

pub struct Inputs<'a> {
    pub job: &'a Job,
    pub settings: &'a Settings,
    pub files: &'a dyn Files,
    pub images: &'a dyn Images,
    pub folders: &'a dyn Folders,
    pub env: &'a dyn WorkerEnv,
    pub host: &'a Host,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Start the job, with this.
    Admit(Box<Admitted>),
    Refuse(Box<Refusal>),
    /// Try again later: nothing was decided.
    Retry {
        detail: String,
    },
}

impl Decision {
    /// The reason, when the job is refused.
    pub fn reason(&self) -> Option<Reason> {
        match self {
            Decision::Refuse(r) => Some(r.reason),
            _ => None,
        }
    }
}

/// A refusal: the reason, what it concerns (names only), and what to do about it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Refusal {
    pub reason: Reason,
    pub detail: Detail,
    pub fix: String,
}

impl Refusal {
    fn new(reason: Reason, detail: Detail, fix: impl Into<String>) -> Refusal {
        Refusal {
            reason,
            detail,
            fix: fix.into(),
        }
    }

    /// The reason's fixed public sentence.
    pub fn sentence(&self) -> &'static str {
        self.reason.sentence()
    }

    /// The fixed comment a forge issue gets: it names the server and the rule, nothing else.
    pub fn comment(&self) -> String {
        self.reason.comment(self.detail.server.as_deref())
    }

    /// The worker's `refused_<reason>` log line: names and counts, never a value.
    pub fn log(&self, job: &Job) -> serde_json::Value {
        serde_json::json!({
            "event": self.reason.log_event(),
            "jobId": job.id,
            "reason": self.reason,
            "detail": self.detail,
            "fix": self.fix,
        })
    }
}

/// The GitHub API host a github job's forge server reaches.
pub const GITHUB_API_HOST: &str = "api.github.com";
pub const MAX_NAMES: usize = 8;

/// A step of the decision: `Err` ends it there.
type Step<T> = Result<T, Box<Decision>>;

fn refuse(reason: Reason, detail: Detail, fix: impl Into<String>) -> Box<Decision> {
    Box::new(Decision::Refuse(Box::new(Refusal::new(
        reason, detail, fix,
    ))))
}

/// A refusal with the reason's own fix.
fn refuse_plain(reason: Reason, detail: Detail) -> Box<Decision> {
    refuse(reason, detail, reason.fix())
}

fn retry(detail: String) -> Box<Decision> {
    Box::new(Decision::Retry { detail })
}

/// Decides whether the job may start.
pub fn decide(i: &Inputs) -> Decision {
    match decide_steps(i) {
        Ok(admitted) => Decision::Admit(Box::new(admitted)),
        Err(d) => *d,
    }
}

fn decide_steps(i: &Inputs) -> Step<Admitted> {
    let trigger = trigger_now(i)?;
    skew(i.job, trigger.as_ref())?;
    list(i.job)?;
    // From here on the job is judged under its trigger's policy as it stands now.
    let job = &under_policy_now(i.job, trigger.as_ref());
    placed_for(i.job, job)?;
    let i = &Inputs { job, ..*i };
    let names = list(job)?;
    let image = image(i, names)?;
    let mcp = match names {
        Some(names) => Some(mcp_gates(i, names)?),
        None => None,
    };
    let codemode_models = match &mcp {
        Some(m) => m.codemode_models,
        None => overlay_codemode_models(i)?,
    };
    let models = read_models(i)?;
    let model = model(i, models.as_ref())?;
    let egress = job_egress(i, mcp.as_ref(), model.1)?;
    let (kind, workspace) = workspace(i)?;
    let work = work(i, kind);
    let secrets = job_secrets(job, trigger.as_ref())?;
    let (servers, file) = match mcp {
        Some(m) => (m.servers, Some(m.file)),
        None => (Vec::new(), None),
    };
    Ok(Admitted {
        job_id: job.id.clone(),
        kind,
        trigger_type: job.trigger_type.clone(),
        work,
        flow: job.flow.clone(),
        image_dir: i.settings.dir.join("images").join(&image),
        state_dir: job_state_dir(&i.settings.dir, &job.id),
        image,
        workspace,
        servers,
        mcp: file,
        codemode_models,
        secrets,
        secrets_profile: (!job.secrets.is_empty()).then(|| {
            job.secrets_profile
                .clone()
                .unwrap_or_else(|| triggers::DEFAULT_SECRETS_PROFILE.to_owned())
        }),
        model: model.0,
        model_rules: protocol::admitted::ModelRules {
            models: job.models.clone(),
            max_cost_usd: job.max_cost_usd,
        },
        exclude_tools: job.exclude_tools.clone(),
        egress,
        pins: job.pins.unwrap_or_default(),
    })
}

/// The job's egress: off, or on through the proxy with the routes its servers and its model need.
fn job_egress(i: &Inputs, mcp: Option<&McpAdmitted>, model_route: Option<Route>) -> Step<Egress> {
    if !i.settings.egress {
        return Ok(Egress::Off);
    }
    if !i.host.egress_proxy {
        return Err(refuse_plain(
            Reason::EgressProxyMissing,
            Detail::new("PI_EGRESS is on (the default), and this version has no egress proxy")
                .variable(config::settings::EGRESS_SETTING),
        ));
    }
    let mut routes = mcp.map(|m| m.routes.clone()).unwrap_or_default();
    routes.extend(model_route);
    let loopback = loopback_routes(&routes);
    Ok(Egress::On { routes, loopback })
}

/// The job's routes to hosts on the worker's own machine (declared endpoints there), each once, as
/// `host:port`.
fn loopback_routes(routes: &[Route]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in routes {
        let authority = format!("{}:{}", r.host, r.port);
        let on_this_machine = config::url::host_port(&format!("http://{authority}"))
            .is_some_and(|(host, _)| config::url::is_loopback(&host));
        if on_this_machine && !out.contains(&authority) {
            out.push(authority);
        }
    }
    out
}

/// What the agent is asked to do: a local job's task, or a forge job's event and flow (both
/// checked by [`workspace`] before).
fn work(i: &Inputs, kind: Kind) -> Work {
    let job = i.job;
    let forge = job
        .event
        .as_ref()
        .zip(job.flow.as_deref().and_then(Flow::parse));
    match forge {
        Some((event, flow)) if kind.allows_forge_mcp() => Work::Forge(Box::new(ForgeTarget {
            event: event.clone(),
            flow,
            gitlab_host: i.settings.gitlab_url.as_deref().and_then(gitlab_host),
        })),
        _ => Work::Task(job.task.clone().unwrap_or_default()),
    }
}

/// glab's `GITLAB_HOST`: the host of `GITLAB_URL`, with its port when that is not the scheme's.
pub fn gitlab_host(gitlab_url: &str) -> Option<String> {
    gitlab_api_url(gitlab_url)?;
    let url = config::url::parse(gitlab_url).ok()?;
    Some(if url.port() == url.scheme().default_port() {
        url.host().to_string()
    } else {
        format!("{}:{}", url.host(), url.port())
    })
}

/// The trigger at the job's index in `triggers.json` as it is now (`None` for a CLI job). A
/// trigger's job whose trigger is gone, or whose index now holds another trigger (another type,
/// another cron id), is refused: it would run under a policy nobody stands behind.
fn trigger_now(i: &Inputs) -> Step<Option<Trigger>> {
    let Some(index) = i.job.trigger_index else {
        return Ok(None);
    };
    let file = &i.settings.triggers_file;
    let read = match i.files.triggers() {
        Read::Bytes(b) => Ok(b),
        Read::Missing => Err(config::files::ReadError::Missing),
        Read::Failed(why) | Read::Transient(why) => {
            return Err(retry(format!("{} {why}", file.display())));
        }
    };
    let trigger = match triggers::TriggersFile::from_read(file, read) {
        Ok(all) => all.triggers.triggers.into_iter().nth(index),
        // The job's trigger cannot be told now: an operator fixing the file lets it through.
        Err(e) => return Err(retry(e.to_string())),
    };
    let gone = |why: String| {
        refuse_plain(
            Reason::TriggerGone,
            Detail::new(why).field(format!("triggers[{index}]")),
        )
    };
    match trigger {
        None => Err(gone(format!(
            "triggers.json has no trigger {index} now, which queued the job"
        ))),
        Some(t) if !queued_by(i.job, &t) => Err(gone(format!(
            "trigger {index} of triggers.json is no longer the one that queued the job"
        ))),
        Some(t) => Ok(Some(t)),
    }
}

/// Whether `trigger` is the one that queued `job`: the same type, and for a cron trigger the same
/// id (a cron job's id begins with it).
pub fn queued_by(job: &Job, trigger: &Trigger) -> bool {
    trigger.on.type_name() == job.trigger_type
        && match &trigger.on {
            On::Cron { id, .. } => job.id.starts_with(&format!("cron-{id}-")),
            _ => true,
        }
}

/// `job` under the policy of its trigger as it stands now (`now`), so that a job queued before
/// the operator narrowed the trigger, a retry and a rerun run under today's rules: the trigger's
/// `mcp`, `models`, `maxCostUsd`, `excludeTools`, `labels` and `pins`, or the stricter of the
/// trigger's and the job's where both are set (the servers and models both name, the lower cap,
/// every excluded tool, every label, the stricter pin policy). A CLI job (no trigger) is its own policy. Egress is the deployment's
/// setting, read at every admission.
pub fn under_policy_now(job: &Job, now: Option<&Trigger>) -> Job {
    let Some(now) = now else {
        return job.clone();
    };
    let run = &now.run;
    let mcp = match (&job.mcp, &run.mcp) {
        (_, None) => None,
        // Anything but a list of names is the list check's to refuse, as it came.
        (Some(McpField::Names(had)), Some(names)) => {
            let kept: Vec<&str> = had
                .iter()
                .map(String::as_str)
                .filter(|h| names.iter().any(|n| n.as_str() == *h))
                .collect();
            (!kept.is_empty()).then(|| McpField::names(kept))
        }
        (other, Some(_)) => other.clone(),
    };
    let models = match (&job.models, &run.models) {
        (Some(had), Some(list)) => Some(had.iter().filter(|m| list.contains(m)).cloned().collect()),
        (had, list) => had.clone().or_else(|| list.clone()),
    };
    let max_cost_usd = match (job.max_cost_usd, run.max_cost_usd) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let mut exclude_tools = job.exclude_tools.clone();
    for tool in &run.exclude_tools {
        if !exclude_tools.contains(tool) {
            exclude_tools.push(tool.clone());
        }
    }
    let mut labels = job.labels.clone();
    for label in &run.labels {
        if !labels.contains(label) {
            labels.push(label.clone());
        }
    }
    let pins = match (job.pins, run.pins) {
        (Some(had), now) => Some(had.stricter(now)),
        (None, now) => (now != PinPolicy::default()).then_some(now),
    };
    Job {
        mcp,
        models,
        max_cost_usd,
        exclude_tools,
        labels,
        pins,
        ..job.clone()
    }
}

/// A job is placed by its labels when it is queued: one the trigger now asks a label of, which
/// the job was queued without, may be on a worker without it, and is refused (a rerun is queued
/// with today's labels).
fn placed_for(queued: &Job, now: &Job) -> Step<()> {
    match now.labels.iter().find(|l| !queued.labels.contains(l)) {
        Some(label) => Err(refuse_plain(
            Reason::TriggerSkew,
            Detail::new(format!(
                "the trigger now asks for the worker label {label}, which the job was queued without"
            ))
            .field("run.labels"),
        )),
        None => Ok(()),
    }
}

/// The narrowing fields: when the trigger as authored now has one and the job arrived without it,
/// the job would run with more than its trigger allows.
fn skew(job: &Job, now: Option<&Trigger>) -> Step<()> {
    let Some(now) = now else {
        return Ok(());
    };
    let missing = [
        ("mcp", now.run.mcp.is_some() && job.mcp.is_none()),
        ("models", now.run.models.is_some() && job.models.is_none()),
        (
            "maxCostUsd",
            now.run.max_cost_usd.is_some() && job.max_cost_usd.is_none(),
        ),
        (
            "excludeTools",
            !now.run.exclude_tools.is_empty() && job.exclude_tools.is_empty(),
        ),
    ];
    match missing.iter().find(|(_, m)| *m) {
        Some((field, _)) => Err(refuse_plain(
            Reason::TriggerSkew,
            Detail::new(format!(
                "the trigger names run.{field} and the job arrived without it"
            ))
            .field(format!("run.{field}")),
        )),
        None => Ok(()),
    }
}

/// The `(NAME, reference)` pairs to resolve for the job: its own secret names, each with the
/// reference its trigger gives it now. Refused as skew when the trigger now is not the job's
/// (another type, another cron id, another secrets profile) or lacks one of the names.
fn job_secrets(job: &Job, trigger: Option<&Trigger>) -> Step<Vec<SecretRef>> {
    if job.secrets.is_empty() {
        return Ok(Vec::new());
    }
    let skew = |why: &str| {
        refuse_plain(
            Reason::TriggerSkew,
            Detail::new(why.to_owned()).field("run.secrets"),
        )
    };
    let Some(trigger) = trigger else {
        return Err(skew(
            "the job names secrets and no trigger of triggers.json gives them now",
        ));
    };
    if !queued_by(job, trigger) || trigger.run.secrets_profile != job.secrets_profile {
        return Err(skew(
            "the trigger at the job's index is no longer the one that queued it",
        ));
    }
    job.secrets
        .iter()
        .map(|name| {
            trigger
                .run
                .secrets
                .iter()
                .find(|(n, _)| n == name)
                .map(|(n, r)| SecretRef {
                    name: n.clone(),
                    reference: r.clone(),
                })
                .ok_or_else(|| {
                    refuse_plain(
                        Reason::TriggerSkew,
                        Detail::new("the trigger no longer gives a secret the job was queued with")
                            .field("run.secrets")
                            .variable(name.clone()),
                    )
                })
        })
        .collect()
}

/// The list as the loader writes it: 1 to 8 distinct names, each `forge` or a server name.
fn list(job: &Job) -> Step<Option<&[String]>> {
    let names = match &job.mcp {
        None => return Ok(None),
        Some(McpField::Names(names)) => names,
        Some(McpField::Malformed(_)) => {
            return Err(refuse_plain(
                Reason::McpListInvalid,
                Detail::new("run.mcp is not a list of names").field("run.mcp"),
            ));
        }
    };
    let why = if names.is_empty() || names.len() > MAX_NAMES {
        Some(format!(
            "the list has {} names (1 to {MAX_NAMES})",
            names.len()
        ))
    } else if names
        .iter()
        .enumerate()
        .any(|(k, n)| names[..k].contains(n))
    {
        Some("a name appears twice".to_owned())
    } else if names
        .iter()
        .any(|n| n != mcp::FORGE && ServerName::parse(n).is_err())
    {
        Some("an entry is not a server name (lowercase letters and digits, words joined by '-', up to 32 characters)".to_owned())
    } else {
        None
    };
    match why {
        Some(w) => Err(refuse_plain(
            Reason::McpListInvalid,
            Detail::new(w).field("run.mcp"),
        )),
        None => Ok(Some(names)),
    }
}

/// The job's image: installed, and declaring what the job needs.
fn image(i: &Inputs, names: Option<&[String]>) -> Step<String> {
    let name = i
        .job
        .image
        .clone()
        .or_else(|| i.settings.job_image.clone())
        .unwrap_or_else(|| config::settings::DEFAULT_JOB_IMAGE.to_owned());
    let fix_install = || format!("install it: `pi-dispatch image install {name}`");
    if !config::settings::is_image_name(&name) {
        return Err(refuse(
            Reason::JobImageMissing,
            Detail::new("the job's image is not an image name").field("run.image"),
            "name an image installed with `pi-dispatch image install`",
        ));
    }
    let declared = match i.images.image(&name) {
        Image::Missing => {
            return Err(refuse(
                Reason::JobImageMissing,
                Detail::new(format!("image {name} is not installed"))
                    .path(format!("images/{name}")),
                fix_install(),
            ));
        }
        Image::Transient(why) => return Err(retry(format!("image {name}: {why}"))),
        Image::Installed { capabilities } => capabilities,
    };
    let Some(names) = names else {
        return Ok(name);
    };
    if !declared.iter().any(|c| c == "mcp") {
        return Err(refuse(
            Reason::JobImageMcpUnsupported,
            Detail::new(format!("image {name} does not declare the mcp capability")),
            format!("rebuild it with this version: `pi-dispatch image install {name}`"),
        ));
    }
    if names.iter().any(|n| n == mcp::FORGE) && !declared.iter().any(|c| c == "forgeMcp") {
        return Err(refuse_plain(
            Reason::JobImageForgeMcpUnsupported,
            Detail::new(format!(
                "image {name} does not declare the forgeMcp capability"
            ))
            .server(mcp::FORGE),
        ));
    }
    Ok(name)
}

/// What the MCP gates admit: the servers, the job's file, and the routes they need.
struct McpAdmitted {
    servers: Vec<String>,
    file: JobMcpFile,
    routes: Vec<Route>,
    codemode_models: bool,
}

/// The spec's pickup gates for a job that names servers.
fn mcp_gates(i: &Inputs, names: &[String]) -> Step<McpAdmitted> {
    let job = i.job;
    let forge = if names.iter().any(|n| n == mcp::FORGE) {
        Some(forge_entry(i)?)
    } else {
        None
    };
    let overlay_names: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|n| *n != mcp::FORGE)
        .collect();
    // The overlay's servers are judged only when one is named: forge alone needs none (the file
    // is still read for `codemodeModels`).
    let overlay = if overlay_names.is_empty() {
        None
    } else {
        Some(read_overlay(i, &overlay_names)?)
    };
    let servers = match &overlay {
        Some(overlay) => offered_servers(overlay, &overlay_names)?,
        None => Vec::new(),
    };
    // The forge entry is the worker's own: only overlay servers are judged for their variables.
    if !servers.is_empty() {
        let reserved = reserved_variables(i)?;
        for (server, name) in &servers {
            secrets(i, server, name, &reserved)?;
        }
    }
    for (server, name) in &servers {
        excluded(job, server, name)?;
    }
    if forge.is_some() {
        forge_not_excluded(job)?;
    }
    let routes = if i.settings.egress {
        egress_gate(i, &servers, forge.as_ref())?
    } else {
        Vec::new()
    };
    let entries: Vec<(String, Json)> = servers
        .iter()
        .filter_map(|(_, name)| {
            let entry = overlay.as_ref()?.entry(name)?;
            Some((name.to_string(), entry.raw.clone()))
        })
        .collect();
    let codemode_models = match &overlay {
        Some(o) => o.codemode_models,
        None => overlay_codemode_models(i)?,
    };
    Ok(McpAdmitted {
        servers: names.to_vec(),
        file: JobMcpFile::new(&entries, forge.as_ref(), codemode_models),
        routes,
        codemode_models,
    })
}

/// The overlay's server of each name, offered and enabled; a refusal names every server the
/// overlay does not offer.
fn offered_servers<'o, 'n>(
    overlay: &'o Overlay,
    names: &[&'n str],
) -> Step<Vec<(&'o McpServer, &'n str)>> {
    names
        .iter()
        .map(|name| match offered(overlay, name) {
            Ok(server) => Ok((server, *name)),
            Err(refusal) => Err(with_every_unknown(refusal, overlay, names)),
        })
        .collect()
}

/// Whether the trigger's `excludeTools` leaves the forge's server a way to its tools.
fn forge_not_excluded(job: &Job) -> Step<()> {
    let routes = Routes::new(mcp::FORGE, Exposure::Codemode, &[]);
    if routes.way_in(&job.exclude_tools) {
        return Ok(());
    }
    Err(refuse_plain(
        Reason::McpExcluded,
        Detail::new(
            "run.excludeTools removes every route to its tools (direct, tool_search, codemode)",
        )
        .server(mcp::FORGE)
        .field("run.excludeTools"),
    ))
}

/// The overlay's `codemodeModels` for a job that names none of its servers (only `forge`, or
/// none): the operator's switch holds for every job, so the file is read for it. A missing file
/// leaves them on; one that cannot be read whole refuses the job (`mcp-config-invalid`), as it
/// would a job naming a server, since what the operator chose cannot be told.
fn overlay_codemode_models(i: &Inputs) -> Step<bool> {
    let invalid = |why: String| overlay_mcp_invalid(i, why);
    match i.files.overlay_mcp() {
        Read::Missing => Ok(true),
        Read::Bytes(bytes) => mcp::parse_overlay(&bytes)
            .map(|o| o.codemode_models)
            .map_err(|e| invalid(format!("overlay mcp.json: {} [{}]", e, e.code()))),
        Read::Failed(why) => Err(invalid(format!("overlay mcp.json {why}"))),
        Read::Transient(why) => Err(retry(format!("overlay mcp.json: {why}"))),
    }
}

/// The forge entry of a github or gitlab job; any other job naming `forge` is refused.
fn forge_entry(i: &Inputs) -> Step<Forge> {
    let job = i.job;
    let unknown = |why: &str| {
        refuse(
            Reason::McpServerUnknown,
            Detail::new(why.to_owned()).server(mcp::FORGE),
            "name forge only on a github or gitlab trigger, with GITLAB_URL a plain http(s) URL for gitlab",
        )
    };
    match job.kind() {
        Some(Kind::Github) => github_host(&i.settings.github_api_url)
            .map(|host| Forge::Github { host })
            .ok_or_else(|| {
                unknown(
                    "PI_GITHUB_API_URL is neither GitHub's API nor a GitHub Enterprise Server's (a plain http(s) URL ending in /api/v3)",
                )
            }),
        Some(Kind::Gitlab) => {
            let url = i
                .settings
                .gitlab_url
                .as_deref()
                .ok_or_else(|| unknown("GITLAB_URL is not set"))?;
            gitlab_api_url(url)
                .map(|api_url| Forge::Gitlab { api_url })
                .ok_or_else(|| {
                    unknown(
                        "GITLAB_URL is not a plain http(s) URL without user, password, query, fragment or comma",
                    )
                })
        }
        _ => Err(unknown(&format!(
            "forge on a {} job: only github and gitlab jobs have a forge server",
            job.kind
        ))),
    }
}

/// The `GITHUB_HOST` github-mcp-server is given for `PI_GITHUB_API_URL`: none for GitHub's own API,
/// a GitHub Enterprise Server's address for its `https://HOST/api/v3` (the server adds `/api/v3`
/// itself); `None` (outer) when the URL is neither. Pure.
pub fn github_host(api_url: &str) -> Option<Option<String>> {
    let api_url = api_url.trim_end_matches('/');
    if api_url == format!("https://{GITHUB_API_HOST}") {
        return Some(None);
    }
    if api_url.contains(',') || api_url.contains('$') {
        return None;
    }
    let url = config::url::parse(api_url).ok()?;
    if !url.query().is_empty() || url.path().to_string() != "/api/v3" {
        return None;
    }
    api_url
        .strip_suffix("/api/v3")
        .map(|base| Some(base.to_owned()))
}

/// `GITLAB_URL` as the API's base: a plain http(s) URL without user, password, query, fragment or
/// comma; a trailing `/api/v4` (or `/`) is allowed and not doubled.
pub fn gitlab_api_url(text: &str) -> Option<String> {
    if text.contains(',') || text.contains('$') {
        return None;
    }
    let url = config::url::parse(text).ok()?;
    if !url.query().is_empty() || url.path().references().next().is_some() {
        return None;
    }
    let base = text.trim_end_matches('/');
    let base = base.strip_suffix("/api/v4").unwrap_or(base);
    Some(format!("{base}/api/v4"))
}

fn overlay_file(i: &Inputs, name: &str) -> String {
    i.settings.overlay_dir.join(name).display().to_string()
}

/// The overlay's `mcp.json` refused for `why` (`mcp-config-invalid`), naming the file.
fn overlay_mcp_invalid(i: &Inputs, why: String) -> Box<Decision> {
    refuse(
        Reason::McpConfigInvalid,
        Detail::new(why).path(overlay_file(i, "mcp.json")),
        Reason::McpConfigInvalid.fix(),
    )
}

fn read_overlay(i: &Inputs, names: &[&str]) -> Step<Overlay> {
    let path = overlay_file(i, "mcp.json");
    let invalid = |why: String| overlay_mcp_invalid(i, why);
    match i.files.overlay_mcp() {
        Read::Bytes(bytes) => mcp::parse_overlay_named(&bytes, names)
            .map_err(|e| invalid(format!("overlay mcp.json: {} [{}]", e, e.code()))),
        Read::Missing => Err(refuse(
            Reason::McpConfigInvalid,
            Detail::new("the overlay has no mcp.json").path(path.clone()),
            "offer the servers in the overlay's mcp.json (`pi-dispatch import-pi`)",
        )),
        Read::Failed(why) => Err(invalid(format!("overlay mcp.json {why}"))),
        Read::Transient(why) => Err(retry(format!("overlay mcp.json: {why}"))),
    }
}

/// A refusal for an unknown server names every server of the job that the overlay does not offer,
/// not only the first.
fn with_every_unknown(refusal: Box<Decision>, overlay: &Overlay, names: &[&str]) -> Box<Decision> {
    let mut refusal = refusal;
    if let Decision::Refuse(r) = refusal.as_mut() {
        let unknown: Vec<String> = names
            .iter()
            .filter(|n| offered(overlay, n).is_err())
            .map(|n| (*n).to_owned())
            .collect();
        if unknown.len() > 1 {
            r.detail.why = format!(
                "{} (the overlay offers none of {})",
                r.detail.why,
                unknown.join(", ")
            );
            r.detail.servers = unknown;
        }
    }
    refusal
}

fn offered<'o>(overlay: &'o Overlay, name: &str) -> Step<&'o McpServer> {
    let (why, fix) = match overlay.entry(name) {
        None => (
            "the overlay's mcp.json does not offer it".to_owned(),
            format!(
                "offer {name} in the overlay's mcp.json, or leave it out of the job's servers (its trigger's run.mcp, or --mcp of `pi-dispatch run`)"
            ),
        ),
        Some(e) => match &e.verdict {
            Ok(s) if s.enabled => return Ok(s),
            Ok(_) => (
                "it is turned off (\"enabled\": false)".to_owned(),
                format!(
                    "turn {name} on in the overlay's mcp.json, or leave it out of the job's servers (run.mcp, or --mcp)"
                ),
            ),
            Err(problems) => {
                let codes: Vec<&str> = problems.iter().map(|p| p.code.as_str()).collect();
                (
                    format!("the overlay refuses it ({})", codes.join(", ")),
                    format!(
                        "fix {name} in the overlay's mcp.json (`pi-dispatch mcp check` says why)"
                    ),
                )
            }
        },
    };
    Err(refuse(
        Reason::McpServerUnknown,
        Detail::new(why).server(name),
        fix,
    ))
}

/// The overlay's `models.json`, when it has one: refused whole when it cannot be read or holds
/// what a job may not.
fn read_models(i: &Inputs) -> Step<Option<Models>> {
    let path = overlay_file(i, "models.json");
    let invalid = |why: String| {
        refuse_plain(
            Reason::ModelsConfigInvalid,
            Detail::new(why).path(path.clone()),
        )
    };
    match i.files.overlay_models() {
        Read::Missing => Ok(None),
        Read::Bytes(bytes) => config::models::check(&bytes)
            .map(Some)
            .map_err(|e| invalid(e.to_string())),
        Read::Failed(why) => Err(invalid(format!("models.json {why}"))),
        Read::Transient(why) => Err(retry(format!("overlay models.json: {why}"))),
    }
}

/// The model part of the admission alone (doctor checks the deployment's default provider and model
/// this way): the overlay's models.json read, the model found, its key held.
pub fn model_check(i: &Inputs) -> Result<ModelChoice, Decision> {
    let models = read_models(i).map_err(|d| *d)?;
    model(i, models.as_ref()).map(|(m, _)| m).map_err(|d| *d)
}

/// The job's provider and model, `None` when neither the job nor the deployment names them.
fn job_model(i: &Inputs) -> Option<(String, String)> {
    let provider = i
        .job
        .provider
        .clone()
        .or_else(|| i.settings.provider.clone())?;
    let model = i.job.model.clone().or_else(|| i.settings.model.clone())?;
    Some((provider, model))
}

/// Every variable the job is set up to spend with, or that belongs to the forge, the proxy or the
/// runner.
fn reserved_variables(i: &Inputs) -> Step<Vec<String>> {
    let provider = job_model(i).map(|(p, _)| p);
    let listed = i.job.listed_providers(provider.as_deref());
    let mut reserved = config::providers::key_variables(listed.as_deref());
    if let Some(models) = read_models(i)? {
        reserved.extend(models.references);
    }
    Ok(reserved)
}

/// The runner's, proxy and forge variables: one list with the names a trigger may not bind as a
/// secret (`config::triggers`), so the two cannot drift.
fn is_runner_variable(name: &str) -> bool {
    config::triggers::is_reserved_secret_name(name)
}

fn secrets(i: &Inputs, server: &McpServer, name: &str, reserved: &[String]) -> Step<()> {
    let job = i.job;
    for var in server.references() {
        let var = var.as_str();
        if reserved.iter().any(|r| r == var) || is_runner_variable(var) {
            return Err(refuse_plain(
                Reason::McpSecretReserved,
                Detail::new(format!("references {var}, reserved for the job itself"))
                    .server(name)
                    .variable(var),
            ));
        }
        let mapped = job.secrets.iter().any(|s| s == var)
            || (i.settings.forward_env.iter().any(|f| f == var) && i.env.has_value(var));
        if !mapped {
            return Err(refuse(
                Reason::McpSecretUnmapped,
                Detail::new(format!(
                    "references {var}, which is neither in run.secrets nor a forwarded variable the worker holds"
                ))
                .server(name)
                .variable(var),
                format!(
                    "map {var} in the trigger's run.secrets, or add it to PI_FORWARD_ENV and set it in the worker's environment"
                ),
            ));
        }
    }
    Ok(())
}

/// Whether the trigger's `excludeTools` leaves the server a way to its tools, where its exposures
/// would otherwise give one.
fn excluded(job: &Job, server: &McpServer, name: &str) -> Step<()> {
    if has_way_in(server, &[]) && !has_way_in(server, &job.exclude_tools) {
        return Err(refuse_plain(
            Reason::McpExcluded,
            Detail::new(
                "run.excludeTools removes every route to its tools (direct, tool_search, codemode)",
            )
            .server(name)
            .field("run.excludeTools"),
        ));
    }
    Ok(())
}

/// The egress files, read as the proxy reads them. `concerns` is the server named in a refusal.
fn egress_files(i: &Inputs, concerns: Option<&str>) -> Step<(Allowlist, ModelEndpoints)> {
    let unreadable = |path: &std::path::Path, why: String| {
        let detail = Detail::new(why).path(path.display().to_string());
        refuse(
            Reason::McpEgressUnreachable,
            match concerns {
                Some(name) => detail.server(name),
                None => detail,
            },
            format!("fix {} (`pi-dispatch doctor` reads it)", path.display()),
        )
    };
    let allow = &i.settings.egress_allowlist;
    let allowlist: Allowlist = match i.files.allowlist() {
        Read::Bytes(b) => std::str::from_utf8(&b)
            .map_err(|_| "it is not UTF-8 text".to_owned())
            .and_then(|t| egress::parse_allowlist(t).map_err(|e| e.to_string()))
            .map_err(|why| {
                unreadable(
                    allow,
                    format!("egress-allowlist.conf cannot be read: {why}"),
                )
            })?,
        Read::Missing => {
            return Err(unreadable(
                allow,
                "egress-allowlist.conf does not exist".to_owned(),
            ));
        }
        Read::Failed(why) => {
            return Err(unreadable(allow, format!("egress-allowlist.conf {why}")));
        }
        Read::Transient(why) => {
            return Err(retry(format!("egress-allowlist.conf: {why}")));
        }
    };
    let ends = &i.settings.model_endpoints;
    let declared: ModelEndpoints = match i.files.endpoints() {
        Read::Missing => ModelEndpoints::empty(),
        Read::Bytes(b) => std::str::from_utf8(&b)
            .map_err(|_| "it is not UTF-8 text".to_owned())
            .and_then(|t| endpoints::parse_model_endpoints(t).map_err(|e| e.to_string()))
            .map_err(|why| {
                unreadable(ends, format!("model-endpoints.json cannot be read: {why}"))
            })?,
        Read::Failed(why) => {
            return Err(unreadable(ends, format!("model-endpoints.json {why}")));
        }
        Read::Transient(why) => {
            return Err(retry(format!("model-endpoints.json: {why}")));
        }
    };
    Ok((allowlist, declared))
}

/// The routes the job's servers need, each one the proxy would let through.
fn egress_gate(
    i: &Inputs,
    servers: &[(&McpServer, &str)],
    forge: Option<&Forge>,
) -> Step<Vec<Route>> {
    let needs_routes = forge.is_some()
        || servers.iter().any(|(s, _)| {
            matches!(s.transport, Transport::Http(_)) || s.package_runner().is_some()
        });
    if !needs_routes {
        return Ok(Vec::new());
    }
    let first = servers
        .first()
        .map(|(_, n)| *n)
        .or(forge.map(|_| mcp::FORGE));
    let (allowlist, declared) = egress_files(i, first)?;
    let gate = Gate {
        i,
        allowlist,
        declared,
    };
    let mut routes = Vec::new();
    for (server, name) in servers {
        if let Transport::Http(h) = &server.transport {
            routes.push(gate.server_route(h.url.scheme(), h.url.host(), h.url.port(), name)?);
        }
        if let Some(runner) = server.package_runner() {
            routes.push(gate.registry_route(runner, name)?);
        }
    }
    if let Some(forge) = forge {
        routes.push(gate.forge_route(forge)?);
    }
    Ok(routes)
}

/// The egress rule over the files the proxy reads: each route a job's server needs, or the
/// refusal naming what the proxy would not let through.
struct Gate<'a> {
    i: &'a Inputs<'a>,
    allowlist: Allowlist,
    declared: ModelEndpoints,
}

impl Gate<'_> {
    fn reach(&self, scheme: Scheme, host: &UrlHost, port: u16) -> Result<(), egress::Unreachable> {
        egress::route(scheme, host, port, &self.allowlist, &self.declared).map(|_| ())
    }

    /// What opens `host` on `port`: the allowlist for port 443, else a declared endpoint.
    fn unreachable_fix(&self, host: &UrlHost, port: u16) -> String {
        let settings = self.i.settings;
        if port == 443 {
            format!(
                "add {host} to {}, or declare {host} port {port} in {}",
                settings.egress_allowlist.display(),
                settings.model_endpoints.display()
            )
        } else {
            format!(
                "declare {host} port {port} in {} (the allowlist opens port 443 only)",
                settings.model_endpoints.display()
            )
        }
    }

    /// An HTTP server's own route.
    fn server_route(&self, scheme: Scheme, host: &UrlHost, port: u16, name: &str) -> Step<Route> {
        if let Err(why) = self.reach(scheme, host, port) {
            return Err(refuse(
                Reason::McpEgressUnreachable,
                Detail::new(format!("{host} port {port}: {why}"))
                    .server(name)
                    .host(host.to_string(), port),
                self.unreachable_fix(host, port),
            ));
        }
        Ok(Route {
            for_: name.to_owned(),
            host: host.to_string(),
            port,
        })
    }

    /// The route to the registry a package runner (`npx`, ...) fetches from, declared in
    /// `PI_PACKAGE_REGISTRIES`.
    fn registry_route(&self, runner: &str, name: &str) -> Step<Route> {
        let registry = self
            .i
            .settings
            .package_registries
            .iter()
            .find(|(r, _)| r == runner)
            .map(|(_, h)| h);
        let Some(host) = registry else {
            return Err(refuse(
                Reason::McpPackageRunner,
                Detail::new(format!(
                    "no registry host is declared for {runner} in PI_PACKAGE_REGISTRIES"
                ))
                .server(name)
                .variable(config::settings::REGISTRIES_SETTING),
                format!(
                    "declare {runner}=HOST in PI_PACKAGE_REGISTRIES and allowlist HOST, or install the server in the job image"
                ),
            ));
        };
        if let Err(why) = self.reach(Scheme::Https, host, 443) {
            return Err(refuse(
                Reason::McpPackageRunner,
                Detail::new(format!("{runner} fetches from {host}: {why}"))
                    .server(name)
                    .host(host.to_string(), 443),
                self.unreachable_fix(host, 443),
            ));
        }
        Ok(Route {
            for_: name.to_owned(),
            host: host.to_string(),
            port: 443,
        })
    }

    /// The route to the forge's API, which the forge's server calls.
    fn forge_route(&self, forge: &Forge) -> Step<Route> {
        let (scheme, host, port) = forge_api(self.i, forge)?;
        if let Err(why) = self.reach(scheme, &host, port) {
            return Err(refuse(
                Reason::McpEgressUnreachable,
                Detail::new(format!("the forge API {host} port {port}: {why}"))
                    .server(mcp::FORGE)
                    .host(host.to_string(), port),
                self.unreachable_fix(&host, port),
            ));
        }
        Ok(Route {
            for_: mcp::FORGE.to_owned(),
            host: host.to_string(),
            port,
        })
    }
}

/// The scheme, host and port of the forge's API: `PI_GITHUB_API_URL` (GitHub's own when it cannot
/// be read), or GitLab's API URL.
fn forge_api(i: &Inputs, forge: &Forge) -> Step<(Scheme, UrlHost, u16)> {
    match forge {
        Forge::Github { .. } => match config::url::parse(&i.settings.github_api_url) {
            Ok(u) => Ok((u.scheme(), u.host().clone(), u.port())),
            Err(_) => Ok((
                Scheme::Https,
                UrlHost::Name(GITHUB_API_HOST.to_owned()),
                443,
            )),
        },
        Forge::Gitlab { api_url } => match config::url::parse(api_url) {
            Ok(u) => Ok((u.scheme(), u.host().clone(), u.port())),
            Err(_) => Err(refuse_plain(
                Reason::McpServerUnknown,
                Detail::new("GITLAB_URL cannot be read as a URL")
                    .server(mcp::FORGE)
                    .variable(config::settings::GITLAB_URL_SETTING),
            )),
        },
    }
}

/// The job's model: it exists (pi's catalog, or the overlay's models.json), its trigger's list
/// allows it, and the worker holds its key unless it is keyless. With egress on, also the route
/// to the model's own endpoint when the overlay sets one.
fn model(i: &Inputs, models: Option<&Models>) -> Step<(ModelChoice, Option<Route>)> {
    let named = named_model(i)?;
    let found = catalog::find(models, &named.provider, &named.model)
        .map_err(|e| model_not_found(i, &named, e))?;
    on_the_model_list(i.job, &named)?;
    metered(i, models, &named)?;
    // The model's own endpoint, when the overlay sets one: keyless when declared so.
    let endpoint = found
        .base_url
        .as_deref()
        .and_then(|u| config::url::parse(u).ok());
    let keyless = endpoint
        .as_ref()
        .is_some_and(|url| declared_keyless(i, url));
    let key_variable = if keyless {
        None
    } else {
        Some(held_key(i, &found, &named)?)
    };
    let route = endpoint.map(|url| Route {
        for_: "model".to_owned(),
        host: url.host().to_string(),
        port: url.port(),
    });
    let source = match found.source {
        catalog::Source::Builtin => "builtin",
        catalog::Source::Overlay => "overlay",
    };
    Ok((
        ModelChoice {
            provider: named.provider,
            model: named.model,
            key_variable,
            source,
        },
        route.filter(|_| i.settings.egress),
    ))
}

/// A job's provider and model, and how messages name them (`provider/model`).
struct NamedModel {
    provider: String,
    model: String,
    full: String,
}

/// The provider and model the job names, else the deployment's (`model-unset` when neither does).
fn named_model(i: &Inputs) -> Step<NamedModel> {
    let Some((provider, model)) = job_model(i) else {
        return Err(refuse_plain(
            Reason::ModelUnset,
            Detail::new("neither the job nor PI_PROVIDER and PI_MODEL name a provider and model")
                .variables([
                    config::settings::PROVIDER_SETTING,
                    config::settings::MODEL_SETTING,
                ]),
        ));
    };
    Ok(NamedModel {
        full: format!("{provider}/{model}"),
        provider,
        model,
    })
}

/// The refusal of a provider or model that neither pi's catalog nor the overlay's models.json has.
fn model_not_found(i: &Inputs, named: &NamedModel, e: catalog::NotFound) -> Box<Decision> {
    let NamedModel {
        provider,
        model,
        full,
    } = named;
    match e {
        catalog::NotFound::ProviderUnknown => refuse(
            Reason::ModelProviderUnknown,
            Detail::new(format!(
                "{provider} is neither a provider of pi {} nor in the overlay's models.json",
                catalog::pi_version()
            ))
            .model(full.clone()),
            format!(
                "name a provider pi knows, or define {provider} in {}",
                overlay_file(i, "models.json")
            ),
        ),
        catalog::NotFound::ModelUnknown => refuse(
            Reason::ModelUnknown,
            Detail::new(format!(
                "{provider} has no chat model {model} (pi {}'s catalog and the overlay's models.json)",
                catalog::pi_version()
            ))
            .model(full.clone()),
            format!(
                "name one of {provider}'s models, or add {model} to {provider}'s models in the overlay's models.json"
            ),
        ),
    }
}

/// The model is on the trigger's `run.models`, when it has one.
fn on_the_model_list(job: &Job, named: &NamedModel) -> Step<()> {
    let full = &named.full;
    match &job.models {
        Some(list) if !list.contains(full) => Err(refuse(
            Reason::ModelNotAllowed,
            Detail::new(format!("{full} is not on the trigger's model list"))
                .field("run.models")
                .model(full.clone()),
            format!("add {full} to the trigger's run.models, or choose a model on it"),
        )),
        _ => Ok(()),
    }
}

/// The job's model gateway must be able to check and meter the model's calls: its provider
/// speaks a wire format the gateway reads.
fn metered(i: &Inputs, models: Option<&Models>, named: &NamedModel) -> Step<()> {
    let NamedModel {
        provider,
        model,
        full,
    } = named;
    let Some(own) =
        config::model_rules::uncarried_chat_model(catalog::builtin(), models, provider, model)
    else {
        return Ok(());
    };
    Err(refuse(
        Reason::ModelUnsupported,
        Detail::new(format!(
            "{full} speaks {}, which the job's model gateway cannot check and meter",
            own.api
        ))
        .model(full.clone()),
        format!(
            "choose a model whose provider speaks openai-completions, openai-responses or anthropic-messages, or set such an api for {provider} in {}",
            overlay_file(i, "models.json")
        ),
    ))
}

/// Whether `model-endpoints.json` declares the model's endpoint `url` keyless.
fn declared_keyless(i: &Inputs, url: &config::url::PlainUrl) -> bool {
    let declared = match i.files.endpoints() {
        Read::Bytes(b) => std::str::from_utf8(&b)
            .ok()
            .and_then(|t| endpoints::parse_model_endpoints(t).ok()),
        _ => None,
    };
    declared.is_some_and(|d| {
        d.endpoints
            .iter()
            .any(|e| e.keyless && e.port == url.port() && &e.host == url.host())
    })
}

/// The variable holding the model's key in the worker's environment: the first pi reads that
/// holds a value.
fn held_key(i: &Inputs, found: &catalog::Found, named: &NamedModel) -> Step<String> {
    let NamedModel { provider, full, .. } = named;
    if let Some(v) = found.key_variables.iter().find(|v| i.env.has_value(v)) {
        return Ok(v.clone());
    }
    if found.key_variables.is_empty() {
        return Err(refuse(
            Reason::ModelKeyMissing,
            Detail::new(format!(
                "pi takes {provider}'s key only from a sign-in, which a job cannot make"
            ))
            .model(full.clone()),
            format!(
                "give {provider} an apiKey variable in the overlay's models.json, or use another provider"
            ),
        ));
    }
    Err(refuse(
        Reason::ModelKeyMissing,
        Detail::new(format!(
            "the worker's environment sets none of the variables pi reads for {provider}'s key"
        ))
        .model(full.clone())
        .variables(found.key_variables.iter().cloned()),
        format!(
            "set {} in the worker's environment",
            found.key_variables.join(" or ")
        ),
    ))
}

/// The folder the job works in, and the user it runs as.
fn workspace(i: &Inputs) -> Step<(Kind, Workspace)> {
    let job = i.job;
    match job.kind() {
        Some(Kind::Local) => Ok((Kind::Local, local_workspace(i)?)),
        Some(kind @ (Kind::Github | Kind::Gitlab)) => Ok((kind, forge_workspace(i)?)),
        _ => Err(refuse_plain(
            Reason::JobKindUnsupported,
            Detail::new(format!("this version does not run {} jobs", job.kind)).field("run.kind"),
        )),
    }
}

/// A forge job's clone (made after admission, in the job's state folder) and its user: under a
/// root worker `PI_FORGE_JOB_USER` (nobody by default), else the worker's own user. The job must
/// carry its event, follow a forge flow, and the worker must hold what it acts on the forge with.
fn forge_workspace(i: &Inputs) -> Step<Workspace> {
    let job = i.job;
    let event = forge_job_event(job)?;
    forge_flow(job)?;
    match event.forge {
        protocol::forge_event::Forge::Github => github_set_up(i, event)?,
        protocol::forge_event::Forge::Gitlab => gitlab_set_up(i)?,
    }
    let (uid, gid) = if i.host.root {
        i.settings
            .forge_job_user
            .unwrap_or(config::settings::DEFAULT_FORGE_JOB_USER)
    } else {
        (i.host.user.uid, i.host.user.gid)
    };
    let path = forge_workspace_path(&i.settings.dir, &job.id);
    Ok(Workspace {
        path: path.display().to_string(),
        uid,
        gid,
    })
}

/// A forge job's event: of the job's own forge, its names held to the forge's grammar.
fn forge_job_event(job: &Job) -> Step<&protocol::forge_event::ForgeEvent> {
    let Some(event) = job.event.as_ref().filter(|e| e.forge.as_str() == job.kind) else {
        return Err(refuse_plain(
            Reason::JobUnreadable,
            Detail::new(format!("a {} job without its forge event", job.kind)).field("event"),
        ));
    };
    // The names the worker builds URLs and paths from, held to the forge's grammar (a saved or
    // older event included).
    if let Err(invalid) = protocol::forge_names::check(event) {
        return Err(refuse_plain(
            Reason::JobUnreadable,
            Detail::new(invalid.to_string()).field(format!("event.{}", invalid.0)),
        ));
    }
    Ok(event)
}

/// A forge job follows a forge flow (answer or fix), never a command.
fn forge_flow(job: &Job) -> Step<()> {
    match (&job.flow, &job.command) {
        (Some(flow), None) if Flow::parse(flow).is_some() => Ok(()),
        (_, Some(_)) => Err(refuse_plain(
            Reason::JobFlowUnsupported,
            Detail::new("a forge job follows a flow; it does not run a command")
                .field("run.command"),
        )),
        _ => Err(refuse_plain(
            Reason::JobFlowUnsupported,
            Detail::new("a forge job's flow is answer or fix").field("run.flow"),
        )),
    }
}

/// `forge-unconfigured` for `why`, naming the settings concerned.
fn unconfigured(why: &str, variables: &[&str]) -> Box<Decision> {
    let mut detail = Detail::new(why.to_owned());
    for v in variables {
        detail = detail.variable(*v);
    }
    refuse_plain(Reason::ForgeUnconfigured, detail)
}

/// A GitHub App that can mint the job's token: its id and a key that signs, and an event that
/// came through one of its installations.
fn github_set_up(i: &Inputs, event: &protocol::forge_event::ForgeEvent) -> Step<()> {
    use config::settings as s;
    if i.settings.github_app_id.is_none() || i.settings.github_app_key_file.is_none() {
        return Err(unconfigured(
            "no GitHub App is set up to mint the job's token",
            &[s::GITHUB_APP_ID_SETTING, s::GITHUB_APP_KEY_SETTING],
        ));
    }
    if i.host.github_key == Some(false) {
        return Err(unconfigured(
            "the GitHub App's key cannot be read or cannot sign, so no token can be minted for the job",
            &[s::GITHUB_APP_KEY_SETTING],
        ));
    }
    if event.installation.is_none() {
        return Err(unconfigured(
            "the event came through no GitHub App installation, so no token can be minted for it",
            &[],
        ));
    }
    Ok(())
}

/// GitLab's URL, plain, and a token the worker acts with.
fn gitlab_set_up(i: &Inputs) -> Step<()> {
    use config::settings as s;
    if i.settings
        .gitlab_url
        .as_deref()
        .and_then(gitlab_api_url)
        .is_none()
    {
        return Err(unconfigured(
            "GITLAB_URL is unset or not a plain http(s) URL",
            &[s::GITLAB_URL_SETTING],
        ));
    }
    if !i.env.has_value(s::GITLAB_TOKEN_SETTING) {
        return Err(unconfigured(
            "the worker holds no GitLab token to act with",
            &[s::GITLAB_TOKEN_SETTING],
        ));
    }
    Ok(())
}

/// A job's own folder on the host: `state/jobs/<id>`.
pub fn job_state_dir(deployment: &std::path::Path, job_id: &str) -> std::path::PathBuf {
    deployment.join("state").join("jobs").join(job_id)
}

/// Where a forge job's clone is made: `state/jobs/<id>/workspace`.
pub fn forge_workspace_path(deployment: &std::path::Path, job_id: &str) -> std::path::PathBuf {
    job_state_dir(deployment, job_id).join("workspace")
}

/// The folder a local job works in, and the user it runs as.
fn local_workspace(i: &Inputs) -> Step<Workspace> {
    let job = i.job;
    let Some(path) = job.folder.as_deref() else {
        return Err(refuse_plain(
            Reason::JobUnreadable,
            Detail::new("a local job without a folder").field("folder"),
        ));
    };
    let folder = local_folder(i, path)?;
    // A job of a root worker runs as its folder's owner; never as root, whose files its sandbox's
    // user would then own.
    if folder.uid == 0 && i.host.root {
        return Err(refuse(
            Reason::WorkspaceOwnedByRoot,
            Detail::new(format!("{path} belongs to root"))
                .path(path)
                .uid(0),
            format!("give {path} to the user the job should run as: chown -R USER {path}"),
        ));
    }
    reachable_by_the_job(i, path, &folder)?;
    Ok(Workspace {
        path: path.to_owned(),
        uid: folder.uid,
        gid: folder.gid,
    })
}

/// The job's folder as the worker sees it: a folder, with its owner and mode.
fn local_folder(i: &Inputs, path: &str) -> Step<reach::Folder> {
    match i.folders.folder(path) {
        Folder::Folder { uid, gid, mode } => Ok(reach::Folder { mode, uid, gid }),
        Folder::Missing => Err(refuse_plain(
            Reason::WorkspaceMissing,
            Detail::new(format!("{path} does not exist")).path(path),
        )),
        Folder::NotAFolder => Err(refuse_plain(
            Reason::WorkspaceMissing,
            Detail::new(format!("{path} is not a folder")).path(path),
        )),
        Folder::Failed(why) => Err(refuse(
            Reason::WorkspaceUnreachable,
            Detail::new(format!("{path} {why}")).path(path),
            format!("let the worker's user reach {path}"),
        )),
        Folder::Transient(why) => Err(retry(format!("{path} {why}"))),
    }
}

/// The job's user can use its folder: the folder's owner under a root worker, else the worker's
/// own user.
fn reachable_by_the_job(i: &Inputs, path: &str, folder: &reach::Folder) -> Step<()> {
    let user = if i.host.root {
        reach::User {
            uid: folder.uid,
            gid: folder.gid,
            groups: Vec::new(),
        }
    } else {
        i.host.user.clone()
    };
    let Err(unreachable) = reach::check(
        std::path::Path::new(path),
        folder,
        &user,
        &reach::WORKSPACE,
        i.host.passwd.as_deref(),
    ) else {
        return Ok(());
    };
    let missing: Vec<&str> = unreachable.missing.iter().map(|a| a.as_str()).collect();
    Err(refuse(
        Reason::WorkspaceUnreachable,
        Detail::new(unreachable.to_string())
            .path(path)
            .uid(user.uid),
        format!(
            "let uid {} {} {path} (chown or chmod), or run the job on a folder it can use",
            user.uid,
            missing.join(" and ")
        ),
    ))
}

#[cfg(test)]
#[path = "admission_tests.rs"]
mod tests;
