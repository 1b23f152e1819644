//! Sealing a full segment apart from the flushes (decision 355).
//!
//! A sealed segment is synced before the next one exists (the module rule of `segment.rs`: a
//! crash never leaves data after a hole). Done inline, that first sync of a segment written
//! without `enforce_fsync` is awaited by whoever called `flush`: on the node, the shard's
//! storage task, so every group of the shard waits for one group's seal. With
//! [`PartitionLog::seal_apart`] the flush that fills a segment only marks it sealing and
//! returns; [`PartitionLog::take_seal`] hands the two syncs out as a [`SealJob`] the caller runs
//! as its own task, and [`PartitionLog::sealed`] creates the next segment once the job is done.
//! Meanwhile the log's later committed batches stay held in memory (they are durable in the
//! caller's WAL, and `synced_offset` does not pass the sealed segment's end, so the WAL is not
//! reclaimed above them); a forced point ([`PartitionLog::sync`]) finishes the seal itself and
//! the job's late answer is ignored. The rule on disk is unchanged, so recovery is too.

use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{PartitionLog, SegmentError};
use crate::storage::{Storage, StorageError};

/// Tokens of handed-out jobs, unique in the process (a job of a log since replaced by an
/// install is told from the new log's own).
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

/// One `fdatasync` pair of a segment's `.log` and `.index`: how long it took and how many
/// bytes were written to the segment since its last sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncTiming {
    /// Wall time of the two syncs.
    pub elapsed: Duration,
    /// Bytes flushed since the files' previous sync.
    pub bytes: u64,
}

/// The sealing state of a log.
#[derive(Debug, Default)]
pub(super) struct SealState {
    /// Seals run as [`SealJob`]s.
    pub(super) apart: bool,
    /// A full segment waits for its sync; the next segment starts at this offset.
    pub(super) sealing: Option<u64>,
    /// The token of the job handed out for it.
    pub(super) job: Option<u64>,
    /// Bytes flushed since the active segment's last sync.
    pub(super) dirty: u64,
    /// Segment syncs done since the last [`PartitionLog::take_sync_timings`].
    pub(super) timings: Vec<SyncTiming>,
}

impl SealState {
    pub(super) fn timed(&mut self, elapsed: Duration, bytes: u64) {
        self.dirty = 0;
        self.timings.push(SyncTiming { elapsed, bytes });
    }
}

/// The syncs of a sealed segment, to run apart from the log.
pub struct SealJob<S: Storage> {
    storage: S,
    log: Rc<S::File>,
    idx: Rc<S::File>,
    end: u64,
    bytes: u64,
    token: u64,
}

impl<S: Storage> std::fmt::Debug for SealJob<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealJob")
            .field("end", &self.end)
            .field("bytes", &self.bytes)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

/// A finished [`SealJob`], for [`PartitionLog::sealed`].
#[derive(Debug)]
pub struct SealDone {
    token: u64,
    end: u64,
    /// The syncs' outcome.
    pub result: Result<(), StorageError>,
    /// Their timing.
    pub timing: SyncTiming,
}

impl<S: Storage> SealJob<S> {
    /// The offset after the sealed segment.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// Syncs the sealed segment's `.log` and `.index`.
    pub async fn run(self) -> SealDone {
        let started = Instant::now();
        let result = match self.storage.sync(&self.log).await {
            Ok(()) => self.storage.sync(&self.idx).await,
            Err(e) => Err(e),
        };
        SealDone {
            token: self.token,
            end: self.end,
            result,
            timing: SyncTiming {
                elapsed: started.elapsed(),
                bytes: self.bytes,
            },
        }
    }
}

impl<S: Storage> PartitionLog<S> {
    /// From now on a full segment is sealed by a [`SealJob`] the caller runs (module docs).
    pub fn seal_apart(&mut self) {
        self.seal.apart = true;
    }

    /// A full segment waits for its sync (batches are held until it is done).
    pub fn is_sealing(&self) -> bool {
        self.seal.sealing.is_some()
    }

    /// The job that syncs the segment waiting to be sealed, once per seal.
    pub fn take_seal(&mut self) -> Option<SealJob<S>>
    where
        S: Clone,
    {
        let end = self.seal.sealing?;
        if self.seal.job.is_some() {
            return None;
        }
        let seg = self.segments.last().expect("a sealing segment");
        let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
        self.seal.job = Some(token);
        let bytes = std::mem::take(&mut self.seal.dirty);
        Some(SealJob {
            storage: self.storage.clone(),
            log: Rc::clone(&seg.log),
            idx: Rc::clone(&seg.idx),
            end,
            bytes,
            token,
        })
    }

