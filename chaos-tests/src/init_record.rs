//! Conversion between fuse-wire's [`InitParams`] and upgrade-protocol's
//! [`NegotiatedInit`]: the two crates know nothing of each other, so the
//! binaries that use both convert at their edge.

use fuse_wire::InitParams;
use upgrade_protocol::NegotiatedInit;

/// The record to hand to another process.
pub fn to_record(p: &InitParams) -> NegotiatedInit {
    NegotiatedInit {
        major: p.major,
        minor: p.minor,
        kernel_minor: p.kernel_minor,
        flags: p.flags,
        max_readahead: p.max_readahead,
        max_write: p.max_write,
        max_pages: p.max_pages,
        max_background: p.max_background,
        congestion_threshold: p.congestion_threshold,
        time_gran: p.time_gran,
    }
}

/// The parameters a generation adopts.
pub fn from_record(r: &NegotiatedInit) -> InitParams {
    InitParams {
        major: r.major,
        minor: r.minor,
        kernel_minor: r.kernel_minor,
        flags: r.flags,
        max_readahead: r.max_readahead,
        max_write: r.max_write,
        max_pages: r.max_pages,
        max_background: r.max_background,
        congestion_threshold: r.congestion_threshold,
        time_gran: r.time_gran,
    }
}
