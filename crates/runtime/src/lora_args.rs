//! The LoRA flags, as vLLM names them: `--enable-lora`, the adapters loaded at start-up
//! (`--lora-modules NAME=PATH ...`) and the limits (`--max-loras` in one step, `--max-lora-rank`,
//! `--max-cpu-loras` held at once), as given ([`LoraArgs`]) and checked ([`LoraSettings`]); and
//! `--lora-dtype`, how an f32 model stores adapters' matrices.

use std::path::PathBuf;

use pagoda_models::lora::LoraDtype;
use serde::Deserialize;

use crate::engine_args::ArgsError;

/// Rank limit when none is given (vLLM's default).
pub const DEFAULT_MAX_LORA_RANK: usize = 16;
/// Adapters in one step when none is given (vLLM's default).
pub const DEFAULT_MAX_LORAS: usize = 1;

#[derive(Debug, Clone, Default, clap::Args, Deserialize)]
#[command(next_help_heading = "LoRA adapters")]
#[serde(rename_all = "kebab-case")]
pub struct LoraArgs {
    /// Serve LoRA adapters over the model: a request names one in `model`. [default: false]
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub enable_lora: Option<bool>,
    /// Adapters loaded at start-up, each NAME=PATH: a PEFT directory (adapter_config.json and
    /// adapter_model.safetensors) or a GGUF LoRA file (llama.cpp's convert_lora_to_gguf.py).
    /// Needs --enable-lora.
    #[arg(long, num_args = 1.., value_name = "NAME=PATH")]
    pub lora_modules: Option<Vec<String>>,
    /// Most adapters whose sequences run in one step; sequences of another adapter wait.
    /// [default: 1]
    #[arg(long, value_name = "N")]
    pub max_loras: Option<usize>,
    /// Highest adapter rank accepted. [default: 16]
    #[arg(long, value_name = "RANK")]
    pub max_lora_rank: Option<usize>,
    /// Most adapters held in memory at once. [default: --max-loras]
    #[arg(long, value_name = "N")]
    pub max_cpu_loras: Option<usize>,
    /// Allow POST /v1/load_lora_adapter and /v1/unload_lora_adapter while serving (vLLM's
    /// VLLM_ALLOW_RUNTIME_LORA_UPDATING). [default: false]
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub allow_runtime_lora_updating: Option<bool>,
    /// Directories run-time loads may read adapters from (and below); any directory when none
    /// is given.
    #[arg(long, num_args = 1.., value_name = "DIR")]
    pub lora_dirs: Option<Vec<PathBuf>>,
    /// How a float32 model stores adapters' matrices (half dtypes store them in theirs). auto:
    /// bfloat16 where the file's are bfloat16 and alpha / r keeps them exact (a power of two),
    /// else float32; no value changes. bfloat16: rounds every value to bfloat16 (lossy; half the
    /// bytes of float32, read faster at small batches). [default: auto]
    #[arg(long, value_enum)]
    pub lora_dtype: Option<LoraDtype>,
}

/// The LoRA settings of a server that serves adapters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraSettings {
    /// Start-up adapters: (name, directory), in the order given.
    pub modules: Vec<(String, PathBuf)>,
    pub max_loras: usize,
    pub max_lora_rank: usize,
    pub max_cpu_loras: usize,
    /// Adapters may be loaded and unloaded while serving.
    pub allow_runtime_updating: bool,
    /// Where run-time loads may read from; anywhere when empty.
    pub allowed_dirs: Vec<PathBuf>,
    /// How an f32 model stores adapters (`--lora-dtype`).
    pub dtype: LoraDtype,
}

fn invalid(flag: &'static str, message: impl Into<String>) -> ArgsError {
    ArgsError { flag, message: message.into() }
}

