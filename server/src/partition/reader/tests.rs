//! The bounded tail and the segment read path (decisions 280-283): every poll the machine
//! answers from the segments equals the answer of a machine holding every batch in memory;
//! the tail stays within its budget while the partition grows; a damaged segment is a typed
//! error; an offer reads the evicted part from the files and installs into an equal state; a
//! boot's scan rebuilds the tail and the log checksum.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;

use consensus::{ReplicaId, StateMachine};
use journal::batch;
use journal::file::FileStorage;
use journal::segment::{FlushPolicy, PartitionLog};
use journal::storage::block_on;
use wire::header::{Layout, PrepareHeader};
use wire::{GroupId, Operation};

use super::*;
use crate::client::codec::{Consumer, Identifier, PollingStrategy};
use crate::client::request::PollMessages;
use crate::partition::PollAnswer;
use crate::partition::machine::{PartitionStateMachine, StorageWork};

const POLICY: FlushPolicy = FlushPolicy {
    enforce_fsync: false,
    messages_required_to_save: 5,
    size_of_messages_required_to_save: 1 << 20,
    segment_size: 64 * 1024,
};

/// The tail budget of the tests: a few batches.
const CACHE: usize = 8 * 1024;

fn group() -> GroupId {
    crate::test_frames::partition_group()
}

/// A partition on disk: the tested machine (bounded tail over the segments), the reference
/// machine (every batch in memory), the log the storage task would own, and the map.
struct Rig {
    dir: PathBuf,
    storage: FileStorage,
    log: PartitionLog<FileStorage>,
    map: SharedMap,
    machine: PartitionStateMachine,
    reference: PartitionStateMachine,
    next: u64,
    timestamp: u64,
}

impl Rig {
    fn new(name: &str) -> Rig {
        Rig::with_policy(name, POLICY)
    }

    fn with_policy(name: &str, policy: FlushPolicy) -> Rig {
        let dir = crate::scratch_dir(&format!("reader-{name}"));
        let storage = FileStorage::new(&dir, false).unwrap();
        let (log, _) = block_on(PartitionLog::open(storage.clone(), "p1-", policy, 0)).unwrap();
        let map = Rc::new(RefCell::new(SegmentMap {
            files: Some(Rc::new(StorageFiles(storage.clone()))),
            dir: Some(dir.clone()),
            ..SegmentMap::default()
        }));
        let machine = PartitionStateMachine::new(group()).with_disk(map.clone(), CACHE);
        Rig {
            dir,
            storage,
            log,
            map,
            machine,
            reference: PartitionStateMachine::new(group()),
            next: 0,
            timestamp: 1_000,
        }
    }

    /// Applies one batch of `messages` messages to both machines and does the storage work
    /// as the storage task does (commit, flush by the policy, refresh the map).
    fn send(&mut self, messages: usize) {
        let payloads: Vec<Vec<u8>> = (0..messages)
            .map(|i| {
                let o = self.next + i as u64;
                vec![(o % 251) as u8; 100 + (o as usize * 37) % 700]
            })
            .collect();
        let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
        let body = batch::build(3, self.next, self.timestamp, &refs);
        let mut h = PrepareHeader::zeroed();
        h.operation = Operation::SendMessages.byte();
        let mut reply = Vec::new();
        self.reference.apply(&h, &body, &mut reply);
        reply.clear();
        self.machine.apply(&h, &body, &mut reply);
        for work in self.machine.take_storage() {
            let StorageWork::Batch(bytes) = work else {
                panic!("only batches here: {work:?}")
            };
            self.log.commit_batch(bytes.to_vec()).unwrap();
            if self.log.should_flush(0, 0) {
                block_on(self.log.flush()).unwrap();
            }
            self.map.borrow_mut().refresh(&self.log);
        }
        let _ = self.reference.take_storage();
        self.next += messages as u64;
        self.timestamp += 10;
    }

