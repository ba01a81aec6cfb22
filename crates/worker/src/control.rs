//! What tells the worker's threads to stop, around the job's path: the control that drains and
//! stops the slots, the cron thread and the retention thread, and how a queue that fails is said.

use std::sync::atomic::{AtomicBool, Ordering};

/// Tells the loop to stop: first it drains (takes no new job, lets the running ones finish), then
/// it stops (ends the running ones and hands them back to the queue).
#[derive(Debug, Default)]
pub struct Control {
    draining: AtomicBool,
    stopping: AtomicBool,
}

impl Control {
    pub fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn stop(&self) {
        self.draining.store(true, Ordering::SeqCst);
        self.stopping.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }
}

/// A queue that failed, said in the log (the caller tries again at its next turn).
pub(crate) fn queue_error(e: &queue::QueueError) {
    tracing::error!(event = "queue_error", detail = %e);
}
