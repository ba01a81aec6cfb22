//! The proxy's two files, re-read whenever either changes (its size, modification or change time,
//! or inode: the change time too, since a copy that keeps the old modification time is a change):
//! checked at every decision, so an edit counts from the next request. A file that cannot be read
//! or is refused refuses everything until it is fixed (logged once per change).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use config::egress::parse_allowlist;
use config::endpoints::{ModelEndpoints, parse_model_endpoints};

use crate::rules::Rules;

/// Where the proxy reads its rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleFiles {
    pub allowlist: PathBuf,
    pub endpoints: PathBuf,
}

type Stamp = Option<(u64, SystemTime, (i64, i64), u64)>;

fn stamp(path: &std::path::Path) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| {
        (
            m.len(),
            m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            (m.ctime(), m.ctime_nsec()),
            m.ino(),
        )
    })
}

/// The rules as last read, or why they cannot be.
pub type Current = Result<Arc<Rules>, Arc<str>>;

pub struct WatchedRules {
    files: RuleFiles,
    state: Mutex<(Stamp, Stamp, Current)>,
}

impl WatchedRules {
    pub fn new(files: RuleFiles) -> WatchedRules {
        let (a, e) = (stamp(&files.allowlist), stamp(&files.endpoints));
        let current = read(&files);
        log_read(&current);
        WatchedRules {
            files,
            state: Mutex::new((a, e, current)),
        }
    }

    /// The rules now: re-read first if either file changed since the last read.
    pub fn current(&self) -> Current {
        let (a, e) = (stamp(&self.files.allowlist), stamp(&self.files.endpoints));
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.0 != a || state.1 != e {
            let current = read(&self.files);
            log_read(&current);
            *state = (a, e, current);
        }
        state.2.clone()
    }
}

fn log_read(current: &Current) {
    match current {
        Ok(rules) => tracing::info!(
            event = "egress_rules_read",
            allowlist_entries = rules.allowlist.len(),
            endpoints = rules.endpoints.endpoints.len()
        ),
        Err(why) => tracing::warn!(event = "egress_rules_unreadable", detail = %why),
    }
}

/// Both files, read as the pickup reads them: the allowlist must exist; a missing endpoints file
/// declares none.
pub fn read(files: &RuleFiles) -> Current {
    let allow = std::fs::read(&files.allowlist)
        .map_err(|e| format!("egress-allowlist.conf cannot be read ({})", e.kind()))?;
    let allow = std::str::from_utf8(&allow)
        .map_err(|_| "egress-allowlist.conf is not UTF-8 text".to_owned())?;
    let allowlist = parse_allowlist(allow).map_err(|e| e.to_string())?;
    let endpoints = match std::fs::read(&files.endpoints) {
        Ok(bytes) => {
            let text = std::str::from_utf8(&bytes)
                .map_err(|_| "model-endpoints.json is not UTF-8 text".to_owned())?;
            parse_model_endpoints(text).map_err(|e| e.to_string())?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => ModelEndpoints::empty(),
        Err(e) => return Err(format!("model-endpoints.json cannot be read ({})", e.kind()).into()),
    };
    Ok(Arc::new(Rules {
        allowlist,
        endpoints,
    }))
}
