//! The actors' integration tests, one test binary: the history against the
//! spec's examples and as properties, and the step machine without a runtime.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod history;
mod history_props;
mod step_machine;
