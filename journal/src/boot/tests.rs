use super::*;
use crate::batch::build;
use crate::mem::{CrashMode, FailOp, MemStorage, Prng};
use crate::prepare::tests::{prepare, prepare_in};
use crate::storage::{SECTOR, block_on};
use crate::wal::WalDamage;

const ID: Identity = Identity {
    cluster: 42,
    replica_id: 0,
    replica_count: 3,
};
const CONFIG: JournalConfig = JournalConfig {
    slot_count: 16,
    slot_size: 2 * SECTOR as u64,
};
const WAL: WalConfig = WalConfig {
    file_size_max: 64 * SECTOR as u64,
    window_bytes_max: 16 * SECTOR,
    window_us_max: 0,
};

fn metadata(disk: &MemStorage) -> Result<MetadataBoot<MemStorage>, BootError> {
    block_on(boot_metadata(disk.clone(), ID, CONFIG))
}

fn shard(disk: &MemStorage, groups: &[(u64, u64)]) -> ShardBoot<MemStorage> {
    let groups: BTreeMap<u64, u64> = groups.iter().copied().collect();
    block_on(boot_shard(disk.clone(), WAL, &groups)).expect("shard boots")
}

#[test]
fn boot_formats_once_and_never_over_data() {
    let disk = MemStorage::new();
    let mut boot = metadata(&disk).unwrap();
    assert!(boot.formatted);
    assert_eq!(boot.state, None, "only formatted: fresh");
    assert_eq!(boot.superblock.state().map(|s| s.identity()), Some(ID));
    block_on(boot.journal.append(&prepare(1, 0, 10, 0))).unwrap();
    drop(boot);
    let boot = metadata(&disk).unwrap();
    assert!(!boot.formatted);
    assert_eq!(boot.recovery.op_head, 1);
    drop(boot);
    // The superblock is lost (emptied, or its file gone): a fresh one would format over op 1.
    for lose in 0..2 {
        let copy = disk.durable_copy();
        if lose == 0 {
            copy.truncate_file("superblock", 0).unwrap();
        } else {
            block_on(copy.remove("superblock")).unwrap();
        }
        match metadata(&copy) {
            Err(BootError::Superblock(SuperblockError::DataWithoutSuperblock {
                dir,
                files,
                ..
            })) => {
                assert_eq!(dir, copy.location());
                assert_eq!(
                    files,
                    vec![
                        crate::metadata::PREPARES_FILE.to_owned(),
                        crate::metadata::HEADERS_FILE.to_owned()
                    ]
                );
            }
            other => panic!("lose {lose}: {other:?}"),
        }
        // Refused again at the next attempt (the refusal wrote nothing).
        assert!(metadata(&copy).is_err());
    }
}

