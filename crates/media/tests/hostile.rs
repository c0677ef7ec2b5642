//! Hostile inputs: each must be refused with the right typed error, never a panic, and never a
//! large allocation (the limits are checked before decoding, and the decoder runs under an
//! allocation limit). The corpus is generated here; the valid fixture images of
//! tests/fixtures/media/ are cut and corrupted to make the truncated cases.

mod common;

use pagoda_media::{decode_rgb, parse_data_url, probe, ImageFormat, MediaError, MediaLimits};

// ------------------------------------------------------------------------------------------
// Builders for hand-made headers
// ------------------------------------------------------------------------------------------

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

fn chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut out = (data.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let mut crc_input = kind.to_vec();
    crc_input.extend_from_slice(data);
    out.extend_from_slice(&crc32(&crc_input).to_be_bytes());
    out
}

fn ihdr(width: u32, height: u32, depth: u8, color: u8) -> Vec<u8> {
    let mut d = width.to_be_bytes().to_vec();
    d.extend_from_slice(&height.to_be_bytes());
    d.extend_from_slice(&[depth, color, 0, 0, 0]);
    chunk(b"IHDR", &d)
}

const PNG_SIG: &[u8] = b"\x89PNG\r\n\x1a\n";

/// A zlib stream of `len` zero bytes, stored uncompressed in blocks (valid deflate).
fn zlib_stored(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0x78, 0x01];
    let blocks: Vec<&[u8]> = if data.is_empty() { vec![&[]] } else { data.chunks(65_535).collect() };
    for (i, block) in blocks.iter().enumerate() {
        out.push(u8::from(i + 1 == blocks.len()));
        let len = block.len() as u16;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(block);
    }
    let (mut a, mut b) = (1u32, 0u32);
    for &x in data {
        a = (a + u32::from(x)) % 65_521;
        b = (b + a) % 65_521;
    }
    out.extend_from_slice(&((b << 16) | a).to_be_bytes());
    out
}

fn png(width: u32, height: u32, depth: u8, color: u8, idat: &[u8]) -> Vec<u8> {
    let mut out = PNG_SIG.to_vec();
    out.extend(ihdr(width, height, depth, color));
    out.extend(chunk(b"IDAT", idat));
    out.extend(chunk(b"IEND", b""));
    out
}

/// A valid 8-bit RGB PNG of the given size, all black (each row: filter byte + pixels).
fn black_png(width: u32, height: u32) -> Vec<u8> {
    let raw = vec![0u8; (width as usize * 3 + 1) * height as usize];
    png(width, height, 8, 2, &zlib_stored(&raw))
}

fn gif_header(width: u16, height: u16) -> Vec<u8> {
    let mut out = b"GIF89a".to_vec();
    out.extend_from_slice(&width.to_le_bytes());
    out.extend_from_slice(&height.to_le_bytes());
    out.extend_from_slice(&[0x80, 0, 0]); // global colour table of 2 entries
    out.extend_from_slice(&[0, 0, 0, 255, 255, 255]);
    out
}

/// One GIF frame at (0, 0) of `w x h` with a tiny LZW stream (clear, one pixel, end).
fn gif_frame(w: u16, h: u16) -> Vec<u8> {
    let mut out = vec![0x2C, 0, 0, 0, 0];
    out.extend_from_slice(&w.to_le_bytes());
    out.extend_from_slice(&h.to_le_bytes());
    out.push(0);
    // LZW minimum code size 2, one sub-block of 3-bit codes: clear (4), index 0, end (5).
    out.extend_from_slice(&[2, 2, 0x44, 0x01, 0]);
    out
}

/// The fixture JPEG with its SOF0 dimensions replaced (the rest stays a valid JPEG).
fn jpeg_resized_header(width: u16, height: u16) -> Vec<u8> {
    let mut jpeg = fixture("photo.jpg");
    let sof = jpeg.windows(2).position(|w| w == [0xFF, 0xC0]).expect("SOF0");
    jpeg[sof + 5..sof + 7].copy_from_slice(&height.to_be_bytes());
    jpeg[sof + 7..sof + 9].copy_from_slice(&width.to_be_bytes());
    jpeg
}

/// The fixture lossless WebP (a plain VP8L file) with its dimensions replaced.
fn webp_resized_header(width: u32, height: u32) -> Vec<u8> {
    let mut webp = fixture("lossless.webp");
    assert_eq!(&webp[12..16], b"VP8L");
    let bits = u32::from_le_bytes(webp[21..25].try_into().unwrap());
    let bits = (bits & !0x0FFF_FFFF) | (width - 1) | ((height - 1) << 14);
    webp[21..25].copy_from_slice(&bits.to_le_bytes());
    webp
}

