//! Clearing the stamp's rejoin mark (decision 290, refining 240).
//!
//! A directory formatted by `--rejoin` records the rejoin in its stamp, and while it does,
//! every group that boots without a superblock boots in lost state. Only groups created by a
//! metadata op committed before the wipe can have acknowledged anything in the old life. The
//! metadata replica, once normal and out of lost state in some view, holds in its log every op
//! committed before that view began, so every such op is at or below its op head `H` then. So
//! once the metadata replica applied up to `H` and every partition group its metadata names has
//! its own durable superblock on its shard (lost or normal: the group's own record from then
//! on), no group that could have acknowledged in the old life depends on the stamp any more,
//! and a group that boots without a superblock later was created after the wipe. The watcher
//! then rewrites the stamp without the rejoin (durably) and tells every shard, and groups
//! created afterwards boot fresh (they vote and ack at once).
//!
//! Everything the watcher reads is this node's own: the metadata replica's published state,
//! the committed metadata view, and each shard's set of groups whose superblock landed.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tracing::{info, warn};

use crate::metadata::view::{MetadataReader, MetadataView};
use crate::metrics::Gauges;
use crate::partition_group::PartitionGauges;

/// How often the watcher looks.
pub const POLL: Duration = Duration::from_millis(100);

/// The first partition group `view` names whose superblock has not landed on its shard
/// (`marked(shard, group)`), or `None` when every one has.
pub fn first_unmarked(
    view: &MetadataView,
    lanes: u16,
    shards: u16,
    marked: impl Fn(u16, u64) -> bool,
) -> Option<u64> {
    for stream in view.state.streams.values() {
        for topic in stream.topics.values() {
            for partition in &topic.partitions {
                let Some(group) = topic.group(stream.id, partition.id) else {
                    continue;
                };
                let shard = shard::mapping::shard_of(group, lanes, shards);
                if !marked(shard, group.0) {
                    return Some(group.0);
                }
            }
        }
    }
    None
}

/// The rule, one observation at a time.
#[derive(Debug, Default)]
pub struct Clearing {
    /// The metadata replica's op head when first seen normal and out of lost state.
    head: Option<u64>,
}

impl Clearing {
    /// Whether the mark may go now: `unlost_head` is the metadata replica's published op head
    /// while normal and not lost ([`Gauges::unlost_head`]), `applied` the highest op its state
    /// machine applied ([`Gauges::commit_min`]), `view` the committed metadata read after
    /// `applied` (it holds every state change up to `applied`; an op that changes no state,
    /// a login, publishes no new view).
    pub fn ready(
        &mut self,
        unlost_head: Option<u64>,
        applied: u64,
        view: &MetadataView,
        lanes: u16,
        shards: u16,
        marked: impl Fn(u16, u64) -> bool,
    ) -> bool {
        if self.head.is_none() {
            self.head = unlost_head;
        }
        let Some(head) = self.head else {
            return false;
        };
        applied >= head && first_unmarked(view, lanes, shards, marked).is_none()
    }
}

/// What the watcher needs.
pub struct Watcher {
    /// The data directory (its stamp is rewritten).
    pub data: PathBuf,
    /// The metadata replica's published state.
    pub gauges: Arc<Gauges>,
    /// The committed metadata.
    pub metadata: MetadataReader,
    /// Every shard's partition gauges, by shard id.
    pub partitions: Vec<Arc<PartitionGauges>>,
    /// `cluster.replica_lanes`.
    pub lanes: u16,
    /// Whether the node is stopping.
    pub stopping: Box<dyn Fn() -> bool + Send>,
}

/// Starts the watcher on a thread of its own (it writes a small file once; off the shards).
pub fn spawn(watcher: Watcher) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("rejoin-mark".into())
        .spawn(move || run(watcher))
}

