//! Handler tests for the bound on incomplete appends (decision 504): a backup whose appends
//! fall behind its group's stream keeps forwarding, journals nothing more, asks for no repair
//! until they complete, then repairs what it skipped; a primary parks requests meanwhile.

#![allow(unused_must_use)]

use wire::header::{Layout, RequestPreparesHeader};
use wire::{Command, Operation};

use crate::Ignored;
use crate::config::RawConfig;
use crate::io::{Effect, Input};
use crate::test_support::*;
use crate::testing::Cluster;
use crate::types::Frame;

/// Every prepare of [`chain`] is a header and a one-byte body.
const FRAME: u64 = wire::HEADER_SIZE as u64 + 1;

/// Replica `r` of 3 on the metadata group, holding at most two incomplete appends.
fn bounded(r: u8) -> RawConfig {
    let mut raw = raw(3, r);
    raw.appending_bytes_max = 2 * FRAME;
    raw
}

fn appends(effects: &[Effect]) -> Vec<u64> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Append { op, .. } => Some(*op),
            _ => None,
        })
        .collect()
}

fn requested_window(effects: &[Effect]) -> Option<(u64, u64)> {
    effects.iter().find_map(|e| match e {
        Effect::Send { frame, .. } if frame.command() == Some(Command::RequestPrepares) => {
            let h = RequestPreparesHeader::view(frame.bytes()).unwrap();
            Some((h.from_op.get(), h.to_op.get()))
        }
        _ => None,
    })
}

#[test]
fn a_backup_behind_its_appends_forwards_but_neither_journals_nor_acks() {
    let c = chain(0, 0, 4);
    let mut b = boot(bounded(1));
    for f in &c[..2] {
        let (result, effects) = feed(&mut b, 0, f);
        assert_eq!(result, Ok(()));
        assert_eq!(appends(&effects).len(), 1);
    }
    // Two appends in flight reach the bound: op 3 goes down the chain only.
    assert_eq!(
        feed(&mut b, 0, &c[2]),
        (Err(Ignored::AppendingBehind), vec![send(2, c[2].clone())])
    );
    assert_eq!(b.op(), 2);
    // Op 4 lands above the gap that left: forwarded all the same, so the chain goes on.
    assert_eq!(
        feed(&mut b, 0, &c[3]),
        (Err(Ignored::Gap), vec![send(2, c[3].clone())])
    );
    // The appends complete: acked as usual.
    for f in &c[..2] {
        let (_, effects) = input(&mut b, appended(f));
        assert_eq!(effects, vec![send(0, prepare_ok(0, 1, f, 0))]);
    }
    // The primary's commit point shows what is missing: repair asks for the skipped ops and
    // journals them.
    let (_, effects) = feed(&mut b, 0, &commit_frame(0, 0, 2, 1));
    assert_eq!(requested_window(&effects), None, "nothing missing yet");
    let (_, effects) = feed(&mut b, 0, &commit_frame(0, 0, 4, 2));
    assert_eq!(requested_window(&effects), Some((3, 4)));
    for (f, op) in c[2..].iter().zip(3..) {
        let (result, effects) = feed(&mut b, 0, &crate::frames::as_repair(f));
        assert_eq!(result, Ok(()));
        assert_eq!(appends(&effects), vec![op]);
    }
    assert_eq!(b.op(), 4);
}

#[test]
fn repair_waits_while_appends_are_behind_and_asks_once_they_completed() {
    let c = chain(0, 0, 4);
    let mut b = boot(bounded(1));
    for f in &c[..2] {
        feed(&mut b, 0, f);
    }
    // Behind, and the commit point shows ops 3 and 4 exist: no request leaves.
    let (_, effects) = feed(&mut b, 0, &commit_frame(0, 0, 4, 1));
    assert_eq!(requested_window(&effects), None, "{effects:?}");
    let mut waited = Vec::new();
    for _ in 0..2 * crate::constants::REPAIR_RETRY_TICKS_DEFAULT {
        waited.extend(input(&mut b, Input::Tick).1);
    }
    assert_eq!(requested_window(&waited), None, "still behind: {waited:?}");
    for f in &c[..2] {
        input(&mut b, appended(f));
    }
    // The session's retry timer asks now.
    let mut asked = Vec::new();
    for _ in 0..=crate::constants::REPAIR_RETRY_TICKS_DEFAULT {
        asked.extend(input(&mut b, Input::Tick).1);
        if requested_window(&asked).is_some() {
            break;
        }
    }
    assert_eq!(requested_window(&asked), Some((3, 4)), "{asked:?}");
}

