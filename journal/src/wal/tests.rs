use super::*;
use crate::mem::{CrashMode, FailOp, MemStorage, Prng};
use crate::storage::{OpenMode, Storage, block_on};

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
    let mut unverified = 0;
    for seed in 0..300u64 {
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
        let mut submitted = durable;
        for _ in 0..1 + prng.below(8) {
            submitted = wal
                .submit(99, &frame(99, prng.below(20_000) as usize), 0)
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
        assert!(recovery.damage.is_empty(), "seed {seed}: {recovery:?}");
        assert!(recovery.truncated.is_empty(), "seed {seed}: {recovery:?}");
        if !recovery.unverified.is_empty() {
            // Only a disk that reorders sectors lands a marker without its whole window, and
            // only the never-acknowledged window is reported (conservatively).
            assert_eq!(mode, CrashMode::Reorder, "seed {seed}: {recovery:?}");
            assert_eq!(recovery.unverified.len(), 1);
            let u = recovery.unverified[0];
            assert_eq!(
                (u.lsn_first, u.lsn_last),
                (durable + 1, submitted),
                "seed {seed}"
            );
            assert!(recovery.torn_tail.is_none());
            unverified += 1;
        }
        assert!(recovery.lsn_last >= durable, "seed {seed}");
        assert!(seen.iter().enumerate().all(|(i, r)| r.0 == i as u64 + 1));
        // The log goes on after a cut tail or a seal, and reopens with the same report.
        let lsn = block_on(wal.append(5, &frame(5, 5000), 0)).unwrap();
        let (_, again, seen2) = open(&disk);
        assert!(again.torn_tail.is_none(), "seed {seed}: {again:?}");
        assert!(again.damage.is_empty(), "seed {seed}: {again:?}");
        assert_eq!(again.unverified, recovery.unverified, "seed {seed}");
        assert_eq!(seen2.len() as u64, recovery.records + 1);
        assert_eq!(seen2.last().unwrap().0, lsn);
        assert_eq!(again.lsn_last, lsn);
    }
    assert!(
        unverified > 0,
        "no reorder crash landed a marker without its window"
    );
}

