//! `data:` URLs (RFC 2397) as the chat APIs send images: `data:image/png;base64,<data>`.
//! The size is checked on the encoded length before anything is decoded, and the declared
//! MIME type must agree with the magic of the decoded bytes.

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;

use crate::error::MediaError;
use crate::limits::MediaLimits;
use crate::sniff::{sniff, ImageFormat};

/// Standard alphabet; padding optional, as some clients strip it.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// A decoded data URL: its bytes and the format both its MIME type and its magic agree on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataUrl {
    pub format: ImageFormat,
    pub bytes: Vec<u8>,
}

/// Parses and decodes an image data URL under `limits`.
pub fn parse_data_url(url: &str, limits: &MediaLimits) -> Result<DataUrl, MediaError> {
    let rest = url
        .get(..5)
        .filter(|scheme| scheme.eq_ignore_ascii_case("data:"))
        .map(|_| &url[5..])
        .ok_or(MediaError::DataUrl("does not start with `data:`"))?;
    let (header, payload) = rest.split_once(',').ok_or(MediaError::DataUrl("no `,` before the data"))?;
    let mut params = header.split(';');
    let mime = params.next().unwrap_or("").trim();
    // `;base64` must be the last parameter (RFC 2397); others (`charset=...`) are ignored.
    let is_base64 = header.rsplit(';').next().is_some_and(|p| p.trim().eq_ignore_ascii_case("base64"))
        && header.contains(';');
    if mime.is_empty() {
        return Err(MediaError::DataUrl("no media type (expected e.g. `data:image/png;base64,`)"));
    }
    let declared = match ImageFormat::from_mime(mime) {
        Some(format) => format,
        None if mime.eq_ignore_ascii_case("image/svg+xml") => {
            return Err(MediaError::UnsupportedFormat("SVG"))
        }
        None => return Err(MediaError::UnsupportedMime(mime.to_string())),
    };
    if !is_base64 {
        return Err(MediaError::DataUrl("image data must be base64 (`;base64,`)"));
    }
    // Every 4 base64 characters are at most 3 bytes: refuse before allocating the decoded bytes.
    let significant = payload.bytes().filter(|b| !b.is_ascii_whitespace() && *b != b'=').count() as u64;
    let decoded_len = significant / 4 * 3 + (significant % 4).saturating_sub(1);
    limits.check_bytes(decoded_len)?;
    let compact: Vec<u8> = payload.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    let bytes = BASE64.decode(&compact).map_err(|e| MediaError::Base64(e.to_string()))?;
    limits.check_bytes(bytes.len() as u64)?;
    let actual = sniff(&bytes)?;
    if actual != declared {
        return Err(MediaError::MimeMismatch { declared: mime.to_string(), actual });
    }
    Ok(DataUrl { format: actual, bytes })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PNG_MAGIC_B64: &str = "iVBORw0KGgo="; // the 8-byte PNG signature

    #[test]
    fn accepts_png_with_parameters_and_whitespace() {
        let url = format!("DATA:image/PNG;name=a.png;base64,{}\n", PNG_MAGIC_B64);
        let parsed = parse_data_url(&url, &MediaLimits::default()).unwrap();
        assert_eq!(parsed.format, ImageFormat::Png);
        assert_eq!(parsed.bytes, b"\x89PNG\r\n\x1a\n");
    }

    #[test]
    fn size_is_checked_before_decoding() {
        let limits = MediaLimits { max_bytes: 5, ..MediaLimits::default() };
        let url = format!("data:image/png;base64,{PNG_MAGIC_B64}");
        assert_eq!(parse_data_url(&url, &limits), Err(MediaError::TooManyBytes { size: 8, limit: 5 }));
    }
}
