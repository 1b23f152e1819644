//! The simulated disk of one replica: the journal crate's own layouts on its in-memory fault
//! backend ([`journal::MemStorage`]). The metadata group keeps its superblock and prepare journal
//! (fixed slots + header ring); the partition groups share the node's partition WAL (group
//! commit) and each keep a superblock. Recovery at boot is the journal's: superblock choice,
//! slot classification, WAL replay.
//!
//! What the simulator adds is time. A write is *issued* when the replica emits its effect and
//! executed on the journal, durably, when the simulator delivers its completion (the replica then
//! learns it through an input); partition appends completing in the same tick share one WAL
//! window and one sync. A crash lets an in-order prefix of each group's issued-but-unreported
//! appends land (the disk had written them, the completion never reached the replica), the last
//! one possibly torn ([`journal::CrashMode::TornLast`]), lands or drops each unreported
//! superblock write whole, and forgets the rest. Faults on durable data (bit flips in an interior
//! entry, lost entries) are written into the backend's files, where recovery has to find them.
//!
//! The state-machine snapshots stay with the simulator (the journal stores only their op and
//! checksum in the superblock, journal.md G4).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use consensus::VsrState;
use journal::superblock::core_state;
use journal::{
    CrashMode, GroupReplay, Identity, JournalConfig, JournalError, MemStorage, MetadataJournal,
    PartitionWal, SECTOR, SlotState, Superblock, WalConfig, WalError, block_on, recover_metadata,
};
use wire::GroupId;
use wire::header::Layout;

use crate::prng::Prng;

/// Identifies one issued write until its completion is delivered.
pub type WriteId = u64;

/// Metadata journal geometry: `slot_count` slots (drawn per seed, small enough that slots wrap
/// within a seed; the core's `journal_slot_count` is the same value), slots sized for the
/// simulator's small frames.
pub fn journal_config(slot_count: u64) -> JournalConfig {
    JournalConfig {
        slot_count,
        slot_size: 2 * SECTOR as u64,
    }
}

/// Partition WAL geometry: small files, so rotation happens within a seed.
/// Committed partition ops the simulated WAL keeps below a group's checkpoint: what a shard
/// WAL shared by many groups would still hold when one group checkpoints (decision 71).
pub const PARTITION_WAL_RETAINED_OPS: u64 = 64;

const WAL: WalConfig = WalConfig {
    file_size_max: 256 * 1024,
    window_bytes_max: 64 * 1024,
    window_us_max: 500,
};

/// A write issued by a replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Journal the frame at `op`.
    Append {
        /// Op number.
        op: u64,
        /// The whole prepare frame.
        frame: Vec<u8>,
    },
    /// Replace the group's durable VSR state (atomic: the old or the new generation survives).
    Superblock(VsrState),
}

/// An issued, not yet completed write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// Its id.
    pub id: WriteId,
    /// Group it belongs to.
    pub group: u64,
    /// What it writes.
    pub write: Write,
    /// Tick at which its completion is delivered.
    pub complete_at: u64,
    /// A later truncate removed it: it completes but writes nothing.
    pub void: bool,
    /// The device reports an error for it (or the journal refused it): nothing is written, the
    /// completion says failed.
    pub failed: bool,
    /// Already durable (a superblock write a truncation's barrier flushed): it completes at its
    /// tick without being written again, and a crash cannot undo it.
    pub written: bool,
}

/// Counters of the storage model the report reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// Writes torn by a crash.
    pub torn: u64,
    /// Appends the journal refused (reported to the replica as failed writes).
    pub refused: u64,
}

/// What the disk holds for one group at boot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupBoot {
    /// The durable VSR state, `None` if no superblock was ever written.
    pub state: Option<VsrState>,
    /// The checkpoint op the superblock names (the journal's floor).
    pub checkpoint_op: u64,
    /// Intact entries at or above the checkpoint op, by op (holes possible).
    pub entries: BTreeMap<u64, Vec<u8>>,
    /// Ops above the checkpoint the journal knows were written and whose stored entry is
    /// damaged (recovery's `Corrupt` slots).
    pub damaged: BTreeSet<u64>,
    /// Of `damaged`, the ops whose header the journal's header ring still holds (their
    /// prepare was durable once: possibly acknowledged), with that header.
    pub faulty: BTreeMap<u64, [u8; wire::HEADER_SIZE]>,
}

/// What the disk holds for one op right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// Nothing.
    Absent,
    /// The entry, verified.
    Intact(Vec<u8>),
    /// Written, and damaged since (the replica cannot know until it reads it).
    Damaged,
}

/// A partition group's durable state: its superblock, and the prepares its WAL records hold
/// (the replay of the WAL, kept current as appends and truncations become durable).
#[derive(Debug)]
struct PartitionDisk {
    superblock: Superblock<MemStorage>,
    frames: BTreeMap<u64, Vec<u8>>,
}

#[derive(Debug)]
struct Booted {
    superblock: Superblock<MemStorage>,
    journal: MetadataJournal<MemStorage>,
    wal: PartitionWal<MemStorage>,
    /// Where the newest WAL window starts: `(file, offset)`.
    last_window: Option<(String, u64)>,
    partitions: BTreeMap<u64, PartitionDisk>,
}

