//! The value types of the model's and engine's flags that only flags have (`--device`,
//! `--dtype`, `--kv-cache-dtype`, byte sizes), each parsed by clap and by a TOML file alike, and
//! what each means to the layers below. Flags whose values are a model option's
//! (`--cpu-gemm-dtype`, `--load-format`, `--pooling`, `--quantization`) take `pagoda_models`'
//! own enums, which derive clap's `ValueEnum` behind that crate's `clap` feature.

use candle_core::DType;
use serde::Deserialize;

/// `cpu`, `cuda` or `cuda:N`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DeviceArg {
    #[default]
    Cpu,
    Cuda(usize),
}

impl std::str::FromStr for DeviceArg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(DeviceArg::Cpu),
            "cuda" | "gpu" => Ok(DeviceArg::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceArg::Cuda)
                .ok_or_else(|| format!("expected cpu, cuda or cuda:N, got {s:?}")),
        }
    }
}

impl std::fmt::Display for DeviceArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceArg::Cpu => f.write_str("cpu"),
            DeviceArg::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl<'de> Deserialize<'de> for DeviceArg {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// A byte count: an integer, or a number with a unit (`512MiB`, `2GiB`, `1.5GB`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl std::str::FromStr for ByteSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let num: f64 =
            num.parse().map_err(|_| format!("expected a size like 1073741824 or 1GiB, got {s:?}"))?;
        let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1.0,
            "k" | "kb" => 1e3,
            "m" | "mb" => 1e6,
            "g" | "gb" => 1e9,
            "ki" | "kib" => 1024.0,
            "mi" | "mib" => 1024.0 * 1024.0,
            "gi" | "gib" => 1024.0 * 1024.0 * 1024.0,
            "ti" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
            u => return Err(format!("unknown size unit {u:?} in {s:?}")),
        };
        Ok(ByteSize((num * mult) as u64))
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(ByteSize(n)),
            Raw::Text(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum DtypeArg {
    /// float32 on the CPU, bfloat16 on CUDA.
    #[default]
    Auto,
    #[value(alias = "f32", alias = "float")]
    #[serde(alias = "f32", alias = "float")]
    Float32,
    #[value(alias = "f16", alias = "half")]
    #[serde(alias = "f16", alias = "half")]
    Float16,
    #[value(alias = "bf16")]
    #[serde(alias = "bf16")]
    Bfloat16,
}

/// `--kv-cache-dtype`: how the KV cache stores K and V.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum KvCacheDtypeArg {
    /// float16 when computing in float32 (as llama.cpp), else the compute dtype.
    #[default]
    Auto,
    #[value(alias = "f32", alias = "float")]
    #[serde(alias = "f32", alias = "float")]
    Float32,
    #[value(alias = "f16", alias = "half")]
    #[serde(alias = "f16", alias = "half")]
    Float16,
    #[value(alias = "bf16")]
    #[serde(alias = "bf16")]
    Bfloat16,
    /// FP8 (e4m3) with a K and a V scale per cache slot, calibrated at start-up: half of a 16-bit
    /// cache's memory.
    #[value(alias = "fp8_e4m3")]
    #[serde(alias = "fp8_e4m3")]
    Fp8,
}

impl KvCacheDtypeArg {
    /// The KV cache's dtype for a model computing in `compute`: `auto` stores f32 models' K/V
    /// as f16 (as llama.cpp does), which halves the cache's memory and the attention's reads.
    pub fn kv_cache(self, compute: DType) -> DType {
        match self {
            Self::Auto if compute == DType::F32 => DType::F16,
            Self::Auto => compute,
            Self::Float32 => DType::F32,
            Self::Float16 => DType::F16,
            Self::Bfloat16 => DType::BF16,
            Self::Fp8 => DType::F8E4M3,
        }
    }
}

impl DtypeArg {
    /// The compute dtype on `device`: `auto` is float32 on the CPU, bfloat16 on CUDA.
    pub fn compute(self, device: DeviceArg) -> DType {
        match self {
            DtypeArg::Auto if device == DeviceArg::Cpu => DType::F32,
            DtypeArg::Auto => DType::BF16,
            DtypeArg::Float32 => DType::F32,
            DtypeArg::Float16 => DType::F16,
            DtypeArg::Bfloat16 => DType::BF16,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_dtypes_follow_the_device_and_the_compute_dtype() {
        assert_eq!(DtypeArg::Auto.compute(DeviceArg::Cpu), DType::F32);
        assert_eq!(DtypeArg::Auto.compute(DeviceArg::Cuda(1)), DType::BF16);
        assert_eq!(DtypeArg::Float16.compute(DeviceArg::Cpu), DType::F16);
        assert_eq!(KvCacheDtypeArg::Auto.kv_cache(DType::F32), DType::F16);
        assert_eq!(KvCacheDtypeArg::Auto.kv_cache(DType::BF16), DType::BF16);
        assert_eq!(KvCacheDtypeArg::Float32.kv_cache(DType::F32), DType::F32);
        assert_eq!(KvCacheDtypeArg::Bfloat16.kv_cache(DType::F32), DType::BF16);
        assert_eq!(KvCacheDtypeArg::Fp8.kv_cache(DType::BF16), DType::F8E4M3);
    }

    #[test]
    fn devices_and_sizes_parse() {
        assert_eq!("cuda:3".parse::<DeviceArg>(), Ok(DeviceArg::Cuda(3)));
        assert_eq!("GPU".parse::<DeviceArg>(), Ok(DeviceArg::Cuda(0)));
        assert!("tpu".parse::<DeviceArg>().is_err());
        assert_eq!(DeviceArg::Cuda(2).to_string(), "cuda:2");
        assert_eq!("1.5GiB".parse::<ByteSize>(), Ok(ByteSize(3 << 29)));
        assert!("3 parsecs".parse::<ByteSize>().is_err());
    }
}
