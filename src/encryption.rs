//! Secrets at rest: AES-256-GCM under the keys of `ORDERPAY_ENCRYPTION_KEY` (each the base64 of
//! 32 bytes), each value with a fresh random nonce and bound to the row it belongs to (associated
//! data), so a ciphertext copied onto another row does not open.
//!
//! The variable holds one key or several, comma separated ([`Keyring`]): the first seals, every
//! one opens, so the key can be rotated without a moment where stored secrets cannot be read
//! (new key first, then `orderpay secrets reseal`, then the old key dropped; docs/operations.md).
//!
//! A sealed value is `version (1 byte) || nonce (12) || ciphertext || tag (16)`. The version byte
//! leaves room for another algorithm later without guessing what a stored value is. Which key
//! sealed a value is not written down: GCM's tag tells whether a key opens it, and a keyring
//! holds a handful of keys.

use std::fmt;
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};

const VERSION: u8 = 1;
const KEY_BYTES: usize = 32;

/// The key secrets are sealed with. Its `Debug` hides it; nothing prints it.
#[derive(Clone)]
pub struct EncryptionKey(Arc<LessSafeKey>);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("ORDERPAY_ENCRYPTION_KEY must be the base64 of 32 random bytes (`openssl rand -base64 32`)")]
    Malformed,
    #[error("ORDERPAY_ENCRYPTION_KEY must be 32 bytes, this one is {0}")]
    Length(usize),
}

/// No randomness for a nonce (the operating system's generator failed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot seal a value: {0}")]
pub struct SealError(String);

/// A sealed value that does not open: another key, another row, or changed bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the value opens under no key of ORDERPAY_ENCRYPTION_KEY")]
pub struct OpenError;

impl EncryptionKey {
    /// Parses the base64 (standard alphabet, padded or not) of 32 bytes.
    pub fn parse(text: &str) -> Result<EncryptionKey, KeyError> {
        let text = text.trim();
        let bytes = STANDARD
            .decode(text)
            .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(text))
            .map_err(|_| KeyError::Malformed)?;
        if bytes.len() != KEY_BYTES {
            return Err(KeyError::Length(bytes.len()));
        }
        let key = UnboundKey::new(&AES_256_GCM, &bytes).map_err(|_| KeyError::Length(bytes.len()))?;
        Ok(EncryptionKey(Arc::new(LessSafeKey::new(key))))
    }

    /// `plaintext` sealed for the row named by `context`.
    pub fn seal(&self, plaintext: &[u8], context: &[u8]) -> Result<Vec<u8>, SealError> {
        let mut nonce = [0_u8; NONCE_LEN];
        crate::crypto::fill_random(&mut nonce).map_err(|error| SealError(error.to_string()))?;
        let mut sealed = Vec::with_capacity(1 + NONCE_LEN + plaintext.len() + AES_256_GCM.tag_len());
        sealed.push(VERSION);
        sealed.extend_from_slice(&nonce);
        let mut in_out = plaintext.to_vec();
        // Sealing fails only for inputs over GCM's 64 GiB limit.
        self.0
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(context), &mut in_out)
            .map_err(|_| SealError("over the size limit".to_owned()))?;
        sealed.extend_from_slice(&in_out);
        Ok(sealed)
    }

    /// The plaintext of a value [`seal`](Self::seal)ed for `context` with this key.
    pub fn open(&self, sealed: &[u8], context: &[u8]) -> Result<Vec<u8>, OpenError> {
        let (&version, rest) = sealed.split_first().ok_or(OpenError)?;
        if version != VERSION || rest.len() < NONCE_LEN + AES_256_GCM.tag_len() {
            return Err(OpenError);
        }
        let (nonce, ciphertext) = rest.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| OpenError)?;
        let mut in_out = ciphertext.to_vec();
        let plaintext =
            self.0.open_in_place(nonce, Aad::from(context), &mut in_out).map_err(|_| OpenError)?;
        Ok(plaintext.to_vec())
    }
}

impl fmt::Debug for EncryptionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("EncryptionKey(<redacted>)")
    }
}

/// The keys of `ORDERPAY_ENCRYPTION_KEY`: the first seals, every one opens.
#[derive(Clone)]
pub struct Keyring(Arc<[EncryptionKey]>);

/// A malformed key of the list, named by its place in it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyringError {
    #[error("{0}")]
    Key(KeyError),
    #[error("{error} (key {position} of {count})")]
    ListedKey { error: KeyError, position: usize, count: usize },
    #[error("ORDERPAY_ENCRYPTION_KEY names no key")]
    Empty,
}

/// A value opened, and whether the sealing key is the first of the keyring (else it should be
/// sealed again under the first: `orderpay secrets reseal`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    pub plaintext: Vec<u8>,
    pub under_first_key: bool,
}

