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

/// The WAL's durable-end record (one extra write + `fdatasync` of `wal-end` every
/// `END_EVERY_DEFAULT` commits) against the same WAL with the periodic record off
/// (`set_end_interval(0)`; rotation and reclaim still write it), paired: the two series take
/// turns in blocks of 64 appends over the same minutes, each in its own directory on the same
/// disk. Prints `with / without` over the measured samples (below 1.10 is the target).
fn append_end_record(c: &mut Criterion) {
    let dir = bench_dir("append-end");
    let mut group = c.benchmark_group("append_end_record");
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(6));
    for (size, grouped) in [(4 * KIB, false), (4 * KIB, true), (MIB, true)] {
        let label = match size {
            s if s >= MIB => format!("{}MiB", s / MIB),
            s => format!("{}KiB", s / KIB),
        };
        let mode = if grouped {
            "group_commit_64"
        } else {
            "fdatasync_each"
        };
        let frame = prepare(5, 1, 0, size - 256);
        let open = |tag: &str, every: u32| {
            let sub = dir.join(format!("{tag}-{mode}-{label}"));
            let storage = FileStorage::new(&sub, true).expect("storage");
            let (mut wal, _) =
                block_on(PartitionWal::open(storage, wal_config(), |_| {})).expect("open");
            wal.set_end_interval(every);
            wal
        };
        let mut with = open("with", journal::wal::END_EVERY_DEFAULT);
        let mut without = open("without", 0);
        let mut calls: Vec<(Duration, Duration)> = Vec::new();
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_function(BenchmarkId::new(format!("paired_{mode}"), &label), |b| {
            b.iter_custom(|iters| {
                let (mut a, mut b) = (Duration::ZERO, Duration::ZERO);
                let mut left = iters;
                while left > 0 {
                    let block = left.min(APPENDERS as u64);
                    a += wal_appends(&mut with, &frame, block, grouped);
                    b += wal_appends(&mut without, &frame, block, grouped);
                    left -= block;
                }
                calls.push((a, b));
                a
            })
        });
        let calls = &calls[calls.len().saturating_sub(10)..];
        if !calls.is_empty() {
            let total = |f: fn(&(Duration, Duration)) -> Duration| {
                calls.iter().map(f).sum::<Duration>().as_secs_f64()
            };
            let mut r: Vec<f64> = calls
                .iter()
                .map(|c| c.0.as_secs_f64() / c.1.as_secs_f64())
                .collect();
            r.sort_by(f64::total_cmp);
            println!(
                "append_end_record paired {mode} {label}: with the record = {:.3}x without \
                 (samples {:.3}..{:.3})",
                total(|c| c.0) / total(|c| c.1),
                r[0],
                r[r.len() - 1]
            );
        }
    }
    group.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The segment half of the partition append path (decision 272): a committed 1 MB batch of
/// 1000 x 1000-byte messages into a partition's segments and the flush the default policy makes
/// due (one `O_DIRECT` write, no fdatasync), with the full re-verification of every message
/// (`commit_batch`, the path before decision 272: one copy out of the prepare and one xxh3 pass
/// per message and batch) next to `commit_verified_batch` (the node's path: the committed
/// prepare's bytes, header checked only). Segments rotate at 256 MiB and are removed then.
fn segment_append(c: &mut Criterion) {
    let dir = bench_dir("segment");
    let storage = FileStorage::new(&dir, true).expect("storage");
    let payload = vec![0x5au8; 1000];
    let payloads: Vec<&[u8]> = (0..1000).map(|_| payload.as_slice()).collect();
    let policy = journal::FlushPolicy {
        segment_size: FILE_MAX,
        ..journal::FlushPolicy::default()
    };
    let mut group = c.benchmark_group("segment_append");
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(4));
    let len = journal::batch::build(1, 0, 1, &payloads).len();
    group.throughput(Throughput::Bytes(len as u64));
    for verified in [false, true] {
        let name = if verified {
            "commit_verified_batch_flush"
        } else {
            "commit_batch_flush"
        };
        group.bench_function(BenchmarkId::new(name, "1000x1000B"), |b| {
            b.iter_custom(|iters| {
                let _ = std::fs::remove_dir_all(&dir);
                std::fs::create_dir_all(&dir).expect("bench dir");
                let (mut log, _) = block_on(journal::PartitionLog::open(
                    storage.clone(),
                    "p1-",
                    policy,
                    0,
                ))
                .expect("open");
                // Batches are stamped before the clock starts: the node receives them built.
                let batches: Vec<Vec<u8>> = (0..iters)
                    .map(|i| journal::batch::build(1, i * 1000, 1 + i, &payloads))
                    .collect();
                let start = Instant::now();
                for batch in batches {
                    if verified {
                        log.commit_verified_batch(batch.into()).expect("commit");
                    } else {
                        log.commit_batch(batch.as_slice().to_vec()).expect("commit");
                    }
                    if log.should_flush(0, 0) {
                        block_on(log.flush()).expect("flush");
                    }
                }
                block_on(log.flush()).expect("flush");
                start.elapsed()
            });
        });
    }
    group.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A SendMessages prepare of 1000 x 1000 B made durable the two ways (decision 414), paired in
