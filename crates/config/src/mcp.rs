//! The overlay's `mcp.json`: which MCP servers the operator offers to jobs.
//!
//! `parse_overlay` reads the whole file strictly (any duplicate key or a wrong top-level shape refuses
//! it), then validates each server on its own into either a [`McpServer`] or the list of its
//! [`Problem`]s, so one bad entry never hides the verdict on the others.

use std::collections::{BTreeSet, HashSet};

use unicode_general_category::{GeneralCategory, get_general_category};

use crate::json::{self, Json, JsonError, Object};
use crate::problem::{Problem, ProblemCode as Code, printable_key};
use crate::reference::{Reference, Template, VarName};
use crate::url::{self, PlainUrl, UrlProblem};

/// The largest overlay file read; a larger one is refused whole rather than held in memory.
pub const MAX_FILE_BYTES: usize = 8 * 1024 * 1024;
pub const MAX_NAME_CHARS: usize = 32;
pub const MAX_DESCRIPTION_CHARS: usize = 300;
pub const TIMEOUT_SECONDS: std::ops::RangeInclusive<u64> = 1..=600;

/// The name of the worker's own forge server, which no overlay entry may take.
pub const FORGE: &str = "forge";

/// Commands that download what they run at every start, refused without `allowPackageRunner`.
pub const PACKAGE_RUNNERS: [&str; 10] = [
    "npx", "npm", "pnpm", "pnpx", "yarn", "bunx", "bun", "uvx", "uv", "pipx",
];

/// Folders a stdio command may live under: the image's own, and the overlay at `/opt/pi-global`.
/// Every other folder is one the job can write to.
pub const COMMAND_ROOTS: [&str; 5] = ["usr", "bin", "sbin", "opt", "app"];

/// Variables of the job's usage meter, which a server's `env` may not replace.
pub const METER_VARIABLES: [&str; 3] = [
    "NODE_OPTIONS",
    "PI_DISPATCH_CHILD_LEDGER",
    "PI_DISPATCH_RUNNER_PID",
];

/// Header names the hub itself sets for every request; an entry may not set them.
/// (The spec is silent here; these would let an entry reframe or redirect the request.)
pub const RESERVED_HEADERS: [&str; 12] = [
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
    "proxy-authorization",
    "mcp-session-id",
    "mcp-protocol-version",
];

/// A validated server name: `^[a-z0-9]+(-[a-z0-9]+)*$`, at most 32 characters, neither `forge` nor
/// holding `dispatch`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServerName(String);

impl ServerName {
    pub fn parse(s: &str) -> Result<ServerName, Problem> {
        if !is_name_shape(s) {
            return Err(Problem::new(
                Code::NameInvalid,
                "name",
                format!(
                    "a server name is lowercase letters and digits, words joined by single '-', at most {MAX_NAME_CHARS} characters"
                ),
            ));
        }
        if s == FORGE {
            return Err(Problem::new(
                Code::NameReserved,
                "name",
                "'forge' is the worker's own forge server; name this server otherwise (a trigger names forge without an overlay entry)",
            ));
        }
        if s.contains("dispatch") {
            return Err(Problem::new(
                Code::NameReserved,
                "name",
                "a name holding 'dispatch' is reserved for pi-dispatch itself",
            ));
        }
        Ok(ServerName(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ServerName {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether `s` has the shape of a server name (the reserved names included).
pub fn is_name_shape(s: &str) -> bool {
    s.len() <= MAX_NAME_CHARS
        && !s.is_empty()
        && s.split('-').all(|w| {
            !w.is_empty()
                && w.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
}

/// How pi reaches a server's tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposure {
    Codemode,
    Deferred,
    Direct,
    Hidden,
}

impl Exposure {
    pub const ALL: [Exposure; 4] = [
        Exposure::Codemode,
        Exposure::Deferred,
        Exposure::Direct,
        Exposure::Hidden,
    ];

    pub fn parse(s: &str) -> Option<Exposure> {
        Exposure::ALL.into_iter().find(|e| e.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Exposure::Codemode => "codemode",
            Exposure::Deferred => "deferred",
            Exposure::Direct => "direct",
            Exposure::Hidden => "hidden",
        }
    }
}

/// The schemes a header value may put before its reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthScheme {
    Bearer,
    Basic,
    Token,
    Bot,
    ApiKey,
    Key,
    Splunk,
    Ssws,
    Digest,
}

impl AuthScheme {
    pub const ALL: [AuthScheme; 9] = [
        AuthScheme::Bearer,
        AuthScheme::Basic,
        AuthScheme::Token,
        AuthScheme::Bot,
        AuthScheme::ApiKey,
        AuthScheme::Key,
        AuthScheme::Splunk,
        AuthScheme::Ssws,
        AuthScheme::Digest,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AuthScheme::Bearer => "Bearer",
            AuthScheme::Basic => "Basic",
            AuthScheme::Token => "Token",
            AuthScheme::Bot => "Bot",
            AuthScheme::ApiKey => "ApiKey",
            AuthScheme::Key => "Key",
            AuthScheme::Splunk => "Splunk",
            AuthScheme::Ssws => "SSWS",
            AuthScheme::Digest => "Digest",
        }
    }
}

/// One header: a reference, optionally after a scheme and one space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub name: String,
    pub scheme: Option<AuthScheme>,
    pub value: Reference,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpServer {
    pub url: PlainUrl,
    pub headers: Vec<Header>,
}

/// A stdio server's command: a bare name, or an absolute path under one of [`COMMAND_ROOTS`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command(String);

impl Command {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_bare(&self) -> bool {
        !self.0.contains('/')
    }

    /// The command's file name: the last path segment.
    pub fn file_name(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or(&self.0)
    }

    /// The package runner this command is, by its file name.
    pub fn package_runner(&self) -> Option<&'static str> {
        let file = self.file_name();
        PACKAGE_RUNNERS.into_iter().find(|r| *r == file)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StdioServer {
    pub command: Command,
    pub args: Vec<Template>,
    pub env: Vec<(String, Reference)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    Http(HttpServer),
    Stdio(StdioServer),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    Http,
    Stdio,
}

impl TransportKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TransportKind::Http => "http",
            TransportKind::Stdio => "stdio",
        }
    }
}

/// A server entry that passed every rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpServer {
    pub name: ServerName,
    pub description: String,
    pub transport: Transport,
    pub exposure: Option<Exposure>,
    /// Per tool name or `*` pattern, in file order.
    pub tool_exposure: Vec<(String, Exposure)>,
    /// Seconds, 1..=600.
    pub timeout: Option<u16>,
    pub enabled: bool,
    pub allow_package_runner: bool,
}

impl McpServer {
    pub fn kind(&self) -> TransportKind {
        match self.transport {
            Transport::Http(_) => TransportKind::Http,
            Transport::Stdio(_) => TransportKind::Stdio,
        }
    }

