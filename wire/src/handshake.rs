//! The replica handshake (handshake.md): transcript and MACs, the three frames, and the acceptor
//! and dialer as IO-free state machines.
//!
//! The machines take whole frames and answer with a [`Step`]: which bytes to write, and whether
//! the connection is accepted or closed, and why. Nonces come in from the caller's CSPRNG; the
//! handshake grace timer and TLS belong to the caller too (the TLS exporter comes in as a
//! [`Binding`]).

use zerocopy::FromZeros;
use zerocopy::little_endian::{U32, U128};

use crate::command::Command;
use crate::framer::{FramingError, whole_frame};
use crate::header::{
    FrameHeader, GenericHeader, HELLO_LANE_OFFSET, Layout, ReplicaChallenge, ReplicaFinish,
    ReplicaHello,
};
use crate::{HEADER_SIZE, MAX_MESSAGE_SIZE_DEFAULT};

/// Transcript domain tag (§4): keeps these MACs from ever matching a BLAKE3 keyed hash made for
/// another purpose with the same key.
pub const DOMAIN_TAG: &[u8; 27] = b"apache-iggy replica-auth v1";

/// BLAKE3 `derive_key` context (§4): the raw secret is never used as a MAC key directly.
pub const KEY_CONTEXT: &str = "apache-iggy replica-auth v1 psk->mac-key";

/// RFC 8446 exporter label (§5) the caller's TLS stack must use to produce [`Binding::Tls`].
pub const EXPORTER_LABEL: &[u8] = b"iggy replica psk binding";

/// Exporter output length (§5).
pub const EXPORTER_LEN: usize = 32;

/// ALPN protocol (§5): a client-plane TLS endpoint fails negotiation instead of misreading frames.
pub const ALPN: &[u8] = b"iggy-replica";

/// Nonce length; both nonces enter every transcript so no MAC can be replayed.
pub const NONCE_LEN: usize = 32;

/// MAC length; verified over all bytes in constant time.
pub const MAC_LEN: usize = 32;

/// Transcript length (§4): tag 27 + cluster 16 + ids 2 + nonces 64 + binding 33 + direction 1.
pub const TRANSCRIPT_LEN: usize = 143;

/// Shortest accepted shared secret (§4): boot refuses shorter values.
pub const MIN_SECRET_LEN: usize = 32;

/// Direction byte of the dialer's MAC (`mac_d`).
pub const DIR_DIALER: u8 = 1;

/// Direction byte of the acceptor's MAC (`mac_a`).
pub const DIR_ACCEPTOR: u8 = 2;

/// The all-zero nonce: "no nonce" in a hello, and the nonce of every reject.
pub const NO_NONCE: [u8; NONCE_LEN] = [0; NONCE_LEN];

/// A 32-byte nonce.
pub type Nonce = [u8; NONCE_LEN];

/// A 32-byte MAC.
pub type Mac = [u8; MAC_LEN];

/// A whole 256-byte handshake frame, ready to write.
pub type Frame = [u8; HEADER_SIZE];

/// Which side made a MAC. Folded into the transcript so an acceptor MAC reflected back never
/// verifies as a dialer MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// `mac_d`, sent in the ReplicaFinish.
    Dialer,
    /// `mac_a`, sent in the ReplicaChallenge.
    Acceptor,
}

impl Direction {
    /// The transcript byte.
    pub const fn byte(self) -> u8 {
        match self {
            Direction::Dialer => DIR_DIALER,
            Direction::Acceptor => DIR_ACCEPTOR,
        }
    }
}

/// The channel a MAC is bound to (§5). A relay terminating two TLS sessions sees two exporters,
/// so neither side's MAC verifies on the other session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    /// Raw TCP.
    Plaintext,
    /// TLS 1.3 with the session's exporter ([`EXPORTER_LABEL`], no context, 32 bytes).
    Tls {
        /// Exporter output.
        exporter: [u8; EXPORTER_LEN],
    },
}

impl Binding {
    /// Mode byte: distinct so a TLS session with an all-zero exporter is not plaintext.
    pub const fn mode_byte(&self) -> u8 {
        match self {
            Binding::Plaintext => 0,
            Binding::Tls { .. } => 1,
        }
    }

    /// The exporter bytes as folded into the transcript (zero on plaintext).
    pub const fn exporter(&self) -> [u8; EXPORTER_LEN] {
        match self {
            Binding::Plaintext => [0; EXPORTER_LEN],
            Binding::Tls { exporter } => *exporter,
        }
    }
}

/// The inputs both sides agree on before MACing (§4). Both build it from their own
/// configuration and the nonces seen on the wire, so any disagreement fails the MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transcript {
    /// The verifier's or signer's own cluster id.
    pub cluster: u128,
    /// The lower id.
    pub dialer_id: u8,
    /// The higher id.
    pub acceptor_id: u8,
    /// Dialer nonce.
    pub nonce_d: Nonce,
    /// Acceptor nonce.
    pub nonce_a: Nonce,
    /// Channel binding.
    pub binding: Binding,
}

