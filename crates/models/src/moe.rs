//! A routed mixture-of-experts MLP (Mixtral, Qwen3-MoE): a router picks each token's best
//! `experts_per_token` experts (softmax over its logits, top k, optionally renormalized), and
//! each expert, a SiLU gated MLP, runs once per step over all the tokens routed to it (gathered
//! rows, one matmul per projection), its outputs weighted and added back in place.

use candle_core::{DType, Device, Tensor};

use crate::config::{ModelConfig, MoeConfig};
use crate::error::Result;
use crate::linear::{Linear, StackedLinear};
use crate::weights::{load_linear, WeightSource};

struct Expert {
    /// Gate and up projections.
    gate_up_proj: StackedLinear,
    down_proj: Linear,
}

pub(crate) struct MoeMlp {
    router: Linear,
    experts: Vec<Expert>,
    config: MoeConfig,
}

impl MoeMlp {
    /// Layer `i`'s router (`blk.{i}.ffn_gate_inp`) and experts (`blk.{i}.ffn_{gate,up,down}_exps`).
    pub(crate) fn load(
        source: &mut dyn WeightSource,
        c: &ModelConfig,
        moe: MoeConfig,
        i: usize,
    ) -> Result<Self> {
        let (h, ffn, n) = (c.hidden_size, moe.expert_intermediate_size, moe.num_experts);
        let name = |part: &str| format!("blk.{i}.{part}.weight");
        let router = load_linear(source, &name("ffn_gate_inp"), n, h, None)?;
        let gates = source.experts(&name("ffn_gate_exps"), n, ffn, h)?;
        let ups = source.experts(&name("ffn_up_exps"), n, ffn, h)?;
        let downs = source.experts(&name("ffn_down_exps"), n, h, ffn)?;
        let experts = gates
            .into_iter()
            .zip(ups)
            .zip(downs)
            .map(|((gate, up), down)| {
                let (gate_up_proj, down_proj) = (StackedLinear::new(vec![gate, up])?, down);
                Ok(match source.quantization() {
                    Some(q) => {
                        Expert { gate_up_proj: q.apply(gate_up_proj)?, down_proj: q.apply_one(down_proj)? }
                    }
                    None => Expert { gate_up_proj, down_proj },
                })
            })
            .collect::<Result<_>>()?;
        Ok(Self { router, experts, config: moe })
    }

    /// `x` `[tokens, hidden]` (normed) -> `[tokens, hidden]`.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let tokens = x.dim(0)?;
        let logits = self.router.forward(x)?.to_dtype(DType::F32)?.to_vec2::<f32>()?;
        let routes = route(&logits, self.config.experts_per_token, self.config.normalize_top_k);
        let mut out = x.zeros_like()?;
        for (expert, picked) in self.experts.iter().zip(&routes) {
            if picked.is_empty() {
                continue;
            }
            let rows: Vec<u32> = picked.iter().map(|&(t, _)| t).collect();
            let weights: Vec<f32> = picked.iter().map(|&(_, w)| w).collect();
            let index = Tensor::from_vec(rows, picked.len(), x.device())?;
            let xs = x.index_select(&index, 0)?;
            let [gate, up]: [Tensor; 2] =
                expert.gate_up_proj.forward(&xs)?.try_into().expect("two projections");
            let ys = expert.down_proj.forward(&pagoda_ops::silu_and_mul(&gate, &up)?)?;
            let weights = Tensor::from_vec(weights, (picked.len(), 1), &Device::Cpu)?
                .to_device(x.device())?
                .to_dtype(ys.dtype())?;
            out = out.index_add(&index, &ys.broadcast_mul(&weights)?, 0)?;
        }
        debug_assert_eq!(out.dim(0)?, tokens);
        Ok(out)
    }
}

/// For each expert, the `(token, weight)` pairs routed to it, tokens ascending. Each row of
/// `logits` picks its `k` most probable experts (the lower index first on ties), weighted by
/// their softmax probabilities, renormalized over the `k` when `normalize`.
fn route(logits: &[Vec<f32>], k: usize, normalize: bool) -> Vec<Vec<(u32, f32)>> {
    let num_experts = logits.first().map_or(0, Vec::len);
    let mut routes = vec![Vec::new(); num_experts];
    for (token, row) in logits.iter().enumerate() {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exps: Vec<f32> = row.iter().map(|&l| (l - max).exp()).collect();
        let total: f32 = exps.iter().sum();
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|&a, &b| exps[b].total_cmp(&exps[a]).then(a.cmp(&b)));
        let top = &order[..k.min(order.len())];
        let norm = if normalize { top.iter().map(|&e| exps[e]).sum::<f32>() } else { total };
        for &e in top {
            routes[e].push((token as u32, exps[e] / norm));
        }
    }
    routes
}

#[cfg(test)]
mod tests {
    use super::route;

    #[test]
    fn routes_each_token_to_its_top_k_experts() {
        let logits = vec![vec![0.0, 2.0, 1.0, -1.0], vec![3.0, 0.0, 0.0, 3.0]];
        let routes = route(&logits, 2, true);
        // Token 0: experts 1 and 2; token 1: experts 0 and 3 (a tie, both kept).
        assert_eq!(routes[1].len(), 1);
        assert_eq!(routes[2][0].0, 0);
        assert_eq!(routes[0][0].0, 1);
        assert_eq!(routes[3][0].0, 1);
        let w = |e: usize, t: u32| routes[e].iter().find(|r| r.0 == t).unwrap().1;
        assert!((w(1, 0) + w(2, 0) - 1.0).abs() < 1e-6);
        assert!((w(1, 0) / w(2, 0) - 1f32.exp()).abs() < 1e-5);
        assert!((w(0, 1) - 0.5).abs() < 1e-6);

        let plain = route(&logits, 2, false);
        let total: f32 = [0.0f32, 2.0, 1.0, -1.0].iter().map(|l| (l - 2.0).exp()).sum();
        assert!((plain[1][0].1 - 1.0 / total).abs() < 1e-6);
        // Ties go to the lower index.
        let tied = route(&[vec![1.0, 1.0, 1.0]], 1, true);
        assert_eq!((tied[0].len(), tied[1].len(), tied[2].len()), (1, 0, 0));
    }
}
