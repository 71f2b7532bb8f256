//! Directory quotas under random sequences of changes (proptest): files and
//! directories made, resized, linked, unlinked, renamed across quota
//! boundaries, orphans reclaimed, limits changed, O_TMPFILEs made (counted
//! from their directory) and linked (counted from their name). After every step, taken
//! or refused, each quota's stored usage equals a recount of its tree; a
//! refused step changed nothing (no usage, no name); and a step refused
//! for lack of quota is refused only because a quota counting it would go
//! past a limit. Runs on the engine BATON_META_BACKEND names;
//! PROPTEST_CASES=N runs more cases.
#![allow(clippy::unwrap_used)]

mod common;

use baton_meta::{
    FileKind, MetaError, MetaStore, Quota, RenameFlags, SessionInfo, SetAttr, ROOT_INO,
};
use common::*;
use proptest::prelude::*;

/// The session O_TMPFILEs are made by.
const SESSION: u64 = 1;

const PLAIN: RenameFlags = RenameFlags {
    noreplace: false,
    exchange: false,
};

#[derive(Debug, Clone)]
enum Step {
    Create {
        dir: usize,
    },
    Mkdir {
        dir: usize,
    },
    Resize {
        file: usize,
        size: u64,
    },
    Link {
        file: usize,
        dir: usize,
    },
    Unlink {
        name: usize,
    },
    Rename {
        name: usize,
        dir: usize,
    },
    MoveDir {
        dir: usize,
        to: usize,
    },
    Reclaim,
    Tmpfile {
        dir: usize,
    },
    LinkTmpfile {
        tmpfile: usize,
        dir: usize,
    },
    Limits {
        dir: usize,
        bytes: Option<u64>,
        inodes: Option<u64>,
    },
}

fn step() -> impl Strategy<Value = Step> {
    let ix = || 0usize..64;
    prop_oneof![
        3 => ix().prop_map(|dir| Step::Create { dir }),
        1 => ix().prop_map(|dir| Step::Mkdir { dir }),
        4 => (ix(), 0u64..40_000).prop_map(|(file, size)| Step::Resize { file, size }),
        2 => (ix(), ix()).prop_map(|(file, dir)| Step::Link { file, dir }),
        2 => ix().prop_map(|name| Step::Unlink { name }),
        2 => (ix(), ix()).prop_map(|(name, dir)| Step::Rename { name, dir }),
        1 => (ix(), ix()).prop_map(|(dir, to)| Step::MoveDir { dir, to }),
        1 => Just(Step::Reclaim),
        1 => ix().prop_map(|dir| Step::Tmpfile { dir }),
        1 => (ix(), ix()).prop_map(|(tmpfile, dir)| Step::LinkTmpfile { tmpfile, dir }),
        1 => (ix(), limit(60_000), limit(12))
            .prop_map(|(dir, bytes, inodes)| Step::Limits { dir, bytes, inodes }),
    ]
}

fn limit(max: u64) -> impl Strategy<Value = Option<u64>> {
    prop_oneof![1 => Just(None), 3 => (0..=max).prop_map(Some)]
}

/// What the test knows of the tree: directories (with where they are) and
/// the names of regular files.
struct Model {
    /// (ino, parent, name); index 0 is the root.
    dirs: Vec<(u64, u64, String)>,
    /// (parent, name, ino) of every regular file's name.
    names: Vec<(u64, String, u64)>,
    /// Regular files not yet reclaimed (linked or orphans).
    files: Vec<u64>,
    /// O_TMPFILEs never linked (and not reclaimed).
    tmpfiles: Vec<u64>,
    next_name: u32,
}

impl Model {
    fn name(&mut self) -> String {
        self.next_name += 1;
        format!("n{}", self.next_name)
    }
}

/// Everything a refused step must leave as it was.
#[derive(Debug, PartialEq)]
struct Snapshot {
    quotas: Vec<Quota>,
    listings: Vec<Vec<String>>,
    orphans: Vec<u64>,
}

fn snapshot(m: &dyn MetaStore, model: &Model) -> Snapshot {
    let mut listings: Vec<Vec<String>> = model
        .dirs
        .iter()
        .map(|(ino, _, _)| {
            let mut l = names(m, *ino);
            l.sort();
            l
        })
        .collect();
    listings.sort();
    Snapshot {
        quotas: m.quotas().unwrap(),
        listings,
        orphans: m.orphans().unwrap(),
    }
}

fn pick<T>(v: &[T], i: usize) -> Option<&T> {
    (!v.is_empty()).then(|| &v[i % v.len()])
}

