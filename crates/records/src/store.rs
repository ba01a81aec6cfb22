//! Where the records are kept: in the queue's store (the SQLite file, or the queue's Redis, which
//! every host shares), indexed for what operators ask of them, each written once with what it adds
//! to the deployment's counters. Records kept by earlier versions (a file each under
//! `state/runs`, or Redis records without the index) are brought in once, losing nothing.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use queue::{Cursor, RecordEntry, RecordIndex, RecordKeys};

use crate::query::Query;
use crate::record::{Outcome, Record};

/// Every record [`Records::list`] found, oldest first, and those that cannot be read as one.
#[derive(Debug, Default)]
pub struct Listing {
    pub records: Vec<Record>,
    /// Records that are not readable as one (written by a newer version, or damaged), by id.
    pub unreadable: Vec<String>,
}

/// A page of the records a query finds, newest first.
#[derive(Debug, Default)]
pub struct Page {
    pub records: Vec<Record>,
    /// What the store holds under these ids is not a record this version reads.
    pub unreadable: Vec<String>,
    /// Where the next page starts, when this one is full.
    pub next: Option<Cursor>,
}

/// The deployment's records.
pub struct Records {
    index: Arc<dyn RecordIndex>,
    place: String,
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("no record has the id given")]
    NotFound,
    #[error("a record is not valid JSON of the record's shape")]
    Invalid,
    #[error("the records cannot be used: {0}")]
    Store(#[from] queue::QueueError),
    #[error("the records folder of an earlier version cannot be read ({0})")]
    Folder(std::io::ErrorKind),
}

/// Job ids become keys (and, before, file names): only these characters.
pub fn is_plain_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// What [`Records::migrate`] brought in.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Migrated {
    /// Records stored now.
    pub records: usize,
    /// Files or Redis records that are not readable as a record: left where they were (a file
    /// moves with its folder).
    pub unreadable: Vec<String>,
    /// Where the folder of record files went, once read.
    pub folder: Option<PathBuf>,
}

/// How many records a page of a full listing or a migration step holds.
const BATCH: usize = 1_000;

impl Records {
    /// The records in the queue's SQLite file at `path`.
    pub fn sqlite(path: &Path) -> Result<Records, RecordError> {
        Ok(Records {
            index: Arc::new(queue::SqliteQueue::open(path)?),
            place: path.display().to_string(),
        })
    }

    /// The records in the queue's Redis.
    pub fn redis(queue: Arc<queue::RedisQueue>) -> Records {
        Records {
            index: queue,
            place: "the queue's Redis".to_owned(),
        }
    }

    /// The deployment's records, as its settings place the queue, with the records of earlier
    /// versions brought in (once).
    pub fn open(
        settings: &config::settings::Settings,
        password: Option<String>,
    ) -> Result<Records, RecordError> {
        let records = match &settings.queue {
            config::settings::QueueBackend::Sqlite => {
                Records::sqlite(&queue::sqlite_path(&settings.dir))?
            }
            config::settings::QueueBackend::Redis { url } => {
                let target = queue::RedisTarget {
                    url: url.clone(),
                    password,
                };
                Records::redis(Arc::new(queue::RedisQueue::open(&target)?))
            }
        };
        let migrated = records.migrate(&settings.dir.join("state"))?;
        if migrated != Migrated::default() {
            tracing::info!(
                event = "records_migrated",
                records = migrated.records,
                unreadable = migrated.unreadable.len(),
                folder = migrated.folder.as_ref().map(|f| f.display().to_string())
            );
            for what in &migrated.unreadable {
                tracing::warn!(event = "record_unreadable", what = %what);
            }
        }
        Ok(records)
    }

    /// Where they are, for messages.
    pub fn place(&self) -> String {
        self.place.clone()
    }

    /// Writes `record` (once: a job has one record; a second write for the same id replaces
    /// nothing and says so), adding what it counts to the counters.
    pub fn write(&self, record: &Record) -> Result<bool, RecordError> {
        if !is_plain_id(&record.job_id) {
            return Err(RecordError::Invalid);
        }
        let text = serde_json::to_string(record).map_err(|_| RecordError::Invalid)?;
        self.put(record, &text)
    }

    /// Writes many records as [`Records::write`] writes one, in one step; how many were new.
    pub fn write_many(&self, records: &[Record]) -> Result<usize, RecordError> {
        if records.iter().any(|r| !is_plain_id(&r.job_id)) {
            return Err(RecordError::Invalid);
        }
        let mut texts = Vec::with_capacity(records.len());
        for r in records {
            texts.push(serde_json::to_string(r).map_err(|_| RecordError::Invalid)?);
        }
        self.put_many(records, &texts)
    }

