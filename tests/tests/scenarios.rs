//! Partition and crash stories over the simulator (simulation.md §3), each a few DSL lines.

use tests::dsl::Scenario;
use wire::Command;

#[test]
fn calm_cluster_commits() {
    let mut s = Scenario::new(3);
    s.submit(5).expect_commits(5, 1_000);
    s.expect_converged(1_000);
}

#[test]
fn solo_cluster_commits() {
    let mut s = Scenario::new(1);
    s.submit(3).expect_commits(3, 500);
}

#[test]
fn isolated_backup_does_not_block_commits() {
    let mut s = Scenario::new(3);
    s.isolate(2);
    s.submit(5).expect_commits(5, 2_000);
    s.heal().expect_converged(5_000);
}

#[test]
fn isolated_primary_is_replaced() {
    let mut s = Scenario::new(3);
    s.submit(2).expect_commits(2, 1_000);
    s.isolate(0).expect_view_above(0, 3_000);
    s.submit(2).expect_commits(4, 3_000);
    s.heal().expect_converged(5_000);
}

#[test]
fn primary_that_can_receive_but_not_send_is_replaced() {
    let mut s = Scenario::new(3);
    s.submit(1).expect_commits(1, 1_000);
    s.block(0, 1).block(0, 2).expect_view_above(0, 3_000);
    s.submit(2).expect_commits(3, 5_000);
    s.heal().expect_converged(5_000);
}

/// Backups keep hearing the primary's Commit heartbeats while the primary hears no PrepareOk:
/// only the core's primary abdication (a [design] addition to consensus.md §7) gets the backups
/// to elect. The client must also leave the stale primary that answers "not committed" forever.
#[test]
fn primary_that_can_send_but_not_receive_is_replaced() {
    let mut s = Scenario::new(3);
    s.submit(1).expect_commits(1, 1_000);
    s.block(1, 0).block(2, 0);
    s.submit(2).expect_commits(3, 5_000);
    s.heal().expect_converged(5_000);
}

#[test]
fn minority_cannot_commit() {
    let mut s = Scenario::new(5);
    s.submit(1).expect_commits(1, 1_000);
    s.split(&[0, 1]).submit(1).expect_no_commits(300);
    s.heal().expect_commits(2, 5_000);
}

#[test]
fn crashed_primary_restarts_and_cluster_converges() {
    let mut s = Scenario::new(3);
    s.submit(3).expect_commits(3, 1_000);
    s.crash(0).expect_view_above(0, 3_000);
    s.submit(2).expect_commits(5, 3_000);
    s.restart(0).expect_converged(5_000);
}

#[test]
fn whole_cluster_restart_keeps_committed_ops() {
    let mut s = Scenario::new(3);
    s.submit(3).expect_commits(3, 1_000);
    s.crash(0).crash(1).crash(2).run(10);
    s.restart(0).restart(1).restart(2);
    s.submit(1).expect_commits(4, 5_000);
    s.expect_converged(5_000);
}

#[test]
fn lost_start_views_are_recovered_by_the_probe() {
    let mut s = Scenario::new(3);
    s.submit(1).expect_commits(1, 1_000);
    s.lose(Command::StartView, 1_000_000).isolate(0).run(1_500);
    s.heal().isolate(0).expect_view_above(0, 5_000);
    s.submit(1).expect_commits(2, 5_000);
    s.heal().expect_converged(5_000);
}

#[test]
fn half_of_the_prepare_oks_lost() {
    let mut s = Scenario::new(3);
    s.lose(Command::PrepareOk, 500_000);
    s.submit(10).expect_commits(10, 5_000);
    s.heal().expect_converged(3_000);
}

#[test]
fn lost_commit_heartbeats_cause_a_view_change_and_no_harm() {
    let mut s = Scenario::new(5);
    s.submit(2).expect_commits(2, 1_000);
    s.lose(Command::Commit, 1_000_000)
        .expect_view_above(0, 3_000);
    s.submit(2).expect_commits(4, 5_000);
    s.heal().expect_converged(5_000);
}

