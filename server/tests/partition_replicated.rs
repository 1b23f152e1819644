//! Partition groups end to end on real disks: three nodes' partition hosts
//! (`server::partition_group`) on one glommio executor, each with its own temporary data
//! directory (WAL and group files through `journal::FileStorage`, fdatasync'ed), joined by an
//! in-process network (`partition_cluster`). Groups come from a committed metadata view
//! published into a `MetadataHandle`, as the metadata state machine would publish it.

mod partition_cluster;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use consensus::ClientRequest;
use server::client::codec::{Consumer, Identifier};
use server::client::reply::{decode_send_reply, read_result};
use server::client::request::{OffsetTarget, Request, StoreConsumerOffset};
use server::groups::{Partitions, Refused};
use server::metadata::view::{MetadataHandle, MetadataReader};
use server::partition_group::{self as pg, Event, Host, Outcome, ReclaimLimits};
use wire::GroupId;

use partition_cluster::{Cluster, LANES, group, poll_all, run, send, storage, until, view};

fn consumer() -> Consumer {
    Consumer {
        group: false,
        id: Identifier::Numeric(7),
    }
}

fn store(client: u128, number: u64, partition: u32, offset: u64) -> ClientRequest {
    let mut body = Vec::new();
    Request::StoreConsumerOffset(StoreConsumerOffset {
        target: OffsetTarget {
            consumer: consumer(),
            stream: Identifier::Numeric(0),
            topic: Identifier::Numeric(0),
            partition: Some(partition),
        },
        offset,
        quorum: true,
    })
    .encode(&mut body);
    ClientRequest::new(
        client,
        wire::Operation::StoreConsumerOffset,
        0,
        number,
        body,
    )
}

/// Poll bodies are equal (reported by length and first difference, not dumped).
fn same(a: &[u8], b: &[u8], what: &str) {
    let first = a.iter().zip(b).position(|(x, y)| x != y);
    assert!(
        a == b,
        "{what}: poll bodies differ ({} vs {} bytes, first difference at {first:?})",
        a.len(),
        b.len()
    );
}

fn next_offset(host: &Host, partition: u32) -> u64 {
    host.group_state(group(partition)).map_or(0, |s| s.4)
}

fn payload(i: usize) -> Vec<u8> {
    let mut p = vec![(i % 251) as u8; 1000];
    p[..8].copy_from_slice(&(i as u64).to_le_bytes());
    p
}

/// Waits until `partition`'s primary (replica 0) commits requests: a fresh group refuses them
/// (status 58, transient) until its first superblock is durable. The probe is a
/// StoreConsumerOffset on an empty partition: committed, rejected by the state machine
/// (4100), no message and no offset stored.
async fn until_accepting(c: &Cluster, partition: u32) {
    let replies = c.nodes[0].as_ref().unwrap().replies.clone();
    for attempt in 0..500u64 {
        let client = 0xACCE_0000 + u128::from(partition);
        let before = replies.0.borrow().len();
        if c.host(0)
            .submit(group(partition), store(client, attempt + 1, partition, 0))
            .is_ok()
        {
            until("the probe's reply", || replies.0.borrow().len() > before).await;
            let (_, frame) = replies.0.borrow().last().cloned().unwrap();
            if u32::from_le_bytes(frame.bytes()[216..220].try_into().unwrap()) == 0 {
                return;
            }
        }
        glommio::timer::sleep(Duration::from_millis(10)).await;
    }
    panic!("partition {partition} never accepted a request");
}

/// Waits until all three replicas host both groups and replica 0 commits requests on both.
async fn until_ready(c: &Cluster) {
    until("both groups hosted everywhere", || {
        (0..3).all(|r| (0..2).all(|p| c.host(r).hosts(group(p).0)))
    })
    .await;
    until_accepting(c, 0).await;
    until_accepting(c, 1).await;
}

/// Stops all three replicas cleanly (each pump reports `Stopped`).
async fn stop_all(c: &mut Cluster) {
    for r in 0..3 {
        assert_eq!(c.stop(r).await, Outcome::Stopped);
    }
}

