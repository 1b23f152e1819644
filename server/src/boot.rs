//! Boot from disk: the data directory's layout, its cluster stamp, and the one place that turns
//! the journal's recovery into the consensus core's [`consensus::Recovered`] (issue 10 item 3,
//! journal.md section 3.5, consensus.md section 9.1).
//!
//! # Layout (`--data-dir`, default `system.path`)
//!
//! ```text
//! DIR/strand.cluster             the stamp: cluster name and id, replica id, roster size
//! DIR/shard-0/metadata/          the metadata group (shard 0 only)
//!     superblock                 4 copies of the durable VSR state (journal::superblock)
//!     format.0, format.1         the journal geometry it was formatted with (journal::boot)
//!     journal.prepares           the fixed-slot prepare journal
//!     journal.headers            its header ring
//!     snapshot.0, snapshot.1     the checkpoint snapshot, ping-pong (journal::artifact)
//! DIR/shard-N/wal/               reserved: shard N's partition WAL (not written yet)
//! ```
//!
//! First boot (no stamp, no `shard-0`) formats: it creates the directories and writes the
//! stamp durably (temporary file, fsync, rename, fsync of the directory). Every later boot
//! checks the stamp against the config; a different cluster name, roster size or replica id,
//! a `shard-0` without a stamp, an unreadable superblock, journal data without a superblock,
//! or a `journal_slot_count` other than formatted refuses to start with a
//! [`BootError`] naming the file and the rule. Nothing is ever formatted over existing data.
//!
//! Only this module knows how the journal's boot (`journal::boot::boot_metadata`: format,
//! journal geometry, superblock, scan, snapshot pairing) maps onto `Recovered`, and how the
//! core's durable state maps onto the superblock ([`core_state`], [`persisted_state`]); both
//! follow the simulator's adapter (`tests/src/storage.rs`) field for field.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use consensus::{Artifact, Frame, Recovered};
use journal::artifact::{Snapshot, SnapshotStore};
use journal::boot::boot_metadata;
use journal::metadata::{JournalConfig, JournalError, MetadataJournal, SlotState};
use journal::storage::Storage;
use journal::superblock::{Identity, Superblock, ViewHeader, VsrState as DiskState};
use wire::header::{Layout as _, PrepareHeader};
use wire::manifest::ArtifactKind;

/// The stamp file's name in the data directory.
pub const STAMP_FILE: &str = "strand.cluster";

/// The data format generation this build writes and reads, recorded in the stamp as
/// `data_format`: raised whenever a build starts writing something an older build would not
/// read back safely. 0 (absent): before the field. 1: partition WAL record kind 3, a body
/// reference by batch checksum (decision 498). A build refuses a directory of a later
/// generation and records its own in one of an earlier one at boot (decision 499).
pub const DATA_FORMAT: u32 = 1;

/// Bytes per metadata journal slot: the largest metadata prepare a node journals (the journal's
/// own default). The metadata group's `max_message_size` is capped at it so the core never
/// prepares a frame the journal would refuse.
pub const METADATA_SLOT_SIZE: u64 = 1024 * 1024;

/// The metadata group's directory under the data directory.
pub fn metadata_dir(data: &Path) -> PathBuf {
    data.join("shard-0").join("metadata")
}

/// What the data directory must belong to (from the config).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    /// `cluster.name`.
    pub cluster_name: String,
    /// `wire::cluster_id(cluster_name)`.
    pub cluster_id: u128,
    /// `--replica-id`.
    pub replica_id: u8,
    /// Entries in `[[cluster.nodes]]`.
    pub replica_count: u8,
    /// What the partition layout under the directory depends on (decision 192).
    pub layout: ShardLayout,
    /// The directory was formatted by `--rejoin` (decision 240): while the stamp says so,
    /// every group that boots without a superblock state boots in lost state.
    pub rejoin: bool,
}

/// A stamp as read back, with what only the file records: the layout (`None` before decision
/// 192) and the data format generation (0 before decision 499). A stamp is always written
/// with this build's [`DATA_FORMAT`].
#[derive(Debug, PartialEq, Eq)]
struct Recorded {
    stamp: Stamp,
    layout: Option<ShardLayout>,
    data_format: u32,
}

/// What places a partition group's data under the data directory: its lane is
/// `lane(group, replica_lanes)` and its shard directory `shard-{lane mod shards}` (README
/// decision 2, `shard::mapping`). Both are recorded in the stamp; a change of either would
/// look for a group's WAL records, segments and superblock under another shard's directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardLayout {
    /// Shards the node runs (`--shards`, `--cores` or `system.sharding`).
    pub shards: u16,
    /// `cluster.replica_lanes`.
    pub replica_lanes: u16,
}

/// The stamp file's TOML form. `shards` and `replica_lanes` are absent from stamps written
/// before decision 192; such a stamp is completed (rewritten durably) at its next boot.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct StampFile {
    cluster_name: String,
    cluster_id: String,
    replica_id: u8,
    replica_count: u8,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    shards: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    replica_lanes: Option<u16>,
    /// Written `true` by `--rejoin` (decision 240); absent otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    rejoin: bool,
    /// Absent from stamps written before decision 499 (generation 0).
    #[serde(default)]
    data_format: u32,
}

impl Stamp {
    fn encode(&self) -> String {
        let file = StampFile {
            cluster_name: self.cluster_name.clone(),
            cluster_id: format!("{:#034x}", self.cluster_id),
            replica_id: self.replica_id,
            replica_count: self.replica_count,
            shards: Some(self.layout.shards),
            replica_lanes: Some(self.layout.replica_lanes),
            rejoin: self.rejoin,
            data_format: DATA_FORMAT,
        };
        format!(
            "# Written once when this directory was formatted; never edit it.\n{}",
            toml::to_string(&file).expect("a stamp serializes")
        )
    }

    /// The stamp and what its file records beside it.
    fn decode(text: &str) -> Option<Recorded> {
        let file: StampFile = toml::from_str(text).ok()?;
        let layout = match (file.shards, file.replica_lanes) {
            (Some(shards), Some(replica_lanes)) => Some(ShardLayout {
                shards,
                replica_lanes,
            }),
            (None, None) => None,
            _ => return None,
        };
        let stamp = Stamp {
            cluster_name: file.cluster_name,
            cluster_id: u128::from_str_radix(file.cluster_id.strip_prefix("0x")?, 16).ok()?,
            replica_id: file.replica_id,
            replica_count: file.replica_count,
            layout: layout.unwrap_or(ShardLayout {
                shards: 0,
                replica_lanes: 0,
            }),
            rejoin: file.rejoin,
        };
        Some(Recorded {
            stamp,
            layout,
            data_format: file.data_format,
        })
    }

