//! The runner's lines to the worker on its standard output, beside the job's path: the servers'
//! signed line as soon as they have connected, and pi's events as they come, one whole line at a
//! time; and the fields every line of the runner's starts from.

use protocol::exit_line::{ExitLine, ServerState};

use crate::job_file::Stop;
use crate::runner::JobOptions;

/// One line of the runner's output at a time: pi's events and the servers' line never mix.
static OUTPUT: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Writes `line` (with its line end) to the runner's output whole.
pub(crate) async fn write_output(line: &[u8]) {
    use tokio::io::AsyncWriteExt as _;
    let _one = OUTPUT.lock().await;
    let mut out = tokio::io::stdout();
    let _ = out.write_all(line).await;
    let _ = out.flush().await;
}

/// Tells the worker the servers' states as they connected, in a line signed with the job's key
/// (when the runner has one), for the job's live view.
pub(crate) async fn say_servers(job: &JobOptions, servers: Vec<ServerState>) {
    let Some(key) = &job.key else {
        return;
    };
    let line = ExitLine {
        event: protocol::exit_line::SERVERS_EVENT.to_owned(),
        ..line(&job.job_id, 0, None, servers)
    };
    if let Ok(text) = protocol::exit_line::sign(&line, key.as_bytes()) {
        write_output(format!("{text}\n").as_bytes()).await;
    }
}

/// The exit line with `code`, the stop's reason, server and cause, and the servers' states; nothing
/// counted yet.
pub(crate) fn line(
    job_id: &str,
    code: u8,
    stop: Option<&Stop>,
    servers: Vec<ServerState>,
) -> ExitLine {
    ExitLine {
        event: "exit".to_owned(),
        job_id: job_id.to_owned(),
        code,
        reason: stop.map(|s| s.reason.as_str().to_owned()),
        server: stop.and_then(|s| s.server.clone()),
        cause: stop.map(|s| s.cause.clone()),
        servers,
        tool_calls: Vec::new(),
        usage: None,
        final_message: None,
    }
}
