//! What pi's JSON event stream (`pi --mode json`, one event a line) says of a job: what the model
//! spent, how its last answer ended, and that answer's text. It is pi's claim, which anything
//! inside pi can write: the runner holds it against what its model gateway saw
//! ([`crate::model_answer::verdict`]), so it can make a job fail but never complete on its own. The
//! worker reads the same lines (the runner passes them on) for what a job spent when no exit line
//! came, and for its activity.

#[cfg(test)]
use crate::exit_line::MAX_FINAL_MESSAGE;
use crate::exit_line::push_bounded;
use crate::reason::Reason;
use crate::usage::Usage;

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
    /// The text of the last assistant message (at most [`crate::exit_line::MAX_FINAL_MESSAGE`] bytes).
    last_text: String,
    /// Whether `last_text` was cut.
    last_cut: bool,
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

/// One of pi's events that pi-dispatch reads, parsed once from its line: the start of a turn or
/// of a tool call, and the end of an assistant message (its usage, its ending, its text). Every
/// other event is `None`.
#[derive(Debug, Clone, PartialEq)]
pub enum PiEvent {
    TurnStart,
    /// A tool call begins, with the tool's name (at most [`MAX_TOOL_NAME`] characters).
    ToolStart {
        tool: Option<String>,
    },
    /// An assistant message ended: the message as pi wrote it.
    Answer(serde_json::Value),
}

/// The longest tool name an event keeps.
pub const MAX_TOOL_NAME: usize = 128;

/// The event types [`PiEvent`] reads. A line that names none of them is not parsed.
const READ_TYPES: [&str; 3] = [
    "\"turn_start\"",
    "\"tool_execution_start\"",
    "\"message_end\"",
];

impl PiEvent {
    /// The event of one line of pi's `--mode json` output, when it is one pi-dispatch reads.
    pub fn parse(line: &str) -> Option<PiEvent> {
        if !READ_TYPES.iter().any(|t| line.contains(t)) {
            return None;
        }
        let mut event = serde_json::from_str::<serde_json::Value>(line).ok()?;
        match event.get("type")?.as_str()? {
            "turn_start" => Some(PiEvent::TurnStart),
            "tool_execution_start" => Some(PiEvent::ToolStart {
                tool: event
                    .get("toolName")
                    .and_then(serde_json::Value::as_str)
                    .map(|n| n.chars().take(MAX_TOOL_NAME).collect()),
            }),
            "message_end" => {
                let message = event.get_mut("message")?.take();
                (message.get("role").and_then(|r| r.as_str()) == Some("assistant"))
                    .then_some(PiEvent::Answer(message))
            }
            _ => None,
        }
    }
}

/// The value of the first (or, with `last`, the last) `"key":"VALUE"` in `text`, when short and
/// plain.
fn string_of<'a>(text: &'a str, key: &str, last: bool) -> Option<&'a str> {
    let needle = format!("\"{key}\":\"");
    let at = if last {
        text.rfind(&needle)
    } else {
        text.find(&needle)
    }? + needle.len();
    let value = &text[at..];
    let value = &value[..value.find('"')?];
    (value.len() <= 64
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'))
    .then_some(value)
}

impl PiEvents {
    /// One of pi's lines too long to hold (an answer of over a mebibyte, streamed in deltas): what
    /// its first bytes (`head`) and last bytes (`tail`) still tell. An assistant's `message_end`
    /// counts as the answer it is (how it ended and what it used, from the end of the line), its
    /// text cut: the gateway's text of the same answer is the job's final message. The event's
    /// type, when it has a plain one.
    pub fn observe_overlong(&mut self, head: &[u8], tail: &[u8]) -> Option<String> {
        let start = String::from_utf8_lossy(&head[..head.len().min(512)]);
        let kind = string_of(&start, "type", false)?.to_owned();
        if kind == "message_end" && string_of(&start, "role", false) == Some("assistant") {
            let end = String::from_utf8_lossy(tail);
            let mut message = serde_json::json!({"role": "assistant", "content": []});
            if let Some(stop) = string_of(&end, "stopReason", true) {
                message["stopReason"] = stop.into();
            }
            if let Some(at) = end.rfind("\"usage\":") {
                let rest = &end.as_bytes()[at + "\"usage\":".len()..];
                if let Some(Ok(usage)) = serde_json::Deserializer::from_slice(rest)
                    .into_iter::<serde_json::Value>()
                    .next()
                {
                    message["usage"] = usage;
                }
            }
            self.observe_event(&PiEvent::Answer(message));
            self.last_cut = true;
        }
        Some(kind)
    }

