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
