//! Scenario tests over the reference driver ([`crate::testing::Cluster`]).

use wire::Operation;

use crate::testing::Cluster;
use crate::types::{Frame, GroupId, Status};
use wire::header::Layout as _;

fn metadata(n: u8) -> Cluster {
    Cluster::new(n, GroupId::METADATA, |_| {})
}

/// Registers `client` at the primary `p` and returns its session (the Register op).
fn register(c: &mut Cluster, p: u8, client: u128) -> u64 {
    c.submit(
        p,
        Cluster::request(client, Operation::Register, 0, 0, vec![]),
    );
    let (_, frame) = c
        .replies
        .iter()
        .rev()
        .find(|(id, _)| id.0 == client)
        .expect("a register reply")
        .clone();
    reply_header(&frame).op.get()
}

/// A frame the core built as a Reply, viewed as one.
fn reply_header(frame: &Frame) -> &wire::header::ReplyHeader {
    wire::header::ReplyHeader::view(frame.bytes()).expect("a whole header")
}

#[test]
fn three_replicas_commit_and_apply_everywhere() {
    let mut c = metadata(3);
    let session = register(&mut c, 0, 7);
    assert_eq!(session, 1);
    for request in 1..=20 {
        c.submit(
            0,
            Cluster::request(
                7,
                Operation::CreateStream,
                session,
                request,
                vec![request as u8; 8],
            ),
        );
    }
    // Backups learn the last commits from the next prepare or heartbeat.
    c.ticks(60);
    for r in 0..3 {
        assert_eq!(c.replica(r).commit_min(), 21, "replica {r}");
        assert_eq!(c.replica(r).state_machine(), c.replica(0).state_machine());
        assert_eq!(
            c.replica(r).client_table_encoded(),
            c.replica(0).client_table_encoded()
        );
    }
    assert_eq!(c.replies.len(), 21);
}

#[test]
fn solo_replica_commits_alone() {
    let mut c = metadata(1);
    let session = register(&mut c, 0, 9);
    c.submit(
        0,
        Cluster::request(9, Operation::CreateStream, session, 1, vec![1]),
    );
    assert_eq!(c.replica(0).commit_min(), 2);
}

#[test]
fn duplicate_request_is_answered_from_the_table() {
    let mut c = metadata(3);
    let session = register(&mut c, 0, 7);
    let req = Cluster::request(7, Operation::CreateStream, session, 1, vec![1]);
    c.submit(0, req.clone());
    let first = c.replies.last().unwrap().1.clone();
    let op = c.replica(0).op();
    c.submit(0, req);
    assert_eq!(c.replica(0).op(), op, "not proposed again");
    assert_eq!(c.replies.last().unwrap().1, first, "replayed byte for byte");
}

#[test]
fn backup_without_session_gets_transient_and_no_session_gets_evicted() {
    let mut c = metadata(3);
    c.submit(
        1,
        Cluster::request(5, Operation::CreateStream, 1, 1, vec![]),
    );
    let (_, frame) = c.replies.last().unwrap();
    assert_eq!(frame.command(), Some(wire::Command::Reply));
    assert_eq!(&frame.body()[8..12], &58u32.to_le_bytes());
    c.submit(
        0,
        Cluster::request(5, Operation::CreateStream, 1, 1, vec![]),
    );
    let (_, frame) = c.replies.last().unwrap();
    assert_eq!(frame.command(), Some(wire::Command::Eviction));
}

#[test]
fn primary_crash_elects_a_new_primary_that_keeps_committed_ops() {
    let mut c = metadata(3);
    let session = register(&mut c, 0, 7);
    for request in 1..=5 {
        c.submit(
            0,
            Cluster::request(7, Operation::CreateStream, session, request, vec![1]),
        );
    }
    let committed = c.replica(0).commit_max();
    c.crash(0);
    c.ticks(700);
    let v = c.replica(1).view();
    assert!(v >= 1);
    let p = (v % 3) as u8;
    assert!(c.replica(p).is_primary(), "replica {p} leads view {v}");
    assert!(c.replica(p).commit_min() >= committed);
    // The new primary serves the same session.
    c.submit(
        p,
        Cluster::request(7, Operation::CreateStream, session, 6, vec![2]),
    );
    assert_eq!(c.replica(p).commit_min(), committed + 1);
    // The old primary restarts, probes, and catches up.
    c.restart(0);
    assert_eq!(c.replica(0).status(), Status::Recovering);
    c.ticks(400);
    assert_eq!(c.replica(0).status(), Status::Normal);
    assert_eq!(c.replica(0).view(), c.replica(p).view());
    assert_eq!(c.replica(0).commit_min(), c.replica(p).commit_min());
    assert_eq!(c.replica(0).state_machine(), c.replica(p).state_machine());
}