    /// Takes one line of pi's `--mode json` output into account (anything else is ignored).
    pub fn observe(&mut self, line: &str) {
        if let Some(event) = PiEvent::parse(line) {
            self.observe_event(&event);
        }
    }

    /// Takes one of pi's events into account: only an assistant's answer counts.
    pub fn observe_event(&mut self, event: &PiEvent) {
        let PiEvent::Answer(message) = event else {
            return;
        };
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
        (self.last_text, self.last_cut) = answer_text(message);
        let number = |v: Option<&serde_json::Value>| v.and_then(|n| n.as_u64()).unwrap_or(0);
        if let Some(usage) = message.get("usage") {
            // pi's numbers are its claim: a count past u64 stays at its most, never wraps.
            let u = &mut self.usage;
            u.input_tokens = u.input_tokens.saturating_add(number(usage.get("input")));
            u.output_tokens = u.output_tokens.saturating_add(number(usage.get("output")));
            u.total_tokens = u
                .total_tokens
                .saturating_add(number(usage.get("totalTokens")));
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

    /// What pi claims: that the agent finished its task (pi exited well and its last answer ended
    /// normally).
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

    /// Assistant messages seen, failed ones included.
    pub fn answers(&self) -> u64 {
        self.answers
    }

    /// The text of the agent's last answer, when it gave one.
    pub fn final_message(&self) -> Option<String> {
        (self.answers > 0 && !self.last_text.is_empty()).then(|| self.last_text.clone())
    }

    /// The text pi claims for its last answer, and whether it was cut.
    pub fn final_text(&self) -> (&str, bool) {
        (&self.last_text, self.last_cut)
    }
}

/// The text parts of an assistant message, joined, at most [`crate::exit_line::MAX_FINAL_MESSAGE`] bytes, and
/// whether it was cut.
fn answer_text(message: &serde_json::Value) -> (String, bool) {
    let mut text = String::new();
    let mut cut = false;
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
                push_bounded(&mut text, &mut cut, "\n");
            }
            push_bounded(&mut text, &mut cut, t);
        }
    }
    (text, cut)
}

/// One line of pi's `--mode json` output read whole, as a person reads a transcript (the panel):
/// every event by what it is, a message of any role with its parts. [`PiEvent`] is the few events
/// the runner and the worker act on, read from the same lines.
#[derive(Debug, Clone, PartialEq)]
pub enum PiLine {
    /// Text that is no JSON.
    NotJson,
    /// A streaming update (`message_start`, `message_update`, `tool_execution_update`): the event
    /// that ends it holds the same.
    Delta,
    AgentStart,
    AgentEnd,
    TurnStart,
    TurnEnd,
    /// A message ended (`message_end`), of any role.
    Message(PiMessage),
    /// A tool call begins: the tool's name and its arguments as pi wrote them.
    ToolStart {
        tool: Option<String>,
        args: Option<serde_json::Value>,
    },
    /// A tool call ended: the parts of its result, and whether it failed.
    ToolEnd {
        tool: Option<String>,
        failed: bool,
        result: Vec<PiPart>,
    },
    /// Any other JSON: an event by its type, or `None` when it names none.
    Other(Option<String>),
}

/// A message as pi writes it: who wrote it, its parts, and how it ended (`stopReason`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PiMessage {
    pub role: Option<String>,
    pub content: Vec<PiPart>,
    pub stop_reason: Option<String>,
}

/// One part of a message's content (a content written as a string is one text part; a part that
/// names no type is left out).
#[derive(Debug, Clone, PartialEq)]
pub enum PiPart {
    Text(String),
    Thinking(String),
    /// The model asks for a tool: its name and arguments as pi wrote them.
    ToolCall {
        name: Option<String>,
        arguments: Option<serde_json::Value>,
    },
    /// Another kind of part (an image, ...), by its type.
    Other(String),
}