    /// The package runner its command is, if it is a stdio server started by one.
    pub fn package_runner(&self) -> Option<&'static str> {
        match &self.transport {
            Transport::Stdio(s) => s.command.package_runner(),
            Transport::Http(_) => None,
        }
    }

    /// What is worth saying of this valid server without refusing it.
    pub fn warnings(&self) -> Vec<Warning> {
        let mut out = Vec::new();
        if let Transport::Http(h) = &self.transport
            && h.url.scheme() == url::Scheme::Http
            && !h.headers.is_empty()
        {
            out.push(plain_http_credentials(h));
        }
        out
    }

    /// Every variable the entry references, in its headers, url, arguments and env.
    pub fn references(&self) -> BTreeSet<&VarName> {
        let mut names = BTreeSet::new();
        match &self.transport {
            Transport::Http(h) => {
                names.extend(h.url.references().map(Reference::name));
                names.extend(h.headers.iter().map(|h| h.value.name()));
            }
            Transport::Stdio(s) => {
                names.extend(
                    s.args
                        .iter()
                        .flat_map(Template::references)
                        .map(Reference::name),
                );
                names.extend(s.env.iter().map(|(_, r)| r.name()));
            }
        }
        names
    }
}

/// A note on a valid server: it stays offered, and `mcp check` still exits 0. The message names
/// fields, hosts and header names, never a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// A stable code, as `mcp check --json` prints it.
    pub code: &'static str,
    /// Where in the entry, as for a [`Problem`].
    pub field: String,
    pub message: String,
    /// What to do about it.
    pub fix: String,
}

/// The code of [`plain_http_credentials`].
pub const WARNING_PLAIN_HTTP_CREDENTIALS: &str = "plain-http-credentials";

/// An `http://` server sent headers: every header value is a reference to a credential, and it
/// would travel unencrypted to the server's host and port, loopback included.
fn plain_http_credentials(h: &HttpServer) -> Warning {
    let names: Vec<&str> = h.headers.iter().map(|h| h.name.as_str()).collect();
    let (host, port) = (h.url.host(), h.url.port());
    let heard = if crate::egress::is_loopback(host) {
        format!(
            "to {host} port {port}, the loopback of the machine the job runs on, where any program listening on that port receives it"
        )
    } else {
        format!("across the network to {host} port {port}, readable on every hop")
    };
    Warning {
        code: WARNING_PLAIN_HTTP_CREDENTIALS,
        field: "url".to_owned(),
        message: format!(
            "the url is http://, so the credential in {} ({}) would be sent in plain text {heard}",
            if names.len() == 1 {
                "the header"
            } else {
                "each header"
            },
            names.join(", ")
        ),
        fix: "use the server's https:// url".to_owned(),
    }
}

