//! The `arbor` binary's library: the load test (`arbor loadtest`), which
//! benches and tests drive without the command line. The commands themselves
//! are the binary's (`src/main.rs`, `src/cli/`).

#![deny(missing_docs)]

pub mod loadtest;
