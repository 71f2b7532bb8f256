//! Keys of encrypted volumes: from a key file (32 bytes, raw or hex) or
//! derived from a passphrase with Argon2id.
//!
//! A passphrase volume records, in its storage URL beside the codec,
//! `kdf=argon2id-m19456-t2-p1` (the algorithm and its cost: 19 MiB of
//! memory, 2 passes, 1 lane, OWASP's minimum for Argon2id) and
//! `kdf_salt=HEX` (16 random bytes drawn at format time). The derived key
//! is checked against the volume's `key_check` like a key file's, so a
//! wrong passphrase is refused before mount(2) and nothing is read or
//! written with it.

use std::path::{Path, PathBuf};

use argon2::{Algorithm, Argon2, Params, Version};

use crate::codec::{CodecSpec, KEY_BYTES};
use crate::error::{BlocksError, Result};

/// The key derivation recorded in a passphrase volume's storage URL.
pub const KDF_ARGON2ID: &str = "argon2id-m19456-t2-p1";
/// Argon2id memory cost in KiB, passes and lanes of [`KDF_ARGON2ID`].
const ARGON2_MEMORY_KIB: u32 = 19_456;
const ARGON2_PASSES: u32 = 2;
const ARGON2_LANES: u32 = 1;
/// Salt length in bytes.
pub const KDF_SALT_BYTES: usize = 16;
/// Shortest passphrase accepted.
pub const PASSPHRASE_BYTES_MIN: usize = 8;
/// Longest passphrase file read.
pub const PASSPHRASE_BYTES_MAX: usize = 4096;

/// Where an encrypted volume's key comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// A key file: 32 raw bytes or 64 hex digits.
    File(PathBuf),
    /// A file holding a passphrase (one trailing newline is ignored).
    Passphrase(PathBuf),
}

/// Reads a passphrase file: its bytes without one trailing `\n` or `\r\n`.
pub fn read_passphrase_file(path: &Path) -> Result<Vec<u8>> {
    let bad = |reason: String| BlocksError::Key {
        path: path.to_path_buf(),
        reason,
    };
    let mut bytes = std::fs::read(path).map_err(|e| bad(format!("cannot be read: {e}")))?;
    if bytes.len() > PASSPHRASE_BYTES_MAX {
        return Err(bad(format!(
            "holds {} bytes: a passphrase file holds at most {PASSPHRASE_BYTES_MAX}",
            bytes.len()
        )));
    }
    if bytes.ends_with(b"\n") {
        bytes.pop();
        if bytes.ends_with(b"\r") {
            bytes.pop();
        }
    }
    if bytes.len() < PASSPHRASE_BYTES_MIN {
        return Err(bad(format!(
            "holds a passphrase of {} bytes: use at least {PASSPHRASE_BYTES_MIN}",
            bytes.len()
        )));
    }
    Ok(bytes)
}

/// 16 random bytes as hex: a new volume's salt.
pub fn new_salt() -> Result<String> {
    use std::io::Read;
    let mut salt = [0u8; KDF_SALT_BYTES];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut salt))
        .map_err(|e| BlocksError::Key {
            path: "/dev/urandom".into(),
            reason: format!("cannot be read for a salt: {e}"),
        })?;
    Ok(salt.iter().map(|b| format!("{b:02x}")).collect())
}

/// The key Argon2id derives from `passphrase` and the hex `salt`.
pub fn derive_key(passphrase: &[u8], salt_hex: &str) -> Result<[u8; KEY_BYTES]> {
    let failed = |reason: String| BlocksError::Key {
        path: "(passphrase)".into(),
        reason,
    };
    let salt = (0..salt_hex.len() / 2)
        .map(|i| u8::from_str_radix(&salt_hex[2 * i..2 * i + 2], 16))
        .collect::<std::result::Result<Vec<u8>, _>>()
        .map_err(|e| failed(format!("salt is not hex: {e}")))?;
    let params = Params::new(
        ARGON2_MEMORY_KIB,
        ARGON2_PASSES,
        ARGON2_LANES,
        Some(KEY_BYTES),
    )
    .map_err(|e| failed(format!("Argon2 parameters: {e}")))?;
    let mut key = [0u8; KEY_BYTES];
    Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
        .hash_password_into(passphrase, &salt, &mut key)
        .map_err(|e| failed(format!("Argon2id failed: {e}")))?;
    Ok(key)
}

/// The key of a volume with codec `spec` from `source`; `None` for a
/// volume that is not encrypted. A key file for a passphrase volume (or
/// the reverse) is refused with what to give instead.
pub fn key_for(
    url: &str,
    spec: &CodecSpec,
    source: Option<&KeySource>,
) -> Result<Option<[u8; KEY_BYTES]>> {
    if spec.key_check.is_none() {
        return Ok(None);
    }
    let mismatch = |reason: &str| BlocksError::KeyKind {
        url: url.to_string(),
        reason: reason.to_string(),
    };
    match (&spec.kdf_salt, source) {
        (_, None) => Err(BlocksError::KeyNeeded {
            url: url.to_string(),
        }),
        (Some(salt), Some(KeySource::Passphrase(path))) => {
            derive_key(&read_passphrase_file(path)?, salt).map(Some)
        }
        (None, Some(KeySource::File(path))) => crate::codec::read_key_file(path).map(Some),
        (Some(_), Some(KeySource::File(_))) => Err(mismatch(
            "it was formatted with a passphrase: give --passphrase-file (or BATON_PASSPHRASE_FILE), not a key file",
        )),
        (None, Some(KeySource::Passphrase(_))) => Err(mismatch(
            "it was formatted with a key file: give --key-file (or BATON_KEY_FILE), not a passphrase",
        )),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn derivation_depends_on_passphrase_and_salt_and_is_stable() {
        let salt = "00112233445566778899aabbccddeeff";
        let a = derive_key(b"correct horse", salt).unwrap();
        assert_eq!(a, derive_key(b"correct horse", salt).unwrap());
        assert_ne!(a, derive_key(b"correct horsf", salt).unwrap());
        assert_ne!(
            a,
            derive_key(b"correct horse", &salt.replace('0', "1")).unwrap()
        );
        assert_eq!(new_salt().unwrap().len(), 2 * KDF_SALT_BYTES);
        assert_ne!(new_salt().unwrap(), new_salt().unwrap());
    }

    #[test]
    fn passphrase_files_lose_one_newline_and_must_be_long_enough() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pass");
        std::fs::write(&p, "long enough phrase\n").unwrap();
        assert_eq!(read_passphrase_file(&p).unwrap(), b"long enough phrase");
        std::fs::write(&p, "short\n").unwrap();
        let e = read_passphrase_file(&p).unwrap_err().to_string();
        assert!(e.contains("at least 8"), "{e}");
    }
}
