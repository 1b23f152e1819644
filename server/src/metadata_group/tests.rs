use super::*;
use crate::boot::{MetadataBoot, recover};
use crate::test_frames::prepare;
use consensus::{DigestStateMachine, WholeArtifacts};
use journal::MemStorage;

/// The metadata inbox counts frames in and out by their bytes too (decision 503): 256
/// frames of 1 MiB fill it, the next is dropped and counted, and each one the pump takes
/// out makes room again; a connection report is never refused.
#[test]
fn the_inbox_holds_a_bounded_number_of_bytes() {
    use crate::inbox_bound::INBOX_BYTES_MAX;
    use std::sync::atomic::Ordering;
    let gauges = Arc::new(Gauges::default());
    let inbox = Inbox::new(gauges.clone());
    let frame = || Event::Frame {
        from: 1,
        bytes: vec![0u8; 1 << 20],
    };
    for _ in 0..INBOX_BYTES_MAX >> 20 {
        inbox.push(frame());
    }
    inbox.push(frame());
    assert_eq!(gauges.inbox_dropped_full.load(Ordering::Relaxed), 1);
    inbox.push(Event::Peer {
        peer: 1,
        connected: false,
    });
    for _ in 0..2 {
        assert!(matches!(inbox.pop(), Some(Event::Frame { .. })));
        inbox.push(frame());
    }
    assert_eq!(gauges.inbox_dropped_full.load(Ordering::Relaxed), 1);
    inbox.push(frame());
    assert_eq!(gauges.inbox_dropped_full.load(Ordering::Relaxed), 2);
    assert_eq!(inbox.events.borrow().len(), (INBOX_BYTES_MAX >> 20) + 1);
}
use journal::metadata::JournalConfig;

const IDENTITY: journal::Identity = journal::Identity {
    cluster: 42,
    replica_id: 0,
    replica_count: 3,
};
const JOURNAL: JournalConfig = JournalConfig {
    slot_count: 64,
    slot_size: 4096,
};

async fn boot(disk: &MemStorage) -> MetadataBoot<MemStorage, DigestStateMachine> {
    recover(
        disk.clone(),
        std::path::Path::new("mem"),
        IDENTITY,
        JOURNAL,
        DigestStateMachine::default(),
    )
    .await
    .unwrap()
}

fn on_executor<F, Fut>(f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .io_memory(256 << 10)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap();
}

/// Storage effects complete in emission order; a Truncate lands after the appends queued
/// before it and before the ones queued after it; a checkpoint is durable (snapshot,
/// superblock, floor) before `Checkpointed`, and the next boot restores it.
#[test]
fn storage_effects_run_in_emission_order() {
    on_executor(|| async {
        let disk = MemStorage::new();
        let p1 = prepare(1, 0, 1);
        let p2 = prepare(2, identity_of(&p1), 2);
        let p3 = prepare(3, identity_of(&p2), 3);
        let p2b = prepare(2, identity_of(&p1), 9);
        let ops = vec![
            MetadataStorageOp::Append {
                op: 1,
                frame: Frame::new(p1.clone()),
            },
            MetadataStorageOp::Append {
                op: 2,
                frame: Frame::new(p2.clone()),
            },
            MetadataStorageOp::Append {
                op: 3,
                frame: Frame::new(p3.clone()),
            },
            MetadataStorageOp::Truncate { from_op: 2 },
            MetadataStorageOp::Append {
                op: 2,
                frame: Frame::new(p2b.clone()),
            },
            MetadataStorageOp::Persist(consensus::VsrState {
                view: 1,
                log_view: 1,
                commit_max: 1,
                lost_state: false,
                ..consensus::VsrState::default()
            }),
            MetadataStorageOp::Checkpoint {
                snapshot: Snapshot {
                    op: 1,
                    payload: encode_snapshot(
                        identity_of(&p1),
                        1_001,
                        &[],
                        &consensus::DigestMachine {
                            op: 1,
                            digest: 77,
                            partition: false,
                        }
                        .artifacts(1),
                    ),
                },
                prepare: (identity_of(&p1), 1_001),
            },
        ];
        let done = execute(&disk, ops).await;
        assert_eq!(
            done,
            vec![
                Completion::Appended {
                    op: 1,
                    checksum: identity_of(&p1)
                },
                Completion::Appended {
                    op: 2,
                    checksum: identity_of(&p2)
                },
                Completion::Appended {
                    op: 3,
                    checksum: identity_of(&p3)
                },
                Completion::Appended {
                    op: 2,
                    checksum: identity_of(&p2b)
                },
                Completion::VsrStatePersisted {
                    view: 1,
                    log_view: 1
                },
                Completion::Checkpointed { op: 1 },
            ]
        );
        let again = boot(&disk).await;
        let r = &again.recovered;
        assert_eq!(
            r.superblock.as_ref().map(|s| (s.view, s.log_view)),
            Some((1, 1)),
            "the superblock kept the view across the checkpoint"
        );
        assert_eq!((r.snapshot_op, r.snapshot_checksum), (1, identity_of(&p1)));
        assert_eq!(again.state_machine.digest, 77, "restored from the snapshot");
        let frames: Vec<(u64, u128)> = r
            .frames
            .iter()
            .map(|f| (f.prepare_header().unwrap().op.get(), identity_of(f.bytes())))
            .collect();
        assert_eq!(
            frames,
            vec![(1, identity_of(&p1)), (2, identity_of(&p2b))],
            "op 3 truncated, op 2 replaced"
        );
    });
}

