//! What the bot posts and pushes is checked, in real forge jobs through the receiver and the worker
//! with real pi and the fake forge: a GitLab answer whose final message holds quick actions and a
//! mass mention is posted inert; an issue's escape sequences and bidirectional overrides reach the
//! prompt escaped, and a quick action after a lone CR is posted inert; a fix job that writes its own token into a file (as it is, in
//! base64, percent-encoded) pushes nothing, ends `job-output-secret` and gets the fixed comment,
//! which names no value. The control: the token is really in the file the job left in its clone.

use serde_json::json;
use testkit::fake_forge::FakeForge;
use testkit::fake_model::Step;

use crate::forge::{INSTALLATION_TOKEN, Kind, Site, triggers};

/// Each way the job writes its token, and the file it leaves.
const PLANTS: [(&str, &str); 3] = [
    (
        "printf 'token=%s\\n' \"$GH_TOKEN\" > notes.txt",
        "notes.txt",
    ),
    (
        "printf 'token: %s' \"$GH_TOKEN\" | base64 -w0 > notes.b64",
        "notes.b64",
    ),
    (
        "printf %s \"$GH_TOKEN\" | od -An -tx1 | tr -d ' \\n' | sed 's/../%&/g' > notes.url",
        "notes.url",
    ),
];

#[test]
fn a_fix_job_that_writes_its_token_pushes_nothing() {
    let script = PLANTS
        .iter()
        .flat_map(|(plant, _)| {
            [
                Step::call("bash", json!({ "command": plant })),
                Step::text("Fixed it."),
            ]
        })
        .collect();
    let site = Site::start(FakeForge::start_in, script, triggers(), &[]);
    // The refused jobs' folders are kept for a look, as an operator who reads them would ask.
    let env = std::fs::read_to_string(site.s.d.path().join(".env")).unwrap();
    site.s
        .d
        .write(".env", &format!("{env}PI_KEEP_FAILED_JOBS_DAYS=1\n"));
    for (n, (_, file)) in PLANTS.iter().enumerate() {
        let number = 40 + n as u64;
        let a = site.label(Kind::Github, number, "pi-fix", &format!("d-plant-{number}"));
        assert_eq!(a["status"], 202, "{a}");
        let id = a["answer"]["jobs"][0].as_str().unwrap().to_owned();
        let worked = site.work();
        // The control: the job left its token in the file, in its form.
        let left = std::fs::read_to_string(
            site.s
                .d
                .path()
                .join(format!("state/jobs/{id}/workspace/{file}")),
        )
        .unwrap_or_else(|e| panic!("{file}: {e}\n{}", worked.stderr));
        assert!(!left.is_empty(), "{file}");
        assert!(
            (*file == "notes.txt") == left.contains(INSTALLATION_TOKEN),
            "{file}: {left}"
        );
        let record = site.s.record(&id);
        assert_eq!(record["outcome"], "policy", "{record:#}\n{}", worked.stderr);
        assert_eq!(record["reason"], "job-output-secret", "{record:#}");
        let why = record["detail"]["why"].as_str().unwrap_or_default();
        assert!(why.contains(file) && why.contains("GH_TOKEN"), "{why}");
        let comments = site.fake.comments(&Kind::Github.issue_key(number));
        assert_eq!(comments.len(), 1, "{comments:#?}");
        assert!(
            comments[0].contains("rule job-output-secret"),
            "{comments:#?}"
        );
        for text in [
            record.to_string(),
            comments[0].clone(),
            worked.stderr.clone(),
        ] {
            assert!(
                !text.contains(INSTALLATION_TOKEN),
                "the token is out: {text}"
            );
        }
        assert!(
            !site
                .fake
                .branches("github", Kind::Github.repository())
                .contains(&format!("pi-dispatch/{id}")),
            "{file}: pushed"
        );
    }
    assert_eq!(site.fake.pulls().len(), 0, "nothing is proposed");
}

