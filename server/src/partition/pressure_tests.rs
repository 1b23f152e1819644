//! Decision 505: a shard's bound on its groups' incomplete appends, applied per tick.

use consensus::{
    ClientRequest, DigestStateMachine, Effect, GroupId, Input, Outbox, RawConfig, Recovered,
    Replica, ReplicaId,
};
use wire::Operation;

use consensus::apply_storage_pressure;

const NOW: consensus::Now = consensus::Now {
    tick: 1,
    realtime_us: 5_000_000,
};

/// A solo metadata replica (primary at once) with one Register prepared and its append in
/// flight.
fn solo_with_an_append() -> Replica<DigestStateMachine> {
    let raw = RawConfig::new(0xC1, ReplicaId(0), 1, GroupId::METADATA);
    let mut out = Outbox::new();
    let mut r = Replica::new(
        raw.validate().unwrap(),
        Recovered::fresh(7),
        DigestStateMachine::default(),
        &mut out,
    );
    let (view, log_view) = (r.view(), r.log_view());
    r.step(
        NOW,
        Input::Done(consensus::Completion::VsrStatePersisted { view, log_view }),
        &mut out,
    )
    .unwrap();
    out.drain().for_each(drop);
    assert!(prepares(&mut r, 1), "an empty backlog prepares");
    r
}

/// Submits a Register for `client`: whether the replica prepared it at once.
fn prepares(r: &mut Replica<DigestStateMachine>, client: u128) -> bool {
    let mut out = Outbox::new();
    let request = ClientRequest::new(client, Operation::Register, 0, 0, vec![]);
    r.step(NOW, Input::Request(request), &mut out).unwrap();
    out.drain().any(|e| matches!(e, Effect::Append { .. }))
}

#[test]
fn a_shard_over_its_bound_holds_every_group_with_a_backlog() {
    let mut groups = [solo_with_an_append(), solo_with_an_append()];
    let one = groups[0].appending_bytes();
    assert!(one > 0);
    // Under the shard's bound: each group keeps preparing beside its backlog.
    let (total, pressed) = apply_storage_pressure(groups.iter_mut(), 3 * one + 1);
    assert_eq!((total, pressed), (2 * one, false));
    assert!(prepares(&mut groups[0], 2));
    // The total reaches the bound: a group with an incomplete append prepares no more.
    let (total, pressed) = apply_storage_pressure(groups.iter_mut(), 3 * one + 1);
    assert_eq!((total, pressed), (3 * one, false));
    let (_, pressed) = apply_storage_pressure(groups.iter_mut(), 3 * one);
    assert!(pressed);
    assert!(!prepares(&mut groups[1], 3), "parked under pressure");
    // It goes: the parked request waits only for the group's own next completion, and a
    // new one is prepared at once.
    let (_, pressed) = apply_storage_pressure(groups.iter_mut(), 4 * one);
    assert!(!pressed);
    assert!(prepares(&mut groups[0], 4));
    // A bound of 0 (`partition.appending_shard_bytes_max = 0`, decision 510) is none.
    let (total, pressed) = apply_storage_pressure(groups.iter_mut(), 0);
    assert!(total > 0);
    assert!(!pressed);
}
