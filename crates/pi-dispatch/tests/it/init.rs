//! `pi-dispatch init` end to end.

use crate::common::Deployment;

#[test]
fn writes_the_missing_files_and_never_overwrites() {
    let d = Deployment::new();
    let target = d.path().join("new-deployment");
    let run = d.run(&["init", target.to_str().unwrap()]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    insta::assert_snapshot!("init_fresh", d.redact(&run.stdout));
    for name in [
        ".env",
        "triggers.json",
        "egress-allowlist.conf",
        "model-endpoints.json",
    ] {
        assert!(target.join(name).is_file(), "{name}");
    }
    assert!(target.join("pi-global").is_dir());

    std::fs::write(target.join(".env"), "PI_EGRESS=0\n").unwrap();
    let run = d.run(&["init", target.to_str().unwrap()]);
    assert_eq!(run.code, 0);
    assert!(
        run.stdout
            .contains("left   .env (already there, not changed)"),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains("wrote"), "{}", run.stdout);
    assert_eq!(
        std::fs::read_to_string(target.join(".env")).unwrap(),
        "PI_EGRESS=0\n"
    );
}

#[test]
fn the_deployment_init_writes_reads_cleanly_and_doctor_says_what_is_left() {
    let d = Deployment::new();
    assert_eq!(d.run(&["init"]).code, 0);
    let run = d.run(&["doctor"]);
    // Every file init wrote reads; what doctor still fails is what the worker would refuse a job
    // for, with its fix: no image yet. The egress proxy doctor starts for itself answers.
    assert_eq!(run.code, 1, "{}", run.stdout);
    let failed: Vec<&str> = run.stdout.lines().filter(|l| l.starts_with('✗')).collect();
    assert_eq!(failed.len(), 1, "{}", run.stdout);
    assert!(failed[0].contains("job-image-missing"));
    assert!(
        run.stdout
            .contains("✓ egress proxy: a host on no list is refused"),
        "{}",
        run.stdout
    );
}

#[test]
fn init_follows_the_settings_for_where_files_go() {
    let d = Deployment::new();
    let overlay = d.path().join("elsewhere/overlay");
    let out = d
        .command(&["init"])
        .env("PI_GLOBAL_PI_DIR", &overlay)
        .env("PI_TRIGGERS_FILE", "conf/triggers.json")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(overlay.is_dir());
    assert!(d.path().join("conf/triggers.json").is_file());
}
