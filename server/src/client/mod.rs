//! The client plane's data layer (client-plane.md): the field encodings ([`codec`]), the
//! supported requests and how every other command is answered ([`request`]), the reply bodies
//! ([`reply`]), the error codes ([`status`]) and what the receiving shard does with each
//! request ([`route`]); the node-level answers ([`answers`]). Pure functions over bytes: no sockets, no
//! sessions, no clocks. Every decode of client bytes returns a typed error, never panics.

pub mod answers;
pub mod codec;
pub mod groups;
pub mod lifecycle;
pub mod permit;
pub mod reply;
pub mod request;
pub mod route;
pub mod status;
pub mod user_answers;
pub mod users;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod users_tests;
