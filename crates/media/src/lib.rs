//! `pagoda-media`: untrusted image bytes in, the exact pixel tensors and prompt expansions of the
//! HF processors out (issue 67, images for vision-language models).
//!
//! - [`limits`]: [`MediaLimits`], bytes / pixels / images per request, checked before decoding.
//! - [`sniff`]: the format from the bytes' magic ([`ImageFormat`]); SVG and others refused.
//! - [`data_url`]: `data:image/...;base64,` URLs, MIME checked against the magic.
//! - [`container`]: truncated JPEG / WebP containers refused (the decoders would guess).
//! - [`decode`]: PNG, JPEG, WebP, GIF (first frame) to RGB as transformers' `convert_to_rgb`.
//! - [`resample`]: Pillow's resampling filters, bit-exact on 8-bit images.
//! - [`pixels`]: rescale and normalize into f32 [`PixelValues`].
//! - [`idefics3`], [`gemma3`]: the two processors (tiling, prompt expansion).
//! - [`error`]: [`MediaError`], every refusal with what was wrong.

pub mod container;
pub mod data_url;
pub mod decode;
pub mod error;
pub mod gemma3;
pub mod idefics3;
pub mod limits;
pub mod pixels;
pub mod prompt;
pub mod resample;
pub mod sniff;

pub use data_url::{parse_data_url, DataUrl};
pub use decode::{decode_rgb, probe, ImageInfo, RgbImage};
pub use error::MediaError;
pub use limits::MediaLimits;
pub use pixels::{Normalization, PixelValues};
pub use resample::Filter;
pub use sniff::{sniff, ImageFormat};
