//! A fault-injecting `ObjectStore` wrapper for chaos tests: makes the real
//! backend slow, transiently erroring or unreachable, selected by the
//! environment variable [`STORAGE_FAULT_ENV`] when a store is opened.
//!
//! `BATON_STORAGE_FAULT=delay_ms=50,error_rate=0.1,unreachable_file=/run/x,seed=7`
//!
//! - `delay_ms`: every operation sleeps this long before it runs;
//! - `error_rate`: the fraction (0..=1) of operations that fail with a
//!   transient (`Generic`) error before reaching the backend;
//! - `unreachable_file`: while this file exists, every operation fails with
//!   a transient error (a test creates and removes it to open and close an
//!   outage window);
//! - `seed`: the seed of the error draws (default 1).
//!
//! Unset or empty, stores are not wrapped. An unparseable value is an error
//! at open, never silently ignored.

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
};

use crate::error::{BlocksError, Result};

/// The environment variable that selects storage faults.
pub const STORAGE_FAULT_ENV: &str = "BATON_STORAGE_FAULT";
/// Upper bound of `delay_ms` (a typo must not hang a test for hours).
pub const FAULT_DELAY_MS_MAX: u64 = 10_000;

/// What to inject. Parsed from [`STORAGE_FAULT_ENV`].
#[derive(Debug, Clone, PartialEq)]
pub struct StorageFaults {
    /// Sleep before every operation.
    pub delay_ms: u64,
    /// Fraction of operations failing with a transient error.
    pub error_rate: f64,
    /// While this file exists, every operation fails.
    pub unreachable_file: Option<PathBuf>,
    /// Seed of the error draws.
    pub seed: u64,
}

impl StorageFaults {
    /// Parses `key=value,...` (see the module docs). Pure.
    pub fn parse(text: &str) -> Result<StorageFaults> {
        let invalid = |reason: String| {
            BlocksError::InvalidArgument {
            what: format!("{STORAGE_FAULT_ENV}={text:?}: {reason}; expected e.g. delay_ms=50,error_rate=0.1,unreachable_file=/run/outage"),
        }
        };
        let mut faults = StorageFaults {
            delay_ms: 0,
            error_rate: 0.0,
            unreachable_file: None,
            seed: 1,
        };
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| invalid(format!("{item:?} is not key=value")))?;
            let number = |v: &str| {
                v.parse::<u64>()
                    .map_err(|_| invalid(format!("{key}: {v:?} is not a number")))
            };
            match key {
                "delay_ms" => faults.delay_ms = number(value)?.min(FAULT_DELAY_MS_MAX),
                "seed" => faults.seed = number(value)?,
                "error_rate" => {
                    faults.error_rate = value
                        .parse::<f64>()
                        .ok()
                        .filter(|r| (0.0..=1.0).contains(r))
                        .ok_or_else(|| invalid(format!("error_rate {value:?} is not in 0..=1")))?
                }
                "unreachable_file" => faults.unreachable_file = Some(PathBuf::from(value)),
                _ => return Err(invalid(format!("unknown key {key:?}"))),
            }
        }
        Ok(faults)
    }
}

/// Wraps `store` in a [`FaultyStore`] when [`STORAGE_FAULT_ENV`] is set.
pub fn wrap_from_env(store: Arc<dyn ObjectStore>) -> Result<Arc<dyn ObjectStore>> {
    match std::env::var(STORAGE_FAULT_ENV) {
        Ok(text) if !text.trim().is_empty() => {
            let faults = StorageFaults::parse(&text)?;
            tracing::warn!(
                ?faults,
                "object store faults injected ({STORAGE_FAULT_ENV})"
            );
            Ok(Arc::new(FaultyStore::new(store, faults)))
        }
        _ => Ok(store),
    }
}

