use super::*;
use crate::batch::build;
use crate::mem::{CrashMode, FailOp, MemStorage, Prng};
use crate::storage::block_on;
use crate::storage::{OpenMode, read_exact_at};
use std::task::{Context, Poll, Waker};

const POLICY: FlushPolicy = FlushPolicy {
    enforce_fsync: true,
    messages_required_to_save: 4,
    size_of_messages_required_to_save: 1 << 20,
    segment_size: 16 * 1024,
};

fn batch_at(offset: u64, messages: usize, len: usize) -> Vec<u8> {
    let payloads: Vec<Vec<u8>> = (0..messages)
        .map(|i| vec![(offset as usize + i) as u8; len])
        .collect();
    let refs: Vec<&[u8]> = payloads.iter().map(|p| p.as_slice()).collect();
    build(1, offset, 1_000 + offset * 10, &refs)
}

fn open(disk: &MemStorage, policy: FlushPolicy) -> (PartitionLog<MemStorage>, SegmentRecovery) {
    block_on(PartitionLog::open(disk.clone(), "p1-", policy, 0)).unwrap()
}

/// Commits `batches` batches of 3 messages, flushing as the policy says.
fn fill(log: &mut PartitionLog<MemStorage>, batches: u64) {
    for _ in 0..batches {
        let next = log.next_offset();
        log.commit_batch(batch_at(next, 3, 500)).unwrap();
        if log.should_flush(0, 0) {
            block_on(log.flush()).unwrap();
        }
    }
}

fn offsets_of(bytes: &[u8]) -> Vec<u64> {
    let mut at = 0;
    let mut out = Vec::new();
    while at < bytes.len() {
        let info = batch::verify(&bytes[at..]).unwrap();
        out.push(info.base_offset);
        at += info.len as usize;
    }
    out
}

#[test]
fn reads_by_offset_and_timestamp_across_segments_and_reopen() {
    let disk = MemStorage::new();
    let (mut log, _) = open(&disk, POLICY);
    fill(&mut log, 40);
    assert_eq!(log.next_offset(), 120);
    assert!(log.segment_bases().len() > 2, "{:?}", log.segment_bases());
    for (offset, first) in [(0, 0), (1, 0), (3, 3), (59, 57), (119, 117)] {
        let bytes = block_on(log.read_from_offset(offset, 1)).unwrap();
        assert_eq!(offsets_of(&bytes), vec![first], "offset {offset}");
    }
    let all = block_on(log.read_from_offset(0, u64::MAX)).unwrap();
    assert_eq!(offsets_of(&all), (0..40).map(|i| i * 3).collect::<Vec<_>>());
    // Timestamps are 1000 + 10 * base_offset.
    let bytes = block_on(log.read_from_timestamp(1_000 + 10 * 58, 1)).unwrap();
    assert_eq!(offsets_of(&bytes), vec![60]);
    assert!(block_on(log.read_from_offset(500, 1)).unwrap().is_empty());
    block_on(log.sync()).unwrap();
    let (log, recovery) = open(&disk, POLICY);
    assert_eq!(recovery.next_offset, 120);
    assert_eq!(recovery.tail_cut, 0);
    let all = block_on(log.read_from_offset(0, u64::MAX)).unwrap();
    assert_eq!(offsets_of(&all).len(), 40);
}

/// One flush per batch puts an index entry per batch in one segment; past 170 entries the
/// rewritten index sector starts inside an entry (4096 is not a multiple of 24). The flush
/// that crossed it indexed out of bounds (a shard panicked after 171 flushes of one partition
/// under `strand bench`); every entry must survive, in memory and after a reopen.
#[test]
fn an_index_entry_that_straddles_a_sector_is_written_whole() {
    let policy = FlushPolicy {
        enforce_fsync: true,
        messages_required_to_save: 1,
        size_of_messages_required_to_save: 1 << 30,
        segment_size: 1 << 30,
    };
    let disk = MemStorage::new();
    let (mut log, _) = open(&disk, policy);
    let batches = 400u64;
    for _ in 0..batches {
        let next = log.next_offset();
        log.commit_batch(batch_at(next, 1, 8)).unwrap();
        block_on(log.flush()).unwrap();
    }
    assert_eq!(log.segment_bases(), vec![0]);
    let check = |log: &PartitionLog<MemStorage>| {
        for offset in 0..batches {
            let bytes = block_on(log.read_from_offset(offset, 1)).unwrap();
            assert_eq!(offsets_of(&bytes), vec![offset], "offset {offset}");
            let by_time = block_on(log.read_from_timestamp(1_000 + 10 * offset, 1)).unwrap();
            assert_eq!(offsets_of(&by_time), vec![offset], "timestamp of {offset}");
        }
    };
    check(&log);
    let (log, recovery) = open(&disk, policy);
    assert_eq!(recovery.next_offset, batches);
    assert_eq!(recovery.tail_cut, 0);
    check(&log);
}

