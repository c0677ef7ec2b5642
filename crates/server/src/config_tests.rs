//! Tests of flag and TOML merging, defaults and validation.

use super::*;
use clap::{CommandFactory, Parser};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: ServeArgs,
}

fn argv<'a>(args: &'a [&'a str]) -> impl Iterator<Item = &'a str> {
    std::iter::once("pagoda").chain(args.iter().copied())
}

fn cli(args: &[&str]) -> ServeArgs {
    Cli::try_parse_from(argv(args)).unwrap().args
}

/// The configuration `args` ask for, with no config file.
fn flags(args: &[&str]) -> Result<ServerConfig, ConfigError> {
    ServerConfig::from_args(cli(args))
}

/// `args` over a config file holding `file`, over the defaults, as `pagoda serve` layers them.
fn layered(args: &[&str], file: &str) -> Result<ServerConfig, ConfigError> {
    let file = ServerConfig::parse_file(file).unwrap();
    ServerConfig::from_args(ServeArgs::over(file, &Cli::command().get_matches_from(argv(args)))?)
}

#[test]
fn defaults() {
    let c = ServerConfig::from_args(ServeArgs::default()).unwrap();
    assert_eq!(c.engine.model, DEFAULT_MODEL);
    assert!(c.engine.model_is_default);
    assert_eq!(c.served_model_names, vec!["SmolLM2-135M-Instruct.Q4_1".to_owned()]);
    let name = crate::state::default_served_name;
    assert_eq!(name("HuggingFaceTB/SmolLM2-135M-Instruct"), "HuggingFaceTB/SmolLM2-135M-Instruct");
    assert_eq!(name("org/repo/model.Q8_0.GGUF"), "model.Q8_0");
    assert_eq!(c.bind_addr(), "127.0.0.1:8000");
    assert!(c.engine.enable_prefix_caching);
    assert_eq!(c.engine.block_size, 16);
    assert_eq!(c.engine.device, DeviceArg::Cpu);
    assert_eq!(c.engine.max_num_batched_tokens, 512);
    assert_eq!(c.metrics_prefix, MetricsPrefix::Pagoda);
    assert_eq!(c.http_header_read_timeout, Duration::from_secs(10));
    assert_eq!(c.http_keep_alive_timeout, Duration::from_secs(75));
    assert_eq!(c.max_connections, 2048);
}

#[test]
fn the_step_budget_defaults_by_device_and_a_given_one_wins() {
    let budget = |args: &[&str]| flags(args).unwrap().engine.max_num_batched_tokens;
    assert_eq!(budget(&[]), 512);
    assert_eq!(budget(&["--device", "cuda"]), 2048);
    assert_eq!(budget(&["--device", "cuda", "--max-num-batched-tokens", "300"]), 300);
    assert_eq!(budget(&["--max-num-batched-tokens", "4096"]), 4096);
    // From the file when the flag is absent, for either device.
    let file = "max-num-batched-tokens = 1024";
    assert_eq!(layered(&["--device", "cuda"], file).unwrap().engine.max_num_batched_tokens, 1024);
    assert_eq!(layered(&["--max-num-batched-tokens", "64"], file).unwrap().engine.max_num_batched_tokens, 64);
}

#[test]
fn vllm_flags_parse() {
    let a = cli(&[
        "--model",
        "m.gguf",
        "--served-model-name",
        "a",
        "b",
        "--max-model-len",
        "2048",
        "--no-enable-prefix-caching",
        "--kv-cache-memory",
        "512MiB",
        "--device",
        "cuda:1",
        "--dtype",
        "bf16",
        "--kv-cache-dtype",
        "f32",
        "--cpu-gemm-dtype",
        "float32",
        "--metrics-prefix",
        "vllm",
        "--allowed-origins",
        "https://a.example",
    ]);
    let c = ServerConfig::from_args(a).unwrap();
    assert_eq!(c.served_model_names, vec!["a", "b"]);
    assert_eq!(c.engine.max_model_len, Some(2048));
    assert!(!c.engine.enable_prefix_caching);
    assert_eq!(c.engine.kv_cache_memory, Some(512 << 20));
    assert_eq!(c.engine.device, DeviceArg::Cuda(1));
    assert_eq!(c.engine.dtype, DtypeArg::Bfloat16);
    assert_eq!(c.engine.kv_cache_dtype, pagoda_runtime::KvCacheDtypeArg::Float32);
    assert_eq!(c.engine.kernels.cpu_gemm_dtype, CpuGemmDtype::Float32);
    assert_eq!(c.metrics_prefix, MetricsPrefix::Vllm);
    assert!(!c.engine.model_is_default);
    let c = flags(&["--enable-prefix-caching"]).unwrap();
    assert!(c.engine.enable_prefix_caching);
}

#[test]
fn shipped_example_configs_parse() {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")), std::path::PathBuf::from)
        .join("../../configs");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let path = path.display().to_string();
            let c = ServerConfig::from_matches(&Cli::command().get_matches_from(argv(&["--config", &path])))
                .unwrap_or_else(|e| panic!("{path}: {e}"));
            assert!(!c.engine.model.is_empty());
            checked += 1;
        }
    }
    assert!(checked > 0, "no example config in {}", dir.display());
}

