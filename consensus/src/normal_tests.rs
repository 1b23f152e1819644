//! Handler tests for normal operation: one replica in a given state, one input, the exact
//! effects out.

// Setup steps feed inputs whose outcome the test does not inspect.
#![allow(unused_must_use)]
use wire::Operation;
use wire::header::{Layout, ReplyHeader};

use crate::Ignored;
use crate::io::{Completion, Effect, Input};
use crate::test_support::*;
use crate::testing::Cluster;
use crate::types::{ClientId, ReplicaId, Status};

/// A fresh primary's prepare of a Register (op 1), its append requested.
fn propose_register(p: &mut R) -> crate::Frame {
    let (_, effects) = input(
        p,
        Input::Request(Cluster::request(0x77, Operation::Register, 0, 0, vec![])),
    );
    let Effect::Append { frame, .. } = effects[1].clone() else {
        panic!()
    };
    frame
}

#[test]
fn primary_projects_forwards_then_appends() {
    let mut p = fresh(3, 0);
    let request = Cluster::request(0x77, Operation::Register, 0, 0, vec![]);
    let (result, effects) = input(&mut p, Input::Request(request));
    assert_eq!(result, Ok(()));
    let Effect::Append { op: 1, frame } = &effects[1] else {
        panic!("{effects:?}");
    };
    assert_eq!(effects, vec![send(1, frame.clone()), effects[1].clone()]);
    let h = frame.prepare_header().unwrap();
    assert_eq!(
        (
            h.op.get(),
            h.frame.view.get(),
            h.parent.get(),
            h.commit.get()
        ),
        (1, 0, 0, 0)
    );
    assert_eq!(h.timestamp.get(), NOW.realtime_us);
    assert_eq!(p.op(), 1);
    assert_eq!(p.pipeline_len(), 1);
}

#[test]
fn primary_commits_on_quorum_and_replies() {
    let mut p = fresh(3, 0);
    let request = Cluster::request(0x77, Operation::Register, 0, 0, vec![]);
    let (_, effects) = input(&mut p, Input::Request(request));
    let Effect::Append { frame, .. } = &effects[1] else {
        panic!()
    };
    let frame = frame.clone();
    // Own durable append: one ack of two.
    assert_eq!(input(&mut p, appended(&frame)), (Ok(()), vec![]));
    assert_eq!(p.commit_max(), 0);
    // The backup's ack completes the quorum: commit, apply, reply.
    let (result, effects) = feed(&mut p, 1, &prepare_ok(0, 1, &frame, 0));
    assert_eq!(result, Ok(()));
    assert_eq!(p.commit_min(), 1);
    let [
        Effect::Reply {
            client,
            frame: reply,
        },
    ] = effects.as_slice()
    else {
        panic!("{effects:?}");
    };
    assert_eq!(*client, ClientId(0x77));
    let h = ReplyHeader::view(reply.bytes()).unwrap();
    assert_eq!((h.op.get(), h.commit.get(), h.status.get()), (1, 1, 0));
    // A duplicate ack changes nothing.
    assert_eq!(
        feed(&mut p, 1, &prepare_ok(0, 1, &frame, 0)),
        (Err(Ignored::UnknownPrepare), vec![])
    );
}

#[test]
fn prepare_ok_from_another_view_or_unknown_prepare_is_ignored() {
    let mut p = fresh(3, 0);
    let other = prepare(0, 0, 1, 0, 0, b"x");
    assert_eq!(
        feed(&mut p, 1, &prepare_ok(0, 1, &other, 0)),
        (Err(Ignored::UnknownPrepare), vec![])
    );
    assert_eq!(
        feed(&mut p, 1, &prepare_ok(1, 1, &other, 0)),
        (Err(Ignored::ViewNew), vec![])
    );
    let mut b = fresh(3, 1);
    assert_eq!(
        feed(&mut b, 2, &prepare_ok(0, 2, &other, 0)),
        (Err(Ignored::NotPrimary), vec![])
    );
}