/// Every injected fault into written windows is detected: reported as interior damage (a later
/// window is intact), as a truncated file, or, in the last window, as damage or an unverified
/// window through its tail marker (never cut as a torn tail).
#[test]
fn every_injected_wal_corruption_is_detected() {
    let trials: u64 = std::env::var("JOURNAL_CORRUPTION_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let mut prng = Prng::new(0xbad);
    let (mut interior, mut last_damage, mut last_unverified, mut truncated) = (0, 0, 0, 0);
    let mut detected = 0u64;
    let mut uncovered = Vec::new();
    for trial in 0..trials {
        let disk = MemStorage::new();
        let (mut wal, _, _) = open(&disk);
        // (file seq, offset, bytes, lsn_first, lsn_last) of each window.
        let mut windows = Vec::new();
        for w in 0..12u64 {
            let file_before = wal.files.last().unwrap().seq;
            let lsn_first = wal.durable_lsn() + 1;
            for _ in 0..1 + prng.below(5) {
                wal.submit(w, &frame(w, 100 + prng.below(12_000) as usize), 0)
                    .unwrap();
            }
            let bytes = wal.window_bytes() as u64;
            let padded = sector_ceil(bytes);
            let rotates = wal.offset + padded + MARKER as u64 > CONFIG.file_size_max;
            let (seq, offset) = if rotates {
                (file_before + 1, 0)
            } else {
                (file_before, wal.offset)
            };
            let lsn_last = block_on(wal.commit()).unwrap();
            windows.push((seq, offset, bytes, lsn_first, lsn_last));
        }
        let victim = prng.below(windows.len() as u64) as usize;
        let (seq, offset, bytes, lsn_first, lsn_last) = windows[victim];
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
        // Detected means reported: some damaged, unverified or truncated-file range covers
        // every lsn of the damaged window.
        let covered = recovery
            .damage
            .iter()
            .chain(&recovery.unverified)
            .any(|d| d.lsn_first <= lsn_first && lsn_last <= d.lsn_last);
        if covered {
            detected += 1;
        } else {
            uncovered.push((trial, kind, windows[victim], recovery.clone()));
            continue;
        }
        let last_in_file = windows.iter().rev().find(|w| w.0 == seq).unwrap().1 == offset;
        if kind == 3 {
            assert_eq!(recovery.truncated, vec![seq], "trial {trial}");
            truncated += 1;
        } else if victim + 1 == windows.len() {
            // The last window: its marker names it, so it is never cut as a torn tail.
            assert!(recovery.torn_tail.is_none(), "trial {trial}: {recovery:?}");
            let lost = WalDamage {
                file: seq,
                offset,
                lsn_first,
                lsn_last,
            };
            if kind == 1 {
                // A zero sector is what an unlanded sector looks like on a reordering disk.
                assert_eq!(recovery.unverified, vec![lost], "trial {trial}");
            }
            if recovery.damage == vec![lost] {
                assert!(recovery.unverified.is_empty());
                last_damage += 1;
            } else {
                assert_eq!(
                    recovery.unverified,
                    vec![lost],
                    "trial {trial}: {recovery:?}"
                );
                assert!(recovery.damage.is_empty());
                last_unverified += 1;
            }
            assert_eq!(
                seen.last().map_or(0, |r| r.0),
                lsn_first - 1,
                "trial {trial}"
            );
            // The seal keeps the loss reported.
            let (_, again, _) = open(&disk);
            assert_eq!(
                (again.damage.clone(), again.unverified.clone()),
                (recovery.damage.clone(), recovery.unverified.clone()),
                "trial {trial}"
            );
        } else {
            assert!(
                !recovery.damage.is_empty(),
                "trial {trial} kind {kind} victim {victim} {:?} last_in_file {last_in_file}: {recovery:?}",
                windows[victim]
            );
            interior += 1;
        }
        // Whatever was delivered is in order and below the damage.
        assert!(seen.windows(2).all(|p| p[0].0 < p[1].0), "trial {trial}");
        assert!(seen.iter().all(|r| r.1 < 12), "trial {trial}");
        if kind != 3 {
            assert!(
                seen.iter().all(|r| r.0 < lsn_first || r.0 > lsn_last),
                "trial {trial}: a damaged record was delivered"
            );
        }
    }
    eprintln!(
        "wal corruption: {trials} injected, {detected} detected with a reported range covering \
         the damaged window (interior {interior}, last window damaged {last_damage}, last \
         window unverified {last_unverified}, truncated file {truncated})"
    );
    assert!(
        uncovered.is_empty(),
        "{} of {trials} injected faults were not covered by a reported range, first: {:?}",
        uncovered.len(),
        uncovered.first()
    );
    assert_eq!(detected, trials);
    assert_eq!(
        interior + last_damage + last_unverified + truncated,
        detected
    );
}

/// `(file seq, offset, padded bytes)` of the window the next commit writes.
fn next_window(wal: &PartitionWal<MemStorage>) -> (u64, u64, u64) {
    let padded = sector_ceil(wal.window_bytes() as u64);
    let seq = wal.files.last().unwrap().seq;
    if wal.offset + padded + MARKER as u64 > CONFIG.file_size_max {
        (seq + 1, 0, padded)
    } else {
        (seq, wal.offset, padded)
    }
}

/// Commits windows of the given record sizes; returns `(seq, offset, padded)` of the last.
fn commit_windows(wal: &mut PartitionWal<MemStorage>, sizes: &[&[usize]]) -> (u64, u64, u64) {
    let mut at = (0, 0, 0);
    for (w, lens) in sizes.iter().enumerate() {
        for len in *lens {
            wal.submit(w as u64, &frame(w as u64, *len), 0).unwrap();
        }
        at = next_window(wal);
        block_on(wal.commit()).unwrap();
    }
    at
}

#[test]
fn a_zeroed_one_sector_last_window_is_detected() {
    // The case the campaign used to miss: the whole last window in one sector, zeroed.
    let disk = MemStorage::new();
    let (mut wal, _, _) = open(&disk);
    let (seq, offset, padded) = commit_windows(&mut wal, &[&[3000, 2000], &[100, 200]]);
    assert_eq!(padded, SECTOR as u64);
    disk.zero_sector(&file_name(seq), offset / SECTOR as u64)
        .unwrap();
    let (mut wal, recovery, seen) = open(&disk);
    let lost = WalDamage {
        file: seq,
        offset,
        lsn_first: 3,
        lsn_last: 4,
    };
    assert_eq!(recovery.unverified, vec![lost]);
    assert!(recovery.damage.is_empty() && recovery.torn_tail.is_none());
    assert!(!recovery.is_clean());
    assert_eq!(seen.len(), 2);
    assert_eq!(recovery.lsn_last, 2);
    // The lost lsns are never reused, and the report survives later opens and appends.
    assert_eq!(wal.durable_lsn(), 4);
    assert_eq!(block_on(wal.append(1, &frame(1, 10), 0)).unwrap(), 5);
    let (_, again, seen) = open(&disk);
    assert_eq!(again.unverified, vec![lost]);
    assert!(again.damage.is_empty() && again.torn_tail.is_none());
    let lsns: Vec<u64> = seen.iter().map(|r| r.0).collect();
    assert_eq!(lsns, vec![1, 2, 5]);
}

#[test]
fn a_bit_flip_in_the_last_synced_window_is_damage() {
    for byte in [0u64, 10, 64 + 30, 5000, 9000] {
        let disk = MemStorage::new();
        let (mut wal, _, _) = open(&disk);
        let (seq, offset, _) = commit_windows(&mut wal, &[&[700], &[4000, 5000]]);
        disk.flip_bit(&file_name(seq), offset + byte, 3).unwrap();
        let (_, recovery, seen) = open(&disk);
        let lost = WalDamage {
            file: seq,
            offset,
            lsn_first: 2,
            lsn_last: 3,
        };
        assert_eq!(recovery.damage, vec![lost], "byte {byte}");
        assert!(recovery.unverified.is_empty() && recovery.torn_tail.is_none());
        assert_eq!(seen.len(), 1);
        let (_, again, _) = open(&disk);
        assert_eq!(again.damage, vec![lost], "byte {byte}");
    }
}

#[test]
fn a_flip_in_record_padding_is_detected() {
    // Padding bytes are covered by no checksum; they must read as zeros.
    let disk = MemStorage::new();
    let (mut wal, _, _) = open(&disk);
    let (seq, offset, _) = commit_windows(&mut wal, &[&[13]]);
    commit_windows(&mut wal, &[&[8]]);
    disk.flip_bit(&file_name(seq), offset + (HEAD + HEAD + 13) as u64, 0)
        .unwrap();
    let (_, recovery, _) = open(&disk);
    assert_eq!(recovery.damage.len(), 1, "{recovery:?}");
    assert_eq!(
        (recovery.damage[0].lsn_first, recovery.damage[0].lsn_last),
        (1, 1)
    );
}

#[test]
fn a_torn_tail_under_torn_prefix_is_cut_cleanly() {
    let (mut cut, mut landed) = (0, 0);
    for seed in 0..200u64 {
        let disk = MemStorage::new();
        let (mut wal, _, _) = open(&disk);
        commit_windows(&mut wal, &[&[5000], &[300, 7000]]);
        let durable = wal.durable_lsn();
        wal.submit(1, &frame(seed, 20_000), 0).unwrap();
        wal.submit(2, &frame(seed, 9_000), 0).unwrap();
        disk.fail_next(FailOp::Sync);
        assert!(block_on(wal.commit()).is_err());
        disk.crash(CrashMode::TornPrefix, &mut Prng::new(seed));
        let (_, recovery, seen) = open(&disk);
        assert!(recovery.is_clean(), "seed {seed}: {recovery:?}");
        assert!(recovery.unverified.is_empty());
        if recovery.torn_tail.is_some() {
            cut += 1;
            assert_eq!(recovery.lsn_last, durable);
        } else if recovery.lsn_last > durable {
            landed += 1;
        }
        assert_eq!(seen.len() as u64, recovery.lsn_last);
    }
    assert!(cut > 0 && landed > 0, "cut {cut} landed {landed}");
}

#[test]
fn a_marker_that_landed_without_the_window_head_is_a_torn_tail() {
    // On a reordering disk the new marker may land while the new window's first sector still
    // holds the previous marker: that window never landed whole, so it is cut, not reported.
    let disk = MemStorage::new();
    let (mut wal, _, _) = open(&disk);
    let (seq, offset, padded) = commit_windows(&mut wal, &[&[3000], &[6000]]);
    let marker_at = (offset + padded) as usize;
    let previous_marker =
        disk.durable_image(&file_name(seq)).unwrap()[marker_at..][..SECTOR].to_vec();
    let (seq2, offset2, _) = commit_windows(&mut wal, &[&[9000]]);
    assert_eq!((seq2, offset2), (seq, marker_at as u64));
    let file = block_on(disk.open(&file_name(seq), OpenMode::Existing)).unwrap();
    block_on(disk.write_at(&file, offset2, &previous_marker)).unwrap();
    block_on(disk.sync(&file)).unwrap();
    let (_, recovery, seen) = open(&disk);
    assert!(recovery.is_clean(), "{recovery:?}");
    assert_eq!(recovery.torn_tail, Some((seq, offset2)));
    assert_eq!(seen.len(), 2);
    // Had it lost a different sector (zeros), it could have been acknowledged.
    let (mut wal, _, _) = open(&disk);
    let (seq3, offset3, _) = commit_windows(&mut wal, &[&[9000]]);
    disk.zero_sector(&file_name(seq3), offset3 / SECTOR as u64 + 1)
        .unwrap();
    let (_, recovery, _) = open(&disk);
    assert_eq!(recovery.unverified.len(), 1, "{recovery:?}");
    assert_eq!(recovery.unverified[0].lsn_first, 3);
}

#[test]
fn a_zeroed_marker_with_an_intact_window_loses_nothing() {
    let disk = MemStorage::new();
    let (mut wal, _, _) = open(&disk);
    let (seq, offset, padded) = commit_windows(&mut wal, &[&[100], &[5000, 600]]);
    let name = file_name(seq);
    disk.zero_sector(&name, (offset + padded) / SECTOR as u64)
        .unwrap();
    let (_, recovery, seen) = open(&disk);
    assert_eq!(
        recovery,
        WalRecovery {
            records: 3,
            windows: 2,
            lsn_last: 3,
            ..WalRecovery::default()
        }
    );
    assert_eq!(seen.len(), 3);
    // The marker was restored, so damage to that window is still caught.
    let image = disk.durable_image(&name).unwrap();
    assert!(
        image[(offset + padded) as usize..][..HEAD]
            .iter()
            .any(|b| *b != 0)
    );
    disk.zero_sector(&name, offset / SECTOR as u64 + 1).unwrap();
    let (_, recovery, _) = open(&disk);
    assert_eq!(recovery.unverified.len(), 1, "{recovery:?}");
    // A damaged marker alone is cut like garbage after the last window.
    let disk = MemStorage::new();
    let (mut wal, _, _) = open(&disk);
    let (seq, offset, padded) = commit_windows(&mut wal, &[&[100], &[5000, 600]]);
    disk.flip_bit(&file_name(seq), offset + padded + 20, 1)
        .unwrap();
    let (_, recovery, seen) = open(&disk);
    assert!(recovery.is_clean(), "{recovery:?}");
    assert_eq!(seen.len(), 3);
}

#[test]
fn the_last_window_of_a_new_file_is_covered_after_rotation_and_reclaim() {
    let disk = MemStorage::new();
    let (mut wal, _, _) = open(&disk);
    // Three 64 KiB windows fit in a 256 KiB file with the marker; the fourth rotates.
    let big: &[usize] = &[70_000];
    commit_windows(&mut wal, &[big, big, big]);
    assert_eq!(wal.file_count(), 1);
    let (seq, offset, _) = commit_windows(&mut wal, &[big]);
    assert_eq!((seq, offset, wal.file_count()), (2, 0, 2));
    // The last window of the first file keeps its marker; that file still scans clean.
    let (mut wal, recovery, _) = open(&disk);
    assert!(recovery.is_clean(), "{recovery:?}");
    assert_eq!(block_on(wal.reclaim(4)).unwrap(), 1);
    for kind in 0..2 {
        let disk2 = disk.durable_copy();
        match kind {
            0 => disk2.zero_sector(&file_name(2), 3).unwrap(),
            _ => disk2.flip_bit(&file_name(2), 7000, 2).unwrap(),
        }
        // Nothing intact is left before it (the earlier file was reclaimed).
        let (mut wal, recovery, seen) = open(&disk2);
        assert!(seen.is_empty());
        let lost = WalDamage {
            file: 2,
            offset: 0,
            lsn_first: 4,
            lsn_last: 4,
        };
        if kind == 0 {
            assert_eq!(recovery.unverified, vec![lost], "{recovery:?}");
        } else {
            assert_eq!(recovery.damage, vec![lost], "{recovery:?}");
        }
        assert_eq!(block_on(wal.append(1, &frame(1, 10), 0)).unwrap(), 5);
        let (_, again, seen) = open(&disk2);
        assert_eq!(
            (again.damage, again.unverified),
            (recovery.damage, recovery.unverified)
        );
        assert_eq!(seen.len(), 1);
    }
}

#[test]
fn a_window_that_fills_the_file_keeps_its_marker_sector() {
    // One record that fills the file up to the reserved marker sector.
    let exact = CONFIG.file_size_max as usize - MARKER - 2 * HEAD;
    let disk = MemStorage::new();
    let (mut wal, _, _) = open(&disk);
    assert_eq!(
        wal.submit(1, &frame(1, exact + 1), 0),
        Err(WalError::TooLarge(exact + 1))
    );
    let (seq, offset, padded) = commit_windows(&mut wal, &[&[exact]]);
    assert_eq!((seq, offset), (1, 0));
    assert_eq!(padded + MARKER as u64, CONFIG.file_size_max);
    let image = disk.durable_image(&file_name(1)).unwrap();
    assert_eq!(
        Marker::parse(&image[padded as usize..]).map(|m| (m.offset, m.lsn_first, m.lsn_last)),
        Some((0, 1, 1))
    );
    // The next window rotates; a window that fills the rest of a file exactly does not.
    let (seq, offset, _) = commit_windows(&mut wal, &[&[1000]]);
    assert_eq!((seq, offset), (2, 0));
    let rest = CONFIG.file_size_max as usize - SECTOR - MARKER - 2 * HEAD;
    let (seq, offset, padded) = commit_windows(&mut wal, &[&[rest]]);
    assert_eq!((seq, offset), (2, SECTOR as u64));
    assert_eq!(offset + padded + MARKER as u64, CONFIG.file_size_max);
    let (_, recovery, seen) = open(&disk);
    assert!(recovery.is_clean(), "{recovery:?}");
    assert_eq!(seen.len(), 3);
    // Zeroing the exact-fill window's last sector is detected through the marker.
    disk.zero_sector(&file_name(2), CONFIG.file_size_max / SECTOR as u64 - 2)
        .unwrap();
    let (_, recovery, seen) = open(&disk);
    assert_eq!(recovery.unverified.len(), 1, "{recovery:?}");
    assert_eq!(recovery.unverified[0].lsn_first, 3);
    assert_eq!(seen.len(), 2);
}

#[test]
fn a_damaged_truncation_record_in_the_last_window_is_reported() {
    let disk = MemStorage::new();
    let (mut wal, _, _) = open(&disk);
    commit_windows(&mut wal, &[&[400]]);
    let (seq, offset, _) = next_window(&wal);
    wal.submit_truncate(3, 7, 0).unwrap();
    block_on(wal.commit()).unwrap();
    disk.flip_bit(&file_name(seq), offset + HEAD as u64 + 70, 0)
        .unwrap();
    let (_, recovery, _) = open(&disk);
    assert_eq!(recovery.damage.len(), 1, "{recovery:?}");
    assert_eq!(recovery.damage[0].lsn_first, 2);
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

#[test]
fn a_crash_while_sealing_keeps_the_loss_reported() {
    for seed in 0..60u64 {
        let disk = MemStorage::new();
        let (mut wal, _, _) = open(&disk);
        let (seq, offset, _) = commit_windows(&mut wal, &[&[3000], &[5000, 4000]]);
        let kind = seed % 2;
        if kind == 0 {
            disk.zero_sector(&file_name(seq), offset / SECTOR as u64 + 1)
        } else {
            disk.flip_bit(&file_name(seq), offset + 100, 1)
        }
        .unwrap();
        // The seal's write or its sync fails, then power is lost.
        disk.fail_next(if seed % 4 < 2 {
            FailOp::Write
        } else {
            FailOp::Sync
        });
        let failed = block_on(PartitionWal::open(disk.clone(), CONFIG, |_| {}));
        assert!(failed.is_err(), "seed {seed}: {:?}", failed.map(|r| r.1));
        let mode = [
            CrashMode::TornPrefix,
            CrashMode::Reorder,
            CrashMode::LoseUnsynced,
        ][(seed / 4) as usize % 3];
        disk.crash(mode, &mut Prng::new(seed));
        let (_, recovery, seen) = open(&disk);
        let lost: Vec<(u64, u64)> = recovery
            .damage
            .iter()
            .chain(&recovery.unverified)
            .map(|d| (d.lsn_first, d.lsn_last))
            .collect();
        assert_eq!(lost, vec![(2, 3)], "seed {seed}: {recovery:?}");
        // What a torn seal left after itself (the damaged window's rest) may be cut.
        assert!(
            recovery.torn_tail.is_none_or(|t| t.1 > offset),
            "seed {seed}"
        );
        assert_eq!(seen.len(), 1);
        let (_, again, _) = open(&disk);
        assert_eq!(
            again.damage.len() + again.unverified.len(),
            1,
            "seed {seed}"
        );
    }
}

/// Found by the `wal_recover` fuzz target: a truncated last file whose first window head is
/// damaged was taken for a preallocation a crash interrupted, and recovery came back clean and
/// empty although two windows had been reported durable.
#[test]
fn a_truncated_last_file_with_a_damaged_first_window_is_damage_not_an_empty_file() {
    let disk = MemStorage::new();
    let (mut wal, _, _) = open(&disk);
    wal.submit(0, &frame(1, 235), 0).unwrap();
    block_on(wal.commit()).unwrap();
    wal.submit(0, &frame(2, 10_023), 0).unwrap();
    block_on(wal.commit()).unwrap();
    drop(wal);
    disk.truncate_file("wal.0000000001", 7 * SECTOR as u64)
        .unwrap();
    disk.flip_bit("wal.0000000001", 0, 0).unwrap();
    let (wal, recovery, seen) = open(&disk);
    assert!(!recovery.is_clean(), "{recovery:?}");
    assert_eq!(recovery.truncated, vec![1]);
    assert_eq!(recovery.damage[0].lsn_first, 1);
    assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), vec![2]);
    assert_eq!(wal.durable_lsn(), 2);
}

