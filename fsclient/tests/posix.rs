//! POSIX behaviour of a mounted Baton volume, through std::fs and libc on
//! the mountpoint: names, errors, data, sizes, holes, xattrs, special files,
//! times and statfs. Each test mounts its own volume with the real
//! `fsclient` binary. Needs root and /dev/fuse.

#![allow(clippy::unwrap_used)]

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};

use common::*;

fn err_of<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    r.expect_err("the call must fail").raw_os_error().unwrap()
}

#[test]
fn names_and_their_errors() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    fs::write(m.p("f"), b"data").unwrap();
    fs::create_dir(m.p("d")).unwrap();
    fs::write(m.p("d/inner"), b"x").unwrap();

    assert_eq!(err_of(fs::create_dir(m.p("d"))), libc::EEXIST);
    assert_eq!(
        err_of(
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(m.p("f"))
        ),
        libc::EEXIST
    );
    assert_eq!(err_of(File::open(m.p("missing"))), libc::ENOENT);
    assert_eq!(err_of(fs::remove_file(m.p("missing"))), libc::ENOENT);
    assert_eq!(err_of(fs::create_dir(m.p("f/sub"))), libc::ENOTDIR);
    assert_eq!(err_of(File::open(m.p("f/sub"))), libc::ENOTDIR);
    assert_eq!(err_of(fs::remove_dir(m.p("f"))), libc::ENOTDIR);
    assert_eq!(err_of(fs::remove_file(m.p("d"))), libc::EISDIR);
    assert_eq!(
        err_of(OpenOptions::new().write(true).open(m.p("d"))),
        libc::EISDIR
    );
    assert_eq!(err_of(fs::remove_dir(m.p("d"))), libc::ENOTEMPTY);
    let long = "n".repeat(256);
    assert_eq!(err_of(fs::write(m.p(&long), b"")), libc::ENAMETOOLONG);
    assert_eq!(err_of(fs::create_dir(m.p(&long))), libc::ENAMETOOLONG);
    fs::write(m.p(&"n".repeat(255)), b"ok").unwrap();

    fs::remove_file(m.p("d/inner")).unwrap();
    fs::remove_dir(m.p("d")).unwrap();
    assert_eq!(err_of(fs::metadata(m.p("d"))), libc::ENOENT);
    let root = fs::metadata(&m.mnt).unwrap();
    assert_eq!(root.ino(), 1);
    assert_eq!(root.nlink(), 2);
    fs::create_dir(m.p("sub")).unwrap();
    assert_eq!(fs::metadata(&m.mnt).unwrap().nlink(), 3);
    m.stop();
}

/// A name a directory lacks is answered by the kernel the next time
/// (a negative entry: `stat` of a missing module or header, as an
/// interpreter or a compiler searching its paths makes, costs no request),
/// and every way of making the name through the mount replaces it.
#[test]
fn a_missing_name_is_remembered_until_the_mount_makes_it() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    fs::create_dir(m.p("d")).unwrap();
    for name in ["f", "dir", "moved", "link", "sym", "node"] {
        assert_eq!(
            err_of(fs::symlink_metadata(m.p(&format!("d/{name}")))),
            libc::ENOENT
        );
    }
    // With the server stopped, the kernel answers from its entry alone.
    let pid = m.child.pid();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let (answered, _, stderr) = sh(&format!(
        "timeout 5 stat {} 2>&1; test $? -eq 1",
        s(&m.p("d/f"))
    ));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    assert!(
        answered,
        "stat of a remembered missing name waited for the server: {stderr}"
    );

    fs::write(m.p("d/f"), b"made").unwrap();
    fs::create_dir(m.p("d/dir")).unwrap();
    fs::write(m.p("src"), b"moved").unwrap();
    fs::rename(m.p("src"), m.p("d/moved")).unwrap();
    fs::hard_link(m.p("d/f"), m.p("d/link")).unwrap();
    std::os::unix::fs::symlink("f", m.p("d/sym")).unwrap();
    let (made, _, stderr) = sh(&format!("mkfifo {}", s(&m.p("d/node"))));
    assert!(made, "mkfifo: {stderr}");
    assert_eq!(fs::read(m.p("d/f")).unwrap(), b"made");
    assert!(fs::metadata(m.p("d/dir")).unwrap().is_dir());
    assert_eq!(fs::read(m.p("d/moved")).unwrap(), b"moved");
    assert_eq!(fs::read(m.p("d/link")).unwrap(), b"made");
    assert_eq!(fs::read(m.p("d/sym")).unwrap(), b"made");
    assert!(fs::symlink_metadata(m.p("d/node")).is_ok());
    assert_eq!(err_of(fs::symlink_metadata(m.p("src"))), libc::ENOENT);

    // Gone again, and made again.
    fs::remove_file(m.p("d/f")).unwrap();
    assert_eq!(err_of(fs::symlink_metadata(m.p("d/f"))), libc::ENOENT);
    fs::write(m.p("d/f"), b"again").unwrap();
    assert_eq!(fs::read(m.p("d/f")).unwrap(), b"again");
}

fn renameat2(from: &std::path::Path, to: &std::path::Path, flags: u32) -> i32 {
    let (a, b) = (cstr(from), cstr(to));
    // SAFETY: valid NUL-terminated paths; plain syscall.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    };
    if rc == 0 {
        0
    } else {
        errno()
    }
}

