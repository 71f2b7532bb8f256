//! copy_file_range(2) on a mounted Baton volume: whole blocks aligned
//! alike on both sides are shared (the destination's rows name the
//! source's objects, no byte is copied), everything else is copied as
//! bytes; a write to either side afterwards changes only that side; the
//! source's unlink and reclaim, fsck and gc keep what the destination
//! names; a copy between two volumes is a byte copy the kernel does itself;
//! a user's copy (and write) clears set-ID bits as on ext4 beside it.
//! Each test mounts its own volume with the real `fsclient` binary and
//! calls copy_file_range on it directly. Needs root and /dev/fuse.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use baton_volume::CheckedVolume;
use common::*;

const BS: usize = BLOCK_SIZE as usize;

/// One copy_file_range call: the bytes copied, or the errno.
fn copy_range(src: &File, off_in: u64, dst: &File, off_out: u64, len: usize) -> Result<usize, i32> {
    let mut off_in = off_in as i64;
    let mut off_out = off_out as i64;
    // SAFETY: both fds are open for the call; the offsets are ours.
    let n = unsafe {
        libc::copy_file_range(
            src.as_raw_fd(),
            &mut off_in,
            dst.as_raw_fd(),
            &mut off_out,
            len,
            0,
        )
    };
    if n < 0 {
        Err(errno())
    } else {
        Ok(n as usize)
    }
}

/// copy_file_range until `len` bytes are copied or it copies none.
fn copy_all(src: &File, dst: &File, len: usize) -> usize {
    let mut done = 0;
    while done < len {
        match copy_range(src, done as u64, dst, done as u64, len - done) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) => panic!("copy_file_range: errno {e}"),
        }
    }
    done
}

/// Objects in the volume's store.
fn stored_objects(vol: &Volume) -> usize {
    let dirs = fs::read_dir(vol.data.join("blocks")).into_iter().flatten();
    dirs.flatten()
        .map(|d| fs::read_dir(d.path()).into_iter().flatten().count())
        .sum()
}

/// fsck: nothing lost or short, nothing unreferenced; the shared count.
fn assert_fsck_clean(vol: &Volume) -> baton_volume::CheckReport {
    let checked = CheckedVolume::open(VOLUME, &vol.base).unwrap();
    let report = checked.check().unwrap();
    assert!(
        report.is_consistent(),
        "lost blocks: {:?}",
        report.bad_blocks
    );
    assert!(
        report.unreferenced.is_empty(),
        "objects taken for garbage: {:?}",
        report.unreferenced
    );
    report
}

/// gc with no minimum age, as `fsctl gc --min-age 0` (volume unmounted):
/// the objects it deleted.
fn gc(vol: &Volume) -> usize {
    let checked = CheckedVolume::open(VOLUME, &vol.base).unwrap();
    let report = checked.check().unwrap();
    let doomed = baton_volume::collectable(&report.unreferenced, Duration::ZERO, SystemTime::now());
    checked.store.delete(&doomed);
    doomed.len()
}

/// Object keys of `ino`'s rows by block index (volume unmounted).
fn rows(vol: &Volume, ino: u64) -> BTreeMap<u64, String> {
    let meta = baton_meta::open(s(&vol.meta_path())).unwrap();
    meta.blocks(ino, 0, 1 << 16)
        .unwrap()
        .into_iter()
        .map(|r| (r.index, r.object_key))
        .collect()
}

