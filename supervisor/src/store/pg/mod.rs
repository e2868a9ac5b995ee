//! The PostgreSQL store: one database shared by every replica of a service.
//!
//! The same tree log as the SQLite store (`store/encode.rs` writes it,
//! `store/log.rs` reads it back): a `trees` row per tree and its `segments`,
//! each an LZ4-compressed JSON array of records. What differs is where the
//! rules live: fencing is checked by the database (each batch locks the rows
//! of its trees `FOR UPDATE` and every segment insert and row update names
//! the epoch it holds), claims are one transaction on the locked row, and
//! the migrations run under an advisory lock so replicas starting at once do
//! not race.
//!
//! The `Store` port is synchronous (the writer is a thread of its own, reads
//! run in `spawn_blocking`), and `tokio-postgres` is asynchronous: the store
//! owns a small runtime that drives the connections (the pool's and the
//! `LISTEN` one), and each call blocks its own thread on the client's
//! futures (`futures::executor::block_on`, with the store's runtime entered
//! so new connections land on it). That works from any thread, a tokio
//! worker included, like SQLite's calls do. No TLS yet: connections are
//! plain TCP (`NoTls`), for a database on the same host or a private network.

mod gc;
mod listen;
mod query;
mod schema;
mod turns;
mod webhook;
mod write;

/// The schema's migrations, for the test that both backends' have one shape.
#[cfg(test)]
pub(crate) use schema::MIGRATIONS;

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use arbor_actors::TreeId;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;

pub use self::schema::MigrateReport;
use crate::error::Error;
use crate::store::encode::WriterState;

/// Where the password comes from when the URL has none.
pub const PASSWORD_ENV: &str = "ARBOR_PG_PASSWORD";
/// libpq's own variable, honoured after `ARBOR_PG_PASSWORD`.
const LIBPQ_PASSWORD_ENV: &str = "PGPASSWORD";
/// Connections in the pool (the writer takes one per batch; each read one).
const POOL_SIZE: usize = 8;
/// How long the server lets a transaction of this store sit idle before it
/// ends it (and frees its row locks): a stopped process's batch.
const IDLE_IN_TRANSACTION_MS: u64 = 5_000;
/// How long a call waits for a connection, or to connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The `Store` on a PostgreSQL database (see the module doc). Open it with
/// `open` (migrates) or `open_existing` (refuses a database without Arbor's
/// schema); `migrate` only migrates.
pub struct PgStore {
    /// The URL as errors and logs show it: without its password.
    shown: String,
    /// The password, to scrub from any message that might carry it.
    password: Option<String>,
    config: tokio_postgres::Config,
    /// `None` only while dropping.
    runtime: Option<tokio::runtime::Runtime>,
    pool: Pool,
    writer: Mutex<WriterState>,
    /// How long a tree whose owner cannot be seen (another host) counts as
    /// running after its last heartbeat.
    lease_ms: u64,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("url", &self.shown)
            .field("lease_ms", &self.lease_ms)
            .finish_non_exhaustive()
    }
}