#[test]
fn rename_replaces_exchanges_and_refuses() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    fs::write(m.p("a"), b"A").unwrap();
    fs::write(m.p("b"), b"B").unwrap();
    fs::create_dir_all(m.p("dir/sub")).unwrap();
    fs::create_dir(m.p("full")).unwrap();
    fs::write(m.p("full/x"), b"").unwrap();

    assert_eq!(
        renameat2(&m.p("a"), &m.p("b"), libc::RENAME_NOREPLACE),
        libc::EEXIST
    );
    assert_eq!(renameat2(&m.p("a"), &m.p("b"), libc::RENAME_EXCHANGE), 0);
    assert_eq!(fs::read(m.p("a")).unwrap(), b"B");
    assert_eq!(fs::read(m.p("b")).unwrap(), b"A");
    assert_eq!(
        renameat2(
            &m.p("a"),
            &m.p("b"),
            libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE
        ),
        libc::EINVAL
    );
    assert_eq!(
        renameat2(&m.p("a"), &m.p("c"), libc::RENAME_WHITEOUT),
        libc::EINVAL
    );
    assert_eq!(
        renameat2(&m.p("a"), &m.p("c"), libc::RENAME_EXCHANGE),
        libc::ENOENT
    );

    // Plain rename over an existing file replaces it.
    fs::rename(m.p("a"), m.p("b")).unwrap();
    assert_eq!(fs::read(m.p("b")).unwrap(), b"B");
    assert_eq!(err_of(fs::metadata(m.p("a"))), libc::ENOENT);
    fs::rename(m.p("b"), m.p("dir/sub/moved")).unwrap();
    assert_eq!(fs::read(m.p("dir/sub/moved")).unwrap(), b"B");

    assert_eq!(
        err_of(fs::rename(m.p("dir"), m.p("dir/sub/into"))),
        libc::EINVAL
    );
    assert_eq!(err_of(fs::rename(m.p("dir"), m.p("full"))), libc::ENOTEMPTY);
    assert_eq!(
        err_of(fs::rename(m.p("dir/sub/moved"), m.p("full"))),
        libc::EISDIR
    );
    assert_eq!(
        err_of(fs::rename(m.p("full"), m.p("dir/sub/moved"))),
        libc::ENOTDIR
    );
    fs::create_dir(m.p("empty")).unwrap();
    fs::rename(m.p("dir"), m.p("empty")).unwrap();
    assert!(m.p("empty/sub/moved").exists());
    m.stop();
}

#[test]
fn hard_links_share_the_inode_and_count_links() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    fs::write(m.p("one"), b"shared").unwrap();
    fs::create_dir(m.p("d")).unwrap();
    fs::hard_link(m.p("one"), m.p("d/two")).unwrap();
    let (a, b) = (
        fs::metadata(m.p("one")).unwrap(),
        fs::metadata(m.p("d/two")).unwrap(),
    );
    assert_eq!(a.ino(), b.ino());
    assert_eq!(b.nlink(), 2);
    assert_eq!(
        err_of(fs::hard_link(m.p("one"), m.p("d/two"))),
        libc::EEXIST
    );
    assert_eq!(err_of(fs::hard_link(m.p("d"), m.p("dlink"))), libc::EPERM);
    fs::remove_file(m.p("one")).unwrap();
    assert_eq!(fs::metadata(m.p("d/two")).unwrap().nlink(), 1);
    assert_eq!(fs::read(m.p("d/two")).unwrap(), b"shared");
    m.stop();
}

/// Block objects of inode `ino` in the data directory.
fn objects_of(vol: &Volume, ino: u64) -> usize {
    object_files(vol, ino).len()
}

#[test]
fn an_unlinked_open_file_stays_usable_until_its_last_close() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let data = pattern(200_000, 1);
    fs::write(m.p("victim"), &data).unwrap();
    let ino = fs::metadata(m.p("victim")).unwrap().ino();
    assert!(objects_of(&vol, ino) > 0, "close committed the blocks");
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("victim"))
        .unwrap();
    fs::remove_file(m.p("victim")).unwrap();
    assert_eq!(err_of(fs::metadata(m.p("victim"))), libc::ENOENT);
    let mut back = Vec::new();
    f.read_to_end(&mut back).unwrap();
    assert_eq!(back, data);
    f.write_all(b"tail").unwrap();
    f.sync_all().unwrap();
    let mut end = [0u8; 4];
    f.read_exact_at(&mut end, data.len() as u64).unwrap();
    assert_eq!(&end, b"tail");
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    // Times set through the open handle of the unlinked file stick.
    let then = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
    f.set_times(std::fs::FileTimes::new().set_modified(then))
        .unwrap();
    assert_eq!(f.metadata().unwrap().modified().unwrap(), then);
    let stored = baton_meta::open(s(&vol.meta_path()))
        .unwrap()
        .getattr(ino)
        .unwrap();
    assert_eq!(
        stored.mtime.sec, 1_000_000_000,
        "the volume keeps times set on an open unlinked file"
    );
    drop(f);
    assert!(
        wait_until(DEADLINE, || objects_of(&vol, ino) == 0),
        "the last release reclaims the orphan's objects"
    );
    m.stop();
}

#[test]
fn append_truncate_and_exclusive_opens() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    fs::write(m.p("log"), b"one\n").unwrap();
    let mut log = OpenOptions::new().append(true).open(m.p("log")).unwrap();
    log.write_all(b"two\n").unwrap();
    let mut other = OpenOptions::new().append(true).open(m.p("log")).unwrap();
    other.write_all(b"three\n").unwrap();
    log.write_all(b"four\n").unwrap();
    drop((log, other));
    assert_eq!(fs::read(m.p("log")).unwrap(), b"one\ntwo\nthree\nfour\n");

    let mut t = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(m.p("log"))
        .unwrap();
    assert_eq!(t.metadata().unwrap().len(), 0);
    t.write_all(b"new").unwrap();
    drop(t);
    assert_eq!(fs::read(m.p("log")).unwrap(), b"new");

    let excl = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(m.p("fresh"));
    assert!(excl.is_ok());
    assert_eq!(fs::metadata(m.p("fresh")).unwrap().mode() & 0o777, 0o600);
    assert_eq!(
        err_of(
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(m.p("fresh"))
        ),
        libc::EEXIST
    );
    // O_CREAT without O_EXCL opens the existing file.
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("fresh"))
        .unwrap();
    m.stop();
}