/// One entry of `mcpServers`, valid or not.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerEntry {
    /// The key as written in the file.
    pub name: String,
    /// `enabled` as written when it is a boolean, else true.
    pub enabled: bool,
    /// The transport the entry asks for, when that much can be told.
    pub transport: Option<TransportKind>,
    pub verdict: Result<McpServer, Vec<Problem>>,
    /// The entry exactly as written, for the job's own mcp.json.
    pub raw: Json,
}

impl ServerEntry {
    /// Valid and turned on: a trigger may name it.
    pub fn offered(&self) -> Option<&McpServer> {
        self.verdict.as_ref().ok().filter(|s| s.enabled)
    }

    pub fn problems(&self) -> &[Problem] {
        match &self.verdict {
            Ok(_) => &[],
            Err(p) => p,
        }
    }
}

/// The overlay's `mcp.json`, read whole.
#[derive(Debug, Clone, PartialEq)]
pub struct Overlay {
    /// `codemodeModels`: whether codemode scripts may call `models.*` (default true).
    pub codemode_models: bool,
    pub servers: Vec<ServerEntry>,
}

impl Overlay {
    pub fn entry(&self, name: &str) -> Option<&ServerEntry> {
        self.servers.iter().find(|s| s.name == name)
    }

    /// The server a trigger may name as `name`, if the file offers it.
    pub fn offered(&self, name: &str) -> Option<&McpServer> {
        self.entry(name).and_then(ServerEntry::offered)
    }

    pub fn all_valid(&self) -> bool {
        self.servers.iter().all(|s| s.verdict.is_ok())
    }
}

/// Why the file as a whole cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OverlayError {
    #[error("mcp.json is larger than {} MiB", MAX_FILE_BYTES / (1024 * 1024))]
    TooLarge,
    #[error("mcp.json is not UTF-8 text")]
    NotUtf8,
    #[error("mcp.json is {0}")]
    Json(JsonError),
    #[error("mcp.json must be an object with an 'mcpServers' object")]
    NotAnObject,
    #[error("mcp.json has no 'mcpServers' object")]
    ServersMissing,
    #[error("mcp.json's 'mcpServers' must be an object, not {0}")]
    ServersNotObject(&'static str),
    #[error("mcp.json's 'codemodeModels' must be true or false")]
    CodemodeModelsInvalid,
    #[error("mcp.json has a top-level key pi-dispatch does not know{}", key_suffix(.0))]
    UnknownKey(Option<String>),
}

fn key_suffix(key: &Option<String>) -> String {
    key.as_ref().map(|k| format!(": '{k}'")).unwrap_or_default()
}

impl OverlayError {
    pub fn code(&self) -> &'static str {
        match self {
            OverlayError::TooLarge => "file-too-large",
            OverlayError::NotUtf8 => "not-utf8",
            OverlayError::Json(JsonError::DuplicateKey { .. }) => "duplicate-key",
            OverlayError::Json(JsonError::Syntax { .. }) => "not-json",
            OverlayError::NotAnObject
            | OverlayError::ServersMissing
            | OverlayError::ServersNotObject(_)
            | OverlayError::CodemodeModelsInvalid
            | OverlayError::UnknownKey(_) => "top-level-invalid",
        }
    }
}

/// Reads an overlay `mcp.json` from its bytes.
pub fn parse_overlay(bytes: &[u8]) -> Result<Overlay, OverlayError> {
    parse_overlay_judging(bytes, |_| true)
}

/// Reads the file whole and as strictly as [`parse_overlay`] (a duplicate key or a wrong shape
/// anywhere still refuses it), but judges only the entries named in `names`: what a job's pickup
/// needs, at a fraction of the cost for a large overlay. Entries not named are left out.
pub fn parse_overlay_named(bytes: &[u8], names: &[&str]) -> Result<Overlay, OverlayError> {
    parse_overlay_judging(bytes, |name| names.contains(&name))
}

fn parse_overlay_judging(
    bytes: &[u8],
    judge: impl Fn(&str) -> bool,
) -> Result<Overlay, OverlayError> {
    if bytes.len() > MAX_FILE_BYTES {
        return Err(OverlayError::TooLarge);
    }
    let text = std::str::from_utf8(bytes).map_err(|_| OverlayError::NotUtf8)?;
    let root = json::parse(text).map_err(OverlayError::Json)?;
    let Json::Object(root) = root else {
        return Err(OverlayError::NotAnObject);
    };
    let mut codemode_models = true;
    let mut servers = None;
    for (key, value) in root.iter() {
        match key {
            "mcpServers" => match value {
                Json::Object(o) => servers = Some(o),
                other => return Err(OverlayError::ServersNotObject(other.kind())),
            },
            "codemodeModels" => match value {
                Json::Bool(b) => codemode_models = *b,
                _ => return Err(OverlayError::CodemodeModelsInvalid),
            },
            other => {
                return Err(OverlayError::UnknownKey(
                    printable_key(other).map(str::to_owned),
                ));
            }
        }
    }
    let servers = servers.ok_or(OverlayError::ServersMissing)?;
    Ok(Overlay {
        codemode_models,
        servers: servers
            .iter()
            .filter(|(name, _)| judge(name))
            .map(|(name, value)| validate_entry(name, value))
            .collect(),
    })
}