#[test]
fn what_the_bot_posts_runs_no_quick_action() {
    let answer = "The port is 8780.\n/label ~pi-fix\n/merge\n  /approve\ncc @all";
    let site = Site::start(
        FakeForge::start_in,
        vec![Step::text(answer)],
        triggers(),
        &[],
    );
    let a = site.label(Kind::Gitlab, 50, "pi-answer", "d-quick-50");
    assert_eq!(a["status"], 202, "{a}");
    let id = a["answer"]["jobs"][0].as_str().unwrap().to_owned();
    site.work();
    let record = site.s.record(&id);
    assert_eq!(record["outcome"], "completed", "{record:#}");
    // The control: the model's answer held the commands.
    assert_eq!(record["finalMessage"], answer, "{record:#}");
    let comments = site.fake.comments(&Kind::Gitlab.issue_key(50));
    assert_eq!(comments.len(), 1, "{comments:#?}");
    let posted = &comments[0];
    assert!(
        posted.lines().all(|l| !l.trim_start().starts_with('/')),
        "{posted}"
    );
    // It still reads as written: a backslash before each command, a space no one sees.
    assert!(
        posted.starts_with(
            "The port is 8780.\n\\/label ~pi-fix\n\\/merge\n  \\/approve\ncc @\u{200B}all"
        ),
        "{posted:?}"
    );
}

/// The forge's tokens live 3 seconds and the fix job takes longer: its own token has run out when
/// it is delivered, and the delivery, with a token minted for it, still pushes and proposes. Every
/// token minted for the job (its own, the delivery's, the comment's) is revoked by the end. The
/// forge then answers the comment's first two posts with 502: it is posted once, on the third try.
#[test]
fn a_fix_job_outliving_its_token_is_delivered_and_every_token_is_revoked() {
    let script = vec![
        Step::call(
            "bash",
            json!({"command": "sleep 4; echo 'The service listens on port 8780.' > README.md"}),
        ),
        Step::text("Fixed the port."),
    ];
    let site = Site::start(FakeForge::start_in, script, triggers(), &[]);
    site.fake
        .set_token_lifetime(std::time::Duration::from_secs(3));
    site.fake.fail_comment_posts(&[502, 502]);
    let a = site.label(Kind::Github, 60, "pi-fix", "d-long-60");
    assert_eq!(a["status"], 202, "{a}");
    let id = a["answer"]["jobs"][0].as_str().unwrap().to_owned();
    let worked = site.work();
    let record = site.s.record(&id);
    assert_eq!(
        record["outcome"], "completed",
        "{record:#}\n{}",
        worked.stderr
    );
    assert!(record["pullRequest"].is_string(), "{record:#}");
    let minted = site.fake.minted();
    // The job's token, the delivery's, and one for each of the comment's three tries.
    assert_eq!(minted.len(), 5, "{minted:#?}");
    // The control: the job's own token had run out before the delivery's was minted.
    assert!(minted[0].expires < minted[1].expires - std::time::Duration::from_secs(3));
    assert!(
        minted.iter().all(|m| m.revocations >= 1),
        "a token was left alive: {minted:#?}"
    );
    let comments = site.fake.comments(&Kind::Github.issue_key(60));
    assert_eq!(comments.len(), 1, "{comments:#?}");
    assert!(comments[0].contains("proposed a change"), "{comments:#?}");
    assert_eq!(
        worked.stderr.matches("forge_comment_retry").count(),
        2,
        "{}",
        worked.stderr
    );
}

