//! The node's configuration: TOML in the shape of spec architecture.md §10, every key with a
//! default, validated once into a typed [`Config`].
//!
//! Reading goes through three steps, each of which names the key it refuses:
//! 1. TOML syntax (the parser's message, with line and column);
//! 2. shape: a key nobody reads (`unknown config key `cluster.auth.secret``) or a value of the
//!    wrong type (`config key `cluster.replica_lanes`: invalid type ...`);
//! 3. rules: ranges and cross-key rules (`config key `cluster.replica_lanes`: 2 is below the
//!    node's 4 shards ...`).
//!
//! The defaults are the reference's, except where the spec marks Strand's own (README decision
//! 2 lanes, decision 4 acks, `reconnect_period` 1 s) and the keys only Strand has:
//! `system.sharding.io_memory`, `system.sharding.ring_depth`, and the two
//! `checkpoint_interval_ops` (docs/decisions.md 31, 35, 36). The README lists them all.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use shard::{CoreList, Sharding};

/// Environment variable that overrides `cluster.auth.shared_secret`.
pub const SHARED_SECRET_ENV: &str = "IGGY_CLUSTER_AUTH_SHARED_SECRET";
/// Shortest accepted shared secret, in bytes (handshake.md §4).
pub const SHARED_SECRET_MIN: usize = 32;
/// Largest roster (ours; replica ids are a byte and quorums are computed over at most 32).
pub const NODES_MAX: usize = 32;

/// A refused configuration: the key (a dotted TOML path, or a command-line flag) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Dotted path of the key, e.g. `cluster.nodes[1].ports.tcp`; empty for a syntax error.
    pub key: String,
    /// What is wrong with it.
    pub message: String,
}

impl ConfigError {
    fn new(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError {
            key: key.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            write!(f, "config: {}", self.message)
        } else if self.key.starts_with("--") {
            write!(f, "flag `{}`: {}", self.key, self.message)
        } else if [
            SHARED_SECRET_ENV,
            crate::metadata::ENV_ROOT_USERNAME,
            crate::metadata::ENV_ROOT_PASSWORD,
        ]
        .contains(&self.key.as_str())
        {
            write!(f, "environment variable `{}`: {}", self.key, self.message)
        } else {
            write!(f, "config key `{}`: {}", self.key, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

// ---------------------------------------------------------------------------------------------
// The file as written (every key optional, defaults filled in).

macro_rules! defaults {
    ($ty:ident { $($field:ident : $value:expr),* $(,)? }) => {
        impl Default for $ty {
            fn default() -> Self {
                $ty { $($field: $value),* }
            }
        }
    };
}

fn s(v: &str) -> String {
    v.to_string()
}

/// The whole file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawConfig {
    /// `[cluster]`.
    pub cluster: RawCluster,
    /// `[message_bus]`.
    pub message_bus: RawMessageBus,
    /// `[network]`.
    pub network: RawNetwork,
    /// `[metadata]`.
    pub metadata: RawMetadata,
    /// `[partition]`.
    pub partition: RawPartition,
    /// `[system]`.
    pub system: RawSystem,
}

/// `[cluster]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct RawCluster {
    pub enabled: bool,
    pub replica_lanes: u64,
    pub name: String,
    pub heartbeat_timeout: String,
    pub commit_broadcast_interval: String,
    pub prepare_retransmit_interval: String,
    pub view_change_retransmit_interval: String,
    pub view_change_status_timeout: String,
    pub request_start_view_retransmit_interval: String,
    pub view_probe_attempts_max: u64,
    pub repair_retry_interval: String,
    pub repair_chunk_max: u64,
    pub superblock_wedged_fatal_timeout: String,
    pub dead_node_session_timeout: String,
    pub auth: RawAuth,
    pub tls: RawTls,
    pub coordinator: RawCoordinator,
    pub nodes: Vec<RawNode>,
}

defaults!(RawCluster {
    enabled: false,
    replica_lanes: 16,
    name: s("iggy-cluster"),
    heartbeat_timeout: s("5s"),
    commit_broadcast_interval: s("500ms"),
    prepare_retransmit_interval: s("250ms"),
    view_change_retransmit_interval: s("500ms"),
    view_change_status_timeout: s("5s"),
    request_start_view_retransmit_interval: s("1s"),
    view_probe_attempts_max: 5,
    repair_retry_interval: s("1s"),
    repair_chunk_max: 128,
    superblock_wedged_fatal_timeout: s("2m"),
    dead_node_session_timeout: s("10s"),
    auth: RawAuth::default(),
    tls: RawTls::default(),
    coordinator: RawCoordinator::default(),
    nodes: Vec::new(),
});

/// `[cluster.auth]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct RawAuth {
    pub enabled: bool,
    pub shared_secret: String,
    pub previous_shared_secret: String,
}

/// `[cluster.tls]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct RawTls {
    pub enabled: bool,
    pub self_signed: bool,
    pub cert_file: String,
    pub key_file: String,
    pub ca_file: String,
}

/// `[cluster.coordinator]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct RawCoordinator {
    pub skip_shard_zero_for_replicas: bool,
    pub skip_shard_zero_for_clients: bool,
}

defaults!(RawCoordinator {
    skip_shard_zero_for_replicas: true,
    skip_shard_zero_for_clients: false
});

/// One `[[cluster.nodes]]` entry. `name`, `ip`, `replica_id` and `ports` have no default.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct RawNode {
    pub name: String,
    pub ip: String,
    pub replica_id: u64,
    pub ports: RawPorts,
    #[serde(default)]
    pub advertised_address: Option<String>,
}

/// A node's ports. `tcp`, `http` and `tcp_replica` are required (the transports Strand serves);
/// `quic` and `websocket` are accepted for the reference's shape and checked for collisions.
#[derive(Debug, Clone, Default, Deserialize)]
#[allow(missing_docs)]
pub struct RawPorts {
    pub tcp: Option<u64>,
    pub quic: Option<u64>,
    pub http: Option<u64>,
    pub websocket: Option<u64>,
    pub tcp_replica: Option<u64>,
}

