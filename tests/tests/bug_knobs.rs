//! The checkers must bite: with a deliberately broken core rule (the consensus crate's
//! `bug-knobs` feature) the simulator finds a violation within a bounded seed range.
//! Run: `cargo test -p tests --features bug-knobs --test bug_knobs` (CI does). The loosened
//! nack quorum needs a view change that discards a committed op: at the time of writing seed
//! 34 finds it (seconds in a debug build); the search is bounded by 1,000 seeds.
#![cfg(feature = "bug-knobs")]

use consensus::BugKnobs;
use tests::check::Invariant;
use tests::runner::{Overrides, run_seed};
use tests::sim::Options;

/// The first seed in `seeds` whose run breaks an invariant, with the invariant.
fn first_violation(
    knobs: BugKnobs,
    seeds: std::ops::Range<u64>,
    overrides: Overrides,
) -> Option<(u64, Invariant)> {
    for seed in seeds {
        let options = Options {
            stop_at_violation: true,
            bug_knobs: knobs,
            ..Options::default()
        };
        let report = run_seed(seed, overrides, options);
        if let Some(v) = report
            .violations
            .iter()
            .find(|v| v.invariant != Invariant::Liveness)
        {
            // Control: the same seed with the rule intact must hold, or the finding is not the
            // knob's (an open core bug would show up here).
            let control = Options {
                stop_at_violation: true,
                ..Options::default()
            };
            if !run_seed(seed, overrides, control).violations.is_empty() {
                eprintln!("seed {seed}: violation also without the knob, skipped: {v}");
                continue;
            }
            eprintln!("seed {seed}: {v}");
            return Some((seed, v.invariant));
        }
    }
    None
}

#[test]
fn ack_before_append_is_caught_fast() {
    let knobs = BugKnobs {
        ack_before_append: true,
        ..BugKnobs::default()
    };
    let overrides = Overrides {
        replicas: Some(3),
        ticks: Some(600),
        ..Overrides::default()
    };
    let found = first_violation(knobs, 0..20, overrides);
    assert!(
        matches!(found, Some((_, Invariant::AckDurable))),
        "{found:?}"
    );
}

#[test]
fn skipped_durable_gate_is_caught_fast() {
    let knobs = BugKnobs {
        skip_durable_before_send: true,
        ..BugKnobs::default()
    };
    let overrides = Overrides {
        replicas: Some(3),
        ticks: Some(1_500),
        ..Overrides::default()
    };
    let found = first_violation(knobs, 0..50, overrides);
    assert!(found.is_some(), "no violation found");
}

#[test]
fn loosened_nack_quorum_is_caught_within_1000_seeds() {
    let knobs = BugKnobs {
        loosen_nack_quorum: true,
        ..BugKnobs::default()
    };
    let found = first_violation(knobs, 0..1_000, Overrides::default());
    assert!(
        matches!(
            found,
            Some((_, Invariant::ReplyStaysCommitted | Invariant::Agreement))
        ),
        "{found:?}"
    );
}

/// The core's own invariant sweep runs in the simulator's builds, release included (the
/// `consensus/invariants` feature the `tests` crate enables): a replica that enters Recovering
/// without its probe timer breaks no checker invariant at once, but the sweep names it at the
/// first restart. `cargo test --release -p tests --features bug-knobs --test bug_knobs sweep`
/// runs this in a release build.
#[test]
fn recovering_without_probe_trips_the_core_sweep_in_every_build() {
    // Constant per build: what it checks is this build's features.
    #[allow(clippy::assertions_on_constants)]
    {
        assert!(
            consensus::INVARIANT_SWEEP,
            "built without consensus/invariants"
        );
    }
    let knobs = BugKnobs {
        recover_without_probe: true,
        ..BugKnobs::default()
    };
    let overrides = Overrides {
        replicas: Some(3),
        ticks: Some(1_500),
        ..Overrides::default()
    };
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut tripped = None;
    for seed in 0..200 {
        let options = Options {
            stop_at_violation: true,
            bug_knobs: knobs,
            ..Options::default()
        };
        let outcome = std::panic::catch_unwind(move || run_seed(seed, overrides, options));
        if let Err(payload) = outcome {
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            tripped = Some((seed, message));
            break;
        }
    }
    std::panic::set_hook(hook);
    let (seed, message) = tripped.expect("no seed tripped the sweep");
    eprintln!("seed {seed}: {message}");
    assert!(
        message.contains("a Recovering replica keeps probing"),
        "{message}"
    );
}
