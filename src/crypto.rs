//! The primitives every other module takes from ring: randomness from the operating system
//! (`SystemRandom`: API keys, webhook secrets, nonces, jitter) and SHA-256 (API key hashes,
//! request fingerprints). ring is already here for TLS and AES-GCM, so no second crate reads
//! the OS's random source or hashes. AES-GCM is `encryption.rs`, HMAC `webhook_signature.rs`.

use ring::digest::{SHA256, digest};
use ring::rand::{SecureRandom, SystemRandom};

/// The OS could not give randomness (it practically never happens; callers refuse to go on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the operating system gave no randomness")]
pub struct NoRandomness;

/// Fills `bytes` with random bytes.
pub fn fill_random(bytes: &mut [u8]) -> Result<(), NoRandomness> {
    SystemRandom::new().fill(bytes).map_err(|_| NoRandomness)
}

/// A random `u64`.
pub fn random_u64() -> Result<u64, NoRandomness> {
    let mut bytes = [0_u8; 8];
    fill_random(&mut bytes)?;
    Ok(u64::from_le_bytes(bytes))
}

/// The SHA-256 of `data`.
pub fn sha256(data: &[u8]) -> [u8; 32] {
    let mut hash = [0_u8; 32];
    hash.copy_from_slice(digest(&SHA256, data).as_ref());
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_is_the_standard_one_and_randomness_differs() {
        assert_eq!(
            hex::encode(sha256(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_ne!(random_u64().unwrap(), random_u64().unwrap());
    }
}
