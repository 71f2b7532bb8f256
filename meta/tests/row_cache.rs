//! Attributes, entries and absent xattrs served from memory on a SQLite
//! volume its process serves (`MetaStore::serve_as_only_writer`): they
//! answer what the database holds after every kind of change, failed ones
//! included, and after a change they come from memory, not a read.
#![allow(clippy::unwrap_used)]

mod common;

use std::ffi::OsStr;

use baton_meta::{
    BlockRef, CommitBlocks, CreateArgs, FileKind, MetaStore, RenameFlags, SetAttr, TimeOrNow,
    TxKind, XattrFlags, ROOT_INO,
};
use common::*;

/// Transactions of `kind` the store ran so far.
fn count(m: &dyn MetaStore, kind: TxKind) -> u64 {
    m.transaction_stats()
        .iter()
        .find(|(k, _)| *k == kind)
        .map_or(0, |(_, s)| s.count)
}

fn inline_block(index: u64, len: u32) -> BlockRef {
    BlockRef {
        index,
        object_key: format!("obj-{index}-{len}"),
        len,
        inline: None,
    }
}

#[test]
fn after_a_create_a_write_and_a_setattr_the_reads_come_from_memory() {
    let v = fresh_sqlite();
    let m = v.meta.as_ref();
    let d = dir(m, ROOT_INO, "d");
    let f = file(m, d.ino, "f");
    let commit = CommitBlocks {
        new_size: Some(1),
        blocks: vec![inline_block(0, 1)],
        ..Default::default()
    };
    m.commit_blocks(f.ino, &commit, None).unwrap();
    let set = SetAttr {
        mtime: Some(TimeOrNow::Now),
        ..Default::default()
    };
    let (after, _) = m.setattr(f.ino, &set, None).unwrap();

    let reads = count(m, TxKind::Read);
    let from_memory = count(m, TxKind::Memory);
    assert_eq!(m.getattr_plus(f.ino).unwrap(), (after.clone(), 1));
    assert_eq!(m.lookup_plus(d.ino, n("f")).unwrap(), (after.clone(), 1));
    assert_eq!(m.getattr(f.ino).unwrap(), after);
    let capability = m.getxattr(f.ino, n("security.capability"));
    assert!(matches!(
        capability,
        Err(baton_meta::MetaError::NoXattr { .. })
    ));
    assert_eq!(m.getattr_plus(d.ino).unwrap().0.ino, d.ino);
    assert_eq!(
        count(m, TxKind::Read),
        reads,
        "a read ran for what the writer had just written"
    );
    assert_eq!(count(m, TxKind::Memory), from_memory + 5);

    // A second store on the file (another process, no cache) agrees.
    m.sync().unwrap();
    let other = baton_meta::open(&v.url()).unwrap();
    assert_eq!(other.getattr_plus(f.ino).unwrap(), (after, 1));
}