#[test]
fn an_unbounded_backup_journals_whatever_is_in_flight() {
    let c = chain(0, 0, 4);
    let mut raw = bounded(1);
    raw.appending_bytes_max = 0;
    let mut b = boot(raw);
    for f in &c {
        let (result, effects) = feed(&mut b, 0, f);
        assert_eq!(result, Ok(()));
        assert_eq!(appends(&effects).len(), 1);
    }
    assert_eq!(b.op(), 4);
}

#[test]
fn a_primary_behind_its_appends_parks_requests_until_they_complete() {
    let mut raw = raw(3, 0);
    // One incomplete append of a Register prepare reaches it.
    raw.appending_bytes_max = 1;
    let mut p = boot(raw);
    let request =
        |client: u128| Input::Request(Cluster::request(client, Operation::Register, 0, 0, vec![]));
    let (result, effects) = input(&mut p, request(1));
    assert_eq!(result, Ok(()));
    let first: Frame = effects
        .iter()
        .find_map(|e| match e {
            Effect::Append { frame, .. } => Some(frame.clone()),
            _ => None,
        })
        .expect("prepared at once");
    // Committed by the two backups while the primary's own append is still on its way.
    feed(&mut p, 1, &prepare_ok(0, 1, &first, 0));
    feed(&mut p, 2, &prepare_ok(0, 2, &first, 0));
    assert_eq!(p.commit_min(), 1);
    // The pipeline is empty, but the append is not done: the next request waits.
    assert_eq!(input(&mut p, request(2)), (Ok(()), vec![]));
    assert_eq!(p.op(), 1);
    // The append completes: the parked request is prepared.
    let (_, effects) = input(&mut p, appended(&first));
    assert_eq!(appends(&effects), vec![2], "{effects:?}");
    assert_eq!(p.op(), 2);
}

#[test]
fn under_storage_pressure_a_backup_journals_only_into_an_empty_backlog() {
    let c = chain(0, 0, 3);
    // Its own bound is far away: only the driver's pressure can hold it back.
    let mut b = boot(raw(3, 1));
    b.set_storage_pressure(true);
    let (result, effects) = feed(&mut b, 0, &c[0]);
    assert_eq!(result, Ok(()));
    assert_eq!(appends(&effects), vec![1], "an empty backlog takes one");
    assert_eq!(
        feed(&mut b, 0, &c[1]),
        (Err(Ignored::AppendingBehind), vec![send(2, c[1].clone())])
    );
    assert_eq!(b.prepares_skipped_behind(), 1);
    // The pressure goes: the retransmission is journaled beside the incomplete append.
    b.set_storage_pressure(false);
    let (result, effects) = feed(&mut b, 0, &c[1]);
    assert_eq!(result, Ok(()));
    assert_eq!(appends(&effects), vec![2]);
}

#[test]
fn repair_windows_shrink_to_the_largest_prepare_seen() {
    // Small prepares: the window is the ops missing, up to `repair_chunk_max`.
    let c = chain(0, 0, 1);
    let mut b = boot(raw(3, 1));
    journal(&mut b, &c);
    let (_, effects) = feed(&mut b, 0, &commit_frame(0, 0, 40, 1));
    assert_eq!(requested_window(&effects), Some((2, 40)));
    // A 1 MiB prepare seen: a window asks for what fits 8 MiB (7 of them).
    let big = prepare(0, 0, 1, 0, 0, &vec![7u8; 1024 * 1024]);
    let mut b = boot(raw(3, 1));
    journal(&mut b, std::slice::from_ref(&big));
    let (_, effects) = feed(&mut b, 0, &commit_frame(0, 0, 40, 1));
    let ops = crate::constants::REPAIR_WINDOW_BYTES_MAX / big.bytes().len() as u64;
    assert_eq!(ops, 7);
    assert_eq!(requested_window(&effects), Some((2, 1 + ops)));
}