#[test]
fn truncation_down_and_up_through_paths_and_open_files() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let data = pattern(300_000, 2);
    fs::write(m.p("t"), &data).unwrap();

    // By path, nothing open: committed at once.
    let f = OpenOptions::new().write(true).open(m.p("t")).unwrap();
    drop(f);
    let (ok, _, err) = sh(&format!("truncate -s 100000 {}", s(&m.p("t"))));
    assert!(ok, "{err}");
    assert_eq!(fs::read(m.p("t")).unwrap(), &data[..100_000]);
    let (ok, _, err) = sh(&format!("truncate -s 250000 {}", s(&m.p("t"))));
    assert!(ok, "{err}");
    let back = fs::read(m.p("t")).unwrap();
    assert_eq!(back.len(), 250_000);
    assert_eq!(&back[..100_000], &data[..100_000]);
    assert!(
        back[100_000..].iter().all(|b| *b == 0),
        "grown part reads as zeros"
    );

    // On an open file: staged (floor protocol), then writes past the floor.
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("t"))
        .unwrap();
    f.set_len(70_000).unwrap();
    f.set_len(200_000).unwrap();
    f.write_all_at(b"XYZ", 150_000).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 200_000);
    let mut mid = vec![0u8; 10];
    f.read_exact_at(&mut mid, 69_995).unwrap();
    assert_eq!(&mid[..5], &data[69_995..70_000]);
    assert_eq!(&mid[5..], &[0; 5]);
    drop(f);
    let back = fs::read(m.p("t")).unwrap();
    assert_eq!(back.len(), 200_000);
    assert_eq!(&back[..70_000], &data[..70_000]);
    assert!(back[70_000..150_000].iter().all(|b| *b == 0));
    assert_eq!(&back[150_000..150_003], b"XYZ");
    assert!(back[150_003..].iter().all(|b| *b == 0));
    assert_eq!(
        err_of(fs::File::open(&m.mnt).unwrap().set_len(1)),
        libc::EINVAL
    );
    m.stop();
}

#[test]
fn a_sparse_100_gib_file_costs_nothing() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let size: u64 = 100 << 30;
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("sparse"))
        .unwrap();
    f.write_all_at(b"end", size - 3).unwrap();
    f.write_all_at(b"start", 0).unwrap();
    f.sync_all().unwrap();
    let meta = f.metadata().unwrap();
    assert_eq!(meta.len(), size);
    assert!(
        meta.blocks() * 512 <= 2 * u64::from(BLOCK_SIZE),
        "st_blocks {} is not small",
        meta.blocks()
    );
    let mut buf = vec![1u8; 4096];
    f.read_exact_at(&mut buf, 50 << 30).unwrap();
    assert!(buf.iter().all(|b| *b == 0));
    let mut end = [0u8; 3];
    f.read_exact_at(&mut end, size - 3).unwrap();
    assert_eq!(&end, b"end");
    let mut f2 = File::open(m.p("sparse")).unwrap();
    let hole = lseek(&f2, 0, libc::SEEK_HOLE).unwrap();
    // The writeback cache writes whole pages: the first row is one page.
    assert_eq!(hole, 4096, "the first block row ends after one page");
    let data = lseek(&f2, 5000, libc::SEEK_DATA).unwrap();
    assert_eq!(
        data,
        (size - 3) / u64::from(BLOCK_SIZE) * u64::from(BLOCK_SIZE)
    );
    assert_eq!(f2.seek(SeekFrom::End(0)).unwrap(), size);
    m.stop();
}

fn lseek(f: &File, offset: u64, whence: i32) -> Result<u64, i32> {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid open fd.
    let r = unsafe { libc::lseek(f.as_raw_fd(), offset as i64, whence) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as u64)
    }
}

#[test]
fn seek_data_and_seek_hole_follow_the_block_map() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let bs = u64::from(BLOCK_SIZE);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("holes"))
        .unwrap();
    f.write_all_at(&pattern(bs as usize, 3), 0).unwrap();
    f.write_all_at(&pattern(bs as usize, 4), 4 * bs).unwrap();
    f.set_len(8 * bs).unwrap();
    f.sync_all().unwrap();
    assert_eq!(lseek(&f, 0, libc::SEEK_DATA), Ok(0));
    assert_eq!(lseek(&f, 0, libc::SEEK_HOLE), Ok(bs));
    assert_eq!(lseek(&f, bs, libc::SEEK_DATA), Ok(4 * bs));
    assert_eq!(lseek(&f, 4 * bs + 10, libc::SEEK_DATA), Ok(4 * bs + 10));
    assert_eq!(lseek(&f, 4 * bs, libc::SEEK_HOLE), Ok(5 * bs));
    assert_eq!(lseek(&f, 5 * bs, libc::SEEK_DATA), Err(libc::ENXIO));
    assert_eq!(lseek(&f, 6 * bs, libc::SEEK_HOLE), Ok(6 * bs));
    assert_eq!(lseek(&f, 8 * bs, libc::SEEK_HOLE), Err(libc::ENXIO));
    assert_eq!(lseek(&f, 9 * bs, libc::SEEK_DATA), Err(libc::ENXIO));
    m.stop();
}

