//! JSON Web Tokens (HS256) for `--jwt-secret`, as go-ethereum's authenticated engine API
//! uses them: a 32-byte shared secret in a hex file, a token signed with HMAC-SHA256 whose
//! `iat` is within 60 s of the server's clock, optionally an `exp`, and `sub` as the
//! caller's name. A keep-alive connection that sends the same token again is answered
//! from a [`JwtCache`] without another HMAC.

// The server's `--jwt-secret` is not wired yet; until it is, only the tests use this.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde_json::{Map, Value};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// The longest token accepted, in bytes; longer ones are refused before any decoding.
pub(crate) const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// How far `iat` may be from the server's clock, either way, in seconds.
pub(crate) const IAT_WINDOW_SECS: u64 = 60;

/// Gives every loaded secret its own number, so a cache never serves a token verified
/// under another secret (a reloaded one, say).
static NEXT_SECRET_ID: AtomicU64 = AtomicU64::new(0);

/// The shared secret, held as HMAC-SHA256's keyed state, so that each verification
/// starts from it instead of hashing the key again.
#[derive(Clone)]
pub(crate) struct JwtSecret {
    /// HMAC keyed with the secret, not yet fed any message.
    mac: Hmac<Sha256>,
    /// This secret's number (from `NEXT_SECRET_ID`).
    id: u64,
}

// The key never reaches a log.
impl fmt::Debug for JwtSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JwtSecret(<redacted>)")
    }
}

impl JwtSecret {
    /// Reads a secret written as 64 hex digits, with an optional `0x` and surrounding
    /// whitespace.
    pub(crate) fn from_hex(text: &str) -> Result<Self, JwtError> {
        let text = text.trim();
        let digits = text
            .strip_prefix("0x")
            .or_else(|| text.strip_prefix("0X"))
            .unwrap_or(text);
        // HMAC pads a key shorter than SHA-256's 64-byte block with zeros (RFC 2104), so
        // the padded block is the same key, and `new` takes it without a fallible length.
        let (mut block, mut len) = ([0u8; 64], 0);
        for (at, c) in digits.chars().enumerate() {
            let nibble = c
                .to_digit(16)
                .ok_or(JwtError::Secret(SecretProblem::NotHex(at)))?;
            if let Some(byte) = block[..32].get_mut(at / 2) {
                *byte = *byte << 4 | nibble as u8;
            }
            len = at + 1;
        }
        if len != 64 {
            return Err(JwtError::Secret(SecretProblem::Length(len)));
        }
        Ok(Self {
            mac: <Hmac<Sha256> as hmac::digest::KeyInit>::new(&block.into()),
            id: NEXT_SECRET_ID.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// Reads the secret from a file (see [`JwtSecret::from_hex`]); errors name the file.
    pub(crate) fn load(path: &Path) -> Result<Self, JwtError> {
        let text =
            std::fs::read_to_string(path).map_err(|e| JwtError::SecretIo(path.to_owned(), e))?;
        Self::from_hex(&text).map_err(|e| match e {
            JwtError::Secret(problem) => JwtError::SecretFile(path.to_owned(), problem),
            other => other,
        })
    }

    /// HMAC-SHA256 of `message` under this secret, ready to finalize or verify.
    fn mac(&self, message: &[u8]) -> Hmac<Sha256> {
        #[cfg(test)]
        tests::HMACS.with(|n| n.set(n.get() + 1));
        let mut mac = self.mac.clone();
        mac.update(message);
        mac
    }
}

/// What a verified token says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Claims {
    /// When it was issued, in seconds since the Unix epoch.
    pub(crate) iat: u64,
    /// When it expires, if it says.
    pub(crate) exp: Option<u64>,
    /// Who it names (the caller's identity), if it says.
    pub(crate) sub: Option<Box<str>>,
}

impl Claims {
    /// Whether the token is still good at `now`: `iat` within the window, before `exp`.
    fn check_time(&self, now: u64) -> Result<(), JwtError> {
        if now.abs_diff(self.iat) > IAT_WINDOW_SECS {
            return Err(JwtError::IatWindow { iat: self.iat, now });
        }
        match self.exp {
            Some(exp) if now >= exp => Err(JwtError::Expired { exp, now }),
            _ => Ok(()),
        }
    }
}

/// The seconds since the Unix epoch now (0 if the clock is set before it).
pub(crate) fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Verifies an HS256 token (without `Bearer `) against `secret` at `now_unix`.
pub(crate) fn verify(secret: &JwtSecret, token: &[u8], now_unix: u64) -> Result<Claims, JwtError> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(JwtError::TooLong(token.len()));
    }
    let mut parts = token.split(|&b| b == b'.');
    let (Some(header_part), Some(payload), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(JwtError::Parts(token.split(|&b| b == b'.').count()));
    };
    // The header first: it says how the token is signed, and only HS256 is accepted.
    let header = json_object(header_part, "header")?;
    if header.get("alg").and_then(Value::as_str) != Some("HS256") {
        return Err(JwtError::Alg);
    }
    if header.get("typ").is_some_and(|typ| *typ != "JWT") {
        return Err(JwtError::Typ);
    }
    // RFC 7515 §4.1.11: a recipient refuses extensions it must understand, and we know none.
    if header.contains_key("crit") {
        return Err(JwtError::Crit);
    }
    let signature = decode(signature, "signature")?;
    let signed = &token[..header_part.len() + 1 + payload.len()];
    secret
        .mac(signed)
        .verify_slice(&signature)
        .map_err(|_| JwtError::Signature)?;
    // The payload is parsed only once it is known to come from a holder of the secret.
    let payload = json_object(payload, "payload")?;
    let iat = integer(&payload, "iat")?.ok_or(JwtError::IatMissing)?;
    let exp = integer(&payload, "exp")?;
    let sub = match payload.get("sub") {
        None => None,
        Some(Value::String(sub)) => Some(sub.as_str().into()),
        Some(_) => return Err(JwtError::SubNotString),
    };
    let claims = Claims { iat, exp, sub };
    claims.check_time(now_unix)?;
    Ok(claims)
}

