//! [`PostgresMeta`]: a PostgreSQL server behind [`MetaStore`], so that
//! mounts on several hosts can share one volume.
//!
//! The operations are `crate::ops`, shared with the SQLite engine, run on
//! a PostgreSQL transaction through [`db`] (its implementation of the
//! statement layer `crate::sql`); the schema and its migrations are in
//! [`schema`].
//!
//! Transactions: every mutation (with its exactly-once record, when it has
//! a request key) is one SERIALIZABLE transaction, retried from the start
//! on a serialization failure or deadlock (SQLSTATE 40001 / 40P01) up to
//! [`WRITE_ATTEMPT_COUNT_MAX`] times, so concurrent hosts see the same
//! one-writer-at-a-time semantics SQLite's `BEGIN IMMEDIATE` gives; reads
//! run in REPEATABLE READ READ ONLY transactions (one snapshot per call),
//! except a read of one statement (`getattr`, `lookup`, `getxattr`), which
//! is its own snapshot outside any transaction: one round trip, not three.
//! Connections: a pool of [`PG_CONNECTIONS_MAX`] clients; a closed client
//! (server restart) is reconnected before its next use. TLS by the URL's
//! `sslmode=` and `sslrootcert=` ([`tls`]).

pub(crate) mod db;
mod schema;
pub mod tls;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use ::postgres::{Client, IsolationLevel, NoTls};

use self::db::{Connection, DbError, StatementCache};
use crate::answered::AnsweredQueue;
use crate::engine::Engine;
use crate::error::{MetaError, Result};
use crate::ops::requests;
use crate::record::Recorded;
use crate::tx_stats::{TxCounters, TxKind};
use crate::types::{RequestKey, Timespec, VolumeConfig, VolumeRecord};
use crate::FORMAT_VERSION;

/// Client connections per opened volume.
pub const PG_CONNECTIONS_MAX: usize = 4;
/// Attempts of one mutation when PostgreSQL reports a serialization
/// failure or a deadlock (first try included).
pub const WRITE_ATTEMPT_COUNT_MAX: u32 = 16;
/// First backoff between attempts; doubles up to [`WRITE_BACKOFF_MS_MAX`].
pub const WRITE_BACKOFF_MS_INITIAL: u64 = 1;
/// Upper bound of one backoff sleep.
pub const WRITE_BACKOFF_MS_MAX: u64 = 100;
/// Time to establish a connection to the server.
pub const PG_CONNECT_TIMEOUT_MS: u64 = 5_000;

/// Whether `url` names a PostgreSQL database.
pub fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// `url` without its password, for messages. Pure. The user info ends at
/// the last `@`, so a password holding an unencoded `/` or `@` is masked
/// whole (`upgrade_protocol`'s volume strings mask the same way).
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) if !user.contains('/') => {
                format!("{scheme}://{user}:***@{host}")
            }
            _ => url.to_string(),
        },
        None => url.to_string(),
    }
}

struct PgConn {
    client: Client,
    cache: StatementCache,
}

/// A Baton volume's metadata in a PostgreSQL database (its current schema).
pub struct PostgresMeta {
    url: String,
    volume: VolumeRecord,
    pool: Vec<Mutex<PgConn>>,
    next: AtomicUsize,
    /// Answered requests whose records a later write deletes.
    answered: AnsweredQueue,
    tx: TxCounters,
    /// `true` once fenced. Writes hold the read side for their whole
    /// transaction; `fence` takes the write side, so it waits for them.
    fenced: std::sync::RwLock<bool>,
    /// Corruption found while serving: writes refused.
    quarantine: crate::quarantine::Quarantine,
}

impl std::fmt::Debug for PostgresMeta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresMeta")
            .field("url", &redact_url(&self.url))
            .field("volume", &self.volume.name)
            .finish()
    }
}

fn connect(url: &str) -> Result<Client> {
    let invalid = |why: String| MetaError::Postgres {
        op: "connect",
        code: None,
        message: format!("{} is not a valid PostgreSQL URL: {why}", redact_url(url)),
    };
    let options = tls::parse(url).map_err(invalid)?;
    let mut config: ::postgres::Config = options
        .url
        .parse()
        .map_err(|e: ::postgres::Error| invalid(e.to_string()))?;
    config.connect_timeout(Duration::from_millis(PG_CONNECT_TIMEOUT_MS));
    let connected = match tls::connector(&options)? {
        Some(tls) => config.connect(tls),
        None => config.connect(NoTls),
    };
    connected.map_err(|e| {
        // A server's refusal says why in its message ("no pg_hba.conf
        // entry ... no encryption"); the error's Display only "db error".
        let text = match e.as_db_error() {
            Some(db) => db.message().to_string(),
            None => e.to_string(),
        };
        let hint = if text.contains("certificate") || text.contains("TLS") || text.contains("tls") {
            "; check that sslrootcert= names the CA that signed the server's certificate \
             and (verify-full) that the URL's host is in the certificate"
        } else if text.contains("SSL") || text.contains("no pg_hba.conf entry") {
            "; if the server requires TLS, add ?sslmode=require (or verify-full&sslrootcert=CA.pem)"
        } else {
            ""
        };
        MetaError::Postgres {
            op: "connect",
            code: e.code().map(|c| c.code().to_string()),
            message: format!("cannot connect to {}: {text}{hint}", redact_url(url)),
        }
    })
}

