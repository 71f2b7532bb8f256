//! Writers: `run` appends to, overwrites and truncates a few files with
//! pwrite, fsyncs often, and keeps each file's expected content in memory
//! (every write the kernel acknowledged); at the end every file is read
//! back with O_DIRECT and compared, and the directory listed against the
//! model. `filler` writes without fsync until the staging disk is full;
//! `pressure` writes one large file (memory pressure for the OOM fault).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Duration;

use super::{close_checked, Ctx};
use crate::chaos::rng::fill_content;

/// Live files per writer.
const WRITER_FILE_COUNT_MAX: usize = 4;
/// Largest single write.
const WRITE_BYTES_MAX: u64 = 64 << 10;

struct Tracked {
    file: Option<File>,
    content: Vec<u8>,
}

struct Writer {
    dir: PathBuf,
    files: BTreeMap<String, Tracked>,
    unknown: BTreeSet<String>,
    created_count: u64,
}

impl Writer {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Forgets a file whose content is unknown after a failed write.
    fn poison(&mut self, ctx: &mut Ctx, name: &str) {
        self.files.remove(name);
        let path = self.path(name);
        if ctx
            .op("unlink", path.display(), || std::fs::remove_file(&path))
            .is_err()
        {
            self.unknown.insert(name.to_string());
        }
    }

    fn create(&mut self, ctx: &mut Ctx) {
        self.created_count += 1;
        let name = format!("f{}", self.created_count);
        let path = self.path(&name);
        if let Ok(file) = ctx.op("create", path.display(), || {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
        }) {
            self.files.insert(
                name,
                Tracked {
                    file: Some(file),
                    content: Vec::new(),
                },
            );
        } else {
            self.unknown.insert(name);
        }
    }

    /// One write, truncate or close on file `name`; false if it failed.
    fn step(&mut self, ctx: &mut Ctx, name: &str) -> bool {
        let path = self.path(name);
        let limit = ctx.args.file_bytes.max(4096);
        let Some(tracked) = self.files.get_mut(name) else {
            return true;
        };
        if tracked.file.is_none() {
            match ctx.op("open", path.display(), || {
                OpenOptions::new().read(true).write(true).open(&path)
            }) {
                Ok(file) => tracked.file = Some(file),
                Err(_) => return false,
            }
        }
        let Some(file) = tracked.file.as_ref() else {
            return false;
        };
        let len = tracked.content.len() as u64;
        let action = ctx.rng.below(100);
        if action < 5 && len > 0 {
            let new_len = ctx.rng.below(len);
            if ctx
                .op("truncate", path.display(), || file.set_len(new_len))
                .is_err()
            {
                return false;
            }
            tracked.content.truncate(new_len as usize);
            return true;
        }
        if action < 10 {
            let Some(file) = tracked.file.take() else {
                return true;
            };
            return ctx
                .op("close", path.display(), || close_checked(file))
                .is_ok();
        }
        let size = ctx.rng.range(1, WRITE_BYTES_MAX);
        let offset = if action < 65 && len + size <= limit {
            len
        } else {
            ctx.rng.below((len + 1).min(limit.saturating_sub(size) + 1))
        };
        let data = ctx.rng.bytes(size as usize);
        if ctx
            .op("write", path.display(), || file.write_all_at(&data, offset))
            .is_err()
        {
            return false;
        }
        let end = offset as usize + data.len();
        if tracked.content.len() < end {
            tracked.content.resize(end, 0);
        }
        tracked.content[offset as usize..end].copy_from_slice(&data);
        match ctx.rng.below(4) {
            0 | 1 => ctx.op("fsync", path.display(), || file.sync_all()).is_ok(),
            2 => ctx
                .op("fdatasync", path.display(), || file.sync_data())
                .is_ok(),
            _ => true,
        }
    }

    /// Reads `name` back with O_DIRECT and compares it with the model;
    /// false if it could not be read back whole. A failed read or close
    /// there may be the error of this writer's own unsynced pages (the
    /// direct read and the close write them back first, and the first
    /// to look clears the kernel's error flag, so this writer's own close
    /// then succeeds): the caller then no longer knows the content.
    fn verify(&mut self, ctx: &mut Ctx, name: &str, final_pass: bool) -> bool {
        let path = self.path(name);
        let Some(expected) = self.files.get(name).map(|t| t.content.clone()) else {
            return true;
        };
        match ctx.read_direct(&path) {
            Some(got) => {
                let verified = expected.len().min(got.len()) as u64;
                if final_pass {
                    ctx.report.acknowledged_bytes_verified += verified;
                } else {
                    ctx.report.read_bytes_verified += verified;
                }
                ctx.compare(&path, 0, &expected, &got);
                true
            }
            None if final_pass => {
                ctx.report.lost_bytes += expected.len() as u64;
                false
            }
            None => false,
        }
    }

