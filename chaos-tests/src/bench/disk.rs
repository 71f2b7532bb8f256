//! What the disk under a benchmark is, for its report: the filesystem
//! holding a directory, its device, and for ext4 whether it has a journal
//! (without one, ext4 avoids reusing a freed inode for a minute or more,
//! which slows creates after deletes).

use std::path::Path;

use fuse_wire::mountinfo::{self, MountInfo};

/// `FSTYPE on SOURCE` for the mount holding `dir` (the longest mount
/// point above it in `/proc/self/mountinfo`), with `, no journal` or
/// `, journal` for ext4. `unknown` if it cannot be told.
pub fn describe(dir: &Path) -> String {
    let Ok(dir) = dir.canonicalize() else {
        return "unknown".to_string();
    };
    let Ok(table) = mountinfo::read() else {
        return "unknown".to_string();
    };
    let Some(mount) = holding_mount(&table, &dir) else {
        return "unknown".to_string();
    };
    let source = mount.source.to_string_lossy();
    let journal = match mount.fstype.as_str() {
        "ext4" => ext4_journal(&source),
        _ => "",
    };
    format!("{} on {source}{journal}", mount.fstype)
}

/// The mount of `table` whose point is the longest one above `dir`
/// (later lines win a tie: they are mounted over the earlier ones).
pub fn holding_mount<'a>(table: &'a [MountInfo], dir: &Path) -> Option<&'a MountInfo> {
    table
        .iter()
        .filter(|m| dir.starts_with(&m.mountpoint))
        .fold(None, |best: Option<&MountInfo>, m| match best {
            Some(b) if b.mountpoint.as_os_str().len() > m.mountpoint.as_os_str().len() => Some(b),
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
        let table = mountinfo::parse(
            b"\
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
30 27 0:40 / /var/tmp/x rw - tmpfs tmpfs rw
31 27 0:41 / /var rw - xfs /dev/vdb rw
not a mountinfo line",
        );
        let fields = |m: &MountInfo| {
            (
                m.mountpoint.display().to_string(),
                m.fstype.clone(),
                m.source.to_string_lossy().into_owned(),
            )
        };
        let held = holding_mount(&table, Path::new("/var/tmp/bench")).unwrap();
        assert_eq!(
            fields(held),
            ("/var".into(), "xfs".into(), "/dev/vdb".into())
        );
        let root = holding_mount(&table, Path::new("/work")).unwrap();
        assert_eq!(fields(root), ("/".into(), "ext4".into(), "/dev/vda".into()));
        // A path component, not a string prefix: /var/tmp/xy is not in /var/tmp/x.
        let var = holding_mount(&table, Path::new("/var/tmp/xy")).unwrap();
        assert_eq!(var.mountpoint, Path::new("/var"));
        let spaced = mountinfo::parse(b"40 27 0:42 / /mnt/a\\040b rw - tmpfs tmpfs rw");
        let held = holding_mount(&spaced, Path::new("/mnt/a b/c")).unwrap();
        assert_eq!(held.mountpoint, Path::new("/mnt/a b"));
    }
}
