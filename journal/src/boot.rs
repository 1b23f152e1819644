//! Boot of a node's storage for the server: the duties the rest of the crate leaves to its
//! caller, done once and in order (docs/decisions.md items 91-93).
//!
//! [`boot_metadata`] (the metadata plane's directory):
//! - *format*: on a directory with no superblock and no journal data it records the journal's
//!   geometry (`format.{0,1}`) and writes the first superblock before any journal write, so
//!   that journal data never exists without a superblock and [`Superblock::open`] can refuse
//!   to format over data ([`SuperblockError::DataWithoutSuperblock`], naming the directory);
//! - *slot count*: the configured `journal_slot_count` (and slot size) must equal what the
//!   journal was formatted with, or boot refuses naming both ([`BootError::Geometry`]);
//! - *snapshot pairing*: the superblock's checkpoint pairs with the snapshot on disk
//!   ([`check_pairing`]), or boot refuses;
//! - *repair ranges* of the journal scan are handed up ([`MetadataBoot::repair`]).
//!
//! [`boot_shard`] (a shard's partition WAL):
//! - every lsn range the WAL reports lost (`damage`, `unverified`, a `truncated` or missing
//!   file) is mapped to *faulty op ranges per partition group*: ops that may have been
//!   acknowledged and are no longer held. The consensus core holds them as faulty (neither
//!   present nor nacked) and repairs them from peers. They are recorded durably in
//!   `wal-faults.{0,1}` before [`boot_shard`] returns, that is before the first append, so a
//!   second crash cannot forget them; they stay until the caller reports them repaired
//!   ([`FaultRecord::repaired`]). Replayed ops inside a faulty range are dropped from the
//!   replay (never present);
//! - a torn last window is *not* a fault: recovery cuts it only when it can show that its
//!   `fdatasync` never returned (no valid tail marker names it, or its first sector still
//!   holds the previous window's marker, and its lsns lie above the durable-end record; see
//!   the `wal` module). After a power cut of every node each one cuts its own torn window
//!   and none marks the shard as having lost state, so a view can form; only what may have
//!   been acknowledged becomes faulty, and only for the groups it may belong to;
//! - reclaim: [`ReclaimGuard`] never lets the WAL be reclaimed past a record whose batch a
//!   group's segments have not synced.

use std::collections::{BTreeMap, VecDeque};

use crate::artifact::{ArtifactError, Snapshot, SnapshotStore};
use crate::metadata::{JournalConfig, JournalError, MetadataJournal, Recovery};
use crate::partition::send_messages_end;
use crate::pingpong::{CopyRead, PingPong};
use crate::recover::{PairingError, check_pairing};
use crate::storage::{Storage, StorageError};
use crate::superblock::{Identity, Superblock, SuperblockError, VsrState};
use crate::wal::{GroupReplay, PartitionWal, WalConfig, WalError, WalRecovery};

/// The format record's name (`format.0`, `format.1`).
pub const FORMAT_FILE: &str = "format";
/// The shard's remembered faulty ranges (`wal-faults.0`, `wal-faults.1`).
pub const FAULTS_FILE: &str = "wal-faults";
const FORMAT_MAGIC: u32 = u32::from_le_bytes(*b"FRMT");
const FAULTS_MAGIC: u32 = u32::from_le_bytes(*b"WFLT");

