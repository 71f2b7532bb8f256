//! One memory cgroup per generation process, under a Baton parent:
//! `<v1 memory root>/<parent>/<mount-id>-gen<N>` (cgroup v1) or
//! `<v2 root>/<parent>/<mount-id>-gen<N>` (cgroup v2, memory controller
//! enabled down to the parent). Gives `--memory-max` a place to live, and
//! tells an OOM kill from any other SIGKILL (the cgroup's `oom_kill` count).
//!
//! Which layout has the memory controller is detected at start
//! ([`detect`]): v2 if its root lists `memory` in `cgroup.controllers`,
//! else a v1 `memory` hierarchy, else none (generations then run in the
//! supervisor's cgroup and deaths by SIGKILL are reported as signals).
//!
//! A child joins its cgroup before it execs: [`Cgroup::procs_path`] is
//! written with "0" (the writer itself) from a `pre_exec` hook.

use std::path::{Path, PathBuf};

use crate::Error;

/// Where cgroup filesystems are mounted.
pub const CGROUP_FS_ROOT: &str = "/sys/fs/cgroup";

/// Which cgroup layout carries the memory controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// cgroup v1: the memory hierarchy's root directory.
    V1 {
        /// e.g. `/sys/fs/cgroup/memory`.
        memory_root: PathBuf,
    },
    /// cgroup v2: the unified hierarchy's root directory.
    V2 {
        /// e.g. `/sys/fs/cgroup` or `/sys/fs/cgroup/unified`.
        root: PathBuf,
    },
}

fn lists_memory(controllers_file: &Path) -> bool {
    std::fs::read_to_string(controllers_file)
        .map(|text| text.split_whitespace().any(|c| c == "memory"))
        .unwrap_or(false)
}

/// Finds the layout with the memory controller under `fs_root` (normally
/// [`CGROUP_FS_ROOT`]): pure v2 at the root, v2 under `unified/` (hybrid),
/// then v1 under `memory/`. Reads only files.
pub fn detect(fs_root: &Path) -> Option<Layout> {
    for root in [fs_root.to_path_buf(), fs_root.join("unified")] {
        if lists_memory(&root.join("cgroup.controllers")) {
            return Some(Layout::V2 { root });
        }
    }
    let memory_root = fs_root.join("memory");
    (memory_root.join("memory.limit_in_bytes").is_file()
        && memory_root.join("cgroup.procs").is_file())
    .then_some(Layout::V1 { memory_root })
}

/// The `oom_kill N` count in a v1 `memory.oom_control` or a v2
/// `memory.events` file. Pure.
pub fn parse_oom_kills(text: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(' ')?;
        (key == "oom_kill").then(|| value.trim().parse().ok())?
    })
}

fn write(path: &Path, value: &str) -> Result<(), Error> {
    std::fs::write(path, value).map_err(Error::io("writing", path))
}

/// The Baton parent cgroup, created at start.
#[derive(Clone, Debug)]
pub struct Parent {
    layout: Layout,
    dir: PathBuf,
}

impl Parent {
    /// Creates (or reuses) the parent `name` in `layout`; on v2 enables the
    /// memory controller for its children.
    pub fn create(layout: Layout, name: &str) -> Result<Parent, Error> {
        let dir = match &layout {
            Layout::V1 { memory_root } => memory_root.join(name),
            Layout::V2 { root } => root.join(name),
        };
        if let Layout::V2 { root } = &layout {
            enable_memory(root)?;
        }
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(source) => {
                return Err(Error::Io {
                    op: "creating cgroup",
                    path: dir,
                    source,
                })
            }
        }
        if matches!(layout, Layout::V2 { .. }) {
            enable_memory(&dir)?;
        }
        Ok(Parent { layout, dir })
    }

    /// The parent directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Creates the cgroup `name` for one generation, with a memory limit.
    /// A leftover of a crashed supervisor with the same name is removed
    /// first (it fails if processes still live in it).
    pub fn child(&self, name: &str, memory_max_bytes: Option<u64>) -> Result<Cgroup, Error> {
        let dir = self.dir.join(name);
        if dir.exists() {
            std::fs::remove_dir(&dir).map_err(Error::io("removing leftover cgroup", &dir))?;
        }
        std::fs::create_dir(&dir).map_err(Error::io("creating cgroup", &dir))?;
        let cgroup = Cgroup {
            v2: matches!(self.layout, Layout::V2 { .. }),
            dir,
        };
        if let Some(bytes) = memory_max_bytes {
            let file = if cgroup.v2 {
                "memory.max"
            } else {
                "memory.limit_in_bytes"
            };
            if let Err(err) = write(&cgroup.dir.join(file), &bytes.to_string()) {
                cgroup.remove();
                return Err(err);
            }
        }
        Ok(cgroup)
    }
}

