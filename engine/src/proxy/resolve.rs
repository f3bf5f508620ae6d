//! Upstream names resolved off the upstream thread: `getaddrinfo` blocks (for seconds
//! when a DNS server is slow or gone), and the upstream thread serves every upstream
//! connection. A name is resolved once when the proxy starts, and again on a thread of
//! its own after a connection to it fails (it may have moved); connections use the
//! last address found.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::Shared;
use crate::client::address::Address;

/// Where an upstream's name last resolved to.
#[derive(Default)]
pub(crate) struct Resolved {
    addr: Mutex<Option<SocketAddr>>,
    /// A resolution is under way.
    busy: AtomicBool,
}

impl Resolved {
    /// The last address found, if any.
    pub(crate) fn get(&self) -> Option<SocketAddr> {
        *self
            .addr
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn set(&self, addr: SocketAddr) {
        *self
            .addr
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(addr);
    }
}

/// The `host:port` of a TCP or HTTP address (`None` for a Unix socket).
pub(crate) fn host_port(address: &Address) -> Option<&str> {
    match address {
        Address::Tcp(hostport) => Some(hostport),
        Address::Http { authority, .. } | Address::Ws { authority, .. } => Some(authority),
        Address::Unix(_) => None,
    }
}

/// Resolves `host_port` to its first address (blocking).
pub(crate) fn resolve(host_port: &str) -> io::Result<SocketAddr> {
    host_port
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "the name has no address"))
}

/// Resolves upstream `u`'s name again on a thread of its own, unless one is already
/// doing so; an IP address is not looked up again.
pub(crate) fn again(shared: &Arc<Shared>, u: usize) {
    let up = &shared.upstreams[u];
    let Some(name) = host_port(&up.address) else {
        return;
    };
    if name.parse::<SocketAddr>().is_ok() || up.resolved.busy.swap(true, Ordering::AcqRel) {
        return;
    }
    let shared = Arc::clone(shared);
    let spawned = std::thread::Builder::new()
        .name("ringrpc-resolve".into())
        .spawn(move || {
            let up = &shared.upstreams[u];
            if let Some(name) = host_port(&up.address) {
                match resolve(name) {
                    Ok(addr) => up.resolved.set(addr),
                    Err(e) => tracing::warn!("proxy: resolving {}: {e}", up.url),
                }
            }
            up.resolved.busy.store(false, Ordering::Release);
        });
    if spawned.is_err() {
        up.resolved.busy.store(false, Ordering::Release);
    }
}

/// The address found for `address` when the proxy starts (`None`: not yet, logged;
/// it is looked up again when connecting).
pub(crate) fn first(url: &str, address: &Address) -> Resolved {
    let r = Resolved::default();
    if let Some(name) = host_port(address) {
        match resolve(name) {
            Ok(addr) => r.set(addr),
            Err(e) => tracing::warn!("proxy: resolving {url}: {e}"),
        }
    }
    r
}