/// Sends `batches` SendMessages of two messages to each of `partitions` at the primary
/// (replica 0) at once, and waits for every reply.
async fn send_burst(c: &Cluster, partitions: u32, first: usize, batches: usize) {
    let replies = c.nodes[0].as_ref().unwrap().replies.clone();
    let before = replies.0.borrow().len();
    for i in first..first + batches {
        for p in 0..partitions {
            let (a, b) = (payload(2 * i), payload(2 * i + 1));
            let request = send(100 + u128::from(p), i as u64 + 1, p, &[&a, &b]);
            c.host(0).submit(group(p), request).unwrap();
        }
    }
    let expected = before + batches * partitions as usize;
    until("every SendMessages reply", || {
        replies.0.borrow().len() >= expected
    })
    .await;
    for (_, frame) in &replies.0.borrow()[before..] {
        let status = u32::from_le_bytes(frame.bytes()[216..220].try_into().unwrap());
        let body = &frame.bytes()[256..];
        assert_eq!(status, 0, "reply status {status}, body {body:?}");
        let sent = decode_send_reply(read_result(body).unwrap().unwrap()).unwrap();
        assert_eq!(sent.len(), 1);
    }
}

/// Three replicas of two partition groups on real disks: SendMessages and StoreConsumerOffset
/// commit and every replica polls the same messages; appends of both groups share WAL windows
/// (fewer fdatasyncs than appends); checkpoints reclaim WAL files; a replica stopped and
/// restarted recovers its messages from its WAL and segments alone (cut off from its peers),
/// then catches up on what it missed.
#[test]
fn three_replicas_replicate_poll_recover_and_catch_up() {
    run(|| async {
        let mut c = Cluster::new("replicate", 3, view(2, 4));
        until_ready(&c).await;
        // A backup refuses submissions and names the primary.
        assert_eq!(
            c.host(1).submit(group(0), send(5, 1, 0, &[b"x"])),
            Err(Refused::NotPrimary {
                view: 0,
                primary: 0
            })
        );
        // A group the committed metadata does not name is unknown here.
        assert_eq!(
            c.host(1).submit(group(5), send(5, 1, 5, &[b"x"])),
            Err(Refused::Unknown)
        );

        send_burst(&c, 2, 0, 30).await;
        let replies = c.nodes[0].as_ref().unwrap().replies.clone();
        c.host(0).submit(group(0), store(9, 1, 0, 5)).unwrap();
        until("the store's reply", || {
            replies.0.borrow().iter().any(|(id, _)| *id == 9)
        })
        .await;
        // Every replica applies what committed.
        until("every replica applied 60 messages per group", || {
            (0..3).all(|r| (0..2).all(|p| next_offset(c.host(r), p) == 60))
        })
        .await;
        until("every replica applied the store", || {
            (0..3).all(|r| {
                c.host(r)
                    .consumer_offset(group(0), 0, &consumer())
                    .unwrap()
                    .is_some_and(|o| o.stored_offset == 5)
            })
        })
        .await;
        let reference = poll_all(c.host(0), 0);
        assert_eq!((reference.0, reference.1), (60, 59));
        for r in 1..3 {
            same(
                &poll_all(c.host(r), 0).2,
                &reference.2,
                &format!("replica {r}"),
            );
        }
        // Group commit: appends of both groups shared windows and fdatasyncs.
        for r in 0..3 {
            let g = c.gauges(r);
            let (appends, commits) = (
                g.appends.load(Ordering::Relaxed),
                g.wal_commits.load(Ordering::Relaxed),
            );
            eprintln!("replica {r}: {appends} appends in {commits} WAL commits");
            assert!(appends >= 61, "replica {r}: {appends} appends");
            assert!(
                commits * 2 <= appends,
                "replica {r}: {commits} WAL commits (one fdatasync each) for {appends} appends"
            );
        }
        // Checkpoints let reclaim remove WAL files (so a restart needs the segments).
        until("replica 2 reclaimed WAL files", || {
            c.gauges(2).wal_files_reclaimed.load(Ordering::Relaxed) > 0
        })
        .await;
        assert!(c.gauges(2).checkpoints.load(Ordering::Relaxed) > 0);

        // Replica 2 stops cleanly and restarts cut off: everything it committed comes back
        // from its own disk.
        assert_eq!(c.stop(2).await, Outcome::Stopped);
        c.net.cut.borrow_mut().insert(2);
        c.start(2);
        until("replica 2 recovered both groups", || {
            (0..2).all(|p| c.host(2).hosts(group(p).0))
        })
        .await;
        let recovered = poll_all(c.host(2), 0);
        assert!(
            recovered.0 >= 56,
            "replica 2 recovered {} of 60 messages from WAL and segments",
            recovered.0
        );
        same(
            &recovered.2[16..],
            &reference.2[16..16 + recovered.2.len() - 16],
            "the recovered messages are the committed ones",
        );
        // It misses a burst while cut off, then catches up.
        send_burst(&c, 2, 30, 10).await;
        c.net.cut.borrow_mut().clear();
        c.reconnect(2, &[group(0), group(1)]);
        until("replica 2 caught up", || {
            (0..2).all(|p| next_offset(c.host(2), p) == 80)
        })
        .await;
        same(
            &poll_all(c.host(2), 1).2,
            &poll_all(c.host(0), 1).2,
            "replica 2 caught up",
        );
        // The primary checkpointed past what replica 2 held (interval 8, 10 ops missed), so
        // it caught up by state transfer (SEGMENT_LOG + CONSUMER_OFFSETS installed).
        for p in 0..2 {
            assert!(
                c.host(2).transfers_installed(group(p)) >= Some(1),
                "partition {p} caught up by transfer"
            );
        }
        assert_eq!(
            c.host(2)
                .consumer_offset(group(0), 0, &consumer())
                .unwrap()
                .map(|o| o.stored_offset),
            Some(5)
        );
        // The installed state is on its disk: restarted cut off, it polls every message.
        let expected = poll_all(c.host(0), 0).2;
        assert_eq!(c.stop(2).await, Outcome::Stopped);
        c.net.cut.borrow_mut().insert(2);
        c.start(2);
        until("replica 2 recovered both groups", || {
            (0..2).all(|p| c.host(2).hosts(group(p).0))
        })
        .await;
        same(
            &poll_all(c.host(2), 0).2,
            &expected,
            "the install survived a restart",
        );
        c.net.cut.borrow_mut().clear();
        stop_all(&mut c).await;
    });
}

