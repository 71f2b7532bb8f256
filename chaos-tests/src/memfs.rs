//! `MemFs`: a small in-memory filesystem for testing and benchmarking
//! fuse-wire. TEST CODE ONLY: nothing persists, and every generation starts
//! from the same seeded tree (`hello`, `stall`, `big`), so a test can check
//! what a read across a handover must return.
//!
//! Fault hooks for tests: reads of the file named by `stall_name` are never
//! answered (the reply is abandoned), optionally after journaling the raw
//! request, so a test can kill or stop the generation while an application
//! waits on it.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use fuse_wire::reply::{
    DirentBuf, DirentRecord, ReplyAttr, ReplyCreate, ReplyData, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyWrite, ReplyXattr,
};
use fuse_wire::{
    Attr, AttrOut, CreateIn, EntryOut, Errno, FileHandle, Filesystem, FopenFlags, MkdirIn, MknodIn,
    NodeId, OpenIn, ReadIn, RenameFlags, Request, SetattrIn, SetattrValid, WriteIn,
};

/// Content of the seeded file `hello`.
pub const HELLO: &[u8] = b"hello from baton\n";
/// Size of the seeded files `stall` and `big`.
pub const PATTERN_FILE_LEN: usize = 1 << 20;

/// The byte at `offset` of the seeded pattern files.
pub fn pattern_byte(offset: u64) -> u8 {
    (offset.wrapping_mul(2_654_435_761) >> 7) as u8
}

/// Test hooks and options.
#[derive(Clone, Debug, Default)]
pub struct MemFsOptions {
    /// The first read of this file name is never answered (later reads
    /// are, so readahead does not pile up more stalled requests).
    pub stall_name: Option<OsString>,
    /// Where to write the raw bytes of a stalled request (then the marker).
    pub journal_path: Option<PathBuf>,
    /// Created (empty) once a request has been stalled.
    pub stall_marker: Option<PathBuf>,
    /// Open files with FOPEN_DIRECT_IO so every read reaches the server.
    pub direct_io: bool,
    /// Attribute and entry cache time in seconds (0: every stat asks).
    pub cache_secs: u64,
    /// Answer as Baton does on a volume only it serves, so that a mount
    /// of this filesystem with Baton's INIT flags costs what the kernel
    /// and the transport cost Baton, and nothing of its storage (the
    /// bench's floor): missing names as negative entries, files opened
    /// with `KEEP_CACHE` and directories with `CACHE_DIR | KEEP_CACHE`,
    /// absent xattrs as `ENODATA`, the umask applied (`DONT_MASK`).
    pub like_baton: bool,
}

#[derive(Debug)]
enum Content {
    File(Vec<u8>),
    Dir(BTreeMap<OsString, u64>),
    Symlink(OsString),
}

#[derive(Debug)]
struct Node {
    content: Content,
    mode: u32,
    uid: u32,
    gid: u32,
    nlink: u32,
    atime: (u64, u32),
    mtime: (u64, u32),
    ctime: (u64, u32),
}

struct State {
    nodes: HashMap<u64, Node>,
    next_ino: u64,
    stalled: bool,
}

/// The in-memory test filesystem.
pub struct MemFs {
    state: Mutex<State>,
    options: MemFsOptions,
}

fn now() -> (u64, u32) {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (d.as_secs(), d.subsec_nanos())
}

fn file_node(data: Vec<u8>, mode: u32) -> Node {
    let t = (1_700_000_000, 0);
    Node {
        content: Content::File(data),
        mode: libc::S_IFREG | mode,
        uid: 0,
        gid: 0,
        nlink: 1,
        atime: t,
        mtime: t,
        ctime: t,
    }
}

