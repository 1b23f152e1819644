//! The storage task's side of group removal (decision 342), over in-memory disks across
//! reboots: a node that missed a delete (and the key's reuse) removes the dead incarnation at
//! boot and boots the live one empty; a retired group is removed with its WAL records; a crash
//! in the middle of a removal (the marker left, the rest partly gone) is finished by the next
//! boot without an error.

use super::*;
use crate::client::codec::Name;
use crate::metadata::state::{Partition, State, Stream, Topic};
use crate::metadata::topic::{TopicSettings, derive};
use crate::metadata::view::{MetadataHandle, MetadataView};
use crate::partition::lifecycle::{marker_name, open_marker};
use journal::MemStorage;
use wire::PartitionKey;

const KEY: PartitionKey = PartitionKey {
    stream: 0,
    topic: 0,
    partition: 0,
};

fn key() -> u64 {
    GroupId::partition(KEY).unwrap().0
}

/// A view where partition 0 of topic 0 of stream 0 is live as `live`, or retired as `retired`.
fn reader(live: Option<u64>, retired: Option<u64>) -> MetadataReader {
    let mut state = State::default();
    let topic = Topic {
        id: 0,
        name: Name::new("t").unwrap(),
        created_at: 0,
        explicit: Default::default(),
        derived: derive(&Default::default()),
        settings: TopicSettings::DEFAULT,
        partitions: live
            .map(|g| Partition {
                id: 0,
                created_at: 0,
                consensus_group_id: g,
            })
            .into_iter()
            .collect(),
    };
    state.streams.insert(
        0,
        Stream {
            id: 0,
            name: Name::new("s").unwrap(),
            created_at: 0,
            topics: BTreeMap::from([(0, topic)]),
        },
    );
    if let Some(r) = retired {
        state.retired.insert(key(), r);
    }
    let handle = Arc::new(MetadataHandle::default());
    handle.publish(MetadataView { op: 1, state });
    MetadataReader::new(handle)
}

/// What one life of the storage task did.
#[derive(Debug, Default)]
struct Life {
    /// `(incarnation, replayed frames)` of every Booted event.
    booted: Vec<(Option<u64>, usize)>,
    removed: usize,
    fatal: Option<String>,
}

/// Boots the shard over `parts`/`wal`, boots the group (again after a removal when the view
/// wants the key, as the pump does on `Removed`), appends `appends` ops, and shuts down.
async fn life(
    parts: &MemStorage,
    wal: &MemStorage,
    metadata: MetadataReader,
    appends: u64,
) -> Life {
    let super::tests::TestTask {
        mut task,
        queues,
        inbox,
        fatal,
        ..
    } = super::tests::test_task(wal, parts, metadata).await;
    let mut life = Life::default();
    task.boot_group(key(), FlushPolicy::default()).await;
    // The pump boots a removed key again only when the metadata wants it.
    let wanted = task.metadata.view().state.live_incarnation(key()).is_some();
    if !task.groups.contains_key(&key()) && wanted {
        task.boot_group(key(), FlushPolicy::default()).await;
    }
    if task.groups.contains_key(&key()) {
        for op in 1..=appends {
            let frame = super::tests::prepare(key(), op);
            queues.push(key(), PartitionStorageOp::Append { op, frame });
        }
    }
    queues.closed.set(true);
    task.run().await;
    while let Some((_, e)) = inbox.pop() {
        match e {
            Event::Booted(b) => life.booted.push((b.incarnation, b.recovered.frames.len())),
            Event::Removed { .. } => life.removed += 1,
            _ => {}
        }
    }
    life.fatal = fatal.borrow().clone();
    life
}

/// Runs `test` on a glommio executor with fresh partition and WAL disks.
fn on_disks<F: Future<Output = ()>>(
    test: impl FnOnce(MemStorage, MemStorage) -> F + Send + 'static,
) {
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .io_memory(256 << 10)
        .spawn(move || async move { test(MemStorage::new(), MemStorage::new()).await })
        .unwrap()
        .join()
        .unwrap();
}