fn run(w: Watcher) {
    let shards = w.partitions.len() as u16;
    let mut clearing = Clearing::default();
    while !(w.stopping)() {
        let unlost_head = w.gauges.unlost_head();
        let applied = w.gauges.commit_min();
        let view = w.metadata.view();
        let ready = clearing.ready(unlost_head, applied, &view, w.lanes, shards, |s, g| {
            w.partitions
                .get(usize::from(s))
                .is_some_and(|p| p.marked.load().contains(&g))
        });
        if ready {
            match crate::boot::clear_rejoin(&w.data) {
                Ok(()) => {
                    for p in &w.partitions {
                        p.rejoin_cleared.store(true, Ordering::Release);
                    }
                    info!(
                        applied,
                        head = clearing.head,
                        "every group of the old life carries its own mark; the stamp's rejoin \
                         is cleared (decision 290)"
                    );
                }
                Err(e) => warn!(error = %e, "clearing the stamp's rejoin failed; it stays"),
            }
            return;
        }
        drop(view);
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use consensus::WholeArtifacts;
    use wire::header::{Layout, PrepareHeader};

    use super::*;
    use crate::client::codec::{Identifier, Name, Options};
    use crate::client::request::{CreateTopic, Request};
    use crate::metadata::password::HashParams;
    use crate::metadata::{Genesis, MetadataStateMachine, RootCredentials};

    /// The committed metadata after stream 0 and a topic of `partitions` partitions.
    fn view(partitions: u32) -> MetadataView {
        let mut sm = MetadataStateMachine::new(&Genesis {
            cluster_id: 0xC1,
            root: RootCredentials::resolve(None, None, ("a", "b"), |_| None).unwrap(),
            params: HashParams::TEST,
        })
        .unwrap();
        let requests = [
            Request::CreateStream {
                name: Name::new("s").unwrap(),
                options: Options::default(),
            },
            Request::CreateTopic(CreateTopic {
                stream: Identifier::Numeric(0),
                partitions_count: partitions,
                name: Name::new("t").unwrap(),
                options: Options::default(),
            }),
        ];
        for (op, request) in requests.iter().enumerate() {
            let (operation, _) = request.operation();
            let mut body = Vec::new();
            request.encode(&mut body);
            let projection = sm.project(operation, &body);
            let mut h = PrepareHeader::zeroed();
            h.op.set(op as u64 + 1);
            h.timestamp.set(1000);
            h.operation = projection.operation.byte();
            h.user_id.set(crate::metadata::ROOT_USER_ID);
            sm.apply(&h, &projection.body, &mut Vec::new());
        }
        MetadataView::clone(&sm.reader().view())
    }

    /// Decision 290: the mark goes only when the metadata replica was seen normal and out of
    /// lost state, applied up to its op head then, and every group its metadata names is
    /// marked on its shard; the head is the first one seen.
    #[test]
    fn the_mark_goes_only_when_the_old_life_is_covered() {
        let view = view(3);
        let groups: Vec<u64> = {
            let stream = &view.state.streams[&0];
            let topic = stream.topics.values().next().unwrap();
            topic
                .partitions
                .iter()
                .map(|p| topic.group(stream.id, p.id).unwrap().0)
                .collect()
        };
        assert_eq!(groups.len(), 3);
        let all = |_: u16, _: u64| true;
        let all_but_last = |_: u16, g: u64| g != groups[2];
        let mut c = Clearing::default();
        // Lost (or not normal): no head, never ready, whatever is marked.
        assert!(!c.ready(None, 100, &view, 16, 2, all));
        // Normal at head 7: ready once applied reaches 7 and every group is marked.
        assert!(!c.ready(Some(7), 6, &view, 16, 2, all));
        assert!(!c.ready(Some(7), 7, &view, 16, 2, all_but_last));
        assert_eq!(first_unmarked(&view, 16, 2, all_but_last), Some(groups[2]));
        // A later head does not move the first one.
        assert!(c.ready(Some(50), 7, &view, 16, 2, all));
        // The shard asked about is the group's own.
        let on_own_shard = |s: u16, g: u64| s == shard::mapping::shard_of(wire::GroupId(g), 16, 2);
        assert!(first_unmarked(&view, 16, 2, on_own_shard).is_none());
        let on_shard_zero = |s: u16, _: u64| s == 0;
        let spread = groups
            .iter()
            .any(|&g| shard::mapping::shard_of(wire::GroupId(g), 16, 2) != 0);
        assert_eq!(
            first_unmarked(&view, 16, 2, on_shard_zero).is_some(),
            spread
        );
    }
}
