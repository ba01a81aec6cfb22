//! The MCP pickup gates: one pure function that admits a job (with its `/job/mcp.json`), refuses it
//! with one of the spec's reasons, or asks for a retry when a read failed in a way that may pass.
//!
//! Files, image labels and the worker's environment come through small traits, so every rule is
//! tested on values; the file-reading implementations live with the worker.

use config::egress::{self, Allowlist};
use config::endpoints::{self, ModelEndpoints};
use config::json::Json;
use config::mcp::{self, Exposure, McpServer, Overlay, ServerName, Transport};
use config::settings::Settings;
use config::triggers::{Kind, Trigger};
use config::url::{Host, Scheme};
use serde::Serialize;

use crate::job::Job;
use crate::job_mcp::{Forge, JobMcpFile};
use crate::providers;
use crate::reason::Reason;

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

/// The deployment files the gates read.
pub trait Files {
    fn overlay_mcp(&self) -> Read;
    fn overlay_models(&self) -> Read;
    fn allowlist(&self) -> Read;
    fn endpoints(&self) -> Read;
}

/// An image's `dev.pi-dispatch.capabilities` label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Capabilities {
    /// The declared capabilities (an image without the label declares none).
    Declared(Vec<String>),
    /// The labels could not be read in a way that may pass.
    Transient(String),
}

/// Reads image labels; the embedded backend reads `images/NAME/image.json`, a container backend
/// asks its engine.
pub trait ImageLabels {
    fn capabilities(&self, image: &str) -> Capabilities;
}

/// The worker's own environment, by name only: whether a variable holds a value.
pub trait WorkerEnv {
    fn has_value(&self, name: &str) -> bool;
}

pub struct Inputs<'a> {
    pub job: &'a Job,
    /// The trigger at the job's index in triggers.json as it is now, when there is one.
    pub trigger_now: Option<&'a Trigger>,
    pub settings: &'a Settings,
    pub files: &'a dyn Files,
    pub images: &'a dyn ImageLabels,
    pub env: &'a dyn WorkerEnv,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Start the job; `mcp` is its `/job/mcp.json` when it names servers.
    Admit {
        mcp: Option<JobMcpFile>,
    },
    Refuse(Refusal),
    /// Try again later: nothing was decided.
    Retry {
        detail: String,
    },
}

/// A refusal: the reason, the fixed public comment, and the log line with the detail.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Refusal {
    pub reason: Reason,
    /// The server the rule concerns, when there is one.
    pub server: Option<String>,
    pub comment: String,
    pub log: Log,
}

/// The worker's `refused_<reason>` log line: names and counts, never a value.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Log {
    pub event: &'static str,
    pub reason: Reason,
    #[serde(rename = "jobId")]
    pub job_id: String,
    pub server: Option<String>,
    pub detail: String,
}

impl Refusal {
    fn new(job: &Job, reason: Reason, server: Option<&str>, detail: impl Into<String>) -> Refusal {
        Refusal {
            reason,
            server: server.map(str::to_owned),
            comment: reason.comment(server),
            log: Log {
                event: reason.log_event(),
                reason,
                job_id: job.id.clone(),
                server: server.map(str::to_owned),
                detail: detail.into(),
            },
        }
    }

    /// The run record of a refused job: a policy outcome that spent nothing.
    pub fn record(&self, job: &Job) -> serde_json::Value {
        serde_json::json!({
            "jobId": job.id,
            "outcome": "policy",
            "reason": self.reason.as_str(),
            "exitCode": null,
            "turns": null,
            "tokens": null,
            "provider": job.provider,
            "model": job.model,
            "budgetReserved": false,
            "triggerIndex": job.trigger_index,
            "triggerType": job.trigger_type,
        })
    }
}

/// The GitHub API host a github job's forge server reaches.
pub const GITHUB_API_HOST: &str = "api.github.com";
pub const MAX_NAMES: usize = 8;

/// A step of the gates: `Err` ends the decision there.
type Step<T> = Result<T, Box<Decision>>;

/// Decides whether the job may start.
pub fn decide(i: &Inputs) -> Decision {
    match decide_steps(i) {
        Ok(d) => d,
        Err(d) => *d,
    }
}

fn refuse(
    job: &Job,
    reason: Reason,
    server: Option<&str>,
    detail: impl Into<String>,
) -> Box<Decision> {
    Box::new(Decision::Refuse(Refusal::new(job, reason, server, detail)))
}

fn retry(detail: String) -> Box<Decision> {
    Box::new(Decision::Retry { detail })
}