#[test]
fn the_flush_policy_counts_messages_bytes_and_segment_room() {
    let disk = MemStorage::new();
    let (mut log, _) = open(&disk, POLICY);
    log.commit_batch(batch_at(0, 3, 10)).unwrap();
    assert!(!log.should_flush(0, 0));
    assert!(log.should_flush(1, 0));
    assert!(log.should_flush(0, 1 << 20));
    let big = FlushPolicy {
        messages_required_to_save: 1 << 20,
        ..POLICY
    };
    let (mut log, _) = open(&MemStorage::new(), big);
    log.commit_batch(batch_at(0, 1, 17_000)).unwrap();
    assert!(log.should_flush(0, 0), "a full segment forces a flush");
    assert!(matches!(
        log.commit_batch(batch_at(5, 1, 1)),
        Err(SegmentError::Offset {
            base_offset: 5,
            expected: 1
        })
    ));
}

#[test]
fn a_crash_keeps_an_intact_prefix_and_the_log_goes_on() {
    for seed in 0..100u64 {
        let disk = MemStorage::new();
        let lazy = FlushPolicy {
            enforce_fsync: false,
            ..POLICY
        };
        let (mut log, _) = open(&disk, lazy);
        fill(&mut log, 10);
        let synced = block_on(log.sync()).unwrap();
        fill(&mut log, 1 + seed % 20);
        let mode = [
            CrashMode::TornPrefix,
            CrashMode::Reorder,
            CrashMode::LoseUnsynced,
        ][seed as usize % 3];
        disk.crash(mode, &mut Prng::new(seed));
        let (mut log, recovery) = open(&disk, lazy);
        assert!(recovery.next_offset >= synced, "seed {seed}: {recovery:?}");
        let all = block_on(log.read_from_offset(0, u64::MAX)).unwrap();
        let offsets = offsets_of(&all);
        assert_eq!(
            offsets,
            (0..offsets.len() as u64).map(|i| i * 3).collect::<Vec<_>>(),
            "seed {seed}"
        );
        assert_eq!(
            offsets.len() as u64 * 3,
            recovery.next_offset,
            "seed {seed}"
        );
        fill(&mut log, 5);
        block_on(log.sync()).unwrap();
        let (log, again) = open(&disk, lazy);
        assert_eq!(again.tail_cut, 0, "seed {seed}");
        assert_eq!(again.next_offset, recovery.next_offset + 15);
        assert!(block_on(log.read_from_offset(0, u64::MAX)).is_ok());
    }
}

#[test]
fn corrupt_segment_bytes_are_errors_never_panics() {
    let mut prng = Prng::new(3);
    let mut detected = 0;
    for _ in 0..100 {
        let disk = MemStorage::new();
        let (mut log, _) = open(&disk, POLICY);
        fill(&mut log, 12);
        block_on(log.sync()).unwrap();
        let base = log.segment_bases()[0];
        let len = block_on(log.segment_bytes(base)).unwrap().unwrap().len() as u64;
        disk.flip_bit(&log_name("p1-", base), prng.below(len), prng.below(8) as u8)
            .unwrap();
        let (log, recovery) = open(&disk, POLICY);
        let read = block_on(log.read_from_offset(0, u64::MAX));
        // Either the read refuses the damaged batch, or recovery dropped it from the index/tail.
        if read.is_err() || recovery.tail_cut > 0 || recovery.index_dropped > 0 {
            detected += 1;
        }
    }
    assert_eq!(detected, 100);
}