/// A replica whose newest WAL file was cut short (lost records, end unknown) rejoins every
/// group in lost state (it may have acknowledged what it lost), then catches up from its peers.
#[test]
fn a_cut_wal_file_makes_the_groups_rejoin_in_lost_state() {
    run(|| async {
        let mut c = Cluster::new_with("cut", 3, view(2, 1_000_000), 8);
        until_ready(&c).await;
        send_burst(&c, 2, 0, 10).await;
        until("replica 2 applied them", || {
            (0..2).all(|p| next_offset(c.host(2), p) >= 20)
        })
        .await;
        assert_eq!(c.stop(2).await, Outcome::Stopped);
        // Cut the newest WAL file to one sector.
        let wal = c.dirs[2].join("wal");
        let mut files: Vec<PathBuf> = std::fs::read_dir(&wal)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("wal.0")
            })
            .collect();
        files.sort();
        let newest = files.last().expect("a WAL file").clone();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&newest)
            .unwrap()
            .set_len(512)
            .unwrap();
        c.net.cut.borrow_mut().insert(2);
        c.start(2);
        until("replica 2 booted both groups", || {
            (0..2).all(|p| c.host(2).hosts(group(p).0))
        })
        .await;
        for p in 0..2 {
            assert_eq!(
                c.host(2).is_lost_state(group(p)),
                Some(true),
                "partition {p} rejoins in lost state"
            );
        }
        c.net.cut.borrow_mut().clear();
        c.reconnect(2, &[group(0), group(1)]);
        send_burst(&c, 2, 10, 2).await;
        until("replica 2 caught up", || {
            (0..2).all(|p| next_offset(c.host(2), p) == 24)
        })
        .await;
        same(
            &poll_all(c.host(2), 0).2,
            &poll_all(c.host(0), 0).2,
            "replica 2 after rejoining",
        );
        // Out of lost state and checkpointed again, the loss counts as repaired: the next
        // restart neither rejoins in lost state nor drops its replayed entries.
        until("replica 2 out of lost state", || {
            (0..2).all(|p| c.host(2).is_lost_state(group(p)) == Some(false))
        })
        .await;
        let checkpoints = c.gauges(2).checkpoints.load(Ordering::Relaxed);
        send_burst(&c, 2, 12, 10).await;
        until("replica 2 checkpointed after rejoining", || {
            c.gauges(2).checkpoints.load(Ordering::Relaxed) >= checkpoints + 2
        })
        .await;
        until("replica 2 applied the burst", || {
            (0..2).all(|p| next_offset(c.host(2), p) == 44)
        })
        .await;
        assert_eq!(c.stop(2).await, Outcome::Stopped);
        c.net.cut.borrow_mut().insert(2);
        c.start(2);
        until("replica 2 booted both groups again", || {
            (0..2).all(|p| c.host(2).hosts(group(p).0))
        })
        .await;
        for p in 0..2 {
            assert_eq!(c.host(2).is_lost_state(group(p)), Some(false));
            assert!(
                poll_all(c.host(2), p).0 >= 40,
                "partition {p}: its own disk serves what it committed"
            );
        }
        c.net.cut.borrow_mut().clear();
        stop_all(&mut c).await;
    });
}

