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