/// `[message_bus]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct RawMessageBus {
    pub max_batch: u64,
    pub max_message_size: String,
    pub peer_queue_capacity: u64,
    pub reconnect_period: String,
    pub close_peer_timeout: String,
    pub close_grace: String,
    pub handshake_grace: String,
}

defaults!(RawMessageBus {
    max_batch: 256,
    max_message_size: s("64 MiB"),
    peer_queue_capacity: 256,
    reconnect_period: s("1 s"),
    close_peer_timeout: s("2 s"),
    close_grace: s("2 s"),
    handshake_grace: s("10 s"),
});

/// `[network]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct RawNetwork {
    pub tcp_congestion_control: String,
}

defaults!(RawNetwork {
    tcp_congestion_control: s(""),
});

/// `[metadata]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct RawMetadata {
    pub prepare_queue_depth: u64,
    pub journal_slots: u64,
    pub clients_table_max: u64,
    pub checkpoint_interval_ops: u64,
    pub root_username: String,
    pub root_password: Secret,
}

defaults!(RawMetadata {
    prepare_queue_depth: 32,
    journal_slots: 1024,
    clients_table_max: 8192,
    checkpoint_interval_ops: 256,
    root_username: s(crate::metadata::ROOT_DEFAULT),
    root_password: Secret(s(crate::metadata::ROOT_DEFAULT)),
});

/// A secret from the config file or the environment: `Debug` never shows it.
#[derive(Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// `[partition]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct RawPartition {
    pub ack: String,
    pub topic: Vec<RawTopicAck>,
    pub prepare_queue_depth: u64,
    pub evicted_ring_capacity: u64,
    pub evicted_ring_bytes_max: String,
    pub transfer_served_cache_bytes_max: String,
    pub transfer_artifact_bytes_max: String,
    pub checkpoint_interval_ops: u64,
    pub read_cache_bytes: String,
    pub read_cache_shard_bytes: String,
    pub wal_size: String,
    pub appending_bytes_max: String,
    pub appending_shard_bytes_max: String,
}

defaults!(RawPartition {
    ack: s("disk"),
    topic: Vec::new(),
    prepare_queue_depth: 32,
    evicted_ring_capacity: 4096,
    evicted_ring_bytes_max: s("16 MiB"),
    transfer_served_cache_bytes_max: s("2176 MiB"),
    transfer_artifact_bytes_max: s("1 TiB"),
    checkpoint_interval_ops: 1024,
    read_cache_bytes: s("256 MiB"),
    read_cache_shard_bytes: s("1 GiB"),
    wal_size: s("64 MiB"),
    appending_bytes_max: s("64 MiB"),
    appending_shard_bytes_max: s("256 MiB"),
});

/// `[[partition.topic]]`: a per-topic ack override.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct RawTopicAck {
    pub stream: String,
    pub topic: String,
    pub ack: String,
}

/// `[system]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct RawSystem {
    pub path: String,
    pub memory_prefault_bytes: String,
    pub sharding: RawSharding,
}

defaults!(RawSystem {
    path: s("local_data"),
    memory_prefault_bytes: s("1 GiB"),
    sharding: RawSharding::default()
});

/// `system.sharding.cpu_allocation`: `"all"`, a count, or a core list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawCpuAllocation {
    /// `cpu_allocation = 4`.
    Count(u64),
    /// `cpu_allocation = "all"` or `"0-1,3"`.
    Text(String),
}

/// `[system.sharding]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct RawSharding {
    pub cpu_allocation: RawCpuAllocation,
    pub pin_cores: bool,
    pub inbox_capacity: u64,
    pub reply_inbox_capacity: u64,
    pub shutdown_drain_timeout: String,
    pub shutdown_poll_interval: String,
    pub shutdown_join_timeout: String,
    pub reconcile_periodic_interval: String,
    pub io_memory: String,
    pub ring_depth: u64,
}

defaults!(RawSharding {
    cpu_allocation: RawCpuAllocation::Text(s("all")),
    pin_cores: true,
    inbox_capacity: 1024,
    reply_inbox_capacity: 1024,
    shutdown_drain_timeout: s("10 s"),
    shutdown_poll_interval: s("50 ms"),
    shutdown_join_timeout: s("30 s"),
    reconcile_periodic_interval: s("1 s"),
    io_memory: s("2 MiB"),
    ring_depth: 128,
});

impl RawConfig {
    /// Parses TOML text; a key nobody reads or a value of the wrong type is an error naming it.
    pub fn parse(text: &str) -> Result<RawConfig, ConfigError> {
        let deserializer = toml::Deserializer::parse(text)
            .map_err(|e| ConfigError::new("", format!("TOML syntax: {e}")))?;
        let mut unknown = Vec::new();
        let mut note = |path: serde_ignored::Path<'_>| unknown.push(path.to_string());
        let ignoring = serde_ignored::Deserializer::new(deserializer, &mut note);
        let raw: RawConfig = serde_path_to_error::deserialize(ignoring).map_err(|e| {
            let key = e.path().to_string();
            let message = e.into_inner().message().trim().to_string();
            ConfigError::new(if key == "." { String::new() } else { key }, message)
        })?;
        if let Some(key) = unknown.into_iter().next() {
            return Err(ConfigError::new(bracket_indices(&key), "unknown key"));
        }
        Ok(raw)
    }
}

