//! Per-group configuration: [`RawConfig`] (every field with the spec default) becomes a
//! [`Config`] only through [`RawConfig::validate`], so holding a `Config` proves it was checked.

use thiserror::Error;

use crate::constants::*;
use crate::types::{GroupId, Plane, ReplicaId};

/// Unchecked configuration of one replica of one group. Build with [`RawConfig::new`], adjust
/// fields, then [`RawConfig::validate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawConfig {
    /// Cluster id (`wire::cluster_id(name)`).
    pub cluster: u128,
    /// This replica's id.
    pub replica: ReplicaId,
    /// Roster size `n` (1..=32).
    pub replica_count: u8,
    /// The group this replica runs: [`GroupId::METADATA`] or a packed partition key.
    pub group: GroupId,
    /// Prepare queue depth (1..=127, default 32). Set equal on every node.
    pub prepare_queue_depth: usize,
    /// Request queue depth (default 2 × prepare depth).
    pub request_queue_depth: usize,
    /// Prepare retransmit base interval in ticks (default 25).
    pub prepare_retransmit_ticks: u64,
    /// Commit heartbeat interval in ticks (default 50).
    pub commit_broadcast_ticks: u64,
    /// Backup heartbeat timeout in ticks (default 500).
    pub heartbeat_timeout_ticks: u64,
    /// SVC/DVC retransmit interval in ticks (default 50).
    pub view_change_retransmit_ticks: u64,
    /// View change escalation timeout in ticks (default 500).
    pub view_change_status_timeout_ticks: u64,
    /// RequestStartView probe interval in ticks (default 100).
    pub request_start_view_ticks: u64,
    /// Probe firings before electing (1..=100, default 5).
    pub view_probe_attempts_max: u32,
    /// Repair / transfer idle retry in ticks (default 100).
    pub repair_retry_ticks: u64,
    /// Forwarded register/logout wait in ticks (default 500).
    pub forward_timeout_ticks: u64,
    /// RepairPrepares per RequestPrepares (default 128, `< peer_queue_capacity`).
    pub repair_chunk_max: u32,
    /// The bus's per-peer queue capacity (only validated against `repair_chunk_max`).
    pub peer_queue_capacity: u32,
    /// Largest frame, header included (default 64 MiB).
    pub max_message_size: usize,
    /// Client table capacity (metadata plane; 2..=65536, default 8192). Set equal everywhere.
    pub clients_table_max: usize,
    /// Committed frames kept in memory below `commit_min` before reading through the journal.
    pub frame_cache_committed: u64,
    /// Bytes of frames (committed and pipeline) kept in memory: above it committed frames are
    /// dropped oldest first, as if `frame_cache_committed` were smaller (default 64 MiB, at least
    /// `max_message_size`).
    pub frame_cache_committed_bytes: u64,
    /// Bytes of prepares whose appends this replica requested and has not seen complete
    /// (decision 504). At or above it a backup forwards a new prepare down the chain but
    /// neither journals nor acknowledges it, and asks for no repairs; a primary prepares no
    /// new request. Repair fetches what was skipped once the appends caught up, so a replica
    /// whose disk is slower than its group's stream holds a bounded backlog instead of all of
    /// it. An empty backlog always takes one prepare, whatever its size. 0 = unbounded.
    /// Default [`APPENDING_BYTES_MAX_DEFAULT`]. Node-local: need not agree.
    pub appending_bytes_max: u64,
    /// Partition plane: the largest SEGMENT_LOG artifact a state-transfer offer may name
    /// (state-transfer.md §3, architecture.md `partition.transfer_artifact_bytes_max`). A
    /// Strand offer carries a partition's whole retained log as one SEGMENT_LOG (decision
    /// 163), so this bounds the partition a replica can take by transfer (decision 507).
    /// Default [`TRANSFER_ARTIFACT_BYTES_MAX_DEFAULT`] (1 TiB, the partition's total cap).
    /// The metadata plane keeps its own caps (1 GiB per artifact, 4 GiB in all).
    pub transfer_artifact_bytes_max: u64,
    /// Committed headers kept in the in-memory index below `commit_min`; repair requests for
    /// older ops are answered RangeEvicted (state transfer takes over).
    pub headers_retained: u64,
    /// Periodic checkpoints: once `commit_min` is this many ops above the snapshot floor the
    /// core emits `Effect::Checkpoint` at `commit_min`, and after `Completion::Checkpointed`
    /// raises its floor (repair below it answers RangeEvicted). 0 disables them (transfers
    /// still checkpoint); otherwise at least 8. Default 256 on the metadata group (it must fit
    /// `journal_slot_count`), 1024 on partitions. Node-local: need not agree.
    pub checkpoint_interval_ops: u64,
    /// Slots of the local prepare journal: an op `o` lives in slot `o % slots` and the journal
    /// refuses to overwrite a slot above its durable checkpoint, so the core journals (and
    /// prepares, and acks) an op only while `o < checkpoint_durable + slots` (decision 34).
    /// 0 = unbounded (the partition plane's append-only WAL). Default: metadata groups
    /// [`JOURNAL_SLOT_COUNT_DEFAULT`] (the journal's own default), partition groups 0. When
    /// bounded it must be at least `2 × checkpoint_interval_ops + prepare_queue_depth` (and
    /// checkpoints must be on). Node-local: set it to what this node's journal was formatted with.
    pub journal_slot_count: u64,
    /// Primary timestamp window (decision 72, consensus.md §17.7): a backup journals and
    /// acknowledges a live prepare extending its head only if the prepare's timestamp is at
    /// most this many microseconds ahead of the backup's own clock, so a primary whose clock
    /// runs ahead cannot commit (and pin every later timestamp to) its future. Must exceed the
    /// clock skew tolerated between replicas. Default [`TIMESTAMP_AHEAD_MAX_US_DEFAULT`].
    pub timestamp_ahead_max_us: u64,
    /// Partition ack level "memory" (spec README decision 4, our decision 73): a backup
    /// acknowledges a prepare once it holds it in memory, before its append is durable. A
    /// group with a prior life then restarts in lost state (it may have acknowledged prepares
    /// its disk lost). Partition groups of at least 3 replicas only; default off ("disk").
    pub memory_ack: bool,
    /// PrepareOk's `commit` field carries the acker's `commit_min` (the ops it has applied)
    /// instead of its `commit_max` (server decision 395: the metadata primary holds a purge's
    /// or a delete's reply until enough replicas applied it). The primary's core never reads
    /// the field, so only what the frame says changes. Default off (the simulator's groups).
    pub acks_carry_applied: bool,
    /// Deliberately wrong behaviour for checker self-tests.
    #[cfg(feature = "bug-knobs")]
    pub bug_knobs: BugKnobs,
}

