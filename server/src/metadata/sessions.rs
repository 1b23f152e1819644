//! Where each session came from (decisions 370-371): the replica whose client connection
//! registered it, recorded at the Register's commit on every replica alike, so the metadata
//! primary can end the sessions of a node that died with their connections.
//!
//! The primary writes the origin into the Register prepare's body (the core's
//! `project_register` hook, the only place that knows whether the Register was forwarded):
//! [`ORIGIN_TAG`], the origin replica id, then the body the Register carried. Every replica
//! reads it back at apply (`begin_session`). A body without the tag (a prepare of an older
//! build, or one a foreign primary wrote) records no origin: such a session is never ended by
//! the node rules, only by the ways every session ends (decision 317).

use std::collections::BTreeMap;

use super::state::{SnapshotError, State};
use crate::client::codec::Reader;

/// The prefix of a Register prepare's body that carries its origin.
pub const ORIGIN_TAG: [u8; 4] = *b"SOR1";

/// The Register prepare body the primary replicates: the tag, the origin, then `body`.
pub fn register_body(origin: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ORIGIN_TAG.len() + 1 + body.len());
    out.extend_from_slice(&ORIGIN_TAG);
    out.push(origin);
    out.extend_from_slice(body);
    out
}

/// The origin a committed Register prepare's body names; `None` for an untagged or short body.
pub fn origin_of(body: &[u8]) -> Option<u8> {
    body.strip_prefix(&ORIGIN_TAG)?.first().copied()
}

/// The live sessions' origins, by client id. Holds only sessions the client table holds: a
/// Register inserts, every session end removes (the same steps as the table's change).
pub type Origins = BTreeMap<u128, u8>;

/// Appends the origins section (snapshot version 3): `u32 count`, then `client u128, origin
/// u8` per session in client order.
pub fn encode_section(state: &State, out: &mut Vec<u8>) {
    out.extend_from_slice(&(state.session_origins.len() as u32).to_le_bytes());
    for (client, origin) in &state.session_origins {
        out.extend_from_slice(&client.to_le_bytes());
        out.push(*origin);
    }
}

/// Reads the origins section: client ids non-zero and strictly ascending.
pub fn decode_section(r: &mut Reader<'_>, state: &mut State) -> Result<(), SnapshotError> {
    let count = r.u32("session origin count")?;
    for _ in 0..count {
        let client = u128::from_le_bytes(r.array::<16>("session client")?);
        let origin = r.u8("session origin")?;
        if client == 0
            || state
                .session_origins
                .keys()
                .next_back()
                .is_some_and(|last| *last >= client)
        {
            return Err(SnapshotError::Content(
                "session clients zero or not ascending",
            ));
        }
        state.session_origins.insert(client, origin);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_origin_rides_the_register_body_and_untagged_bodies_name_none() {
        let body = register_body(2, b"login");
        assert_eq!(origin_of(&body), Some(2));
        assert_eq!(&body[5..], b"login");
        assert_eq!(origin_of(&register_body(0, &[])), Some(0));
        // An older build's bodies: the login body (starts with the version, 0x2C00 LE), or
        // a forwarded Register's empty body; a truncated tag.
        assert_eq!(origin_of(&0x2C00u32.to_le_bytes()), None);
        assert_eq!(origin_of(&[]), None);
        assert_eq!(origin_of(b"SOR1"), None);
        assert_eq!(origin_of(b"SOR"), None);
    }
}
