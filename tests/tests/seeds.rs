//! Seed runs as ordinary tests: a short fixed set in CI, a long range on demand with
//! `STRAND_SIM_SEEDS=1..1000 cargo test --release -p tests --test seeds -- --nocapture`.

use tests::runner::{Overrides, Summary, parse_range, replay_command, run_seed};
use tests::sim::Options;

/// Small, fast seeds: short fault phases keep the debug build under a minute on two cores.
const CI_SEEDS: std::ops::Range<u64> = 0..20;
const CI_TICKS: u64 = 1_000;

fn run(seeds: std::ops::Range<u64>, overrides: Overrides) -> Summary {
    let mut summary = Summary::default();
    for seed in seeds {
        let report = run_seed(
            seed,
            overrides,
            Options {
                stop_at_violation: true,
                ..Options::default()
            },
        );
        if let Some(v) = report.violations.first() {
            eprintln!(
                "seed {seed}: {} at tick {}: {}",
                v.invariant, v.tick, v.detail
            );
            eprintln!("replay: {}", replay_command(seed, overrides));
        }
        summary.add(&report);
    }
    eprintln!("{}", summary.to_json());
    summary
}

#[test]
fn ci_seeds_hold_every_invariant() {
    let summary = run(
        CI_SEEDS,
        Overrides {
            ticks: Some(CI_TICKS),
            ..Overrides::default()
        },
    );
    assert!(
        summary.failed_seeds.is_empty(),
        "failing seeds: {:?}",
        summary.failures
    );
}

#[test]
fn long_seed_range_on_demand() {
    let Ok(range) = std::env::var("STRAND_SIM_SEEDS") else {
        return;
    };
    let seeds = parse_range(&range).expect("STRAND_SIM_SEEDS must look like A..B");
    let summary = run(seeds, Overrides::default());
    assert!(
        summary.failed_seeds.is_empty(),
        "failing seeds: {:?}",
        summary.failures
    );
}

#[test]
fn a_seed_replays_bit_for_bit() {
    let overrides = Overrides {
        ticks: Some(600),
        ..Overrides::default()
    };
    for seed in [3, 7] {
        let a = run_seed(seed, overrides, Options::default());
        let b = run_seed(seed, overrides, Options::default());
        assert_eq!(a, b, "seed {seed} is not deterministic");
    }
}
