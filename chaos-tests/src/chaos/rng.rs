//! Seeded randomness and known file content for the chaos suite: one
//! splitmix64 generator (pure, reproducible from a seed) and the content
//! function of the large read-only files (byte `q` of file key `k` is a pure
//! function of `(k, q)`, so any block read can be checked on its own).

/// One splitmix64 step of `z`. Pure.
pub fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A small seeded generator (splitmix64 sequence).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`, decorrelated by `stream` (worker index etc.).
    pub fn new(seed: u64, stream: u64) -> Rng {
        Rng(splitmix64(seed ^ splitmix64(stream.wrapping_add(0x5EED))))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        splitmix64(self.0)
    }

    /// Uniform in `0..n` (0 when n is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo) + 1)
    }

    /// True with probability `numerator / denominator`.
    pub fn chance(&mut self, numerator: u64, denominator: u64) -> bool {
        self.below(denominator) < numerator
    }

    /// Random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            out.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        out.truncate(len);
        out
    }
}

/// The content key of large file `index` in a run with `seed`. Pure.
pub fn big_file_key(seed: u64, index: usize) -> u64 {
    splitmix64(seed ^ 0xB16F_11E5 ^ ((index as u64) << 40))
}

/// Fills `buf` with bytes `offset..offset+len` of the content of `key`. Pure.
pub fn fill_content(key: u64, offset: u64, buf: &mut [u8]) {
    let mut position = offset;
    let mut at = 0;
    while at < buf.len() {
        let word = splitmix64(key ^ (position / 8).wrapping_mul(0xD6E8_FEB8_6659_FD93));
        let bytes = word.to_le_bytes();
        let start = (position % 8) as usize;
        let take = (8 - start).min(buf.len() - at);
        buf[at..at + take].copy_from_slice(&bytes[start..start + take]);
        at += take;
        position += take as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_of_any_range_matches_the_whole() {
        let mut whole = vec![0u8; 1000];
        fill_content(42, 0, &mut whole);
        let mut part = vec![0u8; 301];
        fill_content(42, 123, &mut part);
        assert_eq!(&whole[123..424], &part[..]);
        let mut other = vec![0u8; 301];
        fill_content(43, 123, &mut other);
        assert_ne!(part, other);
    }

    #[test]
    fn same_seed_same_sequence() {
        let (mut a, mut b) = (Rng::new(7, 1), Rng::new(7, 1));
        assert_eq!(a.bytes(64), b.bytes(64));
        assert_ne!(Rng::new(7, 2).next_u64(), Rng::new(7, 1).next_u64());
    }
}