/// Switches that break named safety rules so the simulator can prove its checkers bite.
/// Only with the `bug-knobs` feature; all off by default.
#[cfg(feature = "bug-knobs")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BugKnobs {
    /// Send PrepareOk as soon as the append is *requested*, before `Completion::Appended`
    /// (breaks journal.md G1: acked but not durable).
    pub ack_before_append: bool,
    /// Use `Q_nack - 1` (at least 1) as the nack quorum in the DVC merge (can discard a
    /// committed op).
    pub loosen_nack_quorum: bool,
    /// Send view-scoped frames without waiting for `VsrStatePersisted` (breaks §8.10).
    pub skip_durable_before_send: bool,
    /// Truncate without first writing the truncation ceiling and the described headers to
    /// the superblock (breaks decision 51: a restart may nack an op it acknowledged).
    pub volatile_truncation_ceiling: bool,
    /// Enter Recovering without starting the probe timer (a replica that never asks for the
    /// view). Only the core's own invariant sweep names it at once: a checker self-test that
    /// the sweep runs in the simulator's release builds.
    pub recover_without_probe: bool,
}

impl RawConfig {
    /// Spec defaults for one replica of `group`.
    pub fn new(cluster: u128, replica: ReplicaId, replica_count: u8, group: GroupId) -> RawConfig {
        RawConfig {
            cluster,
            replica,
            replica_count,
            group,
            prepare_queue_depth: PREPARE_QUEUE_DEPTH_DEFAULT,
            request_queue_depth: REQUEST_QUEUE_DEPTH_DEFAULT,
            prepare_retransmit_ticks: PREPARE_RETRANSMIT_TICKS_DEFAULT,
            commit_broadcast_ticks: COMMIT_BROADCAST_TICKS_DEFAULT,
            heartbeat_timeout_ticks: HEARTBEAT_TIMEOUT_TICKS_DEFAULT,
            view_change_retransmit_ticks: VIEW_CHANGE_RETRANSMIT_TICKS_DEFAULT,
            view_change_status_timeout_ticks: VIEW_CHANGE_STATUS_TIMEOUT_TICKS_DEFAULT,
            request_start_view_ticks: REQUEST_START_VIEW_TICKS_DEFAULT,
            view_probe_attempts_max: VIEW_PROBE_ATTEMPTS_MAX_DEFAULT,
            repair_retry_ticks: REPAIR_RETRY_TICKS_DEFAULT,
            forward_timeout_ticks: FORWARD_TIMEOUT_TICKS_DEFAULT,
            repair_chunk_max: REPAIR_CHUNK_MAX_DEFAULT,
            peer_queue_capacity: PEER_QUEUE_CAPACITY_DEFAULT,
            max_message_size: wire::MAX_MESSAGE_SIZE_DEFAULT,
            clients_table_max: CLIENTS_TABLE_MAX_DEFAULT,
            frame_cache_committed: FRAME_CACHE_COMMITTED_DEFAULT,
            frame_cache_committed_bytes: FRAME_CACHE_COMMITTED_BYTES_DEFAULT,
            appending_bytes_max: APPENDING_BYTES_MAX_DEFAULT,
            transfer_artifact_bytes_max: TRANSFER_ARTIFACT_BYTES_MAX_DEFAULT,
            headers_retained: HEADERS_RETAINED,
            checkpoint_interval_ops: match group.kind() {
                wire::GroupKind::Metadata => METADATA_CHECKPOINT_INTERVAL_OPS_DEFAULT,
                _ => CHECKPOINT_INTERVAL_OPS_DEFAULT,
            },
            journal_slot_count: match group.kind() {
                wire::GroupKind::Metadata => JOURNAL_SLOT_COUNT_DEFAULT,
                _ => 0,
            },
            timestamp_ahead_max_us: TIMESTAMP_AHEAD_MAX_US_DEFAULT,
            memory_ack: false,
            acks_carry_applied: false,
            #[cfg(feature = "bug-knobs")]
            bug_knobs: BugKnobs::default(),
        }
    }

