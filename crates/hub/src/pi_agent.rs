//! Starting real pi in the job: the private agent folder (pi's `mcp.json`, `settings.json`, the
//! runner's MCP extension, the overlay's `models.json` and `APPEND_SYSTEM.md`), pi's command line,
//! the `pi` a job's own commands find on `PATH` (always `--no-mcp`), and what pi's JSON event stream
//! says about usage.
//!
//! pi's built-in MCP extension is switched off and loaded again through the runner's extension
//! (`pi_guard.js`), which hides servers other extensions register, drops `/mcp`, and ends the job
//! when another extension takes a name only the job's MCP may own. The repository's own `.pi`
//! (its `mcp.json`, extensions, settings) is never loaded: pi runs with `--no-approve`.

use std::path::{Path, PathBuf};

use protocol::exit_line::MAX_FINAL_MESSAGE;
use protocol::reason::Reason;
use protocol::usage::Usage;
use serde::Deserialize;

/// Where pi is and what it runs.
#[derive(Debug, Clone)]
pub struct PiOptions {
    /// The Node.js binary.
    pub node: PathBuf,
    /// pi's package folder (`@earendil-works/pi-coding-agent`), holding `dist/cli.js`.
    pub package: PathBuf,
    /// The job's prompt (`/job/prompt.md`), given to pi on its standard input.
    pub prompt: PathBuf,
    /// `provider/model`, when the job names one.
    pub model: Option<String>,
    /// The overlay (`/opt/pi-global`): its `models.json`, `APPEND_SYSTEM.md`, `skills/` and
    /// `extensions/` are pi's.
    pub overlay: Option<PathBuf>,
}

/// The runner's extension file, before its constants are filled in.
const GUARD_TEMPLATE: &str = include_str!("pi_guard.js");

/// The exit code the extension ends pi with when a name is shadowed.
pub const SHADOWED_EXIT: i32 = 70;

/// The files the runner writes for pi, under the private agent folder.
pub struct AgentFolder {
    pub dir: PathBuf,
}

impl AgentFolder {
    pub fn guard(&self) -> PathBuf {
        self.dir.join("pi-dispatch").join("mcp.js")
    }

    pub fn report(&self) -> PathBuf {
        self.dir.join("pi-dispatch").join("report.json")
    }

    /// Where the `pi` shim is: first on the `PATH` pi's tools see.
    pub fn bin(&self) -> PathBuf {
        self.dir.join("pi-dispatch").join("bin")
    }
}

fn js_string(path: &Path) -> String {
    serde_json::Value::String(path.to_string_lossy().into_owned()).to_string()
}

/// The extension's text for this job.
pub fn guard_js(folder: &AgentFolder, package: &Path, codemode_models: bool) -> String {
    let module = |rel: &str| js_string(&package.join(rel));
    GUARD_TEMPLATE
        .replace("__MCP_MODULE__", &module("dist/extensions/mcp/index.js"))
        .replace(
            "__CODEMODE_MODULE__",
            &module("dist/extensions/codemode/index.js"),
        )
        .replace("__SELF_PATH__", &js_string(&folder.guard()))
        .replace("__REPORT_PATH__", &js_string(&folder.report()))
        .replace(
            "__CODEMODE_MODELS__",
            if codemode_models { "true" } else { "false" },
        )
}

/// pi's `settings.json`: the built-in MCP (and, with codemode's models off, the built-in codemode)
/// replaced by the runner's extension; the overlay's extensions and skills added.
pub fn settings_json(
    folder: &AgentFolder,
    overlay: Option<&Path>,
    codemode_models: bool,
) -> String {
    let mut extensions = vec!["-builtin:mcp".to_owned()];
    if !codemode_models {
        extensions.push("-builtin:codemode".to_owned());
    }
    extensions.push(folder.guard().to_string_lossy().into_owned());
    let mut skills = Vec::new();
    if let Some(overlay) = overlay {
        let ext = overlay.join("extensions");
        if ext.is_dir() {
            extensions.push(ext.to_string_lossy().into_owned());
        }
        let sk = overlay.join("skills");
        if sk.is_dir() {
            skills.push(sk.to_string_lossy().into_owned());
        }
    }
    let settings = serde_json::json!({
        "extensions": extensions,
        "skills": skills,
    });
    format!("{settings:#}\n")
}

