//! The seeded word hashing the rate limiter's peer table and the de-duplication store's
//! keys share: each word mixed in by one multiply, its 128-bit product folded in half
//! (foldhash's mixing step). With a secret multiplier a caller cannot aim its keys at
//! another's.

/// `x × y` as 128 bits, its halves folded together.
#[inline(always)]
pub(crate) fn fold(x: u64, y: u64) -> u64 {
    let p = u128::from(x) * u128::from(y);
    (p as u64) ^ (p >> 64) as u64
}