    fn put_many(&self, records: &[Record], texts: &[String]) -> Result<usize, RecordError> {
        let keys: Vec<RecordKeys> = records.iter().map(Record::keys).collect();
        let counts: Vec<Vec<(String, f64)>> = records.iter().map(crate::counts::of).collect();
        let entries: Vec<RecordEntry<'_>> = records
            .iter()
            .zip(texts)
            .zip(keys.iter().zip(&counts))
            .map(|((r, text), (keys, counts))| RecordEntry {
                id: &r.job_id,
                text,
                keys,
                counts,
            })
            .collect();
        Ok(self.index.put_records(&entries)?)
    }

    fn put(&self, record: &Record, text: &str) -> Result<bool, RecordError> {
        let keys = record.keys();
        let counts = crate::counts::of(record);
        Ok(self.index.put_record(&RecordEntry {
            id: &record.job_id,
            text,
            keys: &keys,
            counts: &counts,
        })?)
    }

    pub fn read(&self, id: &str) -> Result<Record, RecordError> {
        if !is_plain_id(id) {
            return Err(RecordError::NotFound);
        }
        let text = self.index.get_record(id)?.ok_or(RecordError::NotFound)?;
        serde_json::from_str(&text).map_err(|_| RecordError::Invalid)
    }

    /// The records `query` asks for (at most its limit), newest first, from after `after`.
    pub fn find(&self, query: &Query, after: Option<&Cursor>) -> Result<Page, RecordError> {
        let found = self
            .index
            .find_records(&query.filter(), after, query.limit)?;
        let next = (found.len() >= query.limit)
            .then(|| found.last().map(queue::FoundRecord::cursor))
            .flatten();
        let mut page = Page {
            next,
            ..Page::default()
        };
        for f in found {
            match f.text.and_then(|t| serde_json::from_str::<Record>(&t).ok()) {
                Some(r) => page.records.push(r),
                None => page.unreadable.push(f.id),
            }
        }
        Ok(page)
    }

    /// When the jobs of the records `query` finds ended, and how, newest first (at most its limit
    /// of each outcome): what a chart of outcomes needs, without reading a record.
    pub fn outcomes(&self, query: &Query) -> Result<Vec<(u64, Outcome)>, RecordError> {
        let mut ended = Vec::new();
        for outcome in [
            Outcome::Completed,
            Outcome::Failed,
            Outcome::Policy,
            Outcome::Cancelled,
        ] {
            if query.outcome.is_some_and(|o| o != outcome) {
                continue;
            }
            let mut filter = query.filter();
            filter.outcome = Some(outcome.as_str().to_owned());
            let times = self.index.find_times(&filter, query.limit)?;
            ended.extend(times.into_iter().map(|t| (t, outcome)));
        }
        Ok(ended)
    }

