//! `pagoda-ops`: custom tensor ops (paged attention, KV write, rotary, rmsnorm), each with a CPU implementation.