/// A replica's disk.
#[derive(Debug)]
pub struct Disk {
    storage: MemStorage,
    identity: Identity,
    /// The metadata journal's geometry (fixed for the life of the data directory).
    journal: JournalConfig,
    booted: Option<Booted>,
    pending: VecDeque<Pending>,
    /// Latest completion tick per group and kind (journal 0, superblock 1), to keep order.
    last_completion: BTreeMap<(u64, u8), u64>,
    next_id: WriteId,
    /// Counters.
    pub stats: DiskStats,
    /// The next crash is a power cut that lands every unreported append and tears the last
    /// one of each file (scenario stories; reset by the crash).
    pub tear_last_on_crash: bool,
    /// The directory was formatted by a rejoin (`--rejoin` on an empty directory, decisions 28
    /// and 230): the node's stamp records it, written durably before any group boots, and it
    /// stays until every group's lost-state superblock is durable. A group that boots without
    /// a superblock from such a directory is a rejoin whose mark never landed: lost state.
    rejoin_formatted: bool,
}

fn prefix(group: u64) -> String {
    format!("p{group:016x}-")
}

fn is_metadata(group: u64) -> bool {
    GroupId(group).is_metadata()
}

fn view_of(frame: &[u8]) -> u32 {
    frame
        .get(52..56)
        .map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
}

/// The ops the metadata journal holds above its checkpoint.
fn journaled_ops(journal: &MetadataJournal<MemStorage>) -> Vec<u64> {
    (journal.checkpoint_op() + 1..=journal.op_head())
        .filter(|&op| journal.has(op))
        .collect()
}

impl Disk {
    /// An empty data directory of the replica `identity` names, its metadata journal laid out
    /// as `journal`. Boot it before use. With `lying_sync` the device acknowledges flushes it
    /// never did (checker self-tests).
    pub fn new(identity: Identity, journal: JournalConfig, lying_sync: bool) -> Disk {
        let storage = MemStorage::new();
        storage.set_lying_sync(lying_sync);
        Disk {
            storage,
            identity,
            journal,
            booted: None,
            pending: VecDeque::new(),
            last_completion: BTreeMap::new(),
            next_id: 1,
            stats: DiskStats::default(),
            tear_last_on_crash: false,
            rejoin_formatted: false,
        }
    }

    /// Formats this (empty) directory for a rejoin: the stamp says so, durably, before any
    /// group boots (decision 230).
    pub fn format_for_rejoin(&mut self) {
        self.rejoin_formatted = true;
    }

    /// Whether the directory was formatted by a rejoin that has not yet marked every group.
    pub fn rejoin_formatted(&self) -> bool {
        self.rejoin_formatted
    }

    /// Every group's lost-state mark is durable (each booted with a superblock): the rejoin's
    /// format is complete and the stamp drops the flag.
    pub fn rejoin_marked(&mut self) {
        self.rejoin_formatted = false;
    }

    /// Recovers every group: the metadata superblock and journal, the partition WAL, each
    /// partition superblock. An error means the node must not start (an unreadable superblock,
    /// or interior damage in the WAL, whose lost records cannot be attributed to groups).
    pub fn boot(&mut self, groups: &[u64]) -> Result<BTreeMap<u64, GroupBoot>, String> {
        self.booted = None;
        let storage = self.storage.clone();
        let recovered = block_on(recover_metadata(
            storage.clone(),
            self.identity,
            self.journal,
        ))
        .map_err(|e| format!("metadata: {e}"))?;
        let mut boots = BTreeMap::new();
        let checkpoint_op = recovered.state.map_or(0, |s| s.checkpoint_op);
        let mut metadata = GroupBoot {
            // Only formatted (journal decision 91) reads as no state: the core never wrote one.
            state: recovered
                .state
                .and_then(|_| core_state(&recovered.superblock)),
            checkpoint_op,
            ..GroupBoot::default()
        };
        let ops = recovered.recovery.headers.iter().map(|h| h.op());
        for op in std::iter::once(checkpoint_op)
            .filter(|&op| op > 0)
            .chain(ops)
        {
            match block_on(recovered.journal.read(op)) {
                Ok(frame) => {
                    metadata.entries.insert(op, frame);
                }
                Err(JournalError::NotFound(_)) => {}
                Err(_) => {
                    metadata.damaged.insert(op);
                }
            }
        }
        for slot in &recovered.recovery.slots {
            if let SlotState::Corrupt { op, identity } = slot {
                metadata.damaged.insert(*op);
                if let Some(identity) = identity
                    && let Some(header) = recovered.journal.ring_header(*op)
                    && u128::from_le_bytes(header[..16].try_into().expect("16 bytes")) == *identity
                {
                    metadata.faulty.insert(*op, header);
                }
            }
        }
        let mut replay = GroupReplay::default();
        let (wal, wal_recovery) = block_on(PartitionWal::open(storage.clone(), WAL, |r| {
            replay.apply(r)
        }))
        .map_err(|e| format!("partition WAL: {e}"))?;
        if !wal_recovery.is_clean() {
            return Err(format!(
                "partition WAL: interior damage {:?}, truncated files {:?}",
                wal_recovery.damage, wal_recovery.truncated
            ));
        }
        let mut partitions = BTreeMap::new();
        for &group in groups.iter().filter(|&&g| !is_metadata(g)) {
            let superblock = block_on(Superblock::open(
                storage.clone(),
                &prefix(group),
                self.identity,
            ))
            .map_err(|e| format!("partition {group:#x} superblock: {e}"))?;
            let checkpoint_op = superblock.state().map_or(0, |s| s.checkpoint_op);
            let frames: BTreeMap<u64, Vec<u8>> = replay
                .groups
                .remove(&group)
                .unwrap_or_default()
                .split_off(&checkpoint_op);
            boots.insert(
                group,
                GroupBoot {
                    state: core_state(&superblock),
                    checkpoint_op,
                    entries: frames.clone(),
                    damaged: BTreeSet::new(),
                    faulty: BTreeMap::new(),
                },
            );
            partitions.insert(group, PartitionDisk { superblock, frames });
        }
        boots.insert(GroupId::METADATA.0, metadata);
        self.booted = Some(Booted {
            superblock: recovered.superblock,
            journal: recovered.journal,
            wal,
            last_window: None,
            partitions,
        });
        Ok(boots)
    }

