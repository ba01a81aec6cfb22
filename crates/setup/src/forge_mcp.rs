//! The forge's own MCP servers in a job image (`image install --forge-mcp DIR`): GitHub's
//! `github-mcp-server` and GitLab's `@zereight/mcp-gitlab`, each behind its wrapper, laid out as
//!
//! ```text
//! images/NAME/
//!   forge-mcp/forge-mcp-github, forge-mcp-gitlab   the wrappers (image/forge-mcp in this repository)
//!   forge-mcp/github/github-mcp-server, toolsets   the binary, checked against its pins, and the
//!                                                  GITHUB_TOOLSETS value of its version
//!   forge-mcp/gitlab/node_modules/                 mcp-gitlab, at the version the lockfile pins
//!   usr/local/bin/forge-mcp-github, -gitlab        links to the wrappers, as a job sees them
//! ```
//!
//! `DIR` holds `github-mcp-server` (the binary) and `gitlab/node_modules` (installed with `npm ci`
//! from `image/forge-mcp/gitlab`'s lockfile). Nothing is fetched here: the operator supplies both.

use std::fs;
use std::io;
use std::path::Path;
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::fsutil::link_tree;

/// The wrappers, as the image carries them.
pub const GITHUB_WRAPPER: &str = include_str!("../../../image/forge-mcp/forge-mcp-github");
pub const GITLAB_WRAPPER: &str = include_str!("../../../image/forge-mcp/forge-mcp-gitlab");
/// The github-mcp-server binaries an image may carry.
pub const GITHUB_PINS: &str = include_str!("../../../image/forge-mcp/github/pins");
/// mcp-gitlab's lockfile.
pub const GITLAB_LOCK: &str = include_str!("../../../image/forge-mcp/gitlab/package-lock.json");

/// The GITHUB_TOOLSETS value of a server the operator pins: GitHub's name for its default set.
pub const DEFAULT_TOOLSETS: &str = "default";

const GITLAB_PACKAGE: &str = "node_modules/@zereight/mcp-gitlab";

/// One pinned github-mcp-server binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    pub version: String,
    pub arch: String,
    pub sha256: String,
    pub toolsets: String,
}

/// The pins of a pins file: `VERSION ARCH SHA256 TOOLSETS` a line, `#` comments. Lines of another
/// shape are skipped (the file is this project's own, checked by a test). Pure.
pub fn pins(text: &str) -> Vec<Pin> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            [version, arch, sha256, toolsets] => Some(Pin {
                version: version.to_owned(),
                arch: arch.to_owned(),
                sha256: sha256.to_ascii_lowercase(),
                toolsets: toolsets.to_owned(),
            }),
            _ => None,
        })
        .collect()
}

/// The version of mcp-gitlab a lockfile pins. Pure.
pub fn gitlab_version(lock: &str) -> Option<String> {
    let lock: serde_json::Value = serde_json::from_str(lock).ok()?;
    lock["packages"][GITLAB_PACKAGE]["version"]
        .as_str()
        .map(str::to_owned)
}

/// What went into the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Staged {
    pub github_version: String,
    pub gitlab_version: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ForgeMcpError {
    #[error("--forge-mcp must hold {0} (see docs/forges.md)")]
    Missing(&'static str),
    #[error(
        "github-mcp-server in --forge-mcp is not a pinned build (its sha256 is in neither image/forge-mcp/github/pins nor --github-mcp-sha256)"
    )]
    Unpinned,
    #[error("--github-mcp-sha256 must be 64 hexadecimal digits")]
    BadPin,
    #[error("github-mcp-server --version did not name its version")]
    NoVersion,
    #[error(
        "mcp-gitlab in --forge-mcp is version {found}; image/forge-mcp/gitlab's lockfile pins {pinned}"
    )]
    GitlabVersion { found: String, pinned: String },
    #[error("{what} failed ({kind})")]
    Io {
        what: &'static str,
        kind: io::ErrorKind,
    },
}

fn io_err(what: &'static str) -> impl Fn(io::Error) -> ForgeMcpError {
    move |e| ForgeMcpError::Io {
        what,
        kind: e.kind(),
    }
}

/// `--github-mcp-sha256`, checked: 64 hexadecimal digits, in lowercase. Pure.
pub fn operator_pin(text: &str) -> Result<String, ForgeMcpError> {
    if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(text.to_ascii_lowercase())
    } else {
        Err(ForgeMcpError::BadPin)
    }
}