    /// The superblock identity this stamp demands.
    pub fn identity(&self) -> Identity {
        Identity {
            cluster: self.cluster_id,
            replica_id: self.replica_id,
            replica_count: self.replica_count,
        }
    }
}

/// Why a node refuses to start from its data directory. Every message names the file and the
/// rule.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// Creating or writing the directory failed.
    #[error("{path}: {what}: {error}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The OS error.
        error: std::io::Error,
    },
    /// The directory was written by a build of a later data format generation.
    #[error(
        "{path}: the data directory was written by a newer build (data format {found}; this \
         build reads up to {supported}); refusing to start (rule: a data directory moves \
         forward only: this build would take the newer records for damage and cut the data \
         they vouch for; run the newer build)"
    )]
    NewerFormat {
        /// The stamp.
        path: PathBuf,
        /// The generation it records.
        found: u32,
        /// This build's ([`DATA_FORMAT`]).
        supported: u32,
    },
    /// The stamp does not parse.
    #[error("{path}: the cluster stamp does not parse; refusing to start (never reformatted)")]
    StampUnreadable {
        /// The stamp.
        path: PathBuf,
    },
    /// The stamp names another cluster, roster size or replica.
    #[error(
        "{path}: the data directory belongs to {found}, but the config says {expected}; \
         refusing to start (rule: a data directory serves one cluster name, one roster size \
         and one replica id for its whole life)"
    )]
    StampMismatch {
        /// The stamp.
        path: PathBuf,
        /// What the stamp says.
        found: String,
        /// What the config says.
        expected: String,
    },
    /// The node runs another shard count or lane count than the directory was formatted with.
    #[error(
        "{path}: the data directory was formatted for {recorded}, but this node now runs \
         {configured}; refusing to start (rule: a partition group's data lives under \
         shard-(lane mod shards) with lane = lane(group, replica_lanes), so a changed count would \
         look for it under another shard's directory, docs/decisions.md 192). Start it with \
         {recorded} again (`--shards`, `--cores` or system.sharding; cluster.replica_lanes), or \
         move the directory aside and rejoin with an empty one and `--rejoin`"
    )]
    LayoutChanged {
        /// The stamp.
        path: PathBuf,
        /// What the stamp records.
        recorded: String,
        /// What the node runs now.
        configured: String,
    },
    /// `--rejoin` on a directory that holds a node's state.
    #[error(
        "{path}: --rejoin formats an empty data directory as a replica that lost its state, but \
         this directory already holds one ({what}); refusing to start (rule: never formatted \
         over data, docs/decisions.md 191). Drop --rejoin to boot from it (a rejoin whose stamp \
         was written is recorded in the stamp, and its groups boot in lost state with or without \
         the flag, decision 240), or move it aside to rejoin empty"
    )]
    RejoinOverData {
        /// The data directory.
        path: PathBuf,
        /// What was found.
        what: String,
    },
    /// Metadata exists but the stamp is gone.
    #[error(
        "{path}: missing, but {data} holds metadata; refusing to start (rule: only a \
         directory without shard-0 is formatted)"
    )]
    StampMissing {
        /// Where the stamp should be.
        path: PathBuf,
        /// The metadata directory found.
        data: PathBuf,
    },
    /// The journal's boot refused: the superblock (unreadable, another identity, missing
    /// beside journal data), the journal geometry (`journal_slot_count` or slot size other
    /// than formatted), the format record, the journal scan, or a snapshot that does not pair
    /// with the superblock (`journal::boot::boot_metadata`).
    #[error(
        "{path}: {error}; refusing to start (rule: journal.md G5/G6 and section 3.5, \
         docs/decisions.md 91; never reformatted; if the data is lost, move the directory aside \
         and start with an empty one and --rejoin, decision 191)"
    )]
    Recover {
        /// The metadata directory.
        path: PathBuf,
        /// The journal's verdict.
        error: journal::boot::BootError,
    },
    /// The snapshot's payload does not decode, or the state machine refused it.
    #[error(
        "{path}: the checkpoint snapshot at op {op} does not restore: {why}; refusing to start"
    )]
    Snapshot {
        /// The snapshot's directory.
        path: PathBuf,
        /// Its op.
        op: u64,
        /// Why.
        why: String,
    },
    /// A damaged journal entry lies below an intact one: it may have been acknowledged.
    #[error(
        "{path}: prepare at op {op} is damaged below intact entries; refusing to start \
         (rule: journal.md G3, acknowledged data is never cut; move the directory aside and \
         start with an empty one and --rejoin to rejoin as lost state, docs/decisions.md 191)"
    )]
    InteriorDamage {
        /// The journal's directory.
        path: PathBuf,
        /// The lowest damaged op.
        op: u64,
    },
    /// Any other journal failure during boot.
    #[error("{path}: {error}; refusing to start")]
    Journal {
        /// The journal's directory.
        path: PathBuf,
        /// The error.
        error: JournalError,
    },
}

fn io<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(std::io::Error) -> BootError + 'a {
    move |error| BootError::Io {
        path: path.to_owned(),
        what,
        error,
    }
}

/// Refuses `--rejoin` unless `data` has never held a node (no stamp, no `shard-0`): rejoining
/// formats, and nothing formats over data (decision 191). A directory whose stamp records a
/// rejoin (decision 240: the stamp landed, a crash came before the groups' marks did) is
/// accepted: the rejoin goes on from the stamp, which is what a start without the flag does.
pub fn check_rejoin(data: &Path) -> Result<(), BootError> {
    if let Ok(text) = std::fs::read_to_string(data.join(STAMP_FILE))
        && Stamp::decode(&text).is_some_and(|r| r.stamp.rejoin)
    {
        return Ok(());
    }
    for what in [STAMP_FILE, "shard-0"] {
        if data.join(what).exists() {
            return Err(BootError::RejoinOverData {
                path: data.to_owned(),
                what: format!("{} exists", data.join(what).display()),
            });
        }
    }
    Ok(())
}

fn describe_layout(layout: &ShardLayout) -> String {
    format!(
        "{} shards and {} replica lanes",
        layout.shards, layout.replica_lanes
    )
}

