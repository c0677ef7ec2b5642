//! [`ImageCollector`]: what the message flattening of each API does with an image part. The
//! chat template sees text only, so an image part becomes the model's image placeholder (for
//! Idefics3 `<image>`) at its place in the message's text, and its [`ImageRef`] is kept, in
//! prompt order, for [`super::build`] to expand and locate after the template has run. On a
//! model that takes no images, the part is refused naming it.

use super::ImageRef;
use crate::error::InvalidParam;

/// Collects a request's image parts while its messages are flattened to text.
#[derive(Debug, Clone)]
pub struct ImageCollector {
    /// The text an image part becomes; `None`: image parts are refused with `refusal`.
    placeholder: Option<String>,
    refusal: &'static str,
    images: Vec<ImageRef>,
}

impl ImageCollector {
    /// For a model without a vision encoder: every image part is a 400.
    pub fn text_only() -> Self {
        Self::refusing("image parts are not supported: this model takes no images (it has no vision encoder)")
    }

    /// Image parts refused with `message` (an endpoint that cannot take them).
    pub fn refusing(message: &'static str) -> Self {
        Self { placeholder: None, refusal: message, images: Vec::new() }
    }

    /// For a vision model whose template input marks an image with `placeholder`.
    pub fn with_placeholder(placeholder: impl Into<String>) -> Self {
        Self { placeholder: Some(placeholder.into()), refusal: "", images: Vec::new() }
    }

    /// Refuses an image part at `part` when images are not taken here.
    pub fn check(&self, part: &str) -> Result<(), InvalidParam> {
        match self.placeholder {
            Some(_) => Ok(()),
            None => Err(InvalidParam::new(part, self.refusal)),
        }
    }

    /// Keeps `image` (of the part named `part`) and returns the text that stands for it.
    pub fn push(&mut self, part: &str, image: ImageRef) -> Result<&str, InvalidParam> {
        self.check(part)?;
        self.images.push(image);
        Ok(self.placeholder.as_deref().unwrap_or_default())
    }

    /// The placeholder text a user might also type (to refuse mixing it with real images).
    pub fn placeholder(&self) -> Option<&str> {
        self.placeholder.as_deref()
    }

    pub fn into_images(self) -> Vec<ImageRef> {
        self.images
    }
}

/// A message's text from its parts: text parts joined by `separator`, an image's placeholder
/// put right against its neighbours (as HF templates that loop over parts write it: SmolVLM's
/// `User:<image>What is this?`).
#[derive(Debug, Clone)]
pub struct PartsText {
    text: String,
    separator: &'static str,
    /// The last piece was text (the next text needs the separator).
    after_text: bool,
}

impl PartsText {
    pub fn new(separator: &'static str) -> Self {
        Self { text: String::new(), separator, after_text: false }
    }

    pub fn push_text(&mut self, text: &str) {
        if self.after_text {
            self.text.push_str(self.separator);
        }
        self.text.push_str(text);
        self.after_text = true;
    }

    pub fn push_image(&mut self, placeholder: &str) {
        self.text.push_str(placeholder);
        self.after_text = false;
    }

    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    pub fn finish(self) -> String {
        self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(i: usize) -> ImageRef {
        ImageRef { param: format!("p{i}"), url: "data:".into() }
    }

    #[test]
    fn text_only_refuses_naming_the_part() {
        let mut c = ImageCollector::text_only();
        let err = c.push("messages[0].content[1]", image(0)).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages[0].content[1]"));
        assert!(err.message.contains("takes no images"), "{}", err.message);
        assert!(c.into_images().is_empty());
    }

    #[test]
    fn placeholders_in_order() {
        let mut c = ImageCollector::with_placeholder("<image>");
        let mut t = PartsText::new("\n");
        t.push_text("a");
        t.push_image(c.push("p", image(0)).unwrap());
        t.push_text("b");
        t.push_text("c");
        t.push_image(c.push("p", image(1)).unwrap());
        assert_eq!(t.finish(), "a<image>b\nc<image>");
        assert_eq!(c.into_images(), vec![image(0), image(1)]);
    }
}
