//! The head of a BERT cross-encoder (`BertForSequenceClassification`, the reranker kind): the
//! pooler (a dense layer and tanh over the `[CLS]` state), a linear classifier to one logit,
//! and the activation that makes the logit a relevance score. sentence-transformers and vLLM
//! both score with that activation: the config's `sentence_transformers.activation_fn` where
//! it names one, else a sigmoid, since a one-label cross-encoder is trained as a binary
//! classifier.

use std::path::Path;

use candle_core::Tensor;
use serde_json::Value;

use crate::error::{ModelError, Result};
use crate::linear::Linear;
use crate::weights::WeightSource;

/// What turns a cross-encoder's logit into its score.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScoreActivation {
    Sigmoid,
    Identity,
}

impl ScoreActivation {
    pub fn apply(self, logit: f32) -> f32 {
        match self {
            ScoreActivation::Sigmoid => (1.0 / (1.0 + (-f64::from(logit)).exp())) as f32,
            ScoreActivation::Identity => logit,
        }
    }
}

#[derive(Debug, Clone)]
pub struct SequenceClassifier {
    pooler: Linear,
    classifier: Linear,
    activation: ScoreActivation,
}

/// Whether `config.json` declares a sequence-classification model (a cross-encoder).
pub fn is_classifier(config: &Value) -> bool {
    config["architectures"].as_array().is_some_and(|a| {
        a.iter().any(|v| v.as_str().is_some_and(|s| s.ends_with("ForSequenceClassification")))
    })
}

impl SequenceClassifier {
    /// The head of the classifier in `dir` (weights `bert.pooler.dense` and `classifier`), when
    /// its `config.json` declares one; `None` for a plain encoder.
    pub fn load(source: &mut dyn WeightSource, dir: &Path, hidden: usize) -> Result<Option<Self>> {
        let path = dir.join("config.json");
        let text =
            std::fs::read_to_string(&path).map_err(|source| ModelError::Io { path: path.clone(), source })?;
        let config: Value = serde_json::from_str(&text)
            .map_err(|e| ModelError::Config { path: path.clone(), message: e.to_string() })?;
        if !is_classifier(&config) {
            return Ok(None);
        }
        let bad = |message: String| ModelError::Config { path: path.clone(), message };
        let labels = config["num_labels"]
            .as_u64()
            .or_else(|| config["id2label"].as_object().map(|m| m.len() as u64))
            // transformers' default when a config names no labels.
            .unwrap_or(2);
        if labels != 1 {
            return Err(bad(format!(
                "a sequence classifier with {labels} labels is not supported; cross-encoders \
                 (rerankers) have one"
            )));
        }
        let activation = match config["sentence_transformers"]["activation_fn"].as_str() {
            None => ScoreActivation::Sigmoid,
            Some(name) if name.ends_with(".Sigmoid") => ScoreActivation::Sigmoid,
            Some(name) if name.ends_with(".Identity") => ScoreActivation::Identity,
            Some(name) => {
                return Err(bad(format!(
                    "activation_fn `{name}` is not supported (Sigmoid and Identity are)"
                )))
            }
        };
        let plan = source.kernel_plan();
        let mut linear = |name: &str, out_dim: usize| -> Result<Linear> {
            let weight = source.dense(&format!("{name}.weight"), &[out_dim, hidden])?;
            let bias = source.dense(&format!("{name}.bias"), &[out_dim])?;
            Linear::dense(weight, Some(bias), plan)
        };
        let pooler = linear("bert.pooler.dense", hidden)?;
        let classifier = linear("classifier", 1)?;
        Ok(Some(Self { pooler, classifier, activation }))
    }

    /// The score of each input from its `[CLS]` state (`cls`: `[inputs, hidden]`).
    pub fn scores(&self, cls: &Tensor) -> Result<Vec<f32>> {
        let pooled = self.pooler.forward(cls)?.tanh()?;
        // The model's dtype (bfloat16 on CUDA) out, f32 scores to the wire.
        let logits = self.classifier.forward(&pooled)?.flatten_all()?.to_dtype(candle_core::DType::F32)?;
        let logits = logits.to_vec1::<f32>()?;
        Ok(logits.into_iter().map(|l| self.activation.apply(l)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activations_and_the_declaration() {
        assert!((ScoreActivation::Sigmoid.apply(0.0) - 0.5).abs() < 1e-7);
        assert!((ScoreActivation::Sigmoid.apply(2.0) - 0.880_797).abs() < 1e-6);
        assert_eq!(ScoreActivation::Identity.apply(-3.5), -3.5);
        let declared = serde_json::json!({"architectures": ["BertForSequenceClassification"]});
        assert!(is_classifier(&declared));
        assert!(!is_classifier(&serde_json::json!({"architectures": ["BertModel"]})));
        assert!(!is_classifier(&serde_json::json!({})));
    }
}