fn decide_steps(i: &Inputs) -> Step<Decision> {
    let job = i.job;
    skew(i)?;
    let Some(names) = &job.mcp else {
        return Ok(Decision::Admit { mcp: None });
    };
    let names = list(job, names)?;
    let forge = names.iter().any(|n| n == mcp::FORGE);
    capabilities(i, forge)?;
    let forge = if forge { Some(forge_entry(i)?) } else { None };

    let overlay_names: Vec<&String> = names.iter().filter(|n| *n != mcp::FORGE).collect();
    // The overlay is read only when a server of it is named: forge alone needs none.
    let overlay = if overlay_names.is_empty() {
        None
    } else {
        let named: Vec<&str> = overlay_names.iter().map(|n| n.as_str()).collect();
        Some(read_overlay(i, &named)?)
    };
    let mut servers = Vec::new();
    if let Some(overlay) = &overlay {
        for name in &overlay_names {
            servers.push((offered(job, overlay, name)?, name.as_str()));
        }
    }

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
        let routes = Routes::new(mcp::FORGE, Exposure::Codemode, &[]);
        if !routes.way_in(&job.exclude_tools) {
            return Err(refuse(
                job,
                Reason::McpExcluded,
                Some(mcp::FORGE),
                "run.excludeTools removes every route to its tools (direct, tool_search, codemode)",
            ));
        }
    }
    if i.settings.egress {
        egress_gate(i, &servers, forge.as_ref())?;
    }

    let entries: Vec<(String, Json)> = servers
        .iter()
        .filter_map(|(_, name)| {
            let entry = overlay.as_ref()?.entry(name)?;
            Some((name.to_string(), entry.raw.clone()))
        })
        .collect();
    let codemode_models = overlay.as_ref().is_none_or(|o| o.codemode_models);
    Ok(Decision::Admit {
        mcp: Some(JobMcpFile::new(&entries, forge.as_ref(), codemode_models)),
    })
}

/// The narrowing fields: when the trigger as authored now has one and the job arrived without it,
/// the job would run with more than its trigger allows.
fn skew(i: &Inputs) -> Step<()> {
    let (job, Some(now)) = (i.job, i.trigger_now) else {
        return Ok(());
    };
    if now.on.type_name() != job.trigger_type {
        return Ok(()); // another trigger stands at that index now: nothing to compare with
    }
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
        Some((field, _)) => Err(refuse(
            job,
            Reason::TriggerSkew,
            None,
            format!("the trigger names run.{field} and the job arrived without it"),
        )),
        None => Ok(()),
    }
}

/// The list as the loader writes it: 1 to 8 distinct names, each `forge` or a server name.
fn list<'a>(job: &Job, names: &'a [String]) -> Step<&'a [String]> {
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
        Some("an entry is not a server name".to_owned())
    } else {
        None
    };
    match why {
        Some(w) => Err(refuse(job, Reason::McpListInvalid, None, w)),
        None => Ok(names),
    }
}

fn capabilities(i: &Inputs, forge: bool) -> Step<()> {
    let job = i.job;
    let image = job
        .image
        .as_deref()
        .or(i.settings.job_image.as_deref())
        .unwrap_or(config::settings::DEFAULT_JOB_IMAGE);
    let declared = match i.images.capabilities(image) {
        Capabilities::Declared(caps) => caps,
        Capabilities::Transient(why) => {
            return Err(retry(format!("image labels: {why}")));
        }
    };
    if !declared.iter().any(|c| c == "mcp") {
        return Err(refuse(
            job,
            Reason::JobImageMcpUnsupported,
            None,
            format!("image {image} does not declare the mcp capability"),
        ));
    }
    if forge && !declared.iter().any(|c| c == "forgeMcp") {
        return Err(refuse(
            job,
            Reason::JobImageForgeMcpUnsupported,
            Some(mcp::FORGE),
            format!("image {image} does not declare the forgeMcp capability"),
        ));
    }
    Ok(())
}

/// The forge entry of a github or gitlab job; any other job naming `forge` is refused.
fn forge_entry(i: &Inputs) -> Step<Forge> {
    let job = i.job;
    let unknown = |detail: &str| {
        refuse(
            job,
            Reason::McpServerUnknown,
            Some(mcp::FORGE),
            detail.to_owned(),
        )
    };
    match job.kind() {
        Some(Kind::Github) => Ok(Forge::Github),
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

fn read_overlay(i: &Inputs, names: &[&str]) -> Step<Overlay> {
    let job = i.job;
    match i.files.overlay_mcp() {
        Read::Bytes(bytes) => mcp::parse_overlay_named(&bytes, names).map_err(|e| {
            refuse(
                job,
                Reason::McpConfigInvalid,
                None,
                format!("overlay mcp.json: {} [{}]", e, e.code()),
            )
        }),
        Read::Missing => Err(refuse(
            job,
            Reason::McpConfigInvalid,
            None,
            "overlay mcp.json is missing",
        )),
        Read::Failed(why) => Err(refuse(
            job,
            Reason::McpConfigInvalid,
            None,
            format!("overlay mcp.json {why}"),
        )),
        Read::Transient(why) => Err(retry(format!("overlay mcp.json: {why}"))),
    }
}

fn offered<'o>(job: &Job, overlay: &'o Overlay, name: &str) -> Step<&'o McpServer> {
    let why = match overlay.entry(name) {
        None => "the overlay's mcp.json does not offer it".to_owned(),
        Some(e) => match &e.verdict {
            Ok(s) if s.enabled => return Ok(s),
            Ok(_) => "it is turned off (\"enabled\": false)".to_owned(),
            Err(problems) => {
                let codes: Vec<&str> = problems.iter().map(|p| p.code.as_str()).collect();
                format!("the overlay refuses it ({})", codes.join(", "))
            }
        },
    };
    Err(refuse(job, Reason::McpServerUnknown, Some(name), why))
}

