//! The simulator: real `consensus::Replica`s (one per group per node) over the simulated network
//! ([`crate::net`]), disks ([`crate::storage`]) and clocks ([`crate::clock`]), with clients that
//! submit and retry requests, a fault schedule drawn from the seed ([`crate::swarm`]), and the
//! checkers ([`crate::check`]) fed after every step.
//!
//! One tick, in order: faults (crash, restart, partitions, clock steps), connection changes,
//! network delivery, storage completions, `Input::Tick` to every replica (hosts in an order drawn
//! from the schedule stream), clients, end-of-tick checks.

use std::collections::{BTreeMap, BTreeSet};

use consensus::{
    ClientRequest, Completion, Config, Effect, Frame, GroupId, Input, Now, Outbox, RawConfig,
    Replica, ReplicaId, Status,
};
use wire::{Command, Message, Operation};

mod clients;
mod finish;
mod hosts;

use crate::check::{Checker, Observed, Violation};
use crate::clock::DriftClock;
use crate::machine::SimMachine;
use crate::net::{Network, Node};
use crate::prng::{Prng, Stream};
use crate::storage::{Disk, Entry, Write, journal_config};
use crate::swarm::Swarm;

/// Cluster name of every simulated cluster.
pub const CLUSTER_NAME: &str = "strand-sim";

/// Options of one run besides the swarm.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Print a line per notable event to stderr.
    pub trace: bool,
    /// Stop at the first violation (the default for seed runs).
    pub stop_at_violation: bool,
    /// Disks that acknowledge flushes they never did (a checker self-test: the simulator must
    /// notice, since it runs on the journal's fault backend).
    pub lying_sync: bool,
    /// Deliberately broken core rules (checker self-tests).
    #[cfg(feature = "bug-knobs")]
    pub bug_knobs: consensus::BugKnobs,
}

/// What one seed did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// Fault profile name.
    pub profile: &'static str,
    /// Cluster size.
    pub replicas: u8,
    /// Groups (metadata included).
    pub groups: u8,
    /// Ticks simulated.
    pub ticks: u64,
    /// Safety violations and stalls, in detection order.
    pub violations: Vec<Violation>,
    /// Liveness failures (a subset of `violations`).
    pub stalls: u64,
    /// Distinct committed ops over all groups.
    pub committed_ops: u64,
    /// Of which in partition groups.
    pub partition_ops: u64,
    /// Times a group reached a new view with a Normal primary.
    pub view_changes: u64,
    /// Crashes injected.
    pub crashes: u64,
    /// Repair requests sent (RequestPrepares).
    pub repairs: u64,
    /// State transfers installed.
    pub state_transfers: u64,
    /// Periodic checkpoints taken (journal compactions), transfers excluded.
    pub checkpoints: u64,
    /// State transfer requests sent.
    pub state_transfer_requests: u64,
    /// Frames the network dropped (loss, overrun, partition, down).
    pub frames_dropped: u64,
    /// Of which dropped by a full per-peer queue.
    pub frames_overrun: u64,
    /// Client requests that completed (committed reply received).
    pub requests_completed: u64,
    /// Requests refused for good (not transient, not committed).
    pub requests_refused: u64,
    /// Inputs the cores ignored.
    pub inputs_ignored: u64,
    /// `Effect::Fatal` seen (the node is then crashed).
    pub fatals: u64,
    /// Ticks from healing to convergence (0 if the run did not converge or never faulted).
    pub heal_ticks: u64,
    /// Unreported appends torn by crashes.
    pub torn_writes: u64,
    /// Appends the journal refused (completed as failed writes).
    pub journal_refusals: u64,
    /// Journal entries recovery truncated after a gap, torn entry or chain break.
    pub recovery_truncations: u64,
    /// Damaged newest journal entries handed to the core as held but faulty at boot (the
    /// header ring vouched for them, decision 62).
    pub faulty_entries_held: u64,
    /// Wiped nodes that rejoined (`Recovered::wiped`).
    pub wiped_rejoins: u64,
    /// Group boots restored from a snapshot a state transfer installed (the replica restarted
    /// from its transferred snapshot, its identity only from its own superblock).
    pub restarts_from_transferred_snapshot: u64,
    /// Of which the superblock named the snapshot's prepare identity.
    pub restarts_from_transferred_snapshot_identified: u64,
    /// Nodes that refused to boot after interior journal corruption.
    pub boot_refusals: u64,
    /// Durable journal entries corrupted by the fault schedule.
    pub entries_corrupted: u64,
    /// A digest of every frame sent, in order: two runs of one seed must agree bit for bit.
    pub fingerprint: u64,
    /// Live prepares a backup refused for a timestamp beyond its clock's window (decision 72).
    pub prepares_clock_ahead: u64,
    /// Prepares a replica skipped because its incomplete appends reached
    /// `appending_bytes_max` (decision 504), to be repaired later.
    pub prepares_appending_behind: u64,
    /// Node ticks under storage pressure (decision 505).
    pub pressure_ticks: u64,
    /// Restarts of a memory-ack group with a prior life, rejoining in lost state (decision 73).
    pub memory_ack_rejoins: u64,
    /// Memory-ack groups that had more replicas down or lost at once than they tolerate
    /// (excused from liveness only).
    pub memory_ack_over_budget: u64,
    /// Partition groups: committed ops a server read back from below its checkpoint (its WAL
    /// still held them) to repair a lagging backup: the repair floor, decision 71.
    pub repair_floor_served: u64,
    /// Partition groups: RangeEvicted above the receiver's commit point that started a state
    /// transfer (the primary evicted ops the receiver lacks).
    pub repair_floor_transfers: u64,
    /// State-transfer artifact bytes served (StateChunk bodies sent).
    pub transfer_bytes: u64,
    /// Largest artifact prefix served (`offset + len` of a StateChunk): how far beyond the
    /// core's memory bound the seed's artifacts went.
    pub transfer_artifact_max: u64,
    /// Most state-machine artifact bytes any core held at once for a transfer
    /// (`Replica::transfer_bytes_peak`, bounded by `TRANSFER_BYTES_HELD_MAX`, decision 170).
    pub transfer_bytes_peak: u64,
    /// Partition-group view changes started by primary affinity (`Replica::take_over`).
    pub takeovers: u64,
}