    fn final_check(&mut self, ctx: &mut Ctx) {
        let names: Vec<String> = self.files.keys().cloned().collect();
        for name in &names {
            if let Some(file) = self.files.get_mut(name).and_then(|t| t.file.take()) {
                let path = self.path(name);
                let _ = ctx.op("close", path.display(), || close_checked(file));
            }
        }
        for name in &names {
            let _ = self.verify(ctx, name, true);
        }
        let dir = self.dir.clone();
        let Ok(listed) = ctx.op("readdir", dir.display(), || {
            std::fs::read_dir(&dir)?
                .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect::<std::io::Result<BTreeSet<String>>>()
        }) else {
            return;
        };
        ctx.report.tree_checked = true;
        for name in &names {
            if !listed.contains(name) {
                ctx.mismatch(format!(
                    "{}: {name} missing from the listing",
                    dir.display()
                ));
            }
        }
        for name in &listed {
            if !self.files.contains_key(name) && !self.unknown.contains(name) {
                ctx.mismatch(format!("{}: unexpected entry {name}", dir.display()));
            }
        }
    }
}

pub(super) fn run(ctx: &mut Ctx) {
    let dir = ctx
        .args
        .mnt
        .join("writers")
        .join(format!("w{}", ctx.args.index));
    if ctx
        .op("mkdir", dir.display(), || std::fs::create_dir_all(&dir))
        .is_err()
    {
        return;
    }
    let mut writer = Writer {
        dir,
        files: BTreeMap::new(),
        unknown: BTreeSet::new(),
        created_count: 0,
    };
    while !ctx.should_stop() {
        if writer.files.len() < WRITER_FILE_COUNT_MAX && ctx.rng.chance(1, 10) {
            writer.create(ctx);
            continue;
        }
        let names: Vec<String> = writer.files.keys().cloned().collect();
        if names.is_empty() {
            continue;
        }
        let name = names[ctx.rng.below(names.len() as u64) as usize].clone();
        if ctx.rng.chance(1, 200) {
            writer.files.remove(&name);
            let path = writer.path(&name);
            if ctx
                .op("unlink", path.display(), || std::fs::remove_file(&path))
                .is_err()
            {
                writer.unknown.insert(name);
            }
            continue;
        }
        if ctx.rng.chance(1, 25) {
            if !writer.verify(ctx, &name, false) {
                writer.poison(ctx, &name);
            }
            continue;
        }
        if !writer.step(ctx, &name) {
            writer.poison(ctx, &name);
        }
    }
    writer.final_check(ctx);
}

pub(super) fn filler(ctx: &mut Ctx) {
    let dir = ctx.args.mnt.join("filler");
    if ctx
        .op("mkdir", dir.display(), || std::fs::create_dir_all(&dir))
        .is_err()
    {
        return;
    }
    let chunk = ctx.rng.bytes(1 << 20);
    let mut round = 0u64;
    while !ctx.should_stop() {
        round += 1;
        let path = dir.join(format!("fill-{}-{round}", ctx.args.index));
        let Ok(file) = ctx.op("create", path.display(), || File::create(&path)) else {
            break;
        };
        let mut offset = 0u64;
        while offset < ctx.args.file_bytes && !ctx.should_stop() {
            if ctx
                .op("write", path.display(), || {
                    file.write_all_at(&chunk, offset)
                })
                .is_err()
            {
                break;
            }
            offset += chunk.len() as u64;
        }
        let _ = ctx.op("close", path.display(), || close_checked(file));
        let _ = ctx.op("unlink", path.display(), || std::fs::remove_file(&path));
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Write + fsync rounds of the pressure worker at most.
const PRESSURE_ROUNDS_MAX: usize = 8;

pub(super) fn pressure(ctx: &mut Ctx) {
    let dir = ctx.args.mnt.join("pressure");
    let path = dir.join(format!("p{}", ctx.args.index));
    let key = ctx.args.seed ^ 0x9E55_0000 ^ ctx.args.index as u64;
    let Ok(file) = ctx.op("create", path.display(), || {
        std::fs::create_dir_all(&dir)?;
        File::create(&path)
    }) else {
        return;
    };
    let mut chunk = vec![0u8; 1 << 20];
    let mut offset = 0u64;
    // Rounds of write + fsync (each fsync uploads, which allocates in the
    // generation), until the harness stops it or the rounds run out: the
    // OOM fault lowers the limit meanwhile, so some round must hit it.
    for round in 0..PRESSURE_ROUNDS_MAX {
        if round > 0 && ctx.should_stop() {
            break;
        }
        offset = 0;
        while offset < ctx.args.file_bytes {
            fill_content(key, offset, &mut chunk);
            if ctx
                .op("write", path.display(), || {
                    file.write_all_at(&chunk, offset)
                })
                .is_err()
            {
                return;
            }
            offset += chunk.len() as u64;
        }
        if ctx.op("fsync", path.display(), || file.sync_all()).is_err() {
            return;
        }
    }
    if ctx
        .op("close", path.display(), || close_checked(file))
        .is_err()
    {
        return;
    }
    let mut expected = vec![0u8; offset as usize];
    fill_content(key, 0, &mut expected);
    if let Some(got) = ctx.read_direct(&path) {
        ctx.report.acknowledged_bytes_verified += expected.len().min(got.len()) as u64;
        ctx.compare(&path, 0, &expected, &got);
    } else {
        ctx.report.lost_bytes += expected.len() as u64;
    }
}