/// Runs `ops` through the storage task (the executor's write path) on `disk`, booted,
/// and returns what it completed.
async fn execute(disk: &MemStorage, ops: Vec<MetadataStorageOp>) -> Vec<Completion> {
    let booted = boot(disk).await;
    let gauges = Arc::new(Gauges::default());
    let queue = Rc::new(StorageQueue::default());
    let inbox = Rc::new(Inbox::new(gauges.clone()));
    let fatal = Rc::new(RefCell::new(None));
    for op in ops {
        queue.push(op);
    }
    queue.close();
    storage_task(
        booted.disk,
        queue,
        inbox.clone(),
        fatal.clone(),
        gauges,
        None,
    )
    .await;
    assert_eq!(*fatal.borrow(), None);
    let mut done = Vec::new();
    while let Some(Event::Done(c)) = inbox.pop() {
        done.push(c);
    }
    done
}

fn header(frame: &[u8]) -> wire::header::PrepareHeader {
    use wire::header::Layout;
    *wire::header::PrepareHeader::view(&frame[..wire::HEADER_SIZE]).unwrap()
}

/// Decisions 50-52 across a restart: what the core's `PersistVsrState` carried (view
/// headers, truncation ceiling, the checkpoint's prepare identity) comes back at boot from
/// the node's own superblock, exactly: the newest write's headers replace the older ones,
/// the ceiling is never lowered, and a checkpoint identity is recorded once the core names
/// it for the checkpoint the superblock records (a checkpoint taken without it) and is
/// never overwritten by a later different one.
#[test]
fn a_restarted_node_restores_view_headers_ceiling_and_checkpoint_identity() {
    on_executor(|| async {
        let disk = MemStorage::new();
        let p1 = prepare(1, 0, 1);
        let p2 = prepare(2, identity_of(&p1), 2);
        let p3 = prepare(3, identity_of(&p2), 3);
        let fresh = boot(&disk).await;
        assert_eq!(fresh.recovered.superblock, None, "only formatted: no state");
        drop(fresh);
        let state = |view: u32, headers: &[&[u8]], ceiling: u64, identity: (u128, u64)| {
            consensus::VsrState {
                view,
                log_view: view,
                commit_max: 1,
                lost_state: false,
                view_headers: headers.iter().map(|f| header(f)).collect(),
                held_ceiling: ceiling,
                snapshot_op: 1,
                snapshot_checksum: identity.0,
                snapshot_timestamp: identity.1,
            }
        };
        let done = execute(
            &disk,
            vec![
                MetadataStorageOp::Append {
                    op: 1,
                    frame: Frame::new(p1.clone()),
                },
                MetadataStorageOp::Append {
                    op: 2,
                    frame: Frame::new(p2.clone()),
                },
                // A checkpoint whose prepare identity the replica did not know yet (a
                // transferred snapshot before the op above it arrived).
                checkpoint_1_without_identity(),
                MetadataStorageOp::Persist(state(2, &[&p2, &p3], 5, (identity_of(&p1), 1_001))),
                MetadataStorageOp::Persist(state(3, &[&p3], 4, (0xbad, 7))),
            ],
        )
        .await;
        assert_eq!(done.len(), 5, "{done:?}");
        let again = boot(&disk).await;
        let r = &again.recovered;
        assert_eq!(
            r.superblock,
            Some(state(3, &[&p3], 5, (identity_of(&p1), 1_001))),
            "restored from the superblock: newest headers, highest ceiling, the identity \
                 learned for checkpoint 1 kept"
        );
        assert_eq!(
            (r.snapshot_op, r.snapshot_checksum, r.snapshot_timestamp),
            (1, identity_of(&p1), 1_001),
            "the checkpoint identity from the superblock, not the snapshot payload (0)"
        );
        drop(again);

        // Decision 52, asked again at completion: an identity learned after the
        // checkpoint was taken is recorded for that checkpoint only, once.
        let learned = MemStorage::new();
        let done = execute(
            &learned,
            vec![
                MetadataStorageOp::Append {
                    op: 1,
                    frame: Frame::new(p1.clone()),
                },
                checkpoint_1_without_identity(),
                MetadataStorageOp::CheckpointIdentity {
                    op: 2,
                    prepare: (0xbad, 7),
                },
                MetadataStorageOp::CheckpointIdentity {
                    op: 1,
                    prepare: (identity_of(&p1), 1_001),
                },
                MetadataStorageOp::CheckpointIdentity {
                    op: 1,
                    prepare: (0xbad, 7),
                },
            ],
        )
        .await;
        assert_eq!(
            done,
            vec![
                Completion::Appended {
                    op: 1,
                    checksum: identity_of(&p1)
                },
                Completion::Checkpointed { op: 1 },
            ]
        );
        let r = boot(&learned).await.recovered;
        assert_eq!(
            (r.snapshot_op, r.snapshot_checksum, r.snapshot_timestamp),
            (1, identity_of(&p1), 1_001)
        );

        // A state the core wrote is a state even when it equals the formatted bytes (a
        // restarted replica is not a fresh one).
        let other = MemStorage::new();
        drop(boot(&other).await);
        let done = execute(
            &other,
            vec![MetadataStorageOp::Persist(consensus::VsrState::default())],
        )
        .await;
        assert_eq!(done.len(), 1, "{done:?}");
        assert_eq!(
            boot(&other).await.recovered.superblock,
            Some(consensus::VsrState::default())
        );
    });
}

/// A checkpoint at op 1 of an empty state, taken before the replica knew the identity of op 1's
/// prepare (a transferred snapshot that arrived before the op above it).
fn checkpoint_1_without_identity() -> MetadataStorageOp {
    MetadataStorageOp::Checkpoint {
        snapshot: Snapshot {
            op: 1,
            payload: encode_snapshot(0, 0, &[], &consensus::DigestMachine::default().artifacts(1)),
        },
        prepare: (0, 0),
    }
}
