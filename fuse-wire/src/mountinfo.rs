//! `/proc/self/mountinfo`, parsed in one place for every crate that reads
//! it (the supervisor's restore, the CSI plugin's publications, the tests'
//! mount guards, the bench's disk report).
//!
//! A line is `ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - FSTYPE
//! SOURCE SUPER_OPTIONS` (proc(5)). The kernel writes the root, the
//! mountpoint and the source with space, tab, newline and backslash
//! escaped as `\ooo` (`seq_escape`/`mangle_path` in fs/proc_namespace.c),
//! so fields never hold a raw space and `" - "` only ever separates the
//! optional fields from the rest. Paths are bytes: a mountpoint that is not
//! UTF-8 comes back exactly as it was mounted.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// Where the kernel lists the mounts of the caller's mount namespace.
pub const MOUNTINFO_PATH: &str = "/proc/self/mountinfo";

/// One line of mountinfo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountInfo {
    /// The mount's unique id.
    pub mount_id: u32,
    /// The id of the mount it sits on.
    pub parent_id: u32,
    /// The filesystem's device number (for FUSE, `minor` is the fusectl
    /// connection number).
    pub major: u32,
    /// See `major`.
    pub minor: u32,
    /// The directory of the filesystem shown at the mountpoint (`/` unless
    /// a bind mount shows a subdirectory).
    pub root: PathBuf,
    /// Where it is mounted.
    pub mountpoint: PathBuf,
    /// Per-mount options (`rw,nosuid,...`).
    pub options: String,
    /// The filesystem type (`fuse.baton`, `ext4`, ...).
    pub fstype: String,
    /// The source (device or the name a FUSE filesystem gave), unescaped.
    pub source: OsString,
}

impl MountInfo {
    /// Parses one line; None for a line that is not in the format above.
    /// Pure; never panics on any input.
    pub fn parse(line: &[u8]) -> Option<MountInfo> {
        let mut fields = line.split(|&b| b == b' ');
        let mount_id = number(fields.next()?)?;
        let parent_id = number(fields.next()?)?;
        let device = fields.next()?;
        let colon = device.iter().position(|&b| b == b':')?;
        let root = unescape(fields.next()?);
        let mountpoint = unescape(fields.next()?);
        let options = text(fields.next()?);
        // The optional fields (`shared:N`, ...) end at a lone `-`, looked
        // for only after the six fixed fields: a path may be `-` itself.
        fields.find(|field| *field == b"-")?;
        let fstype = fields.next().filter(|t| !t.is_empty()).map(text)?;
        let source = unescape(fields.next()?).into_os_string();
        Some(MountInfo {
            mount_id,
            parent_id,
            major: number(&device[..colon])?,
            minor: number(&device[colon + 1..])?,
            root,
            mountpoint,
            options,
            fstype,
            source,
        })
    }

    /// `major:minor`, as /sys/class/bdi names the device.
    pub fn device(&self) -> String {
        format!("{}:{}", self.major, self.minor)
    }

    /// A FUSE filesystem (`fuse` or `fuse.SUBTYPE`).
    pub fn is_fuse(&self) -> bool {
        self.fstype == "fuse" || self.fstype.starts_with("fuse.")
    }
}

fn number(field: &[u8]) -> Option<u32> {
    std::str::from_utf8(field).ok()?.parse().ok()
}

fn text(field: &[u8]) -> String {
    String::from_utf8_lossy(field).into_owned()
}

/// Every mount of the caller's namespace, oldest first (lines the parser
/// does not understand are skipped). Read as bytes: one mount anywhere on
/// the machine with a path that is not UTF-8 must not hide the others.
/// Never touches a mount itself: a stat of a FUSE mount with no server
/// would block.
pub fn read() -> std::io::Result<Vec<MountInfo>> {
    Ok(parse(&std::fs::read(MOUNTINFO_PATH)?))
}

/// Parses the bytes of a mountinfo file. Pure.
pub fn parse(text: &[u8]) -> Vec<MountInfo> {
    text.split(|&b| b == b'\n')
        .filter_map(MountInfo::parse)
        .collect()
}