/// `cluster.nodes.1.port` (serde_ignored's form) as `cluster.nodes[1].port`, the form every
/// other error uses.
fn bracket_indices(path: &str) -> String {
    let mut out = String::with_capacity(path.len() + 2);
    for segment in path.split('.') {
        if !out.is_empty() && !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit()) {
            out.push_str(&format!("[{segment}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(segment);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The validated config.

/// `partition.ack` (spec README decision 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ack {
    /// A replication quorum has fdatasync'ed the prepare (default).
    Disk,
    /// A replication quorum holds it in memory (faster, weaker).
    Memory,
}

/// A node's ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Ports {
    pub tcp: u16,
    pub quic: Option<u16>,
    pub http: u16,
    pub websocket: Option<u16>,
    pub tcp_replica: u16,
}

/// A roster entry.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Node {
    pub name: String,
    pub ip: IpAddr,
    pub replica_id: u8,
    pub ports: Ports,
    pub advertised_address: Option<String>,
}

/// `[cluster]`, validated.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct Cluster {
    pub enabled: bool,
    pub replica_lanes: u16,
    pub name: String,
    pub heartbeat_timeout: Duration,
    pub commit_broadcast_interval: Duration,
    pub prepare_retransmit_interval: Duration,
    pub view_change_retransmit_interval: Duration,
    pub view_change_status_timeout: Duration,
    pub request_start_view_retransmit_interval: Duration,
    pub view_probe_attempts_max: u32,
    pub repair_retry_interval: Duration,
    pub repair_chunk_max: u32,
    /// `None` when disabled (`"0"`).
    pub superblock_wedged_fatal_timeout: Option<Duration>,
    /// How long the metadata primary sees a node down before it ends the sessions that node
    /// registered (decision 372); `None` when disabled (`"0"`).
    pub dead_node_session_timeout: Option<Duration>,
    /// `None` when authentication is off.
    pub shared_secret: Option<Vec<u8>>,
    pub previous_shared_secret: Option<Vec<u8>>,
    pub tls: Option<Tls>,
    pub skip_shard_zero_for_replicas: bool,
    pub skip_shard_zero_for_clients: bool,
    /// Sorted by replica id (ids are `0..n`).
    pub nodes: Vec<Node>,
}

/// `[cluster.tls]` when enabled.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Tls {
    pub self_signed: bool,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
}

/// `[message_bus]`, validated.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct MessageBus {
    pub max_batch: u32,
    pub max_message_size: u64,
    pub peer_queue_capacity: u32,
    pub reconnect_period: Duration,
    pub close_peer_timeout: Duration,
    pub close_grace: Duration,
    pub handshake_grace: Duration,
}

/// The `[network]` table that sets `network.tcp_congestion_control` to `congestion`, for a
/// generated config (`strand dev`, `strand bench --spawn`); empty for `None`.
pub fn network_section(congestion: Option<&shard::net::CongestionControl>) -> String {
    congestion.map_or_else(String::new, |c| {
        format!("\n[network]\ntcp_congestion_control = \"{c}\"\n")
    })
}

/// `[network]`, validated (decision 501).
#[derive(Debug, Clone)]
pub struct Network {
    /// `network.tcp_congestion_control`: set on the node's client and replica listeners
    /// before they listen and on its replica dials before they connect; `None` (the empty
    /// string) leaves the kernel's default. Whether the kernel has it is checked at start.
    pub tcp_congestion_control: Option<shard::net::CongestionControl>,
}

/// `[metadata]`, validated.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct Metadata {
    pub prepare_queue_depth: u32,
    pub journal_slots: u32,
    pub clients_table_max: u32,
    pub checkpoint_interval_ops: u64,
    /// The root user: `IGGY_ROOT_USERNAME` / `IGGY_ROOT_PASSWORD`, else
    /// `metadata.root_username` / `metadata.root_password` (decision 124).
    pub root: crate::metadata::RootCredentials,
}

/// The smallest `partition.wal_size`: a file must hold one whole group-commit window
/// (`journal::wal::WalConfig::window_bytes_max`, 4 MiB) and its tail marker; 8 MiB leaves a
/// window's worth of records beside it (decision 382).
pub const WAL_SIZE_MIN: u64 = 8 << 20;
/// The largest `partition.wal_size` (a WAL file is read whole into memory at boot).
pub const WAL_SIZE_MAX: u64 = 1 << 30;

/// `[partition]`, validated.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct Partition {
    pub ack: Ack,
    /// `(stream, topic) -> ack` overrides.
    pub topic_ack: BTreeMap<(String, String), Ack>,
    pub prepare_queue_depth: u32,
    pub evicted_ring_capacity: u32,
    pub evicted_ring_bytes_max: u64,
    pub transfer_served_cache_bytes_max: u64,
    pub transfer_artifact_bytes_max: u64,
    pub checkpoint_interval_ops: u64,
    /// Each partition's in-memory tail of committed batches (decision 280).
    pub read_cache_bytes: u64,
    /// Every partition tail of one shard together (decision 424).
    pub read_cache_shard_bytes: u64,
    /// Bytes of each file of a shard's partition WAL (decision 382): fixed for a data
    /// directory's life (`crate::wal_size`).
    pub wal_size: u64,
    /// Bytes of prepares one partition group may have asked to append and not seen complete;
    /// past it a backup forwards new prepares without journaling them and a primary holds
    /// new requests (decisions 504, 510). 0: no bound.
    pub appending_bytes_max: u64,
    /// The same for every partition group of one shard together: past it each group takes a
    /// new append only into an empty backlog (decisions 505, 510). 0: no bound.
    pub appending_shard_bytes_max: u64,
}

/// `[system]` with the command line applied.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct System {
    /// `system.path`, or `--data-dir`.
    pub path: PathBuf,
    /// `system.memory_prefault_bytes`: memory the node faults in at boot and keeps for its
    /// caches (decision 512); 0 for none.
    pub memory_prefault_bytes: u64,
    /// Shards and placement: `--cores`, `--shards`, else `system.sharding`.
    pub sharding: Sharding,
    pub inbox_capacity: usize,
    pub reply_inbox_capacity: usize,
    pub shutdown_drain_timeout: Duration,
    pub shutdown_poll_interval: Duration,
    pub shutdown_join_timeout: Duration,
    pub reconcile_periodic_interval: Duration,
    pub io_memory: usize,
    pub ring_depth: usize,
}

/// The validated configuration of one node.
#[derive(Debug, Clone)]
pub struct Config {
    /// This node's roster entry (`--replica-id`).
    pub replica_id: u8,
    #[allow(missing_docs)]
    pub cluster: Cluster,
    #[allow(missing_docs)]
    pub message_bus: MessageBus,
    #[allow(missing_docs)]
    pub network: Network,
    #[allow(missing_docs)]
    pub metadata: Metadata,
    #[allow(missing_docs)]
    pub partition: Partition,
    #[allow(missing_docs)]
    pub system: System,
}

impl Config {
    /// This node's roster entry.
    pub fn node(&self) -> &Node {
        &self.cluster.nodes[usize::from(self.replica_id)]
    }
}

