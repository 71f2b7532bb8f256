//! O_TMPFILE on a mounted volume: a file opened without a name, written,
//! then published with `linkat` (by AT_EMPTY_PATH and by /proc/self/fd),
//! reads back whole under its name with nlink 1, its size and mode, after
//! a remount too; with O_EXCL, or once unlinked, it cannot be linked
//! (ENOENT, compared with the same calls on the host's filesystem); closed
//! without a name it is reclaimed with its objects and quota charge. Each
//! test mounts its own volume with the real `fsclient` binary. Needs root
//! and /dev/fuse.

#![allow(clippy::unwrap_used)]

mod common;

use std::fs::{self, File};
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use baton_meta::{MetaStore, QuotaUsage};
use common::*;

fn meta(vol: &Volume) -> Box<dyn MetaStore> {
    baton_meta::open(s(&vol.meta_path())).unwrap()
}

/// open(dir, O_TMPFILE | `flags`, `mode`): the file, or the errno.
fn open_tmpfile(dir: &Path, flags: i32, mode: u32) -> Result<File, i32> {
    let path = cstr(dir);
    // SAFETY: a valid NUL-terminated path; the fd returned is ours alone.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_TMPFILE | flags, mode) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: `fd` is a new open file descriptor nobody else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// How an open file is given a name.
#[derive(Clone, Copy, Debug)]
enum LinkBy {
    /// `linkat(fd, "", AT_FDCWD, to, AT_EMPTY_PATH)`.
    EmptyPath,
    /// `linkat(AT_FDCWD, "/proc/self/fd/N", AT_FDCWD, to, AT_SYMLINK_FOLLOW)`.
    ProcFd,
}

/// Links the open file `f` at `to`: 0 or the errno.
fn link_open_file(f: &File, to: &Path, by: LinkBy) -> i32 {
    let to = cstr(to);
    let rc = match by {
        // SAFETY: valid fd and NUL-terminated paths; plain syscall.
        LinkBy::EmptyPath => unsafe {
            libc::linkat(
                f.as_raw_fd(),
                c"".as_ptr(),
                libc::AT_FDCWD,
                to.as_ptr(),
                libc::AT_EMPTY_PATH,
            )
        },
        LinkBy::ProcFd => {
            let proc_path = cstr(Path::new(&format!("/proc/self/fd/{}", f.as_raw_fd())));
            // SAFETY: as above.
            unsafe {
                libc::linkat(
                    libc::AT_FDCWD,
                    proc_path.as_ptr(),
                    libc::AT_FDCWD,
                    to.as_ptr(),
                    libc::AT_SYMLINK_FOLLOW,
                )
            }
        }
    };
    if rc == 0 {
        0
    } else {
        errno()
    }
}

#[test]
fn an_o_tmpfile_written_then_linked_reads_back_whole_under_its_name() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    fs::create_dir(m.p("d")).unwrap();
    for (i, by) in [LinkBy::EmptyPath, LinkBy::ProcFd].into_iter().enumerate() {
        let data = pattern(300_000 + i * 7, i as u64);
        let mut f = open_tmpfile(&m.p("d"), libc::O_RDWR, 0o600).unwrap();
        let before = f.metadata().unwrap();
        assert_eq!((before.nlink(), before.len()), (0, 0), "{by:?}");
        f.write_all(&data).unwrap();
        assert!(
            fs::read_dir(m.p("d")).unwrap().count() == i,
            "{by:?}: no entry before the link"
        );
        let name = format!("d/published-{i}");
        assert_eq!(link_open_file(&f, &m.p(&name), by), 0, "{by:?}");
        let st = fs::metadata(m.p(&name)).unwrap();
        assert_eq!(
            (st.nlink(), st.len(), st.mode(), st.ino()),
            (1, data.len() as u64, libc::S_IFREG | 0o600, before.ino()),
            "{by:?}"
        );
        assert_eq!(fs::read(m.p(&name)).unwrap(), data, "{by:?}");
        // The fd goes on writing into the named file.
        f.write_all_at(b"tail", data.len() as u64).unwrap();
        drop(f);
        let mut want = data.clone();
        want.extend_from_slice(b"tail");
        assert_eq!(fs::read(m.p(&name)).unwrap(), want, "{by:?}");
    }
    assert!(
        wait_until(DEADLINE, || meta(&vol).orphans().unwrap().is_empty()),
        "a linked tmpfile is no orphan: {:?}",
        meta(&vol).orphans()
    );
    m.stop();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let mut want = pattern(300_000, 0);
    want.extend_from_slice(b"tail");
    assert_eq!(fs::read(m.p("d/published-0")).unwrap(), want);
    m.stop();
}

