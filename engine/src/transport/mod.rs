//! Transports other than the newline framer: codecs that turn a byte stream into requests.

pub(crate) mod http;
pub(crate) mod io;
pub(crate) mod websocket;