/// one group: `twice` journals the whole frame (WAL write and fdatasync) and then writes its
/// batch to the segment (the committed copy, unsynced, as a flush); `once` writes the batch at
/// the segment's tail and syncs it, and journals the header with a body reference (WAL write
/// and fdatasync). The node runs the two writes of `once` side by side; here they run one
/// after the other, so the figure is the bytes and syncs the disk takes, not the overlap.
fn write_once(c: &mut Criterion) {
    let dir = bench_dir("write-once");
    let storage = FileStorage::new(&dir, true).expect("storage");
    let payload = vec![0x3cu8; 1000];
    let payloads: Vec<&[u8]> = (0..1000).map(|_| payload.as_slice()).collect();
    let policy = journal::FlushPolicy {
        segment_size: FILE_MAX,
        ..journal::FlushPolicy::default()
    };
    let mut group = c.benchmark_group("write_once");
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(4));
    let len = journal::batch::build(1, 0, 1, &payloads).len();
    group.throughput(Throughput::Bytes(len as u64));
    for once in [false, true] {
        let name = if once { "once" } else { "twice" };
        group.bench_function(BenchmarkId::new(name, "1000x1000B"), |b| {
            b.iter_custom(|iters| {
                let _ = std::fs::remove_dir_all(&dir);
                std::fs::create_dir_all(&dir).expect("bench dir");
                let (mut log, _) = block_on(journal::PartitionLog::open(
                    storage.clone(),
                    "p1-",
                    policy,
                    0,
                ))
                .expect("open");
                let (mut wal, _) = block_on(PartitionWal::open(
                    FileStorage::new(&dir.join("wal"), true).expect("wal dir"),
                    wal_config(),
                    |_| {},
                ))
                .expect("wal");
                // Frames are built before the clock starts: the node receives them built.
                let frames: Vec<(Vec<u8>, bytes::Bytes)> = (0..iters)
                    .map(|i| {
                        let body = journal::batch::build(1, i * 1000, 1 + i, &payloads);
                        let mut frame = prepare(5, i + 1, 0, 0);
                        frame.extend_from_slice(&body);
                        (frame, bytes::Bytes::from(body))
                    })
                    .collect();
                let start = Instant::now();
                for (frame, body) in frames {
                    if once {
                        let (segment, position) = log.reserve(body.clone()).expect("tail");
                        block_on(log.flush_synced()).expect("segment");
                        let reference =
                            journal::wal::BodyRef::of(segment, position, &body).expect("batch");
                        let header: &[u8; wire::HEADER_SIZE] =
                            frame[..wire::HEADER_SIZE].try_into().expect("header");
                        wal.submit_ref(5, header, &reference, 0).expect("submit");
                        block_on(wal.commit()).expect("commit");
                    } else {
                        wal.submit(5, &frame, 0).expect("submit");
                        block_on(wal.commit()).expect("commit");
                        log.commit_verified_batch(body).expect("commit");
                        block_on(log.flush()).expect("flush");
                    }
                    if wal.file_count() > 2 {
                        let lsn = wal.durable_lsn();
                        block_on(wal.reclaim(lsn)).expect("reclaim");
                    }
                }
                start.elapsed()
            });
        });
    }
    group.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A body reference built and checked (decision 498): `BodyRef::of` reads the batch checksum