/// Applies `step`; Ok(None) if it did not apply to this tree (nothing to
/// pick), Ok(Some(result)) otherwise.
fn apply(m: &dyn MetaStore, model: &mut Model, step: &Step) -> Option<Result<(), MetaError>> {
    match *step {
        Step::Create { dir } | Step::Mkdir { dir } => {
            let parent = pick(&model.dirs, dir)?.0;
            let name = model.name();
            let kind = match step {
                Step::Mkdir { .. } => FileKind::Directory,
                _ => FileKind::Regular,
            };
            let args = baton_meta::CreateArgs::new(kind, 0o644);
            Some(m.create(parent, n(&name), &args, None).map(|a| {
                if kind == FileKind::Directory {
                    model.dirs.push((a.ino, parent, name));
                } else {
                    model.names.push((parent, name, a.ino));
                    model.files.push(a.ino);
                }
            }))
        }
        Step::Resize { file, size } => {
            let ino = *pick(&model.files, file)?;
            let set = SetAttr {
                size: Some(size),
                ..SetAttr::default()
            };
            Some(m.setattr(ino, &set, None).map(|_| ()))
        }
        Step::Link { file, dir } => {
            let (_, _, ino) = pick(&model.names, file)?.clone();
            let parent = pick(&model.dirs, dir)?.0;
            let name = model.name();
            Some(
                m.link(ino, parent, n(&name), None)
                    .map(|_| model.names.push((parent, name, ino))),
            )
        }
        Step::Unlink { name } => {
            let i = name % model.names.len().max(1);
            let (parent, entry, _) = pick(&model.names, name)?.clone();
            Some(m.unlink(parent, n(&entry), None).map(|_| {
                model.names.remove(i);
            }))
        }
        Step::Rename { name, dir } => {
            let i = name % model.names.len().max(1);
            let (parent, entry, ino) = pick(&model.names, name)?.clone();
            let to = pick(&model.dirs, dir)?.0;
            let new_name = model.name();
            Some(
                m.rename(parent, n(&entry), to, n(&new_name), PLAIN, None)
                    .map(|_| model.names[i] = (to, new_name, ino)),
            )
        }
        Step::MoveDir { dir, to } => {
            if model.dirs.len() < 2 {
                return None;
            }
            let i = 1 + dir % (model.dirs.len() - 1);
            let (ino, parent, name) = model.dirs[i].clone();
            let to = pick(&model.dirs, to)?.0;
            let new_name = model.name();
            Some(
                m.rename(parent, n(&name), to, n(&new_name), PLAIN, None)
                    .map(|_| model.dirs[i] = (ino, to, new_name)),
            )
        }
        Step::Reclaim => {
            for ino in m.orphans().unwrap() {
                m.reclaim(ino, None).unwrap();
                model.files.retain(|f| *f != ino);
                model.tmpfiles.retain(|f| *f != ino);
            }
            Some(Ok(()))
        }
        Step::Tmpfile { dir } => {
            let parent = pick(&model.dirs, dir)?.0;
            let args = baton_meta::CreateArgs::new(FileKind::Regular, 0o600);
            Some(m.tmpfile(parent, &args, SESSION, true, None).map(|a| {
                model.tmpfiles.push(a.ino);
                model.files.push(a.ino);
            }))
        }
        Step::LinkTmpfile { tmpfile, dir } => {
            let i = tmpfile % model.tmpfiles.len().max(1);
            let ino = *pick(&model.tmpfiles, tmpfile)?;
            let parent = pick(&model.dirs, dir)?.0;
            let name = model.name();
            Some(m.link(ino, parent, n(&name), None).map(|_| {
                model.tmpfiles.remove(i);
                model.names.push((parent, name, ino));
            }))
        }
        Step::Limits { dir, bytes, inodes } => {
            let ino = pick(&model.dirs, dir)?.0;
            Some(m.set_quota(ino, bytes, inodes).map(|_| ()))
        }
    }
}

fn run(steps: &[Step], limits: &[(Option<u64>, Option<u64>)]) -> Result<(), TestCaseError> {
    let v = fresh();
    let m = v.meta.as_ref();
    let mut model = Model {
        dirs: vec![(ROOT_INO, ROOT_INO, String::new())],
        names: Vec::new(),
        files: Vec::new(),
        tmpfiles: Vec::new(),
        next_name: 0,
    };
    m.open_session(&SessionInfo {
        id: SESSION,
        host: "testhost".into(),
        pid: std::process::id(),
        mount: "/mnt".into(),
    })
    .unwrap();
    // Nested quota directories: q0, q0/q1, and q2 beside them.
    for (i, parent) in [(0usize, 0usize), (1, 1), (2, 0)] {
        let parent_ino = model.dirs[parent].0;
        let name = format!("q{i}");
        let d = dir(m, parent_ino, &name);
        model.dirs.push((d.ino, parent_ino, name));
    }
    for (i, (bytes, inodes)) in limits.iter().enumerate() {
        m.set_quota(model.dirs[i + 1].0, *bytes, *inodes).unwrap();
    }
    for (k, step) in steps.iter().enumerate() {
        let before = snapshot(m, &model);
        let Some(result) = apply(m, &mut model, step) else {
            continue;
        };
        match result {
            Ok(()) => {}
            Err(err) => {
                let errno = err.errno();
                prop_assert!(
                    errno == libc::EDQUOT || errno == libc::EINVAL,
                    "step {k} {step:?} failed with an unexpected error: {err}"
                );
                prop_assert_eq!(
                    &snapshot(m, &model),
                    &before,
                    "step {} {:?} was refused ({}) but changed the volume",
                    k,
                    step,
                    err
                );
                if errno == libc::EDQUOT && !matches!(step, Step::MoveDir { .. }) {
                    // Only a limit reached may refuse: some quota would go
                    // past a limit by what one file adds (one inode, at
                    // most 40,000 bytes; a moved tree may add more).
                    let full = before.quotas.iter().any(|q| {
                        q.bytes_max.is_some_and(|max| q.used.bytes + 40_000 > max)
                            || q.inodes_max.is_some_and(|max| q.used.inodes >= max)
                    });
                    prop_assert!(
                        full,
                        "step {k} {step:?}: EDQUOT with room in every quota: {before:?}"
                    );
                }
            }
        }
        let drift = m.recount_quotas(false).unwrap();
        prop_assert!(
            drift.is_empty(),
            "after step {k} {step:?}: stored usage differs from a recount: {drift:?}"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(16),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn quota_usage_always_equals_a_recount_and_refusals_change_nothing(
        limits in proptest::collection::vec((limit(60_000), limit(12)), 3),
        steps in proptest::collection::vec(step(), 1..48),
    ) {
        run(&steps, &limits)?;
    }
}
