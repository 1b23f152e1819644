//! A tiny scenario language over the simulator, so a partition or crash story reads in a few
//! lines (STYLE.md §6):
//!
//! ```no_run
//! use tests::dsl::Scenario;
//! let mut s = Scenario::new(3);
//! s.isolate(2);
//! s.submit(5).expect_commits(5, 2_000);
//! s.heal().expect_converged(3_000);
//! s.assert_safe();
//! ```
//! Scenarios run with the seed's streams for delays and schedules but without the automatic
//! fault schedule and without automatic client traffic: every fault and request is the story's.

use crate::net::Node;
use crate::sim::{Options, Sim};
use crate::swarm::Swarm;

/// A scenario: a calm cluster whose faults and requests are driven by hand.
pub struct Scenario {
    /// The simulator underneath (for assertions the DSL does not cover).
    pub sim: Sim,
}

impl Scenario {
    /// A calm cluster of `replicas` hosting only the metadata group, seed 0.
    pub fn new(replicas: u8) -> Scenario {
        Scenario::with(0, Swarm::calm(replicas, 0))
    }

    /// A scenario over an explicit seed and swarm.
    pub fn with(seed: u64, swarm: Swarm) -> Scenario {
        Scenario::with_options(seed, swarm, Options::default())
    }

    /// A scenario over an explicit seed, swarm and simulator options (bug knobs, for stories
    /// that prove a checker bites).
    pub fn with_options(seed: u64, swarm: Swarm, options: Options) -> Scenario {
        let options = Options {
            trace: std::env::var("STRAND_SIM_TRACE").is_ok(),
            ..options
        };
        let mut sim = Sim::new(seed, swarm, options);
        sim.auto_faults = false;
        sim.auto_submit = false;
        Scenario { sim }
    }

    /// Cuts replica `r` off from every other replica (both directions).
    pub fn isolate(&mut self, r: u8) -> &mut Self {
        let others: Vec<Node> = (0..self.sim.swarm.replicas)
            .filter(|&p| p != r)
            .map(Node::Replica)
            .collect();
        self.sim.net.partition(&[Node::Replica(r)], &others);
        self
    }

    /// Blocks frames from `from` to `to` only.
    pub fn block(&mut self, from: u8, to: u8) -> &mut Self {
        self.sim.net.block(Node::Replica(from), Node::Replica(to));
        self
    }

    /// Splits the cluster into `side` and the rest.
    pub fn split(&mut self, side: &[u8]) -> &mut Self {
        let a: Vec<Node> = side.iter().copied().map(Node::Replica).collect();
        let b: Vec<Node> = (0..self.sim.swarm.replicas)
            .filter(|r| !side.contains(r))
            .map(Node::Replica)
            .collect();
        self.sim.net.partition(&a, &b);
        self
    }

    /// Loses every frame of `command` between replicas (`ppm` = 1_000_000) or a share of them.
    pub fn lose(&mut self, command: wire::Command, ppm: u32) -> &mut Self {
        self.sim.net.lose_command(command, ppm);
        self
    }

    /// Removes every partition, clog and command filter.
    pub fn heal(&mut self) -> &mut Self {
        self.sim.net.heal();
        self
    }

    /// Crashes replica `r` (its unreported writes are lost).
    pub fn crash(&mut self, r: u8) -> &mut Self {
        self.sim.crash_replica(r);
        self
    }

    /// Crashes replica `r` losing every write it has not seen complete (a power cut).
    pub fn power_cut(&mut self, r: u8) -> &mut Self {
        self.sim.crash_replica_losing_writes(r);
        self
    }

    /// Cuts replica `r`'s power the other way: its unreported appends land, the last one of
    /// each file torn (where `power_cut` loses them).
    pub fn power_cut_tearing(&mut self, r: u8) -> &mut Self {
        self.sim.power_cut_replica(r);
        self
    }

    /// Damages the newest durable metadata entry on replica `r`'s disk (a bit flip after it
    /// was durable: its header ring copy survives). Returns the op hit.
    pub fn corrupt_newest(&mut self, r: u8) -> u64 {
        self.sim
            .corrupt_newest_entry(r)
            .expect("a durable metadata entry to damage")
    }

    /// Wipes the data directory of the (down) replica `r`: its next start rejoins from an
    /// empty directory, as a replica that lost its state.
    pub fn wipe(&mut self, r: u8) -> &mut Self {
        self.sim.wipe_replica(r);
        self
    }

    /// Restarts replica `r` from its disk.
    pub fn restart(&mut self, r: u8) -> &mut Self {
        self.sim.restart_replica(r);
        self
    }

    /// Queues `count` requests on client 0.
    pub fn submit(&mut self, count: u32) -> &mut Self {
        self.sim.queue_requests(0, count);
        self
    }

    /// Runs `ticks` ticks.
    pub fn run(&mut self, ticks: u64) -> &mut Self {
        for _ in 0..ticks {
            self.sim.run_tick();
        }
        self
    }

    /// Runs until `done` holds, at most `ticks_max` ticks; returns whether it held.
    pub fn run_until(&mut self, ticks_max: u64, mut done: impl FnMut(&Sim) -> bool) -> bool {
        for _ in 0..ticks_max {
            if done(&self.sim) {
                return true;
            }
            self.sim.run_tick();
        }
        done(&self.sim)
    }

    /// Runs until client 0 has completed `count` requests in total; panics after `ticks_max`.
    pub fn expect_commits(&mut self, count: u64, ticks_max: u64) -> &mut Self {
        let ok = self.run_until(ticks_max, |sim| sim.client_completed(0) >= count);
        assert!(
            ok,
            "expected {count} completed requests within {ticks_max} ticks, got {} (tick {}, violations {:?})",
            self.sim.client_completed(0),
            self.sim.tick,
            self.sim.checker.violations
        );
        self.assert_safe()
    }

    /// Runs `ticks` and asserts client 0 completed nothing more (a minority must not commit).
    pub fn expect_no_commits(&mut self, ticks: u64) -> &mut Self {
        let before = self.sim.client_completed(0);
        self.run(ticks);
        assert_eq!(
            self.sim.client_completed(0),
            before,
            "requests completed while they should not"
        );
        self.assert_safe()
    }

    /// Runs until every group converged; panics after `ticks_max`.
    pub fn expect_converged(&mut self, ticks_max: u64) -> &mut Self {
        let ok = self.run_until(ticks_max, Sim::converged);
        assert!(
            ok,
            "no convergence within {ticks_max} ticks (tick {})",
            self.sim.tick
        );
        self.assert_safe()
    }

    /// Runs until some replica is the Normal primary of a view above `view` in the metadata
    /// group; panics after `ticks_max`.
    pub fn expect_view_above(&mut self, view: u32, ticks_max: u64) -> &mut Self {
        let group = self.sim.groups()[0];
        let n = self.sim.swarm.replicas;
        let ok = self.run_until(ticks_max, |sim| {
            (0..n).any(|r| {
                sim.replica(r, group)
                    .is_some_and(|x| x.is_primary() && x.view() > view)
            })
        });
        assert!(ok, "no primary above view {view} within {ticks_max} ticks");
        self.assert_safe()
    }

    /// Asserts no safety invariant broke so far.
    pub fn assert_safe(&mut self) -> &mut Self {
        let broken: Vec<String> = self
            .sim
            .checker
            .safety_violations()
            .map(ToString::to_string)
            .collect();
        assert!(broken.is_empty(), "violations: {broken:#?}");
        self
    }
}
