//! Journal benchmarks: append throughput with one fdatasync per append and with group commit, at
//! 4 KiB, 64 KiB and 1 MiB entries, each next to a raw `O_DIRECT` write + `fdatasync` of the same
//! size measured in the same run; and recovery time of a 1 GiB partition WAL and a 1 GiB
//! metadata journal. Files live in `$JOURNAL_BENCH_DIR` (default: the system temp dir); that
//! filesystem must support `O_DIRECT`.
//!
//! "64 concurrent appenders" is modelled as it runs on a thread-per-core shard: 64 appends (one
//! per appender task) join the open window, and one write + one fdatasync commits them all.

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use journal::{
    AlignedBuf, FileStorage, JournalConfig, MetadataJournal, PartitionWal, SECTOR, WalConfig,
    block_on,
};
use wire::header::{FrameHeader, Layout, PrepareHeader};
use wire::{Command, GroupId, Operation, Sender, finish_header};

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;
const FILE_MAX: u64 = 256 * MIB as u64;
const APPENDERS: usize = 64;

fn bench_dir(tag: &str) -> PathBuf {
    let root = std::env::var_os("JOURNAL_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = root.join(format!("journal-bench-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("bench dir");
    dir
}

fn prepare(group: u64, op: u64, parent: u128, body_len: usize) -> Vec<u8> {
    let mut header = PrepareHeader::zeroed();
    header.frame = FrameHeader::new(
        Command::Prepare,
        Sender {
            cluster: 1,
            replica: 0,
            view: 1,
        },
    );
    header.op.set(op);
    header.parent.set(parent);
    header.operation = Operation::CreateStream.byte();
    header.group.set(group);
    let body: Vec<u8> = (0..body_len).map(|i| (i * 7 + op as usize) as u8).collect();
    finish_header(&mut header, &body).expect("finish");
    let mut frame = header.bytes().to_vec();
    frame.extend_from_slice(&body);
    frame
}

/// Raw O_DIRECT writes of `size` bytes at consecutive offsets of sparse 256 MiB files (a new
/// file when one is full, like the WAL), one fdatasync after every `per_sync` writes.
fn raw_direct(dir: &Path, size: usize, iters: u64, per_sync: u64) -> Duration {
    let path = dir.join("raw");
    let open = || {
        let _ = std::fs::remove_file(&path);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .expect("O_DIRECT open");
        file.set_len(FILE_MAX).expect("set_len");
        file.sync_all().expect("sync");
        file
    };
    let mut file = open();
    let mut buf = AlignedBuf::zeroed(size.next_multiple_of(SECTOR));
    buf.as_mut_slice()
        .iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = i as u8);
    let mut offset = 0u64;
    let start = Instant::now();
    for i in 0..iters {
        if offset + buf.len() as u64 > FILE_MAX {
            file = open();
            offset = 0;
        }
        file.write_all_at(buf.as_slice(), offset).expect("write");
        offset += buf.len() as u64;
        if (i + 1) % per_sync == 0 || i + 1 == iters {
            file.sync_data().expect("fdatasync");
        }
    }
    start.elapsed()
}

fn wal_config() -> WalConfig {
    WalConfig {
        file_size_max: FILE_MAX,
        window_bytes_max: 4 * MIB,
        window_us_max: 1_000,
    }
}

/// WAL appends of `size`-byte frames: with `group`, up to 64 appends share one commit (bounded
/// by the 4 MiB window); without, every append is its own commit.
fn wal_appends(
    wal: &mut PartitionWal<FileStorage>,
    frame: &[u8],
    iters: u64,
    group: bool,
) -> Duration {
    let start = Instant::now();
    let mut in_window = 0;
    for i in 0..iters {
        if group {
            wal.submit(5, frame, 0).expect("submit");
            in_window += 1;
            if in_window == APPENDERS || wal.is_window_full() || i + 1 == iters {
                block_on(wal.commit()).expect("commit");
                in_window = 0;
            }
        } else {
            block_on(wal.append(5, frame, 0)).expect("append");
        }
        if wal.file_count() > 2 {
            let lsn = wal.durable_lsn();
            block_on(wal.reclaim(lsn)).expect("reclaim");
        }
    }
    start.elapsed()
}