/// Data still dirty in the kernel's page cache (written, neither flushed
/// nor closed) is data to SEEK_DATA and SEEK_HOLE, through this file and
/// another one; and LSEEKs racing writes on more files than there are
/// workers never wedge the mount (each waits for its pages' WRITEs).
#[test]
fn seek_data_sees_writes_still_in_the_kernels_page_cache() {
    let vol = Volume::new();
    let mnt = vol.mountpoint("mnt");
    let m = vol.mount(&mnt);
    let _watchdog = Watchdog::start(&mnt, std::time::Duration::from_secs(120));
    let bs = u64::from(BLOCK_SIZE);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("dirty"))
        .unwrap();
    f.set_len(8 * bs).unwrap();
    // One page, left dirty in the kernel (the writeback cache).
    f.write_all_at(&pattern(4096, 5), 3 * bs + 8192).unwrap();
    assert_eq!(lseek(&f, 0, libc::SEEK_DATA), Ok(3 * bs));
    let other = File::open(m.p("dirty")).unwrap();
    assert_eq!(lseek(&other, 0, libc::SEEK_DATA), Ok(3 * bs));
    assert_eq!(lseek(&other, 3 * bs, libc::SEEK_HOLE), Ok(4 * bs));
    // Past the server's size, within the kernel's: an extending write.
    f.write_all_at(&pattern(100, 6), 10 * bs).unwrap();
    assert_eq!(lseek(&f, 4 * bs, libc::SEEK_DATA), Ok(10 * bs));
    assert_eq!(lseek(&f, 10 * bs, libc::SEEK_HOLE), Ok(10 * bs + 100));

    let writers: Vec<_> = (0..8u64)
        .map(|i| {
            let path = m.p(&format!("race-{i}"));
            std::thread::spawn(move || {
                let f = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(path)
                    .unwrap();
                for round in 0..40u64 {
                    let at = (round * 7 + i) % 64 * 4096;
                    f.write_all_at(&pattern(4096, round), at).unwrap();
                    let data = lseek(&f, 0, libc::SEEK_DATA).unwrap();
                    assert!(data <= at, "SEEK_DATA {data} skips the write at {at}");
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    m.stop();
}

#[test]
fn fallocate_extends_and_punches_holes() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let data = pattern(256 * 1024, 5);
    fs::write(m.p("p"), &data).unwrap();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("p"))
        .unwrap();
    let before = f.metadata().unwrap().blocks();
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    fallocate(&f, punch, 10_000, 190_000).unwrap();
    let meta = f.metadata().unwrap();
    assert_eq!(meta.len(), data.len() as u64);
    assert!(meta.blocks() < before, "punching whole blocks frees them");
    let mut back = vec![0u8; data.len()];
    f.read_exact_at(&mut back, 0).unwrap();
    assert_eq!(&back[..10_000], &data[..10_000]);
    assert!(back[10_000..200_000].iter().all(|b| *b == 0));
    assert_eq!(&back[200_000..], &data[200_000..]);

    fallocate(&f, 0, 0, 400_000).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 400_000);
    fallocate(&f, 0, 0, 100).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 400_000, "mode 0 never shrinks");
    // Every other mode: tests/fallocate.rs.
    assert_eq!(
        fallocate(&f, libc::FALLOC_FL_COLLAPSE_RANGE, 0, 65536),
        Err(libc::EOPNOTSUPP)
    );
    drop(f);
    let back = fs::read(m.p("p")).unwrap();
    assert_eq!(back.len(), 400_000);
    assert_eq!(&back[200_000..data.len()], &data[200_000..]);
    m.stop();
}

fn xattr_set(path: &std::path::Path, name: &str, value: &[u8], flags: i32) -> i32 {
    let (p, n) = (cstr(path), std::ffi::CString::new(name).unwrap());
    // SAFETY: valid pointers and lengths.
    let r = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    };
    if r == 0 {
        0
    } else {
        errno()
    }
}

fn xattr_get(path: &std::path::Path, name: &str, size: usize) -> Result<(usize, Vec<u8>), i32> {
    let (p, n) = (cstr(path), std::ffi::CString::new(name).unwrap());
    let mut buf = vec![0u8; size];
    // SAFETY: buf has `size` bytes.
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), size) };
    if r < 0 {
        return Err(errno());
    }
    buf.truncate(if size == 0 { 0 } else { r as usize });
    Ok((r as usize, buf))
}

fn xattr_list(path: &std::path::Path, size: usize) -> Result<(usize, Vec<u8>), i32> {
    let p = cstr(path);
    let mut buf = vec![0u8; size];
    // SAFETY: buf has `size` bytes.
    let r = unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), size) };
    if r < 0 {
        return Err(errno());
    }
    buf.truncate(if size == 0 { 0 } else { r as usize });
    Ok((r as usize, buf))
}

