use super::*;
use crate::mem::{CrashMode, FailOp, MemStorage, Prng};
use crate::storage::block_on;

const CONFIG: WalConfig = WalConfig {
    file_size_max: 256 * 1024,
    window_bytes_max: 64 * 1024,
    window_us_max: 100,
};

fn frame(lsn_hint: u64, len: usize) -> Vec<u8> {
    let mut prng = Prng::new(lsn_hint);
    (0..len).map(|_| prng.next_u64() as u8).collect()
}

type Seen = Vec<(u64, u64, Vec<u8>)>;

fn open(disk: &MemStorage) -> (PartitionWal<MemStorage>, WalRecovery, Seen) {
    let mut seen = Vec::new();
    let (wal, recovery) = block_on(PartitionWal::open(disk.clone(), CONFIG, |r| {
        seen.push((r.lsn, r.group, r.frame.to_vec()))
    }))
    .unwrap();
    (wal, recovery, seen)
}

#[test]
fn one_sync_covers_a_whole_window() {
    let disk = MemStorage::new();
    let (mut wal, recovery, _) = open(&disk);
    assert_eq!(recovery, WalRecovery::default());
    let (_, syncs_before) = disk.counts();
    let mut expected = Vec::new();
    for i in 0..40u64 {
        let f = frame(i, 300 + (i as usize * 37) % 1000);
        let lsn = wal.submit(i % 5, &f, 0).unwrap();
        assert_eq!(lsn, i + 1);
        expected.push((lsn, i % 5, f));
    }
    assert_eq!(wal.durable_lsn(), 0);
    assert_eq!(block_on(wal.commit()).unwrap(), 40);
    assert_eq!(disk.counts().1 - syncs_before, 1);
    let (_, recovery, seen) = open(&disk);
    assert!(recovery.is_clean());
    assert_eq!(recovery.lsn_last, 40);
    assert_eq!(seen, expected);
}

#[test]
fn window_bounds_by_bytes_and_time() {
    let disk = MemStorage::new();
    let (mut wal, _, _) = open(&disk);
    assert!(!wal.is_window_due(1_000));
    wal.submit(1, &frame(1, 100), 1_000).unwrap();
    assert!(!wal.is_window_due(1_050));
    assert!(wal.is_window_due(1_100));
    assert!(!wal.is_window_full());
    wal.submit(1, &frame(2, 70_000), 1_000).unwrap();
    assert!(wal.is_window_full());
}

#[test]
fn rotation_reopen_and_reclaim() {
    let disk = MemStorage::new();
    let (mut wal, _, _) = open(&disk);
    for i in 0..200u64 {
        block_on(wal.append(7, &frame(i, 3000), 0)).unwrap();
    }
    assert!(wal.file_count() > 2);
    let (mut wal, recovery, seen) = open(&disk);
    assert!(recovery.is_clean(), "{recovery:?}");
    assert_eq!(seen.len(), 200);
    assert!(seen.iter().enumerate().all(|(i, r)| r.0 == i as u64 + 1));
    let files = wal.file_count();
    assert!(block_on(wal.reclaim(150)).unwrap() > 0);
    assert!(wal.file_count() < files);
    block_on(wal.append(7, &frame(999, 10), 0)).unwrap();
    let (_, recovery, seen) = open(&disk);
    assert!(recovery.is_clean(), "{recovery:?}");
    assert_eq!(recovery.lsn_last, 201);
    assert!(seen.first().unwrap().0 > 1);
}

#[test]
fn a_crash_loses_only_the_unsynced_window() {
    for seed in 0..200u64 {
        let disk = MemStorage::new();
        let (mut wal, _, _) = open(&disk);
        let mut prng = Prng::new(seed);
        let windows = 1 + prng.below(20);
        for w in 0..windows {
            for _ in 0..1 + prng.below(8) {
                let len = prng.below(9000) as usize;
                wal.submit(w, &frame(w, len), 0).unwrap();
            }
            block_on(wal.commit()).unwrap();
        }
        let durable = wal.durable_lsn();
        for _ in 0..1 + prng.below(8) {
            wal.submit(99, &frame(99, prng.below(20_000) as usize), 0)
                .unwrap();
        }
        disk.fail_next(FailOp::Sync);
        assert!(block_on(wal.commit()).is_err());
        let mode = [
            CrashMode::TornPrefix,
            CrashMode::Reorder,
            CrashMode::LoseUnsynced,
        ][seed as usize % 3];
        disk.crash(mode, &mut Prng::new(seed));
        let (mut wal, recovery, seen) = open(&disk);
        assert!(recovery.is_clean(), "seed {seed}: {recovery:?}");
        assert!(recovery.lsn_last >= durable, "seed {seed}");
        assert!(seen.iter().enumerate().all(|(i, r)| r.0 == i as u64 + 1));
        // The log goes on after a cut tail and reopens clean.
        block_on(wal.append(5, &frame(5, 5000), 0)).unwrap();
        let (_, again, seen2) = open(&disk);
        assert!(
            again.is_clean() && again.torn_tail.is_none(),
            "seed {seed}: {again:?}"
        );
        assert_eq!(seen2.len() as u64, recovery.lsn_last + 1);
    }
}

