//! What a running job shows while it runs: its record as it stands (what it is for, its times so
//! far), the servers' states once its runner has said them (in a line signed with the job's key),
//! what pi began (turns and tool calls, pi's own claim), and its transcript so far, redacted as the
//! transcript is. The job's worker writes it into the queue's store ([`LiveFeed`]) at most twice a
//! second, so `runs show ID` and the panel on any host read it ([`read`]). Nothing in it decides
//! anything: the record written at the end does.

use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};
use std::time::{Duration, SystemTime};

use protocol::exit_line::ServerState;
use queue::Queue;
use serde::{Deserialize, Serialize};

use crate::record::{Activity, MAX_ACTIVITY, Record, Watched, now_ms};

/// The most transcript lines, and bytes, a live view holds; what comes after is left out, and the
/// view says so (the transcript file keeps everything).
pub const MAX_LINES: u64 = 20_000;
pub const MAX_BYTES: u64 = 8 * 1024 * 1024;

/// How often the worker writes the view, at most.
pub const WRITE_EVERY: Duration = Duration::from_millis(500);

/// What a running job shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    /// The record as the job stands (its outcome is not yet decided: read [`Snapshot::phase`]).
    pub record: Record,
    /// The worker running it.
    pub worker: String,
    /// The servers' states, once the runner has said them (empty before).
    pub servers: Vec<ServerState>,
    /// What pi began so far (the first [`MAX_ACTIVITY`]).
    pub activity: Vec<Activity>,
    pub turns: u64,
    pub tool_calls: u64,
    pub updated_at_ms: u64,
    /// Transcript lines the view holds.
    pub lines: u64,
    /// More lines came than the view keeps (or the deployment keeps no transcripts: none).
    pub cut: bool,
}

impl Snapshot {
    /// Where the job is: `preparing` (admitted, its sandbox not asked for yet), `starting` (its
    /// sandbox asked for), `running` (its sandbox up), `connecting` (before the admission).
    pub fn phase(&self) -> &'static str {
        let r = &self.record;
        if r.sandbox_up_at_ms.is_some() {
            "running"
        } else if r.started_at_ms.is_some() {
            "starting"
        } else if r.admitted_at_ms.is_some() {
            "preparing"
        } else {
            "picked-up"
        }
    }
}

impl Snapshot {
    /// The tool calls pi began, by tool, in the order each tool was first called (`?` for a call
    /// without a name).
    pub fn tools_begun(&self) -> Vec<(String, u64)> {
        let mut tools: Vec<(String, u64)> = Vec::new();
        for a in self.activity.iter().filter(|a| a.kind == "tool") {
            let name = a.tool.as_deref().unwrap_or("?");
            match tools.iter_mut().find(|(t, _)| t == name) {
                Some((_, n)) => *n += 1,
                None => tools.push((name.to_owned(), 1)),
            }
        }
        tools
    }
}

/// A running job's view as the worker keeps it, written to the queue by a thread of its own.
pub struct LiveFeed {
    queue: Arc<dyn Queue>,
    job_id: String,
    state: Mutex<Feed>,
    wake: Condvar,
    /// Held from taking the pending lines to writing them, so that batches land in order.
    writing: Mutex<()>,
}

impl std::fmt::Debug for LiveFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LiveFeed({})", self.job_id)
    }
}

struct Feed {
    snapshot: Snapshot,
    pending: Vec<String>,
    bytes: u64,
    dirty: bool,
    done: bool,
}

impl LiveFeed {
    /// Starts the view of the job whose record begins as `record`, run by `worker`.
    pub fn start(queue: Arc<dyn Queue>, record: Record, worker: &str) -> Arc<LiveFeed> {
        let feed = Arc::new(LiveFeed {
            queue,
            job_id: record.job_id.clone(),
            state: Mutex::new(Feed {
                snapshot: Snapshot {
                    record,
                    worker: worker.to_owned(),
                    servers: Vec::new(),
                    activity: Vec::new(),
                    turns: 0,
                    tool_calls: 0,
                    updated_at_ms: now_ms(),
                    lines: 0,
                    cut: false,
                },
                pending: Vec::new(),
                bytes: 0,
                dirty: true,
                done: false,
            }),
            wake: Condvar::new(),
            writing: Mutex::new(()),
        });
        let weak = Arc::downgrade(&feed);
        std::thread::spawn(move || write_until_done(&weak));
        feed
    }

    fn with(&self, f: impl FnOnce(&mut Feed)) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut state);
        state.dirty = true;
    }

    /// The view has its last lines: written once more, then the writing thread ends. When this
    /// returns, every line the feed was given is in the queue (the record written after it never
    /// comes before the last lines a follower reads).
    pub fn finish(&self) {
        self.with(|s| s.done = true);
        self.wake.notify_all();
        self.write();
    }

    /// Writes what changed; whether the feed is done.
    fn write(&self) -> bool {
        let _writing = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        let (snapshot, lines, done) = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            if !state.dirty {
                return state.done;
            }
            state.dirty = false;
            state.snapshot.updated_at_ms = now_ms();
            (
                serde_json::to_string(&state.snapshot).unwrap_or_default(),
                std::mem::take(&mut state.pending),
                state.done,
            )
        };
        if let Err(e) = self
            .queue
            .live_put(&self.job_id, &snapshot, &lines, SystemTime::now())
        {
            tracing::warn!(event = "live_view_unwritten", job_id = %self.job_id, detail = %e);
        }
        done
    }

    fn wait(&self) {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if !state.done {
            let _ = self.wake.wait_timeout(state, WRITE_EVERY);
        }
    }
}

