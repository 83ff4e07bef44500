//! The `Idempotency-Key` header value, parsed.

use std::fmt;

/// A client's idempotency key: 1 to 255 printable ASCII characters (0x21-0x7E).
///
/// Accepted on the wire as a bare token or as an RFC 8941 string (`"..."`), the form the IETF
/// draft uses; the quotes are not part of the key, so both forms name the same key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the Idempotency-Key header is empty")]
    Empty,
    #[error("the Idempotency-Key header is longer than 255 characters")]
    TooLong,
    #[error("the Idempotency-Key header may only contain printable ASCII characters (0x21-0x7E)")]
    InvalidCharacter,
    #[error("the Idempotency-Key header is a malformed quoted string")]
    MalformedQuotedString,
}

impl IdempotencyKey {
    pub const MAX_LEN: usize = 255;

    /// Parses the raw header bytes.
    pub fn parse(raw: &[u8]) -> Result<Self, KeyError> {
        let key = match raw {
            [b'"', inner @ .., b'"'] => unquote(inner)?,
            [b'"', ..] => return Err(KeyError::MalformedQuotedString),
            bare => bare.to_vec(),
        };
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if key.len() > Self::MAX_LEN {
            return Err(KeyError::TooLong);
        }
        if !key.iter().all(|b| (0x21..=0x7e).contains(b)) {
            return Err(KeyError::InvalidCharacter);
        }
        // Every byte is printable ASCII, so this cannot fail.
        String::from_utf8(key).map(IdempotencyKey).map_err(|_| KeyError::InvalidCharacter)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// RFC 8941 sf-string body: `\"` and `\\` are the only escapes; a bare `"` ends the string early.
fn unquote(inner: &[u8]) -> Result<Vec<u8>, KeyError> {
    let mut out = Vec::with_capacity(inner.len());
    let mut bytes = inner.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some(&escaped @ (b'"' | b'\\')) => out.push(escaped),
                _ => return Err(KeyError::MalformedQuotedString),
            },
            b'"' => return Err(KeyError::MalformedQuotedString),
            other => out.push(other),
        }
    }
    Ok(out)
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_and_quoted_forms_are_the_same_key() {
        let bare = IdempotencyKey::parse(b"8e03978e-40d5-43e8-bc93-6894a57f9324").unwrap();
        let quoted = IdempotencyKey::parse(b"\"8e03978e-40d5-43e8-bc93-6894a57f9324\"").unwrap();
        assert_eq!(bare, quoted);
        assert_eq!(IdempotencyKey::parse(br#""a\"b\\c""#).unwrap().as_str(), r#"a"b\c"#);
    }

    #[test]
    fn length_bounds() {
        assert!(IdempotencyKey::parse(&[b'k'; 255]).is_ok());
        assert_eq!(IdempotencyKey::parse(&[b'k'; 256]), Err(KeyError::TooLong));
        assert_eq!(IdempotencyKey::parse(b""), Err(KeyError::Empty));
        assert_eq!(IdempotencyKey::parse(b"\"\""), Err(KeyError::Empty));
    }

    #[test]
    fn only_printable_ascii() {
        for bad in [&b"has space"[..], b"tab\t", "caf\u{e9}".as_bytes(), b"nul\0", b"del\x7f"] {
            assert_eq!(IdempotencyKey::parse(bad), Err(KeyError::InvalidCharacter), "{bad:?}");
        }
        assert_eq!(IdempotencyKey::parse(b"\"quoted space\""), Err(KeyError::InvalidCharacter));
    }

    #[test]
    fn malformed_quoted_strings() {
        for bad in [&b"\"open"[..], b"\"a\"b\"", b"\"bad\\escape\"", b"\"trailing\\\""] {
            assert_eq!(IdempotencyKey::parse(bad), Err(KeyError::MalformedQuotedString), "{bad:?}");
        }
    }

    mod properties {
        use proptest::prelude::*;

        use super::super::*;

        proptest! {
            #[test]
            fn any_bytes_parse_or_are_refused_without_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
                if let Ok(key) = IdempotencyKey::parse(&bytes) {
                    let text = key.as_str();
                    prop_assert!((1..=255).contains(&text.len()));
                    prop_assert!(text.bytes().all(|b| (0x21..=0x7e).contains(&b)));
                }
            }

            // A bare key may not start with `"`: that is the quoted form.
            #[test]
            fn printable_keys_parse_bare_and_quoted_to_the_same_key(key in "[!#-~][!-~]{0,254}") {
                let bare = IdempotencyKey::parse(key.as_bytes()).unwrap();
                prop_assert_eq!(bare.as_str(), key.as_str());
                let quoted = format!("\"{}\"", key.replace('\\', "\\\\").replace('"', "\\\""));
                prop_assert_eq!(IdempotencyKey::parse(quoted.as_bytes()).unwrap(), bare);
            }
        }
    }
}