    /// Issues a write that completes `latency` ticks after `now` (never before an earlier write
    /// of the same group and kind: the journal and the superblock are each written in order).
    /// It fails (an IO error) when `failed`.
    pub fn issue_with(
        &mut self,
        now: u64,
        group: u64,
        write: Write,
        latency: u64,
        failed: bool,
    ) -> WriteId {
        let kind = u8::from(matches!(write, Write::Superblock(_)));
        let last = self.last_completion.entry((group, kind)).or_insert(0);
        let complete_at = (now + latency).max(*last);
        *last = complete_at;
        let id = self.next_id;
        self.next_id += 1;
        self.pending.push_back(Pending {
            id,
            group,
            write,
            complete_at,
            void: false,
            failed,
            written: false,
        });
        id
    }

    fn booted(&mut self) -> &mut Booted {
        self.booted
            .as_mut()
            .expect("the simulator uses a disk only while its node is up")
    }

    /// Executes every write due at `now` on the journal, durably, and returns them in issue
    /// order (a refused append comes back `failed`). The caller turns each into the replica's
    /// completion input. Partition appends share one WAL window.
    pub fn complete_due(&mut self, now: u64) -> Vec<Pending> {
        let mut done = Vec::new();
        let mut keep = VecDeque::with_capacity(self.pending.len());
        for p in self.pending.drain(..) {
            if p.complete_at <= now {
                done.push(p);
            } else {
                keep.push_back(p);
            }
        }
        self.pending = keep;
        let mut window = Vec::new();
        for i in 0..done.len() {
            let p = &done[i];
            if p.void || p.failed || p.written {
                continue;
            }
            let ok = match &p.write {
                Write::Append { .. } if !is_metadata(p.group) => {
                    let mut submitted = self.submit_append(&done[i]);
                    if matches!(submitted, Err(WalError::WindowFull { .. })) {
                        // The window is as large as a file: commit it, start the next.
                        self.commit_appends(&mut done, &mut window);
                        submitted = self.submit_append(&done[i]);
                    }
                    if submitted.is_ok() {
                        window.push(i);
                    }
                    submitted.is_ok()
                }
                Write::Append { .. } | Write::Superblock(_) => self.execute(p),
            };
            if !ok {
                done[i].failed = true;
                self.stats.refused += 1;
            }
        }
        self.commit_appends(&mut done, &mut window);
        done
    }

    /// Adds a partition append to the open WAL window.
    fn submit_append(&mut self, p: &Pending) -> Result<u64, WalError> {
        let Write::Append { frame, .. } = &p.write else {
            unreachable!("only appends go to the WAL");
        };
        self.booted().wal.submit(p.group, frame, 0)
    }

    /// Commits the WAL window holding the partition appends `window` (indexes into `done`):
    /// they become durable together, or fail together.
    fn commit_appends(&mut self, done: &mut [Pending], window: &mut Vec<usize>) {
        if window.is_empty() {
            return;
        }
        let committed = self.commit_window();
        for i in window.drain(..) {
            let p = &mut done[i];
            if !committed {
                p.failed = true;
                self.stats.refused += 1;
            } else if let Write::Append { op, frame } = &p.write {
                let part = self.booted().partitions.get_mut(&p.group).expect("hosted");
                part.frames.insert(*op, frame.clone());
            }
        }
    }

    /// Commits the open WAL window; `false` if the WAL failed.
    fn commit_window(&mut self) -> bool {
        let booted = self.booted();
        let (before, offset) = booted.wal.layout();
        let ok = block_on(booted.wal.commit()).is_ok();
        if ok {
            let (after, _) = booted.wal.layout();
            let newest = after.last().cloned().expect("one file at least");
            let start = if before.last() == Some(&newest) {
                offset
            } else {
                0
            };
            booted.last_window = Some((newest, start));
        }
        ok
    }