/// A durable snapshot of a group (written by `Effect::Checkpoint`).
#[derive(Debug, Clone)]
struct Snapshot {
    op: u64,
    /// Identity and timestamp of the prepare at `op` as the replica knew them when it asked
    /// for the checkpoint (0 when unknown); the superblock stores them (decision 52).
    prepare: (u128, u64),
    /// Installed by a state transfer (the checkpoint after an install).
    transferred: bool,
    client_table: Vec<u8>,
    state: SimMachine,
}

impl Snapshot {
    /// The hash of the snapshot's bytes (the superblock's `checkpoint_checksum`, not the
    /// prepare identity).
    fn bytes_checksum(&self) -> u128 {
        let mut bytes = Vec::with_capacity(32 + self.client_table.len());
        bytes.extend_from_slice(&self.op.to_le_bytes());
        bytes.extend_from_slice(&self.state.inner.op.to_le_bytes());
        bytes.extend_from_slice(&self.state.inner.digest.to_le_bytes());
        bytes.extend_from_slice(&self.state.offset_end.to_le_bytes());
        bytes.extend_from_slice(&self.client_table);
        u128::from(wire::integrity::xxh3(&bytes)) | (1 << 64)
    }
}

#[derive(Debug, Clone)]
struct PendingRead {
    complete_at: u64,
    group: u64,
    op: u64,
    checksum: u128,
}

#[derive(Debug, Clone)]
struct PendingCheckpoint {
    complete_at: u64,
    group: u64,
    snapshot: Snapshot,
}

struct Live {
    replica: Replica<SimMachine>,
    /// Highest op whose commit the checker has seen from this replica (this life).
    checked_commit: u64,
    /// How much of the state machine's applied log the checker has read.
    applied_cursor: usize,
    was_normal_primary: bool,
    /// Transfer installs of this life already counted in the report.
    transfers_counted: u64,
}

struct Host {
    id: u8,
    up: bool,
    restart_at: u64,
    clock: DriftClock,
    disk: Disk,
    snapshots: BTreeMap<u64, Snapshot>,
    reads: Vec<PendingRead>,
    checkpoints: Vec<PendingCheckpoint>,
    live: BTreeMap<u64, Live>,
    /// Peers this host's bus currently reports connected (as told to the replicas).
    connected: BTreeSet<u8>,
    slow: bool,
    /// Refused to boot (interior journal corruption) and was wiped: the next start rejoins
    /// with `Recovered::wiped`.
    wiped: bool,
    /// Primary affinity: the tick since which this node's metadata replica has been the
    /// Normal primary of its current view (what the node itself knows).
    metadata_primary_since: Option<(u32, u64)>,
    /// Primary affinity: the last tick a partition group was asked to take over.
    takeover_at: BTreeMap<u64, u64>,
}

#[derive(Debug, Clone)]
struct Outstanding {
    group: u64,
    request: u64,
    operation: Operation,
    body: Vec<u8>,
    submitted: u64,
    last_sent: u64,
    /// A transient refusal asked for a retry at this tick (to the target it chose).
    retry_at: Option<u64>,
    /// "Not committed yet" answers from the current target in a row.
    not_ready: u64,
    attempts: u32,
}

#[derive(Debug, Clone)]
struct Client {
    index: u32,
    id: u128,
    session: u64,
    next_request: u64,
    target: u8,
    outstanding: Option<Outstanding>,
    /// Completed a request submitted after healing.
    done_after_heal: bool,
    /// Requests a scenario asked for and not yet submitted.
    queued: u32,
    /// Non-Register requests completed.
    completed: u64,
}

/// One simulation run.
pub struct Sim {
    /// The seed.
    pub seed: u64,
    /// Shape and fault mix.
    pub swarm: Swarm,
    options: Options,
    /// Current tick.
    pub tick: u64,
    cluster: u128,
    groups: Vec<u64>,
    hosts: Vec<Host>,
    clients: Vec<Client>,
    client_index: BTreeMap<u128, u32>,
    /// The network.
    pub net: Network,
    /// The checkers.
    pub checker: Checker,
    outbox: Outbox,
    prng_storage: Prng,
    prng_crashes: Prng,
    prng_partitions: Prng,
    prng_clients: Prng,
    prng_schedule: Prng,
    prng_clocks: Prng,
    prng_identity: Prng,
    healed_at: Option<u64>,
    /// Whether the fault schedule runs (scenario tests drive faults by hand).
    pub auto_faults: bool,
    /// Whether clients submit on their own (scenario tests submit by hand).
    pub auto_submit: bool,
    /// Whether clients also send SendMessages to partition groups.
    pub partition_traffic: bool,
    max_normal_view: BTreeMap<u64, u32>,
    /// Memory-ack groups that had more replicas down or lost than they tolerate at once
    /// (`track_memory_ack_budget`): excused from liveness, still checked for safety.
    memory_over_budget: BTreeSet<u64>,
    /// Counters.
    pub report: Report,
}

fn identity_of(frame: &[u8]) -> u128 {
    u128::from_le_bytes(frame[0..16].try_into().expect("16 bytes"))
}

