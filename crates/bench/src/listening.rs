//! Starting a long-running command of the release binary (`receiver`, `panel`) for a
//! measurement.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};

use anyhow::{Context as _, bail};
use serde_json::Value;

/// Starts `cmd` (given `--log-format json`) and waits until it logs `event` with its address; the
/// address, and the process (its log is read and dropped from then on, so its pipe never fills).
pub fn start(mut cmd: Command, event: &str) -> anyhow::Result<(String, Child)> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start the command that logs {event}"))?;
    let stderr = child.stderr.take().context("no stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    let addr = loop {
        let Some(line) = lines.next() else {
            bail!("it ended before it logged {event}");
        };
        let v: Value = serde_json::from_str(&line?).unwrap_or_default();
        if v["event"] == event {
            break v["addr"].as_str().unwrap_or_default().to_owned();
        }
    };
    std::thread::spawn(move || for _ in lines.map_while(Result::ok) {});
    Ok((addr, child))
}