#[test]
fn xattrs_follow_the_size_probe_protocol() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let f = m.p("x");
    fs::write(&f, b"").unwrap();
    assert_eq!(xattr_get(&f, "user.none", 10), Err(libc::ENODATA));
    assert_eq!(xattr_set(&f, "user.color", b"blue", 0), 0);
    assert_eq!(xattr_set(&f, "user.size", b"large", 0), 0);
    assert_eq!(xattr_get(&f, "user.color", 0).unwrap().0, 4);
    assert_eq!(xattr_get(&f, "user.color", 64).unwrap().1, b"blue");
    assert_eq!(xattr_get(&f, "user.color", 2), Err(libc::ERANGE));
    assert_eq!(
        xattr_set(&f, "user.color", b"red", libc::XATTR_CREATE),
        libc::EEXIST
    );
    assert_eq!(
        xattr_set(&f, "user.other", b"v", libc::XATTR_REPLACE),
        libc::ENODATA
    );
    assert_eq!(xattr_set(&f, "user.color", b"red", libc::XATTR_REPLACE), 0);
    assert_eq!(xattr_get(&f, "user.color", 64).unwrap().1, b"red");
    let (len, _) = xattr_list(&f, 0).unwrap();
    assert_eq!(len, "user.color\0user.size\0".len());
    assert_eq!(xattr_list(&f, 64).unwrap().1, b"user.color\0user.size\0");
    assert_eq!(xattr_list(&f, 5), Err(libc::ERANGE));
    let n = std::ffi::CString::new("user.size").unwrap();
    let p = cstr(&f);
    // SAFETY: valid strings.
    assert_eq!(unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) }, 0);
    // SAFETY: valid strings.
    assert_eq!(unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) }, -1);
    assert_eq!(errno(), libc::ENODATA);
    assert_eq!(xattr_list(&f, 64).unwrap().1, b"user.color\0");
    fs::create_dir(m.p("dx")).unwrap();
    assert_eq!(xattr_set(&m.p("dx"), "user.d", b"1", 0), 0);
    m.stop();
}

#[test]
fn symlinks_fifos_sockets_and_devices() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    fs::write(m.p("target"), b"pointed").unwrap();
    std::os::unix::fs::symlink("target", m.p("link")).unwrap();
    std::os::unix::fs::symlink("nowhere", m.p("dangling")).unwrap();
    assert_eq!(fs::read_link(m.p("link")).unwrap().to_str(), Some("target"));
    assert!(fs::symlink_metadata(m.p("link"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(fs::symlink_metadata(m.p("link")).unwrap().len(), 6);
    assert_eq!(fs::read(m.p("link")).unwrap(), b"pointed");
    assert_eq!(err_of(fs::read(m.p("dangling"))), libc::ENOENT);
    assert_eq!(
        err_of(std::os::unix::fs::symlink("x", m.p("link"))),
        libc::EEXIST
    );
    assert_eq!(err_of(fs::read_link(m.p("target"))), libc::EINVAL);

    let (ok, _, err) = sh(&format!("mkfifo -m 640 {}", s(&m.p("fifo"))));
    assert!(ok, "{err}");
    let meta = fs::metadata(m.p("fifo")).unwrap();
    assert_eq!(meta.mode() & libc::S_IFMT, libc::S_IFIFO);
    assert_eq!(meta.mode() & 0o777, 0o640);
    // A FIFO opened read-write does not block and passes bytes.
    let mut fifo = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("fifo"))
        .unwrap();
    fifo.write_all(b"pipe").unwrap();
    let mut got = [0u8; 4];
    fifo.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"pipe");

    let node = |name: &str, mode: u32, dev: u64| {
        let p = cstr(&m.p(name));
        // SAFETY: valid path.
        let r = unsafe { libc::mknod(p.as_ptr(), mode, dev) };
        assert_eq!(r, 0, "mknod {name}: {}", errno());
    };
    node("sock", libc::S_IFSOCK | 0o600, 0);
    node("chr", libc::S_IFCHR | 0o600, libc::makedev(1, 3));
    node("blk", libc::S_IFBLK | 0o600, libc::makedev(7, 0));
    node("reg", libc::S_IFREG | 0o644, 0);
    assert_eq!(
        fs::metadata(m.p("sock")).unwrap().mode() & libc::S_IFMT,
        libc::S_IFSOCK
    );
    let chr = fs::metadata(m.p("chr")).unwrap();
    assert_eq!(chr.mode() & libc::S_IFMT, libc::S_IFCHR);
    assert_eq!(chr.rdev(), libc::makedev(1, 3));
    assert_eq!(
        fs::metadata(m.p("blk")).unwrap().mode() & libc::S_IFMT,
        libc::S_IFBLK
    );
    assert!(fs::metadata(m.p("reg")).unwrap().is_file());
    let names: Vec<String> = {
        let mut v: Vec<String> = fs::read_dir(&m.mnt)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        names,
        ["blk", "chr", "dangling", "fifo", "link", "reg", "sock", "target"]
    );
    m.stop();
}

#[test]
fn statfs_reports_names_and_space() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    fs::write(m.p("f"), pattern(100_000, 6)).unwrap();
    let st = nix::sys::statvfs::statvfs(&m.mnt).unwrap();
    assert_eq!(st.name_max(), 255);
    assert!(st.blocks() > 0 && st.blocks_free() > 0 && st.blocks_free() < st.blocks());
    assert!(st.files() > st.files_free());
    assert_eq!(st.fragment_size(), 4096);
    m.stop();
}

fn utimens(path: &std::path::Path, times: [libc::timespec; 2]) -> i32 {
    let p = cstr(path);
    // SAFETY: valid path and times array.
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), times.as_ptr(), 0) };
    if r == 0 {
        0
    } else {
        errno()
    }
}

fn ts(sec: i64, nsec: i64) -> libc::timespec {
    libc::timespec {
        tv_sec: sec,
        tv_nsec: nsec,
    }
}

