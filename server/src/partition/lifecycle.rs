//! Partition groups leaving a node (decision 342): which incarnation of a group key a node's
//! disk holds, whether the committed metadata proves it dead, and the removal of its files in
//! an order a crash at any point survives.
//!
//! Group keys are reused (streams and topics take the lowest free slot, partitions `0..n`,
//! client-plane.md §5), so "this key is not in the metadata" does not mean "this data is dead":
//! the node's metadata view may lag behind a CreateTopic that made it. Each group's directory
//! therefore records its *incarnation*, the partition's `consensus_group_id` (unique, never
//! reused), in `incarnation-{prefix}.{0,1}`, written durably before the group journals
//! anything; the metadata records every deleted incarnation (`State::retired`). A group is
//! removed only when the view proves its incarnation dead: retired at or above it, or the key
//! live again with a later one. A view that knows nothing newer leaves it alone.
//!
//! Removal order, each step durable before the next:
//! 1. the pump drops the group's replica (it sends and journals nothing more);
//! 2. a WAL truncate record for the group from op 0: replay never returns its prepares again,
//!    so the WAL no longer holds them (they leave reclaim accounting with the group's state);
//! 3. segments, indexes, offsets and staging files removed;
//! 4. the superblock removed;
//! 5. the incarnation marker removed, last.
//!
//! A crash before 5 leaves the marker, so the next boot finds the incarnation and removes the
//! rest (the boot checks before it recovers the group); a crash between 3 and 4 leaves a
//! superblock without its segments, which that check removes before anything reads it. After
//! 5 nothing of the group is left; its WAL records, if the truncate was not reclaimed yet,
//! replay to nothing.

use journal::pingpong::PingPong;
use journal::storage::{Storage, StorageError};

use crate::metadata::state::State;

/// Magic of the incarnation marker.
const MARKER_MAGIC: u32 = u32::from_le_bytes(*b"INC1");

/// What the committed metadata says about the incarnation a node's disk holds for a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The key is live with this incarnation, and the disk holds it or nothing recorded yet.
    Live(u64),
    /// The disk's incarnation is proven deleted: remove the group.
    Dead,
    /// Nothing proves it either way (the view may lag): keep the group as it is.
    Unknown,
}

/// The incarnation tag a group carries in bits 52..62 of every frame's `group` (decision
/// 375): `1..=2047`, never 0, so an untagged frame never reaches a tagged group. Consecutive
/// incarnations of one key always differ (a purge skips an id whose tag would repeat, see
/// `metadata::lifecycle`).
pub const fn incarnation_tag(incarnation: u64) -> u16 {
    (incarnation % wire::group::TAG_MAX as u64) as u16 + 1
}

/// The verdict for group key `group` whose disk records `on_disk` (`None`: no marker).
pub fn verdict(state: &State, group: u64, on_disk: Option<u64>) -> Verdict {
    if let Some(live) = state.live_incarnation(group) {
        return match on_disk {
            None => Verdict::Live(live),
            Some(mine) if mine == live => Verdict::Live(live),
            Some(mine) if mine < live => Verdict::Dead,
            Some(_) => Verdict::Unknown,
        };
    }
    match (state.retired.get(&group), on_disk) {
        (Some(retired), Some(mine)) if mine <= *retired => Verdict::Dead,
        _ => Verdict::Unknown,
    }
}

/// The marker's file name stem. Outside the group's prefix on purpose: the journal refuses
/// to format a superblock beside files of its prefix that hold data, and the marker is
/// written before the superblock exists.
pub fn marker_name(prefix: &str) -> String {
    format!("incarnation-{prefix}")
}

/// Opens a group's incarnation marker: the store and the incarnation it records.
pub async fn open_marker<S: Storage>(
    storage: S,
    prefix: &str,
) -> Result<(PingPong<S>, Option<u64>), StorageError> {
    let (store, payload, _) = PingPong::open(storage, &marker_name(prefix), MARKER_MAGIC).await?;
    let incarnation = payload
        .as_deref()
        .and_then(|p| p.try_into().ok())
        .map(u64::from_le_bytes);
    Ok((store, incarnation))
}