impl Keyring {
    /// Parses one key, or several separated by commas (spaces around them ignored).
    pub fn parse(text: &str) -> Result<Keyring, KeyringError> {
        let listed: Vec<&str> = text.split(',').map(str::trim).filter(|key| !key.is_empty()).collect();
        let count = listed.len();
        let keys = listed
            .iter()
            .enumerate()
            .map(|(index, key)| {
                EncryptionKey::parse(key).map_err(|error| match count {
                    1 => KeyringError::Key(error),
                    _ => KeyringError::ListedKey { error, position: index + 1, count },
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if keys.is_empty() {
            return Err(KeyringError::Empty);
        }
        Ok(Keyring(keys.into()))
    }

    /// How many keys it holds.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never: a keyring holds one key at least.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `plaintext` sealed for `context` under the first key.
    pub fn seal(&self, plaintext: &[u8], context: &[u8]) -> Result<Vec<u8>, SealError> {
        self.0[0].seal(plaintext, context)
    }

    /// The plaintext of a value sealed for `context` under any of the keys.
    pub fn open(&self, sealed: &[u8], context: &[u8]) -> Result<Opened, OpenError> {
        self.0
            .iter()
            .enumerate()
            .find_map(|(index, key)| {
                let plaintext = key.open(sealed, context).ok()?;
                Some(Opened { plaintext, under_first_key: index == 0 })
            })
            .ok_or(OpenError)
    }
}

impl From<EncryptionKey> for Keyring {
    fn from(key: EncryptionKey) -> Keyring {
        Keyring(Arc::new([key]))
    }
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Keyring({} keys, <redacted>)", self.0.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> EncryptionKey {
        EncryptionKey::parse(&STANDARD.encode([byte; 32])).unwrap()
    }

    #[test]
    fn sealed_values_open_with_their_key_and_context_only() {
        let key = key(7);
        let sealed = key.seal(b"whsec_abc", b"row-1").unwrap();
        assert_eq!(sealed.len(), 1 + 12 + 9 + 16);
        assert!(!sealed.windows(9).any(|window| window == b"whsec_abc"));
        assert_eq!(key.open(&sealed, b"row-1").unwrap(), b"whsec_abc");
        assert_ne!(key.seal(b"whsec_abc", b"row-1").unwrap(), sealed, "a fresh nonce each time");
        assert_eq!(key.open(&sealed, b"row-2"), Err(OpenError), "bound to its row");
        assert_eq!(self::key(8).open(&sealed, b"row-1"), Err(OpenError), "another key");
        let mut changed = sealed.clone();
        *changed.last_mut().unwrap() ^= 1;
        assert_eq!(key.open(&changed, b"row-1"), Err(OpenError));
        for short in [&[][..], &[1][..], &sealed[..20]] {
            assert_eq!(key.open(short, b"row-1"), Err(OpenError));
        }
    }

    #[test]
    fn a_keyring_seals_under_its_first_key_and_opens_under_any() {
        let text =
            |bytes: &[u8]| bytes.iter().map(|&b| STANDARD.encode([b; 32])).collect::<Vec<_>>().join(", ");
        let old = Keyring::parse(&text(&[1])).unwrap();
        let both = Keyring::parse(&text(&[2, 1])).unwrap();
        let new = Keyring::parse(&text(&[2])).unwrap();
        assert_eq!(both.len(), 2);
        let sealed_old = old.seal(b"whsec_x", b"row").unwrap();
        let opened = both.open(&sealed_old, b"row").unwrap();
        assert_eq!((opened.plaintext.as_slice(), opened.under_first_key), (&b"whsec_x"[..], false));
        assert_eq!(new.open(&sealed_old, b"row"), Err(OpenError), "the old key dropped");
        let sealed_new = both.seal(b"whsec_y", b"row").unwrap();
        assert!(both.open(&sealed_new, b"row").unwrap().under_first_key);
        assert_eq!(new.open(&sealed_new, b"row").unwrap().plaintext, b"whsec_y");
        assert_eq!(old.open(&sealed_new, b"row"), Err(OpenError));
        assert_eq!(Keyring::parse(" , ").unwrap_err(), KeyringError::Empty);
        let bad = Keyring::parse(&format!("{}, nope", text(&[1]))).unwrap_err().to_string();
        assert!(bad.ends_with("(key 2 of 2)") && bad.starts_with("ORDERPAY_ENCRYPTION_KEY must be"), "{bad}");
        assert_eq!(format!("{both:?}"), "Keyring(2 keys, <redacted>)");
    }

    #[test]
    fn keys_are_32_bytes_of_base64() {
        assert!(EncryptionKey::parse(&STANDARD.encode([1_u8; 32])).is_ok());
        let unpadded = STANDARD.encode([1_u8; 32]).trim_end_matches('=').to_owned();
        assert!(EncryptionKey::parse(&unpadded).is_ok());
        assert_eq!(EncryptionKey::parse("not base64!").unwrap_err(), KeyError::Malformed);
        assert_eq!(EncryptionKey::parse(&STANDARD.encode([1_u8; 16])).unwrap_err(), KeyError::Length(16));
        assert_eq!(format!("{:?}", key(1)), "EncryptionKey(<redacted>)");
    }
}
