//! Limits, in one type with documented defaults and chainable setters.

/// The engine's limits. Every field has a documented default; setters chain.
///
/// ```
/// let config = ringrpc::Config::default()
///     .max_request_bytes(64 * 1024)
///     .max_depth(32);
/// assert_eq!(config.request_limit(), 64 * 1024);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub(crate) max_request_bytes: usize,
    pub(crate) max_response_bytes: usize,
    pub(crate) max_depth: usize,
}

/// Default [`Config::max_request_bytes`]: 1 MiB.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1024 * 1024;
/// Default [`Config::max_response_bytes`]: 8 MiB.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 8 * 1024 * 1024;
/// Default [`Config::max_depth`]: 64 levels of arrays/objects.
pub const DEFAULT_MAX_DEPTH: usize = 64;

impl Default for Config {
    fn default() -> Self {
        Self {
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            max_depth: DEFAULT_MAX_DEPTH,
        }
    }
}

impl Config {
    /// The largest request frame accepted, in bytes, without its line terminator
    /// (default [`DEFAULT_MAX_REQUEST_BYTES`]). A longer frame is discarded without being
    /// buffered whole and answered with `-32600` naming the limit; this also bounds the
    /// memory a connection's read buffer holds.
    pub fn max_request_bytes(mut self, bytes: usize) -> Self {
        self.max_request_bytes = bytes.max(1);
        self
    }

    /// The largest reply written, in bytes (default [`DEFAULT_MAX_RESPONSE_BYTES`]). A
    /// call whose result would pass it gets a `-32002 Response too large` error instead.
    /// For a batch the bound applies to the whole reply array; the small error objects
    /// that replace oversized results are always written.
    pub fn max_response_bytes(mut self, bytes: usize) -> Self {
        self.max_response_bytes = bytes.max(1);
        self
    }

    /// The deepest nesting of arrays and objects accepted (default
    /// [`DEFAULT_MAX_DEPTH`]); deeper documents get `-32700` naming the limit. This bounds
    /// the parser's stack and every recursive walk of a parsed request.
    pub fn max_depth(mut self, depth: usize) -> Self {
        self.max_depth = depth.clamp(2, 1024);
        self
    }

    /// The request size limit in force.
    pub fn request_limit(&self) -> usize {
        self.max_request_bytes
    }

    /// The response size limit in force.
    pub fn response_limit(&self) -> usize {
        self.max_response_bytes
    }

    /// The nesting depth limit in force.
    pub fn depth_limit(&self) -> usize {
        self.max_depth
    }
}
