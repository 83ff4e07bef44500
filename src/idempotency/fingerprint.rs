//! The request fingerprint a key is bound to: SHA-256 over the method, the route and a canonical
//! form of the JSON body.
//!
//! Canonical means: object keys sorted by their UTF-8 bytes, no insignificant whitespace, strings
//! re-escaped one way, numbers kept as the exact text the client sent (serde_json's
//! `arbitrary_precision`), so re-serialising the same intent yields the same fingerprint while
//! `1.5` and `1.50` remain different requests. Sorting is done here rather than relying on
//! serde_json's map order, which a feature flag elsewhere in the build could change.

use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// Fingerprint of `method route body`; `body` is `None` for a request without one, which
    /// counts the same as an empty object.
    pub fn of_request(method: &str, route: &str, body: Option<&Value>) -> Self {
        let mut canonical = Vec::with_capacity(256);
        canonical.extend_from_slice(method.as_bytes());
        canonical.push(b' ');
        canonical.extend_from_slice(route.as_bytes());
        canonical.push(b'\n');
        match body {
            Some(value) => write_canonical(value, &mut canonical),
            None => canonical.extend_from_slice(b"{}"),
        }
        Fingerprint(crate::crypto::sha256(&canonical))
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Fingerprint)
    }
}

/// Appends the canonical JSON text of `value` to `out`.
pub fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|(a, _), (b, _)| a.as_bytes().cmp(b.as_bytes()));
            out.push(b'{');
            for (index, (key, value)) in entries.into_iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                write_string(key, out);
                out.push(b':');
                write_canonical(value, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        Value::String(s) => write_string(s, out),
        // Null, booleans and numbers (exact text) have a single compact rendering.
        scalar => out.extend_from_slice(scalar.to_string().as_bytes()),
    }
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    // serde_json escapes a given string one way only, whatever escapes the client used.
    out.extend_from_slice(Value::String(s.to_owned()).to_string().as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(body: &str) -> Fingerprint {
        let value: Value = serde_json::from_str(body).unwrap();
        Fingerprint::of_request("POST", "/orders", Some(&value))
    }

    #[test]
    fn reordered_keys_and_whitespace_do_not_matter() {
        let a = fp(r#"{"currency":"USD","items":[{"sku":"a","quantity":1,"unit_price":"1.00"}]}"#);
        let b = fp(r#"{ "items" : [ { "unit_price":"1.00", "quantity":1, "sku":"a" } ],
                       "currency" : "USD" }"#);
        assert_eq!(a, b);
        assert_eq!(fp(r#"{"s":"\u0041"}"#), fp(r#"{"s":"A"}"#));
    }

    #[test]
    fn different_values_differ() {
        assert_ne!(fp(r#"{"a":1}"#), fp(r#"{"a":2}"#));
        assert_ne!(fp(r#"{"a":1.5}"#), fp(r#"{"a":1.50}"#));
        assert_ne!(fp(r#"{"a":[1,2]}"#), fp(r#"{"a":[2,1]}"#));
        assert_ne!(fp(r#"{"a":"1"}"#), fp(r#"{"a":1}"#));
    }

    #[test]
    fn method_and_route_are_bound() {
        let body: Value = serde_json::from_str("{}").unwrap();
        let post = Fingerprint::of_request("POST", "/orders", Some(&body));
        assert_ne!(post, Fingerprint::of_request("POST", "/payments", Some(&body)));
        assert_ne!(post, Fingerprint::of_request("PUT", "/orders", Some(&body)));
        assert_eq!(post, Fingerprint::of_request("POST", "/orders", None));
    }

    #[test]
    fn numbers_keep_their_exact_text() {
        let mut out = Vec::new();
        let value: Value = serde_json::from_str(r#"{"n":12345678901234567890.123456789}"#).unwrap();
        write_canonical(&value, &mut out);
        assert_eq!(out, br#"{"n":12345678901234567890.123456789}"#);
    }

    mod properties {
        use proptest::prelude::*;
        use serde_json::Value;

        use super::super::*;

        /// JSON values with numbers as exact text (integers, decimals, exponents).
        fn json_value() -> impl Strategy<Value = Value> {
            let number = prop_oneof![
                any::<i64>().prop_map(|n| n.to_string()),
                (any::<i32>(), 0_u32..1_000_000).prop_map(|(a, b)| format!("{a}.{b}")),
                (any::<i16>(), -20_i32..20).prop_map(|(a, e)| format!("{a}e{e}")),
            ]
            .prop_map(|text| serde_json::from_str::<Value>(&text).unwrap());
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                number,
                ".{0,12}".prop_map(Value::String),
            ];
            leaf.prop_recursive(4, 48, 6, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                    prop::collection::btree_map(".{0,8}", inner, 0..6)
                        .prop_map(|map| Value::Object(map.into_iter().collect())),
                ]
            })
        }

        /// Writes `value` with its object keys in reverse order and whitespace everywhere.
        fn scrambled(value: &Value, out: &mut String) {
            match value {
                Value::Object(map) => {
                    out.push_str("{ \n");
                    for (index, (key, value)) in map.iter().rev().enumerate() {
                        if index > 0 {
                            out.push_str(" ,\t");
                        }
                        out.push_str(&Value::String(key.clone()).to_string());
                        out.push_str(" : ");
                        scrambled(value, out);
                    }
                    out.push_str("\r\n}");
                }
                Value::Array(items) => {
                    out.push_str("[ ");
                    for (index, item) in items.iter().enumerate() {
                        if index > 0 {
                            out.push_str(" , ");
                        }
                        scrambled(item, out);
                    }
                    out.push_str(" ]");
                }
                other => out.push_str(&other.to_string()),
            }
        }

        fn fingerprint(text: &str) -> Fingerprint {
            let value: Value = serde_json::from_str(text).unwrap();
            Fingerprint::of_request("POST", "/orders", Some(&value))
        }

        proptest! {
            #[test]
            fn reserialising_keeps_the_fingerprint(value in json_value()) {
                let mut text = String::new();
                scrambled(&value, &mut text);
                prop_assert_eq!(fingerprint(&value.to_string()), fingerprint(&text));
                prop_assert_eq!(fingerprint(&value.to_string()), fingerprint(&serde_json::to_string_pretty(&value).unwrap()));
            }

            #[test]
            fn different_values_differ(a in json_value(), b in json_value()) {
                let (mut canonical_a, mut canonical_b) = (Vec::new(), Vec::new());
                write_canonical(&a, &mut canonical_a);
                write_canonical(&b, &mut canonical_b);
                // Numbers compare as text (1.0 is not 1), everything else by value.
                prop_assert_eq!(a == b, canonical_a == canonical_b);
                prop_assert_eq!(canonical_a == canonical_b, fingerprint(&a.to_string()) == fingerprint(&b.to_string()));
            }
        }
    }
}