    fn poll(m: &PartitionStateMachine, strategy: PollingStrategy, count: u32) -> (bool, Poll) {
        let request = PollMessages {
            consumer: Consumer {
                group: false,
                id: Identifier::Numeric(7),
            },
            stream: Identifier::Numeric(1),
            topic: Identifier::Numeric(2),
            partition: Some(3),
            strategy,
            count,
            auto_commit: false,
        };
        match m.poll(3, &request).unwrap() {
            PollAnswer::Ready(p) => (false, p),
            PollAnswer::Disk(read) => (true, block_on(read.read()).unwrap()),
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Polls of every strategy, from every offset, with small and large counts: the machine whose
/// tail holds a few batches answers exactly as the one holding all of them, and the old ones
/// are read from the segments (not from memory). The tail stays within its budget plus the
/// batches not yet flushed while the partition grows to ~20x the budget.
#[test]
fn polls_below_the_tail_read_the_segments_and_equal_the_full_answers() {
    let mut rig = Rig::new("equal");
    let mut peak = 0;
    for i in 0..120 {
        rig.send(1 + i % 4);
        peak = peak.max(rig.machine.cache_bytes());
    }
    let total = rig.reference.cache_bytes();
    assert!(
        total > 20 * CACHE,
        "the partition outgrew the tail: {total}"
    );
    // Unflushed batches stay (at most POLICY's 5 messages, 4 per batch: 2 batches of < 3 KiB
    // each) plus the one batch past the budget.
    assert!(
        peak <= CACHE + 3 * 4 * 3 * 1024,
        "tail {peak} B for a budget of {CACHE} B"
    );
    // GetStats' figures (decision 380): every committed byte, wherever it is, and the
    // segment files the storage task published.
    assert_eq!(rig.machine.stored_bytes(), total as u64);
    // Nothing flushed yet still counts the open segment.
    let fresh = PartitionStateMachine::new(group()).with_disk(Rc::new(RefCell::default()), CACHE);
    assert_eq!(fresh.segments_count(), 1);
    let segments = rig.map.borrow().segments.len();
    assert!(segments >= 1);
    assert_eq!(rig.machine.segments_count(), segments);
    let end = rig.next;
    let mut from_disk = 0;
    let mut strategies = vec![
        PollingStrategy::First(0),
        PollingStrategy::Last(0),
        PollingStrategy::Next(0),
        PollingStrategy::Timestamp(0),
        PollingStrategy::Timestamp(1_000 + 10 * 57),
        PollingStrategy::Timestamp(1_000 + 10 * 57 + 1),
        PollingStrategy::Timestamp(1_000 + 10 * 119),
        PollingStrategy::Timestamp(u64::MAX),
    ];
    strategies.extend((0..end + 2).map(PollingStrategy::Offset));
    for strategy in strategies {
        for count in [1, 3, 10, 1000] {
            let (disk, got) = Rig::poll(&rig.machine, strategy, count);
            let (_, want) = Rig::poll(&rig.reference, strategy, count);
            assert!(
                got == want,
                "{strategy:?} count {count}: {:?} vs {:?} (messages, last offset)",
                (got.messages_count, got.last_offset),
                (want.messages_count, want.last_offset)
            );
            from_disk += usize::from(disk);
        }
    }
    assert!(from_disk > 1000, "old polls read the segments: {from_disk}");
    // Every payload from offset 0 comes back, in order, across many polls.
    let mut offset = 0;
    while offset < end {
        let (_, got) = Rig::poll(&rig.machine, PollingStrategy::Offset(offset), 7);
        assert!(got.messages_count > 0);
        offset = got.last_offset.unwrap() + 1;
    }
    assert_eq!(offset, end);
}

/// A batch of the segments that no longer verifies is a typed error from the read (the client
/// core answers 1 and counts it), never a panic; polls the tail answers are unaffected.
#[test]
fn a_damaged_segment_is_a_typed_error() {
    let mut rig = Rig::new("corrupt");
    for _ in 0..60 {
        rig.send(3);
    }
    let seg = rig.map.borrow().segments[0].clone();
    let path = rig.dir.join(&seg.name);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[300] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let request = |strategy| PollMessages {
        consumer: Consumer {
            group: false,
            id: Identifier::Numeric(7),
        },
        stream: Identifier::Numeric(1),
        topic: Identifier::Numeric(2),
        partition: Some(3),
        strategy,
        count: 10,
        auto_commit: false,
    };
    let Ok(PollAnswer::Disk(read)) = rig.machine.poll(3, &request(PollingStrategy::First(0)))
    else {
        panic!("offset 0 left the tail");
    };
    let err = block_on(read.read()).unwrap_err();
    assert!(
        matches!(err, ReadError::Corrupt { ref name, .. } if *name == seg.name),
        "{err}"
    );
    // A file cut inside a batch: typed too.
    std::fs::write(&path, &bytes[..200]).unwrap();
    let Ok(PollAnswer::Disk(read)) = rig.machine.poll(3, &request(PollingStrategy::First(0)))
    else {
        panic!("offset 0 left the tail");
    };
    assert!(matches!(
        block_on(read.read()),
        Err(ReadError::Corrupt { .. })
    ));
    let last = rig.next - 1;
    let (disk, p) = Rig::poll(&rig.machine, PollingStrategy::Offset(last), 10);
    assert!(!disk);
    assert_eq!(p.last_offset, Some(last));
}

/// An offer of a machine whose tail holds a few batches reads the rest from the segment
/// files by chunk; the bytes match the manifest's length and checksum and install into a
/// machine equal to the reference.
#[test]
fn an_offer_reads_the_evicted_part_from_the_segments() {
    let mut rig = Rig::new("offer");
    for i in 0..80 {
        rig.send(1 + i % 3);
    }
    assert!(rig.machine.cache_bytes() < rig.reference.cache_bytes() / 4);
    let entries = rig.machine.offer(ReplicaId(1), 9).unwrap();
    let want = rig.reference.offer(ReplicaId(1), 9).unwrap();
    assert_eq!(entries, want, "same manifest as the all-in-memory machine");
    let mut into = PartitionStateMachine::new(group());
    into.stage_begin(&entries).unwrap();
    for (index, entry) in entries.iter().enumerate() {
        let mut all = Vec::new();
        let mut offset = 0;
        while offset < entry.len {
            let len = 1000.min((entry.len - offset) as usize);
            let mut buf = Vec::new();
            rig.machine
                .read_chunk(ReplicaId(1), index, offset, len, &mut buf)
                .unwrap();
            assert_eq!(buf.len(), len);
            into.stage_chunk(index, offset, &buf).unwrap();
            all.extend_from_slice(&buf);
            offset += len as u64;
        }
        assert_eq!(wire::manifest::artifact_checksum(&all), entry.checksum);
    }
    rig.machine.release_offer(ReplicaId(1));
    into.install_staged(9).unwrap();
    for offset in [0, 17, rig.next - 1] {
        let (_, got) = Rig::poll(&into, PollingStrategy::Offset(offset), 50);
        let (_, want) = Rig::poll(&rig.reference, PollingStrategy::Offset(offset), 50);
        assert!(got == want, "offset {offset}");
    }
}

/// A transfer installed by streaming its staged file (a machine with segment files) checks
/// the staged bytes against the manifest's checksum: a staged log of valid batches of the
/// same lengths and offsets but other payloads (the file is disk input) is refused and
/// changes nothing; the offered log itself installs.
#[test]
fn a_streamed_install_refuses_a_staged_log_that_is_not_the_offered_one() {
    let rig = Rig::new("streamed-checksum");
    let source = |salt: u8| {
        let mut m = PartitionStateMachine::new(group());
        let mut h = PrepareHeader::zeroed();
        h.operation = Operation::SendMessages.byte();
        for base in 0..5u64 {
            let payload = vec![salt ^ base as u8; 300];
            m.apply(
                &h,
                &batch::build(3, base, 1_000, &[&payload]),
                &mut Vec::new(),
            );
        }
        m
    };
    let (mut offered, mut other) = (source(1), source(2));
    let stream = |from: &mut PartitionStateMachine, into: &mut PartitionStateMachine| {
        let entries = from.offer(ReplicaId(1), 9).unwrap();
        for (index, entry) in entries.iter().enumerate() {
            let mut buf = Vec::new();
            from.read_chunk(ReplicaId(1), index, 0, entry.len as usize, &mut buf)
                .unwrap();
            into.stage_chunk(index, 0, &buf).unwrap();
        }
        from.release_offer(ReplicaId(1));
    };
    let receiver = || {
        PartitionStateMachine::new(group())
            .with_disk(rig.map.clone(), CACHE)
            .with_staging_dir(Some(rig.dir.clone()))
    };
    let manifest = offered.offer(ReplicaId(1), 9).unwrap();
    offered.release_offer(ReplicaId(1));
    let others = other.offer(ReplicaId(1), 9).unwrap();
    other.release_offer(ReplicaId(1));
    let shape = |m: &[wire::manifest::ManifestEntry]| {
        m.iter()
            .map(|e| (e.kind, e.frontier, e.len))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        shape(&manifest),
        shape(&others),
        "the same lengths and offsets"
    );
    assert_ne!(manifest[0].checksum, others[0].checksum);

    let mut into = receiver();
    into.stage_begin(&manifest).unwrap();
    stream(&mut other, &mut into);
    assert!(
        into.install_staged(9).is_err(),
        "another log under the manifest"
    );
    assert_eq!(StateMachine::next_offset(&into), 0, "nothing installed");

    let mut into = receiver();
    into.stage_begin(&manifest).unwrap();
    stream(&mut offered, &mut into);
    into.install_staged(9).unwrap();
    assert_eq!(StateMachine::next_offset(&into), 5);
}

/// A boot's scan streams the segments: it keeps a tail within the budget, stops at the
/// checkpoint's offset, and its checksum is the SEGMENT_LOG's; a machine built from it
/// answers like the reference.
#[test]
fn a_boot_scan_rebuilds_the_tail_and_the_checksum() {
    let mut rig = Rig::new("scan");
    for i in 0..70 {
        rig.send(1 + i % 2);
    }
    block_on(rig.log.sync()).unwrap();
    rig.map.borrow_mut().refresh(&rig.log);
    let files = StorageFiles(rig.storage.clone());
    let scan = block_on(scan(&rig.map.borrow(), &files, rig.next, CACHE)).unwrap();
    let held: usize = scan.tail.iter().map(Bytes::len).sum();
    assert!(held <= CACHE && !scan.tail.is_empty());
    assert_eq!(scan.end, Some(rig.next));
    assert_eq!(scan.first, Some(0));
    let want = rig.reference.offer(ReplicaId(2), 1).unwrap();
    assert_eq!(scan.hasher.clone().digest(), want[0].checksum);
    assert_eq!(scan.len, want[0].len);
    let m = PartitionStateMachine::from_scan(
        group(),
        scan,
        rig.reference.offsets().clone(),
        rig.map.clone(),
        CACHE,
    )
    .unwrap();
    for offset in [0, 33, rig.next - 1] {
        let (_, got) = Rig::poll(&m, PollingStrategy::Offset(offset), 20);
        let (_, want) = Rig::poll(&rig.reference, PollingStrategy::Offset(offset), 20);
        assert!(got == want, "offset {offset}");
    }
    // Stopped below the end: only whole batches up to it.
    let until = 40;
    let part = block_on(super::scan(&rig.map.borrow(), &files, until, CACHE)).unwrap();
    assert!(part.end.unwrap() <= until);
}

/// A batch the segments do not hold yet never leaves the tail, whatever the budget: with a
/// flush policy that has not flushed, the tail holds everything and every poll is answered
/// from it; after the flush the tail shrinks to the budget and the answers stay equal.
#[test]
fn unwritten_batches_stay_in_the_tail() {
    let mut rig = Rig::with_policy(
        "unwritten",
        FlushPolicy {
            messages_required_to_save: 10_000,
            ..POLICY
        },
    );
    for _ in 0..40 {
        rig.send(2);
    }
    assert!(rig.reference.cache_bytes() > 4 * CACHE);
    assert_eq!(rig.machine.cache_bytes(), rig.reference.cache_bytes());
    for offset in 0..rig.next {
        let (disk, got) = Rig::poll(&rig.machine, PollingStrategy::Offset(offset), 5);
        let (_, want) = Rig::poll(&rig.reference, PollingStrategy::Offset(offset), 5);
        assert!(!disk && got == want, "offset {offset}");
    }
    block_on(rig.log.flush()).unwrap();
    rig.map.borrow_mut().refresh(&rig.log);
    rig.send(2);
    assert!(rig.machine.cache_bytes() <= CACHE + 4 * 1024);
    for offset in 0..rig.next {
        let (_, got) = Rig::poll(&rig.machine, PollingStrategy::Offset(offset), 5);
        let (_, want) = Rig::poll(&rig.reference, PollingStrategy::Offset(offset), 5);
        assert!(got == want, "offset {offset} after the flush");
    }
}

/// Counts the reads of the segment files (decision 407) and their lengths.
struct CountingFiles {
    inner: StorageFiles<FileStorage>,
    reads: Rc<RefCell<Vec<usize>>>,
}

impl SegmentFiles for CountingFiles {
    fn read(
        &self,
        name: String,
        position: u64,
        len: usize,
    ) -> LocalFuture<Result<Bytes, ReadError>> {
        self.reads.borrow_mut().push(len);
        self.inner.read(name, position, len)
    }
}

/// A poll of many batches below the tail is one read of the segment, from the index entry
/// before its start to the entry at or past its end (decisions 406-407), and its batches are
/// slices of that read, back to back (no copy per batch); it equals the all-in-memory answer.
/// The old path read 256 KiB chunks: this poll of ~400 KB took two reads and copied every
/// batch out of them.
#[test]
fn a_poll_below_the_tail_is_one_read_shared_by_its_batches() {
    let policy = FlushPolicy {
        messages_required_to_save: 100,
        segment_size: 64 << 20,
        ..POLICY
    };
    let mut rig = Rig::with_policy("one-read", policy);
    for _ in 0..20 {
        rig.send(100);
    }
    let reads = Rc::new(RefCell::new(Vec::new()));
    rig.map.borrow_mut().files = Some(Rc::new(CountingFiles {
        inner: StorageFiles(rig.storage.clone()),
        reads: reads.clone(),
    }));
    let (disk, got) = Rig::poll(&rig.machine, PollingStrategy::Offset(250), 800);
    let (_, want) = Rig::poll(&rig.reference, PollingStrategy::Offset(250), 800);
    assert!(disk, "offset 250 left the tail");
    assert!(got == want, "equal to the all-in-memory answer");
    assert_eq!(got.messages_count, 800);
    let bytes: usize = got.batches.iter().map(Bytes::len).sum();
    assert!(
        bytes > READ_CHUNK,
        "the poll spans more than one old chunk: {bytes} B"
    );
    let reads = reads.borrow().clone();
    assert_eq!(reads.len(), 1, "one read for the poll: {reads:?}");
    // From batch 200..300 (the entry before 250) to the entry at 1100 (past 250 + 800).
    assert!(
        reads[0] >= bytes && reads[0] < bytes + 60_000,
        "{reads:?} for {bytes} B"
    );
    // The first and last batches are parts (rewritten headers); the whole ones between are
    // slices of the one read buffer, back to back.
    let whole = &got.batches[1..got.batches.len() - 1];
    assert!(whole.len() >= 6);
    for pair in whole.windows(2) {
        assert_eq!(
            pair[0].as_ptr().wrapping_add(pair[0].len()),
            pair[1].as_ptr(),
            "whole batches share the read's buffer"
        );
    }
}

/// A poll from the tail shares the committed batches (decision 405): its whole batches are the
/// very `Bytes` the machine committed (the ones it handed the storage task), not copies, and
/// they are not hashed again.
#[test]
fn a_tail_poll_shares_the_committed_batches() {
    let mut m = PartitionStateMachine::new(group());
    let mut committed = Vec::new();
    for b in 0..3u64 {
        let payloads = [vec![b as u8; 300], vec![7; 20]];
        let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
        let body = batch::build(3, 2 * b, 1_000 + b, &refs);
        let mut h = PrepareHeader::zeroed();
        h.operation = Operation::SendMessages.byte();
        m.apply(&h, &body, &mut Vec::new());
        for work in m.take_storage() {
            if let StorageWork::Batch(bytes) = work {
                committed.push(bytes);
            }
        }
    }
    let (disk, p) = Rig::poll(&m, PollingStrategy::Offset(0), 6);
    assert!(!disk);
    assert_eq!(p.messages_count, 6);
    assert_eq!(p.batches.len(), 3);
    for (got, kept) in p.batches.iter().zip(&committed) {
        assert_eq!(
            got.as_ptr(),
            kept.as_ptr(),
            "the committed bytes, not a copy"
        );
        assert_eq!(got, kept);
    }
}

/// A consumer polling in sequence from the first offset to the tail across several segments
/// (decision 421): every answer equals the all-in-memory machine's; most polls are answered
/// from the partition's kept read or its read ahead, so the files are read far fewer times
/// than there are polls; the read ahead is run after the poll, beside the next poll (waited
/// for), or dropped (the next poll reads for itself); the kept bytes stay within the budget.
#[test]
fn a_sequential_consumer_is_served_from_the_kept_read_and_the_read_ahead() {
    let policy = FlushPolicy {
        messages_required_to_save: 100,
        segment_size: 9 << 20,
        ..POLICY
    };
    let mut rig = Rig::with_policy("ahead", policy);
    for _ in 0..600 {
        rig.send(100);
    }
    assert!(rig.map.borrow().segments.len() >= 3, "several segments");
    let reads = Rc::new(RefCell::new(Vec::new()));
    rig.map.borrow_mut().files = Some(Rc::new(CountingFiles {
        inner: StorageFiles(rig.storage.clone()),
        reads: reads.clone(),
    }));
    let request = |offset| PollMessages {
        consumer: Consumer {
            group: false,
            id: Identifier::Numeric(7),
        },
        stream: Identifier::Numeric(1),
        topic: Identifier::Numeric(2),
        partition: Some(3),
        strategy: PollingStrategy::Offset(offset),
        count: 250,
        auto_commit: false,
    };
    let (mut offset, mut polls, mut kept, mut ahead) = (0u64, 0u32, 0u32, 0u32);
    // The reads ahead a poll started, and what becomes of them (one way after another).
    let mut pending: Vec<LocalFuture<()>> = Vec::new();
    let (mut started, mut mode) = (0u32, 0u32);
    loop {
        let answer = rig.machine.poll(3, &request(offset)).unwrap();
        let PollAnswer::Disk(read) = answer else {
            break; // the tail: the rest is in memory
        };
        let (got, times) = match mode {
            // The read ahead runs beside this poll, which waits for it.
            0 => {
                let ahead = std::mem::take(&mut pending);
                // A block_on that parks: the poll waits (pending) until the read ahead wakes it.
                let (got, ()) = futures_lite::future::block_on(futures_lite::future::zip(
                    read.read_timed(),
                    async {
                        for f in ahead {
                            f.await;
                        }
                    },
                ));
                got
            }
            // It ran before this poll.
            1 => {
                for f in std::mem::take(&mut pending) {
                    block_on(f);
                }
                block_on(read.read_timed())
            }
            // It was dropped: abandoned, this poll reads for itself.
            _ => {
                pending.clear();
                block_on(read.read_timed())
            }
        };
        let got = got.unwrap();
        let PollAnswer::Ready(want) = rig.reference.poll(3, &request(offset)).unwrap() else {
            panic!("the reference holds everything in memory");
        };
        assert!(
            got == want,
            "poll at {offset} equals the all-in-memory answer"
        );
        assert!(kept_bytes() <= KEPT_BYTES_MAX);
        kept += times.kept;
        ahead += times.ahead;
        pending = times.started;
        if !pending.is_empty() {
            mode = started % 3;
            started += 1;
        }
        polls += 1;
        offset = got.last_offset.unwrap() + 1;
    }
    drop(pending);
    let reads = reads.borrow().len() as u32;
    assert!(
        offset > 50_000,
        "the consumer read most of the log: {offset}"
    );
    assert!(started >= 6, "reads ahead started: {started}");
    assert!(ahead > 0, "some polls were answered by a read ahead");
    assert!(
        kept * 10 > polls * 8,
        "most reads came from the kept read: {kept} of {polls} polls"
    );
    assert!(reads * 5 < polls, "{reads} file reads for {polls} polls");
}

/// Segment bytes served from the kept read or a read ahead are verified like any read
/// (decision 421): a damaged batch far past the first poll's read is found by the poll that
/// reaches it, never returned.
#[test]
fn a_damaged_batch_in_a_read_ahead_is_a_typed_error() {
    let policy = FlushPolicy {
        messages_required_to_save: 100,
        segment_size: 64 << 20,
        ..POLICY
    };
    let mut rig = Rig::with_policy("ahead-damage", policy);
    for _ in 0..300 {
        rig.send(100);
    }
    let seg = rig.map.borrow().segments[0].clone();
    // A byte inside a batch some 6 MB in: past the first read, inside a read ahead.
    let position = seg
        .index
        .iter()
        .find(|e| e.position > 6 << 20)
        .unwrap()
        .position
        + 500;
    let path = rig.dir.join(&seg.name);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[position as usize] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();
    let mut offset = 0;
    let mut ahead = 0;
    let err = loop {
        let request = PollMessages {
            consumer: Consumer {
                group: false,
                id: Identifier::Numeric(7),
            },
            stream: Identifier::Numeric(1),
            topic: Identifier::Numeric(2),
            partition: Some(3),
            strategy: PollingStrategy::Offset(offset),
            count: 250,
            auto_commit: false,
        };
        let Ok(PollAnswer::Disk(read)) = rig.machine.poll(3, &request) else {
            panic!("the damage lies below the tail, so some poll reads it");
        };
        let (got, times) = block_on(read.read_timed());
        for f in times.started {
            block_on(f);
        }
        ahead += times.ahead;
        match got {
            Ok(p) => offset = p.last_offset.unwrap() + 1,
            Err(e) => break e,
        }
    };
    assert!(
        ahead > 0,
        "polls were answered by reads ahead before the damage"
    );
    assert!(
        matches!(err, ReadError::Corrupt { ref name, .. } if *name == seg.name),
        "{err}"
    );
}

/// A kept read is served only while its segment is mapped as it was (decision 421): a
/// refresh that replaces a segment (a cut, an install) bumps the generation and drops the kept
/// read and its share of the budget. Decision 495: the entries held are compared only when the
/// log's rewrite mark moved, and a cut moves it, so a cut that the same number of entries
/// refills (lengths alone would not show it) is still found.
#[test]
fn a_replaced_segment_drops_the_kept_read() {
    let policy = FlushPolicy {
        messages_required_to_save: 100,
        segment_size: 64 << 20,
        ..POLICY
    };
    let mut rig = Rig::with_policy("ahead-generation", policy);
    for _ in 0..40 {
        rig.send(100);
    }
    let (disk, _) = Rig::poll(&rig.machine, PollingStrategy::Offset(0), 250);
    assert!(disk);
    assert!(rig.map.borrow().recent.borrow().window.is_some());
    assert!(kept_bytes() > 0);
    let generation = rig.map.borrow().generation;
    let entries = rig.map.borrow().segments[0].index.len();
    let mark = rig.log.rewrite_mark();
    assert_eq!(rig.map.borrow().rewrite_mark, mark);
    // Growing only keeps the generation and the mark.
    rig.send(100);
    assert_eq!(rig.map.borrow().generation, generation);
    assert_eq!(rig.log.rewrite_mark(), mark);
    assert_eq!(rig.map.borrow().segments[0].index.len(), entries + 1);
    // Cut the last batch and write another in its place with a later timestamp: as many
    // entries and bytes as before, one of them different.
    block_on(rig.log.rewind(4000)).unwrap();
    assert_ne!(rig.log.rewrite_mark(), mark, "a cut moves the mark");
    let payloads: Vec<Vec<u8>> = (4000..4100u64)
        .map(|o| vec![(o % 251) as u8; 100 + (o as usize * 37) % 700])
        .collect();
    let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
    rig.log
        .commit_batch(batch::build(3, 4000, rig.timestamp + 1_000_000, &refs))
        .unwrap();
    block_on(rig.log.flush()).unwrap();
    let log = &rig.log;
    rig.map.borrow_mut().refresh(log);
    let map = rig.map.borrow();
    assert_eq!(
        map.generation,
        generation + 1,
        "the changed entry was found"
    );
    assert!(map.recent.borrow().window.is_none());
    assert_eq!(kept_bytes(), 0, "its share of the budget is back");
    let held: Vec<_> = map.segments[0].index.clone();
    let now: Vec<_> = log.extents().next().unwrap().index.to_vec();
    assert_eq!(held, now, "the map holds the log's entries");
}

/// The shard's share per group bounds a tail below its own budget (decision 424): with the
/// share a quarter of the tail's budget the tail stays near the share, polls still answer
/// exactly (older batches from the segments), and a larger share lets the tail grow again.
#[test]
fn the_shards_share_bounds_a_tail_below_its_own_budget() {
    let mut rig = Rig::new("share");
    let share = Rc::new(std::cell::Cell::new(CACHE / 4));
    let machine = std::mem::replace(&mut rig.machine, PartitionStateMachine::new(group()));
    rig.machine = machine.with_tail_share(share.clone());
    for _ in 0..40 {
        rig.send(2);
    }
    assert!(rig.reference.cache_bytes() > 4 * CACHE);
    let held = rig.machine.cache_bytes();
    assert!(
        held <= CACHE / 4 + 4 * 1024,
        "the tail holds {held} B, the share is {} B",
        CACHE / 4
    );
    for offset in 0..rig.next {
        let (_, got) = Rig::poll(&rig.machine, PollingStrategy::Offset(offset), 5);
        let (_, want) = Rig::poll(&rig.reference, PollingStrategy::Offset(offset), 5);
        assert!(got == want, "offset {offset}");
    }
    share.set(usize::MAX);
    for _ in 0..40 {
        rig.send(2);
    }
    let held = rig.machine.cache_bytes();
    assert!(
        held > CACHE / 2 && held <= CACHE + 4 * 1024,
        "with the share lifted the tail's own budget bounds it: {held} B"
    );
}