async fn files(parts: &MemStorage) -> Vec<String> {
    let prefix = group_prefix(key());
    parts
        .list()
        .await
        .unwrap()
        .into_iter()
        .filter(|n| n.contains(&prefix))
        .collect()
}

async fn marker(parts: &MemStorage) -> Option<u64> {
    open_marker(parts.clone(), &group_prefix(key()))
        .await
        .unwrap()
        .1
}

#[test]
fn a_missed_delete_and_reuse_removes_the_dead_incarnation_at_boot() {
    on_disks(|parts, wal| async move {
        // Life 1: the key is live as incarnation 5; the marker is written before any append.
        let first = life(&parts, &wal, reader(Some(5), None), 3).await;
        assert_eq!(first.fatal, None);
        assert_eq!(first.booted, vec![(Some(5), 0)]);
        assert_eq!(marker(&parts).await, Some(5));
        // Life 2, the view unchanged: its three prepares replay.
        let second = life(&parts, &wal, reader(Some(5), None), 0).await;
        assert_eq!(second.booted, vec![(Some(5), 3)]);
        assert_eq!(second.removed, 0);
        // Life 3: while it was down the topic was deleted and made again (incarnation 9). The old
        // incarnation goes, WAL records included; the new one boots empty.
        let third = life(&parts, &wal, reader(Some(9), None), 2).await;
        assert_eq!(third.fatal, None);
        assert_eq!(third.removed, 1);
        assert_eq!(third.booted, vec![(Some(9), 0)]);
        assert_eq!(marker(&parts).await, Some(9));
        // Life 4: only incarnation 9's two prepares replay.
        let fourth = life(&parts, &wal, reader(Some(9), None), 0).await;
        assert_eq!(fourth.booted, vec![(Some(9), 2)]);
        // Life 5: retired at 9: removed, nothing booted, no file of the group left.
        let fifth = life(&parts, &wal, reader(None, Some(9)), 0).await;
        assert_eq!((fifth.removed, fifth.booted.len()), (1, 0), "{fifth:?}");
        assert_eq!(files(&parts).await, Vec::<String>::new());
    });
}

/// A view that lags (the key unknown, or live with an older incarnation than the disk's)
/// never removes anything.
#[test]
fn a_lagging_view_removes_nothing() {
    on_disks(|parts, wal| async move {
        life(&parts, &wal, reader(Some(5), None), 2).await;
        for view in [
            reader(None, None),
            reader(Some(4), None),
            reader(None, Some(4)),
        ] {
            let l = life(&parts, &wal, view, 0).await;
            assert_eq!(l.removed, 0);
            assert_eq!(l.booted, vec![(Some(5), 2)]);
        }
    });
}

/// A crash after the superblock and segments went but before the marker did: the next boot
/// sees the marker, proves the incarnation dead and finishes; a crash after the segments but
/// before the superblock: the same.
#[test]
fn a_removal_cut_short_is_finished_by_the_next_boot() {
    for keep_superblock in [false, true] {
        on_disks(move |parts, wal| async move {
            life(&parts, &wal, reader(Some(5), None), 2).await;
            let prefix = group_prefix(key());
            for name in files(&parts).await {
                let is_marker = name.starts_with(&marker_name(&prefix));
                let is_superblock = name == format!("{prefix}superblock");
                let kept = is_marker || (keep_superblock && is_superblock);
                if !kept {
                    parts.remove(&name).await.unwrap();
                }
            }
            let l = life(&parts, &wal, reader(None, Some(5)), 0).await;
            assert_eq!(l.fatal, None);
            assert_eq!((l.removed, l.booted.len()), (1, 0), "{l:?}");
            assert_eq!(files(&parts).await, Vec::<String>::new());
        });
    }
}
