//! The serializer: responses and batch arrays written straight into a caller-provided,
//! reused output buffer.

pub(crate) mod batch;
pub(crate) mod json;
#[cfg(feature = "client")]
pub(crate) mod request;
pub(crate) mod response;

pub use response::ResultWriter;
