//! # ringrpc
//!
//! A zero-copy, high-throughput JSON-RPC 2.0 engine.
//!
//! A request's bytes are read once into a connection's buffer and never copied again:
//!
//! ```text
//!  read buffer (BytesMut) ──split_to──▶ frame ──simd-json, in place──▶ tape
//!        ▲                                                             │
//!   transport                                           validate (borrowed views)
//!        │                                                             ▼
//!   out (Vec<u8>) ◀──────── serializer ◀──────── handler ◀──── Registry lookup
//! ```
//!
//! - **Codec** — [`LineDecoder`] splits newline-delimited frames off the read buffer;
//!   simd-json parses each frame in place into a tape held in a reused [`Scratch`];
//!   requests are validated into borrowed views ([`Params`], [`Id`]).
//! - **Dispatch** — a [`Registry`] built before serving and then frozen; handlers get
//!   borrowed [`Params`] and return results or [`RpcError`]s.
//! - **Serializer** — responses go straight into a caller-provided, reused buffer.
//!
//! [`Engine::handle`] is the whole no-I/O path: a proxy or any other host can embed it.
//!
//! ```
//! use ringrpc::{Config, Engine, Params, Registry, RpcError};
//! use serde::Deserialize;
//!
//! #[derive(Deserialize)]
//! struct Subtract { minuend: i64, subtrahend: i64 }
//!
//! let mut methods = Registry::builder();
//! methods.method("subtract", |p: Params<'_>| -> Result<i64, RpcError> {
//!     let s: Subtract = p.parse()?; // accepts [42, 23] and {"minuend":42,"subtrahend":23}
//!     Ok(s.minuend - s.subtrahend)
//! })?;
//! let engine = Engine::new(methods.freeze(), Config::default());
//!
//! // A stream transport: bytes arrive in a read buffer, replies go out one per line.
//! let (mut decoder, mut scratch, mut out) = (engine.decoder(), engine.scratch(), Vec::new());
//! let mut buf = bytes::BytesMut::from(&br#"{"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":1}
//! {"jsonrpc":"2.0","method":"subtract","params":{"subtrahend":23,"minuend":42},"id":"a"}
//! "#[..]);
//! engine.handle_lines(&mut buf, &mut decoder, &mut scratch, &mut out);
//! assert_eq!(out, &br#"{"jsonrpc":"2.0","id":1,"result":19}
//! {"jsonrpc":"2.0","id":"a","result":19}
//! "#[..]);
//! # Ok::<(), ringrpc::RegisterError>(())
//! ```
//!
//! # Calls answered later, the call context, hooks
//!
//! A method that waits on I/O registers with [`RegistryBuilder::deferred_method`]: it
//! gets a [`Responder`] that is `Send + 'static` and answers from any thread or async
//! runtime, without holding a thread meanwhile. Handlers that want to know who calls
//! ([`Transport`], [`Peer`], HTTP [`Headers`], the id, the deadline) ask for a
//! [`Context`] ([`RegistryBuilder::method_with_ctx`]); [`Hooks`] run before and after
//! every call and batch element, on every path; [`RegistryBuilder::fallback`] catches
//! every method not registered, and [`RpcError::relay`] passes an upstream's error on
//! as it came.
//!
//! ```
//! use ringrpc::{Config, Context, Engine, Params, Registry, RpcError};
//!
//! let mut methods = Registry::builder();
//! methods
//!     .deferred_method("double_later", |_ctx, params, responder| {
//!         let [n]: [i64; 1] = match params.parse() {
//!             Ok(n) => n,
//!             Err(e) => return responder.error(e),
//!         };
//!         std::thread::spawn(move || responder.respond(Ok::<_, RpcError>(2 * n)));
//!     })?
//!     .method_with_ctx("transport", |ctx: &Context<'_>, _p: Params<'_>| {
//!         Ok::<_, RpcError>(ctx.connection().transport().as_str())
//!     })?;
//! methods.fallback(|ctx, _params, out| out.write_str(ctx.method()));
//! let engine = Engine::new(methods.freeze(), Config::default());
//!
//! let mut out = Vec::new();
//! let batch = br#"[{"jsonrpc":"2.0","method":"double_later","params":[21],"id":1},
//!                  {"jsonrpc":"2.0","method":"transport","id":2},
//!                  {"jsonrpc":"2.0","method":"anything","id":3}]"#;
//! let _ = engine.handle(batch, &mut engine.scratch(), &mut out);
//! assert_eq!(
//!     out,
//!     &br#"[{"jsonrpc":"2.0","id":1,"result":42},{"jsonrpc":"2.0","id":2,"result":"embedded"},{"jsonrpc":"2.0","id":3,"result":"anything"}]"#[..]
//! );
//! # Ok::<(), ringrpc::RegisterError>(())
//! ```
#![deny(missing_docs)]
#![warn(unreachable_pub)]
#![deny(
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc,
    unsafe_op_in_unsafe_fn
)]

pub mod access_log;
#[cfg(feature = "client")]
pub mod client;
mod codec;
mod config;
pub mod dedup;
pub mod demo;
mod dispatch;
mod engine;
mod error;
/// Checks for the fuzz targets and their replay tests (feature `fuzzing`); not a
/// stable API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod guard;
mod hash;
pub mod metrics;
#[cfg(feature = "proxy")]
pub mod proxy;
mod serializer;
pub mod server;
pub mod trace;
mod transport;

pub use codec::{Id, LineDecoder, Params};
pub use config::{defaults, Config, ServerConfig};
pub use dispatch::context::{Connection, Context, Headers, Peer, Source, Transport};
pub use dispatch::hooks::{Answered, Hooks};
pub use dispatch::registry::{Registry, RegistryBuilder};
pub use dispatch::responder::Responder;
pub use dispatch::subscription::{Lagging, Sink, SinkClosed, Subscribing, SubscriptionConfig};
pub use engine::{Engine, Outcome, Scratch};
pub use error::{AppCode, ErrorCode, FrameError, Reason, RegisterError, RpcError};
pub use serializer::ResultWriter;

/// The README's examples, compiled and run as doctests (they use the client too).
#[cfg(all(doctest, feature = "client"))]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// The error codes, as constants (see docs/PROTOCOL.md).
pub mod codes {
    pub use crate::error::{
        FINGERPRINT_MISMATCH, INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, IN_PROGRESS,
        LIMIT_EXCEEDED, METHOD_NOT_FOUND, PARSE_ERROR, PERMISSION_DENIED, REQUEST_TIMEOUT,
        RESERVED_MAX, RESERVED_MIN, RESPONSE_TOO_LARGE, SERVER_BUSY, UNAUTHENTICATED,
    };
}