#[test]
fn times_have_nanosecond_precision_and_honour_now_and_omit() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let f = m.p("t");
    fs::write(&f, b"x").unwrap();
    assert_eq!(
        utimens(
            &f,
            [
                ts(1_500_000_000, 123_456_789),
                ts(1_600_000_000, 987_654_321)
            ]
        ),
        0
    );
    let meta = fs::metadata(&f).unwrap();
    assert_eq!(
        (meta.atime(), meta.atime_nsec()),
        (1_500_000_000, 123_456_789)
    );
    assert_eq!(
        (meta.mtime(), meta.mtime_nsec()),
        (1_600_000_000, 987_654_321)
    );

    assert_eq!(
        utimens(&f, [ts(0, libc::UTIME_OMIT), ts(1_700_000_000, 5)]),
        0
    );
    let meta = fs::metadata(&f).unwrap();
    assert_eq!(
        (meta.atime(), meta.atime_nsec()),
        (1_500_000_000, 123_456_789)
    );
    assert_eq!((meta.mtime(), meta.mtime_nsec()), (1_700_000_000, 5));

    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert_eq!(
        utimens(&f, [ts(0, libc::UTIME_NOW), ts(0, libc::UTIME_OMIT)]),
        0
    );
    let meta = fs::metadata(&f).unwrap();
    assert!((meta.atime() - now).abs() <= 2, "atime is now");
    assert_eq!((meta.mtime(), meta.mtime_nsec()), (1_700_000_000, 5));
    assert!(
        (meta.ctime() - now).abs() <= 2,
        "ctime moves on every change"
    );

    // Times survive the flush of later writes and a remount.
    let mut w = OpenOptions::new().write(true).open(&f).unwrap();
    w.write_all(b"more").unwrap();
    drop(w);
    assert_eq!(utimens(&f, [ts(1_400_000_000, 1), ts(1_400_000_000, 2)]), 0);
    let mnt = m.mnt.clone();
    m.stop();
    let m = vol.mount(&mnt);
    let meta = fs::metadata(m.p("t")).unwrap();
    assert_eq!((meta.mtime(), meta.mtime_nsec()), (1_400_000_000, 2));
    assert_eq!(fs::read(m.p("t")).unwrap(), b"more");
    m.stop();
}

#[test]
fn modes_owners_and_setgid_inheritance() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    fs::create_dir(m.p("g")).unwrap();
    std::os::unix::fs::chown(m.p("g"), Some(0), Some(1234)).unwrap();
    fs::set_permissions(m.p("g"), fs::Permissions::from_mode(0o2775)).unwrap();
    fs::write(m.p("g/file"), b"").unwrap();
    fs::create_dir(m.p("g/sub")).unwrap();
    let file = fs::metadata(m.p("g/file")).unwrap();
    let sub = fs::metadata(m.p("g/sub")).unwrap();
    assert_eq!(file.gid(), 1234);
    assert_eq!(sub.gid(), 1234);
    assert_eq!(
        sub.mode() & 0o2000,
        0o2000,
        "subdirectories inherit set-group-ID"
    );

    fs::write(m.p("f"), b"").unwrap();
    fs::set_permissions(m.p("f"), fs::Permissions::from_mode(0o4755)).unwrap();
    assert_eq!(fs::metadata(m.p("f")).unwrap().mode() & 0o7777, 0o4755);
    std::os::unix::fs::chown(m.p("f"), Some(42), Some(43)).unwrap();
    let meta = fs::metadata(m.p("f")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (42, 43));
    assert_eq!(meta.mode() & 0o7777, 0o755, "chown clears set-user-ID");
    m.stop();
}

#[test]
fn large_directories_list_completely() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    fs::create_dir(m.p("big")).unwrap();
    let mut want: Vec<String> = (0..600)
        .map(|i| format!("entry-with-a-longish-name-{i:04}"))
        .collect();
    for name in &want {
        fs::write(m.p(&format!("big/{name}")), name.as_bytes()).unwrap();
    }
    // Each entry stat'ed as it is listed: the first entries come with
    // their attributes (READDIRPLUS, at most 128 a reply), later ones are
    // looked up, and the listing goes on from either kind of reply.
    let mut got: Vec<String> = fs::read_dir(m.p("big"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            assert_eq!(e.metadata().unwrap().len(), name.len() as u64, "{name}");
            name
        })
        .collect();
    got.sort();
    want.sort();
    assert_eq!(got, want);
    let (ok, out, err) = sh(&format!("ls -la {} | wc -l", s(&m.p("big"))));
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "603", "total line, ., .. and 600 entries");
    for name in want.iter().step_by(7) {
        assert_eq!(
            fs::read(m.p(&format!("big/{name}"))).unwrap(),
            name.as_bytes()
        );
    }
    m.stop();
}