/// Decodes one part: base64url, no padding, no stray bits.
fn decode(part: &[u8], which: &'static str) -> Result<Vec<u8>, JwtError> {
    URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|_| JwtError::Base64(which))
}

/// Decodes one part as a JSON object.
fn json_object(part: &[u8], which: &'static str) -> Result<Map<String, Value>, JwtError> {
    match serde_json::from_slice(&decode(part, which)?) {
        Ok(Value::Object(map)) => Ok(map),
        _ => Err(JwtError::NotObject(which)),
    }
}

/// A claim that, if present, is a non-negative integer (not a float, not a string).
fn integer(payload: &Map<String, Value>, name: &'static str) -> Result<Option<u64>, JwtError> {
    payload
        .get(name)
        .map(|v| v.as_u64().ok_or(JwtError::NotInteger(name)))
        .transpose()
}

/// A connection's last verified token: the same bytes again cost a constant-time
/// comparison and the time check, not an HMAC.
#[derive(Debug, Default)]
pub(crate) struct JwtCache {
    /// The token's bytes (the allocation is reused for the next one).
    token: Vec<u8>,
    /// Its claims (meaningless while `secret_id` is `None`).
    claims: Claims,
    /// The secret it was verified under; `None` until a token verifies.
    secret_id: Option<u64>,
}

impl JwtCache {
    /// Verifies `token` as [`verify`] does, unless it is the token last verified here
    /// under the same secret; then only its time window is checked again.
    pub(crate) fn check(
        &mut self,
        secret: &JwtSecret,
        token: &[u8],
        now_unix: u64,
    ) -> Result<&Claims, JwtError> {
        let hit =
            self.secret_id == Some(secret.id) && bool::from(self.token.as_slice().ct_eq(token));
        if !hit {
            // Replaced only once the new token verifies: a bad one leaves the old entry.
            self.claims = verify(secret, token, now_unix)?;
            self.token.clear();
            self.token.extend_from_slice(token);
            self.secret_id = Some(secret.id);
        }
        self.claims.check_time(now_unix)?;
        Ok(&self.claims)
    }
}

