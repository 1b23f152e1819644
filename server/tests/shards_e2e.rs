//! Lanes align connections with groups under load (issue 10 item 6): three `strand start`
//! nodes, each with `--shards 2`, a topic whose partitions land on both shards, a producer
//! sending a bounded number of batches to every partition. From each node's `/metrics`, over
//! the load: replica frames flowed into both shards and partition prepares were appended on
//! both, and the frames forwarded between shards (`strand_frames_forwarded_total`) stay under
//! 1% of the replica frames received (`strand_replica_frames_in_total`): a group's frames
//! arrive on the connection of its lane, which the accepting shard handed to the shard that
//! owns the lane.
//!
//! Every wait is bounded; nothing asserts on elapsed time.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::client::{CREATE_STREAM, CREATE_TOPIC, Client, name, topic_body};
use common::{Node, eventually, partition_primary, partition_sum, scrape, send_batches};

const SHARDS: u16 = 2;
/// `cluster.replica_lanes` (the default).
const LANES: u16 = 16;
/// Batches of three messages the producer sends.
const BATCHES: usize = 300;

/// The fewest partitions of stream 0 / topic 0 that put groups on every shard.
fn partitions() -> u32 {
    let shard = |partition: u32| {
        let group = wire::GroupId::partition(wire::PartitionKey {
            stream: 0,
            topic: 0,
            partition,
        })
        .unwrap();
        shard::mapping::shard_of(group, LANES, SHARDS)
    };
    (1..64)
        .find(|&n| (0..SHARDS).all(|s| (0..n).any(|p| shard(p) == s)))
        .unwrap()
}

fn spawn(config: &Path, node: &mut Node, logs: &Path) {
    common::spawn_plain(config, node, logs, SHARDS as u8);
}

/// `name{labels}` of one shard's replica-plane or partition-plane counter.
fn per_shard(all: &BTreeMap<String, u64>, name: &str, shard: u16) -> u64 {
    let replica = format!("{name}{{shard=\"{shard}\"}}");
    let partition = format!("{name}{{plane=\"partition\",shard=\"{shard}\"}}");
    all.get(&replica)
        .or_else(|| all.get(&partition))
        .copied()
        .unwrap_or_else(|| panic!("no {name} for shard {shard}"))
}

#[test]
fn with_two_shards_under_load_frames_stay_on_their_lanes_shard() {
    let _serial = common::serial();
    let dir = common::scratch("shards");
    let ports = common::free_ports(9);
    let config_path = dir.join("strand.toml");
    std::fs::write(&config_path, common::config("shards-e2e", 3, &ports, "")).unwrap();
    let logs = dir.join("nodes.log");
    let mut nodes = common::nodes(&dir, 3, &ports);
    for node in nodes.iter_mut() {
        spawn(&config_path, node, &logs);
    }
    common::run_killed(&mut nodes, &logs, &dir, |nodes| {
        let partitions = partitions();
        let mp = common::metadata_primary(nodes, &[0, 1, 2], &logs);
        let mut admin = Client::connect(nodes[mp].tcp, 0xAD);
        admin.login();
        assert_eq!(admin.replicated(CREATE_STREAM, &name("load")).result(), 0);
        let topic = topic_body(0, partitions, "events");
        assert_eq!(admin.replicated(CREATE_TOPIC, &topic).result(), 0);
        let pp = partition_primary(nodes, &[0, 1, 2], u64::from(partitions), &logs);
        for node in nodes.iter() {
            let m = scrape(node.http).unwrap();
            for s in 0..SHARDS {
                assert!(
                    per_shard(&m, "strand_partition_groups", s) >= 1,
                    "n{} runs a group on shard {s}",
                    node.id
                );
            }
        }
        let before: Vec<_> = nodes.iter().map(|n| scrape(n.http).unwrap()).collect();

        let mut producer = Client::connect(nodes[pp].tcp, 0xB0B);
        producer.login();
        let mut acked = vec![Vec::new(); partitions as usize];
        send_batches(&mut producer, 0, &mut acked, 0, BATCHES);
        // Every node applied every acknowledged batch.
        let primary_commit =
            partition_sum(&scrape(nodes[pp].http).unwrap(), "strand_partition_commit");
        let after: Vec<_> = eventually("every node applied the load", &logs, || {
            let all: Option<Vec<_>> = nodes.iter().map(|n| scrape(n.http)).collect();
            all.filter(|all| {
                all.iter()
                    .all(|m| partition_sum(m, "strand_partition_commit") >= primary_commit)
            })
        });

        for (i, (b, a)) in before.iter().zip(&after).enumerate() {
            let delta = |name: &str, s: u16| per_shard(a, name, s) - per_shard(b, name, s);
            let frames: Vec<u64> = (0..SHARDS)
                .map(|s| delta("strand_replica_frames_in_total", s))
                .collect();
            let forwarded: u64 = (0..SHARDS)
                .map(|s| delta("strand_frames_forwarded_total", s))
                .sum();
            let appends: Vec<u64> = (0..SHARDS)
                .map(|s| delta("strand_partition_appends_total", s))
                .collect();
            eprintln!(
                "n{i}: replica frames in per shard {frames:?}, forwarded {forwarded}, partition \
                 appends per shard {appends:?}"
            );
            for s in 0..usize::from(SHARDS) {
                assert!(
                    frames[s] >= 50 && appends[s] >= 50,
                    "n{i}: replica frames and appends flowed on shard {s}: {frames:?} {appends:?}"
                );
            }
            let received: u64 = frames.iter().sum();
            assert!(
                forwarded * 100 < received,
                "n{i}: {forwarded} of {received} replica frames forwarded between shards (1% or \
                 more)"
            );
        }
    });
}
