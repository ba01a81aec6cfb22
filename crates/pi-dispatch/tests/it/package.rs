//! The Debian package (`scripts/package-deb`), on a clean Debian system in a Podman container:
//! lintian finds no error in it; it installs with its user, folders, modes and units (not enabled),
//! which `systemd-analyze verify` reads cleanly; doctor passes and a job with the scripted model
//! completes in a bubblewrap sandbox nested in the container; an upgrade to a newer build whose
//! default configuration changed keeps the operator's configuration and the deployment; removal
//! keeps both; purge deletes both.

use std::path::{Path, PathBuf};
use std::process::Command;

use testkit::fake_model::{FakeModel, Step};

use crate::common::{node_modules, succeeds};

const PROGRAM: &str = env!("CARGO_BIN_EXE_pi-dispatch");

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Builds the package of this test's program as `version` into `out`, from the packaging files of
/// the tree at `tree`; the .deb's path.
fn package(tree: &Path, version: &str, out: &Path) -> PathBuf {
    let printed = succeeds(
        Command::new("bash")
            .arg(tree.join("scripts/package-deb"))
            .args(["--binary", PROGRAM, "--version", version, "--out"])
            .arg(out),
    );
    PathBuf::from(
        printed
            .lines()
            .last()
            .expect("package-deb names the package"),
    )
}

/// A Debian container, removed when dropped. It shares the host's network (the scripted model
/// listens on the host's loopback) and process namespace, and is privileged, so that bubblewrap
/// can make a job's sandbox inside it (docs/install.md).
struct Debian {
    name: String,
}

impl Debian {
    /// A container of `image` (its entry point set aside), named for `what`, with `extra`
    /// options and `mounts` (host folder, place) read-only.
    fn start(image: &str, what: &str, extra: &[String], mounts: &[(&Path, &str)]) -> Debian {
        let name = format!("pi-dispatch-{what}-test-{}", std::process::id());
        let _ = Command::new("podman").args(["rm", "-f", &name]).output();
        let mut cmd = Command::new("podman");
        cmd.args(["run", "-d", "--name", &name, "--runtime", "runc"])
            // Podman here needs explicit limits, no higher than the host's.
            .args([
                "--ulimit",
                "nofile=4096:4096",
                "--ulimit",
                "nproc=4096:4096",
            ])
            .args(["--privileged", "--pid", "host", "--network", "host"])
            // A repository and a job's temporary files on file systems that take idmapped
            // mounts (the container's own root does not).
            .args(["--mount", "type=tmpfs,destination=/srv"])
            .args(["--mount", "type=tmpfs,destination=/tmp"]);
        for (host, inside) in mounts {
            cmd.arg("-v").arg(format!("{}:{inside}:ro", host.display()));
        }
        cmd.args(extra)
            .args(["--entrypoint", "sleep", image, "infinity"]);
        succeeds(&mut cmd);
        Debian { name }
    }

    /// Runs `script` under bash in the container; its exit status and output (both streams).
    fn sh(&self, script: &str) -> (bool, String) {
        let out = Command::new("podman")
            .args(["exec", &self.name, "bash", "-c", script])
            .output()
            .unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    /// Runs `script`, which must succeed; what it printed.
    fn must(&self, script: &str) -> String {
        let (success, said) = self.sh(script);
        assert!(success, "in the container, `{script}` failed:\n{said}");
        said
    }
}

impl Drop for Debian {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["rm", "-f", "-t", "0", &self.name])
            .output();
    }
}

/// The scripted model of the demo (`examples/demo/script.json`), on the host's loopback.
fn scripted_model() -> FakeModel {
    let script = std::fs::read_to_string(repo_root().join("examples/demo/script.json")).unwrap();
    FakeModel::start(Step::script_from_json(&script).unwrap())
}

/// The scripted model's port.
fn port(model: &FakeModel) -> String {
    let url = model.base_url();
    url.trim_end_matches("/v1")
        .rsplit(':')
        .next()
        .unwrap()
        .to_owned()
}

/// The demo's pi setup in `dir`, its model on `model`'s port: the folder `import-pi` takes.
fn demo_overlay(dir: &Path, model: &FakeModel) -> PathBuf {
    let demo = dir.join("pi-agent");
    std::fs::create_dir_all(&demo).unwrap();
    let agent = repo_root().join("examples/demo/pi-agent");
    std::fs::copy(agent.join("mcp.json"), demo.join("mcp.json")).unwrap();
    let models = std::fs::read_to_string(agent.join("models.json")).unwrap();
    assert!(models.contains("127.0.0.1:18555"), "{models}");
    std::fs::write(
        demo.join("models.json"),
        models.replace("18555", &port(model)),
    )
    .unwrap();
    demo
}

