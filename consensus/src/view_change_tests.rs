//! Handler tests for the view change: one replica in a given state, one input, the exact
//! effects out.

// Setup steps feed inputs whose outcome the test does not inspect.
#![allow(unused_must_use)]

use wire::Command;

use crate::Ignored;
use crate::io::Effect;
use crate::test_support::*;
use crate::types::{Status, VsrState};

fn sends_of(effects: &[Effect], command: Command) -> usize {
    effects
        .iter()
        .filter(|e| matches!(e, Effect::Send { frame, .. } if frame.command() == Some(command)))
        .count()
}

/// Backup `r` of 3 after its heartbeat timeout, superblock written.
fn in_view_change(r: u8) -> R {
    let mut b = fresh(3, r);
    tick_until_effects(&mut b, 1000);
    assert_eq!(b.status(), Status::ViewChange);
    b
}

#[test]
fn start_view_change_leaves_only_once_the_view_is_durable() {
    let mut b = fresh(3, 1);
    tick_until_effects(&mut b, 1000);
    assert_eq!(persisted(&mut b), broadcast(3, 1, &svc(1, 1)));
}

/// Timers are counted down first and fired after: the StartViewChange retransmit timer, started
/// by the heartbeat timeout's handler, runs its whole 50 ticks (it fired after 49 when firing
/// and counting down interleaved within a tick).
#[test]
fn a_timer_started_by_a_firing_timer_runs_its_whole_period() {
    let mut b = in_view_change(2);
    persisted(&mut b);
    let retransmit = crate::constants::VIEW_CHANGE_RETRANSMIT_TICKS_DEFAULT;
    for tick in 1..retransmit {
        let (_, effects) = input(&mut b, crate::io::Input::Tick);
        assert_eq!(effects, vec![], "tick {tick}");
    }
    let (_, effects) = input(&mut b, crate::io::Input::Tick);
    assert_eq!(effects, broadcast(3, 2, &svc(1, 2)), "tick {retransmit}");
}

#[test]
fn svc_quorum_triggers_the_dvc_and_the_primary_elect_starts_the_view() {
    // Replica 1 is the primary-elect of view 1.
    let mut b = in_view_change(1);
    persisted(&mut b);
    let (result, effects) = feed(&mut b, 2, &svc(1, 2));
    assert_eq!(result, Ok(()));
    assert_eq!(sends_of(&effects, Command::DoViewChange), 2);
    assert_eq!(effects.len(), 2);
    // Replica 2's DVC completes the quorum: the (empty) log is decided and the view starts,
    // but the StartView waits for the superblock to record log_view 1.
    let mut other = in_view_change(2);
    persisted(&mut other);
    let (_, effects) = feed(&mut other, 1, &svc(1, 1));
    let Effect::Send { frame: dvc, .. } = effects
        .iter()
        .find(|e| matches!(e, Effect::Send { frame, .. } if frame.command() == Some(Command::DoViewChange)))
        .unwrap()
        .clone()
    else {
        panic!()
    };
    let (result, effects) = feed(&mut b, 2, &dvc);
    assert_eq!(result, Ok(()));
    assert_eq!(b.status(), Status::Normal);
    assert!(b.is_primary());
    assert_eq!(
        effects,
        vec![Effect::PersistVsrState(VsrState {
            view: 1,
            log_view: 1,
            commit_max: 0,
            lost_state: false,
            ..Default::default()
        })]
    );
    let effects = persisted(&mut b);
    assert_eq!(sends_of(&effects, Command::StartView), 2);
    assert_eq!(effects.len(), 2);
}

#[test]
fn svc_of_the_current_view_is_ignored_while_normal() {
    let mut b = fresh(3, 1);
    assert_eq!(feed(&mut b, 2, &svc(0, 2)), (Err(Ignored::ViewOld), vec![]));
}

#[test]
fn a_newer_svc_joins_the_view_change_without_sending_before_durable() {
    let mut b = fresh(3, 2);
    let (result, effects) = feed(&mut b, 0, &svc(4, 0));
    assert_eq!(result, Ok(()));
    assert_eq!(b.view(), 4);
    assert_eq!(
        effects,
        vec![Effect::PersistVsrState(VsrState {
            view: 4,
            log_view: 0,
            commit_max: 0,
            lost_state: false,
            ..Default::default()
        })]
    );
    // Durable: SVC, and the DVC because own + replica 0 make Q_vc = 2.
    let effects = persisted(&mut b);
    assert_eq!(sends_of(&effects, Command::StartViewChange), 2);
    assert_eq!(sends_of(&effects, Command::DoViewChange), 2);
}

