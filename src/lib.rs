//! Arbor: an actor-based hierarchical supervisor for trees of LLM agents.
//!
//! This crate is the facade: configuration, built-in and (later) real model
//! providers, and the `arbor` command line. The agent runtime lives in
//! [`arbor_actors`] (re-exported as [`actors`]) and tree-wide policy in
//! [`arbor_supervisor`] (re-exported as [`supervisor`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use arbor::{Config, Runtime};
//! let runtime = Runtime::new(Config::default_config()?)?;
//! let result = runtime.run("coordinator", "Compare three sorting algorithms").await?;
//! println!("{}", result.state.status.as_str());
//! # Ok(()) }
//! ```

pub mod config;
pub mod loadtest;
pub mod providers;
pub mod render;
pub mod runs;

pub use arbor_actors as actors;
pub use arbor_supervisor as supervisor;
pub use config::{Config, ConfigError};

use arbor_actors::RunResult;
use arbor_supervisor::{StartRequest, Supervisor};

/// Errors of the facade.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Supervisor(#[from] arbor_supervisor::Error),
}

/// A supervisor built from a config.
pub struct Runtime {
    config: Config,
    supervisor: Supervisor,
}

impl Runtime {
    /// A runtime that keeps its trees in memory only.
    pub fn new(config: Config) -> Result<Runtime, Error> {
        let catalog = config.catalog()?;
        let supervisor = Supervisor::new(catalog, config.limits.clone());
        Ok(Runtime { config, supervisor })
    }

    /// A runtime that stores every tree in the SQLite file at `path` (created if
    /// missing), so its runs can be browsed, resumed after a crash and replayed.
    pub fn with_store(config: Config, path: &std::path::Path) -> Result<Runtime, Error> {
        let catalog = config.catalog()?;
        let store = arbor_supervisor::store::SqliteStore::open(path)?;
        let supervisor = Supervisor::new(catalog, config.limits.clone())
            .with_store(std::sync::Arc::new(store))?;
        Ok(Runtime { config, supervisor })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn supervisor(&self) -> &Supervisor {
        &self.supervisor
    }

    /// Runs `agent` on `prompt` to the end.
    pub async fn run(&self, agent: &str, prompt: &str) -> Result<RunResult, Error> {
        let request = StartRequest {
            agent: agent.to_owned(),
            prompt: prompt.to_owned(),
            ..StartRequest::default()
        };
        Ok(self.supervisor.run(request).await?)
    }
}
