//! Sizes on the command lines of every Baton program (`--cache-size 1G`,
//! `--block-size 4M`, `--memory-max 512M`): one syntax, binary units.

/// Parses `4096`, `64K`, `512M`, `1G`, `2T` (also `1GiB`, `1GB`: binary
/// units either way). Pure.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, suffix) = t.split_at(digits_end);
    if number.is_empty() {
        return Err(format!(
            "{text:?} is not a size: expected e.g. 1G, 512M or 4096"
        ));
    }
    // Only ASCII digits remain, so the one way to fail is overflow.
    let value: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is too large"))?;
    let shift = match suffix.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => {
            return Err(format!(
                "{text:?} has an unknown unit {suffix:?}: use K, M, G or T"
            ))
        }
    };
    value
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64K").unwrap(), 64 << 10);
        assert_eq!(parse_size("512m").unwrap(), 512 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("2T").unwrap(), 2 << 40);
        assert_eq!(parse_size("7B").unwrap(), 7);
    }

    #[test]
    fn bad_sizes_say_why() {
        assert!(parse_size("").unwrap_err().contains("not a size"));
        assert!(parse_size("G").unwrap_err().contains("not a size"));
        assert!(parse_size("12Q").unwrap_err().contains("unknown unit"));
        assert!(parse_size("99999999999T")
            .unwrap_err()
            .contains("too large"));
        assert!(parse_size("-1").unwrap_err().contains("not a size"));
    }

    #[test]
    fn a_number_too_long_for_64_bits_is_too_large() {
        assert!(parse_size("99999999999999999999999")
            .unwrap_err()
            .contains("too large"));
    }

    proptest::proptest! {
        #[test]
        fn a_number_with_any_unit_is_that_many_bytes_or_too_large(
            value in proptest::prelude::any::<u64>(),
            unit in proptest::sample::select(vec![
                ("", 0), ("B", 0), ("k", 10), ("KiB", 10), ("M", 20), ("mb", 20),
                ("G", 30), ("GiB", 30), ("t", 40), ("TB", 40),
            ]),
        ) {
            let (suffix, shift) = unit;
            let parsed = parse_size(&format!("{value}{suffix}"));
            match value.checked_mul(1u64 << shift) {
                Some(bytes) => proptest::prop_assert_eq!(parsed, Ok(bytes)),
                None => proptest::prop_assert!(parsed.unwrap_err().contains("too large")),
            }
        }

        #[test]
        fn any_text_is_a_size_or_a_reason_that_quotes_it(text in "\\PC{0,24}") {
            if let Err(reason) = parse_size(&text) {
                proptest::prop_assert!(reason.contains(&format!("{text:?}")), "{}", reason);
            }
        }
    }
}
