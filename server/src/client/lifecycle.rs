//! Stream and topic lifecycle request bodies (client-plane.md §2.2; bodies as the Iggy SDK
//! 0.11.0-edge.4 sends them): UpdateStream 129, PurgeStream 131, UpdateTopic 133,
//! DeleteTopic 134, PurgeTopic 135, CreatePartitions 136, DeletePartitions 137.
//! All of them are metadata operations answered with a result section and an empty payload.

use wire::Operation;

use super::codec::{BodyError, Identifier, Name, Options, Reader};

/// One lifecycle command and its decoded body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lifecycle {
    /// 129: rename a stream; `options` must be empty (no stream option is updatable).
    UpdateStream {
        /// The stream.
        stream: Identifier,
        /// Its new name.
        name: Name,
        /// Options as sent.
        options: Options,
    },
    /// 131: every message of every partition of the stream's topics goes.
    PurgeStream(Identifier),
    /// 133: rename a topic and patch its updatable options (absent keys keep their value).
    UpdateTopic {
        /// The stream.
        stream: Identifier,
        /// The topic.
        topic: Identifier,
        /// Its new name.
        name: Name,
        /// Options to patch.
        options: Options,
    },
    /// 134.
    DeleteTopic {
        /// The stream.
        stream: Identifier,
        /// The topic.
        topic: Identifier,
    },
    /// 135.
    PurgeTopic {
        /// The stream.
        stream: Identifier,
        /// The topic.
        topic: Identifier,
    },
    /// 136: `count` partitions appended after the last one.
    CreatePartitions {
        /// The stream.
        stream: Identifier,
        /// The topic.
        topic: Identifier,
        /// How many.
        count: u32,
    },
    /// 137: the `count` highest partitions removed.
    DeletePartitions {
        /// The stream.
        stream: Identifier,
        /// The topic.
        topic: Identifier,
        /// How many.
        count: u32,
    },
}

impl Lifecycle {
    /// The wire operation of this command.
    pub fn operation(&self) -> Operation {
        match self {
            Lifecycle::UpdateStream { .. } => Operation::UpdateStream,
            Lifecycle::PurgeStream(_) => Operation::PurgeStream,
            Lifecycle::UpdateTopic { .. } => Operation::UpdateTopic,
            Lifecycle::DeleteTopic { .. } => Operation::DeleteTopic,
            Lifecycle::PurgeTopic { .. } => Operation::PurgeTopic,
            Lifecycle::CreatePartitions { .. } => Operation::CreatePartitions,
            Lifecycle::DeletePartitions { .. } => Operation::DeletePartitions,
        }
    }

    /// Whether `operation` is one of these commands.
    pub fn serves(operation: Operation) -> bool {
        matches!(
            operation,
            Operation::UpdateStream
                | Operation::PurgeStream
                | Operation::UpdateTopic
                | Operation::DeleteTopic
                | Operation::PurgeTopic
                | Operation::CreatePartitions
                | Operation::DeletePartitions
        )
    }

    /// Decodes the body of `operation` (which [`Lifecycle::serves`]); `None` for any other
    /// operation. The reader must be finished by the caller.
    pub fn read(operation: Operation, r: &mut Reader<'_>) -> Option<Result<Lifecycle, BodyError>> {
        let stream_topic = |r: &mut Reader<'_>| -> Result<(Identifier, Identifier), BodyError> {
            Ok((
                Identifier::read(r, "stream id")?,
                Identifier::read(r, "topic id")?,
            ))
        };
        if !Lifecycle::serves(operation) {
            return None;
        }
        let decoded = (|| {
            Ok::<_, BodyError>(match operation {
                Operation::UpdateStream => Lifecycle::UpdateStream {
                    stream: Identifier::read(r, "stream id")?,
                    name: Name::read(r, "stream name")?,
                    options: Options::decode(r.rest())?,
                },
                Operation::PurgeStream => Lifecycle::PurgeStream(Identifier::read(r, "stream id")?),
                Operation::UpdateTopic => {
                    let (stream, topic) = stream_topic(r)?;
                    Lifecycle::UpdateTopic {
                        stream,
                        topic,
                        name: Name::read(r, "topic name")?,
                        options: Options::decode(r.rest())?,
                    }
                }
                Operation::DeleteTopic => {
                    let (stream, topic) = stream_topic(r)?;
                    Lifecycle::DeleteTopic { stream, topic }
                }
                Operation::PurgeTopic => {
                    let (stream, topic) = stream_topic(r)?;
                    Lifecycle::PurgeTopic { stream, topic }
                }
                Operation::CreatePartitions => {
                    let (stream, topic) = stream_topic(r)?;
                    Lifecycle::CreatePartitions {
                        stream,
                        topic,
                        count: r.u32("partitions_count")?,
                    }
                }
                Operation::DeletePartitions => {
                    let (stream, topic) = stream_topic(r)?;
                    Lifecycle::DeletePartitions {
                        stream,
                        topic,
                        count: r.u32("partitions_count")?,
                    }
                }
                _ => unreachable!("served operations only"),
            })
        })();
        Some(decoded)
    }

    /// Encodes the body (what the SDK sends).
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Lifecycle::UpdateStream {
                stream,
                name,
                options,
            } => {
                stream.write(out);
                name.write(out);
                options.encode(out);
            }
            Lifecycle::PurgeStream(stream) => stream.write(out),
            Lifecycle::UpdateTopic {
                stream,
                topic,
                name,
                options,
            } => {
                stream.write(out);
                topic.write(out);
                name.write(out);
                options.encode(out);
            }
            Lifecycle::DeleteTopic { stream, topic } | Lifecycle::PurgeTopic { stream, topic } => {
                stream.write(out);
                topic.write(out);
            }
            Lifecycle::CreatePartitions {
                stream,
                topic,
                count,
            }
            | Lifecycle::DeletePartitions {
                stream,
                topic,
                count,
            } => {
                stream.write(out);
                topic.write(out);
                out.extend_from_slice(&count.to_le_bytes());
            }
        }
    }
}
