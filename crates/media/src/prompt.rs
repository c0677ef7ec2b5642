//! Placeholder expansion shared by the processors: each occurrence of a model's image token in
//! the prompt is replaced, left to right, by that image's expansion (which may itself contain
//! the token, so the replaced text is never scanned again).

use crate::error::MediaError;

/// Replaces the `i`-th `token` of `prompt` by `expansions[i]`; the counts must be equal.
pub fn replace_placeholders(
    prompt: &str,
    token: &'static str,
    expansions: &[String],
) -> Result<String, MediaError> {
    let placeholders = prompt.matches(token).count();
    if placeholders != expansions.len() {
        return Err(MediaError::PlaceholderCount { token, placeholders, images: expansions.len() });
    }
    let mut out = String::with_capacity(prompt.len() + expansions.iter().map(String::len).sum::<usize>());
    let mut rest = prompt;
    for expansion in expansions {
        let at = rest.find(token).expect("counted above");
        out.push_str(&rest[..at]);
        out.push_str(expansion);
        rest = &rest[at + token.len()..];
    }
    out.push_str(rest);
    Ok(out)
}