    /// Executes one metadata append or any superblock write durably; `false` if refused.
    fn execute(&mut self, p: &Pending) -> bool {
        let identity = self.identity;
        let booted = self.booted();
        match &p.write {
            Write::Append { frame, .. } => match block_on(booted.journal.append(frame)) {
                // A checkpoint that landed after the append was issued (a transfer install)
                // covers the op: its effect is durable in the snapshot, nothing to write.
                Ok(()) | Err(JournalError::BelowCheckpoint { .. }) => true,
                Err(_) => false,
            },
            Write::Superblock(s) => {
                let superblock = if is_metadata(p.group) {
                    &mut booted.superblock
                } else {
                    match booted.partitions.get_mut(&p.group) {
                        Some(part) => &mut part.superblock,
                        None => return false,
                    }
                };
                let base = superblock.state().copied().unwrap_or_default();
                // The core names the prepare identity of its snapshot; it belongs to the
                // checkpoint this superblock records only at the same op (decision 52).
                let learned = s.snapshot_op == base.checkpoint_op
                    && s.snapshot_op > 0
                    && s.snapshot_checksum != 0
                    && base.checkpoint_prepare_checksum == 0;
                let state = journal::VsrState {
                    cluster: identity.cluster,
                    replica_id: identity.replica_id,
                    replica_count: identity.replica_count,
                    view: s.view,
                    log_view: s.log_view,
                    commit_max: s.commit_max,
                    lost_state: s.lost_state,
                    truncation_ceiling: s.held_ceiling.max(base.truncation_ceiling),
                    checkpoint_prepare_checksum: if learned {
                        s.snapshot_checksum
                    } else {
                        base.checkpoint_prepare_checksum
                    },
                    checkpoint_timestamp: if learned {
                        s.snapshot_timestamp
                    } else {
                        base.checkpoint_timestamp
                    },
                    ..base
                };
                let headers: Vec<journal::superblock::ViewHeader> =
                    s.view_headers.iter().map(|h| *h.bytes()).collect();
                block_on(superblock.write_with_view_headers(&state, &headers)).is_ok()
            }
        }
    }

    /// Truncates `group`'s journal from `from_op` at once, durably, and voids issued appends at
    /// or above it (they still complete, but write nothing): the journal executes a truncate in
    /// emission order, after the appends issued before it.
    ///
    /// The superblock writes of `group` issued before the truncation are made durable first
    /// (the core's barrier, decision 51: its truncation ceiling is on disk before any entry
    /// goes); they still complete at their own tick. Returns `false`, truncating nothing, when
    /// one of them fails: the node must fail-stop.
    pub fn truncate_now(&mut self, group: u64, from_op: u64) -> bool {
        let mut barrier = Vec::new();
        for (i, p) in self.pending.iter().enumerate() {
            if p.group == group && !p.written && matches!(p.write, Write::Superblock(_)) {
                barrier.push(i);
            }
        }
        for i in barrier {
            if self.pending[i].failed {
                return false;
            }
            let p = self.pending[i].clone();
            if !self.execute(&p) {
                return false;
            }
            self.pending[i].written = true;
        }
        let booted = self.booted();
        if is_metadata(group) {
            block_on(booted.journal.truncate_from(from_op)).expect("in-memory truncate");
        } else if let Some(part) = booted.partitions.get_mut(&group) {
            part.frames.split_off(&from_op);
            booted
                .wal
                .submit_truncate(group, from_op, 0)
                .expect("a truncation record fits");
            assert!(self.commit_window(), "in-memory WAL commit");
        }
        for p in self.pending.iter_mut() {
            if p.group == group && matches!(p.write, Write::Append { op, .. } if op >= from_op) {
                p.void = true;
            }
        }
        true
    }

    /// Raises the superblock's truncation ceiling of `group` to `op`, durably (boot, before
    /// recovery cuts entries that may have been acknowledged; decision 51). Nothing to do
    /// without a superblock: nothing was sent.
    pub fn raise_truncation_ceiling(&mut self, group: u64, op: u64) {
        let booted = self.booted();
        let superblock = if is_metadata(group) {
            &mut booted.superblock
        } else {
            match booted.partitions.get_mut(&group) {
                Some(part) => &mut part.superblock,
                None => return,
            }
        };
        let Some(base) = superblock.state().copied() else {
            return;
        };
        if base.truncation_ceiling >= op {
            return;
        }
        let state = journal::VsrState {
            truncation_ceiling: op,
            ..base
        };
        block_on(superblock.write(&state)).expect("in-memory superblock write");
    }

