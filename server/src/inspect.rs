//! `strand inspect`: decode frames (and later journals) into readable fields and verdicts.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Subcommand;
use wire::decode::{self, Message};
use wire::header::{FieldKind, layout_fields};
use wire::integrity::{prepare_identity, seal_of};
use wire::suffix::SuffixEntry;
use wire::{Command, HEADER_SIZE, Integrity, MAX_MESSAGE_SIZE_DEFAULT};

/// What to decode.
#[derive(Debug, Subcommand)]
pub enum Inspect {
    /// Decode frames given as hex strings, or read back to back from a file, and print every
    /// field, the integrity check and the replica port's verdict. Exits 1 if any frame is refused.
    Frame {
        /// Frames as hex (whitespace and a leading 0x are ignored).
        hex: Vec<String>,
        /// A file of raw frames, back to back.
        #[arg(long, conflicts_with = "hex")]
        file: Option<PathBuf>,
        /// The frame size limit (`message_bus.max_message_size`).
        #[arg(long, default_value_t = MAX_MESSAGE_SIZE_DEFAULT)]
        max_message_size: usize,
    },
    /// Decode a state-transfer manifest (a StateTransferTarget body) and list its artifacts.
    /// Exits 1 if it does not decode.
    Manifest {
        /// The manifest as hex.
        hex: Vec<String>,
        /// A file holding the raw manifest.
        #[arg(long, conflicts_with = "hex")]
        file: Option<PathBuf>,
    },
    /// Print what a node's data directory holds, without writing to it: the stamp, every
    /// superblock (each copy and the chosen state), the metadata journal's head, snapshots,
    /// and per shard the partition WAL's durable end, its files and segment ranges. Exits 1
    /// if something is unreadable.
    DataDir {
        /// The data directory (`--data-dir` of `strand start`).
        dir: PathBuf,
    },
}

pub fn run(what: Inspect, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    match what {
        Inspect::Frame {
            hex,
            file,
            max_message_size,
        } => frames(&input(&hex, file)?, max_message_size, out),
        Inspect::Manifest { hex, file } => manifest(&input(&hex, file)?, out),
        Inspect::DataDir { dir } => crate::inspect_dir::run(&dir, out),
    }
}

fn input(hex: &[String], file: Option<PathBuf>) -> anyhow::Result<Vec<u8>> {
    match file {
        Some(path) => std::fs::read(&path).with_context(|| format!("reading {}", path.display())),
        None if hex.is_empty() => bail!("give the bytes as hex arguments or --file"),
        None => parse_hex(&hex.concat()),
    }
}

