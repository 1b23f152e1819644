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