/// Writes `stamp` as `data`'s stamp durably: a temporary file, fsync, rename, fsync of `data`.
fn write_stamp(data: &Path, stamp: &Stamp) -> Result<(), BootError> {
    let path = data.join(STAMP_FILE);
    let temp = data.join(format!("{STAMP_FILE}.tmp"));
    let mut file = std::fs::File::create(&temp).map_err(io(&temp, "creating"))?;
    file.write_all(stamp.encode().as_bytes())
        .map_err(io(&temp, "writing"))?;
    file.sync_all().map_err(io(&temp, "syncing"))?;
    std::fs::rename(&temp, &path).map_err(io(&path, "renaming into place"))?;
    std::fs::File::open(data)
        .and_then(|d| d.sync_all())
        .map_err(io(data, "syncing the directory"))
}

/// Checks the stamp of `data`, or formats `data` when it has never held a node. Returns
/// whether it formatted.
pub fn check_or_format(data: &Path, expected: &Stamp) -> Result<bool, BootError> {
    let path = data.join(STAMP_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let Recorded {
                stamp: found,
                layout,
                data_format,
            } = Stamp::decode(&text).ok_or(BootError::StampUnreadable { path: path.clone() })?;
            let describe = |s: &Stamp| {
                format!(
                    "cluster {:?} (id {:#x}), replica {} of {}",
                    s.cluster_name, s.cluster_id, s.replica_id, s.replica_count
                )
            };
            let identity = |s: &Stamp| {
                (
                    s.cluster_name.clone(),
                    s.cluster_id,
                    s.replica_id,
                    s.replica_count,
                )
            };
            if identity(&found) != identity(expected) {
                return Err(BootError::StampMismatch {
                    path,
                    found: describe(&found),
                    expected: describe(expected),
                });
            }
            if data_format > DATA_FORMAT {
                return Err(BootError::NewerFormat {
                    path,
                    found: data_format,
                    supported: DATA_FORMAT,
                });
            }
            match layout {
                Some(layout) if layout != expected.layout => Err(BootError::LayoutChanged {
                    path,
                    recorded: describe_layout(&layout),
                    configured: describe_layout(&expected.layout),
                }),
                layout => {
                    // A stamp from before the layout was recorded (no partition data was laid
                    // out by shard then), or of an earlier data format generation (nothing of
                    // this build's generation is written yet): both are recorded now.
                    if layout.is_none() || data_format < DATA_FORMAT {
                        write_stamp(
                            data,
                            &Stamp {
                                rejoin: found.rejoin,
                                ..expected.clone()
                            },
                        )?;
                    }
                    Ok(false)
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let metadata = metadata_dir(data);
            if data.join("shard-0").exists() {
                return Err(BootError::StampMissing {
                    path,
                    data: metadata,
                });
            }
            std::fs::create_dir_all(&metadata).map_err(io(&metadata, "creating"))?;
            write_stamp(data, expected)?;
            let shard0 = data.join("shard-0");
            std::fs::File::open(&shard0)
                .and_then(|d| d.sync_all())
                .map_err(io(&shard0, "syncing the directory"))?;
            Ok(true)
        }
        Err(e) => Err(io(&path, "reading")(e)),
    }
}

/// Whether `data`'s stamp records a rejoin (decision 240). Read after [`check_or_format`], so
/// the stamp exists and parses.
pub fn stamp_records_rejoin(data: &Path) -> Result<bool, BootError> {
    let path = data.join(STAMP_FILE);
    let text = std::fs::read_to_string(&path).map_err(io(&path, "reading"))?;
    Stamp::decode(&text)
        .map(|r| r.stamp.rejoin)
        .ok_or(BootError::StampUnreadable { path })
}

/// Rewrites `data`'s stamp without the rejoin, durably (decision 290: every group the life
/// before the wipe could have acknowledged in carries its own mark). A stamp without the
/// rejoin is left as it is.
pub fn clear_rejoin(data: &Path) -> Result<(), BootError> {
    let path = data.join(STAMP_FILE);
    let text = std::fs::read_to_string(&path).map_err(io(&path, "reading"))?;
    let stamp = Stamp::decode(&text)
        .ok_or(BootError::StampUnreadable { path })?
        .stamp;
    if !stamp.rejoin {
        return Ok(());
    }
    write_stamp(
        data,
        &Stamp {
            rejoin: false,
            ..stamp
        },
    )
}

/// Whether a group boots in lost state by the stamp (decision 240): the directory is a rejoin
/// and the group has no superblock state, so its own mark never landed (or it never had
/// one) and this life may have acknowledged what the disk does not hold.
pub fn boots_lost_by_stamp(rejoin: bool, superblock: Option<&consensus::VsrState>) -> bool {
    rejoin && superblock.is_none()
}

/// What a checkpoint snapshot holds besides the state machine (the core needs them back).
const SNAPSHOT_MAGIC: u32 = 0x534D_5331; // "SMS1"

/// Encodes the metadata group's checkpoint snapshot payload: the identity and timestamp of the
/// prepare at the checkpoint op, the client table, and the state machine's artifacts.
pub fn encode_snapshot(
    checksum: u128,
    timestamp: u64,
    client_table: &[u8],
    artifacts: &[Artifact],
) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&SNAPSHOT_MAGIC.to_le_bytes());
    out.extend_from_slice(&checksum.to_le_bytes());
    out.extend_from_slice(&timestamp.to_le_bytes());
    out.extend_from_slice(&(client_table.len() as u64).to_le_bytes());
    out.extend_from_slice(client_table);
    out.extend_from_slice(&(artifacts.len() as u64).to_le_bytes());
    for a in artifacts {
        out.push(a.kind.0);
        out.extend_from_slice(&a.frontier.to_le_bytes());
        out.extend_from_slice(&(a.bytes.len() as u64).to_le_bytes());
        out.extend_from_slice(&a.bytes);
    }
    out
}

/// A decoded snapshot payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotPayload {
    /// Identity of the prepare at the snapshot op.
    pub checksum: u128,
    /// Its timestamp.
    pub timestamp: u64,
    /// The serialized client table.
    pub client_table: Vec<u8>,
    /// The state machine's artifacts.
    pub artifacts: Vec<Artifact>,
}