impl Sim {
    /// Builds the cluster for `seed` with the given swarm; every replica starts fresh.
    pub fn new(seed: u64, swarm: Swarm, options: Options) -> Sim {
        let cluster = wire::cluster_id(CLUSTER_NAME);
        let mut groups = vec![GroupId::METADATA.0];
        for p in 0..u32::from(swarm.partition_groups) {
            let key = wire::PartitionKey {
                stream: 1,
                topic: 1,
                partition: p + 1,
            };
            groups.push(GroupId::partition(key).expect("small ids").0);
        }
        let mut prng_clocks = Prng::new(seed, Stream::Clocks);
        let hosts = (0..swarm.replicas)
            .map(|id| Host {
                id,
                up: false,
                restart_at: 0,
                clock: DriftClock::random(
                    &mut prng_clocks,
                    swarm.clock_offset_us,
                    swarm.clock_drift_ppm,
                ),
                disk: Disk::new(
                    journal::Identity {
                        cluster,
                        replica_id: id,
                        replica_count: swarm.replicas,
                    },
                    journal_config(swarm.journal_slot_count),
                    options.lying_sync,
                ),
                snapshots: BTreeMap::new(),
                reads: Vec::new(),
                checkpoints: Vec::new(),
                live: BTreeMap::new(),
                connected: (0..swarm.replicas).filter(|&p| p != id).collect(),
                slow: swarm.slow_disk == Some(id),
                wiped: false,
                metadata_primary_since: None,
                takeover_at: BTreeMap::new(),
            })
            .collect();
        let mut prng_identity = Prng::new(seed, Stream::Identity);
        let clients = (0..swarm.clients)
            .map(|index| Client {
                index,
                id: prng_identity.next_u128_nonzero(),
                session: 0,
                next_request: 1,
                target: 0,
                outstanding: None,
                done_after_heal: false,
                queued: 0,
                completed: 0,
            })
            .collect::<Vec<_>>();
        let client_index = clients.iter().map(|c| (c.id, c.index)).collect();
        let net = Network::new(swarm.net.clone(), Prng::new(seed, Stream::Network));
        let mut sim = Sim {
            seed,
            options,
            tick: 0,
            cluster,
            groups,
            hosts,
            clients,
            client_index,
            net,
            checker: Checker::default(),
            outbox: Outbox::new(),
            prng_storage: Prng::new(seed, Stream::Storage),
            prng_crashes: Prng::new(seed, Stream::Crashes),
            prng_partitions: Prng::new(seed, Stream::Partitions),
            prng_clients: Prng::new(seed, Stream::Clients),
            prng_schedule: Prng::new(seed, Stream::Schedule),
            prng_clocks,
            prng_identity,
            healed_at: None,
            auto_faults: true,
            auto_submit: true,
            partition_traffic: true,
            max_normal_view: BTreeMap::new(),
            memory_over_budget: BTreeSet::new(),
            report: Report {
                seed,
                profile: swarm.profile.name(),
                replicas: swarm.replicas,
                groups: 1 + swarm.partition_groups,
                ..Report::default()
            },
            swarm,
        };
        // The swarm is the seed's whole fault configuration: printing it records the schedule
        // next to the seed (simulation.md §4) in case the generator changes later.
        sim.trace(format_args!("swarm {:?}", sim.swarm));
        for r in 0..sim.swarm.replicas {
            sim.start_host(r);
        }
        sim
    }

    fn trace(&self, what: std::fmt::Arguments<'_>) {
        if self.options.trace {
            eprintln!("[{} t{}] {what}", self.seed, self.tick);
        }
    }

    /// Group ids hosted by every node (metadata first).
    pub fn groups(&self) -> &[u64] {
        &self.groups
    }

    fn config(&self, replica: u8, group: u64) -> Config {
        let mut raw = RawConfig::new(
            self.cluster,
            ReplicaId(replica),
            self.swarm.replicas,
            GroupId(group),
        );
        let capacity = self.swarm.net.peer_queue_capacity as u32;
        raw.peer_queue_capacity = capacity;
        raw.repair_chunk_max = raw.repair_chunk_max.min(capacity.saturating_sub(1)).max(1);
        if let Some(cache) = self.swarm.frame_cache_committed {
            raw.frame_cache_committed = cache;
        }
        raw.checkpoint_interval_ops = self.swarm.checkpoint_interval_ops;
        // The metadata journal is the node's disk's (the partition WAL has no slot limit).
        if raw.journal_slot_count != 0 {
            raw.journal_slot_count = self.swarm.journal_slot_count;
        }
        raw.memory_ack = self.is_memory_ack(group);
        if let Some(max) = self.swarm.appending_bytes_max {
            raw.appending_bytes_max = max;
        }
        #[cfg(feature = "bug-knobs")]
        {
            raw.bug_knobs = self.options.bug_knobs;
        }
        raw.validate().expect("simulator configuration is valid")
    }

    /// Whether `group` runs with ack level "memory" (decision 73): drawn per seed.
    pub fn is_memory_ack(&self, group: u64) -> bool {
        self.groups
            .iter()
            .skip(1)
            .position(|&g| g == group)
            .is_some_and(|p| p < 8 && self.swarm.memory_ack_groups & (1 << p) != 0)
    }

    // ---- hosts: queries and connections (start, crash, restart: `sim/hosts.rs`) ----------

    /// Whether replica `r` is up.
    pub fn is_up(&self, r: u8) -> bool {
        self.hosts[usize::from(r)].up
    }

    /// The replica `r` runs for `group`, if it is up.
    pub fn replica(&self, r: u8, group: u64) -> Option<&Replica<SimMachine>> {
        self.hosts[usize::from(r)]
            .live
            .get(&group)
            .map(|l| &l.replica)
    }