/// Found by the `wal_recover` fuzz target: records submitted without a commit grew a window
/// past the file size; its commit then wrote beyond the preallocated file and recovery lost
/// every record of it, though the commit had reported them durable.
#[test]
fn a_window_never_outgrows_a_file() {
    let disk = MemStorage::new();
    let (mut wal, _, _) = open(&disk);
    let big = frame(1, 60 * 1024);
    let mut submitted = 0;
    let refused = loop {
        match wal.submit(1, &big, 0) {
            Ok(_) => submitted += 1,
            Err(e) => break e,
        }
        assert!(submitted < 10, "the window keeps growing");
    };
    assert!(
        matches!(refused, WalError::WindowFull { .. }),
        "{refused:?}"
    );
    let durable = block_on(wal.commit()).unwrap();
    assert_eq!(durable, submitted);
    wal.submit(1, &big, 0).expect("room again after the commit");
    drop(wal);
    let (_, recovery, seen) = open(&disk);
    assert!(recovery.is_clean(), "{recovery:?}");
    assert_eq!(seen.len() as u64, submitted);
}

/// Two damaged windows, the second the last: no marker names the first one, but the second's
/// marker proves the first was synced before it was written. Both are acknowledged data lost
/// (found in review: recovery had called them a torn tail and reissued their lsns).
#[test]
fn two_damaged_last_windows_are_damage_not_a_torn_tail() {
    let disk = MemStorage::new();
    let (mut wal, _, _) = open(&disk);
    for lsn in 1..=2 {
        block_on(wal.append(1, &frame(lsn, 100_000), 0)).unwrap();
    }
    drop(wal);
    disk.flip_bit("wal.0000000001", 50_000, 3).unwrap();
    disk.flip_bit("wal.0000000001", 150_000, 3).unwrap();
    for _ in 0..2 {
        let (wal, recovery, seen) = open(&disk);
        assert!(seen.is_empty());
        assert_eq!(recovery.torn_tail, None);
        let lost: Vec<(u64, u64)> = recovery
            .damage
            .iter()
            .map(|d| (d.lsn_first, d.lsn_last))
            .collect();
        assert_eq!(lost, vec![(1, 2)], "{recovery:?}");
        assert_eq!(wal.durable_lsn(), 2, "lost lsns are never reissued");
    }
}