/// Validates one `mcpServers` entry.
pub fn validate_entry(name: &str, value: &Json) -> ServerEntry {
    let Json::Object(entry) = value else {
        return ServerEntry {
            name: name.to_owned(),
            enabled: true,
            transport: None,
            verdict: Err(vec![Problem::new(
                Code::EntryNotObject,
                "",
                format!("a server entry must be an object, not {}", value.kind()),
            )]),
            raw: value.clone(),
        };
    };
    let mut v = Validator::default();
    let server_name = v.take(ServerName::parse(name));
    let transport_kind = v.transport_kind(entry);
    v.keys(entry, transport_kind);
    let description = v.description(entry.get("description"));
    let allow_package_runner =
        v.boolean(entry, "allowPackageRunner", Code::AllowPackageRunnerInvalid);
    // Each side an entry writes is checked, even when its transport is in doubt (an `sse` type, or
    // both `url` and `command`), so that every problem is reported at once.
    let writes = |keys: &[&str]| keys.iter().any(|k| entry.get(k).is_some());
    let http = (transport_kind != Some(TransportKind::Stdio) && writes(&HTTP_KEYS))
        .then(|| v.http(entry))
        .flatten();
    let stdio = (transport_kind != Some(TransportKind::Http) && writes(&STDIO_KEYS))
        .then(|| v.stdio(entry, allow_package_runner == Some(true)))
        .flatten();
    let transport = match transport_kind {
        Some(TransportKind::Http) => http.map(Transport::Http),
        Some(TransportKind::Stdio) => stdio.map(Transport::Stdio),
        None => None,
    };
    let exposure = entry.get("exposure").and_then(|e| v.exposure(e));
    let tool_exposure = entry
        .get("toolExposure")
        .map(|t| v.tool_exposure(t))
        .unwrap_or_default();
    let timeout = entry.get("timeout").and_then(|t| v.timeout(t));
    let enabled = v.boolean(entry, "enabled", Code::EnabledInvalid);
    let enabled_value = enabled.unwrap_or(true);
    let verdict = match (server_name, description, transport) {
        (Some(name), Some(description), Some(transport)) if v.problems.is_empty() => {
            Ok(McpServer {
                name,
                description,
                transport,
                exposure,
                tool_exposure,
                timeout,
                enabled: enabled_value,
                allow_package_runner: allow_package_runner.unwrap_or(false),
            })
        }
        _ => Err(v.problems),
    };
    ServerEntry {
        name: name.to_owned(),
        enabled: enabled_value,
        transport: transport_kind.or_else(|| written_kind(entry)),
        verdict,
        raw: value.clone(),
    }
}

/// The transport an entry's keys point at, whatever else is wrong with it: `url` is HTTP,
/// `command` is stdio; when they tell nothing (both or neither), a recognised `type` decides.
fn written_kind(entry: &Object) -> Option<TransportKind> {
    match (entry.get("url").is_some(), entry.get("command").is_some()) {
        (true, false) => Some(TransportKind::Http),
        (false, true) => Some(TransportKind::Stdio),
        _ => match entry.get("type").and_then(Json::as_str) {
            Some("http" | "streamable-http" | "sse") => Some(TransportKind::Http),
            Some("stdio") => Some(TransportKind::Stdio),
            _ => None,
        },
    }
}

const HTTP_KEYS: [&str; 2] = ["url", "headers"];
const STDIO_KEYS: [&str; 4] = ["command", "args", "env", "allowPackageRunner"];
const COMMON_KEYS: [&str; 6] = [
    "type",
    "description",
    "exposure",
    "toolExposure",
    "timeout",
    "enabled",
];

#[derive(Default)]
struct Validator {
    problems: Vec<Problem>,
}