/// Decision 517: a window is sized by the prepares of the newest ops, not by every prepare
/// since boot, so a 1 MiB batch long ago no longer holds small prepares to 7 per window.
#[test]
fn repair_windows_grow_back_once_the_large_prepares_are_past() {
    let round = u64::from(crate::constants::PREPARE_SIZE_ROUND);
    let mut frames = vec![prepare(0, 0, 1, 0, 0, &vec![7u8; 1024 * 1024])];
    for op in 2..=2 * round {
        let parent = checksum(frames.last().expect("one"));
        frames.push(prepare(0, 0, op, parent, 0, &[op as u8]));
    }
    let short = crate::constants::REPAIR_WINDOW_BYTES_MAX / frames[0].bytes().len() as u64;
    let window_after = |head: u64| {
        let mut b = boot(raw(3, 1));
        journal(&mut b, &frames[..head as usize]);
        assert_eq!(b.op(), head);
        let (_, effects) = feed(&mut b, 0, &commit_frame(0, 0, head + 1000, 1));
        requested_window(&effects).map(|(from, to)| (from, to - from + 1))
    };
    // While op 1's round is the newest or the one before it, the window stays short.
    assert_eq!(window_after(round), Some((round + 1, short)));
    assert_eq!(window_after(2 * round - 1), Some((2 * round, short)));
    // Op 2 x round opens a round two after op 1's: the whole chunk again.
    assert_eq!(window_after(2 * round), Some((2 * round + 1, 128)));
}

/// Decision 518: a driver shares the room left under its bound among its groups that repair
/// (and one more), since a repaired prepare is journaled whole when it arrives: a window of 7
/// prepares of 1 MiB with no bound, 6 with room for 6, 3 each once the other group repairs
/// too, 1 at the bound.
#[test]
fn repair_windows_fit_the_drivers_room() {
    use crate::replica::apply_storage_pressure;
    let big = prepare(0, 0, 1, 0, 0, &vec![7u8; 1024 * 1024]);
    let size = big.bytes().len() as u64;
    let backup = || {
        let mut b = boot(raw(3, 1));
        journal(&mut b, std::slice::from_ref(&big));
        assert_eq!(b.appending_bytes(), 0);
        b
    };
    let window = |b: &mut R| {
        let (_, effects) = feed(b, 0, &commit_frame(0, 0, 40, 1));
        requested_window(&effects).map(|(from, to)| (from, to - from + 1))
    };
    let mut groups = [backup(), backup()];
    assert_eq!(apply_storage_pressure(groups.iter_mut(), 0), (0, false));
    assert_eq!(window(&mut groups[0]), Some((2, 7)));

    let room = 2 * 3 * size + 1;
    let mut groups = [backup(), backup()];
    assert_eq!(apply_storage_pressure(groups.iter_mut(), room), (0, false));
    assert_eq!(window(&mut groups[0]), Some((2, 6)));
    // Group 0 now repairs: the room is shared between it and one more.
    let mut groups = [groups.into_iter().next().expect("two"), backup()];
    assert!(groups[0].is_repairing());
    assert_eq!(apply_storage_pressure(groups.iter_mut(), room), (0, false));
    assert_eq!(window(&mut groups[1]), Some((2, 3)));

    // The other group's append is incomplete and fills the bound: one op.
    let mut groups = [backup(), backup()];
    let next = prepare(0, 0, 2, checksum(&big), 0, &vec![8u8; 1024 * 1024]);
    feed(&mut groups[1], 0, &next);
    let behind = groups[1].appending_bytes();
    assert!(behind > 0);
    assert_eq!(
        apply_storage_pressure(groups.iter_mut(), behind),
        (behind, true)
    );
    assert_eq!(window(&mut groups[0]), Some((2, 1)));
}