#[test]
fn file_is_under_flags() {
    let file = r#"
        model = "from-file.gguf"
        port = 9000
        max-num-seqs = 8
        kv-cache-memory = "1GiB"
        enable-prefix-caching = false
        allowed-origins = ["http://localhost:3000"]
        "#;
    let c = layered(&["--port", "9100"], file).unwrap();
    assert_eq!(c.engine.model, "from-file.gguf");
    assert_eq!(c.port, 9100);
    assert_eq!(c.engine.max_num_seqs, 8);
    assert_eq!(c.engine.kv_cache_memory, Some(1 << 30));
    assert!(!c.engine.enable_prefix_caching);
    assert_eq!(c.allowed_origins, vec!["http://localhost:3000"]);
}

#[test]
fn unknown_file_keys_are_errors() {
    for (text, key) in [
        ("max-model-lenn = 3", "max-model-lenn"),
        ("max_model_len = 3", "max_model_len"),
        ("config = \"x\"", "config"),
        ("no-enable-prefix-caching = true", "no-enable-prefix-caching"),
    ] {
        match ServerConfig::parse_file(text) {
            Err(FileError::UnknownKey(k)) => assert_eq!(k, key),
            other => panic!("{text}: {other:?}"),
        }
    }
    assert!(matches!(ServerConfig::parse_file("port = \"eighty\""), Err(FileError::Parse(_))));
    assert!(matches!(ServerConfig::parse_file("max-num-seqs = -1"), Err(FileError::Parse(_))));
}

#[test]
fn bad_values_are_errors() {
    for args in [
        &["--block-size", "0"][..],
        &["--gpu-memory-utilization", "1.5"],
        &["--max-num-seqs", "0"],
        &["--max-model-len", "0"],
        &["--kv-cache-memory", "0"],
        &["--http-header-read-timeout", "0"],
        &["--http-keep-alive-timeout=-1"],
        &["--http-keep-alive-timeout", "inf"],
        &["--max-connections", "0"],
    ] {
        assert!(flags(args).is_err(), "{args:?}");
    }
    assert!(Cli::try_parse_from(["pagoda", "--device", "tpu"]).is_err());
    assert!(Cli::try_parse_from(["pagoda", "--kv-cache-memory", "lots"]).is_err());
    assert!(Cli::try_parse_from(["pagoda", "--enable-prefix-caching", "--no-enable-prefix-caching"]).is_err());
}

#[test]
fn byte_sizes() {
    let p = |s: &str| s.parse::<ByteSize>().map(|b| b.0);
    assert_eq!(p("1024"), Ok(1024));
    assert_eq!(p("2GiB"), Ok(2 << 30));
    assert_eq!(p("1.5 GB"), Ok(1_500_000_000));
    assert_eq!(p("16k"), Ok(16_000));
    assert!(p("").is_err() && p("GiB").is_err() && p("3 parsecs").is_err());
}

#[test]
fn ipv6_bind_address() {
    let c = flags(&["--host", "::1", "--port", "0"]).unwrap();
    assert_eq!(c.bind_addr(), "[::1]:0");
}

#[test]
fn batch_invariant_is_float32_on_the_cpu_and_half_precision_on_cuda() {
    let on = |args: &[&str], file: &str| layered(args, file).map(|c| c.engine.kernels.batch_invariant).ok();
    assert_eq!(on(&[], ""), Some(false));
    assert_eq!(on(&["--batch-invariant"], ""), Some(true));
    assert_eq!(on(&["--batch-invariant", "false"], "batch-invariant = true"), Some(false));
    assert_eq!(on(&[], "batch-invariant = true"), Some(true));
    assert_eq!(on(&["--batch-invariant", "--cpu-gemm-dtype", "int8", "--dtype", "float32"], ""), Some(true));
    // On CUDA in half precision: bfloat16 by default.
    assert_eq!(on(&["--batch-invariant", "--device", "cuda"], ""), Some(true));
    assert_eq!(on(&["--batch-invariant", "--device", "cuda", "--dtype", "float16"], ""), Some(true));
    for args in [
        &["--batch-invariant", "--device", "cuda", "--dtype", "float32"][..],
        &["--batch-invariant", "--device", "cuda", "--dequantize", "false"],
        &["--batch-invariant", "--dtype", "bfloat16"],
        &["--batch-invariant", "--dequantize", "false"],
    ] {
        let e = flags(args).unwrap_err();
        assert!(e.to_string().contains("--batch-invariant"), "{args:?}: {e}");
    }
}