#[test]
fn backup_adopts_a_start_view_and_reacks_its_suffix_after_persisting() {
    let c = chain(0, 0, 2);
    let mut b = fresh(3, 2);
    journal(&mut b, &c);
    let sv = start_view(1, 1, 2, 0, &c);
    let (result, effects) = feed(&mut b, 1, &sv);
    assert_eq!(result, Ok(()));
    assert_eq!((b.view(), b.log_view(), b.status()), (1, 1, Status::Normal));
    assert_eq!(
        effects,
        vec![Effect::PersistVsrState(VsrState {
            view: 1,
            log_view: 1,
            commit_max: 0,
            lost_state: false,
            view_headers: headers_of(&c),
            ..Default::default()
        })]
    );
    assert_eq!(
        persisted(&mut b),
        vec![
            send(1, prepare_ok(1, 2, &c[0], 0)),
            send(1, prepare_ok(1, 2, &c[1], 0))
        ]
    );
}

#[test]
fn start_view_truncates_a_diverging_suffix() {
    let ours = chain(0, 0, 2);
    let mut b = fresh(3, 2);
    journal(&mut b, &ours);
    // View 1 decided a different op 2.
    let theirs = prepare(1, 1, 2, checksum(&ours[0]), 0, b"other");
    let sv = start_view(1, 1, 2, 0, &[ours[0].clone(), theirs.clone()]);
    let (result, effects) = feed(&mut b, 1, &sv);
    assert_eq!(result, Ok(()));
    // The barrier write (new log_view, the view's headers, the ceiling) precedes the cut.
    assert_eq!(
        effects[0],
        Effect::PersistVsrState(VsrState {
            view: 1,
            log_view: 1,
            view_headers: headers_of(&[ours[0].clone(), theirs.clone()]),
            held_ceiling: 2,
            ..Default::default()
        })
    );
    assert_eq!(effects[1], Effect::Truncate { from_op: 2 });
    assert!(b.header(2).is_none());
    assert_eq!(b.op(), 2, "the head is the view's");
    // The view's op 2 arrives by retransmission and fills the hole.
    let (result, effects) = feed(&mut b, 1, &theirs);
    assert_eq!(result, Ok(()));
    assert_eq!(
        effects,
        vec![Effect::Append {
            op: 2,
            frame: theirs.clone()
        }]
    );
}

#[test]
fn equal_view_start_view_never_truncates_acked_prepares() {
    let c = chain(1, 1, 3);
    let mut b = fresh(3, 2);
    // Adopt view 1 with op 1, then receive ops 2 and 3 live.
    feed(&mut b, 1, &start_view(1, 1, 1, 0, &c[..1]));
    persisted(&mut b);
    for f in &c[1..] {
        feed(&mut b, 1, f);
    }
    assert_eq!(b.op(), 3);
    // The probe answer taken before those prepares existed must not cut them.
    assert_eq!(
        feed(&mut b, 1, &start_view(1, 1, 1, 0, &c[..1])),
        (Err(Ignored::StartViewRejected), vec![])
    );
    assert_eq!(b.op(), 3);
}

#[test]
fn start_view_from_the_wrong_sender_or_without_a_suffix_is_refused() {
    let c = chain(0, 0, 1);
    let mut b = fresh(3, 2);
    assert_eq!(
        feed(&mut b, 0, &start_view(1, 0, 1, 0, &c)).0,
        Err(Ignored::WrongSender)
    );
    assert_eq!(
        feed(&mut b, 1, &start_view(1, 1, 1, 0, &[])).0,
        Err(Ignored::StartViewRejected)
    );
}

#[test]
fn status_timeout_escalates_to_the_next_view() {
    let mut b = in_view_change(2);
    persisted(&mut b);
    for _ in 0..800 {
        input(&mut b, crate::io::Input::Tick);
        if b.view() == 2 {
            break;
        }
    }
    assert_eq!(b.view(), 2);
    assert_eq!(b.status(), Status::ViewChange);
}

#[cfg(feature = "bug-knobs")]
#[test]
fn bug_knob_sends_view_scoped_frames_before_they_are_durable() {
    let mut raw = raw(3, 1);
    raw.bug_knobs.skip_durable_before_send = true;
    let mut b = boot(raw);
    let effects = tick_until_effects(&mut b, 1000);
    assert_eq!(sends_of(&effects, Command::StartViewChange), 2);
}

