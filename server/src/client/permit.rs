//! Which permission each client command needs, checked on the receiving shard against the
//! committed metadata before anything is submitted or read (decision 302). Metadata
//! operations are checked again at apply (`metadata::MetadataStateMachine::check`), where
//! the state may have moved since.

use super::request::Request;
use crate::metadata::users::{Action, allowed};
use crate::metadata::view::MetadataView;

/// The action `request` needs, resolved against `view`; `None` when it needs none (Ping,
/// login, logout, GetMe, GetClusterMetadata, the caller's own tokens and password) or names
/// a stream or topic that does not exist (the command's own not-found answer follows, as
/// the reference answers a missing resource before a permission).
pub fn required(request: &Request<'_>, user_id: u32, view: &MetadataView) -> Option<Action> {
    use Request::*;
    let stream = |id| view.stream(id).ok().map(|s| s.id);
    let topic = |s, t| view.topic(s, t).ok().map(|f| (f.stream.id, f.topic.id));
    let user = |id: &super::codec::Identifier| match id {
        super::codec::Identifier::Numeric(n) => Some(*n),
        super::codec::Identifier::Named(name) => view.user(name.as_str()).map(|u| u.id),
    };
    Some(match request {
        Ping | Register(_) | Logout | GetClusterMetadata | GetMe => return None,
        CreatePersonalAccessToken { .. }
        | GetPersonalAccessTokens
        | DeletePersonalAccessToken(_) => return None,
        GetStats | GetClients | GetClient(_) => Action::ReadServers,
        GetUsers => Action::ReadUsers,
        GetUser(id) => {
            if user(id) == Some(user_id) {
                return None;
            }
            Action::ReadUsers
        }
        ChangePassword(c) => {
            if user(&c.user) == Some(user_id) {
                return None;
            }
            Action::ManageUsers
        }
        CreateUser(_) | UpdateUser(_) | DeleteUser(_) | UpdatePermissions(_) => Action::ManageUsers,
        GetStreams => Action::ReadStreams,
        CreateStream { .. } => Action::CreateStream,
        GetStream(id) => Action::ReadStream(stream(id)?),
        DeleteStream(id) => Action::ManageStream(stream(id)?),
        CreateTopic(t) => Action::CreateTopic(stream(&t.stream)?),
        GetTopic {
            stream: s,
            topic: t,
        } => {
            let (s, t) = topic(s, t)?;
            Action::ReadTopic(s, t)
        }
        SendMessages(send) => {
            let (s, t) = topic(&send.stream, &send.topic)?;
            Action::Send(s, t)
        }
        PollMessages(poll) => {
            let (s, t) = topic(&poll.stream, &poll.topic)?;
            Action::Poll(s, t)
        }
        StoreConsumerOffset(store) => {
            let (s, t) = topic(&store.target.stream, &store.target.topic)?;
            Action::Poll(s, t)
        }
        GetConsumerOffset(target) => {
            let (s, t) = topic(&target.stream, &target.topic)?;
            Action::Poll(s, t)
        }
        Lifecycle(l) => {
            use super::lifecycle::Lifecycle as L;
            match l {
                L::UpdateStream { stream: s, .. } | L::PurgeStream(s) => {
                    Action::ManageStream(stream(s)?)
                }
                L::UpdateTopic {
                    stream: s,
                    topic: t,
                    ..
                }
                | L::DeleteTopic {
                    stream: s,
                    topic: t,
                }
                | L::PurgeTopic {
                    stream: s,
                    topic: t,
                }
                | L::CreatePartitions {
                    stream: s,
                    topic: t,
                    ..
                }
                | L::DeletePartitions {
                    stream: s,
                    topic: t,
                    ..
                } => {
                    let (s, t) = topic(s, t)?;
                    Action::ManageTopic(s, t)
                }
            }
        }
        DeleteConsumerOffset(delete) => {
            let (s, t) = topic(&delete.target.stream, &delete.target.topic)?;
            Action::Poll(s, t)
        }
        GetTopics(id) => Action::ReadStream(stream(id)?),
        CreateConsumerGroup {
            stream: s,
            topic: t,
            ..
        }
        | GetConsumerGroups {
            stream: s,
            topic: t,
        } => {
            let (s, t) = topic(s, t)?;
            Action::ReadTopic(s, t)
        }
        DeleteConsumerGroup(g)
        | JoinConsumerGroup(g)
        | LeaveConsumerGroup(g)
        | GetConsumerGroup(g)
        | SyncConsumerGroup(g) => {
            let (s, t) = topic(&g.stream, &g.topic)?;
            Action::ReadTopic(s, t)
        }
    })
}

/// `Ok` when `user_id` may run `request`, else the Unauthorized code (41).
pub fn authorize(request: &Request<'_>, user_id: u32, view: &MetadataView) -> Result<(), u32> {
    match required(request, user_id, view) {
        Some(action) if !allowed(user_id, view.state.accounts.get(&user_id), action) => {
            Err(super::status::UNAUTHORIZED)
        }
        _ => Ok(()),
    }
}