/// What the command line and the environment say beside the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--replica-id`.
    pub replica_id: u64,
    /// `--cores LIST` (pinned).
    pub cores: Option<CoreList>,
    /// `--shards N` (unpinned).
    pub shards: Option<u64>,
    /// `--data-dir`.
    pub data_dir: Option<PathBuf>,
    /// `IGGY_CLUSTER_AUTH_SHARED_SECRET`, when set.
    pub shared_secret_env: Option<String>,
    /// `IGGY_ROOT_USERNAME`, when set.
    pub root_username_env: Option<String>,
    /// `IGGY_ROOT_PASSWORD`, when set.
    pub root_password_env: Option<Secret>,
    /// The CPUs this process may run on (`sched_getaffinity`), for `"all"` and counts.
    pub available_cpus: Vec<usize>,
}

impl Overrides {
    /// Reads the environment and the process's CPU set.
    pub fn from_environment(replica_id: u64) -> std::io::Result<Overrides> {
        Ok(Overrides {
            replica_id,
            shared_secret_env: std::env::var(SHARED_SECRET_ENV).ok(),
            root_username_env: std::env::var(crate::metadata::ENV_ROOT_USERNAME).ok(),
            root_password_env: std::env::var(crate::metadata::ENV_ROOT_PASSWORD)
                .ok()
                .map(Secret),
            available_cpus: shard::cores::thread_allowed_cpus()?,
            ..Overrides::default()
        })
    }
}

/// Parses and validates in one go.
pub fn load(text: &str, overrides: &Overrides) -> Result<Config, ConfigError> {
    RawConfig::parse(text)?.validate(overrides)
}

fn duration(key: &str, text: &str) -> Result<Duration, ConfigError> {
    humantime::parse_duration(text.trim())
        .map_err(|e| ConfigError::new(key, format!("`{text}` is not a duration ({e})")))
}

fn nonzero_duration(key: &str, text: &str) -> Result<Duration, ConfigError> {
    let d = duration(key, text)?;
    if d.is_zero() {
        return Err(ConfigError::new(key, "must not be zero"));
    }
    Ok(d)
}

/// Parses a byte size: a number with an optional unit `B`, `KB`/`MB`/`GB`/`TB` (powers of
/// 1000) or `KiB`/`MiB`/`GiB`/`TiB` (powers of 1024), case-insensitive, space optional.
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().ok()?;
    let factor: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1000,
        "mb" => 1000_u64.pow(2),
        "gb" => 1000_u64.pow(3),
        "tb" => 1000_u64.pow(4),
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        _ => return None,
    };
    number.checked_mul(factor)
}

fn size(key: &str, text: &str) -> Result<u64, ConfigError> {
    parse_size(text).ok_or_else(|| {
        ConfigError::new(
            key,
            format!("`{text}` is not a size like \"64 MiB\" or \"4096\""),
        )
    })
}

fn in_range(key: &str, value: u64, low: u64, high: u64) -> Result<u64, ConfigError> {
    if value < low || value > high {
        return Err(ConfigError::new(
            key,
            format!("{value} is outside {low}..={high}"),
        ));
    }
    Ok(value)
}

fn ack(key: &str, text: &str) -> Result<Ack, ConfigError> {
    match text {
        "disk" => Ok(Ack::Disk),
        "memory" => Ok(Ack::Memory),
        other => Err(ConfigError::new(
            key,
            format!("`{other}` is neither \"disk\" nor \"memory\""),
        )),
    }
}

fn secret(key: &str, value: &str) -> Result<Option<Vec<u8>>, ConfigError> {
    if value.is_empty() {
        return Ok(None);
    }
    if value.len() < SHARED_SECRET_MIN {
        return Err(ConfigError::new(
            key,
            format!(
                "is {} bytes; at least {SHARED_SECRET_MIN} are required",
                value.len()
            ),
        ));
    }
    Ok(Some(value.as_bytes().to_vec()))
}

fn optional_path(value: &str) -> Option<PathBuf> {
    (!value.is_empty()).then(|| PathBuf::from(value))
}

impl RawConfig {
    /// Checks every rule and applies the command line.
    pub fn validate(&self, overrides: &Overrides) -> Result<Config, ConfigError> {
        let system = self.validate_system(overrides)?;
        let message_bus = self.validate_message_bus()?;
        let network = self.validate_network()?;
        let cluster = self.validate_cluster(overrides, &system, &message_bus)?;
        let metadata = self.validate_metadata(overrides)?;
        let partition = self.validate_partition(&message_bus)?;
        if !cluster.enabled {
            return Err(ConfigError::new(
                "cluster.enabled",
                "must be true: a Strand node is a replica of a cluster",
            ));
        }
        let replica_id = overrides.replica_id;
        if replica_id >= cluster.nodes.len() as u64 {
            return Err(ConfigError::new(
                "--replica-id",
                format!(
                    "{replica_id} is not in the roster (replica ids 0..{} in [[cluster.nodes]])",
                    cluster.nodes.len()
                ),
            ));
        }
        Ok(Config {
            replica_id: replica_id as u8,
            cluster,
            message_bus,
            network,
            metadata,
            partition,
            system,
        })
    }

    fn validate_network(&self) -> Result<Network, ConfigError> {
        let name = &self.network.tcp_congestion_control;
        let tcp_congestion_control =
            if name.is_empty() {
                None
            } else {
                Some(shard::net::CongestionControl::new(name).map_err(|e| {
                    ConfigError::new("network.tcp_congestion_control", e.to_string())
                })?)
            };
        Ok(Network {
            tcp_congestion_control,
        })
    }

