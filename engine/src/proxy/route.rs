//! Which upstream group a method goes to: `PATTERN=GROUP` rules, first match wins.

use rustc_hash::FxHashMap;

/// A method pattern: an exact name, or a prefix followed by `*`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Pattern {
    /// The whole name.
    Exact(Box<str>),
    /// Names starting with this (`*` alone: every name).
    Prefix(Box<str>),
}

impl Pattern {
    /// `eth_*` is a prefix, anything else an exact name (a `*` elsewhere is a literal).
    pub(crate) fn parse(s: &str) -> Self {
        match s.strip_suffix('*') {
            Some(prefix) => Self::Prefix(prefix.into()),
            None => Self::Exact(s.into()),
        }
    }

    /// Whether `method` matches.
    pub(crate) fn matches(&self, method: &str) -> bool {
        match self {
            Self::Exact(name) => **name == *method,
            Self::Prefix(prefix) => method.starts_with(&**prefix),
        }
    }
}

/// Patterns in order, each with a value (a group index, or a method class); the first
/// matching pattern decides. Exact names before the first prefix pattern are found by
/// one hash lookup, so a long list of exact routes costs no more than a short one.
#[derive(Clone, Debug)]
pub(crate) struct Rules<T> {
    /// Exact names that come before any prefix pattern (a later duplicate loses).
    exact: FxHashMap<Box<str>, T>,
    /// Every rule from the first prefix pattern on, in order.
    rest: Vec<(Pattern, T)>,
}

impl<T: Copy> Rules<T> {
    /// The rules, in the order given.
    pub(crate) fn new(rules: impl IntoIterator<Item = (Pattern, T)>) -> Self {
        let mut exact = FxHashMap::default();
        let mut rest = Vec::new();
        for (pattern, value) in rules {
            match pattern {
                Pattern::Exact(name) if rest.is_empty() => {
                    exact.entry(name).or_insert(value);
                }
                other => rest.push((other, value)),
            }
        }
        Self { exact, rest }
    }

    /// The value of the first rule `method` matches.
    pub(crate) fn find(&self, method: &str) -> Option<T> {
        if let Some(&v) = self.exact.get(method) {
            return Some(v);
        }
        self.rest
            .iter()
            .find(|(p, _)| p.matches(method))
            .map(|&(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_match_wins() {
        let rules = Rules::new(
            [
                ("eth_call", 0),
                ("eth_*", 1),
                ("eth_getLogs", 2), // shadowed by eth_*
                ("debug_*", 3),
                ("*", 4),
            ]
            .map(|(p, v)| (Pattern::parse(p), v)),
        );
        assert_eq!(rules.find("eth_call"), Some(0));
        assert_eq!(rules.find("eth_getLogs"), Some(1));
        assert_eq!(rules.find("debug_trace"), Some(3));
        assert_eq!(rules.find("net_version"), Some(4));
        assert_eq!(rules.find(""), Some(4));
        let none = Rules::new([(Pattern::parse("a"), 0)]);
        assert_eq!(none.find("b"), None);
        assert_eq!(none.find("a"), Some(0));
        assert!(Pattern::parse("a*b").matches("a*b"));
        assert!(!Pattern::parse("a*b").matches("axb"));
    }
}