#[test]
fn flapping_partition_faster_than_the_heartbeat_timeout() {
    let mut s = Scenario::new(3);
    s.submit(1).expect_commits(1, 1_000);
    for round in 0..20u8 {
        s.isolate(round % 3).run(100);
        s.heal().run(50);
    }
    s.submit(3).expect_commits(4, 5_000);
    s.expect_converged(5_000);
}

#[test]
fn two_replicas_of_five_crash_together_and_return() {
    let mut s = Scenario::new(5);
    s.submit(3).expect_commits(3, 1_000);
    s.crash(0).crash(1).submit(2).expect_commits(5, 5_000);
    s.restart(0).restart(1).expect_converged(5_000);
}

/// Issue 8 item 1, decision 51, end to end: backup r2 journals op 1 of view 0 that never
/// commits (the primary loses it in a power cut); view 1 commits ops 1..=3 without r2; r2
/// adopts view 1, journals and acknowledges op 4 while it cannot repair yet; then repair proves
/// its op 1 stale and the cut also removes the acknowledged op 4. r2 loses power before it has
/// op 4 again, op 4's other holder (the primary) goes down, and r0 never had op 4. Restarted,
/// r2 must not nack op 4 in the next view change: the nack quorum (2 of 3) would discard a
/// committed op. Returns the scenario for the caller's assertions.
fn stale_fork_below_an_acked_op_through_a_restart(options: tests::sim::Options) -> Scenario {
    let mut swarm = tests::swarm::Swarm::calm(3, 0);
    swarm.slow_disk = Some(0);
    let mut s = Scenario::with_options(0, swarm, options);
    let group = s.sim.groups()[0];
    // Op 1 of view 0 reaches r2 only; r2's ack never reaches r0; r0 loses its own copy.
    s.isolate(1).block(2, 0).submit(1);
    let r2_holds_op_1 = s.run_until(200, |sim| {
        sim.replica(2, group).is_some_and(|r| r.is_durable(1))
    });
    assert!(r2_holds_op_1, "r2 journals the stale op 1");
    s.power_cut(0).heal().isolate(2).restart(0);
    // View 1 (primary r1) commits ops 1..=3 without r2 (the client retries its request).
    s.expect_view_above(0, 3_000);
    s.submit(2).expect_commits(3, 5_000);
    // r2 rejoins view 1 but cannot repair yet; r0 is cut off so op 4 commits with r2's ack.
    s.heal()
        .isolate(0)
        .lose(Command::RequestPrepares, 1_000_000);
    s.submit(1).expect_commits(4, 5_000);
    let r2 = s.sim.replica(2, group).expect("r2 up");
    let acked = r2.op();
    assert!(
        r2.log_view() == 1
            && r2.is_durable(acked)
            && r2.header(1).is_some_and(|h| h.frame.view.get() == 0),
        "r2 holds the stale op 1 and acknowledged op {acked} in view 1"
    );
    // Repair resumes: op 2 proves r2's op 1 stale; the cut removes the acked op as well.
    s.heal().isolate(0);
    let cut = s.run_until(2_000, |sim| {
        sim.replica(2, group)
            .is_some_and(|r| r.header(acked).is_none())
    });
    assert!(cut, "the stale run is cut together with op {acked}");
    // r2 loses power before it holds that op again; the primary r1 goes down too.
    s.power_cut(2).crash(1).heal().restart(2);
    s
}

#[test]
fn a_stale_fork_below_an_acked_op_survives_a_restart() {
    let mut s = stale_fork_below_an_acked_op_through_a_restart(tests::sim::Options::default());
    // r0 and r2 cannot decide op 4 alone (only r1 holds its body): no view may discard it.
    s.run(3_000).assert_safe();
    s.restart(1).expect_converged(10_000);
    s.submit(1).expect_commits(5, 5_000);
    s.assert_safe();
}