#[test]
fn a_copy_shares_whole_blocks_and_each_side_then_changes_alone() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let len = 8 * BS + 1000;
    let data = pattern(len, 1);
    fs::write(m.p("src"), &data).unwrap();
    let before = stored_objects(&vol);
    assert_eq!(before, 9);
    let src = File::open(m.p("src")).unwrap();
    let dst = open_rw(&m.p("dst"));
    assert_eq!(copy_range(&src, 0, &dst, 0, len), Ok(len));
    assert_eq!(dst.metadata().unwrap().len(), len as u64);
    drop((src, dst));
    assert_eq!(
        stored_objects(&vol),
        before + 1,
        "the 8 whole blocks are shared, only the 1000-byte tail is copied"
    );
    assert!(fs::read(m.p("dst")).unwrap() == data, "the copy reads back");

    // Copy-on-write: each side's write changes that side only.
    let (mut want_src, mut want_dst) = (data.clone(), data.clone());
    let f = open_rw(&m.p("src"));
    f.write_all_at(&pattern(100, 2), (2 * BS + 10) as u64)
        .unwrap();
    f.sync_all().unwrap();
    want_src[2 * BS + 10..2 * BS + 110].copy_from_slice(&pattern(100, 2));
    let g = open_rw(&m.p("dst"));
    g.write_all_at(&pattern(BS, 3), (5 * BS) as u64).unwrap();
    g.sync_all().unwrap();
    want_dst[5 * BS..6 * BS].copy_from_slice(&pattern(BS, 3));
    drop((f, g));
    assert!(
        fs::read(m.p("src")).unwrap() == want_src,
        "source after both writes"
    );
    assert!(
        fs::read(m.p("dst")).unwrap() == want_dst,
        "destination after both writes"
    );
    assert_eq!(stored_objects(&vol), before + 3);
    let report = assert_fsck_clean(&vol);
    assert_eq!(
        report.shared_count, 6,
        "blocks 0, 1, 3, 4, 6 and 7: {report:?}"
    );

    // The source goes: only what the destination does not name is deleted.
    fs::remove_file(m.p("src")).unwrap();
    let reclaimed = wait_until(DEADLINE, || stored_objects(&vol) == before);
    assert!(reclaimed, "objects left: {}", stored_objects(&vol));
    assert!(
        fs::read(m.p("dst")).unwrap() == want_dst,
        "destination after the unlink"
    );
    m.stop();
    assert_eq!(assert_fsck_clean(&vol).shared_count, 0);
    assert_eq!(gc(&vol), 0, "gc found garbage");
    let m = vol.mount(&vol.mountpoint("mnt"));
    assert!(
        fs::read(m.p("dst")).unwrap() == want_dst,
        "destination after gc"
    );
    m.stop();
}

/// The destination's expected bytes and which of its blocks name which
/// source block's object.
struct Model {
    bytes: Vec<u8>,
    shared: BTreeMap<u64, u64>,
}

impl Model {
    /// A copy of `len` bytes of `src` (clipped at its end) from `off_in`
    /// to `off_out`: returns the bytes copied.
    fn copy(&mut self, src: &[u8], off_in: usize, off_out: usize, len: usize) -> usize {
        let len = len.min(src.len().saturating_sub(off_in));
        if len == 0 {
            return 0;
        }
        let end = off_out + len;
        if self.bytes.len() < end {
            self.bytes.resize(end, 0);
        }
        self.bytes[off_out..end].copy_from_slice(&src[off_in..off_in + len]);
        let touched = (off_out / BS) as u64..end.div_ceil(BS) as u64;
        self.shared.retain(|i, _| !touched.contains(i));
        if off_in % BS == off_out % BS {
            let first = off_out.div_ceil(BS);
            for i in first..end / BS {
                self.shared
                    .insert(i as u64, (i * BS - off_out + off_in) as u64 / BS as u64);
            }
        }
        len
    }
}

/// Copies at offsets aligned alike and not, over existing data, past the
/// destination's end (the file grows, with a hole), clipped at the
/// source's end, at or past it (0 bytes), and between two ranges of one
/// file, all match a model: the destination's bytes and exactly which of
/// its blocks share the source's objects. Overlapping ranges of one file
/// are refused (EINVAL) by the kernel before FUSE.
#[test]
fn copies_at_any_alignment_match_a_model_and_share_only_aligned_blocks() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let src_bytes = pattern(6 * BS + 300, 4);
    fs::write(m.p("src"), &src_bytes).unwrap();
    let mut model = Model {
        bytes: pattern(3 * BS + 17, 5),
        shared: BTreeMap::new(),
    };
    fs::write(m.p("dst"), &model.bytes).unwrap();
    let src = File::open(m.p("src")).unwrap();
    let dst = open_rw(&m.p("dst"));
    for (off_in, off_out, len) in [
        (BS + 100, BS + 100, 3 * BS),
        (0, 7 * BS + 1, 2 * BS),
        (2 * BS, 9 * BS, 5 * BS),
        (6 * BS + 300, 0, 10),
        (7 * BS, 0, 10),
        (BS - 1, 3 * BS - 1, BS + 2),
    ] {
        let want = model.copy(&src_bytes, off_in, off_out, len);
        let got = copy_range(&src, off_in as u64, &dst, off_out as u64, len);
        assert_eq!(got, Ok(want), "copy of {len} from {off_in} to {off_out}");
    }
    assert_eq!(dst.metadata().unwrap().len(), model.bytes.len() as u64);
    assert!(fs::read(m.p("dst")).unwrap() == model.bytes, "bytes");
    // Within one file: block 0 to block 14, and overlapping (refused).
    assert_eq!(copy_range(&dst, 0, &dst, 14 * BS as u64, BS), Ok(BS));
    let (head, _) = model.bytes.split_at(BS);
    let head = head.to_vec();
    model.bytes.resize(15 * BS, 0);
    model.bytes[14 * BS..].copy_from_slice(&head);
    assert_eq!(copy_range(&dst, 0, &dst, 100, 1000), Err(libc::EINVAL));
    assert_eq!(copy_range(&dst, 0, &dst, 0, BS), Err(libc::EINVAL));
    assert!(
        fs::read(m.p("dst")).unwrap() == model.bytes,
        "bytes after the self-copy"
    );
    let (src_ino, dst_ino) = (src.metadata().unwrap().ino(), dst.metadata().unwrap().ino());
    drop((src, dst));
    m.stop();

    let (src_rows, dst_rows) = (rows(&vol, src_ino), rows(&vol, dst_ino));
    let shared: BTreeMap<u64, u64> = dst_rows
        .iter()
        .filter_map(|(i, key)| {
            let from = src_rows.iter().find(|(_, k)| *k == key)?;
            Some((*i, *from.0))
        })
        .collect();
    assert_eq!(shared, model.shared, "blocks sharing the source's objects");
    assert_eq!(
        dst_rows.get(&14),
        dst_rows.get(&0),
        "the self-copy shares its block"
    );
    assert_fsck_clean(&vol);
    let m = vol.mount(&vol.mountpoint("mnt"));
    assert!(
        fs::read(m.p("dst")).unwrap() == model.bytes,
        "bytes after a remount"
    );
    m.stop();
}