#[test]
fn backup_forwards_along_the_chain_and_appends() {
    let c = chain(0, 0, 1);
    let mut b1 = fresh(3, 1);
    assert_eq!(
        feed(&mut b1, 0, &c[0]),
        (
            Ok(()),
            vec![
                send(2, c[0].clone()),
                Effect::Append {
                    op: 1,
                    frame: c[0].clone()
                }
            ]
        )
    );
    // The last backup before the primary ends the chain.
    let mut b2 = fresh(3, 2);
    assert_eq!(
        feed(&mut b2, 1, &c[0]),
        (
            Ok(()),
            vec![Effect::Append {
                op: 1,
                frame: c[0].clone()
            }]
        )
    );
}

#[test]
fn chain_skips_disconnected_peers() {
    let c = chain(0, 0, 1);
    let mut b1 = fresh(4, 1);
    input(
        &mut b1,
        Input::PeerConnection {
            peer: ReplicaId(2),
            connected: false,
        },
    );
    let (_, effects) = feed(&mut b1, 0, &c[0]);
    assert_eq!(effects[0], send(3, c[0].clone()));
}

#[test]
fn backup_acks_only_after_the_durable_append() {
    let c = chain(0, 0, 1);
    let mut b = fresh(3, 2);
    feed(&mut b, 1, &c[0]);
    let (result, effects) = input(&mut b, appended(&c[0]));
    assert_eq!(result, Ok(()));
    assert_eq!(effects, vec![send(0, prepare_ok(0, 2, &c[0], 0))]);
    // A completion for another identity is stale.
    let other = prepare(0, 0, 1, 0, 0, b"other");
    assert_eq!(
        input(&mut b, appended(&other)),
        (Err(Ignored::StaleCompletion), vec![])
    );
}

#[test]
fn duplicate_prepare_is_reforwarded_and_reacked() {
    let c = chain(0, 0, 1);
    let mut b = fresh(3, 1);
    feed(&mut b, 0, &c[0]);
    input(&mut b, appended(&c[0]));
    let (result, effects) = feed(&mut b, 0, &c[0]);
    // Acted on (re-forwarded, re-acked): not an ignored input.
    assert_eq!(result, Ok(()));
    assert_eq!(
        effects,
        vec![send(2, c[0].clone()), send(0, prepare_ok(0, 1, &c[0], 0))]
    );
}

/// `Err(Ignored)` means nothing was done: a committed prepare we hold is re-acked (`Ok`), one
/// we do not hold is ignored without effects; a stale heartbeat carrying a newer commit point
/// advances the commit (`Ok`), one that does not is ignored.
#[test]
fn an_input_that_was_acted_on_is_not_ignored() {
    let c = chain(0, 0, 2);
    let mut b = fresh(3, 1);
    journal(&mut b, &c);
    // Heartbeat (counter 5) commits op 1 only.
    assert_eq!(feed(&mut b, 0, &commit_frame(0, 0, 1, 5)).0, Ok(()));
    assert_eq!(b.commit_min(), 1);
    let (result, effects) = feed(&mut b, 0, &c[0]);
    assert_eq!(result, Ok(()));
    assert_eq!(effects, vec![send(0, prepare_ok(0, 1, &c[0], 1))]);
    let other = prepare(0, 0, 1, 0, 0, b"other");
    assert_eq!(feed(&mut b, 0, &other), (Err(Ignored::Committed), vec![]));
    // A stale counter (4 < 5) with commit 2: op 2 is executed, so the input was acted on.
    let (result, _) = feed(&mut b, 0, &commit_frame(0, 0, 2, 4));
    assert_eq!(result, Ok(()));
    assert_eq!(b.commit_min(), 2);
    assert_eq!(
        feed(&mut b, 0, &commit_frame(0, 0, 2, 4)),
        (Err(Ignored::StaleHeartbeat), vec![])
    );
    // A prepare above a gap is not journaled, but its commit point executes ops 1 and 2.
    let mut b = fresh(3, 1);
    journal(&mut b, &c);
    let gap = prepare(0, 0, 4, 0, 2, b"four");
    assert_eq!(feed(&mut b, 0, &gap).0, Ok(()));
    assert_eq!(b.commit_min(), 2);
    let gap = prepare(0, 0, 5, 0, 2, b"five");
    assert_eq!(feed(&mut b, 0, &gap).0, Err(Ignored::Gap));
}