/// The same story with the truncation ceiling kept in memory only (decision 51 broken): the
/// restarted r2 nacks the op it acknowledged and the checkers catch it.
#[cfg(feature = "bug-knobs")]
#[test]
fn bug_knob_a_volatile_truncation_ceiling_is_caught_by_the_story() {
    let options = tests::sim::Options {
        bug_knobs: consensus::BugKnobs {
            volatile_truncation_ceiling: true,
            ..consensus::BugKnobs::default()
        },
        ..tests::sim::Options::default()
    };
    let mut s = stale_fork_below_an_acked_op_through_a_restart(options);
    s.run(3_000).restart(1).run(10_000);
    let broken: Vec<String> = s
        .sim
        .checker
        .safety_violations()
        .map(ToString::to_string)
        .collect();
    assert!(
        broken.iter().any(|v| v.contains("nack-acked")),
        "violations: {broken:#?}"
    );
}

/// Decision 62, the cluster-wide case: a power cut tears the same last write on every
/// replica. A torn write never reached the header ring (it is written after the prepare's
/// sync, and the append completes, and PrepareOk leaves, only after both), so no replica ever
/// acked it and no replica holds it at boot: every boot cuts it (none exits), the view change
/// completes without it, and the client's retry commits.
#[test]
fn a_power_cut_tearing_the_same_last_write_everywhere() {
    let mut swarm = tests::swarm::Swarm::calm(3, 0);
    // Slow disks, so the last append is still unreported on every replica when power goes.
    swarm.disk_latency = (200, 200);
    let mut s = Scenario::with(0, swarm);
    s.submit(2).expect_commits(2, 10_000);
    s.submit(1);
    let group = s.sim.groups()[0];
    let committed = s.sim.replica(0, group).unwrap().commit_max();
    let last = committed + 1;
    let pending_everywhere = s.run_until(2_000, |sim| {
        (0..3).all(|r| {
            sim.replica(r, group)
                .is_some_and(|x| x.header(last).is_some() && !x.is_durable(last))
        })
    });
    assert!(pending_everywhere, "op {last} pending on every replica");
    s.power_cut_tearing(0)
        .power_cut_tearing(1)
        .power_cut_tearing(2);
    assert_eq!(
        (0..3)
            .map(|r| s.sim.hosts_torn_writes(r))
            .collect::<Vec<_>>(),
        vec![1, 1, 1],
        "the same last write torn everywhere"
    );
    s.restart(0).restart(1).restart(2);
    assert!((0..3).all(|r| s.sim.is_up(r)), "no boot refused");
    assert!(
        (0..3).all(|r| s.sim.replica(r, group).is_some_and(|x| x.op() < last)),
        "every boot cut the torn op {last}"
    );
    assert_eq!(
        s.sim.report.faulty_entries_held, 0,
        "a torn write is never faulty"
    );
    s.expect_commits(3, 20_000);
    s.expect_converged(20_000);
}

/// Decision 62, one replica: r2 is cut off while r0 and r1 commit; then r1's newest entry (a
/// committed op only r0 and r1 hold) is damaged and both crash. r1 restarts: the entry is held
/// but faulty, so its DoViewChange neither offers nor nacks it, and with r2's nack alone
/// (`Q_nack` = 2) the view change waits for a copy instead of discarding a committed op. When
/// r0 returns with its copy the op survives. Cutting the damaged newest entry at boot (the old
/// policy) lets r1 and r2 nack it and a new op takes its place: agreement breaks.
#[test]
fn a_damaged_newest_entry_is_repaired_not_discarded() {
    let mut s = Scenario::new(3);
    s.submit(1).expect_commits(1, 2_000);
    s.isolate(2);
    s.submit(2).expect_commits(3, 5_000);
    let op = s.corrupt_newest(1);
    s.crash(0).crash(1).heal().restart(1).run(3_000);
    assert_eq!(
        s.sim.report.faulty_entries_held, 1,
        "op {op} held but faulty"
    );
    s.assert_safe();
    s.restart(0);
    s.submit(1).expect_commits(4, 20_000);
    s.expect_converged(20_000);
}

