//! Decoding untrusted bytes into the RGB pixels the HF processors start from.
//!
//! Order of checks: byte count, magic (the decoder is chosen by the bytes, never by a declared
//! type), dimensions from the header alone, the container's completeness (see `container`),
//! then the decode itself under the `image` crate's allocation limits. Animated GIF/WebP/APNG give their first frame only, so a thousand-frame
//! "bomb" costs one frame.
//!
//! The conversion to RGB is transformers' `convert_to_rgb` on a PIL image: images with alpha
//! (RGBA, LA, a palette or a colour key with transparency) are composited onto opaque white with
//! PIL's `alpha_composite` integer arithmetic; 16-bit channels keep their high byte, as PIL reads
//! 16-bit RGB(A) PNGs; 16-bit grayscale is clipped to 255, as PIL converts mode `I;16` to RGB.

use std::io::Cursor;

use image::error::{ImageError, LimitErrorKind};
use image::{DynamicImage, ImageDecoder, ImageReader, Limits};

use crate::error::MediaError;
use crate::limits::MediaLimits;
use crate::sniff::{sniff, ImageFormat};

/// An 8-bit RGB image, rows top to bottom, `width * height * 3` bytes (HWC).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RgbImage {
    pub width: u32,
    pub height: u32,
    pub data: Vec<u8>,
}

impl RgbImage {
    /// An image of the given size from HWC bytes; `None` if the length does not match.
    pub fn from_raw(width: u32, height: u32, data: Vec<u8>) -> Option<RgbImage> {
        (data.len() as u64 == u64::from(width) * u64::from(height) * 3).then_some(RgbImage {
            width,
            height,
            data,
        })
    }
}

/// What the header says, read before any pixel is decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageInfo {
    pub format: ImageFormat,
    pub width: u32,
    pub height: u32,
}

/// Checks the size and magic of `bytes` and reads the dimensions from the header, under `limits`.
pub fn probe(bytes: &[u8], limits: &MediaLimits) -> Result<ImageInfo, MediaError> {
    limits.check_bytes(bytes.len() as u64)?;
    let format = sniff(bytes)?;
    // No dimension limits here: the header's dimensions are checked below, with a clearer error.
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format.to_image_crate());
    reader.limits(decoder_limits(limits, false));
    let decoder = reader.into_decoder().map_err(|e| decode_error(format, limits, (0, 0), e, true))?;
    let (width, height) = decoder.dimensions();
    limits.check_dimensions(width, height)?;
    Ok(ImageInfo { format, width, height })
}

/// Decodes `bytes` (PNG, JPEG, WebP, or a GIF's first frame) into RGB as transformers'
/// `convert_to_rgb` does, under `limits`.
pub fn decode_rgb(bytes: &[u8], limits: &MediaLimits) -> Result<RgbImage, MediaError> {
    let info = probe(bytes, limits)?;
    let format = info.format;
    crate::container::check_complete(format, bytes)?;
    let dims = (info.width, info.height);
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format.to_image_crate());
    reader.limits(decoder_limits(limits, true));
    let decoder = reader.into_decoder().map_err(|e| decode_error(format, limits, dims, e, true))?;
    // The decoded buffer plus our RGB copy must fit the allocation limit; the decoders only
    // account for their own working memory.
    let output = decoder.total_bytes().saturating_add(u64::from(info.width) * u64::from(info.height) * 3);
    if output > limits.max_alloc_bytes {
        return Err(MediaError::AllocationLimit { format, limit: limits.max_alloc_bytes });
    }
    let image =
        DynamicImage::from_decoder(decoder).map_err(|e| decode_error(format, limits, dims, e, false))?;
    if (image.width(), image.height()) != (info.width, info.height) {
        return Err(MediaError::Corrupt {
            format,
            detail: format!(
                "decoded {}x{} but the header says {}x{}",
                image.width(),
                image.height(),
                info.width,
                info.height
            ),
        });
    }
    to_rgb(image, format)
}

fn decoder_limits(limits: &MediaLimits, with_dimensions: bool) -> Limits {
    let mut l = Limits::default();
    if with_dimensions {
        l.max_image_width = Some(limits.max_side);
        l.max_image_height = Some(limits.max_side);
    }
    l.max_alloc = Some(limits.max_alloc_bytes);
    l
}

