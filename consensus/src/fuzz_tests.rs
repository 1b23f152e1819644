//! Network input never panics: valid frames of every kind, mutated field by field and
//! re-sealed (so they pass the stateless decoder), fed to replicas in every status.

use proptest::prelude::*;
use wire::Command;

use crate::io::{Input, Outbox};
use crate::test_support::*;
use crate::types::ReplicaId;

fn samples() -> Vec<crate::Frame> {
    let c = chain(0, 0, 3);
    let mut frames = c.clone();
    frames.push(prepare_ok(0, 1, &c[0], 0));
    frames.push(commit_frame(0, 0, 2, 5));
    frames.push(svc(1, 2));
    frames.push(start_view(1, 1, 3, 1, &c));
    frames.push(request_prepares(2, 9, 1, 3));
    frames.push(repair_reply(Command::RepairDone, 0, 9, 3));
    frames.push(repair_reply(Command::RangeEvicted, 0, 9, 2));
    frames.push(request_start_view(2, 0, 4));
    frames.push(crate::frames::as_repair(&c[1]));
    // A DVC as a replica builds it.
    let mut b = fresh(3, 2);
    journal(&mut b, &c);
    let (dvc, _) = b.build_do_view_change();
    frames.push(dvc);
    frames
}

fn states() -> Vec<R> {
    let c = chain(0, 0, 3);
    let mut out = vec![fresh(3, 0), fresh(3, 1)];
    let mut b = fresh(3, 2);
    journal(&mut b, &c);
    out.push(b);
    out.push(restarted(3, 1, 0, &c, 9));
    let mut vc = fresh(3, 1);
    tick_until_effects(&mut vc, 1000);
    persisted(&mut vc);
    out.push(vc);
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1500))]
    #[test]
    fn mutated_frames_never_panic(
        which in 0usize..14,
        edits in proptest::collection::vec((0usize..256, any::<u8>()), 1..6),
        state in 0usize..5,
        tail in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let samples = samples();
        let mut bytes = samples[which % samples.len()].bytes().to_vec();
        for (offset, value) in edits {
            // Keep the size and command bytes, everything else is fair game.
            if !(48..52).contains(&offset) && offset != 60 && offset >= 32 {
                bytes[offset] = value;
            }
        }
        if bytes.len() > 256 && !tail.is_empty() {
            let n = tail.len().min(bytes.len() - 256);
            bytes[256..256 + n].copy_from_slice(&tail[..n]);
        }
        let body = bytes[256..].to_vec();
        let header: &mut [u8; 256] = (&mut bytes[..256]).try_into().unwrap();
        let _ = wire::finish(header, &body);
        let mut replica = states().swap_remove(state);
        let mut out = Outbox::new();
        let from = ReplicaId(bytes[61] % 3);
        let _ = replica.step(NOW, Input::Frame { from, frame: &bytes }, &mut out);
        for _ in 0..3 {
            let _ = replica.step(NOW, Input::Tick, &mut out);
        }
    }
}
