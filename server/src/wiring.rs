//! The validated node config turned into the settings of the parts it runs: the replica
//! plane's [`NetConfig`] and the metadata group's [`consensus::Config`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use consensus::{GroupId, RawConfig, ReplicaId};
use shard::net::tls::TlsConfig;
use shard::net::{NetConfig, Peer};
use wire::handshake::Keys;

use crate::boot::METADATA_SLOT_SIZE;
use crate::config::Config;

/// The replica plane's settings (auth keys and TLS material loaded here).
pub fn net_config(config: &Config) -> anyhow::Result<NetConfig> {
    let roster = config
        .cluster
        .nodes
        .iter()
        .map(|n| Peer {
            id: n.replica_id,
            name: n.name.clone(),
            addr: SocketAddr::new(n.ip, n.ports.tcp_replica),
        })
        .collect();
    let mut net = NetConfig::new(
        wire::cluster_id(&config.cluster.name),
        config.replica_id,
        roster,
    );
    net.lanes = config.cluster.replica_lanes;
    if let Some(secret) = &config.cluster.shared_secret {
        let keys = Keys::new(secret, config.cluster.previous_shared_secret.as_deref())
            .map_err(|e| anyhow::anyhow!("config key `cluster.auth.shared_secret`: {e}"))?;
        net.auth = Some(keys);
    }
    if let Some(tls) = &config.cluster.tls {
        let built = if tls.self_signed {
            TlsConfig::self_signed(&config.node().name)
        } else {
            let need = |p: &Option<std::path::PathBuf>, key: &str| {
                p.clone()
                    .with_context(|| format!("config key `cluster.tls.{key}` is required"))
            };
            TlsConfig::from_files(
                &need(&tls.cert_file, "cert_file")?,
                &need(&tls.key_file, "key_file")?,
                &need(&tls.ca_file, "ca_file")?,
            )
        }
        .map_err(|e| anyhow::anyhow!("config key `cluster.tls`: {e}"))?;
        net.tls = Some(Arc::new(built));
    }
    net.handshake_grace = config.message_bus.handshake_grace;
    net.reconnect_period = config.message_bus.reconnect_period;
    net.max_message_size = usize::try_from(config.message_bus.max_message_size)
        .context("message_bus.max_message_size")?;
    net.peer_queue_capacity = config.message_bus.peer_queue_capacity as usize;
    net.max_batch = config.message_bus.max_batch as usize;
    net.congestion = config.network.tcp_congestion_control.clone();
    Ok(net)
}

/// Whole 10 ms ticks in `d`, at least 1.
fn ticks(d: Duration) -> u64 {
    (d.as_millis() / u128::from(consensus::constants::TICK_MS)).max(1) as u64
}

/// What every group's core config takes from the cluster's timers and the message bus: the
/// request queue (twice the prepare queue, set before), retransmit, heartbeat, view-change and
/// repair intervals in ticks, and the peer queue capacity.
fn cluster_settings(raw: &mut RawConfig, config: &Config) {
    let c = &config.cluster;
    raw.request_queue_depth = 2 * raw.prepare_queue_depth;
    raw.prepare_retransmit_ticks = ticks(c.prepare_retransmit_interval);
    raw.commit_broadcast_ticks = ticks(c.commit_broadcast_interval);
    raw.heartbeat_timeout_ticks = ticks(c.heartbeat_timeout);
    raw.view_change_retransmit_ticks = ticks(c.view_change_retransmit_interval);
    raw.view_change_status_timeout_ticks = ticks(c.view_change_status_timeout);
    raw.request_start_view_ticks = ticks(c.request_start_view_retransmit_interval);
    raw.view_probe_attempts_max = c.view_probe_attempts_max;
    raw.repair_retry_ticks = ticks(c.repair_retry_interval);
    raw.repair_chunk_max = c.repair_chunk_max;
    raw.peer_queue_capacity = config.message_bus.peer_queue_capacity;
}

/// The metadata group's core config for this node.
pub fn metadata_config(config: &Config) -> anyhow::Result<consensus::Config> {
    let c = &config.cluster;
    let mut raw = RawConfig::new(
        wire::cluster_id(&c.name),
        ReplicaId(config.replica_id),
        u8::try_from(c.nodes.len()).context("roster size")?,
        GroupId::METADATA,
    );
    let m = &config.metadata;
    raw.prepare_queue_depth = m.prepare_queue_depth as usize;
    cluster_settings(&mut raw, config);
    // The journal's slot bounds the metadata prepares this node can hold.
    raw.max_message_size =
        usize::try_from(config.message_bus.max_message_size.min(METADATA_SLOT_SIZE))
            .context("message_bus.max_message_size")?;
    raw.clients_table_max = m.clients_table_max as usize;
    raw.checkpoint_interval_ops = m.checkpoint_interval_ops;
    raw.journal_slot_count = u64::from(m.journal_slots);
    // The primary holds a purge's or a delete's reply until enough replicas applied it; their
    // PrepareOks tell it how far they did (decision 395).
    raw.acks_carry_applied = true;
    raw.validate()
        .map_err(|e| anyhow::anyhow!("the metadata group's consensus config: {e}"))
}

/// The partition groups' core config template for this node (`partition.*` and the cluster
/// timers; the pump sets each group's id). `partition.ack = "memory"` turns on `memory_ack`;
/// the pump applies `[[partition.topic]]` overrides per group (decision 165).
pub fn partition_config(config: &Config) -> anyhow::Result<RawConfig> {
    let c = &config.cluster;
    let any_partition = GroupId::partition(wire::PartitionKey {
        stream: 0,
        topic: 0,
        partition: 0,
    })
    .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let mut raw = RawConfig::new(
        wire::cluster_id(&c.name),
        ReplicaId(config.replica_id),
        u8::try_from(c.nodes.len()).context("roster size")?,
        any_partition,
    );
    let p = &config.partition;
    raw.prepare_queue_depth = p.prepare_queue_depth as usize;
    cluster_settings(&mut raw, config);
    raw.max_message_size = usize::try_from(config.message_bus.max_message_size)
        .context("message_bus.max_message_size")?;
    raw.checkpoint_interval_ops = p.checkpoint_interval_ops;
    raw.memory_ack = p.ack == crate::config::Ack::Memory && raw.replica_count >= 3;
    raw.transfer_artifact_bytes_max = p.transfer_artifact_bytes_max;
    raw.appending_bytes_max = p.appending_bytes_max;
    raw.clone()
        .validate()
        .map_err(|e| anyhow::anyhow!("the partition groups' consensus config: {e}"))?;
    Ok(raw)
}