#[test]
fn a_failed_superblock_write_is_retried_and_withholds_every_send() {
    use crate::io::{Completion, Input};
    let mut b = fresh(3, 1);
    tick_until_effects(&mut b, 1000);
    let (result, effects) = input(
        &mut b,
        Input::Done(Completion::VsrStatePersistFailed {
            view: 1,
            log_view: 0,
        }),
    );
    assert_eq!((result, effects), (Ok(()), vec![]));
    // The retry comes back on its own; nothing view-scoped leaves in between.
    let effects = tick_until_effects(&mut b, 10);
    assert_eq!(
        effects,
        vec![Effect::PersistVsrState(VsrState {
            view: 1,
            log_view: 0,
            commit_max: 0,
            lost_state: false,
            ..Default::default()
        })]
    );
    assert_eq!(persisted(&mut b), broadcast(3, 1, &svc(1, 1)));
}

#[test]
fn nothing_but_requests_leaves_while_the_view_is_not_durable() {
    let c = chain(1, 1, 2);
    let mut b = fresh(3, 2);
    // Adopt view 1 (superblock write outstanding) and receive its prepares.
    feed(&mut b, 1, &start_view(1, 1, 1, 0, &c[..1]));
    assert_ne!(b.vsr_state_durable(), (1, 1));
    let (result, effects) = feed(&mut b, 1, &c[1]);
    assert_eq!(result, Ok(()));
    assert_eq!(
        effects,
        vec![Effect::Append {
            op: 2,
            frame: c[1].clone()
        }],
        "no forward down the chain yet"
    );
    // A duplicate is neither re-forwarded nor re-acked; repair is not served.
    let (_, effects) = feed(&mut b, 1, &c[1]);
    assert_eq!(effects, vec![]);
    let (_, effects) = feed(&mut b, 0, &request_prepares(0, 3, 1, 2));
    assert_eq!(effects, vec![]);
}

#[test]
fn the_completion_of_a_truncated_append_does_not_make_its_re_append_durable() {
    use crate::io::{Completion, Input};
    let ours = chain(0, 0, 2);
    let mut b = fresh(3, 2);
    journal(&mut b, &ours[..1]);
    // Op 2 arrives; its append is still in flight when view 1 discards it.
    feed(&mut b, 1, &ours[1]);
    let theirs = prepare(1, 1, 2, checksum(&ours[0]), 0, b"other");
    feed(
        &mut b,
        1,
        &start_view(1, 1, 2, 0, &[ours[0].clone(), theirs.clone()]),
    );
    persisted(&mut b);
    let stale = Input::Done(Completion::Appended {
        op: 2,
        checksum: checksum(&ours[1]),
    });
    assert_eq!(
        input(&mut b, stale),
        (Err(Ignored::StaleCompletion), vec![])
    );
    assert!(!b.is_durable(2));
}

#[test]
fn entries_below_a_hole_wait_for_the_chain_instead_of_being_cut() {
    let c = chain(0, 0, 5);
    let mut b = fresh(3, 2);
    journal(&mut b, &c[..2]);
    // View 1 describes ops 4..5 (commit 4); op 3 is a hole here, ops 1-2 cannot be checked yet.
    let (result, effects) = feed(&mut b, 1, &start_view(1, 1, 5, 4, &c[3..]));
    assert_eq!(result, Ok(()));
    assert!(!effects.iter().any(|e| matches!(e, Effect::Truncate { .. })));
    persisted(&mut b);
    assert_eq!(b.commit_min(), 0, "unverified entries are not applied");
    // Op 3 arrives by repair: it verifies ops 1-2 through the chain and everything applies.
    let repair = crate::frames::as_repair(&c[2]);
    let session_nonce = b.repair.session.as_ref().map(|s| s.nonce).unwrap();
    let (result, _) = feed(&mut b, 1, &repair);
    assert_eq!(result, Ok(()));
    let (_, _) = feed(
        &mut b,
        1,
        &repair_reply(Command::RepairDone, 1, session_nonce, 3),
    );
    assert!(b.journal.get(1).unwrap().verified);
    assert_eq!(b.commit_min(), 3);
}

#[test]
fn a_stale_run_below_a_hole_is_cut_once_proven() {
    let c = chain(1, 1, 5);
    let stale = chain(0, 0, 2);
    let mut b = fresh(3, 2);
    journal(&mut b, &stale);
    feed(&mut b, 1, &start_view(1, 1, 5, 4, &c[3..]));
    persisted(&mut b);
    let (result, effects) = feed(&mut b, 1, &crate::frames::as_repair(&c[2]));
    assert_eq!(result, Ok(()));
    assert!(effects.contains(&Effect::Truncate { from_op: 1 }));
    assert!(b.header(1).is_none());
}

