//! Limits on untrusted images, checked before any pixel is decoded (the bytes first, then the
//! dimensions read from the header), and handed to the decoder as its allocation limit.

use crate::error::MediaError;

/// Resource limits for one image and for one request.
///
/// The defaults follow what the large hosted APIs document for a single image (tens of MB,
/// tens of megapixels) and keep the worst case of one decode to about 256 MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MediaLimits {
    /// Largest encoded image, in bytes (the decoded bytes of a data URL). Default 20 MiB.
    pub max_bytes: u64,
    /// Longest side, in pixels. Default 16384.
    pub max_side: u32,
    /// Most pixels (width x height). Default 40,000,000 (a 40-megapixel photo).
    pub max_pixels: u64,
    /// Most bytes the decoder may allocate at once (its own buffers and the output). Default
    /// 256 MiB: an RGBA8 image at `max_pixels` (160 MB) plus the decoder's working memory.
    pub max_alloc_bytes: u64,
    /// Most images in one request, like vLLM's `--limit-mm-per-prompt image=N`. The decoder
    /// sees one image at a time, so the caller enforces this with
    /// [`MediaLimits::check_image_count`] before decoding any of them. Default 8.
    pub max_images_per_request: usize,
}

impl Default for MediaLimits {
    fn default() -> Self {
        Self {
            max_bytes: 20 * 1024 * 1024,
            max_side: 16_384,
            max_pixels: 40_000_000,
            max_alloc_bytes: 256 * 1024 * 1024,
            max_images_per_request: 8,
        }
    }
}

impl MediaLimits {
    /// Refuses a request with more images than allowed.
    pub fn check_image_count(&self, count: usize) -> Result<(), MediaError> {
        if count > self.max_images_per_request {
            return Err(MediaError::TooManyImages { count, limit: self.max_images_per_request });
        }
        Ok(())
    }

    /// Refuses an encoded image that is empty or larger than `max_bytes`.
    pub fn check_bytes(&self, size: u64) -> Result<(), MediaError> {
        if size == 0 {
            return Err(MediaError::Empty);
        }
        if size > self.max_bytes {
            return Err(MediaError::TooManyBytes { size, limit: self.max_bytes });
        }
        Ok(())
    }

    /// Refuses dimensions (from the header) that are zero or over the limits.
    pub fn check_dimensions(&self, width: u32, height: u32) -> Result<(), MediaError> {
        if width == 0 || height == 0 {
            return Err(MediaError::ZeroSize { width, height });
        }
        if width > self.max_side
            || height > self.max_side
            || u64::from(width) * u64::from(height) > self.max_pixels
        {
            return Err(MediaError::TooLarge {
                width,
                height,
                max_side: self.max_side,
                max_pixels: self.max_pixels,
            });
        }
        Ok(())
    }
}