/// Every injected fault into written windows is detected: reported as interior damage (a later
/// window is intact), as a truncated file, or as a cut tail when it hit the last window (bit rot
/// there is indistinguishable from a torn write; see the module docs).
#[test]
fn every_injected_wal_corruption_is_detected() {
    let trials: u64 = std::env::var("JOURNAL_CORRUPTION_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let mut prng = Prng::new(0xbad);
    let (mut interior, mut tail, mut truncated, mut invisible) = (0, 0, 0, 0);
    for trial in 0..trials {
        let disk = MemStorage::new();
        let (mut wal, _, _) = open(&disk);
        // (file seq, offset, bytes) of each window.
        let mut windows = Vec::new();
        for w in 0..12u64 {
            let file_before = wal.files.last().unwrap().seq;
            for _ in 0..1 + prng.below(5) {
                wal.submit(w, &frame(w, 100 + prng.below(12_000) as usize), 0)
                    .unwrap();
            }
            let bytes = wal.window_bytes() as u64;
            let padded = sector_ceil(bytes);
            let rotates = wal.offset + padded > CONFIG.file_size_max;
            let (seq, offset) = if rotates {
                (file_before + 1, 0)
            } else {
                (file_before, wal.offset)
            };
            block_on(wal.commit()).unwrap();
            windows.push((seq, offset, bytes));
        }
        let victim = prng.below(windows.len() as u64) as usize;
        let (seq, offset, bytes) = windows[victim];
        let name = file_name(seq);
        let kind = prng.below(4);
        match kind {
            0 => disk.flip_bit(&name, offset + prng.below(bytes), prng.below(8) as u8),
            1 => disk.zero_sector(&name, (offset + prng.below(bytes)) / SECTOR as u64),
            2 => disk.lose_sector(&name, (offset + prng.below(bytes)) / SECTOR as u64),
            _ => disk.truncate_file(&name, offset + prng.below(bytes)),
        }
        .unwrap();
        let (_, recovery, seen) = open(&disk);
        let last_in_file = windows.iter().rev().find(|w| w.0 == seq).unwrap().1 == offset;
        if kind == 3 {
            assert_eq!(recovery.truncated, vec![seq], "trial {trial}");
            truncated += 1;
        } else if victim + 1 == windows.len() {
            if recovery.torn_tail.is_none() {
                // Only a zeroed sector that held the whole last window reads as never written.
                assert!(
                    kind == 1 && bytes <= SECTOR as u64,
                    "trial {trial}: {recovery:?}"
                );
                assert_eq!(seen.len() as u64, recovery.lsn_last);
                invisible += 1;
                continue;
            }
            tail += 1;
        } else {
            assert!(
                !recovery.damage.is_empty(),
                "trial {trial} kind {kind} victim {victim} {:?} last_in_file {last_in_file}: {recovery:?}",
                windows[victim]
            );
            interior += 1;
        }
        // Whatever was delivered is intact and in order.
        for (lsn, group, f) in &seen {
            assert!(*lsn >= 1 && *group < 12, "trial {trial}");
            assert!(!f.is_empty() || f.is_empty());
        }
    }
    eprintln!(
        "wal corruption: {trials} injected, {} detected (interior {interior}, last window cut \
         {tail}, truncated file {truncated}); {invisible} zeroed a whole one-sector last window, \
         which reads as never written",
        trials - invisible
    );
}

#[test]
fn truncations_replay_in_log_order_per_group() {
    use crate::prepare::tests::prepare_in;
    let disk = MemStorage::new();
    let (mut wal, _, _) = open(&disk);
    for op in 1..=5 {
        wal.submit(9, &prepare_in(9, op, 0, 10, 0), 0).unwrap();
        wal.submit(8, &prepare_in(8, op, 0, 10, 0), 0).unwrap();
    }
    wal.submit_truncate(9, 3, 0).unwrap();
    wal.submit(9, &prepare_in(9, 3, 0, 10, 7), 0).unwrap();
    block_on(wal.commit()).unwrap();
    let mut replay = GroupReplay::default();
    block_on(PartitionWal::open(disk.clone(), CONFIG, |r| {
        replay.apply(r)
    }))
    .unwrap();
    assert_eq!(replay.undecodable, 0);
    assert_eq!(replay.groups[&8].len(), 5);
    let ops: Vec<u64> = replay.groups[&9].keys().copied().collect();
    assert_eq!(ops, vec![1, 2, 3]);
    assert_eq!(replay.groups[&9][&3], prepare_in(9, 3, 0, 10, 7));
}