/// Maps the decoder's error: `in_header` tells a header that cannot be read from data that is
/// corrupt after a valid header.
fn decode_error(
    format: ImageFormat,
    limits: &MediaLimits,
    (width, height): (u32, u32),
    e: ImageError,
    in_header: bool,
) -> MediaError {
    match e {
        ImageError::Limits(l) if matches!(l.kind(), LimitErrorKind::DimensionError) => {
            MediaError::TooLarge { width, height, max_side: limits.max_side, max_pixels: limits.max_pixels }
        }
        ImageError::Limits(_) => MediaError::AllocationLimit { format, limit: limits.max_alloc_bytes },
        ImageError::Unsupported(u) => MediaError::UnsupportedFeature { format, detail: u.to_string() },
        other if in_header => MediaError::BadHeader { format, detail: other.to_string() },
        other => MediaError::Corrupt { format, detail: other.to_string() },
    }
}

/// transformers' `convert_to_rgb` (alpha composited onto white) on what PIL would have opened.
fn to_rgb(image: DynamicImage, format: ImageFormat) -> Result<RgbImage, MediaError> {
    let (width, height) = (image.width(), image.height());
    let data = match image {
        DynamicImage::ImageRgb8(buf) => buf.into_raw(),
        DynamicImage::ImageLuma8(buf) => buf.into_raw().iter().flat_map(|&l| [l, l, l]).collect(),
        DynamicImage::ImageRgba8(buf) => {
            buf.into_raw().chunks_exact(4).flat_map(|p| composite_rgb(p[0], p[1], p[2], p[3])).collect()
        }
        DynamicImage::ImageLumaA8(buf) => {
            buf.into_raw().chunks_exact(2).flat_map(|p| composite_rgb(p[0], p[0], p[0], p[1])).collect()
        }
        // PIL opens a 16-bit RGB(A) PNG as 8-bit RGB(A) from each sample's high byte.
        DynamicImage::ImageRgb16(buf) => buf.into_raw().iter().map(|&v| (v >> 8) as u8).collect(),
        DynamicImage::ImageRgba16(buf) => buf
            .into_raw()
            .chunks_exact(4)
            .flat_map(|p| {
                composite_rgb((p[0] >> 8) as u8, (p[1] >> 8) as u8, (p[2] >> 8) as u8, (p[3] >> 8) as u8)
            })
            .collect(),
        DynamicImage::ImageLumaA16(buf) => buf
            .into_raw()
            .chunks_exact(2)
            .flat_map(|p| {
                let l = (p[0] >> 8) as u8;
                composite_rgb(l, l, l, (p[1] >> 8) as u8)
            })
            .collect(),
        // PIL opens 16-bit grayscale as mode `I;16`, whose conversion to RGB clips at 255.
        DynamicImage::ImageLuma16(buf) => buf
            .into_raw()
            .iter()
            .flat_map(|&v| {
                let l = v.min(255) as u8;
                [l, l, l]
            })
            .collect(),
        other => {
            return Err(MediaError::UnsupportedFeature {
                format,
                detail: format!("pixel layout {:?}", other.color()),
            })
        }
    };
    Ok(RgbImage { width, height, data })
}

/// One RGBA pixel composited onto opaque white, as PIL's `alpha_composite` computes it.
fn composite_rgb(r: u8, g: u8, b: u8, a: u8) -> [u8; 3] {
    [composite_channel(r, a), composite_channel(g, a), composite_channel(b, a)]
}

/// PIL's `alpha_composite` of one channel `v` with alpha `a` over opaque white (255, 255).
/// Its integer arithmetic: the source weight is `a * 255 * 255 / out_alpha` with 7 extra bits
/// of precision, and the division by 255 is done by shifts with rounding.
pub fn composite_channel(v: u8, a: u8) -> u8 {
    const PRECISION_BITS: u32 = 7;
    if a == 0 {
        return 255;
    }
    let (v, a) = (u32::from(v), u32::from(a));
    let blend = 255 * (255 - a);
    let out_a255 = a * 255 + blend;
    let coef1 = a * 255 * 255 * (1 << PRECISION_BITS) / out_a255;
    let coef2 = 255 * (1 << PRECISION_BITS) - coef1;
    let tmp = v * coef1 + 255 * coef2 + (0x80 << PRECISION_BITS);
    (((tmp >> 8) + tmp) >> 8 >> PRECISION_BITS) as u8
}
