//! Optional compression (LZ4) and encryption (ChaCha20-Poly1305) of block
//! objects at rest, chosen at format time and recorded in the storage URL
//! (`?compression=lz4&encryption=chacha20-poly1305&key_check=HEX`, plus
//! `kdf=...&kdf_salt=HEX` when the key is derived from a passphrase: see
//! `passphrase.rs`); the key itself is never recorded: it comes from a key
//! file or a passphrase at format and mount.
//!
//! Object layout when a codec is on:
//!
//! ```text
//! "BTNC" | version u8 = 1 | flags u8 (1 = lz4, 2 = encrypted)
//!        | nonce [12] (encrypted only) | payload
//! payload = lz4 (size-prefixed) of the block, then sealed with the object
//!           key as associated data (an object copied under another key
//!           fails to open)
//! ```
//!
//! `key_check` is the tag of an empty message sealed under a fixed nonce
//! that data never uses (data nonces are random and 96-bit): a wrong key is
//! refused before mount(2), not at the first read.

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};

use crate::error::{BlocksError, Result};

/// Key length of ChaCha20-Poly1305.
pub const KEY_BYTES: usize = 32;
/// The query parameters a codec adds to a storage URL.
pub const CODEC_PARAMS: [&str; 5] = ["compression", "encryption", "key_check", "kdf", "kdf_salt"];

const MAGIC: &[u8; 4] = b"BTNC";
const VERSION: u8 = 1;
const FLAG_LZ4: u8 = 1;
const FLAG_SEALED: u8 = 2;
const NONCE_BYTES: usize = 12;
const HEADER_BYTES: usize = 6;
/// Never a data nonce (those are random): only for `key_check`.
const KEY_CHECK_NONCE: [u8; NONCE_BYTES] = *b"baton-check!";

/// What a volume's objects are encoded with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CodecSpec {
    /// LZ4 compression.
    pub compress: bool,
    /// ChaCha20-Poly1305, with the hex `key_check` of the format-time key.
    pub key_check: Option<String>,
    /// The key is Argon2id of a passphrase with this hex salt
    /// ([`crate::passphrase::KDF_ARGON2ID`]); `None`: a key file.
    pub kdf_salt: Option<String>,
}

impl CodecSpec {
    /// Whether objects are stored as written.
    pub fn is_plain(&self) -> bool {
        !self.compress && self.key_check.is_none()
    }

    /// Splits the codec parameters off a storage URL: (the backend's URL,
    /// the codec). Pure.
    pub fn split_url(url: &str) -> Result<(String, CodecSpec)> {
        let bad = |reason: &str| BlocksError::InvalidUrl {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        let Some((base, query)) = url.split_once('?') else {
            return Ok((url.to_string(), CodecSpec::default()));
        };
        let mut spec = CodecSpec::default();
        let mut encryption = false;
        let mut kdf = false;
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("compression", "lz4")) => spec.compress = true,
                Some(("compression", _)) => return Err(bad("compression must be lz4")),
                Some(("encryption", "chacha20-poly1305")) => encryption = true,
                Some(("encryption", _)) => return Err(bad("encryption must be chacha20-poly1305")),
                Some(("key_check", hex)) if hex.len() == 32 && is_hex(hex) => {
                    spec.key_check = Some(hex.to_string());
                }
                Some(("key_check", _)) => return Err(bad("key_check must be 32 hex digits")),
                Some(("kdf", crate::passphrase::KDF_ARGON2ID)) => kdf = true,
                Some(("kdf", _)) => return Err(bad(
                    "kdf is not argon2id-m19456-t2-p1 (a newer Baton made this volume: upgrade)",
                )),
                Some(("kdf_salt", hex)) if hex.len() == 32 && is_hex(hex) => {
                    spec.kdf_salt = Some(hex.to_string());
                }
                Some(("kdf_salt", _)) => return Err(bad("kdf_salt must be 32 hex digits")),
                _ => kept.push(pair),
            }
        }
        if encryption != spec.key_check.is_some() {
            return Err(bad("encryption and key_check go together"));
        }
        if kdf != spec.kdf_salt.is_some() || (kdf && !encryption) {
            return Err(bad("kdf and kdf_salt go together, with encryption"));
        }
        let base = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        Ok((base, spec))
    }

    /// `url` with this codec's parameters added. Pure.
    pub fn add_to_url(&self, url: &str) -> String {
        let mut params = Vec::new();
        if self.compress {
            params.push("compression=lz4".to_string());
        }
        if let Some(check) = &self.key_check {
            params.push("encryption=chacha20-poly1305".to_string());
            params.push(format!("key_check={check}"));
            if let Some(salt) = &self.kdf_salt {
                params.push(format!("kdf={}", crate::passphrase::KDF_ARGON2ID));
                params.push(format!("kdf_salt={salt}"));
            }
        }
        if params.is_empty() {
            return url.to_string();
        }
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}{}", params.join("&"))
    }
}

