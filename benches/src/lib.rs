//! Baseline JSON-RPC implementations the benches compare ringrpc against.
