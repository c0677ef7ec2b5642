//! Software prefetch of the next panel for the 256-bit integer kernels
//! ([`crate::matmul::nibble_avx2`], [`crate::matmul::int8_matmul_avx2`],
//! [`crate::matmul::int16_matmul_avx2`]).
//!
//! Those kernels walk one panel several times, 8 or 16 of its 32 columns a pass, so each pass
//! strides through the codes and the next pass starts over from the panel's first block. The
//! hardware prefetchers never see a stream that runs into the next panel, and memory idles
//! while the later passes run from L1: one row (a decode step) read a Q4_1 weight at about half
//! the rate that prefetching the next panel across the passes reaches. Panels of a weight are
//! equal-sized and contiguous in its codes, scales and minimums, so the next panel sits right
//! after the current one in each; past the last panel the prefetched lines are simply unused
//! (a prefetch never faults).

use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};

use crate::matmul::int8_matmul::Int8Panel;

const LINE: usize = 64;

/// The cache lines of the panel after `panel`, split into equal shares for the steps of the
/// passes over `panel` to prefetch one each.
pub(crate) struct NextPanel {
    /// First byte past the current panel in codes, scales and minimums, and the line counts.
    parts: [(*const u8, usize); 3],
    lines: usize,
    steps: usize,
}

impl NextPanel {
    /// The panel after `panel`, fetched over `steps` steps.
    pub(crate) fn after(panel: &Int8Panel<'_>, steps: usize) -> Self {
        let part = |start: *const u8, bytes: usize| (start.wrapping_add(bytes), bytes.div_ceil(LINE));
        let parts = [
            part(panel.codes.as_ptr(), panel.codes.len()),
            part(panel.scales.as_ptr().cast(), std::mem::size_of_val(panel.scales)),
            part(panel.mins.as_ptr().cast(), std::mem::size_of_val(panel.mins)),
        ];
        let lines = parts.iter().map(|p| p.1).sum();
        Self { parts, lines, steps: steps.max(1) }
    }

    /// Prefetches share `step` (of `steps`) of the next panel's lines into L1.
    ///
    /// # Safety
    /// The CPU has SSE (every x86-64 CPU). Addresses need not be valid: prefetches do not fault.
    #[inline(always)]
    pub(crate) unsafe fn fetch(&self, step: usize) {
        let (first, end) = (step * self.lines / self.steps, (step + 1) * self.lines / self.steps);
        let (mut part, mut base) = (0, 0);
        for line in first..end.min(self.lines) {
            while line >= base + self.parts[part].1 {
                base += self.parts[part].1;
                part += 1;
            }
            let at = self.parts[part].0.wrapping_add((line - base) * LINE);
            // SAFETY: prefetching any address is allowed (the caller's contract).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(at.cast()) };
        }
    }
}