fn manifest(bytes: &[u8], out: &mut impl Write) -> anyhow::Result<ExitCode> {
    let manifest = match wire::manifest::decode(bytes) {
        Ok(manifest) => manifest,
        Err(error) => {
            writeln!(out, "manifest refused: {error}")?;
            return Ok(ExitCode::FAILURE);
        }
    };
    writeln!(
        out,
        "manifest: {} artifacts, entry_len {}",
        manifest.len(),
        manifest.entry_len()
    )?;
    for (index, entry) in manifest.iter().enumerate() {
        writeln!(
            out,
            "  artifact {index}: {}, frontier {}, len {}, checksum {:#018x}",
            entry.kind, entry.frontier, entry.len, entry.checksum
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

fn parse_hex(text: &str) -> anyhow::Result<Vec<u8>> {
    let digits: String = text
        .trim_start_matches("0x")
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    if !digits.len().is_multiple_of(2) {
        bail!("odd number of hex digits");
    }
    (0..digits.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&digits[i..i + 2], 16)
                .with_context(|| format!("bad hex at digit {i}"))
        })
        .collect()
}

/// Walks back-to-back frames; stops at the first framing failure, as a connection would.
fn frames(
    mut bytes: &[u8],
    max_message_size: usize,
    out: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let mut refused = false;
    let mut index = 0;
    while !bytes.is_empty() {
        let Some(header) = bytes
            .get(..HEADER_SIZE)
            .and_then(|h| <&[u8; HEADER_SIZE]>::try_from(h).ok())
        else {
            writeln!(
                out,
                "frame {index}: {} trailing bytes, shorter than a header",
                bytes.len()
            )?;
            return Ok(ExitCode::FAILURE);
        };
        let size = match wire::framer::frame_size(header, max_message_size) {
            Ok(size) => size.expect("a whole header is in"),
            Err(error) => {
                writeln!(out, "frame {index}: {error}: the connection closes here")?;
                return Ok(ExitCode::FAILURE);
            }
        };
        let command = Command::from_byte(header[60]).expect("frame_size checked the command");
        let Some(frame) = bytes.get(..size) else {
            writeln!(
                out,
                "frame {index}: {command}, size {size} but only {} bytes remain",
                bytes.len()
            )?;
            return Ok(ExitCode::FAILURE);
        };
        refused |= !describe(index, frame, command, max_message_size, out)?;
        bytes = &bytes[size..];
        index += 1;
    }
    Ok(if refused {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Prints one frame; returns whether its plane accepts it.
fn describe(
    index: usize,
    frame: &[u8],
    command: Command,
    max_message_size: usize,
    out: &mut impl Write,
) -> anyhow::Result<bool> {
    let header: &[u8; HEADER_SIZE] = frame[..HEADER_SIZE].try_into().expect("framed");
    let mut details = None;
    let layout = if command == Command::Request {
        "RoutedRequestHeader"
    } else {
        command.layout_name()
    };
    writeln!(
        out,
        "frame {index}: {command} ({}), {} bytes, layout {layout}",
        command.byte(),
        frame.len()
    )?;
    for field in layout_fields(layout).expect("every command has a layout") {
        match (field.kind, field.read_uint(header)) {
            (FieldKind::Bytes, _) => {
                let bytes = field.bytes(header);
                if bytes.iter().all(|b| *b == 0) {
                    writeln!(out, "  {:<24} zero ({} bytes)", field.name, bytes.len())?;
                } else {
                    writeln!(out, "  {:<24} {}", field.name, hex(bytes))?;
                }
            }
            (_, Some(value)) => writeln!(out, "  {:<24} {value}", field.name)?,
            (_, None) => unreachable!("integer fields read as integers"),
        }
    }
    let integrity = match command.integrity() {
        Integrity::FrameSeal => format!(
            "frame seal {}",
            if seal_of(header).to_le_bytes() == header[..16] {
                "ok"
            } else {
                "MISMATCH"
            }
        ),
        Integrity::PrepareIdentity => {
            format!("prepare identity {:#034x}", prepare_identity(header))
        }
        Integrity::None => "unsealed".to_string(),
        Integrity::HandshakeMac => "handshake frame (MAC inside)".to_string(),
    };
    writeln!(out, "  integrity: {integrity}")?;
    let verdict = match command {
        Command::Reply => decode::decode_reply(frame, max_message_size).map(|_| "client plane"),
        Command::Eviction => {
            decode::decode_eviction(frame, max_message_size).map(|_| "client plane")
        }
        _ => decode::decode_replica(frame, max_message_size).map(|message| {
            details = Some(message);
            "replica plane"
        }),
    };
    match verdict {
        Ok(plane) => writeln!(out, "  verdict: {plane}: accepted")?,
        Err(error) => writeln!(
            out,
            "  verdict: refused at {:?} ({:?}): {error}",
            error.stage(),
            error.disposition()
        )?,
    }
    if let Some(message) = details {
        if command.group_offset().is_some() {
            writeln!(out, "  group: {}", message.group())?;
        }
        suffix(&message, out)?;
    }
    Ok(verdict.is_ok())
}

/// Lists the entries of a DoViewChange or StartView suffix.
fn suffix(message: &Message<'_>, out: &mut impl Write) -> std::io::Result<()> {
    let suffix = match message {
        Message::DoViewChange { suffix, .. } => Ok(suffix),
        Message::StartView { suffix, .. } => suffix.as_ref(),
        _ => return Ok(()),
    };
    let suffix = match suffix {
        Ok(suffix) => suffix,
        Err(error) => return writeln!(out, "  suffix ignored: {error}"),
    };
    for entry in suffix.entries() {
        match entry {
            SuffixEntry::Held(h) => writeln!(
                out,
                "  suffix op {:<12} held, identity {:#034x}, parent {:#034x}",
                h.op.get(),
                h.frame.checksum.get(),
                h.parent.get()
            )?,
            SuffixEntry::Blank { op } => writeln!(out, "  suffix op {op:<12} blank")?,
        }
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::header::{CommitHeader, FrameHeader, Layout};
    use wire::{GroupId, Sender};

    fn commit() -> Vec<u8> {
        let mut commit = CommitHeader::zeroed();
        commit.frame = FrameHeader::new(
            Command::Commit,
            Sender {
                cluster: 1,
                replica: 2,
                view: 3,
            },
        );
        commit.commit.set(99);
        commit.group.set(GroupId::METADATA.0);
        wire::finish_header(&mut commit, &[]).unwrap();
        commit.bytes().to_vec()
    }

    #[test]
    fn prints_fields_and_accepts_a_sealed_commit() {
        let mut out = Vec::new();
        let code = frames(&commit(), MAX_MESSAGE_SIZE_DEFAULT, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(code, ExitCode::SUCCESS);
        assert!(text.contains("Commit (9), 256 bytes"), "{text}");
        assert!(text.contains("commit                   99"), "{text}");
        assert!(text.contains("frame seal ok"), "{text}");
        assert!(text.contains("replica plane: accepted"), "{text}");
    }

    #[test]
    fn a_flipped_byte_is_refused_at_the_seal() {
        let mut bytes = commit();
        bytes[200] ^= 1;
        let mut out = Vec::new();
        let code = frames(&bytes, MAX_MESSAGE_SIZE_DEFAULT, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(code, ExitCode::FAILURE);
        assert!(
            text.contains("MISMATCH") && text.contains("refused at Seal"),
            "{text}"
        );
    }

    #[test]
    fn manifests_list_their_artifacts_or_are_refused() {
        use wire::manifest::{ArtifactKind, ManifestEntry, encode};
        let entry = ManifestEntry {
            kind: ArtifactKind::SEGMENT_LOG,
            frontier: 7,
            len: 64,
            checksum: 5,
        };
        let mut bytes = Vec::new();
        encode(&[entry], &mut bytes).unwrap();
        let mut out = Vec::new();
        assert_eq!(manifest(&bytes, &mut out).unwrap(), ExitCode::SUCCESS);
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("artifact 0: SEGMENT_LOG, frontier 7, len 64"),
            "{text}"
        );
        bytes[5] ^= 1;
        let mut out = Vec::new();
        assert_eq!(manifest(&bytes, &mut out).unwrap(), ExitCode::FAILURE);
    }

    #[test]
    fn hex_input_round_trips() {
        let bytes = commit();
        assert_eq!(parse_hex(&format!("0x{}", hex(&bytes))).unwrap(), bytes);
        assert!(parse_hex("abc").is_err());
    }
}