#[test]
fn the_refusal_names_the_directory_on_the_file_backend() {
    let dir = std::env::temp_dir().join(format!("strand-boot-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let storage = crate::FileStorage::new(&dir, false).unwrap();
    let mut boot = block_on(boot_metadata(storage.clone(), ID, CONFIG)).unwrap();
    block_on(boot.journal.append(&prepare(1, 0, 10, 0))).unwrap();
    drop(boot);
    std::fs::remove_file(dir.join("superblock")).unwrap();
    let error = block_on(boot_metadata(storage, ID, CONFIG)).unwrap_err();
    let message = error.to_string();
    assert!(message.contains(&dir.display().to_string()), "{message}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_partition_group_without_its_superblock_beside_segments_refuses() {
    let disk = MemStorage::new();
    block_on(async {
        let policy = crate::FlushPolicy::default();
        let mut boot = crate::recover_partition(
            disk.clone(),
            "g7-",
            ID,
            policy,
            BTreeMap::new(),
            &BTreeMap::new(),
        )
        .await
        .unwrap();
        boot.superblock
            .write(&VsrState {
                cluster: 42,
                replica_count: 3,
                ..VsrState::default()
            })
            .await
            .unwrap();
        boot.log.commit_batch(build(7, 0, 1, &[b"a"])).unwrap();
        boot.log.sync().await.unwrap();
        disk.remove("g7-superblock").await.unwrap();
        let error = crate::recover_partition(
            disk.clone(),
            "g7-",
            ID,
            policy,
            BTreeMap::new(),
            &BTreeMap::new(),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(
                error,
                crate::PartitionError::Superblock(SuperblockError::DataWithoutSuperblock { .. })
            ),
            "{error:?}"
        );
        // Another group's prefix in the same directory holds nothing: it boots fresh.
        assert!(
            crate::recover_partition(
                disk.clone(),
                "g8-",
                ID,
                policy,
                BTreeMap::new(),
                &BTreeMap::new()
            )
            .await
            .is_ok()
        );
    });
}

#[test]
fn a_slot_count_mismatch_refuses_naming_both_values() {
    let disk = MemStorage::new();
    metadata(&disk).unwrap();
    let other = JournalConfig {
        slot_count: 32,
        ..CONFIG
    };
    let error = block_on(boot_metadata(disk.clone(), ID, other)).unwrap_err();
    assert_eq!(
        error,
        BootError::Geometry {
            dir: disk.location(),
            configured_slots: 32,
            formatted_slots: 16,
            configured_size: CONFIG.slot_size,
            formatted_size: CONFIG.slot_size,
        }
    );
    let message = error.to_string();
    assert!(
        message.contains("32") && message.contains("16"),
        "{message}"
    );
    assert!(metadata(&disk).is_ok());
}

#[test]
fn a_snapshot_behind_the_superblock_refuses() {
    let disk = MemStorage::new();
    let mut boot = metadata(&disk).unwrap();
    let mut parent = 0;
    for op in 1..=6 {
        let frame = prepare(op, parent, 10, 0);
        block_on(boot.journal.append(&frame)).unwrap();
        parent = crate::prepare::verify_frame(&frame, true)
            .unwrap()
            .identity();
    }
    let snapshot = Snapshot {
        op: 4,
        payload: vec![4; 100],
    };
    block_on(crate::checkpoint(
        &mut boot.snapshots,
        &mut boot.superblock,
        &mut boot.journal,
        &snapshot,
        crate::recover::formatted_state(ID),
    ))
    .unwrap();
    drop(boot);
    let boot = metadata(&disk).unwrap();
    assert_eq!(boot.snapshot.as_ref().map(|s| s.op), Some(4));
    drop(boot);
    // The snapshot rots (both copies: only one generation was written).
    for name in ["snapshot.0", "snapshot.1"] {
        if disk.durable_image(name).is_some_and(|i| !i.is_empty()) {
            disk.flip_bit(name, 40, 1).unwrap();
        }
    }
    assert!(matches!(
        metadata(&disk),
        Err(BootError::Pairing(PairingError::SnapshotBehind {
            checkpoint_op: 4,
            ..
        }))
    ));
}

/// Group 1 ops 1..=3 and group 2 ops 1..=2 in two windows, then a last window with group 1
/// op 4 and group 2 op 3. Returns `(file, offset, padded bytes)` of the last window.
fn three_windows(boot: &mut ShardBoot<MemStorage>) -> (u64, u64, u64) {
    let wal = &mut boot.wal;
    for (g, op) in [(1, 1), (2, 1), (1, 2)] {
        wal.submit(g, &prepare_in(g, op, 0, 3000, 1), 0).unwrap();
    }
    block_on(wal.commit()).unwrap();
    for (g, op) in [(2, 2), (1, 3)] {
        wal.submit(g, &prepare_in(g, op, 0, 3000, 2), 0).unwrap();
    }
    block_on(wal.commit()).unwrap();
    let (names, offset) = wal.layout();
    for (g, op) in [(1, 4), (2, 3)] {
        wal.submit(g, &prepare_in(g, op, 0, 5000, 3), 0).unwrap();
    }
    let padded = crate::storage::sector_ceil(wal.window_bytes() as u64);
    block_on(wal.commit()).unwrap();
    let seq = names.last().unwrap()[4..].parse().unwrap();
    (seq, offset, padded)
}

#[test]
fn unverified_ranges_are_handed_up_per_group_and_remembered() {
    let disk = MemStorage::new();
    let groups = [(1, 0), (2, 0), (3, 10)];
    let mut boot = shard(&disk, &groups);
    let (seq, offset, _) = three_windows(&mut boot);
    drop(boot);
    // A zero sector inside the last window (not its head): unverified, lsns 6..=7.
    disk.zero_sector(&format!("wal.{seq:010}"), offset / SECTOR as u64 + 1)
        .unwrap();
    let mut boot = shard(&disk, &groups);
    assert_eq!(
        boot.recovery.unverified,
        vec![WalDamage {
            file: seq,
            offset,
            lsn_first: 6,
            lsn_last: 7
        }]
    );
    let expected: BTreeMap<u64, Vec<FaultyOps>> = [
        (
            1,
            vec![FaultyOps {
                first: 4,
                last: Some(5),
            }],
        ),
        (
            2,
            vec![FaultyOps {
                first: 3,
                last: Some(4),
            }],
        ),
        (
            3,
            vec![FaultyOps {
                first: 11,
                last: Some(12),
            }],
        ),
    ]
    .into_iter()
    .collect();
    assert_eq!(boot.faults.faulty(), &expected);
    assert_eq!(
        boot.replay.groups[&1].keys().copied().collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    // The log goes on; a second crash (unsynced window lost) keeps the faults.
    block_on(boot.wal.append(1, &prepare_in(1, 4, 0, 100, 9), 0)).unwrap();
    boot.wal.submit(2, &prepare_in(2, 3, 0, 100, 9), 0).unwrap();
    drop(boot);
    disk.crash(CrashMode::LoseUnsynced, &mut Prng::new(1));
    let mut boot = shard(&disk, &groups);
    assert_eq!(boot.faults.faulty(), &expected);
    // Op 4 of group 1 came back repaired but stays out until the caller says so.
    assert!(!boot.replay.groups[&1].contains_key(&4));
    block_on(boot.faults.repaired(1, 5)).unwrap();
    block_on(boot.faults.repaired(3, 12)).unwrap();
    drop(boot);
    let boot = shard(&disk, &groups);
    let left: Vec<u64> = boot.faults.faulty().keys().copied().collect();
    assert_eq!(left, vec![2]);
    assert!(boot.replay.groups[&1].contains_key(&4));
}

#[test]
fn truncated_ranges_are_handed_up_and_remembered_past_the_wal() {
    let disk = MemStorage::new();
    let groups = [(1, 0), (2, 0)];
    let mut boot = shard(&disk, &groups);
    let (seq, offset, _) = three_windows(&mut boot);
    drop(boot);
    // The file loses its tail from inside the last window: lsns from 6 on, end unknown.
    disk.truncate_file(&format!("wal.{seq:010}"), offset + SECTOR as u64)
        .unwrap();
    let mut boot = shard(&disk, &groups);
    assert_eq!(boot.recovery.truncated, vec![seq]);
    let expected: BTreeMap<u64, Vec<FaultyOps>> = [
        (
            1,
            vec![FaultyOps {
                first: 4,
                last: None,
            }],
        ),
        (
            2,
            vec![FaultyOps {
                first: 3,
                last: None,
            }],
        ),
    ]
    .into_iter()
    .collect();
    assert_eq!(boot.faults.faulty(), &expected);
    // The WAL itself forgets a loss past its durable-end record once it appends over it; the
    // boot record does not.
    block_on(boot.wal.append(1, &prepare_in(1, 4, 0, 100, 9), 0)).unwrap();
    drop(boot);
    disk.crash(CrashMode::LoseUnsynced, &mut Prng::new(2));
    let boot = shard(&disk, &groups);
    assert!(boot.recovery.is_clean(), "{:?}", boot.recovery);
    assert_eq!(boot.faults.faulty(), &expected);
}

#[test]
fn a_torn_last_window_after_a_power_cut_is_cut_not_faulty() {
    let mut cut = 0;
    for seed in 0..60 {
        let disk = MemStorage::new();
        let groups = [(1, 0), (2, 0)];
        let mut boot = shard(&disk, &groups);
        three_windows(&mut boot);
        for (g, op) in [(1, 5), (2, 4), (1, 6)] {
            boot.wal
                .submit(g, &prepare_in(g, op, 0, 7000, 4), 0)
                .unwrap();
        }
        disk.fail_next(FailOp::Sync);
        assert!(block_on(boot.wal.commit()).is_err());
        drop(boot);
        let mode = [CrashMode::TornPrefix, CrashMode::LoseUnsynced][seed % 2];
        disk.crash(mode, &mut Prng::new(seed as u64));
        let boot = shard(&disk, &groups);
        assert!(
            boot.faults.faulty().is_empty(),
            "seed {seed}: {:?}",
            boot.recovery
        );
        assert!(boot.recovery.is_clean(), "seed {seed}: {:?}", boot.recovery);
        cut += u64::from(boot.recovery.torn_tail.is_some());
    }
    assert!(cut > 0, "no crash tore the last window");
}

fn send_messages(partition: u64, base: u64, count: usize) -> Vec<u8> {
    let mut frame = vec![0u8; wire::HEADER_SIZE];
    frame[208] = wire::Operation::SendMessages.byte();
    let payloads: Vec<&[u8]> = (0..count).map(|_| &b"m"[..]).collect();
    frame.extend_from_slice(&build(partition, base, 1, &payloads));
    frame
}

#[test]
fn reclaim_never_passes_a_groups_synced_segment_offset() {
    let mut guard = ReclaimGuard::default();
    // lsn 1: group 1 offsets 0..2; lsn 2: group 2 offsets 0..3; lsn 3: group 1 offsets 2..4.
    guard.note(1, 1, &send_messages(1, 0, 2));
    guard.note(2, 2, &send_messages(2, 0, 3));
    guard.note(3, 1, &send_messages(1, 2, 2));
    let synced = |g1: u64, g2: u64| move |g: u64| if g == 1 { g1 } else { g2 };
    assert_eq!(guard.limit(synced(0, 0)), 1);
    assert_eq!(guard.limit(synced(2, 0)), 2, "group 2 has synced nothing");
    assert_eq!(guard.limit(synced(3, 3)), 3, "group 1 synced 3 of 4");
    assert_eq!(guard.limit(synced(4, 3)), 4);
    // With the WAL: files whose records are all below the limit go, no others.
    let disk = MemStorage::new();
    let mut boot = shard(&disk, &[]);
    let mut guard = ReclaimGuard::default();
    for i in 0..80u64 {
        let frame = send_messages(1, i * 10, 10);
        let lsn = block_on(
            boot.wal
                .append(1, &[frame.clone(), vec![0; 8000]].concat(), 0),
        )
        .unwrap();
        guard.note(lsn, 1, &frame);
    }
    assert!(boot.wal.file_count() > 2);
    let limit = guard.limit(|_| 300); // records 1..=30 synced
    assert_eq!(limit, 31);
    block_on(boot.wal.reclaim(limit)).unwrap();
    drop(boot);
    let mut first = None;
    let boot = block_on(PartitionWal::open(disk.clone(), WAL, |r| {
        first.get_or_insert(r.lsn);
    }))
    .unwrap();
    assert!(boot.1.is_clean());
    assert!(
        first.unwrap() <= 31,
        "reclaimed past the synced offset: {first:?}"
    );
    assert!(first.unwrap() > 1, "nothing reclaimed");
}