    /// Checks ranges and the relations between fields (§6 validation rules, §10.3).
    pub fn validate(self) -> Result<Config, ConfigError> {
        use ConfigError::*;
        let n = usize::from(self.replica_count);
        if n == 0 || n > REPLICAS_MAX {
            return Err(ReplicaCount(self.replica_count));
        }
        if self.replica.0 >= self.replica_count {
            return Err(ReplicaOutsideRoster {
                replica: self.replica.0,
                replica_count: self.replica_count,
            });
        }
        let plane = match self.group.kind() {
            wire::GroupKind::Metadata => Plane::Metadata,
            wire::GroupKind::Partition(_) => Plane::Partition,
            wire::GroupKind::Invalid => return Err(Group(self.group.0)),
        };
        if self.prepare_queue_depth == 0 || self.prepare_queue_depth > PIPELINE_PREPARE_QUEUE_MAX {
            return Err(PrepareQueueDepth(self.prepare_queue_depth));
        }
        if self.request_queue_depth > REQUEST_QUEUE_DEPTH_MAX {
            return Err(RequestQueueDepth(self.request_queue_depth));
        }
        let intervals = [
            ("prepare_retransmit_ticks", self.prepare_retransmit_ticks),
            ("commit_broadcast_ticks", self.commit_broadcast_ticks),
            ("heartbeat_timeout_ticks", self.heartbeat_timeout_ticks),
            (
                "view_change_retransmit_ticks",
                self.view_change_retransmit_ticks,
            ),
            (
                "view_change_status_timeout_ticks",
                self.view_change_status_timeout_ticks,
            ),
            ("request_start_view_ticks", self.request_start_view_ticks),
            ("repair_retry_ticks", self.repair_retry_ticks),
            ("forward_timeout_ticks", self.forward_timeout_ticks),
            ("timestamp_ahead_max_us", self.timestamp_ahead_max_us),
        ];
        for (name, ticks) in intervals {
            if ticks == 0 {
                return Err(ZeroInterval(name));
            }
        }
        if self.heartbeat_timeout_ticks < 4 * self.commit_broadcast_ticks {
            return Err(HeartbeatTooShort);
        }
        if self.view_change_status_timeout_ticks < 4 * self.view_change_retransmit_ticks {
            return Err(ViewChangeStatusTooShort);
        }
        if !(1..=100).contains(&self.view_probe_attempts_max) {
            return Err(ProbeAttempts(self.view_probe_attempts_max));
        }
        if self.repair_chunk_max == 0 || self.repair_chunk_max >= self.peer_queue_capacity {
            return Err(RepairChunk {
                repair_chunk_max: self.repair_chunk_max,
                peer_queue_capacity: self.peer_queue_capacity,
            });
        }
        if self.max_message_size < 2 * wire::HEADER_SIZE * SUFFIX_ENTRIES_MAX {
            return Err(MaxMessageSize(self.max_message_size));
        }
        if self.clients_table_max < 2 || self.clients_table_max > CLIENTS_TABLE_MAX {
            return Err(ClientsTableMax(self.clients_table_max));
        }
        if self.frame_cache_committed_bytes < self.max_message_size as u64 {
            return Err(FrameCacheBytes(self.frame_cache_committed_bytes));
        }
        if self.headers_retained < self.frame_cache_committed {
            return Err(HeadersRetained(self.headers_retained));
        }
        if self.checkpoint_interval_ops != 0
            && self.checkpoint_interval_ops < CHECKPOINT_INTERVAL_OPS_MIN
        {
            return Err(CheckpointInterval(self.checkpoint_interval_ops));
        }
        if self.journal_slot_count != 0 {
            // A bounded journal fills up unless checkpoints raise its floor; the room must
            // cover a whole interval (to reach the next checkpoint trigger) while the previous
            // checkpoint is still being written, plus a full pipeline above it.
            let interval = self.checkpoint_interval_ops;
            let needed = interval
                .saturating_mul(2)
                .saturating_add(self.prepare_queue_depth as u64);
            if interval == 0 || self.journal_slot_count < needed {
                return Err(JournalSlotCount {
                    journal_slot_count: self.journal_slot_count,
                    checkpoint_interval_ops: interval,
                    prepare_queue_depth: self.prepare_queue_depth,
                });
            }
        }
        if self.memory_ack && (plane == Plane::Metadata || self.replica_count < 3) {
            return Err(MemoryAck);
        }
        Ok(Config { raw: self, plane })
    }
}