/// Why boot must stop.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BootError {
    /// The superblock: unreadable, another identity, or absent beside journal data.
    #[error("superblock: {0}")]
    Superblock(#[from] SuperblockError),
    /// The metadata journal could not be scanned.
    #[error("journal: {0}")]
    Journal(#[from] JournalError),
    /// The snapshot store.
    #[error("snapshot: {0}")]
    Artifact(#[from] ArtifactError),
    /// The snapshot does not pair with the superblock's checkpoint.
    #[error("snapshot pairing: {0}")]
    Pairing(#[from] PairingError),
    /// The partition WAL could not be opened.
    #[error("partition wal: {0}")]
    Wal(#[from] WalError),
    /// The storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The configured journal geometry is not the one the journal was formatted with.
    #[error(
        "{dir}: journal_slot_count {configured_slots} (slot size {configured_size}) configured, \
         but the journal was formatted with {formatted_slots} (slot size {formatted_size})"
    )]
    Geometry {
        /// The data directory.
        dir: String,
        /// From the configuration.
        configured_slots: u64,
        /// Recorded at format.
        formatted_slots: u64,
        /// From the configuration.
        configured_size: u64,
        /// Recorded at format.
        formatted_size: u64,
    },
    /// A boot record (`format`, `wal-faults`) is unreadable, or missing where the directory
    /// was clearly formatted: what it held cannot be known, so boot stops.
    #[error("{dir}: boot record {name} {what}")]
    Record {
        /// The data directory.
        dir: String,
        /// The record.
        name: &'static str,
        /// What is wrong.
        what: &'static str,
    },
}

/// The metadata plane, booted.
#[derive(Debug)]
pub struct MetadataBoot<S: Storage> {
    /// The superblock, ready for the next write.
    pub superblock: Superblock<S>,
    /// Its newest state; `None` while only the format generation exists (the core never wrote
    /// one: a fresh replica, not a restarted one; see [`crate::recover::formatted_state`]).
    pub state: Option<VsrState>,
    /// Whether this boot formatted the directory.
    pub formatted: bool,
    /// The journal, ready for appends.
    pub journal: MetadataJournal<S>,
    /// What the journal scan found.
    pub recovery: Recovery,
    /// Inclusive op ranges to repair from peers (the scan's `repair`).
    pub repair: Vec<(u64, u64)>,
    /// The snapshot store and the snapshot paired with the superblock's checkpoint.
    pub snapshots: SnapshotStore<S>,
    /// The newest intact snapshot.
    pub snapshot: Option<Snapshot>,
}

fn geometry_bytes(config: &JournalConfig) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..8].copy_from_slice(&config.slot_count.to_le_bytes());
    b[8..16].copy_from_slice(&config.slot_size.to_le_bytes());
    b
}

fn record_error(storage: &impl Storage, name: &'static str, what: &'static str) -> BootError {
    BootError::Record {
        dir: storage.location(),
        name,
        what,
    }
}

/// Boots the metadata plane of `storage` (see the module docs): formats a new directory,
/// checks the configured journal geometry against the formatted one, opens the superblock
/// and the journal, and pairs the snapshot with the superblock's checkpoint.
pub async fn boot_metadata<S: Storage + Clone>(
    storage: S,
    identity: Identity,
    config: JournalConfig,
) -> Result<MetadataBoot<S>, BootError> {
    config.validate()?;
    let (mut format, recorded, reads) =
        PingPong::open(storage.clone(), FORMAT_FILE, FORMAT_MAGIC).await?;
    if recorded.is_none() && reads.contains(&CopyRead::Damaged) {
        return Err(record_error(&storage, FORMAT_FILE, "is unreadable"));
    }
    if let Some(bytes) = &recorded {
        let [slots, size] = match bytes.as_slice() {
            b if b.len() == 16 => {
                [0, 8].map(|at| u64::from_le_bytes(b[at..at + 8].try_into().expect("8")))
            }
            _ => return Err(record_error(&storage, FORMAT_FILE, "has an unknown shape")),
        };
        if slots != config.slot_count || size != config.slot_size {
            return Err(BootError::Geometry {
                dir: storage.location(),
                configured_slots: config.slot_count,
                formatted_slots: slots,
                configured_size: config.slot_size,
                formatted_size: size,
            });
        }
    }
    // Refuses a missing superblock beside journal data.
    let mut superblock = Superblock::open(storage.clone(), "", identity).await?;
    let formatted = superblock.state().is_none();
    let state = match superblock.state().copied() {
        Some(state) => {
            if recorded.is_none() {
                return Err(record_error(&storage, FORMAT_FILE, "is missing"));
            }
            state
        }
        None => {
            // Format: the geometry, then the first superblock, both durable before the first
            // journal write (a crash in between leaves no journal data: the next boot formats
            // again).
            if recorded.is_none() {
                format.write(&geometry_bytes(&config), true).await?;
            }
            let state = crate::recover::formatted_state(identity);
            superblock.write(&state).await?;
            state
        }
    };
    let only_formatted =
        superblock.sequence() == 1 && state == crate::recover::formatted_state(identity);
    let (journal, recovery) =
        MetadataJournal::open(storage.clone(), config, state.checkpoint_op, state.op_head).await?;
    let (snapshots, snapshot) = SnapshotStore::open(storage).await?;
    check_pairing(Some(&state), snapshot.as_ref())?;
    let state = (!only_formatted).then_some(state);
    Ok(MetadataBoot {
        superblock,
        state,
        formatted,
        journal,
        repair: recovery.repair.clone(),
        recovery,
        snapshots,
        snapshot,
    })
}

