//! `pi-dispatch prune [--dry-run]`: removes now what the worker's retention removes as it goes
//! (`PI_KEEP_RECORDS_DAYS`, `PI_KEEP_TRANSCRIPTS_DAYS`, `PI_KEEP_FAILED_JOBS_DAYS`): the folders
//! of settled jobs but their transcripts, transcripts past their days, records past theirs with
//! the queue's entries of their jobs. With `--dry-run` it says what it would remove and removes
//! nothing. Nothing a job that is not over needs is touched.

use crate::context::Context;
use crate::exit::Exit;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Say what would be removed, and remove nothing.
    #[arg(long)]
    dry_run: bool,
}

pub fn run(args: &Args, ctx: &Context) -> anyhow::Result<Exit> {
    ctx.deployment()?;
    let settings = ctx.settings()?;
    let records = crate::cmd::runs::records(ctx)?;
    let queue = ctx.queue(&settings)?;
    let retention = worker::retention::Retention {
        keep: settings.keep,
        jobs_dir: ctx.dir.join("state").join("jobs"),
    };
    let total = prune(&retention, &records, &*queue, args.dry_run)?;
    crate::output::print(&pruned_text(&total, &settings.keep, args.dry_run))?;
    for folder in &total.mounted {
        eprintln!(
            "pi-dispatch: {} is left as it is: something is mounted in it (a job's view or disk that was not unmounted)",
            folder.display()
        );
    }
    for (path, kind) in &total.failed {
        eprintln!(
            "pi-dispatch: {} could not be removed ({kind:?})",
            path.display()
        );
    }
    Ok(if total.failed.is_empty() && total.mounted.is_empty() {
        Exit::Success
    } else {
        Exit::CheckFailed
    })
}

/// Retention's passes, each bounded, until one removes nothing new (with `dry_run`, one pass that
/// removes nothing): what they removed, or would.
fn prune(
    retention: &worker::retention::Retention,
    records: &records::store::Records,
    queue: &dyn queue::Queue,
    dry_run: bool,
) -> anyhow::Result<worker::retention::Pruned> {
    let now = records::record::now_ms();
    let mut total = worker::retention::Pruned::default();
    loop {
        let budget = worker::retention::Budget::default();
        let p = retention.pass(records, queue, now, budget, dry_run)?;
        let done = p.is_empty() || dry_run;
        total.records += p.records;
        total.done_jobs += p.done_jobs;
        total.transcripts += p.transcripts;
        total.folders += p.folders;
        total.bytes += p.bytes;
        total.mounted.extend(p.mounted);
        total.failed.extend(p.failed);
        // Each pass is bounded; a pass that removed nothing new is the last (a folder that
        // cannot be removed is not tried forever).
        if done || total.failed.len() > 100 {
            return Ok(total);
        }
    }
}

/// What was removed (or would be), by kind, with how long each is kept.
fn pruned_text(
    total: &worker::retention::Pruned,
    k: &config::settings::Keep,
    dry_run: bool,
) -> String {
    let verb = if dry_run {
        "would be removed"
    } else {
        "removed"
    };
    let failed = match k.failed_jobs_days {
        0 => String::new(),
        days => format!("; a job that did not complete is kept {days} days"),
    };
    format!(
        "Job folders of settled jobs (all but the transcript{failed}): {} {verb} ({})\n\
         Transcripts older than {} days: {} {verb}\n\
         Records older than {} days: {} {verb}\n{}",
        total.folders,
        mib(total.bytes),
        k.transcripts_days,
        total.transcripts,
        k.records_days,
        total.records,
        if dry_run {
            String::new()
        } else {
            format!("Finished jobs the queue forgot: {}\n", total.done_jobs)
        },
    )
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}