/// The same across a rotation: the damaged window closing one file and the damaged window
/// opening the next are both reported, and the next file is not dropped silently.
#[test]
fn damage_across_a_rotation_is_reported_whole() {
    let disk = MemStorage::new();
    let (mut wal, _, _) = open(&disk);
    for lsn in 1..=3 {
        block_on(wal.append(1, &frame(lsn, 100_000), 0)).unwrap();
    }
    assert_eq!(wal.file_count(), 2);
    drop(wal);
    disk.flip_bit("wal.0000000001", 150_000, 3).unwrap();
    disk.flip_bit("wal.0000000002", 50_000, 3).unwrap();
    let (wal, recovery, seen) = open(&disk);
    assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), vec![1]);
    let lost: Vec<(u64, u64)> = recovery
        .damage
        .iter()
        .map(|d| (d.lsn_first, d.lsn_last))
        .collect();
    assert_eq!(lost, vec![(2, 3)], "{recovery:?}");
    assert_eq!(wal.durable_lsn(), 3);
}

/// The lsns a recovery reports lost (damaged or unverified).
fn reported(recovery: &WalRecovery, lsn: u64) -> bool {
    recovery
        .damage
        .iter()
        .chain(&recovery.unverified)
        .any(|d| d.lsn_first <= lsn && lsn <= d.lsn_last)
}

