//! Metadata churn against an in-memory model of the tree: create, mkdir,
//! rename (also over an existing file), link, unlink, rmdir, setxattr,
//! readdir, stat and read, publication through O_TMPFILE (write, then
//! `linkat`) and an O_TMPFILE closed without a name (no entry appears),
//! each checked against the model as it runs; at
//! the end the whole tree on the mount (paths, types, contents, link
//! counts, hard-link identity, user xattrs) is compared with the model.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::Ctx;

/// Entries in one churn tree before the worker only removes.
const ENTRY_COUNT_MAX: usize = 150;
/// Directory depth limit.
const DEPTH_MAX: usize = 3;
/// Largest file content.
const FILE_BYTES_MAX: u64 = 8 << 10;
const XATTR_VALUE_BYTES_MAX: u64 = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    Dir,
    File(u64),
}

#[derive(Default)]
struct Inode {
    content: Vec<u8>,
    xattrs: BTreeMap<String, Vec<u8>>,
}

/// The expected tree: relative path ("" is the root) -> node.
#[derive(Default)]
struct Model {
    nodes: BTreeMap<String, Node>,
    inodes: BTreeMap<u64, Inode>,
    next: u64,
}

fn parent(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(p, _)| p)
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

impl Model {
    fn fresh(&mut self, prefix: &str) -> String {
        self.next += 1;
        format!("{prefix}{}", self.next)
    }

    fn dirs(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|(_, n)| **n == Node::Dir)
            .map(|(p, _)| p.clone())
            .collect()
    }

    fn files(&self) -> Vec<(String, u64)> {
        self.nodes
            .iter()
            .filter_map(|(p, n)| match n {
                Node::File(id) => Some((p.clone(), *id)),
                Node::Dir => None,
            })
            .collect()
    }

    fn children(&self, dir: &str) -> Vec<String> {
        self.nodes
            .keys()
            .filter(|p| !p.is_empty() && parent(p) == dir)
            .map(|p| p.rsplit('/').next().unwrap_or(p).to_string())
            .collect()
    }

    fn links(&self, id: u64) -> u64 {
        self.nodes
            .values()
            .filter(|n| **n == Node::File(id))
            .count() as u64
    }

    fn remove_path(&mut self, path: &str) {
        if let Some(Node::File(id)) = self.nodes.remove(path) {
            if self.links(id) == 0 {
                self.inodes.remove(&id);
            }
        }
    }

    /// Moves `from` (and everything under it) to `to`, replacing a file at `to`.
    fn rename(&mut self, from: &str, to: &str) {
        self.remove_path(to);
        let prefix = format!("{from}/");
        let moved: Vec<String> = self
            .nodes
            .keys()
            .filter(|p| p.as_str() == from || p.starts_with(&prefix))
            .cloned()
            .collect();
        for old in moved {
            if let Some(node) = self.nodes.remove(&old) {
                self.nodes
                    .insert(format!("{to}{}", &old[from.len()..]), node);
            }
        }
    }
}

fn c_path(path: &Path) -> std::io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
}