/// Records `incarnation` durably.
pub async fn write_marker<S: Storage>(
    store: &mut PingPong<S>,
    incarnation: u64,
) -> Result<(), StorageError> {
    store.write(&incarnation.to_le_bytes(), true).await
}

/// Removes every file of the group with `prefix` in the order above (steps 3-5); the WAL
/// truncate (step 2) is the caller's. Returns the number of files removed. Idempotent: a
/// second call after a crash removes what is left.
pub async fn remove_files<S: Storage>(storage: &S, prefix: &str) -> Result<usize, StorageError> {
    let names = storage.list().await?;
    let superblock = format!("{prefix}superblock");
    let marker = marker_name(prefix);
    let staging = format!("staging-{prefix}");
    let mine =
        |n: &String| n.starts_with(prefix) || n.starts_with(&staging) || n.starts_with(&marker);
    let rank = |n: &str| {
        if n.starts_with(&marker) {
            2
        } else if n == superblock {
            1
        } else {
            0
        }
    };
    let mut doomed: Vec<&String> = names.iter().filter(|n| mine(n)).collect();
    doomed.sort_by_key(|n| rank(n));
    for name in &doomed {
        storage.remove(name).await?;
    }
    Ok(doomed.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::state::{Partition, Stream, Topic};
    use crate::metadata::topic::{TopicSettings, derive};
    use journal::MemStorage;
    use journal::storage::{OpenMode, block_on};
    use std::collections::BTreeMap;
    use wire::{GroupId, PartitionKey};

    fn key(partition: u32) -> u64 {
        GroupId::partition(PartitionKey {
            stream: 0,
            topic: 0,
            partition,
        })
        .unwrap()
        .0
    }

    fn state(live: &[u64], retired: &[(u32, u64)]) -> State {
        let mut s = State::default();
        let topic = Topic {
            id: 0,
            name: crate::client::codec::Name::new("t").unwrap(),
            created_at: 0,
            explicit: Default::default(),
            derived: derive(&Default::default()),
            settings: TopicSettings::DEFAULT,
            partitions: live
                .iter()
                .enumerate()
                .map(|(id, g)| Partition {
                    id: id as u32,
                    created_at: 0,
                    consensus_group_id: *g,
                })
                .collect(),
        };
        s.streams.insert(
            0,
            Stream {
                id: 0,
                name: crate::client::codec::Name::new("s").unwrap(),
                created_at: 0,
                topics: BTreeMap::from([(0, topic)]),
            },
        );
        s.retired = retired.iter().map(|(p, g)| (key(*p), *g)).collect();
        s
    }

    #[test]
    fn only_a_proven_dead_incarnation_is_removed() {
        // Partition 0 live as incarnation 5, partition 1 retired at 3, partition 2 unknown.
        let s = state(&[5], &[(1, 3)]);
        assert_eq!(verdict(&s, key(0), None), Verdict::Live(5));
        assert_eq!(verdict(&s, key(0), Some(5)), Verdict::Live(5));
        assert_eq!(verdict(&s, key(0), Some(4)), Verdict::Dead, "recreated key");
        assert_eq!(
            verdict(&s, key(0), Some(6)),
            Verdict::Unknown,
            "view behind"
        );
        assert_eq!(verdict(&s, key(1), Some(3)), Verdict::Dead);
        assert_eq!(verdict(&s, key(1), Some(2)), Verdict::Dead);
        assert_eq!(
            verdict(&s, key(1), Some(4)),
            Verdict::Unknown,
            "view behind"
        );
        assert_eq!(verdict(&s, key(1), None), Verdict::Unknown, "no marker");
        assert_eq!(verdict(&s, key(2), Some(1)), Verdict::Unknown);
    }

    #[test]
    fn the_marker_round_trips_and_removal_takes_every_file_marker_last() {
        let disk = MemStorage::new();
        let prefix = "p0000000000000007-";
        block_on(async {
            let (mut store, found) = open_marker(disk.clone(), prefix).await.unwrap();
            assert_eq!(found, None);
            write_marker(&mut store, 42).await.unwrap();
            let (_, found) = open_marker(disk.clone(), prefix).await.unwrap();
            assert_eq!(found, Some(42));
            for name in [
                format!("{prefix}superblock"),
                format!("{prefix}00000000000000000000.log"),
                format!("{prefix}00000000000000000000.index"),
                format!("{prefix}offsets.0"),
                format!("staging-{prefix}x"),
                "p0000000000000008-superblock".to_owned(),
            ] {
                disk.open(&name, OpenMode::Create).await.unwrap();
            }
            assert_eq!(remove_files(&disk, prefix).await.unwrap(), 7);
            assert_eq!(
                disk.list().await.unwrap(),
                vec!["p0000000000000008-superblock".to_owned()]
            );
            assert_eq!(remove_files(&disk, prefix).await.unwrap(), 0);
        });
    }

    /// MemStorage that records the order of removals.
    #[derive(Clone)]
    struct Recording {
        inner: MemStorage,
        removed: std::rc::Rc<std::cell::RefCell<Vec<String>>>,
    }

    impl Storage for Recording {
        type File = <MemStorage as Storage>::File;
        async fn open(&self, name: &str, mode: OpenMode) -> Result<Self::File, StorageError> {
            self.inner.open(name, mode).await
        }
        async fn read_at(
            &self,
            file: &Self::File,
            offset: u64,
            buf: &mut [u8],
        ) -> Result<usize, StorageError> {
            self.inner.read_at(file, offset, buf).await
        }
        async fn write_at(
            &self,
            file: &Self::File,
            offset: u64,
            data: &[u8],
        ) -> Result<(), StorageError> {
            self.inner.write_at(file, offset, data).await
        }
        async fn sync(&self, file: &Self::File) -> Result<(), StorageError> {
            self.inner.sync(file).await
        }
        async fn len(&self, file: &Self::File) -> Result<u64, StorageError> {
            self.inner.len(file).await
        }
        async fn set_len(&self, file: &Self::File, len: u64) -> Result<(), StorageError> {
            self.inner.set_len(file, len).await
        }
        async fn remove(&self, name: &str) -> Result<(), StorageError> {
            self.removed.borrow_mut().push(name.to_owned());
            self.inner.remove(name).await
        }
        async fn list(&self) -> Result<Vec<String>, StorageError> {
            self.inner.list().await
        }
    }

    /// Whatever the names sort like, the superblock goes after every data file and the
    /// marker after the superblock (a crash between any two removals leaves the marker).
    #[test]
    fn removal_order_is_data_then_superblock_then_marker() {
        let disk = Recording {
            inner: MemStorage::new(),
            removed: Default::default(),
        };
        let prefix = "p0000000000000007-";
        block_on(async {
            let (mut store, _) = open_marker(disk.clone(), prefix).await.unwrap();
            write_marker(&mut store, 1).await.unwrap();
            for name in [
                format!("{prefix}00000000000000000000.index"),
                format!("{prefix}superblock"),
                format!("{prefix}zzz.log"),
                format!("{prefix}offsets.1"),
            ] {
                disk.open(&name, OpenMode::Create).await.unwrap();
            }
            remove_files(&disk, prefix).await.unwrap();
        });
        let removed = disk.removed.borrow();
        let at = |name: &str| removed.iter().position(|n| n == name).unwrap();
        let superblock = at(&format!("{prefix}superblock"));
        assert_eq!(removed.len(), 6);
        assert_eq!(superblock, 3, "{removed:?}");
        assert!(
            removed[4..]
                .iter()
                .all(|n| n.starts_with(&marker_name(prefix)))
        );
    }
}