    fn validate_system(&self, overrides: &Overrides) -> Result<System, ConfigError> {
        let raw = &self.system.sharding;
        let sharding = if let Some(cores) = &overrides.cores {
            if overrides.shards.is_some() {
                return Err(ConfigError::new(
                    "--cores",
                    "conflicts with --shards; give one",
                ));
            }
            Sharding::Pinned(cores.clone())
        } else if let Some(n) = overrides.shards {
            Sharding::Unpinned(in_range("--shards", n, 1, 1024)? as usize)
        } else {
            let key = "system.sharding.cpu_allocation";
            let available = &overrides.available_cpus;
            let list = match &raw.cpu_allocation {
                RawCpuAllocation::Text(all) if all == "all" => {
                    if available.is_empty() {
                        return Err(ConfigError::new(key, "no CPU is available to this process"));
                    }
                    available.clone()
                }
                RawCpuAllocation::Count(n) => {
                    let n = in_range(key, *n, 1, 1024)? as usize;
                    if raw.pin_cores && n > available.len() {
                        return Err(ConfigError::new(
                            key,
                            format!(
                                "{n} pinned shards but only {} CPUs are available",
                                available.len()
                            ),
                        ));
                    }
                    if !raw.pin_cores {
                        return self.finish_system(overrides, Sharding::Unpinned(n));
                    }
                    available[..n].to_vec()
                }
                RawCpuAllocation::Text(list) => {
                    let cores = CoreList::parse(list)
                        .map_err(|e| ConfigError::new(key, format!("`{list}`: {e}")))?;
                    if !raw.pin_cores {
                        return Err(ConfigError::new(
                            "system.sharding.pin_cores",
                            "a core list in cpu_allocation needs pin_cores = true",
                        ));
                    }
                    if let Some(core) = cores.ids().iter().find(|c| !available.contains(c)) {
                        return Err(ConfigError::new(
                            key,
                            format!("core {core} is not available to this process"),
                        ));
                    }
                    cores.ids().to_vec()
                }
            };
            if raw.pin_cores {
                Sharding::Pinned(CoreList::from_ids(list).expect("distinct CPUs"))
            } else {
                Sharding::Unpinned(list.len())
            }
        };
        self.finish_system(overrides, sharding)
    }

    fn finish_system(
        &self,
        overrides: &Overrides,
        sharding: Sharding,
    ) -> Result<System, ConfigError> {
        let raw = &self.system.sharding;
        if let Some(core) = overrides.cores.as_ref().and_then(|c| {
            c.ids()
                .iter()
                .find(|c| !overrides.available_cpus.contains(c))
        }) {
            return Err(ConfigError::new(
                "--cores",
                format!("core {core} is not available to this process"),
            ));
        }
        let path = match &overrides.data_dir {
            Some(dir) => dir.clone(),
            None if self.system.path.is_empty() => {
                return Err(ConfigError::new("system.path", "must not be empty"));
            }
            None => PathBuf::from(&self.system.path),
        };
        let k = "system.sharding.";
        let shutdown_drain_timeout = nonzero_duration(
            &format!("{k}shutdown_drain_timeout"),
            &raw.shutdown_drain_timeout,
        )?;
        let shutdown_poll_interval = nonzero_duration(
            &format!("{k}shutdown_poll_interval"),
            &raw.shutdown_poll_interval,
        )?;
        let shutdown_join_timeout = nonzero_duration(
            &format!("{k}shutdown_join_timeout"),
            &raw.shutdown_join_timeout,
        )?;
        if shutdown_poll_interval > shutdown_drain_timeout {
            return Err(ConfigError::new(
                format!("{k}shutdown_poll_interval"),
                "must not exceed system.sharding.shutdown_drain_timeout",
            ));
        }
        if shutdown_join_timeout < shutdown_drain_timeout {
            return Err(ConfigError::new(
                format!("{k}shutdown_join_timeout"),
                "must be at least system.sharding.shutdown_drain_timeout",
            ));
        }
        let io_memory = size(&format!("{k}io_memory"), &raw.io_memory)?;
        let io_memory = in_range(&format!("{k}io_memory"), io_memory, 64 << 10, 1 << 30)?;
        let prefault_key = "system.memory_prefault_bytes";
        let memory_prefault_bytes = match size(prefault_key, &self.system.memory_prefault_bytes)? {
            0 => 0,
            bytes => in_range(
                prefault_key,
                bytes,
                crate::memory::PREFAULT_BYTES_MIN,
                crate::memory::PREFAULT_BYTES_MAX,
            )?,
        };
        Ok(System {
            path,
            memory_prefault_bytes,
            sharding,
            inbox_capacity: in_range(
                &format!("{k}inbox_capacity"),
                raw.inbox_capacity,
                1,
                1 << 20,
            )? as usize,
            reply_inbox_capacity: in_range(
                &format!("{k}reply_inbox_capacity"),
                raw.reply_inbox_capacity,
                1,
                1 << 20,
            )? as usize,
            shutdown_drain_timeout,
            shutdown_poll_interval,
            shutdown_join_timeout,
            reconcile_periodic_interval: nonzero_duration(
                &format!("{k}reconcile_periodic_interval"),
                &raw.reconcile_periodic_interval,
            )?,
            io_memory: io_memory as usize,
            ring_depth: in_range(&format!("{k}ring_depth"), raw.ring_depth, 1, 32768)? as usize,
        })
    }

    fn validate_message_bus(&self) -> Result<MessageBus, ConfigError> {
        let raw = &self.message_bus;
        let max_message_size = size("message_bus.max_message_size", &raw.max_message_size)?;
        Ok(MessageBus {
            max_batch: in_range("message_bus.max_batch", raw.max_batch, 1, 512)? as u32,
            max_message_size: in_range(
                "message_bus.max_message_size",
                max_message_size,
                wire::HEADER_SIZE as u64,
                u64::from(u32::MAX),
            )?,
            peer_queue_capacity: in_range(
                "message_bus.peer_queue_capacity",
                raw.peer_queue_capacity,
                1,
                1 << 20,
            )? as u32,
            reconnect_period: nonzero_duration(
                "message_bus.reconnect_period",
                &raw.reconnect_period,
            )?,
            close_peer_timeout: nonzero_duration(
                "message_bus.close_peer_timeout",
                &raw.close_peer_timeout,
            )?,
            close_grace: nonzero_duration("message_bus.close_grace", &raw.close_grace)?,
            handshake_grace: nonzero_duration("message_bus.handshake_grace", &raw.handshake_grace)?,
        })
    }