/// Decision 240: a replica whose directory was wiped and formatted as a rejoin boots every
/// partition group in lost state (they have no superblock): with the other backup down, the
/// primary's commit point does not move, because the rejoined replica never acks; once the
/// other backup returns the cluster commits, the rejoined replica catches up and leaves lost
/// state, and a restart still in the rejoined directory boots from the superblocks it wrote.
#[test]
fn a_rejoined_replica_boots_its_partition_groups_lost_and_never_helps_a_quorum() {
    run(|| async {
        let mut c = Cluster::new_with("rejoin", 3, view(2, 1_000_000), 8);
        until_ready(&c).await;
        send_burst(&c, 2, 0, 10).await;
        until("replica 2 applied them", || {
            (0..2).all(|p| next_offset(c.host(2), p) >= 20)
        })
        .await;
        assert_eq!(c.stop(1).await, Outcome::Stopped);
        assert_eq!(c.stop(2).await, Outcome::Stopped);
        // Replica 2 loses its disk and rejoins.
        std::fs::remove_dir_all(&c.dirs[2]).unwrap();
        std::fs::create_dir_all(&c.dirs[2]).unwrap();
        c.rejoined.insert(2);
        c.start(2);
        for g in [group(0), group(1)] {
            for (a, b) in [(2, 0), (0, 2)] {
                c.host(a).inbox.push(Event::Peer {
                    peer: b,
                    lane: shard::mapping::lane(g, LANES),
                    connected: true,
                });
            }
        }
        until("replica 2 booted both groups", || {
            (0..2).all(|p| c.host(2).hosts(group(p).0))
        })
        .await;
        for p in 0..2 {
            assert_eq!(
                c.host(2).is_lost_state(group(p)),
                Some(true),
                "partition {p} boots in lost state in a rejoined directory"
            );
        }
        let before: Vec<u64> = (0..2)
            .map(|p| c.host(0).group_state(group(p)).unwrap().2)
            .collect();
        let replies = c.nodes[0].as_ref().unwrap().replies.clone();
        let answered = replies.0.borrow().len();
        for p in 0..2 {
            let (a, b) = (payload(1000), payload(1001));
            c.host(0)
                .submit(group(p), send(100 + u128::from(p), 11, p, &[&a, &b]))
                .unwrap();
        }
        // A quorum of one remembering replica plus the lost one must not commit: wait many
        // heartbeats and prepare retries, then check nothing moved.
        for _ in 0..150 {
            glommio::timer::sleep(Duration::from_millis(10)).await;
            for p in 0..2 {
                let (_, _, commit, _, _) = c.host(0).group_state(group(p)).unwrap();
                assert_eq!(
                    commit, before[p as usize],
                    "partition {p}: the primary committed with the lost replica's help"
                );
                assert_eq!(c.host(2).is_lost_state(group(p)), Some(true));
            }
            assert_eq!(replies.0.borrow().len(), answered, "nothing was replied");
        }
        // The other backup returns: the requests commit, replica 2 catches up and leaves
        // lost state.
        c.start(1);
        c.reconnect(1, &[group(0), group(1)]);
        until("both requests replied", || {
            replies.0.borrow().len() >= answered + 2
        })
        .await;
        until("replica 2 caught up", || {
            (0..2).all(|p| next_offset(c.host(2), p) == 22)
        })
        .await;
        until("replica 2 out of lost state", || {
            (0..2).all(|p| c.host(2).is_lost_state(group(p)) == Some(false))
        })
        .await;
        // Still a rejoined directory, but every group's superblock landed: a restart boots
        // from them, not lost.
        assert_eq!(c.stop(2).await, Outcome::Stopped);
        c.start(2);
        until("replica 2 booted both groups again", || {
            (0..2).all(|p| c.host(2).hosts(group(p).0))
        })
        .await;
        for p in 0..2 {
            assert_eq!(c.host(2).is_lost_state(group(p)), Some(false));
        }
        stop_all(&mut c).await;
    });
}

