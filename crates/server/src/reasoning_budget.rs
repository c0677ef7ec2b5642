//! A cap on how many tokens a reasoning model may think (Anthropic's `thinking.budget_tokens`):
//! a [`TokenConstraint`] that follows the output with the same reasoning splitter the response
//! uses, counts the tokens generated inside the reasoning, and once the budget is spent allows
//! only the tokens of the closing tag (`</think>`), one after the other, so the model goes on to
//! its answer. A structured-output grammar, if any, runs inside it and sees every token.

use std::sync::Arc;

use pagoda_engine::{ConstraintError, TokenConstraint, TokenMask};
use pagoda_text::{ReasoningFormat, ReasoningSplitter, Tokenizer};

/// What a budget needs to know, shared by every sequence of a request.
pub struct BudgetSpec {
    pub budget: usize,
    pub format: ReasoningFormat,
    /// The prompt ends inside an opened reasoning section.
    pub prompt_opened: bool,
    /// The closing tag's token ids, forced in order once the budget is spent.
    pub end_ids: Vec<u32>,
    pub tokenizer: Arc<Tokenizer>,
    /// Length of the masks the sampler takes.
    pub vocab_size: usize,
}

impl std::fmt::Debug for BudgetSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BudgetSpec").field("budget", &self.budget).field("end_ids", &self.end_ids).finish()
    }
}

impl PartialEq for BudgetSpec {
    fn eq(&self, other: &Self) -> bool {
        (self.budget, self.format, self.prompt_opened, &self.end_ids)
            == (other.budget, other.format, other.prompt_opened, &other.end_ids)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Not past the reasoning yet; `used` tokens of it so far.
    Thinking { used: usize },
    /// The budget is spent: the next token is `end_ids[i]`.
    Closing(usize),
    /// The reasoning is over.
    Answering,
}

/// See the module docs.
pub struct ReasoningBudget {
    spec: Arc<BudgetSpec>,
    splitter: ReasoningSplitter,
    phase: Phase,
    inner: Option<Box<dyn TokenConstraint>>,
}

impl ReasoningBudget {
    pub fn new(spec: Arc<BudgetSpec>, inner: Option<Box<dyn TokenConstraint>>) -> Self {
        let splitter = ReasoningSplitter::new(spec.format, spec.prompt_opened);
        Self { spec, splitter, phase: Phase::Thinking { used: 0 }, inner }
    }

    fn one_token(&self, id: u32) -> TokenMask {
        let mut mask = TokenMask::new(self.spec.vocab_size);
        mask.allow(id);
        mask
    }

    fn free(&mut self) -> Result<TokenMask, ConstraintError> {
        match &mut self.inner {
            Some(inner) => inner.compute_mask(),
            None => Ok(TokenMask::all(self.spec.vocab_size)),
        }
    }
}

impl TokenConstraint for ReasoningBudget {
    fn compute_mask(&mut self) -> Result<TokenMask, ConstraintError> {
        if let Phase::Thinking { used } = self.phase {
            if used >= self.spec.budget && !self.spec.end_ids.is_empty() {
                self.phase = Phase::Closing(0);
            }
        }
        match self.phase {
            Phase::Closing(i) => Ok(self.one_token(self.spec.end_ids[i])),
            _ => self.free(),
        }
    }

    fn accept_token(&mut self, token: u32) -> Result<(), ConstraintError> {
        if let Some(inner) = &mut self.inner {
            inner.accept_token(token)?;
        }
        let text = self.spec.tokenizer.decode(&[token], false).unwrap_or_default();
        let was_reasoning = self.splitter.in_reasoning();
        self.splitter.push(&text);
        self.phase = match self.phase {
            Phase::Closing(i) if i + 1 < self.spec.end_ids.len() => Phase::Closing(i + 1),
            Phase::Closing(_) => Phase::Answering,
            Phase::Thinking { .. } if was_reasoning && !self.splitter.in_reasoning() => Phase::Answering,
            // Counted from the first token inside the reasoning (not the opening tag's).
            Phase::Thinking { used } if was_reasoning => Phase::Thinking { used: used + 1 },
            other => other,
        };
        Ok(())
    }

