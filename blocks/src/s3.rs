//! `s3://BUCKET/PREFIX?endpoint=URL&region=NAME`: parsing the S3 storage
//! URL a volume records, and building `object_store`'s Amazon S3 client
//! from it with Baton's timeouts and retry policy.
//!
//! Only non-secret settings live in the URL (it is stored in the volume's
//! metadata). Credentials come from the usual environment variables
//! (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, web
//! identity, container or instance credentials) through
//! `AmazonS3Builder::from_env`; settings in the URL win over the
//! environment. A custom endpoint gets path-style requests (bucket in the
//! path, as MinIO, Ceph RGW and other S3-compatible servers expect), and
//! plain `http://` is allowed only when the endpoint says so.

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::prefix::PrefixStore;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, RetryConfig};

use crate::error::{BlocksError, Result};

/// Time to establish one TCP (+TLS) connection to the endpoint.
pub const S3_CONNECT_TIMEOUT_MS: u64 = 5_000;
/// Time for one whole request, body included (a 64 MiB block at ~2 MB/s).
pub const S3_REQUEST_TIMEOUT_MS: u64 = 60_000;
/// Retries of one request on transient errors (5xx, throttling, resets).
pub const S3_RETRY_COUNT_MAX: usize = 4;
/// First backoff between retries; doubles up to [`S3_BACKOFF_MS_MAX`].
pub const S3_BACKOFF_MS_INITIAL: u64 = 100;
/// Upper bound of one backoff sleep.
pub const S3_BACKOFF_MS_MAX: u64 = 2_000;
/// No retry starts later than this after the first attempt.
pub const S3_RETRY_WINDOW_MS_MAX: u64 = 30_000;

/// The parts of an `s3://` storage URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Location {
    /// Bucket name.
    pub bucket: String,
    /// Key prefix inside the bucket (no leading or trailing `/`), may be empty.
    pub prefix: String,
    /// Custom endpoint (`http://127.0.0.1:9000`), `None` for AWS.
    pub endpoint: Option<String>,
    /// Region (`us-east-1` when neither URL nor environment say).
    pub region: Option<String>,
}

impl S3Location {
    /// Parses `s3://BUCKET[/PREFIX][?endpoint=URL&region=NAME]`. Pure.
    pub fn parse(url: &str) -> Result<S3Location> {
        let bad = |reason: &str| BlocksError::InvalidUrl {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| bad("an S3 URL starts with s3://"))?;
        let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (bucket, prefix) = location.split_once('/').unwrap_or((location, ""));
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.'));
        if !bucket_ok {
            return Err(bad(
                "the bucket name must be 3-63 characters of a-z, 0-9, '-' and '.' (s3://BUCKET/PREFIX)",
            ));
        }
        let prefix = prefix.trim_matches('/');
        if prefix.split('/').any(|p| p == "." || p == "..") || prefix.contains("//") {
            return Err(bad("the prefix must not contain '.', '..' or empty parts"));
        }
        let mut parsed = S3Location {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
            endpoint: None,
            region: None,
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("endpoint", v)) if v.starts_with("http://") || v.starts_with("https://") => {
                    parsed.endpoint = Some(v.trim_end_matches('/').to_string());
                }
                Some(("endpoint", _)) => {
                    return Err(bad("endpoint must be an http:// or https:// URL"))
                }
                Some(("region", v)) if !v.is_empty() => parsed.region = Some(v.to_string()),
                _ => {
                    return Err(bad(
                        "unknown query parameter: only endpoint=URL and region=NAME are understood",
                    ))
                }
            }
        }
        Ok(parsed)
    }

    /// The URL again, in the canonical form recorded in a volume. Pure.
    pub fn to_url(&self) -> String {
        let mut url = format!("s3://{}", self.bucket);
        if !self.prefix.is_empty() {
            url.push('/');
            url.push_str(&self.prefix);
        }
        let mut query = Vec::new();
        if let Some(endpoint) = &self.endpoint {
            query.push(format!("endpoint={endpoint}"));
        }
        if let Some(region) = &self.region {
            query.push(format!("region={region}"));
        }
        if !query.is_empty() {
            url.push('?');
            url.push_str(&query.join("&"));
        }
        url
    }

    /// Builds the client: environment first, then the URL's settings,
    /// Baton's timeouts and retries, and the prefix.
    pub fn build(&self) -> Result<Arc<dyn ObjectStore>> {
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(&self.bucket)
            .with_retry(retry_config())
            .with_client_options(client_options(self.endpoint.as_deref()));
        if let Some(endpoint) = &self.endpoint {
            // AWS_ENDPOINT_URL_S3 would otherwise override the recorded one.
            builder = builder
                .with_endpoint(endpoint)
                .with_config(AmazonS3ConfigKey::S3Endpoint, endpoint)
                .with_virtual_hosted_style_request(false)
                .with_allow_http(endpoint.starts_with("http://"));
        }
        if let Some(region) = &self.region {
            builder = builder.with_region(region);
        }
        let s3 = builder.build().map_err(|source| BlocksError::S3Config {
            url: self.to_url(),
            source,
        })?;
        if self.prefix.is_empty() {
            Ok(Arc::new(s3))
        } else {
            Ok(Arc::new(PrefixStore::new(s3, self.prefix.as_str())))
        }
    }
}

