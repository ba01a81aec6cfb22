//! `pi-dispatch rerun ID [--force]`: queues a new job that runs job ID again, with the job as it
//! was queued (its forge event, its folder and task) under its trigger's policy as it is now,
//! through the admission as any job. The new job names the one it runs again, and `runs show ID` lists its reruns. A job
//! that has not ended is not run again (cancel it first); a local job's folder with uncommitted
//! changes is refused unless `--force`, as `run` refuses it.

use std::path::PathBuf;

use protocol::job::Job;
use records::store::RecordError;

use crate::cmd::run::{Queued, queue_job, refusal_text};
use crate::context::Context;
use crate::exit::Exit;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The id of the job to run again (as `pi-dispatch runs` shows it).
    id: String,
    /// Run a local job again even though its folder has uncommitted changes.
    #[arg(long)]
    force: bool,
}

/// Why a job is not run again: what to say, and the exit.
pub struct NotRun {
    pub why: String,
    pub exit: Exit,
}

fn not_run(why: String, exit: Exit) -> NotRun {
    NotRun { why, exit }
}

/// The job that runs `original` again, under a new id: as it was queued, under its trigger's
/// policy as the trigger stands now (the admission holds it to that too; a trigger that is gone
/// refuses it there).
fn again(ctx: &Context, original: &Job, of: &str) -> anyhow::Result<Job> {
    let trigger = match original.trigger_index {
        Some(index) => {
            let settings = ctx.settings()?;
            config::triggers::TriggersFile::read(&settings.triggers_file)
                .ok()
                .and_then(|all| all.trigger(index).ok().cloned())
                .filter(|t| pickup::admission::queued_by(original, t))
        }
        None => None,
    };
    // A cron job's id names its trigger's id (its secrets are checked against it).
    let prefix = match trigger.as_ref().map(|t| &t.on) {
        Some(config::triggers::On::Cron { id, .. }) => format!("cron-{id}-rerun"),
        _ => "rerun".to_owned(),
    };
    let now = pickup::admission::under_policy_now(original, trigger.as_ref());
    Ok(Job {
        id: crate::cmd::run::new_job_id(&prefix)?,
        rerun_of: Some(of.to_owned()),
        host: None,
        ..now
    })
}

/// Queues job `id` again: the new job's id, or why not.
pub fn rerun(ctx: &Context, id: &str, force: bool) -> anyhow::Result<Result<String, NotRun>> {
    let shown = crate::output::display_name(id);
    let records = crate::cmd::runs::records(ctx)?;
    let record = match records.read(id) {
        Ok(r) => r,
        Err(RecordError::NotFound) => {
            let settings = ctx.settings()?;
            let open = queue::exists(&settings)
                && ctx
                    .queue(&settings)?
                    .status(std::time::SystemTime::now(), 0)?
                    .open
                    .iter()
                    .any(|j| j.id == id);
            return Ok(Err(if open {
                not_run(
                    format!(
                        "job {shown} has not ended: follow it (pi-dispatch runs show {shown} --follow), or cancel it first"
                    ),
                    Exit::CheckFailed,
                )
            } else {
                not_run(
                    format!("no job has the id {shown} (see pi-dispatch runs)"),
                    Exit::Unusable,
                )
            }));
        }
        Err(e) => return Err(e.into()),
    };
    let Some(original) = &record.job else {
        return Ok(Err(not_run(
            format!(
                "the record of {shown} was written by an earlier pi-dispatch and keeps no job to run again; queue it anew (pi-dispatch run)"
            ),
            Exit::CheckFailed,
        )));
    };
    let job = again(ctx, original, &record.job_id)?;
    if let (Some(folder), Some(protocol::job::Kind::Local)) = (&job.folder, job.kind()) {
        let limit = std::time::Duration::from_secs(ctx.settings()?.run_check_secs);
        if !force && crate::cmd::run::dirty(&PathBuf::from(folder), limit)? {
            return Ok(Err(not_run(
                format!(
                    "the job's folder {folder} has uncommitted changes, and the job would work among them; commit or stash them, or pass --force"
                ),
                Exit::CheckFailed,
            )));
        }
    }
    match queue_job(ctx, &job)? {
        Queued::Refused(r) => Ok(Err(not_run(
            refusal_text(&r)
                .trim_start_matches("pi-dispatch: ")
                .trim_end()
                .to_owned(),
            Exit::CheckFailed,
        ))),
        Queued::Yes { id: new, unchecked } => {
            if let Some(detail) = unchecked {
                tracing::warn!(event = "rerun_unchecked", job_id = %new, detail = %detail);
            }
            let settings = ctx.settings()?;
            ctx.queue(&settings)?.link_rerun(&record.job_id, &new)?;
            tracing::info!(event = "rerun_queued", job_id = %new, rerun_of = %record.job_id);
            Ok(Ok(new))
        }
    }
}

pub fn run(args: &Args, ctx: &Context) -> anyhow::Result<Exit> {
    ctx.deployment()?;
    match rerun(ctx, &args.id, args.force)? {
        Ok(new) => {
            crate::output::print(&format!(
                "Queued {new}, which runs {} again (pi-dispatch runs show {new} --follow to watch it).\n",
                crate::output::display_name(&args.id)
            ))?;
            Ok(Exit::Success)
        }
        Err(NotRun { why, exit }) => {
            eprintln!("pi-dispatch: {why}");
            Ok(exit)
        }
    }
}