impl Validator {
    fn problem(&mut self, code: Code, field: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem::new(code, field, message));
    }

    fn take<T>(&mut self, r: Result<T, Problem>) -> Option<T> {
        r.map_err(|p| self.problems.push(p)).ok()
    }

    /// Which transport the entry is, from `url`, `command` and `type`; problems when they disagree.
    fn transport_kind(&mut self, entry: &Object) -> Option<TransportKind> {
        let declared = match entry.get("type") {
            None => None,
            Some(t) => Some(self.declared_kind(t)?),
        };
        let written = match (entry.get("url").is_some(), entry.get("command").is_some()) {
            (true, true) => {
                self.problem(
                    Code::TransportConflict,
                    "url",
                    "an entry has either url (streamable HTTP) or command (stdio), not both",
                );
                return None;
            }
            (true, false) => Some(TransportKind::Http),
            (false, true) => Some(TransportKind::Stdio),
            (false, false) => None,
        };
        match (declared, written) {
            (Some(d), Some(w)) if d != w => {
                self.type_mismatch(d, w);
                None
            }
            (_, Some(w)) => Some(w),
            (declared, None) => {
                self.transport_missing(declared);
                None
            }
        }
    }

    /// The transport `type` names; `None` (its problem kept) when it names none this version runs.
    fn declared_kind(&mut self, value: &Json) -> Option<TransportKind> {
        match value.as_str() {
            Some("http" | "streamable-http") => Some(TransportKind::Http),
            Some("stdio") => Some(TransportKind::Stdio),
            Some("sse") => {
                self.problem(
                    Code::TypeSse,
                    "type",
                    "the legacy SSE transport is not supported; use the server's streamable HTTP URL",
                );
                None
            }
            _ => {
                self.problem(
                    Code::TypeInvalid,
                    "type",
                    "type must be http, streamable-http or stdio",
                );
                None
            }
        }
    }

    /// `type` says one transport and the entry's keys (`url` or `command`) the other.
    fn type_mismatch(&mut self, declared: TransportKind, written: TransportKind) {
        let has = match written {
            TransportKind::Http => "a url",
            TransportKind::Stdio => "a command",
        };
        self.problem(
            Code::TypeMismatch,
            "type",
            format!("type says {} but the entry has {has}", declared.as_str()),
        );
    }

    /// The entry has neither `url` nor `command`: the one its `type` needs, or either.
    fn transport_missing(&mut self, declared: Option<TransportKind>) {
        let (field, message) = match declared {
            Some(TransportKind::Http) => ("url", "a streamable HTTP server needs a url"),
            Some(TransportKind::Stdio) => ("command", "a stdio server needs a command"),
            None => (
                "",
                "an entry needs a url (streamable HTTP) or a command (stdio)",
            ),
        };
        self.problem(Code::TransportMissing, field, message);
    }

    /// Refuses every key that is not part of the entry's transport or common to both.
    fn keys(&mut self, entry: &Object, kind: Option<TransportKind>) {
        for key in entry.keys() {
            let field = printable_key(key).unwrap_or("").to_owned();
            match key {
                k if COMMON_KEYS.contains(&k) => {}
                "auth" | "oauth" => self.problem(
                    Code::KeyAuth,
                    field,
                    "a job cannot finish a sign-in and must not hold pi's mcp-auth.json; give the server a token in a header as a reference instead",
                ),
                "cwd" => self.problem(
                    Code::KeyCwd,
                    field,
                    "a job runs its servers in the checkout (/workspace); cwd cannot be set",
                ),
                k if HTTP_KEYS.contains(&k) => {
                    if kind == Some(TransportKind::Stdio) {
                        self.problem(Code::KeyOtherTransport, field, "a stdio server has no url or headers");
                    }
                }
                k if STDIO_KEYS.contains(&k) => {
                    if kind == Some(TransportKind::Http) {
                        self.problem(
                            Code::KeyOtherTransport,
                            field,
                            "a streamable HTTP server has no command, args, env or allowPackageRunner",
                        );
                    }
                }
                _ => {
                    let message = if printable_key(key).is_some() {
                        "a key pi-dispatch does not know; it is refused until pi-dispatch knows what it does in a job".to_owned()
                    } else {
                        "the entry has a key pi-dispatch does not know".to_owned()
                    };
                    self.problem(Code::KeyUnknown, field, message);
                }
            }
        }
    }

    fn description(&mut self, value: Option<&Json>) -> Option<String> {
        let text = match value {
            None => {
                self.problem(
                    Code::DescriptionMissing,
                    "description",
                    "a description is required: one line the agent reads about the server",
                );
                return None;
            }
            Some(Json::String(s)) => s,
            Some(other) => {
                self.problem(
                    Code::DescriptionInvalid,
                    "description",
                    format!("description must be a string, not {}", other.kind()),
                );
                return None;
            }
        };
        if text.trim().is_empty() {
            self.problem(
                Code::DescriptionMissing,
                "description",
                "description is empty",
            );
            return None;
        }
        let chars = text.chars().count();
        if chars > MAX_DESCRIPTION_CHARS {
            self.problem(
                Code::DescriptionInvalid,
                "description",
                format!("description is {chars} characters; at most {MAX_DESCRIPTION_CHARS}"),
            );
            return None;
        }
        if let Some(c) = text.chars().find(|c| forbidden_in_description(*c)) {
            self.problem(
                Code::DescriptionInvalid,
                "description",
                format!(
                    "description must be one line without control or invisible formatting characters (found U+{:04X})",
                    c as u32
                ),
            );
            return None;
        }
        Some(text.clone())
    }

    fn http(&mut self, entry: &Object) -> Option<HttpServer> {
        let url = match entry.get("url") {
            Some(Json::String(s)) => match url::parse(s) {
                Ok(u) => Some(u),
                Err(problems) => {
                    for p in problems {
                        self.problem(url_code(&p), "url", p.to_string());
                    }
                    None
                }
            },
            Some(other) => {
                self.problem(
                    Code::UrlInvalid,
                    "url",
                    format!("url must be a string, not {}", other.kind()),
                );
                None
            }
            None => None,
        };
        let headers = match entry.get("headers") {
            None => Some(Vec::new()),
            Some(Json::Object(h)) => self.headers(h),
            Some(other) => {
                self.problem(
                    Code::HeaderInvalid,
                    "headers",
                    format!(
                        "headers must be an object of header names to references, not {}",
                        other.kind()
                    ),
                );
                None
            }
        };
        Some(HttpServer {
            url: url?,
            headers: headers?,
        })
    }

    fn headers(&mut self, object: &Object) -> Option<Vec<Header>> {
        let before = self.problems.len();
        let mut headers: Vec<Header> = Vec::new();
        let mut seen = HashSet::new();
        for (name, value) in object.iter() {
            if !is_header_token(name) {
                self.problem(
                    Code::HeaderInvalid,
                    "headers",
                    "a header name is not a valid HTTP header name",
                );
                continue;
            }
            let field = keyed_field("headers", name);
            let lower = name.to_ascii_lowercase();
            if RESERVED_HEADERS.contains(&lower.as_str()) {
                self.problem(
                    Code::HeaderReserved,
                    field,
                    "this header is set by the job's MCP connection itself and cannot be given",
                );
                continue;
            }
            if !seen.insert(lower) {
                self.problem(
                    Code::HeaderInvalid,
                    field,
                    "this header is written twice (header names ignore case)",
                );
                continue;
            }
            let Json::String(text) = value else {
                self.problem(
                    Code::HeaderInvalid,
                    field,
                    format!("a header value must be a string, not {}", value.kind()),
                );
                continue;
            };
            match parse_header_value(text) {
                Some((scheme, value)) => headers.push(Header {
                    name: name.to_owned(),
                    scheme,
                    value,
                }),
                None => self.problem(Code::HeaderLiteral, field, header_literal_message(text)),
            }
        }
        (self.problems.len() == before).then_some(headers)
    }

    fn stdio(&mut self, entry: &Object, allow_package_runner: bool) -> Option<StdioServer> {
        let command = match entry.get("command") {
            Some(Json::String(s)) => {
                let command = self.take(parse_command(s));
                if let Some(runner) = command.as_ref().and_then(Command::package_runner)
                    && !allow_package_runner
                {
                    self.problem(
                        Code::PackageRunner,
                        "command",
                        format!(
                            "'{runner}' is a package runner: it downloads the server at every job start, at whatever version the registry serves; install the server in the image or the overlay, or add \"allowPackageRunner\": true"
                        ),
                    );
                }
                command
            }
            Some(other) => {
                self.problem(
                    Code::CommandInvalid,
                    "command",
                    format!("command must be a string, not {}", other.kind()),
                );
                None
            }
            None => None,
        };
        let args = match entry.get("args") {
            None => Some(Vec::new()),
            Some(Json::Array(items)) => self.args(items),
            Some(other) => {
                self.problem(
                    Code::ArgumentInvalid,
                    "args",
                    format!("args must be an array of strings, not {}", other.kind()),
                );
                None
            }
        };
        let env = match entry.get("env") {
            None => Some(Vec::new()),
            Some(Json::Object(e)) => self.env(e),
            Some(other) => {
                self.problem(
                    Code::EnvInvalid,
                    "env",
                    format!(
                        "env must be an object of variable names to references, not {}",
                        other.kind()
                    ),
                );
                None
            }
        };
        Some(StdioServer {
            command: command?,
            args: args?,
            env: env?,
        })
    }

    fn args(&mut self, items: &[Json]) -> Option<Vec<Template>> {
        let before = self.problems.len();
        let mut args = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let field = format!("args[{i}]");
            let Json::String(text) = item else {
                self.problem(
                    Code::ArgumentInvalid,
                    field,
                    format!("an argument must be a string, not {}", item.kind()),
                );
                continue;
            };
            if text.starts_with('~') {
                self.problem(
                    Code::ArgumentHome,
                    field,
                    "an argument may not start with '~': pi reads it as the job's home folder",
                );
                continue;
            }
            if text.contains('\0') {
                self.problem(
                    Code::ArgumentInvalid,
                    field,
                    "an argument may not hold a NUL character",
                );
                continue;
            }
            match Template::parse(text) {
                Ok(t) => args.push(t),
                Err(_) => self.problem(
                    Code::ReferenceMalformed,
                    field,
                    "an argument holds a '${' that is not a reference of the form ${NAME}",
                ),
            }
        }
        (self.problems.len() == before).then_some(args)
    }

    fn env(&mut self, object: &Object) -> Option<Vec<(String, Reference)>> {
        let before = self.problems.len();
        let mut env = Vec::new();
        for (name, value) in object.iter() {
            if !is_env_name(name) {
                self.problem(
                    Code::EnvInvalid,
                    "env",
                    "a variable name in env is not letters, digits and '_' (not starting with a digit)",
                );
                continue;
            }
            let field = keyed_field("env", name);
            if METER_VARIABLES.contains(&name) {
                self.problem(
                    Code::EnvReserved,
                    field,
                    "this variable belongs to the job's usage meter and cannot be replaced",
                );
                continue;
            }
            let Json::String(text) = value else {
                self.problem(
                    Code::EnvInvalid,
                    field,
                    format!("an env value must be a string, not {}", value.kind()),
                );
                continue;
            };
            match Reference::parse_whole(text) {
                Some(r) => env.push((name.to_owned(), r)),
                None => self.problem(Code::EnvLiteral, field, env_literal_message(text)),
            }
        }
        (self.problems.len() == before).then_some(env)
    }

    fn exposure(&mut self, value: &Json) -> Option<Exposure> {
        let e = value.as_str().and_then(Exposure::parse);
        if e.is_none() {
            self.problem(
                Code::ExposureInvalid,
                "exposure",
                "exposure must be codemode, deferred, direct or hidden",
            );
        }
        e
    }

    fn tool_exposure(&mut self, value: &Json) -> Vec<(String, Exposure)> {
        let Json::Object(o) = value else {
            self.problem(
                Code::ToolExposureInvalid,
                "toolExposure",
                format!(
                    "toolExposure must be an object of tool names or patterns to exposures, not {}",
                    value.kind()
                ),
            );
            return Vec::new();
        };
        let mut out = Vec::new();
        for (tool, e) in o.iter() {
            if !is_tool_pattern(tool) {
                self.problem(
                    Code::ToolExposureInvalid,
                    "toolExposure",
                    "a key of toolExposure is not a tool name or pattern (1 to 128 printable characters, no spaces)",
                );
                continue;
            }
            let field = keyed_field("toolExposure", tool);
            match e.as_str().and_then(Exposure::parse) {
                Some(e) => out.push((tool.to_owned(), e)),
                None => self.problem(
                    Code::ToolExposureInvalid,
                    field,
                    "an exposure must be codemode, deferred, direct or hidden",
                ),
            }
        }
        out
    }

    fn timeout(&mut self, value: &Json) -> Option<u16> {
        let t = match value {
            Json::Number(n) => n.as_u64().filter(|t| TIMEOUT_SECONDS.contains(t)),
            _ => None,
        };
        if t.is_none() {
            self.problem(
                Code::TimeoutInvalid,
                "timeout",
                "timeout must be a whole number of seconds from 1 to 600",
            );
        }
        t.and_then(|t| u16::try_from(t).ok())
    }

    fn boolean(&mut self, entry: &Object, key: &str, code: Code) -> Option<bool> {
        match entry.get(key)? {
            Json::Bool(b) => Some(*b),
            _ => {
                self.problem(code, key, format!("{key} must be true or false"));
                None
            }
        }
    }
}

