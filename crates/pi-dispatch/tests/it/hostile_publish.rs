//! A hijacked fix job against the worker's publishing, as real jobs through the receiver and the
//! worker with real pi and the fake forge: pi's bash tool leaves a nested repository whose gitfile
//! leads to a FIFO, one whose gitfile leads elsewhere on the host, and a sparse file of a
//! terabyte. Each job ends with its documented reason, naming what it left (the control: the probe
//! reached publishing), nothing is pushed, and the worker goes on at once.

use std::time::{Duration, Instant};

use serde_json::json;
use testkit::fake_forge::FakeForge;
use testkit::fake_model::Step;

use crate::forge::{Kind, Site, triggers};

/// What each job leaves, the reason its publishing ends with, and the path the record names.
const ATTACKS: [(&str, &str, &str); 3] = [
    (
        "mkdir -p x sub && mkfifo x/HEAD && printf 'gitdir: ../x\\n' > sub/.git && ls -la sub",
        "job-output-refused",
        "sub/.git",
    ),
    (
        "mkdir -p sub2 && printf 'gitdir: /root\\n' > sub2/.git && cat sub2/.git",
        "job-output-refused",
        "sub2/.git",
    ),
    (
        "truncate -s 1T huge.bin && ls -l huge.bin",
        "job-output-too-large",
        "huge.bin",
    ),
];

#[test]
fn what_a_fix_job_leaves_is_refused_without_holding_up_the_worker() {
    let script = ATTACKS
        .iter()
        .flat_map(|(attack, _, _)| {
            [
                Step::call("bash", json!({ "command": attack })),
                Step::text("Fixed it."),
            ]
        })
        .collect();
    let site = Site::start(FakeForge::start_in, script, triggers(), &[]);
    for (n, (_, reason, path)) in ATTACKS.iter().enumerate() {
        let number = 10 + n as u64;
        let a = site.label(
            Kind::Github,
            number,
            "pi-fix",
            &format!("d-hostile-{number}"),
        );
        assert_eq!(a["status"], 202, "{a}");
        let id = a["answer"]["jobs"][0].as_str().unwrap().to_owned();
        let started = Instant::now();
        let worked = site.work();
        // The worker recorded the job and was free for the next one well within the test's bound.
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{}",
            worked.stderr
        );
        let record = site.s.record(&id);
        assert_eq!(record["outcome"], "policy", "{record:#}\n{}", worked.stderr);
        assert_eq!(record["reason"], *reason, "{record:#}");
        let why = record["detail"]["why"].as_str().unwrap_or_default();
        assert!(why.contains(path), "{why}");
    }
    assert_eq!(site.fake.pulls().len(), 0, "nothing is proposed");
}
