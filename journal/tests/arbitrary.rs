//! Nothing read from disk may panic: every decoder and every recovery scan gets arbitrary bytes
//! and must answer with a value.

use journal::artifact::{OffsetTable, decode_client_table};
use journal::mem::MemStorage;
use journal::metadata::{HEADERS_FILE, JournalConfig, MetadataJournal, PREPARES_FILE};
use journal::segment::{FlushPolicy, PartitionLog, log_name};
use journal::storage::{OpenMode, SECTOR, Storage, block_on};
use journal::superblock::{Identity, Superblock};
use journal::wal::{PartitionWal, WalConfig};
use proptest::prelude::*;

fn disk_with(files: &[(&str, Vec<u8>)]) -> MemStorage {
    let disk = MemStorage::new();
    block_on(async {
        for (name, bytes) in files {
            let file = disk.open(name, OpenMode::Create).await.unwrap();
            let mut padded = bytes.clone();
            padded.resize(bytes.len().next_multiple_of(SECTOR), 0);
            disk.write_at(&file, 0, &padded).await.unwrap();
            disk.sync(&file).await.unwrap();
        }
    });
    disk
}

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..max)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn decoders_never_panic(data in bytes(4096)) {
        let _ = OffsetTable::decode(&data);
        let _ = decode_client_table(&data);
        // With a matching trailer (random bytes never have one) the field parsers run too.
        let mut trailed = data.clone();
        trailed.extend_from_slice(&wire::integrity::xxh3(&data).to_le_bytes());
        let _ = OffsetTable::decode(&trailed);
        let _ = decode_client_table(&trailed);
        let mut tagged = b"ICT2".to_vec();
        tagged.extend_from_slice(&data);
        tagged.extend_from_slice(&wire::integrity::xxh3(&tagged).to_le_bytes());
        let _ = decode_client_table(&tagged);
        let _ = journal::batch::verify(&data);
        let _ = journal::prepare::verify_frame(&data, true);
    }

    #[test]
    fn superblock_open_never_panics(data in bytes(4 * SECTOR)) {
        let disk = disk_with(&[("superblock", data)]);
        let id = Identity { cluster: 1, replica_id: 0, replica_count: 1 };
        let _ = block_on(Superblock::open(disk, "", id));
    }

    #[test]
    fn metadata_recovery_never_panics(ring in bytes(SECTOR), prepares in bytes(8 * SECTOR)) {
        let disk = disk_with(&[(HEADERS_FILE, ring), (PREPARES_FILE, prepares)]);
        let config = JournalConfig { slot_count: 8, slot_size: SECTOR as u64 };
        let (_, recovery) = block_on(MetadataJournal::open(disk, config, 0, 0)).unwrap();
        prop_assert_eq!(recovery.slots.len(), 8);
    }

    #[test]
    fn wal_recovery_never_panics(data in bytes(8 * SECTOR)) {
        let config = WalConfig { file_size_max: 8 * SECTOR as u64, window_bytes_max: 4 * SECTOR, window_us_max: 0 };
        // A WAL opened once (its durable-end record names file 1), whose file then holds
        // arbitrary bytes: the scan answers.
        let disk = MemStorage::new();
        drop(block_on(PartitionWal::open(disk.clone(), config, |_| {})).unwrap());
        block_on(async {
            let file = disk.open("wal.0000000001", OpenMode::Existing).await.unwrap();
            let mut padded = data.clone();
            padded.resize(data.len().next_multiple_of(SECTOR), 0);
            disk.set_len(&file, 0).await.unwrap();
            disk.write_at(&file, 0, &padded).await.unwrap();
            disk.sync(&file).await.unwrap();
        });
        let _ = block_on(PartitionWal::open(disk, config, |_| {})).unwrap();
    }

    #[test]
    fn wal_end_record_never_panics(data in bytes(4 * SECTOR), window in bytes(2 * SECTOR)) {
        let disk = disk_with(&[(journal::wal::END_FILE, data), ("wal.0000000001", window)]);
        let config = WalConfig { file_size_max: 8 * SECTOR as u64, window_bytes_max: 4 * SECTOR, window_us_max: 0 };
        // Refused (an untrustworthy record) or opened: an answer either way.
        let _ = block_on(PartitionWal::open(disk, config, |_| {}));
    }

    #[test]
    fn segment_recovery_and_reads_never_panic(log in bytes(4 * SECTOR), index in bytes(SECTOR)) {
        let disk = disk_with(&[
            (log_name("p-", 0).as_str(), log),
            (journal::segment::index_name("p-", 0).as_str(), index),
        ]);
        let (log, _) = block_on(PartitionLog::open(disk, "p-", FlushPolicy::default(), 0)).unwrap();
        let _ = block_on(log.read_from_offset(0, u64::MAX));
        let _ = block_on(log.read_from_timestamp(0, u64::MAX));
    }
}