#[test]
fn gaps_chain_breaks_and_foreign_views_are_dropped() {
    let c = chain(0, 0, 3);
    let mut b = fresh(3, 1);
    // Not journaled above a gap, but forwarded: the next hop may hold what this one lacks
    // (decision 504).
    assert_eq!(
        feed(&mut b, 0, &c[1]),
        (Err(Ignored::Gap), vec![send(2, c[1].clone())])
    );
    feed(&mut b, 0, &c[0]);
    let forged = prepare(0, 0, 2, 12345, 0, b"forged");
    assert_eq!(feed(&mut b, 0, &forged), (Err(Ignored::ChainBreak), vec![]));
    let newer = prepare(2, 2, 2, checksum(&c[0]), 0, b"n");
    assert_eq!(feed(&mut b, 2, &newer), (Err(Ignored::ViewNew), vec![]));
    assert_eq!(b.observed_newer_view, 2);
}

#[test]
fn prepares_carry_the_commit_point_and_backups_apply() {
    let c = chain(0, 0, 2);
    let mut b = fresh(3, 2);
    feed(&mut b, 1, &c[0]);
    let second = prepare(0, 0, 2, checksum(&c[0]), 1, &[2]);
    feed(&mut b, 1, &second);
    assert_eq!(b.commit_max(), 1);
    assert_eq!(b.commit_min(), 1, "the backup walked its journal");
}

#[test]
fn primary_retransmits_directly_to_replicas_missing_an_ack() {
    let mut p = fresh(3, 0);
    let frame = propose_register(&mut p);
    input(&mut p, appended(&frame));
    for _ in 0..24 {
        let (_, effects) = input(&mut p, Input::Tick);
        assert!(effects.iter().all(|e| !matches!(e, Effect::Send { .. })));
    }
    let (_, effects) = input(&mut p, Input::Tick);
    assert_eq!(
        effects,
        vec![send(1, frame.clone()), send(2, frame.clone())]
    );
}

#[test]
fn commit_heartbeat_every_interval_with_a_growing_counter() {
    let mut p = fresh(3, 0);
    for _ in 0..49 {
        assert_eq!(input(&mut p, Input::Tick).1, vec![]);
    }
    let (_, effects) = input(&mut p, Input::Tick);
    assert_eq!(effects, broadcast(3, 0, &commit_frame(0, 0, 0, 1)));
}

#[test]
fn backup_accepts_fresh_heartbeats_and_repairs_when_behind() {
    let mut b = fresh(3, 1);
    let (result, effects) = feed(&mut b, 0, &commit_frame(0, 0, 3, 1));
    assert_eq!(result, Ok(()));
    assert_eq!(b.commit_max(), 3);
    let [Effect::Send { to, frame }] = effects.as_slice() else {
        panic!("{effects:?}")
    };
    assert_eq!(*to, ReplicaId(0));
    assert_eq!(frame.command(), Some(wire::Command::RequestPrepares));
    // The same counter again is stale; an older view is old.
    assert_eq!(
        feed(&mut b, 0, &commit_frame(0, 0, 3, 1)).0,
        Err(Ignored::StaleHeartbeat)
    );
    assert_eq!(
        feed(&mut b, 2, &commit_frame(0, 2, 3, 9)).0,
        Err(Ignored::WrongSender)
    );
}

#[test]
fn heartbeat_timeout_starts_a_view_change_gated_on_the_superblock() {
    let mut b = fresh(3, 1);
    let mut last = vec![];
    for _ in 0..1000 {
        let (_, effects) = input(&mut b, Input::Tick);
        if !effects.is_empty() {
            last = effects;
            break;
        }
    }
    assert_eq!(b.status(), Status::ViewChange);
    assert_eq!(b.view(), 1);
    // Nothing view-scoped leaves before the superblock records view 1.
    assert_eq!(
        last,
        vec![Effect::PersistVsrState(crate::VsrState {
            view: 1,
            log_view: 0,
            commit_max: 0,
            lost_state: false,
            ..Default::default()
        })]
    );
}