impl Transcript {
    /// The 143 MAC preimage bytes for one direction.
    pub fn bytes(&self, direction: Direction) -> [u8; TRANSCRIPT_LEN] {
        let mut out = [0u8; TRANSCRIPT_LEN];
        let parts: [&[u8]; 9] = [
            DOMAIN_TAG,
            &self.cluster.to_le_bytes(),
            &[self.dialer_id],
            &[self.acceptor_id],
            &self.nonce_d,
            &self.nonce_a,
            &[self.binding.mode_byte()],
            &self.binding.exporter(),
            &[direction.byte()],
        ];
        let mut at = 0;
        for part in parts {
            out[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        debug_assert_eq!(at, TRANSCRIPT_LEN);
        out
    }
}

/// A MAC key derived from a shared secret. Debug output is redacted so a key never reaches a log.
#[derive(Clone, PartialEq, Eq)]
pub struct MacKey([u8; 32]);

impl MacKey {
    /// Derives the key (§4): BLAKE3 `derive_key` over the raw secret bytes, no trimming.
    pub fn derive(secret: &[u8]) -> MacKey {
        MacKey(blake3::derive_key(KEY_CONTEXT, secret))
    }

    /// The key bytes, for comparison with published vectors.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl core::fmt::Debug for MacKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("MacKey(..)")
    }
}

/// The MAC of a transcript: BLAKE3 keyed hash (§4).
pub fn mac(key: &MacKey, transcript: &[u8; TRANSCRIPT_LEN]) -> Mac {
    *blake3::keyed_hash(&key.0, transcript).as_bytes()
}

/// Why a shared-secret configuration is refused at boot (§4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// Short secrets are guessable offline from one recorded handshake.
    #[error("shared_secret is {len} bytes, at least {MIN_SECRET_LEN} required")]
    CurrentTooShort {
        /// Configured length.
        len: usize,
    },
    /// Same rule for the verify-only key.
    #[error("previous_shared_secret is {len} bytes, at least {MIN_SECRET_LEN} required")]
    PreviousTooShort {
        /// Configured length.
        len: usize,
    },
    /// A rotation window with two equal keys is a misconfiguration, not a rotation.
    #[error("previous_shared_secret equals shared_secret")]
    PreviousEqualsCurrent,
}

/// The keys of an auth-enabled node: signs with `current`, verifies under `current` or
/// `previous`, which is what lets a secret rotate through rolling restarts without an outage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    current: MacKey,
    previous: Option<MacKey>,
}

impl Keys {
    /// Validates the secrets (both at least [`MIN_SECRET_LEN`] bytes, previous != current) and
    /// derives their keys.
    pub fn new(current: &[u8], previous: Option<&[u8]>) -> Result<Keys, SecretError> {
        if current.len() < MIN_SECRET_LEN {
            return Err(SecretError::CurrentTooShort { len: current.len() });
        }
        if let Some(previous) = previous {
            if previous.len() < MIN_SECRET_LEN {
                return Err(SecretError::PreviousTooShort {
                    len: previous.len(),
                });
            }
            if previous == current {
                return Err(SecretError::PreviousEqualsCurrent);
            }
        }
        Ok(Keys {
            current: MacKey::derive(current),
            previous: previous.map(MacKey::derive),
        })
    }

    /// The MAC this node sends: always under the current key.
    pub fn sign(&self, transcript: &[u8; TRANSCRIPT_LEN]) -> Mac {
        mac(&self.current, transcript)
    }

    /// Whether `received` is the MAC of `transcript` under the current or the previous key.
    /// `blake3::Hash` equality is constant time, so timing leaks nothing about the expected MAC.
    pub fn verify(&self, transcript: &[u8; TRANSCRIPT_LEN], received: &Mac) -> bool {
        let received = blake3::Hash::from(*received);
        let under = |key: &MacKey| blake3::keyed_hash(&key.0, transcript) == received;
        // Both keys are always tried so the timing does not reveal which one matched.
        let current = under(&self.current);
        let previous = self.previous.as_ref().is_some_and(under);
        current | previous
    }
}

/// ReplicaChallenge status byte (§3). The acceptor sends 1..=3 as rejects; 4 and 5 exist only as
/// log labels. A dialer proceeds only on [`Status::Ok`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// The challenge carries `nonce_a` and `mac_a`.
    Ok,
    /// The first frame was not a ReplicaHello; also how a dialer reads any undefined byte.
    UnknownCommand,
    /// The hello's cluster differs from the acceptor's.
    ClusterMismatch,
    /// The hello's replica is outside the roster or not below the acceptor.
    DirectionalRule,
    /// Auth on, hello without a nonce (never sent).
    AuthRequired,
    /// The finish MAC did not verify (never sent).
    MacMismatch,
}

impl Status {
    /// Decodes byte 192 as the reference dialer does: every undefined byte reads as
    /// UnknownCommand, so it is a rejection like every other non-zero value.
    pub const fn decode(byte: u8) -> Status {
        match byte {
            0 => Status::Ok,
            2 => Status::ClusterMismatch,
            3 => Status::DirectionalRule,
            4 => Status::AuthRequired,
            5 => Status::MacMismatch,
            _ => Status::UnknownCommand,
        }
    }