/// In `debian`, where the package is installed and the demo's setup is at /demo: the demo's
/// deployment in /var/lib/pi-dispatch (`import-pi`, `image install`, the model as an endpoint), a
/// repository of the package's user, doctor (which must pass, its sandbox check included), and a
/// job on the repository, which must complete with both MCP calls answered and its file written.
/// `keys` is the shell's preamble that gives it the worker's keys. The job's id.
fn demo_job(debian: &Debian, model: &FakeModel, keys: &str) -> String {
    let port = port(model);
    debian.must(&format!(
        "set -e
         cd /var/lib/pi-dispatch
         pi-dispatch import-pi --from /demo
         pi-dispatch image install --from /node_modules
         printf 'PI_PROVIDER=demo\\nPI_MODEL=scripted\\n' >> .env
         echo '{{\"version\": 1, \"endpoints\": [{{\"id\": \"demo\", \"host\": \"127.0.0.1\", \"port\": {port}}}]}}' > model-endpoints.json
         mkdir /srv/repo && cd /srv/repo && git init -q && echo '# A repository' > README.md
         git add README.md && git -c user.email=t@localhost -c user.name=t commit -qm first
         chown -R pi-dispatch: /srv/repo"
    ));
    let as_the_worker = format!("{keys} export PI_DIR=/var/lib/pi-dispatch;");
    let (passed, doctor) = debian.sh(&format!("{as_the_worker} pi-dispatch doctor 2>/dev/null"));
    assert!(
        passed && doctor.contains(" 0 failed") && doctor.contains("✓ bubblewrap"),
        "doctor:\n{doctor}"
    );
    let queued = debian.must(&format!(
        "{as_the_worker} pi-dispatch run /srv/repo --task 'Echo a greeting, add 20 and 22, and leave a note.' --mcp everything"
    ));
    let job = queued
        .split_whitespace()
        .nth(1)
        .expect("run names the job it queued")
        .to_owned();
    debian.must(&format!(
        "{as_the_worker} pi-dispatch worker --until-empty 2>/dev/null"
    ));
    let record: serde_json::Value = serde_json::from_str(&debian.must(&format!(
        "{as_the_worker} pi-dispatch runs show {job} --json"
    )))
    .unwrap();
    assert_eq!(record["outcome"], "completed", "{record}");
    let answered: u64 = record["mcp"]["toolCalls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["ok"].as_u64().unwrap())
        .sum();
    assert_eq!(answered, 2, "{record}");
    assert_eq!(
        debian.must("cat /srv/repo/NOTES.md"),
        "pi-dispatch was here\n"
    );
    job
}

/// The packaging files of this tree, copied to `to`: a later build's tree, whose default
/// worker.env has one more line.
fn newer_tree(to: &Path) {
    let root = repo_root();
    for dir in [
        "scripts",
        "packaging/deb",
        "examples/systemd",
        "crates/pi-dispatch",
    ] {
        std::fs::create_dir_all(to.join(dir)).unwrap();
    }
    for file in ["scripts/package-deb", "crates/pi-dispatch/Cargo.toml"] {
        std::fs::copy(root.join(file), to.join(file)).unwrap();
    }
    for dir in ["packaging/deb", "examples/systemd"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), to.join(dir).join(entry.file_name())).unwrap();
        }
    }
    let env = to.join("packaging/deb/worker.env");
    let mut text = std::fs::read_to_string(&env).unwrap();
    text.push_str("# A line of the newer build's own.\n");
    std::fs::write(&env, text).unwrap();
}

