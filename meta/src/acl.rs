//! POSIX ACLs in their xattr form (`system.posix_acl_access`,
//! `system.posix_acl_default`), and the kernel's rules for them.
//!
//! The value is a little-endian header `version: u32` (always
//! [`ACL_XATTR_VERSION`]) and then `count` entries of
//! `tag: u16, perm: u16, id: u32`. [`Acl::parse`] accepts exactly what the
//! kernel's `posix_acl_valid` accepts (one owner, owning group and other
//! entry each, a mask whenever there are named entries, in tag order) and
//! never panics on foreign bytes. The rules that tie an ACL to the mode are
//! the kernel's `fs/posix_acl.c`: [`Acl::equiv_mode`]
//! (`posix_acl_equiv_mode`: setting an access ACL sets the mode, and one the
//! mode says in full is stored as no ACL), [`Acl::chmod`]
//! (`__posix_acl_chmod`) and [`Acl::create_masq`] (`posix_acl_create_masq`:
//! a new inode's ACL from its directory's default ACL and the create mode).

use std::fmt;

/// `system.posix_acl_access`: the ACL checked on access.
pub const ACL_ACCESS_XATTR: &[u8] = b"system.posix_acl_access";
/// `system.posix_acl_default`: a directory's ACL, inherited by new entries.
pub const ACL_DEFAULT_XATTR: &[u8] = b"system.posix_acl_default";
/// `POSIX_ACL_XATTR_VERSION`.
pub const ACL_XATTR_VERSION: u32 = 2;
/// Most entries in one ACL: what a 64 KiB xattr value can hold.
pub const ACL_ENTRY_COUNT_MAX: usize = (crate::limits::XATTR_VALUE_LEN_MAX - 4) / 8;

/// `ACL_USER_OBJ`: the owner.
pub const TAG_USER_OBJ: u16 = 0x01;
/// `ACL_USER`: a named user.
pub const TAG_USER: u16 = 0x02;
/// `ACL_GROUP_OBJ`: the owning group.
pub const TAG_GROUP_OBJ: u16 = 0x04;
/// `ACL_GROUP`: a named group.
pub const TAG_GROUP: u16 = 0x08;
/// `ACL_MASK`: the most any named entry or the owning group grants.
pub const TAG_MASK: u16 = 0x10;
/// `ACL_OTHER`: everyone else.
pub const TAG_OTHER: u16 = 0x20;
/// `ACL_UNDEFINED_ID`: the id of an entry that names nobody.
pub const ID_UNDEFINED: u32 = u32::MAX;

const HEADER_LEN: usize = 4;
const ENTRY_LEN: usize = 8;

/// Which of the two ACLs an xattr name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AclKind {
    /// `system.posix_acl_access`.
    Access,
    /// `system.posix_acl_default`.
    Default,
}

impl AclKind {
    /// The kind `name` names, if it is one of the two ACL xattrs.
    pub fn of_name(name: &[u8]) -> Option<AclKind> {
        match name {
            ACL_ACCESS_XATTR => Some(AclKind::Access),
            ACL_DEFAULT_XATTR => Some(AclKind::Default),
            _ => None,
        }
    }
}

/// One entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AclEntry {
    /// `TAG_*`.
    pub tag: u16,
    /// `rwx` as 4/2/1.
    pub perm: u16,
    /// The uid or gid of a named entry; [`ID_UNDEFINED`] otherwise.
    pub id: u32,
}

/// A parsed, valid ACL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<AclEntry>,
}

/// Why bytes are not an ACL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed POSIX ACL: {0}")]
pub struct AclParseError(String);

impl Acl {
    /// Parses and validates the xattr form.
    pub fn parse(bytes: &[u8]) -> Result<Acl, AclParseError> {
        let bad = |why: String| Err(AclParseError(why));
        let Some((header, body)) = bytes.split_first_chunk::<HEADER_LEN>() else {
            return bad(format!("{} bytes: shorter than its header", bytes.len()));
        };
        let version = u32::from_le_bytes(*header);
        if version != ACL_XATTR_VERSION {
            return bad(format!("version {version}, not {ACL_XATTR_VERSION}"));
        }
        if body.len() % ENTRY_LEN != 0 {
            return bad(format!(
                "{} bytes of entries: not a whole number of {ENTRY_LEN}-byte entries",
                body.len()
            ));
        }
        if body.len() / ENTRY_LEN > ACL_ENTRY_COUNT_MAX {
            return bad(format!("more than {ACL_ENTRY_COUNT_MAX} entries"));
        }
        let entries = body
            .chunks_exact(ENTRY_LEN)
            .map(|e| {
                let tag = u16::from_le_bytes([e[0], e[1]]);
                // The kernel ignores the id of an entry that names nobody.
                let id = match tag {
                    TAG_USER | TAG_GROUP => u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
                    _ => ID_UNDEFINED,
                };
                AclEntry {
                    tag,
                    perm: u16::from_le_bytes([e[2], e[3]]),
                    id,
                }
            })
            .collect();
        let acl = Acl { entries };
        acl.validate()
            .map_err(|why| AclParseError(why.to_owned()))?;
        Ok(acl)
    }

