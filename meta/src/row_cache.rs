//! Attributes, directory entries and absent xattrs served from memory, on a
//! volume this process alone writes (SQLite, once the process serves it:
//! [`crate::MetaStore::serve_as_only_writer`]).
//!
//! Exact, not a cache with a timeout: every row the writer changes reaches
//! [`RowCache::observe`] (SQLite's pre-update hook, `sqlite/row_changes.rs`),
//! and a request's changes are applied here when it succeeds, before its
//! reply, in the order it made them. A read that misses fills the cache
//! only if no change was observed since it began ([`RowCache::epoch`]): a
//! value read from before a change never outlives the change.
//! A change outside a request (the replay of an operation log) forgets
//! everything: its rows were never seen as a request's.
//!
//! The committed bytes of an inode (`st_blocks`) are known as a sum read
//! with the attributes (until its block rows or its size change), or, for
//! an inode created here, as its block rows themselves (while it has few).
//!
//! A directory created here is *complete*: every entry it has was made by
//! this writer and is kept, so a name it lacks is known to be missing (a
//! LOOKUP of it, or a CREATE's check for it, runs no statement).
//!
//! The writer's own requests read what memory knows through [`Known`]
//! until they change a row: the attributes a WRITE's commit or a SETATTR
//! starts from, and what a CREATE checks (its directory, the name's
//! absence, a default ACL's absence).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::types::{Attr, FileKind};

/// Inodes whose attributes are kept at most (all are forgotten when the
/// limit is reached, as are entries and xattr facts at theirs).
pub const CACHED_INODES_MAX: usize = 65_536;
/// Directory entries kept at most.
pub const CACHED_ENTRIES_MAX: usize = 65_536;
/// Block rows kept per inode created here; past it its committed bytes
/// are read again.
const CACHED_BLOCK_ROWS_MAX: usize = 16;
/// Absent xattr names kept per inode.
const CACHED_ABSENT_XATTRS_MAX: usize = 4;

/// One row change of the writer, as the cache needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RowEvent {
    /// The inode's row now holds `attr` (`inserted`: a new inode, with no
    /// block rows and no xattrs yet), or is gone or unreadable (`None`).
    Inode {
        ino: u64,
        attr: Option<Attr>,
        inserted: bool,
    },
    /// The entry `name` in `parent` now names `ino`, or is gone (`None`).
    Entry {
        parent: u64,
        name: Box<[u8]>,
        ino: Option<u64>,
    },
    /// Block row `idx` of `ino` now holds `len` bytes, or is gone (`None`).
    Block {
        ino: u64,
        idx: u64,
        len: Option<u64>,
    },
    /// An xattr row of `ino` changed.
    Xattr { ino: u64 },
    /// A change the cache cannot follow: forget everything.
    Unknown,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct RowCache {
    enabled: AtomicBool,
    /// The tables are laid out as the writer's hook reads them.
    usable: AtomicBool,
    block_size: u64,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Changes observed so far; a fill read before a change is refused.
    epoch: u64,
    /// The writer runs a request: observed changes wait in `pending`.
    in_request: bool,
    pending: Vec<RowEvent>,
    inodes: HashMap<u64, Inode>,
    entries: HashMap<u64, HashMap<Box<[u8]>, u64>>,
    entry_count: usize,
    /// Directories whose every entry is in `entries` (created here).
    complete_dirs: HashSet<u64>,
    xattrs: HashMap<u64, Xattrs>,
}

#[derive(Debug)]
struct Inode {
    attr: Attr,
    bytes: Bytes,
}

/// What is known of an inode's committed bytes.
#[derive(Debug)]
enum Bytes {
    Unknown,
    /// As read, below the size read with it.
    Sum(u64),
    /// Every block row: `(idx, len)`.
    Rows(Vec<(u64, u64)>),
}

/// What is known of an inode's xattrs.
#[derive(Debug)]
enum Xattrs {
    /// It has none (created here, none set since).
    None,
    /// These names are absent.
    Absent(Vec<Box<[u8]>>),
}