/// A validated configuration (see [`RawConfig`] for the fields).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    raw: RawConfig,
    plane: Plane,
}

impl Config {
    /// The validated fields.
    pub fn raw(&self) -> &RawConfig {
        &self.raw
    }

    /// The plane, derived from the group id.
    pub fn plane(&self) -> Plane {
        self.plane
    }

    /// Roster size as `usize`.
    pub fn n(&self) -> usize {
        usize::from(self.raw.replica_count)
    }
}

impl std::ops::Deref for Config {
    type Target = RawConfig;
    fn deref(&self) -> &RawConfig {
        &self.raw
    }
}

/// Why a [`RawConfig`] is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// `replica_count` outside 1..=32.
    #[error("replica_count {0} is outside 1..=32")]
    ReplicaCount(u8),
    /// `replica >= replica_count`.
    #[error("replica id {replica} is outside a roster of {replica_count}")]
    ReplicaOutsideRoster {
        /// The id.
        replica: u8,
        /// The roster size.
        replica_count: u8,
    },
    /// The group value names neither the metadata group nor a partition.
    #[error("group {0:#x} is not a valid group key")]
    Group(u64),
    /// `prepare_queue_depth` outside 1..=127.
    #[error("prepare_queue_depth {0} is outside 1..=127")]
    PrepareQueueDepth(usize),
    /// `request_queue_depth` above the limit.
    #[error("request_queue_depth {0} is above 254")]
    RequestQueueDepth(usize),
    /// An interval is zero.
    #[error("{0} must not be zero")]
    ZeroInterval(&'static str),
    /// `heartbeat_timeout < 4 × commit_broadcast`.
    #[error("heartbeat_timeout_ticks must be at least 4 × commit_broadcast_ticks")]
    HeartbeatTooShort,
    /// `view_change_status_timeout < 4 × view_change_retransmit`.
    #[error("view_change_status_timeout_ticks must be at least 4 × view_change_retransmit_ticks")]
    ViewChangeStatusTooShort,
    /// `view_probe_attempts_max` outside 1..=100.
    #[error("view_probe_attempts_max {0} is outside 1..=100")]
    ProbeAttempts(u32),
    /// `repair_chunk_max` zero or not below the peer queue.
    #[error(
        "repair_chunk_max {repair_chunk_max} must be in 1..peer_queue_capacity ({peer_queue_capacity})"
    )]
    RepairChunk {
        /// Configured chunk.
        repair_chunk_max: u32,
        /// Configured queue.
        peer_queue_capacity: u32,
    },
    /// `max_message_size` cannot carry a full suffix.
    #[error("max_message_size {0} cannot carry a full view-change suffix")]
    MaxMessageSize(usize),
    /// `frame_cache_committed_bytes` below `max_message_size`.
    #[error("frame_cache_committed_bytes {0} is below max_message_size")]
    FrameCacheBytes(u64),
    /// `headers_retained` below `frame_cache_committed`.
    #[error("headers_retained {0} is below frame_cache_committed")]
    HeadersRetained(u64),
    /// `checkpoint_interval_ops` neither 0 (off) nor at least 8.
    #[error("checkpoint_interval_ops {0} must be 0 (off) or at least 8")]
    CheckpointInterval(u64),
    /// A bounded journal without room for `2 × checkpoint_interval_ops + prepare_queue_depth`
    /// ops above its checkpoint, or with checkpoints off.
    #[error(
        "journal_slot_count {journal_slot_count} must be 0 (unbounded) or at least 2 × \
         checkpoint_interval_ops ({checkpoint_interval_ops}, not 0) + prepare_queue_depth \
         ({prepare_queue_depth})"
    )]
    JournalSlotCount {
        /// Configured slots.
        journal_slot_count: u64,
        /// Configured interval.
        checkpoint_interval_ops: u64,
        /// Configured pipeline depth.
        prepare_queue_depth: usize,
    },
    /// `clients_table_max` outside 2..=65536.
    #[error("clients_table_max {0} is outside 2..=65536")]
    ClientsTableMax(usize),
    /// `memory_ack` on the metadata group (a partition setting only) or with fewer than three
    /// replicas (a restarted replica never votes, so f + 1 others must be able to elect).
    #[error("memory_ack needs a partition group of at least 3 replicas")]
    MemoryAck,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw() -> RawConfig {
        RawConfig::new(1, ReplicaId(0), 3, GroupId::METADATA)
    }

    #[test]
    fn memory_ack_needs_a_partition_group_of_three_and_the_timestamp_window_is_non_zero() {
        let mut r = raw();
        r.memory_ack = true;
        assert_eq!(r.validate(), Err(ConfigError::MemoryAck));
        let partition = GroupId::partition(wire::PartitionKey {
            stream: 1,
            topic: 1,
            partition: 1,
        })
        .unwrap();
        let mut r = RawConfig::new(1, ReplicaId(0), 2, partition);
        r.memory_ack = true;
        assert_eq!(r.clone().validate(), Err(ConfigError::MemoryAck));
        r.replica_count = 3;
        assert!(r.validate().is_ok());
        let mut r = raw();
        r.timestamp_ahead_max_us = 0;
        assert_eq!(
            r.validate(),
            Err(ConfigError::ZeroInterval("timestamp_ahead_max_us"))
        );
    }

    #[test]
    fn defaults_validate() {
        let config = raw().validate().unwrap();
        assert_eq!(config.plane(), Plane::Metadata);
        assert_eq!(config.prepare_queue_depth, 32);
    }

    #[test]
    fn relations_are_checked() {
        let mut r = raw();
        r.repair_chunk_max = 256;
        assert!(matches!(r.validate(), Err(ConfigError::RepairChunk { .. })));
        let mut r = raw();
        r.heartbeat_timeout_ticks = 100;
        assert_eq!(r.validate(), Err(ConfigError::HeartbeatTooShort));
        let mut r = raw();
        r.replica = ReplicaId(3);
        assert!(matches!(
            r.validate(),
            Err(ConfigError::ReplicaOutsideRoster { .. })
        ));
        let mut r = raw();
        // Bit 63 set but not the metadata group (bits 52..62 are an incarnation tag since
        // decision 375, so a value there is a tagged partition key, not an invalid group).
        r.group = GroupId((1 << 63) | 1);
        assert!(matches!(r.validate(), Err(ConfigError::Group(_))));
        let mut r = raw();
        r.prepare_queue_depth = 128;
        assert_eq!(r.validate(), Err(ConfigError::PrepareQueueDepth(128)));
        let mut r = raw();
        let max = r.max_message_size as u64;
        r.frame_cache_committed_bytes = max - 1;
        assert_eq!(
            r.clone().validate(),
            Err(ConfigError::FrameCacheBytes(max - 1))
        );
        r.max_message_size -= 1;
        assert!(r.validate().is_ok());
    }

    #[test]
    fn checkpoint_interval_is_off_or_at_least_eight() {
        assert_eq!(raw().checkpoint_interval_ops, 256);
        for ok in [0, 8, 1 << 20] {
            let mut r = raw();
            r.journal_slot_count = 0;
            r.checkpoint_interval_ops = ok;
            assert!(r.validate().is_ok());
        }
        let mut r = raw();
        r.checkpoint_interval_ops = 7;
        assert_eq!(r.validate(), Err(ConfigError::CheckpointInterval(7)));
    }

    #[test]
    fn journal_slots_leave_room_for_a_checkpoint() {
        assert_eq!(raw().journal_slot_count, JOURNAL_SLOT_COUNT_DEFAULT);
        let partition = RawConfig::new(1, ReplicaId(0), 3, GroupId(1));
        assert_eq!(
            partition.journal_slot_count, 0,
            "partition WALs are unbounded"
        );
        assert_eq!(
            partition.checkpoint_interval_ops,
            CHECKPOINT_INTERVAL_OPS_DEFAULT
        );
        assert!(partition.validate().is_ok());
        let mut r = raw();
        r.checkpoint_interval_ops = 16;
        r.prepare_queue_depth = 32;
        r.journal_slot_count = 64;
        assert!(r.clone().validate().is_ok());
        r.journal_slot_count = 63;
        assert_eq!(
            r.clone().validate(),
            Err(ConfigError::JournalSlotCount {
                journal_slot_count: 63,
                checkpoint_interval_ops: 16,
                prepare_queue_depth: 32,
            })
        );
        r.journal_slot_count = 1 << 20;
        r.checkpoint_interval_ops = 0;
        assert!(matches!(
            r.validate(),
            Err(ConfigError::JournalSlotCount { .. })
        ));
    }
}
