//! A tiny reference driver: replicas of one group in one thread over a perfect in-memory network
//! and storage, with switches for dropping links, crashing and restarting. Used by the unit
//! tests and the benchmarks; the deterministic simulator (`tests/`) is the real harness.

use std::collections::{BTreeMap, VecDeque};

use crate::config::{Config, RawConfig};
use crate::io::{ClientRequest, Completion, Effect, Input, Outbox, Recovered};
use crate::replica::Replica;
use crate::state_machine::DigestStateMachine;
use crate::types::{ClientId, Frame, GroupId, Now, ReplicaId, VsrState};

/// What a node's disk holds.
#[derive(Debug, Clone, Default)]
pub struct Disk {
    /// Journaled prepares by op.
    pub journal: BTreeMap<u64, Frame>,
    /// The superblock.
    pub superblock: Option<VsrState>,
    /// The durable snapshot written by the last `Effect::Checkpoint`.
    pub snapshot: Option<Snapshot>,
}

/// A durable checkpoint: the state machine and client table at `op`.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The checkpoint op.
    pub op: u64,
    /// Identity of the prepare at `op` (0 if unknown).
    pub checksum: u128,
    /// Timestamp of the prepare at `op` (0 if unknown).
    pub timestamp: u64,
    /// The encoded client table.
    pub client_table: Vec<u8>,
    /// The state machine.
    pub state: DigestStateMachine,
}

/// A fresh state machine for `group`: a partition group's offers (and accepts) a SEGMENT_LOG
/// artifact, which is all the core lets a partition receiver install (§11.2 step 3); a
/// METADATA_SNAPSHOT offer is rejected there, so the transfer could never complete.
fn machine(group: GroupId) -> DigestStateMachine {
    crate::Buffered::new(crate::DigestMachine {
        partition: !group.is_metadata(),
        ..crate::DigestMachine::default()
    })
}

/// Replicas of one group, a FIFO network and immediate storage.
pub struct Cluster {
    /// The replicas (`None` while crashed).
    pub replicas: Vec<Option<Replica<DigestStateMachine>>>,
    /// Disks, surviving crashes.
    pub disks: Vec<Disk>,
    /// Frames in flight: `(from, to, frame)`.
    pub network: VecDeque<(ReplicaId, ReplicaId, Frame)>,
    /// Completions in flight: `(replica, completion)`.
    pub completions: VecDeque<(ReplicaId, Completion)>,
    /// Replies and evictions sent to clients.
    pub replies: Vec<(ClientId, Frame)>,
    /// Bit `a * 32 + b` set: frames from `a` to `b` are dropped.
    pub cut: Vec<bool>,
    /// Current time.
    pub now: Now,
    /// Configs per replica.
    pub configs: Vec<Config>,
    /// Boots so far (incarnations).
    pub boots: u128,
    /// Frames sent, by command byte.
    pub sent: [u64; 32],
    /// Frames lost at random, per mille (seeded by `seed`).
    pub loss_per_mille: u64,
    /// PRNG state for losses.
    pub seed: u64,
    /// Chaos: deliver frames out of order, duplicate some, and interleave completions with
    /// network delivery at random.
    pub chaos: bool,
    outbox: Outbox,
}

impl Cluster {
    /// `n` fresh replicas of `group`; `tune` adjusts each raw config.
    pub fn new(n: u8, group: GroupId, tune: impl Fn(&mut RawConfig)) -> Cluster {
        let configs: Vec<Config> = (0..n)
            .map(|r| {
                let mut raw = RawConfig::new(0xC1, ReplicaId(r), n, group);
                tune(&mut raw);
                raw.validate().expect("valid test config")
            })
            .collect();
        let mut cluster = Cluster {
            replicas: Vec::new(),
            disks: vec![Disk::default(); n as usize],
            network: VecDeque::new(),
            completions: VecDeque::new(),
            replies: Vec::new(),
            cut: vec![false; 32 * 32],
            now: Now {
                tick: 0,
                realtime_us: 1_000_000,
            },
            configs,
            boots: 0,
            sent: [0; 32],
            loss_per_mille: 0,
            seed: 1,
            chaos: false,
            outbox: Outbox::new(),
        };
        for r in 0..n {
            cluster.boots += 1;
            let replica = Replica::new(
                cluster.configs[r as usize].clone(),
                Recovered::fresh(cluster.boots),
                machine(group),
                &mut cluster.outbox,
            );
            cluster.replicas.push(Some(replica));
            cluster.execute(ReplicaId(r));
        }
        // Fresh groups write their first superblock before anything else.
        cluster.run();
        cluster
    }