/// The errno of each way of linking a file that may not be linked: an
/// O_TMPFILE opened with O_EXCL, an ordinary file unlinked while open,
/// and an O_TMPFILE linked once and then unlinked.
fn unlinkable_outcomes(dir: &Path) -> Vec<(&'static str, i32)> {
    let mut out = Vec::new();
    for by in [LinkBy::EmptyPath, LinkBy::ProcFd] {
        let excl = open_tmpfile(dir, libc::O_RDWR | libc::O_EXCL, 0o600).unwrap();
        out.push((
            "O_TMPFILE|O_EXCL",
            link_open_file(&excl, &dir.join("excl"), by),
        ));

        let path = dir.join("ordinary");
        fs::write(&path, b"x").unwrap();
        let ordinary = File::options().read(true).write(true).open(&path).unwrap();
        fs::remove_file(&path).unwrap();
        out.push(("unlinked file", link_open_file(&ordinary, &path, by)));

        let once = open_tmpfile(dir, libc::O_RDWR, 0o600).unwrap();
        let first = dir.join("once");
        assert_eq!(link_open_file(&once, &first, by), 0);
        fs::remove_file(&first).unwrap();
        out.push((
            "tmpfile unlinked after its link",
            link_open_file(&once, &dir.join("twice"), by),
        ));
    }
    out
}

#[test]
fn an_o_excl_tmpfile_or_an_unlinked_file_cannot_be_linked_as_on_the_host() {
    let host = tempfile::tempdir().unwrap();
    let expected = unlinkable_outcomes(host.path());
    assert!(
        expected.iter().all(|(_, e)| *e == libc::ENOENT),
        "the host's filesystem: {expected:?}"
    );
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    assert_eq!(unlinkable_outcomes(&m.mnt), expected);
    let mut names: Vec<String> = fs::read_dir(&m.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert!(names.is_empty(), "nothing was linked: {names:?}");
    assert!(
        wait_until(DEADLINE, || meta(&vol).orphans().unwrap().is_empty()),
        "every one was reclaimed at its close: {:?}",
        meta(&vol).orphans()
    );
    m.stop();
}

#[test]
fn an_o_tmpfile_closed_without_a_name_is_reclaimed_with_its_quota_charge() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let q = m.p("q");
    fs::create_dir(&q).unwrap();
    let q_ino = fs::metadata(&q).unwrap().ino();
    meta(&vol)
        .set_quota(q_ino, Some(1 << 20), Some(10))
        .unwrap();
    let usage = || meta(&vol).quota(q_ino).unwrap().unwrap().used;

    let mut f = open_tmpfile(&q, libc::O_RDWR, 0o640).unwrap();
    let ino = f.metadata().unwrap().ino();
    f.write_all(&pattern(200_000, 3)).unwrap();
    f.sync_all().unwrap();
    assert!(!object_files(&vol, ino).is_empty(), "fsync uploaded it");
    assert_eq!(
        usage(),
        QuotaUsage {
            bytes: 200_000,
            inodes: 1
        },
        "its directory's quota counts it"
    );
    assert_eq!(meta(&vol).orphans().unwrap(), vec![ino]);
    drop(f);
    assert!(
        wait_until(DEADLINE, || object_files(&vol, ino).is_empty()
            && meta(&vol).orphans().unwrap().is_empty()),
        "closed unnamed, it is reclaimed: orphans {:?}, objects {:?}",
        meta(&vol).orphans(),
        object_files(&vol, ino)
    );
    assert!(meta(&vol).getattr(ino).is_err());
    assert_eq!(usage(), QuotaUsage::default());
    assert_eq!(fs::read_dir(&q).unwrap().count(), 0);
    assert!(meta(&vol).recount_quotas(false).unwrap().is_empty());
    m.stop();
}

#[test]
fn an_o_tmpfile_follows_the_umask_and_a_set_group_id_directory() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let shared = m.p("shared");
    fs::create_dir(&shared).unwrap();
    let (ok, _, err) = sh(&format!("chgrp 50 {0} && chmod 2777 {0}", s(&shared)));
    assert!(ok, "{err}");
    // SAFETY: umask only changes this process's file creation mask.
    let old = unsafe { libc::umask(0o027) };
    let f = open_tmpfile(&shared, libc::O_RDWR, 0o666);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let f = f.unwrap();
    let st = f.metadata().unwrap();
    assert_eq!((st.mode() & 0o7777, st.gid()), (0o640, 50));
    assert_eq!(link_open_file(&f, &shared.join("f"), LinkBy::EmptyPath), 0);
    let named = fs::metadata(shared.join("f")).unwrap();
    assert_eq!(
        (named.mode() & 0o7777, named.gid(), named.nlink()),
        (0o640, 50, 1)
    );
    m.stop();
}
