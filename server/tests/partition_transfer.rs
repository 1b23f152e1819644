//! A partition group's state transfer streams (decision 220): a replica cut off while the others
//! commit a partition many times larger than `TRANSFER_BYTES_HELD_MAX` past their journal's
//! reach catches up by a transfer, stages the SEGMENT_LOG in a temporary file of its partition
//! directory, and then answers polls for every message exactly as the primary does. The heap
//! this thread holds (all three cores and machines, the driver, its network) is counted by a
//! global allocator, per thread: until the install it grows by at most the core's bound plus
//! bookkeeping (the serving machine's offer shares its batches, the receiver writes chunks to
//! the file), and through the install by its read cache, a read chunk and a batch more, not by
//! the partition: the receiver reads from the segments (decision 280), verifies the staged
//! file by chunk and hands it to the storage task (decision 284), and its polls of old offsets
//! read that file. Before decision 284 the install read the staged file back whole (the
//! partition once more); behind `Buffered`, the serving side copied the partition into its
//! offer and the receiver accumulated it and copied it again.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;

use consensus::constants::{STATE_CHUNK_LEN_MAX, TRANSFER_BYTES_HELD_MAX};
use consensus::{
    ClientRequest, Completion, Effect, Frame, GroupId, Input, Now, Outbox, RawConfig, Recovered,
    Replica, ReplicaId,
};
use server::client::codec::{Consumer, Identifier, PollingStrategy};
use server::client::reply::PollHead;
use server::client::request::PollMessages;
use server::partition::PollAnswer;
use server::partition::machine::PartitionStateMachine;
use server::partition::reader::{SegmentMap, StorageFiles};
use wire::{Operation, PartitionKey};

#[global_allocator]
static ALLOCATOR: counting_alloc::Counting = counting_alloc::Counting;

/// Messages per batch and their size: one request carries 4 x 60 KiB.
const PAYLOAD: usize = 60 << 10;
const PER_BATCH: usize = 4;
/// Requests: 80 x 240 KiB, about 19 MiB, about 36 times the bound.
const REQUESTS: usize = 80;
/// Heap the driver, ordinary traffic and the cores' bookkeeping may add (manifests, the offer's
/// batch handles, heartbeats, repair frames, poll state).
const BOOKKEEPING: usize = 64 << 10;
/// The receiver's read cache (its in-memory tail).
const CACHE: usize = 256 << 10;
/// What the install may hold beside the cache: its read buffer and one batch being verified.
const INSTALL_CHUNK: usize = (256 << 10) + PER_BATCH * PAYLOAD + (4 << 10);

fn group() -> GroupId {
    GroupId::partition(PartitionKey {
        stream: 1,
        topic: 1,
        partition: 0,
    })
    .unwrap()
}

fn payload(i: usize) -> Vec<u8> {
    let mut p = vec![(i % 251) as u8; PAYLOAD];
    p[..8].copy_from_slice(&(i as u64).to_le_bytes());
    p
}

/// Three replicas of one partition group, a FIFO network, immediate storage; replica 2 can be
/// cut off.
struct Driver {
    replicas: Vec<Replica<PartitionStateMachine>>,
    journals: Vec<BTreeMap<u64, Frame>>,
    network: VecDeque<(ReplicaId, ReplicaId, Frame)>,
    completions: VecDeque<(ReplicaId, Completion)>,
    cut: bool,
    now: Now,
    outbox: Outbox,
    installs: usize,
    /// While sampling: the heap at the start, the peak growth seen after every step before
    /// replica 2 installed, and whether its staging file was seen then.
    sampling: Option<(usize, usize, bool, PathBuf)>,
}

impl Driver {
    fn new(staging: &std::path::Path) -> Driver {
        let mut d = Driver {
            replicas: Vec::new(),
            journals: vec![BTreeMap::new(); 3],
            network: VecDeque::new(),
            completions: VecDeque::new(),
            cut: true,
            now: Now {
                tick: 0,
                realtime_us: 1_000_000,
            },
            outbox: Outbox::new(),
            installs: 0,
            sampling: None,
        };
        for r in 0..3u8 {
            let mut raw = RawConfig::new(0xC1, ReplicaId(r), 3, group());
            raw.checkpoint_interval_ops = consensus::constants::CHECKPOINT_INTERVAL_OPS_MIN;
            let dir = staging.join(format!("r{r}"));
            std::fs::create_dir_all(&dir).unwrap();
            // Reads from the partition directory (no storage task runs here: the segments stay
            // empty, so the serving replicas keep every batch; the receiver's install maps the
            // staged file).
            let files = journal::file::FileStorage::new(&dir, false).unwrap();
            let map = SegmentMap {
                files: Some(std::rc::Rc::new(StorageFiles(files))),
                dir: Some(dir.clone()),
                ..SegmentMap::default()
            };
            let machine = PartitionStateMachine::new(group())
                .with_staging_dir(Some(dir))
                .with_disk(std::rc::Rc::new(std::cell::RefCell::new(map)), CACHE);
            let replica = Replica::new(
                raw.validate().unwrap(),
                Recovered::fresh(u128::from(r) + 1),
                machine,
                &mut d.outbox,
            );
            d.replicas.push(replica);
            d.execute(ReplicaId(r));
        }
        d.run();
        d
    }