    /// Tells every live replica about connection changes since the last call (the bus reports
    /// a peer connected when both are up and the link is not blocked in this direction).
    fn sync_connections(&mut self) {
        let n = self.swarm.replicas;
        for r in 0..n {
            if !self.hosts[usize::from(r)].up {
                continue;
            }
            for p in 0..n {
                if p == r {
                    continue;
                }
                let now = self.net.is_connected(Node::Replica(r), Node::Replica(p));
                let was = self.hosts[usize::from(r)].connected.contains(&p);
                if now == was {
                    continue;
                }
                if now {
                    self.hosts[usize::from(r)].connected.insert(p);
                } else {
                    self.hosts[usize::from(r)].connected.remove(&p);
                }
                for group in self.groups.clone() {
                    self.step(
                        r,
                        group,
                        Input::PeerConnection {
                            peer: ReplicaId(p),
                            connected: now,
                        },
                    );
                }
            }
        }
    }

    // ---- stepping and effects ----------------------------------------------------------------

    fn now(&self, r: u8) -> Now {
        Now {
            tick: self.tick,
            realtime_us: self.hosts[usize::from(r)].clock.realtime_us(self.tick),
        }
    }

    fn step(&mut self, r: u8, group: u64, input: Input<'_>) {
        let now = self.now(r);
        let mut outbox = std::mem::take(&mut self.outbox);
        let Some(live) = self.hosts[usize::from(r)].live.get_mut(&group) else {
            self.outbox = outbox;
            return;
        };
        let what = if self.options.trace {
            Some(format!("{input:?}"))
        } else {
            None
        };
        let skipped = live.replica.prepares_skipped_behind();
        let result = live.replica.step(now, input, &mut outbox);
        self.report.prepares_appending_behind += live.replica.prepares_skipped_behind() - skipped;
        if let Err(reason) = result {
            self.report.inputs_ignored += 1;
            if reason == consensus::Ignored::ClockAhead {
                self.report.prepares_clock_ahead += 1;
            }
            if let Some(what) = what {
                let what: String = what.chars().take(160).collect();
                eprintln!(
                    "[{} t{}] r{r} group {group:#x} ignored {reason:?}: {what}",
                    self.seed, self.tick
                );
            }
        }
        self.outbox = outbox;
        self.after_step(r, group);
    }

    /// The node's bound on its groups' incomplete appends together (decision 505), as a
    /// shard applies it once per tick: from what this node's own replicas report.
    fn apply_storage_pressure(&mut self, r: u8) {
        let Some(bound) = self.swarm.node_appending_bytes_max else {
            return;
        };
        let live = &mut self.hosts[usize::from(r)].live;
        let (_, pressed) =
            consensus::apply_storage_pressure(live.values_mut().map(|l| &mut l.replica), bound);
        if pressed {
            self.report.pressure_ticks += 1;
        }
    }

    fn after_step(&mut self, r: u8, group: u64) {
        let effects: Vec<Effect> = self.outbox.drain().collect();
        for effect in effects {
            if !self.hosts[usize::from(r)].up {
                break; // a Fatal crashed the node: the rest of the outbox never runs
            }
            self.execute(r, group, effect);
        }
        if self.hosts[usize::from(r)].up {
            self.observe(r, group);
        }
    }

    /// Whether the next journal or superblock write fails (fault phase only).
    fn write_fails(&mut self) -> bool {
        self.in_fault_phase() && self.prng_storage.chance_ppm(self.swarm.write_fail_ppm)
    }

    fn disk_latency(&mut self, r: u8) -> u64 {
        let (mean, max) = self.swarm.disk_latency;
        let base = self.prng_storage.delay(mean, max);
        if self.hosts[usize::from(r)].slow {
            base * 10 + 20
        } else {
            base
        }
    }

    fn execute(&mut self, r: u8, group: u64, effect: Effect) {
        let tick = self.tick;
        match effect {
            Effect::Send { to, frame } => {
                self.fold(frame.bytes());
                self.check_send(r, group, &frame);
                self.net.send(
                    Node::Replica(r),
                    Node::Replica(to.0),
                    frame.bytes().to_vec(),
                );
            }
            Effect::Append { op, frame } => {
                let latency = self.disk_latency(r);
                let failed = self.write_fails();
                let write = Write::Append {
                    op,
                    frame: frame.bytes().to_vec(),
                };
                self.hosts[usize::from(r)]
                    .disk
                    .issue_with(tick + 1, group, write, latency, failed);
            }
            Effect::Truncate { from_op } => {
                // Executed in emission order, before any later append: the journal truncates
                // synchronously (pending appends at or above it are voided), after the
                // superblock writes issued before it are durable (decision 51).
                if !self.hosts[usize::from(r)].disk.truncate_now(group, from_op) {
                    self.report.fatals += 1;
                    self.trace(format_args!(
                        "fatal r{r} group {group:#x}: superblock write before a truncation failed"
                    ));
                    self.crash(r, "fatal");
                    let (low, high) = self.swarm.down_ticks;
                    self.hosts[usize::from(r)].restart_at =
                        tick + self.prng_crashes.range_inclusive(low, high);
                }
            }
            Effect::PersistVsrState(state) => {
                let latency = self.disk_latency(r);
                let failed = self.write_fails();
                self.hosts[usize::from(r)].disk.issue_with(
                    tick + 1,
                    group,
                    Write::Superblock(state),
                    latency,
                    failed,
                );
            }
            Effect::Read { op, checksum } => {
                let complete_at = tick + 1 + self.disk_latency(r);
                self.hosts[usize::from(r)].reads.push(PendingRead {
                    complete_at,
                    group,
                    op,
                    checksum,
                });
            }
            Effect::Reply { client, frame } => {
                self.fold(frame.bytes());
                if let Some(&index) = self.client_index.get(&client.0) {
                    self.net.send(
                        Node::Replica(r),
                        Node::Client(index),
                        frame.bytes().to_vec(),
                    );
                }
            }
            Effect::Checkpoint { op } => {
                let live = &self.hosts[usize::from(r)].live[&group];
                let transferred = live.replica.transfers_installed() > live.transfers_counted;
                if transferred {
                    self.report.state_transfers +=
                        live.replica.transfers_installed() - live.transfers_counted;
                } else {
                    self.report.checkpoints += 1;
                }
                let transfers = live.replica.transfers_installed();
                self.hosts[usize::from(r)]
                    .live
                    .get_mut(&group)
                    .expect("live group")
                    .transfers_counted = transfers;
                let complete_at = tick + 1 + self.disk_latency(r);
                let live = &self.hosts[usize::from(r)].live[&group];
                // Only what the replica itself knows (decision 52); no global record.
                let snapshot = Snapshot {
                    op,
                    prepare: live.replica.snapshot_identity(op),
                    transferred,
                    client_table: live.replica.client_table_encoded(),
                    state: SimMachine {
                        inner: live.replica.state_machine().inner.clone(),
                        offset_end: live.replica.state_machine().offset_end,
                        ..SimMachine::default()
                    },
                };
                self.hosts[usize::from(r)]
                    .checkpoints
                    .push(PendingCheckpoint {
                        complete_at,
                        group,
                        snapshot,
                    });
            }
            Effect::Fatal(reason) => {
                self.report.fatals += 1;
                self.trace(format_args!("fatal r{r} group {group:#x}: {reason}"));
                self.crash(r, "fatal");
                let (low, high) = self.swarm.down_ticks;
                self.hosts[usize::from(r)].restart_at =
                    tick + self.prng_crashes.range_inclusive(low, high);
            }
        }
    }

