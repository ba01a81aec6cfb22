//! `pi-dispatch image install [NAME] [--from NODE_MODULES]`: builds the embedded backend's job image
//! `images/NAME/` (see `setup::image`).

use std::path::PathBuf;

use crate::context::Context;
use crate::exit::Exit;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: ImageCommand,
}

#[derive(Debug, clap::Subcommand)]
enum ImageCommand {
    /// Build images/NAME from the pinned Node.js, pi and MCP servers, with this program as the
    /// runner. An image that is there is replaced only once the new one is complete.
    Install {
        /// The image's name.
        #[arg(default_value = config::settings::DEFAULT_JOB_IMAGE)]
        name: String,
        /// Take the packages from this node_modules folder (installed from the pinned list)
        /// instead of running npm ci.
        #[arg(long, value_name = "NODE_MODULES")]
        from: Option<PathBuf>,
    },
}

pub fn run(args: &Args, ctx: &Context) -> anyhow::Result<Exit> {
    let ImageCommand::Install { name, from } = &args.command;
    let runner = std::env::current_exe()
        .map_err(|e| anyhow::anyhow!("cannot find this program's own file ({})", e.kind()))?;
    let from = from.as_ref().map(|f| ctx.absolute(f));
    let mut progress = |line: &str| eprintln!("{line}");
    let source = match &from {
        Some(folder) => setup::image::Source::Folder(folder),
        None => setup::image::Source::Npm(std::path::Path::new("npm")),
    };
    match setup::image::install(&ctx.dir, name, source, &runner, &mut progress) {
        Ok(done) => {
            crate::output::print(&format!(
                "Image {name} is ready at {} (pi {}, Node.js {}, {} package files).\nJobs use it when a trigger says \"image\": \"{name}\" or PI_JOB_IMAGE={name}.\n",
                done.dir.display(),
                done.pi_version,
                done.node_version,
                done.files
            ))?;
            Ok(Exit::Success)
        }
        Err(e) => {
            eprintln!("pi-dispatch: image {name} was not installed: {e}");
            Ok(Exit::CheckFailed)
        }
    }
}
