//! Where trees are stored: a SQLite file (the embedded default), or a
//! shared PostgreSQL database that several `arbor serve` replicas run
//! their trees on. One type for the config's `[store] path` / `url` and
//! every `--store` flag: a path, `sqlite://PATH`, or
//! `postgres://user@host:port/db`.
//!
//! A Postgres URL may carry a password; it is kept only in the URL the store
//! connects with and never printed: `Display` and `Debug` show the URL with
//! the password replaced by `***` (and a password given by
//! `ARBOR_PG_PASSWORD` is read by the store itself, never here).

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use arbor_supervisor::store::Store;

/// The environment variable a Postgres store takes its password from when
/// its URL has none.
pub const PASSWORD_ENV: &str = "ARBOR_PG_PASSWORD";

/// Where trees are stored.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreLocation {
    /// A SQLite file (created if missing where a store is written).
    Sqlite(PathBuf),
    /// A PostgreSQL database, shared by every replica that names it.
    Postgres(PgUrl),
}

/// A `postgres://` (or `postgresql://`) URL, checked: it names a host and a
/// database. Its password, if any, is never shown.
#[derive(Clone, PartialEq, Eq)]
pub struct PgUrl {
    url: String,
    redacted: String,
}

/// Why a store location was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreLocationError {
    /// Nothing was given.
    #[error("names no store: give a SQLite file path or a postgres:// URL")]
    Empty,
    /// A URL whose scheme Arbor has no store for.
    #[error(
        "{scheme}:// is not a store Arbor knows: give a SQLite file path, sqlite://PATH or \
         postgres://user@host:port/db"
    )]
    Scheme {
        /// The scheme given.
        scheme: String,
    },
    /// A Postgres URL that does not parse, or names no host or database.
    #[error("{url} is not a usable Postgres URL: {why} (like postgres://user@host:5432/db)")]
    Postgres {
        /// The URL as given, password redacted.
        url: String,
        /// What is wrong with it.
        why: String,
    },
}

impl StoreLocation {
    /// The SQLite file, if this is one.
    pub fn sqlite_path(&self) -> Option<&Path> {
        match self {
            StoreLocation::Sqlite(path) => Some(path),
            StoreLocation::Postgres(_) => None,
        }
    }

    /// Whether this is a shared Postgres database.
    pub fn is_postgres(&self) -> bool {
        matches!(self, StoreLocation::Postgres(_))
    }

    /// From the config's `[store]`: its `url` when it has one, else its `path`.
    pub fn from_section(
        section: &super::StoreSection,
    ) -> Result<StoreLocation, StoreLocationError> {
        match &section.url {
            Some(url) => url.parse(),
            None if section.path.as_os_str().is_empty() => Err(StoreLocationError::Empty),
            None => Ok(StoreLocation::Sqlite(section.path.clone())),
        }
    }
}

/// What `arbor migrate` found and left: the schema version before and after
/// (`None` where the backend does not say: a SQLite file is migrated when it
/// is opened).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Migrated {
    /// The version the store had (0: an empty database).
    pub from: Option<i64>,
    /// The version it has now.
    pub to: Option<i64>,
}

impl StoreLocation {
    /// Opens the store to run trees on, creating and migrating it as needed.
    pub fn open(&self) -> Result<Arc<dyn Store>, arbor_supervisor::Error> {
        match self {
            StoreLocation::Sqlite(path) => sqlite::open(path),
            StoreLocation::Postgres(url) => postgres::open(url),
        }
    }

    /// Opens a store that exists already at this build's schema (nothing is
    /// created or migrated), for the commands that change one (gc, resume).
    pub fn open_existing(&self) -> Result<Arc<dyn Store>, arbor_supervisor::Error> {
        match self {
            StoreLocation::Sqlite(path) => sqlite::open_existing(path),
            StoreLocation::Postgres(url) => postgres::open_existing(url),
        }
    }