    fn is_finished(&self) -> bool {
        self.phase == Phase::Answering && self.inner.as_ref().is_some_and(|i| i.is_finished())
    }

    fn fork(&self) -> Box<dyn TokenConstraint> {
        Box::new(Self {
            spec: Arc::clone(&self.spec),
            splitter: self.splitter.clone(),
            phase: self.phase,
            inner: self.inner.as_ref().map(|i| i.fork()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> Arc<Tokenizer> {
        let model = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
        Arc::new(Tokenizer::from_gguf(&model).expect("run `make model` first"))
    }

    fn budget(
        format: ReasoningFormat,
        prompt_opened: bool,
        budget: usize,
    ) -> (ReasoningBudget, Vec<u32>, Arc<Tokenizer>) {
        let tokenizer = tokenizer();
        let end_ids = tokenizer.encode("</think>", false).unwrap();
        let spec = BudgetSpec {
            budget,
            format,
            prompt_opened,
            end_ids: end_ids.clone(),
            tokenizer: Arc::clone(&tokenizer),
            vocab_size: tokenizer.vocab_size(),
        };
        (ReasoningBudget::new(Arc::new(spec), None), end_ids, tokenizer)
    }

    /// Runs `text`'s tokens through the constraint, each checked against the mask first.
    fn feed(c: &mut ReasoningBudget, tok: &Tokenizer, text: &str) {
        for id in tok.encode(text, false).unwrap() {
            assert!(c.compute_mask().unwrap().allows(id), "{text:?}: {id} refused");
            c.accept_token(id).unwrap();
        }
    }

    fn forced(c: &mut ReasoningBudget) -> Option<u32> {
        let mask = c.compute_mask().unwrap();
        let allowed: Vec<u32> = (0..c.spec.vocab_size as u32).filter(|&id| mask.allows(id)).collect();
        (allowed.len() == 1).then(|| allowed[0])
    }

    #[test]
    fn a_spent_budget_forces_the_closing_tag_then_lets_go() {
        let (mut c, end_ids, tok) = budget(ReasoningFormat::Qwen3, true, 5);
        feed(&mut c, &tok, " one two three four five");
        assert!(tok.encode(" one two three four five", false).unwrap().len() >= 5);
        for &id in &end_ids {
            assert_eq!(forced(&mut c), Some(id));
            c.accept_token(id).unwrap();
        }
        assert_eq!(forced(&mut c), None, "free after the tag");
        feed(&mut c, &tok, "\n\nThe answer is yes.");
        assert_eq!(c.phase, Phase::Answering);
        // A fork carries the state.
        let mut copy = c.fork();
        assert!(copy.compute_mask().unwrap().allows(end_ids[0]));
    }

    #[test]
    fn reasoning_that_ends_in_time_is_left_alone() {
        let (mut c, _, tok) = budget(ReasoningFormat::Qwen3, true, 50);
        feed(
            &mut c,
            &tok,
            "short thought</think>\n\nanswer words that go on and on for a long while past fifty",
        );
        feed(&mut c, &tok, &" more".repeat(60));
        assert_eq!(c.phase, Phase::Answering);
    }

    #[test]
    fn qwen3_counts_only_inside_think() {
        // An answer that does not open with <think> has no reasoning to cut.
        let (mut c, _, tok) = budget(ReasoningFormat::Qwen3, false, 3);
        feed(&mut c, &tok, "plain words before any <think> at all, and more words after it");
        assert_eq!(c.phase, Phase::Thinking { used: 0 });
        assert_eq!(forced(&mut c), None);
        let (mut c, end_ids, tok) = budget(ReasoningFormat::Qwen3, false, 3);
        feed(&mut c, &tok, "<think> a b c");
        assert_eq!(forced(&mut c), Some(end_ids[0]));
    }
}