/// Three files of windows (fourteen 40 KB windows); returns the durable lsn.
fn three_files(disk: &MemStorage) -> u64 {
    let (mut wal, _, _) = open(disk);
    for w in 0..14u64 {
        wal.submit(w, &frame(w, 30_000), 0).unwrap();
        wal.submit(w, &frame(w + 100, 10_000), 0).unwrap();
        block_on(wal.commit()).unwrap();
    }
    assert_eq!(wal.file_count(), 3, "the test wants three files");
    wal.durable_lsn()
}

#[test]
fn a_wal_cut_to_zero_length_is_loss_not_a_fresh_wal() {
    for files_cut in [1, 3] {
        let disk = MemStorage::new();
        let durable = three_files(&disk);
        let names = block_on(disk.list()).unwrap();
        let wal_files: Vec<&String> = names.iter().filter(|n| n.starts_with("wal.")).collect();
        let recorded = block_on(end::open(&disk)).unwrap().unwrap().end().unwrap();
        assert!(
            recorded.durable < durable,
            "the record lags (default cadence)"
        );
        for name in wal_files.iter().rev().take(files_cut) {
            disk.truncate_file(name, 0).unwrap();
        }
        let (mut wal, recovery, seen) = open(&disk);
        assert!(!recovery.is_clean(), "{recovery:?}");
        let back: Vec<u64> = seen.iter().map(|r| r.0).collect();
        for lsn in 1..=durable {
            assert!(
                back.contains(&lsn) || reported(&recovery, lsn),
                "cut {files_cut}: lsn {lsn} lost silently: {recovery:?}"
            );
        }
        // The lsns the record vouched for stay reported (sealed) and are never reused; past
        // the record only this open knew (the boot record keeps it, decision 91).
        let lsn = block_on(wal.append(1, &frame(1, 10), 0)).unwrap();
        assert!(lsn > recorded.durable);
        let (_, again, seen) = open(&disk);
        let back: Vec<u64> = seen.iter().map(|r| r.0).collect();
        for lsn in 1..=recorded.durable {
            assert!(
                back.contains(&lsn) || reported(&again, lsn),
                "cut {files_cut}, second open: lsn {lsn} lost silently: {again:?}"
            );
        }
    }
}