/// `parent.key` when the key is plain enough to print (see [`printable_key`]), else `parent`.
fn keyed_field(parent: &str, key: &str) -> String {
    match printable_key(key) {
        Some(k) => format!("{parent}.{k}"),
        None => parent.to_owned(),
    }
}

fn url_code(p: &UrlProblem) -> Code {
    match p.code() {
        "url-scheme" => Code::UrlScheme,
        "url-not-plain" => Code::UrlNotPlain,
        "url-credentials" => Code::UrlCredentials,
        "url-fragment" => Code::UrlFragment,
        "url-host-reference" => Code::UrlHostReference,
        "url-query-literal" => Code::UrlQueryLiteral,
        "reference-malformed" => Code::ReferenceMalformed,
        _ => Code::UrlInvalid,
    }
}

/// Cc (control), Cf (invisible formatting), Zl and Zp (line and paragraph separators), and every
/// code point of Unicode's Default_Ignorable_Code_Point set (DerivedCoreProperties.txt): what a
/// renderer draws as nothing, such as variation selectors (U+FE00..U+FE0F, U+E0100..U+E01EF), the
/// Hangul fillers (U+115F, U+1160, U+3164, U+FFA0), the combining grapheme joiner and U+180B..U+180F.
fn forbidden_in_description(c: char) -> bool {
    const IGNORABLE: icu_properties::CodePointSetDataBorrowed<'static> =
        icu_properties::CodePointSetData::new::<icu_properties::props::DefaultIgnorableCodePoint>();
    matches!(
        get_general_category(c),
        GeneralCategory::Control
            | GeneralCategory::Format
            | GeneralCategory::LineSeparator
            | GeneralCategory::ParagraphSeparator
    ) || IGNORABLE.contains(c)
}

