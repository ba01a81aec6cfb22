//! `run.secrets` resolved on the host, before anything is spent.
//!
//! The resolver of profile `P` is the executable file `<deployment>/resolvers/P`. It is run once per
//! reference, with the reference as its only argument, standard input closed, the worker's own
//! environment, in the deployment folder, under a time limit ([`DEFAULT_LIMIT`]):
//!
//! - exit 0: standard output is the value (one trailing newline removed). An empty value, more than
//!   [`MAX_VALUE_BYTES`], a NUL byte or text that is not UTF-8 is refused as `secret-unresolved`.
//! - exit 2: the resolver refuses the reference; the job is refused as `secret-unresolved`.
//! - any other exit, a signal or the time limit: an infrastructure fault, retried
//!   (`secret-resolver-failed`).
//! - no such executable file (or one that cannot be started at all): a configuration error, refused
//!   as `secret-resolver-missing`.
//!
//! The resolver's standard error goes nowhere (it may echo what it looked up), and its output appears
//! in no error: a refusal names the secret's variable and the profile, with a fixed sentence.

use std::fmt;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::AsyncReadExt;

/// Where a deployment keeps its resolvers, one executable file per profile.
pub const RESOLVERS_DIR: &str = "resolvers";
/// How long one run of a resolver may take.
pub const DEFAULT_LIMIT: Duration = Duration::from_secs(30);
/// The largest value a resolver may print.
pub const MAX_VALUE_BYTES: usize = 64 * 1024;

pub use protocol::secret::Secret;

/// Why a resolver's answer was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unusable {
    /// It exited 2: it will not resolve this reference.
    Declined,
    Empty,
    TooLarge,
    /// A NUL byte, or not UTF-8: not a value an environment variable can hold.
    NotText,
}

impl Unusable {
    fn sentence(self) -> &'static str {
        match self {
            Unusable::Declined => "the resolver declined it (exit 2)",
            Unusable::Empty => "the resolver printed an empty value",
            Unusable::TooLarge => "the resolver printed more than 64 KiB",
            Unusable::NotText => {
                "the resolver printed a value that is not text (a NUL byte, or not UTF-8)"
            }
        }
    }
}

/// Why a resolver could not answer this time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    TimedOut,
    Exit(i32),
    Signal(i32),
    /// Starting it, or reading its output, failed in a way that may pass.
    Io(io::ErrorKind),
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Fault::TimedOut => f.write_str("it ran past its time limit"),
            Fault::Exit(code) => write!(f, "it exited {code}"),
            Fault::Signal(sig) => write!(f, "it was ended by signal {sig}"),
            Fault::Io(kind) => write!(f, "running it failed ({kind})"),
        }
    }
}

/// What resolving a trigger's secrets ended in, when it did not give every value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// The profile has no usable resolver: configuration, refused.
    #[error(
        "secrets profile {profile} has no resolver: {RESOLVERS_DIR}/{profile} in the deployment folder is missing or not an executable file"
    )]
    ResolverMissing { profile: String },
    /// The resolver's file could not be looked at this time: retried.
    #[error("the resolver of secrets profile {profile} could not be read this time ({kind})")]
    ResolverUnreadable {
        profile: String,
        kind: io::ErrorKind,
    },
    /// The resolver answered, and its answer refuses the job.
    #[error("secret {name} was not resolved by profile {profile}: {}", why.sentence())]
    Unresolved {
        name: String,
        profile: String,
        why: Unusable,
    },
    /// The resolver could not answer this time: retried.
    #[error("secret {name} could not be resolved by profile {profile} this time: {fault}")]
    ResolverFailed {
        name: String,
        profile: String,
        fault: Fault,
    },
}

impl SecretError {
    /// The reason token of the refusal or the retry.
    pub fn reason(&self) -> protocol::reason::Reason {
        use protocol::reason::Reason;
        match self {
            SecretError::ResolverMissing { .. } => Reason::SecretResolverMissing,
            SecretError::Unresolved { .. } => Reason::SecretUnresolved,
            SecretError::ResolverFailed { .. } | SecretError::ResolverUnreadable { .. } => {
                Reason::SecretResolverFailed
            }
        }
    }

