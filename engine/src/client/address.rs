//! The address a client connects to: the transport is chosen by the URL's scheme.

use std::path::PathBuf;

use super::Error;

/// A parsed `tcp://`, `unix://`, `http://` or `ws://` address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Address {
    /// Newline-delimited JSON over TCP; `host:port`.
    Tcp(String),
    /// Newline-delimited JSON over a Unix stream socket.
    Unix(PathBuf),
    /// HTTP/1.1 keep-alive: `host:port` to connect to (and send as `Host`), and the path.
    Http { authority: String, path: String },
    /// WebSocket: `host:port` and the path of the handshake.
    Ws { authority: String, path: String },
}

impl Address {
    /// Parses `tcp://host:port`, `unix:///path`, `http://host[:port][/path]` or
    /// `ws://host[:port][/path]`.
    pub(crate) fn parse(url: &str) -> Result<Self, Error> {
        let bad = |why: &str| Error::Address(format!("{url:?}: {why}"));
        if let Some(rest) = url.strip_prefix("tcp://") {
            if rest.is_empty() || !rest.contains(':') || rest.contains('/') {
                return Err(bad("expected tcp://host:port"));
            }
            Ok(Self::Tcp(rest.to_owned()))
        } else if let Some(rest) = url.strip_prefix("unix://") {
            if rest.is_empty() {
                return Err(bad("expected unix:///path/to/socket"));
            }
            Ok(Self::Unix(PathBuf::from(rest)))
        } else if let Some(rest) = url.strip_prefix("ws://") {
            match Self::parse(&format!("http://{rest}")) {
                Ok(Self::Http { authority, path }) => Ok(Self::Ws { authority, path }),
                _ => Err(bad("expected ws://host[:port][/path]")),
            }
        } else if let Some(rest) = url.strip_prefix("http://") {
            let (authority, path) = match rest.find('/') {
                Some(i) => (&rest[..i], &rest[i..]),
                None => (rest, "/"),
            };
            if authority.is_empty() || path.bytes().any(|b| b <= b' ' || b == 0x7f) {
                return Err(bad("expected http://host[:port][/path]"));
            }
            // Without a port (and outside an IPv6 literal's brackets), HTTP's own.
            let authority = match authority.rfind(':') {
                Some(i) if !authority[i..].contains(']') => authority.to_owned(),
                _ => format!("{authority}:80"),
            };
            Ok(Self::Http {
                authority,
                path: path.to_owned(),
            })
        } else {
            Err(bad("the scheme must be tcp://, unix://, http:// or ws://"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_choose_the_transport() {
        assert_eq!(
            Address::parse("tcp://127.0.0.1:7700").unwrap(),
            Address::Tcp("127.0.0.1:7700".into())
        );
        assert_eq!(
            Address::parse("unix:///tmp/x.sock").unwrap(),
            Address::Unix("/tmp/x.sock".into())
        );
        assert_eq!(
            Address::parse("http://localhost:8080/rpc/v1").unwrap(),
            Address::Http {
                authority: "localhost:8080".into(),
                path: "/rpc/v1".into()
            }
        );
        assert_eq!(
            Address::parse("http://example.com").unwrap(),
            Address::Http {
                authority: "example.com:80".into(),
                path: "/".into()
            }
        );
        assert_eq!(
            Address::parse("http://[::1]").unwrap(),
            Address::Http {
                authority: "[::1]:80".into(),
                path: "/".into()
            }
        );
        for bad in [
            "",
            "tcp://",
            "tcp://host",
            "ftp://x",
            "unix://",
            "http://",
            "http://h/a b",
        ] {
            assert!(
                matches!(Address::parse(bad), Err(Error::Address(_))),
                "{bad}"
            );
        }
    }
}
