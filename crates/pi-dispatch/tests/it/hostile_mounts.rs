//! A job's mount table names no path of the host: a hijacked job's tool reads
//! `/proc/self/mountinfo`, and finds neither the deployment's folder, nor the job's id, nor the
//! repository's path, in any mount's root, place or options. The control: the table it read has
//! the job's own folders in it.

use serde_json::json;
use testkit::fake_model::Step;

use crate::worker::{Service, stdio};

#[test]
fn a_jobs_mount_table_names_no_path_of_the_host() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: a root worker gives a job its folders as mounts of their own");
        return;
    }
    let s = Service::new(
        vec![
            Step::call(
                "bash",
                json!({"command": "cat /proc/self/mountinfo; echo listed"}),
            ),
            Step::text("Listed."),
        ],
        |_| json!({"everything": stdio(None)}),
        "",
    );
    let (id, _, results, _) = s.complete("List the mounts.", "everything");
    let table = results
        .iter()
        .find(|r| r.contains("listed"))
        .expect("the tool's output reached the model");
    // The control: the table is the job's, with its folders in their places.
    for place in [
        sandbox::bwrap::WORKSPACE,
        sandbox::bwrap::JOB_DIR,
        sandbox::bwrap::OVERLAY,
        sandbox::bwrap::IMAGE,
    ] {
        assert!(
            table.lines().any(|l| l.split(' ').nth(4) == Some(place)),
            "no mount at {place}:\n{table}"
        );
    }
    let deployment = s.d.path().to_string_lossy().into_owned();
    let repo = s.repo.to_string_lossy().into_owned();
    for line in table.lines() {
        for host in [deployment.as_str(), repo.as_str(), id.as_str()] {
            assert!(
                !line.contains(host),
                "{host} is in the job's mount table: {line}"
            );
        }
    }
}
