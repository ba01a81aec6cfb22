//! The worker. So far: its durable job queue.

pub mod queue;
