//! `pi-dispatch init [DIR]`: writes the deployment folder's missing files; never overwrites.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use setup::init::{Action, Step};

use crate::context::Context;
use crate::exit::Exit;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The deployment folder to set up [default: --dir, else the current folder]
    #[arg(value_name = "DIR")]
    dir: Option<PathBuf>,
}

pub fn run(args: &Args, ctx: &Context) -> anyhow::Result<Exit> {
    let ctx = match &args.dir {
        Some(dir) => Context::new(Some(&ctx.absolute(dir)))?,
        None => Context::new(Some(&ctx.dir))?,
    };
    let settings = ctx.settings()?;
    let steps = setup::init::init(&settings)
        .map_err(|e| anyhow::anyhow!("cannot write the deployment folder ({})", e.kind()))?;
    crate::output::print(&human(&settings.dir, &steps))?;
    Ok(Exit::Success)
}

fn human(dir: &Path, steps: &[Step]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Deployment folder: {}", dir.display());
    for step in steps {
        let shown = crate::output::relative(dir, &step.path);
        let line = match step.action {
            Action::Wrote => format!("  wrote  {shown}"),
            Action::Made => format!("  made   {shown}/"),
            Action::Left => format!("  left   {shown} (already there, not changed)"),
        };
        let _ = writeln!(out, "{line}");
    }
    let _ = writeln!(
        out,
        "Next: `pi-dispatch import-pi` stages your pi servers and files into the overlay; `pi-dispatch doctor` checks the whole deployment."
    );
    out
}