    /// The replica `r` (panics if crashed).
    pub fn replica(&self, r: u8) -> &Replica<DigestStateMachine> {
        self.replicas[r as usize].as_ref().expect("replica is up")
    }

    fn execute(&mut self, r: ReplicaId) {
        let effects: Vec<Effect> = self.outbox.drain().collect();
        let disk = &mut self.disks[r.0 as usize];
        for effect in effects {
            match effect {
                Effect::Send { to, frame } => {
                    self.sent[usize::from(frame.bytes()[60]) % 32] += 1;
                    self.network.push_back((r, to, frame));
                }
                Effect::Append { op, frame } => {
                    let checksum = frame
                        .prepare_header()
                        .expect("prepare")
                        .frame
                        .checksum
                        .get();
                    disk.journal.insert(op, frame);
                    self.completions
                        .push_back((r, Completion::Appended { op, checksum }));
                }
                Effect::Truncate { from_op } => {
                    disk.journal.split_off(&from_op);
                }
                Effect::PersistVsrState(state) => {
                    let (view, log_view) = (state.view, state.log_view);
                    disk.superblock = Some(state);
                    self.completions
                        .push_back((r, Completion::VsrStatePersisted { view, log_view }));
                }
                Effect::Read { op, .. } => {
                    let frame = disk.journal.get(&op).cloned();
                    self.completions
                        .push_back((r, Completion::Read { op, frame }));
                }
                Effect::Reply { client, frame } => self.replies.push((client, frame)),
                Effect::Checkpoint { op } => {
                    // G4: the snapshot is durable before the journal floor moves; the entry at
                    // `op` itself is kept.
                    let replica = self.replicas[r.0 as usize].as_ref().expect("replica is up");
                    let header = replica.header(op).copied();
                    disk.snapshot = Some(Snapshot {
                        op,
                        checksum: header.map_or(0, |h| h.frame.checksum.get()),
                        timestamp: header.map_or(0, |h| h.timestamp.get()),
                        client_table: replica.client_table_encoded(),
                        state: replica.state_machine().clone(),
                    });
                    disk.journal.retain(|o, _| *o >= op);
                    self.completions
                        .push_back((r, Completion::Checkpointed { op }));
                }
                Effect::Fatal(reason) => panic!("replica {r} fail-stop: {reason}"),
            }
        }
    }

    /// Feeds one input to replica `r` and executes its effects.
    pub fn step(&mut self, r: ReplicaId, input: Input<'_>) {
        let now = self.now;
        if let Some(replica) = self.replicas[r.0 as usize].as_mut() {
            let _ = replica.step(now, input, &mut self.outbox);
            self.execute(r);
        }
    }

    /// Delivers frames and completions until nothing is in flight (bounded).
    pub fn run(&mut self) {
        for _ in 0..1_000_000 {
            let network_first =
                self.chaos && !self.network.is_empty() && self.random().is_multiple_of(2);
            let completion = if network_first {
                None
            } else {
                self.completions.pop_front()
            };
            let pick = if self.chaos && self.network.len() > 1 && self.random().is_multiple_of(10) {
                (self.random() % self.network.len() as u64) as usize
            } else {
                0
            };
            if let Some((r, completion)) = completion {
                self.step(r, Input::Done(completion));
            } else if let Some((from, to, frame)) = self.network.remove(pick) {
                if self.chaos && self.random().is_multiple_of(50) {
                    self.network.push_back((from, to, frame.clone()));
                }
                if self.cut[from.0 as usize * 32 + to.0 as usize] {
                    continue;
                }
                if self.loss_per_mille > 0 && self.random() % 1000 < self.loss_per_mille {
                    continue;
                }
                self.step(
                    to,
                    Input::Frame {
                        from,
                        frame: &frame,
                    },
                );
            } else {
                return;
            }
        }
        panic!("the cluster did not quiesce");
    }

