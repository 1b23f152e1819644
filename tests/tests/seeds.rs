//! Seed runs as ordinary tests: a short fixed set in CI, a long range on demand with
//! `STRAND_SIM_SEEDS=1..1000 cargo test --release -p tests --test seeds -- --nocapture`.

use tests::runner::{Overrides, Summary, parse_range, replay_command, run_seed};
use tests::sim::{Options, Report};

/// Small, fast seeds: short fault phases keep the debug build under a minute on two cores.
const CI_SEEDS: std::ops::Range<u64> = 0..32;
const CI_TICKS: u64 = 1_500;

/// Runs `seed` stopping at the first violation, which is printed with its replay command.
fn check_seed(seed: u64, overrides: Overrides) -> Report {
    let options = Options {
        stop_at_violation: true,
        ..Options::default()
    };
    let report = run_seed(seed, overrides, options);
    if let Some(v) = report.violations.first() {
        eprintln!(
            "seed {seed}: {} at tick {}: {}",
            v.invariant, v.tick, v.detail
        );
        eprintln!("replay: {}", replay_command(seed, overrides));
    }
    report
}

fn run(seeds: std::ops::Range<u64>, overrides: Overrides) -> Summary {
    let mut summary = Summary::default();
    for seed in seeds {
        summary.add(&check_seed(seed, overrides));
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

/// Seeds that found core bugs the core has fixed since: they must keep passing. An open
/// finding joins this list with its fix.
///
/// Earlier findings and their causes: 47, 341 (rollback after a forwarded append), 54 (fresh restart reusing op 1), 28, 895 (stalls after
/// that divergence), 1018, 1173 (parent after truncating to op 0), 464, 1665 (recovery
/// barrier), 1832, 692, 1260 (no repair without a commit_max advance), 2614, 4926 (acked
/// entries above a journal hole lost at recovery), 3347, 1566, 4443, 7060, 8750, 9037
/// (lost_state was not durable across a second crash), 4322, 6046, 8386 (n = 1 crash loop
/// after a failed append), 4866.
/// Fixed later: 3880, 9492 and 9801 (decision 32), 53286 (decision 33).
#[test]
fn fixed_seeds() {
    let mut failing = Vec::new();
    for (seed, overrides) in [
        47,
        341,
        54,
        28,
        895,
        1018,
        1173,
        464,
        1665,
        1832,
        692,
        1260,
        2614,
        363,
        620,
        // Partition-group stalls (decision 32): a Recovering replica offered a StartView
        // without a suffix by a primary whose journal lacked its committed head (4967); a view
        // change whose canonical DVCs described no committed head, so no one could anchor it
        // (3722).
        3722,
        4967,
        // Hash chain after a transfer and stalls of a wiped replica (core e93399a).
        3880,
        9492,
        9801,
        // Agreement (issue 8, decision 50): a restarted replica kept log_view 1 but lost the
        // header of op 6 it held only in memory, and as the only highest-log_view sender its
        // shorter log discarded committed op 6.
        9100001119,
        // Primary affinity without backoff (decision 171), fresh seeds: the metadata primary
        // took a partition group back right after abdicating there (its backup's clock
        // refused its timestamps), forever (6521744102340548486, `--replicas 2`-sized); a
        // replica whose takeover view changes never completed took over again at once, each
        // time stalling the group (7978156039964786132).
        6_521_744_102_340_548_486,
        7_978_156_039_964_786_132,
        // A wiped rejoin crashed one tick after starting, before one partition group's
        // lost-state superblock was durable; the next boot found no superblock there, booted
        // that group fresh, and its vote elected a primary without a replied op (decision 230).
        728_396_823_963_137_041,
    ]
    .map(|seed| (seed, Overrides::default()))
    .into_iter()
    .chain([
        // Metadata-group stall with `--replicas 4 --groups 5` (decision 33): the three live
        // replicas escalated view changes forever while the fourth, wiped, stayed Recovering;
        // op 84 was described (from a StartView) only by a replica that never held its body,
        // which did not nack it, so the merge awaited a copy only the lost replica could offer.
        (
            53286,
            Overrides {
                replicas: Some(4),
                groups: Some(4),
                ..Overrides::default()
            },
        ),
    ])
    .chain(
        [
            // Issue 8, decision 60: a primary whose recovery barrier sat above its commit point
            // refused every state transfer while both backups were mid-transfer (stall).
            9_200_000_136,
            880_288,
            // Issue 8, decision 61: a wiped replica adopted the isolated old primary's StartView
            // of a view it had voted to supersede and acked in it (stall, a safety hole).
            9_200_000_408,
        ]
        .map(|seed| {
            (
                seed,
                Overrides {
                    replicas: Some(3),
                    groups: Some(3),
                    ..Overrides::default()
                },
            )
        }),
    )
    .chain([
        // Issue 8, decisions 50-51 (fresh seed, `--replicas 2`): a primary-elect's merge cut an
        // op it had acknowledged in view 0 behind a barrier still carrying log_view 0; crashed
        // before the view started, it claimed the view-0 log without that op (`nack-acked`).
        (
            6_294_941_059_973_890_987,
            Overrides {
                replicas: Some(2),
                ..Overrides::default()
            },
        ),
    ]) {
        if !check_seed(seed, overrides).violations.is_empty() {
            failing.push(seed);
        }
    }
    assert!(failing.is_empty(), "fixed seeds fail again: {failing:?}");
}

/// The simulator runs on the journal's fault backend: disks that acknowledge flushes they never
/// did must lose acknowledged prepares at crashes, and the checkers must notice within a few
/// seeds (the same seeds hold every invariant with honest disks, above).
#[test]
fn lying_disks_are_caught() {
    let overrides = Overrides {
        ticks: Some(CI_TICKS),
        ..Overrides::default()
    };
    let caught = CI_SEEDS.into_iter().find(|&seed| {
        let options = Options {
            stop_at_violation: true,
            lying_sync: true,
            ..Options::default()
        };
        !run_seed(seed, overrides, options).violations.is_empty()
    });
    eprintln!("lying disks caught at seed {caught:?}");
    assert!(
        caught.is_some(),
        "no seed noticed disks that lie about fsync"
    );
}