#[test]
fn isolated_backup_catches_up_by_repair() {
    let mut c = metadata(3);
    let session = register(&mut c, 0, 7);
    c.isolate(2, true);
    for request in 1..=40 {
        c.submit(
            0,
            Cluster::request(7, Operation::CreateStream, session, request, vec![3]),
        );
    }
    assert_eq!(c.replica(2).commit_min(), 0);
    c.isolate(2, false);
    c.ticks(200);
    assert_eq!(c.replica(2).commit_min(), c.replica(0).commit_min());
    assert_eq!(c.replica(2).state_machine(), c.replica(0).state_machine());
}

#[test]
fn partition_group_stamps_and_backups_rederive() {
    let group = GroupId::partition(wire::PartitionKey {
        stream: 1,
        topic: 1,
        partition: 3,
    })
    .unwrap();
    let mut c = Cluster::new(3, group, |_| {});
    for request in 1..=10u64 {
        let batch = crate::partition::build_batch(&[b"a", b"bb", b"ccc"]);
        let body = crate::partition::build_send_messages_request(&batch, 3);
        c.submit(
            0,
            Cluster::request(11, Operation::SendMessages, 1, request, body),
        );
    }
    c.ticks(60);
    for r in 0..3 {
        assert_eq!(c.replica(r).commit_min(), 10);
        assert_eq!(c.replica(r).next_offset(), 30);
        assert_eq!(c.replica(r).state_machine(), c.replica(0).state_machine());
    }
}

#[test]
fn five_replicas_survive_two_crashes() {
    let mut c = metadata(5);
    let session = register(&mut c, 0, 7);
    for request in 1..=5 {
        c.submit(
            0,
            Cluster::request(7, Operation::CreateStream, session, request, vec![4]),
        );
    }
    c.crash(0);
    c.crash(1);
    c.ticks(1500);
    let live: Vec<u8> = (2..5).collect();
    let primaries: Vec<u8> = live
        .iter()
        .copied()
        .filter(|r| c.replica(*r).is_primary())
        .collect();
    assert_eq!(primaries.len(), 1, "one primary among the survivors");
    for r in live {
        assert!(c.replica(r).commit_min() >= 6);
    }
}

#[test]
fn far_behind_backup_catches_up_by_state_transfer() {
    let mut c = Cluster::new(3, GroupId::METADATA, |raw| {
        raw.frame_cache_committed = 4;
        raw.headers_retained = 8;
    });
    let session = register(&mut c, 0, 7);
    c.isolate(2, true);
    for request in 1..=60 {
        c.submit(
            0,
            Cluster::request(7, Operation::CreateStream, session, request, vec![5]),
        );
    }
    // The primary's journal index no longer reaches op 1.
    assert!(c.replica(0).header(1).is_none());
    c.isolate(2, false);
    c.ticks(300);
    assert_eq!(c.replica(2).commit_min(), c.replica(0).commit_min());
    assert_eq!(c.replica(2).state_machine(), c.replica(0).state_machine());
    assert_eq!(
        c.replica(2).client_table_encoded(),
        c.replica(0).client_table_encoded()
    );
    assert!(!c.replica(2).is_transferring());
    assert!(
        c.sent[wire::Command::StateChunk.byte() as usize] > 0,
        "it transferred state"
    );
    assert!(c.sent[wire::Command::RangeEvicted.byte() as usize] > 0);
    // It keeps up afterwards.
    c.submit(
        0,
        Cluster::request(7, Operation::CreateStream, session, 61, vec![6]),
    );
    c.ticks(60);
    assert_eq!(c.replica(2).commit_min(), c.replica(0).commit_min());
}