/// Ops of one group that may have been acknowledged and are not held: the core treats them as
/// faulty (neither present nor nacked) and repairs them from peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct FaultyOps {
    /// First op.
    pub first: u64,
    /// Last op, `None`: every op from `first` on (the loss's end is unknown).
    pub last: Option<u64>,
}

impl FaultyOps {
    /// Whether `op` lies in the range.
    pub fn contains(&self, op: u64) -> bool {
        op >= self.first && self.last.is_none_or(|l| op <= l)
    }
}

/// The shard's faulty ranges per group, kept durably until repaired, and the WAL's lost lsn
/// ranges already handed up (a sealed loss is reported at every open: it must not come back
/// as new faults once repaired).
#[derive(Debug)]
pub struct FaultRecord<S: Storage> {
    store: PingPong<S>,
    faulty: BTreeMap<u64, Vec<FaultyOps>>,
    seen: Vec<(u64, u64)>,
}

/// Payload of `wal-faults`: `count u64`, then `count` entries of `group u64 | first op u64 |
/// last op u64 (u64::MAX: open)`, then `seen u64`, then `seen` entries of `lsn_first u64 |
/// lsn_last u64`.
fn encode_faults(faulty: &BTreeMap<u64, Vec<FaultyOps>>, seen: &[(u64, u64)]) -> Vec<u8> {
    let mut out = Vec::new();
    let count: usize = faulty.values().map(Vec::len).sum();
    out.extend_from_slice(&(count as u64).to_le_bytes());
    for (group, ranges) in faulty {
        for r in ranges {
            out.extend_from_slice(&group.to_le_bytes());
            out.extend_from_slice(&r.first.to_le_bytes());
            out.extend_from_slice(&r.last.unwrap_or(u64::MAX).to_le_bytes());
        }
    }
    out.extend_from_slice(&(seen.len() as u64).to_le_bytes());
    for (a, b) in seen {
        out.extend_from_slice(&a.to_le_bytes());
        out.extend_from_slice(&b.to_le_bytes());
    }
    out
}

type Faults = (BTreeMap<u64, Vec<FaultyOps>>, Vec<(u64, u64)>);

fn decode_faults(bytes: &[u8]) -> Option<Faults> {
    let at = |i: usize| -> Option<u64> {
        Some(u64::from_le_bytes(bytes.get(i..i + 8)?.try_into().ok()?))
    };
    let count = usize::try_from(at(0)?).ok()?;
    let mut faulty: BTreeMap<u64, Vec<FaultyOps>> = BTreeMap::new();
    let mut p = 8;
    for _ in 0..count.min(bytes.len() / 24) {
        let (group, first, last) = (at(p)?, at(p + 8)?, at(p + 16)?);
        let last = (last != u64::MAX).then_some(last);
        if last.is_some_and(|l| l < first) {
            return None;
        }
        faulty
            .entry(group)
            .or_default()
            .push(FaultyOps { first, last });
        p += 24;
    }
    let seen_count = usize::try_from(at(p)?).ok()?;
    p += 8;
    let mut seen = Vec::new();
    for _ in 0..seen_count.min(bytes.len() / 16) {
        seen.push((at(p)?, at(p + 8)?));
        p += 16;
    }
    (p == bytes.len() && faulty.values().map(Vec::len).sum::<usize>() == count)
        .then_some((faulty, seen))
}

