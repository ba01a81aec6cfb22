//! What a stdio server is started with: its command found in the image, and a closed environment —
//! exactly the base names below from the runner's own environment, the usage meter, and the server's
//! own `env` on top (which may not replace the meter). Nothing else of the job: never the provider's
//! key, never the forge token unless it is the forge's own server (whose entry names it).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use config::mcp::METER_VARIABLES;

use crate::resolve::Secret;

/// Names a stdio server gets from the runner's environment when the runner has them.
pub const BASE_VARIABLES: [&str; 14] = [
    "PATH",
    "HOME",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TMPDIR",
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "NO_PROXY",
    "https_proxy",
    "http_proxy",
    "no_proxy",
    // Node 22 reads the proxy variables (for fetch) only with it.
    "NODE_USE_ENV_PROXY",
    "LC_ALL",
];

/// The server's environment: base names (and every `LC_*`), the meter, then its own `env`.
pub fn environment(runner: &[(String, String)], own: &[(String, Secret)]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = runner
        .iter()
        .filter(|(k, v)| {
            !v.is_empty()
                && (BASE_VARIABLES.contains(&k.as_str())
                    || k.starts_with("LC_")
                    || METER_VARIABLES.contains(&k.as_str()))
        })
        .cloned()
        .collect();
    for (k, v) in own {
        if METER_VARIABLES.contains(&k.as_str()) {
            continue; // the overlay refuses these already; the meter is never replaced
        }
        out.retain(|(name, _)| name != k);
        out.push((k.clone(), v.expose().to_owned()));
    }
    out.sort();
    out
}

/// Where `command` is in the image: a bare name looked up on `path` (absolute folders only), or an
/// absolute path; `None` when there is no executable file there.
pub fn find_command(command: &str, path: Option<&str>) -> Option<PathBuf> {
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if command.starts_with('/') {
        let p = PathBuf::from(command);
        return executable(&p).then_some(p);
    }
    path?
        .split(':')
        .filter(|dir| dir.starts_with('/'))
        .map(|dir| Path::new(dir).join(command))
        .find(|p| executable(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn only_the_base_names_the_meter_and_its_own_env() {
        let runner = pairs(&[
            ("PATH", "/usr/bin"),
            ("HOME", "/home/job"),
            ("LC_CTYPE", "C.UTF-8"),
            ("OPENAI_API_KEY", "cnry-provider"),
            ("GH_TOKEN", "cnry-forge"),
            ("DOCS_TOKEN", "cnry-other-server"),
            ("NODE_OPTIONS", "--require /opt/meter.js"),
            ("PI_DISPATCH_CHILD_LEDGER", "/run/ledger"),
            ("PI_DISPATCH_RUNNER_PID", "7"),
            ("TMPDIR", ""),
            ("HTTPS_PROXY", "http://127.0.0.1:3128"),
            ("NO_PROXY", "127.0.0.1"),
            ("NODE_USE_ENV_PROXY", "1"),
            ("PI_DISPATCH_EGRESS_LOOPBACK", "127.0.0.1:8000"),
        ]);
        let own = vec![
            ("FILES_TOKEN".to_owned(), Secret::new("f")),
            ("HOME".to_owned(), Secret::new("/srv")),
            ("NODE_OPTIONS".to_owned(), Secret::new("--inspect")),
        ];
        let env = environment(&runner, &own);
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "FILES_TOKEN",
                "HOME",
                "HTTPS_PROXY",
                "LC_CTYPE",
                "NODE_OPTIONS",
                "NODE_USE_ENV_PROXY",
                "NO_PROXY",
                "PATH",
                "PI_DISPATCH_CHILD_LEDGER",
                "PI_DISPATCH_RUNNER_PID"
            ]
        );
        assert!(env.contains(&("HOME".to_owned(), "/srv".to_owned())));
        assert!(env.contains(&(
            "NODE_OPTIONS".to_owned(),
            "--require /opt/meter.js".to_owned()
        )));
        assert!(!env.iter().any(|(_, v)| v.contains("cnry")));
    }

    #[test]
    fn commands_are_found_on_the_path_or_at_their_absolute_path() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("srv-tool");
        std::fs::write(&bin, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let plain = dir.path().join("not-exec");
        std::fs::write(&plain, "").unwrap();
        let path = format!("relative:{}", dir.path().display());
        assert_eq!(find_command("srv-tool", Some(&path)), Some(bin.clone()));
        assert_eq!(find_command(bin.to_str().unwrap(), None), Some(bin));
        assert_eq!(find_command("not-exec", Some(&path)), None);
        assert_eq!(find_command("missing", Some(&path)), None);
        assert_eq!(find_command("srv-tool", None), None);
    }
}
