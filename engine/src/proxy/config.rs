//! The proxy's settings from a TOML file (`--config FILE`): everything the builder
//! takes, so a deployment can keep its routes and method classes in one place.
//!
//! ```toml
//! connections = 2              # per upstream
//! reactor_connections = true   # and one per upstream of each reactor's own
//! upstream_timeout_ms = 30000
//! coalesce = true
//! cache_bytes = 67108864
//! idempotent = ["eth_call", "eth_get*"]
//!
//! [[upstream]]
//! group = "default"
//! url = "http://10.0.0.5:8545/"
//!
//! [[upstream]]
//! group = "archive"
//! url = "tcp://10.0.0.9:7700"
//!
//! [[route]]
//! pattern = "debug_*"
//! group = "archive"
//!
//! [[cache]]
//! pattern = "eth_chainId"
//! ttl_ms = 60000
//!
//! [[subscription]]
//! subscribe = "eth_subscribe"
//! notification = "eth_subscription"
//! unsubscribe = "eth_unsubscribe"
//! ```
//!
//! Unknown keys are refused (a typo must not be ignored silently).

use std::time::Duration;

use serde::Deserialize;

use super::{ProxyBuilder, ProxyError};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    connections: Option<usize>,
    reactor_connections: Option<bool>,
    upstream_timeout_ms: Option<u64>,
    coalesce: Option<bool>,
    cache_bytes: Option<usize>,
    max_answer_bytes: Option<usize>,
    hedge_after_ms: Option<u64>,
    hedge_max: Option<f64>,
    hedge_quantile: Option<f64>,
    health_interval_ms: Option<u64>,
    batch_max: Option<usize>,
    subscription_queue: Option<usize>,
    #[serde(default)]
    idempotent: Vec<String>,
    #[serde(default)]
    upstream: Vec<Upstream>,
    #[serde(default)]
    route: Vec<Route>,
    #[serde(default)]
    cache: Vec<Cache>,
    #[serde(default)]
    subscription: Vec<Subscription>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Subscription {
    subscribe: String,
    notification: String,
    unsubscribe: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Upstream {
    group: String,
    url: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Route {
    pattern: String,
    group: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Cache {
    pattern: String,
    ttl_ms: u64,
}

impl ProxyBuilder {
    /// Adds the settings of a TOML text (the format is in docs/PROXY.md, "Configuration
    /// file"):
    /// upstreams, routes, idempotent patterns and caches are appended to what the
    /// builder has; scalar settings replace its values.
    ///
    /// # Errors
    ///
    /// [`ProxyError::Config`] naming what is wrong (syntax, unknown keys, types).
    pub fn toml(&mut self, text: &str) -> Result<&mut Self, ProxyError> {
        let f: File = toml::from_str(text).map_err(|e| ProxyError::Config(e.to_string()))?;
        if let Some(n) = f.connections {
            self.connections(n);
        }
        if let Some(on) = f.reactor_connections {
            self.reactor_connections(on);
        }
        if let Some(ms) = f.upstream_timeout_ms {
            self.timeout(Duration::from_millis(ms.max(1)));
        }
        if let Some(on) = f.coalesce {
            self.coalesce(on);
        }
        if let Some(n) = f.cache_bytes {
            self.cache_bytes(n);
        }
        if let Some(n) = f.max_answer_bytes {
            self.max_answer_bytes(n);
        }
        match (f.hedge_after_ms, f.hedge_quantile) {
            (Some(_), Some(_)) => {
                return Err(ProxyError::Config(
                    "hedge_after_ms and hedge_quantile: give one or the other".into(),
                ))
            }
            (Some(ms), None) => {
                self.hedge(Duration::from_millis(ms), f.hedge_max.unwrap_or(0.1));
            }
            (None, Some(q)) if (0.0..=1.0).contains(&q) => {
                self.hedge_quantile(q, f.hedge_max.unwrap_or(0.1));
            }
            (None, Some(q)) => {
                return Err(ProxyError::Config(format!(
                    "hedge_quantile = {q}: a quantile is between 0 and 1"
                )))
            }
            (None, None) => {}
        }
        if let Some(n) = f.batch_max {
            self.batch_max(n);
        }
        if let Some(ms) = f.health_interval_ms {
            self.health_interval(Duration::from_millis(ms));
        }
        for p in &f.idempotent {
            self.idempotent(p);
        }
        for u in &f.upstream {
            self.upstream(&u.group, &u.url);
        }
        for r in &f.route {
            self.route(&r.pattern, &r.group);
        }
        for c in &f.cache {
            self.cache(&c.pattern, Duration::from_millis(c.ttl_ms));
        }
        for s in &f.subscription {
            self.subscription(&s.subscribe, &s.notification, &s.unsubscribe);
        }
        if let Some(n) = f.subscription_queue {
            self.subscription_queue(n);
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::super::Proxy;

    #[test]
    fn a_file_sets_everything_and_typos_are_refused() {
        let text = r#"
            connections = 3
            upstream_timeout_ms = 500
            coalesce = false
            hedge_quantile = 0.95
            health_interval_ms = 0
            batch_max = 7
            idempotent = ["get_*"]
            [[upstream]]
            group = "default"
            url = "tcp://127.0.0.1:1"
            [[upstream]]
            group = "b"
            url = "http://127.0.0.1:2/rpc"
            [[route]]
            pattern = "b_*"
            group = "b"
            [[cache]]
            pattern = "get_chain"
            ttl_ms = 1000
            [[subscription]]
            subscribe = "subscribe_ticks"
            notification = "tick"
            unsubscribe = "unsubscribe_ticks"
        "#;
        let mut b = Proxy::builder();
        b.toml(text).unwrap();
        assert_eq!(b.connections, 3);
        assert_eq!(b.upstreams.len(), 2);
        assert_eq!(b.routes, [("b_*".to_owned(), "b".to_owned())]);
        assert!(!b.coalesce);
        assert_eq!(b.cache.len(), 1);
        assert_eq!(
            b.hedge,
            Some((super::super::HedgeAfter::Quantile(0.95), 0.1))
        );
        assert_eq!(b.health, None, "0 turns health checks off");
        assert_eq!(b.batch_max, Some(7));
        assert_eq!(
            b.subscriptions,
            [(
                "subscribe_ticks".to_owned(),
                "tick".to_owned(),
                "unsubscribe_ticks".to_owned()
            )]
        );
        // A subscription routed to an HTTP upstream is refused when the proxy starts.
        let mut b = Proxy::builder();
        b.toml(
            r#"
            [[upstream]]
            group = "default"
            url = "tcp://127.0.0.1:1"
            [[upstream]]
            group = "web"
            url = "http://127.0.0.1:2/"
            [[route]]
            pattern = "eth_*"
            group = "web"
            [[subscription]]
            subscribe = "eth_subscribe"
            notification = "eth_subscription"
            unsubscribe = "eth_unsubscribe"
            "#,
        )
        .unwrap();
        let e = b.start().unwrap_err().to_string();
        assert!(
            e.contains("eth_subscribe")
                && e.contains("http://127.0.0.1:2/")
                && e.contains("tcp://"),
            "{e}"
        );
        let mut b = Proxy::builder();
        b.upstream("default", "tcp://127.0.0.1:1")
            .subscription("s", "n", "s");
        assert!(
            b.start().is_err(),
            "subscribe and unsubscribe are one method"
        );
        let mut b = Proxy::builder();
        let e = b.toml("hedge_quantile = 95").unwrap_err().to_string();
        assert!(e.contains("between 0 and 1"), "{e}");
        let mut b = Proxy::builder();
        let e = b
            .toml("hedge_quantile = 0.9\nhedge_after_ms = 5")
            .unwrap_err()
            .to_string();
        assert!(e.contains("one or the other"), "{e}");
        let mut b = Proxy::builder();
        let e = b.toml("conections = 3").unwrap_err().to_string();
        assert!(e.contains("conections"), "{e}");
        let mut b = Proxy::builder();
        assert!(b.toml("[[route]]\npattern = 1\ngroup = \"x\"").is_err());
    }
}