    /// Every record, oldest first, and those that cannot be read as one.
    pub fn list(&self) -> Result<Listing, RecordError> {
        let all = Query {
            limit: BATCH,
            ..Query::default()
        };
        let mut listing = Listing::default();
        let mut after = None;
        loop {
            let page = self.find(&all, after.as_ref())?;
            listing.records.extend(page.records);
            listing.unreadable.extend(page.unreadable);
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        listing.records.reverse();
        listing.unreadable.sort();
        Ok(listing)
    }

    /// How many records there are.
    pub fn count(&self) -> Result<u64, RecordError> {
        Ok(self.index.count_records()?)
    }

    /// How many records are of jobs that ended before `before_ms`.
    pub fn count_before(&self, before_ms: u64) -> Result<u64, RecordError> {
        Ok(self.index.count_records_before(before_ms)?)
    }

    /// Removes at most `max` of the oldest records of jobs that ended before `before_ms`; their
    /// ids.
    pub fn prune(&self, before_ms: u64, max: usize) -> Result<Vec<String>, RecordError> {
        Ok(self.index.prune_records(before_ms, max)?)
    }

    /// The deployment's counters, every series with its value.
    pub fn counters(&self) -> Result<Vec<(String, f64)>, RecordError> {
        Ok(self.index.counters()?)
    }

    /// Brings in the records earlier versions kept elsewhere: Redis records stored without the
    /// index, and the record files of `state/runs` (the folder is then renamed
    /// `state/runs.imported`, with every file in it, so that nothing is read twice or lost).
    /// Safe to run by several processes at once, and again: a record is stored once.
    pub fn migrate(&self, state: &Path) -> Result<Migrated, RecordError> {
        let mut migrated = Migrated::default();
        let mut unindexed: std::collections::HashSet<String> = std::collections::HashSet::new();
        loop {
            let batch = self.index.unindexed_records(BATCH)?;
            // A record indexed now leaves the list; one that comes back is not progress.
            if batch.is_empty() || batch.iter().all(|(id, _)| unindexed.contains(id)) {
                break;
            }
            for (id, text) in batch {
                match text.as_deref().map(serde_json::from_str::<Record>) {
                    Some(Ok(record)) => {
                        self.put(&record, text.as_deref().unwrap_or_default())?;
                        migrated.records += 1;
                    }
                    _ => {
                        self.index_unreadable(&id)?;
                        migrated.unreadable.push(format!("record {id} in Redis"));
                    }
                }
                unindexed.insert(id);
            }
        }
        let folder = state.join("runs");
        if folder.is_dir() {
            self.import_folder(&folder, &mut migrated)?;
        }
        Ok(migrated)
    }

    /// A Redis record from before the index that is no record this version reads: indexed by
    /// nothing but its place among the records, so that it is listed as unreadable.
    fn index_unreadable(&self, id: &str) -> Result<(), RecordError> {
        let keys = RecordKeys {
            finished_at_ms: 0,
            outcome: String::new(),
            reason: Some(String::new()),
            trigger_index: None,
            trigger_type: String::new(),
            repo: None,
            folder: None,
        };
        self.index.put_record(&RecordEntry {
            id,
            text: "",
            keys: &keys,
            counts: &[],
        })?;
        Ok(())
    }

    fn import_folder(&self, folder: &Path, migrated: &mut Migrated) -> Result<(), RecordError> {
        let entries = std::fs::read_dir(folder).map_err(|e| RecordError::Folder(e.kind()))?;
        let mut batch: Vec<Record> = Vec::with_capacity(BATCH);
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || !name.ends_with(".json") {
                continue;
            }
            let record = std::fs::read(entry.path())
                .ok()
                .and_then(|b| serde_json::from_slice::<Record>(&b).ok())
                .filter(|r| is_plain_id(&r.job_id));
            match record {
                Some(r) => batch.push(r),
                None => migrated.unreadable.push(entry.path().display().to_string()),
            }
            if batch.len() == BATCH {
                migrated.records += self.write_many(&batch)?;
                batch.clear();
            }
        }
        migrated.records += self.write_many(&batch)?;
        let mut to = folder.with_extension("imported");
        if to.exists() {
            to = folder.with_extension(format!("imported-{}", crate::record::now_ms()));
        }
        match std::fs::rename(folder, &to) {
            Ok(()) => migrated.folder = Some(to),
            // Another process brought them in and moved the folder meanwhile.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(RecordError::Folder(e.kind())),
        }
        Ok(())
    }
}

/// Writes the record (once; a record that exists already is left as it is) and logs what became
/// of it. True when it was written now, or when the record stored is this very one: a store that
/// went away (a Redis restarted) as it answered a write it had made is asked again, and finds it.
pub fn write_logged(records: &Records, record: &Record) -> bool {
    let written = records.write(record).map(|now| {
        now || records
            .read(&record.job_id)
            .is_ok_and(|stored| stored == *record)
    });
    match written {
        Ok(true) => {
            tracing::info!(event = "job_recorded", job_id = %record.job_id,
                outcome = %record.outcome, reason = record.reason.map(protocol::reason::Reason::as_str),
                attempt = record.attempt);
            true
        }
        Ok(false) => {
            tracing::info!(event = "job_already_recorded", job_id = %record.job_id);
            false
        }
        Err(e) => {
            tracing::error!(event = "record_failed", job_id = %record.job_id, detail = %e);
            false
        }
    }
}

/// Cancels job `id` (`cancel` and the panel): a job that had not started is done at once and
/// gets its record here; a running one is marked, and its worker stops it and records it.
pub fn cancel(
    queue: &dyn queue::Queue,
    records: &Records,
    id: &str,
    now: std::time::SystemTime,
) -> Result<queue::Cancel, queue::QueueError> {
    let answer = queue.cancel(id, now)?;
    if let queue::Cancel::Removed { payload, attempt } = &answer {
        let job = crate::record::job_of(id, payload).unwrap_or_else(|| crate::record::stub(id));
        let record = Record::ended(
            &job,
            protocol::reason::Reason::Cancelled,
            *attempt,
            crate::record::now_ms(),
        );
        write_logged(records, &record);
    }
    Ok(answer)
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
