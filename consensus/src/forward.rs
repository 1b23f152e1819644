//! Session forwarding (§13): a Register or Logout reaching a metadata backup travels to the
//! primary as ForwardRegister / ForwardLogout; the primary proposes it and answers with the
//! result once it commits; the backup then answers its client.

use std::collections::BTreeMap;

use wire::decode::{LogoutOutcome, RegisterOutcome};
use wire::header::{
    ForwardLogoutHeader, ForwardLogoutResultHeader, ForwardRegisterHeader,
    ForwardRegisterResultHeader, FrameHeader, Layout, ReplyHeader,
};
use wire::{Command, Operation};

use crate::constants::FORWARDS_PENDING_MAX;
use crate::frames::{self, codes};
use crate::ignored::Ignored;
use crate::io::{ClientRequest, Effect, Outbox};
use crate::replica::Replica;
use crate::state_machine::StateMachine;
use crate::types::{ClientId, Frame, Now, ReplicaId};

/// A client request parked at the origin while its forward is in flight.
#[derive(Debug, Clone)]
pub(crate) struct Waiter {
    pub request: ClientRequest,
    pub ticks_left: u64,
}

/// Forwarding state: waiters at the origin, forwarded proposals at the primary.
#[derive(Debug, Clone, Default)]
pub(crate) struct Forwards {
    /// Origin: waiters by nonce.
    pub waiters: BTreeMap<u128, Waiter>,
    /// Origin: nonce counter (seeded by the incarnation).
    pub counter: u64,
    /// Primary: client → (origin, nonce, is_logout) of a forwarded proposal in flight.
    pub proposals: BTreeMap<u128, (ReplicaId, u128, bool)>,
}

impl<S: StateMachine> Replica<S> {
    /// Register/Logout reaching a Normal metadata backup: forward to the primary (§13 origin).
    pub(crate) fn forward_session(
        &mut self,
        now: Now,
        request: ClientRequest,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let _ = now;
        let client = request.header.client.get();
        if self.forwards.waiters.len() >= FORWARDS_PENDING_MAX {
            self.deny_forward(&request, codes::TRANSIENT_NOT_ACCEPTED, out);
            return Err(Ignored::QueueFull);
        }
        if self.forwards.counter == 0 {
            self.forwards.counter = (self.incarnation as u64).max(1);
        }
        self.forwards.counter = self.forwards.counter.wrapping_add(1).max(1);
        let nonce = (u128::from(self.id.0) << 64) | u128::from(self.forwards.counter);
        let primary = self.primary_index(self.view);
        let frame = if request.header.operation == Operation::Register.byte() {
            let mut h = ForwardRegisterHeader::zeroed();
            h.frame = FrameHeader::new(Command::ForwardRegister, self.sender());
            h.client.set(client);
            h.nonce.set(nonce);
            h.user_id = request.header.user_id;
            frames::finish(h, &[])
        } else {
            let (session, number) = (request.header.session.get(), request.header.request.get());
            if session == 0 || number == 0 {
                return Err(Ignored::Malformed);
            }
            let mut h = ForwardLogoutHeader::zeroed();
            h.frame = FrameHeader::new(Command::ForwardLogout, self.sender());
            h.client.set(client);
            h.nonce.set(nonce);
            h.session.set(session);
            h.request.set(number);
            frames::finish(h, &[])
        };
        self.forwards.waiters.insert(
            nonce,
            Waiter {
                request,
                ticks_left: self.config.forward_timeout_ticks,
            },
        );
        self.send(out, primary, frame);
        Ok(())
    }

    fn deny_forward(&self, request: &ClientRequest, code: u32, out: &mut Outbox) {
        let frame = frames::reply_denied_result(&request.header, self.commit_max, code);
        out.push(Effect::Reply {
            client: ClientId(request.header.client.get()),
            frame,
        });
    }

    /// Forward waiter timeouts: `ForwardTimedOut` (transient; the op may still commit).
    pub(crate) fn tick_forwards(&mut self, now: Now, out: &mut Outbox) {
        let _ = now;
        if self.forwards.waiters.is_empty() {
            return;
        }
        let mut expired = Vec::new();
        for (nonce, w) in self.forwards.waiters.iter_mut() {
            w.ticks_left -= 1;
            if w.ticks_left == 0 {
                expired.push(*nonce);
            }
        }
        for nonce in expired {
            let waiter = self.forwards.waiters.remove(&nonce).expect("listed");
            self.deny_forward(&waiter.request, codes::TRANSIENT_NOT_COMMITTED, out);
        }
    }

    /// The client reply an origin builds from a forwarded result.
    fn forwarded_reply(&self, request: &ClientRequest, op: u64, body: &[u8]) -> Frame {
        let mut h = ReplyHeader::zeroed();
        h.frame = FrameHeader::new(Command::Reply, self.sender());
        h.request_checksum = request.header.request_checksum;
        h.client = request.header.client;
        h.op.set(op);
        h.commit.set(op);
        h.timestamp = request.header.timestamp;
        h.request = request.header.request;
        h.operation = request.header.operation;
        frames::finish(h, body)
    }

