//! Simulated clients: Register, then metadata (CreateStream) or partition (SendMessages)
//! requests, one outstanding each, with timeouts, retries and re-routing on refusals; replies
//! are checked against what committed.

use consensus::GroupId;
use wire::header::{EvictionHeader, Layout, RequestHeader};
use wire::{Command, Operation};

use super::{Outstanding, Sim};
use crate::machine::{send_messages_batch, send_messages_request};
use crate::net::Node;

impl Sim {
    pub(super) fn clients_act(&mut self) {
        let n = self.swarm.replicas;
        for i in 0..self.clients.len() {
            let retry = self.swarm.client_retry_ticks;
            let tick = self.tick;
            let (timed_out, retry_due) = match &self.clients[i].outstanding {
                Some(o) => (
                    tick >= o.last_sent + retry,
                    o.retry_at.is_some_and(|at| tick >= at),
                ),
                None => (false, false),
            };
            if timed_out || retry_due {
                let c = &mut self.clients[i];
                if timed_out && !retry_due {
                    // No answer at all: try the next replica.
                    c.target = (c.target + 1) % n;
                }
                self.send_outstanding(i);
                continue;
            }
            if self.clients[i].outstanding.is_some() {
                continue;
            }
            let wants = if !self.auto_submit {
                self.clients[i].queued > 0
            } else {
                match self.healed_at {
                    None => self.prng_clients.chance_ppm(self.swarm.submit_ppm),
                    Some(_) => !self.clients[i].done_after_heal,
                }
            };
            if wants {
                self.submit_next(i);
            }
        }
    }

    /// Submits the client's next request (Register first, then metadata operations).
    fn submit_next(&mut self, i: usize) {
        let session = self.clients[i].session;
        let partitions = self.groups.len() as u64 - 1;
        let to_partition = self.partition_traffic
            && session != 0
            && partitions > 0
            && self.prng_clients.chance_ppm(500_000);
        let payload = self.prng_clients.next_u64();
        let (group, operation, body) = if session == 0 {
            (GroupId::METADATA.0, Operation::Register, register_body())
        } else if to_partition {
            // The core gets the whole request body (envelope + batch) and keeps the batch.
            let group = self.groups[1 + self.prng_clients.below(partitions) as usize];
            let count = self.prng_clients.range_inclusive(1, 4) as u32;
            let origin = self.hosts[0].clock.realtime_us(self.tick);
            let batch = send_messages_batch(count, payload, origin);
            let key = GroupId(group).fields();
            let body = send_messages_request(key.stream, key.topic, key.partition, &batch);
            (group, Operation::SendMessages, body)
        } else {
            let mut body = b"stream-".to_vec();
            body.extend_from_slice(&payload.to_le_bytes());
            (GroupId::METADATA.0, Operation::CreateStream, body)
        };
        let c = &mut self.clients[i];
        // Metadata numbers count 1, 2, 3, ...; the SDK reuses the current number for partition
        // ops, but replies carry no group, so the simulator gives every request its own number
        // (gaps are allowed, consensus.md §12) to tell a late duplicate reply from the answer.
        let request = match operation {
            Operation::Register => 0,
            _ => {
                c.next_request += 1;
                c.next_request - 1
            }
        };
        if operation != Operation::Register {
            c.queued = c.queued.saturating_sub(1);
        }
        c.outstanding = Some(Outstanding {
            group,
            request,
            operation,
            body,
            submitted: self.tick,
            last_sent: self.tick,
            retry_at: None,
            not_ready: 0,
            attempts: 0,
        });
        self.send_outstanding(i);
    }

    /// Queues `count` metadata requests on client `i`, submitted one after the other (after a
    /// Register if the client has no session).
    pub fn queue_requests(&mut self, i: usize, count: u32) {
        self.clients[i].queued += count;
    }

    /// Non-Register requests client `i` completed.
    pub fn client_completed(&self, i: usize) -> u64 {
        self.clients[i].completed
    }

    fn send_outstanding(&mut self, i: usize) {
        let tick = self.tick;
        let c = &mut self.clients[i];
        let Some(o) = c.outstanding.as_mut() else {
            return;
        };
        o.last_sent = tick;
        o.retry_at = None;
        o.attempts += 1;
        let mut header = RequestHeader::zeroed();
        header.frame = wire::header::FrameHeader::new(
            Command::Request,
            wire::Sender {
                cluster: self.cluster,
                replica: 0,
                view: 0,
            },
        );
        header.client.set(c.id);
        header
            .request_checksum
            .set(u128::from(wire::integrity::xxh3(&o.body)));
        header.request.set(o.request);
        header.operation = o.operation as u8;
        header.session.set(c.session);
        wire::finish_header(&mut header, &o.body).expect("request fits");
        let mut wrapped = o.group.to_le_bytes().to_vec();
        wire::encode::write_frame(&header, &o.body, &mut wrapped);
        let (index, target) = (c.index, c.target);
        if self.options.trace {
            let (request, op, attempt) = (o.request, o.operation, o.attempts);
            eprintln!(
                "[{} t{}] client {i} sends request {request} {op:?} to r{target} (attempt {attempt})",
                self.seed, self.tick
            );
        }
        self.net
            .send(Node::Client(index), Node::Replica(target), wrapped);
    }