    /// The wire byte.
    pub const fn byte(self) -> u8 {
        match self {
            Status::Ok => 0,
            Status::UnknownCommand => 1,
            Status::ClusterMismatch => 2,
            Status::DirectionalRule => 3,
            Status::AuthRequired => 4,
            Status::MacMismatch => 5,
        }
    }

    /// Whether a dialer continues the handshake (§7 step 4).
    pub const fn proceeds(self) -> bool {
        matches!(self, Status::Ok)
    }
}

/// Common region of every handshake frame (§2): checksum, view and release stay 0 because the
/// MAC, not the seal, authenticates these frames.
fn frame_header(cluster: u128, replica: u8, command: Command) -> FrameHeader {
    let mut frame = FrameHeader::new_zeroed();
    frame.cluster = U128::new(cluster);
    frame.size = U32::new(HEADER_SIZE as u32);
    frame.command = command.byte();
    frame.replica = replica;
    frame
}

/// The ReplicaHello a dialer sends. `nonce` is [`NO_NONCE`] with auth disabled; `lane` lands at
/// byte 224, which the reference ignores, so lane 0 is byte-identical to the reference's hello.
pub fn hello_frame(cluster: u128, replica: u8, nonce: &Nonce, lane: u8) -> Frame {
    let mut hello = ReplicaHello::zeroed();
    hello.frame = frame_header(cluster, replica, Command::ReplicaHello);
    hello.nonce = *nonce;
    hello.reserved[HELLO_LANE_OFFSET - 160] = lane;
    *hello.bytes()
}

/// The status-0 ReplicaChallenge carrying the acceptor's nonce and MAC.
pub fn challenge_frame(cluster: u128, replica: u8, nonce_a: &Nonce, mac_a: &Mac) -> Frame {
    let mut challenge = ReplicaChallenge::zeroed();
    challenge.frame = frame_header(cluster, replica, Command::ReplicaChallenge);
    challenge.nonce = *nonce_a;
    challenge.mac = *mac_a;
    *challenge.bytes()
}

/// A reject: a ReplicaChallenge with a non-zero status and zero nonce and MAC, so a waiting
/// dialer learns why instead of timing out.
pub fn reject_frame(cluster: u128, replica: u8, status: Status) -> Frame {
    let mut challenge = ReplicaChallenge::zeroed();
    challenge.frame = frame_header(cluster, replica, Command::ReplicaChallenge);
    challenge.status = status.byte();
    *challenge.bytes()
}

/// The ReplicaFinish carrying the dialer's MAC; its nonce slot stays zero.
pub fn finish_frame(cluster: u128, replica: u8, mac_d: &Mac) -> Frame {
    let mut finish = ReplicaFinish::zeroed();
    finish.frame = frame_header(cluster, replica, Command::ReplicaFinish);
    finish.mac = *mac_d;
    *finish.bytes()
}

/// Applies the frame reader's rules (wire.md §3) and returns the common region.
fn read_frame(frame: &[u8], max_message_size: usize) -> Result<&FrameHeader, FramingError> {
    let (header, _) = whole_frame(frame, max_message_size)?;
    Ok(&GenericHeader::view(header).expect("a whole header").frame)
}

/// Bytes 128..160 and 160..192 of a frame known to hold a whole header.
fn nonce_and_mac(frame: &[u8]) -> (Nonce, Mac) {
    // Both views are over the same per-command region; the challenge view names both slots.
    match ReplicaChallenge::view(frame) {
        Some(view) => (view.nonce, view.mac),
        None => (NO_NONCE, [0; MAC_LEN]),
    }
}

/// Why a handshake closed, for the caller's log line and counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Reason {
    /// The frame reader refused the frame (size or command byte); nothing is sent.
    #[error("unreadable frame: {0}")]
    BadFrame(#[from] FramingError),
    /// Acceptor: the first frame was not a ReplicaHello (status 1).
    #[error("first frame is command {0}, not ReplicaHello")]
    UnknownCommand(u8),
    /// Acceptor: the hello names another cluster (status 2).
    #[error("hello from another cluster")]
    ClusterMismatch,
    /// Acceptor: the hello's replica is outside the roster or not below us (status 3).
    #[error("replica {0} may not dial this replica")]
    DirectionalRule(u8),
    /// Acceptor: auth is on and the hello has no nonce; the peer is not waiting for a reply.
    #[error("auth required but the hello carries no nonce")]
    AuthRequired,
    /// The peer's MAC did not verify under the current or previous key.
    #[error("handshake MAC mismatch")]
    MacMismatch,
    /// The next frame had the wrong command (acceptor: not a finish; dialer: not a challenge).
    #[error("unexpected command {0} during the handshake")]
    UnexpectedCommand(u8),
    /// Dialer: the acceptor rejected the hello.
    #[error("rejected by the acceptor: {0:?}")]
    Rejected(Status),
    /// A frame arrived after the machine accepted or closed.
    #[error("handshake already finished")]
    Finished,
    /// Dialer: a frame arrived before [`Dialer::start`].
    #[error("dialer not started")]
    NotStarted,
}

