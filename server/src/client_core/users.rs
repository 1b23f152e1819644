//! The receiving shard's part of the user commands (decisions 304-309): the secrets of
//! CreateUser, ChangePassword and CreatePersonalAccessToken are replaced before submission
//! (a prepare is journaled on every node), and GetMe / GetClient / GetClients are answered
//! from the committed sessions.

use consensus::codes::TRANSIENT_NOT_ACCEPTED;
use consensus::{ClientRequest, Frame};
use wire::header::RequestHeader;

use super::{ClientCore, frames};
use crate::client::codec::Name;
use crate::client::reply::{RESULT_OK, read_result};
use crate::client::route::{ClientsQuery, Prepare};
use crate::client::users::{
    ClientRecord, PreparedPassword, PreparedToken, PreparedUser, TRANSPORT_TCP, status,
};
use crate::metadata::ROOT_USER_ID;
use crate::metadata::password::{HashParams, PasswordHash, SALT_LEN};
use crate::metadata::users::{random_bytes, token_hash};

/// Bytes of randomness in a personal access token (shown as 64 hex digits).
const TOKEN_BYTES: usize = 32;

/// The key a token is derived under (decision 381): from `cluster.auth.shared_secret` when
/// authentication is on, so every node of the cluster derives the same token for the same
/// request; else a random key of this process, so a resend to this node does. `None` when the
/// kernel gives no randomness.
fn token_key(shared_secret: Option<&[u8]>) -> Option<[u8; 32]> {
    static PROCESS_KEY: std::sync::OnceLock<Option<[u8; 32]>> = std::sync::OnceLock::new();
    match shared_secret {
        Some(secret) => Some(blake3::derive_key(
            "strand 2026 personal access token key",
            secret,
        )),
        None => *PROCESS_KEY.get_or_init(|| {
            let mut key = [0u8; 32];
            random_bytes(&mut key).ok().map(|_| key)
        }),
    }
}

/// A token's secret: the keyed hash of what identifies its request (client, session, request
/// number, the client's body checksum, the name). A resend of the same request derives the
/// same token, so the reply the client table kept (its hash) can be answered with it; any
/// other request derives an unrelated one.
fn token_secret(key: &[u8; 32], header: &RequestHeader, name: &Name) -> [u8; TOKEN_BYTES] {
    let mut hasher = blake3::Hasher::new_keyed(key);
    hasher.update(&header.client.get().to_le_bytes());
    hasher.update(&header.session.get().to_le_bytes());
    hasher.update(&header.request.get().to_le_bytes());
    hasher.update(&header.request_checksum.get().to_le_bytes());
    hasher.update(name.as_str().as_bytes());
    *hasher.finalize().as_bytes()
}

impl ClientCore {
    /// The Argon2id cost of new hashes: the root user's (set from the node's genesis), so a
    /// cluster hashes every password at one configured cost.
    fn hash_params(&self) -> HashParams {
        self.node
            .reader
            .view()
            .state
            .users
            .get(&ROOT_USER_ID)
            .map_or(HashParams::DEFAULT, |root| root.password.params)
    }

