//! What the disk under a benchmark is, for its report: the filesystem
//! holding a directory, its device, and for ext4 whether it has a journal
//! (without one, ext4 avoids reusing a freed inode for a minute or more,
//! which slows creates after deletes).

use std::path::Path;

/// `FSTYPE on SOURCE` for the mount holding `dir` (the longest mount
/// point above it in `/proc/self/mountinfo`), with `, no journal` or
/// `, journal` for ext4. `unknown` if it cannot be told.
pub fn describe(dir: &Path) -> String {
    let Ok(dir) = dir.canonicalize() else {
        return "unknown".to_string();
    };
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return "unknown".to_string();
    };
    let Some(mount) = holding_mount(&mountinfo, &dir) else {
        return "unknown".to_string();
    };
    let journal = match mount.fstype {
        "ext4" => ext4_journal(mount.source),
        _ => "",
    };
    format!("{} on {}{journal}", mount.fstype, mount.source)
}

/// One line of `/proc/self/mountinfo`, the fields used here.
#[derive(Debug, PartialEq, Eq)]
pub struct MountLine<'a> {
    /// Where it is mounted (octal escapes such as `\040` for a space
    /// undone, by [`fuse_wire::unescape_mountinfo`]).
    pub point: String,
    /// Its filesystem type.
    pub fstype: &'a str,
    /// Its source (the device).
    pub source: &'a str,
}

impl<'a> MountLine<'a> {
    /// Parses a mountinfo line: `ID PARENT MAJ:MIN ROOT POINT OPTIONS
    /// [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS`.
    pub fn parse(line: &'a str) -> Option<MountLine<'a>> {
        let (before, after) = line.split_once(" - ")?;
        let point = fuse_wire::unescape_mountinfo(before.split_whitespace().nth(4)?);
        let mut after = after.split_whitespace();
        Some(MountLine {
            point,
            fstype: after.next()?,
            source: after.next()?,
        })
    }
}

/// The mount of `mountinfo` whose point is the longest one above `dir`
/// (later lines win a tie: they are mounted over the earlier ones).
pub fn holding_mount<'a>(mountinfo: &'a str, dir: &Path) -> Option<MountLine<'a>> {
    mountinfo
        .lines()
        .filter_map(MountLine::parse)
        .filter(|m| dir.starts_with(&m.point))
        .fold(None, |best: Option<MountLine<'a>>, m| match best {
            Some(b) if b.point.len() > m.point.len() => Some(b),
            _ => Some(m),
        })
}

/// `, no journal` or `, journal` for the ext4 filesystem on `source`
/// (`/sys/fs/ext4/DEV/journal_task` is `<none>` without one); empty if
/// that cannot be read.
fn ext4_journal(source: &str) -> &'static str {
    let device = source.rsplit('/').next().unwrap_or(source);
    match std::fs::read_to_string(format!("/sys/fs/ext4/{device}/journal_task")) {
        Ok(task) if task.trim() == "<none>" => ", no journal",
        Ok(_) => ", journal",
        Err(_) => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_mount_point_above_a_directory_holds_it() {
        let mountinfo = "\
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
30 27 0:40 / /var/tmp/x rw - tmpfs tmpfs rw
31 27 0:41 / /var rw - xfs /dev/vdb rw
not a mountinfo line";
        let held = holding_mount(mountinfo, Path::new("/var/tmp/bench")).unwrap();
        assert_eq!(
            (held.point.as_ref(), held.fstype, held.source),
            ("/var", "xfs", "/dev/vdb")
        );
        let root = holding_mount(mountinfo, Path::new("/work")).unwrap();
        assert_eq!((root.fstype, root.source), ("ext4", "/dev/vda"));
        // A path component, not a string prefix: /var/tmp/xy is not in /var/tmp/x.
        let var = holding_mount(mountinfo, Path::new("/var/tmp/xy")).unwrap();
        assert_eq!(var.point, "/var");
        let spaced = "40 27 0:42 / /mnt/a\\040b rw - tmpfs tmpfs rw";
        let held = holding_mount(spaced, Path::new("/mnt/a b/c")).unwrap();
        assert_eq!((held.point.as_ref(), held.fstype), ("/mnt/a b", "tmpfs"));
    }
}
