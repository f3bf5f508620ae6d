//! The key file (`--auth-file`, TOML): who may call, what, and how often.
//!
//! ```toml
//! [[key]]
//! name  = "ops"          # the identity handlers and logs see
//! token = "s3cret-ops"   # or token_sha256 = "hex…", so the file need not hold secrets
//! allow = ["*"]          # method patterns: exact names or a trailing *
//! rate  = 1000           # calls per second (optional)
//! burst = 2000
//!
//! [[peer]]               # Unix-socket peers allowed by user id, without a token
//! uid   = 1000
//! name  = "local"
//! allow = ["get_*"]
//!
//! [weights]              # what a call costs against rate limits (default 1)
//! sum = 5
//! ```
//!
//! Tokens are kept only as their SHA-256: a presented token is hashed and looked up, and
//! the digests compared in constant time, so neither the file's secrets nor the timing
//! of a comparison tell anything about other keys.

use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::rate::{Bucket, Rate};
use super::GuardError;

/// What an identity may call: exact method names and name prefixes (a pattern ending
/// in `*`). Empty allows nothing (fail closed).
#[derive(Debug, Default)]
pub(crate) struct Allow {
    /// `["*"]`: everything.
    all: bool,
    exact: FxHashSet<Box<str>>,
    prefixes: Vec<Box<str>>,
}

impl Allow {
    /// The patterns of a key's `allow` list.
    pub(crate) fn new(patterns: &[String]) -> Result<Self, String> {
        let mut allow = Self::default();
        for p in patterns {
            match p.strip_suffix('*') {
                Some("") => allow.all = true,
                Some(prefix) if prefix.contains('*') => {
                    return Err(format!("pattern {p:?}: `*` may only end a pattern"))
                }
                Some(prefix) => allow.prefixes.push(prefix.into()),
                None if p.contains('*') => {
                    return Err(format!("pattern {p:?}: `*` may only end a pattern"))
                }
                None if p.is_empty() => return Err("an empty method pattern".into()),
                None => {
                    allow.exact.insert(p.as_str().into());
                }
            }
        }
        Ok(allow)
    }

    /// Everything.
    pub(crate) fn everything() -> Self {
        Self {
            all: true,
            ..Self::default()
        }
    }

    /// Whether `method` may be called.
    #[inline]
    pub(crate) fn allows(&self, method: &str) -> bool {
        self.all
            || (!self.exact.is_empty() && self.exact.contains(method))
            || self.prefixes.iter().any(|p| method.starts_with(&**p))
    }
}

/// An authenticated caller: its name, what it may call, and its own rate limit.
#[derive(Debug)]
pub(crate) struct Principal {
    pub(crate) name: Arc<str>,
    /// The de-duplication store's hash of `name` ([`crate::dedup::Identity`]), made once.
    pub(crate) dedup_state: u64,
    pub(crate) allow: Allow,
    /// The key's `rate`/`burst`, with its bucket (kept across reloads by name).
    pub(crate) limit: Option<(Rate, Arc<Bucket>)>,
}

