//! The records as the pages see them: read in the background every little while, so that a page
//! never waits on the records' store, whatever its size. Records are written once, so each is
//! read once: a refresh reads only the records it has not seen.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use records::record::{Record, Records};

use crate::Panel;
use crate::metrics::Tally;

/// The records at one moment, newest first.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub records: Arc<Vec<Record>>,
    /// What could not be read as a record.
    pub unreadable: usize,
    /// When they were read; `None` before the first read.
    pub read_at: Option<SystemTime>,
    /// The metrics these records make, in the text format (rendered when they were read).
    pub metrics: Arc<String>,
}

impl Snapshot {
    pub fn find(&self, id: &str) -> Option<&Record> {
        self.records.iter().find(|r| r.job_id == id)
    }
}

/// The records read so far: their ids, and what they count for the metrics.
#[derive(Default)]
struct Seen {
    ids: HashSet<String>,
    tally: Tally,
}

#[derive(Default)]
pub struct Cache {
    shown: RwLock<Arc<Snapshot>>,
    /// What was read so far (only the refresh touches it).
    seen: Mutex<Seen>,
    /// Wakes the refresher before its time.
    wake: tokio::sync::Notify,
}

impl Cache {
    pub fn get(&self) -> Arc<Snapshot> {
        self.shown
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Has what is new read now rather than at the next refresh.
    pub fn refresh_soon(&self) {
        self.wake.notify_one();
    }

    /// Reads what is new in `records` and shows it.
    pub fn refresh(&self, records: &Records) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let listing = match records.list_new(&seen.ids) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(event = "panel_records_unreadable", detail = %e);
                return;
            }
        };
        let before = self.get();
        let unreadable = listing.unreadable.len();
        if listing.records.is_empty() && unreadable == before.unreadable {
            // Nothing new: the same records (and their metrics), read now.
            *self.shown.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(Snapshot {
                records: before.records.clone(),
                unreadable,
                read_at: Some(SystemTime::now()),
                metrics: before.metrics.clone(),
            });
            return;
        }
        let mut all = Vec::with_capacity(before.records.len() + listing.records.len());
        for r in listing.records {
            seen.ids.insert(r.job_id.clone());
            seen.tally.add(&r);
            all.push(r);
        }
        all.extend(before.records.iter().cloned());
        // Newest first: by finish time, then id, as `runs` orders them (reversed).
        all.sort_by(|a, b| (b.finished_at_ms, &b.job_id).cmp(&(a.finished_at_ms, &a.job_id)));
        *self.shown.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(Snapshot {
            records: Arc::new(all),
            unreadable,
            read_at: Some(SystemTime::now()),
            metrics: Arc::new(seen.tally.render(unreadable)),
        });
    }
}

/// Reads the records every `every` (or sooner when woken), in the runtime's blocking pool. The
/// first read is the caller's, before it takes requests.
pub fn keep_fresh(panel: Arc<Panel>, every: Duration) {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = panel.snapshot.wake.notified() => {}
            }
            let p = panel.clone();
            let _ = tokio::task::spawn_blocking(move || p.snapshot.refresh(&p.records)).await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::job::Job;
    use records::record::Outcome;

    #[test]
    fn a_refresh_adds_what_is_new_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let records = Records::new(dir.path());
        let write = |id: &str, at: u64| {
            let r = Record::new(
                &Job::new(id, "cli", "local"),
                Outcome::Completed,
                None,
                1,
                at,
            );
            records.write(&r).unwrap();
        };
        let cache = Cache::default();
        write("a", 10);
        cache.refresh(&records);
        write("b", 30);
        write("c", 20);
        cache.refresh(&records);
        let ids: Vec<_> = cache
            .get()
            .records
            .iter()
            .map(|r| r.job_id.clone())
            .collect();
        assert_eq!(ids, ["b", "c", "a"]);
        assert!(cache.get().find("c").is_some());
        // The metrics, counted a record at a time, are what counting them all at once gives.
        let mut all = Tally::default();
        for r in cache.get().records.iter() {
            all.add(r);
        }
        assert_eq!(*cache.get().metrics, all.render(0));
        assert!(cache.get().metrics.contains("pi_dispatch_records 3\n"));
        // Nothing new: the same records and metrics, read again.
        let before = cache.get();
        cache.refresh(&records);
        assert!(Arc::ptr_eq(&before.records, &cache.get().records));
        assert!(cache.get().read_at >= before.read_at);
    }
}