/// The committed-frame cache is bounded in bytes as well as count: with room for 256 committed
/// frames but only 64 KiB, a primary committing 40 frames of ~8 KiB keeps the newest few in
/// memory and reads older ones back to serve a lagging backup's repair.
#[test]
fn committed_frame_cache_is_bounded_in_bytes() {
    let bound = 2 * wire::HEADER_SIZE as u64 * crate::constants::SUFFIX_ENTRIES_MAX as u64;
    let run = |bytes: u64| {
        let mut c = Cluster::new(3, GroupId::METADATA, |raw| {
            raw.max_message_size = bound as usize;
            raw.frame_cache_committed_bytes = bytes;
        });
        let session = register(&mut c, 0, 7);
        c.isolate(2, true);
        for request in 1..=40 {
            c.submit(
                0,
                Cluster::request(7, Operation::CreateStream, session, request, vec![5; 8000]),
            );
        }
        let p = c.replica(0);
        assert_eq!(p.commit_min(), 41);
        let cached: Vec<u64> = (1..=41)
            .filter(|op| p.journal.get(*op).is_some_and(|e| e.frame.is_some()))
            .collect();
        c.isolate(2, false);
        c.ticks(300);
        assert_eq!(
            c.replica(2).commit_min(),
            41,
            "the backup caught up by repair"
        );
        assert_eq!(c.replica(2).state_machine(), c.replica(0).state_machine());
        cached
    };
    let by_count = run(u64::MAX);
    assert_eq!(by_count, (1..=41).collect::<Vec<_>>(), "256 frames fit");
    let by_bytes = run(bound);
    assert!(
        by_bytes.len() >= 2 && by_bytes.len() <= 8,
        "64 KiB holds a few 8 KiB frames: {by_bytes:?}"
    );
    assert_eq!(by_bytes.last(), Some(&41), "the newest frames stay");
    assert!(
        by_bytes.windows(2).all(|w| w[1] == w[0] + 1),
        "one contiguous newest run: {by_bytes:?}"
    );
}

/// The partition twin of `far_behind_backup_catches_up_by_state_transfer`: the primary's checkpoints compact the gap away, so the
/// backup installs a SEGMENT_LOG offer (a partition receiver accepts nothing else, §11.2 step 3).
#[test]
fn far_behind_partition_backup_catches_up_by_state_transfer() {
    let group = GroupId::partition(wire::PartitionKey {
        stream: 1,
        topic: 1,
        partition: 3,
    })
    .unwrap();
    let mut c = Cluster::new(3, group, |raw| raw.checkpoint_interval_ops = 8);
    let send = |c: &mut Cluster, request: u64| {
        let batch = crate::partition::build_batch(&[b"m"]);
        let body = crate::partition::build_send_messages_request(&batch, 3);
        c.submit(
            0,
            Cluster::request(7, Operation::SendMessages, 1, request, body),
        );
    };
    c.isolate(2, true);
    for request in 1..=40 {
        send(&mut c, request);
    }
    assert_eq!(c.replica(0).commit_min(), 40);
    // The primary's snapshot floor is above everything the isolated backup holds.
    assert!(c.disks[0].snapshot.as_ref().is_some_and(|s| s.op >= 32));
    assert_eq!(c.replica(2).commit_min(), 0);
    c.isolate(2, false);
    c.ticks(300);
    assert_eq!(c.replica(2).commit_min(), 40);
    assert_eq!(c.replica(2).state_machine(), c.replica(0).state_machine());
    assert!(c.replica(2).state_machine().partition);
    assert!(!c.replica(2).is_transferring());
    assert_eq!(c.replica(2).transfers_installed(), 1);
    assert!(c.sent[wire::Command::StateChunk.byte() as usize] > 0);
    // It keeps up afterwards.
    send(&mut c, 41);
    c.ticks(60);
    assert_eq!(c.replica(2).commit_min(), 41);
}

/// A small randomized soak: loss, link cuts, crashes and restarts, with an agreement checker
/// after every tick and convergence after healing. The real simulator lives in `tests/`.
fn soak(seed: u64, n: u8, group: GroupId, ticks: u64) {
    soak_at(seed, n, group, ticks, None);
}