/// On a volume only this mount serves, the kernel keeps listings and
/// entries (60 s): every change made through the mount must still show in
/// the next listing and lookup, never a kept one.
#[test]
fn kept_listings_and_entries_show_every_change_through_the_mount() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    fs::create_dir(m.p("d")).unwrap();
    let names = || {
        let mut got: Vec<String> = fs::read_dir(m.p("d"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        got.sort();
        got
    };
    fs::write(m.p("d/a"), b"a").unwrap();
    fs::write(m.p("d/b"), b"b").unwrap();
    assert_eq!(names(), ["a", "b"]);
    assert_eq!(names(), ["a", "b"], "listed again, unchanged");
    fs::write(m.p("d/c"), b"c").unwrap();
    assert_eq!(names(), ["a", "b", "c"]);
    fs::rename(m.p("d/a"), m.p("d/z")).unwrap();
    fs::remove_file(m.p("d/b")).unwrap();
    assert_eq!(names(), ["c", "z"]);
    fs::create_dir(m.p("d/sub")).unwrap();
    fs::hard_link(m.p("d/c"), m.p("elsewhere")).unwrap();
    fs::rename(m.p("elsewhere"), m.p("d/linked")).unwrap();
    assert_eq!(names(), ["c", "linked", "sub", "z"]);
    fs::remove_dir(m.p("d/sub")).unwrap();
    assert_eq!(names(), ["c", "linked", "z"]);
    assert_eq!(err_of(fs::metadata(m.p("d/b"))), libc::ENOENT);
    assert_eq!(fs::metadata(m.p("d/c")).unwrap().nlink(), 2);
    fs::write(m.p("d/c"), b"longer now").unwrap();
    assert_eq!(fs::metadata(m.p("d/linked")).unwrap().len(), 10);
    m.stop();
}

#[test]
fn concurrent_writers_on_one_file_and_many_files() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let chunk = 40_000usize;
    let shared = m.p("shared");
    File::create(&shared).unwrap();
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let shared = shared.clone();
            let own = m.p(&format!("own-{t}"));
            scope.spawn(move || {
                let f = OpenOptions::new().write(true).open(&shared).unwrap();
                let data = pattern(chunk, t);
                for round in 0..5 {
                    f.write_all_at(&data, (t as usize * chunk) as u64).unwrap();
                    if round % 2 == 0 {
                        f.sync_all().unwrap();
                    }
                }
                fs::write(&own, pattern(150_000, 10 + t)).unwrap();
            });
        }
    });
    let back = fs::read(&shared).unwrap();
    for t in 0..4u64 {
        let at = t as usize * chunk;
        assert_eq!(&back[at..at + chunk], &pattern(chunk, t)[..], "region {t}");
        assert_eq!(
            fs::read(m.p(&format!("own-{t}"))).unwrap(),
            pattern(150_000, 10 + t)
        );
    }
    m.stop();
}

#[test]
fn unsupported_requests_fail_cleanly_never_enosys() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    fs::write(m.p("src"), pattern(100_000, 7)).unwrap();
    // copy_file_range is refused with EOPNOTSUPP; the kernel falls back.
    let (ok, _, err) = sh(&format!("cp {} {}", s(&m.p("src")), s(&m.p("dst"))));
    assert!(ok, "{err}");
    assert_eq!(fs::read(m.p("dst")).unwrap(), pattern(100_000, 7));
    let e = OpenOptions::new()
        .read(true)
        .open(m.p("src"))
        .unwrap()
        .set_len(0);
    assert_eq!(err_of(e), libc::EINVAL, "ftruncate of a read-only fd");
    assert!(matches!(
        fs::read_dir(m.p("src")).map(|_| ()).map_err(|e| e.kind()),
        Err(ErrorKind::NotADirectory)
    ));
    m.stop();
}

#[test]
fn sequential_reads_prefetch_the_next_blocks() {
    let vol = Volume::new();
    let mnt = vol.mountpoint("mnt");
    let m = vol.mount(&mnt);
    let bs = BLOCK_SIZE as usize;
    let ahead = fsclient::fs::READAHEAD_BLOCKS as usize;
    let data = pattern(8 * bs, 8);
    fs::write(m.p("seq"), &data).unwrap();
    let scan = pattern(24 * bs, 24);
    fs::write(m.p("scan"), &scan).unwrap();
    m.stop();
    let cache = vol.base.join(VOLUME).join("cache");
    assert!(
        !cache.exists(),
        "a local-directory volume is read in place, without a cache"
    );
    // Asked for, the cache is used even in front of a local directory.
    let m = vol.mount_with(&mnt, &["--cache-size", "1G"]);
    let cached = || {
        fs::read_dir(&cache)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".blk")
            })
            .count()
    };
    assert_eq!(cached(), 0);
    // O_DIRECT: fsclient sees exactly these reads (no kernel readahead).
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(m.p("seq"))
        .unwrap();
    let mut buf = vec![0u8; 16 * 1024];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(cached(), 1, "a first read fetches only its block");
    f.read_exact_at(&mut buf, 16 * 1024).unwrap();
    assert_eq!(&buf[..], &data[16 * 1024..32 * 1024]);
    assert!(
        wait_until(DEADLINE, || cached() == 1 + ahead),
        "a sequential read prefetches the next READAHEAD_BLOCKS blocks"
    );
    // A 1 MiB read from the start is a scan from its first request (one
    // READ: the buffer is page-aligned, so the kernel does not split it).
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(m.p("scan"))
        .unwrap();
    let mut backing = vec![0u8; (1 << 20) + 4096];
    let at = backing.as_ptr().align_offset(4096);
    let buf = &mut backing[at..at + (1 << 20)];
    f.read_exact_at(buf, 0).unwrap();
    assert_eq!(&buf[..], &scan[..1 << 20]);
    let read = (1 << 20) / bs;
    assert!(
        wait_until(DEADLINE, || cached() == 1 + ahead + read + ahead),
        "a large read at offset 0 prefetches the blocks after it: {} cached",
        cached()
    );
    m.stop();
}