/// The failure of a truncated append is stale and uses up its record, whether it arrives
/// before the same prepare is journaled again or after: the re-append's completion then makes
/// the entry durable. Before, a failure arriving first left the record behind, the re-append's
/// completion was taken for the stale one, and the entry stayed appending for good (under
/// decision 504's bound, simulator seed 5441238230993581732 never repaired again); a failure
/// arriving after found the re-journaled entry and stopped the node.
#[test]
fn a_truncated_append_that_fails_leaves_its_re_append_to_complete() {
    use crate::io::{Completion, Outbox};
    for failure_first in [true, false] {
        let c = chain(0, 0, 2);
        let mut b = boot(raw(3, 1));
        journal(&mut b, &c[..1]);
        feed(&mut b, 0, &c[1]);
        // Op 2's append is in flight when a cut removes it; it stays described (decision 51).
        let mut out = Outbox::new();
        b.truncate_journal(2, true, &mut out);
        persisted(&mut b);
        assert_eq!(b.appending_bytes(), 0);
        let failed = || {
            Input::Done(Completion::AppendFailed {
                op: 2,
                checksum: checksum(&c[1]),
            })
        };
        if failure_first {
            assert_eq!(
                input(&mut b, failed()),
                (Err(Ignored::StaleCompletion), vec![])
            );
        }
        // The primary's retransmission journals the same prepare again.
        let (result, effects) = feed(&mut b, 0, &c[1]);
        assert_eq!(result, Ok(()));
        assert_eq!(appends(&effects), vec![2]);
        if !failure_first {
            assert_eq!(
                input(&mut b, failed()),
                (Err(Ignored::StaleCompletion), vec![])
            );
        }
        let (result, effects) = input(&mut b, appended(&c[1]));
        assert_eq!(result, Ok(()), "failure first: {failure_first}");
        assert_eq!(effects, vec![send(0, prepare_ok(0, 1, &c[1], 0))]);
        assert!(b.is_durable(2));
        assert_eq!(b.appending_bytes(), 0);
    }
}

/// Submits a Register for `client` to a solo primary: whether it prepared it at once.
fn prepares(r: &mut R, client: u128) -> bool {
    let mut out = crate::io::Outbox::new();
    let request = crate::ClientRequest::new(client, Operation::Register, 0, 0, vec![]);
    r.step(NOW, Input::Request(request), &mut out).unwrap();
    out.drain().any(|e| matches!(e, Effect::Append { .. }))
}

/// Decision 505 (and 510's 0): a driver's bound on every group's incomplete appends together,
/// applied per tick by `apply_storage_pressure`; at it, a group with a backlog prepares no
/// more until its own appends complete.
#[test]
fn a_driver_over_its_bound_holds_every_group_with_a_backlog() {
    use crate::replica::apply_storage_pressure;
    let solo = || {
        let mut r = fresh(1, 0);
        assert!(prepares(&mut r, 1), "an empty backlog prepares");
        r
    };
    let mut groups = [solo(), solo()];
    let one = groups[0].appending_bytes();
    assert!(one > 0);
    // Under the bound: each group keeps preparing beside its backlog.
    let (total, pressed) = apply_storage_pressure(groups.iter_mut(), 3 * one + 1);
    assert_eq!((total, pressed), (2 * one, false));
    assert!(prepares(&mut groups[0], 2));
    // The total reaches the bound: a group with an incomplete append prepares no more.
    let (total, pressed) = apply_storage_pressure(groups.iter_mut(), 3 * one + 1);
    assert_eq!((total, pressed), (3 * one, false));
    let (_, pressed) = apply_storage_pressure(groups.iter_mut(), 3 * one);
    assert!(pressed);
    assert!(!prepares(&mut groups[1], 3), "parked under pressure");
    // Below it again, a new request is prepared at once.
    let (_, pressed) = apply_storage_pressure(groups.iter_mut(), 4 * one);
    assert!(!pressed);
    assert!(prepares(&mut groups[0], 4));
    // A bound of 0 (`partition.appending_shard_bytes_max = 0`, decision 510) is none.
    let (total, pressed) = apply_storage_pressure(groups.iter_mut(), 0);
    assert!(total > 0);
    assert!(!pressed);
}
