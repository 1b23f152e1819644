use super::*;
use crate::batch::build;
use crate::mem::MemStorage;
use crate::storage::block_on;

fn table() -> OffsetTable {
    OffsetTable {
        purge_generation: 2,
        next_offset: 90,
        consumers: [(1, 10), (5, 50)].into_iter().collect(),
        groups: [(3, 30)].into_iter().collect(),
    }
}

#[test]
fn ico1_and_ict2_round_trip_and_refuse_damage() {
    let bytes = table().encode();
    assert_eq!(OffsetTable::decode(&bytes).unwrap(), table());
    for at in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[at] ^= 1;
        assert!(OffsetTable::decode(&bad).is_err(), "byte {at}");
    }
    assert!(OffsetTable::decode(&bytes[..5]).is_err());
    let clients = vec![
        ClientEntry {
            client: 7,
            epoch: 3,
            user_id: 1,
            watermark: 4,
            watermark_checksum: 99,
            replies: vec![vec![1, 2, 3], vec![]],
        },
        ClientEntry::default(),
    ];
    let bytes = encode_client_table(&clients);
    assert_eq!(decode_client_table(&bytes).unwrap(), clients);
    for at in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[at] ^= 0x80;
        assert!(decode_client_table(&bad).is_err(), "byte {at}");
    }
}

#[test]
fn manifests_carry_the_artifact_checksums() {
    let a = b"snapshot payload".to_vec();
    let b = encode_client_table(&[]);
    let manifest_bytes = build_manifest(&[
        (ArtifactKind::METADATA_SNAPSHOT, 7, &a),
        (ArtifactKind::CLIENT_TABLE, 9, &b),
    ])
    .unwrap();
    let entries = manifest::decode(&manifest_bytes).unwrap().to_vec();
    assert_eq!(entries[0].frontier, 7);
    assert_eq!(entries[1].checksum, manifest::artifact_checksum(&b));
    assert!(verify_artifacts(&entries, &[a.clone(), b.clone()]).is_ok());
    let mut bad = a.clone();
    bad[0] ^= 1;
    assert_eq!(
        verify_artifacts(&entries, &[bad, b]),
        Err(ArtifactError::Checksum { index: 0 })
    );
}

#[test]
fn stores_survive_reopen() {
    let disk = MemStorage::new();
    block_on(async {
        let (mut offsets, empty, damaged) = OffsetStore::open(disk.clone(), "p1-").await.unwrap();
        assert_eq!(empty, OffsetTable::default());
        assert!(!damaged);
        offsets.write(&table(), true).await.unwrap();
        let (_, back, _) = OffsetStore::open(disk.clone(), "p1-").await.unwrap();
        assert_eq!(back, table());
        let (mut snapshots, none) = SnapshotStore::open(disk.clone()).await.unwrap();
        assert!(none.is_none());
        let snapshot = Snapshot {
            op: 64,
            payload: vec![5; 10_000],
        };
        snapshots.write(&snapshot).await.unwrap();
        let (_, back) = SnapshotStore::open(disk.clone()).await.unwrap();
        assert_eq!(back.as_ref(), Some(&snapshot));
        assert_eq!(back.unwrap().checksum(), widen(xxh3(&[5; 10_000])));
    });
}

#[test]
fn a_partition_offer_installs_elsewhere_and_tampering_is_refused_before_any_change() {
    let policy = FlushPolicy {
        enforce_fsync: true,
        messages_required_to_save: 1,
        size_of_messages_required_to_save: 1 << 20,
        segment_size: 8192,
    };
    let source = MemStorage::new();
    let (mut log, _) = block_on(PartitionLog::open(source.clone(), "p1-", policy, 0)).unwrap();
    for i in 0..20u64 {
        log.commit_batch(build(1, i * 2, 100 + i, &[&[i as u8; 700], b"x"]))
            .unwrap();
        block_on(log.flush()).unwrap();
    }
    let offer = block_on(partition_offer(&mut log, &table(), 33)).unwrap();
    let entries = manifest::decode(&offer.manifest).unwrap().to_vec();
    assert!(entries.len() > 2);
    assert_eq!(entries.last().unwrap().kind, ArtifactKind::CONSUMER_OFFSETS);

    let target = MemStorage::new();
    // The target has an old log of its own.
    let (mut old, _) = block_on(PartitionLog::open(target.clone(), "p1-", policy, 0)).unwrap();
    old.commit_batch(build(1, 0, 1, &[b"old"])).unwrap();
    block_on(old.sync()).unwrap();
    drop(old);
    let mut tampered = offer.artifacts.clone();
    tampered[1][300] ^= 1;
    assert_eq!(
        block_on(install_partition(
            target.clone(),
            "p1-",
            policy,
            &offer.manifest,
            &tampered
        ))
        .err(),
        Some(ArtifactError::Checksum { index: 1 })
    );
    let (old, _) = block_on(PartitionLog::open(target.clone(), "p1-", policy, 0)).unwrap();
    assert_eq!(old.next_offset(), 1, "a refused install changes nothing");
    drop(old);

    let (installed, recovery, offsets) = block_on(install_partition(
        target.clone(),
        "p1-",
        policy,
        &offer.manifest,
        &offer.artifacts,
    ))
    .unwrap();
    assert_eq!(recovery.staging_swept, 0);
    assert_eq!(installed.next_offset(), 40);
    assert_eq!(offsets.next_offset, 40);
    let a = block_on(log.read_from_offset(0, u64::MAX)).unwrap();
    let b = block_on(installed.read_from_offset(0, u64::MAX)).unwrap();
    assert_eq!(a, b);
    assert!(
        block_on(target.list())
            .unwrap()
            .iter()
            .all(|n| !n.starts_with("staging-"))
    );
}