/// Adds `+memory` to `dir/cgroup.subtree_control` unless it is there.
fn enable_memory(dir: &Path) -> Result<(), Error> {
    let control = dir.join("cgroup.subtree_control");
    if lists_memory(&control) {
        return Ok(());
    }
    write(&control, "+memory")
}

/// One generation's cgroup.
#[derive(Debug)]
pub struct Cgroup {
    v2: bool,
    dir: PathBuf,
}

impl Cgroup {
    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file a process writes "0" to in order to join.
    pub fn procs_path(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// OOM kills inside this cgroup so far.
    pub fn oom_kills(&self) -> Result<u64, Error> {
        let file = self.dir.join(if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        });
        let text = std::fs::read_to_string(&file).map_err(Error::io("reading", &file))?;
        Ok(parse_oom_kills(&text).unwrap_or(0))
    }

    /// Removes the (empty) cgroup; logs and leaves it if that fails.
    pub fn remove(&self) {
        if let Err(err) = std::fs::remove_dir(&self.dir) {
            tracing::warn!(cgroup = %self.dir.display(), %err, "cannot remove a generation's cgroup");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn v1_tree(root: &Path) {
        touch(
            &root.join("memory/memory.limit_in_bytes"),
            "9223372036854771712\n",
        );
        touch(&root.join("memory/cgroup.procs"), "");
    }

    #[test]
    fn hybrid_without_v2_memory_detects_v1() {
        let fs = tempfile::tempdir().unwrap();
        v1_tree(fs.path());
        touch(&fs.path().join("unified/cgroup.controllers"), "\n");
        assert_eq!(
            detect(fs.path()),
            Some(Layout::V1 {
                memory_root: fs.path().join("memory")
            })
        );
    }

    #[test]
    fn v2_with_memory_wins_at_the_root_or_under_unified() {
        let fs = tempfile::tempdir().unwrap();
        touch(
            &fs.path().join("cgroup.controllers"),
            "cpuset cpu io memory hugetlb pids\n",
        );
        assert_eq!(
            detect(fs.path()),
            Some(Layout::V2 {
                root: fs.path().to_path_buf()
            })
        );

        let hybrid = tempfile::tempdir().unwrap();
        v1_tree(hybrid.path());
        touch(
            &hybrid.path().join("unified/cgroup.controllers"),
            "memory pids\n",
        );
        assert_eq!(
            detect(hybrid.path()),
            Some(Layout::V2 {
                root: hybrid.path().join("unified")
            })
        );
    }

    #[test]
    fn no_memory_controller_anywhere_detects_none() {
        let fs = tempfile::tempdir().unwrap();
        assert_eq!(detect(fs.path()), None);
        touch(&fs.path().join("cgroup.controllers"), "cpu io pids\n");
        touch(&fs.path().join("memory/cgroup.procs"), "");
        assert_eq!(detect(fs.path()), None, "a memory dir without its files");
    }

    #[test]
    fn oom_kill_counts_parse_from_v1_and_v2_files() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!(parse_oom_kills(v1), Some(2));
        let v2 = "low 0\nhigh 0\nmax 14\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(parse_oom_kills(v2), Some(1));
        assert_eq!(parse_oom_kills("oom_kill_disable 0\n"), None);
    }

    #[test]
    fn v2_parent_and_child_on_a_fake_tree_enable_memory_and_set_the_limit() {
        let fs = tempfile::tempdir().unwrap();
        touch(&fs.path().join("cgroup.controllers"), "memory pids\n");
        touch(&fs.path().join("cgroup.subtree_control"), "pids\n");
        let layout = detect(fs.path()).unwrap();
        // A plain directory stands in for cgroupfs: pre-create the files
        // the kernel would provide.
        touch(&fs.path().join("baton/cgroup.subtree_control"), "");
        let parent = Parent::create(layout, "baton").unwrap();
        assert_eq!(
            std::fs::read_to_string(fs.path().join("cgroup.subtree_control")).unwrap(),
            "+memory"
        );
        assert_eq!(
            std::fs::read_to_string(parent.dir().join("cgroup.subtree_control")).unwrap(),
            "+memory"
        );
        let child = parent.child("m-gen1", Some(64 << 20)).unwrap();
        assert_eq!(
            std::fs::read_to_string(child.dir().join("memory.max")).unwrap(),
            (64u64 << 20).to_string()
        );
        touch(&child.dir().join("memory.events"), "oom 1\noom_kill 1\n");
        assert_eq!(child.oom_kills().unwrap(), 1);
        assert_eq!(
            child.procs_path(),
            fs.path().join("baton/m-gen1/cgroup.procs")
        );
    }
}