    /// The ACL the mode says: owner, owning group and other, no mask.
    pub fn from_mode(mode: u32) -> Acl {
        let entry = |tag, shift: u32| AclEntry {
            tag,
            perm: ((mode >> shift) & 0o7) as u16,
            id: ID_UNDEFINED,
        };
        Acl {
            entries: vec![
                entry(TAG_USER_OBJ, 6),
                entry(TAG_GROUP_OBJ, 3),
                entry(TAG_OTHER, 0),
            ],
        }
    }

    /// The entries, in tag order.
    pub fn entries(&self) -> &[AclEntry] {
        &self.entries
    }

    /// The xattr form (ids of unnamed entries written as [`ID_UNDEFINED`]).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + ENTRY_LEN * self.entries.len());
        out.extend_from_slice(&ACL_XATTR_VERSION.to_le_bytes());
        for e in &self.entries {
            let id = match e.tag {
                TAG_USER | TAG_GROUP => e.id,
                _ => ID_UNDEFINED,
            };
            out.extend_from_slice(&e.tag.to_le_bytes());
            out.extend_from_slice(&e.perm.to_le_bytes());
            out.extend_from_slice(&id.to_le_bytes());
        }
        out
    }

    /// `posix_acl_valid`: each perm within rwx; owner, named users, owning
    /// group, named groups, mask, other, in that order; exactly one owner,
    /// owning group and other; a mask (at most one) whenever there is a
    /// named entry.
    fn validate(&self) -> Result<(), &'static str> {
        #[derive(PartialEq)]
        enum Next {
            UserObj,
            User,
            Group,
            Other,
            Done,
        }
        let mut state = Next::UserObj;
        let mut needs_mask = false;
        for e in &self.entries {
            if e.perm & !0o7 != 0 {
                return Err("a permission outside rwx");
            }
            state = match (e.tag, state) {
                (TAG_USER_OBJ, Next::UserObj) => Next::User,
                (TAG_USER, Next::User) => {
                    needs_mask = true;
                    Next::User
                }
                (TAG_GROUP_OBJ, Next::User) => Next::Group,
                (TAG_GROUP, Next::Group) => {
                    needs_mask = true;
                    Next::Group
                }
                (TAG_MASK, Next::Group) => Next::Other,
                (TAG_OTHER, Next::Other) => Next::Done,
                (TAG_OTHER, Next::Group) if !needs_mask => Next::Done,
                (TAG_USER_OBJ | TAG_USER | TAG_GROUP_OBJ | TAG_GROUP | TAG_MASK | TAG_OTHER, _) => {
                    return Err(
                        "entries out of order, repeated, missing, or named entries without a mask",
                    )
                }
                _ => return Err("an unknown tag"),
            };
        }
        if state == Next::Done {
            Ok(())
        } else {
            Err("missing the owner, owning group or other entry")
        }
    }

    /// `posix_acl_equiv_mode`: the permission bits of `mode` this ACL
    /// sets (owner; mask, else owning group; other: type and set-ID bits
    /// kept), and whether the mode says all of it (no named entry, no
    /// mask): such an ACL is stored as none.
    pub fn equiv_mode(&self, mode: u32) -> (u32, bool) {
        let mut bits = 0;
        let mut equivalent = true;
        for e in &self.entries {
            let perm = u32::from(e.perm) & 0o7;
            match e.tag {
                TAG_USER_OBJ => bits |= perm << 6,
                TAG_GROUP_OBJ => bits |= perm << 3,
                TAG_OTHER => bits |= perm,
                TAG_MASK => {
                    bits = (bits & !0o070) | (perm << 3);
                    equivalent = false;
                }
                _ => equivalent = false,
            }
        }
        ((mode & !0o777) | bits, equivalent)
    }

    /// `__posix_acl_chmod`: the owner, mask (else owning group) and other
    /// entries take the permission bits of `mode`.
    pub fn chmod(&mut self, mode: u32) {
        let has_mask = self.entries.iter().any(|e| e.tag == TAG_MASK);
        for e in &mut self.entries {
            match e.tag {
                TAG_USER_OBJ => e.perm = ((mode >> 6) & 0o7) as u16,
                TAG_MASK => e.perm = ((mode >> 3) & 0o7) as u16,
                TAG_GROUP_OBJ if !has_mask => e.perm = ((mode >> 3) & 0o7) as u16,
                TAG_OTHER => e.perm = (mode & 0o7) as u16,
                _ => {}
            }
        }
    }

    /// `posix_acl_create_masq`: makes this (a copy of the directory's
    /// default ACL) the new inode's access ACL under the create `mode`, and
    /// returns the new mode and whether the mode says all of the ACL
    /// (then the inode gets no access ACL).
    pub fn create_masq(&mut self, mode: u32) -> (u32, bool) {
        let mut bits = mode & 0o777;
        let mut equivalent = true;
        let mut group_perm_at = None;
        for (i, e) in self.entries.iter_mut().enumerate() {
            let perm = u32::from(e.perm);
            match e.tag {
                TAG_USER_OBJ => {
                    let perm = perm & (bits >> 6);
                    e.perm = perm as u16;
                    bits &= (perm << 6) | !0o700;
                }
                TAG_OTHER => {
                    let perm = perm & bits;
                    e.perm = perm as u16;
                    bits &= perm | !0o007;
                }
                TAG_MASK => {
                    group_perm_at = Some(i);
                    equivalent = false;
                }
                TAG_GROUP_OBJ => {
                    group_perm_at = group_perm_at.or(Some(i));
                }
                _ => equivalent = false,
            }
        }
        // The mask when there is one (it follows the owning group), else
        // the owning group: valid ACLs always have the latter.
        if let Some(i) = group_perm_at {
            let e = &mut self.entries[i];
            let perm = u32::from(e.perm) & (bits >> 3);
            e.perm = perm as u16;
            bits &= (perm << 3) | !0o070;
        }
        ((mode & !0o777) | (bits & 0o777), equivalent)
    }
}

