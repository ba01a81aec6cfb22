//! `pi-dispatch image install [NAME] [--from NODE_MODULES] [--forge-mcp DIR]`: builds the embedded
//! backend's job image `images/NAME/` (see `setup::image`), with the forge's own MCP servers when
//! `--forge-mcp` gives them (`setup::forge_mcp`).

use std::path::PathBuf;

use crate::context::Context;
use crate::exit::Exit;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: ImageCommand,
}

/// What both ways of making an image take.
#[derive(Debug, clap::Args)]
struct Parts {
    /// The image's name.
    #[arg(default_value = config::settings::DEFAULT_JOB_IMAGE)]
    name: String,
    /// Take the packages from this node_modules folder (installed from the pinned list)
    /// instead of running npm ci.
    #[arg(long, value_name = "NODE_MODULES")]
    from: Option<PathBuf>,
    /// Add the forge's own MCP servers from this folder: github-mcp-server (a pinned build)
    /// and gitlab/node_modules (npm ci of image/forge-mcp/gitlab); the image then declares
    /// forgeMcp.
    #[arg(long, value_name = "DIR")]
    forge_mcp: Option<PathBuf>,
    /// Also take a github-mcp-server with this sha256 (one you checked against GitHub's
    /// release), besides the pinned builds.
    #[arg(long, value_name = "SHA256", requires = "forge_mcp")]
    github_mcp_sha256: Option<String>,
}

#[derive(Debug, clap::Subcommand)]
enum ImageCommand {
    /// Build images/NAME from the pinned Node.js, pi and MCP servers, with this program as the
    /// runner. An image that is there is replaced only once the new one is complete.
    Install {
        #[command(flatten)]
        parts: Parts,
    },
    /// Build the job image NAME as a container image (localhost/pi-dispatch-NAME) for the
    /// container backend (PI_SANDBOX=podman): a Debian system, Node.js, pi, the runner, the forge's
    /// servers with --forge-mcp, and the labels, imported into Podman. No registry is used.
    Build {
        #[command(flatten)]
        parts: Parts,
        /// The system from this root filesystem tarball, instead of running mmdebstrap (it needs
        /// libstdc++6, git and ca-certificates besides Debian's essential packages).
        #[arg(long, value_name = "TAR")]
        rootfs: Option<PathBuf>,
    },
}

pub fn run(args: &Args, ctx: &Context) -> anyhow::Result<Exit> {
    let (parts, rootfs) = match &args.command {
        ImageCommand::Install { parts } => (parts, None),
        ImageCommand::Build { parts, rootfs } => {
            (parts, Some(rootfs.as_ref().map(|r| ctx.absolute(r))))
        }
    };
    let Parts {
        name,
        from,
        forge_mcp,
        github_mcp_sha256,
    } = parts;
    let pin = match github_mcp_sha256 {
        Some(text) => match setup::forge_mcp::operator_pin(text) {
            Ok(pin) => Some(pin),
            Err(e) => {
                eprintln!("pi-dispatch: image {name} was not installed: {e}");
                return Ok(Exit::Unusable);
            }
        },
        None => None,
    };
    let forge_mcp = forge_mcp.as_ref().map(|f| ctx.absolute(f));
    let runner = std::env::current_exe()
        .map_err(|e| anyhow::anyhow!("cannot find this program's own file ({})", e.kind()))?;
    let from = from.as_ref().map(|f| ctx.absolute(f));
    let image = Image {
        name,
        source: match &from {
            Some(folder) => setup::image::Source::Folder(folder),
            None => setup::image::Source::Npm(std::path::Path::new("npm")),
        },
        runner: &runner,
        forge: forge_mcp.as_deref().map(|source| setup::image::ForgeMcp {
            source,
            pin: pin.as_deref(),
        }),
    };
    match rootfs {
        Some(rootfs) => image.build(ctx, rootfs.as_deref()),
        None => image.install(ctx),
    }
}

/// An image to make: its name, where its packages and the forge's servers come from, and the
/// runner it carries (this program).
struct Image<'a> {
    name: &'a str,
    source: setup::image::Source<'a>,
    runner: &'a std::path::Path,
    forge: Option<setup::image::ForgeMcp<'a>>,
}

impl Image<'_> {
    /// Builds it as a container image, its system from `rootfs` (else mmdebstrap), imported into
    /// Podman.
    fn build(self, ctx: &Context, rootfs: Option<&std::path::Path>) -> anyhow::Result<Exit> {
        let name = self.name;
        let rootfs = match rootfs {
            Some(tar) => setup::image::Rootfs::Tarball(tar),
            None => setup::image::Rootfs::Mmdebstrap,
        };
        let podman = std::path::Path::new(config::settings::PODMAN);
        let mut progress = |line: &str| eprintln!("{line}");
        match setup::image::build(
            &ctx.dir,
            name,
            self.source,
            self.runner,
            self.forge,
            rootfs,
            podman,
            &mut progress,
        ) {
            Ok(built) => {
                crate::output::print(&format!(
                    "Image {name} is built as the container image {} (pi {}, Node.js {}, capabilities {}).\nWith PI_SANDBOX=podman (and no PI_PODMAN_IMAGE), jobs of image {name} run in it.\n",
                    built.reference, built.pi_version, built.node_version, built.capabilities
                ))?;
                Ok(Exit::Success)
            }
            Err(e) => {
                eprintln!("pi-dispatch: image {name} was not built: {e}");
                Ok(Exit::CheckFailed)
            }
        }
    }

    /// Installs it as the folder `images/NAME/` of the embedded backend.
    fn install(self, ctx: &Context) -> anyhow::Result<Exit> {
        let name = self.name;
        let mut progress = |line: &str| eprintln!("{line}");
        match setup::image::install(
            &ctx.dir,
            name,
            self.source,
            self.runner,
            self.forge,
            &mut progress,
        ) {
            Ok(done) => {
                let servers = match &done.forge_mcp {
                    Some(f) => format!(
                        ", github-mcp-server {}, mcp-gitlab {}",
                        f.github_version, f.gitlab_version
                    ),
                    None => String::new(),
                };
                crate::output::print(&format!(
                    "Image {name} is ready at {} (pi {}, Node.js {}{servers}, {} package files).\nJobs use it when a trigger says \"image\": \"{name}\" or PI_JOB_IMAGE={name}.\n",
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
}