#[test]
fn staging_files_are_swept() {
    let disk = MemStorage::new();
    block_on(async {
        disk.open("staging-p1-00000000000000000000.log", OpenMode::Create)
            .await
            .unwrap();
    });
    let (_, recovery) = open(&disk, POLICY);
    assert_eq!(recovery.staging_swept, 1);
    assert!(block_on(disk.list()).unwrap().is_empty());
}

/// Flushes of shrinking sizes reuse one write buffer: what an earlier, longer flush left in it
/// never reaches the disk (the reopened log reads every batch back verified and ends where
/// the data ends), and each flush's rewritten sector head (taken from memory) is the data.
#[test]
fn shrinking_flushes_leave_no_stale_bytes() {
    let disk = MemStorage::new();
    let policy = FlushPolicy {
        messages_required_to_save: 1,
        ..POLICY
    };
    let (mut log, _) = open(
        &disk,
        FlushPolicy {
            segment_size: 1 << 20,
            ..policy
        },
    );
    let mut bases = Vec::new();
    for len in [9_000, 5_000, 700, 300, 2_000, 1, 4_096, 17] {
        let next = log.next_offset();
        bases.push(next);
        log.commit_batch(batch_at(next, 2, len)).unwrap();
        block_on(log.flush()).unwrap();
    }
    drop(log);
    let (log, recovery) = open(&disk, policy);
    assert_eq!(recovery.tail_cut, 0, "{recovery:?}");
    assert_eq!(log.next_offset(), 16);
    let all = block_on(log.read_from_offset(0, u64::MAX)).unwrap();
    assert_eq!(offsets_of(&all), bases);
}

/// A committed prepare's batch is held without re-hashing its messages, but its header must
/// describe exactly the bytes given, at the next offset.
#[test]
fn a_verified_batch_is_checked_by_its_header() {
    let disk = MemStorage::new();
    let (mut log, _) = open(&disk, POLICY);
    let mut long = batch_at(0, 2, 10);
    long.push(0);
    assert!(matches!(
        log.commit_verified_batch(long.into()),
        Err(SegmentError::Batch(BatchFault::Layout))
    ));
    assert!(matches!(
        log.commit_verified_batch(batch_at(5, 2, 10).into()),
        Err(SegmentError::Offset { .. })
    ));
    assert!(matches!(
        log.commit_verified_batch(Bytes::from_static(b"short")),
        Err(SegmentError::Batch(BatchFault::Truncated))
    ));
    log.commit_verified_batch(batch_at(0, 2, 10).into())
        .unwrap();
    block_on(log.flush()).unwrap();
    let all = block_on(log.read_from_offset(0, u64::MAX)).unwrap();
    assert_eq!(offsets_of(&all), vec![0]);
}

/// The entries the index file of segment 0 holds (non-zero 24-byte records).
fn index_entries(disk: &MemStorage) -> usize {
    let file = block_on(disk.open(&index_name("p1-", 0), OpenMode::Existing)).unwrap();
    let len = block_on(disk.len(&file)).unwrap();
    let mut bytes = vec![0u8; sector_ceil(len) as usize];
    block_on(read_exact_at(disk, &file, 0, &mut bytes)).unwrap();
    bytes
        .chunks_exact(INDEX_ENTRY)
        .filter(|e| e.iter().any(|b| *b != 0))
        .count()
}

/// A log whose first batch (offsets 0-2) is flushed and indexed and whose second (3-5) is
/// committed, held for the next flush.
fn one_flushed_one_held(disk: &MemStorage) -> PartitionLog<MemStorage> {
    let (mut log, _) = open(disk, POLICY);
    log.commit_batch(batch_at(0, 3, 500)).unwrap();
    block_on(log.flush()).unwrap();
    assert_eq!(index_entries(disk), 1);
    log.commit_batch(batch_at(3, 3, 500)).unwrap();
    log
}