impl Watched for LiveFeed {
    /// The record as it stands now (its times).
    fn record(&self, record: &Record) {
        self.with(|s| s.snapshot.record = record.clone());
    }

    /// The servers' states, as the runner said them.
    fn servers(&self, servers: Vec<ServerState>) {
        self.with(|s| s.snapshot.servers = servers);
    }

    /// Something pi began.
    fn activity(&self, a: &Activity) {
        self.with(|s| {
            match a.kind.as_str() {
                "turn" => s.snapshot.turns += 1,
                _ => s.snapshot.tool_calls += 1,
            }
            if s.snapshot.activity.len() < MAX_ACTIVITY {
                s.snapshot.activity.push(a.clone());
            }
        });
    }

    /// A line of the transcript, redacted.
    fn line(&self, text: &str) {
        self.with(|s| {
            let size = text.len() as u64;
            if s.snapshot.lines >= MAX_LINES || s.bytes + size > MAX_BYTES {
                s.snapshot.cut = true;
                return;
            }
            s.bytes += size;
            s.snapshot.lines += 1;
            s.pending.push(text.to_owned());
        });
    }
}

/// The writing thread: until the feed is done (or dropped).
fn write_until_done(feed: &Weak<LiveFeed>) {
    loop {
        let Some(feed) = feed.upgrade() else {
            return;
        };
        feed.wait();
        if feed.write() {
            return;
        }
    }
}

/// What job `id` shows live, with its transcript's lines from `from` (at most `max`); `None` when
/// it shows nothing.
pub fn read(
    queue: &dyn Queue,
    id: &str,
    from: u64,
    max: usize,
) -> Result<Option<(Snapshot, Vec<String>, u64)>, queue::QueueError> {
    let Some(view) = queue.live_get(id, from, max)? else {
        return Ok(None);
    };
    Ok(serde_json::from_str::<Snapshot>(&view.snapshot)
        .ok()
        .map(|s| (s, view.lines, view.total)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_feed_writes_what_the_job_shows_and_its_lines_within_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let queue: Arc<dyn Queue> =
            Arc::new(queue::SqliteQueue::open(&dir.path().join("q.sqlite3")).unwrap());
        let job = protocol::job::Job::new("j1", "cli", "local");
        let mut record = Record::ended(&job, protocol::reason::Reason::Cancelled, 1, 0);
        let feed = LiveFeed::start(queue.clone(), record.clone(), "h:1");
        record.admitted_at_ms = Some(5);
        record.sandbox_up_at_ms = Some(6);
        feed.record(&record);
        feed.activity(&Activity {
            at_ms: 7,
            kind: "turn".into(),
            tool: None,
        });
        feed.activity(&Activity {
            at_ms: 8,
            kind: "tool".into(),
            tool: Some("bash".into()),
        });
        feed.line("first");
        feed.line(&"x".repeat(MAX_BYTES as usize));
        feed.line("third");
        feed.finish();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let (snapshot, lines, total) = loop {
            if let Some((s, lines, total)) = read(&*queue, "j1", 0, 10).unwrap()
                && s.lines == 2
            {
                break (s, lines, total);
            }
            assert!(std::time::Instant::now() < deadline, "never written");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(lines, ["first", "third"]);
        assert_eq!(total, 2);
        assert!(snapshot.cut);
        assert_eq!((snapshot.turns, snapshot.tool_calls), (1, 1));
        assert_eq!(snapshot.phase(), "running");
        assert_eq!(snapshot.worker, "h:1");
    }

    /// The job's record is written once `finish` returns: by then every line is in the queue, so a
    /// follower that sees the record and reads on never misses the last lines.
    #[test]
    fn every_line_is_written_when_finish_returns() {
        let dir = tempfile::tempdir().unwrap();
        let queue: Arc<dyn Queue> =
            Arc::new(queue::SqliteQueue::open(&dir.path().join("q.sqlite3")).unwrap());
        for round in 0..20 {
            let id = format!("j{round}");
            let job = protocol::job::Job::new(&id, "cli", "local");
            let record = Record::ended(&job, protocol::reason::Reason::Cancelled, 1, 0);
            let feed = LiveFeed::start(queue.clone(), record, "h:1");
            for n in 0..50 {
                feed.line(&format!("line {n}"));
            }
            feed.finish();
            let (_, lines, total) = read(&*queue, &id, 0, 100)
                .unwrap()
                .expect("the view is written");
            assert_eq!((lines.len(), total), (50, 50), "round {round}");
            assert_eq!(lines[49], "line 49");
        }
    }
}