#[cfg(feature = "bug-knobs")]
#[test]
fn bug_knob_acks_before_the_append_completes() {
    let mut raw = raw(3, 2);
    raw.bug_knobs.ack_before_append = true;
    let mut b = boot(raw);
    let c = chain(0, 0, 1);
    let (_, effects) = feed(&mut b, 1, &c[0]);
    assert_eq!(
        effects,
        vec![
            Effect::Append {
                op: 1,
                frame: c[0].clone()
            },
            send(0, prepare_ok(0, 2, &c[0], 0))
        ]
    );
}

#[test]
fn backup_refuses_a_send_messages_stamp_it_cannot_rederive() {
    use crate::partition::{build_batch, stamp};
    use wire::header::{FrameHeader, Layout, PrepareHeader};
    let group = crate::GroupId::partition(wire::PartitionKey {
        stream: 1,
        topic: 1,
        partition: 3,
    })
    .unwrap();
    let mut b = boot(crate::RawConfig::new(CLUSTER, ReplicaId(2), 3, group));
    let build = |base_offset: u64, partition: u64| {
        let mut batch = build_batch(&[b"m"]);
        stamp(&mut batch, partition, base_offset, 1_001);
        let mut h = PrepareHeader::zeroed();
        h.frame = FrameHeader::new(wire::Command::Prepare, sender(0, 0));
        h.client.set(5);
        h.op.set(1);
        h.timestamp.set(1_001);
        h.operation = Operation::SendMessages.byte();
        h.group.set(group.0);
        crate::frames::finish(h, &batch)
    };
    assert_eq!(feed(&mut b, 1, &build(7, 3)), (Err(Ignored::Stamp), vec![]));
    assert_eq!(feed(&mut b, 1, &build(0, 4)), (Err(Ignored::Stamp), vec![]));
    let good = build(0, 3);
    assert_eq!(
        feed(&mut b, 1, &good),
        (
            Ok(()),
            vec![Effect::Append {
                op: 1,
                frame: good.clone()
            }]
        )
    );
    assert_eq!(b.next_offset(), 1);
}

#[test]
fn backup_refuses_a_prepare_whose_batch_does_not_hash() {
    // The core verifies a batch in full only where it enters (decision 262): a backup must
    // refuse a damaged message or batch checksum before journaling, acking or forwarding.
    use crate::partition::{build_batch, stamp};
    use wire::header::{FrameHeader, Layout, PrepareHeader};
    let group = crate::GroupId::partition(wire::PartitionKey {
        stream: 1,
        topic: 1,
        partition: 3,
    })
    .unwrap();
    let mut batch = build_batch(&[b"message", b"other"]);
    stamp(&mut batch, 3, 0, 1_001);
    for at in [wire::batch::HEADER_SIZE + 60, 24] {
        let mut bad = batch.clone();
        bad[at] ^= 1;
        let mut h = PrepareHeader::zeroed();
        h.frame = FrameHeader::new(wire::Command::Prepare, sender(0, 0));
        h.client.set(5);
        h.op.set(1);
        h.timestamp.set(1_001);
        h.operation = Operation::SendMessages.byte();
        h.group.set(group.0);
        let mut b = boot(crate::RawConfig::new(CLUSTER, ReplicaId(1), 3, group));
        let frame = crate::frames::finish(h, &bad);
        assert_eq!(
            feed(&mut b, 0, &frame),
            (Err(Ignored::Stamp), vec![]),
            "byte {at}"
        );
        assert_eq!(b.next_offset(), 0);
    }
}