impl<S: Storage> FaultRecord<S> {
    /// The faulty ranges per group.
    pub fn faulty(&self) -> &BTreeMap<u64, Vec<FaultyOps>> {
        &self.faulty
    }

    /// Records `ops` of `group` faulty, durably: ops found lost after the shard's boot (a
    /// referenced body that its group's boot did not find intact, decision 414).
    pub async fn add(&mut self, group: u64, ops: FaultyOps) -> Result<(), StorageError> {
        let ranges = self.faulty.entry(group).or_default();
        if ranges.contains(&ops) {
            return Ok(());
        }
        ranges.push(ops);
        ranges.sort();
        self.store
            .write(&encode_faults(&self.faulty, &self.seen), true)
            .await
    }

    /// Forgets `group`'s faulty ops up to `through_op` (repaired from peers, journaled again
    /// and durable, or covered by a checkpoint), durably.
    pub async fn repaired(&mut self, group: u64, through_op: u64) -> Result<(), StorageError> {
        let Some(ranges) = self.faulty.get_mut(&group) else {
            return Ok(());
        };
        let before = ranges.clone();
        ranges.retain_mut(|r| {
            if r.last.is_some_and(|l| l <= through_op) {
                return false;
            }
            r.first = r.first.max(through_op + 1);
            true
        });
        if ranges.is_empty() {
            self.faulty.remove(&group);
        }
        if self.faulty.get(&group) != Some(&before) {
            self.store
                .write(&encode_faults(&self.faulty, &self.seen), true)
                .await?;
        }
        Ok(())
    }
}

/// A shard's partition WAL, booted.
#[derive(Debug)]
pub struct ShardBoot<S: Storage> {
    /// The WAL, ready for appends (every fault below is durable already).
    pub wal: PartitionWal<S>,
    /// What the WAL scan found.
    pub recovery: WalRecovery,
    /// The replayed prepares per group, without the faulty ops.
    pub replay: GroupReplay,
    /// Faulty op ranges per group, this boot's and those remembered from earlier boots.
    pub faults: FaultRecord<S>,
}

/// One replayed record's effect on its group's head.
#[derive(Debug, Clone, Copy)]
enum Event {
    Op(u64),
    Truncate(u64),
}

/// Maps the lost lsn range `[a, b]` to `group`'s faulty ops. `floor`: the group's highest op
/// durable outside the WAL (its segments, its checkpoint); `events`: its records by lsn.
fn faulty_ops(a: u64, b: u64, floor: u64, events: &[(u64, Event)]) -> Option<FaultyOps> {
    let mut head = floor;
    for (_, e) in events.iter().take_while(|(lsn, _)| *lsn < a) {
        head = match *e {
            Event::Op(op) => op.max(head),
            Event::Truncate(from) => head.min(from.saturating_sub(1)).max(floor),
        };
    }
    if b == u64::MAX {
        return Some(FaultyOps {
            first: head + 1,
            last: None,
        });
    }
    let lost = b - a + 1;
    let next = events.iter().find_map(|(lsn, e)| match e {
        Event::Op(op) if *lsn > b => Some(*op),
        _ => None,
    });
    match next {
        // The group's next op after the loss: its ops in the loss lie between.
        Some(op) if op > head + 1 => Some(FaultyOps {
            first: head + 1,
            last: Some(op - 1),
        }),
        Some(op) if op == head + 1 => None,
        // A lower op after the loss: a truncation was lost with it, so which replayed ops it
        // replaced is unknown: everything above the group's floor up to its head.
        Some(_) => Some(FaultyOps {
            first: floor + 1,
            last: Some(head),
        }),
        None => Some(FaultyOps {
            first: head + 1,
            last: Some(head + lost),
        }),
    }
}