#[test]
fn scheduling_policy_defaults_to_fcfs() {
    let c = ServerConfig::from_args(ServeArgs::default()).unwrap();
    assert_eq!(c.scheduling_policy, SchedulingPolicy::Fcfs);
    let c = flags(&["--scheduling-policy", "priority"]).unwrap();
    assert_eq!(c.scheduling_policy, SchedulingPolicy::Priority);
    let file = "scheduling-policy = \"priority\"";
    assert_eq!(layered(&[], file).unwrap().scheduling_policy, SchedulingPolicy::Priority);
}

#[test]
fn hosted_tools_are_ignored_unless_the_flag_or_the_file_says_reject() {
    let c = ServerConfig::from_args(ServeArgs::default()).unwrap();
    assert_eq!(c.hosted_tools, HostedToolsPolicy::Ignore);
    let c = flags(&["--hosted-tools", "reject"]).unwrap();
    assert_eq!(c.hosted_tools, HostedToolsPolicy::Reject);
    let file = "hosted-tools = \"reject\"";
    let c = layered(&["--hosted-tools", "ignore"], file).unwrap();
    assert_eq!(c.hosted_tools, HostedToolsPolicy::Ignore);
    assert_eq!(layered(&[], file).unwrap().hosted_tools, HostedToolsPolicy::Reject);
    assert!(ServerConfig::parse_file("hosted-tools = \"drop\"").is_err());
}

#[test]
fn pooling_is_off_unless_a_flag_or_the_file_names_one() {
    use pagoda_runtime::PoolingKind;
    let c = ServerConfig::from_args(ServeArgs::default()).unwrap();
    assert_eq!(c.engine.pooling, None);
    let c = flags(&["--pooling", "mean"]).unwrap();
    assert_eq!(c.engine.pooling, Some(PoolingKind::Mean));
    assert_eq!(layered(&[], "pooling = \"last\"").unwrap().engine.pooling, Some(PoolingKind::Last));
    assert!(Cli::try_parse_from(["pagoda", "--pooling", "max"]).is_err());
}

