#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The forge client against the fake forge on loopback: the App's JWT mints the token, comments
//! are posted once, the clone and the push go over git's smart HTTP with the token in a header,
//! and a pull request is opened and never merged.

use std::sync::Arc;

use forge::git::{self, Author};
use forge::{AppKey, Forges, GithubApp, GitlabDeployment, Posted, Secret};
use protocol::forge_event::{Forge, ForgeEvent};
use testkit::fake_forge::{FakeForge, FakeForgeSetup, app_key_pem};

const INSTALLATION_TOKEN: &str = "ghs_CANARY-installation-token-51d0";
const GITLAB_TOKEN: &str = "glpat-CANARY-deployment-token-8e2b";

fn event(forge: Forge) -> ForgeEvent {
    ForgeEvent {
        forge,
        delivery: "d-1".into(),
        action: "labeled".into(),
        repository: match forge {
            Forge::Github => "octo-org/hello".into(),
            Forge::Gitlab => "group/hello".into(),
        },
        repository_id: 15,
        installation: Some(987),
        default_branch: "main".into(),
        number: 42,
        pull_request: false,
        title: "Fix the port".into(),
        body: "It says 8080.".into(),
        labels: vec!["docs".into()],
        added_labels: vec!["docs".into()],
        comment: None,
        head: None,
        sender: "maintainer".into(),
    }
}

fn setup() -> (FakeForge, Forges) {
    let key = AppKey::from_pem(&app_key_pem()).unwrap();
    let fake = FakeForge::start(FakeForgeSetup {
        app_id: 4242,
        app_public_key: key.public_der(),
        installation_token: INSTALLATION_TOKEN.into(),
        gitlab_token: GITLAB_TOKEN.into(),
    });
    let forges = Forges::new(
        Some(GithubApp {
            api_url: fake.github_api_url(),
            git_url: fake.github_git_url(),
            app_id: 4242,
            key: Arc::new(key),
        }),
        Some(GitlabDeployment {
            url: fake.gitlab_url(),
            api_url: format!("{}/api/v4", fake.gitlab_url()),
            token: Secret::new(GITLAB_TOKEN),
        }),
    );
    (fake, forges)
}

#[tokio::test]
async fn the_app_key_mints_the_token_and_another_key_does_not() {
    let (fake, forges) = setup();
    let e = event(Forge::Github);
    let token = forges.mint(&e, forge::Scope::Job).await.unwrap();
    // Each mint is a token of its own, asked for with the permissions of its scope.
    assert_eq!(token.expose(), format!("{INSTALLATION_TOKEN}-1"));
    assert_eq!(
        fake.minted()[0].permissions,
        Some(forge::Scope::Job.github_permissions())
    );
    assert_eq!(format!("{token:?}"), "Secret(***)");
    // The request narrows the token to the event's repository.
    let mint = &fake.requests()[0];
    assert_eq!(mint.body["repository_ids"], serde_json::json!([15]));
    assert!(mint.path.ends_with("/app/installations/987/access_tokens"));
    // Another App's key is refused, and the error says no more than the status.
    let mut other = forges.clone();
    other.github.as_mut().unwrap().key = Arc::new(AppKey::from_pem(&app_key_pem()).unwrap());
    let err = other.mint(&e, forge::Scope::Job).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "mint the job's installation token: the forge answered HTTP 401"
    );
    assert!(!err.may_pass());
    // A key file that is not one.
    assert!(
        AppKey::from_pem("-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----")
            .is_err()
    );
    assert!(AppKey::from_pem("hello").is_err());
}