/// Issue 8 item 1 (decision 51): backup r2 holds a stale op 1 from view 0, adopts view 1
/// (head 3, commit 3), journals and acknowledges op 4 live, then repair fills ops 3 and 2; op 2
/// proves op 1 stale and the cut from op 1 also removes the acknowledged op 4. Returns the
/// effects of that step and the replica restarted from what its disk then holds (the last
/// superblock write it asked for, an empty journal).
fn stale_fork_below_an_acked_op(knobs: Option<&dyn Fn(&mut crate::RawConfig)>) -> (Vec<Effect>, R) {
    let c = chain(1, 1, 4);
    let stale = chain(0, 0, 1);
    let mut raw = raw(3, 2);
    if let Some(set) = knobs {
        set(&mut raw);
    }
    let mut b = boot(raw.clone());
    journal(&mut b, &stale);
    let mut last_state = None;
    let note = |effects: &[Effect], last: &mut Option<crate::VsrState>| {
        for e in effects {
            if let Effect::PersistVsrState(s) = e {
                *last = Some(s.clone());
            }
        }
    };
    let (result, effects) = feed(&mut b, 1, &start_view(1, 1, 3, 3, &c[2..3]));
    assert_eq!(result, Ok(()));
    note(&effects, &mut last_state);
    persisted(&mut b);
    // Op 4 live: journaled, acknowledged once durable.
    let (result, _) = feed(&mut b, 1, &c[3]);
    assert_eq!(result, Ok(()));
    let (_, effects) = input(&mut b, appended(&c[3]));
    assert!(effects.contains(&send(1, prepare_ok(1, 2, &c[3], 3))));
    // Repair, top-down: op 3, then op 2, which proves op 1 stale.
    let (result, _) = feed(&mut b, 1, &crate::frames::as_repair(&c[2]));
    assert_eq!(result, Ok(()));
    let (result, effects) = feed(&mut b, 1, &crate::frames::as_repair(&c[1]));
    assert_eq!(result, Ok(()));
    note(&effects, &mut last_state);
    let mut out = crate::Outbox::new();
    let restarted = crate::Replica::new(
        raw.validate().unwrap(),
        crate::Recovered {
            superblock: last_state,
            incarnation: 11,
            ..crate::Recovered::default()
        },
        crate::DigestStateMachine::default(),
        &mut out,
    );
    (effects, restarted)
}

/// The slot a restarted r2 reports for op 4 once it adopted view 3 (primary r0), whose
/// StartView describes ops 3..=4 with commit 3.
fn op_4_after_a_restart(mut b: R) -> crate::merge::Slot {
    let c = chain(1, 1, 4);
    let (result, _) = feed(&mut b, 0, &start_view(3, 0, 4, 3, &c[2..]));
    assert_eq!(result, Ok(()));
    persisted(&mut b);
    let (_, dvc) = b.build_do_view_change();
    dvc.slots[&4]
}

#[test]
fn an_acked_op_cut_with_a_stale_run_is_never_nacked_after_a_restart() {
    let c = chain(1, 1, 4);
    let (effects, b) = stale_fork_below_an_acked_op(None);
    // The ceiling and the view's verified ops 2..=4 are written before the cut takes effect.
    assert_eq!(
        effects,
        vec![
            append(&c[1]),
            Effect::PersistVsrState(VsrState {
                view: 1,
                log_view: 1,
                commit_max: 3,
                view_headers: headers_of(&c[1..]),
                held_ceiling: 4,
                ..Default::default()
            }),
            Effect::Truncate { from_op: 1 },
        ]
    );
    // Restarted from that disk: it still claims log_view 1 with head 4, op 4 held.
    assert_eq!((b.log_view(), b.op(), b.commit_max()), (1, 4, 3));
    assert!(matches!(
        op_4_after_a_restart(b),
        crate::merge::Slot::Held { present: false, .. }
    ));
}

#[cfg(feature = "bug-knobs")]
#[test]
fn bug_knob_a_volatile_truncation_ceiling_nacks_an_acked_op_after_a_restart() {
    let knob: &dyn Fn(&mut crate::RawConfig) = &|raw| {
        raw.bug_knobs.volatile_truncation_ceiling = true;
    };
    let (effects, b) = stale_fork_below_an_acked_op(Some(knob));
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, Effect::PersistVsrState(_)))
    );
    assert!(matches!(
        op_4_after_a_restart(b),
        crate::merge::Slot::HeldNack { .. }
    ));
}

/// Status moves outside the table are bugs: a view change never falls back to Recovering.
#[test]
#[should_panic(expected = "status move ViewChange -> Recovering")]
fn a_status_move_outside_the_table_panics() {
    let mut b = in_view_change(2);
    b.set_status(Status::Recovering);
}