    /// Records a durable checkpoint at `op` (the snapshot is already durable): the superblock
    /// names it, then the journal's floor rises to it (journal.md G4: the entry at `op` stays).
    /// `snapshot_checksum` is the hash of the snapshot's bytes; `prepare` the identity and
    /// timestamp of the prepare at `op` as the replica knew them (0 when unknown).
    pub fn install_checkpoint(
        &mut self,
        group: u64,
        op: u64,
        snapshot_checksum: u128,
        prepare: (u128, u64),
    ) {
        let identity = self.identity;
        let booted = self.booted();
        let superblock = if is_metadata(group) {
            &mut booted.superblock
        } else {
            &mut booted
                .partitions
                .get_mut(&group)
                .expect("hosted")
                .superblock
        };
        let base = superblock.state().copied().unwrap_or(journal::VsrState {
            cluster: identity.cluster,
            replica_id: identity.replica_id,
            replica_count: identity.replica_count,
            ..journal::VsrState::default()
        });
        let state = journal::VsrState {
            checkpoint_op: op,
            checkpoint_checksum: snapshot_checksum,
            checkpoint_prepare_checksum: prepare.0,
            checkpoint_timestamp: prepare.1,
            ..base
        };
        block_on(superblock.write(&state)).expect("in-memory superblock write");
        if is_metadata(group) {
            booted
                .journal
                .set_checkpoint(op)
                .expect("checkpoints only move forward");
        } else if let Some(part) = booted.partitions.get_mut(&group) {
            // The WAL is reclaimed a window below the checkpoint, as a shard WAL shared by
            // many groups would be: repair serves a lagging backup from it (decision 71).
            part.frames = part
                .frames
                .split_off(&op.saturating_sub(PARTITION_WAL_RETAINED_OPS));
        }
    }

    /// Forgets every issued write whose completion was not delivered (they never reach the
    /// device); a following crash lands none of them. Writes a truncation's barrier already
    /// made durable stay on disk.
    pub fn forget_unreported(&mut self) {
        self.pending.clear();
    }

    /// A crash. Per group, an in-order prefix of the unreported appends may land (the disk had
    /// written them but the completion never reached the replica); when `may_tear`, the last
    /// landed append of a group may be torn (at most one per file: the metadata journal, the
    /// WAL). Unreported superblock writes land or not, whole. Everything else is forgotten,
    /// and the disk must boot again.
    pub fn crash(&mut self, prng: &mut Prng, may_tear: bool) {
        let pending: Vec<Pending> = self.pending.drain(..).collect();
        self.last_completion.clear();
        let forced = std::mem::take(&mut self.tear_last_on_crash);
        let may_tear = may_tear || forced;
        if self.booted.is_none() {
            return;
        }
        let groups: BTreeSet<u64> = pending.iter().map(|p| p.group).collect();
        // Per pending write: lands whole, lands torn, or is lost.
        let mut land = vec![false; pending.len()];
        let mut torn: Vec<usize> = Vec::new();
        for group in groups {
            let appends: Vec<usize> = (0..pending.len())
                .filter(|&i| pending[i].group == group)
                .filter(|&i| matches!(pending[i].write, Write::Append { .. }))
                .collect();
            let landed = if forced {
                appends.len()
            } else {
                prng.range_inclusive(0, appends.len() as u64) as usize
            };
            for (k, &i) in appends.iter().enumerate() {
                let p = &pending[i];
                if k >= landed || p.void || p.failed {
                    continue;
                }
                land[i] = true;
                let shares_file = |&j: &usize| {
                    matches!(pending[j].write, Write::Append { .. })
                        && is_metadata(pending[j].group) == is_metadata(group)
                };
                if k + 1 == landed
                    && may_tear
                    && (forced || prng.chance_ppm(500_000))
                    && !torn.iter().any(shares_file)
                {
                    torn.push(i);
                }
            }
            let superblocks: Vec<usize> = (0..pending.len())
                .filter(|&i| pending[i].group == group && !pending[i].written)
                .filter(|&i| matches!(pending[i].write, Write::Superblock(_)))
                .collect();
            for (k, &i) in superblocks.iter().enumerate() {
                // The group's newest superblock write, if it did not land, may have reached the
                // device torn: recovery must fall back to the previous generation.
                if prng.chance_ppm(500_000) && !pending[i].failed {
                    land[i] = true;
                } else if k + 1 == superblocks.len()
                    && may_tear
                    && !pending[i].failed
                    && prng.chance_ppm(500_000)
                {
                    torn.push(i);
                }
            }
        }
        // What landed, in issue order, durably; the torn writes last, left unsynced.
        for (i, p) in pending.iter().enumerate() {
            if !land[i] || torn.contains(&i) {
                continue;
            }
            match &p.write {
                Write::Append { op, frame } if !is_metadata(p.group) => {
                    let booted = self.booted();
                    if booted.wal.submit(p.group, frame, 0).is_ok() && self.commit_window() {
                        let part = self.booted().partitions.get_mut(&p.group);
                        part.expect("hosted").frames.insert(*op, frame.clone());
                    }
                }
                _ => {
                    self.execute(p);
                }
            }
        }
        for &i in &torn {
            let p = &pending[i];
            // The write reaches the device; its sync never returns.
            self.storage.fail_next(journal::FailOp::Sync);
            match &p.write {
                Write::Superblock(_) => {
                    self.execute(p);
                }
                Write::Append { frame, .. } => {
                    let booted = self.booted();
                    if is_metadata(p.group) {
                        let _ = block_on(booted.journal.append(frame));
                    } else if booted.wal.submit(p.group, frame, 0).is_ok() {
                        let _ = block_on(booted.wal.commit());
                    }
                }
            }
            self.stats.torn += 1;
        }
        let mode = if torn.is_empty() {
            CrashMode::LoseUnsynced
        } else {
            CrashMode::TornLast
        };
        self.storage
            .crash(mode, &mut journal::Prng::new(prng.next_u64()));
        if forced {
            // A story's power cut tears inside the record: a one-sector tear that hit only the
            // sector's padding would land the whole record, which recovery rightly keeps.
            for &i in &torn {
                if let Write::Append { op, .. } = pending[i].write
                    && is_metadata(pending[i].group)
                {
                    let at = (op % self.journal.slot_count) * self.journal.slot_size + 100;
                    let _ = self
                        .storage
                        .flip_bit(journal::metadata::PREPARES_FILE, at, 0);
                }
            }
        }
        self.booted = None;
    }

