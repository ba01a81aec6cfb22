//! A deployment whose state lives on a small file system of its own (a tmpfs mounted for the test):
//! once it is nearly full the worker starts no job, says why, and loses nothing; with room again
//! the same job runs.

use std::path::{Path, PathBuf};

use testkit::fake_model::Step;

use crate::common::Run;
use crate::worker::{Service, stdio};

/// A tmpfs mounted at a folder for as long as it lives.
pub(crate) struct Mounted(PathBuf);

impl Mounted {
    pub(crate) fn tmpfs(at: &Path, mib: u64) -> Mounted {
        std::fs::create_dir_all(at).unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m,mode=0711")])
            .arg("tmpfs")
            .arg(at)
            .status()
            .unwrap();
        assert!(status.success(), "mount tmpfs at {}", at.display());
        Mounted(at.to_owned())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

fn free_mib(folder: &Path) -> u64 {
    config::files::free_bytes(folder).unwrap() >> 20
}

#[test]
fn a_nearly_full_state_disk_starts_no_job_and_loses_no_record() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: mounting the state's own file system takes root");
        return;
    }
    let s = Service::new(
        vec![Step::text("done"), Step::text("done again")],
        |_| serde_json::json!({"direct": stdio(None)}),
        "PI_DISK_WARN_MB=32\nPI_DISK_MIN_MB=24\n",
    );
    let state = s.d.path().join("state");
    let _mounted = Mounted::tmpfs(&state, 64);
    // The control: with room, a job runs and its record is written on that file system.
    let first = s.queue("Say done.", "direct");
    let worked = s.work();
    assert_eq!(
        s.record(&first)["outcome"],
        "completed",
        "{}",
        worked.stderr
    );
    // Nearly full: less than PI_DISK_MIN_MB left.
    let filler = state.join("filler");
    let fill = free_mib(&state).saturating_sub(16);
    std::fs::write(&filler, vec![1u8; usize::try_from(fill << 20).unwrap()]).unwrap();
    assert!(free_mib(&state) < 24, "{} MiB free", free_mib(&state));
    let doctor = s.cli(&["doctor", "--json"]);
    assert!(
        doctor.stdout.contains("\"disk.state\"") && doctor.stdout.contains("starts no job"),
        "{}",
        doctor.stdout
    );
    let second = s.queue("Say done again.", "direct");
    let refused = s.work();
    assert!(
        refused.stderr.contains("disk_nearly_full") && refused.stderr.contains("disk-nearly-full"),
        "{}",
        refused.stderr
    );
    let status = s.cli(&["status"]);
    assert!(status.stdout.contains(&second), "{}", status.stdout);
    assert!(
        s.d.record(&second).is_none(),
        "a record was written for a job that did not run"
    );
    // Nothing already recorded was lost.
    assert_eq!(s.record(&first)["outcome"], "completed");
    // Room again: the same job runs.
    std::fs::remove_file(&filler).unwrap();
    let worked: Run = s.work();
    assert_eq!(
        s.record(&second)["outcome"],
        "completed",
        "{}",
        worked.stderr
    );
}
