//! The operations of [`Staging`]: open and recovery, write, overlay reads,
//! size changes, and the take/clear halves of a flush.

use super::io::{
    fsync_path, open_optional, open_rw, overwrite_in_page, read_padded, remove_optional, replace,
    replace_durable, write_at_reserved,
};
use super::*;

/// One block's share of a byte range.
struct BlockSpan {
    index: u64,
    /// File offset where the block starts.
    block_start: u64,
    /// Range within the block.
    lo: u64,
    hi: u64,
}

impl Staging {
    /// Opens (creating if needed) the staging area in `dir` for volumes
    /// with `block_size_bytes` blocks. Fails if the area was created with
    /// another block size. Opening changes no staged file: a standby
    /// generation opens the area while the serving one still writes to it;
    /// leftovers are cleaned by [`Staging::recover`].
    pub fn open(dir: &Path, block_size_bytes: u64) -> Result<Self> {
        if block_size_bytes == 0 || block_size_bytes > BLOCK_SIZE_BYTES_MAX {
            return Err(BlocksError::InvalidArgument {
                what: format!(
                    "block size {block_size_bytes} must be in 1..={BLOCK_SIZE_BYTES_MAX}"
                ),
            });
        }
        private_fs::create_dir_all(dir)
            .map_err(|e| BlocksError::staging(dir, "create staging dir", dir, e))?;
        let staging = Staging {
            dir: dir.to_path_buf(),
            block_size_bytes,
            stripes: (0..STAGING_LOCK_STRIPE_COUNT)
                .map(|_| Mutex::default())
                .collect(),
            seq_next: AtomicU64::new(1),
            emptied: Mutex::default(),
            owned: AtomicBool::new(false),
        };
        staging.check_format()?;
        staging.check_boot()?;
        staging.note_retired_leftovers();
        Ok(staging)
    }

    /// The staging root directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Block size this area was opened with.
    pub fn block_size_bytes(&self) -> u64 {
        self.block_size_bytes
    }

    /// Inodes with staged data (blocks or a size record), ascending, after
    /// deleting temp files of interrupted (never acknowledged) writes. Call
    /// only when no other process writes to this area: a new generation
    /// calls it once its predecessor is dead, then flushes what that one
    /// acknowledged. Owns the area as [`Staging::own`] does.
    pub fn recover(&self) -> Result<Vec<u64>> {
        let inos = self.list_staged(true)?;
        self.owned.store(true, Ordering::Release);
        Ok(inos)
    }

    /// This process is now the only one writing to the area (its
    /// predecessor is dead, or fenced for a handover): from here on, an
    /// inode neither found now nor staged for since has nothing staged,
    /// without a look at the files (module docs, "Which inodes are
    /// staged"). Returns the inodes with staged data, ascending; changes
    /// no file. Safe to call again (a rolled-back handover).
    pub fn own(&self) -> Result<Vec<u64>> {
        let inos = self.list_staged(false)?;
        self.owned.store(true, Ordering::Release);
        Ok(inos)
    }

    /// Inodes with staged data, ascending, changing nothing: safe while
    /// other threads or processes write.
    pub fn staged_inodes(&self) -> Result<Vec<u64>> {
        self.list_staged(false)
    }

    /// Bytes of staged block files of `inos` (what a failed final flush
    /// leaves on this disk; sparse blocks count by their length).
    pub fn staged_bytes(&self, inos: &[u64]) -> Result<u64> {
        let mut bytes = 0;
        for &ino in inos {
            for index in self.block_indices(ino)? {
                let path = self.block_path(ino, index);
                bytes += match std::fs::metadata(&path) {
                    Ok(meta) => meta.len(),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
                    Err(e) => return Err(self.err("stat staged block", &path, e)),
                };
            }
        }
        Ok(bytes)
    }

    /// What is staged and not uploaded, changing nothing (for metrics,
    /// about once a second): the bytes of every staged block file and the
    /// modification time of the least recently written one (`None` when
    /// nothing is staged). A file removed meanwhile is skipped.
    pub fn pending(&self) -> Result<(u64, Option<std::time::SystemTime>)> {
        let mut bytes = 0;
        let mut oldest: Option<std::time::SystemTime> = None;
        for ino in self.inode_dirs()? {
            for index in self.block_indices(ino)? {
                let path = self.block_path(ino, index);
                let meta = match std::fs::metadata(&path) {
                    Ok(meta) => meta,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(self.err("stat staged block", &path, e)),
                };
                bytes += meta.len();
                if let Ok(modified) = meta.modified() {
                    oldest = Some(oldest.map_or(modified, |o| o.min(modified)));
                }
            }
        }
        Ok((bytes, oldest))
    }