/// [`soak`] with `checkpoint_interval_ops` set (`None`: the group's default). Returns the state
/// transfers installed (counted at each crash and at the end).
fn soak_at(seed: u64, n: u8, group: GroupId, ticks: u64, interval: Option<u64>) -> u64 {
    use std::collections::BTreeMap;
    let mut c = Cluster::new(n, group, |raw| {
        if let Some(interval) = interval {
            raw.checkpoint_interval_ops = interval;
        }
    });
    let mut transfers = 0;
    c.seed = seed;
    c.loss_per_mille = 50;
    c.chaos = seed.is_multiple_of(2);
    let partition = !group.is_metadata();
    let mut applied: BTreeMap<u64, u128> = BTreeMap::new();
    let mut seen = vec![0u64; n as usize];
    let mut sessions: BTreeMap<u8, u64> = BTreeMap::new();
    let mut request = 0u64;
    let mut replied_max = 0u64;
    let mut check = |c: &Cluster, seen: &mut Vec<u64>| {
        for r in 0..n {
            let Some(replica) = c.replicas[r as usize].as_ref() else {
                continue;
            };
            let cm = replica.commit_min();
            assert!(
                cm >= seen[r as usize] || seen[r as usize] == u64::MAX,
                "seed {seed}: commit_min regressed"
            );
            for op in seen[r as usize] + 1..=cm {
                if let Some(h) = replica.header(op) {
                    let id = h.frame.checksum.get();
                    let prior = *applied.entry(op).or_insert(id);
                    assert_eq!(
                        prior, id,
                        "seed {seed}: replicas applied different ops at {op}"
                    );
                }
            }
            seen[r as usize] = cm;
        }
    };
    for t in 0..ticks {
        let roll = c.random() % 1000;
        if roll < 3 {
            let r = (c.random() % u64::from(n)) as u8;
            if c.replicas[r as usize].is_some() && c.replicas.iter().flatten().count() > 1 {
                transfers += c.replica(r).transfers_installed();
                c.crash(r);
            }
        } else if roll < 13 {
            let r = (c.random() % u64::from(n)) as u8;
            if c.replicas[r as usize].is_none() {
                c.restart(r);
                // Restart replays: the applied frontier may restart lower.
                seen[r as usize] = c.replica(r).commit_min();
            }
        } else if roll < 20 {
            let (a, b) = (
                (c.random() % u64::from(n)) as u8,
                (c.random() % u64::from(n)) as u8,
            );
            if a != b {
                let up = c.random().is_multiple_of(2);
                c.set_link(a, b, up);
            }
        }
        if t.is_multiple_of(3) {
            let live: Vec<u8> = (0..n)
                .filter(|r| c.replicas[*r as usize].is_some())
                .collect();
            if let Some(&p) = live.iter().find(|r| c.replica(**r).is_primary()) {
                request += 1;
                let client = 1000 + u128::from(request % 4);
                if partition {
                    let batch = crate::partition::build_batch(&[b"m"]);
                    let body = crate::partition::build_send_messages_request(&batch, 3);
                    c.step(
                        crate::ReplicaId(p),
                        crate::Input::Request(Cluster::request(
                            client,
                            Operation::SendMessages,
                            1,
                            request,
                            body,
                        )),
                    );
                } else {
                    let key = (client % 4) as u8;
                    match sessions.get(&key) {
                        None => c.step(
                            crate::ReplicaId(p),
                            crate::Input::Request(Cluster::request(
                                client,
                                Operation::Register,
                                0,
                                0,
                                vec![],
                            )),
                        ),
                        Some(s) => c.step(
                            crate::ReplicaId(p),
                            crate::Input::Request(Cluster::request(
                                client,
                                Operation::CreateStream,
                                *s,
                                request,
                                vec![1],
                            )),
                        ),
                    }
                }
            }
        }
        c.tick();
        if std::env::var("SOAK_TRACE").is_ok() {
            let state: Vec<String> = (0..n)
                .map(|r| match c.replicas[r as usize].as_ref() {
                    Some(x) => format!(
                        "{}:{:?}/v{}/lv{}/op{}/cm{}/cx{}",
                        r, x.status, x.view, x.log_view, x.op, x.commit_min, x.commit_max
                    ),
                    None => format!("{r}:down"),
                })
                .collect();
            eprintln!("T{t} {}", state.join(" "));
        }
        for (_, frame) in &c.replies {
            let committed = frame.command() == Some(wire::Command::Reply)
                && reply_header(frame).timestamp.get() != 0;
            if committed {
                replied_max = replied_max.max(reply_header(frame).op.get());
            }
        }
        for (client, frame) in &c.replies {
            if frame.command() == Some(wire::Command::Reply)
                && reply_header(frame).operation == Operation::Register.byte()
                && frame.body().len() > 12
            {
                let key = (client.0 % 4) as u8;
                let epoch = reply_header(frame).op.get();
                sessions.insert(key, epoch);
            }
        }
        c.replies.clear();
        check(&c, &mut seen);
    }
    // Heal everything and require convergence.
    c.loss_per_mille = 0;
    for r in 0..n {
        c.isolate(r, false);
        if c.replicas[r as usize].is_none() {
            c.restart(r);
            seen[r as usize] = c.replica(r).commit_min();
        }
    }
    for _ in 0..6000 {
        c.tick();
        check(&c, &mut seen);
        let top = (0..n).map(|r| c.replica(r).commit_max()).max().unwrap();
        if (0..n)
            .all(|r| c.replica(r).commit_min() == top && c.replica(r).status() == Status::Normal)
        {
            break;
        }
    }
    let top = c.replica(0).commit_min();
    assert!(
        top >= replied_max,
        "seed {seed}: op {replied_max} was replied, the cluster is at {top}"
    );
    for r in 0..n {
        if c.replica(r).commit_min() != top {
            let x = c.replica(r);
            let holes: Vec<u64> = (x.commit_min + 1..=x.op)
                .filter(|o| x.journal.get(*o).is_none())
                .take(10)
                .collect();
            eprintln!(
                "DEBUG r{r}: holes {holes:?} pending {:?} session {:?} view_headers {:?} base {} next_offset {} transfer {:?}",
                x.repair.pending.keys().take(5).collect::<Vec<_>>(),
                x.repair.session,
                x.view_headers.keys().take(5).collect::<Vec<_>>(),
                x.journal.base(),
                x.next_offset,
                x.transfer.stage
            );
            if let Some(e) = x.journal.get(x.commit_min + 1) {
                eprintln!(
                    "DEBUG next entry durable {} frame {}",
                    e.durable,
                    e.frame.is_some()
                );
            }
        }
        assert_eq!(
            (c.replica(r).status(), c.replica(r).commit_min()),
            (Status::Normal, top),
            "seed {seed}: replica {r} did not converge (views {:?})",
            (0..n)
                .map(|r| (
                    c.replica(r).view(),
                    c.replica(r).status(),
                    c.replica(r).commit_min(),
                    c.replica(r).commit_max(),
                    c.replica(r).op()
                ))
                .collect::<Vec<_>>()
        );
        assert_eq!(
            c.replica(r).state_machine().digest,
            c.replica(0).state_machine().digest,
            "seed {seed}"
        );
        // Client tables are equal modulo the view bytes of cached replies (wire.md §11.6).
        let masked = |r: u8| {
            let mut t = c.replica(r).clients.clone();
            for session in t.sessions.values_mut() {
                for reply in &mut session.replies {
                    reply.frame[52..56].fill(0);
                }
            }
            t
        };
        assert_eq!(masked(r), masked(0), "seed {seed}: client tables differ");
    }
    transfers
        + (0..n)
            .map(|r| c.replica(r).transfers_installed())
            .sum::<u64>()
}