    fn validate_cluster(
        &self,
        overrides: &Overrides,
        system: &System,
        bus: &MessageBus,
    ) -> Result<Cluster, ConfigError> {
        let raw = &self.cluster;
        let lanes = in_range("cluster.replica_lanes", raw.replica_lanes, 1, 256)? as u16;
        let shards = system.sharding.shards();
        if usize::from(lanes) < shards {
            return Err(ConfigError::new(
                "cluster.replica_lanes",
                format!(
                    "{lanes} is below the node's {shards} shards: shards beyond the lane count \
                     would host no groups (spec README decision 2)"
                ),
            ));
        }
        if raw.name.trim().is_empty() {
            return Err(ConfigError::new("cluster.name", "must not be empty"));
        }
        let heartbeat_timeout =
            nonzero_duration("cluster.heartbeat_timeout", &raw.heartbeat_timeout)?;
        let commit_broadcast_interval = nonzero_duration(
            "cluster.commit_broadcast_interval",
            &raw.commit_broadcast_interval,
        )?;
        if heartbeat_timeout < Duration::from_secs(2)
            || heartbeat_timeout < 4 * commit_broadcast_interval
        {
            return Err(ConfigError::new(
                "cluster.heartbeat_timeout",
                "must be at least 2s and at least 4 x cluster.commit_broadcast_interval",
            ));
        }
        let view_change_retransmit_interval = nonzero_duration(
            "cluster.view_change_retransmit_interval",
            &raw.view_change_retransmit_interval,
        )?;
        let view_change_status_timeout = nonzero_duration(
            "cluster.view_change_status_timeout",
            &raw.view_change_status_timeout,
        )?;
        if view_change_status_timeout < 4 * view_change_retransmit_interval {
            return Err(ConfigError::new(
                "cluster.view_change_status_timeout",
                "must be at least 4 x cluster.view_change_retransmit_interval",
            ));
        }
        let repair_chunk_max = in_range("cluster.repair_chunk_max", raw.repair_chunk_max, 1, 1024)?;
        if repair_chunk_max >= u64::from(bus.peer_queue_capacity) {
            return Err(ConfigError::new(
                "cluster.repair_chunk_max",
                format!(
                    "{repair_chunk_max} must be below message_bus.peer_queue_capacity ({})",
                    bus.peer_queue_capacity
                ),
            ));
        }
        let wedged = duration(
            "cluster.superblock_wedged_fatal_timeout",
            &raw.superblock_wedged_fatal_timeout,
        )?;
        if !wedged.is_zero() && wedged < Duration::from_secs(30) {
            return Err(ConfigError::new(
                "cluster.superblock_wedged_fatal_timeout",
                "must be \"0\" (disabled) or at least 30s",
            ));
        }

        let dead_node = duration(
            "cluster.dead_node_session_timeout",
            &raw.dead_node_session_timeout,
        )?;
        if !dead_node.is_zero()
            && !(Duration::from_millis(500)..=Duration::from_secs(3600)).contains(&dead_node)
        {
            return Err(ConfigError::new(
                "cluster.dead_node_session_timeout",
                "must be \"0\" (disabled) or between 500ms and 1h",
            ));
        }

        // Authentication: the environment overrides the file's secret.
        let (secret_key, secret_value) = match &overrides.shared_secret_env {
            Some(value) => (SHARED_SECRET_ENV, value.as_str()),
            None => (
                "cluster.auth.shared_secret",
                raw.auth.shared_secret.as_str(),
            ),
        };
        let shared_secret = secret(secret_key, secret_value)?;
        let previous_shared_secret = secret(
            "cluster.auth.previous_shared_secret",
            &raw.auth.previous_shared_secret,
        )?;
        let (shared_secret, previous_shared_secret) = if raw.auth.enabled {
            if shared_secret.is_none() {
                return Err(ConfigError::new(
                    secret_key,
                    format!(
                        "is required (at least {SHARED_SECRET_MIN} bytes) when cluster.auth.enabled; \
                         prefer {SHARED_SECRET_ENV}"
                    ),
                ));
            }
            (shared_secret, previous_shared_secret)
        } else {
            (None, None)
        };
        let tls = if raw.tls.enabled {
            if !raw.auth.enabled {
                return Err(ConfigError::new(
                    "cluster.tls.enabled",
                    "requires cluster.auth.enabled",
                ));
            }
            if !raw.tls.self_signed {
                for (key, value) in [
                    ("cluster.tls.cert_file", &raw.tls.cert_file),
                    ("cluster.tls.key_file", &raw.tls.key_file),
                    ("cluster.tls.ca_file", &raw.tls.ca_file),
                ] {
                    if value.is_empty() {
                        return Err(ConfigError::new(
                            key,
                            "is required when TLS is on without self_signed",
                        ));
                    }
                }
            }
            Some(Tls {
                self_signed: raw.tls.self_signed,
                cert_file: optional_path(&raw.tls.cert_file),
                key_file: optional_path(&raw.tls.key_file),
                ca_file: optional_path(&raw.tls.ca_file),
            })
        } else {
            None
        };

        Ok(Cluster {
            enabled: raw.enabled,
            replica_lanes: lanes,
            name: raw.name.clone(),
            heartbeat_timeout,
            commit_broadcast_interval,
            prepare_retransmit_interval: nonzero_duration(
                "cluster.prepare_retransmit_interval",
                &raw.prepare_retransmit_interval,
            )?,
            view_change_retransmit_interval,
            view_change_status_timeout,
            request_start_view_retransmit_interval: nonzero_duration(
                "cluster.request_start_view_retransmit_interval",
                &raw.request_start_view_retransmit_interval,
            )?,
            view_probe_attempts_max: in_range(
                "cluster.view_probe_attempts_max",
                raw.view_probe_attempts_max,
                1,
                100,
            )? as u32,
            repair_retry_interval: nonzero_duration(
                "cluster.repair_retry_interval",
                &raw.repair_retry_interval,
            )?,
            repair_chunk_max: repair_chunk_max as u32,
            superblock_wedged_fatal_timeout: (!wedged.is_zero()).then_some(wedged),
            dead_node_session_timeout: (!dead_node.is_zero()).then_some(dead_node),
            shared_secret,
            previous_shared_secret,
            tls,
            skip_shard_zero_for_replicas: raw.coordinator.skip_shard_zero_for_replicas,
            skip_shard_zero_for_clients: raw.coordinator.skip_shard_zero_for_clients,
            nodes: self.validate_nodes()?,
        })
    }

