//! The volume string: what names a volume on every command line and in
//! every request (`fsctl mount VOLUME`, [`crate::Request::Mount`],
//! `fsclient serve VOLUME`). One pure parse, shared by the fd holder, fsctl
//! and the filesystem, so the three never disagree on what a string means
//! or where its local state lives.
//!
//! | string | metadata | local state (lock, staging, cache) |
//! |---|---|---|
//! | `NAME` | `BASE/NAME/meta.db` | `BASE/NAME` |
//! | `sqlite:///abs/meta.db` (or `sqlite:/abs/meta.db`) | that file | its directory |
//! | `postgres://user@host:port/DB?opts` | that database | `BASE/pg-DB` |

use std::fmt;
use std::path::{Path, PathBuf};

/// A volume name is at most this long.
pub const VOLUME_NAME_LEN_MAX: usize = 128;

/// A parsed volume string. Pure: parsing touches no file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VolumeSpec {
    /// A volume under the base directory.
    Named(String),
    /// A SQLite metadata file, named by an absolute path.
    Sqlite(PathBuf),
    /// A PostgreSQL database, which other hosts may mount too.
    Postgres {
        /// The URL as given (it may hold a password: never print it; use
        /// [`VolumeSpec::display`]).
        url: String,
        /// The database the URL names.
        database: String,
    },
}

/// A volume string that names no volume; the message says what would.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("volume `{volume}` {reason}")]
pub struct VolumeSpecError {
    /// The string as given, its password masked.
    pub volume: String,
    /// What is wrong and what to write instead.
    pub reason: &'static str,
}

impl VolumeSpec {
    /// Parses a volume name, a `sqlite:` URL or a `postgres://` URL.
    pub fn parse(text: &str) -> Result<VolumeSpec, VolumeSpecError> {
        let refuse = |reason| VolumeSpecError {
            volume: redact_url(text),
            reason,
        };
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            let database = postgres_database(text).ok_or_else(|| {
                refuse("names no database: use postgres://user@host:port/DB (DB of letters, digits, `_`, `-`, `.`)")
            })?;
            return Ok(VolumeSpec::Postgres {
                url: text.to_string(),
                database: database.to_string(),
            });
        }
        if let Some(rest) = text.strip_prefix("sqlite:") {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            let usable = path.starts_with('/') && Path::new(path).file_name().is_some();
            if !usable {
                return Err(refuse(
                    "is not a usable SQLite URL: use sqlite:///absolute/path/meta.db",
                ));
            }
            return Ok(VolumeSpec::Sqlite(PathBuf::from(path)));
        }
        if text.contains("://") {
            return Err(refuse(
                "has a scheme Baton does not know: use a volume name, sqlite:///path/meta.db or postgres://user@host:port/DB",
            ));
        }
        if !is_valid_name(text) {
            return Err(refuse(
                "is not a volume name: use letters, digits, `-`, `_` and `.` (not starting with `.`, at most 128), or a sqlite:// or postgres:// URL",
            ));
        }
        Ok(VolumeSpec::Named(text.to_string()))
    }

    /// Other hosts may serve the volume too (its metadata is on a server).
    pub fn is_shared(&self) -> bool {
        matches!(self, VolumeSpec::Postgres { .. })
    }

    /// This host's directory of the volume: its metadata's directory, or
    /// for a shared volume, the local state of its mount (`BASE/pg-DB`).
    pub fn local_dir(&self, base_dir: &Path) -> PathBuf {
        match self {
            VolumeSpec::Named(name) => base_dir.join(name),
            VolumeSpec::Sqlite(path) => path
                .parent()
                .map_or_else(|| PathBuf::from("/"), Path::to_path_buf),
            VolumeSpec::Postgres { database, .. } => base_dir.join(format!("pg-{database}")),
        }
    }

    /// The SQLite metadata file, if the metadata is one.
    pub fn sqlite_path(&self, base_dir: &Path) -> Option<PathBuf> {
        match self {
            VolumeSpec::Named(name) => Some(base_dir.join(name).join("meta.db")),
            VolumeSpec::Sqlite(path) => Some(path.clone()),
            VolumeSpec::Postgres { .. } => None,
        }
    }

    /// The URL the metadata engine opens.
    pub fn meta_url(&self, base_dir: &Path) -> String {
        match self {
            VolumeSpec::Postgres { url, .. } => url.clone(),
            VolumeSpec::Named(name) => {
                format!("sqlite://{}", base_dir.join(name).join("meta.db").display())
            }
            VolumeSpec::Sqlite(path) => format!("sqlite://{}", path.display()),
        }
    }

    /// The volume for messages and logs: a URL's password masked.
    pub fn display(&self) -> String {
        match self {
            VolumeSpec::Named(name) => name.clone(),
            VolumeSpec::Sqlite(path) => format!("sqlite://{}", path.display()),
            VolumeSpec::Postgres { url, .. } => redact_url(url),
        }
    }

    /// A short name for tables: the volume's name, a SQLite volume's
    /// directory (`/var/lib/baton/vol/meta.db` → `vol`), a PostgreSQL
    /// volume's database.
    pub fn short_name(&self) -> String {
        match self {
            VolumeSpec::Named(name) => name.clone(),
            VolumeSpec::Sqlite(path) => {
                let part = if path.file_name().is_some_and(|f| f == "meta.db") {
                    path.parent().and_then(Path::file_name)
                } else {
                    path.file_stem()
                };
                part.map_or_else(
                    || path.display().to_string(),
                    |p| p.to_string_lossy().into_owned(),
                )
            }
            VolumeSpec::Postgres { database, .. } => database.clone(),
        }
    }

    /// The mount's source in /proc/mounts, which every user can read: a
    /// shared volume shows its database name, never its URL.
    pub fn mount_source(&self) -> String {
        match self {
            VolumeSpec::Postgres { database, .. } => database.clone(),
            other => other.display(),
        }
    }
}