#[test]
fn another_writer_is_noticed_at_the_next_batch() {
    let v = fresh_sqlite();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f");
    assert_eq!(m.getattr(f.ino).unwrap().mode, 0o644);
    m.sync().unwrap();
    let other = baton_meta::open(&v.url()).unwrap();
    let chmod = SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    other.setattr(f.ino, &chmod, None).unwrap();
    other.sync().unwrap();
    // The store's next write begins a batch, which sees the other commit.
    file(m, ROOT_INO, "g");
    assert_eq!(m.getattr(f.ino).unwrap().mode, 0o600);
    assert_eq!(m.getattr_plus(f.ino).unwrap().0.mode, 0o600);
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

const NAMES: [&str; 5] = ["a", "b", "c", "d", "e"];

/// What a mount that enforces ACLs asks for: a default ACL inherited, the
/// umask applied otherwise.
fn create_args(kind: FileKind, mode: u32) -> CreateArgs {
    let mut args = CreateArgs::new(kind, mode);
    args.inherit_acl = true;
    args.umask = 0o022;
    args
}

/// A default ACL (xattr bytes): owner rwx, group rx, others nothing.
fn default_acl() -> Vec<u8> {
    baton_meta::acl::Acl::from_mode(0o750).to_bytes()
}

/// Runs one random change and says what it answered; failures (a name
/// taken, a directory not empty) are part of the test: a refused request
/// must leave nothing behind.
fn random_change(
    m: &dyn MetaStore,
    rng: &mut Rng,
    dirs: &mut Vec<u64>,
    inos: &mut Vec<u64>,
) -> String {
    let parent = dirs[rng.below(dirs.len() as u64) as usize];
    let name = n(NAMES[rng.below(NAMES.len() as u64) as usize]);
    let ino = inos[rng.below(inos.len() as u64) as usize];
    let mut answer = match rng.below(12) {
        0 | 1 => {
            let made = m.create(parent, name, &create_args(FileKind::Regular, 0o666), None);
            if let Ok(a) = &made {
                inos.push(a.ino);
            }
            format!("create {parent}/{name:?}: {made:?}")
        }
        2 => {
            let made = m.create(parent, name, &create_args(FileKind::Directory, 0o777), None);
            if let Ok(a) = &made {
                dirs.push(a.ino);
                inos.push(a.ino);
            }
            format!("mkdir {parent}/{name:?}: {made:?}")
        }
        3 => format!("unlink: {:?}", m.unlink(parent, name, None)),
        4 => format!("rmdir: {:?}", m.rmdir(parent, name, None)),
        5 => {
            let to = dirs[rng.below(dirs.len() as u64) as usize];
            let flags = RenameFlags {
                noreplace: rng.below(4) == 0,
                exchange: rng.below(4) == 0,
            };
            let new_name = n(NAMES[rng.below(NAMES.len() as u64) as usize]);
            format!(
                "rename: {:?}",
                m.rename(parent, name, to, new_name, flags, None)
            )
        }
        6 => {
            let set = SetAttr {
                mode: Some(0o600 | rng.below(0o100) as u32),
                size: (rng.below(2) == 0).then(|| rng.below(3 * u64::from(BS))),
                mtime: Some(TimeOrNow::Now),
                ..Default::default()
            };
            format!("setattr {ino}: {:?}", m.setattr(ino, &set, None))
        }
        7 | 8 => {
            let blocks = rng.below(3);
            let size = blocks * u64::from(BS) + rng.below(u64::from(BS));
            let rows = (0..=blocks)
                .map(|i| {
                    let len = if i == blocks {
                        (size % u64::from(BS)) as u32
                    } else {
                        BS
                    };
                    inline_block(i, len.max(1))
                })
                .filter(|b| b.index * u64::from(BS) + u64::from(b.len) <= size.max(1))
                .collect();
            let commit = CommitBlocks {
                new_size: Some(size.max(1)),
                blocks: rows,
                punched: if rng.below(3) == 0 { vec![0] } else { vec![] },
                ..Default::default()
            };
            format!("commit {ino}: {:?}", m.commit_blocks(ino, &commit, None))
        }
        9 => {
            let flags = XattrFlags {
                create: rng.below(2) == 0,
                ..Default::default()
            };
            if rng.below(2) == 0 {
                let acl = OsStr::new("system.posix_acl_default");
                format!(
                    "default acl {parent}: {:?}",
                    m.setxattr(parent, acl, &default_acl(), flags, None)
                )
            } else {
                format!(
                    "setxattr {ino}: {:?}",
                    m.setxattr(ino, n("user.a"), b"v", flags, None)
                )
            }
        }
        10 => format!(
            "removexattr {ino}: {:?}",
            m.removexattr(ino, n("user.a"), None)
        ),
        _ => {
            let to = dirs[rng.below(dirs.len() as u64) as usize];
            format!("link {ino}: {:?}", m.link(ino, to, name, None))
        }
    };
    if rng.below(8) == 0 {
        for orphan in m.orphans().unwrap() {
            answer += &format!("; reclaim {orphan}: {:?}", m.reclaim(orphan, None).unwrap());
        }
    }
    answer
}

/// `s` with every time in it written `T`: two volumes changed alike
/// differ only in when.
fn untimed(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find("Timespec {") {
        out.push_str(&rest[..at]);
        out.push('T');
        rest = rest[at..].find('}').map_or("", |end| &rest[at + end + 1..]);
    }
    out.push_str(rest);
    out
}

/// Every answer the cache can give, for comparison.
fn answers(m: &dyn MetaStore, dirs: &[u64], inos: &[u64]) -> Vec<String> {
    let mut out = Vec::new();
    for &d in dirs {
        for name in NAMES {
            out.push(format!(
                "lookup {d}/{name}: {:?}",
                m.lookup_plus(d, n(name))
            ));
            out.push(format!(
                "lookup attr {d}/{name}: {:?}",
                m.lookup(d, n(name))
            ));
        }
    }
    for &ino in inos {
        out.push(format!("getattr {ino}: {:?}", m.getattr_plus(ino)));
        out.push(format!("getattr attr {ino}: {:?}", m.getattr(ino)));
        for name in ["user.a", "security.capability", "system.posix_acl_access"] {
            let got = m.getxattr(ino, OsStr::new(name));
            out.push(format!("getxattr {ino} {name}: {got:?}"));
        }
    }
    out
}

#[test]
fn what_memory_answers_is_what_the_database_holds_through_random_changes() {
    for seed in [1u64, 7, 42] {
        let v = fresh_sqlite();
        let m = v.meta.as_ref();
        let other = baton_meta::open(&v.url()).unwrap();
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut dirs = vec![ROOT_INO];
        let mut inos = vec![ROOT_INO];
        for step in 0..300 {
            if step % 50 == 25 {
                // Start from nothing, as after a handover: what is known
                // now comes from reads (sums of committed bytes), not from
                // creates (block rows).
                m.serve_as_only_writer();
            }
            random_change(m, &mut rng, &mut dirs, &mut inos);
            // Read through the cache (filling it) before and after commit.
            let cached = answers(m, &dirs, &inos);
            m.sync().unwrap();
            let stored = answers(other.as_ref(), &dirs, &inos);
            for (c, s) in cached.iter().zip(&stored) {
                assert_eq!(
                    c, s,
                    "seed {seed}, step {step}: memory and database disagree"
                );
            }
            assert_eq!(answers(m, &dirs, &inos), stored, "seed {seed}, step {step}");
        }
    }
}

/// The same random changes on two volumes, one served from memory and one
/// not: every change answers the same and leaves the same rows (times
/// aside). A write reads its file's attributes, its directory, the name's
/// absence and a default ACL's absence from memory before it changes a
/// row (`row_cache::Known`): what it read there is what the database held.
#[test]
fn writes_that_read_from_memory_do_what_writes_that_read_the_database_do() {
    for seed in [3u64, 11, 99] {
        let cached = fresh_sqlite();
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("meta.db");
        let database_only = baton_meta::format(db.to_str().unwrap(), &config()).unwrap();
        let volumes = [cached.meta.as_ref(), database_only.as_ref()];
        let mut rngs = [1, 2].map(|_| Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1));
        let mut dirs = [vec![ROOT_INO], vec![ROOT_INO]];
        let mut inos = [vec![ROOT_INO], vec![ROOT_INO]];
        for step in 0..300 {
            if step % 100 == 50 {
                volumes[0].serve_as_only_writer();
            }
            let answered: Vec<String> = (0..2)
                .map(|i| {
                    let answer =
                        random_change(volumes[i], &mut rngs[i], &mut dirs[i], &mut inos[i]);
                    untimed(&answer)
                })
                .collect();
            assert_eq!(answered[0], answered[1], "seed {seed}, step {step}");
            let rows = volumes.map(|m| untimed(&answers(m, &dirs[0], &inos[0]).join("\n")));
            assert_eq!(rows[0], rows[1], "seed {seed}, step {step}");
        }
        assert_eq!(dirs[0], dirs[1]);
        assert_eq!(count(volumes[1], TxKind::Memory), 0);
    }
}