    fn list_staged(&self, clean: bool) -> Result<Vec<u64>> {
        let mut inos = Vec::new();
        for ino in self.inode_dirs()? {
            let mut stripe = self.stripe(ino);
            if clean {
                self.clean_inode_dir(ino)?;
                if !self.inode_dir(ino).exists() {
                    continue;
                }
            }
            if self.record(ino)?.is_some() || !self.block_indices(ino)?.is_empty() {
                stripe.staged.insert(ino);
                inos.push(ino);
            }
        }
        Ok(inos)
    }

    /// Stages `data` at `offset` of inode `ino`. The first time a block
    /// becomes dirty, `base(index)` supplies its committed content (`None`:
    /// hole). Returns once the bytes are in the page cache of the staging
    /// filesystem. ENOSPC is [`BlocksError::StagingFull`], with earlier
    /// staged data intact (space is reserved with `fallocate` before each
    /// `pwrite`; a failed multi-block write may have applied its first blocks).
    ///
    /// `base` runs under this inode's stripe lock: it must read committed
    /// data only (store/cache) and never call back into this `Staging`.
    pub fn write(
        &self,
        ino: u64,
        offset: u64,
        data: &[u8],
        base: &dyn Fn(u64) -> Result<Option<Bytes>>,
    ) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let end = self.checked_end(offset, data.len() as u64)?;
        let mut stripe = self.stripe(ino);
        stripe.staged.insert(ino);
        let rec = self.record(ino)?;
        // A size record is a file in the inode dir, and dirs are retired
        // only empty, under this lock: with one, the dir exists already.
        if rec.is_none() {
            self.ensure_inode_dir(ino)?;
        }
        let floor = rec.and_then(|r| r.floor_bytes);
        for span in self.spans(offset, end) {
            let from = (span.block_start + span.lo - offset) as usize;
            let chunk = &data[from..from + (span.hi - span.lo) as usize];
            let path = self.block_path(ino, span.index);
            match open_rw(&path) {
                Ok(file) => write_at_reserved(&file, span.lo, chunk)
                    .map_err(|e| self.err("write block", &path, e))?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    self.create_block(ino, &span, chunk, floor, base)?
                }
                Err(e) => return Err(self.err("open block", &path, e)),
            }
            let seq = self.seq_next.fetch_add(1, Ordering::Relaxed);
            stripe.block_seq.insert((ino, span.index), seq);
        }
        let size = match rec.map(|r| r.size) {
            None => StagedSize::AtLeast(end),
            Some(StagedSize::AtLeast(s)) => StagedSize::AtLeast(s.max(end)),
            Some(StagedSize::Exact(s)) => StagedSize::Exact(s.max(end)),
        };
        if rec.map(|r| r.size) != Some(size) {
            let (seq, floor_seq) = rec.map_or((1, 0), |r| (r.seq + 1, r.floor_seq));
            self.write_record(
                ino,
                &SizeRecord {
                    size,
                    floor_bytes: floor,
                    seq,
                    floor_seq,
                },
            )?;
        }
        Ok(())
    }

    /// First write to a block: base content (clipped at the floor) plus
    /// `chunk`, written to a temp file and renamed into place so a block
    /// file is never partial.
    fn create_block(
        &self,
        ino: u64,
        span: &BlockSpan,
        chunk: &[u8],
        floor: Option<u64>,
        base: &dyn Fn(u64) -> Result<Option<Bytes>>,
    ) -> Result<()> {
        let dead_from = floor.map(|f| f.saturating_sub(span.block_start));
        let mut committed = match dead_from {
            Some(0) => None,
            _ => base(span.index)?,
        };
        if let Some(b) = &mut committed {
            if b.len() as u64 > self.block_size_bytes {
                return Err(BlocksError::InvalidArgument {
                    what: format!(
                        "base content of inode {ino} block {} is {} bytes, larger than the block size {}",
                        span.index,
                        b.len(),
                        self.block_size_bytes
                    ),
                });
            }
            if let Some(cut) = dead_from {
                b.truncate(cut.min(b.len() as u64) as usize);
            }
        }
        let path = self.block_path(ino, span.index);
        let tmp = path.with_extension(&TMP_SUFFIX[1..]);
        let res = private_fs::create(&tmp).and_then(|f| {
            if let Some(b) = &committed {
                write_at_reserved(&f, 0, b)?;
            }
            write_at_reserved(&f, span.lo, chunk)?;
            fs::rename(&tmp, &path)
        });
        if let Err(e) = res {
            let _ = fs::remove_file(&tmp);
            return Err(self.err("create block", &path, e));
        }
        Ok(())
    }

    /// Staged data overlapping `offset..offset+len`, to lay over committed data.
    pub fn read_overlay(&self, ino: u64, offset: u64, len: u64) -> Result<Overlay> {
        if len > OVERLAY_READ_BYTES_MAX {
            return Err(BlocksError::InvalidArgument {
                what: format!("overlay read of {len} bytes exceeds {OVERLAY_READ_BYTES_MAX}"),
            });
        }
        let stripe = self.stripe(ino);
        if !self.may_be_staged(&stripe, ino) {
            return Ok(Overlay::default());
        }
        let rec = self.record(ino)?;
        let mut overlay = Overlay {
            size: rec.map(|r| r.size),
            segments: Vec::new(),
        };
        let mut end = offset.saturating_add(len);
        if let Some(StagedSize::Exact(s)) = overlay.size {
            end = end.min(s);
        }
        let floor = rec.and_then(|r| r.floor_bytes);
        for span in self.spans(offset, end) {
            let path = self.block_path(ino, span.index);
            let file = open_optional(&path).map_err(|e| self.err("open block", &path, e))?;
            let (lo, data) = match (file, floor) {
                (Some(f), _) => {
                    let bytes = read_padded(&f, span.lo, (span.hi - span.lo) as usize)
                        .map_err(|e| self.err("read block", &path, e))?;
                    (span.lo, bytes)
                }
                (None, Some(fl)) if fl < span.block_start + span.hi => {
                    let lo = span.lo.max(fl.saturating_sub(span.block_start));
                    (lo, vec![0u8; (span.hi - lo) as usize])
                }
                (None, _) => continue,
            };
            overlay.segments.push(OverlaySegment {
                offset: span.block_start + lo,
                data: Bytes::from(data),
            });
        }
        Ok(overlay)
    }

    /// Sets the logical size (truncate or extend). Staged blocks past the
    /// new size are dropped or cut, and the truncation floor is lowered to
    /// `size_bytes` so committed data past it reads as zeros until commit.
    pub fn set_size(&self, ino: u64, size_bytes: u64) -> Result<()> {
        if size_bytes > FILE_SIZE_BYTES_MAX {
            return Err(BlocksError::InvalidArgument {
                what: format!("size {size_bytes} exceeds {FILE_SIZE_BYTES_MAX}"),
            });
        }
        let mut stripe = self.stripe(ino);
        stripe.staged.insert(ino);
        self.ensure_inode_dir(ino)?;
        for index in self.block_indices(ino)? {
            let block_start = index.saturating_mul(self.block_size_bytes);
            let path = self.block_path(ino, index);
            if block_start >= size_bytes {
                remove_optional(&path).map_err(|e| self.err("remove block", &path, e))?;
                stripe.block_seq.remove(&(ino, index));
            } else if size_bytes - block_start < self.block_size_bytes {
                let keep = size_bytes - block_start;
                let file = open_rw(&path).map_err(|e| self.err("open block", &path, e))?;
                let len = file
                    .metadata()
                    .map_err(|e| self.err("stat block", &path, e))?
                    .len();
                if len > keep {
                    file.set_len(keep)
                        .map_err(|e| self.err("truncate block", &path, e))?;
                    let seq = self.seq_next.fetch_add(1, Ordering::Relaxed);
                    stripe.block_seq.insert((ino, index), seq);
                }
            }
        }
        let rec = self.record(ino)?;
        let seq = rec.map_or(1, |r| r.seq + 1);
        let (floor_bytes, floor_seq) =
            match rec.and_then(|r| r.floor_bytes.map(|f| (f, r.floor_seq))) {
                Some((f, fseq)) if f < size_bytes => (f, fseq),
                _ => (size_bytes, seq),
            };
        let new = SizeRecord {
            size: StagedSize::Exact(size_bytes),
            floor_bytes: Some(floor_bytes),
            seq,
            floor_seq,
        };
        tracing::debug!(
            ino,
            size_bytes,
            floor_bytes,
            "staged size set (truncation floor)"
        );
        self.write_record(ino, &new)
    }

    /// The staged size of `ino`, if any.
    pub fn staged_size(&self, ino: u64) -> Result<Option<StagedSize>> {
        let stripe = self.stripe(ino);
        if !self.may_be_staged(&stripe, ino) {
            return Ok(None);
        }
        Ok(self.record(ino)?.map(|r| r.size))
    }

    /// Whether `ino` has nothing staged: no block and no size record.
    /// Answered from memory once the area is owned.
    pub fn is_unstaged(&self, ino: u64) -> Result<bool> {
        let stripe = self.stripe(ino);
        if !self.may_be_staged(&stripe, ino) {
            return Ok(true);
        }
        Ok(self.record(ino)?.is_none() && self.block_indices(ino)?.is_empty())
    }

    /// Indices of the staged (dirty) blocks of `ino`, ascending.
    pub fn dirty_blocks(&self, ino: u64) -> Result<Vec<u64>> {
        let stripe = self.stripe(ino);
        if !self.may_be_staged(&stripe, ino) {
            return Ok(Vec::new());
        }
        self.block_indices(ino)
    }

    /// Reads up to [`UPLOAD_SET_BLOCK_COUNT_MAX`] staged blocks (lowest
    /// indices first) and the size record of `ino` for upload and commit.
    /// Nothing is removed: call [`Staging::clear`] after the commit.
    pub fn take_for_upload(&self, ino: u64) -> Result<UploadSet> {
        let stripe = self.stripe(ino);
        if !self.may_be_staged(&stripe, ino) {
            return Ok(UploadSet {
                ino,
                size: None,
                floor_bytes: None,
                blocks: Vec::new(),
                complete: true,
                record_seq: None,
                floor_seq: 0,
            });
        }
        let rec = self.record(ino)?;
        let indices = self.block_indices(ino)?;
        let mut blocks = Vec::new();
        for &index in indices.iter().take(UPLOAD_SET_BLOCK_COUNT_MAX) {
            let path = self.block_path(ino, index);
            let data = fs::read(&path).map_err(|e| self.err("read block", &path, e))?;
            // Invariant: a staged block never exceeds the block size.
            assert!(
                data.len() as u64 <= self.block_size_bytes,
                "staged block {} too long",
                path.display()
            );
            let seq = stripe.block_seq.get(&(ino, index)).copied().unwrap_or(0);
            blocks.push(StagedBlock {
                index,
                data: Bytes::from(data),
                seq,
            });
        }
        Ok(UploadSet {
            ino,
            size: rec.map(|r| r.size),
            floor_bytes: rec.and_then(|r| r.floor_bytes),
            blocks,
            complete: indices.len() <= UPLOAD_SET_BLOCK_COUNT_MAX,
            record_seq: rec.map(|r| r.seq),
            floor_seq: rec.map_or(0, |r| r.floor_seq),
        })
    }

    /// Removes what `set` took, after the caller committed it. Blocks or
    /// records changed since the take stay staged for the next flush.
    pub fn clear(&self, set: &UploadSet) -> Result<()> {
        self.clear_with(set, &|| {})
    }

    /// [`Staging::clear`], calling `between` after the size record was
    /// settled and before any block file is removed (a test hook).
    ///
    /// The record goes first: its truncation floor was applied by the
    /// commit, and a floor that outlived the blocks written past it would
    /// make the next flush cut the committed data at the floor again, data
    /// the application wrote after the truncation. So a crash in between
    /// leaves blocks without the record (recommitted as they are, the same
    /// bytes), and a failed record write (a full disk) leaves both.
    pub fn clear_with(&self, set: &UploadSet, between: &dyn Fn()) -> Result<()> {
        let ino = set.ino;
        let mut stripe = self.stripe(ino);
        if !self.may_be_staged(&stripe, ino) {
            return Ok(());
        }
        let unchanged: Vec<u64> = set
            .blocks
            .iter()
            .filter(|b| {
                let current = stripe.block_seq.get(&(ino, b.index)).copied();
                current.unwrap_or(0) == b.seq
            })
            .map(|b| b.index)
            .collect();
        let remaining: Vec<u64> = self
            .block_indices(ino)?
            .into_iter()
            .filter(|index| !unchanged.contains(index))
            .collect();
        if let Some(rec) = self.record(ino)? {
            if Some(rec.seq) == set.record_seq && remaining.is_empty() {
                let path = self.inode_dir(ino).join(SIZE_FILE);
                remove_optional(&path).map_err(|e| self.err("remove size record", &path, e))?;
            } else if rec.floor_bytes.is_some()
                && set.floor_bytes.is_some()
                && rec.floor_seq == set.floor_seq
            {
                let new = SizeRecord {
                    floor_bytes: None,
                    seq: rec.seq + 1,
                    ..rec
                };
                self.write_record(ino, &new)?;
            }
        }
        between();
        for index in unchanged {
            let path = self.block_path(ino, index);
            remove_optional(&path).map_err(|e| self.err("remove block", &path, e))?;
            stripe.block_seq.remove(&(ino, index));
        }
        if remaining.is_empty() && self.record(ino)?.is_none() {
            stripe.staged.remove(&ino);
            // Retired later, off the request path (`retire.rs`).
            self.note_emptied(ino);
        }
        Ok(())
    }

    /// Drops everything staged for `ino` (the file was deleted): its
    /// directory moves into `retired/` at once and is removed later.
    pub fn discard(&self, ino: u64) -> Result<()> {
        let mut stripe = self.stripe(ino);
        stripe.block_seq.retain(|(i, _), _| *i != ino);
        if !self.may_be_staged(&stripe, ino) {
            return Ok(());
        }
        self.retire_now(ino)?;
        stripe.staged.remove(&ino);
        Ok(())
    }

    /// Makes the staged data of `ino` durable against power loss (FUSE fsync).
    pub fn sync(&self, ino: u64) -> Result<()> {
        let _guard = self.stripe(ino);
        let dir = self.inode_dir(ino);
        if !dir.exists() {
            return Ok(());
        }
        let entries = fs::read_dir(&dir).map_err(|e| self.err("list inode dir", &dir, e))?;
        for entry in entries {
            let path = entry
                .map_err(|e| self.err("list inode dir", &dir, e))?
                .path();
            fsync_path(&path).map_err(|e| self.err("fsync", &path, e))?;
        }
        fsync_path(&dir).map_err(|e| self.err("fsync", &dir, e))?;
        fsync_path(&self.dir).map_err(|e| self.err("fsync", &self.dir, e))
    }
}