#[test]
fn the_debian_package_installs_runs_a_job_upgrades_keeping_configuration_and_purges() {
    let dir = tempfile::tempdir().unwrap();
    let packages = dir.path().join("packages");
    let first = package(&repo_root(), "0.1.0-1", &packages);
    let newer = dir.path().join("newer");
    newer_tree(&newer);
    let second = package(&newer, "0.1.0-2", &packages);

    // lintian: no error (warnings are printed, and the package's overrides say why each is there).
    for deb in [&first, &second] {
        let out = Command::new("lintian")
            .args(["--fail-on", "error"])
            .arg(deb)
            .output()
            .expect("lintian runs (scripts/install-tests installs it)");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && !said.lines().any(|l| l.starts_with("E:")),
            "lintian:\n{said}"
        );
    }

    let model = scripted_model();
    let demo = demo_overlay(dir.path(), &model);
    let debian = Debian::start(
        &testkit::debian_package_base_image(),
        "package",
        &[],
        &[
            (&packages, "/pkg"),
            (&node_modules(), "/node_modules"),
            (&demo, "/demo"),
        ],
    );
    let deb = |p: &Path| format!("/pkg/{}", p.file_name().unwrap().to_str().unwrap());

    // Install.
    debian.must(&format!("dpkg -i {}", deb(&first)));
    let version = debian.must("pi-dispatch --version");
    assert!(
        version.starts_with("pi-dispatch 0.1.0 (commit ") && version.contains(", pi "),
        "{version}"
    );
    let modes = debian.must(
        "stat -c '%n %a %U %G' /etc/pi-dispatch /etc/pi-dispatch/worker.env \
         /etc/pi-dispatch/receiver.env /etc/pi-dispatch/panel.env /var/lib/pi-dispatch \
         /var/lib/pi-dispatch/.env /var/lib/pi-dispatch/state /usr/bin/pi-dispatch",
    );
    assert_eq!(
        modes,
        "/etc/pi-dispatch 700 root root\n\
         /etc/pi-dispatch/worker.env 600 root root\n\
         /etc/pi-dispatch/receiver.env 600 root root\n\
         /etc/pi-dispatch/panel.env 600 root root\n\
         /var/lib/pi-dispatch 755 root root\n\
         /var/lib/pi-dispatch/.env 600 root root\n\
         /var/lib/pi-dispatch/state 700 root root\n\
         /usr/bin/pi-dispatch 755 root root\n"
    );
    // The system user, with no login, and the identity of forge jobs.
    let user = debian.must("getent passwd pi-dispatch");
    assert!(
        user.trim_end().ends_with(":/nonexistent:/usr/sbin/nologin"),
        "{user}"
    );
    let ids = debian.must("echo \"$(id -u pi-dispatch):$(id -g pi-dispatch)\"");
    let env = debian.must("cat /var/lib/pi-dispatch/.env");
    // Set once, where init left it commented out: a name set twice is an unreadable .env.
    let set: Vec<&str> = env
        .lines()
        .filter(|l| l.trim_start_matches("# ").starts_with("PI_FORGE_JOB_USER="))
        .collect();
    assert_eq!(set, [format!("PI_FORGE_JOB_USER={}", ids.trim())], "{env}");
    // The units are there, not enabled, and systemd reads them without a complaint.
    let units = debian.must("ls /lib/systemd/system/ | grep pi-dispatch");
    assert_eq!(
        units,
        "pi-dispatch-panel.service\npi-dispatch-receiver.service\npi-dispatch-worker.service\n"
    );
    let (_, wants) = debian.sh("ls /etc/systemd/system/*.wants/ 2>/dev/null");
    assert!(!wants.contains("pi-dispatch"), "{wants}");
    let verify = debian.must(
        "systemd-analyze verify /lib/systemd/system/pi-dispatch-worker.service \
         /lib/systemd/system/pi-dispatch-receiver.service \
         /lib/systemd/system/pi-dispatch-panel.service 2>&1",
    );
    assert_eq!(verify, "", "systemd-analyze verify has complaints");
    let worker_unit = debian.must("cat /lib/systemd/system/pi-dispatch-worker.service");
    assert!(
        worker_unit
            .lines()
            .any(|l| l == "ExecStart=/usr/bin/pi-dispatch worker --dir /var/lib/pi-dispatch"),
        "{worker_unit}"
    );
    // The manual page and the completions.
    debian.must(
        "test -s /usr/share/man/man1/pi-dispatch.1.gz && \
         grep -q 'complete -F _pi__dispatch' /usr/share/bash-completion/completions/pi-dispatch",
    );

    // The operator's configuration (the stand-in's key in worker.env, as the worker's unit reads
    // it), the demo's deployment, doctor, and a job.
    debian.must("echo DEMO_MODEL_KEY=demo-key >> /etc/pi-dispatch/worker.env");
    let job = demo_job(
        &debian,
        &model,
        "set -a; . /etc/pi-dispatch/worker.env; set +a;",
    );
    // Upgrade to the newer build, whose default worker.env changed too: the operator's stays (the
    // package's goes beside it), and so do the deployment and its record.
    let before_env = debian.must("cat /var/lib/pi-dispatch/.env");
    debian.must(&format!(
        "dpkg -i --force-confdef --force-confold {} < /dev/null",
        deb(&second)
    ));
    assert_eq!(
        debian.must("dpkg-query -W -f '${Version}' pi-dispatch"),
        "0.1.0-2"
    );
    let kept = debian.must("cat /etc/pi-dispatch/worker.env");
    assert!(kept.contains("DEMO_MODEL_KEY=demo-key\n"), "{kept}");
    assert!(!kept.contains("newer build"), "{kept}");
    assert!(
        debian
            .must("cat /etc/pi-dispatch/worker.env.dpkg-dist")
            .contains("newer build")
    );
    assert_eq!(
        debian.must("stat -c '%a %U' /etc/pi-dispatch/worker.env /etc/pi-dispatch"),
        "600 root\n700 root\n"
    );
    assert_eq!(debian.must("cat /var/lib/pi-dispatch/.env"), before_env);
    let runs = debian.must("PI_DIR=/var/lib/pi-dispatch pi-dispatch runs");
    assert!(runs.contains(&job), "{runs}");

    // Remove: the program goes, the configuration and the deployment stay.
    debian.must("dpkg -r pi-dispatch");
    let (present, _) = debian.sh("test -e /usr/bin/pi-dispatch");
    assert!(!present, "the program is still there after removal");
    assert_eq!(
        debian.must("dpkg-query -W -f '${Status}' pi-dispatch"),
        "deinstall ok config-files"
    );
    debian.must(
        "grep -q DEMO_MODEL_KEY /etc/pi-dispatch/worker.env && \
         test -d /var/lib/pi-dispatch/state && test -d /var/lib/pi-dispatch/images/pi-job",
    );

    // Purge: both go; the system user stays (docs/install.md says why).
    debian.must("dpkg -P pi-dispatch");
    let (left, what) = debian.sh("ls -d /etc/pi-dispatch /var/lib/pi-dispatch 2>&1");
    assert!(!left, "purge left {what}");
    debian.must("getent passwd pi-dispatch");
}

