//! The client plane's data layer (client-plane.md): the field encodings ([`codec`]), the
//! supported requests and how every other command is answered ([`request`]), the reply bodies
//! ([`reply`]) and the error codes ([`status`]). Pure functions over bytes: no sockets, no
//! sessions, no clocks. Every decode of client bytes returns a typed error, never panics.

pub mod codec;
pub mod reply;
pub mod request;
pub mod status;

#[cfg(test)]
mod tests;
