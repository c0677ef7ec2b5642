//! [`MediaRefusal`]: why an image part was refused. Every variant is the client's fault (a 400
//! naming the part); a bug of ours never comes out as one of these.

use pagoda_media::MediaError;

use crate::error::{ApiError, InvalidParam};

/// Why an image part could not be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MediaRefusal {
    /// The bytes, or a data URL, were refused by the decoder's checks.
    #[error(transparent)]
    Media(#[from] MediaError),
    /// A URL that does not parse.
    #[error("not a valid URL: {0}")]
    BadUrl(String),
    /// A URL scheme other than `data`, `http`, `https` and `file`.
    #[error("URL scheme `{0}` is not supported (use a data: URL, or http(s):// or file:// where the server allows them)")]
    Scheme(String),
    /// An `http(s)` URL while no domain is allowed.
    #[error("image URLs are not fetched by this server (start it with --allowed-media-domains to allow hosts); send the image as a data: URL")]
    RemoteOff,
    /// An `http(s)` URL (or a redirect) to a host the flags do not list.
    #[error("fetching images from `{0}` is not allowed (not in the server's --allowed-media-domains)")]
    HostNotAllowed(String),
    /// A redirect to a host the flags do not list.
    #[error("the image URL redirects to `{0}`, which is not in the server's --allowed-media-domains")]
    RedirectNotAllowed(String),
    /// More redirects than we follow.
    #[error("the image URL redirects more than {0} times")]
    TooManyRedirects(usize),
    /// The fetch failed (connection, timeout, a non-2xx answer).
    #[error("fetching the image failed: {0}")]
    Fetch(String),
    /// A `file://` URL while no local directory is allowed.
    #[error("file:// image URLs are not allowed (start the server with --allowed-local-media-path)")]
    LocalOff,
    /// A `file://` path outside the allowed directory (after following `..` and symlinks).
    #[error("file:// image URLs must name a file under the server's --allowed-local-media-path")]
    LocalOutside,
    /// A `file://` path that cannot be read.
    #[error("cannot read the file:// image: {0}")]
    LocalRead(String),
}

impl MediaRefusal {
    /// The 400 naming `param`.
    pub fn at(self, param: impl Into<String>) -> ApiError {
        ApiError::InvalidParam(InvalidParam::new(param, self.to_string()))
    }
}