    fn fold(&mut self, bytes: &[u8]) {
        let f = &mut self.report.fingerprint;
        *f = f.rotate_left(5) ^ wire::integrity::xxh3(bytes) ^ self.tick;
    }

    /// Checks on every frame a replica sends: durable-before-send for view-scoped frames and
    /// ack durability for PrepareOk; counts repair and transfer requests.
    fn check_send(&mut self, r: u8, group: u64, frame: &Frame) {
        let Some(command) = frame.command() else {
            return;
        };
        let Some(header) = frame.header_bytes() else {
            return;
        };
        let view = <wire::header::GenericHeader as wire::header::Layout>::view(header)
            .expect("a whole header")
            .frame
            .view
            .get();
        match command {
            // A lost replica's view probe (decision 61) asks for no prepare: not a repair.
            Command::RequestPrepares => {
                let probe =
                    <wire::header::RequestPreparesHeader as wire::Layout>::view(&header[..])
                        .is_some_and(|h| h.from_op.get() == u64::MAX);
                if !probe {
                    self.report.repairs += 1;
                }
            }
            Command::RequestStateTransfer => self.report.state_transfer_requests += 1,
            Command::StateChunk => {
                if let Some(h) = <wire::header::StateChunkHeader as wire::Layout>::view(&header[..])
                {
                    let body = (frame.bytes().len() - wire::HEADER_SIZE) as u64;
                    self.report.transfer_bytes += body;
                    self.report.transfer_artifact_max =
                        self.report.transfer_artifact_max.max(h.offset.get() + body);
                }
            }
            _ => {}
        }
        let requester_side = matches!(
            command,
            Command::RequestStartView
                | Command::RequestPrepares
                | Command::RequestStateTransfer
                | Command::RequestStateChunk
        );
        let disk = &self.hosts[usize::from(r)].disk;
        let durable = disk.durable_state(group);
        if !requester_side {
            // Without a superblock, recovery infers the view from the journal (consensus.md
            // §9.1), so that is what a restart would come back with.
            let durable_view = match durable.as_ref() {
                Some(sb) => sb.view,
                None => disk.journal_max_view(group),
            };
            self.checker.on_view_scoped_send(
                self.tick,
                r,
                group,
                &command.to_string(),
                view,
                durable_view,
            );
        }
        if command == Command::DoViewChange
            && let Ok(Message::DoViewChange { header, suffix }) =
                wire::decode_replica(frame, wire::MAX_MESSAGE_SIZE_DEFAULT)
        {
            let nack = header.nack_bitset.get();
            let nacked: Vec<u64> = suffix
                .entries()
                .enumerate()
                .filter(|(i, _)| nack & (1u128 << i) != 0)
                .map(|(_, e)| e.op())
                .collect();
            self.checker.on_dvc_nacks(
                self.tick,
                r,
                group,
                header.log_view.get(),
                header.op.get(),
                &nacked,
            );
            self.checker
                .on_do_view_change_sent(r, group, header.frame.view.get());
            // Without a superblock the recovered log_view is 0 (§9.1).
            let durable_log_view = durable.as_ref().map_or(0, |s| s.log_view);
            self.checker.on_log_view_send(
                self.tick,
                r,
                group,
                header.log_view.get(),
                durable_log_view,
            );
        }
        if command == Command::PrepareOk
            && let Ok(Message::PrepareOk(ok)) =
                wire::decode_replica(frame, wire::MAX_MESSAGE_SIZE_DEFAULT)
        {
            let op = ok.op.get();
            self.checker.on_ack(r, group, ok.frame.view.get(), op);
            self.checker
                .on_prepare_ok_view(self.tick, r, group, op, ok.frame.view.get());
            // An entry the fault schedule corrupted after it was written is excused: the
            // replica cannot know (a latent sector error), and recovery or reads catch it.
            let entry = self.hosts[usize::from(r)].disk.entry(group, op);
            let durable = match &entry {
                Entry::Intact(bytes) => Some(identity_of(bytes)),
                Entry::Absent | Entry::Damaged => None,
            };
            // Ack level "memory" acknowledges what the replica holds, not what its disk does
            // (decision 73): its durability is the lost-state rejoin, checked by agreement.
            if entry != Entry::Damaged && !self.is_memory_ack(group) {
                self.checker.on_prepare_ok(
                    self.tick,
                    r,
                    group,
                    op,
                    ok.prepare_checksum.get(),
                    durable,
                );
            }
        }
    }