impl fmt::Display for VolumeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display())
    }
}

/// The one rule for a volume name: it becomes a directory name, so letters,
/// digits, `-`, `_` and `.`, not starting with `.`, at most
/// [`VOLUME_NAME_LEN_MAX`] bytes.
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name.len() <= VOLUME_NAME_LEN_MAX
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// The database a PostgreSQL URL names, if it is a plain name.
fn postgres_database(url: &str) -> Option<&str> {
    let path = url.split('?').next().unwrap_or(url);
    let (_, rest) = path.split_once("://")?;
    let (_, database) = rest.split_once('/')?;
    let plain = !database.is_empty()
        && !database.starts_with('.')
        && database
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    plain.then_some(database)
}

/// `url` with the password of its user info masked (`user:***@host`).
/// The user info ends at the last `@`, so a password holding an unencoded
/// `/` or `@` is masked whole.
fn redact_url(url: &str) -> String {
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_password_with_a_slash_or_an_at_sign_is_masked_whole() {
        assert_eq!(
            redact_url("postgres://baton:pa/ss@w0rd@db.example:5432/vol"),
            "postgres://baton:***@db.example:5432/vol"
        );
        assert_eq!(
            redact_url("postgres://baton:secret@db/vol"),
            "postgres://baton:***@db/vol"
        );
        assert_eq!(redact_url("postgres://db/vol"), "postgres://db/vol");
    }

    #[test]
    fn short_names_are_the_volume_the_directory_or_the_database() {
        let short = |text: &str| VolumeSpec::parse(text).unwrap().short_name();
        assert_eq!(short("vol"), "vol");
        assert_eq!(short("sqlite:///var/lib/baton/data/meta.db"), "data");
        assert_eq!(short("sqlite:///srv/team.db"), "team");
        assert_eq!(short("postgres://u:secret@db.example/models"), "models");
    }

    #[test]
    fn names_resolve_under_the_base_dir() {
        let spec = VolumeSpec::parse("vol-1.a_b").unwrap();
        assert_eq!(spec, VolumeSpec::Named("vol-1.a_b".into()));
        let base = Path::new("/b");
        assert_eq!(spec.local_dir(base), PathBuf::from("/b/vol-1.a_b"));
        assert_eq!(
            spec.sqlite_path(base),
            Some(PathBuf::from("/b/vol-1.a_b/meta.db"))
        );
        assert_eq!(spec.meta_url(base), "sqlite:///b/vol-1.a_b/meta.db");
        assert_eq!(spec.mount_source(), "vol-1.a_b");
        assert!(!spec.is_shared());
    }

    #[test]
    fn sqlite_urls_name_their_file() {
        for text in ["sqlite:///x/y/meta.db", "sqlite:/x/y/meta.db"] {
            let spec = VolumeSpec::parse(text).unwrap();
            assert_eq!(spec, VolumeSpec::Sqlite("/x/y/meta.db".into()));
            assert_eq!(spec.local_dir(Path::new("/b")), PathBuf::from("/x/y"));
            assert_eq!(spec.meta_url(Path::new("/b")), "sqlite:///x/y/meta.db");
            assert_eq!(spec.mount_source(), "sqlite:///x/y/meta.db");
        }
    }

    #[test]
    fn postgres_urls_keep_local_state_under_the_base_dir_and_never_show_the_password() {
        let spec = VolumeSpec::parse("postgres://u:pw@h:5432/vol_1?sslmode=disable").unwrap();
        assert!(spec.is_shared());
        assert_eq!(
            spec.local_dir(Path::new("/b")),
            PathBuf::from("/b/pg-vol_1")
        );
        assert_eq!(spec.sqlite_path(Path::new("/b")), None);
        assert_eq!(
            spec.meta_url(Path::new("/b")),
            "postgres://u:pw@h:5432/vol_1?sslmode=disable"
        );
        assert_eq!(
            spec.display(),
            "postgres://u:***@h:5432/vol_1?sslmode=disable"
        );
        assert_eq!(spec.mount_source(), "vol_1");
        let plain = VolumeSpec::parse("postgresql://postgres@127.0.0.1:5/db").unwrap();
        assert_eq!(plain.display(), "postgresql://postgres@127.0.0.1:5/db");
    }

    #[test]
    fn strings_that_name_no_volume_are_refused_without_their_password() {
        for bad in [
            "",
            "a/b",
            "..",
            ".hidden",
            "/abs/meta.db",
            "postgres://h",
            "postgres://h/",
            "postgres://h/a/b",
            "mysql://h/db",
            "sqlite://rel/x.db",
            "sqlite:///",
            "name with space",
        ] {
            assert!(VolumeSpec::parse(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(VolumeSpec::parse(&"v".repeat(VOLUME_NAME_LEN_MAX)).is_ok());
        assert!(VolumeSpec::parse(&"v".repeat(VOLUME_NAME_LEN_MAX + 1)).is_err());
        let err = VolumeSpec::parse("postgres://u:secret@h/").unwrap_err();
        assert!(!err.to_string().contains("secret"), "{err}");
        assert!(
            err.to_string().contains("postgres://user@host:port/DB"),
            "{err}"
        );
    }

    proptest::proptest! {
        #[test]
        fn every_valid_name_is_a_named_volume(
            name in "[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}",
        ) {
            proptest::prop_assert_eq!(
                VolumeSpec::parse(&name),
                Ok(VolumeSpec::Named(name.clone()))
            );
        }

        #[test]
        fn any_text_parses_or_is_refused_without_a_panic(text in "\\PC{0,64}") {
            if let Ok(spec) = VolumeSpec::parse(&text) {
                // What parses has a directory of its own under the base.
                let base = Path::new("/base");
                proptest::prop_assert!(spec.is_shared() || spec.sqlite_path(base).is_some());
            }
        }

        #[test]
        fn a_postgres_password_never_reaches_a_message(
            user in "[a-z]{1,8}",
            password in "Pw[a-z0-9/@:?#%!]{2,12}",
            host in "[a-z]{1,8}(:[0-9]{1,5})?",
            database in "[a-z][a-z0-9_]{0,8}",
            query in "(\\?sslmode=require)?",
        ) {
            let url = format!("postgres://{user}:{password}@{host}/{database}{query}");
            let shown = match VolumeSpec::parse(&url) {
                Ok(spec) => format!("{spec} {} {}", spec.display(), spec.mount_source()),
                Err(err) => err.to_string(),
            };
            proptest::prop_assert!(!shown.contains(&password), "{} shows {}", shown, password);
        }
    }
}
