//! Protecting a service: who may call (authentication), what they may call
//! (allow-lists), and how often (rate limits), checked for every call and every batch
//! element before it runs.

pub(crate) mod jwt;
pub(crate) mod rate;