/// Boots a shard's partition WAL (see the module docs). `groups`: the shard's partition groups,
/// each with its highest op durable outside the WAL (0 if none); groups found only in the WAL
/// are included with 0.
pub async fn boot_shard<S: Storage + Clone>(
    storage: S,
    config: WalConfig,
    groups: &BTreeMap<u64, u64>,
) -> Result<ShardBoot<S>, BootError> {
    let (store, remembered, reads) =
        PingPong::open(storage.clone(), FAULTS_FILE, FAULTS_MAGIC).await?;
    if remembered.is_none() && reads.contains(&CopyRead::Damaged) {
        return Err(record_error(&storage, FAULTS_FILE, "is unreadable"));
    }
    let (mut faulty, mut seen) = match remembered {
        Some(bytes) => decode_faults(&bytes)
            .ok_or_else(|| record_error(&storage, FAULTS_FILE, "has an unknown shape"))?,
        None => (BTreeMap::new(), Vec::new()),
    };
    let before = (faulty.clone(), seen.clone());
    let mut replay = GroupReplay::default();
    let mut events: BTreeMap<u64, Vec<(u64, Event)>> = BTreeMap::new();
    let (wal, recovery) = PartitionWal::open(storage, config, |r| {
        let event = match r.truncate_from {
            Some(from) => Some(Event::Truncate(from)),
            None => crate::prepare::verify_header(r.frame)
                .ok()
                .map(|h| Event::Op(h.op())),
        };
        if let Some(e) = event {
            events.entry(r.group).or_default().push((r.lsn, e));
        }
        replay.apply(r);
    })
    .await?;
    let lost: Vec<(u64, u64)> = recovery
        .damage
        .iter()
        .chain(&recovery.unverified)
        .map(|d| (d.lsn_first, d.lsn_last))
        .collect();
    let mut all: BTreeMap<u64, u64> = groups.clone();
    for g in events.keys() {
        all.entry(*g).or_insert(0);
    }
    for &(a, b) in &lost {
        if seen.contains(&(a, b)) {
            continue; // handed up at an earlier boot (a seal reports it at every open)
        }
        for (group, floor) in &all {
            let none = Vec::new();
            let e = events.get(group).unwrap_or(&none);
            if let Some(ops) = faulty_ops(a, b, *floor, e) {
                let ranges = faulty.entry(*group).or_default();
                if !ranges.contains(&ops) {
                    ranges.push(ops);
                    ranges.sort();
                }
            }
        }
    }
    // Only what this open reported can be reported again (a seal repeats until reclaimed).
    seen = lost;
    // Durable before the first append: a second crash must not forget them.
    let mut faults = FaultRecord {
        store,
        faulty,
        seen,
    };
    if (&faults.faulty, &faults.seen) != (&before.0, &before.1) {
        faults
            .store
            .write(&encode_faults(&faults.faulty, &faults.seen), true)
            .await?;
    }
    for (group, ranges) in &faults.faulty {
        replay.retain(*group, |op| !ranges.iter().any(|r| r.contains(op)));
    }
    Ok(ShardBoot {
        wal,
        recovery,
        replay,
        faults,
    })
}

/// Keeps WAL reclaim behind what every group's segments have synced (decision 44): a record
/// whose SendMessages batch ends above its group's synced segment offset must stay in the WAL.
#[derive(Debug, Default)]
pub struct ReclaimGuard {
    /// `(lsn, group, batch end offset)` of records not yet known synced, in lsn order.
    pending: VecDeque<(u64, u64, u64)>,
    /// The lsn below which every record is covered.
    covered: u64,
}

impl ReclaimGuard {
    /// Notes a committed record (every record, in lsn order; those without a batch are
    /// covered as soon as everything before them is).
    pub fn note(&mut self, lsn: u64, group: u64, frame: &[u8]) {
        let end = send_messages_end(frame).unwrap_or(0);
        self.pending.push_back((lsn, group, end));
    }

    /// The highest lsn the WAL may be reclaimed to ([`PartitionWal::reclaim`]'s argument):
    /// every record below it has its batch within its group's synced segment offset
    /// (`synced(group)`: the end offset its segments have durably synced).
    pub fn limit(&mut self, synced: impl Fn(u64) -> u64) -> u64 {
        while let Some(&(lsn, group, end)) = self.pending.front() {
            if end > synced(group) {
                return lsn;
            }
            self.covered = lsn + 1;
            self.pending.pop_front();
        }
        self.covered
    }
}

#[cfg(test)]
mod tests;
