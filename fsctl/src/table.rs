//! Plain-text tables: columns as wide as their widest cell.

/// `rows` as lines of columns as wide as their widest cell, two spaces
/// apart (`right[i]`: column i is aligned right); no trailing spaces.
pub fn aligned<const N: usize>(rows: &[[String; N]], right: &[bool; N]) -> String {
    let mut widths = [0usize; N];
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let pad = " ".repeat(widths[i] - cell.chars().count());
            if right[i] {
                line.push_str(&pad);
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.push_str(&pad);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_columns_line_up_whatever_the_width_of_a_cell() {
        let row = |cells: [&str; 3]| cells.map(String::from);
        let rows = [
            row(["MOUNTPOINT", "VOLUME (full)", "GEN"]),
            row(["/mnt/a", "sqlite:///var/lib/baton/default/meta.db", "1"]),
            row(["/a/much/longer/mountpoint", "b", "12345"]),
        ];
        let text = aligned(&rows, &[false, false, true]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "MOUNTPOINT                 VOLUME (full)                              GEN",
                "/mnt/a                     sqlite:///var/lib/baton/default/meta.db      1",
                "/a/much/longer/mountpoint  b                                        12345",
            ]
        );
    }
}
