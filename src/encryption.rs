//! Secrets at rest: AES-256-GCM under the key of `ORDERPAY_ENCRYPTION_KEY` (base64 of 32
//! bytes), each value with a fresh random nonce and bound to the row it belongs to (associated
//! data), so a ciphertext copied onto another row does not open.
//!
//! A sealed value is `version (1 byte) || nonce (12) || ciphertext || tag (16)`. The version byte
//! leaves room for another key or algorithm later without guessing what a stored value is.

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
#[error("the value cannot be decrypted with this ORDERPAY_ENCRYPTION_KEY")]
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
        getrandom::fill(&mut nonce).map_err(|error| SealError(error.to_string()))?;
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
    fn keys_are_32_bytes_of_base64() {
        assert!(EncryptionKey::parse(&STANDARD.encode([1_u8; 32])).is_ok());
        let unpadded = STANDARD.encode([1_u8; 32]).trim_end_matches('=').to_owned();
        assert!(EncryptionKey::parse(&unpadded).is_ok());
        assert_eq!(EncryptionKey::parse("not base64!").unwrap_err(), KeyError::Malformed);
        assert_eq!(EncryptionKey::parse(&STANDARD.encode([1_u8; 16])).unwrap_err(), KeyError::Length(16));
        assert_eq!(format!("{:?}", key(1)), "EncryptionKey(<redacted>)");
    }
}
