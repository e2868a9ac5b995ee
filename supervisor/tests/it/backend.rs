//! One store suite, two backends: a fresh store of either kind for a test
//! (SQLite: a file in a temporary directory; Postgres: a database of its
//! own on the server `ARBOR_PG_URL` names, dropped at the end), and
//! `both_backends!`, which instantiates a test for each.

use std::sync::Arc;

use arbor_supervisor::store::{PgStore, SqliteStore, Store};

/// The environment variable that names the test server.
pub(crate) const PG_URL_ENV: &str = "ARBOR_PG_URL";

/// Which backend a test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backend {
    Sqlite,
    Postgres,
}

/// A fresh, empty store's place: open as many stores on it as a test needs
/// (each is another process, or replica, on the same data).
pub(crate) struct Place {
    pub(crate) backend: Backend,
    /// The file's path, or the database's URL.
    pub(crate) at: String,
    _dir: Option<tempfile::TempDir>,
    _db: Option<Database>,
}

impl Place {
    /// A store on this place (migrating it the first time).
    pub(crate) fn open(&self) -> Arc<dyn Store> {
        match self.backend {
            Backend::Sqlite => Arc::new(SqliteStore::open(self.at.as_ref()).unwrap()),
            Backend::Postgres => Arc::new(PgStore::open(&self.at).unwrap()),
        }
    }

    /// Runs one SQL statement on the store's data (the same text on either
    /// backend: for a test that plays a process out of sight).
    pub(crate) fn execute(&self, statement: &str) {
        match self.backend {
            Backend::Sqlite => {
                let db = rusqlite::Connection::open(&self.at).unwrap();
                db.execute_batch(statement).unwrap();
            }
            Backend::Postgres => pg(&self.at, statement.to_owned()),
        }
    }
}

impl Backend {
    /// A fresh place of this backend.
    pub(crate) fn fresh(self) -> Place {
        match self {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let at = dir.path().join("store.db").display().to_string();
                Place {
                    backend: self,
                    at,
                    _dir: Some(dir),
                    _db: None,
                }
            }
            Backend::Postgres => {
                let db = Database::create();
                Place {
                    backend: self,
                    at: db.url.clone(),
                    _dir: None,
                    _db: Some(db),
                }
            }
        }
    }
}

/// The test server's URL; fails the test when it is not set.
pub(crate) fn server_url() -> String {
    std::env::var(PG_URL_ENV).unwrap_or_else(|_| {
        panic!(
            "{PG_URL_ENV} is not set: the Postgres store's tests need a server. Start one with \
             `eval \"$(tests/pg/start)\"` (it prints {PG_URL_ENV}=postgres://…) and run the \
             tests again"
        )
    })
}

/// `url` naming the database `name` instead of its own.
pub(crate) fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let start = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[start..].find('/').map_or(base.len(), |i| start + i);
    let mut out = format!("{}/{name}", &base[..host_end]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

/// Runs statements on the database at `url`, on a thread and runtime of
/// their own (so from any test, async or not).
pub(crate) fn pg(url: &str, statements: String) {
    let url = url.to_owned();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap_or_else(|e| panic!("cannot connect to the test server: {e}"));
            tokio::spawn(connection);
            client.batch_execute(&statements).await.unwrap();
        });
    })
    .join()
    .unwrap();
}

/// A database of its own on the test server, dropped with this.
pub(crate) struct Database {
    pub(crate) url: String,
    name: String,
    server: String,
}

impl Database {
    pub(crate) fn create() -> Self {
        let server = server_url();
        let name = format!(
            "arbor_test_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let admin = with_database(&server, "postgres");
        pg(&admin, format!("DROP DATABASE IF EXISTS {name}"));
        pg(&admin, format!("CREATE DATABASE {name}"));
        Database {
            url: with_database(&server, &name),
            name,
            server: admin,
        }
    }
}

static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Drop for Database {
    fn drop(&mut self) {
        let server = self.server.clone();
        let name = self.name.clone();
        let _ = std::panic::catch_unwind(move || {
            pg(
                &server,
                format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            )
        });
    }
}

/// A test for each backend: `both_backends! { fn name(backend) { … } }`
/// makes `name::sqlite` and `name::postgres` (plain tests), and
/// `both_backends! { async fn name(backend) { … } }` the same under a
/// two-thread tokio runtime.
macro_rules! both_backends {
    ($(#[$meta:meta])* fn $name:ident($backend:ident) $body:block) => {
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            fn body($backend: crate::backend::Backend) $body
            #[test]
            fn sqlite() {
                body(crate::backend::Backend::Sqlite)
            }
            #[test]
            fn postgres() {
                body(crate::backend::Backend::Postgres)
            }
        }
    };
    ($(#[$meta:meta])* async fn $name:ident($backend:ident) $body:block) => {
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            async fn body($backend: crate::backend::Backend) $body
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                body(crate::backend::Backend::Sqlite).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                body(crate::backend::Backend::Postgres).await
            }
        }
    };
}
pub(crate) use both_backends;