impl Reason {
    /// The status a nackable first-frame failure is answered with (§6 "reject s").
    const fn reject_status(self) -> Option<Status> {
        match self {
            Reason::UnknownCommand(_) => Some(Status::UnknownCommand),
            Reason::ClusterMismatch => Some(Status::ClusterMismatch),
            Reason::DirectionalRule(_) => Some(Status::DirectionalRule),
            _ => None,
        }
    }
}

/// What the caller does after feeding the machine. Both machines answer with the same three
/// effects, so one IO loop drives either side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Write `send`, then feed the peer's next frame.
    Continue {
        /// Frame to write.
        send: Frame,
    },
    /// Write `send` if any; the connection now belongs to `peer` (drop it if that peer is
    /// already connected).
    Accept {
        /// Frame to write first (the dialer's hello or finish).
        send: Option<Frame>,
        /// The peer's replica id.
        peer: u8,
    },
    /// Write `send` if any (a best-effort reject), then close.
    Close {
        /// Reject frame to write first.
        send: Option<Frame>,
        /// Why.
        reason: Reason,
    },
}

/// Steps of the [`Acceptor`].
pub type AcceptorStep = Step;
/// Steps of the [`Dialer`].
pub type DialerStep = Step;

impl Step {
    const fn close(reason: Reason) -> Step {
        Step::Close { send: None, reason }
    }
}

/// Configuration of the accepting (higher-id) side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptorConfig {
    /// Own cluster id; a hello must carry it.
    pub cluster: u128,
    /// Own replica id.
    pub self_id: u8,
    /// Roster size; the dialer's id must be below it.
    pub replica_count: u8,
    /// `None` with `cluster.auth.enabled = false`.
    pub auth: Option<Keys>,
    /// The channel this connection runs on.
    pub binding: Binding,
    /// Frame reader limit (`message_bus.max_message_size`).
    pub max_message_size: usize,
}

