//! Writing a command's report to standard output.

use std::io::{self, Write};

/// Writes `text` to standard output, inert: every control character but line ends and tabs is
/// written as `\u00XX` (see [`inert`]), so nothing a job put in a record, a name or a transcript
/// can drive the terminal. A reader that went away (`| head`) is not an error of the command: the
/// rest is dropped and the command still exits with its verdict.
pub fn print(text: &str) -> anyhow::Result<()> {
    print_raw(inert(text).as_bytes())
}

/// Writes `bytes` to standard output as they are: only for what the operator asked for raw.
pub fn print_raw(bytes: &[u8]) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// `text` with every control character (C0, DEL and C1) but `\n` and `\t` written as `\u00XX`:
/// a terminal shows it and does nothing, and inside a JSON string it is the same character, so
/// JSON output stays valid and means the same. Pure.
pub fn inert(text: &str) -> std::borrow::Cow<'_, str> {
    if !text
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `path` shown relative to `dir` when it lies inside it, else as it is.
pub fn relative(dir: &std::path::Path, path: &std::path::Path) -> String {
    path.strip_prefix(dir)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| path.display().to_string())
}

/// A server name as a terminal may show it: as written when it is plain, else escaped and cut short.
pub fn display_name(name: &str) -> String {
    const MAX: usize = 48;
    if !name.is_empty() && name.len() <= MAX && name.bytes().all(|b| b.is_ascii_graphic()) {
        return name.to_owned();
    }
    let escaped: String = format!("{name:?}");
    if escaped.chars().count() > MAX {
        escaped.chars().take(MAX).chain(['…']).collect()
    } else {
        escaped
    }
}

/// Why a configuration file is not used: it cannot be read, or it is read and refused.
pub enum FileError<E> {
    Read(config::files::ReadError),
    Parse(E),
}

/// Errors with a stable code, as the reports print them.
pub trait Coded {
    fn code(&self) -> &'static str;
}

impl Coded for config::mcp::OverlayError {
    fn code(&self) -> &'static str {
        config::mcp::OverlayError::code(self)
    }
}

impl Coded for config::triggers::TriggersError {
    fn code(&self) -> &'static str {
        config::triggers::TriggersError::code(self)
    }
}

impl<E: Coded> FileError<E> {
    pub fn code(&self) -> &'static str {
        match self {
            FileError::Read(e) => e.code(),
            FileError::Parse(e) => e.code(),
        }
    }
}

/// Reads `path` whole (no link, at most `limit` bytes) and parses it.
pub fn read_and_parse<T, E>(
    path: &std::path::Path,
    limit: usize,
    parse: impl FnOnce(&[u8]) -> Result<T, E>,
) -> Result<T, FileError<E>> {
    let bytes = config::files::read_file(path, limit).map_err(FileError::Read)?;
    parse(&bytes).map_err(FileError::Parse)
}

/// Prints a report: as pretty JSON with `json`, else in its human form.
pub fn print_report(
    json: bool,
    report: &impl serde::Serialize,
    human: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    let text = if json {
        serde_json::to_string_pretty(report)? + "\n"
    } else {
        human()
    };
    print(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_shown_not_obeyed() {
        assert_eq!(inert("plain\ttext\n"), "plain\ttext\n");
        assert_eq!(
            inert("\u{1b}]0;title\u{7}\u{1b}[2J\r\u{9b}31m\u{7f}"),
            "\\u001b]0;title\\u0007\\u001b[2J\\u000d\\u009b31m\\u007f"
        );
        // Inside a JSON string, the escape is the same character: JSON output stays valid.
        let json = serde_json::to_string(&serde_json::json!({"t": "a\u{9b}b"})).unwrap();
        let shown = inert(&json);
        let back: serde_json::Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(back["t"], "a\u{9b}b");
    }

    #[test]
    fn names_are_shown_plainly_or_escaped() {
        assert_eq!(display_name("docs"), "docs");
        assert_eq!(display_name(""), "\"\"");
        assert_eq!(display_name("a b"), "\"a b\"");
        assert_eq!(display_name("x\u{1b}[31m"), "\"x\\u{1b}[31m\"");
        assert!(display_name(&"n".repeat(100)).ends_with('…'));
    }
}