    // ---- primary ------------------------------------------------------------------------------

    fn register_result(
        &self,
        nonce: u128,
        client: u128,
        outcome: RegisterOutcome,
        epoch: u64,
        watermark: u64,
    ) -> Frame {
        let mut h = ForwardRegisterResultHeader::zeroed();
        h.frame = FrameHeader::new(Command::ForwardRegisterResult, self.sender());
        h.nonce.set(nonce);
        h.client.set(client);
        if outcome == RegisterOutcome::Ok {
            h.epoch.set(epoch);
            h.watermark.set(watermark);
        }
        h.outcome = outcome as u8;
        frames::finish(h, &[])
    }

    fn logout_result(
        &self,
        nonce: u128,
        client: u128,
        outcome: LogoutOutcome,
        commit: u64,
    ) -> Frame {
        let mut h = ForwardLogoutResultHeader::zeroed();
        h.frame = FrameHeader::new(Command::ForwardLogoutResult, self.sender());
        h.nonce.set(nonce);
        h.client.set(client);
        if outcome == LogoutOutcome::Ok {
            h.commit.set(commit);
        }
        h.outcome = outcome as u8;
        frames::finish(h, &[])
    }

    /// Shared preflight of a forwarded proposal: `Err(outcome byte)` when refused.
    fn forward_preflight(&self, client: u128) -> Result<(), u8> {
        if !self.is_primary() || self.transfer.is_active() {
            return Err(1); // NotPrimary (both enums)
        }
        let in_flight = self
            .pipeline
            .iter()
            .any(|p| p.header.client.get() == client)
            || self
                .requests
                .iter()
                .any(|r| r.header.client.get() == client)
            || self.forwards.proposals.contains_key(&client);
        if in_flight || !self.is_caught_up_primary() {
            return Err(u8::MAX); // InProgress (value differs per enum)
        }
        if self.requests.len() >= self.config.request_queue_depth {
            return Err(u8::MAX - 1); // PipelineFull
        }
        Ok(())
    }

    pub(crate) fn on_forward_register(
        &mut self,
        now: Now,
        header: &ForwardRegisterHeader,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let origin = ReplicaId(header.frame.replica);
        let (client, nonce) = (header.client.get(), header.nonce.get());
        let outcome = match self.forward_preflight(client) {
            Err(1) => Some(RegisterOutcome::NotPrimary),
            Err(u8::MAX) => Some(RegisterOutcome::InProgress),
            Err(_) => Some(RegisterOutcome::PipelineFull),
            Ok(())
                if self
                    .clients
                    .owner(client)
                    .is_some_and(|owner| owner != header.user_id.get()) =>
            {
                Some(RegisterOutcome::ClientIdOwnedByAnotherUser)
            }
            Ok(()) => None,
        };
        if let Some(outcome) = outcome {
            let frame = self.register_result(nonce, client, outcome, 0, 0);
            self.send(out, origin, frame);
            return Ok(());
        }
        let mut request = ClientRequest::new(client, Operation::Register, 0, 0, Vec::new());
        request.header.user_id = header.user_id;
        self.forwards
            .proposals
            .insert(client, (origin, nonce, false));
        self.submit_forwarded(now, request, out);
        Ok(())
    }

    pub(crate) fn on_forward_logout(
        &mut self,
        now: Now,
        header: &ForwardLogoutHeader,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let origin = ReplicaId(header.frame.replica);
        let (client, nonce) = (header.client.get(), header.nonce.get());
        let outcome = match self.forward_preflight(client) {
            Err(1) => Some(LogoutOutcome::NotPrimary),
            Err(u8::MAX) => Some(LogoutOutcome::InProgress),
            Err(_) => Some(LogoutOutcome::PipelineFull),
            Ok(()) => None,
        };
        if let Some(outcome) = outcome {
            let frame = self.logout_result(nonce, client, outcome, 0);
            self.send(out, origin, frame);
            return Ok(());
        }
        // The session instance the origin logs out is its Register's epoch; the table holds
        // the client's current one (decision 393, refining 374 (b)).
        let outcome = match self.clients.sessions.get(&client) {
            // Already gone: Ok at the current commit point.
            None => Some(LogoutOutcome::Ok),
            // A later Register rebound the client id: the session the origin meant is gone
            // already, and the newer one is not its to end (a late forward, or a backup
            // whose table was behind). Ok at the current commit point, nothing proposed.
            Some(entry) if header.session.get() < entry.epoch => Some(LogoutOutcome::Ok),
            // A session newer than this caught-up primary's committed table is none it ever
            // registered: refused (transient at the origin), never the current one ended.
            Some(entry) if header.session.get() > entry.epoch => Some(LogoutOutcome::Canceled),
            Some(_) => None,
        };
        if let Some(outcome) = outcome {
            let commit = if outcome == LogoutOutcome::Ok {
                self.commit_max
            } else {
                0
            };
            let frame = self.logout_result(nonce, client, outcome, commit);
            self.send(out, origin, frame);
            return Ok(());
        }
        let request = ClientRequest::new(
            client,
            Operation::Logout,
            header.session.get(),
            header.request.get(),
            Vec::new(),
        );
        self.forwards
            .proposals
            .insert(client, (origin, nonce, true));
        self.submit_forwarded(now, request, out);
        Ok(())
    }