fn setxattr(path: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    let (p, n) = (
        c_path(path)?,
        CString::new(name).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?,
    );
    // SAFETY: valid NUL-terminated strings and a buffer of value.len() bytes.
    let rc = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn getxattr(path: &Path, name: &str) -> std::io::Result<Vec<u8>> {
    let (p, n) = (
        c_path(path)?,
        CString::new(name).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?,
    );
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid NUL-terminated strings and a buffer of buf.len() bytes.
    let rc = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(rc as usize);
    Ok(buf)
}

fn listxattr(path: &Path) -> std::io::Result<Vec<String>> {
    let p = c_path(path)?;
    let mut buf = vec![0u8; 4096];
    // SAFETY: a valid NUL-terminated path and a buffer of buf.len() bytes.
    let rc = unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(rc as usize);
    Ok(buf
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .filter(|s| s.starts_with("user."))
        .collect())
}

struct Churn {
    root: PathBuf,
    model: Model,
    /// False once an operation failed: its effect is unknown, so the final
    /// comparison is skipped (the failure itself fails the scenario).
    valid: bool,
}

impl Churn {
    fn abs(&self, rel: &str) -> PathBuf {
        if rel.is_empty() {
            self.root.clone()
        } else {
            self.root.join(rel)
        }
    }

    fn pick<T: Clone>(ctx: &mut Ctx, items: &[T]) -> Option<T> {
        if items.is_empty() {
            None
        } else {
            Some(items[ctx.rng.below(items.len() as u64) as usize].clone())
        }
    }

    fn checked(&mut self, ok: bool) {
        if !ok {
            self.valid = false;
        }
    }

    fn create(&mut self, ctx: &mut Ctx) {
        let Some(dir) = Self::pick(ctx, &self.model.dirs()) else {
            return;
        };
        let rel = join(&dir, &self.model.fresh("f"));
        let content = {
            let len = ctx.rng.below(FILE_BYTES_MAX + 1) as usize;
            ctx.rng.bytes(len)
        };
        let path = self.abs(&rel);
        let ok = ctx
            .op("create", path.display(), || {
                let mut f = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&path)?;
                f.write_all(&content)
            })
            .is_ok();
        self.checked(ok);
        if ok {
            self.model.next += 1;
            let id = self.model.next;
            self.model.inodes.insert(
                id,
                Inode {
                    content,
                    xattrs: BTreeMap::new(),
                },
            );
            self.model.nodes.insert(rel, Node::File(id));
        }
    }

    /// A file written under no name (O_TMPFILE), then linked: it appears
    /// whole at once, as a created file does.
    fn tmpfile_publish(&mut self, ctx: &mut Ctx) {
        let Some(dir) = Self::pick(ctx, &self.model.dirs()) else {
            return;
        };
        let rel = join(&dir, &self.model.fresh("t"));
        let content = {
            let len = ctx.rng.below(FILE_BYTES_MAX + 1) as usize;
            ctx.rng.bytes(len)
        };
        let (dir_path, path) = (self.abs(&dir), self.abs(&rel));
        let ok = ctx
            .op("tmpfile-publish", path.display(), || {
                let mut f = crate::tmpfile::open_tmpfile(&dir_path, 0, 0o644)?;
                f.write_all(&content)?;
                crate::tmpfile::link_open_file(&f, &path)
            })
            .is_ok();
        self.checked(ok);
        if ok {
            self.model.next += 1;
            let id = self.model.next;
            self.model.inodes.insert(
                id,
                Inode {
                    content,
                    xattrs: BTreeMap::new(),
                },
            );
            self.model.nodes.insert(rel, Node::File(id));
        }
    }

    /// A file written under no name (O_TMPFILE) and closed: the tree does
    /// not change (readdir and the final walk check that).
    fn tmpfile_discard(&mut self, ctx: &mut Ctx) {
        let Some(dir) = Self::pick(ctx, &self.model.dirs()) else {
            return;
        };
        let content = {
            let len = ctx.rng.below(FILE_BYTES_MAX + 1) as usize;
            ctx.rng.bytes(len)
        };
        let dir_path = self.abs(&dir);
        let ok = ctx
            .op("tmpfile-discard", dir_path.display(), || {
                let mut f = crate::tmpfile::open_tmpfile(&dir_path, 0, 0o644)?;
                f.write_all(&content)
            })
            .is_ok();
        self.checked(ok);
    }

    fn mkdir(&mut self, ctx: &mut Ctx) {
        let dirs: Vec<String> = self
            .model
            .dirs()
            .into_iter()
            .filter(|d| d.matches('/').count() + 1 < DEPTH_MAX || d.is_empty())
            .collect();
        let Some(dir) = Self::pick(ctx, &dirs) else {
            return;
        };
        let rel = join(&dir, &self.model.fresh("d"));
        let path = self.abs(&rel);
        let ok = ctx
            .op("mkdir", path.display(), || std::fs::create_dir(&path))
            .is_ok();
        self.checked(ok);
        if ok {
            self.model.nodes.insert(rel, Node::Dir);
        }
    }

    fn rename(&mut self, ctx: &mut Ctx) {
        let sources: Vec<String> = self
            .model
            .nodes
            .keys()
            .filter(|p| !p.is_empty())
            .cloned()
            .collect();
        let Some(from) = Self::pick(ctx, &sources) else {
            return;
        };
        let from_node = self.model.nodes.get(&from).copied();
        let over_file = matches!(from_node, Some(Node::File(_))) && ctx.rng.chance(1, 4);
        let to = if over_file {
            let targets: Vec<String> = self
                .model
                .files()
                .into_iter()
                .filter(|(p, id)| *p != from && Some(Node::File(*id)) != from_node)
                .map(|(p, _)| p)
                .collect();
            match Self::pick(ctx, &targets) {
                Some(t) => t,
                None => return,
            }
        } else {
            let prefix = format!("{from}/");
            let dirs: Vec<String> = self
                .model
                .dirs()
                .into_iter()
                .filter(|d| *d != from && !d.starts_with(&prefix))
                .collect();
            let Some(dir) = Self::pick(ctx, &dirs) else {
                return;
            };
            join(&dir, &self.model.fresh("r"))
        };
        if from_node == Some(Node::Dir) {
            // Keep the whole moved subtree within the depth limit.
            let prefix = format!("{from}/");
            let height = self
                .model
                .nodes
                .keys()
                .filter(|p| p.starts_with(&prefix))
                .map(|p| p[prefix.len()..].matches('/').count() + 1)
                .max()
                .unwrap_or(0);
            if to.matches('/').count() + 1 + height > DEPTH_MAX + 1 {
                return;
            }
        }
        let (a, b) = (self.abs(&from), self.abs(&to));
        let ok = ctx
            .op(
                "rename",
                format!("{} -> {}", a.display(), b.display()),
                || std::fs::rename(&a, &b),
            )
            .is_ok();
        self.checked(ok);
        if ok {
            self.model.rename(&from, &to);
        }
    }

    fn link(&mut self, ctx: &mut Ctx) {
        let Some((from, id)) = Self::pick(ctx, &self.model.files()) else {
            return;
        };
        let Some(dir) = Self::pick(ctx, &self.model.dirs()) else {
            return;
        };
        let to = join(&dir, &self.model.fresh("l"));
        let (a, b) = (self.abs(&from), self.abs(&to));
        let ok = ctx
            .op("link", b.display(), || std::fs::hard_link(&a, &b))
            .is_ok();
        self.checked(ok);
        if ok {
            self.model.nodes.insert(to, Node::File(id));
        }
    }

    fn unlink(&mut self, ctx: &mut Ctx) {
        let Some((rel, _)) = Self::pick(ctx, &self.model.files()) else {
            return;
        };
        let path = self.abs(&rel);
        let ok = ctx
            .op("unlink", path.display(), || std::fs::remove_file(&path))
            .is_ok();
        self.checked(ok);
        if ok {
            self.model.remove_path(&rel);
        }
    }

    fn rmdir(&mut self, ctx: &mut Ctx) {
        let empty: Vec<String> = self
            .model
            .dirs()
            .into_iter()
            .filter(|d| !d.is_empty() && self.model.children(d).is_empty())
            .collect();
        let Some(rel) = Self::pick(ctx, &empty) else {
            return;
        };
        let path = self.abs(&rel);
        let ok = ctx
            .op("rmdir", path.display(), || std::fs::remove_dir(&path))
            .is_ok();
        self.checked(ok);
        if ok {
            self.model.nodes.remove(&rel);
        }
    }

    fn setxattr(&mut self, ctx: &mut Ctx) {
        let Some((rel, id)) = Self::pick(ctx, &self.model.files()) else {
            return;
        };
        let name = format!("user.k{}", ctx.rng.below(4));
        let value = {
            let len = ctx.rng.range(1, XATTR_VALUE_BYTES_MAX) as usize;
            ctx.rng.bytes(len)
        };
        let path = self.abs(&rel);
        let ok = ctx
            .op("setxattr", path.display(), || {
                setxattr(&path, &name, &value)
            })
            .is_ok();
        self.checked(ok);
        if let (true, Some(inode)) = (ok, self.model.inodes.get_mut(&id)) {
            inode.xattrs.insert(name, value);
        }
    }

    fn readdir(&mut self, ctx: &mut Ctx) {
        let Some(rel) = Self::pick(ctx, &self.model.dirs()) else {
            return;
        };
        let path = self.abs(&rel);
        let Ok(mut listed) = ctx.op("readdir", path.display(), || {
            std::fs::read_dir(&path)?
                .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect::<std::io::Result<Vec<String>>>()
        }) else {
            self.valid = false;
            return;
        };
        listed.sort();
        let mut expected = self.model.children(&rel);
        expected.sort();
        if listed != expected {
            ctx.mismatch(format!(
                "readdir {}: {listed:?}, model {expected:?}",
                path.display()
            ));
        }
    }

    fn stat_and_read(&mut self, ctx: &mut Ctx) {
        let Some((rel, id)) = Self::pick(ctx, &self.model.files()) else {
            return;
        };
        let path = self.abs(&rel);
        let links = self.model.links(id);
        let Some(expected) = self.model.inodes.get(&id).map(|i| i.content.clone()) else {
            return;
        };
        match ctx.op("stat", path.display(), || std::fs::symlink_metadata(&path)) {
            Ok(meta) if meta.len() != expected.len() as u64 || meta.nlink() != links => ctx
                .mismatch(format!(
                    "stat {}: size {} nlink {}, model {} and {links}",
                    path.display(),
                    meta.len(),
                    meta.nlink(),
                    expected.len()
                )),
            Ok(_) => {}
            Err(_) => self.valid = false,
        }
        if let Ok(got) = ctx.op("read", path.display(), || std::fs::read(&path)) {
            ctx.report.read_bytes_verified += got.len().min(expected.len()) as u64;
            ctx.compare(&path, 0, &expected, &got);
        } else {
            self.valid = false;
        }
    }

    fn step(&mut self, ctx: &mut Ctx) {
        let full = self.model.nodes.len() >= ENTRY_COUNT_MAX;
        let roll = ctx.rng.below(100);
        match roll {
            0..=19 if !full => self.create(ctx),
            20..=27 if !full => self.mkdir(ctx),
            28..=42 => self.rename(ctx),
            43..=50 if !full => self.link(ctx),
            51..=62 => self.unlink(ctx),
            63..=69 => self.rmdir(ctx),
            70..=77 => self.setxattr(ctx),
            78..=84 => self.readdir(ctx),
            85..=88 if !full => self.tmpfile_publish(ctx),
            89 => self.tmpfile_discard(ctx),
            85..=88 => self.readdir(ctx),
            90..=99 => self.stat_and_read(ctx),
            _ => self.unlink(ctx),
        }
    }
}