    fn validate_nodes(&self) -> Result<Vec<Node>, ConfigError> {
        let raw = &self.cluster.nodes;
        if raw.len() > NODES_MAX {
            return Err(ConfigError::new(
                "cluster.nodes",
                format!("{} nodes; at most {NODES_MAX}", raw.len()),
            ));
        }
        let mut nodes: Vec<Node> = Vec::with_capacity(raw.len());
        let mut names = BTreeSet::new();
        let mut ids = BTreeMap::new();
        // (ip, port) -> the key that claimed it first.
        let mut bound: BTreeMap<(IpAddr, u16), String> = BTreeMap::new();
        for (i, node) in raw.iter().enumerate() {
            let key = |field: &str| format!("cluster.nodes[{i}].{field}");
            if node.name.trim().is_empty() {
                return Err(ConfigError::new(key("name"), "must not be empty"));
            }
            if !names.insert(node.name.clone()) {
                return Err(ConfigError::new(
                    key("name"),
                    format!("`{}` is used twice", node.name),
                ));
            }
            let ip: IpAddr = node.ip.trim().parse().map_err(|_| {
                ConfigError::new(key("ip"), format!("`{}` is not an IP address", node.ip))
            })?;
            if node.replica_id >= raw.len() as u64 {
                return Err(ConfigError::new(
                    key("replica_id"),
                    format!(
                        "{} is not below the roster size {}",
                        node.replica_id,
                        raw.len()
                    ),
                ));
            }
            if let Some(first) = ids.insert(node.replica_id, i) {
                return Err(ConfigError::new(
                    key("replica_id"),
                    format!(
                        "{} is also cluster.nodes[{first}].replica_id",
                        node.replica_id
                    ),
                ));
            }
            let mut port = |name: &str, value: Option<u64>, required: bool| {
                let k = key(&format!("ports.{name}"));
                let Some(value) = value else {
                    return if required {
                        Err(ConfigError::new(k, "is required"))
                    } else {
                        Ok(None)
                    };
                };
                let value = in_range(&k, value, 1, u64::from(u16::MAX))? as u16;
                // An unspecified address binds every interface, so it collides with any ip.
                let clash = bound.iter().find(|((other_ip, other_port), _)| {
                    *other_port == value
                        && (*other_ip == ip || other_ip.is_unspecified() || ip.is_unspecified())
                });
                if let Some((_, other)) = clash {
                    return Err(ConfigError::new(k, format!("{ip}:{value} is also {other}")));
                }
                bound.insert((ip, value), k);
                Ok(Some(value))
            };
            let ports = Ports {
                tcp: port("tcp", node.ports.tcp, true)?.expect("required"),
                quic: port("quic", node.ports.quic, false)?,
                http: port("http", node.ports.http, true)?.expect("required"),
                websocket: port("websocket", node.ports.websocket, false)?,
                tcp_replica: port("tcp_replica", node.ports.tcp_replica, true)?.expect("required"),
            };
            nodes.push(Node {
                name: node.name.clone(),
                ip,
                replica_id: node.replica_id as u8,
                ports,
                advertised_address: node.advertised_address.clone(),
            });
        }
        nodes.sort_by_key(|n| n.replica_id);
        Ok(nodes)
    }

    fn validate_metadata(&self, overrides: &Overrides) -> Result<Metadata, ConfigError> {
        let raw = &self.metadata;
        let depth = in_range(
            "metadata.prepare_queue_depth",
            raw.prepare_queue_depth,
            1,
            127,
        )?;
        let slots = raw.journal_slots;
        let floor = 4 * depth.max(64);
        if slots < floor || slots > u64::from(u32::MAX) {
            return Err(ConfigError::new(
                "metadata.journal_slots",
                format!(
                    "{slots} must be at least 4 x max(64, metadata.prepare_queue_depth) = {floor}"
                ),
            ));
        }
        let interval = raw.checkpoint_interval_ops;
        if interval < 8 || slots < 2 * interval + depth {
            return Err(ConfigError::new(
                "metadata.checkpoint_interval_ops",
                format!(
                    "{interval} must be at least 8, and metadata.journal_slots ({slots}) at least \
                     2 x it + metadata.prepare_queue_depth (docs/decisions.md 35)"
                ),
            ));
        }
        Ok(Metadata {
            prepare_queue_depth: depth as u32,
            journal_slots: slots as u32,
            clients_table_max: in_range(
                "metadata.clients_table_max",
                raw.clients_table_max,
                2,
                65536,
            )? as u32,
            checkpoint_interval_ops: interval,
            root: crate::metadata::RootCredentials::resolve(
                Some(&raw.root_username),
                Some(&raw.root_password.0),
                ("metadata.root_username", "metadata.root_password"),
                |var| match var {
                    crate::metadata::ENV_ROOT_USERNAME => overrides.root_username_env.clone(),
                    crate::metadata::ENV_ROOT_PASSWORD => {
                        overrides.root_password_env.as_ref().map(|s| s.0.clone())
                    }
                    _ => None,
                },
            )
            .map_err(|e| {
                let key = match &e {
                    crate::metadata::RootError::Username { origin, .. }
                    | crate::metadata::RootError::Password { origin, .. } => *origin,
                };
                let message = e.to_string();
                let message = message
                    .strip_prefix(&format!("{key}: "))
                    .unwrap_or(&message)
                    .to_owned();
                ConfigError::new(key, message)
            })?,
        })
    }