impl RowCache {
    pub(crate) fn new(block_size_bytes: u32) -> RowCache {
        RowCache {
            enabled: AtomicBool::new(false),
            usable: AtomicBool::new(true),
            block_size: u64::from(block_size_bytes).max(1),
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Serves from memory from now on, starting empty (unless
    /// [`RowCache::disable_for_good`] was called).
    pub(crate) fn enable(&self) {
        self.clear();
        let usable = self.usable.load(Ordering::SeqCst);
        self.enabled.store(usable, Ordering::SeqCst);
    }

    /// Never serves from memory (the hook cannot read the tables).
    pub(crate) fn disable_for_good(&self) {
        self.usable.store(false, Ordering::SeqCst);
        self.enabled.store(false, Ordering::SeqCst);
    }

    pub(crate) fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::SeqCst)
    }

    /// Forgets everything (another writer may have changed any row).
    pub(crate) fn clear(&self) {
        let mut inner = self.lock();
        inner.epoch += 1;
        inner.forget_all();
    }

    /// A row change of the writer (called inside SQLite's hook).
    pub(crate) fn observe(&self, event: RowEvent) {
        let mut inner = self.lock();
        inner.epoch += 1;
        if inner.in_request && event != RowEvent::Unknown {
            inner.pending.push(event);
        } else {
            inner.forget_all();
        }
    }

    /// The writer starts a request: end it with [`Request::end`].
    pub(crate) fn begin_request(&self) -> Request<'_> {
        let mut inner = self.lock();
        inner.in_request = true;
        inner.pending.clear();
        Request {
            cache: self,
            ended: false,
        }
    }

    fn end_request(&self, applied: bool) {
        let mut inner = self.lock();
        inner.in_request = false;
        inner.epoch += 1;
        let pending = std::mem::take(&mut inner.pending);
        if applied {
            for event in pending {
                inner.apply(event);
            }
        }
    }

    /// Take before reading what a miss fills; pass to the fill.
    pub(crate) fn epoch(&self) -> u64 {
        self.lock().epoch
    }

    /// What `f` finds in memory, if the cache is on.
    fn known<T>(&self, f: impl FnOnce(&Inner) -> Option<T>) -> Option<T> {
        if !self.is_enabled() {
            return None;
        }
        f(&self.lock())
    }

    /// Runs `f` on the cache if it is on and no change came in since a
    /// read began at `epoch` (what that read found is still true).
    fn fill(&self, epoch: u64, f: impl FnOnce(&mut Inner)) {
        if !self.is_enabled() {
            return;
        }
        let mut inner = self.lock();
        if inner.epoch == epoch {
            f(&mut inner);
        }
    }

    /// The attributes of `ino`, if known.
    pub(crate) fn attr(&self, ino: u64) -> Option<Attr> {
        self.known(|inner| inner.attr(ino))
    }

    /// The attributes and committed bytes of `ino`, if both are known.
    pub(crate) fn attr_plus(&self, ino: u64) -> Option<(Attr, u64)> {
        self.known(|inner| self.attr_plus_in(inner, ino))
    }

    /// The attributes of the inode entry `name` of `parent` names, if known.
    pub(crate) fn lookup(&self, parent: u64, name: &[u8]) -> Option<Attr> {
        self.known(|inner| {
            let ino = inner.entry(parent, name)?;
            inner.attr(ino)
        })
    }

    /// The inode entry `name` of `parent` names, with its attributes and
    /// committed bytes, if all are known.
    pub(crate) fn lookup_plus(&self, parent: u64, name: &[u8]) -> Option<(Attr, u64)> {
        self.known(|inner| self.attr_plus_in(inner, inner.entry(parent, name)?))
    }

    /// Whether `ino` is known to have no xattr `name`.
    pub(crate) fn xattr_absent(&self, ino: u64, name: &[u8]) -> bool {
        self.known(|inner| inner.xattr_absent(ino, name).then_some(()))
            .is_some()
    }

    /// Whether directory `parent` is known to have no entry `name`.
    pub(crate) fn entry_absent(&self, parent: u64, name: &[u8]) -> bool {
        self.known(|inner| inner.entry_absent(parent, name).then_some(()))
            .is_some()
    }

    /// What `f` finds in memory for the writer's request, which must not
    /// have changed a row yet: its changes reach memory when it ends, and
    /// until then memory answers for the rows as they were before it.
    fn known_before_change<T>(&self, f: impl FnOnce(&Inner) -> Option<T>) -> Option<T> {
        self.known(|inner| {
            assert!(
                inner.in_request,
                "a fact for a write asked outside a request"
            );
            if inner.pending.is_empty() {
                f(inner)
            } else {
                None
            }
        })
    }