    /// Whether the job is retried (an infrastructure fault) rather than refused.
    pub fn is_retry(&self) -> bool {
        matches!(
            self,
            SecretError::ResolverFailed { .. } | SecretError::ResolverUnreadable { .. }
        )
    }

    /// 1 retried, 2 refused, as the job's exit codes.
    pub fn code(&self) -> u8 {
        if self.is_retry() { 1 } else { 2 }
    }
}

/// How one run of a resolver ended, before its output is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    Exited(i32),
    Signaled(i32),
    TimedOut,
    /// It printed more than [`MAX_VALUE_BYTES`] and was stopped.
    Overflowed,
}

impl Ending {
    fn from_status(status: ExitStatus) -> Ending {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(code), _) => Ending::Exited(code),
            (None, Some(sig)) => Ending::Signaled(sig),
            (None, None) => Ending::Signaled(0),
        }
    }
}

/// The verdict on one run: its value, or why not. Pure.
pub fn judge(ending: Ending, stdout: &[u8]) -> Result<Secret, Judged> {
    match ending {
        Ending::Overflowed => Err(Judged::Refused(Unusable::TooLarge)),
        Ending::TimedOut => Err(Judged::Fault(Fault::TimedOut)),
        Ending::Signaled(sig) => Err(Judged::Fault(Fault::Signal(sig))),
        Ending::Exited(2) => Err(Judged::Refused(Unusable::Declined)),
        Ending::Exited(0) => {
            let value = stdout.strip_suffix(b"\n").unwrap_or(stdout);
            if value.len() > MAX_VALUE_BYTES {
                return Err(Judged::Refused(Unusable::TooLarge));
            }
            if value.is_empty() {
                return Err(Judged::Refused(Unusable::Empty));
            }
            if value.contains(&0) {
                return Err(Judged::Refused(Unusable::NotText));
            }
            match String::from_utf8(value.to_vec()) {
                Ok(text) => Ok(Secret::new(text)),
                Err(_) => Err(Judged::Refused(Unusable::NotText)),
            }
        }
        Ending::Exited(code) => Err(Judged::Fault(Fault::Exit(code))),
    }
}

/// [`judge`]'s answer when there is no value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judged {
    Refused(Unusable),
    Fault(Fault),
}

/// A profile's resolver, found on disk.
#[derive(Debug, Clone)]
pub struct Resolver {
    program: PathBuf,
    deployment: PathBuf,
    profile: String,
    limit: Duration,
}

/// Where profile `profile`'s resolver is, when the name is a profile name (lowercase letters and
/// digits, words joined by single `-`, at most 32 characters). Pure.
pub fn resolver_path(deployment: &Path, profile: &str) -> Option<PathBuf> {
    config::mcp::is_name_shape(profile).then(|| deployment.join(RESOLVERS_DIR).join(profile))
}

impl Resolver {
    /// Finds the resolver of `profile` in `deployment`; a missing or non-executable file refuses the
    /// job, a read that may pass asks for a retry.
    pub fn find(deployment: &Path, profile: &str) -> Result<Resolver, SecretError> {
        let missing = || SecretError::ResolverMissing {
            profile: profile.to_owned(),
        };
        let program = resolver_path(deployment, profile).ok_or_else(missing)?;
        match std::fs::metadata(&program) {
            Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => {}
            Ok(_) => return Err(missing()),
            Err(e) if is_configuration(e.kind()) => return Err(missing()),
            Err(e) => {
                return Err(SecretError::ResolverUnreadable {
                    profile: profile.to_owned(),
                    kind: e.kind(),
                });
            }
        }
        Ok(Resolver {
            program,
            deployment: deployment.to_owned(),
            profile: profile.to_owned(),
            limit: DEFAULT_LIMIT,
        })
    }

    /// The same resolver with another time limit per run.
    pub fn with_limit(mut self, limit: Duration) -> Resolver {
        self.limit = limit;
        self
    }