fn is_retryable(e: &MetaError) -> bool {
    matches!(e, MetaError::Postgres { code: Some(code), .. } if code == "40001" || code == "40P01")
}

impl PostgresMeta {
    /// Creates the schema, the volume record and the root directory in the
    /// (empty) database `url`, and opens it. Refuses with
    /// [`MetaError::AlreadyFormatted`] if the database holds a volume.
    pub fn format(url: &str, config: &VolumeConfig) -> Result<PostgresMeta> {
        Self::format_at_version(url, config, schema::latest_version())
    }

    /// [`PostgresMeta::format`] with only the first `version` migrations:
    /// a volume as an older Baton made it (tests of migrations).
    #[doc(hidden)]
    pub fn format_at_version(
        url: &str,
        config: &VolumeConfig,
        version: i64,
    ) -> Result<PostgresMeta> {
        config.check()?;
        let volume = VolumeRecord {
            name: config.name.clone(),
            uuid: random_u128()?,
            storage_url: config.storage_url.clone(),
            block_size_bytes: config.block_size_bytes,
            format_version: FORMAT_VERSION,
            created: Timespec::now(),
        };
        let mut client = connect(url)?;
        let mut cache = StatementCache::new();
        let version = version.clamp(1, schema::latest_version());
        schema::create(&mut client, &mut cache, &volume, version, &redact_url(url))
            .map_err(|e| e.in_op("format"))?;
        if version < schema::latest_version() {
            // An older layout: do not open (that would migrate it).
            return Self::without_migration(url, volume, client);
        }
        Self::with_first_client(url, volume, PgConn { client, cache })
    }

    fn without_migration(url: &str, volume: VolumeRecord, client: Client) -> Result<PostgresMeta> {
        Self::with_first_client(
            url,
            volume,
            PgConn {
                client,
                cache: StatementCache::new(),
            },
        )
    }

    /// Opens the volume in database `url`: checks it is Baton's and not
    /// newer than this build, and runs the migrations it lacks.
    pub fn open(url: &str) -> Result<PostgresMeta> {
        let mut client = connect(url)?;
        let mut cache = StatementCache::new();
        let volume =
            schema::open(&mut client, &mut cache, &redact_url(url)).map_err(|e| e.in_op("open"))?;
        Self::with_first_client(url, volume, PgConn { client, cache })
    }

    fn with_first_client(url: &str, volume: VolumeRecord, first: PgConn) -> Result<PostgresMeta> {
        let mut pool = Vec::with_capacity(PG_CONNECTIONS_MAX);
        pool.push(Mutex::new(first));
        for _ in 1..PG_CONNECTIONS_MAX {
            pool.push(Mutex::new(PgConn {
                client: connect(url)?,
                cache: StatementCache::new(),
            }));
        }
        tracing::debug!(url = %redact_url(url), volume = %volume.name, "metadata opened");
        Ok(PostgresMeta {
            url: url.to_string(),
            volume,
            pool,
            next: AtomicUsize::new(0),
            answered: AnsweredQueue::default(),
            tx: TxCounters::default(),
            fenced: std::sync::RwLock::new(false),
            quarantine: crate::quarantine::Quarantine::default(),
        })
    }

    /// Runs `f` on a pool client as one read: counted, and its errors
    /// carry `op`.
    fn read_on_client<T>(
        &self,
        op: &'static str,
        f: impl FnOnce(&mut Client, &mut StatementCache) -> Result<T>,
    ) -> Result<T> {
        let start = Instant::now();
        let mut guard = match self.conn() {
            Ok(guard) => guard,
            Err(e) => {
                self.tx.record(TxKind::Read, start, false);
                return Err(e.in_op(op));
            }
        };
        let PgConn { client, cache } = &mut *guard;
        let result = f(client, cache);
        self.tx.record(TxKind::Read, start, result.is_ok());
        result.map_err(|e| self.quarantine.observe(log_store_error(e.in_op(op))))
    }

    /// The schema version recorded in the database.
    pub fn schema_version(&self) -> Result<i64> {
        let mut conn = self.conn()?;
        schema::version(&mut conn.client)
    }

    /// The schema version this build creates.
    pub fn latest_schema_version() -> i64 {
        schema::latest_version()
    }

    /// A free pool client if there is one, else waits for one; reconnects
    /// a client whose connection closed.
    fn conn(&self) -> Result<MutexGuard<'_, PgConn>> {
        let count = self.pool.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % count;
        let mut guard = (0..count)
            .find_map(|i| self.pool[(start + i) % count].try_lock().ok())
            .unwrap_or_else(|| {
                self.pool[start]
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
            });
        if guard.client.is_closed() {
            tracing::warn!(url = %redact_url(&self.url), "metadata connection closed; reconnecting");
            guard.client = connect(&self.url)?;
            guard.cache.clear();
        }
        Ok(guard)
    }
}

