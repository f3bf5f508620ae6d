//! A serde `Deserializer` over a span of the simd-json tape.
//!
//! Strings are handed to visitors as borrowed (`visit_borrowed_str`), so `&'a str` fields
//! point into the frame. Recursion is bounded by the parser's depth limit.

use std::fmt;

use serde::de::{self, value::BorrowedStrDeserializer, IntoDeserializer, Visitor};
use serde::forward_to_deserialize_any;
use simd_json::{Node, StaticNode};

use super::tape::{elements, members, Elements, Members};

/// Why params did not deserialize (serde's message).
#[derive(Debug)]
pub(crate) struct DeError(String);

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DeError {}

impl de::Error for DeError {
    #[cold]
    fn custom<T: fmt::Display>(msg: T) -> Self {
        DeError(msg.to_string())
    }
}

/// Deserializes the value whose nodes are exactly `nodes` (`nodes[0]` and its span).
pub(crate) struct TapeDe<'a> {
    nodes: &'a [Node<'a>],
}

impl<'a> TapeDe<'a> {
    pub(crate) fn new(nodes: &'a [Node<'a>]) -> Self {
        Self { nodes }
    }

    fn head(&self) -> Result<&'a Node<'a>, DeError> {
        self.nodes
            .first()
            .ok_or_else(|| de::Error::custom("truncated value"))
    }
}

impl<'de> de::Deserializer<'de> for TapeDe<'de> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match *self.head()? {
            Node::String(s) => visitor.visit_borrowed_str(s),
            Node::Static(StaticNode::Null) => visitor.visit_unit(),
            Node::Static(StaticNode::Bool(b)) => visitor.visit_bool(b),
            Node::Static(StaticNode::I64(i)) => visitor.visit_i64(i),
            Node::Static(StaticNode::U64(u)) => visitor.visit_u64(u),
            Node::Static(StaticNode::F64(f)) => visitor.visit_f64(f),
            #[allow(unreachable_patterns)]
            Node::Static(_) => Err(de::Error::custom("unsupported number")),
            // A visitor that stops early (a 2-tuple given 3 elements) is an error, as in
            // serde_json: extra params are not silently dropped.
            Node::Array { len, .. } => {
                let mut seq = Seq(elements(self.nodes));
                let v = visitor.visit_seq(&mut seq)?;
                match seq.0.len() {
                    0 => Ok(v),
                    _ => Err(de::Error::invalid_length(len, &"fewer elements in array")),
                }
            }
            Node::Object { len, .. } => {
                let mut map = Map {
                    members: members(self.nodes),
                    value: &[],
                };
                let v = visitor.visit_map(&mut map)?;
                match map.members.len() {
                    0 => Ok(v),
                    _ => Err(de::Error::invalid_length(len, &"fewer members in object")),
                }
            }
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.head()? {
            Node::Static(StaticNode::Null) => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        match *self.head()? {
            Node::String(s) => visitor.visit_enum(BorrowedStrDeserializer::<DeError>::new(s)),
            Node::Object { len: 1, .. } => match members(self.nodes).next() {
                Some(Ok((variant, value))) => visitor.visit_enum(Enum {
                    variant,
                    value: TapeDe::new(value),
                }),
                _ => Err(de::Error::custom("malformed enum")),
            },
            _ => Err(de::Error::invalid_type(
                de::Unexpected::Other("a value that is not a string or a one-member object"),
                &"an enum",
            )),
        }
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map struct
        identifier ignored_any
    }
}

/// The elements of an array; those not yet visited are left in the walk.
struct Seq<'a>(Elements<'a>);

impl<'de> de::SeqAccess<'de> for Seq<'de> {
    type Error = DeError;

    fn next_element_seed<T: de::DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DeError> {
        match self.0.next() {
            Some(value) => seed.deserialize(TapeDe::new(value)).map(Some),
            None => Ok(None),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

/// The members of an object; keys are always strings on the tape.
struct Map<'a> {
    members: Members<'a>,
    /// The value of the member whose key was read last (serde asks for it next).
    value: &'a [Node<'a>],
}

impl<'de> de::MapAccess<'de> for Map<'de> {
    type Error = DeError;

    fn next_key_seed<K: de::DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        match self.members.next() {
            Some(Ok((key, value))) => {
                self.value = value;
                seed.deserialize(BorrowedStrDeserializer::new(key))
                    .map(Some)
            }
            Some(Err(_)) => Err(de::Error::custom("malformed object")),
            None => Ok(None),
        }
    }

    fn next_value_seed<V: de::DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, DeError> {
        seed.deserialize(TapeDe::new(self.value))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.members.len())
    }
}

/// An externally tagged enum: `{"Variant": value}`.
struct Enum<'a> {
    variant: &'a str,
    value: TapeDe<'a>,
}

impl<'de> de::EnumAccess<'de> for Enum<'de> {
    type Error = DeError;
    type Variant = TapeDe<'de>;

    fn variant_seed<V: de::DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, TapeDe<'de>), DeError> {
        let v = seed.deserialize(BorrowedStrDeserializer::<DeError>::new(self.variant))?;
        Ok((v, self.value))
    }
}