#[test]
fn a_lost_newest_or_oldest_file_is_loss() {
    // Newest: gone after the record named it.
    let disk = MemStorage::new();
    let durable = three_files(&disk);
    block_on(disk.remove(&file_name(3))).unwrap();
    let (_, recovery, seen) = open(&disk);
    assert_eq!(recovery.missing, vec![3]);
    let last_back = seen.last().unwrap().0;
    assert!(last_back < durable);
    assert!(
        recovery
            .damage
            .iter()
            .any(|d| d.lsn_first == last_back + 1 && d.lsn_last == u64::MAX),
        "{recovery:?}"
    );
    // Oldest: its lsns are not taken for a reclaimed prefix.
    let disk = MemStorage::new();
    let durable = three_files(&disk);
    block_on(disk.remove(&file_name(1))).unwrap();
    let (_, recovery, seen) = open(&disk);
    assert_eq!(recovery.missing, vec![1]);
    let first_back = seen.first().unwrap().0;
    assert!(first_back > 1);
    assert!(
        (1..first_back).all(|l| reported(&recovery, l)),
        "{recovery:?}"
    );
    assert_eq!(seen.last().unwrap().0, durable);
    // Remembered: the record keeps the floor, so the next open reports the same prefix.
    let (_, again, _) = open(&disk);
    assert!((1..first_back).all(|l| reported(&again, l)), "{again:?}");
}

#[test]
fn reclaim_records_the_floor_before_removing_and_a_crash_between_is_clean() {
    let disk = MemStorage::new();
    three_files(&disk);
    let (mut wal, _, _) = open(&disk);
    assert_eq!(block_on(wal.reclaim(u64::MAX)).unwrap(), 2);
    let floor = wal.floor();
    assert!(floor > 1);
    let (wal, recovery, seen) = open(&disk);
    assert!(recovery.is_clean(), "{recovery:?}");
    assert_eq!(seen.first().unwrap().0, floor);
    assert_eq!(wal.floor(), floor);
    // A crash after the record but before the removals: the old files are reclaimed at open.
    let disk = MemStorage::new();
    three_files(&disk);
    let (mut wal, _, _) = open(&disk);
    let keep = disk.durable_copy();
    assert_eq!(block_on(wal.reclaim(u64::MAX)).unwrap(), 2);
    for name in [file_name(1), file_name(2)] {
        let image = keep.durable_image(&name).unwrap();
        let file = block_on(disk.open(&name, OpenMode::Create)).unwrap();
        block_on(disk.write_at(&file, 0, &image)).unwrap();
        block_on(disk.sync(&file)).unwrap();
    }
    let (wal, recovery, seen) = open(&disk);
    assert!(recovery.is_clean(), "{recovery:?}");
    assert_eq!(seen.first().unwrap().0, floor);
    assert_eq!(wal.file_count(), 1);
}

#[test]
fn a_last_window_without_head_and_marker_is_loss_once_the_record_covers_it() {
    for covered in [true, false] {
        let disk = MemStorage::new();
        let (mut wal, _, _) = open(&disk);
        commit_windows(&mut wal, &[&[5000], &[300, 300]]);
        let (seq, offset, padded) = commit_windows(&mut wal, &[&[9000, 100]]);
        let durable = wal.durable_lsn();
        if covered {
            block_on(wal.record_end()).unwrap();
            assert_eq!(wal.end_lag(), 0);
        } else {
            assert_eq!(
                wal.end_lag(),
                durable,
                "the default cadence has not recorded yet"
            );
        }
        // Two faults: the window's head sector and its marker sector are both zeroed.
        disk.zero_sector(&file_name(seq), offset / SECTOR as u64)
            .unwrap();
        disk.zero_sector(&file_name(seq), (offset + padded) / SECTOR as u64)
            .unwrap();
        let (mut wal, recovery, seen) = open(&disk);
        assert_eq!(seen.last().unwrap().0, durable - 2);
        if covered {
            let lost = WalDamage {
                file: seq,
                offset,
                lsn_first: durable - 1,
                lsn_last: durable,
            };
            assert_eq!(recovery.damage, vec![lost], "{recovery:?}");
            // Sealed: never reused, reported again after more appends.
            assert_eq!(
                block_on(wal.append(1, &frame(1, 10), 0)).unwrap(),
                durable + 1
            );
            let (_, again, _) = open(&disk);
            assert_eq!(again.damage, vec![lost]);
        } else {
            // The documented blind spot: lsns past the record read as a torn tail.
            assert!(recovery.is_clean(), "{recovery:?}");
            assert!(recovery.torn_tail.is_some());
        }
    }
}

#[test]
fn the_record_costs_no_sync_per_commit_in_steady_state() {
    let disk = MemStorage::new();
    let (mut wal, _, _) = open(&disk);
    wal.set_end_interval(8);
    let (_, syncs_before) = disk.counts();
    for i in 0..32u64 {
        wal.submit(1, &frame(i, 100), 0).unwrap();
        block_on(wal.commit()).unwrap();
    }
    // One sync per commit, plus one record (one sync) every 8 commits.
    assert_eq!(disk.counts().1 - syncs_before, 32 + 4);
    assert_eq!(wal.end_lag(), 0);
}