fn is_hex(text: &str) -> bool {
    text.chars().all(|c| c.is_ascii_hexdigit())
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads a key file: 32 raw bytes, or 64 hex digits (a trailing newline is
/// allowed).
pub fn read_key_file(path: &std::path::Path) -> Result<[u8; KEY_BYTES]> {
    let bad = |reason: String| BlocksError::Key {
        path: path.to_path_buf(),
        reason,
    };
    let bytes = std::fs::read(path).map_err(|e| bad(format!("cannot be read: {e}")))?;
    if bytes.len() == KEY_BYTES {
        let mut key = [0u8; KEY_BYTES];
        key.copy_from_slice(&bytes);
        return Ok(key);
    }
    let text = String::from_utf8_lossy(&bytes);
    let text = text.trim();
    if text.len() == 2 * KEY_BYTES && is_hex(text) {
        let mut key = [0u8; KEY_BYTES];
        for (i, byte) in key.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16)
                .map_err(|e| bad(format!("bad hex: {e}")))?;
        }
        return Ok(key);
    }
    Err(bad(format!(
        "holds {} bytes: expected {KEY_BYTES} raw bytes or {} hex digits (e.g. `head -c 32 /dev/urandom > KEYFILE`)",
        bytes.len(),
        2 * KEY_BYTES
    )))
}

/// The `key_check` of `key`. Pure.
pub fn key_check(key: &[u8; KEY_BYTES]) -> String {
    let cipher = ChaCha20Poly1305::new(Key::from_slice(key));
    // Invariant: sealing an empty message cannot fail.
    let tag = cipher
        .encrypt(Nonce::from_slice(&KEY_CHECK_NONCE), &b""[..])
        .unwrap_or_default();
    to_hex(&tag)
}

/// Encodes and decodes block objects of one volume.
pub struct Codec {
    compress: bool,
    cipher: Option<ChaCha20Poly1305>,
}

impl std::fmt::Debug for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Codec")
            .field("compress", &self.compress)
            .field("encrypted", &self.cipher.is_some())
            .finish()
    }
}

impl Codec {
    /// The codec of `spec` with `key`; refuses a missing or wrong key.
    pub fn new(url: &str, spec: &CodecSpec, key: Option<&[u8; KEY_BYTES]>) -> Result<Codec> {
        let cipher = match (&spec.key_check, key) {
            (None, _) => None,
            (Some(_), None) => {
                return Err(BlocksError::KeyNeeded {
                    url: url.to_string(),
                })
            }
            (Some(expected), Some(key)) => {
                if key_check(key) != *expected {
                    return Err(BlocksError::WrongKey {
                        url: url.to_string(),
                    });
                }
                Some(ChaCha20Poly1305::new(Key::from_slice(key)))
            }
        };
        Ok(Codec {
            compress: spec.compress,
            cipher,
        })
    }

    /// The stored form of `data` under object `key`.
    pub fn encode(&self, key: &str, data: &[u8]) -> Result<Vec<u8>> {
        let mut flags = 0;
        let compressed;
        let mut payload: &[u8] = data;
        if self.compress {
            compressed = lz4_flex::compress_prepend_size(data);
            payload = &compressed;
            flags |= FLAG_LZ4;
        }
        let mut out = Vec::with_capacity(HEADER_BYTES + NONCE_BYTES + payload.len() + 16);
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        match &self.cipher {
            None => {
                out.push(flags);
                out.extend_from_slice(payload);
            }
            Some(cipher) => {
                out.push(flags | FLAG_SEALED);
                let nonce: [u8; NONCE_BYTES] = rand::random();
                let sealed = cipher
                    .encrypt(
                        Nonce::from_slice(&nonce),
                        Payload {
                            msg: payload,
                            aad: key.as_bytes(),
                        },
                    )
                    .map_err(|_| BlocksError::Decode {
                        key: key.to_string(),
                        reason: "encryption failed".into(),
                    })?;
                out.extend_from_slice(&nonce);
                out.extend_from_slice(&sealed);
            }
        }
        Ok(out)
    }

