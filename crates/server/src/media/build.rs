//! A chat prompt with images, built: the images loaded and preprocessed (off the async
//! runtime), the rendered template's placeholders each expanded to its image's text (Idefics3's
//! tile/row/col layout), the text tokenized, and each image's placeholder positions found, so
//! the engine gets its [`ImageInput`]s in prompt order.

use std::sync::Arc;

use pagoda_engine::{split_placeholders, EncoderCacheStats, ImageInput};
use pagoda_text::ChatMessage;

use super::fetch::Fetcher;
use super::policy::{MediaPolicy, MediaSettings};
use super::vision::{PreparedImage, VisionProcessor};
use super::{ImageCollector, ImageRef, MediaRefusal};
use crate::error::ApiError;
use crate::prompt::{ChatOptions, PromptBuilder, TokenizedPrompt};

/// What the server knows about images: the flags' policy, the fetch client, and the served
/// model's processor (`None` for a text-only model).
#[derive(Debug, Clone)]
pub struct MediaState {
    pub policy: MediaPolicy,
    pub fetcher: Fetcher,
    pub vision: Option<Arc<VisionProcessor>>,
    /// The engine's encoder-cache counters (a vision model's), for the metrics.
    pub encoder_cache: Option<Arc<EncoderCacheStats>>,
}

impl MediaState {
    pub fn new(settings: MediaSettings, vision: Option<VisionProcessor>) -> Result<Self, String> {
        Ok(Self {
            policy: MediaPolicy::new(settings),
            fetcher: Fetcher::new()?,
            vision: vision.map(Arc::new),
            encoder_cache: None,
        })
    }

    /// The collector a request's messages are flattened with.
    pub fn collector(&self) -> ImageCollector {
        match &self.vision {
            Some(v) => ImageCollector::with_placeholder(v.image_token),
            None => ImageCollector::text_only(),
        }
    }
}

/// A prompt's images as the engine takes them (compared by hash, positions and shape: the
/// pixels follow from the hash).
#[derive(Debug, Clone, Default)]
pub struct PromptImages(pub Vec<ImageInput>);

impl PartialEq for PromptImages {
    fn eq(&self, other: &Self) -> bool {
        self.0.len() == other.0.len()
            && self.0.iter().zip(&other.0).all(|(a, b)| {
                a.hash == b.hash
                    && a.placeholder_positions == b.placeholder_positions
                    && a.pixels.shape == b.pixels.shape
            })
    }
}

/// Loads and preprocesses `images` for `vision`; the first refusal names its part.
pub async fn prepare_all(
    media: &MediaState,
    vision: &Arc<VisionProcessor>,
    prompts: &PromptBuilder,
    images: &[ImageRef],
) -> Result<Vec<PreparedImage>, ApiError> {
    let bytes = super::load::load_all(images, &media.policy, &media.fetcher).await?;
    let vision = Arc::clone(vision);
    let limits = media.policy.limits;
    let params: Vec<String> = images.iter().map(|i| i.param.clone()).collect();
    // Decoding and resampling are CPU work: on the blocking pool, under the tokenizer permits.
    prompts
        .blocking(move || {
            bytes
                .iter()
                .zip(&params)
                .map(|(b, param)| vision.prepare(b, &limits).map_err(|e| MediaRefusal::from(e).at(param)))
                .collect::<Result<Vec<_>, _>>()
        })
        .await?
}