    /// Feeds the checkers the replica's state after a step, and every op it newly committed.
    fn observe(&mut self, r: u8, group: u64) {
        let tick = self.tick;
        let Some(live) = self.hosts[usize::from(r)].live.get_mut(&group) else {
            return;
        };
        let replica = &live.replica;
        // A primary-elect's own DoViewChange counts in its merge without being sent.
        if let Some((log_view, head, nacked)) = replica.own_do_view_change() {
            self.checker
                .on_dvc_nacks(tick, r, group, log_view, head, &nacked);
        }
        let Some(live) = self.hosts[usize::from(r)].live.get_mut(&group) else {
            return;
        };
        let replica = &live.replica;
        self.report.transfer_bytes_peak = self
            .report
            .transfer_bytes_peak
            .max(replica.transfer_bytes_peak() as u64);
        let observed = Observed {
            view: replica.view(),
            log_view: replica.log_view(),
            commit_min: replica.commit_min(),
            commit_max: replica.commit_max(),
            normal_primary: replica.is_primary() && replica.status() == Status::Normal,
        };
        // Every op the state machine applied (with the header it was applied with), plus the
        // ops between the last seen and the current commit_min that bypass the state machine
        // (Register, Logout), from the journal's headers.
        let bodies: Vec<crate::machine::AppliedBody> =
            replica.state_machine().applied[live.applied_cursor..].to_vec();
        live.applied_cursor += bodies.len();
        let mut applied: Vec<(u64, wire::header::PrepareHeader)> =
            bodies.iter().map(|b| (b.op, b.header)).collect();
        let from = live.checked_commit + 1;
        for op in from..=replica.commit_min() {
            if bodies.iter().any(|b| b.op == op) {
                continue;
            }
            if let Some(h) = replica.header(op) {
                applied.push((op, *h));
            }
        }
        live.checked_commit = live.checked_commit.max(replica.commit_min());
        let offsets = (!GroupId(group).is_metadata())
            .then(|| (replica.next_offset(), replica.state_machine().offset_end))
            .filter(|(next, end)| next < end);
        let became_primary = observed.normal_primary && !live.was_normal_primary;
        live.was_normal_primary = observed.normal_primary;
        let lacks: Vec<(u64, Option<u128>)> = if became_primary {
            self.checker
                .replied_ops(group)
                // A primary of a view after the one the reply came from must hold the op; a
                // stale primary of an older view cannot commit anything and is not checked.
                .filter(|&(op, _, view)| op > replica.commit_min() && observed.view > view)
                .filter_map(|(op, identity, _)| {
                    // Holding another prepare there is always wrong. Lacking the op is wrong
                    // only above commit_max: at or below it the primary knows the op committed,
                    // can never re-propose it (its head is at least commit_max) and repairs it.
                    let held = replica.header(op).map(|h| h.frame.checksum.get());
                    let wrong = match held {
                        Some(h) => h != identity,
                        None => op > replica.commit_max(),
                    };
                    wrong.then_some((op, held))
                })
                .collect()
        } else {
            Vec::new()
        };
        for (op, h) in applied {
            self.checker.on_apply(tick, r, group, op, &h);
        }
        for b in bodies {
            self.checker
                .on_apply_body(tick, r, group, b.op, b.body_digest);
        }
        for (op, held) in lacks {
            self.checker
                .on_primary_lacks(tick, r, group, observed.view, op, held);
        }
        if let Some((next, end)) = offsets {
            self.checker.on_offset_rewind(tick, r, group, next, end);
        }
        self.checker.observe(tick, r, group, observed);
        if observed.normal_primary {
            let max = self.max_normal_view.entry(group).or_insert(0);
            if observed.view > *max {
                *max = observed.view;
                self.report.view_changes += 1;
                self.trace(format_args!(
                    "group {group:#x}: r{r} primary of view {}",
                    observed.view
                ));
            }
        }
    }

    // ---- the tick --------------------------------------------------------------------------

    /// Runs one tick.
    pub fn run_tick(&mut self) {
        self.tick += 1;
        if self.auto_faults {
            self.faults();
        }
        self.restart_due();
        self.sync_connections();

        self.net.transmit(self.tick);
        for packet in self.net.deliver(self.tick) {
            match (packet.from, packet.to) {
                (Node::Replica(from), Node::Replica(to)) => {
                    self.deliver_frame(from, to, &packet.frame)
                }
                (Node::Client(c), Node::Replica(to)) => self.deliver_request(c, to, &packet.frame),
                (Node::Replica(_), Node::Client(c)) => self.deliver_reply(c, &packet.frame),
                (Node::Client(_), Node::Client(_)) => {}
            }
        }

        let mut order: Vec<u8> = (0..self.swarm.replicas).collect();
        self.prng_schedule.shuffle(&mut order);
        for &r in &order {
            self.complete_storage(r);
        }
        for &r in &order {
            self.apply_storage_pressure(r);
            for group in self.groups.clone() {
                self.step(r, group, Input::Tick);
            }
        }
        if self.swarm.affinity {
            for &r in &order {
                self.primary_affinity(r);
            }
        }
        self.clients_act();
        self.track_memory_ack_budget();
    }

