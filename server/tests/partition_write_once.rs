//! Message batches written once (decision 414) end to end on real disks: three nodes'
//! partition hosts on one glommio executor (`partition_cluster`). A batch of 64 KiB or more
//! goes to its segment's tail before its prepare is acknowledged, and the WAL holds only a
//! reference to it; these tests follow such batches through a view change that truncates
//! prepared bodies, and through a crash.

mod partition_cluster;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use server::client::reply::{decode_send_reply, read_result};
use server::groups::Partitions;
use server::partition_group::{REF_BODY_MIN, group_prefix};

use partition_cluster::{Cluster, group, poll_all, run, send, until, view};

const N: u8 = 3;

/// Two messages of 40 kB: one batch is past [`REF_BODY_MIN`].
fn big(round: u64, i: u64) -> [Vec<u8>; 2] {
    [0u8, 1].map(|m| {
        let mut p = vec![(round * 31 + i * 7 + u64::from(m)) as u8; 40_000];
        p[..8].copy_from_slice(&(round * 1000 + i).to_le_bytes());
        p
    })
}

fn cluster(name: &str) -> Cluster {
    // Flushing never fires on its own: what reaches the segments is what is written ahead.
    let mut c = Cluster::unstarted(name, N, view(1, 1_000_000), 1_000, Default::default());
    // Room for whole records too (the harness's 64 KiB WAL files would refuse them).
    c.wal.file_size_max = 8 * 1024 * 1024;
    c.wal.window_bytes_max = 1024 * 1024;
    for r in 0..N {
        c.start(r);
    }
    c
}

fn state(c: &Cluster, r: u8) -> (u32, consensus::Status, u64, u64, u64) {
    c.host(r).group_state(group(0)).expect("hosted")
}

/// Sends `count` big batches at node `r`, one after the other, each until it commits (a
/// fresh group answers 58, transient, until its first superblock is durable).
async fn send_big(c: &Cluster, r: u8, round: u64, count: u64) {
    let node = c.nodes[r as usize].as_ref().expect("running");
    let mut number = 0;
    for i in 0..count {
        let [a, b] = big(round, i);
        loop {
            number += 1;
            let before = node.replies.0.borrow().len();
            let request = send(0xB16 + u128::from(round), number, 0, &[&a, &b]);
            if node.host.submit(group(0), request).is_err() {
                glommio::timer::sleep(Duration::from_millis(10)).await;
                continue;
            }
            until("the reply", || node.replies.0.borrow().len() > before).await;
            let (_, frame) = node.replies.0.borrow().last().cloned().unwrap();
            let status = u32::from_le_bytes(frame.bytes()[216..220].try_into().unwrap());
            if status == 58 {
                glommio::timer::sleep(Duration::from_millis(10)).await;
                continue;
            }
            assert_eq!(status, 0, "reply status {status}");
            decode_send_reply(read_result(&frame.bytes()[256..]).unwrap().unwrap()).unwrap();
            break;
        }
    }
}

/// The bytes of the group's segment logs on node `r`'s disk, in segment order.
fn segment_bytes(c: &Cluster, r: u8) -> Vec<u8> {
    let dir: &Path = &c.dirs[r as usize].join("partitions");
    let prefix = group_prefix(group(0).0);
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(&prefix) && n.ends_with(".log"))
        .collect();
    names.sort();
    names
        .iter()
        .flat_map(|n| std::fs::read(dir.join(n)).unwrap())
        .collect()
}