/// Seeds per soak test: `STRAND_SOAK_SEEDS` (default small, so `cargo test` stays fast).
fn soak_seeds(default: u64) -> u64 {
    std::env::var("STRAND_SOAK_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[test]
fn soak_metadata_three() {
    for seed in 1..=soak_seeds(12) {
        soak(seed, 3, GroupId::METADATA, 1500);
    }
}

#[test]
fn soak_metadata_five() {
    for seed in 100..100 + soak_seeds(6) {
        soak(seed, 5, GroupId::METADATA, 1500);
    }
}

#[test]
fn soak_partition_three() {
    let group = GroupId::partition(wire::PartitionKey {
        stream: 1,
        topic: 1,
        partition: 3,
    })
    .unwrap();
    for seed in 200..200 + soak_seeds(8) {
        soak(seed, 3, group, 1500);
    }
}

/// Partition groups at a small checkpoint interval: lagging replicas find their gap compacted
/// away and catch up by state transfer (SEGMENT_LOG artifacts), not by journal repair.
#[test]
fn soak_partition_three_transfers() {
    let group = GroupId::partition(wire::PartitionKey {
        stream: 1,
        topic: 1,
        partition: 3,
    })
    .unwrap();
    let mut transfers = 0;
    for seed in 200..200 + soak_seeds(8) {
        transfers += soak_at(seed, 3, group, 1500, Some(16));
    }
    assert!(transfers > 0, "no partition state transfer was exercised");
}

#[test]
fn soak_metadata_two_and_four() {
    for seed in (300..300 + soak_seeds(4)).chain([361]) {
        soak(seed, 2, GroupId::METADATA, 1500);
        soak(seed, 4, GroupId::METADATA, 1500);
    }
}

#[test]
fn a_primary_that_can_send_but_not_receive_is_replaced() {
    let mut c = metadata(3);
    let session = register(&mut c, 0, 7);
    // Nothing reaches the primary any more; it still reaches everyone.
    c.cut[32] = true;
    c.cut[2 * 32] = true;
    c.submit(
        0,
        Cluster::request(7, Operation::CreateStream, session, 1, vec![1]),
    );
    c.ticks(1500);
    let v = c.replica(1).view();
    assert!(v >= 1, "the backups elected");
    let p = (v % 3) as u8;
    assert!(c.replica(p).is_primary());
    assert!(c.replica(p).commit_min() >= 1);
}

#[test]
fn debug_seed() {
    let Ok(seed) = std::env::var("SOAK_SEED") else {
        return;
    };
    let group = GroupId::partition(wire::PartitionKey {
        stream: 1,
        topic: 1,
        partition: 3,
    })
    .unwrap();
    soak(seed.parse().unwrap(), 3, group, 1500);
}