    /// Keeps what a read that began at `epoch` found: `attr`, with its
    /// committed bytes if read.
    pub(crate) fn fill_attr(&self, epoch: u64, attr: &Attr, bytes: Option<u64>) {
        self.fill(epoch, |inner| {
            inner.keep_attr(attr, bytes.map_or(Bytes::Unknown, Bytes::Sum));
        });
    }

    /// Keeps what a lookup that began at `epoch` found.
    pub(crate) fn fill_entry(&self, epoch: u64, parent: u64, name: &[u8], attr: &Attr, bytes: u64) {
        self.fill(epoch, |inner| {
            inner.keep_attr(attr, Bytes::Sum(bytes));
            inner.keep_entry(parent, name, attr.ino);
        });
    }

    /// Keeps that a read that began at `epoch` found no xattr `name`.
    pub(crate) fn fill_absent_xattr(&self, epoch: u64, ino: u64, name: &[u8]) {
        self.fill(epoch, |inner| {
            if inner.xattrs.len() >= CACHED_INODES_MAX && !inner.xattrs.contains_key(&ino) {
                inner.xattrs.clear();
            }
            match inner
                .xattrs
                .entry(ino)
                .or_insert(Xattrs::Absent(Vec::new()))
            {
                Xattrs::None => {}
                Xattrs::Absent(names) => {
                    if names.len() >= CACHED_ABSENT_XATTRS_MAX {
                        names.remove(0);
                    }
                    names.push(name.into());
                }
            }
        });
    }

    /// The attributes and committed bytes of `ino` in `inner`.
    fn attr_plus_in(&self, inner: &Inner, ino: u64) -> Option<(Attr, u64)> {
        let inode = inner.inodes.get(&ino)?;
        Some((inode.attr.clone(), self.bytes_of(inode)?))
    }

    /// Committed bytes as `attr_plus` reads them: block rows below the size.
    fn bytes_of(&self, inode: &Inode) -> Option<u64> {
        match &inode.bytes {
            Bytes::Unknown => None,
            Bytes::Sum(sum) => Some(*sum),
            Bytes::Rows(rows) => {
                let below = inode.attr.size.div_ceil(self.block_size);
                Some(
                    rows.iter()
                        .filter(|(idx, _)| *idx < below)
                        .map(|(_, len)| len)
                        .sum(),
                )
            }
        }
    }
}

/// A request of the writer, from [`RowCache::begin_request`].
#[must_use = "end the request with Request::end"]
pub(crate) struct Request<'c> {
    cache: &'c RowCache,
    ended: bool,
}

impl Request<'_> {
    /// The request ended: its changes stand (`applied`) or were rolled
    /// back.
    pub(crate) fn end(mut self, applied: bool) {
        self.ended = true;
        self.cache.end_request(applied);
    }
}

impl Drop for Request<'_> {
    /// Not ended (a panic unwinding): what it changed is unknown.
    fn drop(&mut self) {
        if !self.ended {
            self.cache.end_request(false);
            self.cache.clear();
        }
    }
}

/// What memory knows of the rows a write request is about to read, while
/// the request has changed none (module documentation); nothing on an
/// engine without a cache. Each answer stands in for one statement and
/// must equal what that statement would read.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Known<'c>(Option<&'c RowCache>);

impl<'c> Known<'c> {
    pub(crate) fn new(cache: Option<&'c RowCache>) -> Known<'c> {
        Known(cache)
    }

    /// Nothing is known (PostgreSQL, or a caller with no cache).
    pub(crate) fn nothing() -> Known<'static> {
        Known(None)
    }

    fn ask<T>(&self, f: impl FnOnce(&Inner) -> Option<T>) -> Option<T> {
        self.0?.known_before_change(f)
    }

    /// The attributes of `ino`.
    pub(crate) fn attr(&self, ino: u64) -> Option<Attr> {
        self.ask(|inner| inner.attr(ino))
    }

    /// Whether directory `parent` has no entry `name`.
    pub(crate) fn entry_absent(&self, parent: u64, name: &[u8]) -> bool {
        self.ask(|inner| inner.entry_absent(parent, name).then_some(()))
            .is_some()
    }

