//! Handler tests for the journal's room (decision 34): no `Effect::Append` for an op at or
//! beyond `checkpoint_durable + journal_slot_count`, on every path that appends.

#![allow(unused_must_use)]

use wire::header::{Layout, RequestPreparesHeader};
use wire::{Command, Operation};

use crate::Ignored;
use crate::config::RawConfig;
use crate::io::{Completion, Effect, Input};
use crate::test_support::*;
use crate::testing::Cluster;
use crate::types::Frame;

/// 20 slots, a checkpoint every 8 ops, 4 prepares in flight: the smallest room the config
/// accepts (2 × 8 + 4). From a fresh start the journal holds ops 1..=19.
fn small(r: u8) -> RawConfig {
    let mut raw = raw(3, r);
    raw.journal_slot_count = 20;
    raw.checkpoint_interval_ops = 8;
    raw.prepare_queue_depth = 4;
    raw.request_queue_depth = 8;
    raw
}

fn register(client: u128) -> Input<'static> {
    Input::Request(Cluster::request(client, Operation::Register, 0, 0, vec![]))
}

fn append_of(effects: &[Effect]) -> Frame {
    effects
        .iter()
        .find_map(|e| match e {
            Effect::Append { frame, .. } => Some(frame.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no append in {effects:?}"))
}

fn window(frame: &Frame) -> (u64, u64) {
    assert_eq!(frame.command(), Some(Command::RequestPrepares));
    let h = RequestPreparesHeader::view(frame.bytes()).unwrap();
    (h.from_op.get(), h.to_op.get())
}

#[test]
fn primary_stops_preparing_at_the_room_and_resumes_after_checkpointed() {
    let mut p = boot(small(0));
    assert_eq!(p.journal_op_max(), 19);
    let mut checkpoints = Vec::new();
    for client in 1..=19u128 {
        let (result, effects) = input(&mut p, register(client));
        assert_eq!(result, Ok(()));
        let frame = append_of(&effects);
        assert_eq!(effects, vec![send(1, frame.clone()), effects[1].clone()]);
        input(&mut p, appended(&frame));
        let (_, effects) = feed(&mut p, 1, &prepare_ok(0, 1, &frame, 0));
        checkpoints.extend(
            effects
                .into_iter()
                .filter(|e| matches!(e, Effect::Checkpoint { .. })),
        );
    }
    assert_eq!((p.op(), p.commit_min()), (19, 19));
    // The first interval checkpoints once; it is not durable yet, so the floor stays at 0.
    assert_eq!(checkpoints, vec![Effect::Checkpoint { op: 8 }]);
    // Op 20 would overwrite op 0's slot... the room ends at 19: the request waits.
    assert_eq!(input(&mut p, register(20)), (Ok(()), vec![]));
    assert_eq!(
        (p.op(), p.pipeline_len(), p.request_queue_len()),
        (19, 0, 1)
    );
    assert_eq!(input(&mut p, Input::Tick).1, vec![]);
    assert_eq!(p.op(), 19);
    // The checkpoint lands: room up to 8 + 19; the parked request is prepared, and the next
    // checkpoint (commit_min 19 is an interval above the new floor 8) follows in the same step.
    let (result, effects) = input(&mut p, Input::Done(Completion::Checkpointed { op: 8 }));
    assert_eq!(result, Ok(()));
    assert_eq!(p.journal_op_max(), 27);
    let frame = append_of(&effects);
    assert_eq!(frame.prepare_header().unwrap().op.get(), 20);
    assert_eq!(
        effects,
        vec![
            send(1, frame.clone()),
            Effect::Append { op: 20, frame },
            Effect::Checkpoint { op: 19 },
        ]
    );
    assert_eq!(p.request_queue_len(), 0);
}

#[test]
fn primary_parks_requests_even_with_free_pipeline_slots() {
    let mut p = boot(small(0));
    // 19 prepares in flight is more than the pipeline: fill the room with commits first,
    // then leave the last few in flight.
    for client in 1..=17u128 {
        let (_, effects) = input(&mut p, register(client));
        let frame = append_of(&effects);
        input(&mut p, appended(&frame));
        feed(&mut p, 1, &prepare_ok(0, 1, &frame, 0));
    }
    for client in 18..=19u128 {
        assert_eq!(input(&mut p, register(client)).0, Ok(()));
    }
    assert_eq!((p.op(), p.pipeline_len()), (19, 2));
    // Two pipeline slots free, no room: parked, nothing emitted.
    assert_eq!(input(&mut p, register(20)), (Ok(()), vec![]));
    assert_eq!(p.request_queue_len(), 1);
}

#[test]
fn backup_ignores_a_prepare_beyond_its_room_and_accepts_it_after_its_checkpoint() {
    let c = chain(0, 0, 20);
    let mut b = boot(small(1));
    journal(&mut b, &c[..19]);
    assert_eq!(b.op(), 19);
    // Forwarded down the chain (the next hop may have room), neither journaled nor acked.
    assert_eq!(
        feed(&mut b, 0, &c[19]),
        (Err(Ignored::JournalFull), vec![send(2, c[19].clone())])
    );
    assert_eq!(b.op(), 19);
    // The commit point arrives: the backup applies and checkpoints at 19.
    let (result, effects) = feed(&mut b, 0, &commit_frame(0, 0, 19, 1));
    assert_eq!(result, Ok(()));
    assert_eq!(effects, vec![Effect::Checkpoint { op: 19 }]);
    assert_eq!(
        feed(&mut b, 0, &c[19]),
        (Err(Ignored::JournalFull), vec![send(2, c[19].clone())]),
        "a checkpoint in flight makes no room"
    );
    assert_eq!(
        input(&mut b, Input::Done(Completion::Checkpointed { op: 19 })),
        (Ok(()), vec![])
    );
    assert_eq!(b.journal_op_max(), 38);
    // The primary's retransmission is journaled now, and acked once durable.
    assert_eq!(
        feed(&mut b, 0, &c[19]),
        (
            Ok(()),
            vec![
                send(2, c[19].clone()),
                Effect::Append {
                    op: 20,
                    frame: c[19].clone()
                }
            ]
        )
    );
    let (_, effects) = input(&mut b, appended(&c[19]));
    assert_eq!(effects, vec![send(0, prepare_ok(0, 1, &c[19], 19))]);
}

#[test]
fn repair_asks_only_for_the_room_and_resumes_after_checkpointed() {
    let c = chain(0, 0, 25);
    let mut b = boot(small(2));
    // Far behind: the window stops at the room (19), not at the commit point (25).
    let (_, effects) = feed(&mut b, 0, &commit_frame(0, 0, 25, 1));
    let [Effect::Send { frame: request, .. }] = effects.as_slice() else {
        panic!("{effects:?}")
    };
    assert_eq!(window(request), (1, 19));
    let nonce = RequestPreparesHeader::view(request.bytes())
        .unwrap()
        .nonce
        .get();
    // A repaired prepare beyond the room is dropped, not buffered.
    assert_eq!(
        feed(&mut b, 0, &crate::frames::as_repair(&c[19])),
        (Err(Ignored::JournalFull), vec![])
    );
    let mut checkpoints = Vec::new();
    for f in &c[..19] {
        let (result, effects) = feed(&mut b, 0, &crate::frames::as_repair(f));
        assert_eq!(result, Ok(()));
        assert_eq!(effects, vec![append(f)]);
        let (_, effects) = input(&mut b, appended(f));
        // Durable and committed at once (the commit point is known); the interval checkpoint
        // at 8 goes out and stays in flight.
        checkpoints.extend(
            effects
                .into_iter()
                .filter(|e| matches!(e, Effect::Checkpoint { .. })),
        );
    }
    assert_eq!(b.commit_min(), 19);
    assert_eq!(checkpoints, vec![Effect::Checkpoint { op: 8 }]);
    // The chunk is done and nothing in the room is missing: the session closes.
    assert_eq!(
        feed(&mut b, 0, &repair_reply(Command::RepairDone, 0, nonce, 19)),
        (Ok(()), vec![])
    );
    // The checkpoint makes room: repair asks for the rest, and the next checkpoint follows.
    let (result, effects) = input(&mut b, Input::Done(Completion::Checkpointed { op: 8 }));
    assert_eq!(result, Ok(()));
    let [
        Effect::Send {
            frame: request,
            to: crate::ReplicaId(0),
        },
        Effect::Checkpoint { op: 19 },
    ] = effects.as_slice()
    else {
        panic!("{effects:?}")
    };
    assert_eq!(window(request), (20, 25));
}

#[test]
fn an_unbounded_journal_has_no_room_limit() {
    let mut raw = small(0);
    raw.journal_slot_count = 0;
    let p = boot(raw);
    assert_eq!(p.journal_op_max(), u64::MAX);
}