/// Between two volumes (two FUSE connections) the kernel never sends
/// COPY_FILE_RANGE: copy_file_range(2) copies the bytes itself (or says
/// EXDEV, and `cp` copies them), so the copy is whole and each volume
/// keeps its own objects.
#[test]
fn a_copy_between_two_volumes_is_a_byte_copy() {
    let (vol_a, vol_b) = (Volume::new(), Volume::new());
    let a = vol_a.mount(&vol_a.mountpoint("mnt"));
    let b = vol_b.mount(&vol_b.mountpoint("mnt"));
    let data = pattern(4 * BS + 5, 6);
    fs::write(a.p("src"), &data).unwrap();
    let src = File::open(a.p("src")).unwrap();
    let dst = open_rw(&b.p("dst"));
    let first = copy_range(&src, 0, &dst, 0, data.len());
    eprintln!("copy_file_range between two volumes: {first:?}");
    match first {
        Ok(_) => assert_eq!(copy_all(&src, &dst, data.len()), data.len()),
        Err(e) => {
            assert_eq!(e, libc::EXDEV, "cross-volume copy_file_range");
            let (ok, _, err) = sh(&format!(
                "cp --reflink=auto {} {}",
                s(&a.p("src")),
                s(&b.p("dst"))
            ));
            assert!(ok, "cp: {err}");
        }
    }
    drop((src, dst));
    assert!(fs::read(b.p("dst")).unwrap() == data);
    assert_eq!(stored_objects(&vol_b), 5, "volume b stores its own copy");
    a.stop();
    b.stop();
    assert_fsck_clean(&vol_a);
    assert_fsck_clean(&vol_b);
}

/// A copy into a directory quota is checked for the growth it makes, as a
/// write is: past the byte limit it is refused whole (EDQUOT, nothing
/// copied); within it, the shared blocks count in the quota's usage like
/// written ones.
#[test]
fn a_copy_into_a_quota_is_refused_past_its_limit_and_counted_within_it() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    // The quota first: a mount trusts "no quota" for a second.
    fs::create_dir(m.p("q")).unwrap();
    let q_ino = fs::metadata(m.p("q")).unwrap().ino();
    let meta = baton_meta::open(s(&vol.meta_path())).unwrap();
    meta.set_quota(q_ino, Some(4 * BS as u64), None).unwrap();
    fs::write(m.p("src"), pattern(6 * BS, 7)).unwrap();
    let src = File::open(m.p("src")).unwrap();
    let dst = open_rw(&m.p("q/dst"));
    assert_eq!(copy_range(&src, 0, &dst, 0, 6 * BS), Err(libc::EDQUOT));
    assert_eq!(dst.metadata().unwrap().len(), 0, "nothing copied");
    assert_eq!(copy_range(&src, 0, &dst, 0, 3 * BS), Ok(3 * BS));
    drop((src, dst));
    m.sync_metadata();
    let used = meta.quota(q_ino).unwrap().unwrap().used;
    assert_eq!(used.bytes, 3 * BS as u64);
    drop(meta);
    m.stop();
    assert_fsck_clean(&vol);
}

/// How [`as_user`]'s child writes to the destination.
#[derive(Clone, Copy, Debug)]
enum How {
    Copy,
    Write,
}