#[test]
fn a_shared_prepare_is_journaled_and_forwarded_without_a_copy() {
    use crate::partition::{build_batch, stamp};
    use wire::header::{FrameHeader, Layout, PrepareHeader};
    let group = crate::GroupId::partition(wire::PartitionKey {
        stream: 1,
        topic: 1,
        partition: 3,
    })
    .unwrap();
    let mut batch = build_batch(&[b"m", b"nn"]);
    stamp(&mut batch, 3, 0, 1_001);
    let mut h = PrepareHeader::zeroed();
    h.frame = FrameHeader::new(wire::Command::Prepare, sender(0, 0));
    h.client.set(5);
    h.op.set(1);
    h.timestamp.set(1_001);
    h.operation = Operation::SendMessages.byte();
    h.group.set(group.0);
    let prepare = crate::frames::finish(h, &batch);
    // Replica 1 is mid-chain: it journals the prepare and forwards it to replica 2.
    let mut borrowed = boot(crate::RawConfig::new(CLUSTER, ReplicaId(1), 3, group));
    let mut shared = boot(crate::RawConfig::new(CLUSTER, ReplicaId(1), 3, group));
    let copied = input(
        &mut borrowed,
        Input::Frame {
            from: ReplicaId(0),
            frame: prepare.bytes(),
        },
    );
    let kept = input(
        &mut shared,
        Input::SharedFrame {
            from: ReplicaId(0),
            frame: prepare.clone(),
        },
    );
    assert_eq!(kept, copied, "the same effects either way");
    assert_eq!(kept.0, Ok(()));
    let frames: Vec<&crate::Frame> = kept
        .1
        .iter()
        .filter_map(|e| match e {
            Effect::Append { frame, .. } | Effect::Send { frame, .. } => Some(frame),
            _ => None,
        })
        .collect();
    assert_eq!(frames.len(), 2, "{:?}", kept.1);
    for frame in frames {
        assert_eq!(
            frame.bytes().as_ptr(),
            prepare.bytes().as_ptr(),
            "shared, not copied"
        );
    }
    assert!(shared.incoming.is_none(), "held only during the step");
    assert_eq!(shared.next_offset(), 2);
}

#[test]
fn a_send_messages_request_becomes_its_prepare_in_its_own_buffer() {
    // Decision 460: a request body with a header's room spare is moved into place, not copied
    // into a fresh allocation; the prepare's bytes are those of the copying path.
    use crate::partition::{build_batch, build_send_messages_request, stamp};
    let group = crate::GroupId::partition(wire::PartitionKey {
        stream: 1,
        topic: 1,
        partition: 3,
    })
    .unwrap();
    let batch = build_batch(&[b"first", b"second", b"third"]);
    let request_body = build_send_messages_request(&batch, 3);
    let mut roomy = Vec::with_capacity(request_body.len() + wire::HEADER_SIZE);
    roomy.extend_from_slice(&request_body);
    let allocation = roomy.as_ptr();
    let mut in_place = boot(crate::RawConfig::new(CLUSTER, ReplicaId(0), 3, group));
    let mut copied = boot(crate::RawConfig::new(CLUSTER, ReplicaId(0), 3, group));
    let request = |body| Cluster::request(11, Operation::SendMessages, 1, 1, body);
    let (moved, effects) = input(&mut in_place, Input::Request(request(roomy)));
    // The same body with no room spare: reallocated, same bytes.
    let (_, copied_effects) = input(&mut copied, Input::Request(request(request_body)));
    assert_eq!(moved, Ok(()));
    assert_eq!(effects, copied_effects, "the same prepare either way");
    let Some(Effect::Append { op: 1, frame }) = effects.last() else {
        panic!("{effects:?}");
    };
    assert_eq!(
        frame.bytes().as_ptr(),
        allocation,
        "the request's own buffer"
    );
    let mut expected = batch.clone();
    stamp(&mut expected, 3, 0, NOW.realtime_us);
    assert_eq!(frame.body(), expected.as_slice());
    assert_eq!(in_place.next_offset(), 3);
}

#[test]
fn header_room_is_made_in_place_or_by_growing() {
    use crate::frames::into_header_room;
    let room = wire::HEADER_SIZE;
    for start in [0, 1, 23, room - 1, room, room + 1, 700] {
        let body: Vec<u8> = (0..start + 900).map(|i| (i % 251) as u8).collect();
        let batch = body[start..].to_vec();
        // Exact capacity (a clone): grown or shifted left, same bytes.
        let grown = into_header_room(body.clone(), start);
        assert_eq!(grown.len(), room + batch.len(), "start {start}");
        assert_eq!(&grown[room..], batch.as_slice(), "start {start}");
        // A header's room spare: the same allocation.
        let mut roomy = Vec::with_capacity(body.len() + room);
        roomy.extend_from_slice(&body);
        let pointer = roomy.as_ptr();
        let moved = into_header_room(roomy, start);
        assert_eq!(moved.as_ptr(), pointer, "start {start}: moved in place");
        assert_eq!(&moved[room..], batch.as_slice(), "start {start}");
    }
}

