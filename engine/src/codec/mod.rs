//! The codec: frames split off the read buffer ([`LineDecoder`]), parsed in place by
//! simd-json, and validated into borrowed views ([`Params`], [`Id`]).

pub(crate) mod de;
pub(crate) mod frame;
pub(crate) mod peek;
pub(crate) mod raw;
pub(crate) mod request;
#[cfg(feature = "client")]
pub(crate) mod response;
pub(crate) mod tape;

pub use frame::LineDecoder;
pub use request::Params;
pub use tape::Id;