    /// A job's answer: on success the sealed segment is synced, the next segment is created and
    /// the held batches are flushed (returns `true`); a stale answer (the seal was finished by
    /// a forced sync, or the log was replaced) changes nothing (`false`). A failed sync is an
    /// error (the caller fail-stops; nothing past the sealed segment was written).
    pub async fn sealed(&mut self, done: SealDone) -> Result<bool, SegmentError> {
        if self.seal.job != Some(done.token) || self.seal.sealing != Some(done.end) {
            return Ok(false);
        }
        // The job's timing is its caller's to record (it holds `done.timing`).
        done.result?;
        self.seal.job = None;
        self.seal.sealing = None;
        self.synced_offset = self.synced_offset.max(done.end);
        self.start_segment(done.end).await?;
        self.flush().await?;
        Ok(true)
    }

    /// The segment syncs done since the last call, oldest first.
    pub fn take_sync_timings(&mut self) -> Vec<SyncTiming> {
        std::mem::take(&mut self.seal.timings)
    }

    /// The reservations of blocks ahead that failed since the last call, oldest first
    /// (decision 515: the caller says so; the appends go on).
    pub fn take_reserve_failures(&mut self) -> Vec<super::ReserveFailure> {
        std::mem::take(&mut self.reserve_failures)
    }

    /// Syncs the last segment (sealed) inline; everything written is then synced.
    pub(super) async fn sync_sealed(&mut self) -> Result<(), SegmentError> {
        let started = Instant::now();
        let seg = self.segments.last().expect("a segment");
        self.storage.sync(&seg.log).await?;
        self.storage.sync(&seg.idx).await?;
        self.synced_offset = seg.end_offset;
        let bytes = self.seal.dirty;
        self.seal.timed(started.elapsed(), bytes);
        Ok(())
    }

    /// Bytes flushed since the active segment's last sync.
    pub(super) fn unsynced_bytes(&self) -> u64 {
        self.seal.dirty
    }
}

#[cfg(test)]
mod tests {
    use super::super::{FlushPolicy, PartitionLog, SegmentRecovery};
    use crate::batch::build;
    use crate::mem::{CrashMode, MemStorage, Prng};
    use crate::storage::block_on;

    /// No fsync per flush: the seal's sync is the only one a segment gets.
    const POLICY: FlushPolicy = FlushPolicy {
        enforce_fsync: false,
        messages_required_to_save: 4,
        size_of_messages_required_to_save: 1 << 20,
        segment_size: 16 * 1024,
    };

    fn open(disk: &MemStorage) -> (PartitionLog<MemStorage>, SegmentRecovery) {
        let (mut log, recovery) =
            block_on(PartitionLog::open(disk.clone(), "p1-", POLICY, 0)).unwrap();
        log.seal_apart();
        (log, recovery)
    }

    /// Commits one batch of 3 messages and flushes when the policy says.
    fn commit_one(log: &mut PartitionLog<MemStorage>) {
        let next = log.next_offset();
        let payloads: Vec<Vec<u8>> = (0..3).map(|i| vec![(next + i) as u8; 500]).collect();
        let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
        log.commit_batch(build(1, next, 1_000 + next, &refs))
            .unwrap();
        if log.should_flush(0, 0) {
            block_on(log.flush()).unwrap();
        }
    }

    /// Commits until the active segment fills and waits for its seal.
    fn fill_to_seal(log: &mut PartitionLog<MemStorage>) {
        while !log.is_sealing() {
            commit_one(log);
        }
    }