/// The `pi` a job's own commands start: the same pi, always without MCP.
pub fn shim(node: &Path, package: &Path) -> String {
    let quote = |p: &Path| format!("'{}'", p.to_string_lossy().replace('\'', r"'\''"));
    format!(
        "#!/bin/sh\n# pi inside a pi-dispatch job: MCP is the job's, so a pi started here gets --no-mcp.\nexec {} {} --no-mcp \"$@\"\n",
        quote(node),
        quote(&package.join("dist/cli.js"))
    )
}

/// Writes everything pi needs into the private agent folder (pi's `mcp.json` is written by the
/// caller, which knows the hub's endpoints).
pub fn prepare(folder: &AgentFolder, pi: &PiOptions, codemode_models: bool) -> std::io::Result<()> {
    let own = folder.dir.join("pi-dispatch");
    write_private(
        &own,
        "mcp.js",
        guard_js(folder, &pi.package, codemode_models).as_bytes(),
    )?;
    let _ = std::fs::remove_file(folder.report());
    write_private(
        &folder.dir,
        "settings.json",
        settings_json(folder, pi.overlay.as_deref(), codemode_models).as_bytes(),
    )?;
    for name in ["models.json", "APPEND_SYSTEM.md"] {
        if let Some(overlay) = &pi.overlay {
            match std::fs::read(overlay.join(name)) {
                Ok(bytes) => write_private(&folder.dir, name, &bytes)?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    write_private(&folder.bin(), "pi", shim(&pi.node, &pi.package).as_bytes())?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(
        folder.bin().join("pi"),
        std::fs::Permissions::from_mode(0o700),
    )?;
    Ok(())
}

/// pi's arguments (after the Node binary).
pub fn args(pi: &PiOptions) -> Vec<String> {
    let mut args = vec![
        pi.package
            .join("dist/cli.js")
            .to_string_lossy()
            .into_owned(),
        "--mode".to_owned(),
        "json".to_owned(),
        "--no-session".to_owned(),
        "--no-approve".to_owned(),
    ];
    if let Some(model) = &pi.model {
        args.push("--model".to_owned());
        args.push(model.clone());
    }
    args
}

/// What the extension reported before ending pi.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct GuardReport {
    pub reason: String,
    pub name: String,
}

/// Reads the extension's report, if it wrote one.
pub fn read_report(folder: &AgentFolder) -> Option<GuardReport> {
    let bytes = std::fs::read(folder.report()).ok()?;
    let report: GuardReport = serde_json::from_slice(&bytes).ok()?;
    // The name goes into the cause on the exit line: only a tool name's characters pass.
    let plain = report.name.len() <= 64
        && report
            .name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'/');
    (report.reason == "mcp-shadowed" && plain).then_some(report)
}

/// What pi's JSON event stream (`--mode json`) says: what it spent, how its last answer ended,
/// and that answer's text. Only what is needed is kept; the provider's own error text is read to
/// tell the failures apart and never kept.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PiEvents {
    pub usage: Usage,
    /// Assistant messages seen, failed ones included.
    answers: u64,
    /// How the last assistant message ended.
    last: Option<Ending>,
    /// The text of the last assistant message (at most [`MAX_FINAL_MESSAGE`] bytes).
    last_text: String,
}

/// How an assistant message ended, as pi's `stopReason` says, with a failure sorted.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ending {
    /// `stop`: the model finished its answer.
    Stop,
    /// `toolUse`: the model asked for a tool.
    ToolUse,
    Length,
    Aborted,
    Error(ModelFailure),
    Other,
}

/// A model call that ended in an error, sorted by what the provider's error says.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ModelFailure {
    /// No connection (refused, reset, no such host, timed out).
    Unreachable(&'static str),
    /// An HTTP status from the provider.
    Status(u16),
    /// Anything else.
    Other,
}

/// The connection failures Node's fetch reports, by the name a cause may carry.
const CONNECTION_ERRORS: [&str; 8] = [
    "ECONNREFUSED",
    "ECONNRESET",
    "ENOTFOUND",
    "EAI_AGAIN",
    "ETIMEDOUT",
    "EHOSTUNREACH",
    "ENETUNREACH",
    "UND_ERR_CONNECT_TIMEOUT",
];