    /// SplitMix64 over `seed`.
    pub fn random(&mut self) -> u64 {
        self.seed = self.seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// One tick on every live replica, then [`Cluster::run`].
    pub fn tick(&mut self) {
        self.now.tick += 1;
        self.now.realtime_us += 10_000;
        for r in 0..self.replicas.len() as u8 {
            self.step(ReplicaId(r), Input::Tick);
        }
        self.run();
    }

    /// Ticks `k` times.
    pub fn ticks(&mut self, k: u64) {
        for _ in 0..k {
            self.tick();
        }
    }

    /// Cuts (or heals) both directions between `a` and `b`.
    pub fn set_link(&mut self, a: u8, b: u8, up: bool) {
        self.cut[a as usize * 32 + b as usize] = !up;
        self.cut[b as usize * 32 + a as usize] = !up;
    }

    /// Isolates (or heals) replica `a` from everyone.
    pub fn isolate(&mut self, a: u8, isolated: bool) {
        for b in 0..self.replicas.len() as u8 {
            if a != b {
                self.set_link(a, b, !isolated);
            }
        }
    }

    /// Crashes `r`: its memory is lost, its disk survives; in-flight frames to it are dropped.
    pub fn crash(&mut self, r: u8) {
        self.replicas[r as usize] = None;
        self.completions.retain(|(to, _)| to.0 != r);
    }

    /// Restarts `r` from its disk.
    pub fn restart(&mut self, r: u8) {
        let disk = &self.disks[r as usize];
        self.boots += 1;
        let snapshot_op = disk.snapshot.as_ref().map_or(0, |s| s.op);
        let recovered = Recovered {
            superblock: disk.superblock.clone(),
            frames: disk
                .journal
                .range(snapshot_op.max(1)..)
                .map(|(_, f)| f.clone())
                .collect(),
            incarnation: self.boots,
            snapshot_op,
            snapshot_checksum: disk.snapshot.as_ref().map_or(0, |s| s.checksum),
            snapshot_timestamp: disk.snapshot.as_ref().map_or(0, |s| s.timestamp),
            client_table: disk
                .snapshot
                .as_ref()
                .map_or_else(Vec::new, |s| s.client_table.clone()),
            ..Recovered::default()
        };
        let group = self.configs[r as usize].group;
        let state = disk
            .snapshot
            .as_ref()
            .map_or_else(|| machine(group), |s| s.state.clone());
        let replica = Replica::new(
            self.configs[r as usize].clone(),
            recovered,
            state,
            &mut self.outbox,
        );
        self.replicas[r as usize] = Some(replica);
        self.execute(ReplicaId(r));
    }

    /// A client request (see [`ClientRequest::new`]).
    pub fn request(
        client: u128,
        operation: wire::Operation,
        session: u64,
        request: u64,
        body: Vec<u8>,
    ) -> ClientRequest {
        ClientRequest::new(client, operation, session, request, body)
    }

    /// Primary affinity: asks replica `r` to take over (`Replica::take_over`) and runs the
    /// cluster.
    pub fn take_over(&mut self, r: u8) -> Result<u32, crate::Ignored> {
        let now = self.now;
        let replica = self.replicas[r as usize].as_mut().expect("replica is up");
        let result = replica.take_over(now, &mut self.outbox);
        self.execute(ReplicaId(r));
        self.run();
        result
    }

    /// Submits a request to replica `r` and runs the cluster.
    pub fn submit(&mut self, r: u8, request: ClientRequest) {
        self.step(ReplicaId(r), Input::Request(request));
        self.run();
    }

    /// The highest `commit_min` reached by every live replica.
    pub fn commit_min_all(&self) -> u64 {
        self.replicas
            .iter()
            .flatten()
            .map(|r| r.commit_min())
            .min()
            .unwrap_or(0)
    }
}
