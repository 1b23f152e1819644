//! Three real `strand start` processes on loopback, one config: they form a cluster and agree
//! on a primary for the metadata group; SIGKILL of the primary gives a new view on the
//! survivors; the killed node restarts from its data directory, rejoins and catches up; then
//! all three are killed at once and restart without losing a committed op.
//!
//! Everything is read from each node's `/metrics`. Ops are committed through the test-only
//! hook `STRAND_TEST_REGISTER_INTERVAL_MS` (the primary submits a Register request of its own
//! every 100 ms, whichever node it is; decision 292 says why it stays). Waits are bounded
//! (generous: a loaded CI machine must not flake); the view change's duration is printed, not
//! asserted beyond the bound.

mod common;

use std::time::Instant;

use common::{Node, one_primary, spawn, wait_until};

fn all_nodes(nodes: &[Node]) -> Vec<&Node> {
    nodes.iter().collect()
}

#[test]
fn three_nodes_elect_fail_over_and_rejoin() {
    let _serial = common::serial();
    let dir = common::scratch("cluster");
    let ports = common::free_ports(9);
    let config_path = dir.join("strand.toml");
    let metadata = "journal_slots = 256\ncheckpoint_interval_ops = 8";
    std::fs::write(
        &config_path,
        common::config_with("cluster-e2e", 3, &ports, metadata, ""),
    )
    .unwrap();
    let logs = dir.join("nodes.log");
    let mut nodes = common::nodes(&dir, 3, &ports);
    for node in nodes.iter_mut() {
        spawn(&config_path, node, &logs, &[]);
    }
    common::run_cluster(&mut nodes, &logs, |nodes| {
        // 1. A cluster with one primary, committing.
        let all = wait_until(
            "one primary",
            &all_nodes(nodes),
            &logs,
            // Every node has checkpointed once (8 ops), so the restart below boots from a
            // snapshot with journaled prepares above it.
            |all| {
                one_primary(all)
                    && all
                        .iter()
                        .all(|m| m["commit_min"] >= 12 && m["checkpoints_total"] >= 1)
            },
        );
        let primary = all.iter().position(|m| m["is_primary"] == 1).unwrap();
        let view = all[primary]["view"];
        eprintln!("cluster formed: primary n{primary} in view {view}, metrics {all:?}");

        // 2. SIGKILL the primary: the survivors move to a newer view with a primary.
        let killed = Instant::now();
        common::kill(&mut nodes[primary]);
        let survivors: Vec<&Node> = nodes
            .iter()
            .filter(|n| usize::from(n.id) != primary)
            .collect();
        let after = wait_until("a new view on the survivors", &survivors, &logs, |all| {
            one_primary(all) && all[0]["view"] > view
        });
        let took = killed.elapsed();
        eprintln!(
            "view change after SIGKILL of n{primary}: {took:?} (view {view} -> {})",
            after[0]["view"]
        );
        // The new primary commits (its own Registers).
        let commit_then = after.iter().map(|m| m["commit_max"]).max().unwrap();
        let after = wait_until("commits in the new view", &survivors, &logs, |all| {
            all.iter().all(|m| m["commit_max"] > commit_then)
        });
        let commit_before_restart = after.iter().map(|m| m["commit_max"]).min().unwrap();

        // 3. The killed node restarts from its directory, rejoins and catches up.
        spawn(&config_path, &mut nodes[primary], &logs, &[]);
        let all = wait_until(
            "the restarted node rejoins",
            &all_nodes(nodes),
            &logs,
            |all| {
                let me = &all[primary];
                one_primary(all)
                    && me["is_primary"] == 0
                    && me["commit_min"] >= commit_before_restart
                    && me["commit_max"] >= commit_before_restart
            },
        );
        eprintln!("rejoined: {all:?}");
        // The restart found its durable state: a superblock and journaled prepares (the
        // first boot of every node finds neither).
        let log = std::fs::read_to_string(&logs).unwrap();
        let restarted = log
            .lines()
            .find(|l| l.contains("metadata group recovered from") && l.contains("superblock=Some"))
            .unwrap_or_else(|| panic!("no recovery of a superblock:\n{log}"));
        let journaled: u64 = restarted
            .split("journaled=")
            .nth(1)
            .and_then(|t| t.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        assert!(
            journaled >= 3,
            "it recovered {journaled} prepares: {restarted}"
        );
        let snapshot_op: u64 = restarted
            .split("snapshot_op=")
            .nth(1)
            .and_then(|t| t.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        assert!(snapshot_op >= 8, "it restored no checkpoint: {restarted}");

        // 4. SIGKILL of all three at once, then all restart from their directories: nothing
        // committed is lost (the commit point reaches at least what any node reported) and no
        // view goes back.
        let before = wait_until(
            "metrics before the full kill",
            &all_nodes(nodes),
            &logs,
            |_| true,
        );
        let committed = before.iter().map(|m| m["commit_max"]).max().unwrap();
        let view = before.iter().map(|m| m["view"]).max().unwrap();
        common::kill_all(nodes);
        for node in nodes.iter_mut() {
            spawn(&config_path, node, &logs, &[]);
        }
        let after = wait_until("the restarted cluster", &all_nodes(nodes), &logs, |all| {
            one_primary(all) && all.iter().all(|m| m["commit_min"] > committed)
        });
        assert!(after.iter().all(|m| m["view"] >= view), "{after:?}");
        eprintln!("after a full restart (committed {committed} before): {after:?}");
    });
    let _ = std::fs::remove_dir_all(&dir);
}