fn sort_failure(message: &str) -> ModelFailure {
    // pi-ai writes an HTTP failure as "STATUS: body".
    let digits: String = message.chars().take_while(char::is_ascii_digit).collect();
    if digits.len() == 3
        && message[3..].starts_with(':')
        && let Ok(status) = digits.parse()
    {
        return ModelFailure::Status(status);
    }
    if let Some(code) = CONNECTION_ERRORS.iter().find(|c| message.contains(*c)) {
        return ModelFailure::Unreachable(code);
    }
    if message.starts_with("Connection error") || message.contains("fetch failed") {
        return ModelFailure::Unreachable("connection error");
    }
    ModelFailure::Other
}

impl PiEvents {
    /// Takes one line of pi's `--mode json` output into account (anything else is ignored).
    pub fn observe(&mut self, line: &str) {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
            return;
        };
        if event.get("type").and_then(|t| t.as_str()) != Some("message_end") {
            return;
        }
        let Some(message) = event.get("message") else {
            return;
        };
        if message.get("role").and_then(|r| r.as_str()) != Some("assistant") {
            return;
        }
        self.answers += 1;
        let ending = match message.get("stopReason").and_then(|r| r.as_str()) {
            Some("stop") => Ending::Stop,
            Some("toolUse") => Ending::ToolUse,
            Some("length") => Ending::Length,
            Some("aborted") => Ending::Aborted,
            Some("error") => Ending::Error(sort_failure(
                message
                    .get("errorMessage")
                    .and_then(|m| m.as_str())
                    .unwrap_or_default(),
            )),
            _ => Ending::Other,
        };
        if !matches!(ending, Ending::Error(_) | Ending::Aborted) {
            self.usage.turns += 1;
        }
        self.last = Some(ending);
        self.last_text = answer_text(message);
        let number = |v: Option<&serde_json::Value>| v.and_then(|n| n.as_u64()).unwrap_or(0);
        if let Some(usage) = message.get("usage") {
            self.usage.input_tokens += number(usage.get("input"));
            self.usage.output_tokens += number(usage.get("output"));
            self.usage.total_tokens += number(usage.get("totalTokens"));
            self.usage.cost_usd += usage
                .get("cost")
                .and_then(|c| c.get("total"))
                .and_then(|t| t.as_f64())
                .unwrap_or(0.0);
        }
        // Names of a provider and a model are short words; anything else is not copied.
        let word = |v: Option<&serde_json::Value>| {
            v.and_then(|s| s.as_str())
                .filter(|s| {
                    s.len() <= 128
                        && s.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"-_./:@".contains(&b))
                })
                .map(str::to_owned)
        };
        if let Some(p) = word(message.get("provider")) {
            self.usage.provider = Some(p);
        }
        if let Some(m) = word(message.get("model")) {
            self.usage.model = Some(m);
        }
    }

    /// Whether the agent finished its task: pi exited well and its last answer ended normally.
    /// Otherwise the reason and a cause for the log (fixed words, a status code or an error's
    /// name; never the provider's text).
    pub fn verdict(&self, exited_ok: bool) -> Result<(), (Reason, String)> {
        let failed = |reason, cause: &str| Err((reason, cause.to_owned()));
        match &self.last {
            None if exited_ok => failed(
                Reason::AgentNoTurn,
                "pi ended without any answer from its model",
            ),
            None => failed(
                Reason::AgentFailed,
                "pi exited with a failure before any answer",
            ),
            Some(Ending::Stop) if exited_ok => Ok(()),
            Some(Ending::Stop) => failed(
                Reason::AgentFailed,
                "pi exited with a failure after its model's last answer",
            ),
            Some(Ending::Error(failure)) => Err(match failure {
                ModelFailure::Unreachable(code) => (
                    Reason::ModelUnreachable,
                    format!("the model provider could not be reached ({code}), after pi's retries"),
                ),
                ModelFailure::Status(status @ (401 | 403)) => (
                    Reason::ModelUnauthorized,
                    format!("the model provider answered HTTP {status}"),
                ),
                ModelFailure::Status(429) => (
                    Reason::ModelRateLimited,
                    "the model provider answered HTTP 429, after pi's retries".to_owned(),
                ),
                ModelFailure::Status(status) => (
                    Reason::ModelError,
                    format!("the model provider answered HTTP {status}"),
                ),
                ModelFailure::Other => (
                    Reason::ModelError,
                    "the model's answer ended with an error".to_owned(),
                ),
            }),
            Some(Ending::Aborted) => failed(Reason::AgentAborted, "the model's answer was aborted"),
            Some(Ending::Length) => failed(
                Reason::ModelLengthLimit,
                "the model's last answer stopped at its length limit",
            ),
            Some(Ending::ToolUse | Ending::Other) => failed(
                Reason::AgentFailed,
                "pi ended while its model's last answer asked for more",
            ),
        }
    }

    /// The text of the agent's last answer, when it gave one.
    pub fn final_message(&self) -> Option<String> {
        (self.answers > 0 && !self.last_text.is_empty()).then(|| self.last_text.clone())
    }
}