impl AcceptorConfig {
    /// A configuration with the default frame reader limit.
    pub fn new(
        cluster: u128,
        self_id: u8,
        replica_count: u8,
        auth: Option<Keys>,
        binding: Binding,
    ) -> Self {
        AcceptorConfig {
            cluster,
            self_id,
            replica_count,
            auth,
            binding,
            max_message_size: MAX_MESSAGE_SIZE_DEFAULT,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum AcceptorState {
    AwaitHello,
    AwaitFinish { peer: u8, nonce_d: Nonce },
    Done,
}

/// The acceptor of one inbound connection (§6). Owns its state so the IO loop (or a fuzzer) just
/// feeds it frames.
#[derive(Debug, Clone)]
pub struct Acceptor {
    config: AcceptorConfig,
    nonce_a: Nonce,
    state: AcceptorState,
}

impl Acceptor {
    /// A fresh acceptor; `nonce_a` must come from a CSPRNG (the crate draws no randomness).
    pub fn new(config: AcceptorConfig, nonce_a: Nonce) -> Acceptor {
        Acceptor {
            config,
            nonce_a,
            state: AcceptorState::AwaitHello,
        }
    }

    /// Feeds one whole frame from the peer.
    pub fn on_frame(&mut self, frame: &[u8]) -> AcceptorStep {
        match core::mem::replace(&mut self.state, AcceptorState::Done) {
            AcceptorState::AwaitHello => self.on_hello(frame),
            AcceptorState::AwaitFinish { peer, nonce_d } => self.on_finish(frame, peer, nonce_d),
            AcceptorState::Done => Step::close(Reason::Finished),
        }
    }

    /// Steps 1-8.
    fn on_hello(&mut self, frame: &[u8]) -> Step {
        let header = match read_frame(frame, self.config.max_message_size) {
            Ok(header) => header,
            Err(error) => return Step::close(error.into()),
        };
        let (nonce_d, _) = nonce_and_mac(frame);
        let nackable = self.config.auth.is_some() && nonce_d != NO_NONCE;
        let peer = match self.check_hello(header) {
            Ok(peer) => peer,
            Err(reason) => return self.reject(reason, nackable),
        };
        let Some(keys) = &self.config.auth else {
            return Step::Accept { send: None, peer };
        };
        if nonce_d == NO_NONCE {
            return Step::close(Reason::AuthRequired);
        }
        let mac_a = keys.sign(&self.transcript(peer, nonce_d).bytes(Direction::Acceptor));
        self.state = AcceptorState::AwaitFinish { peer, nonce_d };
        Step::Continue {
            send: challenge_frame(
                self.config.cluster,
                self.config.self_id,
                &self.nonce_a,
                &mac_a,
            ),
        }
    }

    /// Steps 3-5, in the spec's order; returns the announced peer id.
    fn check_hello(&self, header: &FrameHeader) -> Result<u8, Reason> {
        if header.command != Command::ReplicaHello.byte() {
            return Err(Reason::UnknownCommand(header.command));
        }
        if header.cluster.get() != self.config.cluster {
            return Err(Reason::ClusterMismatch);
        }
        let peer = header.replica;
        if peer >= self.config.replica_count || peer >= self.config.self_id {
            return Err(Reason::DirectionalRule(peer));
        }
        Ok(peer)
    }

    /// "reject s": answered only when the peer is known to wait for a challenge.
    fn reject(&self, reason: Reason, nackable: bool) -> Step {
        let send = match reason.reject_status() {
            Some(status) if nackable => Some(reject_frame(
                self.config.cluster,
                self.config.self_id,
                status,
            )),
            _ => None,
        };
        Step::Close { send, reason }
    }

    /// Steps 9-11: the command is checked before the MAC; nothing is ever sent back.
    fn on_finish(&self, frame: &[u8], peer: u8, nonce_d: Nonce) -> Step {
        let header = match read_frame(frame, self.config.max_message_size) {
            Ok(header) => header,
            Err(error) => return Step::close(error.into()),
        };
        if header.command != Command::ReplicaFinish.byte() {
            return Step::close(Reason::UnexpectedCommand(header.command));
        }
        let (_, mac_d) = nonce_and_mac(frame);
        let transcript = self.transcript(peer, nonce_d).bytes(Direction::Dialer);
        match &self.config.auth {
            Some(keys) if keys.verify(&transcript, &mac_d) => Step::Accept { send: None, peer },
            _ => Step::close(Reason::MacMismatch),
        }
    }

    fn transcript(&self, peer: u8, nonce_d: Nonce) -> Transcript {
        Transcript {
            cluster: self.config.cluster,
            dialer_id: peer,
            acceptor_id: self.config.self_id,
            nonce_d,
            nonce_a: self.nonce_a,
            binding: self.config.binding,
        }
    }
}

/// Configuration of the dialing (lower-id) side of one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DialerConfig {
    /// Own cluster id, written into every frame and the transcript.
    pub cluster: u128,
    /// Own replica id.
    pub self_id: u8,
    /// The acceptor dialled (a higher id).
    pub peer_id: u8,
    /// `None` with `cluster.auth.enabled = false`.
    pub auth: Option<Keys>,
    /// The channel this connection runs on.
    pub binding: Binding,
    /// Lane index written at hello byte 224.
    pub lane: u8,
    /// Frame reader limit (`message_bus.max_message_size`).
    pub max_message_size: usize,
}

impl DialerConfig {
    /// A configuration with the default frame reader limit.
    pub fn new(
        cluster: u128,
        self_id: u8,
        peer_id: u8,
        auth: Option<Keys>,
        binding: Binding,
        lane: u8,
    ) -> Self {
        DialerConfig {
            cluster,
            self_id,
            peer_id,
            auth,
            binding,
            lane,
            max_message_size: MAX_MESSAGE_SIZE_DEFAULT,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum DialerState {
    Idle,
    AwaitChallenge { nonce_d: Nonce },
    Done,
}

/// The dialer of one outbound connection (§7).
#[derive(Debug, Clone)]
pub struct Dialer {
    config: DialerConfig,
    state: DialerState,
}

impl Dialer {
    /// A dialer that has sent nothing yet.
    pub fn new(config: DialerConfig) -> Dialer {
        Dialer {
            config,
            state: DialerState::Idle,
        }
    }

    /// Steps 1-2: the hello. With auth disabled the connection is established at once (the
    /// step is [`Step::Accept`] and `nonce_d` is unused); otherwise [`Step::Continue`]. A second
    /// call closes the connection ([`Reason::Finished`]).
    pub fn start(&mut self, nonce_d: Nonce) -> DialerStep {
        if self.state != DialerState::Idle {
            self.state = DialerState::Done;
            return Step::close(Reason::Finished);
        }
        let DialerConfig {
            cluster,
            self_id,
            peer_id,
            lane,
            ..
        } = self.config;
        if self.config.auth.is_none() {
            self.state = DialerState::Done;
            return Step::Accept {
                send: Some(hello_frame(cluster, self_id, &NO_NONCE, lane)),
                peer: peer_id,
            };
        }
        self.state = DialerState::AwaitChallenge { nonce_d };
        Step::Continue {
            send: hello_frame(cluster, self_id, &nonce_d, lane),
        }
    }

    /// Steps 3-6: feeds the acceptor's reply.
    pub fn on_frame(&mut self, frame: &[u8]) -> DialerStep {
        match core::mem::replace(&mut self.state, DialerState::Done) {
            DialerState::AwaitChallenge { nonce_d } => self.on_challenge(frame, nonce_d),
            DialerState::Idle => Step::close(Reason::NotStarted),
            DialerState::Done => Step::close(Reason::Finished),
        }
    }

    /// The challenge's cluster and replica bytes are not checked (§7): the MAC covers our own
    /// configured values instead.
    fn on_challenge(&self, frame: &[u8], nonce_d: Nonce) -> Step {
        let header = match read_frame(frame, self.config.max_message_size) {
            Ok(header) => header,
            Err(error) => return Step::close(error.into()),
        };
        if header.command != Command::ReplicaChallenge.byte() {
            return Step::close(Reason::UnexpectedCommand(header.command));
        }
        let challenge = ReplicaChallenge::view(frame).expect("read_frame saw a whole header");
        let status = Status::decode(challenge.status);
        if !status.proceeds() {
            return Step::close(Reason::Rejected(status));
        }
        // Only an auth-enabled dialer waits for a challenge; without keys nothing verifies.
        let Some(keys) = &self.config.auth else {
            return Step::close(Reason::MacMismatch);
        };
        let transcript = Transcript {
            cluster: self.config.cluster,
            dialer_id: self.config.self_id,
            acceptor_id: self.config.peer_id,
            nonce_d,
            nonce_a: challenge.nonce,
            binding: self.config.binding,
        };
        if !keys.verify(&transcript.bytes(Direction::Acceptor), &challenge.mac) {
            return Step::close(Reason::MacMismatch);
        }
        let mac_d = keys.sign(&transcript.bytes(Direction::Dialer));
        Step::Accept {
            send: Some(finish_frame(
                self.config.cluster,
                self.config.self_id,
                &mac_d,
            )),
            peer: self.config.peer_id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLUSTER: u128 = 0x1234_5678_9abc_def0_0fed_cba9_8765_4321;
    const OLD: &[u8] = b"0123456789abcdef0123456789abcdef";
    const NEW: &[u8] = b"fedcba9876543210fedcba9876543210";
    const NONCE_D: Nonce = [0xd1; 32];
    const NONCE_A: Nonce = [0xa2; 32];

    fn keys(current: &[u8], previous: Option<&[u8]>) -> Option<Keys> {
        Some(Keys::new(current, previous).expect("valid secrets"))
    }

    fn pair(
        dialer_auth: Option<Keys>,
        acceptor_auth: Option<Keys>,
        binding: Binding,
    ) -> (Dialer, Acceptor) {
        let dialer = Dialer::new(DialerConfig::new(CLUSTER, 1, 3, dialer_auth, binding, 0));
        let acceptor = Acceptor::new(
            AcceptorConfig::new(CLUSTER, 3, 4, acceptor_auth, binding),
            NONCE_A,
        );
        (dialer, acceptor)
    }

    /// Runs a whole exchange and returns the final steps of (dialer, acceptor).
    fn run(mut dialer: Dialer, mut acceptor: Acceptor) -> (Step, Step) {
        let hello = match dialer.start(NONCE_D) {
            Step::Continue { send } => send,
            Step::Accept {
                send: Some(send), ..
            } => {
                let accepted = Step::Accept {
                    send: Some(send),
                    peer: 3,
                };
                return (accepted, acceptor.on_frame(&send));
            }
            other => panic!("unexpected start step {other:?}"),
        };
        let challenge = match acceptor.on_frame(&hello) {
            Step::Continue { send } => send,
            other => return (Step::close(Reason::NotStarted), other),
        };
        let dialer_step = dialer.on_frame(&challenge);
        let Step::Accept {
            send: Some(finish), ..
        } = dialer_step
        else {
            // The acceptor is still waiting for a finish that never comes.
            return (dialer_step, Step::Continue { send: challenge });
        };
        (dialer_step, acceptor.on_frame(&finish))
    }

    fn assert_both_accept((dialer, acceptor): (Step, Step)) {
        assert!(matches!(dialer, Step::Accept { peer: 3, .. }), "{dialer:?}");
        assert_eq!(
            acceptor,
            Step::Accept {
                send: None,
                peer: 1
            }
        );
    }

    #[test]
    fn round_trip_plaintext() {
        let (d, a) = pair(keys(OLD, None), keys(OLD, None), Binding::Plaintext);
        assert_both_accept(run(d, a));
    }

    #[test]
    fn round_trip_tls() {
        let binding = Binding::Tls { exporter: [7; 32] };
        let (d, a) = pair(keys(OLD, None), keys(OLD, None), binding);
        assert_both_accept(run(d, a));
    }

    #[test]
    fn tls_exporters_must_match() {
        let mut dialer = Dialer::new(DialerConfig::new(
            CLUSTER,
            1,
            3,
            keys(OLD, None),
            Binding::Tls { exporter: [7; 32] },
            0,
        ));
        let mut acceptor = Acceptor::new(
            AcceptorConfig::new(
                CLUSTER,
                3,
                4,
                keys(OLD, None),
                Binding::Tls { exporter: [0; 32] },
            ),
            NONCE_A,
        );
        let Step::Continue { send: hello } = dialer.start(NONCE_D) else {
            panic!()
        };
        let Step::Continue { send: challenge } = acceptor.on_frame(&hello) else {
            panic!()
        };
        assert_eq!(
            dialer.on_frame(&challenge),
            Step::close(Reason::MacMismatch)
        );
    }

    #[test]
    fn round_trip_auth_disabled() {
        let (d, a) = pair(None, None, Binding::Plaintext);
        let (dialer, acceptor) = run(d, a);
        let Step::Accept {
            send: Some(hello),
            peer: 3,
        } = dialer
        else {
            panic!("{dialer:?}")
        };
        assert_eq!(ReplicaHello::view(&hello).unwrap().nonce, NO_NONCE);
        assert_eq!(
            acceptor,
            Step::Accept {
                send: None,
                peer: 1
            }
        );
    }

    #[test]
    fn rotation_window_both_ways() {
        // Step 1 of a rotation: one node already signs with the new key.
        let (d, a) = pair(
            keys(NEW, Some(OLD)),
            keys(OLD, Some(NEW)),
            Binding::Plaintext,
        );
        assert_both_accept(run(d, a));
        let (d, a) = pair(
            keys(OLD, Some(NEW)),
            keys(NEW, Some(OLD)),
            Binding::Plaintext,
        );
        assert_both_accept(run(d, a));
        // Step 3: the window is closed, the old key no longer verifies.
        let (d, a) = pair(keys(OLD, None), keys(NEW, None), Binding::Plaintext);
        let (dialer, acceptor) = run(d, a);
        assert_eq!(dialer, Step::close(Reason::MacMismatch));
        assert!(matches!(acceptor, Step::Continue { .. }));
    }

    #[test]
    fn reflected_acceptor_mac_is_refused() {
        let (mut dialer, mut acceptor) = pair(keys(OLD, None), keys(OLD, None), Binding::Plaintext);
        let Step::Continue { send: hello } = dialer.start(NONCE_D) else {
            panic!()
        };
        let Step::Continue { send: challenge } = acceptor.on_frame(&hello) else {
            panic!()
        };
        let mac_a = ReplicaChallenge::view(&challenge).unwrap().mac;
        let reflected = finish_frame(CLUSTER, 1, &mac_a);
        assert_eq!(
            acceptor.on_frame(&reflected),
            Step::close(Reason::MacMismatch)
        );
        let transcript = Transcript {
            cluster: CLUSTER,
            dialer_id: 1,
            acceptor_id: 3,
            nonce_d: NONCE_D,
            nonce_a: NONCE_A,
            binding: Binding::Plaintext,
        };
        let keys = keys(OLD, None).unwrap();
        assert!(keys.verify(&transcript.bytes(Direction::Acceptor), &mac_a));
        assert!(!keys.verify(&transcript.bytes(Direction::Dialer), &mac_a));
    }

    #[test]
    fn secrets_are_validated() {
        assert_eq!(
            Keys::new(&OLD[..31], None),
            Err(SecretError::CurrentTooShort { len: 31 })
        );
        assert_eq!(
            Keys::new(OLD, Some(&NEW[..5])),
            Err(SecretError::PreviousTooShort { len: 5 })
        );
        assert_eq!(
            Keys::new(OLD, Some(OLD)),
            Err(SecretError::PreviousEqualsCurrent)
        );
    }

    #[test]
    fn status_decode_maps_every_byte() {
        for byte in 0..=255u8 {
            let status = Status::decode(byte);
            assert_eq!(status.proceeds(), byte == 0);
            if byte <= 5 {
                assert_eq!(status.byte(), byte);
            } else {
                assert_eq!(status, Status::UnknownCommand);
            }
        }
    }

    #[test]
    fn lane_lands_at_byte_224_only() {
        let zero = hello_frame(CLUSTER, 1, &NONCE_D, 0);
        let lane = hello_frame(CLUSTER, 1, &NONCE_D, 9);
        assert_eq!(lane[HELLO_LANE_OFFSET], 9);
        let differing: Vec<usize> = (0..HEADER_SIZE).filter(|&i| zero[i] != lane[i]).collect();
        assert_eq!(differing, [HELLO_LANE_OFFSET]);
        assert!(zero[160..].iter().all(|&b| b == 0));
    }

    #[test]
    fn finished_machines_close() {
        let (d, a) = pair(keys(OLD, None), keys(OLD, None), Binding::Plaintext);
        let (mut dialer, mut acceptor) = (d.clone(), a.clone());
        let (_, _) = run(d, a);
        assert_eq!(dialer.on_frame(&[0; 256]), Step::close(Reason::NotStarted));
        assert_eq!(dialer.on_frame(&[0; 256]), Step::close(Reason::Finished));
        assert_eq!(dialer.start(NONCE_D), Step::close(Reason::Finished));
        let hello = hello_frame(CLUSTER, 1, &NO_NONCE, 0);
        assert_eq!(acceptor.on_frame(&hello), Step::close(Reason::AuthRequired));
        assert_eq!(acceptor.on_frame(&hello), Step::close(Reason::Finished));
    }

    #[test]
    fn frame_reader_rules() {
        let acceptor = |frame: &[u8]| {
            Acceptor::new(
                AcceptorConfig::new(CLUSTER, 3, 4, keys(OLD, None), Binding::Plaintext),
                NONCE_A,
            )
            .on_frame(frame)
        };
        let hello = hello_frame(CLUSTER, 1, &NONCE_D, 0);
        assert_eq!(
            acceptor(&hello[..255]),
            Step::close(
                FramingError::Incomplete {
                    len: 255,
                    size: 256
                }
                .into()
            )
        );
        let mut bad = hello;
        bad[48..52].copy_from_slice(&255u32.to_le_bytes());
        assert_eq!(
            acceptor(&bad),
            Step::close(FramingError::SizeTooSmall { size: 255 }.into())
        );
        bad[48..52].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            acceptor(&bad),
            Step::close(
                FramingError::SizeTooLarge {
                    size: u32::MAX,
                    max: crate::MAX_MESSAGE_SIZE_DEFAULT
                }
                .into()
            )
        );
        bad[48..52].copy_from_slice(&300u32.to_le_bytes());
        assert_eq!(
            acceptor(&bad),
            Step::close(
                FramingError::Incomplete {
                    size: 300,
                    len: 256
                }
                .into()
            )
        );
        let mut bad = hello;
        bad[60] = 30;
        assert_eq!(
            acceptor(&bad),
            Step::close(FramingError::UnknownCommand(30).into())
        );
        // A longer hello is read whole and its body ignored.
        let mut long = hello.to_vec();
        long.extend_from_slice(&[0xee; 44]);
        long[48..52].copy_from_slice(&300u32.to_le_bytes());
        assert!(matches!(acceptor(&long), Step::Continue { .. }));
    }

    #[test]
    fn rejects_only_when_nackable() {
        let acceptor = |auth: Option<Keys>, frame: &[u8]| {
            Acceptor::new(
                AcceptorConfig::new(CLUSTER, 3, 4, auth, Binding::Plaintext),
                NONCE_A,
            )
            .on_frame(frame)
        };
        let wrong_cluster = hello_frame(CLUSTER + 1, 1, &NONCE_D, 0);
        let reject = reject_frame(CLUSTER, 3, Status::ClusterMismatch);
        assert_eq!(
            acceptor(keys(OLD, None), &wrong_cluster),
            Step::Close {
                send: Some(reject),
                reason: Reason::ClusterMismatch
            }
        );
        assert_eq!(
            acceptor(None, &wrong_cluster),
            Step::close(Reason::ClusterMismatch)
        );
        let no_nonce = hello_frame(CLUSTER + 1, 1, &NO_NONCE, 0);
        assert_eq!(
            acceptor(keys(OLD, None), &no_nonce),
            Step::close(Reason::ClusterMismatch)
        );
        let equal = hello_frame(CLUSTER, 3, &NONCE_D, 0);
        assert!(matches!(
            acceptor(keys(OLD, None), &equal),
            Step::Close {
                send: Some(_),
                reason: Reason::DirectionalRule(3)
            }
        ));
    }

    /// The fuzz-target shape: any split of any bytes into frames, fed to either machine, yields
    /// steps and never panics; once finished, a machine only says so.
    mod no_panic {
        use super::*;
        use proptest::prelude::*;

        fn frames() -> impl Strategy<Value = Vec<Vec<u8>>> {
            let valid = hello_frame(CLUSTER, 1, &NONCE_D, 0).to_vec();
            let mutated =
                prop::collection::vec((0..HEADER_SIZE, any::<u8>()), 0..4).prop_map(move |flips| {
                    let mut frame = valid.clone();
                    flips.into_iter().for_each(|(at, b)| frame[at] = b);
                    frame
                });
            let arbitrary = prop::collection::vec(any::<u8>(), 0..400);
            prop::collection::vec(prop_oneof![mutated, arbitrary], 0..4)
        }

        fn assert_terminal_then_finished(steps: &[Step]) {
            if let Some(at) = steps
                .iter()
                .position(|s| !matches!(s, Step::Continue { .. }))
            {
                for step in &steps[at + 1..] {
                    assert_eq!(*step, Step::close(Reason::Finished));
                }
            }
        }

        proptest! {
            #[test]
            fn acceptor(frames in frames(), auth in any::<bool>()) {
                let auth = auth.then(|| Keys::new(OLD, Some(NEW)).unwrap());
                let config = AcceptorConfig::new(CLUSTER, 3, 4, auth, Binding::Plaintext);
                let mut acceptor = Acceptor::new(config, NONCE_A);
                let steps: Vec<Step> = frames.iter().map(|f| acceptor.on_frame(f)).collect();
                assert_terminal_then_finished(&steps);
            }

            #[test]
            fn dialer(frames in frames(), auth in any::<bool>()) {
                let auth = auth.then(|| Keys::new(OLD, None).unwrap());
                let config = DialerConfig::new(CLUSTER, 1, 3, auth, Binding::Plaintext, 0);
                let mut dialer = Dialer::new(config);
                let mut steps = vec![dialer.start(NONCE_D)];
                steps.extend(frames.iter().map(|f| dialer.on_frame(f)));
                assert_terminal_then_finished(&steps);
            }
        }
    }
}