/// A flush's index entry goes out while the log syncs, not after: with the log's `fdatasync`
/// held, the entry is in the index file already, and the flush returns once the sync does
/// (one device round trip fewer before a synced batch is acknowledged).
#[test]
fn a_flush_writes_its_index_entry_while_the_log_syncs() {
    let disk = MemStorage::new();
    let mut log = one_flushed_one_held(&disk);
    disk.hold_syncs(&log_name("p1-", 0));
    {
        let mut flush = std::pin::pin!(log.flush());
        let mut cx = Context::from_waker(Waker::noop());
        assert!(
            flush.as_mut().poll(&mut cx).is_pending(),
            "the log's sync is held"
        );
        assert_eq!(
            index_entries(&disk),
            2,
            "the index entry is written while the log's sync is in flight"
        );
        disk.release_syncs();
        assert!(matches!(flush.as_mut().poll(&mut cx), Poll::Ready(Ok(()))));
    }
    assert_eq!(log.synced_offset(), 6);
    let (reopened, _) = open(&disk, POLICY);
    let all = block_on(reopened.read_from_offset(0, u64::MAX)).unwrap();
    assert_eq!(offsets_of(&all), vec![0, 3]);
}

/// A flush whose write fails keeps its batches held: the index has no entry for them, and the
/// retry writes the batches and their one entry.
#[test]
fn a_failed_flush_write_is_retried_whole() {
    let disk = MemStorage::new();
    let mut log = one_flushed_one_held(&disk);
    disk.fail_next(crate::mem::FailOp::Write);
    assert!(block_on(log.flush()).is_err());
    assert_eq!(index_entries(&disk), 1, "no entry for a batch not written");
    block_on(log.flush()).unwrap();
    assert_eq!(index_entries(&disk), 2);
    let all = block_on(log.read_from_offset(0, u64::MAX)).unwrap();
    assert_eq!(offsets_of(&all), vec![0, 3]);
}

/// Decision 491: without `enforce_fsync` a flush writes the index only when its entries fill a
/// sector (170 and 2/3 entries), so 400 flushes write it twice; a forced sync writes the rest,
/// every entry is found after a reopen, and a crash that took the unwritten entries loses no
/// batch: the boot's scan indexes them again, one entry per batch, and reads by offset and
/// by timestamp find every one.
#[test]
fn the_index_is_written_once_per_sector_of_entries() {
    let policy = FlushPolicy {
        enforce_fsync: false,
        messages_required_to_save: 1,
        size_of_messages_required_to_save: 1 << 30,
        segment_size: 1 << 30,
    };
    let check = |log: &PartitionLog<MemStorage>, batches: u64| {
        for offset in 0..batches {
            let bytes = block_on(log.read_from_offset(offset, 1)).unwrap();
            assert_eq!(offsets_of(&bytes), vec![offset], "offset {offset}");
            let by_time = block_on(log.read_from_timestamp(1_000 + 10 * offset, 1)).unwrap();
            assert_eq!(offsets_of(&by_time), vec![offset], "timestamp of {offset}");
        }
    };
    let batches = 400u64;
    let disk = MemStorage::new();
    disk.log_writes();
    let (mut log, _) = open(&disk, policy);
    for _ in 0..batches {
        let next = log.next_offset();
        log.commit_batch(batch_at(next, 1, 8)).unwrap();
        block_on(log.flush_synced()).unwrap();
    }
    let index_writes = disk.writes_to(&index_name("p1-", 0)).len();
    assert_eq!(index_writes, 2, "entries 171 and 342 complete a sector");
    assert_eq!(index_entries(&disk), 342);
    check(&log, batches);
    // A power cut now: the 58 entries past the last write were never written.
    let (reopened, recovery) = open(&disk.durable_copy(), policy);
    assert_eq!(recovery.next_offset, batches);
    assert_eq!(recovery.tail_cut, 0);
    assert_eq!(
        reopened.extents().next().unwrap().index.len(),
        batches as usize
    );
    check(&reopened, batches);
    // A forced sync writes what the file lacks.
    block_on(log.sync()).unwrap();
    assert_eq!(index_entries(&disk), batches as usize);
    let (log, _) = open(&disk, policy);
    check(&log, batches);
}