#[test]
fn wal_files_without_a_record_refuse_to_open() {
    let disk = MemStorage::new();
    let (mut wal, _, _) = open(&disk);
    block_on(wal.append(1, &frame(1, 10), 0)).unwrap();
    block_on(disk.remove(END_FILE)).unwrap();
    assert_eq!(
        block_on(PartitionWal::open(disk.clone(), CONFIG, |_| {})).err(),
        Some(WalError::EndRecord(EndFault::Missing))
    );
    // A fresh directory opens; so does one whose first file never got past its preallocation,
    // beside the record a fresh open writes before that file (it names no file).
    let disk = MemStorage::new();
    let (_, recovery, _) = open(&disk);
    assert!(recovery.is_clean());
    let disk = MemStorage::new();
    let mut record = block_on(open_end(&disk)).unwrap().unwrap();
    let none = WalEnd {
        oldest: 1,
        newest: 0,
        floor: 1,
        durable: 0,
    };
    block_on(record.write(&disk, none)).unwrap();
    let file = block_on(disk.open(&file_name(1), OpenMode::Create)).unwrap();
    block_on(disk.sync(&file)).unwrap();
    let (_, recovery, _) = open(&disk);
    assert!(recovery.is_clean(), "{recovery:?}");
}

/// Decision 481: an empty first file with no record, or a record cut to length 0, is not a
/// crash during formatting (the record comes first), so it refuses instead of opening fresh.
/// Before, a WAL file cut to nothing beside a `wal-end` cut to nothing reopened empty, and
/// every durable lsn was lost without a word (a proptest finding).
#[test]
fn wal_files_beside_an_empty_record_refuse_to_open() {
    let disk = MemStorage::new();
    let file = block_on(disk.open(&file_name(1), OpenMode::Create)).unwrap();
    block_on(disk.sync(&file)).unwrap();
    assert_eq!(
        block_on(PartitionWal::open(disk.clone(), CONFIG, |_| {})).err(),
        Some(WalError::EndRecord(EndFault::Missing))
    );
    let disk = MemStorage::new();
    let (mut wal, _, _) = open(&disk);
    block_on(wal.append(1, &frame(1, 10), 0)).unwrap();
    block_on(wal.record_end()).unwrap();
    drop(wal);
    disk.truncate_file(&file_name(1), 0).unwrap();
    disk.truncate_file(END_FILE, 0).unwrap();
    assert_eq!(
        block_on(PartitionWal::open(disk.clone(), CONFIG, |_| {})).err(),
        Some(WalError::EndRecord(EndFault::Missing))
    );
}

/// The order that makes the refusal safe: a power cut at any point of a fresh directory's
/// first open leaves a directory that opens clean.
#[test]
fn a_power_cut_during_the_first_open_leaves_a_directory_that_opens() {
    let mut cuts = 0;
    for op in [FailOp::Write, FailOp::Sync] {
        for skip in 0..8 {
            for seed in 0..8 {
                let disk = MemStorage::new();
                disk.fail_after(op, skip);
                let opened = block_on(PartitionWal::open(disk.clone(), CONFIG, |_| {}));
                cuts += usize::from(opened.is_err());
                disk.crash(CrashMode::Reorder, &mut Prng::new(seed));
                let (_, recovery, _) = open(&disk);
                assert!(
                    recovery.is_clean(),
                    "{op:?} {skip} seed {seed}: {recovery:?}"
                );
            }
        }
    }
    // Every write and sync of a fresh open was cut at least once.
    assert!(cuts >= 8 * 4, "{cuts} cuts");
}

/// Decision 400: `release` takes files out of the WAL without removing them. A crash before
/// the caller removes them changes nothing a reopen sees: the durable-end record already names
/// the new floor, so the open removes the leftovers and replays only the records above it,
/// clean; removing them later through `retire` leaves the same log.
#[test]
fn released_files_left_at_a_crash_are_removed_by_the_next_open() {
    let disk = MemStorage::new();
    let (mut wal, _, _) = open(&disk);
    let big: &[usize] = &[70_000];
    commit_windows(&mut wal, &[big, big, big, big, big, big, big]);
    assert_eq!(wal.file_count(), 3);
    let released = block_on(wal.release(7)).unwrap();
    let names: Vec<String> = released.iter().map(|r| r.name.clone()).collect();
    assert_eq!(names, vec![file_name(1), file_name(2)]);
    assert_eq!((wal.floor(), wal.file_count()), (7, 1));
    let listed = block_on(disk.list()).unwrap();
    assert!(names.iter().all(|n| listed.contains(n)), "{listed:?}");
    // A crash now: the files are still there.
    let crashed = disk.durable_copy();
    let (wal2, recovery, seen) = open(&crashed);
    assert!(recovery.is_clean(), "{recovery:?}");
    assert_eq!(wal2.floor(), 7);
    assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), vec![7]);
    let listed = block_on(crashed.list()).unwrap();
    assert!(names.iter().all(|n| !listed.contains(n)), "{listed:?}");
    // No crash: the caller retires them, and a reopen sees the same log.
    for r in released {
        block_on(disk.retire(r.file, &r.name)).unwrap();
    }
    let listed = block_on(disk.list()).unwrap();
    assert!(names.iter().all(|n| !listed.contains(n)), "{listed:?}");
    let (_, recovery, seen) = open(&disk);
    assert!(recovery.is_clean(), "{recovery:?}");
    assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), vec![7]);
}

