//! Images in chat requests (issue 67): the image parts of the three chat APIs, where their bytes
//! may come from, and how they become the engine's [`pagoda_engine::ImageInput`]s.
//!
//! - [`parts`]: each API's image part (`image_url`, Anthropic's `image` block, `input_image`)
//!   read into an [`ImageRef`] (its URL and the request field to name in errors).
//! - [`collect`]: [`ImageCollector`], which the message flattening hands each image part to;
//!   it leaves the model's image placeholder in the text, or refuses on a text-only model.
//! - [`policy`]: [`MediaPolicy`], the flags that say which URLs may be read, and the limits.
//! - [`load`], [`fetch`], [`local`]: the bytes of a `data:`, `http(s)://` or `file://` URL.
//! - [`vision`]: [`VisionProcessor`], decoding, preprocessing and hashing for the served model.
//! - [`build`]: a rendered prompt's placeholders expanded, tokenized and located.
//! - [`error`]: [`MediaRefusal`], every way an image is refused (all 400s naming the part).

pub mod build;
pub mod collect;
pub mod error;
pub mod fetch;
pub mod load;
pub mod local;
pub mod parts;
pub mod policy;
pub mod vision;

pub use collect::ImageCollector;
pub use error::MediaRefusal;
pub use policy::MediaPolicy;
pub use vision::VisionProcessor;

/// One image part of a request, in prompt order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// The request field to name when the image is refused (`messages[1].content[0].image_url`).
    pub param: String,
    /// Where the bytes are: a `data:`, `http(s)://` or `file://` URL (Anthropic's base64 source
    /// is turned into a data URL).
    pub url: String,
}