/// What is wrong with a secret's text (never the text itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SecretProblem {
    /// Not 64 hex digits.
    #[error("expected 64 hex digits (32 bytes), found {0}")]
    Length(usize),
    /// A character that is not a hex digit (its position after any `0x`, in characters).
    #[error("the character at position {0} is not a hex digit")]
    NotHex(usize),
}

/// Why a secret could not be loaded or a token was refused. No message holds the token
/// or the secret, nor a value from a header that was not verified.
#[derive(Debug, thiserror::Error)]
pub(crate) enum JwtError {
    /// The secret file (named) could not be read (the `io::Error` is in the message).
    #[error("cannot read the JWT secret file {path}: {1}", path = .0.display())]
    SecretIo(PathBuf, std::io::Error),
    /// The secret file (named) does not hold a secret.
    #[error("the JWT secret file {path}: {1}", path = .0.display())]
    SecretFile(PathBuf, SecretProblem),
    /// The secret's text is not a secret.
    #[error("the JWT secret: {0}")]
    Secret(SecretProblem),
    /// The token is longer than [`MAX_TOKEN_BYTES`].
    #[error("the token is {0} bytes long, over the limit of {MAX_TOKEN_BYTES}")]
    TooLong(usize),
    /// The token has not three parts.
    #[error("a token has three parts separated by dots, this one has {0}")]
    Parts(usize),
    /// A part (named) is not base64url without padding.
    #[error("the token's {0} is not base64url without padding")]
    Base64(&'static str),
    /// The header or payload (named) is not a JSON object.
    #[error("the token's {0} is not a JSON object")]
    NotObject(&'static str),
    /// The header's `alg` is missing or not `HS256`.
    #[error("the token's alg is not \"HS256\"")]
    Alg,
    /// The header's `typ` is present and not `JWT`.
    #[error("the token's typ is not \"JWT\"")]
    Typ,
    /// The header has a `crit` member.
    #[error("the token has a crit header member, and no extension is supported")]
    Crit,
    /// The signature is not the HMAC of the header and payload under the secret.
    #[error("the token's signature does not match the secret")]
    Signature,
    /// The payload has no `iat`.
    #[error("the token has no iat claim")]
    IatMissing,
    /// A time claim is not a non-negative integer.
    #[error("the token's {0} claim is not a non-negative integer")]
    NotInteger(&'static str),
    /// `sub` is not a string.
    #[error("the token's sub claim is not a string")]
    SubNotString,
    /// `iat` is more than [`IAT_WINDOW_SECS`] from now.
    #[error(
        "the token's iat ({iat}) is more than {IAT_WINDOW_SECS} s from the server's clock ({now})"
    )]
    IatWindow {
        /// The token's `iat`.
        iat: u64,
        /// The server's time.
        now: u64,
    },
    /// `now` is at or after `exp`.
    #[error("the token expired at {exp} (the server's clock says {now})")]
    Expired {
        /// The token's `exp`.
        exp: u64,
        /// The server's time.
        now: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    thread_local! {
        /// HMACs computed on this thread, so the cache tests can see one is skipped.
        pub(super) static HMACS: Cell<u32> = const { Cell::new(0) };
    }

    // Made by PyJWT 2.15.1 with key K = bytes(range(32)) and I = 1700000000, e.g.
    //   python3 -c 'import jwt; print(jwt.encode({"iat": 1700000000, "sub": "alice"}, bytes(range(32)), algorithm="HS256"))'
    const SECRET_HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const I: u64 = 1_700_000_000;
    // jwt.encode({"iat": I, "sub": "alice"}, K, algorithm="HS256")
    const GOOD: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJpYXQiOjE3MDAwMDAwMDAsInN1YiI6ImFsaWNlIn0.rZqyNbcckIGJljg6nfoJ_vLyKEk4cKYO0giQnwCXToY";
    // jwt.encode({"iat": I, "exp": I + 30}, K, algorithm="HS256")
    const EXP: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJpYXQiOjE3MDAwMDAwMDAsImV4cCI6MTcwMDAwMDAzMH0.xAIrdCVN8ZhLi1-9cD0Mu2Ux2hjy3BGNzyaX_JehoIQ";
    // jwt.encode({"iat": I, "sub": "alice"}, bytes(range(1, 33)), algorithm="HS256")
    const OTHER_KEY: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJpYXQiOjE3MDAwMDAwMDAsInN1YiI6ImFsaWNlIn0.CQtcizJ48VVDNJsABi6ulipdJTXx42XQLyIut0ojhLg";
    // jwt.encode({"iat": I, "sub": "alice"}, K, algorithm="HS512")
    const HS512: &str = "eyJhbGciOiJIUzUxMiIsInR5cCI6IkpXVCJ9.eyJpYXQiOjE3MDAwMDAwMDAsInN1YiI6ImFsaWNlIn0.W4JfGHrmLgQBifRQ02OSQHmPAENvQDsm6RSSctTKy0M6O0VXoGch-MS9RvCuHkjuGT2nPgG9Wt8hcqjhhH35PA";
    // jwt.encode({"iat": I, "sub": "alice"}, None, algorithm="none")
    const NONE: &str =
        "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJpYXQiOjE3MDAwMDAwMDAsInN1YiI6ImFsaWNlIn0.";
    // jwt.encode({"iat": I}, K, algorithm="HS256", headers={"alg": None})  ("alg": null)
    const ALG_NULL: &str = "eyJhbGciOm51bGwsInR5cCI6IkpXVCJ9.eyJpYXQiOjE3MDAwMDAwMDB9.jJa6stKW59kcHY6mJ3CaeWz3A87WImp9WkMAvmeEmck";
    // No alg at all (PyJWT always writes one), by the standard library:
    //   b=lambda s:base64.urlsafe_b64encode(s).rstrip(b"="); m=b(b'{"typ":"JWT"}')+b"."+b(b'{"iat":1700000000}')
    //   print(m+b"."+b(hmac.digest(K, m, hashlib.sha256)))
    const NO_ALG: &str =
        "eyJ0eXAiOiJKV1QifQ.eyJpYXQiOjE3MDAwMDAwMDB9.JEKf_d2esW2YHJlRQdxmmxSj3aDm9oHIPZ3lFS1meTo";
    // jwt.encode({"iat": I}, K, algorithm="HS256", headers={"typ": "JWS"})
    const TYP: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXUyJ9.eyJpYXQiOjE3MDAwMDAwMDB9.zuIMqgDA7LX878hMPcI2EXQN1fg05RdF_8SilaOIPt4";
    // jwt.encode({"iat": I}, K, algorithm="HS256", headers={"crit": ["b64"], "b64": True})
    const CRIT: &str = "eyJhbGciOiJIUzI1NiIsImNyaXQiOlsiYjY0Il0sInR5cCI6IkpXVCJ9.eyJpYXQiOjE3MDAwMDAwMDB9.9NSRug6DeqmaSutMJDzVWbqAnH8F8IhPRERbUrLifT4";
    // jwt.api_jws.encode(b"[1700000000]", K, algorithm="HS256")
    const ARRAY: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.WzE3MDAwMDAwMDBd.Idznc5RmPcVXy_S8cvr4SWjyvQt1Blr-6kLuMtxEeyI";
    // jwt.encode({"sub": "alice"}, K, algorithm="HS256")
    const NO_IAT: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJhbGljZSJ9.lfXaIzINpl07cPEvzpqEwyp3eHyfv0amRrLq_-BFWvs";
    // jwt.api_jws.encode(b'{"iat":"1700000000"}', K, algorithm="HS256")
    const IAT_STR: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJpYXQiOiIxNzAwMDAwMDAwIn0.yOoguvfZ0_FhQvFxQY2YruYb0aNuydtMPiJdOo8cah8";
    // jwt.api_jws.encode(b'{"iat":1700000000.5}', K, algorithm="HS256")
    const IAT_FLOAT: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJpYXQiOjE3MDAwMDAwMDAuNX0.rIPXB3cgZEZMdoyyHqk1AIXoeYn5brwm2umS6H-1mtw";
    // jwt.api_jws.encode(b'{"iat":1700000000,"sub":7}', K, algorithm="HS256")
    const SUB_NUM: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJpYXQiOjE3MDAwMDAwMDAsInN1YiI6N30.Jlm9i21e5NFIrcpoMIcxoxexrx01ZhNedHBtWqrbBZA";
    // jwt.api_jws.encode(b'{"iat":1700000000,"exp":"soon"}', K, algorithm="HS256")
    const EXP_STR: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJpYXQiOjE3MDAwMDAwMDAsImV4cCI6InNvb24ifQ.Jmn89Nac1PYq61p5G5cyu90kONC9JAJWirVHQSExzC4";

    fn secret() -> JwtSecret {
        JwtSecret::from_hex(SECRET_HEX).expect("the test secret")
    }

    fn check(token: &str, now: u64) -> Result<Claims, JwtError> {
        verify(&secret(), token.as_bytes(), now)
    }

    #[test]
    fn accepts_pyjwt_tokens_within_the_window() {
        let alice = Some("alice".into());
        for now in [I - 60, I, I + 60] {
            let claims = check(GOOD, now).expect("good token");
            assert_eq!(
                (claims.iat, claims.exp, claims.sub),
                (I, None, alice.clone())
            );
        }
        let claims = check(EXP, I + 29).expect("not yet expired");
        assert_eq!((claims.exp, claims.sub), (Some(I + 30), None));
        assert!(now_unix() > I);
    }

    #[test]
    fn refuses_each_bad_token_for_its_reason() {
        let (signed, sig) = GOOD.rsplit_once('.').expect("three parts");
        #[rustfmt::skip]
        let cases: Vec<(String, u64, &str)> = vec![
            (OTHER_KEY.into(), I, "Signature"),
            (NONE.into(), I, "Alg"),
            (HS512.into(), I, "Alg"),
            (ALG_NULL.into(), I, "Alg"),
            (NO_ALG.into(), I, "Alg"),
            (TYP.into(), I, "Typ"),
            (CRIT.into(), I, "Crit"),
            (GOOD.into(), I + 61, "IatWindow { iat: 1700000000, now: 1700000061 }"),
            (GOOD.into(), I - 61, "IatWindow { iat: 1700000000, now: 1699999939 }"),
            (EXP.into(), I + 30, "Expired { exp: 1700000030, now: 1700000030 }"),
            (ARRAY.into(), I, r#"NotObject("payload")"#),
            (NO_IAT.into(), I, "IatMissing"),
            (IAT_STR.into(), I, r#"NotInteger("iat")"#),
            (IAT_FLOAT.into(), I, r#"NotInteger("iat")"#),
            (EXP_STR.into(), I, r#"NotInteger("exp")"#),
            (SUB_NUM.into(), I, "SubNotString"),
            (signed.into(), I, "Parts(2)"),
            (format!("{GOOD}.x"), I, "Parts(4)"),
            // Padding; `/` (base64's, not base64url's); neither; one character changed;
            // the last character's two unused bits set (`Y` 011000, `Z` 011001).
            (format!("{GOOD}="), I, r#"Base64("signature")"#),
            (GOOD.replace('_', "/"), I, r#"Base64("signature")"#),
            (GOOD.replacen("eyJ", "e!J", 1), I, r#"Base64("header")"#),
            (format!("{signed}.s{}", &sig[1..]), I, "Signature"),
            (format!("{}Z", &GOOD[..GOOD.len() - 1]), I, r#"Base64("signature")"#),
            ("a".repeat(MAX_TOKEN_BYTES + 1), I, "TooLong(8193)"),
        ];
        for (token, now, want) in cases {
            let error = check(&token, now).expect_err(&token);
            assert_eq!(format!("{error:?}"), want, "{token}");
            let message = error.to_string();
            assert!(
                !message.contains("eyJ") && !message.contains("0102"),
                "{message}"
            );
        }
        assert_eq!(format!("{:?}", secret()), "JwtSecret(<redacted>)");
    }

    #[test]
    fn the_cache_skips_the_hmac_only_for_the_same_bytes_and_secret() {
        let (secret, other) = (
            secret(),
            JwtSecret::from_hex(&"01".repeat(32)).expect("other"),
        );
        let mut cache = JwtCache::default();
        // The verdict (its iat or its error) and the HMACs it took.
        let mut run = |secret: &JwtSecret, token: &str, now: u64| {
            let before = HMACS.with(Cell::get);
            let verdict = cache.check(secret, token.as_bytes(), now).map(|c| c.iat);
            (format!("{verdict:?}"), HMACS.with(Cell::get) - before)
        };
        let ok = |hmacs| ("Ok(1700000000)".to_string(), hmacs);
        assert_eq!(run(&secret, GOOD, I), ok(1));
        // The same bytes again: no HMAC, across the whole window...
        for now in [I, I + 60, I - 60] {
            assert_eq!(run(&secret, GOOD, now), ok(0));
        }
        // ...and refused once out of it, still without one.
        let late = run(&secret, GOOD, I + 61);
        assert_eq!((late.0.starts_with("Err(IatWindow"), late.1), (true, 0));
        // Same length, other signature: verified and refused; the entry stays.
        assert_eq!(run(&secret, OTHER_KEY, I), ("Err(Signature)".into(), 1));
        assert_eq!(run(&secret, GOOD, I), ok(0));
        // The same bytes under another secret are verified again.
        assert_eq!(run(&other, GOOD, I), ("Err(Signature)".into(), 1));
        // A new token replaces the entry.
        assert_eq!(run(&secret, EXP, I), ok(1));
        assert_eq!(run(&secret, EXP, I), ok(0));
        assert_eq!(run(&secret, GOOD, I), ok(1));
    }

    #[test]
    fn secret_text_and_files() {
        let key = |text: &str| JwtSecret::from_hex(text).map(|s| verify(&s, GOOD.as_bytes(), I));
        let up = SECRET_HEX.to_uppercase();
        #[rustfmt::skip]
        let good = [SECRET_HEX, &format!("  0x{SECRET_HEX}\n"), &format!("\t0X{up} ")];
        for good in good {
            assert!(matches!(key(good), Ok(Ok(_))), "{good}");
        }
        let bad_digit = format!("0x{}g{}", &SECRET_HEX[..10], &SECRET_HEX[11..]);
        let cases = [
            (&SECRET_HEX[2..], "Length(62)"),
            (&format!("{SECRET_HEX}00"), "Length(66)"),
            (" \n", "Length(0)"),
            (&bad_digit, "NotHex(10)"),
            (&format!("0x 0x{SECRET_HEX}"), "NotHex(0)"),
            (&format!("0x{}é", &SECRET_HEX[1..]), "NotHex(63)"),
        ];
        for (text, want) in cases {
            let error = key(text).map(|_| ()).expect_err(text);
            assert_eq!(format!("{error:?}"), format!("Secret({want})"));
        }

        let dir = std::env::temp_dir().join(format!("ringrpc-jwt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let (good, short) = (dir.join("good"), dir.join("short"));
        std::fs::write(&good, format!("0x{SECRET_HEX}\n")).expect("write");
        std::fs::write(&short, "0xabcd\n").expect("write");
        let loaded = JwtSecret::load(&good).expect("loads");
        assert!(verify(&loaded, GOOD.as_bytes(), I).is_ok());
        let message = JwtSecret::load(&short).expect_err("short").to_string();
        let want = "short: expected 64 hex digits (32 bytes), found 4";
        assert!(
            message.ends_with(want) && !message.contains("abcd"),
            "{message}"
        );
        let error = JwtSecret::load(&dir.join("missing")).expect_err("missing");
        assert!(matches!(&error, JwtError::SecretIo(path, _) if path.ends_with("missing")));
        let message = error.to_string();
        assert!(
            message.starts_with("cannot read the JWT secret file"),
            "{message}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