impl MemFs {
    /// A fresh seeded tree.
    pub fn new(options: MemFsOptions) -> Self {
        let pattern: Vec<u8> = (0..PATTERN_FILE_LEN as u64).map(pattern_byte).collect();
        let mut nodes = HashMap::new();
        let mut root = file_node(Vec::new(), 0o755);
        root.mode = libc::S_IFDIR | 0o777;
        root.nlink = 2;
        let children: BTreeMap<OsString, u64> = [("hello", 2), ("stall", 3), ("big", 4)]
            .into_iter()
            .map(|(n, i)| (OsString::from(n), i))
            .collect();
        root.content = Content::Dir(children);
        nodes.insert(NodeId::ROOT.get(), root);
        nodes.insert(2, file_node(HELLO.to_vec(), 0o644));
        nodes.insert(3, file_node(pattern.clone(), 0o644));
        nodes.insert(4, file_node(pattern, 0o644));
        MemFs {
            state: Mutex::new(State {
                nodes,
                next_ino: 5,
                stalled: false,
            }),
            options,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn attr_of(&self, ino: u64, node: &Node) -> Attr {
        let size = match &node.content {
            Content::File(data) => data.len() as u64,
            Content::Dir(children) => children.len() as u64,
            Content::Symlink(target) => target.len() as u64,
        };
        Attr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: node.atime.0,
            mtime: node.mtime.0,
            ctime: node.ctime.0,
            atimensec: node.atime.1,
            mtimensec: node.mtime.1,
            ctimensec: node.ctime.1,
            mode: node.mode,
            nlink: node.nlink,
            uid: node.uid,
            gid: node.gid,
            blksize: 4096,
            ..Default::default()
        }
    }

    fn entry(&self, ino: u64, node: &Node) -> EntryOut {
        EntryOut {
            nodeid: NodeId::new(ino),
            generation: 1,
            entry_valid: self.options.cache_secs,
            attr_valid: self.options.cache_secs,
            attr: self.attr_of(ino, node),
            ..Default::default()
        }
    }

    /// The kernel keeps "no such name" for the entry timeout.
    fn negative_entry(&self) -> EntryOut {
        EntryOut {
            entry_valid: self.options.cache_secs,
            ..Default::default()
        }
    }

    /// The mode bits of a new node: with `DONT_MASK` the kernel leaves the
    /// umask to the filesystem.
    fn new_mode(&self, mode: u32, umask: u32) -> u32 {
        let mode = mode & 0o7777;
        if self.options.like_baton {
            mode & !umask
        } else {
            mode
        }
    }

    fn attr_out(&self, ino: u64, node: &Node) -> AttrOut {
        AttrOut {
            attr_valid: self.options.cache_secs,
            attr: self.attr_of(ino, node),
            ..Default::default()
        }
    }

    /// Adds a node named `name` under `parent`.
    fn insert(
        &self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mut node: Node,
    ) -> Result<EntryOut, Errno> {
        let mut state = self.lock();
        let ino = state.next_ino;
        let dir = state.nodes.get_mut(&parent).ok_or(Errno::ENOENT)?;
        let Content::Dir(children) = &mut dir.content else {
            return Err(Errno::ENOTDIR);
        };
        if children.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        children.insert(name.to_owned(), ino);
        dir.mtime = now();
        dir.ctime = dir.mtime;
        if matches!(node.content, Content::Dir(_)) {
            dir.nlink += 1;
        }
        let (uid, gid, _) = req.caller();
        (node.uid, node.gid) = (uid, gid);
        (node.atime, node.mtime, node.ctime) = (now(), now(), now());
        let entry = self.entry(ino, &node);
        state.nodes.insert(ino, node);
        state.next_ino += 1;
        Ok(entry)
    }

    /// Removes `name` from `parent`; `dir` selects rmdir semantics.
    fn remove(&self, parent: u64, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let mut state = self.lock();
        let ino = match &state.nodes.get(&parent).ok_or(Errno::ENOENT)?.content {
            Content::Dir(children) => *children.get(name).ok_or(Errno::ENOENT)?,
            _ => return Err(Errno::ENOTDIR),
        };
        let node = state.nodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
        match (&node.content, dir) {
            (Content::Dir(children), true) if !children.is_empty() => return Err(Errno::ENOTEMPTY),
            (Content::Dir(_), true) => node.nlink = 0,
            (Content::Dir(_), false) => return Err(Errno::EISDIR),
            (_, true) => return Err(Errno::ENOTDIR),
            (_, false) => node.nlink -= 1,
        }
        node.ctime = now();
        let parent_node = state.nodes.get_mut(&parent).ok_or(Errno::ENOENT)?;
        if let Content::Dir(children) = &mut parent_node.content {
            children.remove(name);
        }
        if dir {
            parent_node.nlink -= 1;
        }
        parent_node.mtime = now();
        // Nodes stay in the table: the kernel may still hold the nodeid, and
        // an open file stays readable. Nodeids are never reused.
        Ok(())
    }

    fn rename_entry(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        if !RenameFlags::NOREPLACE.contains(flags) {
            return Err(Errno::EINVAL);
        }
        let mut state = self.lock();
        let dir_children =
            |state: &State, dir: u64| match &state.nodes.get(&dir).map(|n| &n.content) {
                Some(Content::Dir(children)) => Ok(children.clone()),
                Some(_) => Err(Errno::ENOTDIR),
                None => Err(Errno::ENOENT),
            };
        let source = *dir_children(&state, parent)?
            .get(name)
            .ok_or(Errno::ENOENT)?;
        let target = dir_children(&state, newparent)?.get(newname).copied();
        if let Some(target) = target {
            if flags.contains(RenameFlags::NOREPLACE) {
                return Err(Errno::EEXIST);
            }
            if target == source {
                return Ok(());
            }
            let is_dir = |ino| {
                matches!(
                    state.nodes.get(&ino).map(|n| &n.content),
                    Some(Content::Dir(_))
                )
            };
            match (is_dir(source), is_dir(target)) {
                (true, false) => return Err(Errno::ENOTDIR),
                (false, true) => return Err(Errno::EISDIR),
                _ => {}
            }
            if let Some(Content::Dir(c)) = state.nodes.get(&target).map(|n| &n.content) {
                if !c.is_empty() {
                    return Err(Errno::ENOTEMPTY);
                }
            }
            if let Some(node) = state.nodes.get_mut(&target) {
                node.nlink = node.nlink.saturating_sub(1);
            }
        }
        for (dir, entry_name, value) in [(parent, name, None), (newparent, newname, Some(source))] {
            if let Some(Content::Dir(children)) = state.nodes.get_mut(&dir).map(|n| &mut n.content)
            {
                match value {
                    None => children.remove(entry_name),
                    Some(ino) => children.insert(entry_name.to_owned(), ino),
                };
            }
        }
        Ok(())
    }

    fn stall(&self, req: &Request<'_>, reply: ReplyData) {
        if let Some(path) = &self.options.journal_path {
            if let Err(err) = std::fs::write(path, req.raw()) {
                tracing::error!(%err, path = %path.display(), "cannot journal the stalled request");
            }
        }
        if let Some(marker) = &self.options.stall_marker {
            if let Err(err) = std::fs::write(marker, format!("{:#x}\n", req.unique())) {
                tracing::error!(%err, "cannot write the stall marker");
            }
        }
        tracing::info!(
            unique = req.unique(),
            "stalling a READ on purpose (test hook)"
        );
        reply.abandon();
    }

    /// FOPEN flags of every open: DIRECT_IO if asked for.
    fn open_flags(&self) -> FopenFlags {
        if self.options.direct_io {
            FopenFlags::DIRECT_IO
        } else if self.options.like_baton {
            FopenFlags::KEEP_CACHE
        } else {
            FopenFlags::empty()
        }
    }

    /// True (once) for the first read of the stalled file.
    fn take_stall(&self, nodeid: u64) -> bool {
        let Some(name) = &self.options.stall_name else {
            return false;
        };
        let mut state = self.lock();
        let is_target = matches!(&state.nodes.get(&NodeId::ROOT.get()).map(|n| &n.content),
            Some(Content::Dir(children)) if children.get(name.as_os_str()) == Some(&nodeid));
        let first = is_target && !state.stalled;
        state.stalled |= first;
        first
    }
}

fn dirent_type(mode: u32) -> u32 {
    (mode & libc::S_IFMT) >> 12
}

impl Filesystem for MemFs {
    fn lookup(&self, _req: &Request<'_>, parent: NodeId, name: &OsStr, reply: ReplyEntry) {
        let parent = parent.get();
        let state = self.lock();
        let found = match state.nodes.get(&parent).map(|n| &n.content) {
            Some(Content::Dir(children)) => children
                .get(name)
                .and_then(|ino| Some((*ino, state.nodes.get(ino)?))),
            _ => None,
        };
        match found {
            Some((ino, node)) => reply.entry(&self.entry(ino, node)),
            None if self.options.like_baton => reply.entry(&self.negative_entry()),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(
        &self,
        _req: &Request<'_>,
        nodeid: NodeId,
        _fh: Option<FileHandle>,
        reply: ReplyAttr,
    ) {
        let nodeid = nodeid.get();
        let state = self.lock();
        match state.nodes.get(&nodeid) {
            Some(node) => reply.attr(&self.attr_out(nodeid, node)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(&self, _req: &Request<'_>, nodeid: NodeId, arg: &SetattrIn, reply: ReplyAttr) {
        let nodeid = nodeid.get();
        let mut state = self.lock();
        let Some(node) = state.nodes.get_mut(&nodeid) else {
            return reply.error(Errno::ENOENT);
        };
        if arg.valid.contains(SetattrValid::MODE) {
            node.mode = (node.mode & libc::S_IFMT) | (arg.mode & 0o7777);
        }
        if arg.valid.contains(SetattrValid::UID) {
            node.uid = arg.uid;
        }
        if arg.valid.contains(SetattrValid::GID) {
            node.gid = arg.gid;
        }
        if arg.valid.contains(SetattrValid::SIZE) {
            match &mut node.content {
                Content::File(data) => data.resize(arg.size as usize, 0),
                _ => return reply.error(Errno::EISDIR),
            }
            node.mtime = now();
        }
        if arg.valid.contains(SetattrValid::ATIME) {
            node.atime = (arg.atime, arg.atimensec);
        }
        if arg.valid.contains(SetattrValid::ATIME_NOW) {
            node.atime = now();
        }
        if arg.valid.contains(SetattrValid::MTIME) {
            node.mtime = (arg.mtime, arg.mtimensec);
        }
        if arg.valid.contains(SetattrValid::MTIME_NOW) {
            node.mtime = now();
        }
        node.ctime = now();
        let out = self.attr_out(nodeid, node);
        reply.attr(&out);
    }

    fn readlink(&self, _req: &Request<'_>, nodeid: NodeId, reply: ReplyData) {
        let nodeid = nodeid.get();
        match self.lock().nodes.get(&nodeid).map(|n| &n.content) {
            Some(Content::Symlink(target)) => reply.data(target.as_bytes()),
            Some(_) => reply.error(Errno::EINVAL),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn symlink(
        &self,
        req: &Request<'_>,
        parent: NodeId,
        name: &OsStr,
        target: &OsStr,
        reply: ReplyEntry,
    ) {
        let parent = parent.get();
        let mut node = file_node(Vec::new(), 0o777);
        node.mode = libc::S_IFLNK | 0o777;
        node.content = Content::Symlink(target.to_owned());
        match self.insert(req, parent, name, node) {
            Ok(entry) => reply.entry(&entry),
            Err(errno) => reply.error(errno),
        }
    }

    fn mknod(
        &self,
        req: &Request<'_>,
        parent: NodeId,
        name: &OsStr,
        arg: &MknodIn,
        reply: ReplyEntry,
    ) {
        let parent = parent.get();
        if arg.mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EPERM);
        }
        let mode = self.new_mode(arg.mode, arg.umask);
        match self.insert(req, parent, name, file_node(Vec::new(), mode)) {
            Ok(entry) => reply.entry(&entry),
            Err(errno) => reply.error(errno),
        }
    }

    fn mkdir(
        &self,
        req: &Request<'_>,
        parent: NodeId,
        name: &OsStr,
        arg: &MkdirIn,
        reply: ReplyEntry,
    ) {
        let parent = parent.get();
        let mut node = file_node(Vec::new(), 0);
        node.mode = libc::S_IFDIR | self.new_mode(arg.mode, arg.umask);
        node.nlink = 2;
        node.content = Content::Dir(BTreeMap::new());
        match self.insert(req, parent, name, node) {
            Ok(entry) => reply.entry(&entry),
            Err(errno) => reply.error(errno),
        }
    }

    fn unlink(&self, _req: &Request<'_>, parent: NodeId, name: &OsStr, reply: ReplyEmpty) {
        let parent = parent.get();
        match self.remove(parent, name, false) {
            Ok(()) => reply.ok(),
            Err(errno) => reply.error(errno),
        }
    }

    fn rmdir(&self, _req: &Request<'_>, parent: NodeId, name: &OsStr, reply: ReplyEmpty) {
        let parent = parent.get();
        match self.remove(parent, name, true) {
            Ok(()) => reply.ok(),
            Err(errno) => reply.error(errno),
        }
    }

    fn rename(
        &self,
        _req: &Request<'_>,
        parent: NodeId,
        name: &OsStr,
        newparent: NodeId,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let parent = parent.get();
        let newparent = newparent.get();
        match self.rename_entry(parent, name, newparent, newname, flags) {
            Ok(()) => reply.ok(),
            Err(errno) => reply.error(errno),
        }
    }

    fn link(
        &self,
        _req: &Request<'_>,
        nodeid: NodeId,
        newparent: NodeId,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let nodeid = nodeid.get();
        let newparent = newparent.get();
        let mut state = self.lock();
        if matches!(
            state.nodes.get(&nodeid).map(|n| &n.content),
            Some(Content::Dir(_))
        ) {
            return reply.error(Errno::EPERM);
        }
        match state.nodes.get_mut(&newparent).map(|n| &mut n.content) {
            Some(Content::Dir(children)) if children.contains_key(newname) => {
                return reply.error(Errno::EEXIST)
            }
            Some(Content::Dir(children)) => {
                children.insert(newname.to_owned(), nodeid);
            }
            _ => return reply.error(Errno::ENOENT),
        }
        match state.nodes.get_mut(&nodeid) {
            Some(node) => {
                node.nlink += 1;
                let entry = self.entry(nodeid, node);
                reply.entry(&entry);
            }
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request<'_>, nodeid: NodeId, arg: &OpenIn, reply: ReplyOpen) {
        // ATOMIC_O_TRUNC: the kernel leaves O_TRUNC to the open.
        if arg.flags & libc::O_TRUNC as u32 != 0 {
            let mut state = self.lock();
            if let Some(node) = state.nodes.get_mut(&nodeid.get()) {
                if let Content::File(data) = &mut node.content {
                    data.clear();
                    node.mtime = now();
                    node.ctime = node.mtime;
                }
            }
        }
        reply.opened(FileHandle::default(), self.open_flags());
    }

    fn opendir(&self, _req: &Request<'_>, _nodeid: NodeId, _arg: &OpenIn, reply: ReplyOpen) {
        let flags = if self.options.like_baton {
            FopenFlags::CACHE_DIR | FopenFlags::KEEP_CACHE
        } else {
            FopenFlags::empty()
        };
        reply.opened(FileHandle::default(), flags);
    }

    fn getxattr(
        &self,
        _req: &Request<'_>,
        _nodeid: NodeId,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        if self.options.like_baton {
            reply.error(Errno::ENODATA);
        } else {
            reply.error(Errno::EOPNOTSUPP);
        }
    }

    fn read(&self, req: &Request<'_>, nodeid: NodeId, arg: &ReadIn, reply: ReplyData) {
        let nodeid = nodeid.get();
        if self.take_stall(nodeid) {
            return self.stall(req, reply);
        }
        let state = self.lock();
        match state.nodes.get(&nodeid).map(|n| &n.content) {
            Some(Content::File(data)) => {
                let start = (arg.offset as usize).min(data.len());
                let end = (start + arg.size as usize).min(data.len());
                reply.data(&data[start..end]);
            }
            Some(_) => reply.error(Errno::EISDIR),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn write(
        &self,
        _req: &Request<'_>,
        nodeid: NodeId,
        arg: &WriteIn,
        data: &[u8],
        reply: ReplyWrite,
    ) {
        let nodeid = nodeid.get();
        let mut state = self.lock();
        let Some(node) = state.nodes.get_mut(&nodeid) else {
            return reply.error(Errno::ENOENT);
        };
        let Content::File(content) = &mut node.content else {
            return reply.error(Errno::EISDIR);
        };
        let start = arg.offset as usize;
        if content.len() < start + data.len() {
            content.resize(start + data.len(), 0);
        }
        content[start..start + data.len()].copy_from_slice(data);
        node.mtime = now();
        reply.written(data.len() as u32);
    }

    fn create(
        &self,
        req: &Request<'_>,
        parent: NodeId,
        name: &OsStr,
        arg: &CreateIn,
        reply: ReplyCreate,
    ) {
        let parent = parent.get();
        let mode = self.new_mode(arg.mode, arg.umask);
        match self.insert(req, parent, name, file_node(Vec::new(), mode)) {
            Ok(entry) => reply.created(&entry, FileHandle::default(), self.open_flags()),
            Err(errno) => reply.error(errno),
        }
    }

    fn readdir(
        &self,
        _req: &Request<'_>,
        nodeid: NodeId,
        arg: &ReadIn,
        mut entries: DirentBuf,
        reply: ReplyData,
    ) {
        let nodeid = nodeid.get();
        let state = self.lock();
        let Some(Content::Dir(children)) = state.nodes.get(&nodeid).map(|n| &n.content) else {
            return reply.error(Errno::ENOTDIR);
        };
        let listing = [(OsStr::new("."), nodeid), (OsStr::new(".."), nodeid)]
            .into_iter()
            .chain(children.iter().map(|(name, ino)| (name.as_os_str(), *ino)));
        for (index, (name, ino)) in listing.enumerate().skip(arg.offset as usize) {
            let Some(node) = state.nodes.get(&ino) else {
                continue;
            };
            let dot = index < 2;
            let entry = (entries.is_plus() && !dot).then(|| self.entry(ino, node));
            let record = DirentRecord {
                ino,
                offset_next: index as u64 + 1,
                typ: dirent_type(node.mode),
                name: name.as_bytes(),
            };
            if !entries.push(record, entry.as_ref()) {
                break;
            }
        }
        reply.data(entries.as_bytes());
    }
}
