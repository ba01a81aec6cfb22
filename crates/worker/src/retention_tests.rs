//! Retention with a clock the test holds: exactly what the settings say goes, nothing a job may
//! still need, nothing outside the job's folder, on both stores.

use std::sync::Arc;

use protocol::job::Job;
use protocol::reason::Reason;

use super::*;

const NOW: u64 = 1_900_000_000_000;

fn keep() -> Keep {
    Keep {
        records_days: 365,
        transcripts_days: 30,
        failed_jobs_days: 3,
    }
}

fn record(id: &str, reason: Option<Reason>, days_ago: u64) -> Record {
    let outcome = reason.map_or(Outcome::Completed, Reason::outcome);
    Record::new(
        &Job::new(id, "cron", "local"),
        outcome,
        reason,
        1,
        NOW - days_ago * DAY_MS,
    )
}

/// A job's folder as a forge job leaves it: its transcript, a clone with a folder the job closed,
/// its `/job`, and a link out of the folder.
fn folder(jobs: &Path, id: &str, outside: &Path) -> PathBuf {
    let f = jobs.join(id);
    std::fs::create_dir_all(f.join("origin.git/objects")).unwrap();
    std::fs::create_dir_all(f.join("workspace/closed")).unwrap();
    std::fs::create_dir_all(f.join("job")).unwrap();
    std::fs::write(f.join("transcript.jsonl"), "{}\n").unwrap();
    std::fs::write(f.join("origin.git/objects/pack"), vec![1u8; 64 << 10]).unwrap();
    std::fs::write(f.join("workspace/closed/secret"), "x").unwrap();
    std::fs::set_permissions(
        f.join("workspace/closed"),
        std::fs::Permissions::from_mode(0o000),
    )
    .unwrap();
    std::fs::write(f.join("job/prompt.md"), "task").unwrap();
    std::os::unix::fs::symlink(outside, f.join("workspace/out")).unwrap();
    f
}

fn names(dir: &Path) -> Vec<String> {
    let mut n: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    n.sort();
    n
}

#[test]
fn the_settings_decide_what_becomes_of_a_jobs_folder() {
    let k = keep();
    assert_eq!(tidy(None, &k, NOW), Tidy::Keep);
    assert_eq!(
        tidy(Some(&record("a", None, 0)), &k, NOW),
        Tidy::AllButTranscript
    );
    assert_eq!(tidy(Some(&record("a", None, 30)), &k, NOW), Tidy::All);
    let failed = record("f", Some(Reason::TimeLimit), 2);
    assert_eq!(tidy(Some(&failed), &k, NOW), Tidy::Keep);
    assert_eq!(
        tidy(Some(&failed), &k, NOW + DAY_MS),
        Tidy::AllButTranscript
    );
    let not_kept = Keep {
        failed_jobs_days: 0,
        ..k
    };
    assert_eq!(tidy(Some(&failed), &not_kept, NOW), Tidy::AllButTranscript);
}

/// The stores a pass runs on: SQLite, and a real Redis.
/// A store of records and its queue, with what keeps them (a Redis server, a folder).
type Store = (
    Records,
    Arc<dyn queue::Queue>,
    Option<testkit::redis::RedisServer>,
    tempfile::TempDir,
);

fn stores() -> Vec<Store> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("queue.sqlite3");
    let sqlite = (
        Records::sqlite(&path).unwrap(),
        Arc::new(queue::SqliteQueue::open(&path).unwrap()) as Arc<dyn queue::Queue>,
        None,
        dir,
    );
    let server = testkit::redis::RedisServer::start();
    let target = queue::RedisTarget {
        url: server.url(),
        password: None,
    };
    let redis = Arc::new(queue::RedisQueue::open(&target).unwrap());
    let redis = (
        Records::redis(redis.clone()),
        redis as Arc<dyn queue::Queue>,
        Some(server),
        tempfile::tempdir().unwrap(),
    );
    vec![sqlite, redis]
}