/// A loaded key file.
#[derive(Debug, Default)]
pub(crate) struct Keys {
    /// By SHA-256 of the token.
    tokens: FxHashMap<[u8; 32], Arc<Principal>>,
    uids: FxHashMap<u32, Arc<Principal>>,
    weights: FxHashMap<Box<str>, u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    key: Vec<KeyEntry>,
    #[serde(default)]
    peer: Vec<PeerEntry>,
    #[serde(default)]
    weights: FxHashMap<String, u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyEntry {
    name: String,
    token: Option<String>,
    token_sha256: Option<String>,
    #[serde(default)]
    allow: Vec<String>,
    rate: Option<f64>,
    burst: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PeerEntry {
    uid: u32,
    name: String,
    #[serde(default)]
    allow: Vec<String>,
    rate: Option<f64>,
    burst: Option<u32>,
}

/// SHA-256 of a token.
pub(crate) fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

fn unhex(text: &str) -> Option<[u8; 32]> {
    let text = text.trim();
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in text.as_bytes().chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

/// A key file's TOML error, told without the file's text: toml's own message quotes the
/// line it is on, and serde's name the value they could not take, either of which may
/// be a token (a misspelt `token` field, a token in the wrong field). The line number,
/// and the message with every quoted string in it elided.
fn syntax_error(text: &str, e: &toml::de::Error) -> GuardError {
    let line = e
        .span()
        .and_then(|r| text.get(..r.start))
        .map(|before| before.matches('\n').count() + 1);
    let mut message = String::with_capacity(e.message().len());
    let mut quoted = false;
    for c in e.message().chars() {
        if c == '"' {
            quoted = !quoted;
            message.push_str(if quoted { "\"…" } else { "\"" });
        } else if !quoted {
            message.push(c);
        }
    }
    GuardError::KeyFile(match line {
        Some(line) => format!("line {line}: {}", message.trim()),
        None => message.trim().to_owned(),
    })
}

impl Keys {
    /// Parses a key file's text. `old` is the file loaded before (a reload): identities
    /// of the same name keep their rate-limit buckets, so a reload is no way around a
    /// limit.
    pub(crate) fn parse(text: &str, old: Option<&Keys>) -> Result<Self, GuardError> {
        let file: File = toml::from_str(text).map_err(|e| syntax_error(text, &e))?;
        let bad = |what: String| GuardError::KeyFile(what);
        let old_buckets: FxHashMap<&str, &Arc<Bucket>> = old
            .into_iter()
            .flat_map(|k| k.tokens.values().chain(k.uids.values()))
            .filter_map(|p| p.limit.as_ref().map(|(_, b)| (&*p.name, b)))
            .collect();
        let principal = |name: &str,
                         allow: &[String],
                         rate: Option<f64>,
                         burst: Option<u32>|
         -> Result<Arc<Principal>, GuardError> {
            if name.is_empty() || name.chars().any(char::is_control) {
                return Err(bad(format!(
                    "key name {name:?}: empty or with control characters"
                )));
            }
            let allow = Allow::new(allow).map_err(|e| bad(format!("key {name:?}: {e}")))?;
            let limit = match (rate, burst) {
                (None, None) => None,
                (None, Some(_)) => {
                    return Err(bad(format!("key {name:?}: `burst` without `rate`")))
                }
                (Some(rate), burst) => {
                    let burst = burst.unwrap_or_else(|| Rate::default_burst(rate));
                    let rate =
                        Rate::new(rate, burst).map_err(|e| bad(format!("key {name:?}: {e}")))?;
                    let bucket = old_buckets
                        .get(name)
                        .map_or_else(|| Arc::new(Bucket::new()), |b| Arc::clone(b));
                    Some((rate, bucket))
                }
            };
            Ok(Arc::new(Principal {
                name: name.into(),
                dedup_state: crate::dedup::Identity::new(name).state,
                allow,
                limit,
            }))
        };
        let mut keys = Keys::default();
        let mut names = FxHashSet::default();
        for k in &file.key {
            if !names.insert(k.name.as_str()) {
                return Err(bad(format!("key name {:?} appears twice", k.name)));
            }
            let hash = match (&k.token, &k.token_sha256) {
                (Some(t), None) if !t.is_empty() => digest(t.as_bytes()),
                (None, Some(h)) => unhex(h).ok_or_else(|| {
                    bad(format!(
                        "key {:?}: token_sha256 must be 64 hex digits",
                        k.name
                    ))
                })?,
                (Some(_), Some(_)) => {
                    return Err(bad(format!(
                        "key {:?}: give `token` or `token_sha256`, not both",
                        k.name
                    )))
                }
                _ => {
                    return Err(bad(format!(
                        "key {:?}: no `token` or `token_sha256`",
                        k.name
                    )))
                }
            };
            let p = principal(&k.name, &k.allow, k.rate, k.burst)?;
            if keys.tokens.insert(hash, p).is_some() {
                return Err(bad(format!(
                    "key {:?}: the same token as another key",
                    k.name
                )));
            }
        }
        for peer in &file.peer {
            if !names.insert(peer.name.as_str()) {
                return Err(bad(format!("peer name {:?} appears twice", peer.name)));
            }
            let p = principal(&peer.name, &peer.allow, peer.rate, peer.burst)?;
            if keys.uids.insert(peer.uid, p).is_some() {
                return Err(bad(format!("peer uid {} appears twice", peer.uid)));
            }
        }
        // A weight above a key's burst would make the method uncallable for that key:
        // a mistake, said at load time rather than as endless -32005s.
        let smallest = keys
            .tokens
            .values()
            .chain(keys.uids.values())
            .filter_map(|p| p.limit.as_ref().map(|(rate, _)| (rate.burst(), &p.name)))
            .min_by_key(|(burst, _)| *burst);
        for (method, w) in file.weights {
            if w == 0 {
                return Err(bad(format!("weight of {method:?} must be at least 1")));
            }
            if let Some((burst, name)) = smallest.filter(|(burst, _)| w > *burst) {
                return Err(bad(format!(
                    "weight {w} of {method:?} exceeds the burst {burst} of key {name:?}: it could never be called"
                )));
            }
            keys.weights.insert(method.into(), w);
        }
        Ok(keys)
    }

    /// The identity holding `token`, if any.
    pub(crate) fn by_token(&self, token: &[u8]) -> Option<&Arc<Principal>> {
        let hash = digest(token);
        let (stored, p) = self.tokens.get_key_value(&hash)?;
        // The map found it by equal digests; the constant-time check only keeps the
        // comparison itself from being a timing source.
        bool::from(stored.ct_eq(&hash)).then_some(p)
    }

    /// The identity allowed for a Unix-socket peer of user `uid`.
    pub(crate) fn by_uid(&self, uid: u32) -> Option<&Arc<Principal>> {
        self.uids.get(&uid)
    }

    /// What a call to `method` costs against rate limits.
    #[inline]
    pub(crate) fn weight(&self, method: &str) -> u32 {
        if self.weights.is_empty() {
            1
        } else {
            self.weights.get(method).copied().unwrap_or(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
        [[key]]
        name  = "ops"
        token = "s3cret-ops"
        allow = ["*"]
        rate  = 1000
        burst = 2000
        [[key]]
        name  = "reader"
        token_sha256 = "4a5d0d1e5bb3b35a4d0c6e1f3e9c8a8e1c8f3b6e0a7d0b1c2d3e4f5a6b7c8d9e"
        allow = ["get_*", "sum", "ping"]
        [[key]]
        name = "nobody"
        token = "n0body"
        [[peer]]
        uid = 1000
        name = "local"
        allow = ["ping"]
        [weights]
        sum = 5
    "#;

    #[test]
    fn parses_keys_peers_and_weights() {
        let keys = Keys::parse(FILE, None).unwrap();
        let ops = keys.by_token(b"s3cret-ops").unwrap();
        assert_eq!(&*ops.name, "ops");
        assert!(ops.allow.allows("anything") && ops.limit.is_some());
        assert!(keys.by_token(b"s3cret-op").is_none());
        assert!(keys.by_token(b"").is_none());
        let nobody = keys.by_token(b"n0body").unwrap();
        assert!(
            !nobody.allow.allows("ping"),
            "an empty allow list allows nothing"
        );
        assert_eq!(&*keys.by_uid(1000).unwrap().name, "local");
        assert!(keys.by_uid(0).is_none());
        assert_eq!((keys.weight("sum"), keys.weight("ping")), (5, 1));
    }

    #[test]
    fn token_sha256_matches_the_token() {
        let hex: String = digest(b"r3ader")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let text = format!("[[key]]\nname=\"r\"\ntoken_sha256=\"{hex}\"\nallow=[\"get_*\"]\n");
        let keys = Keys::parse(&text, None).unwrap();
        let r = keys.by_token(b"r3ader").unwrap();
        assert!(r.allow.allows("get_data") && !r.allow.allows("set_data"));
        assert!(
            !r.allow.allows("get"),
            "a prefix pattern needs its whole prefix"
        );
    }

    #[test]
    fn patterns() {
        let a = Allow::new(&["get_*".into(), "sum".into()]).unwrap();
        assert!(a.allows("get_") && a.allows("get_x") && a.allows("sum"));
        assert!(!a.allows("sum2") && !a.allows("ge") && !a.allows("Sum"));
        assert!(Allow::new(&["a*b".into()]).is_err());
        assert!(Allow::new(&["*a".into()]).is_err());
        assert!(Allow::new(&["".into()]).is_err());
        assert!(!Allow::default().allows(""));
    }

    #[test]
    fn bad_files_are_refused_with_a_reason() {
        for (text, want) in [
            ("[[key]]\nname=\"a\"\n", "no `token`"),
            (
                "[[key]]\nname=\"a\"\ntoken=\"x\"\ntoken_sha256=\"00\"\n",
                "not both",
            ),
            (
                "[[key]]\nname=\"a\"\ntoken_sha256=\"abc\"\n",
                "64 hex digits",
            ),
            (
                "[[key]]\nname=\"a\"\ntoken=\"x\"\n[[key]]\nname=\"a\"\ntoken=\"y\"\n",
                "appears twice",
            ),
            (
                "[[key]]\nname=\"a\"\ntoken=\"x\"\n[[key]]\nname=\"b\"\ntoken=\"x\"\n",
                "same token",
            ),
            (
                "[[key]]\nname=\"a\"\ntoken=\"x\"\nburst=3\n",
                "without `rate`",
            ),
            ("[[key]]\nname=\"a\"\ntoken=\"x\"\nrate=-1\n", "key \"a\""),
            ("[[key]]\nname=\"a\"\ntoken=\"x\"\nalow=[]\n", "alow"),
            ("[weights]\nsum=0\n", "at least 1"),
            (
                "[[key]]\nname=\"a\"\ntoken=\"x\"\nrate=1\nburst=2\n[weights]\nsum=3\n",
                "exceeds the burst 2",
            ),
            ("[[key]\n", "TOML"),
        ] {
            let e = Keys::parse(text, None).unwrap_err().to_string();
            assert!(e.contains(want) || want == "TOML", "{text:?}: {e}");
        }
    }

    /// A token in the wrong place is not in the error (which the server prints): toml
    /// quotes the offending line, serde the value it could not take.
    #[test]
    fn errors_never_hold_a_token() {
        for (text, want) in [
            (
                "[[key]]\nname=\"a\"\ntokne = \"s3cret-ops\"\n",
                "line 3: unknown field `tokne`",
            ),
            (
                "[[key]]\nname=\"a\"\ntoken=\"x\"\nrate = \"s3cret-ops\"\n",
                "line 4",
            ),
            ("[[key]]\nname=\"a\"\ntoken = \"s3cret-ops\\q\"\n", "line 3"),
            ("[[key]]\nname=\"a\"\ntoken = \"s3cret-ops\n", "line 3"),
            (
                "[[peer]]\nname=\"p\"\nuid=1\ntoken = \"s3cret-ops\"\n",
                "line 4",
            ),
        ] {
            let e = Keys::parse(text, None).unwrap_err().to_string();
            assert!(!e.contains("s3cret"), "{text:?}: {e}");
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn a_reload_keeps_buckets_by_name() {
        let a = Keys::parse(FILE, None).unwrap();
        let b = Keys::parse(FILE, Some(&a)).unwrap();
        let (pa, pb) = (
            a.by_token(b"s3cret-ops").unwrap(),
            b.by_token(b"s3cret-ops").unwrap(),
        );
        assert!(Arc::ptr_eq(
            &pa.limit.as_ref().unwrap().1,
            &pb.limit.as_ref().unwrap().1
        ));
    }
}