    fn step(&mut self, r: ReplicaId, input: Input<'_>) {
        let _ = self.replicas[usize::from(r.0)].step(self.now, input, &mut self.outbox);
        self.execute(r);
        if let Some((base, peak, seen, path)) = self.sampling.as_mut()
            && self.replicas[2].transfers_installed() == 0
        {
            *peak = counting_alloc::peak() - *base;
            *seen |= path.exists();
        }
    }

    fn execute(&mut self, r: ReplicaId) {
        // The storage work a node's storage task would write: counted, then dropped.
        for work in self.replicas[usize::from(r.0)]
            .state_machine()
            .take_storage()
        {
            if matches!(
                work,
                server::partition::machine::StorageWork::Install { .. }
            ) {
                self.installs += 1;
            }
        }
        let effects: Vec<Effect> = self.outbox.drain().collect();
        let journal = &mut self.journals[usize::from(r.0)];
        for effect in effects {
            match effect {
                Effect::Send { to, frame } => {
                    if !(self.cut && (r.0 == 2 || to.0 == 2)) {
                        self.network.push_back((r, to, frame));
                    }
                }
                Effect::Append { op, frame } => {
                    let checksum = frame.prepare_header().unwrap().frame.checksum.get();
                    journal.insert(op, frame);
                    self.completions
                        .push_back((r, Completion::Appended { op, checksum }));
                }
                Effect::Truncate { from_op } => {
                    journal.split_off(&from_op);
                }
                Effect::PersistVsrState(state) => self.completions.push_back((
                    r,
                    Completion::VsrStatePersisted {
                        view: state.view,
                        log_view: state.log_view,
                    },
                )),
                Effect::Read { op, .. } => {
                    let frame = journal.get(&op).cloned();
                    self.completions
                        .push_back((r, Completion::Read { op, frame }));
                }
                Effect::Reply { .. } => {}
                Effect::Checkpoint { op } => {
                    journal.retain(|o, _| *o >= op);
                    self.completions
                        .push_back((r, Completion::Checkpointed { op }));
                }
                Effect::Fatal(reason) => panic!("replica {} fail-stop: {reason}", r.0),
            }
        }
    }

    fn run(&mut self) {
        for _ in 0..100_000 {
            if let Some((r, completion)) = self.completions.pop_front() {
                self.step(r, Input::Done(completion));
            } else if let Some((from, to, frame)) = self.network.pop_front() {
                self.step(
                    to,
                    Input::Frame {
                        from,
                        frame: frame.bytes(),
                    },
                );
            } else {
                return;
            }
        }
        panic!("the driver did not quiesce");
    }

    fn tick(&mut self) {
        self.now.tick += 1;
        self.now.realtime_us += 10_000;
        for r in 0..3 {
            self.step(ReplicaId(r), Input::Tick);
        }
        self.run();
    }
}

