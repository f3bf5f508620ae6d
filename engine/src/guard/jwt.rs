//! TEMPORARY STUB (replaced by the jwt branch).
#![allow(dead_code, missing_docs, clippy::all)]
use std::path::Path;
#[derive(Debug, thiserror::Error)]
pub(crate) enum JwtError {
    #[error("bad")]
    Bad,
}
pub(crate) struct JwtSecret {
    key: [u8; 32],
}
impl JwtSecret {
    pub(crate) fn load(_p: &Path) -> Result<Self, JwtError> {
        Err(JwtError::Bad)
    }
}
pub(crate) struct Claims {
    pub(crate) iat: u64,
    pub(crate) exp: Option<u64>,
    pub(crate) sub: Option<Box<str>>,
}
#[derive(Default)]
pub(crate) struct JwtCache {
    c: Option<Claims>,
}
impl JwtCache {
    pub(crate) fn check(
        &mut self,
        _s: &JwtSecret,
        _t: &[u8],
        _n: u64,
    ) -> Result<&Claims, JwtError> {
        Err(JwtError::Bad)
    }
}
pub(crate) fn now_unix() -> u64 {
    0
}
