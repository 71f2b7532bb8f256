//! Human sizes on the command line: `4M`, `1G`, `512K`, `4096`.

/// Parses a size with an optional K/M/G/T suffix (powers of 1024).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (digits, shift) = match text.char_indices().last() {
        Some((i, 'k' | 'K')) => (&text[..i], 10),
        Some((i, 'm' | 'M')) => (&text[..i], 20),
        Some((i, 'g' | 'G')) => (&text[..i], 30),
        Some((i, 't' | 'T')) => (&text[..i], 40),
        _ => (text, 0),
    };
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a size; use e.g. 4M, 1G or 65536"))?;
    value
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("`{text}` is too large"))
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("4M"), Ok(4 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("4X").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}
