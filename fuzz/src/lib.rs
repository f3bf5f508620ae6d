//! The `structured` target's input: JSON-RPC requests and batches described with
//! `arbitrary`, mostly valid and often slightly wrong (a wrong version, a missing or
//! repeated member, params of the wrong shape, ids of every type, numbers at the edges,
//! escaped strings, a byte or two edited), rendered to JSON text by [`Input::render`].
//!
//! Shared by `fuzz_targets/structured.rs` and `examples/render_structured.rs`, which
//! writes the rendered corpus that the stable replay test reads.

use arbitrary::Arbitrary;

/// One frame: a document, how it is spaced, and byte edits applied to the text.
#[derive(Arbitrary, Debug)]
pub struct Input {
    doc: Doc,
    ws: Ws,
    edits: Vec<Edit>,
}

#[derive(Arbitrary, Debug)]
enum Doc {
    Single(Req),
    Batch(Vec<Elem>),
    Value(Val),
}

#[derive(Arbitrary, Debug)]
enum Elem {
    Req(Req),
    Value(Val),
}

#[derive(Arbitrary, Debug)]
struct Req {
    version: Version,
    method: Method,
    params: Params,
    id: IdV,
    /// Unknown or repeated members, each inserted at a position.
    extra: Vec<(u8, Member)>,
    /// Rotates the member order.
    rotate: u8,
}

#[derive(Arbitrary, Debug)]
enum Member {
    Unknown(Str, Val),
    Jsonrpc(Version),
    Method(Method),
    Params(Params),
    Id(IdV),
}

#[derive(Arbitrary, Debug)]
enum Version {
    Ok,
    Escaped,
    Missing,
    Wrong(Str),
    NotString(Val),
}