    /// The steps of a seal apart, a crash after each (every crash mode, several seeds): the
    /// recovered log holds everything up to the synced offset the log reported at the crash
    /// (what WAL reclamation trusts), and never data after a hole.
    #[test]
    fn a_crash_at_any_step_of_a_seal_apart_keeps_the_synced_prefix_and_no_hole() {
        for mode in [
            CrashMode::LoseUnsynced,
            CrashMode::TornPrefix,
            CrashMode::TornLast,
            CrashMode::Reorder,
        ] {
            for seed in 0..16 {
                for step in 0..4 {
                    let disk = MemStorage::new();
                    let (mut log, _) = open(&disk);
                    fill_to_seal(&mut log);
                    let job = log.take_seal().expect("a seal to run");
                    let end = job.end();
                    // Held: the flushes after the seal write nothing yet.
                    let extents_end = |log: &PartitionLog<MemStorage>| {
                        log.extents().last().map_or(0, |e| e.end_offset)
                    };
                    for _ in 0..10 {
                        commit_one(&mut log);
                    }
                    assert_eq!(extents_end(&log), end, "batches held while sealing");
                    assert!(
                        log.synced_offset() < end,
                        "nothing synced past the seal yet"
                    );
                    let all = block_on(log.read_from_offset(0, u64::MAX)).unwrap();
                    assert!(!all.is_empty(), "held batches are still readable");
                    assert!(log.take_seal().is_none(), "one job per seal");
                    // Step 0: crash before the job ran. Step 1: its syncs returned, its
                    // answer not applied. Step 2: applied (the next segment exists, the held
                    // batches are written, unsynced). Step 3: the next seal under way too.
                    let mut durable = end.min(log.synced_offset());
                    if step >= 1 {
                        let done = block_on(job.run());
                        durable = end;
                        if step >= 2 {
                            assert!(block_on(log.sealed(done)).unwrap());
                            assert_eq!(log.synced_offset(), end);
                            assert!(extents_end(&log) > end, "held batches written");
                            assert!(log.segment_bases().contains(&end));
                        }
                        if step == 3 {
                            fill_to_seal(&mut log);
                            let _ = log.take_seal().expect("the next seal");
                        }
                    }
                    let synced_at_crash = log.synced_offset();
                    disk.crash(mode, &mut Prng::new(seed));
                    let (reopened, recovery) = open(&disk);
                    assert!(
                        recovery.damage.is_empty(),
                        "{mode:?} seed {seed} step {step}: {:?}",
                        recovery.damage
                    );
                    assert!(
                        reopened.next_offset() >= synced_at_crash.max(durable),
                        "{mode:?} seed {seed} step {step}: recovered {} < synced {} / {}",
                        reopened.next_offset(),
                        synced_at_crash,
                        durable
                    );
                }
            }
        }
    }

    /// A forced sync while a seal job is out finishes the seal itself (the next segment, the
    /// held batches, all synced); the job's late answer changes nothing.
    #[test]
    fn a_forced_sync_finishes_the_seal_and_the_late_job_is_ignored() {
        let disk = MemStorage::new();
        let (mut log, _) = open(&disk);
        fill_to_seal(&mut log);
        let job = log.take_seal().unwrap();
        let end = job.end();
        for _ in 0..5 {
            commit_one(&mut log);
        }
        let next = log.next_offset();
        assert_eq!(block_on(log.sync()).unwrap(), next);
        assert!(!log.is_sealing());
        let bases = log.segment_bases();
        assert_eq!(*bases.last().unwrap(), end);
        let done = block_on(job.run());
        assert!(!block_on(log.sealed(done)).unwrap(), "stale answer");
        assert_eq!(
            log.segment_bases(),
            bases,
            "no second segment at the same base"
        );
        commit_one(&mut log);
        disk.crash(CrashMode::LoseUnsynced, &mut Prng::new(1));
        let (reopened, recovery) = open(&disk);
        assert!(recovery.damage.is_empty());
        assert!(reopened.next_offset() >= next);
    }

    /// Every segment sync is timed with the bytes it made durable.
    #[test]
    fn segment_syncs_are_timed() {
        let disk = MemStorage::new();
        let (mut log, _) = open(&disk);
        fill_to_seal(&mut log);
        assert!(
            log.take_sync_timings().is_empty(),
            "no sync before the seal"
        );
        let job = log.take_seal().unwrap();
        let done = block_on(job.run());
        let bytes = done.timing.bytes;
        assert!(bytes >= POLICY.segment_size, "{bytes}");
        assert!(block_on(log.sealed(done)).unwrap());
        assert!(
            log.take_sync_timings().is_empty(),
            "the job's timing is not counted twice"
        );
        commit_one(&mut log);
        block_on(log.sync()).unwrap();
        let timings = log.take_sync_timings();
        assert_eq!(timings.len(), 1);
        assert!(timings[0].bytes > 0);
    }
}