    /// Opens a store for the commands that only read it: a SQLite file
    /// read-only; a database as it is (nothing created or migrated).
    pub fn open_read_only(&self) -> Result<Arc<dyn Store>, arbor_supervisor::Error> {
        match self {
            StoreLocation::Sqlite(path) => sqlite::open_read_only(path),
            StoreLocation::Postgres(url) => postgres::open_existing(url),
        }
    }

    /// Brings the store to this build's schema.
    pub fn migrate(&self) -> Result<Migrated, arbor_supervisor::Error> {
        match self {
            StoreLocation::Sqlite(path) => sqlite::migrate(path),
            StoreLocation::Postgres(url) => postgres::migrate(url),
        }
    }
}

/// The SQLite backend, when this build has it (the `sqlite` feature).
#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;
    use arbor_supervisor::store::SqliteStore;

    pub(super) fn open(path: &Path) -> Result<Arc<dyn Store>, arbor_supervisor::Error> {
        Ok(Arc::new(SqliteStore::open(path)?))
    }

    pub(super) fn open_existing(path: &Path) -> Result<Arc<dyn Store>, arbor_supervisor::Error> {
        Ok(Arc::new(SqliteStore::open_existing(path)?))
    }

    pub(super) fn open_read_only(path: &Path) -> Result<Arc<dyn Store>, arbor_supervisor::Error> {
        Ok(Arc::new(SqliteStore::open_read_only(path)?))
    }

    pub(super) fn migrate(path: &Path) -> Result<Migrated, arbor_supervisor::Error> {
        let (from, to) = SqliteStore::migrate(path)?;
        Ok(Migrated {
            from: Some(from),
            to: Some(to),
        })
    }
}

/// Without the `sqlite` feature: a SQLite file is refused, saying why (the
/// build compiles no C for SQLite).
#[cfg(not(feature = "sqlite"))]
mod sqlite {
    use super::*;

    fn missing(path: &Path) -> arbor_supervisor::Error {
        arbor_supervisor::Error::Store(format!(
            "cannot open {}: this build of Arbor has no SQLite store (build arbor-agents with \
             the `sqlite` feature, or store trees in Postgres)",
            path.display()
        ))
    }

    pub(super) fn open(path: &Path) -> Result<Arc<dyn Store>, arbor_supervisor::Error> {
        Err(missing(path))
    }

    pub(super) fn open_existing(path: &Path) -> Result<Arc<dyn Store>, arbor_supervisor::Error> {
        Err(missing(path))
    }

    pub(super) fn open_read_only(path: &Path) -> Result<Arc<dyn Store>, arbor_supervisor::Error> {
        Err(missing(path))
    }

    pub(super) fn migrate(path: &Path) -> Result<Migrated, arbor_supervisor::Error> {
        Err(missing(path))
    }
}

/// The Postgres backend, when this build has it (the `postgres` feature).
#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use arbor_supervisor::store::PgStore;

    pub(super) fn open(url: &PgUrl) -> Result<Arc<dyn Store>, arbor_supervisor::Error> {
        Ok(Arc::new(PgStore::open(url.expose())?))
    }

    pub(super) fn open_existing(url: &PgUrl) -> Result<Arc<dyn Store>, arbor_supervisor::Error> {
        Ok(Arc::new(PgStore::open_existing(url.expose())?))
    }

    pub(super) fn migrate(url: &PgUrl) -> Result<Migrated, arbor_supervisor::Error> {
        let report = PgStore::migrate(url.expose())?;
        Ok(Migrated {
            from: Some(report.from),
            to: Some(report.to),
        })
    }
}

/// Without the `postgres` feature: a Postgres URL is refused, saying why.
#[cfg(not(feature = "postgres"))]
mod postgres {
    use super::*;

    fn missing(url: &PgUrl) -> arbor_supervisor::Error {
        arbor_supervisor::Error::Store(format!(
            "cannot open {url}: this build of Arbor has no Postgres store (build it with the \
             `postgres` feature)"
        ))
    }