impl<'de> de::VariantAccess<'de> for TapeDe<'de> {
    type Error = DeError;

    fn unit_variant(self) -> Result<(), DeError> {
        de::Deserialize::deserialize(self)
    }

    fn newtype_variant_seed<T: de::DeserializeSeed<'de>>(
        self,
        seed: T,
    ) -> Result<T::Value, DeError> {
        seed.deserialize(self)
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, DeError> {
        de::Deserializer::deserialize_any(self, visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        de::Deserializer::deserialize_any(self, visitor)
    }
}

/// Absent params: `null` for options and unit, `[]` for sequences, `{}` for structs/maps.
pub(crate) struct AbsentDe;

const EMPTY_ARRAY: [Node<'static>; 1] = [Node::Array { len: 0, count: 0 }];
const EMPTY_OBJECT: [Node<'static>; 1] = [Node::Object { len: 0, count: 0 }];

impl<'de> de::Deserializer<'de> for AbsentDe {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_unit()
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_none()
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        TapeDe::new(&EMPTY_ARRAY).deserialize_any(visitor)
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        TapeDe::new(&EMPTY_ARRAY).deserialize_any(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        TapeDe::new(&EMPTY_OBJECT).deserialize_any(visitor)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        TapeDe::new(&EMPTY_OBJECT).deserialize_any(visitor)
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct newtype_struct tuple_struct enum
        identifier ignored_any
    }
}

impl<'de> IntoDeserializer<'de, DeError> for TapeDe<'de> {
    type Deserializer = Self;
    fn into_deserializer(self) -> Self {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use simd_json::{Buffers, Tape};

    fn with_tape<R>(json: &str, f: impl for<'a> FnOnce(&'a [Node<'a>]) -> R) -> R {
        let mut bytes = json.as_bytes().to_vec();
        let mut tape = Tape(Vec::new());
        simd_json::fill_tape(&mut bytes, &mut Buffers::default(), &mut tape).unwrap();
        f(&tape.0)
    }

    #[derive(Deserialize, Debug, PartialEq)]
    struct Sub<'a> {
        minuend: i64,
        subtrahend: i64,
        #[serde(default, borrow)]
        note: Option<&'a str>,
    }

    #[derive(Deserialize, Debug, PartialEq)]
    enum Shape {
        Dot,
        Circle(f64),
        Rect { w: u32, h: u32 },
    }

    #[test]
    fn structs_take_positional_and_named_forms() {
        let named = with_tape(r#"{"subtrahend":23,"minuend":42,"note":"hi"}"#, |n| {
            let s: Sub<'_> = Deserialize::deserialize(TapeDe::new(n)).unwrap();
            (s.minuend, s.subtrahend, s.note.map(str::to_owned))
        });
        assert_eq!(named, (42, 23, Some("hi".to_owned())));
        let pos = with_tape("[42,23]", |n| {
            let s: Sub<'_> = Deserialize::deserialize(TapeDe::new(n)).unwrap();
            (s.minuend, s.subtrahend, s.note) == (42, 23, None)
        });
        assert!(pos);
    }

    #[test]
    fn errors_name_the_problem() {
        let msg = |json: &str| {
            with_tape(json, |n| {
                Sub::deserialize(TapeDe::new(n)).unwrap_err().to_string()
            })
        };
        assert!(msg(r#"{"minuend":1}"#).contains("missing field `subtrahend`"));
        assert!(msg(r#"{"Minuend":1,"subtrahend":2}"#).contains("missing field `minuend`"));
        assert!(msg(r#"["a",2]"#).contains("invalid type: string \"a\""));
        assert!(msg(r#"[1]"#).contains("invalid length 1"));
        assert!(msg(r#"[1,2,"x",4]"#).contains("invalid length 4, expected fewer elements"));
    }

    #[test]
    fn values_enums_and_absent() {
        let v = with_tape(
            r#"[1,-2,3.5,"s\n",null,true,{"k":[{}]}, 18446744073709551615]"#,
            |n| serde_json::Value::deserialize(TapeDe::new(n)).unwrap(),
        );
        assert_eq!(
            v,
            serde_json::json!([1, -2, 3.5, "s\n", null, true, {"k": [{}]}, u64::MAX])
        );
        let shapes = with_tape(r#"["Dot",{"Circle":1.5},{"Rect":{"w":1,"h":2}}]"#, |n| {
            Vec::<Shape>::deserialize(TapeDe::new(n)).unwrap()
        });
        assert_eq!(
            shapes,
            vec![Shape::Dot, Shape::Circle(1.5), Shape::Rect { w: 1, h: 2 }]
        );
        assert_eq!(Option::<u8>::deserialize(AbsentDe).unwrap(), None);
        assert_eq!(Vec::<u8>::deserialize(AbsentDe).unwrap(), Vec::<u8>::new());
        assert!(Sub::deserialize(AbsentDe)
            .unwrap_err()
            .to_string()
            .contains("missing field"));
    }
}