    /// Flips one bit of a durable entry of `group`. Metadata: any journaled prepare, the newest
    /// included (its ring header survives, so boot holds it as faulty, decision 62);
    /// partitions: a byte of a WAL window older than the newest (damage before a complete
    /// window: recovery must not mistake it for a torn tail).
    /// Returns the op hit (metadata) or the byte offset in the WAL file (partitions).
    pub fn corrupt_interior(&mut self, prng: &mut Prng, group: u64) -> Option<u64> {
        let storage = self.storage.clone();
        let booted = self.booted.as_mut()?;
        let hit = if is_metadata(group) {
            let journal = &booted.journal;
            let ops = journaled_ops(journal);
            if ops.is_empty() {
                return None;
            }
            let op = ops[prng.below(ops.len() as u64) as usize];
            let (file, at, len) = journal.record_location(op)?;
            let byte = at + prng.below(len);
            storage.flip_bit(file, byte, prng.below(8) as u8).ok()?;
            op
        } else {
            let (file, start) = booted.last_window.clone()?;
            if start == 0 {
                return None;
            }
            let byte = prng.below(start);
            storage.flip_bit(&file, byte, prng.below(8) as u8).ok()?;
            byte
        };
        Some(hit)
    }

    /// Flips a bit in the header of the newest durable metadata prepare (scenario stories; the
    /// ring keeps its copy, so the next boot finds it held but faulty). Returns the op hit.
    pub fn corrupt_newest(&mut self, group: u64) -> Option<u64> {
        if !is_metadata(group) {
            return None;
        }
        let storage = self.storage.clone();
        let journal = &self.booted.as_ref()?.journal;
        let op = *journaled_ops(journal).last()?;
        let (file, at, _) = journal.record_location(op)?;
        storage.flip_bit(file, at + 100, 0).ok()?;
        Some(op)
    }

    /// Zeroes the stored prepare of a random durable metadata op, as a lying fsync would. This
    /// breaks the durability contract the protocol relies on (an acked op disappears), so
    /// schedules use it only when asked to. Partition groups are not hit (their WAL records
    /// carry several groups each).
    pub fn lose_entry(&mut self, prng: &mut Prng, group: u64) -> Option<u64> {
        if !is_metadata(group) {
            return None;
        }
        let storage = self.storage.clone();
        let journal = &self.booted.as_ref()?.journal;
        let ops = journaled_ops(journal);
        if ops.is_empty() {
            return None;
        }
        let op = *prng.pick(&ops);
        let (file, at, len) = journal.record_location(op)?;
        let sectors = at / SECTOR as u64..(at + len).div_ceil(SECTOR as u64);
        for sector in sectors {
            storage.zero_sector(file, sector).ok()?;
        }
        Some(op)
    }

    /// The durable VSR state of `group` (what a restart would recover).
    pub fn durable_state(&self, group: u64) -> Option<VsrState> {
        let booted = self.booted.as_ref()?;
        if is_metadata(group) {
            core_state(&booted.superblock)
        } else {
            core_state(&booted.partitions.get(&group)?.superblock)
        }
    }

    /// The highest view among `group`'s durable entries (what recovery infers without a
    /// superblock, consensus.md §9.1).
    pub fn journal_max_view(&self, group: u64) -> u32 {
        let Some(booted) = self.booted.as_ref() else {
            return 0;
        };
        if is_metadata(group) {
            let journal = &booted.journal;
            journaled_ops(journal)
                .into_iter()
                .filter_map(|op| block_on(journal.read(op)).ok())
                .map(|frame| view_of(&frame))
                .max()
                .unwrap_or(0)
        } else {
            booted.partitions.get(&group).map_or(0, |p| {
                p.frames.values().map(|f| view_of(f)).max().unwrap_or(0)
            })
        }
    }