/// Decision 230: a wiped replica that rejoins and loses power before any group's lost-state
/// superblock is durable boots again with no superblock anywhere; its directory's rejoin
/// format must still make every group lost state (it may have acknowledged prepares in the
/// life before the wipe), never a fresh replica that votes. Seed 728396823963137041 found it.
#[test]
fn a_rejoin_cut_before_its_marks_land_boots_in_lost_state_again() {
    let mut s = Scenario::with(0, tests::swarm::Swarm::calm(3, 2));
    s.submit(3).expect_commits(3, 10_000);
    s.crash(0).wipe(0).restart(0);
    let groups = s.sim.groups().to_vec();
    assert!(
        groups
            .iter()
            .all(|&g| s.sim.replica(0, g).is_some_and(|x| x.is_lost_state())),
        "a wiped rejoin starts in lost state"
    );
    // The power goes before a single superblock write completed.
    s.power_cut(0).restart(0);
    let fresh: Vec<u64> = groups
        .iter()
        .copied()
        .filter(|&g| s.sim.replica(0, g).is_some_and(|x| !x.is_lost_state()))
        .collect();
    assert!(
        fresh.is_empty(),
        "groups booted fresh after a cut rejoin: {fresh:#x?}"
    );
    s.submit(2).expect_commits(5, 20_000);
    s.expect_converged(20_000);
    // The metadata group, which committed ops, completes the rejoin once r0 holds the
    // adopted view's log (a group still at op 0 stays lost state: nothing to hold).
    assert!(
        s.sim
            .replica(0, groups[0])
            .is_some_and(|x| !x.is_lost_state()),
        "the metadata group's rejoin completes"
    );
}

/// Decision 504: eight clients keep the metadata pipeline full while the middle of the chain
/// (r1) has a slow disk and, when `bound` says so, room for one incomplete append. Every
/// request must complete and the group converge. Returns r1's peak of incomplete append bytes
/// and the prepares it skipped.
fn slow_middle_backup(bound: Option<u64>) -> (u64, u64) {
    const CLIENTS: usize = 8;
    const EACH: u32 = 30;
    let mut swarm = tests::swarm::Swarm::calm(3, 0);
    swarm.slow_disk = Some(1);
    swarm.appending_bytes_max = bound;
    swarm.clients = CLIENTS as u32;
    let mut s = Scenario::with(0, swarm);
    let group = s.sim.groups()[0];
    for c in 0..CLIENTS {
        s.sim.queue_requests(c, EACH);
    }
    let mut peak = 0;
    let done = s.run_until(30_000, |sim| {
        peak = peak.max(sim.replica(1, group).map_or(0, |r| r.appending_bytes()));
        (0..CLIENTS).all(|c| sim.client_completed(c) >= u64::from(EACH))
    });
    assert!(done, "every request completes");
    s.expect_converged(20_000);
    let skipped = s
        .sim
        .replica(1, group)
        .map_or(0, |r| r.prepares_skipped_behind());
    (peak, skipped)
}

#[test]
fn a_backup_behind_its_disk_keeps_a_bounded_backlog_and_catches_up() {
    // Bounded: r1 skips prepares (forwarded, so r2 and the primary commit without it) and
    // repairs them once its disk caught up; its backlog peaks at one append plus what one
    // repair chunk brings (2,517 B here).
    let (peak, skipped) = slow_middle_backup(Some(1));
    // Unbounded, the same story holds every prepare in flight at r1 (8,672 B here).
    let (peak_unbounded, skipped_unbounded) = slow_middle_backup(None);
    assert!(skipped > 0, "the bound binds");
    assert_eq!(skipped_unbounded, 0);
    assert!(
        peak < peak_unbounded,
        "bounded peak {peak} B against {peak_unbounded} B unbounded"
    );
}
