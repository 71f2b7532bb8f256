//! Shared test helpers: an instrumented object store wrapper that counts
//! concurrent uploads and injects transient failures.
#![allow(dead_code, clippy::unwrap_used)]

use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

/// Wraps a store: `put_opts` sleeps `put_delay_ms`, records peak concurrency
/// and fails with a transient error while `put_failures_left > 0`.
#[derive(Debug)]
pub struct Instrumented {
    pub inner: Arc<dyn ObjectStore>,
    pub put_delay_ms: u64,
    pub inflight: AtomicUsize,
    pub peak: AtomicUsize,
    pub put_failures_left: AtomicU32,
    pub put_calls: AtomicU32,
    /// Puts whose path contains this string always fail (transiently).
    pub fail_paths_containing: std::sync::Mutex<Option<String>>,
    /// Delay of every `get_opts`.
    pub get_delay_ms: std::sync::atomic::AtomicU64,
}

impl Instrumented {
    pub fn new(inner: Arc<dyn ObjectStore>, put_delay_ms: u64, put_failures: u32) -> Self {
        Instrumented {
            inner,
            put_delay_ms,
            inflight: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            put_failures_left: AtomicU32::new(put_failures),
            put_calls: AtomicU32::new(0),
            fail_paths_containing: std::sync::Mutex::new(None),
            get_delay_ms: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

impl fmt::Display for Instrumented {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Instrumented({})", self.inner)
    }
}

#[async_trait::async_trait]
impl ObjectStore for Instrumented {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.put_calls.fetch_add(1, Ordering::SeqCst);
        let now = self.inflight.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(self.put_delay_ms)).await;
        self.inflight.fetch_sub(1, Ordering::SeqCst);
        let fail = self
            .put_failures_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        let doomed = self
            .fail_paths_containing
            .lock()
            .unwrap()
            .as_ref()
            .is_some_and(|m| location.as_ref().contains(m.as_str()));
        if fail || doomed {
            return Err(object_store::Error::Generic {
                store: "instrumented",
                source: "injected transient failure".into(),
            });
        }
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let delay_ms = self.get_delay_ms.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// A `file://` URL for a directory.
pub fn file_url(dir: &std::path::Path) -> String {
    format!("file://{}", dir.display())
}

/// Deterministic test bytes.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}
