//! The PTX of every `kernels/*.cu`, compiled by build.rs for sm_80 and sm_90 and embedded in
//! the library, so a built binary needs no CUDA toolkit at run time (only the driver, which
//! JIT-compiles the PTX for the device at first use).

use super::launch::KernelModule;

include!(concat!(env!("OUT_DIR"), "/ptx.rs"));

/// The PTX text of `module`: the sm_90 build for compute capability 9.0 and newer, else the
/// sm_80 build.
pub(crate) fn source(module: KernelModule, sm90: bool) -> &'static str {
    let stem = module.stem();
    let (_, sm80_ptx, sm90_ptx) = PTX
        .iter()
        .find(|(s, _, _)| *s == stem)
        .unwrap_or_else(|| panic!("kernels/{stem}.cu was not compiled"));
    if sm90 {
        sm90_ptx
    } else {
        sm80_ptx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_is_embedded_for_both_targets() {
        for module in KernelModule::ALL {
            for (sm90, target) in [(false, ".target sm_80"), (true, ".target sm_90")] {
                let ptx = source(module, sm90);
                assert!(ptx.contains(target), "{} lacks {target}", module.stem());
                assert!(ptx.contains(".visible .entry pagoda_"), "{} has no entry point", module.stem());
            }
        }
        // Every entry point the launch builders name exists in its module.
        for name in [
            "pagoda_paged_attention_mma_bf16_d128",
            "pagoda_paged_attention_simt_f32_d80_r8",
            "pagoda_rms_norm_bf16_f32",
            "pagoda_sample_f32",
            "pagoda_lora_add_bf16",
        ] {
            assert!(PTX.iter().any(|(_, a, b)| a.contains(name) && b.contains(name)), "{name} missing");
        }
    }
}
