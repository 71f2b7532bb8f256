//! Volumes whose metadata is in PostgreSQL (a real server: `.ci/run`
//! starts one and exports `BATON_TEST_POSTGRES_URL`): the exerciser across
//! a remount, and two mounts of one volume on this machine (two fsclient
//! processes, two mountpoints, separate local state, one database and one
//! data directory) reading each other's files with close-to-open
//! consistency, one of them killed with -9 while holding staged writes.
//!
//! Skips loudly without a server unless `BATON_REQUIRE_POSTGRES=1` (CI).

#![allow(clippy::unwrap_used)] // Test code: a failed setup step should stop the test.
use std::fs::{self, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use chaos_tests::fsx::{run, FsxConfig};
use chaos_tests::mount_guard::{wait_until, workspace_binary, ChildGuard, MountGuard};
use chaos_tests::staged::staged_inodes;

const URL_ENV: &str = "BATON_TEST_POSTGRES_URL";
const DEADLINE: Duration = Duration::from_secs(30);

fn server(test: &str) -> Option<String> {
    match std::env::var(URL_ENV) {
        Ok(url) => Some(url),
        Err(_) => {
            let required = std::env::var("BATON_REQUIRE_POSTGRES").is_ok_and(|v| v == "1");
            assert!(
                !required,
                "{test}: {URL_ENV} is not set but BATON_REQUIRE_POSTGRES=1"
            );
            eprintln!("\n!!!!! SKIPPED {test}: {URL_ENV} is not set; start a server with .ci/start-postgres DIR PORT (CI sets BATON_REQUIRE_POSTGRES=1 and fails instead) !!!!!\n");
            None
        }
    }
}

/// The single value `sql` returns, as text.
fn psql_value(url: &str, sql: &str) -> String {
    let out = Command::new("psql")
        .args(["-qtA", "-v", "ON_ERROR_STOP=1", url, "-c", sql])
        .output()
        .expect("psql (postgresql-client)");
    assert!(
        out.status.success(),
        "psql {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Regular files under `dir`, recursively (the objects of a file:// store).
fn object_count(dir: &Path) -> usize {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| {
            let path = e.path();
            if path.is_dir() {
                object_count(&path)
            } else {
                1
            }
        })
        .sum()
}

fn psql(url: &str, sql: &str) {
    let out = Command::new("psql")
        .args(["-q", "-v", "ON_ERROR_STOP=1", url, "-c", sql])
        .output()
        .expect("psql (postgresql-client)");
    assert!(
        out.status.success(),
        "psql {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A database and a data directory formatted as one volume; the database
/// is dropped at the end.
struct PgVolume {
    dir: tempfile::TempDir,
    admin: String,
    db: String,
    url: String,
}

impl PgVolume {
    fn format(admin: &str, block_size: &str) -> PgVolume {
        let db = format!(
            "baton_m_{}_{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos()
        );
        psql(admin, &format!("CREATE DATABASE {db}"));
        let url = format!("{}/{db}", admin.rsplit_once('/').unwrap().0);
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let out = Command::new(workspace_binary("fsctl"))
            .args(["format", "vol", "--meta", &url, "--block-size", block_size])
            .arg("--storage")
            .arg(format!("file://{}", data.display()))
            .arg("--base-dir")
            .arg(dir.path())
            .output()
            .expect("run fsctl (build the workspace first)");
        assert!(
            out.status.success(),
            "fsctl format on PostgreSQL failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        PgVolume {
            dir,
            admin: admin.to_string(),
            db,
            url,
        }
    }

    /// Mount `host` (its own mountpoint and local state directory).
    fn mount(&self, host: &str) -> Mounted {
        self.mount_with(host, &[])
    }

    /// [`PgVolume::mount`] with more fsclient arguments.
    fn mount_with(&self, host: &str, extra: &[&str]) -> Mounted {
        self.mount_with_ttl(host, "0", extra)
    }

    /// [`PgVolume::mount_with`] keeping entries and attributes `ttl_ms` in
    /// the kernel.
    fn mount_with_ttl(&self, host: &str, ttl_ms: &str, extra: &[&str]) -> Mounted {
        let mnt = self.dir.path().join(format!("mnt-{host}"));
        fs::create_dir_all(&mnt).unwrap();
        let mut child = ChildGuard(
            Command::new(workspace_binary("fsclient"))
                .args(["mount", &self.url])
                .arg(&mnt)
                .arg("--base-dir")
                .arg(self.dir.path().join(format!("host-{host}")))
                .args(["--attr-ttl-ms", ttl_ms])
                .args(extra)
                .env("RUST_LOG", "warn")
                .stdin(Stdio::null())
                .spawn()
                .expect("spawn fsclient"),
        );
        let up = wait_until(DEADLINE, || {
            if let Ok(Some(status)) = child.0.try_wait() {
                panic!("fsclient {host} exited before mounting: {status}");
            }
            fuse_wire::connection_id(&mnt).is_ok()
        });
        assert!(up, "fsclient {host} did not mount");
        let guard = MountGuard::new(&mnt);
        Mounted { guard, child, mnt }
    }

    fn staging(&self, host: &str) -> PathBuf {
        self.dir
            .path()
            .join(format!("host-{host}/pg-{}/staging", self.db))
    }
}

impl Drop for PgVolume {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .args([
                "-q",
                &self.admin,
                "-c",
                &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.db),
            ])
            .output();
    }
}

struct Mounted {
    guard: MountGuard,
    child: ChildGuard,
    mnt: PathBuf,
}

impl Mounted {
    fn p(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    fn stop(mut self) {
        nix::sys::signal::kill(self.child.pid(), nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = self.child.wait_timeout(DEADLINE).expect("fsclient exits");
        assert!(status.success(), "fsclient exit status {status}");
        drop(self.guard);
    }

    fn kill9(mut self) {
        self.child.0.kill().unwrap();
        self.child.0.wait().unwrap();
        fuse_wire::unmount(&self.mnt).unwrap();
        drop(self.guard);
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed) ^ (i >> 10) as u8)
        .collect()
}

#[test]
fn two_mounts_of_one_volume_see_each_others_closed_files_and_survive_a_kill_9() {
    let Some(admin) = server("postgres two mounts") else {
        return;
    };
    let vol = PgVolume::format(&admin, "64K");
    let a = vol.mount("a");
    let b = vol.mount("b");

    // Close-to-open both ways, on files both have already looked at.
    let big = pattern(700_001, 1);
    fs::write(a.p("shared"), &big).unwrap();
    assert!(fs::read(b.p("shared")).unwrap() == big, "b sees a's file");
    fs::write(b.p("shared"), b"rewritten by b").unwrap();
    assert_eq!(fs::read(a.p("shared")).unwrap(), b"rewritten by b");
    let f = OpenOptions::new().append(true).open(a.p("shared")).unwrap();
    f.write_all_at(b", appended by a", 14).unwrap();
    drop(f);
    assert_eq!(
        fs::read(b.p("shared")).unwrap(),
        b"rewritten by b, appended by a"
    );
    fs::create_dir(b.p("dir")).unwrap();
    fs::rename(a.p("shared"), a.p("dir/moved")).unwrap();
    assert!(fs::metadata(b.p("shared")).is_err(), "the rename is seen");
    assert_eq!(
        fs::read(b.p("dir/moved")).unwrap(),
        b"rewritten by b, appended by a"
    );

    // kill -9 of a with an acknowledged write only staged on a's host.
    let direct = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(a.p("staged"))
        .unwrap();
    let staged = pattern(200_000, 7);
    direct.write_all_at(&staged, 0).unwrap();
    assert!(staged_inodes(&vol.staging("a")) >= 1, "a's write is staged");
    a.kill9();
    drop(direct);

    // b carries on alone.
    fs::write(b.p("while a was down"), b"b kept working").unwrap();
    assert_eq!(
        fs::read(b.p("dir/moved")).unwrap(),
        b"rewritten by b, appended by a"
    );

    // a comes back: its staged data is committed and b sees it.
    let a = vol.mount("a");
    assert_eq!(
        staged_inodes(&vol.staging("a")),
        0,
        "a recovered its staging"
    );
    assert!(
        fs::read(b.p("staged")).unwrap() == staged,
        "b sees a's recovered write"
    );
    assert_eq!(
        fs::read(a.p("while a was down")).unwrap(),
        b"b kept working"
    );
    a.stop();
    b.stop();

    let out = Command::new(workspace_binary("fsctl"))
        .args(["fsck", &vol.url])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "fsck: {said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains(" 0 missing or short"), "{said}");
}

#[test]
fn exerciser_agrees_with_a_plain_directory_on_postgres_across_a_remount() {
    let Some(admin) = server("postgres exerciser") else {
        return;
    };
    let ops = std::env::var("BATON_PG_FSX_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_500);
    let vol = PgVolume::format(&admin, "64K");
    let reference = tempfile::tempdir().unwrap();
    let mut mounted = Some(vol.mount("a"));
    let mnt = mounted.as_ref().unwrap().mnt.clone();
    let mut remount = || {
        let m = mounted.take().ok_or("not mounted")?;
        m.stop();
        mounted = Some(vol.mount("a"));
        Ok(())
    };
    // Every kind of operation the exerciser has (every fallocate mode,
    // copy_file_range, O_TMPFILE, ACLs), COLLAPSE_RANGE and INSERT_RANGE
    // expected to be refused with EOPNOTSUPP.
    let config = FsxConfig {
        file_len_max: 2 << 20,
        io_len_max: 200 << 10,
        remount_at: Some(ops / 2),
        ..FsxConfig::every_op(0x9e_b470, ops)
    };
    if let Err(failure) = run(&config, &mnt, reference.path(), &mut remount) {
        panic!("{failure}");
    }
    if let Some(m) = mounted.take() {
        m.stop();
    }
}

/// Session expiry of the session tests: short, so a dead mount is noticed
/// within seconds (heartbeats every 400 ms).
const TEST_SESSION_EXPIRY_MS: &str = "2000";

impl PgVolume {
    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Whether inode `ino` still exists, and its block-map rows.
    fn inode_rows(&self, ino: u64) -> (bool, u64) {
        let exists = psql_value(
            &self.url,
            &format!("SELECT count(*) FROM inodes WHERE ino = {ino}"),
        );
        let blocks = psql_value(
            &self.url,
            &format!("SELECT count(*) FROM blocks WHERE ino = {ino}"),
        );
        (exists == "1", blocks.parse().unwrap())
    }

    fn session_count(&self) -> u64 {
        psql_value(&self.url, "SELECT count(*) FROM sessions")
            .parse()
            .unwrap()
    }
}

fn mount_pair(vol: &PgVolume) -> (Mounted, Mounted) {
    let expiry = ["--session-expiry-ms", TEST_SESSION_EXPIRY_MS];
    (vol.mount_with("a", &expiry), vol.mount_with("b", &expiry))
}

/// `linkat` of the open file `f` at `to` by /proc/self/fd (what an
/// unprivileged application does): the errno, or 0.
fn link_by_proc_fd(f: &fs::File, to: &Path) -> i32 {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let from = std::ffi::CString::new(format!("/proc/self/fd/{}", f.as_raw_fd())).unwrap();
    let to = std::ffi::CString::new(to.as_os_str().as_bytes()).unwrap();
    // SAFETY: valid NUL-terminated paths; plain syscall.
    let rc = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if rc == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }
}

/// O_TMPFILE on a volume two mounts share: only the mount that made it
/// holds it; published with linkat, the other mount reads it whole; one
/// closed without a name is reclaimed. And a file one mount unlinked
/// cannot be brought back by a link from the other, whose kernel still
/// counts its old name (a keeps attributes a minute, so its kernel sends
/// the LINK): ENOENT, as on a local filesystem.
#[test]
fn an_o_tmpfile_published_on_one_mount_is_read_whole_on_the_other() {
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;
    let Some(admin) = server("postgres O_TMPFILE") else {
        return;
    };
    let vol = PgVolume::format(&admin, "64K");
    let expiry = ["--session-expiry-ms", TEST_SESSION_EXPIRY_MS];
    let a = vol.mount_with_ttl("a", "60000", &expiry);
    let b = vol.mount_with("b", &expiry);
    assert!(
        wait_until(DEADLINE, || vol.session_count() == 2),
        "two sessions"
    );
    let body = pattern(300_000, 5);
    let mut f = chaos_tests::tmpfile::open_tmpfile(&a.mnt, 0, 0o600).unwrap();
    f.write_all(&body).unwrap();
    f.sync_all().unwrap();
    let ino = f.metadata().unwrap().ino();
    let holds = |ino: u64| {
        psql_value(
            &vol.url,
            &format!("SELECT count(*) FROM orphan_holds WHERE ino = {ino}"),
        )
    };
    assert_eq!(holds(ino), "1", "only the mount that made it holds it");
    chaos_tests::tmpfile::link_open_file(&f, &a.p("published")).unwrap();
    drop(f);
    assert_eq!(holds(ino), "0");
    assert!(
        fs::read(b.p("published")).unwrap() == body,
        "b reads it whole"
    );
    assert_eq!(fs::metadata(b.p("published")).unwrap().nlink(), 1);

    let mut unnamed = chaos_tests::tmpfile::open_tmpfile(&a.mnt, 0, 0o600).unwrap();
    unnamed.write_all(&body).unwrap();
    unnamed.sync_all().unwrap();
    let unnamed_ino = unnamed.metadata().unwrap().ino();
    assert_eq!(vol.inode_rows(unnamed_ino), (true, 5));
    drop(unnamed);
    assert!(
        wait_until(DEADLINE, || vol.inode_rows(unnamed_ino) == (false, 0)),
        "closed without a name, it is reclaimed"
    );

    fs::write(a.p("victim"), b"gone").unwrap();
    let held = fs::File::open(a.p("victim")).unwrap();
    assert_eq!(held.metadata().unwrap().nlink(), 1, "a's kernel counts 1");
    fs::remove_file(b.p("victim")).unwrap();
    assert_eq!(link_by_proc_fd(&held, &a.p("back")), libc::ENOENT);
    assert!(fs::metadata(b.p("back")).is_err(), "nothing was linked");
    drop(held);
    a.stop();
    b.stop();
}

#[test]
fn a_file_unlinked_on_one_mount_stays_whole_on_another_that_has_it_open_until_it_closes() {
    use std::os::unix::fs::MetadataExt;
    let Some(admin) = server("postgres unlink while open elsewhere") else {
        return;
    };
    let vol = PgVolume::format(&admin, "64K");
    let (a, b) = mount_pair(&vol);
    assert!(
        wait_until(DEADLINE, || vol.session_count() == 2),
        "two sessions"
    );
    let objects_before = object_count(&vol.data());

    let body = pattern(300_000, 3);
    fs::write(a.p("victim"), &body).unwrap();
    let objects_with_file = object_count(&vol.data());
    assert!(
        objects_with_file >= objects_before + 5,
        "300 KB in 64 KiB blocks"
    );
    let held = OpenOptions::new()
        .read(true)
        .write(true)
        .open(b.p("victim"))
        .unwrap();
    let ino = held.metadata().unwrap().ino();
    fs::remove_file(a.p("victim")).unwrap();
    assert!(fs::metadata(b.p("victim")).is_err(), "b sees the unlink");

    // Several heartbeats and ticks of both mounts pass: nothing reclaims
    // the file b has open.
    std::thread::sleep(Duration::from_millis(2_500));
    assert_eq!(
        vol.inode_rows(ino),
        (true, 5),
        "the orphan and its blocks are kept"
    );
    assert_eq!(object_count(&vol.data()), objects_with_file);
    let mut read = vec![0; body.len()];
    held.read_exact_at(&mut read, 0).unwrap();
    assert!(read == body, "b reads the unlinked file whole");
    held.write_all_at(b"still writable", 100_000).unwrap();
    let mut back = vec![0; 14];
    held.read_exact_at(&mut back, 100_000).unwrap();
    assert_eq!(&back, b"still writable");
    held.sync_all().unwrap();
    held.read_exact_at(&mut read, 0).unwrap();
    let mut expected = body.clone();
    expected[100_000..100_014].copy_from_slice(b"still writable");
    assert!(read == expected, "b reads its own write back after fsync");

    // b closes it: b's mount lets go and reclaims it, objects included.
    drop(held);
    let reclaimed = wait_until(DEADLINE, || vol.inode_rows(ino) == (false, 0));
    assert!(reclaimed, "the orphan is reclaimed after b closed it");
    let objects_gone = wait_until(DEADLINE, || object_count(&vol.data()) == objects_before);
    assert!(
        objects_gone,
        "its objects are deleted: {} left",
        object_count(&vol.data())
    );
    a.stop();
    b.stop();
    assert_eq!(
        vol.session_count(),
        0,
        "clean unmounts close their sessions"
    );
}

#[test]
fn a_killed_mounts_open_unlinked_file_is_reclaimed_by_the_other_after_the_expiry() {
    use std::os::unix::fs::MetadataExt;
    let Some(admin) = server("postgres dead session expiry") else {
        return;
    };
    let vol = PgVolume::format(&admin, "64K");
    let (a, b) = mount_pair(&vol);
    let objects_before = object_count(&vol.data());
    fs::write(a.p("victim"), pattern(200_000, 9)).unwrap();
    let held = fs::File::open(b.p("victim")).unwrap();
    let ino = held.metadata().unwrap().ino();
    fs::remove_file(a.p("victim")).unwrap();
    assert!(
        wait_until(DEADLINE, || vol.session_count() == 2),
        "two sessions"
    );

    // b dies with the file open and no successor: its session stops
    // beating. Right after, the orphan is still held.
    b.kill9();
    drop(held);
    assert_eq!(
        vol.inode_rows(ino),
        (true, 4),
        "held by b's session until it expires"
    );
    // After the expiry a deletes b's session and reclaims the orphan.
    let reclaimed = wait_until(DEADLINE, || vol.inode_rows(ino) == (false, 0));
    assert!(reclaimed, "a reclaimed the dead mount's orphan");
    assert_eq!(vol.session_count(), 1, "only a's session is left");
    let objects_gone = wait_until(DEADLINE, || object_count(&vol.data()) == objects_before);
    assert!(
        objects_gone,
        "its objects are deleted: {} left",
        object_count(&vol.data())
    );
    a.stop();
}

/// A POSIX lock request on all of `file` (`typ`: F_RDLCK, F_WRLCK or
/// F_UNLCK) by this process.
fn posix_lock(typ: i32) -> libc::flock {
    // SAFETY: `flock` is a C struct of integers; all zeroes is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl
}

/// F_SETLK of the whole file: `Err(errno)` when refused.
fn set_lock(file: &fs::File, typ: i32) -> Result<(), nix::errno::Errno> {
    use nix::fcntl::{fcntl, FcntlArg};
    fcntl(file, FcntlArg::F_SETLK(&posix_lock(typ))).map(|_| ())
}

/// F_GETLK for a write lock of the whole file: the type of the lock that
/// blocks it (F_UNLCK if none).
fn blocking_lock_type(file: &fs::File) -> i32 {
    use nix::fcntl::{fcntl, FcntlArg};
    let mut fl = posix_lock(libc::F_WRLCK);
    fcntl(file, FcntlArg::F_GETLK(&mut fl)).unwrap();
    i32::from(fl.l_type)
}

/// Runs `flock ARGS` (util-linux) in the background.
/// `flock ARGS` in a process group of its own: flock runs its command as a
/// child, which killing flock alone would leave behind (an orphaned
/// `sleep 600` holding the test's output open). Dropped or killed, the
/// whole group goes.
struct Flock(std::process::Child);

impl Flock {
    fn kill(&mut self) {
        let group = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.0.wait();
    }

    fn wait_timeout(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.0.try_wait() {
                return Some(status);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Flock {
    fn drop(&mut self) {
        self.kill();
    }
}

fn flock_command(args: &str) -> Flock {
    use std::os::unix::process::CommandExt;
    Flock(
        Command::new("sh")
            .args(["-c", &format!("exec flock {args}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("run flock (util-linux)"),
    )
}

/// Whether `flock -n -x FILE true` gets the lock at once.
fn flock_free(file: &Path) -> bool {
    Command::new("flock")
        .args(["-n", "-x"])
        .arg(file)
        .arg("true")
        .status()
        .expect("run flock (util-linux)")
        .success()
}

#[test]
fn locks_exclude_each_other_across_mounts_and_a_dead_mounts_locks_expire() {
    let Some(admin) = server("postgres locks across mounts") else {
        return;
    };
    let vol = PgVolume::format(&admin, "64K");
    let (a, b) = mount_pair(&vol);
    fs::write(a.p("shared"), b"x").unwrap();
    let on_a = OpenOptions::new()
        .read(true)
        .write(true)
        .open(a.p("shared"))
        .unwrap();
    let on_b = OpenOptions::new()
        .read(true)
        .write(true)
        .open(b.p("shared"))
        .unwrap();

    // POSIX record locks: a's write lock refuses b's and shows in F_GETLK.
    set_lock(&on_a, libc::F_WRLCK).unwrap();
    assert_eq!(
        set_lock(&on_b, libc::F_RDLCK),
        Err(nix::errno::Errno::EAGAIN)
    );
    assert_eq!(blocking_lock_type(&on_b), libc::F_WRLCK);
    // Shared locks coexist across mounts; a's downgrade lets b read-lock.
    set_lock(&on_a, libc::F_RDLCK).unwrap();
    set_lock(&on_b, libc::F_RDLCK).unwrap();
    assert_eq!(
        set_lock(&on_a, libc::F_WRLCK),
        Err(nix::errno::Errno::EAGAIN)
    );
    set_lock(&on_b, libc::F_UNLCK).unwrap();
    set_lock(&on_a, libc::F_WRLCK).unwrap();
    drop(on_a); // close drops a's POSIX locks
    set_lock(&on_b, libc::F_WRLCK).unwrap();
    drop(on_b);

    // flock: a holder on a; a blocking waiter on b parks until the holder
    // is killed (its close releases the lock), then gets it.
    let mut holder = flock_command(&format!("-x -o {} sleep 600", a.p("shared").display()));
    assert!(
        wait_until(DEADLINE, || !flock_free(&b.p("shared"))),
        "a's flock is seen on b"
    );
    let mut waiter = flock_command(&format!("-x {} true", b.p("shared").display()));
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        waiter.0.try_wait().unwrap().is_none(),
        "b's waiter must wait while a holds the lock"
    );
    holder.kill();
    let status = waiter
        .wait_timeout(DEADLINE)
        .expect("b's waiter gets the lock");
    assert!(status.success(), "flock on b: {status}");

    // A mount killed while one of its processes holds a lock: the others
    // are refused until its session expires, then the lock is free.
    let mut holder = flock_command(&format!("-x -o {} sleep 600", a.p("shared").display()));
    assert!(
        wait_until(DEADLINE, || !flock_free(&b.p("shared"))),
        "a's flock is seen on b"
    );
    a.kill9();
    assert!(
        !flock_free(&b.p("shared")),
        "still held right after the kill"
    );
    assert!(
        wait_until(DEADLINE, || flock_free(&b.p("shared"))),
        "a dead mount's lock is freed after its session expires"
    );
    holder.kill();
    b.stop();
}

/// `sh -c SCRIPT` as `uid` (and gid) without supplementary groups (uid 0:
/// root): whether it succeeded, and its stdout then stderr.
fn sh_as(uid: u32, script: &str) -> (bool, String) {
    let mut cmd = Command::new("setpriv");
    cmd.arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .arg("--clear-groups")
        .args(["sh", "-c", script]);
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// An ACL set, changed by chmod and removed on one mount is enforced on
/// another of the same PostgreSQL volume once its attributes expire (1 s
/// here): the kernel forgets its cached ACLs whenever it fetches
/// attributes again, so no notification is needed.
#[test]
fn an_acl_changed_on_one_mount_is_enforced_on_the_other_within_the_attribute_ttl() {
    let Some(admin) = server("postgres ACLs across mounts") else {
        return;
    };
    let vol = PgVolume::format(&admin, "64K");
    let expiry = ["--session-expiry-ms", TEST_SESSION_EXPIRY_MS];
    let a = vol.mount_with_ttl("a", "1000", &expiry);
    let b = vol.mount_with_ttl("b", "1000", &expiry);
    let (on_a, on_b) = (a.p("f"), b.p("f"));
    let (on_a, on_b) = (on_a.to_str().unwrap(), on_b.to_str().unwrap());
    let (ok, out) = sh_as(0, &format!("echo s > {on_a} && chmod 600 {on_a}"));
    assert!(ok, "{out}");
    let read_on_b = || sh_as(65533, &format!("cat {on_b}"));
    let (ok, out) = read_on_b();
    assert!(!ok && out.contains("Permission denied"), "{out}");

    let (ok, out) = sh_as(0, &format!("setfacl -m u:65533:r {on_a}"));
    assert!(ok, "{out}");
    assert!(
        wait_until(DEADLINE, || read_on_b().0),
        "mount b never granted what a's ACL grants"
    );
    let (ok, out) = sh_as(0, &format!("getfacl -n --omit-header {on_b} 2>/dev/null"));
    assert!(ok && out.contains("user:65533:r--\n"), "{out}");

    // chmod on a sets the mask to ---: refused on b again.
    let (ok, out) = sh_as(0, &format!("chmod 600 {on_a}"));
    assert!(ok, "{out}");
    assert!(
        wait_until(DEADLINE, || !read_on_b().0),
        "mount b still grants after a's chmod emptied the mask"
    );
    // `setfacl -b` keeps the owning group's entry (---), not the mask.
    let (ok, out) = sh_as(0, &format!("chmod 640 {on_a} && setfacl -b {on_a}"));
    assert!(ok, "{out}");
    assert!(
        wait_until(DEADLINE, || {
            let (_, out) = sh_as(0, &format!("getfacl -n --omit-header {on_b} 2>/dev/null"));
            out == "user::rw-\ngroup::---\nother::---\n\n"
        }),
        "mount b still shows the removed ACL"
    );
    assert!(!read_on_b().0);
    a.stop();
    b.stop();
}

/// Runs [`chaos_tests::LOCK_PLAN`] with process i on `files[i % count]`
/// (a deadline of 5 s per request); its output.
fn lock_plan(files: &[PathBuf], processes: usize, plan: &str) -> String {
    let files: Vec<&str> = files.iter().map(|f| f.to_str().unwrap()).collect();
    let mut child = ChildGuard(
        Command::new("python3")
            .arg("-c")
            .arg(chaos_tests::LOCK_PLAN)
            .args([&files.join(","), &processes.to_string(), plan, "5"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn python3"),
    );
    let status = child
        .wait_timeout(DEADLINE)
        .expect("the lock plan finishes by its deadline");
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.0.stdout.take().unwrap(), &mut out).unwrap();
    assert!(status.success(), "lock plan {plan:?} failed: {out}");
    out.trim().to_string()
}

/// POSIX lock waits through two mounts (processes 0 and 2 on a, 1 on b,
/// each holding byte i of one file): a wait closing a cycle through the
/// other mount is EDEADLK at once, and the other waiters are granted once
/// the refused one's close releases its byte, all within the plan's
/// 1000 ms watch (ten retry intervals; the plan's deadline is 5 s); a
/// chain waits until released; no wait row is left behind.
#[test]
fn a_posix_wait_closing_a_cycle_through_another_mount_is_edeadlk_and_the_other_is_granted() {
    let Some(admin) = server("postgres lock cycles across mounts") else {
        return;
    };
    let vol = PgVolume::format(&admin, "64K");
    let (a, b) = mount_pair(&vol);
    fs::write(a.p("cycle"), b"").unwrap();
    let files = [a.p("cycle"), b.p("cycle")];
    // 0 (a) holds byte 0 and waits for byte 1, held by 1 (b); 1 asking
    // for byte 0 closes the cycle.
    assert_eq!(
        lock_plan(&files, 2, "0>1,1>0,w1000"),
        "0:early-granted 1:early-EDEADLK"
    );
    // 0 (a) -> 1 (b) -> 2 (a) -> 0: the third request closes it.
    assert_eq!(
        lock_plan(&files, 3, "0>1,1>2,2>0,w1000"),
        "0:early-granted 1:early-granted 2:early-EDEADLK"
    );
    // A chain (0 waits for 1, 2 for 0) is no cycle: nothing is answered
    // until 1 lets go, then 0 and 2 in turn.
    assert_eq!(
        lock_plan(&files, 3, "0>1,2>0,w500,r1"),
        "0:granted 2:granted"
    );
    assert!(
        wait_until(DEADLINE, || psql_value(
            &vol.url,
            "SELECT count(*) FROM lock_waits"
        ) == "0"),
        "a wait row outlived its request"
    );
    a.stop();
    b.stop();
}