/// An HTTP token (RFC 9110): letters, digits and ``!#$%&'*+-.^_`|~``.
fn is_header_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn is_env_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn is_tool_pattern(s: &str) -> bool {
    let n = s.chars().count();
    (1..=128).contains(&n) && s.chars().all(|c| !c.is_whitespace() && !c.is_control())
}

/// `${NAME}`, or one of the schemes, exactly one space, then `${NAME}`.
fn parse_header_value(text: &str) -> Option<(Option<AuthScheme>, Reference)> {
    if let Some(r) = Reference::parse_whole(text) {
        return Some((None, r));
    }
    let (scheme, rest) = text.split_once(' ')?;
    let scheme = AuthScheme::ALL.into_iter().find(|s| s.as_str() == scheme)?;
    Reference::parse_whole(rest).map(|r| (Some(scheme), r))
}

fn schemes_list() -> String {
    AuthScheme::ALL.map(AuthScheme::as_str).join(", ")
}

/// What to say of a header or env value that is not a reference, without quoting it.
fn literal_hint(text: &str) -> &'static str {
    if text.starts_with('!') {
        " (a value starting with '!' is a command pi would run; a job never runs it: pass the value through a trigger variable)"
    } else if has_bare_dollar_name(text) {
        " (a bare $NAME is not filled in: write the name in braces)"
    } else {
        ""
    }
}