/// Renders `messages` (whose image parts the collector turned into placeholders) with `images`
/// expanded, tokenizes, and locates each image's placeholders. `limit`: the most tokens the
/// prompt may have (`None`: the context length).
pub async fn chat(
    media: &MediaState,
    prompts: &PromptBuilder,
    messages: Vec<ChatMessage>,
    options: ChatOptions,
    images: &[ImageRef],
    limit: Option<usize>,
) -> Result<TokenizedPrompt, ApiError> {
    let Some(vision) = &media.vision else {
        // The collector refused image parts already; a text-only prompt needs nothing here.
        return prompts.chat_expanded(messages, options, limit, None).await;
    };
    let prepared = prepare_all(media, vision, prompts, images).await?;
    let expansions: Vec<String> = prepared.iter().map(|p| p.expansion.clone()).collect();
    let token = vision.image_token;
    let expand = Box::new(move |text: String| {
        pagoda_media::prompt::replace_placeholders(&text, token, &expansions).map_err(|e| {
            ApiError::invalid(
                "messages",
                format!("{e}: `{token}` stands for an image part and may not be typed in a text part"),
            )
        })
    });
    let mut prompt = prompts.chat_expanded(messages, options, limit, Some(expand)).await?;
    let counts: Vec<usize> = prepared.iter().map(|p| p.num_placeholders).collect();
    let positions = split_placeholders(&prompt.token_ids, vision.image_token_id, &counts).map_err(|e| {
        ApiError::invalid("messages", format!("the tokenized prompt does not hold its images: {e}"))
    })?;
    prompt.images = PromptImages(
        prepared
            .into_iter()
            .zip(positions)
            .map(|(p, placeholder_positions)| ImageInput {
                hash: p.hash,
                pixels: p.pixels,
                placeholder_positions,
            })
            .collect(),
    );
    Ok(prompt)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagoda_media::idefics3::Idefics3Config;
    use pagoda_text::{ChatTemplate, Tokenizer};

    /// The tiny Idefics3 checkpoint's tokenizer and template, and its processor settings.
    fn tiny() -> (PromptBuilder, MediaState) {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/tiny/idefics3");
        let tokenizer = Arc::new(Tokenizer::from_dir(dir).unwrap());
        let template = ChatTemplate::new(
            tokenizer.chat_template().unwrap(),
            tokenizer.bos_token(),
            tokenizer.eos_token(),
        )
        .unwrap();
        let prompts = PromptBuilder::new(Arc::clone(&tokenizer), Some(Arc::new(template)), 520, 256);
        let config =
            Idefics3Config { longest_edge: 128, tile_size: 64, image_seq_len: 16, ..Default::default() };
        let vision = VisionProcessor::idefics3(config, tokenizer.token_to_id("<image>").unwrap());
        (prompts, MediaState::new(MediaSettings::default(), Some(vision)).unwrap())
    }

    fn image(name: &str, mime: &str) -> ImageRef {
        let path = format!("{}/../../tests/fixtures/media/{name}", env!("CARGO_MANIFEST_DIR"));
        let bytes = std::fs::read(path).unwrap();
        let data = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, bytes);
        ImageRef { param: format!("p.{name}"), url: format!("data:{mime};base64,{data}") }
    }

    #[tokio::test]
    async fn placeholders_are_expanded_and_located_per_image() {
        let (prompts, media) = tiny();
        let images = [image("landscape.png", "image/png"), image("gray.png", "image/png")];
        let messages = vec![ChatMessage::new("user", "<image>a<image>b")];
        let prompt = chat(&media, &prompts, messages, ChatOptions::default(), &images, None).await.unwrap();
        let got = &prompt.images.0;
        assert_eq!(got.len(), 2);
        assert!(prompt.text.contains("<row_2_col_2>") && prompt.text.contains("<global-img>"));
        let id = media.vision.as_ref().unwrap().image_token_id;
        for input in got {
            assert_eq!(input.num_features(), input.pixels.shape[0] * 16);
            assert!(input.placeholder_positions.iter().all(|&p| prompt.token_ids[p as usize] == id));
        }
        // In prompt order, every placeholder token belongs to one of them.
        assert!(got[0].placeholder_positions.last() < got[1].placeholder_positions.first());
        let all = prompt.token_ids.iter().filter(|&&t| t == id).count();
        assert_eq!(all, got[0].num_features() + got[1].num_features());
        assert_ne!(got[0].hash, got[1].hash);
    }

    #[tokio::test]
    async fn counts_and_bad_images_are_400s() {
        let (prompts, media) = tiny();
        let one = [image("landscape.png", "image/png")];
        let typed = vec![ChatMessage::new("user", "<image><image>")];
        let err = chat(&media, &prompts, typed, ChatOptions::default(), &one, None).await.unwrap_err();
        assert_eq!(err.param(), Some("messages"));
        let mut bad = image("landscape.png", "image/jpeg");
        bad.param = "messages[0].content[0].image_url".into();
        let messages = vec![ChatMessage::new("user", "<image>")];
        let err = chat(&media, &prompts, messages, ChatOptions::default(), &[bad], None).await.unwrap_err();
        assert_eq!(err.param(), Some("messages[0].content[0].image_url"));
        assert!(err.to_string().contains("declares image/jpeg"), "{err}");
        // A text-only server renders as before, without images.
        let text_only = MediaState { vision: None, ..media };
        let messages = vec![ChatMessage::new("user", "hi")];
        let prompt = chat(&text_only, &prompts, messages, ChatOptions::default(), &[], None).await.unwrap();
        assert!(prompt.images.0.is_empty() && !prompt.token_ids.is_empty());
    }
}