    /// Primary affinity (spec README decision 3, decision 171), as the node drives it: once
    /// this node's metadata replica has been the Normal primary of one view for at least
    /// `heartbeat_timeout`, each of its partition groups whose primary is elsewhere is asked to
    /// take over, at most once per `heartbeat_timeout` per group. Only what the node knows
    /// locally (its own replicas' status) decides.
    fn primary_affinity(&mut self, r: u8) {
        let tick = self.tick;
        let host = &mut self.hosts[usize::from(r)];
        if !host.up {
            return;
        }
        let Some(metadata) = host.live.get(&GroupId::METADATA.0) else {
            return;
        };
        let timeout = metadata.replica.config().heartbeat_timeout_ticks;
        if !metadata.replica.is_primary() {
            host.metadata_primary_since = None;
            return;
        }
        let view = metadata.replica.view();
        let since = match host.metadata_primary_since {
            Some((v, since)) if v == view => since,
            _ => {
                host.metadata_primary_since = Some((view, tick));
                tick
            }
        };
        if tick < since + timeout {
            return;
        }
        let due: Vec<u64> = host
            .live
            .iter()
            .filter(|(group, live)| {
                **group != GroupId::METADATA.0
                    && live.replica.status() == Status::Normal
                    && live.replica.primary_index(live.replica.view()) != ReplicaId(r)
                    && host
                        .takeover_at
                        .get(group)
                        .is_none_or(|at| tick >= at + timeout)
            })
            .map(|(group, _)| *group)
            .collect();
        for group in due {
            self.hosts[usize::from(r)].takeover_at.insert(group, tick);
            let now = self.now(r);
            let mut outbox = std::mem::take(&mut self.outbox);
            let live = self.hosts[usize::from(r)]
                .live
                .get_mut(&group)
                .expect("listed above");
            match live.replica.take_over(now, &mut outbox) {
                Ok(view) => {
                    self.report.takeovers += 1;
                    self.trace(format_args!(
                        "r{r} group {group:#x} takes over toward view {view}"
                    ));
                }
                Err(_) => self.report.inputs_ignored += 1,
            }
            self.outbox = outbox;
            self.after_step(r, group);
        }
    }

    /// Ack level "memory" (decision 73) keeps its promise while at most `n - Q_vc` replicas of
    /// a group are down or in lost state at once: the others can still elect and hand the lost
    /// ones the log. Beyond that a memory group must stall (a lost-state replica never votes)
    /// until an operator intervenes, so the liveness check holds it to nothing; safety checks
    /// still apply to it. A checker's view only: nothing flows back into a replica.
    fn track_memory_ack_budget(&mut self) {
        if self.swarm.memory_ack_groups == 0 {
            return;
        }
        let budget = usize::from(self.swarm.replicas)
            - consensus::quorum::view_change(usize::from(self.swarm.replicas));
        for &group in &self.groups[1..] {
            if !self.is_memory_ack(group) || self.memory_over_budget.contains(&group) {
                continue;
            }
            let out = self
                .hosts
                .iter()
                .filter(|h| h.live.get(&group).is_none_or(|l| l.replica.is_lost_state()))
                .count();
            if out > budget {
                self.memory_over_budget.insert(group);
                self.report.memory_ack_over_budget += 1;
                self.trace(format_args!(
                    "group {group:#x} (ack memory): {out} replicas down or lost, over budget"
                ));
            }
        }
    }

    fn deliver_frame(&mut self, from: u8, to: u8, frame: &[u8]) {
        let Ok(message) = wire::decode_replica(frame, wire::MAX_MESSAGE_SIZE_DEFAULT) else {
            self.report.inputs_ignored += 1;
            return;
        };
        let group = message.group().0;
        // A RangeEvicted whose floor is above what the receiver applied: before the repair
        // floor (decision 71) every one of them became a state transfer.
        let evicted_above = match &message {
            Message::RangeEvicted(h) if !GroupId(group).is_metadata() => self.hosts
                [usize::from(to)]
            .live
            .get(&group)
            .is_some_and(|l| {
                let r = &l.replica;
                r.status() == Status::Normal
                    && !r.is_transferring()
                    && h.op.get() > r.commit_min() + 1
            }),
            _ => false,
        };
        self.step(
            to,
            group,
            Input::Message {
                from: ReplicaId(from),
                message,
            },
        );
        if evicted_above
            && self.hosts[usize::from(to)]
                .live
                .get(&group)
                .is_some_and(|l| l.replica.is_transferring())
        {
            self.report.repair_floor_transfers += 1;
        }
    }

    fn deliver_request(&mut self, _client: u32, to: u8, wrapped: &[u8]) {
        let group = u64::from_le_bytes(wrapped[..8].try_into().expect("8 bytes"));
        let frame = &wrapped[8..];
        let Ok((header, body)) =
            wire::decode::decode_request(frame, wire::MAX_MESSAGE_SIZE_DEFAULT)
        else {
            return;
        };
        let request = ClientRequest {
            header: *header,
            body: body.to_vec(),
        };
        self.step(to, group, Input::Request(request));
    }

    fn complete_storage(&mut self, r: u8) {
        if !self.hosts[usize::from(r)].up {
            return;
        }
        let tick = self.tick;
        let done = self.hosts[usize::from(r)].disk.complete_due(tick);
        for p in done {
            let completion = match p.write {
                Write::Append { op, frame } if p.failed => Completion::AppendFailed {
                    op,
                    checksum: identity_of(&frame),
                },
                Write::Append { op, frame } => Completion::Appended {
                    op,
                    checksum: identity_of(&frame),
                },
                Write::Superblock(s) if p.failed => Completion::VsrStatePersistFailed {
                    view: s.view,
                    log_view: s.log_view,
                },
                Write::Superblock(s) => {
                    self.checker
                        .on_durable_view(tick, r, p.group, s.view, s.log_view);
                    Completion::VsrStatePersisted {
                        view: s.view,
                        log_view: s.log_view,
                    }
                }
            };
            self.step(r, p.group, Input::Done(completion));
            if !self.hosts[usize::from(r)].up {
                return;
            }
        }
        let host = &mut self.hosts[usize::from(r)];
        let (due, keep): (Vec<PendingCheckpoint>, Vec<PendingCheckpoint>) =
            std::mem::take(&mut host.checkpoints)
                .into_iter()
                .partition(|c| c.complete_at <= tick);
        host.checkpoints = keep;
        for mut c in due {
            if c.snapshot.prepare.0 == 0
                && let Some(live) = self.hosts[usize::from(r)].live.get(&c.group)
            {
                // Learned since it was asked for (the op above a transferred snapshot).
                c.snapshot.prepare = live.replica.snapshot_identity(c.snapshot.op);
            }
            Self::install_checkpoint(&mut self.hosts[usize::from(r)], &c);
            self.step(
                r,
                c.group,
                Input::Done(Completion::Checkpointed { op: c.snapshot.op }),
            );
        }
        let host = &mut self.hosts[usize::from(r)];
        let (due, keep): (Vec<PendingRead>, Vec<PendingRead>) = std::mem::take(&mut host.reads)
            .into_iter()
            .partition(|c| c.complete_at <= tick);
        host.reads = keep;
        for read in due {
            let entry = self.hosts[usize::from(r)].disk.entry(read.group, read.op);
            let frame = match entry {
                Entry::Intact(bytes) => Some(bytes),
                Entry::Absent | Entry::Damaged => None,
            }
            .filter(|bytes| {
                bytes.len() >= wire::HEADER_SIZE
                    && (read.checksum == 0 || identity_of(bytes) == read.checksum)
                    && wire::decode_replica(bytes, wire::MAX_MESSAGE_SIZE_DEFAULT).is_ok()
            })
            .map(Frame::new);
            if read.checksum == 0 && frame.is_some() {
                // Read below the checkpoint for repair (decision 71).
                self.report.repair_floor_served += 1;
            }
            self.step(
                r,
                read.group,
                Input::Done(Completion::Read { op: read.op, frame }),
            );
        }
    }