/// Decodes [`encode_snapshot`]'s bytes; `None` when they do not decode whole.
pub fn decode_snapshot(bytes: &[u8]) -> Option<SnapshotPayload> {
    struct Cursor<'a>(&'a [u8]);
    impl<'a> Cursor<'a> {
        fn take(&mut self, n: usize) -> Option<&'a [u8]> {
            if self.0.len() < n {
                return None;
            }
            let (head, tail) = self.0.split_at(n);
            self.0 = tail;
            Some(head)
        }
        fn u64(&mut self) -> Option<u64> {
            Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
        }
        fn len(&mut self) -> Option<usize> {
            usize::try_from(self.u64()?).ok()
        }
    }
    let mut c = Cursor(bytes);
    if u32::from_le_bytes(c.take(4)?.try_into().ok()?) != SNAPSHOT_MAGIC {
        return None;
    }
    let checksum = u128::from_le_bytes(c.take(16)?.try_into().ok()?);
    let timestamp = c.u64()?;
    let n = c.len()?;
    let client_table = c.take(n)?.to_vec();
    let count = c.len()?;
    let mut artifacts = Vec::new();
    for _ in 0..count {
        let kind = ArtifactKind(c.take(1)?[0]);
        let frontier = c.u64()?;
        let n = c.len()?;
        artifacts.push(Artifact {
            kind,
            frontier,
            bytes: c.take(n)?.to_vec(),
        });
    }
    if !c.0.is_empty() {
        return None;
    }
    Some(SnapshotPayload {
        checksum,
        timestamp,
        client_table,
        artifacts,
    })
}

/// The metadata group's durable objects, recovered and ready for the effect executor.
pub struct MetadataDisk<S: Storage> {
    /// The superblock, ready for the next write.
    pub superblock: Superblock<S>,
    /// The journal, ready for appends.
    pub journal: MetadataJournal<S>,
    /// The snapshot store.
    pub snapshots: SnapshotStore<S>,
    /// The identity every superblock write carries.
    pub identity: Identity,
}

/// What boot hands to the metadata replica.
pub struct MetadataBoot<S: Storage, M> {
    /// The durable objects.
    pub disk: MetadataDisk<S>,
    /// What the core is built from.
    pub recovered: Recovered,
    /// The state machine restored from the snapshot (or fresh).
    pub state_machine: M,
    /// Ops cut at boot: a damaged top the header ring does not vouch for (a torn write, never
    /// acknowledged). Damaged entries it vouches for are in `recovered.faulty` instead.
    pub cut_from: Option<u64>,
}

/// A fresh non-zero random value (the boot's incarnation, consensus.md section 9.3).
pub fn incarnation() -> u128 {
    let mut bytes = [0u8; 16];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .is_err()
    {
        // No urandom: the clock and pid still differ per boot, which is all §9.3 needs.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        bytes = (now ^ (u128::from(std::process::id()) << 64)).to_le_bytes();
    }
    u128::from_le_bytes(bytes).max(1)
}

/// The core's durable state as this node's superblock holds it (decisions 50-52; the mapping
/// is the journal's, shared with the simulator's disks).
pub use journal::superblock::core_state;

/// Recovers the metadata group from `storage` (the metadata directory `path`) through
/// `journal::boot::boot_metadata` (format of a fresh directory, journal geometry check,
/// superblock, journal scan, snapshot paired with the superblock), then restores the state
/// machine from the snapshot and hands every intact journaled prepare above it, in op order,
/// to the core. A damaged entry below an intact one refuses boot (G3); a damaged tail the header
/// ring vouches for is handed over as held but faulty (`Recovered::faulty`, decision 62) and
/// repaired from peers; a torn top the ring never knew is cut, after the truncation ceiling
/// covering it is durable (decision 51).
pub async fn recover<S: Storage + Clone, M: crate::metadata_group::Checkpointable>(
    storage: S,
    path: &Path,
    identity: Identity,
    journal_config: JournalConfig,
    mut state_machine: M,
) -> Result<MetadataBoot<S, M>, BootError> {
    let booted = boot_metadata(storage, identity, journal_config)
        .await
        .map_err(|error| BootError::Recover {
            path: path.to_owned(),
            error,
        })?;
    let mut superblock = booted.superblock;
    let mut core = Recovered::fresh(incarnation());
    // Only formatted (journal decision 91: sequence 1 holding the identity) reads as no state:
    // the core never wrote one. Everything else comes from this node's own superblock.
    core.superblock = booted.state.and_then(|_| core_state(&superblock));
    if let Some(Snapshot { op, payload }) = &booted.snapshot {
        let bad = |why: String| BootError::Snapshot {
            path: path.to_owned(),
            op: *op,
            why,
        };
        let decoded = decode_snapshot(payload).ok_or_else(|| bad("payload".into()))?;
        state_machine
            .restore(*op, &decoded.artifacts)
            .map_err(|e| bad(e.to_string()))?;
        core.snapshot_op = *op;
        core.client_table = decoded.client_table;
        // The prepare identity comes from the superblock that records this checkpoint, nowhere
        // else (decision 52); a snapshot the superblock does not name yet (a crash between the
        // two writes) is restored without one.
        if let Some(sb) = core.superblock.as_ref().filter(|sb| sb.snapshot_op == *op) {
            core.snapshot_checksum = sb.snapshot_checksum;
            core.snapshot_timestamp = sb.snapshot_timestamp;
        }
    }
    let mut journal = booted.journal;
    let checkpoint_op = booted.recovery.checkpoint_op;
    let mut damaged: BTreeSet<u64> = booted
        .recovery
        .slots
        .iter()
        .filter_map(|s| match s {
            SlotState::Corrupt { op, .. } => Some(*op),
            _ => None,
        })
        .collect();
    // Ops in `recovery.repair` whose prepare never landed are holes, not damage: the core
    // keeps the entries above a hole and repairs it from peers.
    let ops: BTreeSet<u64> = std::iter::once(checkpoint_op)
        .chain(std::iter::once(core.snapshot_op))
        .filter(|&op| op > 0)
        .chain(booted.recovery.headers.iter().map(|h| h.op()))
        .collect();
    let mut intact = BTreeSet::new();
    for op in ops.range(core.snapshot_op..) {
        match journal.read(*op).await {
            Ok(bytes) => {
                let valid = matches!(
                    wire::decode_replica(&bytes, wire::MAX_MESSAGE_SIZE_DEFAULT),
                    Ok(wire::Message::Prepare { header, .. })
                        if header.op.get() == *op
                            && header.group.get() == wire::GroupId::METADATA.0
                );
                if valid {
                    core.frames.push(Frame::new(bytes));
                    intact.insert(*op);
                } else if *op > core.snapshot_op {
                    damaged.insert(*op);
                }
            }
            Err(JournalError::NotFound(_)) => {}
            Err(_) if *op > core.snapshot_op => {
                damaged.insert(*op);
            }
            Err(_) => {}
        }
    }
    let mut cut_from = None;
    let first = core.snapshot_op + 1;
    if let Some(&lowest) = damaged.range(first..).next() {
        if intact.range(lowest + 1..).next().is_some() {
            return Err(BootError::InteriorDamage {
                path: path.to_owned(),
                op: lowest,
            });
        }
        // The damaged tail (decision 62): an entry whose header the ring still holds was
        // durable once (the ring is written after the prepare's fdatasync, and the append
        // completes, so PrepareOk may leave, only after the ring's), so it may have been
        // acknowledged: it goes to the core as held but faulty and is repaired from peers. A
        // damaged entry the ring does not vouch for is a hole below the last vouched one and a
        // torn write above it: only that torn top is cut.
        let vouched = vouched_headers(&journal, &booted.recovery.slots, first);
        let top_faulty = vouched.keys().next_back().copied();
        core.faulty.extend(vouched.values().copied());
        if let Some(from) = damaged
            .range(top_faulty.map_or(first, |t| t + 1)..)
            .next()
            .copied()
        {
            // The cut entries are never nacked (decision 51), so the ceiling covering them is
            // durable before they go.
            let ceiling = damaged.iter().next_back().copied().unwrap_or(from);
            if let Some(base) = superblock.state().copied()
                && base.truncation_ceiling < ceiling
            {
                let state = DiskState {
                    truncation_ceiling: ceiling,
                    ..base
                };
                superblock
                    .write(&state)
                    .await
                    .map_err(|error| BootError::Recover {
                        path: path.to_owned(),
                        error: error.into(),
                    })?;
            }
            if let Some(sb) = core.superblock.as_mut() {
                sb.held_ceiling = sb.held_ceiling.max(ceiling);
            }
            journal
                .truncate_from(from)
                .await
                .map_err(|error| BootError::Journal {
                    path: path.to_owned(),
                    error,
                })?;
            cut_from = Some(from);
        }
    }
    Ok(MetadataBoot {
        disk: MetadataDisk {
            superblock,
            journal,
            snapshots: booted.snapshots,
            identity,
        },
        recovered: core,
        state_machine,
        cut_from,
    })
}