#[test]
fn kv_events_config_takes_vllms_json_and_names_bad_fields() {
    let on = r#"{"enable_kv_cache_events": true, "endpoint": "tcp://*:6000", "topic": "kv"}"#;
    let c = flags(&["--kv-events-config", on]).unwrap();
    let kv = c.kv_events.expect("enabled");
    assert_eq!((kv.topic.as_str(), kv.buffer_steps), ("kv", 10_000));
    // Present but not enabled: nothing is published.
    let off = r#"{"enable_kv_cache_events": false}"#;
    assert!(flags(&["--kv-events-config", off]).unwrap().kv_events.is_none());
    for (json, needle) in [
        (r#"{"enable_kv_cache_events": true, "endpoint": "ipc:///tmp/kv"}"#, "endpoint"),
        (r#"{"enable_kv_cache_events": true, "publisher": "kafka"}"#, "kafka"),
        (r#"{"enable_kv_cache_events": true, "unknown": 1}"#, "unknown"),
        ("not json", "expected"),
    ] {
        let err = flags(&["--kv-events-config", json]).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("--kv-events-config") && text.contains(needle), "{json}: {text}");
    }
}

#[test]
fn quantization_comes_from_the_flag_or_the_file() {
    let quantization = |args: &[&str], file: &str| {
        layered(args, file).map(|c| c.engine.quantization.map(|q| format!("{q:?}")))
    };
    assert_eq!(quantization(&[], "").unwrap(), None);
    assert_eq!(quantization(&["--quantization", "fp8"], "").unwrap().as_deref(), Some("Fp8"));
    assert_eq!(quantization(&[], "quantization = \"fp8\"").unwrap().as_deref(), Some("Fp8"));
    assert!(ServerConfig::parse_file("quantization = \"int4\"").is_err());
    let e = quantization(&["--quantization", "fp8", "--batch-invariant"], "").unwrap_err();
    assert!(e.to_string().contains("--quantization"), "{e}");
}

#[test]
fn cors_is_opt_in_and_takes_vllms_json_lists() {
    let c = ServerConfig::from_args(ServeArgs::default()).unwrap();
    assert!(c.allowed_origins.is_empty(), "{:?}", c.allowed_origins);
    assert!(!c.health_generate_without_key);
    assert_eq!((c.stored_responses_memory, c.max_stored_response_bytes), (256 << 20, 4 << 20));
    let c = flags(&["--allowed-origins", r#"["*"]"#, "--allowed-methods", r#"["GET","POST"]"#]).unwrap();
    assert_eq!(
        (c.allowed_origins, c.allowed_methods),
        (vec!["*".to_owned()], vec!["GET".into(), "POST".into()])
    );
    let c = flags(&["--allowed-origins", "https://a.example", "https://b.example"]).unwrap();
    assert_eq!(c.allowed_origins, ["https://a.example", "https://b.example"]);
    for args in [
        &["--allowed-origins", "[\"x\""][..],
        &["--allowed-methods", "G T"],
        &["--max-stored-response-bytes", "0"],
    ] {
        assert!(flags(args).is_err(), "{args:?}");
    }
}

/// Every flag whose help states its default as a value (`[default: 256]`, `[default: auto]`,
/// `[default: GET, POST, DELETE, OPTIONS]`) resolves to the same configuration whether that value
/// is given on the command line, given in the config file, or not given at all: the help (and so
/// docs/configuration.md) cannot drift from the constant the default comes from, and the file
/// cannot have defaults of its own. Defaults stated in prose ("512 on the CPU, 2048 on CUDA",
/// "the model") are skipped.
#[test]
fn stated_defaults_are_what_flags_and_files_resolve_to() {
    // The LoRA limits are refused without --enable-lora.
    let base = |long: &str| if long == "enable-lora" { vec![] } else { vec!["--enable-lora".to_owned()] };
    let resolve = |args: Vec<String>, file: &str| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut c = layered(&args, file).unwrap_or_else(|e| panic!("{args:?} {file:?}: {e}"));
        // Naming the default model is naming a model.
        c.engine.model_is_default = true;
        c
    };
    let mut checked = Vec::new();
    let command = Cli::command();
    for arg in command.get_arguments() {
        let (Some(long), Some(help)) = (arg.get_long(), arg.get_long_help().or(arg.get_help())) else {
            continue;
        };
        let help = help.to_string();
        let Some((_, stated)) = help.trim_end().strip_suffix(']').and_then(|h| h.rsplit_once("[default: "))
        else {
            continue;
        };
        let list = arg.get_num_args().is_some_and(|n| n.max_values() > 1);
        let values: Vec<&str> = if list { stated.split(", ").collect() } else { vec![stated] };
        let prose = |v: &&str| v.contains(' ') || v.starts_with(['$', '-']) || ["none", "off"].contains(v);
        if values.iter().any(prose) {
            continue;
        }
        let default = resolve(base(long), "");
        let mut given = base(long);
        given.push(format!("--{long}"));
        given.extend(values.iter().map(|v| v.to_string()));
        assert_eq!(resolve(given, ""), default, "--{long}: the help says {stated}");
        let literal = |v: &str| match toml::from_str::<toml::Table>(&format!("v = {v}")) {
            Ok(_) => v.to_owned(),
            Err(_) => format!("{v:?}"),
        };
        let value = match values.as_slice() {
            [one] if !list => literal(one),
            many => format!("[{}]", many.iter().map(|v| format!("{v:?}")).collect::<Vec<_>>().join(", ")),
        };
        let file = format!("{long} = {value}");
        assert_eq!(resolve(base(long), &file), default, "{file}: the help says {stated}");
        checked.push(long);
    }
    // A stated default no longer recognised would silently go unchecked.
    assert!(checked.len() >= 25, "checked only {checked:?}");
}

#[test]
fn a_file_is_layered_only_where_the_flags_given_are_known() {
    let e = ServerConfig::from_args(cli(&["--config", "serve.toml"])).unwrap_err();
    assert!(matches!(e, ConfigError::FileNotLayered(_)), "{e}");
    // Flags given on the command line win, including ones set back to their default.
    let c = layered(&["--max-num-seqs", "256", "--no-enable-prefix-caching"], "max-num-seqs = 8").unwrap();
    assert_eq!((c.engine.max_num_seqs, c.engine.enable_prefix_caching), (256, false));
    assert!(
        layered(&["--enable-prefix-caching"], "enable-prefix-caching = false")
            .unwrap()
            .engine
            .enable_prefix_caching
    );
    assert!(matches!(flags(&["--shutdown-timeout", "inf"]), Err(ConfigError::Invalid { .. })));
}