/// Dropping the store may happen inside an async context (a supervisor
/// dropped in a task): its runtime is shut down without waiting there.
impl Drop for PgStore {
    fn drop(&mut self) {
        self.pool.close();
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// `url` with its password (in the user info, or a `password` parameter)
/// replaced by `***`: what an error or a log line may show.
pub fn redact_url(url: &str) -> String {
    let mut out = url.to_owned();
    // URL form: scheme://user:password@host…
    if let Some(start) = out.find("://").map(|i| i + 3) {
        let end = out[start..]
            .find(['/', '?'])
            .map_or(out.len(), |i| start + i);
        if let Some(at) = out[start..end].rfind('@').map(|i| start + i)
            && let Some(colon) = out[start..at].find(':').map(|i| start + i)
        {
            out.replace_range(colon + 1..at, "***");
        }
    }
    // A `password=` parameter, in a query string or key=value form.
    let mut from = 0;
    while let Some(i) = out[from..].find("password=").map(|i| from + i) {
        let value = i + "password=".len();
        let starts_key = i == 0 || matches!(out.as_bytes()[i - 1], b'?' | b'&' | b' ' | b'\t');
        if !starts_key {
            from = value;
            continue;
        }
        let end = if out[value..].starts_with('\'') {
            out[value + 1..]
                .find('\'')
                .map_or(out.len(), |j| value + j + 2)
        } else {
            out[value..]
                .find(['&', ' ', '\t'])
                .map_or(out.len(), |j| value + j)
        };
        out.replace_range(value..end, "***");
        from = value + 3;
    }
    out
}

impl PgStore {
    /// Connects to the database at `url` and migrates it to this build's
    /// schema (creating it in an empty database).
    pub fn open(url: &str) -> Result<Self, Error> {
        let store = Self::connect(url)?;
        store.block(store.migrate_here())?;
        Ok(store)
    }

    /// Connects to a database that holds Arbor's schema at this build's
    /// version; refuses one without it (nothing is created or migrated).
    pub fn open_existing(url: &str) -> Result<Self, Error> {
        let store = Self::connect(url)?;
        store.block(store.check_schema())?;
        Ok(store)
    }

    /// Migrates the database at `url` to this build's schema: what it was
    /// and what it is now.
    pub fn migrate(url: &str) -> Result<MigrateReport, Error> {
        let store = Self::connect(url)?;
        store.block(store.migrate_here())
    }

    /// The URL, without its password.
    pub fn url(&self) -> &str {
        &self.shown
    }

    /// Sets how long a tree whose owner this process cannot see (another
    /// host, another pid namespace) counts as running after its last
    /// heartbeat (default `STALE_AFTER_MS`). The writer beats every second.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease_ms = lease.as_millis() as u64;
        self
    }

    fn connect(url: &str) -> Result<Self, Error> {
        let shown = redact_url(url);
        let open_err = |reason: String| Error::StoreOpen {
            path: shown.clone(),
            reason,
            busy: false,
        };
        let mut config: tokio_postgres::Config =
            url.parse().map_err(|e: tokio_postgres::Error| {
                // The parser's message may quote the text it choked on.
                open_err(format!(
                    "not a PostgreSQL URL ({})",
                    scrub(&e.to_string(), url)
                ))
            })?;
        let password = match config.get_password() {
            Some(p) => Some(String::from_utf8_lossy(p).into_owned()),
            None => {
                let env = std::env::var(PASSWORD_ENV)
                    .or_else(|_| std::env::var(LIBPQ_PASSWORD_ENV))
                    .ok();
                if let Some(p) = &env {
                    config.password(p.as_str());
                }
                env
            }
        };
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        config.application_name("arbor");
        // A process stopped (SIGSTOP, a frozen VM) in the middle of a batch
        // holds the row locks of its trees; the other replicas' claims skip
        // locked rows, so its trees could not be adopted until the server
        // ends that transaction. It does after this long idle in it (a
        // batch never idles: its statements are pipelined).
        if config.get_options().is_none() {
            config.options(format!(
                "-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS}"
            ));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("arbor-pg")
            .enable_all()
            .build()
            .map_err(|e| open_err(format!("cannot start its runtime: {e}")))?;
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(CONNECT_TIMEOUT))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .map_err(|e| open_err(format!("cannot make its pool: {e}")))?;
        let store = PgStore {
            shown,
            password,
            config,
            runtime: Some(runtime),
            pool,
            writer: Mutex::new(WriterState::default()),
            lease_ms: crate::store::STALE_AFTER_MS,
        };
        // Connect once now, so a wrong URL or password fails here.
        store.block(async { store.client().await.map(drop) })?;
        Ok(store)
    }

    /// Runs `f` to its end on this thread, with the store's runtime entered
    /// (connections made meanwhile are driven by it).
    fn block<T>(&self, f: impl Future<Output = T>) -> T {
        let _entered = self.runtime.as_ref().map(|r| r.enter());
        futures::executor::block_on(f)
    }

    /// A connection from the pool.
    async fn client(&self) -> Result<deadpool_postgres::Object, Error> {
        self.pool.get().await.map_err(|e| {
            let reason = match e {
                deadpool_postgres::PoolError::Backend(e) => self.describe(&e),
                other => scrub(&other.to_string(), self.password.as_deref().unwrap_or("")),
            };
            Error::StoreOpen {
                path: self.shown.clone(),
                reason: format!("cannot connect: {reason}"),
                busy: false,
            }
        })
    }

    /// A database error as a message: the server's own words when it sent
    /// some, and never the password.
    fn describe(&self, e: &tokio_postgres::Error) -> String {
        let text = match e.as_db_error() {
            Some(db) => format!("{}: {}", db.severity(), db.message()),
            None => {
                let mut text = e.to_string();
                let mut source = std::error::Error::source(e);
                while let Some(s) = source {
                    text.push_str(": ");
                    text.push_str(&s.to_string());
                    source = s.source();
                }
                text
            }
        };
        scrub(&text, self.password.as_deref().unwrap_or(""))
    }

    /// A failed read or write, naming the database (without its password).
    fn io(&self) -> impl Fn(tokio_postgres::Error) -> Error + '_ {
        move |e| Error::StoreIo {
            path: self.shown.clone().into(),
            source: self.describe(&e).into(),
        }
    }

    fn bad(&self, tree: &TreeId) -> impl Fn(String) -> Error + use<> {
        let path = self.shown.clone();
        let tree_id = tree.clone();
        move |reason| Error::StoreCorrupt {
            path: path.clone(),
            tree: tree_id.clone(),
            reason,
        }
    }

    fn writer(&self) -> Result<std::sync::MutexGuard<'_, WriterState>, Error> {
        self.writer
            .lock()
            .map_err(|_| Error::StorePoisoned("the store's writer state was poisoned"))
    }
}

/// `text` without `secret` in it.
fn scrub(text: &str, secret: &str) -> String {
    if secret.is_empty() {
        text.to_owned()
    } else {
        text.replace(secret, "***")
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn a_urls_password_is_redacted_wherever_it_is_written() {
        assert_eq!(
            redact_url("postgres://arbor:s3cret@db:5432/arbor"),
            "postgres://arbor:***@db:5432/arbor"
        );
        assert_eq!(
            redact_url("postgres://arbor@db/arbor?password=s3cret&sslmode=disable"),
            "postgres://arbor@db/arbor?password=***&sslmode=disable"
        );
        assert_eq!(
            redact_url("host=db user=arbor password='s3 cret' dbname=x"),
            "host=db user=arbor password=*** dbname=x"
        );
        assert_eq!(
            redact_url("postgres://arbor@127.0.0.1:5432"),
            "postgres://arbor@127.0.0.1:5432"
        );
        assert_eq!(redact_url("postgres://u:p:q@h/x"), "postgres://u:***@h/x");
    }
}
