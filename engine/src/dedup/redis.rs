//! The Redis de-duplication store (feature `redis`): being written.