    /// What the disk holds for `group` at `op` right now.
    pub fn entry(&self, group: u64, op: u64) -> Entry {
        let Some(booted) = self.booted.as_ref() else {
            return Entry::Absent;
        };
        if is_metadata(group) {
            // The entry at the checkpoint op itself stays readable (G4).
            match block_on(booted.journal.read(op)) {
                Ok(frame) => Entry::Intact(frame),
                Err(JournalError::NotFound(_)) => Entry::Absent,
                Err(_) => Entry::Damaged,
            }
        } else {
            match booted
                .partitions
                .get(&group)
                .and_then(|p| p.frames.get(&op))
            {
                Some(frame) => Entry::Intact(frame.clone()),
                None => Entry::Absent,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prng::Stream;
    use wire::header::PrepareHeader;

    const IDENTITY: Identity = Identity {
        cluster: 7,
        replica_id: 1,
        replica_count: 3,
    };

    /// A sealed prepare of `op` in `group` chained to `parent`.
    fn prepare(group: u64, op: u64, parent: u128) -> Vec<u8> {
        use wire::Layout;
        use wire::header::{FrameHeader, PrepareHeader};
        let sender = wire::encode::Sender {
            cluster: 7,
            replica: 0,
            view: 1,
        };
        let mut header = PrepareHeader::zeroed();
        header.frame = FrameHeader::new(wire::Command::Prepare, sender);
        header.op.set(op);
        header.parent.set(parent);
        header.timestamp.set(1_000 + op);
        header.operation = wire::Operation::CreateStream.byte();
        header.group.set(group);
        let body = vec![op as u8; 100];
        wire::finish_header(&mut header, &body).expect("finish");
        let mut frame = header.bytes().to_vec();
        frame.extend_from_slice(&body);
        frame
    }

    fn partition() -> u64 {
        GroupId::partition(wire::PartitionKey {
            stream: 1,
            topic: 1,
            partition: 1,
        })
        .expect("small ids")
        .0
    }

    #[test]
    fn core_default_matches_the_journal_default() {
        // The metadata plane's journal and the core's room rule must agree on the slot count.
        assert_eq!(
            consensus::constants::JOURNAL_SLOT_COUNT_DEFAULT,
            JournalConfig::default().slot_count
        );
        let raw = consensus::RawConfig::new(1, consensus::ReplicaId(0), 3, GroupId::METADATA);
        assert_eq!(raw.journal_slot_count, JournalConfig::default().slot_count);
        assert!(raw.validate().is_ok());
    }

    #[test]
    fn durable_only_after_completion_and_recovered_at_boot() {
        let groups = [GroupId::METADATA.0, partition()];
        let mut d = Disk::new(IDENTITY, journal_config(1024), false);
        d.boot(&groups).unwrap();
        for &group in &groups {
            let first = prepare(group, 1, 0);
            let parent = u128::from_le_bytes(first[0..16].try_into().expect("16"));
            let second = prepare(group, 2, parent);
            d.issue_with(
                0,
                group,
                Write::Append {
                    op: 1,
                    frame: first,
                },
                3,
                false,
            );
            d.issue_with(
                0,
                group,
                Write::Append {
                    op: 2,
                    frame: second,
                },
                5,
                false,
            );
        }
        let state = VsrState {
            view: 2,
            log_view: 1,
            commit_max: 0,
            lost_state: false,
            ..VsrState::default()
        };
        d.issue_with(0, groups[0], Write::Superblock(state.clone()), 1, false);
        assert_eq!(d.complete_due(1).len(), 1);
        assert_eq!(d.durable_state(groups[0]), Some(state.clone()));
        assert_eq!(d.entry(groups[1], 1), Entry::Absent);
        assert_eq!(d.complete_due(3).len(), 2);
        assert!(matches!(d.entry(groups[0], 1), Entry::Intact(_)));
        assert!(matches!(d.entry(groups[1], 1), Entry::Intact(_)));
        let mut prng = Prng::new(3, Stream::Storage);
        d.crash(&mut prng, false);
        let boots = d.boot(&groups).unwrap();
        assert_eq!(boots[&groups[0]].state, Some(state));
        for group in groups {
            let ops: Vec<u64> = boots[&group].entries.keys().copied().collect();
            assert!(ops.starts_with(&[1]), "{ops:?}");
        }
    }

    #[test]
    fn a_crash_lands_a_prefix_and_a_torn_tail_is_not_damage() {
        let groups = [GroupId::METADATA.0, partition()];
        let mut tears = 0;
        for seed in 0..64 {
            let mut d = Disk::new(IDENTITY, journal_config(1024), false);
            d.boot(&groups).unwrap();
            for &group in &groups {
                let mut parent = 0;
                for op in 1..=4 {
                    let frame = prepare(group, op, parent);
                    parent = u128::from_le_bytes(frame[0..16].try_into().expect("16"));
                    d.issue_with(0, group, Write::Append { op, frame }, 1 + op, false);
                }
            }
            d.complete_due(2); // op 1 of each group is reported durable
            let mut prng = Prng::new(seed, Stream::Storage);
            d.crash(&mut prng, true);
            tears += d.stats.torn;
            let boots = d.boot(&groups).expect("a torn tail never refuses boot");
            for group in groups {
                let boot = &boots[&group];
                let ops: Vec<u64> = boot.entries.keys().copied().collect();
                assert_eq!(
                    ops,
                    (1..=ops.len() as u64).collect::<Vec<_>>(),
                    "seed {seed}"
                );
                assert!(
                    !ops.is_empty(),
                    "the reported append survives (seed {seed})"
                );
                assert!(boot.damaged.is_empty(), "seed {seed}: {:?}", boot.damaged);
            }
        }
        assert!(tears > 0, "some crash tore a write");
    }

    /// Decision 62: damage to the newest entry after it was durable (its ring header survives)
    /// is reported as held but faulty with the ring's header; a torn newest write (power cut
    /// before its sync returned, the ring never written) is not.
    #[test]
    fn a_damaged_newest_entry_is_faulty_with_its_ring_header_a_torn_one_is_not() {
        let group = GroupId::METADATA.0;
        let mut d = Disk::new(IDENTITY, journal_config(64), false);
        d.boot(&[group]).unwrap();
        let mut parent = 0;
        let mut frames = Vec::new();
        for op in 1..=3 {
            let frame = prepare(group, op, parent);
            parent = u128::from_le_bytes(frame[0..16].try_into().expect("16"));
            frames.push(frame.clone());
            d.issue_with(0, group, Write::Append { op, frame }, 1, false);
        }
        assert_eq!(d.complete_due(1).len(), 3);
        // Every draw of the injector now may hit op 3, the newest.
        let mut prng = Prng::new(5, Stream::Storage);
        let mut hit = None;
        for _ in 0..64 {
            let mut copy = Prng::new(prng.next_u64(), Stream::Storage);
            let op = d.corrupt_interior(&mut copy, group).expect("an op to hit");
            if op == 3 {
                hit = Some(op);
                break;
            }
            // Undo: rewrite the op hit (same bytes, same slot).
            d.issue_with(
                0,
                group,
                Write::Append {
                    op,
                    frame: frames[op as usize - 1].clone(),
                },
                1,
                false,
            );
            d.complete_due(1);
        }
        assert_eq!(hit, Some(3), "the injector reaches the newest op");
        d.crash(&mut prng, false);
        let boots = d.boot(&[group]).unwrap();
        let boot = &boots[&group];
        assert_eq!(boot.entries.keys().copied().collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(boot.damaged, BTreeSet::from([3]));
        assert_eq!(boot.faulty.get(&3).map(|h| &h[..]), Some(&frames[2][..256]));
        // A torn newest write: the ring never learns it, nothing is faulty.
        let frame = prepare(
            group,
            4,
            u128::from_le_bytes(frames[2][0..16].try_into().expect("16")),
        );
        d.issue_with(0, group, Write::Append { op: 4, frame }, 1, false);
        d.tear_last_on_crash = true;
        d.crash(&mut prng, false);
        let boots = d.boot(&[group]).unwrap();
        assert!(!boots[&group].faulty.contains_key(&4));
        assert!(!boots[&group].entries.contains_key(&4));
    }

    #[test]
    fn a_torn_superblock_write_falls_back_to_the_previous_state() {
        let groups = [GroupId::METADATA.0, partition()];
        let state = |view| VsrState {
            view,
            log_view: view,
            commit_max: 0,
            lost_state: false,
            ..VsrState::default()
        };
        let mut torn = 0;
        for seed in 0..64 {
            let mut d = Disk::new(IDENTITY, journal_config(1024), false);
            d.boot(&groups).unwrap();
            for &group in &groups {
                d.issue_with(0, group, Write::Superblock(state(1)), 1, false);
                d.issue_with(0, group, Write::Superblock(state(2)), 5, false);
            }
            d.complete_due(1);
            d.crash(&mut Prng::new(seed, Stream::Storage), true);
            torn += d.stats.torn;
            let boots = d.boot(&groups).expect("one torn copy never refuses boot");
            for group in groups {
                let view = boots[&group].state.as_ref().expect("written").view;
                assert!(view == 1 || view == 2, "seed {seed}: view {view}");
            }
        }
        assert!(torn > 0, "some crash tore a superblock write");
    }

    /// Decision 51: a truncation makes the group's issued superblock writes durable first, and
    /// a crash right after keeps them (view headers and ceiling included); a failed one stops
    /// the truncation.
    #[test]
    fn a_truncation_makes_the_superblock_write_before_it_durable() {
        let group = GroupId::METADATA.0;
        let first = prepare(group, 1, 0);
        let header = *PrepareHeader::view(&first[..256]).expect("a header");
        let state = VsrState {
            view: 3,
            log_view: 3,
            commit_max: 0,
            lost_state: false,
            view_headers: vec![header],
            held_ceiling: 7,
            ..VsrState::default()
        };
        for seed in 0..16 {
            let mut d = Disk::new(IDENTITY, journal_config(1024), false);
            d.boot(&[group]).unwrap();
            d.issue_with(
                0,
                group,
                Write::Append {
                    op: 1,
                    frame: first.clone(),
                },
                1,
                false,
            );
            d.complete_due(1);
            d.issue_with(1, group, Write::Superblock(state.clone()), 50, false);
            assert!(d.truncate_now(group, 1));
            assert_eq!(d.entry(group, 1), Entry::Absent);
            d.crash(&mut Prng::new(seed, Stream::Storage), true);
            let boots = d.boot(&[group]).unwrap();
            assert_eq!(boots[&group].state.as_ref(), Some(&state), "seed {seed}");
        }
        let mut d = Disk::new(IDENTITY, journal_config(1024), false);
        d.boot(&[group]).unwrap();
        d.issue_with(
            0,
            group,
            Write::Append {
                op: 1,
                frame: first.clone(),
            },
            1,
            false,
        );
        d.complete_due(1);
        d.issue_with(1, group, Write::Superblock(state.clone()), 50, true);
        assert!(
            !d.truncate_now(group, 1),
            "a failed barrier write stops the cut"
        );
        assert!(matches!(d.entry(group, 1), Entry::Intact(_)));
    }
}
