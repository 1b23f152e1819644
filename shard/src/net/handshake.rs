//! The handshake over a socket (handshake.md sections 5-7): TLS first when enabled, then the
//! `wire::handshake` acceptor or dialer fed one frame at a time.
//!
//! Handshake frames are read exactly (header, then body), so no byte of a later consensus
//! frame is consumed here and the connection can change shard right after. A body on a
//! handshake frame (legal, and ignored, handshake.md section 6 step 1) is read and discarded in
//! small chunks instead of being buffered: 256 unauthenticated handshakes in flight must not be
//! able to pin 256 x `max_message_size` of memory. The machine is then fed the header alone with
//! `size` set to 256, which it reads exactly as it would the whole frame.

use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use futures_rustls::{TlsAcceptor, TlsConnector};
use glommio::net::TcpStream;
use wire::HEADER_SIZE;
use wire::framer::frame_size;
use wire::handshake::{
    ALPN, Acceptor, AcceptorConfig, Binding, Dialer, DialerConfig, Frame, NONCE_LEN, Nonce, Reason,
    Step,
};
use wire::header::HELLO_LANE_OFFSET;

use super::config::{NetConfig, Peer};
use super::counters::Handshake;
use super::io::Stream;
use super::tls::exporter;

/// Bytes of a handshake frame's body read per discard step.
const DISCARD_CHUNK: usize = 4096;

/// A connection whose handshake succeeded.
pub struct Established {
    /// The connection.
    pub stream: Stream,
    /// The peer's replica id.
    pub peer: u8,
    /// The lane: hello byte 224 on the accepting side, the dialled lane on the dialing side.
    pub lane: u8,
}

fn nonce() -> Result<Nonce, Handshake> {
    let mut nonce = [0u8; NONCE_LEN];
    getrandom::getrandom(&mut nonce).map_err(|error| {
        tracing::error!(%error, "no randomness for a handshake nonce");
        Handshake::Io
    })?;
    Ok(nonce)
}

fn io_failure(error: std::io::Error) -> Handshake {
    tracing::debug!(%error, "replica handshake i/o");
    Handshake::Io
}

/// The counter of a machine's refusal.
fn failure_for(reason: Reason) -> Handshake {
    match reason {
        Reason::BadFrame(_) => Handshake::Framing,
        Reason::UnknownCommand(_) | Reason::UnexpectedCommand(_) => Handshake::UnexpectedCommand,
        Reason::ClusterMismatch => Handshake::ClusterMismatch,
        Reason::DirectionalRule(_) => Handshake::DirectionalRule,
        Reason::AuthRequired => Handshake::AuthRequired,
        Reason::MacMismatch => Handshake::MacMismatch,
        Reason::Rejected(_) => Handshake::Rejected,
        Reason::Finished | Reason::NotStarted => Handshake::UnexpectedCommand,
    }
}

/// Reads one handshake frame: its header, with any body read and discarded (module docs).
async fn read_frame<S: AsyncRead + Unpin>(io: &mut S, max: usize) -> Result<Frame, Handshake> {
    let mut header = [0u8; HEADER_SIZE];
    io.read_exact(&mut header).await.map_err(io_failure)?;
    let size = match frame_size(&header, max) {
        Ok(size) => size.expect("a whole header"),
        Err(error) => {
            tracing::debug!(%error, "replica handshake frame");
            return Err(Handshake::Framing);
        }
    };
    let mut left = size - HEADER_SIZE;
    let mut scratch = [0u8; DISCARD_CHUNK];
    while left > 0 {
        let n = left.min(DISCARD_CHUNK);
        io.read_exact(&mut scratch[..n]).await.map_err(io_failure)?;
        left -= n;
    }
    header[48..52].copy_from_slice(&(HEADER_SIZE as u32).to_le_bytes());
    Ok(header)
}

async fn send<S: AsyncWrite + Unpin>(io: &mut S, frame: &Frame) -> Result<(), Handshake> {
    io.write_all(frame).await.map_err(io_failure)?;
    io.flush().await.map_err(io_failure)
}

/// Runs the acceptor machine; returns the peer and the hello's lane.
async fn run_acceptor<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    config: &NetConfig,
    binding: Binding,
) -> Result<(u8, u8), Handshake> {
    let machine_config = AcceptorConfig {
        max_message_size: config.max_message_size,
        ..AcceptorConfig::new(
            config.cluster,
            config.self_id,
            config.replica_count(),
            config.auth.clone(),
            binding,
        )
    };
    let mut acceptor = Acceptor::new(machine_config, nonce()?);
    let hello = read_frame(io, config.max_message_size).await?;
    let lane = hello[HELLO_LANE_OFFSET];
    let mut step = acceptor.on_frame(&hello);
    loop {
        match step {
            Step::Continue { send: frame } => {
                send(io, &frame).await?;
                let next = read_frame(io, config.max_message_size).await?;
                step = acceptor.on_frame(&next);
            }
            Step::Accept { send: frame, peer } => {
                if let Some(frame) = frame {
                    send(io, &frame).await?;
                }
                if u16::from(lane) >= config.lanes {
                    tracing::warn!(
                        peer,
                        lane,
                        lanes = config.lanes,
                        "hello names a lane beyond cluster.replica_lanes; the key must match on every node"
                    );
                    return Err(Handshake::LaneOutOfRange);
                }
                return Ok((peer, lane));
            }
            Step::Close {
                send: frame,
                reason,
            } => {
                if let Some(frame) = frame {
                    // Best effort: the connection closes whatever happens.
                    let _ = send(io, &frame).await;
                }
                tracing::info!(%reason, "replica handshake refused");
                return Err(failure_for(reason));
            }
        }
    }
}

