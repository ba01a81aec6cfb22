//! The soak's plan, drawn from a seed so that a run can be repeated: which jobs meet a model that
//! hangs or resets, and which faults run beside the jobs, each once a share of the jobs is done.

use std::collections::BTreeMap;

/// What the model does for a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum JobKind {
    /// A tool call, then a final answer.
    Normal,
    /// Nothing: the first request is held open until the job's time limit ends it.
    Hang,
    /// Every request's connection is reset.
    Reset,
}

impl JobKind {
    /// The word in the job's task that tells the model (see `soak::reply`).
    pub fn marker(self) -> &'static str {
        match self {
            JobKind::Normal => "SOAK-NORMAL",
            JobKind::Hang => "SOAK-HANG",
            JobKind::Reset => "SOAK-RESET",
        }
    }
}

/// One fault of the schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL worker `worker` `after_ms` after it next starts a job; started again a second later.
    KillWorker { worker: usize, after_ms: u64 },
    /// SIGSTOP worker `worker` for `for_ms` (past its lease when longer than it), then SIGCONT.
    StopWorker { worker: usize, for_ms: u64 },
    /// Redis stopped, and started again `down_ms` later on the same data.
    RestartQueue { down_ms: u64 },
    /// The queue unanswering for `for_ms`: Redis SIGSTOPped, or the SQLite file locked by another
    /// connection.
    PauseQueue { for_ms: u64 },
    /// The state's file system filled below `PI_DISK_MIN_MB` for `for_ms`.
    FillDisk { for_ms: u64 },
    /// The egress proxy SIGKILLed.
    KillProxy,
}

impl Fault {
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::KillWorker { .. } => "kill-worker",
            Fault::StopWorker { .. } => "stop-worker",
            Fault::RestartQueue { .. } => "restart-queue",
            Fault::PauseQueue { .. } => "pause-queue",
            Fault::FillDisk { .. } => "fill-disk",
            Fault::KillProxy => "kill-proxy",
        }
    }
}

/// splitmix64: small, and the same sequence for the same seed everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `low..=high`.
    fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
    }
}

/// The whole plan of one soak.
pub struct Plan {
    pub seed: u64,
    /// Each job's kind, in the order they are queued.
    pub jobs: Vec<JobKind>,
    /// Each fault, with how many records must be written before it runs, in that order.
    pub faults: Vec<(usize, Fault)>,
}

/// How long a worker's lease is in the soak (`worker --lease`).
pub const LEASE_SECS: u64 = 5;

impl Plan {
    /// A plan of `jobs` jobs; `redis` adds the faults only a server has (a restart).
    pub fn draw(seed: u64, jobs: usize, redis: bool) -> Plan {
        let mut rng = Rng(seed);
        let mut kinds = vec![JobKind::Normal; jobs];
        let odd = (jobs / 50).max(1);
        for kind in [JobKind::Hang, JobKind::Reset] {
            for _ in 0..odd {
                // Never one of the first few, so the faults meet jobs of every kind.
                let at = rng.between(3.min(jobs as u64 - 1), jobs as u64 - 1) as usize;
                kinds[at] = kind;
            }
        }
        let mut every: Vec<fn(&mut Rng) -> Fault> = vec![
            |r| Fault::KillWorker {
                worker: r.between(0, 1) as usize,
                after_ms: r.between(0, 4_000),
            },
            |r| Fault::StopWorker {
                worker: r.between(0, 1) as usize,
                for_ms: r.between(1_000, 2_000 + LEASE_SECS * 1_000),
            },
            |r| Fault::PauseQueue {
                for_ms: r.between(500, 6_000),
            },
            |r| Fault::FillDisk {
                for_ms: r.between(2_000, 8_000),
            },
            |_| Fault::KillProxy,
        ];
        if redis {
            every.push(|r| Fault::RestartQueue {
                down_ms: r.between(500, 3_000),
            });
        }
        let count = (jobs / 12).max(every.len());
        // Every kind once, in a shuffled order, then kinds at random.
        let mut order: Vec<usize> = (0..every.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.between(0, i as u64) as usize);
        }
        while order.len() < count {
            order.push(rng.between(0, every.len() as u64 - 1) as usize);
        }
        // Spread over the first three quarters of the jobs, so that the last fault still meets
        // jobs running however slowly the faults before it went.
        let span = jobs * 3 / 4;
        let faults = order
            .iter()
            .enumerate()
            .map(|(i, k)| ((i + 1) * span / (count + 1), every[*k](&mut rng)))
            .collect();
        Plan {
            seed,
            jobs: kinds,
            faults,
        }
    }

    /// How many of each fault kind (and of each odd model) the plan holds.
    pub fn tally(&self) -> BTreeMap<&'static str, usize> {
        let mut tally = BTreeMap::new();
        for (_, f) in &self.faults {
            *tally.entry(f.kind()).or_default() += 1;
        }
        for k in &self.jobs {
            match k {
                JobKind::Hang => *tally.entry("model-hang").or_default() += 1,
                JobKind::Reset => *tally.entry("model-reset").or_default() += 1,
                JobKind::Normal => {}
            }
        }
        tally
    }

    /// The schedule, as the soak prints it before it starts.
    pub fn describe(&self, backend: &str) -> String {
        let mut out = format!(
            "soak on {backend}: seed {}, {} jobs, {} faults\n",
            self.seed,
            self.jobs.len(),
            self.faults.len()
        );
        for (at, f) in &self.faults {
            out.push_str(&format!("  after {at:>5} records: {f:?}\n"));
        }
        let odd: Vec<String> = self
            .jobs
            .iter()
            .enumerate()
            .filter(|(_, k)| **k != JobKind::Normal)
            .map(|(n, k)| format!("{n}:{k:?}"))
            .collect();
        out.push_str(&format!("  jobs meeting an odd model: {}\n", odd.join(" ")));
        out
    }
}

#[test]
fn a_plan_holds_every_fault_and_is_the_same_for_the_same_seed() {
    let plan = Plan::draw(7, 100, true);
    let tally = plan.tally();
    for kind in [
        "kill-worker",
        "stop-worker",
        "restart-queue",
        "pause-queue",
        "fill-disk",
        "kill-proxy",
        "model-hang",
        "model-reset",
    ] {
        assert!(
            tally.get(kind).copied().unwrap_or(0) >= 1,
            "{kind}: {tally:?}"
        );
    }
    assert!(
        !Plan::draw(7, 100, false)
            .tally()
            .contains_key("restart-queue")
    );
    assert_eq!(Plan::draw(7, 100, true).faults, plan.faults);
    assert_ne!(Plan::draw(8, 100, true).faults, plan.faults);
    // Spread over the run, in order.
    let at: Vec<usize> = plan.faults.iter().map(|(a, _)| *a).collect();
    assert!(at.windows(2).all(|w| w[0] <= w[1]) && *at.last().unwrap() < 100);
}