fn append(c: &mut Criterion) {
    let dir = bench_dir("append");
    let storage = FileStorage::new(&dir, true).expect("storage");
    let mut group = c.benchmark_group("append");
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(4));
    for size in [4 * KIB, 64 * KIB, MIB] {
        let frame = prepare(5, 1, 0, size - 256);
        group.throughput(Throughput::Bytes(size as u64));
        let label = match size {
            s if s >= MIB => format!("{}MiB", s / MIB),
            s => format!("{}KiB", s / KIB),
        };
        group.bench_function(
            BenchmarkId::new("raw_odirect_fdatasync_each", &label),
            |b| b.iter_custom(|iters| raw_direct(&dir, size, iters, 1)),
        );
        let (mut wal, _) =
            block_on(PartitionWal::open(storage.clone(), wal_config(), |_| {})).expect("open");
        group.bench_function(BenchmarkId::new("wal_fdatasync_each", &label), |b| {
            b.iter_custom(|iters| wal_appends(&mut wal, &frame, iters, false))
        });
        group.bench_function(BenchmarkId::new("wal_group_commit_64", &label), |b| {
            b.iter_custom(|iters| wal_appends(&mut wal, &frame, iters, true))
        });
        drop(wal);
        for name in block_on(journal::Storage::list(&storage)).unwrap_or_default() {
            let _ = std::fs::remove_file(dir.join(name));
        }
    }
    // The metadata journal: two fdatasyncs per append (prepare slot, then header ring).
    let config = JournalConfig {
        slot_count: 1024,
        slot_size: 68 * KIB as u64,
    };
    let frames: Vec<Vec<u8>> = (1..=1024u64)
        .map(|op| prepare(GroupId::METADATA.0, op, 0, 4 * KIB - 256))
        .collect();
    group.throughput(Throughput::Bytes(4 * KIB as u64));
    let meta = FileStorage::new(&dir.join("meta"), true).expect("storage");
    let (mut journal, _) = block_on(MetadataJournal::open(meta, config, 0, 0)).expect("open");
    let mut op = journal.op_head();
    group.bench_function(BenchmarkId::new("metadata_journal_append", "4KiB"), |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                op += 1;
                if journal.capacity_remaining() == 0 {
                    journal.set_checkpoint(op - 1).expect("checkpoint");
                }
                // Frames are reused per slot: identity and chain do not matter here.
                let mut frame = frames[(op - 1) as usize % 1024].clone();
                if op > 1024 {
                    frame = prepare(GroupId::METADATA.0, op, 0, 4 * KIB - 256);
                }
                block_on(journal.append(&frame)).expect("append");
            }
            start.elapsed()
        })
    });
    group.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