/// The sha256 of a file, in lowercase hex.
fn sha256_of(path: &Path) -> io::Result<String> {
    Ok(protocol::ids::hex(Sha256::digest(fs::read(path)?)))
}

/// Lays the forge servers from `source` out in `image` (a staging image folder), checked against
/// their pins (and `operator_pin`, a sha256 the operator vouches for).
pub fn stage(
    source: &Path,
    image: &Path,
    operator_pin: Option<&str>,
) -> Result<Staged, ForgeMcpError> {
    let binary = source.join("github-mcp-server");
    if !binary.is_file() {
        return Err(ForgeMcpError::Missing("github-mcp-server"));
    }
    let modules = source.join("gitlab/node_modules");
    if !modules.join("@zereight/mcp-gitlab/package.json").is_file() {
        return Err(ForgeMcpError::Missing(
            "gitlab/node_modules with @zereight/mcp-gitlab",
        ));
    }
    let vouched = vouch_github(&binary, operator_pin)?;
    let root = image.join(protocol::image::FORGE_MCP);
    let github_version = stage_github(&binary, &root, &vouched)?;
    let gitlab_version = stage_gitlab(&modules, &root)?;
    write_wrappers(image, &root)?;
    Ok(Staged {
        github_version,
        gitlab_version,
    })
}

/// A github-mcp-server binary found pinned (or vouched for by the operator's own pin).
struct Vouched {
    digest: String,
    /// The pin that names it; none when only the operator's pin does.
    pinned: Option<Pin>,
    toolsets: String,
}

/// Finds the binary's pin (for this machine) or the operator's, with the toolsets it runs with.
fn vouch_github(binary: &Path, operator_pin: Option<&str>) -> Result<Vouched, ForgeMcpError> {
    let digest = sha256_of(binary).map_err(io_err("reading github-mcp-server"))?;
    let pinned = pins(GITHUB_PINS)
        .into_iter()
        .find(|p| p.sha256 == digest && p.arch == std::env::consts::ARCH);
    let toolsets = match (&pinned, operator_pin) {
        (Some(pin), _) => pin.toolsets.clone(),
        (None, Some(pin)) if pin == digest => DEFAULT_TOOLSETS.to_owned(),
        _ => return Err(ForgeMcpError::Unpinned),
    };
    Ok(Vouched {
        digest,
        pinned,
        toolsets,
    })
}

/// Copies github-mcp-server into `root/github` (checked again as copied) with its toolsets; its
/// version, which must be the pin's.
fn stage_github(binary: &Path, root: &Path, vouched: &Vouched) -> Result<String, ForgeMcpError> {
    let github = root.join("github");
    fs::create_dir_all(&github).map_err(io_err("creating forge-mcp/github"))?;
    let server = github.join("github-mcp-server");
    fs::copy(binary, &server).map_err(io_err("copying github-mcp-server"))?;
    // Checked again as copied: what runs is what was pinned.
    if sha256_of(&server).map_err(io_err("reading github-mcp-server"))? != vouched.digest {
        return Err(ForgeMcpError::Unpinned);
    }
    set_mode(&server, 0o755)?;
    let mut version = Command::new(&server);
    version.arg("--version").env_clear();
    let out =
        spawn::retry_busy(|| version.output()).map_err(io_err("running github-mcp-server"))?;
    let github_version = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("Version: ").map(|v| v.trim().to_owned()))
        .filter(|v| !v.is_empty())
        .ok_or(ForgeMcpError::NoVersion)?;
    if let Some(pin) = &vouched.pinned
        && pin.version != github_version
    {
        return Err(ForgeMcpError::Unpinned);
    }
    fs::write(github.join("toolsets"), format!("{}\n", vouched.toolsets))
        .map_err(io_err("writing forge-mcp/github/toolsets"))?;
    Ok(github_version)
}

