//! A job's transcript (pi's events, as the worker stored them, redacted), read for people: one
//! entry per event that says something (a message, a tool call and its result, a turn), the
//! streaming deltas left out since the message that ends them holds the same text. Pure over the
//! lines it is given; pi's events are read as `protocol` reads them ([`PiLine`]).

use std::io::BufRead;

use protocol::pi_events::{PiLine, PiMessage, PiPart};

/// The most entries shown, and the longest text of one.
pub const MAX_ENTRIES: usize = 2_000;
const MAX_TEXT: usize = 4_000;
/// The most bytes read from the file for the page.
const MAX_READ: u64 = 8 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// `assistant`, `user`, `tool call`, `tool result`, `turn`, ... or `line` for text that is no
    /// event.
    pub kind: String,
    pub text: String,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct View {
    pub entries: Vec<Entry>,
    /// Streaming deltas left out.
    pub deltas: usize,
    /// There is more than the page shows.
    pub cut: bool,
}

fn clip(text: &str) -> String {
    if text.len() <= MAX_TEXT {
        return text.to_owned();
    }
    let mut end = MAX_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes more)", &text[..end], text.len() - end)
}

/// The parts of a message's content as text, a line each, tool calls by name.
fn parts_text(parts: &[PiPart]) -> String {
    parts
        .iter()
        .map(|part| match part {
            PiPart::Text(text) => text.clone(),
            PiPart::Thinking(text) => format!("(thinking) {text}"),
            PiPart::ToolCall { name, arguments } => {
                format!(
                    "→ {}({})",
                    name.as_deref().unwrap_or("?"),
                    json_text(arguments)
                )
            }
            PiPart::Other(kind) => format!("({kind})"),
        })
        .filter(|t| !t.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

fn json_text(value: &Option<serde_json::Value>) -> String {
    value.as_ref().map(ToString::to_string).unwrap_or_default()
}

/// A message's text, and how it ended when that was not the usual way.
fn message_text(message: &PiMessage) -> String {
    let mut text = parts_text(&message.content);
    if let Some(why) = message.stop_reason.as_deref()
        && why != "stop"
        && why != "toolUse"
    {
        text.push_str(&format!("\n(ended: {why})"));
    }
    text
}

/// The entry of one line, or `None` for a delta.
pub fn entry(line: &str) -> Option<Entry> {
    let tool_name = |tool: Option<String>| tool.unwrap_or_else(|| "?".to_owned());
    let (kind, text) = match PiLine::parse(line) {
        PiLine::NotJson => ("line".to_owned(), line.to_owned()),
        PiLine::Delta => return None,
        PiLine::Message(message) => (
            message.role.clone().unwrap_or_else(|| "message".to_owned()),
            message_text(&message),
        ),
        PiLine::ToolStart { tool, args } => (
            "tool call".to_owned(),
            format!("{}({})", tool_name(tool), json_text(&args)),
        ),
        PiLine::ToolEnd {
            tool,
            failed,
            result,
        } => (
            if failed { "tool error" } else { "tool result" }.to_owned(),
            format!("{}: {}", tool_name(tool), parts_text(&result)),
        ),
        PiLine::AgentStart => ("agent start".to_owned(), String::new()),
        PiLine::AgentEnd => ("agent end".to_owned(), String::new()),
        PiLine::TurnStart => ("turn start".to_owned(), String::new()),
        PiLine::TurnEnd => ("turn end".to_owned(), String::new()),
        PiLine::Other(kind) => (kind.unwrap_or_else(|| "event".to_owned()), String::new()),
    };
    Some(Entry {
        kind,
        text: clip(&text),
    })
}

/// Reads the transcript from `reader`, up to [`MAX_ENTRIES`] entries and [`MAX_READ`] bytes.
pub fn read(reader: impl BufRead) -> View {
    let mut view = View::default();
    let mut read = 0u64;
    for line in reader.split(b'\n') {
        let Ok(line) = line else { break };
        read += line.len() as u64 + 1;
        if read > MAX_READ || view.entries.len() >= MAX_ENTRIES {
            view.cut = true;
            break;
        }
        let line = String::from_utf8_lossy(&line);
        if line.trim().is_empty() {
            continue;
        }
        match entry(&line) {
            Some(e) => view.entries.push(e),
            None => view.deltas += 1,
        }
    }
    view
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_become_entries_and_deltas_are_counted() {
        let text = [
            r#"{"type":"agent_start"}"#,
            r#"{"type":"message_update","assistantMessageEvent":{}}"#,
            r#"{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":"Looking."},{"type":"toolCall","name":"docs_search","arguments":{"q":"x"}}],"stopReason":"toolUse"}}"#,
            r#"{"type":"tool_execution_start","toolName":"docs_search","args":{"q":"x"}}"#,
            r#"{"type":"tool_execution_end","toolName":"docs_search","result":{"content":[{"type":"text","text":"found"}]},"isError":false}"#,
            "",
            "[the transcript stops here]",
        ]
        .join("\n");
        let view = read(text.as_bytes());
        let got: Vec<(&str, &str)> = view
            .entries
            .iter()
            .map(|e| (e.kind.as_str(), e.text.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("agent start", ""),
                ("assistant", "Looking.\n→ docs_search({\"q\":\"x\"})"),
                ("tool call", "docs_search({\"q\":\"x\"})"),
                ("tool result", "docs_search: found"),
                ("line", "[the transcript stops here]"),
            ]
        );
        assert_eq!((view.deltas, view.cut), (1, false));
    }

    #[test]
    fn every_kind_of_event_reads_as_before() {
        let shown = |line: &str| entry(line).map(|e| (e.kind, e.text));
        let some = |kind: &str, text: &str| Some((kind.to_owned(), text.to_owned()));
        // Deltas.
        for delta in [
            r#"{"type":"message_start","message":{"role":"assistant"}}"#,
            r#"{"type":"tool_execution_update","toolName":"t"}"#,
        ] {
            assert_eq!(shown(delta), None, "{delta}");
        }
        // Messages: any role, content as a string or parts, how an answer ended.
        assert_eq!(
            shown(r#"{"type":"message_end","message":{"role":"user","content":"Fix it."}}"#),
            some("user", "Fix it.")
        );
        assert_eq!(
            shown(
                r#"{"type":"message_end","message":{"role":"assistant","content":[{"type":"thinking","thinking":"hm"},{"type":"image","data":"x"},{"no":"type"},{"type":"text","text":""},{"type":"text","text":"Done."},{"type":"toolCall","arguments":[1]},{"type":"toolCall","name":"n"}],"stopReason":"length"}}"#
            ),
            some(
                "assistant",
                "(thinking) hm\n(image)\nDone.\n→ ?([1])\n→ n()\n(ended: length)"
            )
        );
        assert_eq!(
            shown(
                r#"{"type":"message_end","message":{"role":"assistant","content":[],"stopReason":"stop"}}"#
            ),
            some("assistant", "")
        );
        assert_eq!(
            shown(
                r#"{"type":"message_end","message":{"role":"toolResult","content":{"x":1},"stopReason":"error"}}"#
            ),
            some("toolResult", "\n(ended: error)")
        );
        assert_eq!(shown(r#"{"type":"message_end"}"#), some("message", ""));
        assert_eq!(
            shown(r#"{"type":"message_end","message":{"role":7,"content":"x","stopReason":1}}"#),
            some("message", "x")
        );
        // Tool calls and their results.
        assert_eq!(
            shown(r#"{"type":"tool_execution_start"}"#),
            some("tool call", "?()")
        );
        assert_eq!(
            shown(
                r#"{"type":"tool_execution_end","toolName":"bash","result":{"content":"no such file"},"isError":true}"#
            ),
            some("tool error", "bash: no such file")
        );
        assert_eq!(
            shown(r#"{"type":"tool_execution_end","isError":"yes"}"#),
            some("tool result", "?: ")
        );
        // Turns, the agent, other events, and JSON that is no event.
        for (line, kind) in [
            (r#"{"type":"turn_start"}"#, "turn start"),
            (r#"{"type":"turn_end","message":{}}"#, "turn end"),
            (r#"{"type":"agent_end","messages":[]}"#, "agent end"),
            (
                r#"{"type":"auto_compaction_start"}"#,
                "auto_compaction_start",
            ),
            (r#"{"type":3}"#, "event"),
            ("[1,2]", "event"),
            ("\"text\"", "event"),
        ] {
            assert_eq!(shown(line), some(kind, ""), "{line}");
        }
        assert_eq!(shown("{not json"), some("line", "{not json"));
    }

    #[test]
    fn a_long_text_is_clipped_on_a_character() {
        let long = "é".repeat(3_000);
        let e = entry(&long).unwrap();
        assert!(
            e.text.ends_with("bytes more)") && e.text.len() < 4_100,
            "{}",
            e.text.len()
        );
    }
}
