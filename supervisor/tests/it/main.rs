//! The supervisor's integration tests, one test binary: trees under paused
//! tokio time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod approval_rules;
mod approval_timeout;
mod approve;
mod backend;
mod background;
mod budget;
mod cancel;
mod common;
mod compaction;
mod failure;
mod limits;
mod principals;
mod spawn;
mod steer;
mod store;
mod turns;
mod watchdogs;
