//! Format detection from the bytes' magic numbers. The declared type (a data URL's MIME, a file
//! name) is never trusted: the decoder is picked from these bytes, and formats we refuse (SVG
//! above all, which is a document that can reference other resources) are named in the error.

use std::fmt;

use crate::error::MediaError;

/// The accepted image formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageFormat {
    Png,
    Jpeg,
    WebP,
    Gif,
}

impl ImageFormat {
    /// The canonical MIME type.
    pub fn mime(self) -> &'static str {
        match self {
            ImageFormat::Png => "image/png",
            ImageFormat::Jpeg => "image/jpeg",
            ImageFormat::WebP => "image/webp",
            ImageFormat::Gif => "image/gif",
        }
    }

    /// The format a MIME type names (case-insensitive; `image/jpg` is accepted because clients
    /// send it), or `None` for anything else.
    pub fn from_mime(mime: &str) -> Option<ImageFormat> {
        match mime.to_ascii_lowercase().as_str() {
            "image/png" => Some(ImageFormat::Png),
            "image/jpeg" | "image/jpg" | "image/pjpeg" => Some(ImageFormat::Jpeg),
            "image/webp" => Some(ImageFormat::WebP),
            "image/gif" => Some(ImageFormat::Gif),
            _ => None,
        }
    }

    pub(crate) fn to_image_crate(self) -> image::ImageFormat {
        match self {
            ImageFormat::Png => image::ImageFormat::Png,
            ImageFormat::Jpeg => image::ImageFormat::Jpeg,
            ImageFormat::WebP => image::ImageFormat::WebP,
            ImageFormat::Gif => image::ImageFormat::Gif,
        }
    }
}

impl fmt::Display for ImageFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ImageFormat::Png => "PNG",
            ImageFormat::Jpeg => "JPEG",
            ImageFormat::WebP => "WebP",
            ImageFormat::Gif => "GIF",
        })
    }
}

/// The format of `bytes`, from their first bytes only.
pub fn sniff(bytes: &[u8]) -> Result<ImageFormat, MediaError> {
    if bytes.is_empty() {
        return Err(MediaError::Empty);
    }
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        return Ok(ImageFormat::Png);
    }
    if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        return Ok(ImageFormat::Jpeg);
    }
    if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        return Ok(ImageFormat::Gif);
    }
    if bytes.len() >= 12 && bytes.starts_with(b"RIFF") && &bytes[8..12] == b"WEBP" {
        return Ok(ImageFormat::WebP);
    }
    if let Some(name) = refused_format(bytes) {
        return Err(MediaError::UnsupportedFormat(name));
    }
    let magic: Vec<String> = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect();
    Err(MediaError::UnknownFormat { magic: magic.join(" ") })
}

/// Names formats that are images (or pose as them) but are refused, for a clearer error.
fn refused_format(bytes: &[u8]) -> Option<&'static str> {
    let starts = |m: &[u8]| bytes.starts_with(m);
    if starts(b"BM") {
        return Some("BMP");
    }
    if starts(b"II*\0") || starts(b"MM\0*") {
        return Some("TIFF");
    }
    if starts(&[0, 0, 1, 0]) {
        return Some("ICO");
    }
    if starts(b"%PDF") {
        return Some("PDF");
    }
    if starts(b"8BPS") {
        return Some("PSD");
    }
    if starts(b"qoif") {
        return Some("QOI");
    }
    if starts(&[0xFF, 0x0A]) || starts(b"\0\0\0\x0cJXL ") {
        return Some("JPEG XL");
    }
    if bytes.len() >= 12 && &bytes[4..8] == b"ftyp" {
        let brand = &bytes[8..12];
        return Some(if brand == b"avif" || brand == b"avis" { "AVIF" } else { "HEIF/ISO media" });
    }
    if looks_like_svg(bytes) {
        return Some("SVG");
    }
    None
}

/// SVG is text: an optional BOM and whitespace, then an XML declaration, a doctype, a comment
/// or the `<svg` element itself. Only the first 512 bytes are looked at.
fn looks_like_svg(bytes: &[u8]) -> bool {
    let head = &bytes[..bytes.len().min(512)];
    let head = head.strip_prefix(&[0xEF, 0xBB, 0xBF]).unwrap_or(head);
    let start = head.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(head.len());
    let head = String::from_utf8_lossy(&head[start..]).to_ascii_lowercase();
    head.starts_with("<svg")
        || ((head.starts_with("<?xml") || head.starts_with("<!doctype") || head.starts_with("<!--"))
            && head.contains("<svg"))
        || head.starts_with("<!doctype svg")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mime_names_round_trip() {
        for f in [ImageFormat::Png, ImageFormat::Jpeg, ImageFormat::WebP, ImageFormat::Gif] {
            assert_eq!(ImageFormat::from_mime(f.mime()), Some(f));
        }
        assert_eq!(ImageFormat::from_mime("IMAGE/JPG"), Some(ImageFormat::Jpeg));
        assert_eq!(ImageFormat::from_mime("image/svg+xml"), None);
    }

    #[test]
    fn svg_variants_are_named() {
        for svg in [
            &b"<svg xmlns='http://www.w3.org/2000/svg'/>"[..],
            b"\xEF\xBB\xBF  <?xml version='1.0'?>\n<svg/>",
        ] {
            assert_eq!(sniff(svg), Err(MediaError::UnsupportedFormat("SVG")));
        }
        assert!(matches!(sniff(b"<?xml version='1.0'?><html/>"), Err(MediaError::UnknownFormat { .. })));
    }
}
