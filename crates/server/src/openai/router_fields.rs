//! SGLang's request fields that the routers Pagoda runs behind add to every chat and completions
//! request they forward: sglang-router and vllm-router re-serialize each body from SGLang's
//! protocol types, so `no_stop_trim`, `separate_reasoning`, `stream_reasoning`,
//! `return_hidden_states` and (chat) `include_reasoning` arrive even when the client never set
//! them, each at SGLang's default. At that default each asks for what Pagoda does anyway (stop
//! strings trimmed, reasoning split out and streamed, no hidden states), so it is honoured; any
//! other value is refused with a 400 naming the field.

use crate::error::ApiError;

/// One such field: its name, what the request says, and the only value Pagoda serves.
pub type RouterField = (&'static str, Option<bool>, bool);

/// `Ok` when every field is absent or at the value Pagoda serves.
pub fn check(fields: &[RouterField]) -> Result<(), ApiError> {
    for &(name, value, served) in fields {
        if value.is_some_and(|v| v != served) {
            return Err(ApiError::invalid(
                name,
                format!("`{name}: {}` is not supported; this server serves only `{name}: {served}`", !served),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_pass_and_anything_else_is_named() {
        assert!(check(&[("no_stop_trim", None, false), ("separate_reasoning", Some(true), true)]).is_ok());
        let err = check(&[("no_stop_trim", Some(false), false), ("return_hidden_states", Some(true), false)])
            .unwrap_err();
        let text = format!("{err}");
        assert!(text.contains("return_hidden_states"), "{text}");
    }
}