/// A replica that crashes before its segments flushed (the topic flushes every 10^6 messages,
/// no checkpoint ran) recovers every message it committed from its WAL alone.
#[test]
fn a_crashed_replica_recovers_unflushed_messages_from_its_wal() {
    run(|| async {
        let mut c = Cluster::new_with("crash", 3, view(2, 1_000_000), 1_000);
        until_ready(&c).await;
        send_burst(&c, 2, 0, 20).await;
        // One more op per group whose prepare carries the commit point of the 20 above.
        send_burst(&c, 2, 20, 1).await;
        until("replica 2 applied them", || {
            (0..2).all(|p| next_offset(c.host(2), p) >= 40)
        })
        .await;
        assert_eq!(c.gauges(2).checkpoints.load(Ordering::Relaxed), 0);
        c.crash(2).await;
        c.net.cut.borrow_mut().insert(2);
        c.start(2);
        until("replica 2 recovered both groups", || {
            (0..2).all(|p| c.host(2).hosts(group(p).0))
        })
        .await;
        for p in 0..2 {
            let recovered = poll_all(c.host(2), p);
            assert!(
                recovered.0 >= 40,
                "partition {p}: {} of the 40 committed messages recovered from the WAL",
                recovered.0
            );
            same(
                &recovered.2[16..],
                &poll_all(c.host(0), p).2[16..16 + recovered.2.len() - 16],
                "the recovered messages are the committed ones",
            );
        }
        stop_all(&mut c).await;
    });
}

/// A clean stop (SIGTERM in a node) leaves every committed message in the segments, even
/// when the topic's flush policy never fired and no checkpoint ran.
#[test]
fn a_clean_stop_flushes_committed_messages_to_the_segments() {
    run(|| async {
        let mut c = Cluster::new_with("flush", 3, view(2, 1_000_000), 1_000);
        until_ready(&c).await;
        send_burst(&c, 2, 0, 20).await;
        stop_all(&mut c).await;
        let parts = storage(&c.dirs[0], "partitions");
        for p in 0..2 {
            let (log, _) = journal::PartitionLog::open(
                parts.clone(),
                &pg::group_prefix(group(p).0),
                journal::FlushPolicy::default(),
                0,
            )
            .await
            .unwrap();
            assert_eq!(
                log.next_offset(),
                40,
                "partition {p}: every committed message"
            );
        }
    });
}