/// A body-reference record replays as the prepare's header and where its body is; a later
/// whole record of the op replaces it, a truncation drops it, and a reference whose header
/// does not name the referenced length is not a prepare.
#[test]
fn body_references_replay_with_their_header_and_place() {
    use crate::prepare::tests::prepare_in;
    let disk = MemStorage::new();
    let (mut wal, _, _) = open(&disk);
    let header = |op: u64, body_len: usize| -> [u8; HEADER_SIZE] {
        prepare_in(9, op, 0, body_len, 0)[..HEADER_SIZE]
            .try_into()
            .unwrap()
    };
    // Both kinds of reference (decision 498): the kind round-trips with the record.
    let body = |op: u64| BodyRef {
        by: if op.is_multiple_of(3) {
            BodyHash::WholeBody
        } else {
            BodyHash::BatchChecksum
        },
        segment: 0,
        position: op * 100,
        len: 100,
        hash: op,
        base_offset: op * 10,
        end_offset: op * 10 + 10,
    };
    for op in 1..=4 {
        wal.submit_ref(9, &header(op, 100), &body(op), 0).unwrap();
    }
    wal.submit(9, &prepare_in(9, 2, 0, 100, 3), 0).unwrap();
    wal.submit_truncate(9, 4, 0).unwrap();
    wal.submit_ref(9, &header(5, 99), &body(5), 0).unwrap();
    let small = wal.window_bytes();
    assert!(small < 8 * 512, "references stay small: {small} bytes");
    block_on(wal.commit()).unwrap();
    let mut replay = GroupReplay::default();
    block_on(PartitionWal::open(disk.clone(), CONFIG, |r| {
        replay.apply(r)
    }))
    .unwrap();
    assert_eq!(
        replay.undecodable, 1,
        "op 5's header names 99 bytes, its record 100"
    );
    let ops: Vec<u64> = replay.groups[&9].keys().copied().collect();
    assert_eq!(ops, vec![1, 2, 3]);
    let referenced: Vec<u64> = replay.bodies[&9].keys().copied().collect();
    assert_eq!(
        referenced,
        vec![1, 3],
        "op 2 was written whole after its reference"
    );
    assert_eq!(replay.bodies[&9][&1], body(1));
    assert_eq!(replay.bodies[&9][&3], body(3));
    assert_eq!(replay.groups[&9][&3], header(3, 100).to_vec());
    assert_eq!(replay.groups[&9][&2], prepare_in(9, 2, 0, 100, 3));
}

/// Decision 471: a WAL file this process creates has its blocks written with zeros ahead of its
/// windows, in the same round as a window's write and never over it; a file found at open is
/// never zeroed (only its windows are written). Either way the log reads back whole.
#[test]
fn a_created_file_is_zeroed_ahead_of_its_windows_and_a_found_one_is_not() {
    let disk = MemStorage::new();
    disk.log_writes();
    let (mut wal, _, _) = open(&disk);
    let first = file_name(1);
    let mut expected = Vec::new();
    for i in 0..3u64 {
        let f = frame(i, 2000);
        let lsn = wal.submit(7, &f, 0).unwrap();
        expected.push((lsn, 7, f));
        block_on(wal.commit()).unwrap();
    }
    let writes = disk.writes_to(&first);
    let window_end = (SECTOR + MARKER) as u64;
    assert_eq!(
        writes,
        vec![
            (0, SECTOR + MARKER),
            (window_end, (CONFIG.file_size_max - window_end) as usize),
            (SECTOR as u64, SECTOR + MARKER),
            (2 * SECTOR as u64, SECTOR + MARKER),
        ],
        "one zero write past the first window, to the end of this small file, then windows"
    );
    let image = disk.durable_image(&first).unwrap();
    assert!(
        image[4 * SECTOR..].iter().all(|b| *b == 0),
        "the zeros changed no byte past the log"
    );
    let (mut wal, recovery, seen) = open(&disk);
    assert!(recovery.is_clean());
    assert_eq!(seen, expected);
    let before = disk.writes_to(&first).len();
    let f = frame(9, 2000);
    let lsn = wal.submit(7, &f, 0).unwrap();
    expected.push((lsn, 7, f));
    block_on(wal.commit()).unwrap();
    assert_eq!(
        disk.writes_to(&first)[before..],
        [(3 * SECTOR as u64, SECTOR + MARKER)],
        "a file found at open takes its windows only"
    );
    let (_, recovery, seen) = open(&disk);
    assert!(recovery.is_clean());
    assert_eq!(seen, expected);
}

/// A reference names its batch by the batch checksum (decision 498): the batch as written is
/// named, and no change of one byte of it is (the whole batch is verified, not only the
/// checksum compared), nor the batch with a byte more or less. A reference of the kind written
/// before, naming its body by the XXH3-64 of all of it, still names exactly that body; the two
/// kinds' hashes are never taken for one another.
#[test]
fn a_body_reference_names_its_batch_whole() {
    let batch = crate::batch::build(4, 200, 7_000, &[b"first message", b"", b"and a third"]);
    let at = BodyRef::of(9, 4096, &batch).expect("a batch");
    assert_eq!(at.by, BodyHash::BatchChecksum);
    assert_eq!(at.hash, wire::batch::peek(&batch).unwrap().checksum);
    assert_eq!(
        (at.len, at.base_offset, at.end_offset),
        (batch.len() as u64, 200, 203)
    );
    assert!(at.names(&batch));
    for i in 0..batch.len() {
        let mut bad = batch.clone();
        bad[i] ^= 0x04;
        assert!(!at.names(&bad), "byte {i} changed and still named");
    }
    let mut longer = batch.clone();
    longer.push(0);
    assert!(!at.names(&longer));
    assert!(!BodyHash::BatchChecksum.names(at.hash, &longer));
    assert!(!at.names(&batch[..batch.len() - 1]));
    let old = BodyRef {
        by: BodyHash::WholeBody,
        hash: wire::integrity::xxh3(&batch),
        ..at
    };
    assert!(old.names(&batch));
    let mut bad = batch.clone();
    bad[300] ^= 1;
    assert!(!old.names(&bad));
    assert!(
        !BodyRef {
            hash: at.hash,
            ..old
        }
        .names(&batch)
    );
    assert!(
        !BodyRef {
            hash: old.hash,
            ..at
        }
        .names(&batch)
    );
}
