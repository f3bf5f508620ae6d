//! Rate limits: GCRA buckets per identity and a bounded table per peer address.