fn log_store_error(e: MetaError) -> MetaError {
    if let MetaError::Postgres { op, message, .. } = &e {
        tracing::warn!(op, error = %message, "metadata store error");
    }
    e
}

fn random_u128() -> Result<u128> {
    use std::io::Read;
    let mut buf = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|source| MetaError::Io {
            path: "/dev/urandom".into(),
            source,
        })?;
    Ok(u128::from_be_bytes(buf))
}

impl Engine for PostgresMeta {
    type Conn<'c> = Connection<'c>;

    const STATEMENT_IS_ROUND_TRIP: bool = true;
    const SHARED_BY_HOSTS: bool = true;

    fn volume_record(&self) -> &VolumeRecord {
        &self.volume
    }

    fn answered_queue(&self) -> &AnsweredQueue {
        &self.answered
    }

    fn tx_counters(&self) -> &TxCounters {
        &self.tx
    }

    /// Runs `f` in one SERIALIZABLE transaction; with a request key, also
    /// records `encode(result)` in it. Retried on serialization failures.
    fn write<T>(
        &self,
        op: &'static str,
        req: Option<RequestKey>,
        f: impl Fn(&Connection<'_>) -> Result<T>,
        encode: impl Fn(&T) -> Recorded,
    ) -> Result<T> {
        let fence = self
            .fenced
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *fence {
            return Err(MetaError::Fenced { op });
        }
        self.quarantine.check(op)?;
        let answered = match req {
            Some(_) => self.answered.take_due(),
            None => Vec::new(),
        };
        let start = Instant::now();
        let mut guard = self.conn().map_err(|e| e.in_op(op))?;
        let mut attempt_count = 0;
        let result = loop {
            attempt_count += 1;
            let PgConn { client, cache } = &mut *guard;
            let mut run = || -> Result<T> {
                let tx = client
                    .build_transaction()
                    .isolation_level(IsolationLevel::Serializable)
                    .start()
                    .map_err(DbError::from)?;
                let c = Connection::new(tx, cache);
                let out = f(&c)?;
                if let Some(key) = req {
                    requests::record(&c, key, &encode(&out).encode())?;
                    requests::forget(&c, &answered)?;
                }
                c.commit()?;
                Ok(out)
            };
            match run() {
                Err(e) if is_retryable(&e) && attempt_count < WRITE_ATTEMPT_COUNT_MAX => {
                    let shift = (attempt_count - 1).min(16);
                    let ms = (WRITE_BACKOFF_MS_INITIAL << shift).min(WRITE_BACKOFF_MS_MAX);
                    tracing::debug!(op, attempt_count, "serialization conflict, retrying");
                    std::thread::sleep(Duration::from_millis(ms));
                }
                other => {
                    break other.map_err(|e| self.quarantine.observe(log_store_error(e.in_op(op))))
                }
            }
        };
        if result.is_err() && !answered.is_empty() {
            // Rolled back: keep the keys for a later write.
            self.answered.put_back(answered);
        }
        self.tx.record(TxKind::Write, start, result.is_ok());
        result
    }

    /// Runs `f` in a REPEATABLE READ, READ ONLY transaction.
    fn read<T>(&self, op: &'static str, f: impl FnOnce(&Connection<'_>) -> Result<T>) -> Result<T> {
        self.read_on_client(op, |client, cache| {
            let tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .map_err(DbError::from)?;
            let c = Connection::new(tx, cache);
            let out = f(&c)?;
            c.commit()?;
            Ok(out)
        })
    }

    /// Runs `f`, ONE statement, on a pool client outside any transaction:
    /// the statement is its own snapshot, and costs one round trip where
    /// [`Engine::read`] costs three (`getattr`, `lookup`, `getxattr`).
    fn read_one<T>(
        &self,
        op: &'static str,
        f: impl FnOnce(&Connection<'_>) -> Result<T>,
    ) -> Result<T> {
        self.read_on_client(op, |client, cache| {
            f(&Connection::one_statement(client, cache))
        })
    }

    fn make_durable(&self) -> Result<()> {
        // Every PostgreSQL commit is already durable when it returns (the
        // server's synchronous_commit, on by default).
        Ok(())
    }

    fn quarantine(&self) -> &crate::quarantine::Quarantine {
        &self.quarantine
    }

    fn fence_writes(&self) {
        *self
            .fenced
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = true;
    }

    fn unfence_writes(&self) {
        *self
            .fenced
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = false;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted_from_urls() {
        assert_eq!(
            redact_url("postgres://baton:s3cret@db.example:5432/vol"),
            "postgres://baton:***@db.example:5432/vol"
        );
        assert_eq!(
            redact_url("postgres://postgres@127.0.0.1:5/db"),
            "postgres://postgres@127.0.0.1:5/db"
        );
        assert_eq!(redact_url("postgresql://h"), "postgresql://h");
        // An unencoded `/` or `@` in the password: masked whole.
        assert_eq!(
            redact_url("postgres://baton:pa/ss@w0rd@db:5432/vol"),
            "postgres://baton:***@db:5432/vol"
        );
        assert!(is_postgres_url("postgresql://h/db") && !is_postgres_url("sqlite:///x"));
    }
}