/// The index never lags more than `INDEX_LAG_BYTES_MAX` of log behind (the most a boot
/// rescans), and a segment that fills has its index written before its seal syncs it.
#[test]
fn the_index_lags_a_bounded_span_of_log_and_a_full_segment_holds_every_entry() {
    let segment_size = 40 << 20;
    let policy = FlushPolicy {
        enforce_fsync: false,
        messages_required_to_save: 1,
        size_of_messages_required_to_save: 1 << 30,
        segment_size,
    };
    let disk = MemStorage::new();
    disk.log_writes();
    let (mut log, _) = open(&disk, policy);
    // 1 MiB batches (and a few bytes): 16 to a lag bound, 40 to the segment.
    while log.segment_bases().len() < 2 {
        let next = log.next_offset();
        log.commit_batch(batch_at(next, 1, 1 << 20)).unwrap();
        block_on(log.flush_synced()).unwrap();
    }
    let writes = disk.writes_to(&index_name("p1-", 0));
    assert_eq!(
        writes.len(),
        3,
        "one index write per 16 MiB of log and one as the segment fills: {writes:?}"
    );
    let sealed = log.extents().next().unwrap();
    assert_eq!(
        index_entries(&disk),
        sealed.index.len(),
        "the sealed segment holds every entry"
    );
}

/// Decision 515: a segment reserves its blocks as far ahead as it holds, at least 256 KiB and
/// at most 16 MiB, so a quiet partition keeps little reserved and a busy one tops up once per
/// 8 MiB; the reservation never reaches past the segment's size.
#[test]
fn a_segment_reserves_ahead_as_far_as_it_holds() {
    let disk = MemStorage::new();
    let policy = FlushPolicy {
        enforce_fsync: false,
        segment_size: 40 << 20,
        ..FlushPolicy::default()
    };
    let (mut log, _) = open(&disk, policy);
    let name = log_name("p1-", 0);
    log.commit_batch(batch_at(0, 3, 500)).unwrap();
    block_on(log.flush()).unwrap();
    let len = log.segments[0].len;
    assert_eq!(
        disk.reserved(&name),
        Some(len + (256 << 10)),
        "a segment of {len} bytes reserves 256 KiB past its end"
    );
    let mut topped_up = 0;
    let mut last = disk.reserved(&name).unwrap();
    while log.segments.len() == 1 {
        let next = log.next_offset();
        log.commit_batch(batch_at(next, 1, 1 << 20)).unwrap();
        block_on(log.flush()).unwrap();
        let (end, reserved) = (log.segments[0].len, disk.reserved(&name).unwrap());
        if reserved != last {
            topped_up += 1;
            last = reserved;
        }
        let ahead = reserved.saturating_sub(end);
        assert!(
            ahead <= end.max(256 << 10) && ahead <= 16 << 20,
            "{ahead} bytes reserved past a segment of {end}"
        );
        assert!(
            reserved >= (40 << 20) || ahead >= end.min(16 << 20) / 2,
            "{ahead} bytes reserved past a segment of {end}: less than half its ahead"
        );
        assert!(reserved <= 40 << 20, "{reserved}: past the segment's size");
    }
    assert!(
        (8..=16).contains(&topped_up),
        "{topped_up} reservations for a 40 MiB segment"
    );
}

/// A failed reservation (decision 515) is handed to the caller once; the segment stops
/// asking, and its flushes and a reopen go on as without it.
#[test]
fn a_failed_reservation_is_reported_once_and_the_log_goes_on() {
    let disk = MemStorage::new();
    let policy = FlushPolicy {
        enforce_fsync: false,
        segment_size: 1 << 20,
        ..FlushPolicy::default()
    };
    let (mut log, _) = open(&disk, policy);
    disk.fail_next(FailOp::Reserve);
    for i in 0..20 {
        log.commit_batch(batch_at(i * 3, 3, 500)).unwrap();
        block_on(log.flush()).unwrap();
        let failures = log.take_reserve_failures();
        if i == 0 {
            assert_eq!(failures.len(), 1);
            assert_eq!(failures[0].segment, 0);
            assert_eq!(failures[0].len, log.segments[0].len + (256 << 10));
            assert!(
                matches!(
                    failures[0].error,
                    StorageError::Injected { op: "reserve", .. }
                ),
                "{:?}",
                failures[0].error
            );
        } else {
            assert!(failures.is_empty(), "flush {i}: {failures:?}");
        }
    }
    assert_eq!(disk.reserved(&log_name("p1-", 0)), Some(0));
    block_on(log.sync()).unwrap();
    drop(log);
    let (log, recovery) = open(&disk, policy);
    assert_eq!(log.next_offset(), 60);
    assert_eq!(recovery.tail_cut, 0);
}