impl fmt::Display for AclEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tag = match self.tag {
            TAG_USER_OBJ => "user::".to_owned(),
            TAG_USER => format!("user:{}:", self.id),
            TAG_GROUP_OBJ => "group::".to_owned(),
            TAG_GROUP => format!("group:{}:", self.id),
            TAG_MASK => "mask::".to_owned(),
            TAG_OTHER => "other::".to_owned(),
            t => format!("tag {t:#x}:"),
        };
        let p = self.perm;
        let c = |bit: u16, ch: char| if p & bit != 0 { ch } else { '-' };
        write!(f, "{tag}{}{}{}", c(4, 'r'), c(2, 'w'), c(1, 'x'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(tag: u16, perm: u16, id: u32) -> AclEntry {
        AclEntry { tag, perm, id }
    }

    fn acl(entries: &[(u16, u16, u32)]) -> Acl {
        Acl {
            entries: entries.iter().map(|&(t, p, i)| entry(t, p, i)).collect(),
        }
    }

    const U: u32 = ID_UNDEFINED;

    #[test]
    fn parse_round_trips_a_valid_acl() {
        let a = acl(&[
            (TAG_USER_OBJ, 7, U),
            (TAG_USER, 5, 1000),
            (TAG_GROUP_OBJ, 5, U),
            (TAG_MASK, 5, U),
            (TAG_OTHER, 0, U),
        ]);
        assert_eq!(Acl::parse(&a.to_bytes()), Ok(a));
    }

    #[test]
    fn parse_refuses_malformed_bytes() {
        let good = Acl::from_mode(0o640).to_bytes();
        assert!(Acl::parse(&good).is_ok());
        assert!(Acl::parse(&[]).is_err());
        assert!(Acl::parse(&good[..3]).is_err());
        assert!(Acl::parse(&good[..good.len() - 1]).is_err());
        let mut v1 = good.clone();
        v1[0] = 1;
        assert!(Acl::parse(&v1).is_err());
        let mut perm = good.clone();
        perm[6] = 8;
        assert!(Acl::parse(&perm).is_err());
        // Header only: no owner entry.
        assert!(Acl::parse(&good[..4]).is_err());
        // Named user without a mask; out of order; repeated; unknown tag.
        for bad in [
            acl(&[(1, 7, U), (2, 7, 5), (4, 7, U), (0x20, 7, U)]),
            acl(&[(4, 7, U), (1, 7, U), (0x20, 7, U)]),
            acl(&[(1, 7, U), (1, 7, U), (4, 7, U), (0x20, 7, U)]),
            acl(&[(1, 7, U), (4, 7, U), (0x40, 7, U), (0x20, 7, U)]),
            acl(&[
                (1, 7, U),
                (4, 7, U),
                (0x10, 7, U),
                (0x10, 7, U),
                (0x20, 7, U),
            ]),
        ] {
            assert!(Acl::parse(&bad.to_bytes()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn parse_survives_every_truncation_and_byte_flip() {
        let a = acl(&[
            (TAG_USER_OBJ, 7, U),
            (TAG_USER, 5, 1000),
            (TAG_GROUP_OBJ, 5, U),
            (TAG_GROUP, 1, 7),
            (TAG_MASK, 5, U),
            (TAG_OTHER, 0, U),
        ])
        .to_bytes();
        for n in 0..a.len() {
            let _ = Acl::parse(&a[..n]);
            for bit in 0..8 {
                let mut b = a.clone();
                b[n] ^= 1 << bit;
                let _ = Acl::parse(&b);
            }
        }
    }

    #[test]
    fn random_bytes_never_panic_and_what_parses_encodes_back() {
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..20_000 {
            let entry_count = (next() % 8) as usize;
            let mut b = ACL_XATTR_VERSION.to_le_bytes().to_vec();
            for _ in 0..entry_count {
                // Tags from the valid set most of the time, ids small.
                let tag = [1u16, 2, 4, 8, 0x10, 0x20, 0x40][(next() % 7) as usize];
                b.extend_from_slice(&tag.to_le_bytes());
                b.extend_from_slice(&((next() % 9) as u16).to_le_bytes());
                b.extend_from_slice(&((next() % 3) as u32).to_le_bytes());
            }
            let cut = if next() % 5 == 0 {
                (next() as usize) % (b.len() + 1)
            } else {
                b.len()
            };
            if let Ok(acl) = Acl::parse(&b[..cut]) {
                assert_eq!(Acl::parse(&acl.to_bytes()).as_ref(), Ok(&acl));
                let mut masq = acl.clone();
                let (mode, _) = masq.create_masq(0o777);
                assert_eq!(mode & !0o777, 0);
                assert!(Acl::parse(&masq.to_bytes()).is_ok());
            }
        }
    }

    #[test]
    fn equiv_mode_takes_the_mask_for_group_bits() {
        let a = acl(&[
            (TAG_USER_OBJ, 6, U),
            (TAG_USER, 7, 1000),
            (TAG_GROUP_OBJ, 4, U),
            (TAG_MASK, 5, U),
            (TAG_OTHER, 0, U),
        ]);
        assert_eq!(a.equiv_mode(0o102777), (0o102650, false));
        assert_eq!(Acl::from_mode(0o751).equiv_mode(0o100000), (0o100751, true));
    }

    #[test]
    fn chmod_sets_the_mask_not_the_owning_group() {
        let mut a = acl(&[
            (TAG_USER_OBJ, 7, U),
            (TAG_USER, 7, 1000),
            (TAG_GROUP_OBJ, 7, U),
            (TAG_MASK, 7, U),
            (TAG_OTHER, 7, U),
        ]);
        a.chmod(0o640);
        let perms: Vec<u16> = a.entries().iter().map(|e| e.perm).collect();
        assert_eq!(perms, [6, 7, 7, 4, 0]);
        let mut m = Acl::from_mode(0o777);
        m.chmod(0o751);
        assert_eq!(m, Acl::from_mode(0o751));
    }

    #[test]
    fn create_masq_limits_the_acl_by_the_create_mode() {
        let mut a = acl(&[
            (TAG_USER_OBJ, 7, U),
            (TAG_USER, 7, 1000),
            (TAG_GROUP_OBJ, 5, U),
            (TAG_MASK, 7, U),
            (TAG_OTHER, 5, U),
        ]);
        assert_eq!(a.create_masq(0o100666), (0o100664, false));
        let perms: Vec<u16> = a.entries().iter().map(|e| e.perm).collect();
        assert_eq!(perms, [6, 7, 5, 6, 4]);
        let mut plain = Acl::from_mode(0o750);
        assert_eq!(plain.create_masq(0o40777), (0o40750, true));
    }
}