/// Rejoin as lost state (decisions 28, 191): the group was just formatted (`--rejoin` on an
/// empty directory), so the superblock is written with `lost_state` before the core exists
/// and hands it the state it then reads: it joins Recovering, never votes or takes the
/// election fallback, and learns the view from a quorum of peers (decision 61) until it
/// durably holds the log of the view it adopted. A crash before that boots in lost state again
/// from the superblock, `--rejoin` or not. Refuses anything but a formatted group.
pub async fn mark_lost_state<S: Storage, M>(
    boot: &mut MetadataBoot<S, M>,
    path: &Path,
) -> Result<(), BootError> {
    let r = &boot.recovered;
    if r.superblock.is_some() || !r.frames.is_empty() || r.snapshot_op > 0 {
        return Err(BootError::RejoinOverData {
            path: path.to_owned(),
            what: "the metadata group has a prior life".into(),
        });
    }
    let base = boot
        .disk
        .superblock
        .state()
        .copied()
        .unwrap_or_else(|| journal::recover::formatted_state(boot.disk.identity));
    let state = DiskState {
        lost_state: true,
        ..base
    };
    boot.disk
        .superblock
        .write(&state)
        .await
        .map_err(|error| BootError::Recover {
            path: path.to_owned(),
            error: error.into(),
        })?;
    boot.recovered.superblock = core_state(&boot.disk.superblock);
    boot.recovered.lost_state = true;
    Ok(())
}

/// The headers of damaged entries at or above `first` that the header ring vouches for: a
/// `Corrupt` slot whose ring entry verifies, names its op and carries the identity the scan
/// reported (decision 62). In op order.
fn vouched_headers<S: Storage>(
    journal: &MetadataJournal<S>,
    slots: &[SlotState],
    first: u64,
) -> BTreeMap<u64, PrepareHeader> {
    let mut out = BTreeMap::new();
    for slot in slots {
        if let SlotState::Corrupt {
            op,
            identity: Some(identity),
        } = slot
            && *op >= first
            && let Some(bytes) = journal.ring_header(*op)
            && let Some(header) = PrepareHeader::view(&bytes[..])
            && header.frame.checksum.get() == *identity
            && header.op.get() == *op
        {
            out.insert(*op, *header);
        }
    }
    out
}