    pub(super) fn deliver_reply(&mut self, index: u32, frame: &[u8]) {
        let i = index as usize;
        let tick = self.tick;
        let n = self.swarm.replicas;
        if frame.get(60) == Some(&Command::Eviction.byte()) {
            let c = &mut self.clients[i];
            let Some(eviction) = EvictionHeader::view(frame) else {
                return;
            };
            let evicted_client = eviction.client.get();
            if evicted_client == c.id && c.session != 0 {
                // The session is gone: log in again under a fresh client id (the SDK does).
                self.client_index.remove(&c.id);
                c.id = self.prng_identity.next_u128_nonzero();
                self.client_index.insert(c.id, c.index);
                c.session = 0;
                c.next_request = 1;
                c.outstanding = None;
            }
            return;
        }
        let Ok((h, body)) = wire::decode::decode_reply(frame, wire::MAX_MESSAGE_SIZE_DEFAULT)
        else {
            return;
        };
        let c = &mut self.clients[i];
        let Some(o) = c.outstanding.clone() else {
            return;
        };
        if h.client.get() != c.id
            || h.request.get() != o.request
            || h.operation != o.operation as u8
        {
            return; // a late reply to an earlier attempt or request
        }
        let op = h.op.get();
        let status = h.status.get();
        if self.options.trace {
            let (replica, commit) = (h.frame.replica, h.commit.get());
            eprintln!(
                "[{} t{tick}] client {i} reply from r{replica}: request {} op {op} commit {commit} status {status} body {:?}",
                self.seed,
                o.request,
                &body[..body.len().min(16)]
            );
        }
        // A refusal is a non-zero status (empty body) or, on the metadata plane, a result
        // section `[1][0][code]` with status 0 and `op = commit =` the responder's commit_max
        // (wire.md §11.6). Our operations never fail after commit, so either is pre-commit.
        let section = if wire::GroupId(o.group).is_metadata() {
            result_code(body)
        } else {
            None
        };
        if status != 0 || op == 0 || section.is_some() {
            let code = if status != 0 {
                status
            } else {
                section.unwrap_or(0)
            };
            if code == 57 || code == 58 {
                if code == 58 {
                    // A status denial carries the responder's view: follow it to its primary
                    // (rotate if that is where we are). A result section carries no view.
                    let view = h.frame.view.get();
                    let hinted = (view % u32::from(n)) as u8;
                    c.target = if status == 0 || hinted == c.target {
                        (c.target + 1) % n
                    } else {
                        hinted
                    };
                }
                if let Some(o) = c.outstanding.as_mut() {
                    // Retry (at the target chosen above) after a short pause. A replica that
                    // keeps answering "not committed yet" for a whole retry timeout may be a
                    // stale primary cut off from its backups: then try the next replica (the
                    // same (client, session, request) is exactly-once anywhere, §12).
                    if code == 57 {
                        o.not_ready += 1;
                        if o.not_ready * 10 >= self.swarm.client_retry_ticks {
                            o.not_ready = 0;
                            c.target = (c.target + 1) % n;
                        }
                    }
                    o.retry_at = Some(tick + 10);
                }
            } else {
                c.outstanding = None;
                self.report.requests_refused += 1;
            }
            return;
        }
        let view = h.frame.view.get();
        let mut masked = frame.to_vec();
        masked[0..16].fill(0);
        masked[52..56].fill(0);
        let client = c.id;
        if o.operation == Operation::Register && body.len() >= 16 {
            c.session = u64::from_le_bytes(body[8..16].try_into().expect("8 bytes"));
        }
        c.target = h.frame.replica;
        c.outstanding = None;
        if o.operation != Operation::Register {
            c.completed += 1;
        }
        if self.healed_at.is_some_and(|at| o.submitted >= at) {
            c.done_after_heal = true;
        }
        self.report.requests_completed += 1;
        self.checker.on_reply(
            tick,
            o.group,
            client,
            o.request,
            op,
            o.operation as u8,
            view,
            masked,
        );
    }
}

/// The result code of a one-entry result section `[1][0][code]`, if the body is exactly one.
fn result_code(body: &[u8]) -> Option<u32> {
    if body.len() != 12 || body[0..4] != 1u32.to_le_bytes() {
        return None;
    }
    Some(u32::from_le_bytes(body[8..12].try_into().ok()?))
}

/// A LoginRegister body (client-plane.md §6.2): version 0.11.0, `rust-sdk`, root credentials.
fn register_body() -> Vec<u8> {
    fn name(out: &mut Vec<u8>, s: &str) {
        out.push(s.len() as u8);
        out.extend_from_slice(s.as_bytes());
    }
    let mut body = 0x2C00u32.to_le_bytes().to_vec();
    name(&mut body, "rust-sdk");
    name(&mut body, "0.11.0-edge.4");
    name(&mut body, "iggy");
    name(&mut body, "iggy");
    body.extend_from_slice(&0u32.to_le_bytes());
    body
}