    fn validate_partition(&self, bus: &MessageBus) -> Result<Partition, ConfigError> {
        let raw = &self.partition;
        let mut topic_ack = BTreeMap::new();
        for (i, t) in raw.topic.iter().enumerate() {
            let value = ack(&format!("partition.topic[{i}].ack"), &t.ack)?;
            if topic_ack
                .insert((t.stream.clone(), t.topic.clone()), value)
                .is_some()
            {
                return Err(ConfigError::new(
                    format!("partition.topic[{i}]"),
                    format!("stream `{}` topic `{}` is listed twice", t.stream, t.topic),
                ));
            }
        }
        let evicted_bytes = size(
            "partition.evicted_ring_bytes_max",
            &raw.evicted_ring_bytes_max,
        )?;
        let evicted_bytes = in_range(
            "partition.evicted_ring_bytes_max",
            evicted_bytes,
            1,
            256 << 20,
        )?;
        let artifact = size(
            "partition.transfer_artifact_bytes_max",
            &raw.transfer_artifact_bytes_max,
        )?;
        let artifact_floor = (1 << 30) + bus.max_message_size;
        if artifact < artifact_floor {
            return Err(ConfigError::new(
                "partition.transfer_artifact_bytes_max",
                format!(
                    "{artifact} must be at least the largest segment (1 GiB) + \
                     message_bus.max_message_size = {artifact_floor}"
                ),
            ));
        }
        // A partition transfer's artifacts together are held to 1 TiB (state-transfer.md §3):
        // a larger per-artifact cap would be accepted and never reached.
        let artifact_ceiling = consensus::constants::PARTITION_TRANSFER_LEN_MAX;
        if artifact > artifact_ceiling {
            return Err(ConfigError::new(
                "partition.transfer_artifact_bytes_max",
                format!(
                    "{artifact} must not exceed a partition transfer's total cap, \
                     {artifact_ceiling} (1 TiB)"
                ),
            ));
        }
        let interval = raw.checkpoint_interval_ops;
        if interval != 0 && interval < 8 {
            return Err(ConfigError::new(
                "partition.checkpoint_interval_ops",
                format!("{interval} must be 0 (off) or at least 8"),
            ));
        }
        let wal_size = in_range(
            "partition.wal_size",
            size("partition.wal_size", &raw.wal_size)?,
            WAL_SIZE_MIN,
            WAL_SIZE_MAX,
        )?;
        if !wal_size.is_multiple_of(journal::storage::SECTOR as u64) {
            return Err(ConfigError::new(
                "partition.wal_size",
                format!(
                    "{wal_size} must be a multiple of the {} B sector",
                    journal::storage::SECTOR
                ),
            ));
        }
        let appending = bound_or_off(
            "partition.appending_bytes_max",
            size("partition.appending_bytes_max", &raw.appending_bytes_max)?,
        )?;
        let appending_shard = bound_or_off(
            "partition.appending_shard_bytes_max",
            size(
                "partition.appending_shard_bytes_max",
                &raw.appending_shard_bytes_max,
            )?,
        )?;
        if appending_shard != 0 && (appending == 0 || appending_shard < appending) {
            return Err(ConfigError::new(
                "partition.appending_shard_bytes_max",
                format!(
                    "{appending_shard} must be 0 (no bound) or at least \
                     partition.appending_bytes_max ({appending}, where 0 is no bound): one \
                     group alone may hold that much"
                ),
            ));
        }
        Ok(Partition {
            ack: ack("partition.ack", &raw.ack)?,
            topic_ack,
            prepare_queue_depth: in_range(
                "partition.prepare_queue_depth",
                raw.prepare_queue_depth,
                1,
                127,
            )? as u32,
            evicted_ring_capacity: in_range(
                "partition.evicted_ring_capacity",
                raw.evicted_ring_capacity,
                1,
                65536,
            )? as u32,
            evicted_ring_bytes_max: evicted_bytes,
            transfer_served_cache_bytes_max: size(
                "partition.transfer_served_cache_bytes_max",
                &raw.transfer_served_cache_bytes_max,
            )?,
            transfer_artifact_bytes_max: artifact,
            checkpoint_interval_ops: interval,
            read_cache_bytes: in_range(
                "partition.read_cache_bytes",
                size("partition.read_cache_bytes", &raw.read_cache_bytes)?,
                64 << 10,
                4 << 30,
            )?,
            read_cache_shard_bytes: in_range(
                "partition.read_cache_shard_bytes",
                size(
                    "partition.read_cache_shard_bytes",
                    &raw.read_cache_shard_bytes,
                )?,
                1 << 20,
                256 << 30,
            )?,
            wal_size,
            appending_bytes_max: appending,
            appending_shard_bytes_max: appending_shard,
        })
    }
}

/// A byte bound where 0 turns it off: 0, or 1 MiB..=64 GiB (below a MiB a backlog would hold
/// less than one ordinary batch).
fn bound_or_off(key: &str, bytes: u64) -> Result<u64, ConfigError> {
    if bytes == 0 {
        return Ok(0);
    }
    in_range(key, bytes, 1 << 20, 64 << 30)
}

// ---------------------------------------------------------------------------------------------
// `strand dev`: an N-node cluster on loopback.

/// The settings every `strand dev` node shares; the roster is appended by [`dev_config`].
pub const DEV_CONFIG: &str = include_str!("dev.toml");

/// The default ports of node 0; node `i` listens on each plus `DEV_PORT_STEP * i`.
pub const DEV_BASE_PORTS: Ports = Ports {
    tcp: 8090,
    quic: Some(8080),
    http: 3000,
    websocket: Some(8092),
    tcp_replica: 9090,
};
/// Port distance between `strand dev` nodes.
pub const DEV_PORT_STEP: u16 = 100;
/// Most nodes `strand dev` starts (ports stay distinct and below 65536).
pub const DEV_REPLICAS_MAX: u8 = 9;

/// The config text of a `strand dev` cluster of `replicas` nodes on 127.0.0.1.
pub fn dev_config(replicas: u8, congestion: Option<&shard::net::CongestionControl>) -> String {
    let mut text = DEV_CONFIG.to_string();
    text.push_str(&network_section(congestion));
    for i in 0..replicas {
        let step = DEV_PORT_STEP * u16::from(i);
        let p = DEV_BASE_PORTS;
        text.push_str(&format!(
            "\n[[cluster.nodes]]\nname = \"strand-dev-{i}\"\nip = \"127.0.0.1\"\nreplica_id = {i}\n\
             ports = {{ tcp = {}, quic = {}, http = {}, websocket = {}, tcp_replica = {} }}\n",
            p.tcp + step,
            p.quic.expect("set") + step,
            p.http + step,
            p.websocket.expect("set") + step,
            p.tcp_replica + step,
        ));
    }
    text
}

#[cfg(test)]
mod tests;
