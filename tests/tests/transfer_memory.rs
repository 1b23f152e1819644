//! State transfer keeps memory bounded (decision 170): a replica that fell behind a compacted
//! journal catches up by a transfer of an artifact many times larger than
//! `TRANSFER_BYTES_HELD_MAX`, and the heap this thread holds while the transfer runs (both
//! cores, both state machines, the tiny driver below and its network) never grows by more than
//! the bound plus a little bookkeeping. Before decision 170 the serving core held every
//! artifact whole and the receiving core accumulated it whole: twice the artifact.
//!
//! The heap is measured by a counting global allocator (`counting-alloc`), per thread, so tests
//! running in parallel do not disturb each other.

use std::collections::{BTreeMap, VecDeque};

use consensus::constants::{STATE_CHUNK_LEN_MAX, TRANSFER_BYTES_HELD_MAX};
use consensus::{
    ClientRequest, Completion, Effect, Frame, GroupId, Input, Now, Outbox, RawConfig, Recovered,
    Replica, ReplicaId,
};
use tests::machine::SimMachine;

#[global_allocator]
static ALLOCATOR: counting_alloc::Counting = counting_alloc::Counting;

/// The main artifact's padding: 64 full chunks (16 MiB), about 32 times the bound.
const PAD: u64 = 64 * STATE_CHUNK_LEN_MAX as u64;
/// Heap the driver, the frames of ordinary traffic and the cores' other bookkeeping may add
/// while the transfer runs (client-table encodings, manifests, heartbeats, repair frames).
const BOOKKEEPING: usize = 64 << 10;

/// Three metadata replicas, a FIFO network, immediate storage; replica 2 can be cut off.
struct Driver {
    replicas: Vec<Replica<SimMachine>>,
    journals: Vec<BTreeMap<u64, Frame>>,
    network: VecDeque<(ReplicaId, ReplicaId, Frame)>,
    completions: VecDeque<(ReplicaId, Completion)>,
    cut: bool,
    now: Now,
    outbox: Outbox,
}

impl Driver {
    fn new() -> Driver {
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
        };
        for r in 0..3u8 {
            let mut raw = RawConfig::new(0xC1, ReplicaId(r), 3, GroupId::METADATA);
            raw.checkpoint_interval_ops = consensus::constants::CHECKPOINT_INTERVAL_OPS_MIN;
            let mut machine = SimMachine::default();
            machine.artifact_pad = PAD;
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
    }

    fn execute(&mut self, r: ReplicaId) {
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

#[test]
fn a_transfer_many_times_the_bound_holds_at_most_the_bound() {
    let mut d = Driver::new();
    // Replica 2 is cut off while the others commit past two checkpoints.
    for client in 1..=40u128 {
        let request = ClientRequest::new(client, wire::Operation::Register, 0, 0, vec![]);
        d.step(ReplicaId(0), Input::Request(request));
        d.run();
    }
    let commit = d.replicas[0].commit_min();
    assert_eq!(commit, 40);
    assert!(d.journals[0].keys().next().is_some_and(|first| *first > 1));
    assert_eq!(d.replicas[2].commit_min(), 0);

    // Reconnected, it learns the commit point, finds the range evicted and transfers.
    d.cut = false;
    let base = counting_alloc::restart_peak();
    for _ in 0..20_000 {
        d.tick();
        if d.replicas[2].transfers_installed() > 0 && d.replicas[2].commit_min() == commit {
            break;
        }
    }
    let peak = counting_alloc::peak() - base;

    assert_eq!(d.replicas[2].transfers_installed(), 1);
    assert_eq!(d.replicas[2].commit_min(), commit);
    assert_eq!(
        d.replicas[2].state_machine().inner,
        d.replicas[0].state_machine().inner
    );
    assert_eq!(
        d.replicas[2].client_table_encoded(),
        d.replicas[0].client_table_encoded()
    );
    let artifact = 16 + PAD as usize;
    assert!(artifact >= 30 * TRANSFER_BYTES_HELD_MAX);
    // The server held one chunk frame at a time; the receiver passed every chunk through.
    let served = d.replicas[0].transfer_bytes_peak();
    assert!(
        served > 0 && served <= TRANSFER_BYTES_HELD_MAX,
        "the serving core held {served} artifact bytes"
    );
    assert_eq!(d.replicas[2].transfer_bytes_peak(), 0);
    assert!(
        peak <= TRANSFER_BYTES_HELD_MAX + BOOKKEEPING,
        "heap grew by {peak} bytes during a transfer of a {artifact}-byte artifact (bound {})",
        TRANSFER_BYTES_HELD_MAX + BOOKKEEPING
    );
    eprintln!(
        "artifact {artifact} bytes, heap peak {peak} bytes above the start, bound {TRANSFER_BYTES_HELD_MAX}"
    );
}