fn recovery(c: &mut Criterion) {
    let mut group = c.benchmark_group("recovery");
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(100));
    group.measurement_time(Duration::from_secs(10));
    group.throughput(Throughput::Bytes(1 << 30));

    // 1 GiB partition WAL: 1024 records of 1 MiB, group-committed.
    let dir = bench_dir("wal-recovery");
    let storage = FileStorage::new(&dir, true).expect("storage");
    let frame = prepare(5, 1, 0, MIB - 256 - 64);
    {
        let (mut wal, _) =
            block_on(PartitionWal::open(storage.clone(), wal_config(), |_| {})).expect("open");
        for _ in 0..1024 {
            wal.submit(5, &frame, 0).expect("submit");
            if wal.is_window_full() {
                block_on(wal.commit()).expect("commit");
            }
        }
        block_on(wal.commit()).expect("commit");
    }
    group.bench_function("partition_wal_1GiB", |b| {
        b.iter(|| {
            let mut records = 0u64;
            let (_, recovery) = block_on(PartitionWal::open(storage.clone(), wal_config(), |_| {
                records += 1
            }))
            .expect("open");
            assert_eq!(records, 1024);
            assert!(recovery.is_clean());
        })
    });
    let _ = std::fs::remove_dir_all(&dir);

    // 1 GiB metadata journal: 1024 slots of 1 MiB, each holding a ~1 MiB prepare.
    let dir = bench_dir("meta-recovery");
    let storage = FileStorage::new(&dir, true).expect("storage");
    let config = JournalConfig {
        slot_count: 1024,
        slot_size: MIB as u64,
    };
    {
        let (mut journal, _) =
            block_on(MetadataJournal::open(storage.clone(), config, 0, 0)).expect("open");
        let mut parent = 0;
        for op in 1..=1024 {
            let frame = prepare(GroupId::METADATA.0, op, parent, MIB - 256 - 8);
            block_on(journal.append(&frame)).expect("append");
            parent = u128::from_le_bytes(frame[0..16].try_into().expect("16"));
        }
    }
    group.bench_function("metadata_journal_1GiB", |b| {
        b.iter(|| {
            let (_, recovery) =
                block_on(MetadataJournal::open(storage.clone(), config, 0, 0)).expect("open");
            assert_eq!(recovery.headers.len(), 1024);
            assert!(recovery.is_clean());
        })
    });
    group.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The same WAL appends on the glommio DMA backend (feature `glommio`), each sample inside its
/// own executor (`io_memory` 2 MiB, unbound), next to the std backend's figures above.
#[cfg(feature = "glommio")]
fn append_dma(c: &mut Criterion) {
    use glommio::{LocalExecutorBuilder, Placement};
    use journal::dma::DmaStorage;
    let dir = bench_dir("append-dma");
    let dir_root = dir.clone();
    let mut group = c.benchmark_group("append_dma");
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(4));
    for size in [4 * KIB, MIB] {
        let label = if size >= MIB { "1MiB" } else { "4KiB" };
        group.throughput(Throughput::Bytes(size as u64));
        for grouped in [false, true] {
            let name = if grouped {
                "wal_group_commit_64"
            } else {
                "wal_fdatasync_each"
            };
            // One executor and one open WAL per series; criterion's thread asks it to run
            // `iters` appends and gets the elapsed time back.
            let (ask, asked) = std::sync::mpsc::channel::<u64>();
            let (tell, told) = std::sync::mpsc::channel::<Duration>();
            let dir = dir.clone();
            let executor = LocalExecutorBuilder::new(Placement::Unbound)
                .io_memory(2 * MIB)
                .spawn(move || async move {
                    let storage = DmaStorage::new(&dir).expect("storage");
                    let frame = prepare(5, 1, 0, size - 256);
                    let (mut wal, _) = PartitionWal::open(storage, wal_config(), |_| {})
                        .await
                        .expect("open");
                    while let Ok(iters) = asked.recv() {
                        let start = Instant::now();
                        let mut in_window = 0;
                        for i in 0..iters {
                            wal.submit(5, &frame, 0).expect("submit");
                            in_window += 1;
                            let due = !grouped
                                || in_window == APPENDERS
                                || wal.is_window_full()
                                || i + 1 == iters;
                            if due {
                                wal.commit().await.expect("commit");
                                in_window = 0;
                            }
                            if wal.file_count() > 2 {
                                let lsn = wal.durable_lsn();
                                wal.reclaim(lsn).await.expect("reclaim");
                            }
                        }
                        tell.send(start.elapsed()).expect("reply");
                    }
                })
                .expect("executor");
            group.bench_function(BenchmarkId::new(name, label), |b| {
                b.iter_custom(|iters| {
                    ask.send(iters).expect("ask");
                    told.recv().expect("answer")
                })
            });
            drop(ask);
            executor.join().expect("join");
            for entry in std::fs::read_dir(&dir_root).into_iter().flatten().flatten() {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    group.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(feature = "glommio")]
criterion_group!(benches, append, append_dma, recovery);
#[cfg(not(feature = "glommio"))]
criterion_group!(benches, append, recovery);
criterion_main!(benches);
