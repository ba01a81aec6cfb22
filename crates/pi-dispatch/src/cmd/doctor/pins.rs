//! doctor's checks of the servers' pins, read from the queue's store as the worker reads them: for
//! each server the overlay offers, pinned (✓), not pinned yet (✓, a note: its first job pins it),
//! a pin that does not read, or drift a job saw that waits for the operator's approval (⚠). Every
//! name a server sent is shown without control characters.

use panel::pins::{self, Entry, ServerPins, printable};
use protocol::pins::StoredDrift;
use protocol::reason::Reason;
use setup::doctor::{Check, Read};

/// The most tools of one server's drift named in its warning.
const NAMED: usize = 5;

/// The servers `mcp` offers, each held to what the store keeps of it. Nothing when no server is
/// offered; a store that cannot be read is one warning.
pub fn checks(
    settings: &config::settings::Settings,
    env: &pickup::fs::Environment,
    mcp: &Read<config::mcp::Overlay>,
) -> Vec<Check> {
    let Read::Parsed(overlay) = mcp else {
        return Vec::new();
    };
    let servers: Vec<&str> = overlay
        .servers
        .iter()
        .filter_map(|s| s.offered())
        .map(|s| s.name.as_str())
        .collect();
    if servers.is_empty() {
        return Vec::new();
    }
    let stored = match read(settings, env) {
        Ok(stored) => stored,
        Err(why) => {
            return vec![Check::warn(
                "pins.store",
                format!("pins: the servers' pins cannot be read from the queue's store: {why}"),
                format!(
                    "make the queue readable (the queue's check above says more); until then every job that names a server ends {} and is tried again",
                    Reason::PinsUnreadable.as_str()
                ),
            )];
        }
    };
    servers
        .into_iter()
        .map(|name| server_check(name, stored.iter().find(|s| s.server == name)))
        .collect()
}

/// What the store keeps of each server, opened as the worker opens it (a Redis given a few
/// seconds). A SQLite queue not made yet holds no pin, and is not made here.
fn read(
    settings: &config::settings::Settings,
    env: &pickup::fs::Environment,
) -> Result<Vec<ServerPins>, String> {
    use config::settings::{QUEUE_PASSWORD_SETTING, QueueBackend};
    let queue: Box<dyn queue::Queue> = match &settings.queue {
        QueueBackend::Sqlite if !queue::exists(settings) => return Ok(Vec::new()),
        QueueBackend::Sqlite => Box::new(
            queue::SqliteQueue::open(&queue::sqlite_path(&settings.dir))
                .map_err(|e| e.to_string())?,
        ),
        QueueBackend::Redis { url } => Box::new(
            queue::RedisQueue::open_with(
                &queue::RedisTarget {
                    url: url.clone(),
                    password: env.get(QUEUE_PASSWORD_SETTING),
                },
                queue::Config::default(),
                std::time::Duration::from_secs(3),
            )
            .map_err(|e| e.to_string())?,
        ),
    };
    pins::read(&*queue).map_err(|e| e.to_string())
}

/// One server's check: drift waiting first, then a pin that does not read, then pinned or not.
fn server_check(name: &str, stored: Option<&ServerPins>) -> Check {
    // One id whatever the outcome, as every check's.
    let id = || format!("pins.server:{name}");
    let fix = format!(
        "see what changed with `pi-dispatch mcp pins diff {name}`; approve it with `pi-dispatch mcp pin {name}`"
    );
    let missing = || {
        Check::ok(
            id(),
            format!(
                "pin: server {name} has none yet: the first job that connects it pins what it lists"
            ),
        )
    };
    let Some(stored) = stored else {
        return missing();
    };
    if let Some(drift) = stored.pending() {
        return Check::warn(id(), drift_label(name, drift), fix);
    }
    if let Some(why) = stored
        .drift
        .as_ref()
        .filter(|_| stored.drift_waits())
        .and_then(Entry::why_not)
    {
        return Check::warn(
            id(),
            format!(
                "pin: a job saw server {name}'s tools differ from its pin, not yet approved, and what it noted cannot be read ({why})"
            ),
            fix,
        );
    }
    match &stored.pin {
        None => missing(),
        Some(Entry::Read(pin)) => Check::ok(
            id(),
            format!(
                "pin: server {name}: {} pinned by {}, {}",
                plural(pin.listing.tools.len(), "tool"),
                printable(&pin.by),
                records::record::utc(pin.pinned_at_ms)
            ),
        ),
        Some(Entry::NotReadable) => Check::warn(
            id(),
            format!(
                "pin: server {name}'s pin cannot be read (it is not JSON of the shape this version writes): the next job takes the server as unpinned, offers every tool it lists, and pins what it lists in its place"
            ),
            format!("store its pin again: `pi-dispatch mcp pin {name}`"),
        ),
        Some(other) => Check::warn(
            id(),
            format!(
                "pin: server {name}'s pin cannot be read ({}): no worker wrote it",
                other.why_not().unwrap_or_default()
            ),
            format!("store its pin again: `pi-dispatch mcp pin {name}`"),
        ),
    }
}

/// The warning of drift waiting: how many tools and of which kinds, the first few by name, and
/// the job that saw it, when.
fn drift_label(name: &str, drift: &StoredDrift) -> String {
    let tools = &drift.comparison.drift;
    let differ = tools.len() + drift.comparison.gone.len();
    let mut named: Vec<String> = tools
        .iter()
        .take(NAMED)
        .map(|d| format!("{} ({})", printable(&d.tool), d.kind.as_str()))
        .collect();
    if tools.len() > NAMED {
        named.push(format!("{} more", tools.len() - NAMED));
    }
    let named = if named.is_empty() {
        String::new()
    } else {
        format!(": {}", named.join(", "))
    };
    format!(
        "pin: server {name}'s tools differ from its pin, not yet approved: {} ({}){named}; seen by job {} at {}; jobs go on without them (withhold) or end (refuse)",
        plural(differ, "tool"),
        pins::kinds(drift),
        printable(&drift.job_id),
        records::record::utc(drift.seen_at_ms)
    )
}

fn plural(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}
