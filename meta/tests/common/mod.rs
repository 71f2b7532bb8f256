//! Shared helpers for the integration tests: a fresh volume in a temp dir
//! and short constructors for names and create arguments.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::PathBuf;

use baton_meta::{Attr, CreateArgs, FileKind, MetaStore, SqliteMeta, VolumeConfig};

/// Block size used by the tests: small so block arithmetic is easy to read.
pub const BS: u32 = 4096;

pub struct Vol {
    pub dir: tempfile::TempDir,
    pub meta: SqliteMeta,
}

impl Vol {
    pub fn path(&self) -> PathBuf {
        self.dir.path().join("meta.db")
    }

    /// Closes and reopens the store on the same file.
    pub fn reopen(self) -> Vol {
        let path = self.path();
        drop(self.meta);
        let meta = baton_meta::open(path.to_str().unwrap()).unwrap();
        Vol {
            dir: self.dir,
            meta,
        }
    }
}

pub fn config() -> VolumeConfig {
    VolumeConfig {
        name: "testvol".into(),
        storage_url: "file:///tmp/objects".into(),
        block_size_bytes: BS,
    }
}

pub fn fresh() -> Vol {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.db");
    let meta = baton_meta::format(path.to_str().unwrap(), &config()).unwrap();
    Vol { dir, meta }
}

pub fn n(s: &str) -> &OsStr {
    OsStr::new(s)
}

pub fn mk(m: &dyn MetaStore, parent: u64, name: &str, kind: FileKind) -> Attr {
    let mode = if kind == FileKind::Directory {
        0o755
    } else {
        0o644
    };
    let mut args = CreateArgs::new(kind, mode);
    if kind == FileKind::Symlink {
        args.symlink_target = Some("target".into());
    }
    m.create(parent, n(name), &args, None).unwrap()
}

pub fn file(m: &dyn MetaStore, parent: u64, name: &str) -> Attr {
    mk(m, parent, name, FileKind::Regular)
}

pub fn dir(m: &dyn MetaStore, parent: u64, name: &str) -> Attr {
    mk(m, parent, name, FileKind::Directory)
}

/// Names listed by readdir, `.` and `..` excluded.
pub fn names(m: &dyn MetaStore, ino: u64) -> Vec<String> {
    m.readdir(ino, 0, 4096)
        .unwrap()
        .into_iter()
        .map(|e| e.name.to_string_lossy().into_owned())
        .filter(|s| s != "." && s != "..")
        .collect()
}

/// Opens a raw SQLite connection on the volume file, for tests that must
/// corrupt or bulk-load the database.
pub fn raw(v: &Vol) -> rusqlite::Connection {
    rusqlite::Connection::open(v.path()).unwrap()
}