/// Adds `--s3-endpoint` / `--s3-region` settings to an `s3://` URL (they
/// replace what the URL says). Other URLs are returned unchanged when no
/// setting is given, and refused when one is. Pure.
pub fn with_s3_settings(url: &str, endpoint: Option<&str>, region: Option<&str>) -> Result<String> {
    if !url.starts_with("s3://") {
        if endpoint.is_some() || region.is_some() {
            return Err(BlocksError::InvalidUrl {
                url: url.to_string(),
                reason: "S3 endpoint and region apply only to s3:// storage".to_string(),
            });
        }
        return Ok(url.to_string());
    }
    let (url, codec) = crate::codec::CodecSpec::split_url(url)?;
    let mut location = S3Location::parse(&url)?;
    if let Some(endpoint) = endpoint {
        let with = format!("s3://{}?endpoint={endpoint}", location.bucket);
        location.endpoint = S3Location::parse(&with)?.endpoint;
    }
    if let Some(region) = region {
        location.region = Some(region.to_string());
    }
    Ok(codec.add_to_url(&location.to_url()))
}

fn retry_config() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(S3_BACKOFF_MS_INITIAL),
            max_backoff: Duration::from_millis(S3_BACKOFF_MS_MAX),
            base: 2.0,
        },
        max_retries: S3_RETRY_COUNT_MAX,
        retry_timeout: Duration::from_millis(S3_RETRY_WINDOW_MS_MAX),
    }
}

fn client_options(endpoint: Option<&str>) -> ClientOptions {
    ClientOptions::new()
        .with_connect_timeout(Duration::from_millis(S3_CONNECT_TIMEOUT_MS))
        .with_timeout(Duration::from_millis(S3_REQUEST_TIMEOUT_MS))
        .with_allow_http(endpoint.is_some_and(|e| e.starts_with("http://")))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_and_print_back() {
        let l = S3Location::parse(
            "s3://my-bucket/a/b/?region=eu-west-1&endpoint=http://127.0.0.1:9000/",
        )
        .unwrap();
        assert_eq!(l.bucket, "my-bucket");
        assert_eq!(l.prefix, "a/b");
        assert_eq!(l.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(l.region.as_deref(), Some("eu-west-1"));
        assert_eq!(
            l.to_url(),
            "s3://my-bucket/a/b?endpoint=http://127.0.0.1:9000&region=eu-west-1"
        );
        assert_eq!(S3Location::parse(&l.to_url()).unwrap(), l);
        let bare = S3Location::parse("s3://bkt").unwrap();
        assert_eq!((bare.prefix.as_str(), bare.endpoint.as_deref()), ("", None));
        assert_eq!(bare.to_url(), "s3://bkt");
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        for (url, says) in [
            ("s3://", "bucket name"),
            ("s3://UPPER/x", "bucket name"),
            ("s3://b_x/x", "bucket name"),
            ("s3://bkt/a/../b", "prefix"),
            ("s3://bkt/a//b", "prefix"),
            ("s3://bkt?endpoint=ftp://x", "http://"),
            ("s3://bkt?secret=x", "unknown query parameter"),
            ("file:///x", "s3://"),
        ] {
            let err = S3Location::parse(url).unwrap_err().to_string();
            assert!(err.contains(says), "{url}: {err}");
        }
    }

    #[test]
    fn settings_are_folded_into_s3_urls_only() {
        assert_eq!(
            with_s3_settings("s3://bkt/p", Some("http://h:1"), Some("r")).unwrap(),
            "s3://bkt/p?endpoint=http://h:1&region=r"
        );
        assert_eq!(
            with_s3_settings("s3://bkt?region=a", None, Some("b")).unwrap(),
            "s3://bkt?region=b"
        );
        assert_eq!(
            with_s3_settings("file:///d", None, None).unwrap(),
            "file:///d"
        );
        assert!(with_s3_settings("file:///d", Some("http://h"), None).is_err());
        assert_eq!(
            with_s3_settings("s3://bkt?compression=lz4", None, Some("r")).unwrap(),
            "s3://bkt?region=r&compression=lz4"
        );
        assert!(with_s3_settings("s3://bkt", Some("h:1"), None).is_err());
    }
}