/// from the header, next to the whole-body XXH3-64 it used to compute (the baseline, same run);
/// `BodyRef::names` verifies the batch whole, the check of a reference on read.
fn body_reference(c: &mut Criterion) {
    let mut group = c.benchmark_group("body_reference");
    for (label, size) in [("1000x1000B", 1000usize), ("1000x100B", 100)] {
        let payload = vec![0x5au8; size];
        let payloads: Vec<&[u8]> = (0..1000).map(|_| payload.as_slice()).collect();
        let body = journal::batch::build(1, 0, 1, &payloads);
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function(BenchmarkId::new("of", label), |b| {
            b.iter(|| journal::wal::BodyRef::of(0, 4096, std::hint::black_box(&body)))
        });
        group.bench_function(BenchmarkId::new("whole_body_xxh3_baseline", label), |b| {
            b.iter(|| wire::integrity::xxh3(std::hint::black_box(&body)))
        });
        let reference = journal::wal::BodyRef::of(0, 4096, &body).expect("a batch");
        group.bench_function(BenchmarkId::new("names", label), |b| {
            b.iter(|| reference.names(std::hint::black_box(&body)))
        });
    }
    group.finish();
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

/// What the glommio executor of [`append_dma`] is asked to run.
#[cfg(feature = "glommio")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DmaSeries {
    /// Raw glommio `O_DIRECT` writes (one reused DMA buffer) + `fdatasync` each.
    Raw,
    /// WAL appends, one commit each.
    WalEach,
    /// WAL appends, up to 64 per commit.
    WalGroup,
    /// `WalGroup`, `Raw` and a std `O_DIRECT` write + `fdatasync` each, interleaved in blocks of
    /// 64 appends so that the device's drift over the run hits all three alike.
    Paired,
}

/// Elapsed times of one request: the series asked for (WAL group commit when paired), and the
/// paired raw glommio and raw std times.
#[cfg(feature = "glommio")]
type DmaTimes = [Duration; 3];

/// Raw writes of one size at consecutive offsets of sparse 256 MiB files, a fresh file when one
/// is full (like the WAL and [`raw_direct`]).
#[cfg(feature = "glommio")]
struct RawDma {
    path: PathBuf,
    file: glommio::io::DmaFile,
    offset: u64,
    buf: std::rc::Rc<glommio::io::DmaBuffer>,
}

#[cfg(feature = "glommio")]
impl RawDma {
    async fn create(path: &Path) -> glommio::io::DmaFile {
        let _ = std::fs::remove_file(path);
        let file = glommio::io::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .dma_open(path)
            .await
            .expect("dma open");
        file.truncate(FILE_MAX).await.expect("truncate");
        file.fdatasync().await.expect("fdatasync");
        file
    }

    async fn open(path: PathBuf, size: usize) -> RawDma {
        let file = RawDma::create(&path).await;
        let mut buf = file.alloc_dma_buffer(size.next_multiple_of(SECTOR));
        buf.as_bytes_mut()
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = i as u8);
        RawDma {
            path,
            file,
            offset: 0,
            buf: std::rc::Rc::new(buf),
        }
    }

    async fn run(&mut self, iters: u64) {
        for _ in 0..iters {
            if self.offset + self.buf.len() as u64 > FILE_MAX {
                let old = std::mem::replace(&mut self.file, RawDma::create(&self.path).await);
                old.close().await.expect("close");
                self.offset = 0;
            }
            let buf = self.buf.clone();
            self.file
                .write_rc_at(buf, self.offset)
                .await
                .expect("write");
            self.offset += self.buf.len() as u64;
            self.file.fdatasync().await.expect("fdatasync");
        }
    }
}

/// The std counterpart of [`RawDma`] (blocking calls, as in [`raw_direct`]).
#[cfg(feature = "glommio")]
struct RawStd {
    path: PathBuf,
    file: std::fs::File,
    offset: u64,
    buf: AlignedBuf,
}

#[cfg(feature = "glommio")]
impl RawStd {
    fn create(path: &Path) -> std::fs::File {
        let _ = std::fs::remove_file(path);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .expect("O_DIRECT open");
        file.set_len(FILE_MAX).expect("set_len");
        file.sync_all().expect("sync");
        file
    }

    fn open(path: PathBuf, size: usize) -> RawStd {
        let file = RawStd::create(&path);
        let mut buf = AlignedBuf::zeroed(size.next_multiple_of(SECTOR));
        buf.as_mut_slice()
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = i as u8);
        RawStd {
            path,
            file,
            offset: 0,
            buf,
        }
    }

    fn run(&mut self, iters: u64) {
        for _ in 0..iters {
            if self.offset + self.buf.len() as u64 > FILE_MAX {
                self.file = RawStd::create(&self.path);
                self.offset = 0;
            }
            self.file
                .write_all_at(self.buf.as_slice(), self.offset)
                .expect("write");
            self.offset += self.buf.len() as u64;
            self.file.sync_data().expect("fdatasync");
        }
    }
}