/// Whether `text` holds a `$` directly followed by a letter or `_` (a bare `$NAME`).
fn has_bare_dollar_name(text: &str) -> bool {
    text.as_bytes()
        .windows(2)
        .any(|w| w[0] == b'$' && (w[1].is_ascii_alphabetic() || w[1] == b'_'))
}

fn header_literal_message(text: &str) -> String {
    format!(
        "a header value is never written in the overlay: write ${{NAME}}, or a scheme ({}), one space and ${{NAME}}{}",
        schemes_list(),
        literal_hint(text)
    )
}

fn env_literal_message(text: &str) -> String {
    format!(
        "an env value is never written in the overlay: write exactly ${{NAME}}{}",
        literal_hint(text)
    )
}

/// A bare name, or an absolute path under one of [`COMMAND_ROOTS`] without `.`, `..` or empty
/// segments; never starting with `~` and never holding a reference.
pub fn parse_command(text: &str) -> Result<Command, Problem> {
    let field = "command";
    if text.is_empty() {
        return Err(Problem::new(
            Code::CommandInvalid,
            field,
            "command is empty",
        ));
    }
    if text.starts_with('~') {
        return Err(Problem::new(
            Code::CommandHome,
            field,
            "a command may not start with '~': pi reads it as the job's home folder; install the server in the image or the overlay",
        ));
    }
    if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Problem::new(
            Code::CommandInvalid,
            field,
            "command is one program without spaces; put its arguments in args",
        ));
    }
    if text.contains("${") || text.contains('$') {
        return Err(Problem::new(
            Code::CommandInvalid,
            field,
            "command may not hold a reference or '$'; references may stand in args",
        ));
    }
    if !text.contains('/') {
        return Ok(Command(text.to_owned()));
    }
    let roots = COMMAND_ROOTS.map(|r| format!("/{r}")).join(", ");
    let Some(rest) = text.strip_prefix('/') else {
        return Err(Problem::new(
            Code::CommandPath,
            field,
            format!(
                "command is a bare name on the image's PATH or an absolute path under {roots}; a relative path is not"
            ),
        ));
    };
    let segments: Vec<&str> = rest.split('/').collect();
    let well_formed = segments.len() >= 2
        && segments
            .iter()
            .all(|s| !s.is_empty() && *s != "." && *s != "..");
    if !well_formed || !COMMAND_ROOTS.contains(&segments[0]) {
        return Err(Problem::new(
            Code::CommandPath,
            field,
            format!(
                "command must be a bare name or an absolute path under {roots} (no '.', '..' or empty segments): any other folder is one the job can write"
            ),
        ));
    }
    Ok(Command(text.to_owned()))
}
