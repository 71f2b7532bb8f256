//! `fsctl format` through the library: a volume is created once, with its
//! data directory, and bad names or a second format are refused clearly.

use baton_volume::{format, FormatRequest, VolumeError, DEFAULT_BLOCK_SIZE_BYTES};

fn request(base: &std::path::Path, name: &str) -> FormatRequest {
    FormatRequest::new(name, base)
}

#[test]
fn format_creates_metadata_and_data_dir_once() {
    let base = tempfile::tempdir().unwrap();
    let formatted = format(&request(base.path(), "vol1")).unwrap();
    assert_eq!(
        formatted.meta_url,
        format!("sqlite://{}/vol1/meta.db", base.path().display())
    );
    assert!(base.path().join("vol1/meta.db").is_file());
    assert!(base.path().join("vol1/data").is_dir());
    let meta = baton_meta::open(&formatted.meta_url).unwrap();
    assert_eq!(meta.volume().name, "vol1");
    assert_eq!(meta.volume().block_size_bytes, DEFAULT_BLOCK_SIZE_BYTES);

    let before = std::fs::read(base.path().join("vol1/meta.db")).unwrap();
    let err = format(&request(base.path(), "vol1")).unwrap_err();
    assert!(err.to_string().contains("already"), "{err}");
    assert_eq!(
        std::fs::read(base.path().join("vol1/meta.db")).unwrap(),
        before,
        "a refused format changes nothing"
    );
}

#[test]
fn bad_names_and_unreachable_storage_are_refused() {
    let base = tempfile::tempdir().unwrap();
    for name in ["", "../x", ".hidden", "a/b", "sp ace"] {
        assert!(
            matches!(
                format(&request(base.path(), name)),
                Err(VolumeError::InvalidName { .. })
            ),
            "{name:?}"
        );
    }
    let req = request(base.path(), "sqlite:///x/meta.db");
    assert!(
        matches!(format(&req), Err(VolumeError::InvalidName { .. })),
        "a URL is not a name"
    );
    let mut req = request(base.path(), "vol2");
    req.storage_url = Some("ftp://nowhere/x".into());
    let err = format(&req).unwrap_err();
    assert!(matches!(err, VolumeError::FormatStorage { .. }), "{err}");
    assert!(
        !base.path().join("vol2/meta.db").exists(),
        "no metadata is written when storage fails"
    );
}
