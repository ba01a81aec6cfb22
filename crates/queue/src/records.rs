//! The records' index, kept in the queue's store beside the jobs: each record's text under its
//! job's id, indexed by when the job ended and by what operators ask of the records (outcome,
//! reason, trigger, repository, folder), and the deployment's counters, which each record adds to
//! as it is stored and which no pruning lowers. The store knows the record only as text and keys:
//! what a record is, and its keys, is the `records` crate's.

use crate::QueueError;

/// What a record is found by. Every text is as the record holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordKeys {
    /// When its job ended (Unix ms): records are listed newest first by this, then by id.
    pub finished_at_ms: u64,
    pub outcome: String,
    /// `None` for a completed job.
    pub reason: Option<String>,
    pub trigger_index: Option<u64>,
    pub trigger_type: String,
    /// A forge job's repository.
    pub repo: Option<String>,
    /// A local job's folder.
    pub folder: Option<String>,
}

/// A record to store: its id, its text, its keys, and what it adds to the deployment's counters
/// (each a series' name and an amount).
#[derive(Debug, Clone, Copy)]
pub struct RecordEntry<'a> {
    pub id: &'a str,
    pub text: &'a str,
    pub keys: &'a RecordKeys,
    pub counts: &'a [(String, f64)],
}

/// Which records a search finds: every condition given must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordFilter {
    pub outcome: Option<String>,
    /// `Some(None)`: records without a reason.
    pub reason: Option<Option<String>>,
    pub trigger_index: Option<u64>,
    pub trigger_type: Option<String>,
    pub repo: Option<String>,
    pub folder: Option<String>,
    /// Records of jobs that ended at or after this (Unix ms).
    pub since_ms: Option<u64>,
}

/// Where a page of records ended: the next page starts with the record after it (older, or as
/// old with a smaller id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub finished_at_ms: u64,
    pub id: String,
}

/// A record found: its id, when its job ended, and its text (`None` if it went between the
/// search and the read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundRecord {
    pub id: String,
    pub finished_at_ms: u64,
    pub text: Option<String>,
}

impl FoundRecord {
    /// Where the page that ends with this record ended.
    pub fn cursor(&self) -> Cursor {
        Cursor {
            finished_at_ms: self.finished_at_ms,
            id: self.id.clone(),
        }
    }
}

/// The records' index. Object-safe, as [`crate::Queue`] is.
pub trait RecordIndex: Send + Sync {
    /// Stores a record and adds its counts, in one step, unless its id has one: `false` when it
    /// had, and then nothing changes.
    fn put_record(&self, entry: &RecordEntry<'_>) -> Result<bool, QueueError>;

    /// Stores many records as [`RecordIndex::put_record`] stores one, in one step or one round
    /// trip (an import, a benchmark); returns how many were stored now.
    fn put_records(&self, entries: &[RecordEntry<'_>]) -> Result<usize, QueueError>;

    /// A record's text, as stored.
    fn get_record(&self, id: &str) -> Result<Option<String>, QueueError>;

    /// At most `limit` records the filter finds, newest first (by when their jobs ended, then by
    /// id), starting after `after`.
    fn find_records(
        &self,
        filter: &RecordFilter,
        after: Option<&Cursor>,
        limit: usize,
    ) -> Result<Vec<FoundRecord>, QueueError>;

    /// When the jobs of at most `limit` records the filter finds ended, newest first: what a
    /// chart needs, without the records' texts.
    fn find_times(&self, filter: &RecordFilter, limit: usize) -> Result<Vec<u64>, QueueError>;

    /// How many records there are.
    fn count_records(&self) -> Result<u64, QueueError>;

    /// How many records are of jobs that ended before `before_ms`.
    fn count_records_before(&self, before_ms: u64) -> Result<u64, QueueError>;

    /// Removes at most `max` of the oldest records of jobs that ended before `before_ms` (the
    /// counters keep what they added); returns their ids.
    fn prune_records(&self, before_ms: u64, max: usize) -> Result<Vec<String>, QueueError>;

    /// Every counter: each series' name and its value.
    fn counters(&self) -> Result<Vec<(String, f64)>, QueueError>;

    /// At most `max` records stored by a version without the index (in Redis, before it had
    /// one), each with its text, for the caller to store again with their keys; none once every
    /// record is indexed. SQLite's records were files then, which the caller imports itself.
    fn unindexed_records(&self, max: usize) -> Result<Vec<(String, Option<String>)>, QueueError>;
}