/// Runs the dialer machine for `lane` towards `peer`.
async fn run_dialer<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    config: &NetConfig,
    peer: u8,
    lane: u8,
    binding: Binding,
) -> Result<(), Handshake> {
    let machine_config = DialerConfig {
        max_message_size: config.max_message_size,
        ..DialerConfig::new(
            config.cluster,
            config.self_id,
            peer,
            config.auth.clone(),
            binding,
            lane,
        )
    };
    let mut dialer = Dialer::new(machine_config);
    let mut step = dialer.start(nonce()?);
    loop {
        match step {
            Step::Continue { send: frame } => {
                send(io, &frame).await?;
                let next = read_frame(io, config.max_message_size).await?;
                step = dialer.on_frame(&next);
            }
            Step::Accept { send: frame, .. } => {
                if let Some(frame) = frame {
                    send(io, &frame).await?;
                }
                return Ok(());
            }
            Step::Close { reason, .. } => {
                tracing::info!(peer, %reason, "replica handshake refused");
                return Err(failure_for(reason));
            }
        }
    }
}

fn check_alpn(alpn: Option<&[u8]>) -> Result<(), Handshake> {
    if alpn == Some(ALPN) {
        Ok(())
    } else {
        Err(Handshake::Alpn)
    }
}

fn tls_failure(error: std::io::Error) -> Handshake {
    tracing::info!(%error, "replica TLS handshake failed");
    Handshake::Tls
}

/// The accepting side: TLS (server role) when configured, then the acceptor machine. The
/// caller bounds it by `handshake_grace`.
pub async fn accept(tcp: TcpStream, config: &NetConfig) -> Result<Established, Handshake> {
    tcp.set_nodelay(true).map_err(|e| io_failure(e.into()))?;
    let Some(tls) = &config.tls else {
        let mut tcp = tcp;
        let (peer, lane) = run_acceptor(&mut tcp, config, Binding::Plaintext).await?;
        return Ok(Established {
            stream: Stream { tcp, tls: None },
            peer,
            lane,
        });
    };
    let mut stream = TlsAcceptor::from(tls.server.clone())
        .accept(tcp)
        .await
        .map_err(tls_failure)?;
    let session = stream.get_ref().1;
    check_alpn(session.alpn_protocol())?;
    let exporter = exporter_of(exporter(&**session))?;
    let (peer, lane) = run_acceptor(&mut stream, config, Binding::Tls { exporter }).await?;
    let (tcp, session) = stream.into_inner();
    Ok(Established {
        stream: Stream {
            tcp,
            tls: Some(session.into()),
        },
        peer,
        lane,
    })
}

fn exporter_of(exported: Result<[u8; 32], rustls::Error>) -> Result<[u8; 32], Handshake> {
    exported.map_err(|error| {
        tracing::info!(%error, "TLS exporter unavailable");
        Handshake::Tls
    })
}

/// The dialing side for `lane` of `peer`: TCP connect bounded by `reconnect_period` (the
/// per-dial timeout), TLS (client role) when configured, then the dialer machine. The caller
/// bounds TLS and the machine by `handshake_grace`.
pub async fn dial(config: &NetConfig, peer: &Peer, lane: u8) -> Result<Established, Handshake> {
    let tcp = super::socket::connect(
        peer.addr,
        config.reconnect_period,
        config.congestion.as_ref(),
    )
    .await
    .map_err(|error| {
        tracing::debug!(peer = peer.id, %error, "replica dial failed");
        Handshake::Connect
    })?;
    tcp.set_nodelay(true).map_err(|e| io_failure(e.into()))?;
    let Some(tls) = &config.tls else {
        let mut tcp = tcp;
        run_dialer(&mut tcp, config, peer.id, lane, Binding::Plaintext).await?;
        return Ok(Established {
            stream: Stream { tcp, tls: None },
            peer: peer.id,
            lane,
        });
    };
    let name = tls.server_name(&peer.name).map_err(|error| {
        tracing::error!(%error, "replica TLS server name");
        Handshake::Tls
    })?;
    let mut stream = TlsConnector::from(tls.client.clone())
        .connect(name, tcp)
        .await
        .map_err(tls_failure)?;
    let session = stream.get_ref().1;
    check_alpn(session.alpn_protocol())?;
    let exporter = exporter_of(exporter(&**session))?;
    run_dialer(
        &mut stream,
        config,
        peer.id,
        lane,
        Binding::Tls { exporter },
    )
    .await?;
    let (tcp, session) = stream.into_inner();
    Ok(Established {
        stream: Stream {
            tcp,
            tls: Some(session.into()),
        },
        peer: peer.id,
        lane,
    })
}
