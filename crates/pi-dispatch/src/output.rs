//! Writing a command's report to standard output.

use std::io::{self, Write};

/// Writes `text` to standard output. A reader that went away (`| head`) is not an error of the
/// command: the rest is dropped and the command still exits with its verdict.
pub fn print(text: &str) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
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

/// Text from a job (the agent's words) as a terminal may show it: line ends and tabs kept, every
/// other control character written as an escape, so nothing it holds can drive the terminal.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c == '\n' || c == '\t' || !c.is_control() {
                c.to_string()
            } else {
                c.escape_default().to_string()
            }
        })
        .collect()
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
    fn names_are_shown_plainly_or_escaped() {
        assert_eq!(display_name("docs"), "docs");
        assert_eq!(display_name(""), "\"\"");
        assert_eq!(display_name("a b"), "\"a b\"");
        assert_eq!(display_name("x\u{1b}[31m"), "\"x\\u{1b}[31m\"");
        assert!(display_name(&"n".repeat(100)).ends_with('…'));
    }
}