/// `len` bytes from `src` at `off_in` to `dst` at `off_out`, by
/// copy_file_range or by pwrite(2) of the bytes read first (both files
/// opened here, as root), in a child that first becomes uid and gid 65534
/// without supplementary groups (unless `root`): the credentials the
/// kernel and the filesystem see at the write, as in a user's own copy.
/// Ok(()) once every byte is written, or the errno (255: a short one).
fn as_user(
    root: bool,
    how: How,
    (src, off_in): (&Path, u64),
    (dst, off_out): (&Path, u64),
    len: usize,
) -> Result<(), i32> {
    let src = File::open(src).unwrap();
    let mut bytes = vec![0u8; len];
    src.read_exact_at(&mut bytes, off_in).unwrap();
    let dst = OpenOptions::new().write(true).open(dst).unwrap();
    let nobody: libc::c_long = 65534;
    // SAFETY: the child makes raw system calls only, then _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        // SAFETY: raw system calls on fds and memory this process holds.
        unsafe {
            let dropped = root
                || (libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) == 0
                    && libc::syscall(libc::SYS_setresgid, nobody, nobody, nobody) == 0
                    && libc::syscall(libc::SYS_setresuid, nobody, nobody, nobody) == 0);
            if !dropped {
                libc::_exit(254);
            }
            let (mut off_in, mut off_out) = (off_in as i64, off_out as i64);
            let n = match how {
                How::Copy => libc::copy_file_range(
                    src.as_raw_fd(),
                    &mut off_in,
                    dst.as_raw_fd(),
                    &mut off_out,
                    len,
                    0,
                ),
                How::Write => libc::pwrite(dst.as_raw_fd(), bytes.as_ptr().cast(), len, off_out),
            };
            libc::_exit(match n {
                n if n < 0 => *libc::__errno_location(),
                n if n as usize == len => 0,
                _ => 255,
            });
        }
    }
    let deadline = Instant::now() + DEADLINE;
    loop {
        let mut status = 0;
        // SAFETY: our own child.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
            assert!(libc::WIFEXITED(status), "the child died: {status:#x}");
            return match libc::WEXITSTATUS(status) {
                0 => Ok(()),
                e => Err(e),
            };
        }
        if Instant::now() > deadline {
            // SAFETY: our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the child did not finish in time");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A copy by a user without CAP_FSETID clears the destination's set-ID
/// bits as a write does, on both of Baton's paths (shared blocks, copied
/// bytes), and exactly as ext4 beside it clears them for the same copy and
/// the same write: set-user-ID always, set-group-ID with group execute or
/// when the writer is not in the file's group; root keeps both.
#[test]
fn a_copy_by_a_user_clears_set_id_bits_as_a_write_and_ext4_do() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    // The reference: ext4 (or whatever holds cargo's target dir) beside it.
    let reference = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = pattern(4 * BS, 21);
    for dir in [reference.path(), &m.mnt] {
        fs::write(dir.join("src"), &data).unwrap();
        fs::write(dir.join("dst"), vec![0u8; 4 * BS]).unwrap();
    }
    let (whole, bytes) = ((0, 0, 2 * BS), (10, 20, 1000));
    // (what, how, mode, by root, the file's group, range, mode after)
    #[rustfmt::skip]
    let cases = [
        ("shared whole blocks", How::Copy, 0o6777, false, 0, whole, 0o777),
        ("copied bytes", How::Copy, 0o6777, false, 0, bytes, 0o777),
        ("no group execute", How::Copy, 0o6767, false, 0, whole, 0o767),
        ("no group execute, writer's group", How::Copy, 0o6767, false, 65534, whole, 0o2767),
        ("root's copy", How::Copy, 0o6777, true, 0, whole, 0o6777),
        ("a write", How::Write, 0o6777, false, 0, bytes, 0o777),
        ("a write, no group execute", How::Write, 0o6767, false, 0, bytes, 0o767),
        ("a write, no group execute, writer's group", How::Write, 0o6767, false, 65534, bytes, 0o2767),
    ];
    for (what, how, mode, root, gid, (off_in, off_out, len), want) in cases {
        let mut modes = Vec::new();
        for dir in [reference.path(), &m.mnt] {
            let dst = dir.join("dst");
            std::os::unix::fs::chown(&dst, Some(0), Some(gid)).unwrap();
            fs::set_permissions(&dst, fs::Permissions::from_mode(mode)).unwrap();
            let src = (dir.join("src"), off_in);
            let done = as_user(root, how, (&src.0, src.1), (&dst, off_out), len);
            assert_eq!(done, Ok(()), "{what} in {}", dir.display());
            modes.push(fs::metadata(&dst).unwrap().mode() & 0o7777);
        }
        assert_eq!(modes[0], want, "{what} on the reference ({how:?})");
        assert_eq!(modes[1], want, "{what} on Baton ({how:?})");
        assert!(fs::read(m.p("dst")).unwrap() == fs::read(reference.path().join("dst")).unwrap());
    }
    m.stop();
}