/// The mount at exactly `mountpoint` that is on top (mounts are listed in
/// the order they were made, so the last one wins), compared as given:
/// never resolved.
pub fn top_at<'a>(table: &'a [MountInfo], mountpoint: &Path) -> Option<&'a MountInfo> {
    table.iter().rev().find(|m| m.mountpoint == mountpoint)
}

/// A field as the bytes it names: every `\ooo` escape undone; a backslash
/// not followed by three octal digits is kept as it is. An escape above
/// `\377`, which the kernel never writes, wraps to a byte.
pub fn unescape(field: &[u8]) -> PathBuf {
    let bytes = field;
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        if let Some(digits) = octal {
            out.push(
                digits
                    .iter()
                    .fold(0u8, |acc, d| acc.wrapping_mul(8).wrapping_add(d - b'0')),
            );
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    PathBuf::from(OsString::from_vec(out))
}

/// `path` as the kernel writes it in mountinfo: space, tab, newline and
/// backslash as `\ooo`, every other byte as it is. The inverse of
/// [`unescape`].
pub fn escape(path: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    for &b in path.as_os_str().as_bytes() {
        match b {
            b' ' | b'\t' | b'\n' | b'\\' => out.extend_from_slice(format!("\\{b:03o}").as_bytes()),
            _ => out.push(b),
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_line_with_escapes_and_optional_fields_parses() {
        let line = br"36 35 0:41 /sub\040dir /mnt/new\012line\134x rw,nosuid shared:1 master:2 - fuse.baton my\040vol rw,user_id=0";
        let m = MountInfo::parse(line).unwrap();
        assert_eq!((m.mount_id, m.parent_id, m.major, m.minor), (36, 35, 0, 41));
        assert_eq!(m.root, Path::new("/sub dir"));
        assert_eq!(m.mountpoint, Path::new("/mnt/new\nline\\x"));
        assert_eq!(m.options, "rw,nosuid");
        assert_eq!(m.fstype, "fuse.baton");
        assert_eq!(m.source, "my vol");
        assert_eq!(m.device(), "0:41");
        assert!(m.is_fuse());
    }

    #[test]
    fn every_mountinfo_escape_is_undone() {
        assert_eq!(unescape(br"/x/a\040b"), Path::new("/x/a b"));
        assert_eq!(unescape(br"/x/new\012line"), Path::new("/x/new\nline"));
        assert_eq!(unescape(br"/x/t\011ab"), Path::new("/x/t\tab"));
        assert_eq!(unescape(br"/x/back\134slash"), Path::new(r"/x/back\slash"));
        assert_eq!(unescape(br"/x/not\08"), Path::new(r"/x/not\08"));
        assert_eq!(unescape(b"/x/trailing\\"), Path::new("/x/trailing\\"));
    }

    #[test]
    fn a_mountpoint_that_is_not_utf8_comes_back_byte_for_byte() {
        // Latin-1 "/mnt/été": the kernel writes these bytes as they are.
        let latin1: &[u8] = b"/mnt/\xe9t\xe9";
        let mut line = b"36 35 0:41 / ".to_vec();
        line.extend_from_slice(latin1);
        line.extend_from_slice(b" rw - fuse.baton baton rw");
        let text = [b"1 0 8:1 / / rw - ext4 /dev/sda1 rw\n".as_slice(), &line].concat();
        let table = parse(&text);
        assert_eq!(table.len(), 2, "one odd line must not hide the others");
        assert_eq!(table[1].mountpoint.as_os_str().as_bytes(), latin1);
    }

    #[test]
    fn escape_is_undone_by_unescape() {
        let path = Path::new("/a b/c\td\ne\\f/\u{e9}");
        let escaped = escape(path);
        assert!(!escaped.contains(&b' ') && !escaped.contains(&b'\n'));
        assert_eq!(unescape(&escaped), path);
    }

    #[test]
    fn lines_that_are_not_mountinfo_are_refused() {
        for line in [
            &b""[..],
            b" - ",
            b"36 35 0:41 / /mnt rw",
            b"x 35 0:41 / /mnt rw - ext4 /dev/sda rw",
            b"36 35 041 / /mnt rw - ext4 /dev/sda rw",
            b"36 35 0:41 / /mnt rw - ",
            b"36 35 0:41 / /mnt rw shared:1 ext4 /dev/sda rw",
        ] {
            assert_eq!(MountInfo::parse(line), None, "{line:?}");
        }
    }

    #[test]
    fn a_path_that_is_a_lone_dash_is_not_the_separator() {
        let m = MountInfo::parse(b"36 35 0:41 - - rw shared:7 - fuse.baton - rw").unwrap();
        assert_eq!(
            (m.root.as_os_str(), m.mountpoint.as_os_str()),
            ("-".as_ref(), "-".as_ref())
        );
        assert_eq!(
            (m.fstype.as_str(), m.source.as_os_str()),
            ("fuse.baton", "-".as_ref())
        );
    }

    #[test]
    fn the_last_mount_at_a_path_is_the_top_one() {
        let table = parse(
            b"1 0 8:1 / / rw - ext4 /dev/sda1 rw\n\
              2 1 0:40 / /mnt rw - fuse.baton a rw\n\
              3 1 0:41 / /mnt rw - fuse.baton b rw\n",
        );
        assert_eq!(table.len(), 3);
        assert_eq!(top_at(&table, Path::new("/mnt")).unwrap().minor, 41);
        assert!(top_at(&table, Path::new("/other")).is_none());
    }

    #[test]
    fn this_process_sees_its_root() {
        let table = read().unwrap();
        assert!(table.iter().any(|m| m.mountpoint == Path::new("/")));
    }

    fn path(bytes: Vec<u8>) -> PathBuf {
        PathBuf::from(OsString::from_vec(bytes))
    }

    proptest::proptest! {
        #[test]
        fn any_path_survives_escape_and_unescape(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
        ) {
            let p = path(bytes);
            proptest::prop_assert_eq!(unescape(&escape(&p)), p);
        }

        #[test]
        fn a_line_made_of_any_fields_parses_back_to_them(
            ids in proptest::prelude::any::<(u32, u32, u32, u32)>(),
            root in proptest::collection::vec(1u8.., 1..24),
            point in proptest::collection::vec(1u8.., 1..24),
            optional in proptest::collection::vec("[a-z]{1,8}:[0-9]{1,3}", 0..3),
            fstype in "[a-z0-9]{1,8}(\\.[a-z0-9]{1,8})?",
            source in proptest::collection::vec(1u8.., 0..16),
        ) {
            let (mount_id, parent_id, major, minor) = ids;
            let mut line = format!("{mount_id} {parent_id} {major}:{minor} ").into_bytes();
            line.extend(escape(&path(root.clone())));
            line.push(b' ');
            line.extend(escape(&path(point.clone())));
            line.extend(b" rw,nosuid");
            for field in &optional {
                line.push(b' ');
                line.extend(field.as_bytes());
            }
            line.extend(format!(" - {fstype} ").into_bytes());
            line.extend(escape(&path(source.clone())));
            line.extend(b" rw,user_id=0");
            let m = MountInfo::parse(&line);
            proptest::prop_assert!(m.is_some(), "{:?}", String::from_utf8_lossy(&line));
            let m = m.unwrap();
            proptest::prop_assert_eq!((m.mount_id, m.parent_id, m.major, m.minor), ids);
            proptest::prop_assert_eq!(m.root, path(root));
            proptest::prop_assert_eq!(m.mountpoint, path(point));
            proptest::prop_assert_eq!(m.options, "rw,nosuid");
            proptest::prop_assert_eq!(m.fstype, fstype);
            proptest::prop_assert_eq!(m.source.into_vec(), source);
        }

        #[test]
        fn any_bytes_parse_or_are_skipped_without_a_panic(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
        ) {
            let _ = parse(&bytes);
        }
    }
}