/// A token minted for a job is revoked, and then opens nothing; a comment the forge answers with
/// 502 twice is posted once, on the third try, each try's token revoked after it.
#[tokio::test]
async fn tokens_are_revoked_and_a_comment_is_tried_again_until_it_is_taken() {
    let (fake, forges) = setup();
    let e = event(Forge::Github);
    let token = forges.mint(&e, forge::Scope::Job).await.unwrap();
    // The control: the token opens the comments until it is revoked.
    let path = "github:octo-org/hello#42";
    assert_eq!(
        forges
            .comment_once(&token, &e, "job-0", "Before.")
            .await
            .unwrap(),
        Posted::Posted
    );
    forges.revoke(&e, &token).await.unwrap();
    let refused = forges.comment_once(&token, &e, "job-1", "After.").await;
    assert!(
        matches!(refused, Err(forge::ForgeError::Status { status: 401, .. })),
        "{refused:?}"
    );
    // Revoking again (or an expired token) is no fault.
    forges.revoke(&e, &token).await.unwrap();
    // GitLab's token is the deployment's: nothing to revoke.
    forges
        .revoke(&event(Forge::Gitlab), &Secret::new(GITLAB_TOKEN))
        .await
        .unwrap();

    fake.fail_comment_posts(&[502, 502]);
    let waits = [std::time::Duration::from_millis(20); 3];
    let posted = forges
        .post_comment(&e, "job-2", "The answer.", &waits)
        .await
        .unwrap();
    assert_eq!(posted, Posted::Posted);
    let comments = fake.comments(path);
    assert_eq!(
        comments
            .iter()
            .filter(|c| c.starts_with("The answer."))
            .count(),
        1,
        "{comments:#?}"
    );
    // One token a try (the first one above, then three), every one revoked.
    let minted = fake.minted();
    assert_eq!(minted.len(), 4, "{minted:#?}");
    assert!(minted.iter().all(|m| m.revocations >= 1), "{minted:#?}");
    // Past its tries, a forge that keeps failing is an error, and the comment is not posted.
    fake.fail_comment_posts(&[503, 503, 503]);
    let given_up = forges
        .post_comment(&e, "job-3", "Never.", &waits[..2])
        .await;
    assert!(
        matches!(given_up, Err(forge::ForgeError::Status { status: 503, .. })),
        "{given_up:?}"
    );
    assert!(!fake.comments(path).iter().any(|c| c.starts_with("Never.")));
}

#[tokio::test]
async fn a_comment_is_posted_once_whatever_the_attempts() {
    let (fake, forges) = setup();
    for forge in [Forge::Github, Forge::Gitlab] {
        let e = event(forge);
        let token = forges.mint(&e, forge::Scope::Job).await.unwrap();
        let first = forges
            .comment_once(&token, &e, "gh-d-1-t0", "The answer.")
            .await
            .unwrap();
        let again = forges
            .comment_once(&token, &e, "gh-d-1-t0", "The answer.")
            .await
            .unwrap();
        assert_eq!((first, again), (Posted::Posted, Posted::AlreadyThere));
        let key = match forge {
            Forge::Github => "github:octo-org/hello#42",
            Forge::Gitlab => "gitlab:15#42",
        };
        let comments = fake.comments(key);
        assert_eq!(comments.len(), 1, "{forge}");
        assert!(comments[0].starts_with("The answer."));
        assert!(protocol::forge_event::is_worker_comment(&comments[0]));
        // Another job's comment is another.
        forges
            .comment_once(&token, &e, "gh-d-2-t0", "Another.")
            .await
            .unwrap();
        assert_eq!(fake.comments(key).len(), 2);
    }
}