/// The superblock state and view headers to write for the core's `PersistVsrState` (decisions
/// 50-52), over what the superblock already holds: the core's `view`, `log_view`,
/// `commit_max`, `lost_state` and view headers as carried; the truncation ceiling never
/// lowered; the checkpoint's prepare identity recorded when the core names it for the
/// checkpoint this superblock records and the superblock has none yet (a transferred snapshot
/// learns it from the op above); the checkpoint itself and the op head kept. The simulator's
/// adapter (`tests/src/storage.rs`, its `Write::Superblock` path) writes the same.
pub fn persisted_state(
    current: Option<&DiskState>,
    identity: Identity,
    state: &consensus::VsrState,
    op_head: u64,
) -> (DiskState, Vec<ViewHeader>) {
    let base = current
        .copied()
        .unwrap_or_else(|| journal::recover::formatted_state(identity));
    let learned = state.snapshot_op == base.checkpoint_op
        && state.snapshot_op > 0
        && state.snapshot_checksum != 0
        && base.checkpoint_prepare_checksum == 0;
    let written = DiskState {
        view: state.view,
        log_view: state.log_view,
        commit_max: state.commit_max.max(base.commit_max),
        lost_state: state.lost_state,
        op_head: op_head.max(base.op_head),
        truncation_ceiling: state.held_ceiling.max(base.truncation_ceiling),
        checkpoint_prepare_checksum: if learned {
            state.snapshot_checksum
        } else {
            base.checkpoint_prepare_checksum
        },
        checkpoint_timestamp: if learned {
            state.snapshot_timestamp
        } else {
            base.checkpoint_timestamp
        },
        ..base
    };
    let headers = state.view_headers.iter().map(|h| *h.bytes()).collect();
    (written, headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp() -> Stamp {
        Stamp {
            cluster_name: "c \"1\"".into(),
            cluster_id: wire::cluster_id("c \"1\""),
            replica_id: 2,
            replica_count: 3,
            layout: ShardLayout {
                shards: 2,
                replica_lanes: 16,
            },
            rejoin: false,
        }
    }

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("strand-boot-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn stamp_round_trips() {
        let s = stamp();
        let layout = s.layout;
        assert_eq!(
            Stamp::decode(&s.encode()),
            Some(Recorded {
                stamp: s,
                layout: Some(layout),
                data_format: DATA_FORMAT,
            })
        );
        assert_eq!(Stamp::decode("cluster_name = \"x\"\n"), None);
    }

    #[test]
    fn formats_once_then_checks() {
        let dir = temp("format");
        assert!(check_or_format(&dir, &stamp()).unwrap());
        assert!(metadata_dir(&dir).is_dir());
        assert!(!check_or_format(&dir, &stamp()).unwrap());
        for (change, rule) in [
            (
                Stamp {
                    cluster_name: "other".into(),
                    cluster_id: wire::cluster_id("other"),
                    ..stamp()
                },
                "cluster \"other\"",
            ),
            (
                Stamp {
                    replica_count: 5,
                    ..stamp()
                },
                "replica 2 of 5",
            ),
            (
                Stamp {
                    replica_id: 1,
                    ..stamp()
                },
                "replica 1 of 3",
            ),
        ] {
            let error = check_or_format(&dir, &change).unwrap_err().to_string();
            assert!(error.contains(STAMP_FILE), "{error}");
            assert!(error.contains(rule), "{error}");
            assert!(error.contains("one roster size"), "{error}");
        }
        // The stamp was not rewritten by the refusals.
        assert!(!check_or_format(&dir, &stamp()).unwrap());
        std::fs::remove_file(dir.join(STAMP_FILE)).unwrap();
        let error = check_or_format(&dir, &stamp()).unwrap_err().to_string();
        assert!(
            error.contains("missing") && error.contains("metadata"),
            "{error}"
        );
        assert!(!dir.join(STAMP_FILE).exists(), "never formatted over data");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Decision 499: the stamp records the data format generation. A directory of a later
    /// generation refuses, naming the stamp and both generations, and is not rewritten; a
    /// stamp of an earlier one (here without the field, as every stamp before) is brought to
    /// this build's generation at boot, keeping its rejoin.
    #[test]
    fn a_newer_data_format_refuses_and_an_older_one_is_recorded_forward() {
        let dir = temp("data-format");
        let path = dir.join(STAMP_FILE);
        assert!(check_or_format(&dir, &stamp()).unwrap());
        let written = std::fs::read_to_string(&path).unwrap();
        let line = format!("data_format = {DATA_FORMAT}");
        assert!(written.contains(&line), "{written}");
        let newer = written.replace(&line, &format!("data_format = {}", DATA_FORMAT + 1));
        std::fs::write(&path, &newer).unwrap();
        let error = check_or_format(&dir, &stamp()).unwrap_err();
        assert!(
            matches!(error, BootError::NewerFormat { found, supported, .. }
                if found == DATA_FORMAT + 1 && supported == DATA_FORMAT),
            "{error:?}"
        );
        let text = error.to_string();
        assert!(
            text.contains(STAMP_FILE) && text.contains("newer build"),
            "{text}"
        );
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            newer,
            "not rewritten"
        );
        let older: String = written
            .lines()
            .filter(|l| !l.starts_with("data_format"))
            .map(|l| format!("{l}\n"))
            .chain(std::iter::once("rejoin = true\n".to_string()))
            .collect();
        std::fs::write(&path, &older).unwrap();
        assert_eq!(Stamp::decode(&older).unwrap().data_format, 0);
        assert!(!check_or_format(&dir, &stamp()).unwrap());
        let recorded = Stamp::decode(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(recorded.data_format, DATA_FORMAT);
        assert!(recorded.stamp.rejoin, "the rejoin is kept");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Decision 192: the stamp records the shard and lane counts; a node started with another
    /// count refuses, naming the file, both values and what to do, and rewrites nothing; a
    /// stamp from before the layout was recorded is completed once.
    #[test]
    fn a_changed_shard_or_lane_count_refuses_naming_the_stamp_and_both_values() {
        let dir = temp("layout");
        assert!(check_or_format(&dir, &stamp()).unwrap());
        let written = std::fs::read(dir.join(STAMP_FILE)).unwrap();
        for (layout, now) in [
            (
                ShardLayout {
                    shards: 4,
                    replica_lanes: 16,
                },
                "now runs 4 shards and 16 replica lanes",
            ),
            (
                ShardLayout {
                    shards: 2,
                    replica_lanes: 32,
                },
                "now runs 2 shards and 32 replica lanes",
            ),
        ] {
            let error = check_or_format(&dir, &Stamp { layout, ..stamp() })
                .unwrap_err()
                .to_string();
            assert!(error.contains(STAMP_FILE), "{error}");
            assert!(
                error.contains("formatted for 2 shards and 16 replica lanes"),
                "{error}"
            );
            assert!(error.contains(now), "{error}");
            assert!(error.contains("--shards"), "{error}");
            assert!(error.contains("--rejoin"), "{error}");
            assert_eq!(std::fs::read(dir.join(STAMP_FILE)).unwrap(), written);
        }
        assert!(!check_or_format(&dir, &stamp()).unwrap());
        // A stamp without the layout (written before decision 192) is completed.
        let old: String = String::from_utf8(written)
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with("shards") && !l.starts_with("replica_lanes"))
            .map(|l| format!("{l}\n"))
            .collect();
        std::fs::write(dir.join(STAMP_FILE), &old).unwrap();
        assert_eq!(Stamp::decode(&old).unwrap().layout, None);
        assert!(!check_or_format(&dir, &stamp()).unwrap());
        let completed = std::fs::read_to_string(dir.join(STAMP_FILE)).unwrap();
        assert_eq!(
            Stamp::decode(&completed).unwrap().layout,
            Some(stamp().layout),
            "{completed}"
        );
        // Half a layout does not parse.
        let half = format!("{old}shards = 2\n");
        std::fs::write(dir.join(STAMP_FILE), half).unwrap();
        assert!(matches!(
            check_or_format(&dir, &stamp()),
            Err(BootError::StampUnreadable { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Decision 191: `--rejoin` formats only a directory that never held a node.
    #[test]
    fn rejoin_refuses_a_directory_with_data() {
        let dir = temp("rejoin");
        check_rejoin(&dir).unwrap();
        assert!(check_or_format(&dir, &stamp()).unwrap());
        let error = check_rejoin(&dir).unwrap_err().to_string();
        assert!(
            error.contains("--rejoin") && error.contains(STAMP_FILE),
            "{error}"
        );
        std::fs::remove_file(dir.join(STAMP_FILE)).unwrap();
        let error = check_rejoin(&dir).unwrap_err().to_string();
        assert!(error.contains("shard-0"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Decision 240: the stamp written by `--rejoin` records the rejoin durably before any
    /// group boots; every later boot reads it (with or without the flag, and through a layout
    /// record upgrade), `--rejoin` again on such a directory goes on with the rejoin, and a
    /// plain format records none.
    #[test]
    fn the_stamp_records_a_rejoin_until_cleared() {
        let dir = temp("rejoin-stamp");
        let rejoin = Stamp {
            rejoin: true,
            ..stamp()
        };
        check_rejoin(&dir).unwrap();
        assert!(check_or_format(&dir, &rejoin).unwrap());
        assert!(stamp_records_rejoin(&dir).unwrap());
        // The crash window: stamp written, no group marked. `--rejoin` again is accepted and
        // a start without it still reads the rejoin.
        check_rejoin(&dir).unwrap();
        assert!(!check_or_format(&dir, &stamp()).unwrap());
        assert!(stamp_records_rejoin(&dir).unwrap());
        assert!(!check_or_format(&dir, &rejoin).unwrap());
        // A pre-192 stamp completed at boot keeps the rejoin.
        let text = std::fs::read_to_string(dir.join(STAMP_FILE)).unwrap();
        let old: String = text
            .lines()
            .filter(|l| !l.starts_with("shards") && !l.starts_with("replica_lanes"))
            .map(|l| format!("{l}\n"))
            .collect();
        std::fs::write(dir.join(STAMP_FILE), old).unwrap();
        assert!(!check_or_format(&dir, &stamp()).unwrap());
        assert!(stamp_records_rejoin(&dir).unwrap());
        // Decision 290: cleared, the stamp is a plain one (same identity and layout), which
        // `--rejoin` refuses again; clearing twice changes nothing.
        clear_rejoin(&dir).unwrap();
        assert!(!stamp_records_rejoin(&dir).unwrap());
        assert!(!check_or_format(&dir, &stamp()).unwrap());
        assert!(check_rejoin(&dir).is_err());
        clear_rejoin(&dir).unwrap();
        assert!(!stamp_records_rejoin(&dir).unwrap());
        let _ = std::fs::remove_dir_all(&dir);

        let plain = temp("plain-stamp");
        assert!(check_or_format(&plain, &stamp()).unwrap());
        assert!(!stamp_records_rejoin(&plain).unwrap());
        assert!(
            !std::fs::read_to_string(plain.join(STAMP_FILE))
                .unwrap()
                .contains("rejoin"),
            "a plain stamp stays as before decision 240"
        );
        assert!(check_rejoin(&plain).is_err());
        let _ = std::fs::remove_dir_all(&plain);
    }

    /// Decision 240: only a group without a superblock state in a rejoined directory boots
    /// lost by the stamp; a group whose superblock landed boots from it (lost or not).
    #[test]
    fn only_a_group_without_a_superblock_boots_lost_by_the_stamp() {
        let state = consensus::VsrState::default();
        assert!(boots_lost_by_stamp(true, None));
        assert!(!boots_lost_by_stamp(true, Some(&state)));
        assert!(!boots_lost_by_stamp(false, None));
        assert!(!boots_lost_by_stamp(false, Some(&state)));
    }

    /// Decision 191: a rejoining group's `lost_state` is durable before the core runs, so a
    /// crash before it adopts a view boots in lost state again without `--rejoin`; a group
    /// with a prior life is never marked.
    #[test]
    fn a_rejoin_is_lost_state_durably_from_the_first_boot() {
        use journal::storage::block_on;
        let disk = journal::MemStorage::new();
        let mut first = boot_with(&disk, slots(64)).unwrap();
        assert!(!first.recovered.lost_state);
        assert!(first.recovered.superblock.is_none(), "formatted only");
        block_on(mark_lost_state(&mut first, Path::new("dir"))).unwrap();
        assert!(first.recovered.lost_state);
        assert!(first.recovered.superblock.as_ref().unwrap().lost_state);
        assert!(first.recovered.has_prior_life());
        drop(first);
        let mut again = boot_with(&disk, slots(64)).unwrap();
        let sb = again.recovered.superblock.clone().expect("a state now");
        assert!(sb.lost_state, "remembered without --rejoin");
        assert!(matches!(
            block_on(mark_lost_state(&mut again, Path::new("dir"))),
            Err(BootError::RejoinOverData { .. })
        ));
    }

    const TEST_IDENTITY: Identity = Identity {
        cluster: 42,
        replica_id: 0,
        replica_count: 3,
    };

    fn slots(slot_count: u64) -> JournalConfig {
        JournalConfig {
            slot_count,
            slot_size: 4096,
        }
    }

    fn boot_with(
        disk: &journal::MemStorage,
        config: JournalConfig,
    ) -> Result<MetadataBoot<journal::MemStorage, consensus::DigestStateMachine>, BootError> {
        journal::storage::block_on(recover(
            disk.clone(),
            Path::new("dir"),
            TEST_IDENTITY,
            config,
            consensus::DigestStateMachine::default(),
        ))
    }

    /// A journal of ops 1..=3 on the in-memory disk (64 slots), then `damage` applied.
    fn three_ops(damage: impl FnOnce(&journal::MemStorage)) -> journal::MemStorage {
        use crate::test_frames::prepare;
        use journal::storage::block_on;
        let disk = journal::MemStorage::new();
        let mut first = boot_with(&disk, slots(64)).unwrap();
        let mut parent = 0;
        for op in 1..=3 {
            let frame = prepare(op, parent, op as u8);
            block_on(first.disk.journal.append(&frame)).unwrap();
            parent = u128::from_le_bytes(frame[..16].try_into().unwrap());
        }
        drop(first);
        damage(&disk);
        disk
    }

    /// A journal of ops 1..=3, then `damage` applied, then a boot: the ops handed to the core.
    fn boot_after(damage: impl FnOnce(&journal::MemStorage)) -> Result<Vec<u64>, BootError> {
        let booted = boot_with(&three_ops(damage), slots(64))?;
        Ok(booted
            .recovered
            .frames
            .iter()
            .map(|f| f.prepare_header().unwrap().op.get())
            .collect())
    }

    /// Decision 51 at boot: the cut of a torn top (damaged, its ring entry too: never
    /// acknowledged, but never nacked either) raises the truncation ceiling over it durably
    /// before the journal drops it, so the next life never nacks it; the core gets the raised
    /// ceiling at once.
    #[test]
    fn a_boot_cut_makes_the_truncation_ceiling_durable_first() {
        use journal::storage::block_on;
        let disk = three_ops(|_| {});
        // The superblock knows the head (op 3), so the scan expects op 3 in its slot; the ring
        // entry is damaged too, so nothing vouches for it.
        let mut booted = boot_with(&disk, slots(64)).unwrap();
        let state = DiskState {
            op_head: 3,
            ..journal::recover::formatted_state(TEST_IDENTITY)
        };
        block_on(booted.disk.superblock.write(&state)).unwrap();
        drop(booted);
        rot(&disk, 3);
        rot_ring(&disk, 3);
        let cut = boot_with(&disk, slots(64)).unwrap();
        assert_eq!(cut.cut_from, Some(3));
        assert!(cut.recovered.faulty.is_empty());
        assert_eq!(
            cut.recovered.superblock.as_ref().map(|s| s.held_ceiling),
            Some(3),
            "the core gets the raised ceiling at once"
        );
        assert_eq!(cut.disk.superblock.state().unwrap().truncation_ceiling, 3);
        drop(cut);
        let again = boot_with(&disk, slots(64)).unwrap();
        assert_eq!(again.cut_from, None, "op 3 is gone");
        assert_eq!(
            again.recovered.superblock.map(|s| s.held_ceiling),
            Some(3),
            "the ceiling came back from the superblock"
        );
    }

    /// Decision 62 at the server's boot: a damaged newest prepare whose header the ring still
    /// holds was durable once, so possibly acknowledged: it is held but faulty (its ring header
    /// handed to the core), never cut; the journal keeps the slot, so a second boot before the
    /// repair holds it again. The repair (an append of the same prepare) makes it intact.
    #[test]
    fn a_damaged_newest_entry_the_ring_vouches_for_is_held_faulty_not_cut() {
        use crate::test_frames::prepare;
        let disk = three_ops(|d| rot(d, 3));
        let booted = boot_with(&disk, slots(64)).unwrap();
        assert_eq!(booted.cut_from, None, "never cut");
        let ops = |b: &MetadataBoot<_, _>| -> Vec<u64> {
            b.recovered
                .frames
                .iter()
                .map(|f| f.prepare_header().unwrap().op.get())
                .collect()
        };
        assert_eq!(ops(&booted), vec![1, 2]);
        let faulty: Vec<u64> = booted.recovered.faulty.iter().map(|h| h.op.get()).collect();
        assert_eq!(faulty, vec![3]);
        // The header handed over is the one op 3 was written with.
        let p1 = prepare(1, 0, 1);
        let p2 = prepare(2, u128::from_le_bytes(p1[..16].try_into().unwrap()), 2);
        let p3 = prepare(3, u128::from_le_bytes(p2[..16].try_into().unwrap()), 3);
        assert_eq!(
            booted.recovered.faulty[0].bytes()[..],
            p3[..wire::HEADER_SIZE]
        );
        drop(booted);
        let again = boot_with(&disk, slots(64)).unwrap();
        assert_eq!(again.recovered.faulty.len(), 1, "held again, not forgotten");
        // The repair from a peer: the same prepare appended again.
        let mut again = again;
        journal::storage::block_on(again.disk.journal.append(&p3)).unwrap();
        drop(again);
        let repaired = boot_with(&disk, slots(64)).unwrap();
        assert_eq!(ops(&repaired), vec![1, 2, 3]);
        assert!(repaired.recovered.faulty.is_empty());
    }

    /// Decision 91 through the server's boot: a `journal_slot_count` other than the one the
    /// journal was formatted with refuses to start, naming both.
    #[test]
    fn another_journal_slot_count_refuses_to_start() {
        let disk = three_ops(|_| {});
        let error = match boot_with(&disk, slots(32)) {
            Err(e) => e,
            Ok(_) => panic!("booted with another journal geometry"),
        };
        assert!(
            matches!(
                error,
                BootError::Recover {
                    error: journal::boot::BootError::Geometry {
                        configured_slots: 32,
                        formatted_slots: 64,
                        ..
                    },
                    ..
                }
            ),
            "{error:?}"
        );
        let text = error.to_string();
        assert!(text.contains("journal_slot_count 32"), "{text}");
        assert!(text.contains("refusing to start"), "{text}");
        assert!(
            boot_with(&disk, slots(64)).is_ok(),
            "the refusal changed nothing"
        );
    }

    /// Flips a body byte of the prepare in `slot` (slots of 4096 bytes).
    fn rot(disk: &journal::MemStorage, slot: u64) {
        disk.flip_bit("journal.prepares", slot * 4096 + 300, 1)
            .unwrap();
    }

    /// Flips a byte of the header ring's entry for `slot` (256 bytes each).
    fn rot_ring(disk: &journal::MemStorage, slot: u64) {
        disk.flip_bit("journal.headers", slot * 256 + 100, 1)
            .unwrap();
    }

    /// journal.md G3 at boot: a damaged prepare below an intact one may have been
    /// acknowledged, so boot refuses; a damaged newest prepare is not handed over as present
    /// (it is held faulty, see below).
    #[test]
    fn damaged_entries_refuse_boot_below_intact_ones_and_are_not_present_at_the_head() {
        assert_eq!(boot_after(|_| {}).unwrap(), vec![1, 2, 3]);
        match boot_after(|d| rot(d, 2)) {
            Err(BootError::InteriorDamage { op: 2, .. }) => {}
            other => panic!("{:?}", other.map_err(|e| e.to_string())),
        }
        let error = boot_after(|d| rot(d, 2)).unwrap_err().to_string();
        assert!(error.contains("op 2") && error.contains("G3"), "{error}");
        assert_eq!(boot_after(|d| rot(d, 3)).unwrap(), vec![1, 2]);
    }

    #[test]
    fn snapshot_payload_round_trips() {
        let artifacts = vec![Artifact {
            kind: ArtifactKind(1),
            frontier: 9,
            bytes: vec![1, 2, 3],
        }];
        let bytes = encode_snapshot(7, 8, &[4, 5], &artifacts);
        let decoded = decode_snapshot(&bytes).unwrap();
        assert_eq!(decoded.checksum, 7);
        assert_eq!(decoded.timestamp, 8);
        assert_eq!(decoded.client_table, vec![4, 5]);
        assert_eq!(decoded.artifacts, artifacts);
        assert_eq!(decode_snapshot(&bytes[..bytes.len() - 1]), None);
    }
}
