//! A raw-frame client for what the SDK cannot send (a malformed body, an oversized batch, a
//! session kept on a backup): client-plane.md's Request header (§1.2) built by hand, one
//! request and one answer at a time (lockstep), every read bounded.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Header size of every frame.
pub const HEADER: usize = 256;
/// Operation bytes (client-plane.md §2.2).
pub const REGISTER: u8 = 1;
/// NonReplicated: the legacy code at 196.
pub const NON_REPLICATED: u8 = 2;
/// Logout.
pub const LOGOUT: u8 = 3;
/// CreateStream.
pub const CREATE_STREAM: u8 = 128;
/// CreateTopic.
pub const CREATE_TOPIC: u8 = 132;
/// SendMessages.
pub const SEND_MESSAGES: u8 = 160;
/// Command byte of a Reply.
pub const REPLY: u8 = 8;
/// Command byte of an Eviction.
pub const EVICTION: u8 = 13;

/// One answer frame.
#[derive(Debug, Clone)]
pub struct Answer(pub Vec<u8>);

impl Answer {
    /// The command byte (8 Reply, 13 Eviction).
    pub fn command(&self) -> u8 {
        self.0[60]
    }
    /// The reply's header status (panics on an eviction, naming it).
    pub fn status(&self) -> u32 {
        assert_eq!(self.command(), REPLY, "a Reply expected, got {self:?}");
        u32::from_le_bytes(self.0[216..220].try_into().unwrap())
    }
    /// The eviction reason (byte 255), `None` for a reply.
    pub fn eviction(&self) -> Option<u8> {
        (self.command() == EVICTION).then(|| self.0[255])
    }
    /// The reply's request number (200..208, §1.3).
    pub fn request(&self) -> u64 {
        u64::from_le_bytes(self.0[200..208].try_into().unwrap())
    }
    /// The reply's operation (208).
    pub fn operation(&self) -> u8 {
        self.0[208]
    }
    /// The body after the header.
    pub fn body(&self) -> &[u8] {
        &self.0[HEADER..]
    }
    /// The result section's code (0 for success); panics when the status is not 0.
    pub fn result(&self) -> u32 {
        assert_eq!(self.status(), 0, "status 0 expected: {self:?}");
        let body = self.body();
        match u32::from_le_bytes(body[0..4].try_into().unwrap()) {
            0 => 0,
            1 => u32::from_le_bytes(body[8..12].try_into().unwrap()),
            n => panic!("result count {n}"),
        }
    }
    /// The code a client sees: the header status, or the result section's entry.
    pub fn code(&self, result_framed: bool) -> u32 {
        match self.status() {
            0 if result_framed => self.result(),
            status => status,
        }
    }
    /// 57 or 58, by either channel.
    pub fn transient(&self) -> bool {
        self.command() == REPLY
            && (matches!(self.status(), 57 | 58)
                || (self.status() == 0
                    && self.body().len() == 12
                    && u32::from_le_bytes(self.body()[0..4].try_into().unwrap()) == 1
                    && matches!(self.result(), 57 | 58)))
    }
}

/// A request frame.
pub fn frame(
    client: u128,
    operation: u8,
    code: u32,
    session: u64,
    request: u64,
    body: &[u8],
) -> Vec<u8> {
    let mut f = vec![0u8; HEADER];
    f[48..52].copy_from_slice(&((HEADER + body.len()) as u32).to_le_bytes());
    f[60] = 5;
    f[128..144].copy_from_slice(&client.to_le_bytes());
    f[168..176].copy_from_slice(&request.to_le_bytes());
    f[176] = operation;
    f[184..192].copy_from_slice(&session.to_le_bytes());
    f[196..200].copy_from_slice(&code.to_le_bytes());
    f.extend_from_slice(body);
    f
}

/// A Name (§5): length byte and the bytes.
pub fn name(text: &str) -> Vec<u8> {
    let mut out = vec![text.len() as u8];
    out.extend_from_slice(text.as_bytes());
    out
}

/// A numeric Identifier (§5).
pub fn numeric(id: u32) -> Vec<u8> {
    let mut out = vec![1, 4];
    out.extend_from_slice(&id.to_le_bytes());
    out
}

/// The LoginRegister body of the SDK 0.11.0-edge.4 (§6.2).
pub fn login_body(username: &str, password: &str) -> Vec<u8> {
    let mut body = 0x2C00u32.to_le_bytes().to_vec();
    for part in ["rust-sdk", "0.11.0-edge.4", username, password] {
        body.extend_from_slice(&name(part));
    }
    body.extend_from_slice(&0u32.to_le_bytes());
    body
}

/// A raw client connection.
pub struct RawClient {
    stream: TcpStream,
    /// The client id (128..144).
    pub client: u128,
    /// The bound session (0 before login).
    pub session: u64,
    /// The next metadata request number.
    pub request: u64,
}

/// How long one answer may take: below the SDK's 30 s, above the server's 5 s deadline.
pub const ANSWER_BOUND: Duration = Duration::from_secs(20);