fn jpeg_with_sof(width: u16, height: u16) -> Vec<u8> {
    let mut out = vec![0xFF, 0xD8];
    // SOF0: length 11, precision 8, height, width, 1 component (id 1, 1x1, table 0)
    out.extend_from_slice(&[0xFF, 0xC0, 0, 11, 8]);
    out.extend_from_slice(&height.to_be_bytes());
    out.extend_from_slice(&width.to_be_bytes());
    out.extend_from_slice(&[1, 1, 0x11, 0]);
    out.extend_from_slice(&[0xFF, 0xD9]);
    out
}

fn webp_vp8x_only(canvas_w: u32, canvas_h: u32) -> Vec<u8> {
    let mut vp8x = vec![0u8; 10];
    vp8x[4..7].copy_from_slice(&(canvas_w - 1).to_le_bytes()[..3]);
    vp8x[7..10].copy_from_slice(&(canvas_h - 1).to_le_bytes()[..3]);
    let mut body = b"WEBP".to_vec();
    body.extend_from_slice(b"VP8X");
    body.extend_from_slice(&10u32.to_le_bytes());
    body.extend_from_slice(&vp8x);
    let mut out = b"RIFF".to_vec();
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend(body);
    out
}

fn fixture(name: &str) -> Vec<u8> {
    common::read(name)
}

fn cut(bytes: &[u8], fraction: f64) -> Vec<u8> {
    bytes[..(bytes.len() as f64 * fraction) as usize].to_vec()
}

fn decode(bytes: &[u8]) -> Result<(u32, u32), MediaError> {
    decode_rgb(bytes, &MediaLimits::default()).map(|i| (i.width, i.height))
}

// ------------------------------------------------------------------------------------------
// The corpus
// ------------------------------------------------------------------------------------------

