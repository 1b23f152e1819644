//! A PollMessages read (issue 12 item 5; decisions 280-281): 1000 messages of 1000 B answered
//! from the partition's in-memory tail, and the same poll answered from the segments (the
//! tail holds only the newest batches), through `FileStorage` in a temporary directory (page
//! cache: the read path's CPU cost, not the device's). `segments` polls the same offset
//! again and again, so after the first iteration it is answered from the partition's kept
//! read (decision 421); `segments_not_kept` drops that read first, so it reads the file.

use std::cell::RefCell;
use std::rc::Rc;

use consensus::StateMachine;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use journal::file::FileStorage;
use journal::segment::{FlushPolicy, PartitionLog};
use journal::storage::block_on;
use server::client::codec::{Consumer, Identifier, PollingStrategy};
use server::client::request::PollMessages;
use server::partition::PollAnswer;
use server::partition::machine::{PartitionStateMachine, StorageWork};
use server::partition::reader::{Keep, SegmentMap, StorageFiles};
use wire::header::{Layout, PrepareHeader};
use wire::{GroupId, Operation, PartitionKey};

const BATCHES: u64 = 64;
const PER_BATCH: u64 = 1000;
const SIZE: usize = 1000;

fn request(offset: u64) -> PollMessages {
    PollMessages {
        consumer: Consumer {
            group: false,
            id: Identifier::Numeric(1),
        },
        stream: Identifier::Numeric(1),
        topic: Identifier::Numeric(1),
        partition: Some(0),
        strategy: PollingStrategy::Offset(offset),
        count: PER_BATCH as u32,
        auto_commit: false,
    }
}

fn poll(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("strand-poll-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let storage = FileStorage::new(&dir, false).unwrap();
    let (mut log, _) = block_on(PartitionLog::open(
        storage.clone(),
        "p1-",
        FlushPolicy::default(),
        0,
    ))
    .unwrap();
    let group = GroupId::partition(PartitionKey {
        stream: 1,
        topic: 1,
        partition: 0,
    })
    .unwrap();
    let map = Rc::new(RefCell::new(SegmentMap {
        files: Some(Rc::new(StorageFiles(storage.clone()))),
        dir: Some(dir.clone()),
        ..SegmentMap::default()
    }));
    // The tail keeps the last 4 batches (4 MB); the first 60 are read from the segments.
    let mut m = PartitionStateMachine::new(group).with_disk(map.clone(), 4 * 1_050_000);
    let payload = vec![7u8; SIZE];
    let payloads: Vec<&[u8]> = (0..PER_BATCH).map(|_| payload.as_slice()).collect();
    let mut header = PrepareHeader::zeroed();
    header.operation = Operation::SendMessages.byte();
    for b in 0..BATCHES {
        let body = journal::batch::build(0, b * PER_BATCH, 1_000 + b, &payloads);
        m.apply(&header, &body, &mut Vec::new());
        for work in m.take_storage() {
            if let StorageWork::Batch(bytes) = work {
                log.commit_batch(bytes.to_vec()).unwrap();
                block_on(log.flush()).unwrap();
                map.borrow_mut().refresh(&log);
            }
        }
    }
    let mut group = c.benchmark_group("poll_1000x1000B");
    group.throughput(Throughput::Bytes(PER_BATCH * SIZE as u64));
    let newest = (BATCHES - 1) * PER_BATCH;
    group.bench_function("tail", |b| {
        b.iter(|| match m.poll(0, &request(newest)).unwrap() {
            PollAnswer::Ready(p) => p,
            PollAnswer::Disk(_) => panic!("the newest batch is in the tail"),
        });
    });
    group.bench_function("segments", |b| {
        b.iter(|| match m.poll(0, &request(10 * PER_BATCH)).unwrap() {
            PollAnswer::Disk(read) => block_on(read.read()).unwrap(),
            PollAnswer::Ready(_) => panic!("batch 10 left the tail"),
        });
    });
    // The same poll with the partition's kept read dropped first (decision 421): every
    // iteration reads the file, as a poll whose bytes no earlier read holds.
    group.bench_function("segments_not_kept", |b| {
        b.iter(|| {
            map.borrow().recent.replace(Keep::default());
            match m.poll(0, &request(10 * PER_BATCH)).unwrap() {
                PollAnswer::Disk(read) => block_on(read.read()).unwrap(),
                PollAnswer::Ready(_) => panic!("batch 10 left the tail"),
            }
        });
    });
    group.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, poll);
criterion_main!(benches);
