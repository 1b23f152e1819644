//! Primary affinity on the node (decision 221, spec README decision 3): three nodes' partition
//! hosts on one glommio executor (real temporary directories, an in-process network: the
//! cluster of `partition_cluster`, shared with `partition_replicated.rs`). Each host reads its node's metadata lead through
//! `Host::set_metadata_lead`; here a cell stands for the metadata pump's gauges. When the lead
//! moves to another node, every partition group's primary follows it there, and that node's
//! host accepts and commits a SendMessages on every partition.

mod partition_cluster;

use std::sync::atomic::Ordering;
use std::time::Duration;

use consensus::Status;
use server::client::reply::{decode_send_reply, read_result};
use server::groups::Partitions;

use partition_cluster::{Cluster, group, run, send, until, view};

const N: u8 = 3;
const PARTITIONS: u32 = 4;

impl Cluster {
    /// Whether every group on every node is Normal with its primary on node `r`.
    fn all_led_by(&self, r: u8) -> bool {
        (0..N).all(|node| {
            (0..PARTITIONS).all(|p| {
                self.host(node)
                    .group_state(group(p))
                    .is_some_and(|(view, status, ..)| {
                        status == Status::Normal && view % u32::from(N) == u32::from(r)
                    })
            })
        })
    }

    fn takeovers(&self, r: u8) -> u64 {
        self.host(r).gauges.takeovers.load(Ordering::Relaxed)
    }

    /// Sends one SendMessages to every partition at node `r` and waits until each commits
    /// (a request refused or answered with a transient status is sent again).
    async fn send_everywhere(&self, r: u8, round: u64) {
        let node = self.nodes[r as usize].as_ref().expect("running");
        for p in 0..PARTITIONS {
            let payload = format!("round {round} partition {p}").into_bytes();
            let client = 0x5E_0000 + u128::from(p);
            let mut committed = false;
            for attempt in 0..300u64 {
                let before = node.replies.0.borrow().len();
                let number = round * 1000 + attempt + 1;
                if node
                    .host
                    .submit(group(p), send(client, number, p, &[&payload]))
                    .is_ok()
                {
                    until("a SendMessages reply", || {
                        node.replies.0.borrow().len() > before
                    })
                    .await;
                    let (_, frame) = node.replies.0.borrow().last().cloned().unwrap();
                    let status = u32::from_le_bytes(frame.bytes()[216..220].try_into().unwrap());
                    if status == 0 {
                        let body = &frame.bytes()[256..];
                        let sent = decode_send_reply(read_result(body).unwrap().unwrap()).unwrap();
                        assert_eq!(sent.len(), 1);
                        committed = true;
                        break;
                    }
                }
                glommio::timer::sleep(Duration::from_millis(10)).await;
            }
            assert!(committed, "partition {p} never committed at node {r}");
        }
    }
}

/// With no metadata lead anywhere the groups stay with replica 0 (view 0); when node 1's
/// metadata replica leads, every group's primary moves to node 1 and node 1 commits on every
/// partition; when the lead moves on to node 2, the primaries follow again. Only the leading
/// node takes over.
#[test]
fn partition_primaries_follow_the_metadata_primary() {
    run(|| async {
        let c = Cluster::new("affinity", N, view(PARTITIONS, 8));
        until("every group normal under replica 0", || c.all_led_by(0)).await;
        c.send_everywhere(0, 1).await;
        assert_eq!((0..N).map(|r| c.takeovers(r)).sum::<u64>(), 0);

        c.leads[1].set(Some(4));
        until("every group led by node 1", || c.all_led_by(1)).await;
        c.send_everywhere(1, 2).await;
        assert!(
            c.takeovers(1) >= u64::from(PARTITIONS),
            "node 1 took the groups over"
        );
        assert_eq!(
            c.takeovers(0) + c.takeovers(2),
            0,
            "only the leading node takes over"
        );

        c.leads[1].set(None);
        c.leads[2].set(Some(8));
        until("every group led by node 2", || c.all_led_by(2)).await;
        c.send_everywhere(2, 3).await;
        assert!(c.takeovers(2) >= u64::from(PARTITIONS));
    });
}