/// One group's entries above its checkpoint hold the shard's WAL while another group writes:
/// reclaim stops at the lagging group's first held record (counted), and the files go once
/// that group checkpoints.
#[test]
fn a_lagging_group_holds_reclaim_until_it_checkpoints() {
    run(|| async {
        let mut c = Cluster::new_solo("lagging");
        until_accepting(&c, 0).await;
        until_accepting(&c, 1).await;
        let replies = c.nodes[0].as_ref().unwrap().replies.clone();
        // Group 1 takes one op and stays below its checkpoint interval.
        let (a, b) = (payload(0), payload(1));
        c.host(0)
            .submit(group(1), send(200, 1, 1, &[&a, &b]))
            .unwrap();
        until("group 1's reply", || {
            replies.0.borrow().iter().any(|(id, _)| *id == 200)
        })
        .await;
        // Group 0 writes many WAL files' worth and checkpoints again and again.
        for round in 0..8 {
            send_burst_one(&c, 0, round * 10, 10).await;
        }
        let g = c.gauges(0);
        assert!(g.checkpoints.load(Ordering::Relaxed) >= 8);
        assert_eq!(
            g.wal_files_reclaimed.load(Ordering::Relaxed),
            0,
            "group 1's op holds every file"
        );
        assert!(
            g.reclaim_blocked.load(Ordering::Relaxed) > 0,
            "the hold is counted"
        );
        assert_eq!(
            c.host(0).submit(group(1), send(201, 2, 1, &[b"x"])),
            Err(Refused::Busy),
            "the group holding the WAL is refused"
        );
        assert!(
            c.host(0).submit(group(0), send(202, 1, 0, &[b"y"])).is_ok(),
            "the others are not"
        );
        // Restarted without the Busy bound (the hold survives the restart: the replayed
        // entries keep their records), group 1 checkpoints and releases the files.
        assert_eq!(c.stop(0).await, Outcome::Stopped);
        let mut c2 = Cluster::resume_solo(
            c,
            ReclaimLimits {
                busy_lsns: u64::MAX,
                ..ReclaimLimits::default()
            },
        );
        until_accepting(&c2, 0).await;
        until_accepting(&c2, 1).await;
        // Group 0 checkpoints again: group 1 still holds every file.
        send_burst_one(&c2, 0, 100, 10).await;
        until("group 0 checkpointed", || {
            c2.gauges(0).checkpoints.load(Ordering::Relaxed) >= 1
        })
        .await;
        assert_eq!(
            c2.gauges(0).wal_files_reclaimed.load(Ordering::Relaxed),
            0,
            "group 1 still holds"
        );
        // Group 1 reaches its checkpoint interval: the files go.
        for i in 0..9 {
            let p = payload(i);
            c2.host(0)
                .submit(group(1), send(300, i as u64 + 10, 1, &[&p]))
                .unwrap();
        }
        until("the files are reclaimed", || {
            c2.gauges(0).wal_files_reclaimed.load(Ordering::Relaxed) > 0
        })
        .await;
        assert!(c2.gauges(0).checkpoints.load(Ordering::Relaxed) >= 2);
        assert_eq!(c2.stop(0).await, Outcome::Stopped);
    });
}

/// With copy-forward on, the idle group's held entry is appended again at the WAL's head, so
/// the files before it go without that group checkpointing; after a crash the entry comes back
/// from its new record.
#[test]
fn a_holding_group_is_copied_forward_and_survives_a_crash() {
    run(|| async {
        let mut c = Cluster::new_solo("forward");
        c.crash(0).await;
        c.limits = ReclaimLimits {
            warn_lsns: 40,
            busy_lsns: u64::MAX,
            copy_forward: true,
        };
        c.start(0);
        until_accepting(&c, 0).await;
        until_accepting(&c, 1).await;
        let replies = c.nodes[0].as_ref().unwrap().replies.clone();
        let (a, b) = (payload(0), payload(1));
        c.host(0)
            .submit(group(1), send(200, 1, 1, &[&a, &b]))
            .unwrap();
        until("group 1's reply", || {
            replies.0.borrow().iter().any(|(id, _)| *id == 200)
        })
        .await;
        for round in 0..8 {
            send_burst_one(&c, 0, round * 10, 10).await;
        }
        let g = c.gauges(0);
        assert!(
            g.copied_forward.load(Ordering::Relaxed) > 0,
            "copied forward"
        );
        assert!(
            g.wal_files_reclaimed.load(Ordering::Relaxed) > 0,
            "files reclaimed past the idle group's first record"
        );
        let before = poll_all(c.host(0), 1);
        assert_eq!(before.0, 2);
        c.crash(0).await;
        c.start(0);
        until("group 1 recovered", || {
            next_offset(c.host(0), 1) == 2 && poll_all(c.host(0), 1).0 == 2
        })
        .await;
        same(
            &poll_all(c.host(0), 1).2,
            &before.2,
            "group 1 after the crash",
        );
        assert_eq!(c.stop(0).await, Outcome::Stopped);
    });
}