/// Every variable the job is set up to spend with, or that belongs to the forge, the proxy or the
/// runner.
fn reserved_variables(i: &Inputs) -> Step<Vec<String>> {
    let job = i.job;
    let listed = job.listed_providers();
    let mut reserved: Vec<String> = providers::key_variables(listed.as_deref())
        .into_iter()
        .map(str::to_owned)
        .collect();
    match i.files.overlay_models() {
        Read::Missing => {}
        Read::Bytes(bytes) => match config::models::check(&bytes) {
            Ok(models) => reserved.extend(models.references),
            Err(e) => {
                return Err(refuse(
                    job,
                    Reason::McpConfigInvalid,
                    None,
                    format!("overlay models.json: {e}"),
                ));
            }
        },
        Read::Failed(why) => {
            return Err(refuse(
                job,
                Reason::McpConfigInvalid,
                None,
                format!("overlay models.json {why}"),
            ));
        }
        Read::Transient(why) => {
            return Err(retry(format!("overlay models.json: {why}")));
        }
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
            return Err(refuse(
                job,
                Reason::McpSecretReserved,
                Some(name),
                format!("references {var}, reserved for the job itself"),
            ));
        }
        let mapped = job.secrets.iter().any(|s| s == var)
            || (i.settings.forward_env.iter().any(|f| f == var) && i.env.has_value(var));
        if !mapped {
            return Err(refuse(
                job,
                Reason::McpSecretUnmapped,
                Some(name),
                format!(
                    "references {var}, which is neither in run.secrets nor a forwarded variable the worker holds"
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
        return Err(refuse(
            job,
            Reason::McpExcluded,
            Some(name),
            "run.excludeTools removes every route to its tools (direct, tool_search, codemode)",
        ));
    }
    Ok(())
}

/// How a server's tools can be reached, for judging `excludeTools`.
struct Routes {
    /// `mcp__<server>__`, as pi writes it (characters outside `[A-Za-z0-9_]` become `_`).
    prefix: String,
    /// The exposure of tools no exact `toolExposure` name covers (none when a `*` entry takes all).
    default: Vec<Exposure>,
    /// Tools named exactly in `toolExposure`, as pi names them, with their exposure.
    named: Vec<(String, Exposure)>,
}

/// A name as pi writes it into a tool name.
fn pi_name(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl Routes {
    fn new(server: &str, exposure: Exposure, tool_exposure: &[(String, Exposure)]) -> Routes {
        let prefix = format!("mcp__{}__", pi_name(server));
        let mut default = Vec::new();
        let mut named = Vec::new();
        for (key, e) in tool_exposure {
            if key.contains('*') {
                default.push(*e);
            } else {
                named.push((format!("{prefix}{}", pi_name(key)), *e));
            }
        }
        if !tool_exposure.iter().any(|(k, _)| k == "*") {
            default.push(exposure);
        }
        Routes {
            prefix,
            default,
            named,
        }
    }

    fn of(server: &McpServer) -> Routes {
        Routes::new(
            server.name.as_str(),
            server.exposure.unwrap_or(Exposure::Codemode),
            &server.tool_exposure,
        )
    }

    /// Whether any route to a tool survives `exclude` (pi tool names and `*` patterns).
    fn way_in(&self, exclude: &[String]) -> bool {
        if exclude.iter().any(|p| covers_every_tool(p, &self.prefix)) {
            return false;
        }
        let open = |tool: &str| !exclude.iter().any(|p| glob(p, tool));
        let (codemode, search) = (open("codemode"), open("tool_search"));
        let reachable = |e: &Exposure| match e {
            Exposure::Direct => true,
            Exposure::Deferred => search,
            Exposure::Codemode => codemode || search,
            Exposure::Hidden => false,
        };
        self.default.iter().any(reachable)
            || self
                .named
                .iter()
                .any(|(tool, e)| open(tool) && reachable(e))
    }
}

/// Whether any route to the server's tools survives `exclude`.
pub fn has_way_in(server: &McpServer, exclude: &[String]) -> bool {
    Routes::of(server).way_in(exclude)
}

/// Whether `pattern` matches every tool name starting with `prefix`: it ends in `*`, and what comes
/// before that star matches some start of `prefix` (the star then takes the rest of any name).
fn covers_every_tool(pattern: &str, prefix: &str) -> bool {
    pattern.strip_suffix('*').is_some_and(|head| {
        (0..=prefix.len()).any(|k| prefix.is_char_boundary(k) && glob(head, &prefix[..k]))
    })
}

/// `*` matches any run of characters; everything else matches itself.
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ti < t.len() {
        if pi < p.len() && p[pi] != '*' && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

fn egress_gate(i: &Inputs, servers: &[(&McpServer, &str)], forge: Option<&Forge>) -> Step<()> {
    let job = i.job;
    let needs_routes = forge.is_some()
        || servers.iter().any(|(s, _)| {
            matches!(s.transport, Transport::Http(_)) || s.package_runner().is_some()
        });
    if !needs_routes {
        return Ok(());
    }
    let first = servers
        .first()
        .map(|(_, n)| *n)
        .or(forge.map(|_| mcp::FORGE));
    let allowlist: Allowlist = match i.files.allowlist() {
        Read::Bytes(b) => std::str::from_utf8(&b)
            .map_err(|_| "it is not UTF-8 text".to_owned())
            .and_then(|t| egress::parse_allowlist(t).map_err(|e| e.to_string()))
            .map_err(|why| {
                refuse(
                    job,
                    Reason::McpEgressUnreachable,
                    first,
                    format!("egress-allowlist.conf cannot be read: {why}"),
                )
            })?,
        Read::Missing | Read::Failed(_) => {
            return Err(refuse(
                job,
                Reason::McpEgressUnreachable,
                first,
                "egress-allowlist.conf cannot be read",
            ));
        }
        Read::Transient(why) => {
            return Err(retry(format!("egress-allowlist.conf: {why}")));
        }
    };
    let declared: ModelEndpoints = match i.files.endpoints() {
        Read::Missing => ModelEndpoints::empty(),
        Read::Bytes(b) => std::str::from_utf8(&b)
            .map_err(|_| "it is not UTF-8 text".to_owned())
            .and_then(|t| endpoints::parse_model_endpoints(t).map_err(|e| e.to_string()))
            .map_err(|why| {
                refuse(
                    job,
                    Reason::McpEgressUnreachable,
                    first,
                    format!("model-endpoints.json cannot be read: {why}"),
                )
            })?,
        Read::Failed(why) => {
            return Err(refuse(
                job,
                Reason::McpEgressUnreachable,
                first,
                format!("model-endpoints.json {why}"),
            ));
        }
        Read::Transient(why) => {
            return Err(retry(format!("model-endpoints.json: {why}")));
        }
    };
    let reach = |scheme: Scheme, host: &Host, port: u16| {
        egress::route(scheme, host, port, &allowlist, &declared)
    };
    for (server, name) in servers {
        if let Transport::Http(h) = &server.transport
            && let Err(why) = reach(h.url.scheme(), h.url.host(), h.url.port())
        {
            return Err(refuse(
                job,
                Reason::McpEgressUnreachable,
                Some(name),
                format!("{} port {}: {why}", h.url.host(), h.url.port()),
            ));
        }
        if let Some(runner) = server.package_runner() {
            let registry = i
                .settings
                .package_registries
                .iter()
                .find(|(r, _)| r == runner)
                .map(|(_, h)| h);
            let Some(host) = registry else {
                return Err(refuse(
                    job,
                    Reason::McpPackageRunner,
                    Some(name),
                    format!("no registry host is declared for {runner} in PI_PACKAGE_REGISTRIES"),
                ));
            };
            if let Err(why) = reach(Scheme::Https, host, 443) {
                return Err(refuse(
                    job,
                    Reason::McpPackageRunner,
                    Some(name),
                    format!("{runner} fetches from {host}: {why}"),
                ));
            }
        }
    }
    if let Some(forge) = forge {
        let (scheme, host, port) = match forge {
            Forge::Github => (Scheme::Https, Host::Name(GITHUB_API_HOST.to_owned()), 443),
            Forge::Gitlab { api_url } => match config::url::parse(api_url) {
                Ok(u) => (u.scheme(), u.host().clone(), u.port()),
                Err(_) => {
                    return Err(refuse(
                        job,
                        Reason::McpServerUnknown,
                        Some(mcp::FORGE),
                        "GITLAB_URL cannot be read as a URL",
                    ));
                }
            },
        };
        if let Err(why) = reach(scheme, &host, port) {
            return Err(refuse(
                job,
                Reason::McpEgressUnreachable,
                Some(mcp::FORGE),
                format!("the forge API {host} port {port}: {why}"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "gates_tests.rs"]
mod tests;