/// Node 0 leads and journals three big batches its backups never see (written ahead at its
/// segment's tail); node 1 takes over and commits three other batches at the same offsets.
/// When node 0 is back, the view change truncates its three prepares: it cuts its segment
/// back and writes the committed batches there, so its segment bytes end equal to the new
/// primary's; after a crash it recovers them from its own disk.
#[test]
fn a_truncated_prepares_bodies_are_cut_and_the_committed_batches_written_in_their_place() {
    run(|| async {
        let mut c = cluster("rewind");
        until("node 0 leads", || {
            (0..N).all(|r| {
                c.host(r)
                    .group_state(group(0))
                    .is_some_and(|(view, status, ..)| {
                        status == consensus::Status::Normal && view % u32::from(N) == 0
                    })
            })
        })
        .await;
        send_big(&c, 0, 1, 3).await;
        let gauges = c.gauges(0);
        assert!(
            gauges.bodies_ahead.load(Ordering::Relaxed) >= 3,
            "the batches were written ahead and referenced"
        );
        assert!(
            gauges.wal_bytes.load(Ordering::Relaxed) < 3 * REF_BODY_MIN as u64,
            "the WAL held references, not the batches"
        );
        let (_, _, _, op_before, offset_before) = state(&c, 0);

        // Node 0 alone: three prepares journaled (bodies ahead), never committed.
        c.net.cut.borrow_mut().insert(0);
        let node0 = c.nodes[0].as_ref().unwrap();
        for i in 0..3 {
            let [a, b] = big(2, i);
            node0
                .host
                .submit(group(0), send(0xDEAD, i + 1, 0, &[&a, &b]))
                .unwrap();
        }
        until("node 0 journaled its lone prepares", || {
            state(&c, 0).3 >= op_before + 3 && c.gauges(0).bodies_ahead.load(Ordering::Relaxed) >= 6
        })
        .await;
        assert_eq!(
            state(&c, 0).2,
            op_before,
            "nothing committed without a quorum"
        );

        // Node 1 takes over with node 2 and commits other batches at the same offsets.
        c.leads[1].set(Some(4));
        until("node 1 leads", || {
            (1..N).all(|r| {
                c.host(r)
                    .group_state(group(0))
                    .is_some_and(|(view, status, ..)| {
                        status == consensus::Status::Normal && view % u32::from(N) == 1
                    })
            })
        })
        .await;
        send_big(&c, 1, 3, 3).await;
        assert_eq!(state(&c, 1).4, offset_before + 6);

        // Node 0 comes back: its three prepares are truncated, its segment rewound.
        c.net.cut.borrow_mut().remove(&0);
        c.reconnect(0, &[group(0)]);
        until("node 0 caught up", || {
            let (_, status, commit, _, next) = state(&c, 0);
            status == consensus::Status::Normal
                && commit >= state(&c, 1).2
                && next == offset_before + 6
        })
        .await;
        assert!(
            c.gauges(0).segment_rewinds.load(Ordering::Relaxed) >= 1,
            "the view change cut node 0's segment back"
        );
        until("node 0's segments equal node 1's", || {
            segment_bytes(&c, 0) == segment_bytes(&c, 1)
        })
        .await;

        // A crash: node 0 recovers the committed batches from its own disk alone.
        c.crash(0).await;
        c.net.cut.borrow_mut().insert(0);
        c.start(0);
        until("node 0 recovered the group", || c.host(0).hosts(group(0).0)).await;
        until("node 0 replayed its journal", || {
            state(&c, 0).4 >= offset_before + 6
        })
        .await;
        assert_eq!(segment_bytes(&c, 0), segment_bytes(&c, 1));
        glommio::timer::sleep(Duration::from_millis(50)).await;
        for r in 0..N {
            let _ = c.stop(r).await;
        }
    });
}

/// Sends one SendMessages of `payloads` to `partition` at node 0 until it commits (a fresh
/// group answers 58 until its first superblock is durable).
async fn send_until_committed(c: &Cluster, partition: u32, client: u128, payloads: &[&[u8]]) {
    let node = c.nodes[0].as_ref().expect("running");
    for number in 1..=500u64 {
        let before = node.replies.0.borrow().len();
        if node
            .host
            .submit(group(partition), send(client, number, partition, payloads))
            .is_err()
        {
            glommio::timer::sleep(Duration::from_millis(10)).await;
            continue;
        }
        until("the reply", || node.replies.0.borrow().len() > before).await;
        let (_, frame) = node.replies.0.borrow().last().cloned().unwrap();
        let status = u32::from_le_bytes(frame.bytes()[216..220].try_into().unwrap());
        if status == 0 {
            return;
        }
        assert_eq!(status, 58, "reply status {status}");
        glommio::timer::sleep(Duration::from_millis(10)).await;
    }
    panic!("partition {partition} never committed");
}

/// A group that holds the WAL's reclaim back with a big batch is copied forward as a body
/// reference (the harness's WAL files of 64 KiB could not hold the 80 kB prepare whole), and
/// after a crash its batch comes back through that reference.
#[test]
fn a_held_prepares_reference_is_copied_forward_and_its_batch_survives_a_crash() {
    run(|| async {
        let limits = server::partition_group::ReclaimLimits {
            warn_lsns: 40,
            busy_lsns: u64::MAX,
            copy_forward: true,
        };
        // One replica, two groups, WAL files of 64 KiB, checkpoints every 8 ops.
        let mut c = Cluster::unstarted("forward-ref", 1, view(2, 4), 8, limits);
        c.start(0);
        let [a, b] = big(7, 0);
        send_until_committed(&c, 1, 0x1D1E, &[&a, &b]).await;
        assert!(c.gauges(0).bodies_ahead.load(Ordering::Relaxed) >= 1);
        // Group 0 moves the WAL on with small batches; group 1 sits below its checkpoint.
        for i in 0..80u64 {
            let small = vec![i as u8; 1000];
            send_until_committed(&c, 0, 0x5A11 + u128::from(i), &[&small]).await;
        }
        let g = c.gauges(0);
        assert!(
            g.copied_forward.load(Ordering::Relaxed) > 0,
            "group 1's held prepare was copied forward"
        );
        assert!(
            g.wal_files_reclaimed.load(Ordering::Relaxed) > 0,
            "files reclaimed past group 1's first record"
        );
        let before = poll_all(c.host(0), 1);
        assert_eq!(before.0, 2, "group 1 holds its two messages");
        c.crash(0).await;
        c.start(0);
        until("group 1 recovered its batch", || {
            c.host(0).group_state(group(1)).is_some_and(|s| s.4 == 2)
                && poll_all(c.host(0), 1).0 == 2
        })
        .await;
        assert!(
            poll_all(c.host(0), 1).2 == before.2,
            "group 1's messages after the crash are the committed ones"
        );
        assert_eq!(c.stop(0).await, server::partition_group::Outcome::Stopped);
    });
}