/// What a case must give.
#[derive(Debug)]
enum Expect {
    Empty,
    TooManyBytes,
    Unknown,
    Refused(&'static str),
    ZeroSize,
    TooLarge,
    BadHeader(ImageFormat),
    Corrupt(ImageFormat),
    Alloc,
}

/// `None` if `result` is the expected error, else what went wrong.
fn check(name: &str, result: Result<(u32, u32), MediaError>, expect: &Expect) -> Option<String> {
    let err = match result {
        Ok(dims) => return Some(format!("{name}: decoded {dims:?}, expected {expect:?}")),
        Err(e) => e,
    };
    let ok = match (expect, &err) {
        (Expect::Empty, MediaError::Empty) => true,
        (Expect::TooManyBytes, MediaError::TooManyBytes { .. }) => true,
        (Expect::Unknown, MediaError::UnknownFormat { .. }) => true,
        (Expect::Refused(want), MediaError::UnsupportedFormat(got)) => want == got,
        (Expect::ZeroSize, MediaError::ZeroSize { .. }) => true,
        (Expect::TooLarge, MediaError::TooLarge { .. }) => true,
        (Expect::BadHeader(f), MediaError::BadHeader { format, .. }) => f == format,
        (Expect::Corrupt(f), MediaError::Corrupt { format, .. }) => f == format,
        (Expect::Alloc, MediaError::AllocationLimit { .. }) => true,
        _ => false,
    };
    (!ok).then(|| format!("{name}: got {err:?} ({err}), expected {expect:?}"))
}

fn corpus() -> Vec<(&'static str, Vec<u8>, Expect)> {
    use Expect::*;
    use ImageFormat::{Gif, Jpeg, Png, WebP};
    let landscape = fixture("landscape.png");
    let photo = fixture("photo.jpg");
    let lossless = fixture("lossless.webp");
    let lossy = fixture("lossy.webp");
    let anim = fixture("anim.gif");
    let mut bad_crc = black_png(4, 4);
    bad_crc[29] ^= 0xFF; // inside IHDR's CRC
    let mut gif_huge_frame = gif_header(8, 8);
    gif_huge_frame.extend(gif_frame(60_000, 60_000));
    gif_huge_frame.push(0x3B);
    let mut webp_bad_size = lossless.clone();
    webp_bad_size[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    let mut jpeg_garbage_scan = photo[..photo.len() / 3].to_vec();
    jpeg_garbage_scan.extend(std::iter::repeat_n(0xA5u8, 2000));
    let mut huge_iccp = PNG_SIG.to_vec();
    huge_iccp.extend(ihdr(4, 4, 8, 2));
    huge_iccp.extend_from_slice(&0x7FFF_FFF0u32.to_be_bytes());
    huge_iccp.extend_from_slice(b"iCCP");
    huge_iccp.extend_from_slice(&[0u8; 64]);
    vec![
        ("empty", vec![], Empty),
        ("one zero byte", vec![0], Unknown),
        ("21 MiB file", [PNG_SIG.to_vec(), vec![0; 21 << 20]].concat(), TooManyBytes),
        ("garbage", (0..1024u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect(), Unknown),
        ("plain text", b"hello, this is not an image".to_vec(), Unknown),
        ("html", b"<!DOCTYPE html><html><body>x</body></html>".to_vec(), Unknown),
        (
            "svg",
            b"<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"1\" height=\"1\"/>".to_vec(),
            Refused("SVG"),
        ),
        ("svg with xml declaration", b"<?xml version=\"1.0\"?>\n<svg/>".to_vec(), Refused("SVG")),
        (
            "svg with BOM and doctype",
            b"\xEF\xBB\xBF<!DOCTYPE svg PUBLIC \"-//W3C//DTD SVG 1.1//EN\"><svg/>".to_vec(),
            Refused("SVG"),
        ),
        ("bmp", b"BM\x3a\0\0\0\0\0\0\0\x36\0\0\0".to_vec(), Refused("BMP")),
        ("tiff little-endian", b"II*\0\x08\0\0\0".to_vec(), Refused("TIFF")),
        ("tiff big-endian", b"MM\0*\0\0\0\x08".to_vec(), Refused("TIFF")),
        ("ico", vec![0, 0, 1, 0, 1, 0, 16, 16], Refused("ICO")),
        ("pdf", b"%PDF-1.7\n%\xE2\xE3".to_vec(), Refused("PDF")),
        ("avif", b"\0\0\0\x1cftypavif\0\0\0\0".to_vec(), Refused("AVIF")),
        ("heic", b"\0\0\0\x18ftypheic\0\0\0\0".to_vec(), Refused("HEIF/ISO media")),
        ("jpeg xl", vec![0xFF, 0x0A, 0xFA, 0x7F], Refused("JPEG XL")),
        ("png signature only", PNG_SIG.to_vec(), BadHeader(Png)),
        ("png cut inside IHDR", black_png(4, 4)[..20].to_vec(), BadHeader(Png)),
        ("png IHDR CRC wrong", bad_crc, BadHeader(Png)),
        ("png zero width", png(0, 10, 8, 2, &zlib_stored(&[0; 10])), BadHeader(Png)),
        ("png zero height", png(10, 0, 8, 2, &zlib_stored(&[])), BadHeader(Png)),
        ("png 50k x 50k header", png(50_000, 50_000, 8, 2, &zlib_stored(&[0; 16])), TooLarge),
        ("png 1 x 100k header", png(1, 100_000, 8, 2, &zlib_stored(&[0; 16])), TooLarge),
        ("png 2^31-1 wide header", png(0x7FFF_FFFF, 1, 8, 2, &zlib_stored(&[0; 16])), Alloc),
        ("png invalid bit depth", png(4, 4, 7, 2, &zlib_stored(&[0; 52])), BadHeader(Png)),
        ("png invalid colour type", png(4, 4, 8, 5, &zlib_stored(&[0; 52])), BadHeader(Png)),
        ("png garbage zlib", png(4, 4, 8, 2, &[0xDE, 0xAD, 0xBE, 0xEF, 1, 2, 3]), Corrupt(Png)),
        ("png no IDAT", [PNG_SIG.to_vec(), ihdr(4, 4, 8, 2), chunk(b"IEND", b"")].concat(), BadHeader(Png)),
        ("png short IDAT", png(16, 16, 8, 2, &zlib_stored(&[0; 20])), Corrupt(Png)),
        ("png cut at 60%", cut(&landscape, 0.6), Corrupt(Png)),
        ("png cut before IEND", cut(&landscape, 0.995), Corrupt(Png)),
        ("png huge iCCP length", huge_iccp, BadHeader(Png)),
        ("gif header only", b"GIF89a".to_vec(), BadHeader(Gif)),
        ("gif zero-size screen", [gif_header(0, 0), gif_frame(1, 1), vec![0x3B]].concat(), ZeroSize),
        (
            "gif 60k x 60k screen",
            [gif_header(60_000, 60_000), gif_frame(1, 1), vec![0x3B]].concat(),
            TooLarge,
        ),
        ("gif 60k x 60k frame on an 8x8 screen", gif_huge_frame, Alloc),
        ("gif no frame", [gif_header(8, 8), vec![0x3B]].concat(), BadHeader(Gif)),
        ("gif cut at 30%", cut(&anim, 0.3), Corrupt(Gif)),
        ("jpeg SOI only", vec![0xFF, 0xD8, 0xFF], BadHeader(Jpeg)),
        ("jpeg 50k x 50k SOF", jpeg_resized_header(50_000, 50_000), TooLarge),
        ("jpeg 65535 x 1 SOF", jpeg_resized_header(65_535, 1), TooLarge),
        ("jpeg zero-width SOF", jpeg_resized_header(0, 48), BadHeader(Jpeg)),
        ("jpeg SOF without tables or scan", jpeg_with_sof(16, 16), BadHeader(Jpeg)),
        ("jpeg cut at 40%", cut(&photo, 0.4), Corrupt(Jpeg)),
        ("jpeg garbage scan", jpeg_garbage_scan, Corrupt(Jpeg)),
        ("webp RIFF header only", b"RIFF\x04\0\0\0WEBP".to_vec(), BadHeader(WebP)),
        ("webp 8000 x 8000 header", webp_resized_header(8_000, 8_000), TooLarge),
        ("webp 16000 x 3000 header", webp_resized_header(16_000, 3_000), TooLarge),
        ("webp VP8X canvas without image", webp_vp8x_only(64, 64), BadHeader(WebP)),
        ("webp RIFF size wrong", webp_bad_size, Corrupt(WebP)),
        ("webp lossless cut at 50%", cut(&lossless, 0.5), Corrupt(WebP)),
        ("webp lossy cut at 50%", cut(&lossy, 0.5), Corrupt(WebP)),
    ]
}

#[test]
fn hostile_corpus_is_refused_with_typed_errors() {
    let cases = corpus();
    assert!(cases.len() >= 40, "{} cases", cases.len());
    let failures: Vec<String> =
        cases.iter().filter_map(|(name, bytes, expect)| check(name, decode(bytes), expect)).collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases wrong:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// An animation bomb (thousands of frames) costs one frame: only the first is decoded, as PIL's
/// `Image.open` + `convert` reads only the first.
#[test]
fn animated_gif_decodes_only_its_first_frame() {
    let mut gif = gif_header(1, 1);
    for _ in 0..20_000 {
        gif.extend(gif_frame(1, 1));
    }
    gif.push(0x3B);
    let start = std::time::Instant::now();
    let image = decode_rgb(&gif, &MediaLimits::default()).unwrap();
    assert_eq!((image.width, image.height, image.data.as_slice()), (1, 1, &[0u8, 0, 0][..]));
    assert!(start.elapsed() < std::time::Duration::from_secs(2), "{:?}", start.elapsed());
}

#[test]
fn byte_limit_is_checked_before_anything_else() {
    let limits = MediaLimits { max_bytes: 100, ..MediaLimits::default() };
    let big = black_png(64, 64);
    assert!(matches!(decode_rgb(&big, &limits), Err(MediaError::TooManyBytes { limit: 100, .. })));
    assert!(matches!(probe(&big, &limits), Err(MediaError::TooManyBytes { .. })));
}

/// A small file that decodes to a large image (zeros compress 1000:1) stops at the pixel limit
/// from the header, and at the allocation limit when the pixel limit would allow it.
#[test]
fn decompression_bombs_stop_at_the_limits() {
    let mut bomb = Vec::new();
    let encoder = image::codecs::png::PngEncoder::new_with_quality(
        &mut bomb,
        image::codecs::png::CompressionType::Best,
        image::codecs::png::FilterType::NoFilter,
    );
    image::ImageEncoder::write_image(
        encoder,
        &vec![0u8; 4000 * 4000 * 3],
        4000,
        4000,
        image::ExtendedColorType::Rgb8,
    )
    .unwrap();
    assert!(bomb.len() < 200_000, "{} bytes", bomb.len());
    let pixels = MediaLimits { max_pixels: 1_000_000, ..MediaLimits::default() };
    assert!(matches!(
        decode_rgb(&bomb, &pixels),
        Err(MediaError::TooLarge { width: 4000, height: 4000, .. })
    ));
    let alloc = MediaLimits { max_alloc_bytes: 8 << 20, ..MediaLimits::default() };
    assert!(matches!(
        decode_rgb(&bomb, &alloc),
        Err(MediaError::AllocationLimit { format: ImageFormat::Png, .. })
    ));
    assert_eq!(decode_rgb(&bomb, &MediaLimits::default()).map(|i| i.data.len()), Ok(4000 * 4000 * 3));
}

#[test]
fn too_many_images_per_request() {
    let limits = MediaLimits { max_images_per_request: 2, ..MediaLimits::default() };
    assert_eq!(limits.check_image_count(2), Ok(()));
    assert_eq!(limits.check_image_count(3), Err(MediaError::TooManyImages { count: 3, limit: 2 }));
}

/// Data URLs: the MIME type must be an accepted image type, agree with the bytes, and the
/// payload must be base64 within the byte limit.
#[test]
fn hostile_data_urls() {
    use base64::Engine as _;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let png_b64 = b64(&black_png(2, 2));
    let limits = MediaLimits::default();
    type Case = (String, fn(&MediaError) -> bool);
    let cases: Vec<Case> = vec![
        (format!("data:image/jpeg;base64,{png_b64}"), |e| {
            matches!(e, MediaError::MimeMismatch { actual: ImageFormat::Png, .. })
        }),
        (format!("data:image/gif;base64,{png_b64}"), |e| matches!(e, MediaError::MimeMismatch { .. })),
        (format!("data:image/svg+xml;base64,{}", b64(b"<svg/>")), |e| {
            *e == MediaError::UnsupportedFormat("SVG")
        }),
        (format!("data:image/png;base64,{}", b64(b"<svg/>")), |e| *e == MediaError::UnsupportedFormat("SVG")),
        (
            format!("data:text/plain;base64,{png_b64}"),
            |e| matches!(e, MediaError::UnsupportedMime(m) if m == "text/plain"),
        ),
        (format!("data:image/bmp;base64,{png_b64}"), |e| matches!(e, MediaError::UnsupportedMime(_))),
        (format!("data:image/png,{png_b64}"), |e| matches!(e, MediaError::DataUrl(_))),
        ("data:image/png;base64".to_string(), |e| matches!(e, MediaError::DataUrl(_))),
        (format!("data:;base64,{png_b64}"), |e| matches!(e, MediaError::DataUrl(_))),
        (format!("http://example.invalid/a.png#{png_b64}"), |e| matches!(e, MediaError::DataUrl(_))),
        ("data:image/png;base64,iVBOR*w0K".to_string(), |e| matches!(e, MediaError::Base64(_))),
        ("data:image/png;base64,".to_string(), |e| *e == MediaError::Empty),
        (format!("data:image/png;base64,{}", "A".repeat(40 << 20)), |e| {
            matches!(e, MediaError::TooManyBytes { .. })
        }),
        (format!("data:image/png;base64,{}", b64(b"GIF89a")), |e| {
            matches!(e, MediaError::MimeMismatch { actual: ImageFormat::Gif, .. })
        }),
    ];
    for (url, is_expected) in &cases {
        let err = parse_data_url(url, &limits).expect_err(&url[..url.len().min(60)]);
        assert!(is_expected(&err), "{}: {err:?}", &url[..url.len().min(60)]);
    }
    let ok = parse_data_url(&format!("data:image/png;base64,{png_b64}"), &limits).unwrap();
    assert_eq!(decode_rgb(&ok.bytes, &limits).map(|i| (i.width, i.height)), Ok((2, 2)));
}

/// Every prefix of every fixture image is refused cleanly (no panic). A JPEG or WebP prefix is
/// always an error; a PNG or GIF prefix may decode only once all of its (first frame's) pixels
/// are in, and then to exactly the whole file's pixels (a missing IEND / later frames lose
/// nothing).
#[test]
fn every_truncation_of_the_fixtures_is_an_error() {
    let m = common::manifest();
    let limits = MediaLimits::default();
    for (name, _) in m["images"].as_object().unwrap() {
        let bytes = fixture(name);
        let whole = decode_rgb(&bytes, &limits).unwrap();
        let step = (bytes.len() / 300).max(1);
        for len in (0..bytes.len()).step_by(step) {
            match decode_rgb(&bytes[..len], &limits) {
                Err(_) => {}
                Ok(image) => {
                    let lenient = name.ends_with(".png") || name.ends_with(".gif");
                    assert!(
                        lenient && image == whole,
                        "{name} cut to {len} of {} bytes decoded",
                        bytes.len()
                    );
                }
            }
        }
    }
}