/// A hijacked fix job leaves its clone as hard to clear as it can: a link to a file of the host,
/// a link to a folder of the host, a folder and a file closed to everyone, a FIFO, and a deep
/// nest. Once the job is settled its folder holds its transcript and nothing else, and what the
/// links named is untouched. The control: the job's own listing (in its transcript) shows every
/// plant was made.
#[test]
fn a_hostile_clone_is_cleared_without_following_or_stopping_on_what_it_planted() {
    let site_probe = tempfile::tempdir().unwrap();
    let canary_file = site_probe.path().join("host-file");
    let canary_dir = site_probe.path().join("host-folder");
    std::fs::write(&canary_file, "the host's\n").unwrap();
    std::fs::create_dir(&canary_dir).unwrap();
    std::fs::write(canary_dir.join("inside"), "the host's too\n").unwrap();
    let plant = format!(
        "ln -s {file} link-to-file; ln -s {dir} link-to-folder; mkdir -p closed/sub; \
         echo x > closed/sub/f; chmod 000 closed/sub/f closed/sub closed; mkfifo pipe; \
         mkdir -p $(printf 'n/%.0s' $(seq 1 200)); ls -la; echo PLANTED-ALL",
        file = canary_file.display(),
        dir = canary_dir.display()
    );
    let script = vec![
        Step::call("bash", json!({ "command": plant })),
        Step::text("Fixed it."),
    ];
    let site = Site::start(FakeForge::start_in, script, triggers(), &[]);
    let a = site.label(Kind::Github, 60, "pi-fix", "d-clear-60");
    assert_eq!(a["status"], 202, "{a}");
    let id = a["answer"]["jobs"][0].as_str().unwrap().to_owned();
    let worked = site.work();
    let folder = site.s.d.path().join("state/jobs").join(&id);
    // The control: every plant was made in the job's clone.
    let transcript = std::fs::read_to_string(folder.join("transcript.jsonl"))
        .unwrap_or_else(|e| panic!("no transcript: {e}\n{}", worked.stderr));
    for made in [
        "PLANTED-ALL",
        "link-to-file ->",
        "link-to-folder ->",
        "closed",
        "pipe",
    ] {
        assert!(transcript.contains(made), "{made}: {}", worked.stderr);
    }
    let left: Vec<String> = std::fs::read_dir(&folder)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["transcript.jsonl"], "{}", worked.stderr);
    assert!(
        worked.stderr.contains("job_folder_tidied"),
        "{}",
        worked.stderr
    );
    assert!(
        !worked.stderr.contains("job_folder_not_tidied"),
        "{}",
        worked.stderr
    );
    assert_eq!(
        std::fs::read_to_string(&canary_file).unwrap(),
        "the host's\n"
    );
    assert_eq!(
        std::fs::read_to_string(canary_dir.join("inside")).unwrap(),
        "the host's too\n"
    );
}

#[test]
fn what_a_stranger_wrote_reaches_the_prompt_escaped_and_a_cr_hides_no_command() {
    // The answer's /close comes after a lone CR: a line end on the forge's page.
    let site = Site::start(
        FakeForge::start_in,
        vec![Step::text("Done.\r/close\r\n/label ~pi-fix")],
        triggers(),
        &[],
    );
    let text =
        "Hidden \u{1b}[8mgone\u{1b}[0m, reversed \u{202E}exe.txt\u{202C}, zero\u{200B}width.";
    let a = site.deliver(crate::forge::label_delivery_of(
        Kind::Github,
        31,
        "pi-answer",
        "d-inert-31",
        text,
    ));
    assert_eq!(a["status"], 202, "{a}");
    let id = a["answer"]["jobs"][0].as_str().unwrap().to_owned();
    let worked = site.work();
    let record = site.s.record(&id);
    assert_eq!(
        record["outcome"], "completed",
        "{record:#}\n{}",
        worked.stderr
    );
    // The prompt pi sent the model: the issue's text, with nothing invisible left in it.
    let prompt = site.s.model.requests()[0].body.to_string();
    assert!(
        prompt.contains("reversed"),
        "the control: the issue's text is there: {prompt}"
    );
    for raw in ['\u{1b}', '\u{202E}', '\u{202C}', '\u{200B}'] {
        assert!(
            !prompt.contains(raw),
            "{raw:?} reached the prompt: {prompt}"
        );
    }
    // (JSON writes a raw ESC as \u001b.)
    assert!(!prompt.contains("\\u001b"), "{prompt}");
    for shown in ["\\\\u{1b}[8m", "\\\\u{202e}", "\\\\u{202c}", "\\\\u{200b}"] {
        assert!(prompt.contains(shown), "{shown} not in {prompt}");
    }
    // The comment: every line that would start with a command shows it instead.
    let comments = site.fake.comments(&Kind::Github.issue_key(31));
    assert_eq!(comments.len(), 1, "{comments:#?}");
    let comment = &comments[0];
    assert!(
        comment.contains("\\/close") && comment.contains("\\/label"),
        "{comment:?}"
    );
    assert!(
        comment
            .split(['\r', '\n'])
            .all(|l| !l.trim_start().starts_with('/')),
        "{comment:?}"
    );
}