// Private helpers.
impl Staging {
    pub(super) fn err(&self, op: &'static str, path: &Path, e: std::io::Error) -> BlocksError {
        BlocksError::staging(&self.dir, op, path, e)
    }

    pub(super) fn stripe(&self, ino: u64) -> MutexGuard<'_, Stripe> {
        let m = &self.stripes[(ino % STAGING_LOCK_STRIPE_COUNT as u64) as usize];
        // The on-disk state is authoritative; the seq map and the staged
        // set only get stale entries from a panic, which at worst keep a
        // block staged longer or cost a look at the files.
        m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether `ino` may have staged files: always, until [`Staging::own`]
    /// (module docs, "Which inodes are staged"). `stripe`: its, locked.
    fn may_be_staged(&self, stripe: &Stripe, ino: u64) -> bool {
        !self.owned.load(Ordering::Acquire) || stripe.staged.contains(&ino)
    }

    fn checked_end(&self, offset: u64, len: u64) -> Result<u64> {
        match offset.checked_add(len) {
            Some(end) if end <= FILE_SIZE_BYTES_MAX => Ok(end),
            _ => Err(BlocksError::InvalidArgument {
                what: format!(
                    "write of {len} bytes at offset {offset} exceeds {FILE_SIZE_BYTES_MAX}"
                ),
            }),
        }
    }