/// `iters` WAL appends: grouped, up to 64 per commit (bounded by the 4 MiB window); else one
/// commit each.
#[cfg(feature = "glommio")]
async fn dma_wal_appends<S: journal::Storage>(
    wal: &mut PartitionWal<S>,
    frame: &[u8],
    iters: u64,
    grouped: bool,
) {
    let mut in_window = 0;
    for i in 0..iters {
        wal.submit(5, frame, 0).expect("submit");
        in_window += 1;
        if !grouped || in_window == APPENDERS || wal.is_window_full() || i + 1 == iters {
            wal.commit().await.expect("commit");
            in_window = 0;
        }
        if wal.file_count() > 2 {
            let lsn = wal.durable_lsn();
            wal.reclaim(lsn).await.expect("reclaim");
        }
    }
}

/// The glommio side of [`append_dma`]: runs `iters` of a series at a size and returns the
/// elapsed times. The WAL is opened once per size (fresh files), the raw files likewise.
#[cfg(feature = "glommio")]
async fn dma_worker(
    dir: PathBuf,
    asked: std::sync::mpsc::Receiver<(DmaSeries, usize, u64)>,
    tell: std::sync::mpsc::Sender<DmaTimes>,
) {
    use journal::Storage;
    use journal::dma::DmaStorage;

    let storage = DmaStorage::new(&dir.join("wal")).expect("storage");
    let mut wal: Option<(usize, PartitionWal<DmaStorage>, Vec<u8>)> = None;
    let mut raw: Option<(RawDma, RawStd)> = None;
    while let Ok((series, size, iters)) = asked.recv() {
        if wal.as_ref().is_none_or(|w| w.0 != size) {
            // The WAL opens first (also before a raw series): its storage's probe settles
            // glommio's IOPOLL decision for the device before a raw file is opened.
            drop(wal.take());
            for name in storage.list().await.unwrap_or_default() {
                let _ = storage.remove(&name).await;
            }
            let (w, _) = PartitionWal::open(storage.clone(), wal_config(), |_| {})
                .await
                .expect("open");
            wal = Some((size, w, prepare(5, 1, 0, size - 256)));
        }
        if matches!(series, DmaSeries::Raw | DmaSeries::Paired)
            && raw
                .as_ref()
                .is_none_or(|r| r.1.buf.len() != size.next_multiple_of(SECTOR))
        {
            if let Some((old, _)) = raw.take() {
                old.file.close().await.expect("close");
            }
            raw = Some((
                RawDma::open(dir.join("raw-dma"), size).await,
                RawStd::open(dir.join("raw-std"), size),
            ));
        }
        let (_, wal, frame) = wal.as_mut().expect("wal");
        let mut times = [Duration::ZERO; 3];
        match series {
            DmaSeries::Raw => {
                let start = Instant::now();
                raw.as_mut().expect("raw").0.run(iters).await;
                times[0] = start.elapsed();
            }
            DmaSeries::WalEach | DmaSeries::WalGroup => {
                let start = Instant::now();
                dma_wal_appends(wal, frame, iters, series == DmaSeries::WalGroup).await;
                times[0] = start.elapsed();
            }
            DmaSeries::Paired => {
                let (raw_dma, raw_std) = raw.as_mut().expect("raw");
                let mut left = iters;
                while left > 0 {
                    let block = left.min(APPENDERS as u64);
                    let start = Instant::now();
                    dma_wal_appends(wal, frame, block, true).await;
                    times[0] += start.elapsed();
                    let start = Instant::now();
                    raw_dma.run(block).await;
                    times[1] += start.elapsed();
                    let start = Instant::now();
                    raw_std.run(block);
                    times[2] += start.elapsed();
                    left -= block;
                }
            }
        }
        tell.send(times).expect("reply");
    }
    if let Some((raw_dma, _)) = raw.take() {
        raw_dma.file.close().await.expect("close");
    }
}