#[test]
fn a_pass_removes_exactly_what_the_settings_say_on_either_store() {
    for (records, queue, _server, state) in stores() {
        let jobs = state.path().join("jobs");
        let outside = state.path().join("outside");
        std::fs::write(&outside, "not the job's").unwrap();
        let r = Retention {
            keep: keep(),
            jobs_dir: jobs.clone(),
        };
        for (id, reason, days) in [
            ("done-old", None, 40),
            ("done-new", None, 1),
            ("failed-new", Some(Reason::TimeLimit), 1),
            ("failed-old", Some(Reason::TimeLimit), 5),
            ("ancient", None, 400),
        ] {
            records.write(&record(id, reason, days)).unwrap();
            folder(&jobs, id, &outside);
        }
        // A job still running: a folder and no record.
        folder(&jobs, "running", &outside);
        // The queue's entries of a job done 400 days ago and of one done yesterday.
        let at = |days: u64| {
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(NOW - days * DAY_MS)
        };
        for (id, days) in [("ancient", 400), ("done-new", 1)] {
            queue.enqueue(id, "{}", at(days)).unwrap();
            let lease = queue
                .lease("w", std::time::Duration::from_secs(60), at(days))
                .unwrap()
                .unwrap();
            assert!(queue.finish(&lease, at(days)).unwrap());
        }
        let dry = r
            .pass(&records, &*queue, NOW, Budget::default(), true)
            .unwrap();
        assert_eq!(
            (dry.records, dry.transcripts, dry.folders),
            (1, 2, 4),
            "{dry:?}"
        );
        assert_eq!(names(&jobs).len(), 6, "a dry pass removed something");
        let done = r
            .pass(&records, &*queue, NOW, Budget::default(), false)
            .unwrap();
        assert_eq!(
            (done.records, done.transcripts, done.folders),
            (1, 2, 4),
            "{done:?} {:?}",
            names(&jobs)
        );
        assert!(
            done.failed.is_empty() && done.mounted.is_empty(),
            "{done:?}"
        );
        assert_eq!(done.done_jobs, 1, "{done:?}");
        assert_eq!(queue.status(at(0), 10).unwrap().counts.done, 1);
        assert_eq!(
            names(&jobs),
            ["done-new", "failed-new", "failed-old", "running"]
        );
        assert_eq!(names(&jobs.join("done-new")), ["transcript.jsonl"]);
        assert_eq!(names(&jobs.join("failed-old")), ["transcript.jsonl"]);
        assert_eq!(
            names(&jobs.join("failed-new")).len(),
            4,
            "a failed job is kept 3 days"
        );
        assert_eq!(
            names(&jobs.join("running")).len(),
            4,
            "a running job's folder was touched"
        );
        assert!(matches!(
            records.read("ancient"),
            Err(RecordError::NotFound)
        ));
        assert!(records.read("done-old").is_ok());
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "not the job's");
        // Nothing left to do at the same time; two days on, the failed job's folder goes too.
        assert!(
            r.pass(&records, &*queue, NOW, Budget::default(), false)
                .unwrap()
                .is_empty()
        );
        let later = r
            .pass(
                &records,
                &*queue,
                NOW + 2 * DAY_MS,
                Budget::default(),
                false,
            )
            .unwrap();
        assert_eq!(later.folders, 1, "{later:?}");
        assert_eq!(names(&jobs.join("failed-new")), ["transcript.jsonl"]);
    }
}