#[tokio::test]
async fn a_clone_and_a_push_carry_the_token_only_in_a_header_and_nothing_is_merged() {
    let (fake, forges) = setup();
    for forge in [Forge::Github, Forge::Gitlab] {
        let e = event(forge);
        let name = forge.as_str();
        fake.add_repo(
            name,
            &e.repository,
            &[("README.md", "port 8080\n"), ("src/lib.rs", "// lib\n")],
        );
        // One token clones and pushes here: the delivery's, which may write the repository.
        let token = forges.mint(&e, forge::Scope::Delivery).await.unwrap();
        let url = forges.clone_url(&e).unwrap();
        assert!(!url.contains(token.expose()));
        let auth = Forges::git_authorization(&e, &token);
        let dir = tempfile::tempdir().unwrap();
        let me = (
            rustix::process::getuid().as_raw(),
            rustix::process::getgid().as_raw(),
        );
        let checkout = git::clone(dir.path(), &url, "main", &auth, "pi-dispatch/job-1", me)
            .await
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(checkout.workspace.join("README.md")).unwrap(),
            "port 8080\n"
        );
        // No file of either repository holds the token.
        for root in [
            &checkout.workspace,
            &checkout.origin,
            &dir.path().to_owned(),
        ] {
            assert_no_token(root, token.expose());
        }
        // Nothing changed: nothing is pushed.
        let needles = forge::scan::Needles::new([("GH_TOKEN", token.expose())]);
        let author = Author {
            name: "pi-dispatch".into(),
            email: "pi-dispatch@example.invalid".into(),
        };
        let limits = limits();
        let bounds = git::Bounds {
            limits: &limits,
            needles: &needles,
        };
        let publish = || {
            git::publish(
                &checkout,
                &url,
                &auth,
                "pi-dispatch/job-1",
                "Fix",
                &author,
                bounds,
            )
        };
        assert_eq!(publish().await.unwrap(), None);
        // The job's token planted in a changed file, as it is or encoded: nothing is pushed, and
        // the refusal names the file and the variable, never the value.
        {
            use base64::Engine as _;
            let value = token.expose();
            let planted = [
                ("as it is", value.to_owned()),
                (
                    "base64",
                    base64::engine::general_purpose::STANDARD.encode(format!("token: {value}")),
                ),
                (
                    "URL-encoded",
                    value.bytes().map(|b| format!("%{b:02X}")).collect(),
                ),
            ];
            std::fs::write(checkout.workspace.join("README.md"), "port 8780\n").unwrap();
            for (form, text) in planted {
                std::fs::write(
                    checkout.workspace.join("notes.txt"),
                    format!("see {text}\n"),
                )
                .unwrap();
                let refused = publish().await.unwrap_err();
                let shown = refused.to_string();
                assert!(
                    matches!(
                        &refused,
                        git::GitError::Tree(forge::tree::TreeError::Secret { form: f, .. }) if *f == form
                    ),
                    "{form}: {shown}"
                );
                assert!(
                    shown.contains("notes.txt") && shown.contains("GH_TOKEN"),
                    "{shown}"
                );
                assert!(!shown.contains(value));
                assert!(
                    !fake
                        .branches(name, &e.repository)
                        .contains(&"pi-dispatch/job-1".to_owned()),
                    "pushed with the token in it"
                );
            }
            std::fs::remove_file(checkout.workspace.join("notes.txt")).unwrap();
        }
        // The job changes a file and adds one; its own .git is not what is pushed.
        std::fs::write(checkout.workspace.join("README.md"), "port 8780\n").unwrap();
        std::fs::write(checkout.workspace.join("NEW.md"), "new\n").unwrap();
        std::fs::write(
            checkout.workspace.join(".git/config"),
            "[url \"http://evil.invalid/\"]\n\tinsteadOf = http://\n",
        )
        .unwrap();
        let commit = git::publish(
            &checkout,
            &url,
            &auth,
            "pi-dispatch/job-1",
            "Fix the port",
            &author,
            bounds,
        )
        .await
        .unwrap();
        assert!(commit.is_some());
        assert_eq!(
            fake.file_on(name, &e.repository, "pi-dispatch/job-1", "README.md")
                .as_deref(),
            Some("port 8780\n")
        );
        assert_eq!(
            fake.file_on(name, &e.repository, "pi-dispatch/job-1", "NEW.md")
                .as_deref(),
            Some("new\n")
        );
        assert_eq!(
            fake.file_on(name, &e.repository, "main", "README.md")
                .as_deref(),
            Some("port 8080\n")
        );
        let pr = forges
            .open_change_request(
                &token,
                &e,
                "pi-dispatch/job-1",
                "main",
                "Fix the port",
                "Closes #42",
            )
            .await
            .unwrap();
        let again = forges
            .open_change_request(
                &token,
                &e,
                "pi-dispatch/job-1",
                "main",
                "Fix the port",
                "Closes #42",
            )
            .await
            .unwrap();
        assert_eq!(pr, again);
        // A comment on that pull request: its head is read from the forge.
        let number = pr.rsplit('/').next().unwrap().parse().unwrap();
        let on_pr = ForgeEvent {
            number,
            pull_request: true,
            ..e.clone()
        };
        let head = forges.pull_request_head(&token, &on_pr).await.unwrap();
        assert_eq!(head.branch, "pi-dispatch/job-1");
        assert!(head.same_repository, "{forge}");
        assert_no_token(dir.path(), token.expose());
    }
    assert_eq!(fake.pulls().len(), 2);
    assert_eq!(fake.merges(), 0);
}

#[tokio::test]
async fn a_wrong_token_cannot_clone() {
    let (fake, forges) = setup();
    let e = event(Forge::Github);
    fake.add_repo("github", &e.repository, &[("README.md", "x\n")]);
    let dir = tempfile::tempdir().unwrap();
    let url = forges.clone_url(&e).unwrap();
    let wrong = Forges::git_authorization(&e, &Secret::new("wrong"));
    let err = git::clone(dir.path(), &url, "main", &wrong, "b", (0, 0))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("fetch the repository"), "{err}");
}

fn limits() -> forge::tree::Limits {
    forge::tree::Limits {
        file_bytes: 1 << 20,
        total_bytes: 8 << 20,
        entries: 10_000,
        time: std::time::Duration::from_secs(60),
    }
}