impl LoraArgs {
    /// The settings asked for; `None` without `--enable-lora`, when no other LoRA flag may be
    /// given.
    pub fn settings(self) -> Result<Option<LoraSettings>, ArgsError> {
        if !self.enable_lora.unwrap_or(false) {
            let given = [
                ("--lora-modules", self.lora_modules.is_some()),
                ("--max-loras", self.max_loras.is_some()),
                ("--max-lora-rank", self.max_lora_rank.is_some()),
                ("--max-cpu-loras", self.max_cpu_loras.is_some()),
                ("--allow-runtime-lora-updating", self.allow_runtime_lora_updating.is_some()),
                ("--lora-dirs", self.lora_dirs.is_some()),
                ("--lora-dtype", self.lora_dtype.is_some()),
            ];
            return match given.into_iter().find(|(_, set)| *set) {
                Some((flag, _)) => Err(invalid(flag, "needs --enable-lora")),
                None => Ok(None),
            };
        }
        let max_loras = self.max_loras.unwrap_or(DEFAULT_MAX_LORAS);
        let max_lora_rank = self.max_lora_rank.unwrap_or(DEFAULT_MAX_LORA_RANK);
        let max_cpu_loras = self.max_cpu_loras.unwrap_or(max_loras);
        if max_loras == 0 {
            return Err(invalid("--max-loras", "must be at least 1"));
        }
        if max_lora_rank == 0 {
            return Err(invalid("--max-lora-rank", "must be at least 1"));
        }
        if max_cpu_loras < max_loras {
            return Err(invalid("--max-cpu-loras", format!("must be at least --max-loras ({max_loras})")));
        }
        let mut modules: Vec<(String, PathBuf)> = Vec::new();
        for module in self.lora_modules.unwrap_or_default() {
            let Some((name, path)) = module.split_once('=').filter(|(n, p)| !n.is_empty() && !p.is_empty())
            else {
                return Err(invalid("--lora-modules", format!("expected NAME=PATH, got {module:?}")));
            };
            if modules.iter().any(|(n, _)| n == name) {
                return Err(invalid("--lora-modules", format!("the name {name:?} is given twice")));
            }
            modules.push((name.to_owned(), PathBuf::from(path)));
        }
        if modules.len() > max_cpu_loras {
            return Err(invalid(
                "--lora-modules",
                format!("{} adapters are more than --max-cpu-loras ({max_cpu_loras})", modules.len()),
            ));
        }
        Ok(Some(LoraSettings {
            modules,
            max_loras,
            max_lora_rank,
            max_cpu_loras,
            allow_runtime_updating: self.allow_runtime_lora_updating.unwrap_or(false),
            allowed_dirs: self.lora_dirs.unwrap_or_default(),
            dtype: self.lora_dtype.unwrap_or_default(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(enable: bool, modules: &[&str]) -> LoraArgs {
        LoraArgs {
            enable_lora: Some(enable),
            lora_modules: Some(modules.iter().map(|m| m.to_string()).collect()),
            ..LoraArgs::default()
        }
    }

    #[test]
    fn modules_parse_and_limits_hold() {
        let settings = LoraArgs { max_cpu_loras: Some(4), ..args(true, &["a=/x/a", "b=/x/b"]) }.settings();
        let settings = settings.unwrap().unwrap();
        assert_eq!(settings.modules, vec![("a".into(), "/x/a".into()), ("b".into(), "/x/b".into())]);
        assert_eq!((settings.max_loras, settings.max_lora_rank, settings.max_cpu_loras), (1, 16, 4));
        let flag = |a: LoraArgs| a.settings().unwrap_err().flag;
        assert_eq!(flag(args(false, &["a=/x"])), "--lora-modules");
        assert_eq!(flag(args(true, &["a"])), "--lora-modules");
        assert_eq!(flag(args(true, &["a=/x", "a=/y"])), "--lora-modules");
        // Two adapters, room for one.
        assert_eq!(flag(args(true, &["a=/x", "b=/y"])), "--lora-modules");
        assert_eq!(
            flag(LoraArgs { max_cpu_loras: Some(1), max_loras: Some(2), ..args(true, &[]) }),
            "--max-cpu-loras"
        );
        assert_eq!(LoraArgs::default().settings().unwrap(), None);
    }

    #[test]
    fn lora_dtype_defaults_to_auto_and_needs_enable_lora() {
        assert_eq!(args(true, &[]).settings().unwrap().unwrap().dtype, LoraDtype::Auto);
        let bf16 = LoraArgs { lora_dtype: Some(LoraDtype::Bfloat16), ..args(true, &[]) };
        assert_eq!(bf16.settings().unwrap().unwrap().dtype, LoraDtype::Bfloat16);
        let off = LoraArgs { lora_dtype: Some(LoraDtype::Float32), ..LoraArgs::default() };
        assert_eq!(off.settings().unwrap_err().flag, "--lora-dtype");
    }

    /// `argv` over a config file's `json`, layered as `pagoda serve` layers them.
    fn layered(json: &str, argv: &[&str]) -> LoraArgs {
        use clap::{Args, FromArgMatches};
        let command = LoraArgs::augment_args(clap::Command::new("pagoda"));
        let matches = command.try_get_matches_from(std::iter::once("pagoda").chain(argv.iter().copied()));
        let mut args: LoraArgs = serde_json::from_str(json).unwrap();
        args.update_from_arg_matches(&matches.unwrap()).unwrap();
        args
    }

    #[test]
    fn a_flag_is_over_the_files_value_and_leaves_the_others() {
        let file = r#"{"lora-dtype": "bf16", "max-loras": 3}"#;
        let a = layered(file, &["--lora-dtype", "float32"]);
        assert_eq!((a.lora_dtype, a.max_loras), (Some(LoraDtype::Float32), Some(3)));
        let a = layered(file, &[]);
        assert_eq!((a.lora_dtype, a.max_loras, a.enable_lora), (Some(LoraDtype::Bfloat16), Some(3), None));
        assert_eq!(layered("{}", &["--enable-lora"]).enable_lora, Some(true));
    }
}