/// An object store that delays and fails operations before passing them on.
#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    faults: StorageFaults,
    draw_count: AtomicU64,
    injected_count: AtomicU64,
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl FaultyStore {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn ObjectStore>, faults: StorageFaults) -> FaultyStore {
        FaultyStore {
            inner,
            faults,
            draw_count: AtomicU64::new(0),
            injected_count: AtomicU64::new(0),
        }
    }

    /// Operations failed on purpose so far.
    pub fn injected_count(&self) -> u64 {
        self.injected_count.load(Ordering::Relaxed)
    }

    /// The fault decision for one operation, without the delay.
    fn decide(&self, op: &str, location: &str) -> object_store::Result<()> {
        let outage = self
            .faults
            .unreachable_file
            .as_ref()
            .is_some_and(|f| f.exists());
        let draw = self.draw_count.fetch_add(1, Ordering::Relaxed);
        let roll = (splitmix64(self.faults.seed ^ draw.wrapping_mul(0x2545_F491_4F6C_DD1D)) >> 11)
            as f64
            / (1u64 << 53) as f64;
        let reason = if outage {
            "storage unreachable (injected outage)"
        } else if roll < self.faults.error_rate {
            "transient storage error (injected)"
        } else {
            return Ok(());
        };
        self.injected_count.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(op, location, reason, "object store fault injected");
        Err(object_store::Error::Generic {
            store: "FaultyStore",
            source: format!("{op} {location}: {reason}").into(),
        })
    }

    /// Sleeps the configured delay, then decides.
    async fn before(&self, op: &str, location: &str) -> object_store::Result<()> {
        if self.faults.delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.faults.delay_ms)).await;
        }
        self.decide(op, location)
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.before("put", location.as_ref()).await?;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.before("put_multipart", location.as_ref()).await?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.before("get", location.as_ref()).await?;
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        self.before("get_ranges", location.as_ref()).await?;
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        // One decision for the whole stream (no delay: deletes are best
        // effort and never on a caller's critical path).
        match self.decide("delete", "(stream)") {
            Ok(()) => self.inner.delete_stream(locations),
            Err(err) => {
                let message = err.to_string();
                locations
                    .map(move |_| {
                        Err(object_store::Error::Generic {
                            store: "FaultyStore",
                            source: message.clone().into(),
                        })
                    })
                    .boxed()
            }
        }
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        match self.decide("list", prefix.map_or("", |p| p.as_ref())) {
            Ok(()) => self.inner.list(prefix),
            Err(err) => futures::stream::once(async move { Err(err) }).boxed(),
        }
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.before("list", prefix.map_or("", |p| p.as_ref()))
            .await?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.before("copy", from.as_ref()).await?;
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        self.before("rename", from.as_ref()).await?;
        self.inner.rename_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use object_store::ObjectStoreExt;

    #[test]
    fn parses_every_key_and_refuses_unknown_ones() {
        let f = StorageFaults::parse("delay_ms=50, error_rate=0.25,unreachable_file=/x,seed=9")
            .unwrap();
        assert_eq!(f.delay_ms, 50);
        assert_eq!(f.error_rate, 0.25);
        assert_eq!(f.unreachable_file, Some(PathBuf::from("/x")));
        assert_eq!(f.seed, 9);
        assert!(StorageFaults::parse("error_rate=2").is_err());
        assert!(StorageFaults::parse("bogus=1").is_err());
        assert!(StorageFaults::parse("delay_ms").is_err());
        assert_eq!(
            StorageFaults::parse("delay_ms=99999999").unwrap().delay_ms,
            FAULT_DELAY_MS_MAX
        );
    }

    #[test]
    fn injects_transient_errors_at_the_rate_and_outages_while_the_file_exists() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let outage = dir.path().join("outage");
        let faults = StorageFaults::parse(&format!(
            "error_rate=0.5,unreachable_file={}",
            outage.display()
        ))
        .unwrap();
        let store = FaultyStore::new(Arc::new(object_store::memory::InMemory::new()), faults);
        let path = Path::from("a");
        let failures = rt.block_on(async {
            let mut failures = 0;
            for _ in 0..400 {
                if store
                    .put(&path, PutPayload::from_static(b"x"))
                    .await
                    .is_err()
                {
                    failures += 1;
                }
            }
            failures
        });
        assert!((120..280).contains(&failures), "{failures} of 400 failed");
        std::fs::write(&outage, b"").unwrap();
        let during = rt.block_on(async {
            let mut ok = 0;
            for _ in 0..50 {
                if store.get(&path).await.is_ok() {
                    ok += 1;
                }
            }
            ok
        });
        assert_eq!(during, 0, "an operation succeeded during the outage");
        let err = rt.block_on(store.get(&path)).unwrap_err();
        assert!(matches!(err, object_store::Error::Generic { .. }), "{err}");
    }
}