    /// The block bytes of stored object `key`.
    pub fn decode(&self, key: &str, stored: &[u8]) -> Result<Vec<u8>> {
        let bad = |reason: &str| BlocksError::Decode {
            key: key.to_string(),
            reason: reason.to_string(),
        };
        if stored.len() < HEADER_BYTES || &stored[..4] != MAGIC {
            return Err(bad(
                "not a Baton encoded object (written without the volume's codec?)",
            ));
        }
        if stored[4] != VERSION {
            return Err(bad("unknown codec version: upgrade Baton"));
        }
        let flags = stored[5];
        let body = &stored[HEADER_BYTES..];
        let opened;
        let payload: &[u8] = if flags & FLAG_SEALED != 0 {
            let cipher = self
                .cipher
                .as_ref()
                .ok_or_else(|| bad("the object is encrypted but the volume is not"))?;
            if body.len() < NONCE_BYTES {
                return Err(bad("truncated"));
            }
            let (nonce, sealed) = body.split_at(NONCE_BYTES);
            opened = cipher
                .decrypt(
                    Nonce::from_slice(nonce),
                    Payload {
                        msg: sealed,
                        aad: key.as_bytes(),
                    },
                )
                .map_err(|_| {
                    bad("authentication failed: the object was altered, moved from another key, or sealed with another key")
                })?;
            &opened
        } else {
            if self.cipher.is_some() {
                return Err(bad("the object is not encrypted but the volume is"));
            }
            body
        };
        if flags & FLAG_LZ4 != 0 {
            lz4_flex::decompress_size_prepended(payload)
                .map_err(|e| bad(&format!("LZ4 data is corrupt: {e}")))
        } else {
            Ok(payload.to_vec())
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const KEY: [u8; KEY_BYTES] = [7; KEY_BYTES];

    fn spec(compress: bool, encrypt: bool) -> CodecSpec {
        CodecSpec {
            compress,
            key_check: encrypt.then(|| key_check(&KEY)),
            kdf_salt: None,
        }
    }

    #[test]
    fn every_combination_round_trips() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 7) as u8).collect();
        for (compress, encrypt) in [(true, false), (false, true), (true, true), (false, false)] {
            let codec = Codec::new("u", &spec(compress, encrypt), Some(&KEY)).unwrap();
            let stored = codec.encode("blocks/k", &data).unwrap();
            assert_eq!(codec.decode("blocks/k", &stored).unwrap(), data);
            if compress {
                assert!(stored.len() < data.len() / 10, "compressible data shrinks");
            }
            if encrypt {
                assert!(!stored
                    .windows(64)
                    .any(|w| data.windows(64).next() == Some(w)));
            }
        }
    }

    #[test]
    fn tampering_moving_and_wrong_keys_are_refused() {
        let codec = Codec::new("u", &spec(false, true), Some(&KEY)).unwrap();
        let mut stored = codec.encode("blocks/a", b"secret data").unwrap();
        let moved = codec.decode("blocks/b", &stored).unwrap_err();
        assert!(
            moved.to_string().contains("authentication failed"),
            "{moved}"
        );
        let last = stored.len() - 1;
        stored[last] ^= 1;
        assert!(codec.decode("blocks/a", &stored).is_err());
        let wrong = Codec::new("u", &spec(false, true), Some(&[8; KEY_BYTES])).unwrap_err();
        assert!(matches!(wrong, BlocksError::WrongKey { .. }), "{wrong}");
        let none = Codec::new("u", &spec(false, true), None).unwrap_err();
        assert!(matches!(none, BlocksError::KeyNeeded { .. }), "{none}");
    }

    #[test]
    fn codec_parameters_split_off_and_add_back() {
        let s = spec(true, true);
        let url = s.add_to_url("s3://b/p?endpoint=http://h:1");
        let (base, back) = CodecSpec::split_url(&url).unwrap();
        assert_eq!(base, "s3://b/p?endpoint=http://h:1");
        assert_eq!(back, s);
        let (base, plain) = CodecSpec::split_url("file:///d").unwrap();
        assert_eq!((base.as_str(), plain.is_plain()), ("file:///d", true));
        let mut derived = spec(false, true);
        derived.kdf_salt = Some("0123456789abcdef0123456789abcdef".into());
        let url = derived.add_to_url("file:///d");
        assert!(
            url.contains("kdf=argon2id-m19456-t2-p1&kdf_salt=0123"),
            "{url}"
        );
        assert_eq!(CodecSpec::split_url(&url).unwrap().1, derived);
        let check = format!("key_check={}", "0".repeat(32));
        for bad in [
            "file:///d?compression=zstd".to_string(),
            "file:///d?encryption=chacha20-poly1305".to_string(),
            "file:///d?key_check=zz".to_string(),
            format!(
                "file:///d?encryption=chacha20-poly1305&{check}&kdf=scrypt&kdf_salt={}",
                "0".repeat(32)
            ),
            format!("file:///d?encryption=chacha20-poly1305&{check}&kdf=argon2id-m19456-t2-p1"),
        ] {
            assert!(CodecSpec::split_url(&bad).is_err(), "{bad}");
        }
    }
}
