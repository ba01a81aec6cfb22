//! The one place outcomes become exit codes: 0 success, 1 a check failed, 2 usage or unreadable input.

use std::process::ExitCode;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Success,
    CheckFailed,
    Unusable,
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(match e {
            Exit::Success => 0,
            Exit::CheckFailed => 1,
            Exit::Unusable => 2,
        })
    }
}

impl Exit {
    /// Prints an error that stopped a command before it could check anything, and exits 2.
    pub fn from_error(e: &anyhow::Error) -> ExitCode {
        eprintln!("pi-dispatch: {e:#}");
        Exit::Unusable.into()
    }
}
