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
        // Written if it can be: a closed or full standard error must not turn exit 2 into a panic.
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            format!("pi-dispatch: {e:#}\n").as_bytes(),
        );
        Exit::Unusable.into()
    }
}