    pub(super) fn open(url: &PgUrl) -> Result<Arc<dyn Store>, arbor_supervisor::Error> {
        Err(missing(url))
    }

    pub(super) fn open_existing(url: &PgUrl) -> Result<Arc<dyn Store>, arbor_supervisor::Error> {
        Err(missing(url))
    }

    pub(super) fn migrate(url: &PgUrl) -> Result<Migrated, arbor_supervisor::Error> {
        Err(missing(url))
    }
}

impl FromStr for StoreLocation {
    type Err = StoreLocationError;

    /// A path (`arbor.db`, `/var/lib/arbor/arbor.db`), `sqlite://PATH`, or
    /// `postgres://…` / `postgresql://…`.
    fn from_str(text: &str) -> Result<StoreLocation, StoreLocationError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(StoreLocationError::Empty);
        }
        let Some((scheme, rest)) = text.split_once("://") else {
            return Ok(StoreLocation::Sqlite(PathBuf::from(text)));
        };
        match scheme.to_ascii_lowercase().as_str() {
            "sqlite" if rest.is_empty() => Err(StoreLocationError::Empty),
            "sqlite" => Ok(StoreLocation::Sqlite(PathBuf::from(rest))),
            "postgres" | "postgresql" => PgUrl::parse(text).map(StoreLocation::Postgres),
            // A path that happens to hold "://" further on (a directory
            // named so) is still a path; a scheme is letters only.
            _ if !scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) =>
            {
                Ok(StoreLocation::Sqlite(PathBuf::from(text)))
            }
            _ => Err(StoreLocationError::Scheme {
                scheme: scheme.to_owned(),
            }),
        }
    }
}

impl PgUrl {
    /// Checks a `postgres://` URL: it parses, names a host and a database.
    pub fn parse(text: &str) -> Result<PgUrl, StoreLocationError> {
        let redacted = redact(text);
        let refuse = |why: &str| StoreLocationError::Postgres {
            url: redacted.clone(),
            why: why.to_owned(),
        };
        let url = reqwest::Url::parse(text).map_err(|e| refuse(&e.to_string()))?;
        if url.host_str().is_none_or(str::is_empty) {
            return Err(refuse("it names no host"));
        }
        if url.path().trim_start_matches('/').is_empty() {
            return Err(refuse("it names no database (the path after the host)"));
        }
        Ok(PgUrl {
            url: text.to_owned(),
            redacted,
        })
    }

    /// The URL to connect with, password included: only for the store.
    pub fn expose(&self) -> &str {
        &self.url
    }

    /// The URL with its password (if any) shown as `***`.
    pub fn redacted(&self) -> &str {
        &self.redacted
    }
}

/// `text` with the password of its `user:password@` part replaced by `***`
/// (kept as it is when it has none, or is not a URL).
pub fn redact(text: &str) -> String {
    let Some((scheme, rest)) = text.split_once("://") else {
        return text.to_owned();
    };
    // The authority ends at the first '/', '?' or '#'; its userinfo at the
    // last '@' in it (a password may hold '@' unencoded).
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return redact_query(text);
    };
    let user = match userinfo.split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        None => userinfo.to_owned(),
    };
    redact_query(&format!("{scheme}://{user}@{host}{tail}"))
}

/// A `password=` query parameter (libpq accepts one) shown as `***`.
fn redact_query(text: &str) -> String {
    let Some((base, query)) = text.split_once('?') else {
        return text.to_owned();
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _)) if key.eq_ignore_ascii_case("password") => format!("{key}=***"),
            _ => pair.to_owned(),
        })
        .collect();
    format!("{base}?{}", query.join("&"))
}

impl fmt::Display for StoreLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreLocation::Sqlite(path) => write!(f, "{}", path.display()),
            StoreLocation::Postgres(url) => f.write_str(url.redacted()),
        }
    }
}

impl fmt::Debug for StoreLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreLocation::Sqlite(path) => f.debug_tuple("Sqlite").field(path).finish(),
            StoreLocation::Postgres(url) => f.debug_tuple("Postgres").field(url).finish(),
        }
    }
}

