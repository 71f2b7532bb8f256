//! Corruption found while serving: the first error that shows the stored
//! metadata is damaged (a broken invariant, a page SQLite cannot read, a
//! PostgreSQL data-corruption error) puts the store in quarantine. From then
//! on every write is refused with [`MetaError::Quarantined`] (EROFS) before
//! it starts, so nothing builds on the damage; reads go on where the data
//! is readable. Only a repair (unmount, `fsctl fsck`) and a new open lift
//! it. Shared by both engines.

use std::sync::OnceLock;

use crate::error::MetaError;

/// Whether, and why, the store stopped taking writes.
#[derive(Debug, Default)]
pub(crate) struct Quarantine {
    reason: OnceLock<String>,
}

impl Quarantine {
    /// The reason, once quarantined.
    pub(crate) fn reason(&self) -> Option<&str> {
        self.reason.get().map(String::as_str)
    }

    /// `Quarantined` if the store is in quarantine (checked before a write
    /// starts).
    pub(crate) fn check(&self, op: &'static str) -> Result<(), MetaError> {
        match self.reason.get() {
            Some(what) => Err(MetaError::Quarantined {
                op,
                what: what.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Looks at an error on its way out: one that shows corruption puts
    /// the store in quarantine (logged once). Returns the error unchanged.
    pub(crate) fn observe(&self, e: MetaError) -> MetaError {
        if e.is_corruption() && self.reason.set(e.to_string()).is_ok() {
            tracing::error!(
                error = %e,
                "metadata found corrupt while serving: the volume now refuses every change (EROFS) and serves reads only; unmount it and run `fsctl fsck`"
            );
        }
        e
    }
}