#[test]
fn metadata_admission_dedups_in_flight_clients_and_parks_overflow() {
    let mut raw = raw(3, 0);
    raw.prepare_queue_depth = 1;
    raw.request_queue_depth = 1;
    let mut p = boot(raw);
    let register = |c| Input::Request(Cluster::request(c, Operation::Register, 0, 0, vec![]));
    assert_eq!(input(&mut p, register(1)).0, Ok(()));
    // The same client again while its register is in flight: "not committed yet".
    let (result, effects) = input(&mut p, register(1));
    assert_eq!(result, Err(Ignored::Refused));
    let [Effect::Reply { frame, .. }] = effects.as_slice() else {
        panic!("{effects:?}")
    };
    assert_eq!(&frame.body()[8..12], &57u32.to_le_bytes());
    // A second client parks in the request queue, a third overflows.
    assert_eq!(input(&mut p, register(2)), (Ok(()), vec![]));
    assert_eq!(p.request_queue_len(), 1);
    assert_eq!(
        input(&mut p, register(3)),
        (Err(Ignored::QueueFull), vec![])
    );
}

#[test]
fn a_failed_append_stops_the_process_even_as_primary() {
    let mut p = fresh(3, 0);
    let frame = propose_register(&mut p);
    let h = frame.prepare_header().unwrap();
    let (_, effects) = input(
        &mut p,
        Input::Done(Completion::AppendFailed {
            op: 1,
            checksum: h.frame.checksum.get(),
        }),
    );
    assert_eq!(
        effects,
        vec![Effect::Fatal(crate::FatalReason::AppendFailed { op: 1 })]
    );
}

#[test]
fn a_fresh_group_acts_only_after_its_first_superblock() {
    let mut out = crate::Outbox::new();
    let mut p = crate::Replica::new(
        raw(3, 0).validate().unwrap(),
        crate::Recovered::fresh(3),
        crate::DigestStateMachine::default(),
        &mut out,
    );
    assert_eq!(
        out.drain().collect::<Vec<_>>(),
        vec![Effect::PersistVsrState(crate::VsrState::default())]
    );
    let (result, effects) = input(
        &mut p,
        Input::Request(Cluster::request(0x77, Operation::Register, 0, 0, vec![])),
    );
    assert_eq!(result, Err(Ignored::Refused));
    assert!(matches!(effects.as_slice(), [Effect::Reply { .. }]));
    // No heartbeat either.
    for _ in 0..60 {
        let (_, effects) = input(&mut p, Input::Tick);
        assert!(effects.iter().all(|e| !matches!(e, Effect::Send { .. })));
    }
}

#[test]
fn a_heartbeat_starts_repair_when_the_commit_point_came_from_a_prepare() {
    let c = chain(0, 0, 3);
    let mut b = fresh(3, 2);
    // Op 3 arrives first (a gap): its commit field says 2 is committed.
    let third = prepare(0, 0, 3, checksum(&c[1]), 2, &[3]);
    feed(&mut b, 1, &third);
    assert_eq!((b.commit_max(), b.commit_min()), (2, 0));
    // The heartbeat does not advance commit_max, but the replica is behind: repair.
    let (_, effects) = feed(&mut b, 0, &commit_frame(0, 0, 2, 1));
    let (to, frame) = sent(&effects[0]);
    assert_eq!(
        (to, frame.command()),
        (0, Some(wire::Command::RequestPrepares))
    );
}