    fn submit_forwarded(&mut self, now: Now, request: ClientRequest, out: &mut Outbox) {
        // Bypass the client-facing preflight (already run) and admit directly.
        if self.requests.is_empty() && self.has_prepare_room() {
            self.propose(now, request, out);
        } else {
            self.requests.push_back(request);
        }
    }

    /// Primary: a forwarded Register/Logout committed at `op`; answer the origin instead of the
    /// (absent) client. Returns whether the op was forwarded.
    pub(crate) fn complete_forward(&mut self, client: u128, op: u64, out: &mut Outbox) -> bool {
        let Some((origin, nonce, logout)) = self.forwards.proposals.remove(&client) else {
            return false;
        };
        let frame = if logout {
            self.logout_result(nonce, client, LogoutOutcome::Ok, op)
        } else {
            let watermark = self
                .clients
                .sessions
                .get(&client)
                .map_or(0, |s| s.watermark);
            self.register_result(nonce, client, RegisterOutcome::Ok, op, watermark)
        };
        if origin != self.id {
            self.send(out, origin, frame);
        }
        true
    }

    /// A view change cancels forwarded proposals: their origins time out (§13).
    pub(crate) fn cancel_forwards(&mut self) {
        self.forwards.proposals.clear();
    }

    // ---- origin: results ----------------------------------------------------------------------

    pub(crate) fn on_forward_register_result(
        &mut self,
        header: &ForwardRegisterResultHeader,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let nonce = header.nonce.get();
        let waiter = self.forwards.waiters.get(&nonce).ok_or(Ignored::Nonce)?;
        if waiter.request.header.client.get() != header.client.get()
            || waiter.request.header.operation != Operation::Register.byte()
        {
            return Err(Ignored::Nonce);
        }
        let waiter = self.forwards.waiters.remove(&nonce).expect("present");
        let outcome = RegisterOutcome::from_byte(header.outcome).ok_or(Ignored::Malformed)?;
        match outcome {
            RegisterOutcome::Ok => {
                let epoch = header.epoch.get();
                let mut body = Vec::with_capacity(32);
                body.extend_from_slice(&0u32.to_le_bytes());
                body.extend_from_slice(&waiter.request.header.user_id.get().to_le_bytes());
                body.extend_from_slice(&epoch.to_le_bytes());
                body.extend_from_slice(&0x2C00u32.to_le_bytes());
                body.push(6);
                body.extend_from_slice(b"0.11.0");
                let frame = self.forwarded_reply(&waiter.request, epoch, &body);
                out.push(Effect::Reply {
                    client: ClientId(header.client.get()),
                    frame,
                });
            }
            RegisterOutcome::ClientIdOwnedByAnotherUser => {
                self.deny_forward(&waiter.request, codes::CLIENT_ID_OWNED_BY_ANOTHER_USER, out)
            }
            RegisterOutcome::InProgress | RegisterOutcome::Canceled => {
                self.deny_forward(&waiter.request, codes::TRANSIENT_NOT_COMMITTED, out)
            }
            _ => self.deny_forward(&waiter.request, codes::TRANSIENT_NOT_ACCEPTED, out),
        }
        Ok(())
    }

    pub(crate) fn on_forward_logout_result(
        &mut self,
        header: &ForwardLogoutResultHeader,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        let nonce = header.nonce.get();
        let waiter = self.forwards.waiters.get(&nonce).ok_or(Ignored::Nonce)?;
        if waiter.request.header.client.get() != header.client.get()
            || waiter.request.header.operation != Operation::Logout.byte()
        {
            return Err(Ignored::Nonce);
        }
        let waiter = self.forwards.waiters.remove(&nonce).expect("present");
        match LogoutOutcome::from_byte(header.outcome).ok_or(Ignored::Malformed)? {
            LogoutOutcome::Ok => {
                let frame = self.forwarded_reply(&waiter.request, header.commit.get(), &[]);
                out.push(Effect::Reply {
                    client: ClientId(header.client.get()),
                    frame,
                });
            }
            LogoutOutcome::InProgress | LogoutOutcome::Canceled => {
                self.deny_forward(&waiter.request, codes::TRANSIENT_NOT_COMMITTED, out)
            }
            _ => self.deny_forward(&waiter.request, codes::TRANSIENT_NOT_ACCEPTED, out),
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "forward_tests.rs"]
mod tests;
