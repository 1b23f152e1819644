//! Installing a transferred SEGMENT_LOG from a file by chunk (decision 284): the receiver
//! staged it in the partition directory; its batches are re-verified and written through a
//! fresh log in place of the old segments, holding one chunk and one flush at a time, so a
//! partition of N bytes costs O(chunk) memory, not O(N).

use super::{FlushPolicy, PartitionLog, SegmentError, SegmentRecovery, batch};
use crate::storage::{OpenMode, SECTOR, Storage, read_exact_at, sector_ceil};

/// Bytes read from the staged file per call.
const CHUNK: usize = 1 << 20;

/// Replaces the segments of `prefix` with the batches of the staged file `staged` (its first
/// `len` bytes: whole batches from offset `frontier` on, contiguous), then reopens the log with
/// `offset_frontier`. The staged file is removed once the new segments are synced. A batch
/// that does not verify or does not follow is an error before anything old is removed.
pub async fn install_from_file<S: Storage + Clone>(
    storage: S,
    prefix: &str,
    policy: FlushPolicy,
    staged: &str,
    frontier: u64,
    len: u64,
    offset_frontier: u64,
) -> Result<(PartitionLog<S>, SegmentRecovery), SegmentError> {
    let file = storage.open(staged, OpenMode::Existing).await?;
    // Pass 1: verify (nothing old is touched until the whole file is sound).
    let end = verify_batches(&storage, &file, len, frontier).await?;
    if end > offset_frontier {
        return Err(SegmentError::Offset {
            base_offset: end,
            expected: offset_frontier,
        });
    }
    for name in storage.list().await? {
        let ours = name
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.ends_with(".log") || rest.ends_with(".index"));
        if ours {
            storage.remove(&name).await?;
        }
    }
    let (mut log, _) =
        PartitionLog::open_inner(storage.clone(), prefix, policy, frontier, false).await?;
    // Pass 2: write through the log, flushing as the batches accumulate.
    write_batches(&storage, &file, len, &mut log).await?;
    log.sync().await?;
    drop(file);
    storage.remove(staged).await?;
    drop(log);
    PartitionLog::open(storage, prefix, policy, offset_frontier).await
}

/// Checks every batch of the first `len` bytes of `file` verifies and follows the one before
/// from `frontier`; returns the offset after the last.
async fn verify_batches<S: Storage>(
    storage: &S,
    file: &S::File,
    len: u64,
    frontier: u64,
) -> Result<u64, SegmentError> {
    let mut reader = Chunks::new(len);
    let mut next = frontier;
    while let Some((position, bytes)) = reader.next(storage, file).await? {
        let info = batch::verify(bytes).map_err(|fault| SegmentError::Corrupt {
            base: frontier,
            position,
            fault,
        })?;
        if info.base_offset != next {
            return Err(SegmentError::Offset {
                base_offset: info.base_offset,
                expected: next,
            });
        }
        next = info.end_offset();
    }
    Ok(next)
}

async fn write_batches<S: Storage>(
    storage: &S,
    file: &S::File,
    len: u64,
    log: &mut PartitionLog<S>,
) -> Result<(), SegmentError> {
    let mut reader = Chunks::new(len);
    while let Some((_, bytes)) = reader.next(storage, file).await? {
        log.commit_batch(bytes.to_vec())?;
        if log.should_flush(0, 0) {
            log.flush().await?;
        }
    }
    Ok(())
}

/// Whole batches of a file read by chunk.
struct Chunks {
    len: u64,
    /// File position of `window[0]` (sector aligned when read).
    window_at: u64,
    window: Vec<u8>,
    at: u64,
}

impl Chunks {
    fn new(len: u64) -> Chunks {
        Chunks {
            len,
            window_at: 0,
            window: Vec::new(),
            at: 0,
        }
    }

    async fn fill<S: Storage>(
        &mut self,
        storage: &S,
        file: &S::File,
        need: usize,
    ) -> Result<bool, SegmentError> {
        let from = (self.at - self.window_at) as usize;
        if self.window.len() >= from + need {
            return Ok(true);
        }
        // Re-read from the sector holding `at` (aligned for O_DIRECT).
        let start = self.at / SECTOR as u64 * SECTOR as u64;
        let want = need.max(CHUNK) + (self.at - start) as usize;
        let mut buf = vec![0u8; sector_ceil(want as u64) as usize];
        let n = read_exact_at(storage, file, start, &mut buf).await?;
        buf.truncate(n.min((self.len - start) as usize));
        self.window = buf;
        self.window_at = start;
        Ok(self.window.len() >= (self.at - start) as usize + need)
    }