impl PiLine {
    /// The event of one line of pi's `--mode json` output, whatever it is.
    pub fn parse(line: &str) -> PiLine {
        let Ok(mut event) = serde_json::from_str::<serde_json::Value>(line) else {
            return PiLine::NotJson;
        };
        let tool = event
            .get("toolName")
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned);
        match event.get("type").and_then(serde_json::Value::as_str) {
            Some("message_start" | "message_update" | "tool_execution_update") => PiLine::Delta,
            Some("agent_start") => PiLine::AgentStart,
            Some("agent_end") => PiLine::AgentEnd,
            Some("turn_start") => PiLine::TurnStart,
            Some("turn_end") => PiLine::TurnEnd,
            Some("message_end") => PiLine::Message(PiMessage::of(event.get("message"))),
            Some("tool_execution_start") => PiLine::ToolStart {
                tool,
                args: event.get_mut("args").map(serde_json::Value::take),
            },
            Some("tool_execution_end") => PiLine::ToolEnd {
                tool,
                failed: event.get("isError").and_then(serde_json::Value::as_bool) == Some(true),
                result: PiPart::all_of(event.get("result").and_then(|r| r.get("content"))),
            },
            other => PiLine::Other(other.map(str::to_owned)),
        }
    }
}

impl PiMessage {
    /// The message pi wrote as `message` (an empty one when there is none).
    fn of(message: Option<&serde_json::Value>) -> PiMessage {
        let Some(message) = message else {
            return PiMessage::default();
        };
        let text_of = |key: &str| {
            message
                .get(key)
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned)
        };
        PiMessage {
            role: text_of("role"),
            content: PiPart::all_of(message.get("content")),
            stop_reason: text_of("stopReason"),
        }
    }
}

impl PiPart {
    /// The parts of a content: a string, or a list of parts.
    fn all_of(content: Option<&serde_json::Value>) -> Vec<PiPart> {
        match content {
            Some(serde_json::Value::String(text)) => vec![PiPart::Text(text.clone())],
            Some(serde_json::Value::Array(parts)) => parts.iter().filter_map(PiPart::of).collect(),
            _ => Vec::new(),
        }
    }

    fn of(part: &serde_json::Value) -> Option<PiPart> {
        let text_of = |key: &str| {
            part.get(key)
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        Some(match part.get("type")?.as_str()? {
            "text" => PiPart::Text(text_of("text")),
            "thinking" => PiPart::Thinking(text_of("thinking")),
            "toolCall" => PiPart::ToolCall {
                name: part
                    .get("name")
                    .and_then(serde_json::Value::as_str)
                    .map(str::to_owned),
                arguments: part.get("arguments").cloned(),
            },
            other => PiPart::Other(other.to_owned()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the `pi_event` fuzz target: two answers whose counts add past u64 (an overflow
    /// in a checked build, a count wrapped to almost nothing otherwise) stay at the most.
    #[test]
    fn counts_pi_claims_past_u64_stay_at_the_most() {
        let line = r#"{"type":"message_end","message":{"role":"assistant","stopReason":"stop","usage":{"input":18446744073709551615,"output":1,"totalTokens":18446744073709551615}}}"#;
        let mut events = PiEvents::default();
        events.observe(line);
        events.observe(line);
        assert_eq!(events.usage.input_tokens, u64::MAX);
        assert_eq!(events.usage.total_tokens, u64::MAX);
        assert_eq!(events.usage.output_tokens, 2);
        assert_eq!(events.usage.turns, 2);
    }

    #[test]
    fn an_answer_too_long_to_hold_still_counts_as_its_ending_says() {
        let text = "x".repeat(3 << 20);
        // As pi writes it: the type first, the message's role, content, usage, then how it ended.
        let line = format!(
            r#"{{"type":"message_end","message":{{"role":"assistant","content":[{{"type":"text","text":"{text}"}}],"usage":{{"input":100,"output":2500000,"totalTokens":2500100}},"stopReason":"stop"}}}}"#
        );
        let (head, tail) = (
            &line.as_bytes()[..1 << 20],
            &line.as_bytes()[line.len() - (64 << 10)..],
        );
        let mut events = PiEvents::default();
        assert_eq!(
            events.observe_overlong(head, tail).as_deref(),
            Some("message_end")
        );
        assert_eq!(events.verdict(true), Ok(()));
        assert_eq!(events.usage.turns, 1);
        assert_eq!(events.usage.output_tokens, 2_500_000);
        assert_eq!(events.final_text(), ("", true));
        // Another event's line counts for nothing, and says what it was.
        let mut other = PiEvents::default();
        let update = format!(
            "{{\"type\":\"message_update\",\"message\":{{\"role\":\"assistant\",\"x\":\"{text}\"}}}}"
        );
        assert_eq!(
            other
                .observe_overlong(&update.as_bytes()[..1 << 20], b"")
                .as_deref(),
            Some("message_update")
        );
        assert_eq!(other.verdict(true).unwrap_err().0, Reason::AgentNoTurn);
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
