//! The `strand` binary's library side, so the binary and tests read them the same way: the
//! node configuration (architecture.md §10), boot from disk ([`boot`]), the metadata group's
//! pump and effect executor ([`metadata_group`]), the metrics endpoint ([`metrics`]); the
//! client plane's codecs ([`client`]); the metadata state machine and its lock-free read handle
//! ([`metadata`]); the partition plane's poll and consumer-offset logic ([`partition`]).

pub mod bench;
pub mod boot;
pub mod catch_up;
pub mod client;
pub mod client_core;
pub mod config;
pub mod forward_metrics;
pub mod groups;
pub mod inbox_bound;
pub mod memory;
pub mod metadata;
pub mod metadata_group;
pub mod metrics;
pub mod partition;
pub mod partition_group;
pub mod rejoin_mark;
pub mod reply_gate;
pub mod routing;
pub mod session_reaper;
pub mod shard_msg;
pub mod timeline;
pub mod wal_size;
pub mod wiring;

/// Exit status of a node stopped by a fatal failure (the core's `Effect::Fatal`, or a storage
/// failure it cannot survive); the log line before it names the cause.
pub const EXIT_FATAL: u8 = 3;

/// A fresh, empty directory for a unit test: `strand-{tag}-{pid}` in the system's temporary
/// directory, emptied first if a run before left it.
#[cfg(test)]
pub(crate) fn scratch_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("strand-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

/// Sealed prepare frames for unit tests.
#[cfg(test)]
pub(crate) mod test_frames {
    use wire::GroupId;
    use wire::header::{FrameHeader, Layout, PrepareHeader};
    use wire::{Command, Operation, Sender};

    /// The partition group (stream 1, topic 2, partition 3) of the partition unit tests.
    pub(crate) fn partition_group() -> GroupId {
        GroupId::partition(wire::PartitionKey {
            stream: 1,
            topic: 2,
            partition: 3,
        })
        .expect("a partition key in range")
    }

    /// A sealed metadata prepare of `op` over `parent`; `salt` varies the body.
    pub(crate) fn prepare(op: u64, parent: u128, salt: u8) -> Vec<u8> {
        let mut header = PrepareHeader::zeroed();
        header.frame = FrameHeader::new(
            Command::Prepare,
            Sender {
                cluster: 42,
                replica: 0,
                view: 1,
            },
        );
        header.op.set(op);
        header.parent.set(parent);
        header.commit.set(op - 1);
        header.timestamp.set(1_000 + op);
        header.operation = Operation::CreateStream.byte();
        header.group.set(GroupId::METADATA.0);
        let body = vec![salt; 100];
        wire::encode::finish_header(&mut header, &body).unwrap();
        let mut frame = header.bytes().to_vec();
        frame.extend_from_slice(&body);
        frame
    }
}
