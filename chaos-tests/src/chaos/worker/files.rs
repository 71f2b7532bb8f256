//! The large known-content files: `prepare` writes them once before any
//! fault; `reader` reads random blocks (half with O_DIRECT, so they reach
//! the filesystem) and `loader` reads one file sequentially in 1 MiB reads
//! over and over, as several processes loading a model at once do. Every
//! block read is compared with its known content.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};

use super::{big_file, AlignedBuf, Ctx, DIRECT_ALIGN_BYTES, VERIFY_CHUNK_BYTES};
use crate::chaos::rng::{big_file_key, fill_content};

/// `prepare` fsyncs every this many bytes.
const PREPARE_FSYNC_BYTES: u64 = 16 << 20;

pub(super) fn prepare(ctx: &mut Ctx) {
    let dir = ctx.args.mnt.join("data");
    if ctx
        .op("mkdir", dir.display(), || std::fs::create_dir_all(&dir))
        .is_err()
    {
        return;
    }
    for index in 0..ctx.args.big_files {
        let path = big_file(&ctx.args.mnt, index);
        let key = big_file_key(ctx.args.seed, index);
        let Ok(file) = ctx.op("create", path.display(), || File::create(&path)) else {
            return;
        };
        let mut chunk = vec![0u8; VERIFY_CHUNK_BYTES];
        let mut offset = 0u64;
        while offset < ctx.args.big_bytes {
            let len = (ctx.args.big_bytes - offset).min(chunk.len() as u64) as usize;
            fill_content(key, offset, &mut chunk[..len]);
            if ctx
                .op("write", path.display(), || {
                    file.write_all_at(&chunk[..len], offset)
                })
                .is_err()
            {
                return;
            }
            offset += len as u64;
            // Bounded staging use: a file larger than the staging disk
            // cannot be written without fsync (see the report).
            if offset % PREPARE_FSYNC_BYTES == 0
                && ctx.op("fsync", path.display(), || file.sync_all()).is_err()
            {
                return;
            }
        }
        if ctx.op("fsync", path.display(), || file.sync_all()).is_err() {
            return;
        }
    }
}

fn open_big(ctx: &mut Ctx, index: usize, direct: bool) -> Option<File> {
    let path = big_file(&ctx.args.mnt, index);
    let flags = if direct { libc::O_DIRECT } else { 0 };
    ctx.op("open", path.display(), || {
        OpenOptions::new()
            .read(true)
            .custom_flags(flags)
            .open(&path)
    })
    .ok()
}

/// Reads `len` bytes at `offset` of big file `index` and checks them.
fn read_checked(ctx: &mut Ctx, file: &File, index: usize, offset: u64, buf: &mut [u8]) -> bool {
    let path = big_file(&ctx.args.mnt, index);
    let Ok(n) = ctx.op("read", path.display(), || file.read_at(buf, offset)) else {
        return false;
    };
    let expected_len = (ctx.args.big_bytes.saturating_sub(offset)).min(buf.len() as u64) as usize;
    let mut expected = vec![0u8; expected_len];
    fill_content(big_file_key(ctx.args.seed, index), offset, &mut expected);
    ctx.report.read_bytes_verified += n.min(expected_len) as u64;
    ctx.compare(&path, offset, &expected, &buf[..n])
}

pub(super) fn reader(ctx: &mut Ctx) {
    let count = ctx.args.big_files.max(1);
    let mut files = Vec::new();
    for index in 0..count {
        let (Some(cached), Some(direct)) =
            (open_big(ctx, index, false), open_big(ctx, index, true))
        else {
            return;
        };
        files.push((cached, direct));
    }
    let mut buf = AlignedBuf::new(128 << 10);
    let blocks = (ctx.args.big_bytes / DIRECT_ALIGN_BYTES as u64).max(1);
    while !ctx.should_stop() {
        let index = ctx.rng.below(count as u64) as usize;
        let len = [4096usize, 65536, 131072][ctx.rng.below(3) as usize];
        let offset = ctx.rng.below(blocks) * DIRECT_ALIGN_BYTES as u64;
        let direct = ctx.rng.chance(1, 2);
        let (cached, odirect) = &files[index];
        let file = if direct { odirect } else { cached };
        read_checked(ctx, file, index, offset, &mut buf.window()[..len]);
    }
}

pub(super) fn loader(ctx: &mut Ctx) {
    let index = ctx.args.index % ctx.args.big_files.max(1);
    let mut buf = AlignedBuf::new(VERIFY_CHUNK_BYTES);
    while !ctx.should_stop() {
        let Some(file) = open_big(ctx, index, true) else {
            return;
        };
        let mut offset = 0;
        while offset < ctx.args.big_bytes && !ctx.should_stop() {
            if !read_checked(ctx, &file, index, offset, buf.window()) {
                break;
            }
            offset += VERIFY_CHUNK_BYTES as u64;
        }
        if offset >= ctx.args.big_bytes {
            *ctx.report.ops.entry("load_pass".to_string()).or_default() += 1;
        }
    }
}