impl fmt::Display for PgUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl fmt::Debug for PgUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PgUrl({:?})", self.redacted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<StoreLocation, StoreLocationError> {
        text.parse()
    }

    /// A lean build (no `sqlite` feature) compiles no SQLite: a SQLite
    /// store is refused, naming the file and the feature, for every use.
    #[cfg(not(feature = "sqlite"))]
    #[test]
    fn a_build_without_sqlite_refuses_a_sqlite_store_naming_the_feature() {
        let location = StoreLocation::Sqlite(PathBuf::from("trees.db"));
        let errors = [
            location.open().err(),
            location.open_existing().err(),
            location.open_read_only().err(),
            location.migrate().err(),
        ];
        for error in errors {
            let text = error.expect("refused").to_string();
            assert!(text.contains("trees.db"), "{text}");
            assert!(text.contains("`sqlite` feature"), "{text}");
        }
        assert!(!std::path::Path::new("trees.db").exists());
    }

    /// With the feature, the same location opens (and so makes) the file.
    #[cfg(feature = "sqlite")]
    #[test]
    fn a_build_with_sqlite_opens_a_sqlite_store() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("trees.db");
        let location = StoreLocation::Sqlite(path.clone());
        assert!(location.open().is_ok());
        assert!(path.exists());
        assert!(location.open_read_only().is_ok());
    }

    #[test]
    fn a_path_or_a_sqlite_url_is_a_sqlite_file() {
        for (text, path) in [
            ("arbor.db", "arbor.db"),
            ("/var/lib/arbor/arbor.db", "/var/lib/arbor/arbor.db"),
            ("sqlite://arbor.db", "arbor.db"),
            ("sqlite:///var/lib/a.db", "/var/lib/a.db"),
            ("odd dir://x/a.db", "odd dir://x/a.db"),
        ] {
            assert_eq!(
                parse(text).unwrap(),
                StoreLocation::Sqlite(PathBuf::from(path)),
                "{text}"
            );
        }
    }

    #[test]
    fn a_postgres_url_is_checked_and_its_password_never_shown() {
        let location = parse("postgres://arbor:s3cret@db.internal:5432/arbor").unwrap();
        assert!(location.is_postgres());
        let shown = format!("{location} {location:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(
            shown.contains("postgres://arbor:***@db.internal:5432/arbor"),
            "{shown}"
        );
        let StoreLocation::Postgres(url) = &location else {
            unreachable!()
        };
        assert_eq!(
            url.expose(),
            "postgres://arbor:s3cret@db.internal:5432/arbor"
        );
        assert!(
            parse("postgresql://arbor@127.0.0.1/arbor")
                .unwrap()
                .is_postgres()
        );
    }

    #[test]
    fn bad_locations_are_refused_naming_what_is_wrong() {
        assert_eq!(parse("  "), Err(StoreLocationError::Empty));
        assert_eq!(parse("sqlite://"), Err(StoreLocationError::Empty));
        let mysql = parse("mysql://u@h/db").unwrap_err().to_string();
        assert!(mysql.contains("mysql:// is not a store"), "{mysql}");
        let no_db = parse("postgres://u:pw@host:5432").unwrap_err().to_string();
        assert!(no_db.contains("names no database"), "{no_db}");
        assert!(!no_db.contains("pw"), "{no_db}");
        let no_host = parse("postgres:///db").unwrap_err().to_string();
        assert!(no_host.contains("no host"), "{no_host}");
    }

    #[test]
    fn redaction_covers_the_userinfo_and_a_password_parameter() {
        assert_eq!(redact("postgres://u:p@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://u:p@ss@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(
            redact("postgres://h/db?user=u&password=p&sslmode=disable"),
            "postgres://h/db?user=u&password=***&sslmode=disable"
        );
        assert_eq!(redact("arbor.db"), "arbor.db");
    }
}