    /// Replaces the secret, submits, and for a token answers the token in place of its hash.
    pub(super) async fn prepare(
        &self,
        conn: u64,
        header: RequestHeader,
        user: u32,
        prepare: Prepare,
    ) -> Frame {
        let mut salt = [0u8; SALT_LEN];
        if let Err(error) = random_bytes(&mut salt) {
            tracing::warn!(%error, "no randomness for a salt");
            return frames::refused(&header, TRANSIENT_NOT_ACCEPTED);
        }
        let mut token = None;
        let body = match prepare {
            Prepare::User(create) => {
                let Ok(password) = PasswordHash::new(&create.password, salt, self.hash_params())
                else {
                    return frames::refused(&header, status::INVALID_PASSWORD);
                };
                PreparedUser {
                    username: create.username,
                    status: create.status,
                    permissions: create.permissions,
                    password,
                }
                .encode()
            }
            Prepare::Password {
                user_id,
                stored,
                request,
            } => {
                let verified = stored.verify(&request.current);
                glommio::executor().yield_now().await;
                if !verified {
                    return frames::refused(&header, status::INVALID_PASSWORD);
                }
                let Ok(new) = PasswordHash::new(&request.new, salt, self.hash_params()) else {
                    return frames::refused(&header, status::INVALID_PASSWORD);
                };
                PreparedPassword {
                    user_id,
                    verified: stored,
                    new,
                }
                .encode()
            }
            Prepare::Token { name, expiry } => {
                let Some(key) = token_key(self.node.config.cluster.shared_secret.as_deref()) else {
                    tracing::warn!("no randomness for the token key");
                    return frames::refused(&header, TRANSIENT_NOT_ACCEPTED);
                };
                let secret = token_secret(&key, &header, &name);
                let text: String = secret.iter().map(|b| format!("{b:02x}")).collect();
                let hash = token_hash(&text);
                token = Some((text, hash));
                PreparedToken { name, expiry, hash }.encode()
            }
        };
        // The hash just ran on this executor: let the shard's other tasks in.
        glommio::executor().yield_now().await;
        let mut request = ClientRequest { header, body };
        request.header.user_id.set(user);
        let answer = self.metadata_call(conn, request).await;
        let Some((text, hash)) = token else {
            return answer;
        };
        match read_result(answer.body()) {
            Ok(Ok(payload)) if payload == hash => {
                let mut body = RESULT_OK.to_vec();
                Name::new(&text).expect("64 hex digits").write(&mut body);
                frames::reply(&header, 0, &body)
            }
            // A committed token this node cannot derive (an earlier attempt's reply from the
            // client table, minted under another key: another node without a shared secret,
            // or before a restart or a secret rotation): never guess it.
            Ok(Ok(_)) => frames::refused(&header, status::PERSONAL_ACCESS_TOKEN_ALREADY_EXISTS),
            _ => answer,
        }
    }

    /// GetMe, GetClient, GetClients from the committed sessions (decision 309).
    pub(super) fn clients(&self, header: &RequestHeader, query: ClientsQuery) -> Frame {
        let sessions = self.node.reader.sessions();
        // The address when the client's connection is on this node, else empty (decision 384).
        let addresses = &self.node.addresses;
        let record = |client: u128, user_id: u32| ClientRecord {
            client_id: client as u32,
            user_id,
            transport: TRANSPORT_TCP,
            address: addresses
                .get(client)
                .map_or_else(String::new, |a| a.to_string()),
            consumer_groups_count: 0,
        };
        let mut out = Vec::new();
        match query {
            ClientsQuery::Me => {
                let client = header.client.get();
                match sessions.by_client.get(&client) {
                    Some(s) => record(client, s.user_id).encode(&mut out),
                    None => {
                        return frames::refused(header, crate::client::status::UNAUTHENTICATED);
                    }
                }
            }
            ClientsQuery::One(id) => {
                if let Some((client, s)) = sessions
                    .by_client
                    .iter()
                    .find(|(client, _)| **client as u32 == id)
                {
                    record(*client, s.user_id).encode(&mut out);
                }
            }
            ClientsQuery::All => {
                for (client, s) in &sessions.by_client {
                    record(*client, s.user_id).encode(&mut out);
                }
            }
        }
        frames::reply(header, 0, &out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nodes with one shared secret derive one key (so one token per request); without a
    /// secret the process key is stable; different requests derive different tokens.
    #[test]
    fn tokens_derive_from_the_request_under_the_cluster_or_process_key() {
        let a = token_key(Some(b"0123456789abcdef0123456789abcdef")).unwrap();
        assert_eq!(
            Some(a),
            token_key(Some(b"0123456789abcdef0123456789abcdef"))
        );
        assert_ne!(
            Some(a),
            token_key(Some(b"0123456789abcdef0123456789abcdeF"))
        );
        let process = token_key(None).unwrap();
        assert_eq!(Some(process), token_key(None));
        assert_ne!(process, a);
        let name = Name::new("ci").unwrap();
        let mut h = <RequestHeader as wire::header::Layout>::zeroed();
        h.request.set(3);
        let t = token_secret(&a, &h, &name);
        assert_eq!(t, token_secret(&a, &h, &name));
        assert_ne!(t, token_secret(&process, &h, &name));
        assert_ne!(t, token_secret(&a, &h, &Name::new("cj").unwrap()));
        h.request.set(4);
        assert_ne!(t, token_secret(&a, &h, &name));
    }
}