    /// Whether `ino` has no xattr `name`.
    pub(crate) fn xattr_absent(&self, ino: u64, name: &[u8]) -> bool {
        self.ask(|inner| inner.xattr_absent(ino, name).then_some(()))
            .is_some()
    }

    /// Whether `ino` has no block row `idx`.
    pub(crate) fn block_row_absent(&self, ino: u64, idx: u64) -> bool {
        self.ask(|inner| match &inner.inodes.get(&ino)?.bytes {
            Bytes::Rows(rows) => rows.iter().all(|(i, _)| *i != idx).then_some(()),
            Bytes::Unknown | Bytes::Sum(_) => None,
        })
        .is_some()
    }
}

impl Inner {
    /// The inode entry `name` of `parent` names, if known.
    fn entry(&self, parent: u64, name: &[u8]) -> Option<u64> {
        self.entries.get(&parent)?.get(name).copied()
    }

    /// The attributes of `ino`, if known.
    fn attr(&self, ino: u64) -> Option<Attr> {
        self.inodes.get(&ino).map(|i| i.attr.clone())
    }

    fn entry_absent(&self, parent: u64, name: &[u8]) -> bool {
        self.complete_dirs.contains(&parent) && self.entry(parent, name).is_none()
    }

    fn xattr_absent(&self, ino: u64, name: &[u8]) -> bool {
        match self.xattrs.get(&ino) {
            Some(Xattrs::None) => true,
            Some(Xattrs::Absent(names)) => names.iter().any(|n| &**n == name),
            None => false,
        }
    }

    fn forget_all(&mut self) {
        self.pending.clear();
        self.inodes.clear();
        self.entries.clear();
        self.entry_count = 0;
        self.complete_dirs.clear();
        self.xattrs.clear();
    }

    fn keep_attr(&mut self, attr: &Attr, bytes: Bytes) {
        if self.inodes.len() >= CACHED_INODES_MAX && !self.inodes.contains_key(&attr.ino) {
            self.inodes.clear();
        }
        match self.inodes.get_mut(&attr.ino) {
            // Block rows known beat a sum (the two agree).
            Some(inode) if matches!(inode.bytes, Bytes::Rows(_)) => inode.attr = attr.clone(),
            Some(inode) => {
                inode.attr = attr.clone();
                if !matches!(bytes, Bytes::Unknown) {
                    inode.bytes = bytes;
                }
            }
            None => {
                self.inodes.insert(
                    attr.ino,
                    Inode {
                        attr: attr.clone(),
                        bytes,
                    },
                );
            }
        }
    }

    fn keep_entry(&mut self, parent: u64, name: &[u8], ino: u64) {
        if self.entry_count >= CACHED_ENTRIES_MAX {
            self.entries.clear();
            self.entry_count = 0;
            self.complete_dirs.clear();
        }
        if self
            .entries
            .entry(parent)
            .or_default()
            .insert(name.into(), ino)
            .is_none()
        {
            self.entry_count += 1;
        }
    }

    fn forget_entry(&mut self, parent: u64, name: &[u8]) {
        if let Some(names) = self.entries.get_mut(&parent) {
            if names.remove(name).is_some() {
                self.entry_count -= 1;
            }
            if names.is_empty() {
                self.entries.remove(&parent);
            }
        }
    }

