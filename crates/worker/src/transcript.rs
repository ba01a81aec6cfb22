//! What the agent did: pi's event stream, as the runner passes it on, kept as the job's transcript
//! (`state/jobs/ID/transcript.jsonl`, mode 0600, at most [`MAX_BYTES`]), with every secret value the
//! worker resolved or forwarded redacted by exact match before a byte is written.

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// The most a transcript holds; what comes after is dropped, and a last line says so.
pub const MAX_BYTES: u64 = 16 * 1024 * 1024;

/// Where a transcript is kept: the records' crate says, for the readers too.
pub use records::transcripts::{FILE, path};

/// The shortest value redacted: shorter ones would match all over the text (and no credential
/// is that short).
pub const MIN_REDACTED: usize = 4;

/// Replaces each secret the worker knows by `[redacted:NAME]`, as written and as JSON writes it
/// inside a string (a value with a quote or a backslash is escaped there).
#[derive(Default, Clone)]
pub struct Redactor {
    /// `(form, replacement)`, longest form first, so that a value holding another is replaced whole.
    forms: Vec<(String, String)>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redactor({} forms)", self.forms.len())
    }
}

impl Redactor {
    /// A redactor of `secrets`: `(variable name, value)`.
    pub fn new<'a>(secrets: impl IntoIterator<Item = (&'a str, &'a str)>) -> Redactor {
        let mut forms = Vec::new();
        for (name, value) in secrets {
            if value.len() < MIN_REDACTED {
                continue;
            }
            let replacement = format!("[redacted:{name}]");
            let json = serde_json::to_string(value).unwrap_or_default();
            let escaped = json
                .strip_prefix('"')
                .and_then(|j| j.strip_suffix('"'))
                .unwrap_or(value);
            forms.push((value.to_owned(), replacement.clone()));
            if escaped != value {
                forms.push((escaped.to_owned(), replacement));
            }
        }
        forms.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        forms.dedup_by(|a, b| a.0 == b.0);
        Redactor { forms }
    }

    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for (form, replacement) in &self.forms {
            if out.contains(form.as_str()) {
                out = out.replace(form.as_str(), replacement);
            }
        }
        if !self.holds_one(&out) {
            return out;
        }
        // A marker spells a secret again, by itself or with the text around it (a secret that
        // is part of `[redacted:NAME]`, or that starts with `]`): the secrets are cut out instead,
        // until none is left. Each cut shortens the text, so this ends.
        while self.holds_one(&out) {
            for (form, _) in &self.forms {
                out = out.replace(form.as_str(), "");
            }
        }
        out
    }

    /// Whether `text` holds a secret, in any of its forms.
    fn holds_one(&self, text: &str) -> bool {
        self.forms
            .iter()
            .any(|(form, _)| text.contains(form.as_str()))
    }
}

/// A transcript being written: under a temporary name until [`Transcript::finish`] renames it.
pub struct Transcript {
    file: config::files::StagedStream,
    path: PathBuf,
    written: u64,
    full: bool,
    redactor: Redactor,
    /// Where each line also goes, redacted, while the job runs.
    live: Option<std::sync::Arc<dyn records::record::Watched>>,
}

impl Transcript {
    /// Starts the transcript of the job whose folder is `dir`.
    pub fn create(dir: &Path, redactor: Redactor) -> std::io::Result<Transcript> {
        Transcript::create_shown(dir, redactor, None)
    }

    /// Starts the transcript of the job whose folder is `dir`, each line also shown on `live`.
    pub fn create_shown(
        dir: &Path,
        redactor: Redactor,
        live: Option<std::sync::Arc<dyn records::record::Watched>>,
    ) -> std::io::Result<Transcript> {
        let path = dir.join(FILE);
        let file = config::files::StagedStream::create(&path, 0o600)?;
        Ok(Transcript {
            file,
            path,
            written: 0,
            full: false,
            redactor,
            live,
        })
    }

    /// One line of pi's output (without its line end).
    pub fn line(&mut self, line: &[u8]) {
        if self.full {
            return;
        }
        let text = String::from_utf8_lossy(line);
        let mut text = self.redactor.redact(&text);
        text.push('\n');
        if self.written + text.len() as u64 > MAX_BYTES {
            self.full = true;
            let _ = self.file.file().write_all(
                b"{\"type\":\"pi_dispatch_transcript_cut\",\"why\":\"the transcript reached its size limit\"}\n",
            );
            return;
        }
        if self.file.file().write_all(text.as_bytes()).is_ok() {
            self.written += text.len() as u64;
        }
        if let Some(live) = &self.live {
            live.line(text.trim_end_matches('\n'));
        }
    }

    /// A line too long to keep.
    pub fn overlong(&mut self) {
        self.line(br#"{"type":"pi_dispatch_line_skipped","why":"the line was longer than 1 MiB"}"#);
    }

    /// Flushes the transcript and puts it in place.
    pub fn finish(self) -> std::io::Result<PathBuf> {
        self.file.commit()?;
        Ok(self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the `redact` fuzz target: a secret that is part of the marker (`KEY]` of
    /// `[redacted:API_KEY]`), and one the marker spells again with the text after it (`]abc`
    /// before `abc`). The control: an ordinary secret still reads as its marker.
    #[test]
    fn no_marker_spells_a_secret_again() {
        let r = Redactor::new([("API_KEY", "KEY]\0\n")]);
        let out = r.redact("a KEY]\0\n b");
        assert!(!out.contains("KEY]\0\n"), "{out:?}");
        let r = Redactor::new([("API_KEY", "KEY]")]);
        let out = r.redact("a KEY] b");
        assert!(!out.contains("KEY]"), "{out:?}");
        let r = Redactor::new([("TOKEN", "]abc")]);
        let out = r.redact("x]abcabc");
        assert!(!out.contains("]abc"), "{out:?}");
        let r = Redactor::new([("TOKEN", "hunter22")]);
        assert_eq!(r.redact("pw hunter22."), "pw [redacted:TOKEN].");
    }

    #[test]
    fn every_form_of_a_secret_is_redacted_and_short_values_are_not() {
        let r = Redactor::new([
            ("DOCS_TOKEN", "cnry-docs-1"),
            ("QUOTED", "cnry\"q\\2"),
            ("LONGER", "cnry-docs-1-and-more"),
            ("TINY", "ab"),
        ]);
        let line = r#"{"a":"cnry-docs-1","b":"cnry\"q\\2","c":"cnry-docs-1-and-more","d":"ab"}"#;
        let out = r.redact(line);
        assert!(!out.contains("cnry"), "{out}");
        assert!(out.contains("[redacted:DOCS_TOKEN]") && out.contains("[redacted:QUOTED]"));
        assert!(out.contains("[redacted:LONGER]"), "{out}");
        assert!(out.contains("\"d\":\"ab\""));
        assert!(!format!("{r:?}").contains("cnry"));
    }

    #[test]
    fn a_transcript_is_private_capped_and_in_place_only_when_finished() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let mut t = Transcript::create(dir.path(), Redactor::new([("K", "cnry-key")])).unwrap();
        t.line(br#"{"type":"x","text":"key cnry-key"}"#);
        assert!(!dir.path().join(FILE).exists());
        let big = vec![b'x'; 1024 * 1024];
        for _ in 0..20 {
            t.line(&big);
        }
        t.overlong();
        let path = t.finish().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.len() as u64 <= MAX_BYTES + 200);
        assert!(text.starts_with("{\"type\":\"x\",\"text\":\"key [redacted:K]\"}\n"));
        assert!(text.ends_with("the transcript reached its size limit\"}\n"));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