    /// Resolves every `(NAME, reference)` in order, each distinct reference once; the first
    /// refusal or fault ends it.
    pub async fn resolve_all(
        &self,
        secrets: &[(String, String)],
    ) -> Result<Vec<(String, Secret)>, SecretError> {
        let mut out: Vec<(String, Secret)> = Vec::with_capacity(secrets.len());
        let mut done: Vec<(&str, usize)> = Vec::new();
        for (name, reference) in secrets {
            let value = match done.iter().find(|(r, _)| r == reference) {
                Some((_, at)) => out[*at].1.clone(),
                None => self.resolve(name, reference).await?,
            };
            done.push((reference, out.len()));
            out.push((name.clone(), value));
        }
        Ok(out)
    }

    /// Resolves one reference, for the secret `name` (named in an error, never the output).
    pub async fn resolve(&self, name: &str, reference: &str) -> Result<Secret, SecretError> {
        let judged = match self.run(reference).await {
            Ok((ending, stdout)) => judge(ending, &stdout),
            Err(Run::NotStarted(kind)) if is_configuration(kind) => {
                return Err(SecretError::ResolverMissing {
                    profile: self.profile.clone(),
                });
            }
            Err(Run::NotStarted(kind) | Run::Io(kind)) => Err(Judged::Fault(Fault::Io(kind))),
        };
        judged.map_err(|j| match j {
            Judged::Refused(why) => SecretError::Unresolved {
                name: name.to_owned(),
                profile: self.profile.clone(),
                why,
            },
            Judged::Fault(fault) => SecretError::ResolverFailed {
                name: name.to_owned(),
                profile: self.profile.clone(),
                fault,
            },
        })
    }

    /// Runs the resolver once: how it ended and what it printed (at most one byte past what a
    /// value may be).
    async fn run(&self, reference: &str) -> Result<(Ending, Vec<u8>), Run> {
        let mut command = tokio::process::Command::new(&self.program);
        command
            .arg(reference)
            .current_dir(&self.deployment)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            // It may echo what it looked up: never read, never logged.
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true);
        let mut child =
            spawn::retry_busy(|| command.spawn()).map_err(|e| Run::NotStarted(e.kind()))?;
        let group = child.id();
        let mut stdout = child
            .stdout
            .take()
            .ok_or(Run::Io(io::ErrorKind::BrokenPipe))?;
        // A value and its newline: more than this is too large.
        let most = MAX_VALUE_BYTES + 1;
        let work = async {
            let read = async {
                let mut buf = Vec::new();
                let r = (&mut stdout)
                    .take(most as u64 + 1)
                    .read_to_end(&mut buf)
                    .await;
                // Over the limit: stop it now rather than wait for it to give up writing.
                if buf.len() > most {
                    kill_group(group);
                }
                r.map(|_| buf)
            };
            let wait = async {
                let status = child.wait().await;
                // Whatever it left behind in its group ends with it, and lets go of its output.
                kill_group(group);
                status
            };
            tokio::join!(read, wait)
        };
        match tokio::time::timeout(self.limit, work).await {
            Ok((read, status)) => {
                let read = read.map_err(|e| Run::Io(e.kind()))?;
                let status = status.map_err(|e| Run::Io(e.kind()))?;
                if read.len() > most {
                    return Ok((Ending::Overflowed, Vec::new()));
                }
                Ok((Ending::from_status(status), read))
            }
            Err(_) => {
                kill_group(group);
                let _ = child.wait().await;
                Ok((Ending::TimedOut, Vec::new()))
            }
        }
    }
}

/// Why a run gave no ending to judge.
enum Run {
    NotStarted(io::ErrorKind),
    Io(io::ErrorKind),
}

/// Errors that a retry will not mend: the file or its interpreter is missing or not allowed.
fn is_configuration(kind: io::ErrorKind) -> bool {
    matches!(
        kind,
        io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied | io::ErrorKind::NotADirectory
    )
}