/// The text parts of an assistant message, joined, at most [`MAX_FINAL_MESSAGE`] bytes.
fn answer_text(message: &serde_json::Value) -> String {
    let mut text = String::new();
    for part in message
        .get("content")
        .and_then(|c| c.as_array())
        .into_iter()
        .flatten()
    {
        if part.get("type").and_then(|t| t.as_str()) == Some("text")
            && let Some(t) = part.get("text").and_then(|t| t.as_str())
        {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(t);
        }
    }
    if text.len() > MAX_FINAL_MESSAGE {
        let mut end = MAX_FINAL_MESSAGE;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// Writes a file only the job's user can read, in a folder made for it.
pub(crate) fn write_private(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(dir.join(name))?;
    f.write_all(bytes)?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder() -> AgentFolder {
        AgentFolder {
            dir: PathBuf::from("/home/job/.pi-dispatch/agent"),
        }
    }

    #[test]
    fn the_extension_has_every_constant_filled_in() {
        let js = guard_js(&folder(), Path::new("/opt/pi"), false);
        for placeholder in [
            "__MCP_MODULE__",
            "__CODEMODE_MODULE__",
            "__SELF_PATH__",
            "__REPORT_PATH__",
            "__CODEMODE_MODELS__",
        ] {
            assert!(
                GUARD_TEMPLATE.contains(placeholder) && !js.contains(placeholder),
                "{placeholder}"
            );
        }
        assert!(js.contains(r#"from "/opt/pi/dist/extensions/mcp/index.js""#));
        assert!(js.contains(r#"const SELF = "/home/job/.pi-dispatch/agent/pi-dispatch/mcp.js""#));
        assert!(js.contains("const CODEMODE_MODELS = false;"));
        assert!(
            guard_js(&folder(), Path::new("/opt/pi"), true)
                .contains("const CODEMODE_MODELS = true;")
        );
    }

    #[test]
    fn settings_replace_the_builtin_mcp_and_codemode_only_when_models_are_off() {
        let on: serde_json::Value =
            serde_json::from_str(&settings_json(&folder(), None, true)).unwrap();
        assert_eq!(
            on["extensions"],
            serde_json::json!([
                "-builtin:mcp",
                "/home/job/.pi-dispatch/agent/pi-dispatch/mcp.js"
            ])
        );
        let off: serde_json::Value =
            serde_json::from_str(&settings_json(&folder(), None, false)).unwrap();
        assert_eq!(off["extensions"][1], "-builtin:codemode");
    }

    #[test]
    fn the_shim_always_adds_no_mcp() {
        let text = shim(Path::new("/opt/node/bin/node"), Path::new("/opt/it's pi"));
        assert!(
            text.ends_with(
                "exec '/opt/node/bin/node' '/opt/it'\\''s pi/dist/cli.js' --no-mcp \"$@\"\n"
            ),
            "{text}"
        );
    }

    fn answer(stop: &str, extra: &str) -> String {
        format!(
            r#"{{"type":"message_end","message":{{"role":"assistant","provider":"fake","model":"fake-model","content":[{{"type":"text","text":"Done, all of it."}}],"usage":{{"input":10,"output":5,"totalTokens":15,"cost":{{"total":0.25}}}},"stopReason":"{stop}"{extra}}}}}"#
        )
    }

    fn events(lines: &[String]) -> PiEvents {
        let mut e = PiEvents::default();
        for l in lines {
            e.observe(l);
        }
        e
    }

    #[test]
    fn usage_adds_up_assistant_messages_and_counts_real_answers() {
        let e = events(&[
            r#"{"type":"turn_start"}"#.to_owned(),
            answer("toolUse", ""),
            r#"{"type":"message_end","message":{"role":"toolResult","usage":{"input":99}}}"#
                .to_owned(),
            r#"{"type":"turn_end","message":{}}"#.to_owned(),
            answer("stop", ""),
            r#"{"type":"turn_end","message":{}}"#.to_owned(),
            "not json".to_owned(),
        ]);
        assert_eq!(
            e.usage,
            Usage {
                turns: 2,
                input_tokens: 20,
                output_tokens: 10,
                total_tokens: 30,
                cost_usd: 0.5,
                provider: Some("fake".into()),
                model: Some("fake-model".into()),
            }
        );
        assert_eq!(e.verdict(true), Ok(()));
        assert_eq!(e.final_message().as_deref(), Some("Done, all of it."));
        let mut e = e;
        e.observe(r#"{"type":"message_end","message":{"role":"assistant","model":"a model with spaces","stopReason":"stop"}}"#);
        assert_eq!(e.usage.model.as_deref(), Some("fake-model"));
    }

    #[test]
    fn only_a_normal_last_answer_is_a_finished_task() {
        let failure = |msg: &str| {
            events(&[answer(
                "error",
                &format!(r#","errorMessage":{}"#, serde_json::json!(msg)),
            )])
            .verdict(true)
            .unwrap_err()
            .0
        };
        assert_eq!(
            failure("Connection error.: connect ECONNREFUSED 127.0.0.1:9"),
            Reason::ModelUnreachable
        );
        assert_eq!(failure("fetch failed"), Reason::ModelUnreachable);
        assert_eq!(failure("500: {\"error\":\"x\"}"), Reason::ModelError);
        assert_eq!(failure("401: {\"error\":\"x\"}"), Reason::ModelUnauthorized);
        assert_eq!(failure("403: nope"), Reason::ModelUnauthorized);
        assert_eq!(failure("429: slow down"), Reason::ModelRateLimited);
        assert_eq!(failure("something odd"), Reason::ModelError);
        let verdict = |lines: &[String], ok| events(lines).verdict(ok).map_err(|e| e.0);
        assert_eq!(verdict(&[], true), Err(Reason::AgentNoTurn));
        assert_eq!(verdict(&[], false), Err(Reason::AgentFailed));
        assert_eq!(
            verdict(&[answer("aborted", "")], true),
            Err(Reason::AgentAborted)
        );
        assert_eq!(
            verdict(&[answer("length", "")], true),
            Err(Reason::ModelLengthLimit)
        );
        assert_eq!(
            verdict(&[answer("toolUse", "")], true),
            Err(Reason::AgentFailed)
        );
        assert_eq!(
            verdict(&[answer("stop", "")], false),
            Err(Reason::AgentFailed)
        );
        // An answer after a failed one decides: pi's own retry succeeded.
        assert_eq!(
            verdict(
                &[
                    answer("error", r#","errorMessage":"500: x""#),
                    answer("stop", "")
                ],
                true
            ),
            Ok(())
        );
        // A failed answer is no turn, and its cause never quotes the provider.
        let e = events(&[answer("error", r#","errorMessage":"500: secret-ish body""#)]);
        assert_eq!(e.usage.turns, 0);
        assert!(!e.verdict(true).unwrap_err().1.contains("secret"));
    }

    #[test]
    fn the_final_message_is_cut_on_a_character() {
        let long = "é".repeat(MAX_FINAL_MESSAGE);
        let line = serde_json::json!({"type": "message_end", "message": {"role": "assistant", "stopReason": "stop", "content": [{"type": "text", "text": long}]}}).to_string();
        let text = events(&[line]).final_message().unwrap();
        assert!(text.len() <= MAX_FINAL_MESSAGE && text.len() > MAX_FINAL_MESSAGE - 2);
    }
}