    /// Splits `offset..end` over blocks.
    fn spans(&self, offset: u64, end: u64) -> Vec<BlockSpan> {
        let bs = self.block_size_bytes;
        let mut spans = Vec::new();
        let mut pos = offset;
        while pos < end {
            let index = pos / bs;
            let block_start = index * bs;
            let hi = (end - block_start).min(bs);
            spans.push(BlockSpan {
                index,
                block_start,
                lo: pos - block_start,
                hi,
            });
            pos = block_start + hi;
        }
        spans
    }

    pub(super) fn inode_dir(&self, ino: u64) -> PathBuf {
        self.dir.join(format!("{ino:016x}"))
    }

    fn block_path(&self, ino: u64, index: u64) -> PathBuf {
        self.inode_dir(ino)
            .join(format!("{index:08x}{BLOCK_SUFFIX}"))
    }

    fn ensure_inode_dir(&self, ino: u64) -> Result<()> {
        let dir = self.inode_dir(ino);
        private_fs::create_dir_all(&dir).map_err(|e| self.err("create inode dir", &dir, e))
    }

    fn record(&self, ino: u64) -> Result<Option<SizeRecord>> {
        let path = self.inode_dir(ino).join(SIZE_FILE);
        match fs::read(&path) {
            Ok(buf) => SizeRecord::decode(&buf, &path).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.err("read size record", &path, e)),
        }
    }

    /// Writes a new record with write-then-rename, and rewrites an existing
    /// one in place (`record.rs` says why that is safe).
    fn write_record(&self, ino: u64, rec: &SizeRecord) -> Result<()> {
        let dir = self.inode_dir(ino);
        let path = dir.join(SIZE_FILE);
        let buf: [u8; RECORD_BYTES] = rec.encode();
        let written = match overwrite_in_page(&path, &buf) {
            Ok(true) => Ok(()),
            Ok(false) => replace(&path, &dir.join(format!("{SIZE_FILE}{TMP_SUFFIX}")), &buf),
            Err(e) => Err(e),
        };
        written.map_err(|e| self.err("write size record", &path, e))
    }

    fn block_indices(&self, ino: u64) -> Result<Vec<u64>> {
        let dir = self.inode_dir(ino);
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(self.err("list inode dir", &dir, e)),
        };
        let mut indices = Vec::new();
        for entry in entries {
            let name = entry
                .map_err(|e| self.err("list inode dir", &dir, e))?
                .file_name();
            let name = name.to_string_lossy();
            if let Some(hex) = name.strip_suffix(BLOCK_SUFFIX) {
                if let Ok(index) = u64::from_str_radix(hex, 16) {
                    indices.push(index);
                }
            }
        }
        indices.sort_unstable();
        Ok(indices)
    }

    pub(super) fn inode_dirs(&self) -> Result<Vec<u64>> {
        let entries =
            fs::read_dir(&self.dir).map_err(|e| self.err("list staging dir", &self.dir, e))?;
        let mut inos = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| self.err("list staging dir", &self.dir, e))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.len() == 16 && entry.path().is_dir() {
                if let Ok(ino) = u64::from_str_radix(&name, 16) {
                    inos.push(ino);
                }
            }
        }
        inos.sort_unstable();
        Ok(inos)
    }

    /// Deletes temp files (interrupted writes, never acknowledged) and
    /// retires the directory if nothing staged is left.
    fn clean_inode_dir(&self, ino: u64) -> Result<()> {
        let dir = self.inode_dir(ino);
        let entries = fs::read_dir(&dir).map_err(|e| self.err("list inode dir", &dir, e))?;
        let mut staged = false;
        for entry in entries {
            let path = entry
                .map_err(|e| self.err("list inode dir", &dir, e))?
                .path();
            if path.to_string_lossy().ends_with(TMP_SUFFIX) {
                tracing::info!(path = %path.display(), "removing interrupted staging temp file");
                remove_optional(&path).map_err(|e| self.err("remove temp file", &path, e))?;
            } else {
                staged = true;
            }
        }
        if !staged {
            self.retire_now(ino)?;
        }
        Ok(())
    }

    fn check_format(&self) -> Result<()> {
        let path = self.dir.join(FORMAT_FILE);
        let want = format!(
            "{FORMAT_MAGIC}\nblock_size_bytes={}\n",
            self.block_size_bytes
        );
        // Written durably (below); an empty file is one a power cut took
        // before its bytes reached the disk (older versions wrote it
        // without a sync): written again.
        match fs::read_to_string(&path) {
            Ok(have) if have == want => Ok(()),
            Ok(have) if have.is_empty() => {
                tracing::warn!(path = %path.display(), "staging format file empty (a power cut before it reached the disk); writing it again");
                self.write_format(&path, &want)
            }
            Ok(have) => Err(BlocksError::InvalidArgument {
                what: format!(
                    "staging dir {} has format {have:?} but this volume needs {want:?}; flush it with the settings that wrote it, or move it aside",
                    self.dir.display()
                ),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => self.write_format(&path, &want),
            Err(e) => Err(self.err("read format file", &path, e)),
        }
    }

    fn write_format(&self, path: &Path, want: &str) -> Result<()> {
        // Several generations may open the area at once: each writes its own temp file.
        let tmp = self
            .dir
            .join(format!("{FORMAT_FILE}.{}{TMP_SUFFIX}", std::process::id()));
        replace_durable(path, &tmp, want.as_bytes())
            .map_err(|e| self.err("write format file", path, e))
    }
}