    async fn next<S: Storage>(
        &mut self,
        storage: &S,
        file: &S::File,
    ) -> Result<Option<(u64, &[u8])>, SegmentError> {
        if self.at >= self.len {
            return Ok(None);
        }
        let corrupt = |at, fault| SegmentError::Corrupt {
            base: 0,
            position: at,
            fault,
        };
        let head = batch::BATCH_HEADER.min((self.len - self.at) as usize);
        if !self.fill(storage, file, head).await? {
            return Err(corrupt(self.at, batch::BatchFault::Truncated));
        }
        let from = (self.at - self.window_at) as usize;
        let info = batch::peek(&self.window[from..])
            .ok_or(corrupt(self.at, batch::BatchFault::Truncated))?;
        if info.len > self.len - self.at || !self.fill(storage, file, info.len as usize).await? {
            return Err(corrupt(self.at, batch::BatchFault::Truncated));
        }
        let position = self.at;
        let from = (self.at - self.window_at) as usize;
        self.at += info.len;
        Ok(Some((
            position,
            &self.window[from..from + info.len as usize],
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::build;
    use crate::mem::MemStorage;
    use crate::storage::block_on;

    const POLICY: FlushPolicy = FlushPolicy {
        enforce_fsync: true,
        messages_required_to_save: 4,
        size_of_messages_required_to_save: 1 << 20,
        segment_size: 64 * 1024,
    };

    fn batches(from: u64, n: u64) -> Vec<u8> {
        let mut out = Vec::new();
        for i in 0..n {
            let o = from + i * 2;
            let a = vec![(o % 251) as u8; 700 + (o as usize * 31) % 900];
            out.extend_from_slice(&build(1, o, 1_000 + o, &[&a, b"tail"]));
        }
        out
    }

    fn stage(disk: &MemStorage, name: &str, bytes: &[u8]) {
        block_on(async {
            let f = disk.open(name, OpenMode::Create).await.unwrap();
            let mut buf = crate::file::AlignedBuf::zeroed(sector_ceil(bytes.len() as u64) as usize);
            buf.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
            disk.write_at(&f, 0, buf.as_slice()).await.unwrap();
        });
    }

    /// A staged log several chunks long (batches straddling every chunk edge) replaces the old
    /// segments, reads back byte for byte across rotated segments, and its file is removed;
    /// a damaged or misnumbered staged log is refused before anything old is touched.
    #[test]
    fn a_staged_log_installs_by_chunk_and_a_bad_one_changes_nothing() {
        let disk = MemStorage::new();
        let (mut old, _) = block_on(PartitionLog::open(disk.clone(), "p1-", POLICY, 0)).unwrap();
        let before = batches(0, 10);
        let mut at = 0;
        while at < before.len() {
            let info = batch::peek(&before[at..]).unwrap();
            old.commit_batch(before[at..at + info.len as usize].to_vec())
                .unwrap();
            at += info.len as usize;
        }
        block_on(old.sync()).unwrap();
        drop(old);

        let staged = batches(500, 1500);
        assert!(staged.len() > 2 * CHUNK);
        // Damaged: one byte deep inside, in the second chunk.
        let mut bad = staged.clone();
        bad[CHUNK + 5000] ^= 1;
        stage(&disk, "t1.install", &bad);
        let refused = block_on(install_from_file(
            disk.clone(),
            "p1-",
            POLICY,
            "t1.install",
            500,
            bad.len() as u64,
            3500,
        ));
        assert!(
            matches!(refused, Err(SegmentError::Corrupt { .. })),
            "{refused:?}"
        );
        // Misnumbered: the frontier does not match the first batch.
        stage(&disk, "t1.install", &staged);
        let refused = block_on(install_from_file(
            disk.clone(),
            "p1-",
            POLICY,
            "t1.install",
            498,
            staged.len() as u64,
            3500,
        ));
        assert!(
            matches!(refused, Err(SegmentError::Offset { .. })),
            "{refused:?}"
        );
        let (old, _) = block_on(PartitionLog::open(disk.clone(), "p1-", POLICY, 0)).unwrap();
        assert_eq!(block_on(old.read_from_offset(0, u64::MAX)).unwrap(), before);
        drop(old);

        let (log, _) = block_on(install_from_file(
            disk.clone(),
            "p1-",
            POLICY,
            "t1.install",
            500,
            staged.len() as u64,
            3500,
        ))
        .unwrap();
        assert!(
            log.segment_bases().len() > 1,
            "rotated: {:?}",
            log.segment_bases()
        );
        assert_eq!(log.next_offset(), 3500);
        assert_eq!(block_on(log.read_from_offset(0, u64::MAX)).unwrap(), staged);
        assert!(
            !block_on(disk.list())
                .unwrap()
                .iter()
                .any(|n| n == "t1.install")
        );
    }
}