/// Links mcp-gitlab's packages into `root/gitlab`, once its version is the lock file's; that
/// version.
fn stage_gitlab(modules: &Path, root: &Path) -> Result<String, ForgeMcpError> {
    let pinned_gitlab = gitlab_version(GITLAB_LOCK).unwrap_or_default();
    let package: serde_json::Value = fs::read(modules.join("@zereight/mcp-gitlab/package.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let found = package["version"].as_str().unwrap_or_default().to_owned();
    if found != pinned_gitlab {
        return Err(ForgeMcpError::GitlabVersion {
            found,
            pinned: pinned_gitlab,
        });
    }
    let gitlab = root.join("gitlab");
    fs::create_dir_all(&gitlab).map_err(io_err("creating forge-mcp/gitlab"))?;
    let mut files = 0;
    link_tree(
        modules,
        &gitlab.join("node_modules"),
        &mut files,
        &mut |_| {},
    )
    .map_err(io_err("linking mcp-gitlab"))?;
    Ok(found)
}

/// Writes both servers' wrappers into `root`, each linked from the image's commands.
fn write_wrappers(image: &Path, root: &Path) -> Result<(), ForgeMcpError> {
    let commands = image.join(protocol::image::COMMANDS);
    fs::create_dir_all(&commands).map_err(io_err("creating usr/local/bin"))?;
    for (name, text) in [
        ("forge-mcp-github", GITHUB_WRAPPER),
        ("forge-mcp-gitlab", GITLAB_WRAPPER),
    ] {
        let wrapper = root.join(name);
        fs::write(&wrapper, text).map_err(io_err("writing a wrapper"))?;
        set_mode(&wrapper, 0o755)?;
        let inside = Path::new(protocol::image::MOUNT)
            .join(protocol::image::FORGE_MCP)
            .join(name);
        std::os::unix::fs::symlink(inside, commands.join(name))
            .map_err(io_err("linking a wrapper into usr/local/bin"))?;
    }
    Ok(())
}

fn set_mode(path: &Path, mode: u32) -> Result<(), ForgeMcpError> {
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(io_err("setting a mode"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pins_and_the_lockfile_name_what_the_image_takes() {
        let pins = pins(GITHUB_PINS);
        assert!(!pins.is_empty());
        for pin in &pins {
            assert_eq!(pin.sha256.len(), 64, "{pin:?}");
            assert!(pin.sha256.bytes().all(|b| b.is_ascii_hexdigit()));
            // Every value names GitHub's default set: `default`, or its toolsets one by one.
            assert!(
                pin.toolsets == DEFAULT_TOOLSETS
                    || pin.toolsets == "context,repos,issues,pull_requests,users",
                "{pin:?}"
            );
        }
        assert_eq!(gitlab_version(GITLAB_LOCK).as_deref(), Some("2.1.64"));
        // The lockfile records no download address.
        assert!(!GITLAB_LOCK.contains("\"resolved\""));
    }

    /// Runs `wrapper` (reached through a link, as a job reaches it from /usr/local/bin) from a
    /// folder laid out as the image's `forge-mcp/`, where `program` (relative to it) and `node` on
    /// PATH are stand-ins that write what they were started with: their arguments, then their
    /// environment, one entry a line.
    fn started_by(
        wrapper: &str,
        program: &str,
        env: &[(&str, &str)],
    ) -> (Vec<String>, Vec<String>) {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let here = dir.path().join("forge-mcp");
        let said = dir.path().join("said");
        let stand_in = format!(
            "#!/bin/sh\n{{ for a in \"$@\"; do echo \"arg $a\"; done; env | sed 's/^/env /'; }} > {}\n",
            said.display()
        );
        let executable = |path: &Path, text: &str| {
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, text).unwrap();
            fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
        };
        executable(&here.join("forge-mcp"), wrapper);
        executable(&here.join(program), &stand_in);
        executable(&dir.path().join("bin/node"), &stand_in);
        fs::create_dir_all(here.join("github")).unwrap();
        fs::write(here.join("github/toolsets"), "default\n").unwrap();
        let link = dir.path().join("forge-mcp-link");
        std::os::unix::fs::symlink(here.join("forge-mcp"), &link).unwrap();
        let status = Command::new(&link)
            .env_clear()
            .env(
                "PATH",
                format!("{}:/usr/bin:/bin", dir.path().join("bin").display()),
            )
            .envs(env.iter().copied())
            .status()
            .unwrap();
        assert!(status.success());
        let said = fs::read_to_string(&said).unwrap();
        let pick = |prefix: &str| {
            said.lines()
                .filter_map(|l| l.strip_prefix(prefix))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        let here = here.display().to_string();
        let args = pick("arg ")
            .into_iter()
            .map(|a| a.replace(&here, "HERE"))
            .collect();
        (args, pick("env "))
    }

    #[test]
    fn the_wrappers_set_what_the_spec_says_and_pass_on_no_cli_token() {
        let tokens = [
            ("GH_TOKEN", "cli-1"),
            ("GITHUB_TOKEN", "cli-2"),
            ("GITLAB_TOKEN", "cli-3"),
            ("GL_TOKEN", "cli-4"),
        ];
        let (args, env) = started_by(
            GITHUB_WRAPPER,
            "github/github-mcp-server",
            &[&tokens[..], &[("GITHUB_PERSONAL_ACCESS_TOKEN", "job")]].concat(),
        );
        assert_eq!(args, ["stdio"]);
        holds(
            &env,
            &[
                "GITHUB_TOOLSETS=default",
                "GITHUB_LOCKDOWN_MODE=1",
                "GITHUB_PERSONAL_ACCESS_TOKEN=job",
            ],
            &["GH_TOKEN", "GITHUB_TOKEN"],
        );

        let (args, env) = started_by(
            GITLAB_WRAPPER,
            "gitlab/node_modules/@zereight/mcp-gitlab/build/index.js",
            &[
                &tokens[..],
                &[
                    ("GITLAB_PERSONAL_ACCESS_TOKEN", "job"),
                    ("GITLAB_API_URL", "https://gitlab.example.test/api/v4"),
                ],
            ]
            .concat(),
        );
        assert_eq!(
            args,
            ["HERE/gitlab/node_modules/@zereight/mcp-gitlab/build/index.js"]
        );
        holds(
            &env,
            &[
                "GITLAB_DISABLE_VERSION_CHECK=true",
                "GITLAB_PERSONAL_ACCESS_TOKEN=job",
                "GITLAB_API_URL=https://gitlab.example.test/api/v4",
            ],
            &["GITLAB_TOKEN", "GL_TOKEN"],
        );
    }

    /// That `env` (`NAME=VALUE` lines) has each of `set` and none of the names `gone`.
    fn holds(env: &[String], set: &[&str], gone: &[&str]) {
        for set in set {
            assert!(env.iter().any(|e| e == set), "{set}: {env:?}");
        }
        for gone in gone {
            let gone = format!("{gone}=");
            assert!(!env.iter().any(|e| e.starts_with(&gone)), "{gone}: {env:?}");
        }
    }

    #[test]
    fn an_operator_pin_is_64_hex_digits() {
        assert_eq!(operator_pin(&"AB".repeat(32)).unwrap(), "ab".repeat(32));
        assert!(operator_pin("abc").is_err());
        assert!(operator_pin(&"zz".repeat(32)).is_err());
    }

    #[test]
    fn a_binary_that_no_pin_names_is_refused_and_nothing_is_laid_out() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("src");
        fs::create_dir_all(source.join("gitlab/node_modules/@zereight/mcp-gitlab")).unwrap();
        fs::write(
            source.join("gitlab/node_modules/@zereight/mcp-gitlab/package.json"),
            r#"{"version": "2.1.64"}"#,
        )
        .unwrap();
        fs::write(
            source.join("github-mcp-server"),
            "#!/bin/sh\necho Version: 0.12.1\n",
        )
        .unwrap();
        let image = dir.path().join("image");
        fs::create_dir(&image).unwrap();
        assert!(matches!(
            stage(&source, &image, None),
            Err(ForgeMcpError::Unpinned)
        ));
        assert!(!image.join("forge-mcp").exists());
        // The operator may vouch for it by its digest; then the wrapper names `default`.
        let digest = sha256_of(&source.join("github-mcp-server")).unwrap();
        let staged = stage(&source, &image, Some(&digest)).unwrap();
        assert_eq!(staged.github_version, "0.12.1");
        assert_eq!(
            fs::read_to_string(image.join("forge-mcp/github/toolsets")).unwrap(),
            "default\n"
        );
        assert_eq!(
            fs::read_link(image.join("usr/local/bin/forge-mcp-gitlab")).unwrap(),
            Path::new("/opt/pi-dispatch-image/forge-mcp/forge-mcp-gitlab")
        );
        // Another mcp-gitlab than the lockfile's is refused.
        fs::write(
            source.join("gitlab/node_modules/@zereight/mcp-gitlab/package.json"),
            r#"{"version": "2.0.1"}"#,
        )
        .unwrap();
        let other = dir.path().join("other");
        fs::create_dir(&other).unwrap();
        assert!(matches!(
            stage(&source, &other, Some(&digest)),
            Err(ForgeMcpError::GitlabVersion { .. })
        ));
    }
}