/// Walks the tree under `root`: relative path -> (is dir, metadata).
fn walk(
    ctx: &mut Ctx,
    root: &Path,
    rel: &str,
    out: &mut BTreeMap<String, std::fs::Metadata>,
) -> bool {
    let dir = if rel.is_empty() {
        root.to_path_buf()
    } else {
        root.join(rel)
    };
    let Ok(entries) = ctx.op("readdir", dir.display(), || {
        std::fs::read_dir(&dir)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<std::io::Result<Vec<String>>>()
    }) else {
        return false;
    };
    for name in entries {
        let child = join(rel, &name);
        let path = root.join(&child);
        let Ok(meta) = ctx.op("stat", path.display(), || std::fs::symlink_metadata(&path)) else {
            return false;
        };
        let is_dir = meta.is_dir();
        out.insert(child.clone(), meta);
        if is_dir && !walk(ctx, root, &child, out) {
            return false;
        }
    }
    true
}

fn final_check(ctx: &mut Ctx, churn: &Churn) {
    let mut found = BTreeMap::new();
    if !walk(ctx, &churn.root, "", &mut found) {
        return;
    }
    ctx.report.tree_checked = true;
    let mut st_ino_of: BTreeMap<u64, u64> = BTreeMap::new();
    for (rel, node) in churn.model.nodes.iter().filter(|(p, _)| !p.is_empty()) {
        let path = churn.abs(rel);
        let Some(meta) = found.get(rel) else {
            ctx.mismatch(format!("{} missing", path.display()));
            if let Node::File(id) = node {
                ctx.report.lost_bytes += churn
                    .model
                    .inodes
                    .get(id)
                    .map_or(0, |i| i.content.len() as u64);
            }
            continue;
        };
        let Node::File(id) = node else {
            if !meta.is_dir() {
                ctx.mismatch(format!("{} is not a directory", path.display()));
            }
            continue;
        };
        let Some(inode) = churn.model.inodes.get(id) else {
            continue;
        };
        if *st_ino_of.entry(*id).or_insert(meta.ino()) != meta.ino() {
            ctx.mismatch(format!("{}: hard link to another inode", path.display()));
        }
        if meta.nlink() != churn.model.links(*id) {
            ctx.mismatch(format!(
                "{}: nlink {}, model {}",
                path.display(),
                meta.nlink(),
                churn.model.links(*id)
            ));
        }
        if let Some(got) = ctx.read_direct(&path) {
            ctx.report.acknowledged_bytes_verified += got.len().min(inode.content.len()) as u64;
            ctx.compare(&path, 0, &inode.content, &got);
        }
        if let Ok(mut names) = ctx.op("listxattr", path.display(), || listxattr(&path)) {
            names.sort();
            let expected: Vec<String> = inode.xattrs.keys().cloned().collect();
            if names != expected {
                ctx.mismatch(format!(
                    "{}: xattrs {names:?}, model {expected:?}",
                    path.display()
                ));
            }
        }
        for (name, value) in &inode.xattrs {
            if let Ok(got) = ctx.op("getxattr", path.display(), || getxattr(&path, name)) {
                if got != *value {
                    ctx.mismatch(format!("{}: xattr {name} differs", path.display()));
                }
            }
        }
    }
    for rel in found.keys() {
        if !churn.model.nodes.contains_key(rel) {
            ctx.mismatch(format!("{} is not in the model", churn.abs(rel).display()));
        }
    }
}