impl RawClient {
    /// Connects to `addr` (`ip:port`).
    pub fn connect(addr: &str, client: u128) -> RawClient {
        let stream =
            TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
        stream.set_read_timeout(Some(ANSWER_BOUND)).unwrap();
        RawClient {
            stream,
            client,
            session: 0,
            request: 1,
        }
    }

    /// Writes `f` and reads one answer; panics naming `what` if none comes.
    pub fn exchange_once(&mut self, what: &str, f: &[u8]) -> Answer {
        self.stream
            .write_all(f)
            .unwrap_or_else(|e| panic!("{what}: writing the request: {e}"));
        self.read_answer(what)
    }

    /// Reads one answer frame.
    pub fn read_answer(&mut self, what: &str) -> Answer {
        let mut header = [0u8; HEADER];
        self.stream
            .read_exact(&mut header)
            .unwrap_or_else(|e| panic!("{what}: no answer header within {ANSWER_BOUND:?}: {e}"));
        let size = u32::from_le_bytes(header[48..52].try_into().unwrap()) as usize;
        assert!(size >= HEADER, "{what}: answer size {size}");
        let mut out = header.to_vec();
        out.resize(size, 0);
        self.stream
            .read_exact(&mut out[HEADER..])
            .unwrap_or_else(|e| panic!("{what}: answer body: {e}"));
        Answer(out)
    }

    /// Resends on a transient answer as the SDK does (every 50 ms, within [`ANSWER_BOUND`]).
    pub fn exchange(&mut self, what: &str, f: &[u8]) -> Answer {
        let start = Instant::now();
        loop {
            let answer = self.exchange_once(what, f);
            if !answer.transient() || start.elapsed() > ANSWER_BOUND {
                return answer;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Register with `username`/`password`; the raw answer (a Reply or an Eviction).
    pub fn register(&mut self, username: &str, password: &str) -> Answer {
        let f = frame(
            self.client,
            REGISTER,
            0,
            0,
            0,
            &login_body(username, password),
        );
        let answer = self.exchange("register", &f);
        if answer.command() == REPLY && answer.status() == 0 && answer.result() == 0 {
            self.session = u64::from_le_bytes(answer.body()[8..16].try_into().unwrap());
            assert_ne!(self.session, 0, "Register answered session 0");
            self.request = 1;
        }
        answer
    }

    /// Logs in as root (`iggy`/`iggy`), panicking on anything but success.
    pub fn login(&mut self) {
        let answer = self.register("iggy", "iggy");
        assert_eq!(answer.command(), REPLY, "login: {answer:?}");
        assert_eq!(answer.result(), 0, "login: {answer:?}");
    }

    /// A metadata op (request number taken and advanced), resent on a transient answer when
    /// `retry`.
    pub fn metadata(&mut self, what: &str, operation: u8, body: &[u8], retry: bool) -> Answer {
        let f = frame(self.client, operation, 0, self.session, self.request, body);
        self.request += 1;
        if retry {
            self.exchange(what, &f)
        } else {
            self.exchange_once(what, &f)
        }
    }

    /// Logout (the next request number).
    pub fn logout(&mut self) -> Answer {
        let f = frame(self.client, LOGOUT, 0, self.session, self.request, &[]);
        self.request += 1;
        self.exchange("logout", &f)
    }

    /// A NonReplicated request with `code` (request number = the current counter).
    pub fn read(&mut self, what: &str, code: u32, body: &[u8]) -> Answer {
        let f = frame(
            self.client,
            NON_REPLICATED,
            code,
            self.session,
            self.request,
            body,
        );
        self.exchange(what, &f)
    }

    /// A partition op (request number = the current counter, not advanced).
    pub fn partition(&mut self, what: &str, operation: u8, body: &[u8]) -> Answer {
        let f = frame(self.client, operation, 0, self.session, self.request, body);
        self.exchange(what, &f)
    }

    /// Whether the server closed the connection: a read sees EOF within `within`.
    pub fn closed_within(&mut self, within: Duration) -> bool {
        self.stream.set_read_timeout(Some(within)).unwrap();
        let mut byte = [0u8; 1];
        let closed = matches!(self.stream.read(&mut byte), Ok(0));
        self.stream.set_read_timeout(Some(ANSWER_BOUND)).unwrap();
        closed
    }

    /// Whether nothing more arrives within `within` (no second answer to a request, no
    /// unsolicited frame); false when bytes arrive or the connection closes.
    pub fn silent_for(&mut self, within: Duration) -> bool {
        self.stream.set_read_timeout(Some(within)).unwrap();
        let mut byte = [0u8; 1];
        let silent = match self.stream.read(&mut byte) {
            Err(e) => matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            Ok(_) => false,
        };
        self.stream.set_read_timeout(Some(ANSWER_BOUND)).unwrap();
        silent
    }

    /// Writes bytes as they are (a hand-made frame).
    pub fn write_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }
}