#[derive(Arbitrary, Debug)]
enum Method {
    Known(Known, Esc),
    Name(Str),
    Missing,
    NotString(Val),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Known {
    Subtract,
    Sum,
    Add,
    GetData,
    Ping,
    Echo,
    Sleep,
    Update,
    NotifyHello,
    NotifySum,
    Foobar,
    RpcDiscover,
}

impl Known {
    fn name(self) -> &'static str {
        match self {
            Known::Subtract => "subtract",
            Known::Sum => "sum",
            Known::Add => "add",
            Known::GetData => "get_data",
            Known::Ping => "ping",
            Known::Echo => "echo",
            Known::Sleep => "sleep",
            Known::Update => "update",
            Known::NotifyHello => "notify_hello",
            Known::NotifySum => "notify_sum",
            Known::Foobar => "foobar",
            Known::RpcDiscover => "rpc.discover",
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Params {
    Absent,
    Pair(Int, Int),
    Named {
        minuend: Option<Int>,
        subtrahend: Option<Int>,
        extra: Vec<(Str, Val)>,
        swap: bool,
    },
    Ints(Vec<Int>),
    /// `sleep`'s params: only 0 ms, or invalid, so nothing waits.
    SleepZero(bool),
    SleepBad(Val),
    Array(Vec<Val>),
    Object(Vec<(Str, Val)>),
    Scalar(Val),
}

#[derive(Arbitrary, Debug)]
enum IdV {
    Absent,
    Null,
    Int(i64),
    UInt(u64),
    Small(i8),
    Str(Str),
    Float(f64),
    Lit(NumLit),
    Bad(Val),
}

#[derive(Arbitrary, Debug)]
enum Int {
    Small(i8),
    Any(i64),
    Lit(NumLit),
}

/// Number literals at the edges of the engine's reading.
#[derive(Arbitrary, Debug)]
enum NumLit {
    MinusZero,
    MinusZeroFloat,
    U64Max,
    U64MaxPlus1,
    I64Max,
    I64MaxPlus1,
    I64Min,
    I64MinMinus1,
    BigInt(u8),
    F64Max,
    /// Rounds to `f64::MAX` (serde_json refuses it).
    F64MaxRoundsDown,
    /// Rounds to infinity (serde_json reads it as `f64::MAX`).
    F64MaxRoundsUp,
    Overflow,
    Subnormal,
    Underflow,
    Exp(i32, i16, bool),
    Frac(u32, u32),
}

impl NumLit {
    fn text(&self) -> String {
        match self {
            NumLit::MinusZero => "-0".into(),
            NumLit::MinusZeroFloat => "-0.0".into(),
            NumLit::U64Max => u64::MAX.to_string(),
            NumLit::U64MaxPlus1 => "18446744073709551616".into(),
            NumLit::I64Max => i64::MAX.to_string(),
            NumLit::I64MaxPlus1 => "9223372036854775808".into(),
            NumLit::I64Min => i64::MIN.to_string(),
            NumLit::I64MinMinus1 => "-9223372036854775809".into(),
            NumLit::BigInt(n) => format!("1{}", "0".repeat(usize::from(*n) + 19)),
            NumLit::F64Max => "1.7976931348623157e308".into(),
            NumLit::F64MaxRoundsDown => "1.7976931348623158e308".into(),
            NumLit::F64MaxRoundsUp => "1.79769313486231581e308".into(),
            NumLit::Overflow => "1e400".into(),
            NumLit::Subnormal => "5e-324".into(),
            NumLit::Underflow => "1e-400".into(),
            NumLit::Exp(m, e, upper) => format!("{m}{}{e}", if *upper { 'E' } else { 'e' }),
            NumLit::Frac(i, f) => format!("{i}.{f}"),
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Val {
    Null,
    True,
    False,
    Int(i64),
    UInt(u64),
    Float(f64),
    Lit(NumLit),
    Str(Str),
    Array(Vec<Val>),
    Object(Vec<(Str, Val)>),
}

/// A string and how it is escaped.
#[derive(Arbitrary, Debug)]
struct Str {
    text: String,
    esc: Esc,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Esc {
    /// Only what must be escaped.
    Plain,
    /// Every character as `\uXXXX` (surrogate pairs above the BMP).
    Unicode,
    /// Short escapes where they exist, `\/` for `/`.
    Short,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Ws {
    None,
    Space,
    Newline,
    Tab,
    CrLf,
}

#[derive(Arbitrary, Debug)]
struct Edit {
    at: u16,
    op: EditOp,
}

#[derive(Arbitrary, Debug)]
enum EditOp {
    Insert(u8),
    Delete,
    Replace(u8),
}

impl Input {
    /// The frame's bytes.
    pub fn render(&self) -> Vec<u8> {
        let mut w = W {
            out: Vec::new(),
            ws: self.ws,
        };
        match &self.doc {
            Doc::Single(r) => w.req(r),
            Doc::Batch(elems) => {
                w.open(b'[');
                for (i, e) in elems.iter().enumerate() {
                    if i > 0 {
                        w.punct(b',');
                    }
                    match e {
                        Elem::Req(r) => w.req(r),
                        Elem::Value(v) => w.val(v),
                    }
                }
                w.punct(b']');
            }
            Doc::Value(v) => w.val(v),
        }
        let mut out = w.out;
        // At most two edits: near-valid text, not noise.
        for e in self.edits.iter().take(2) {
            let at = usize::from(e.at) % (out.len() + 1);
            match e.op {
                EditOp::Insert(b) => out.insert(at, b),
                EditOp::Delete if at < out.len() => {
                    out.remove(at);
                }
                EditOp::Replace(b) if at < out.len() => out[at] = b,
                _ => {}
            }
        }
        out
    }
}

struct W {
    out: Vec<u8>,
    ws: Ws,
}

impl W {
    fn space(&mut self) {
        let s: &[u8] = match self.ws {
            Ws::None => b"",
            Ws::Space => b" ",
            Ws::Newline => b"\n",
            Ws::Tab => b"\t",
            Ws::CrLf => b"\r\n",
        };
        self.out.extend_from_slice(s);
    }

    fn open(&mut self, b: u8) {
        self.out.push(b);
        self.space();
    }

    fn punct(&mut self, b: u8) {
        self.space();
        self.out.push(b);
        self.space();
    }

    fn member(&mut self, first: &mut bool, key: &Str, value: impl FnOnce(&mut Self)) {
        if !*first {
            self.punct(b',');
        }
        *first = false;
        self.str(key);
        self.punct(b':');
        value(self);
    }

    fn req(&mut self, r: &Req) {
        // Each member as rendered text, so the order can be changed.
        let mut members: Vec<Vec<u8>> = Vec::new();
        let mut one = |f: &dyn Fn(&mut W)| {
            let mut w = W {
                out: Vec::new(),
                ws: self.ws,
            };
            f(&mut w);
            members.push(w.out);
        };
        if !matches!(r.version, Version::Missing) {
            one(&|w| w.member_version(&r.version));
        }
        if !matches!(r.method, Method::Missing) {
            one(&|w| w.member_method(&r.method));
        }
        if !matches!(r.params, Params::Absent) {
            one(&|w| w.member_params(&r.params));
        }
        if !matches!(r.id, IdV::Absent) {
            one(&|w| w.member_id(&r.id));
        }
        for (at, m) in &r.extra {
            let mut w = W {
                out: Vec::new(),
                ws: self.ws,
            };
            match m {
                Member::Unknown(k, v) => {
                    w.str(k);
                    w.punct(b':');
                    w.val(v);
                }
                Member::Jsonrpc(v) => w.member_version(v),
                Member::Method(m) => w.member_method(m),
                Member::Params(p) => w.member_params(p),
                Member::Id(id) => w.member_id(id),
            }
            if !w.out.is_empty() {
                let at = usize::from(*at) % (members.len() + 1);
                members.insert(at, w.out);
            }
        }
        if !members.is_empty() {
            let n = usize::from(r.rotate) % members.len();
            members.rotate_left(n);
        }
        self.open(b'{');
        for (i, m) in members.iter().enumerate() {
            if i > 0 {
                self.punct(b',');
            }
            self.out.extend_from_slice(m);
        }
        self.punct(b'}');
    }

    fn key(&mut self, k: &str) {
        self.raw_str(k, Esc::Plain);
        self.punct(b':');
    }

    fn member_version(&mut self, v: &Version) {
        match v {
            Version::Missing => {}
            Version::Ok => {
                self.key("jsonrpc");
                self.raw_str("2.0", Esc::Plain);
            }
            Version::Escaped => {
                self.raw_str("jsonrpc", Esc::Unicode);
                self.punct(b':');
                self.raw_str("2.0", Esc::Unicode);
            }
            Version::Wrong(s) => {
                self.key("jsonrpc");
                self.str(s);
            }
            Version::NotString(v) => {
                self.key("jsonrpc");
                self.val(v);
            }
        }
    }

    fn member_method(&mut self, m: &Method) {
        match m {
            Method::Missing => {}
            Method::Known(k, esc) => {
                self.key("method");
                self.raw_str(k.name(), *esc);
            }
            Method::Name(s) => {
                self.key("method");
                self.str(s);
            }
            Method::NotString(v) => {
                self.key("method");
                self.val(v);
            }
        }
    }

    fn member_params(&mut self, p: &Params) {
        if matches!(p, Params::Absent) {
            return;
        }
        self.key("params");
        match p {
            Params::Absent => {}
            Params::Pair(a, b) => {
                self.open(b'[');
                self.int(a);
                self.punct(b',');
                self.int(b);
                self.punct(b']');
            }
            Params::Named {
                minuend,
                subtrahend,
                extra,
                swap,
            } => {
                let mut fields: Vec<(&str, &Int)> = Vec::new();
                if let Some(m) = minuend {
                    fields.push(("minuend", m));
                }
                if let Some(s) = subtrahend {
                    fields.push(("subtrahend", s));
                }
                if *swap {
                    fields.reverse();
                }
                self.open(b'{');
                let mut first = true;
                for (k, v) in fields {
                    if !first {
                        self.punct(b',');
                    }
                    first = false;
                    self.key(k);
                    self.int(v);
                }
                for (k, v) in extra {
                    self.member(&mut first, k, |w| w.val(v));
                }
                self.punct(b'}');
            }
            Params::Ints(v) => {
                self.open(b'[');
                for (i, x) in v.iter().enumerate() {
                    if i > 0 {
                        self.punct(b',');
                    }
                    self.int(x);
                }
                self.punct(b']');
            }
            Params::SleepZero(named) => {
                if *named {
                    self.open(b'{');
                    self.key("ms");
                    self.out.push(b'0');
                    self.punct(b'}');
                } else {
                    self.out.extend_from_slice(b"[0]");
                }
            }
            Params::SleepBad(v) => {
                self.open(b'{');
                self.key("ms");
                self.val(v);
                self.punct(b'}');
            }
            Params::Array(v) => self.val_array(v),
            Params::Object(m) => self.val_object(m),
            Params::Scalar(v) => self.val(v),
        }
    }

    fn member_id(&mut self, id: &IdV) {
        if matches!(id, IdV::Absent) {
            return;
        }
        self.key("id");
        match id {
            IdV::Absent => {}
            IdV::Null => self.out.extend_from_slice(b"null"),
            IdV::Int(i) => self.out.extend_from_slice(i.to_string().as_bytes()),
            IdV::UInt(u) => self.out.extend_from_slice(u.to_string().as_bytes()),
            IdV::Small(i) => self.out.extend_from_slice(i.to_string().as_bytes()),
            IdV::Str(s) => self.str(s),
            IdV::Float(f) => self.float(*f),
            IdV::Lit(l) => self.out.extend_from_slice(l.text().as_bytes()),
            IdV::Bad(v) => self.val(v),
        }
    }

    fn int(&mut self, i: &Int) {
        let text = match i {
            Int::Small(i) => i.to_string(),
            Int::Any(i) => i.to_string(),
            Int::Lit(l) => l.text(),
        };
        self.out.extend_from_slice(text.as_bytes());
    }

    fn float(&mut self, f: f64) {
        // Rust's `{:?}` is the shortest round-trip form, `1e300` or `0.1`.
        let text = if f.is_finite() {
            format!("{f:?}")
        } else {
            "0".into()
        };
        self.out.extend_from_slice(text.as_bytes());
    }

    fn val(&mut self, v: &Val) {
        match v {
            Val::Null => self.out.extend_from_slice(b"null"),
            Val::True => self.out.extend_from_slice(b"true"),
            Val::False => self.out.extend_from_slice(b"false"),
            Val::Int(i) => self.out.extend_from_slice(i.to_string().as_bytes()),
            Val::UInt(u) => self.out.extend_from_slice(u.to_string().as_bytes()),
            Val::Float(f) => self.float(*f),
            Val::Lit(l) => self.out.extend_from_slice(l.text().as_bytes()),
            Val::Str(s) => self.str(s),
            Val::Array(items) => self.val_array(items),
            Val::Object(members) => self.val_object(members),
        }
    }

    fn val_array(&mut self, items: &[Val]) {
        self.open(b'[');
        for (i, v) in items.iter().enumerate() {
            if i > 0 {
                self.punct(b',');
            }
            self.val(v);
        }
        self.punct(b']');
    }

    fn val_object(&mut self, members: &[(Str, Val)]) {
        self.open(b'{');
        let mut first = true;
        for (k, v) in members {
            self.member(&mut first, k, |w| w.val(v));
        }
        self.punct(b'}');
    }

    fn str(&mut self, s: &Str) {
        self.raw_str(&s.text, s.esc);
    }

    fn raw_str(&mut self, s: &str, esc: Esc) {
        self.out.push(b'"');
        for c in s.chars() {
            let short = match c {
                '"' => Some("\\\""),
                '\\' => Some("\\\\"),
                '\n' => Some("\\n"),
                '\r' => Some("\\r"),
                '\t' => Some("\\t"),
                '\u{8}' => Some("\\b"),
                '\u{c}' => Some("\\f"),
                '/' if matches!(esc, Esc::Short) => Some("\\/"),
                _ => None,
            };
            match (esc, short) {
                (Esc::Unicode, _) => {
                    for unit in c.encode_utf16(&mut [0; 2]) {
                        self.out
                            .extend_from_slice(format!("\\u{unit:04x}").as_bytes());
                    }
                }
                (_, Some(s)) => self.out.extend_from_slice(s.as_bytes()),
                (_, None) if c < ' ' => self
                    .out
                    .extend_from_slice(format!("\\u{:04X}", u32::from(c)).as_bytes()),
                (_, None) => {
                    let mut buf = [0; 4];
                    self.out
                        .extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
            }
        }
        self.out.push(b'"');
    }
}