/// The service's container image (`scripts/package-image`): the package on a Debian base, whose
/// entry point is the program and whose command is the worker, on the deployment in its volume;
/// with the flags docs/install.md gives, the demo's job completes in it.
#[test]
fn the_service_image_is_the_package_on_debian_and_runs_the_worker() {
    let dir = tempfile::tempdir().unwrap();
    let deb = package(&repo_root(), "0.1.0-1", &dir.path().join("packages"));
    let tag = format!("localhost/pi-dispatch-image-test:{}", std::process::id());
    let limits = [
        "--runtime",
        "runc",
        "--ulimit",
        "nofile=4096:4096",
        "--ulimit",
        "nproc=4096:4096",
    ];
    let built = succeeds(
        Command::new("bash")
            .arg(repo_root().join("scripts/package-image"))
            .arg("--deb")
            .arg(&deb)
            .args([
                "--base",
                &testkit::debian_package_base_image(),
                "--tag",
                &tag,
                "--",
            ])
            .args(limits),
    );
    assert_eq!(built.trim(), tag);
    struct Image(String, String);
    impl Drop for Image {
        fn drop(&mut self) {
            let _ = Command::new("podman")
                .args(["volume", "rm", "-f", &self.1])
                .output();
            let _ = Command::new("podman").args(["rmi", "-f", &self.0]).output();
        }
    }
    let volume = format!("pi-dispatch-image-test-{}", std::process::id());
    let image = Image(tag.clone(), volume.clone());

    let config = succeeds(Command::new("podman").args([
        "image",
        "inspect",
        &image.0,
        "--format",
        "{{json .Config.Entrypoint}} {{json .Config.Cmd}} {{json .Config.Volumes}} {{.Config.StopSignal}}",
    ]));
    assert_eq!(
        config.trim(),
        r#"["/usr/bin/pi-dispatch"] ["worker"] {"/var/lib/pi-dispatch":{}} SIGTERM"#
    );
    let run = |args: &[&str]| {
        let mut cmd = Command::new("podman");
        cmd.args(["run", "--rm"])
            .args(limits)
            .args(["--privileged", "--pid", "host", "-v"])
            .arg(format!("{volume}:/var/lib/pi-dispatch"))
            .arg(&image.0)
            .args(args);
        cmd
    };
    let version = succeeds(&mut run(&["--version"]));
    assert!(
        version.starts_with("pi-dispatch 0.1.0 (commit "),
        "{version}"
    );
    // The deployment the package set up is in the volume, and the worker runs on it.
    let worker = succeeds(&mut run(&["worker", "--until-empty"]));
    assert!(worker.contains("The queue is empty"), "{worker}");

    // The demo's job, in a container of the image: the keys as the container's environment, the
    // deployment in its volume.
    let model = scripted_model();
    let demo = demo_overlay(dir.path(), &model);
    let mut extra: Vec<String> = ["-v", &format!("{volume}:/var/lib/pi-dispatch")]
        .map(str::to_owned)
        .to_vec();
    extra.extend(["--env", "DEMO_MODEL_KEY=demo-key"].map(str::to_owned));
    let service = Debian::start(
        &image.0,
        "image",
        &extra,
        &[(&node_modules(), "/node_modules"), (&demo, "/demo")],
    );
    demo_job(&service, &model, "");
}