#[test]
fn a_pass_does_no_more_than_its_budget() {
    let (records, queue, _server, state) = stores().remove(0);
    let jobs = state.path().join("jobs");
    for i in 0..5 {
        let id = format!("old-{i}");
        records.write(&record(&id, None, 400)).unwrap();
        std::fs::create_dir_all(jobs.join(&id)).unwrap();
        std::fs::write(jobs.join(&id).join("transcript.jsonl"), "{}").unwrap();
    }
    let r = Retention {
        keep: keep(),
        jobs_dir: jobs.clone(),
    };
    let small = Budget {
        records: 2,
        folders: 3,
    };
    // The folders first; the records wait for a pass that got through every folder.
    let first = r.pass(&records, &*queue, NOW, small, false).unwrap();
    assert_eq!((first.records, first.folders), (0, 3));
    let second = r.pass(&records, &*queue, NOW, small, false).unwrap();
    assert_eq!((second.records, second.folders), (2, 2));
    let third = r.pass(&records, &*queue, NOW, small, false).unwrap();
    assert_eq!((third.records, third.folders), (2, 0));
    assert_eq!(records.count().unwrap(), 1);
    assert_eq!(names(&jobs), Vec::<String>::new());
}

/// A folder with a mount in it that a live worker holds is left whole, even a bind mount of the
/// same file system (whose device is the folder's own); once no worker holds it (its worker was
/// killed), the mount is detached first and the folder goes, and what was mounted is untouched.
#[test]
fn a_folder_with_a_mount_in_it_is_never_entered() {
    let (records, queue, _server, state) = stores().remove(0);
    let jobs = state.path().join("jobs");
    let elsewhere = state.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("precious"), "keep me").unwrap();
    records.write(&record("viewed", None, 40)).unwrap();
    std::fs::create_dir_all(jobs.join("viewed/view")).unwrap();
    let bind = |args: &[&str]| {
        let ok = std::process::Command::new(args[0])
            .args(&args[1..])
            .status()
            .unwrap();
        assert!(ok.success(), "{args:?}");
    };
    let view = jobs.join("viewed/view");
    bind(&[
        "mount",
        "--bind",
        elsewhere.to_str().unwrap(),
        view.to_str().unwrap(),
    ]);
    let r = Retention {
        keep: keep(),
        jobs_dir: jobs.clone(),
    };
    let held = sandbox::identity::lock_job_folder(&jobs.join("viewed"), 1).unwrap();
    let pass = r.pass(&records, &*queue, NOW, Budget::default(), false);
    let still = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .contains(view.to_str().unwrap());
    let pass = pass.unwrap();
    assert!(still, "a live worker's mount was taken");
    assert_eq!(pass.mounted, [jobs.join("viewed")]);
    drop(held);
    assert_eq!(
        std::fs::read_to_string(elsewhere.join("precious")).unwrap(),
        "keep me"
    );
    let control = r
        .pass(&records, &*queue, NOW, Budget::default(), false)
        .unwrap();
    assert_eq!(control.folders, 1, "{control:?}");
    assert!(!jobs.join("viewed").exists());
    assert_eq!(
        std::fs::read_to_string(elsewhere.join("precious")).unwrap(),
        "keep me"
    );
}

#[test]
fn a_settled_jobs_folder_keeps_only_its_transcript() {
    let state = tempfile::tempdir().unwrap();
    let jobs = state.path().join("jobs");
    let outside = state.path().join("outside");
    std::fs::write(&outside, "x").unwrap();
    let r = Retention {
        keep: keep(),
        jobs_dir: jobs.clone(),
    };
    folder(&jobs, "fix-1", &outside);
    let pruned = r.after_job(&record("fix-1", None, 0), NOW);
    assert_eq!(pruned.folders, 1, "{pruned:?}");
    assert!(pruned.bytes >= 64 << 10, "{pruned:?}");
    assert_eq!(names(&jobs.join("fix-1")), ["transcript.jsonl"]);
    // A job that did not complete is kept for a look, as the settings ask.
    folder(&jobs, "fix-2", &outside);
    r.after_job(&record("fix-2", Some(Reason::TimeLimit), 0), NOW);
    assert_eq!(names(&jobs.join("fix-2")).len(), 4);
    assert!(outside.exists());
}
