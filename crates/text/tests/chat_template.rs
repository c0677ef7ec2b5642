//! The SmolLM2 chat template embedded in the GGUF file, rendered and tokenized.

mod common;

use pagoda_text::{ChatMessage, ChatTemplate};

fn smollm2_template() -> (pagoda_text::Tokenizer, ChatTemplate) {
    let tok = common::smollm2();
    let template = ChatTemplate::new(
        tok.chat_template().expect("SmolLM2 ships a chat template"),
        tok.bos_token(),
        tok.eos_token(),
    )
    .unwrap();
    (tok, template)
}

#[test]
fn default_system_prompt_is_inserted() {
    let (tok, template) = smollm2_template();
    let out = template.render(&[ChatMessage::new("user", "Hi")], true).unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = tok.encode(&out, false).unwrap();
    assert_eq!(ids[0], 1);
    // "<|im_start|>" "ass" "istant" "\n" ends the prompt.
    assert_eq!(&ids[ids.len() - 4..], &[1, 520, 9531, 198]);
    assert_eq!(tok.decode(&ids[ids.len() - 3..], false).unwrap(), "assistant\n");
}

#[test]
fn own_system_prompt_and_no_generation_prompt() {
    let (_, template) = smollm2_template();
    let messages = [
        ChatMessage::new("system", "Be terse."),
        ChatMessage::new("user", "2+2?"),
        ChatMessage::new("assistant", "4"),
    ];
    assert_eq!(
        template.render(&messages, false).unwrap(),
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
    );
}