/// Decision 72 (consensus.md §17.7): a primary whose clock runs ahead stamps its prepares with
/// its future; a backup whose clock is more than `timestamp_ahead_max_us` behind that stamp
/// forwards the prepare down the chain but neither journals nor acks it, so the op cannot
/// commit (nor pin every later timestamp) unless a quorum's clocks agree with it. A stamp
/// exactly at the window's edge is accepted.
#[test]
fn a_primary_clock_ahead_of_the_window_gets_no_acks() {
    let window = raw(3, 1).timestamp_ahead_max_us;
    let propose_at = |skew_us: u64| {
        let mut p = fresh(3, 0);
        let skewed = crate::types::Now {
            tick: NOW.tick,
            realtime_us: NOW.realtime_us + skew_us,
        };
        let mut out = crate::io::Outbox::new();
        let request = Cluster::request(0x77, Operation::Register, 0, 0, vec![]);
        p.step(skewed, Input::Request(request), &mut out)
            .expect("proposed");
        let effects: Vec<Effect> = out.drain().collect();
        let Effect::Append { frame, .. } = effects[1].clone() else {
            panic!("{effects:?}")
        };
        assert_eq!(
            frame.prepare_header().unwrap().timestamp.get(),
            NOW.realtime_us + skew_us
        );
        (p, frame)
    };

    // One microsecond past the window: forwarded, not journaled, never acked.
    let (mut p, ahead) = propose_at(window + 1);
    let mut b1 = fresh(3, 1);
    assert_eq!(
        feed(&mut b1, 0, &ahead),
        (Err(Ignored::ClockAhead), vec![send(2, ahead.clone())])
    );
    assert_eq!((b1.op(), b1.header(1)), (0, None));
    let mut b2 = fresh(3, 2);
    assert_eq!(feed(&mut b2, 1, &ahead), (Err(Ignored::ClockAhead), vec![]));
    // Retransmissions fare no better, so the runaway primary never reaches a quorum.
    assert_eq!(feed(&mut b2, 0, &ahead), (Err(Ignored::ClockAhead), vec![]));
    input(&mut p, appended(&ahead));
    assert_eq!((p.commit_max(), p.pipeline_len()), (0, 1));

    // At the window's edge: journaled, and acked once durable.
    let (_, edge) = propose_at(window);
    let mut b2 = fresh(3, 2);
    assert_eq!(
        feed(&mut b2, 1, &edge),
        (
            Ok(()),
            vec![Effect::Append {
                op: 1,
                frame: edge.clone()
            }]
        )
    );
    assert_eq!(
        input(&mut b2, appended(&edge)),
        (Ok(()), vec![send(0, prepare_ok(0, 2, &edge, 0))])
    );
}

/// Server decision 395: with `acks_carry_applied` a backup's PrepareOk says how far it has
/// applied (`commit_min`), not how far it knows the group committed (`commit_max`).
#[test]
fn acks_carry_the_applied_point_when_configured() {
    let c = chain(0, 0, 2);
    for (carry, field) in [(false, 5), (true, 2)] {
        let mut config = raw(3, 1);
        config.acks_carry_applied = carry;
        let mut b = boot(config);
        journal(&mut b, &c);
        // The group committed op 5; this backup holds and applies ops 1 and 2 only.
        feed(&mut b, 0, &commit_frame(0, 0, 5, 1));
        assert_eq!((b.commit_min(), b.commit_max()), (2, 5));
        let (_, effects) = feed(&mut b, 0, &c[1]);
        assert!(
            effects.contains(&send(0, prepare_ok(0, 1, &c[1], field))),
            "carry {carry}: {effects:?}"
        );
    }
}

/// Server decision 395: a primary asked to solicit applied points sends a fresh Commit
/// heartbeat and its prepare at the commit point to every backup; a backup sends nothing.
#[test]
fn a_solicit_sends_a_fresh_heartbeat_and_the_committed_prepare() {
    let mut p = fresh(3, 0);
    let frame = propose_register(&mut p);
    input(&mut p, appended(&frame));
    feed(&mut p, 1, &prepare_ok(0, 1, &frame, 0));
    assert_eq!(p.commit_min(), 1);
    let mut out = crate::io::Outbox::new();
    p.solicit_applied(&mut out);
    let effects: Vec<Effect> = out.drain().collect();
    let heartbeat = commit_frame(0, 0, 1, 1);
    assert_eq!(
        effects,
        vec![
            send(1, heartbeat.clone()),
            send(2, heartbeat),
            send(1, frame.clone()),
            send(2, frame),
        ]
    );
    let mut b = fresh(3, 1);
    let mut out = crate::io::Outbox::new();
    b.solicit_applied(&mut out);
    assert_eq!(out.drain().count(), 0);
}