    /// A change of a request that succeeded, in the order it was made.
    fn apply(&mut self, event: RowEvent) {
        match event {
            RowEvent::Inode {
                ino,
                attr: None,
                inserted: _,
            } => {
                self.inodes.remove(&ino);
                self.xattrs.remove(&ino);
                self.complete_dirs.remove(&ino);
            }
            RowEvent::Inode {
                ino: _,
                attr: Some(attr),
                inserted: true,
            } => {
                if self.xattrs.len() >= CACHED_INODES_MAX {
                    self.xattrs.clear();
                }
                self.xattrs.insert(attr.ino, Xattrs::None);
                if attr.kind == FileKind::Directory {
                    self.complete_dirs.insert(attr.ino);
                }
                self.inodes.remove(&attr.ino);
                self.keep_attr(&attr, Bytes::Rows(Vec::new()));
            }
            RowEvent::Inode {
                ino: _,
                attr: Some(attr),
                inserted: false,
            } => {
                if let Some(inode) = self.inodes.get_mut(&attr.ino) {
                    if inode.attr.size != attr.size && matches!(inode.bytes, Bytes::Sum(_)) {
                        inode.bytes = Bytes::Unknown;
                    }
                    inode.attr = attr;
                } else {
                    self.keep_attr(&attr, Bytes::Unknown);
                }
            }
            RowEvent::Entry { parent, name, ino } => match ino {
                Some(ino) => self.keep_entry(parent, &name, ino),
                None => self.forget_entry(parent, &name),
            },
            RowEvent::Block { ino, idx, len } => {
                let Some(inode) = self.inodes.get_mut(&ino) else {
                    return;
                };
                let Bytes::Rows(rows) = &mut inode.bytes else {
                    inode.bytes = Bytes::Unknown;
                    return;
                };
                rows.retain(|(i, _)| *i != idx);
                if let Some(len) = len {
                    rows.push((idx, len));
                }
                if rows.len() > CACHED_BLOCK_ROWS_MAX {
                    inode.bytes = Bytes::Unknown;
                }
            }
            RowEvent::Xattr { ino } => {
                self.xattrs.remove(&ino);
            }
            RowEvent::Unknown => self.forget_all(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::types::{FileKind, Timespec};

    fn attr(ino: u64, size: u64) -> Attr {
        Attr {
            ino,
            kind: FileKind::Regular,
            mode: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            size,
            atime: Timespec::default(),
            mtime: Timespec::default(),
            ctime: Timespec::default(),
            generation: 1,
        }
    }

    fn cache() -> RowCache {
        let c = RowCache::new(4096);
        c.enable();
        c
    }

    fn request(c: &RowCache, events: Vec<RowEvent>, applied: bool) {
        let request = c.begin_request();
        for e in events {
            c.observe(e);
        }
        request.end(applied);
    }

    fn created(ino: u64) -> RowEvent {
        RowEvent::Inode {
            ino,
            attr: Some(attr(ino, 0)),
            inserted: true,
        }
    }

    #[test]
    fn a_request_that_succeeds_is_served_in_its_order() {
        let c = cache();
        request(
            &c,
            vec![
                created(10),
                RowEvent::Entry {
                    parent: 1,
                    name: (*b"f").into(),
                    ino: Some(10),
                },
                RowEvent::Block {
                    ino: 10,
                    idx: 0,
                    len: Some(5),
                },
                RowEvent::Inode {
                    ino: 10,
                    attr: Some(attr(10, 5)),
                    inserted: false,
                },
            ],
            true,
        );
        assert_eq!(c.lookup_plus(1, b"f"), Some((attr(10, 5), 5)));
        assert!(c.xattr_absent(10, b"security.capability"));
        // A shrink below the row: the row no longer counts.
        request(
            &c,
            vec![RowEvent::Inode {
                ino: 10,
                attr: Some(attr(10, 0)),
                inserted: false,
            }],
            true,
        );
        assert_eq!(c.attr_plus(10), Some((attr(10, 0), 0)));
        request(&c, vec![RowEvent::Xattr { ino: 10 }], true);
        assert!(!c.xattr_absent(10, b"security.capability"));
    }

    #[test]
    fn a_request_rolled_back_changes_nothing() {
        let c = cache();
        request(&c, vec![created(10)], true);
        request(
            &c,
            vec![
                RowEvent::Inode {
                    ino: 10,
                    attr: Some(attr(10, 9)),
                    inserted: false,
                },
                RowEvent::Entry {
                    parent: 1,
                    name: (*b"g").into(),
                    ino: Some(10),
                },
            ],
            false,
        );
        assert_eq!(c.attr_plus(10), Some((attr(10, 0), 0)));
        assert_eq!(c.lookup_plus(1, b"g"), None);
    }

    #[test]
    fn a_fill_read_before_a_change_is_refused() {
        let c = cache();
        let epoch = c.epoch();
        request(
            &c,
            vec![RowEvent::Inode {
                ino: 7,
                attr: None,
                inserted: false,
            }],
            true,
        );
        c.fill_attr(epoch, &attr(7, 3), Some(3));
        assert_eq!(c.attr(7), None);
        let epoch = c.epoch();
        c.fill_attr(epoch, &attr(7, 3), Some(3));
        assert_eq!(c.attr_plus(7), Some((attr(7, 3), 3)));
        // Its size changes: the sum read with the old size is unknown now.
        request(
            &c,
            vec![RowEvent::Inode {
                ino: 7,
                attr: Some(attr(7, 1)),
                inserted: false,
            }],
            true,
        );
        assert_eq!(c.attr(7), Some(attr(7, 1)));
        assert_eq!(c.attr_plus(7), None);
    }

    #[test]
    fn a_change_outside_a_request_forgets_everything() {
        let c = cache();
        request(&c, vec![created(10)], true);
        c.observe(RowEvent::Block {
            ino: 99,
            idx: 0,
            len: None,
        });
        assert_eq!(c.attr(10), None);
        assert!(!c.xattr_absent(10, b"user.a"));
    }

    #[test]
    fn disabled_it_serves_and_keeps_nothing() {
        let c = RowCache::new(4096);
        c.fill_attr(c.epoch(), &attr(3, 0), Some(0));
        assert_eq!(c.attr(3), None);
        c.enable();
        assert_eq!(c.attr(3), None);
    }

    #[test]
    fn many_block_rows_make_the_bytes_unknown() {
        let c = cache();
        let mut events = vec![created(10)];
        for idx in 0..=CACHED_BLOCK_ROWS_MAX as u64 {
            events.push(RowEvent::Block {
                ino: 10,
                idx,
                len: Some(4096),
            });
        }
        request(&c, events, true);
        assert_eq!(c.attr_plus(10), None);
        assert_eq!(c.attr(10), Some(attr(10, 0)));
    }

    fn created_dir(ino: u64) -> RowEvent {
        RowEvent::Inode {
            ino,
            attr: Some(Attr {
                kind: FileKind::Directory,
                nlink: 2,
                ..attr(ino, 0)
            }),
            inserted: true,
        }
    }

    fn entry(parent: u64, name: &[u8], ino: Option<u64>) -> RowEvent {
        RowEvent::Entry {
            parent,
            name: name.into(),
            ino,
        }
    }

    #[test]
    fn a_directory_made_here_knows_the_names_it_lacks() {
        let c = cache();
        request(
            &c,
            vec![created_dir(5), created(6), entry(5, b"f", Some(6))],
            true,
        );
        assert!(c.entry_absent(5, b"g"));
        assert!(!c.entry_absent(5, b"f"), "f is there");
        assert!(!c.entry_absent(1, b"g"), "the root was not made here");
        request(&c, vec![entry(5, b"f", None)], true);
        assert!(c.entry_absent(5, b"f"));
        // Gone, or forgotten: nothing is known of its names.
        request(
            &c,
            vec![RowEvent::Inode {
                ino: 5,
                attr: None,
                inserted: false,
            }],
            true,
        );
        assert!(!c.entry_absent(5, b"f"));
        request(&c, vec![created_dir(7)], true);
        c.clear();
        assert!(!c.entry_absent(7, b"f"));
        // Past the entry bound every entry is dropped: no directory is
        // complete any more.
        request(&c, vec![created_dir(8)], true);
        let names: Vec<RowEvent> = (0..=CACHED_ENTRIES_MAX as u64)
            .map(|i| entry(1, format!("n{i}").as_bytes(), Some(100 + i)))
            .collect();
        request(&c, names, true);
        assert!(!c.entry_absent(8, b"f"));
    }

    #[test]
    fn a_write_knows_rows_only_until_it_changes_one() {
        let c = cache();
        request(
            &c,
            vec![created_dir(5), created(6), entry(5, b"f", Some(6))],
            true,
        );
        let write = c.begin_request();
        let known = Known::new(Some(&c));
        assert_eq!(known.attr(6), Some(attr(6, 0)));
        assert!(known.entry_absent(5, b"g"));
        assert!(known.block_row_absent(6, 0));
        assert!(known.xattr_absent(5, b"system.posix_acl_default"));
        c.observe(RowEvent::Block {
            ino: 6,
            idx: 0,
            len: Some(1),
        });
        // Changed by this request, not yet in memory: nothing is known.
        assert_eq!(known.attr(6), None);
        assert!(!known.block_row_absent(6, 0));
        assert!(!known.entry_absent(5, b"g"));
        write.end(true);
        let write = c.begin_request();
        assert!(!known.block_row_absent(6, 0), "the row is there now");
        assert!(known.block_row_absent(6, 1));
        write.end(true);
        assert_eq!(Known::nothing().attr(6), None);
    }
}
