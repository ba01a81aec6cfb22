//! The worker's loop, around the job's path: `concurrency` slots ([`crate::slot`]), each a thread
//! of its own (bubblewrap dies with the thread that started it, so a slot's thread lives as long
//! as its jobs), each taking a job from the queue, keeping its lease alive while it runs, and
//! settling it: a record and `finish` when it is over, `retry` for an infrastructure fault (the
//! record only once no attempt is left). A record is written before the job is marked done, so a
//! worker killed in between runs the job again and the second record is not written (records are
//! written once). Beside the slots: the worker's heartbeat here, the cron triggers
//! ([`run_cron`]) and the retention passes ([`run_retention`]) on threads of their own.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use protocol::admitted::Flow;
use protocol::job::Job;
use queue::Queue;

use crate::control::queue_error;
use crate::pipeline::Worker;
use crate::slot::Slot;
use crate::verdict::{StopSignal, Verdict};
use records::record::{Draft, Record};
use records::store::Records;

pub use crate::control::Control;
pub use crate::cron::run_cron;
pub use crate::options::{DiskGate, Heartbeat, LoopOptions, Summary};
pub use crate::retention::run_retention;
pub use crate::slot::Runner;

impl Runner for Worker {
    fn process(
        &self,
        job: &Job,
        draft: Draft,
        stop: StopSignal,
    ) -> impl std::future::Future<Output = Verdict> {
        Worker::process(self, job, draft, stop)
    }

    fn settled(
        &self,
        job: &Job,
        record: &Record,
        flow: Option<Flow>,
    ) -> impl std::future::Future<Output = ()> {
        crate::forge_job::post_comment(&self.forges, job, record, flow)
    }
}

/// Runs the loop; returns when `until_empty` and nothing is open, or once `control` has drained
/// or stopped every slot.
pub fn run<R: Runner>(
    worker: Arc<R>,
    queue: Arc<dyn Queue>,
    records: Arc<Records>,
    options: &LoopOptions,
    control: Arc<Control>,
) -> Arc<Summary> {
    let summary = Arc::new(Summary::default());
    let (beat_done, beat_stop) = std::sync::mpsc::channel::<()>();
    let beating = options.heartbeat.clone().map(|heartbeat| {
        let (queue, summary, control) = (queue.clone(), summary.clone(), control.clone());
        std::thread::spawn(move || beat(&heartbeat, &*queue, &summary, &control, &beat_stop))
    });
    let slots: Vec<_> = (0..options.concurrency.max(1))
        .map(|slot| {
            let (worker, queue, records, summary, control) = (
                worker.clone(),
                queue.clone(),
                records.clone(),
                summary.clone(),
                control.clone(),
            );
            let options = options.clone();
            std::thread::spawn(move || {
                let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    tracing::error!(event = "worker_slot_failed", slot);
                    return;
                };
                let slot = Slot {
                    queue,
                    records,
                    options: &options,
                    summary: &summary,
                    control: &control,
                };
                runtime.block_on(slot.run(&*worker));
            })
        })
        .collect();
    for slot in slots {
        let _ = slot.join();
    }
    drop(beat_done);
    if let Some(beating) = beating {
        let _ = beating.join();
    }
    summary
}

/// Announces the worker at once and every heartbeat until `stop` closes, then takes it off the
/// queue's list. A queue that fails is said in the log and tried again at the next beat.
fn beat(
    heartbeat: &Heartbeat,
    queue: &dyn Queue,
    summary: &Summary,
    control: &Control,
    stop: &std::sync::mpsc::Receiver<()>,
) {
    let mut said_error = false;
    loop {
        let card = queue::WorkerCard {
            running: u32::try_from(summary.running.load(Ordering::SeqCst)).unwrap_or(u32::MAX),
            draining: control.is_draining(),
            ..heartbeat.card.clone()
        };
        match queue.announce(&card, SystemTime::now()) {
            Ok(()) => said_error = false,
            Err(e) if !said_error => {
                said_error = true;
                queue_error(&e);
            }
            Err(_) => {}
        }
        match stop.recv_timeout(heartbeat.every) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            _ => break,
        }
    }
    if let Err(e) = queue.leave(&heartbeat.card.id) {
        queue_error(&e);
    }
}

/// Writes the record (once), counted in `summary` when it is written now.
pub fn write_record(records: &Records, record: &Record, summary: Option<&Summary>) {
    if records::store::write_logged(records, record)
        && let Some(summary) = summary
    {
        summary.records.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
#[path = "service_tests.rs"]
mod tests;