/// Every poll answer from offset 0 on, batch by batch, until the end (the replica's bytes).
fn poll_everything(m: &PartitionStateMachine) -> (u64, Vec<Vec<u8>>) {
    let mut bodies = Vec::new();
    let mut messages = 0u64;
    let end = m.committed_offset_end();
    while messages < end {
        let request = PollMessages {
            consumer: Consumer {
                group: false,
                id: Identifier::Numeric(7),
            },
            stream: Identifier::Numeric(1),
            topic: Identifier::Numeric(1),
            partition: Some(0),
            strategy: PollingStrategy::Offset(messages),
            count: 16,
            auto_commit: false,
        };
        let p = match m.poll(0, &request).unwrap() {
            PollAnswer::Ready(p) => p,
            PollAnswer::Disk(read) => journal::storage::block_on(read.read()).unwrap(),
        };
        let (head, _) = PollHead::decode(&p.body()).unwrap();
        assert_eq!(head.current_offset, end - 1);
        assert!(p.messages_count > 0, "no message at offset {messages}");
        messages += u64::from(p.messages_count);
        bodies.push(p.body());
    }
    (messages, bodies)
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strand-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_partition_many_times_the_bound_transfers_through_a_staging_file() {
    let dir = temp_dir("partition-transfer");
    let mut d = Driver::new(&dir);
    // A fresh group refuses requests until its first checkpoint is durable; the driver's are.
    for _ in 0..10 {
        d.tick();
    }
    let payloads: Vec<Vec<u8>> = (0..REQUESTS * PER_BATCH).map(payload).collect();
    for (number, chunk) in payloads.chunks(PER_BATCH).enumerate() {
        let refs: Vec<&[u8]> = chunk.iter().map(Vec::as_slice).collect();
        let batch = consensus::build_batch(&refs);
        let body = consensus::build_send_messages_request(&batch, 0);
        let request = ClientRequest::new(1, Operation::SendMessages, 0, number as u64 + 1, body);
        d.step(ReplicaId(0), Input::Request(request));
        d.run();
    }
    let commit = d.replicas[0].commit_min();
    let end = d.replicas[0].state_machine().committed_offset_end();
    assert_eq!(end, (REQUESTS * PER_BATCH) as u64, "every batch committed");
    assert!(d.journals[0].keys().next().is_some_and(|first| *first > 1));
    assert_eq!(d.replicas[2].commit_min(), 0);
    let partition = REQUESTS * PER_BATCH * PAYLOAD;
    assert!(partition >= 30 * TRANSFER_BYTES_HELD_MAX);
    assert!(partition >= 64 * STATE_CHUNK_LEN_MAX as usize);

    // Reconnected, replica 2 finds the range evicted and transfers.
    d.cut = false;
    let base = counting_alloc::restart_peak();
    let staged = dir
        .join("r2")
        .join(format!("t{:016x}-0.staging", group().0));
    d.sampling = Some((base, 0, false, staged.clone()));
    for _ in 0..20_000 {
        d.tick();
        if d.replicas[2].transfers_installed() > 0 && d.replicas[2].commit_min() == commit {
            break;
        }
    }
    let peak = counting_alloc::peak() - base;
    let (_, staging_peak, saw_staging_file, _) = d.sampling.take().unwrap();

    assert_eq!(d.replicas[2].transfers_installed(), 1);
    assert_eq!(d.replicas[2].commit_min(), commit);
    assert!(
        d.installs >= 1,
        "the install was queued for the storage task"
    );
    assert!(
        saw_staging_file,
        "the SEGMENT_LOG was staged in {}",
        staged.display()
    );
    assert!(
        !staged.exists(),
        "the staging file is removed after the install"
    );
    // Every message reads back from the receiver exactly as from the primary.
    let (messages, bodies) = poll_everything(d.replicas[2].state_machine());
    let (primary_messages, primary_bodies) = poll_everything(d.replicas[0].state_machine());
    assert_eq!(messages, end);
    assert_eq!(primary_messages, end);
    assert!(bodies == primary_bodies, "poll answers differ");
    assert_eq!(
        d.replicas[2].state_machine().offsets(),
        d.replicas[0].state_machine().offsets()
    );

    eprintln!(
        "partition {partition} bytes: heap grew by {staging_peak} bytes until the install, \
         {peak} through it (bound until the install {})",
        TRANSFER_BYTES_HELD_MAX + BOOKKEEPING
    );
    assert!(
        staging_peak <= TRANSFER_BYTES_HELD_MAX + BOOKKEEPING,
        "heap grew by {staging_peak} bytes before the install (bound {})",
        TRANSFER_BYTES_HELD_MAX + BOOKKEEPING
    );
    // The install keeps the tail, not the partition (decision 284).
    let bound = TRANSFER_BYTES_HELD_MAX + BOOKKEEPING + CACHE + INSTALL_CHUNK;
    assert!(bound * 8 < partition);
    assert!(
        peak <= bound,
        "heap grew by {peak} bytes through the install (bound {bound})"
    );
    assert!(d.replicas[2].state_machine().cache_bytes() <= CACHE);
    // The serving side drops its image once the core lets the offer expire.
    for _ in 0..2_000 {
        d.tick();
    }
    assert_eq!(
        d.replicas[0].state_machine().offers_held(),
        0,
        "offer released"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
