//! `job-env PROGRAM [ARGS...]`: what a container job starts with. It reads the job's environment
//! from its standard input (a length line, then `NAME=VALUE` pairs each ended by a NUL byte), clears
//! its own, sets that one (and `PWD`, as bubblewrap does), and becomes `PROGRAM`, which keeps the rest of the input (the job's key,
//! for the runner). So no value of the environment is on a command line, in the engine's record of
//! the container (`podman inspect`), or in a file.

use std::ffi::OsString;
use std::io::{self, Read};
use std::os::unix::process::CommandExt as _;
use std::process::ExitCode;

use crate::env::JobEnv;

/// The most the environment block may hold.
pub const MAX_BYTES: usize = 16 * 1024 * 1024;

/// The block the worker writes first to a container job's input. Pure.
pub fn block(env: &JobEnv) -> Vec<u8> {
    let mut pairs = Vec::new();
    for (name, value) in env.iter() {
        pairs.extend_from_slice(name.as_bytes());
        pairs.push(b'=');
        pairs.extend_from_slice(value.expose().as_bytes());
        pairs.push(0);
    }
    let mut out = format!("{}\n", pairs.len()).into_bytes();
    out.extend_from_slice(&pairs);
    out
}

/// Reads one block from `input`, byte by byte up to the length line and then exactly the block,
/// so that nothing after it is taken from the input. The pairs, in order.
pub fn read_block(input: &mut impl Read) -> io::Result<Vec<(OsString, OsString)>> {
    use std::os::unix::ffi::OsStringExt as _;
    let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, why.to_owned());
    let mut digits = Vec::new();
    loop {
        let mut byte = [0u8; 1];
        input.read_exact(&mut byte)?;
        match byte[0] {
            b'\n' => break,
            b @ b'0'..=b'9' if digits.len() < 9 => digits.push(b),
            _ => return Err(bad("the environment's length line is not a number")),
        }
    }
    let len: usize = std::str::from_utf8(&digits)
        .ok()
        .and_then(|d| d.parse().ok())
        .ok_or_else(|| bad("the environment's length line is not a number"))?;
    if len > MAX_BYTES {
        return Err(bad("the environment is too large"));
    }
    let mut bytes = vec![0u8; len];
    input.read_exact(&mut bytes)?;
    let mut pairs = Vec::new();
    for pair in bytes.split(|b| *b == 0).filter(|p| !p.is_empty()) {
        let at = pair
            .iter()
            .position(|b| *b == b'=')
            .filter(|at| *at > 0)
            .ok_or_else(|| bad("an entry of the environment is not NAME=VALUE"))?;
        pairs.push((
            OsString::from_vec(pair[..at].to_vec()),
            OsString::from_vec(pair[at + 1..].to_vec()),
        ));
    }
    Ok(pairs)
}

/// The launcher: `args` are the program and its arguments. It returns only when it cannot become
/// the program.
pub fn main(args: &[OsString]) -> ExitCode {
    let Some((program, rest)) = args.split_first() else {
        eprintln!("usage: job-env PROGRAM [ARGS...] (the environment comes on standard input)");
        return ExitCode::from(2);
    };
    // Unbuffered, from the descriptor itself: what follows the block stays for the program.
    let mut input = std::fs::File::from(match rustix::io::dup(rustix::stdio::stdin()) {
        Ok(fd) => fd,
        Err(e) => {
            eprintln!("job-env: no standard input ({e})");
            return ExitCode::from(125);
        }
    });
    let pairs = match read_block(&mut input) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("job-env: the job's environment could not be read ({e})");
            return ExitCode::from(125);
        }
    };
    drop(input);
    let mut command = std::process::Command::new(program);
    command.args(rest).env_clear();
    // As bubblewrap does: the working directory in PWD, then the job's own map.
    if let Ok(dir) = std::env::current_dir() {
        command.env("PWD", dir);
    }
    let e = command.envs(pairs).exec();
    eprintln!(
        "job-env: {} could not be started ({})",
        program.to_string_lossy(),
        e.kind()
    );
    ExitCode::from(127)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::{self, Parts};
    use crate::secrets::Secret;

    #[test]
    fn a_block_is_read_back_whole_and_what_follows_is_left() {
        let secrets = vec![("TOKEN".to_owned(), Secret::new("a=b c\\x"))];
        let parts = Parts {
            secrets: &secrets,
            ..Parts::new("j1", "/tmp/home")
        };
        let env = env::build(&parts, &|_| None).unwrap();
        let mut input = block(&env);
        input.extend_from_slice(b"the-key\n");
        let mut reader = io::Cursor::new(input);
        let pairs = read_block(&mut reader).unwrap();
        assert!(
            pairs.contains(&("TOKEN".into(), "a=b c\\x".into())),
            "{pairs:?}"
        );
        assert_eq!(pairs.len(), env.len());
        let mut rest = String::new();
        reader.read_to_string(&mut rest).unwrap();
        assert_eq!(rest, "the-key\n");
        for bad in [&b"x\n"[..], b"3\nA=", b"3\n=ab\0", b"1000000000\n"] {
            assert!(read_block(&mut io::Cursor::new(bad)).is_err(), "{bad:?}");
        }
    }
}
