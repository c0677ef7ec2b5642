//! The one error type of this crate: every way untrusted image input can be refused, each
//! saying what was wrong, so the API layer can turn it into a 400 that names the part.

use crate::sniff::ImageFormat;

/// Why an image (or a prompt that refers to images) was refused.
///
/// Every variant is a client error: nothing here is raised for a bug on our side, so the API
/// maps all of them to a 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MediaError {
    /// No bytes at all (an empty file, or a data URL with nothing after the comma).
    #[error("image is empty (0 bytes)")]
    Empty,
    /// More bytes than `MediaLimits::max_bytes` (checked before any decoding, and for a data URL
    /// before the base64 is decoded).
    #[error("image is {size} bytes, over the limit of {limit} bytes")]
    TooManyBytes { size: u64, limit: u64 },
    /// The bytes are no image format we know of.
    #[error("not a recognised image format (first bytes: {magic})")]
    UnknownFormat { magic: String },
    /// A recognised format that is not accepted (SVG, BMP, TIFF, HEIC, ...).
    #[error("{0} images are not accepted (only PNG, JPEG, WebP and GIF)")]
    UnsupportedFormat(&'static str),
    /// A data URL whose media type is not one of the accepted image types.
    #[error("media type {0:?} is not an accepted image type (image/png, image/jpeg, image/webp, image/gif)")]
    UnsupportedMime(String),
    /// A data URL whose declared media type disagrees with the bytes' magic.
    #[error("data URL declares {declared} but the bytes are {actual}")]
    MimeMismatch { declared: String, actual: ImageFormat },
    /// A data URL that does not follow `data:<mime>;base64,<data>`.
    #[error("malformed data URL: {0}")]
    DataUrl(&'static str),
    /// The base64 payload of a data URL does not decode.
    #[error("invalid base64 in data URL: {0}")]
    Base64(String),
    /// The header declares a zero width or height.
    #[error("image has a zero dimension ({width}x{height})")]
    ZeroSize { width: u32, height: u32 },
    /// The header declares more pixels, or a longer side, than the limits allow.
    #[error(
        "image is {width}x{height}, over the limits ({max_side} pixels a side, {max_pixels} pixels in all)"
    )]
    TooLarge { width: u32, height: u32, max_side: u32, max_pixels: u64 },
    /// The header could not be read (truncated before the dimensions, or invalid).
    #[error("{format} header is malformed or truncated: {detail}")]
    BadHeader { format: ImageFormat, detail: String },
    /// The image data after the header is corrupt or truncated.
    #[error("{format} data is corrupt or truncated: {detail}")]
    Corrupt { format: ImageFormat, detail: String },
    /// Decoding would allocate more than `MediaLimits::max_alloc_bytes`.
    #[error("decoding this {format} would need more memory than the limit of {limit} bytes")]
    AllocationLimit { format: ImageFormat, limit: u64 },
    /// A valid file using a feature of its format that the decoder does not implement.
    #[error("{format} feature not supported: {detail}")]
    UnsupportedFeature { format: ImageFormat, detail: String },
    /// More images in one request than `MediaLimits::max_images_per_request`.
    #[error("{count} images in one request, over the limit of {limit}")]
    TooManyImages { count: usize, limit: usize },
    /// The prompt's image placeholders and the images given do not match in number.
    #[error("the prompt has {placeholders} {token} placeholders but {images} images were given")]
    PlaceholderCount { token: &'static str, placeholders: usize, images: usize },
}