/// The same appends on the glommio DMA backend (feature `glommio`), in one executor
/// (`io_memory` 2 MiB, unbound) that criterion's thread drives over a channel, next to two raw
/// baselines of the same run: `O_DIRECT` write + `fdatasync` through glommio (the like-for-like
/// one) and through std (as in the `append` group).
///
/// At 1 MiB, `paired_group_commit_64` measures the group commit interleaved with both raw
/// baselines (blocks of 64 appends each, in turn) and prints the ratios over the same
/// appends: consecutive series can see the device at different speeds (2x to 4x apart on the
/// project's VMs), and the 0.8x target is about the ratio.
#[cfg(feature = "glommio")]
fn append_dma(c: &mut Criterion) {
    use glommio::{LocalExecutorBuilder, Placement};
    let dir = bench_dir("append-dma");
    let (ask, asked) = std::sync::mpsc::channel::<(DmaSeries, usize, u64)>();
    let (tell, told) = std::sync::mpsc::channel::<DmaTimes>();
    let worker_dir = dir.clone();
    let executor = LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(2 * MIB)
        .spawn(move || dma_worker(worker_dir, asked, tell))
        .expect("executor");
    let mut group = c.benchmark_group("append_dma");
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(4));
    for size in [4 * KIB, 64 * KIB, MIB] {
        let label = match size {
            s if s >= MIB => format!("{}MiB", s / MIB),
            s => format!("{}KiB", s / KIB),
        };
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_function(
            BenchmarkId::new("raw_odirect_fdatasync_each", &label),
            |b| b.iter_custom(|iters| raw_direct(&dir, size, iters, 1)),
        );
        for (series, name) in [
            (DmaSeries::Raw, "raw_dma_fdatasync_each"),
            (DmaSeries::WalEach, "wal_fdatasync_each"),
            (DmaSeries::WalGroup, "wal_group_commit_64"),
        ] {
            group.bench_function(BenchmarkId::new(name, &label), |b| {
                b.iter_custom(|iters| {
                    ask.send((series, size, iters)).expect("ask");
                    told.recv().expect("answer")[0]
                })
            });
        }
        if size == MIB {
            // Criterion sees the group commit's time; the raw times of the same blocks are
            // summed here. Only the measured samples count (the warm-up's calls come first).
            let mut calls: Vec<(u64, DmaTimes)> = Vec::new();
            group.bench_function(BenchmarkId::new("paired_group_commit_64", &label), |b| {
                b.iter_custom(|iters| {
                    ask.send((DmaSeries::Paired, size, iters)).expect("ask");
                    let times = told.recv().expect("answer");
                    calls.push((iters, times));
                    times[0]
                })
            });
            print_paired(&label, &calls[calls.len().saturating_sub(10)..]);
        }
    }
    group.finish();
    drop(ask);
    executor.join().expect("join");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Prints the paired ratios (raw time / group-commit time over the same appends; above 1 means
/// group commit is faster): over all samples, and the lowest and highest sample.
#[cfg(feature = "glommio")]
fn print_paired(label: &str, calls: &[(u64, DmaTimes)]) {
    if calls.is_empty() {
        return; // filtered out
    }
    let appends: u64 = calls.iter().map(|c| c.0).sum();
    let total = |i: usize| calls.iter().map(|c| c.1[i]).sum::<Duration>();
    let per = |d: Duration| d.as_secs_f64() * 1e6 / appends as f64;
    let ratio = |i: usize| {
        let mut r: Vec<f64> = calls
            .iter()
            .map(|c| c.1[i].as_secs_f64() / c.1[0].as_secs_f64())
            .collect();
        r.sort_by(f64::total_cmp);
        (
            total(i).as_secs_f64() / total(0).as_secs_f64(),
            r[0],
            r[r.len() - 1],
        )
    };
    let (dma, dma_min, dma_max) = ratio(1);
    let (std, std_min, std_max) = ratio(2);
    println!(
        "append_dma paired {label} over {appends} appends: group commit {:.0} µs/append, \
         raw glommio {:.0} µs, raw std {:.0} µs; group commit = {dma:.2}x raw glommio \
         (samples {dma_min:.2}..{dma_max:.2}), {std:.2}x raw std ({std_min:.2}..{std_max:.2})",
        per(total(0)),
        per(total(1)),
        per(total(2)),
    );
}

#[cfg(feature = "glommio")]
criterion_group!(
    benches,
    append,
    append_end_record,
    append_dma,
    segment_append,
    write_once,
    body_reference,
    recovery
);
#[cfg(not(feature = "glommio"))]
criterion_group!(
    benches,
    append,
    append_end_record,
    segment_append,
    write_once,
    body_reference,
    recovery
);
criterion_main!(benches);