/// A partition created after boot (a newer committed view) gets its group on the next tick;
/// frames of a group no view names are dropped and counted.
#[test]
fn groups_follow_the_committed_metadata() {
    run(|| async {
        let c = Cluster::new_solo("follow");
        until("the first two groups", || {
            (0..2).all(|p| c.host(0).hosts(group(p).0))
        })
        .await;
        assert!(!c.host(0).hosts(group(2).0));
        c.host(0).inbox.push(Event::Frame {
            from: 1,
            group: group(2).0,
            bytes: Bytes::from_static(&[0; 256]),
        });
        until("the unknown frame counted", || {
            c.gauges(0).dropped_unknown.load(Ordering::Relaxed) == 1
        })
        .await;
        let mut next = view(3, 4);
        next.op = 8;
        c.handle.publish(next);
        until("the new partition's group", || c.host(0).hosts(group(2).0)).await;
        until_accepting(&c, 2).await;
        let mut c = c;
        assert_eq!(c.stop(0).await, Outcome::Stopped);
    });
}

/// The committed view gives each group of this shard its topic's flush policy and ack
/// override; groups of other shards are not this shard's.
#[test]
fn wanted_groups_carry_policy_and_ack_override() {
    let handle = Arc::new(MetadataHandle::default());
    handle.publish(view(8, 4));
    let reader = MetadataReader::new(handle);
    let overrides: pg::AckOverrides = [(("s".to_owned(), "t".to_owned()), true)]
        .into_iter()
        .collect();
    let mut all = 0;
    for shard in 0..4 {
        let wanted = pg::wanted_groups(&reader, shard, LANES, 4, &overrides);
        for (g, spec) in &wanted {
            assert_eq!(shard::mapping::shard_of(GroupId(*g), LANES, 4), shard);
            assert_eq!(spec.memory_ack, Some(true));
            assert_eq!(spec.policy.messages_required_to_save, 4);
        }
        all += wanted.len();
    }
    assert_eq!(all, 8, "every partition on exactly one shard");
    let none = pg::wanted_groups(&reader, 0, LANES, 1, &pg::AckOverrides::new());
    assert!(none.values().all(|s| s.memory_ack.is_none()));
}

async fn send_burst_one(c: &Cluster, partition: u32, first: usize, batches: usize) {
    let replies = c.nodes[0].as_ref().unwrap().replies.clone();
    let before = replies.0.borrow().len();
    for i in first..first + batches {
        let (a, b) = (payload(2 * i), payload(2 * i + 1));
        c.host(0)
            .submit(
                group(partition),
                send(100, i as u64 + 1, partition, &[&a, &b]),
            )
            .unwrap();
    }
    until("every reply", || {
        replies.0.borrow().len() >= before + batches
    })
    .await;
}

impl Cluster {
    /// A one-replica cluster with two groups, WAL files of 64 KiB, copy-forward off and a
    /// small Busy bound.
    fn new_solo(name: &str) -> Cluster {
        let limits = ReclaimLimits {
            warn_lsns: 40,
            busy_lsns: 60,
            copy_forward: false,
        };
        let mut c = Cluster::unstarted(name, 1, view(2, 4), 8, limits);
        c.start(0);
        c
    }

    fn resume_solo(mut c: Cluster, limits: ReclaimLimits) -> Cluster {
        c.limits = limits;
        c.start(0);
        c
    }
}