/// A job's tree is published as data: a filter its `.git/config` and `.gitattributes` name never
/// runs, and a gitfile whose `HEAD` is a FIFO, a gitfile naming a repository elsewhere and a
/// sparse terabyte are refused at once, naming the path; links, executables and files with odd
/// names are published as git would.
#[tokio::test]
async fn a_hostile_tree_is_read_as_data_and_refused_without_waiting() {
    let (fake, forges) = setup();
    let e = event(Forge::Github);
    fake.add_repo("github", &e.repository, &[("README.md", "port 8080\n")]);
    let token = forges.mint(&e, forge::Scope::Delivery).await.unwrap();
    let url = forges.clone_url(&e).unwrap();
    let auth = Forges::git_authorization(&e, &token);
    let dir = tempfile::tempdir().unwrap();
    let me = (
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw(),
    );
    let checkout = git::clone(dir.path(), &url, "main", &auth, "pi-dispatch/job-2", me)
        .await
        .unwrap();
    let ws = &checkout.workspace;
    let marker = dir.path().join("filter-ran");
    // The job configures a clean filter in its .git/config and names it in .gitattributes.
    let mut config = std::fs::read_to_string(ws.join(".git/config")).unwrap();
    config.push_str(&format!(
        "[filter \"x\"]\n\tclean = touch {}\n[core]\n\tfsmonitor = touch {}\n",
        marker.display(),
        marker.display()
    ));
    std::fs::write(ws.join(".git/config"), config).unwrap();
    std::fs::write(ws.join(".gitattributes"), "* filter=x\n").unwrap();
    std::fs::write(ws.join("README.md"), "port 8780\n").unwrap();
    std::fs::write(ws.join("odd \"name\"\n.txt"), "odd\n").unwrap();
    std::fs::write(ws.join("run.sh"), "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(
        ws.join("run.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::os::unix::fs::symlink("README.md", ws.join("docs")).unwrap();
    let author = Author {
        name: "pi-dispatch".into(),
        email: "pi-dispatch@example.invalid".into(),
    };
    let limits = limits();
    let none = forge::scan::Needles::new([]);
    let publish = || {
        git::publish(
            &checkout,
            &url,
            &auth,
            "pi-dispatch/job-2",
            "Fix",
            &author,
            git::Bounds {
                limits: &limits,
                needles: &none,
            },
        )
    };
    // The control: this tree is published, as git would have committed it.
    assert!(publish().await.unwrap().is_some());
    let on = |path: &str| fake.file_on("github", &e.repository, "pi-dispatch/job-2", path);
    assert_eq!(on("README.md").as_deref(), Some("port 8780\n"));
    assert_eq!(on("odd \"name\"\n.txt").as_deref(), Some("odd\n"));
    assert_eq!(
        on("docs").as_deref(),
        Some("README.md"),
        "a link, as its target"
    );
    assert!(!marker.exists(), "the job's filter ran on the host");

    // A gitfile whose HEAD is a FIFO: refused at once, nothing read from it.
    std::fs::create_dir_all(ws.join("sub")).unwrap();
    std::fs::create_dir_all(ws.join("x")).unwrap();
    std::fs::write(ws.join("sub/.git"), "gitdir: ../x\n").unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        ws.join("x/HEAD"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let started = std::time::Instant::now();
    let err = tokio::time::timeout(std::time::Duration::from_secs(30), publish())
        .await
        .expect("publishing waited on the FIFO")
        .unwrap_err();
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert!(err.to_string().contains("sub/.git"), "{err}");
    // A gitfile naming a repository elsewhere on the host: refused the same way.
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::write(
        ws.join("sub/.git"),
        format!("gitdir: {}\n", elsewhere.path().display()),
    )
    .unwrap();
    assert!(matches!(
        publish().await.unwrap_err(),
        git::GitError::Tree(forge::tree::TreeError::Refused { .. })
    ));
    std::fs::remove_file(ws.join("sub/.git")).unwrap();
    // The FIFO itself is refused too.
    assert!(publish().await.unwrap_err().to_string().contains("x/HEAD"));
    std::fs::remove_file(ws.join("x/HEAD")).unwrap();
    // A sparse terabyte: refused by its size, before a byte of it is read.
    let huge = std::fs::File::create(ws.join("huge.bin")).unwrap();
    huge.set_len(1 << 40).unwrap();
    let started = std::time::Instant::now();
    let err = publish().await.unwrap_err();
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert!(
        matches!(
            &err,
            git::GitError::Tree(forge::tree::TreeError::TooLarge { path: Some(p), .. }) if p == "huge.bin"
        ),
        "{err}"
    );
    assert!(!marker.exists(), "the job's filter ran on the host");
}

fn assert_no_token(root: &std::path::Path, token: &str) {
    for entry in walk(root) {
        if let Ok(bytes) = std::fs::read(&entry) {
            assert!(
                !String::from_utf8_lossy(&bytes).contains(token),
                "{} holds the token",
                entry.display()
            );
        }
    }
}

fn walk(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(root) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() && !p.is_symlink() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
