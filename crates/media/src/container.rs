//! Structural checks that the Rust decoders are lenient about but PIL (and so the HF
//! processors) is not: a JPEG must reach its end-of-image marker, and a WebP's RIFF header must
//! not claim more bytes than there are. A truncated file is refused as corrupt instead of being
//! decoded with made-up pixels.

use crate::error::MediaError;
use crate::sniff::ImageFormat;

/// Refuses a JPEG or WebP whose container says it is truncated; other formats pass.
pub fn check_complete(format: ImageFormat, bytes: &[u8]) -> Result<(), MediaError> {
    match format {
        ImageFormat::Jpeg => check_jpeg(bytes),
        ImageFormat::WebP => check_webp(bytes),
        ImageFormat::Png | ImageFormat::Gif => Ok(()),
    }
}

fn corrupt(format: ImageFormat, detail: &str) -> MediaError {
    MediaError::Corrupt { format, detail: detail.to_string() }
}

/// Walks the JPEG's marker segments (skipping each by its length, so an EXIF thumbnail's own
/// markers are never seen) and the entropy-coded data after each SOS (where a 0xFF byte is
/// followed by 0x00 stuffing or a restart marker), until the EOI marker.
fn check_jpeg(bytes: &[u8]) -> Result<(), MediaError> {
    let truncated = || corrupt(ImageFormat::Jpeg, "truncated: no end-of-image marker");
    let mut i = 2; // after SOI
    loop {
        // Fill bytes (0xFF runs) may precede a marker.
        while bytes.get(i) == Some(&0xFF) && bytes.get(i + 1) == Some(&0xFF) {
            i += 1;
        }
        if bytes.get(i) != Some(&0xFF) {
            return Err(bytes
                .get(i)
                .map_or_else(truncated, |_| corrupt(ImageFormat::Jpeg, "expected a marker")));
        }
        let marker = *bytes.get(i + 1).ok_or_else(truncated)?;
        i += 2;
        match marker {
            0xD9 => return Ok(()),
            0xD0..=0xD7 | 0x01 => continue, // no length
            _ => {}
        }
        let len = usize::from(u16::from_be_bytes([
            *bytes.get(i).ok_or_else(truncated)?,
            *bytes.get(i + 1).ok_or_else(truncated)?,
        ]));
        if len < 2 {
            return Err(corrupt(ImageFormat::Jpeg, "marker segment length below 2"));
        }
        i += len;
        if i > bytes.len() {
            return Err(truncated());
        }
        if marker == 0xDA {
            // Entropy-coded data up to the next marker that is not stuffing or a restart.
            loop {
                let at = bytes[i..].iter().position(|&b| b == 0xFF).ok_or_else(truncated)?;
                i += at;
                match bytes.get(i + 1) {
                    None => return Err(truncated()),
                    Some(0x00) | Some(0xD0..=0xD7) | Some(0xFF) => i += 1,
                    Some(_) => break,
                }
            }
        }
    }
}

/// The RIFF size field (bytes 4..8) counts the bytes after it; more than are present means
/// the file was cut.
fn check_webp(bytes: &[u8]) -> Result<(), MediaError> {
    let size = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]) as u64;
    let present = bytes.len() as u64 - 8;
    if size > present {
        return Err(MediaError::Corrupt {
            format: ImageFormat::WebP,
            detail: format!("truncated: the RIFF header says {size} bytes follow, {present} do"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jpeg_walker_handles_stuffing_restarts_and_fill() {
        // SOI, APP0 (len 4), SOS (len 3 + 1 byte), data with FF00 and RST0, fill bytes, EOI.
        let ok = [
            0xFF, 0xD8, 0xFF, 0xE0, 0, 4, 1, 2, 0xFF, 0xDA, 0, 3, 9, 0x12, 0xFF, 0x00, 0xFF, 0xD0, 0x34,
            0xFF, 0xFF, 0xD9,
        ];
        assert_eq!(check_jpeg(&ok), Ok(()));
        assert!(check_jpeg(&ok[..ok.len() - 1]).is_err());
        assert!(check_jpeg(&ok[..12]).is_err());
    }
}
