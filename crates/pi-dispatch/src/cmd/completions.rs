//! `pi-dispatch completions SHELL` and `pi-dispatch man-page`: a shell's completion script and the
//! manual page, both generated from the command line's own definitions, so neither can drift from
//! what the program takes. Neither needs a deployment.

use std::io::Write;

use clap::CommandFactory;

use crate::exit::Exit;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The shell to complete in: bash (`source <(pi-dispatch completions bash)`), zsh, fish,
    /// elvish or powershell.
    #[arg(value_name = "SHELL")]
    shell: clap_complete::Shell,
}

/// The program's name, as the scripts complete it and the page names it.
const NAME: &str = "pi-dispatch";

pub fn completions(args: &Args) -> anyhow::Result<Exit> {
    let mut command = shown();
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut command, NAME, &mut out);
    if args.shell == clap_complete::Shell::Bash {
        out = bash_fixed(&out);
    }
    std::io::stdout().write_all(&out)?;
    Ok(Exit::Success)
}

/// The bash script with its states spelled one way: clap_complete escapes a hyphenated program
/// name one way where it sets the state (`pi__dispatch__subcmd__prune`) and another where it
/// matches it (`pi__subcmd__dispatch__subcmd__prune`), so no subcommand's options would complete
/// (clap-rs/clap issue 6421, open as of clap_complete 4.6.12).
fn bash_fixed(script: &[u8]) -> Vec<u8> {
    String::from_utf8_lossy(script)
        .replace("pi__subcmd__dispatch", "pi__dispatch")
        .into_bytes()
}

/// The command line as an operator sees it: the runner's own commands, hidden from `--help`, left
/// out (the scripts would offer them otherwise).
fn shown() -> clap::Command {
    let full = crate::Cli::command();
    let shown = clap::Command::new(NAME).version(crate::VERSION);
    let shown = match full.get_about() {
        Some(about) => shown.about(about.clone()),
        None => shown,
    };
    shown
        .args(full.get_arguments().cloned())
        .subcommands(full.get_subcommands().filter(|c| !c.is_hide_set()).cloned())
}

/// The manual page (roff): `pi-dispatch man-page > pi-dispatch.1`, or `man -l <(pi-dispatch
/// man-page)`.
pub fn man_page() -> anyhow::Result<Exit> {
    let mut out = Vec::new();
    clap_mangen::Man::new(crate::Cli::command()).render(&mut out)?;
    std::io::stdout().write_all(&out)?;
    Ok(Exit::Success)
}