    // ---- faults ------------------------------------------------------------------------------

    fn in_fault_phase(&self) -> bool {
        self.healed_at.is_none()
    }

    fn faults(&mut self) {
        if !self.in_fault_phase() {
            return;
        }
        if self.tick >= self.swarm.fault_ticks {
            self.heal();
            return;
        }
        let n = self.swarm.replicas;
        if self.prng_crashes.chance_ppm(self.swarm.crash_ppm) {
            let r = self.prng_crashes.below(u64::from(n)) as u8;
            let down = self.hosts.iter().filter(|h| !h.up).count() as u8;
            if self.hosts[usize::from(r)].up && down < self.swarm.down_max {
                self.crash(r, "schedule");
                let (low, high) = self.swarm.down_ticks;
                self.hosts[usize::from(r)].restart_at =
                    self.tick + self.prng_crashes.range_inclusive(low, high);
            }
        }
        if self.swarm.corrupt_ppm > 0
            && !self.swarm.faulty_replicas.is_empty()
            && self.prng_crashes.chance_ppm(self.swarm.corrupt_ppm)
        {
            let r = *self.prng_crashes.pick(&self.swarm.faulty_replicas);
            let group = *self.prng_crashes.pick(&self.groups);
            if let Some(op) = self.hosts[usize::from(r)]
                .disk
                .corrupt_interior(&mut self.prng_crashes, group)
            {
                self.report.entries_corrupted += 1;
                self.trace(format_args!("corrupt r{r} group {group:#x} at {op}"));
            }
        }
        if self.swarm.lose_ppm > 0
            && !self.swarm.faulty_replicas.is_empty()
            && self.prng_crashes.chance_ppm(self.swarm.lose_ppm)
        {
            let r = *self.prng_crashes.pick(&self.swarm.faulty_replicas);
            let group = *self.prng_crashes.pick(&self.groups);
            if let Some(op) = self.hosts[usize::from(r)]
                .disk
                .lose_entry(&mut self.prng_crashes, group)
            {
                self.trace(format_args!("lose r{r} group {group:#x} op {op}"));
            }
        }
        if self.prng_partitions.chance_ppm(self.swarm.partition_ppm) {
            self.change_partitions();
        }
        if self.prng_clocks.chance_ppm(self.swarm.clock_step_ppm) {
            let r = self.prng_clocks.below(u64::from(n)) as usize;
            let mut delta = self.prng_clocks.range_inclusive(0, 10_000_000) as i64 - 5_000_000;
            // Now and then a runaway clock: far past the primary timestamp window (decision
            // 72), so backups refuse that replica's prepares while it leads.
            if self.prng_clocks.chance_ppm(250_000) {
                delta = self.prng_clocks.range_inclusive(20_000_000, 120_000_000) as i64;
                self.trace(format_args!("r{r} clock runs ahead by {delta} us"));
            }
            self.hosts[r].clock.step(delta);
        }
    }

    fn change_partitions(&mut self) {
        let n = self.swarm.replicas;
        if n < 2 {
            return;
        }
        let p = &mut self.prng_partitions;
        let choice = p.below(100);
        self.net.heal();
        let nodes: Vec<Node> = (0..n).map(Node::Replica).collect();
        if choice < 30 {
            self.trace(format_args!("heal partitions"));
        } else if choice < 65 {
            let mut ids = nodes.clone();
            p.shuffle(&mut ids);
            let cut = p.range_inclusive(1, u64::from(n) - 1) as usize;
            let (side, rest) = ids.split_at(cut);
            self.net.partition(side, rest);
            let (side, rest) = (side.to_vec(), rest.to_vec());
            self.trace(format_args!("partition {side:?} | {rest:?}"));
        } else if choice < 85 {
            let links = p.range_inclusive(1, u64::from(n));
            for _ in 0..links {
                let a = p.below(u64::from(n)) as u8;
                let b = p.below(u64::from(n)) as u8;
                if a != b {
                    self.net.block(Node::Replica(a), Node::Replica(b));
                }
            }
            self.trace(format_args!("one-way blocks"));
        } else {
            let a = p.below(u64::from(n)) as u8;
            let b = p.below(u64::from(n)) as u8;
            let extra = p.range_inclusive(10, 200);
            if a != b {
                self.net.clog(Node::Replica(a), Node::Replica(b), extra);
            }
            self.trace(format_args!("clog r{a}->r{b} +{extra}"));
        }
    }
}