pub(super) fn run(ctx: &mut Ctx) {
    let root = ctx
        .args
        .mnt
        .join("churn")
        .join(format!("c{}", ctx.args.index));
    if ctx
        .op("mkdir", root.display(), || std::fs::create_dir_all(&root))
        .is_err()
    {
        return;
    }
    let mut churn = Churn {
        root,
        model: Model::default(),
        valid: true,
    };
    churn.model.nodes.insert(String::new(), Node::Dir);
    // After a failed operation the model is unknown: stop churning, so the
    // report shows the first failure rather than its consequences.
    while !ctx.should_stop() {
        if churn.valid {
            churn.step(ctx);
        } else {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    if churn.valid {
        final_check(ctx, &churn);
    } else {
        ctx.report.note(
            "an operation failed: the final tree was not compared with the model".to_string(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rename_moves_a_subtree_and_replaces_a_file() {
        let mut m = Model::default();
        m.nodes.insert(String::new(), Node::Dir);
        m.nodes.insert("d1".into(), Node::Dir);
        m.nodes.insert("d1/f2".into(), Node::File(2));
        m.nodes.insert("f3".into(), Node::File(3));
        m.inodes.insert(2, Inode::default());
        m.inodes.insert(3, Inode::default());
        m.rename("d1", "d9");
        assert_eq!(m.nodes.get("d9/f2"), Some(&Node::File(2)));
        assert!(!m.nodes.contains_key("d1/f2"));
        m.rename("d9/f2", "f3");
        assert_eq!(m.nodes.get("f3"), Some(&Node::File(2)));
        assert!(!m.inodes.contains_key(&3), "the replaced inode is gone");
        assert_eq!(m.children("d9"), Vec::<String>::new());
    }
}