fn kill_group(group: Option<u32>) {
    if let Some(group) = group {
        spawn::signal::group(group, spawn::signal::End::Kill);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_never_prints_its_value() {
        let s = Secret::new("cnry-value");
        assert_eq!(format!("{s}"), "***");
        assert_eq!(format!("{s:?}"), "Secret(***)");
        assert_eq!(
            format!("{:?}", vec![("A", s.clone())]),
            r#"[("A", Secret(***))]"#
        );
        assert_eq!(s.expose(), "cnry-value");
    }

    #[test]
    fn exit_zero_gives_the_value_less_one_newline() {
        assert_eq!(judge(Ending::Exited(0), b"tok\n").unwrap().expose(), "tok");
        assert_eq!(
            judge(Ending::Exited(0), b"tok\n\n").unwrap().expose(),
            "tok\n"
        );
        assert_eq!(judge(Ending::Exited(0), b"tok").unwrap().expose(), "tok");
    }

    #[test]
    fn unusable_output_refuses_and_faults_retry() {
        let refused = |e, out: &[u8]| judge(e, out).unwrap_err();
        assert_eq!(
            refused(Ending::Exited(0), b"\n"),
            Judged::Refused(Unusable::Empty)
        );
        assert_eq!(
            refused(Ending::Exited(0), b""),
            Judged::Refused(Unusable::Empty)
        );
        assert_eq!(
            refused(Ending::Exited(0), b"a\0b"),
            Judged::Refused(Unusable::NotText)
        );
        assert_eq!(
            refused(Ending::Exited(0), b"\xff\xfe"),
            Judged::Refused(Unusable::NotText)
        );
        let big = vec![b'a'; MAX_VALUE_BYTES + 1];
        assert_eq!(
            refused(Ending::Exited(0), &big),
            Judged::Refused(Unusable::TooLarge)
        );
        let mut at_limit = vec![b'a'; MAX_VALUE_BYTES];
        at_limit.push(b'\n');
        assert!(judge(Ending::Exited(0), &at_limit).is_ok());
        assert_eq!(
            refused(Ending::Overflowed, b""),
            Judged::Refused(Unusable::TooLarge)
        );
        assert_eq!(
            refused(Ending::Exited(2), b"value"),
            Judged::Refused(Unusable::Declined)
        );
        assert_eq!(
            refused(Ending::Exited(1), b"value"),
            Judged::Fault(Fault::Exit(1))
        );
        assert_eq!(
            refused(Ending::Signaled(9), b""),
            Judged::Fault(Fault::Signal(9))
        );
        assert_eq!(
            refused(Ending::TimedOut, b"value"),
            Judged::Fault(Fault::TimedOut)
        );
    }

    #[test]
    fn a_profile_name_is_checked_before_it_becomes_a_path() {
        let d = Path::new("/srv/d");
        assert_eq!(
            resolver_path(d, "ci"),
            Some(PathBuf::from("/srv/d/resolvers/ci"))
        );
        for bad in ["", "../x", "a/b", "A", "a--b", "-a", ".", "a b"] {
            assert_eq!(resolver_path(d, bad), None, "{bad:?}");
        }
    }

    #[test]
    fn reasons_and_codes() {
        let missing = SecretError::ResolverMissing {
            profile: "ci".into(),
        };
        let unresolved = SecretError::Unresolved {
            name: "DOCS_TOKEN".into(),
            profile: "ci".into(),
            why: Unusable::Declined,
        };
        let failed = SecretError::ResolverFailed {
            name: "DOCS_TOKEN".into(),
            profile: "ci".into(),
            fault: Fault::TimedOut,
        };
        assert_eq!(
            (missing.reason().as_str(), missing.code()),
            ("secret-resolver-missing", 2)
        );
        assert_eq!(
            (unresolved.reason().as_str(), unresolved.code()),
            ("secret-unresolved", 2)
        );
        assert_eq!(
            (failed.reason().as_str(), failed.code()),
            ("secret-resolver-failed", 1)
        );
        assert!(unresolved.to_string().contains("DOCS_TOKEN"));
        assert!(failed.is_retry() && !unresolved.is_retry() && !missing.is_retry());
    }
}