#[test]
fn st_blocks_counts_the_committed_blocks_on_every_path() {
    let vol = Volume::new();
    let mnt = vol.mountpoint("mnt");
    // No kernel attribute cache: every stat asks fsclient.
    let m = vol.mount_with(&mnt, &["--attr-ttl-ms", "0"]);
    let bs = BLOCK_SIZE as usize;
    let first = pattern(2 * bs + bs / 2, 3);
    fs::write(m.p("f"), &first).unwrap();
    let blocks_of = |len: usize| (len as u64).div_ceil(512);
    assert_eq!(
        fs::metadata(m.p("f")).unwrap().blocks(),
        blocks_of(first.len())
    );
    // Grown and committed again: nothing stale is reported.
    let second = pattern(3 * bs + 100, 4);
    fs::write(m.p("f"), &second).unwrap();
    assert_eq!(
        fs::metadata(m.p("f")).unwrap().blocks(),
        blocks_of(second.len()),
        "after a second commit"
    );
    m.stop();
    // A new process: LOOKUP, GETATTR and READDIRPLUS read it from the
    // metadata.
    let m = vol.mount(&mnt);
    assert_eq!(
        fs::metadata(m.p("f")).unwrap().blocks(),
        blocks_of(second.len()),
        "LOOKUP"
    );
    let f = File::open(m.p("f")).unwrap();
    assert_eq!(
        f.metadata().unwrap().blocks(),
        blocks_of(second.len()),
        "GETATTR"
    );
    let listed: Vec<u64> = fs::read_dir(&mnt)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().blocks())
        .collect();
    assert_eq!(listed, vec![blocks_of(second.len())], "READDIRPLUS");
    drop(f);
    m.stop();
}

/// Object files under `dir`, at any depth.
fn files_under(dir: &std::path::Path) -> usize {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .map(|e| e.unwrap().path())
        .map(|p| if p.is_dir() { files_under(&p) } else { 1 })
        .sum()
}

#[test]
fn unlinked_files_free_their_objects_and_directories_in_batches() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    // More than one release transaction's worth.
    let count = fsclient::fs::ORPHAN_RELEASE_BATCH_MAX + 44;
    // Past the inline limit (16 KiB): one object per file.
    let data = pattern(20_000, 1);
    for i in 0..count {
        fs::write(m.p(&format!("f{i}")), &data).unwrap();
    }
    assert_eq!(files_under(&vol.data), count, "one object per file");
    for i in 0..count {
        fs::remove_file(m.p(&format!("f{i}"))).unwrap();
    }
    // Objects are deleted, and then their directories, after the release
    // transactions: wait for both (checking the directories the moment
    // the last object was gone failed on a busy machine, between the two).
    let object_dirs = || -> Vec<_> {
        fs::read_dir(&vol.data)
            .unwrap()
            .flat_map(|e| {
                let path = e.unwrap().path();
                fs::read_dir(&path)
                    .into_iter()
                    .flatten()
                    .map(|e| e.unwrap().path())
            })
            .collect()
    };
    assert!(
        wait_until(DEADLINE, || files_under(&vol.data) == 0
            && object_dirs().is_empty()),
        "{} objects and object directories {:?} left after unlinking every file",
        files_under(&vol.data),
        object_dirs()
    );
    m.stop();
}

/// The `key=ns` pairs [`chaos_tests::WRITE_TIMES`] printed for `file`.
fn write_times(
    file: &std::path::Path,
    size_bytes: usize,
) -> std::collections::HashMap<String, i128> {
    let mut child = ChildGuard(
        std::process::Command::new("python3")
            .arg("-c")
            .arg(chaos_tests::WRITE_TIMES)
            .args([s(file), &size_bytes.to_string(), "1.1"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let status = child.wait_timeout(DEADLINE).expect("the writer finishes");
    let mut out = String::new();
    child
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(status.success(), "{out}");
    out.split_whitespace()
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap();
            (key.to_string(), value.parse().unwrap())
        })
        .collect()
}

/// mtime and ctime are the write's (the clock read around it, give or
/// take the kernel's coarse clock), before the close and after it, and
/// not the close's time 1.1 s later.
fn assert_times_are_the_writes(label: &str, t: &std::collections::HashMap<String, i128>) {
    const SLACK_NS: i128 = 20_000_000;
    for key in ["open_mtime", "open_ctime", "mtime", "ctime"] {
        assert!(
            t[key] >= t["write_from"] - SLACK_NS && t[key] <= t["write_to"] + SLACK_NS,
            "{label}: {key} is not the write's time: {t:?}"
        );
    }
    assert!(t["close"] - t["mtime"] > 1_000_000_000, "{label}: {t:?}");
    assert_eq!(
        t["open_mtime"], t["mtime"],
        "{label}: the close moved mtime"
    );
    assert_eq!(
        t["open_ctime"], t["ctime"],
        "{label}: the close moved ctime"
    );
}

fn stat_times(path: &std::path::Path) -> (i128, i128) {
    let meta = fs::metadata(path).unwrap();
    let ns = |sec: i64, nsec: i64| i128::from(sec) * 1_000_000_000 + i128::from(nsec);
    (
        ns(meta.mtime(), meta.mtime_nsec()),
        ns(meta.ctime(), meta.ctime_nsec()),
    )
}

#[test]
fn mtime_and_ctime_after_a_write_and_a_later_close_are_the_writes_as_on_the_local_disk() {
    let vol = Volume::new();
    let local = write_times(&vol.path("local"), 100);
    assert_times_are_the_writes("local disk", &local);
    let m = vol.mount(&vol.mountpoint("mnt"));
    // A small file (one WRITE at offset 0: written through) and one of
    // several blocks (staged, committed at the close's FLUSH).
    let mut shown = Vec::new();
    for (name, size) in [("small", 100), ("large", 300 * 1024)] {
        let t = write_times(&m.p(name), size);
        assert_times_are_the_writes(name, &t);
        shown.push((name, (t["mtime"], t["ctime"])));
    }
    // What was stored is what the kernel showed.
    let mnt = m.mnt.clone();
    m.stop();
    let m = vol.mount(&mnt);
    for (name, times) in shown {
        assert_eq!(stat_times(&m.p(name)), times, "{name} after a remount");
    }
    m.stop();
}
