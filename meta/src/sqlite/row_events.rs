//! What the row cache (`row_cache.rs`) learns from one row change of the
//! writer, read in SQLite's pre-update hook by column position: the
//! positions are the schema's (`schema.rs`), checked once at open
//! ([`layout_matches`]); a database laid out otherwise is served without
//! the cache.

use rusqlite::hooks::{PreUpdateCase, PreUpdateNewValueAccessor, PreUpdateOldValueAccessor};
use rusqlite::types::ValueRef;
use rusqlite::Connection;

use crate::row_cache::{RowCache, RowEvent};
use crate::types::{Attr, FileKind, Timespec};

/// The leading columns of each table the cache follows, in order.
const INODE_COLUMNS: [&str; 15] = [
    "ino",
    "generation",
    "kind",
    "mode",
    "nlink",
    "uid",
    "gid",
    "rdev",
    "size",
    "atime_sec",
    "atime_nsec",
    "mtime_sec",
    "mtime_nsec",
    "ctime_sec",
    "ctime_nsec",
];
const ENTRY_COLUMNS: [&str; 4] = ["cookie", "parent", "name", "ino"];
const BLOCK_COLUMNS: [&str; 4] = ["ino", "idx", "object_key", "len"];
const XATTR_COLUMNS: [&str; 1] = ["ino"];

/// Whether the tables start with the columns this module reads.
pub(crate) fn layout_matches(conn: &Connection) -> bool {
    let leading = |table: &str, expected: &[&str]| -> bool {
        let names: rusqlite::Result<Vec<String>> = conn
            .prepare("SELECT name FROM pragma_table_info(?1) ORDER BY cid")
            .and_then(|mut stmt| stmt.query_map([table], |r| r.get(0))?.collect());
        names.is_ok_and(|names| {
            names.len() >= expected.len() && names.iter().zip(expected).all(|(n, e)| n == e)
        })
    };
    leading("inodes", &INODE_COLUMNS)
        && leading("dentries", &ENTRY_COLUMNS)
        && leading("blocks", &BLOCK_COLUMNS)
        && leading("xattrs", &XATTR_COLUMNS)
}

/// Hands `cache` what a change to `table` means for it (nothing for the
/// tables it does not follow): what the old row's key no longer holds,
/// then what the new row holds. A side it cannot read makes the cache
/// forget everything.
pub(crate) fn observe(cache: &RowCache, table: &str, case: &PreUpdateCase) {
    let followed = matches!(table, "inodes" | "dentries" | "blocks" | "xattrs");
    if !followed || !cache.is_enabled() {
        return;
    }
    let (old, new) = rows(case);
    let inserted = old.is_none();
    let mut gone = old.map(|row| event(table, &row, None));
    let now = new.map(|row| event(table, &row, Some(inserted)));
    // An inode updated in place: its new row says all (a removal first
    // would forget its committed bytes).
    if let (
        Some(Some(RowEvent::Inode { ino: a, .. })),
        Some(Some(RowEvent::Inode { ino: b, .. })),
    ) = (&gone, &now)
    {
        if a == b {
            gone = None;
        }
    }
    for side in [gone, now].into_iter().flatten() {
        cache.observe(side.unwrap_or(RowEvent::Unknown));
    }
}

/// What one row of `table` tells the cache: the old row of a change
/// (`now: None`), whose key holds nothing any more, or the new row
/// (`now: Some(inserted)`).
fn event(table: &str, row: &Row, now: Option<bool>) -> Option<RowEvent> {
    Some(match table {
        "inodes" => RowEvent::Inode {
            ino: row.rowid()?,
            attr: now.and_then(|_| row.attr()),
            inserted: now == Some(true),
        },
        "dentries" => RowEvent::Entry {
            parent: row.int(1)?,
            name: row.blob(2)?,
            ino: match now {
                Some(_) => Some(row.int(3)?),
                None => None,
            },
        },
        "blocks" => RowEvent::Block {
            ino: row.int(0)?,
            idx: row.int(1)?,
            len: match now {
                Some(_) => Some(row.int(3)?),
                None => None,
            },
        },
        _ => RowEvent::Xattr { ino: row.int(0)? },
    })
}

/// One side of a change: a row's values by column position.
enum Row<'a> {
    Old(&'a PreUpdateOldValueAccessor),
    New(&'a PreUpdateNewValueAccessor),
}

impl Row<'_> {
    fn value(&self, i: i32) -> Option<ValueRef<'_>> {
        match self {
            Row::Old(r) => r.get_old_column_value(i).ok(),
            Row::New(r) => r.get_new_column_value(i).ok(),
        }
    }

    /// The rowid: the value of an INTEGER PRIMARY KEY column, which the
    /// hook may give as NULL for a row being inserted.
    fn rowid<T: TryFrom<i64>>(&self) -> Option<T> {
        let rowid = match self {
            Row::Old(r) => r.get_old_row_id(),
            Row::New(r) => r.get_new_row_id(),
        };
        T::try_from(rowid).ok()
    }

    fn int<T: TryFrom<i64>>(&self, i: i32) -> Option<T> {
        match self.value(i)? {
            ValueRef::Integer(v) => T::try_from(v).ok(),
            _ => None,
        }
    }

    fn blob(&self, i: i32) -> Option<Box<[u8]>> {
        match self.value(i)? {
            ValueRef::Blob(b) | ValueRef::Text(b) => Some(b.into()),
            _ => None,
        }
    }

    fn time(&self, sec: i32) -> Option<Timespec> {
        Some(Timespec {
            sec: self.int(sec)?,
            nsec: self.int(sec + 1)?,
        })
    }

    /// The attributes a row of `inodes` holds, as `inode::row_attr_at`
    /// reads them.
    fn attr(&self) -> Option<Attr> {
        Some(Attr {
            ino: self.rowid()?,
            generation: self.int(1)?,
            kind: FileKind::from_code(self.int(2)?)?,
            mode: self.int(3)?,
            nlink: self.int(4)?,
            uid: self.int(5)?,
            gid: self.int(6)?,
            rdev: self.int(7)?,
            size: self.int(8)?,
            atime: self.time(9)?,
            mtime: self.time(11)?,
            ctime: self.time(13)?,
        })
    }
}

fn rows(case: &PreUpdateCase) -> (Option<Row<'_>>, Option<Row<'_>>) {
    match case {
        PreUpdateCase::Insert(new) => (None, Some(Row::New(new))),
        PreUpdateCase::Delete(old) => (Some(Row::Old(old)), None),
        PreUpdateCase::Update {
            old_value_accessor,
            new_value_accessor,
        } => (
            Some(Row::Old(old_value_accessor)),
            Some(Row::New(new_value_accessor)),
        ),
        PreUpdateCase::Unknown => (None, None),
    }
}
