//! Tests of flag and TOML merging, defaults and validation.

use super::*;
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: ServeArgs,
}

fn cli(args: &[&str]) -> ServeArgs {
    Cli::try_parse_from(std::iter::once("pagoda").chain(args.iter().copied())).unwrap().args
}

#[test]
fn defaults() {
    let c = ServerConfig::merge(ServeArgs::default(), ServeArgs::default()).unwrap();
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
    let budget = |args: &[&str]| {
        ServerConfig::merge(cli(args), ServeArgs::default()).unwrap().engine.max_num_batched_tokens
    };
    assert_eq!(budget(&[]), 512);
    assert_eq!(budget(&["--device", "cuda"]), 2048);
    assert_eq!(budget(&["--device", "cuda", "--max-num-batched-tokens", "300"]), 300);
    assert_eq!(budget(&["--max-num-batched-tokens", "4096"]), 4096);
    // From the file when the flag is absent, for either device.
    let file = ServeArgs {
        engine: EngineArgs { max_num_batched_tokens: Some(1024), ..EngineArgs::default() },
        ..ServeArgs::default()
    };
    assert_eq!(
        ServerConfig::merge(cli(&["--device", "cuda"]), file).unwrap().engine.max_num_batched_tokens,
        1024
    );
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
    let c = ServerConfig::merge(a, ServeArgs::default()).unwrap();
    assert_eq!(c.served_model_names, vec!["a", "b"]);
    assert_eq!(c.engine.max_model_len, Some(2048));
    assert!(!c.engine.enable_prefix_caching);
    assert_eq!(c.engine.kv_cache_memory, Some(512 << 20));
    assert_eq!(c.engine.device, DeviceArg::Cuda(1));
    assert_eq!(c.engine.dtype, DtypeArg::Bfloat16);
    assert_eq!(c.engine.kv_cache_dtype, pagoda_runtime::KvCacheDtypeArg::Float32);
    assert_eq!(c.engine.kernels.cpu_gemm_dtype, GemmDtypeArg::Float32.into());
    assert_eq!(c.metrics_prefix, MetricsPrefix::Vllm);
    assert!(!c.engine.model_is_default);
    let c = ServerConfig::merge(cli(&["--enable-prefix-caching"]), ServeArgs::default()).unwrap();
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
            let c =
                ServerConfig::from_args(cli(&["--config", &path])).unwrap_or_else(|e| panic!("{path}: {e}"));
            assert!(!c.engine.model.is_empty());
            checked += 1;
        }
    }
    assert!(checked > 0, "no example config in {}", dir.display());
}

#[test]
fn file_is_under_flags() {
    let file = ServerConfig::parse_file(
        r#"
        model = "from-file.gguf"
        port = 9000
        max-num-seqs = 8
        kv-cache-memory = "1GiB"
        enable-prefix-caching = false
        allowed-origins = ["http://localhost:3000"]
        "#,
    )
    .unwrap();
    let c = ServerConfig::merge(cli(&["--port", "9100"]), file).unwrap();
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
        assert!(ServerConfig::merge(cli(args), ServeArgs::default()).is_err(), "{args:?}");
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
    let c = ServerConfig::merge(cli(&["--host", "::1", "--port", "0"]), ServeArgs::default()).unwrap();
    assert_eq!(c.bind_addr(), "[::1]:0");
}

#[test]
fn batch_invariant_is_float32_on_the_cpu_and_half_precision_on_cuda() {
    let on = |args: &[&str], file: &str| {
        ServerConfig::merge(cli(args), ServerConfig::parse_file(file).unwrap())
            .map(|c| c.engine.kernels.batch_invariant)
            .ok()
    };
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
        let e = ServerConfig::merge(cli(args), ServeArgs::default()).unwrap_err();
        assert!(e.to_string().contains("--batch-invariant"), "{args:?}: {e}");
    }
}

#[test]
fn scheduling_policy_defaults_to_fcfs() {
    let c = ServerConfig::merge(ServeArgs::default(), ServeArgs::default()).unwrap();
    assert_eq!(c.scheduling_policy, SchedulingPolicy::Fcfs);
    let c = ServerConfig::merge(cli(&["--scheduling-policy", "priority"]), ServeArgs::default()).unwrap();
    assert_eq!(c.scheduling_policy, SchedulingPolicy::Priority);
    let file = ServerConfig::parse_file("scheduling-policy = \"priority\"").unwrap();
    assert_eq!(
        ServerConfig::merge(ServeArgs::default(), file).unwrap().scheduling_policy,
        SchedulingPolicy::Priority
    );
}

#[test]
fn hosted_tools_are_ignored_unless_the_flag_or_the_file_says_reject() {
    let c = ServerConfig::merge(ServeArgs::default(), ServeArgs::default()).unwrap();
    assert_eq!(c.hosted_tools, HostedToolsPolicy::Ignore);
    let c = ServerConfig::merge(cli(&["--hosted-tools", "reject"]), ServeArgs::default()).unwrap();
    assert_eq!(c.hosted_tools, HostedToolsPolicy::Reject);
    let file = ServerConfig::parse_file("hosted-tools = \"reject\"").unwrap();
    let c = ServerConfig::merge(cli(&["--hosted-tools", "ignore"]), file.clone()).unwrap();
    assert_eq!(c.hosted_tools, HostedToolsPolicy::Ignore);
    assert_eq!(
        ServerConfig::merge(ServeArgs::default(), file).unwrap().hosted_tools,
        HostedToolsPolicy::Reject
    );
    assert!(ServerConfig::parse_file("hosted-tools = \"drop\"").is_err());
}

#[test]
fn pooling_is_off_unless_a_flag_or_the_file_names_one() {
    use pagoda_runtime::PoolingKind;
    let c = ServerConfig::merge(ServeArgs::default(), ServeArgs::default()).unwrap();
    assert_eq!(c.engine.pooling, None);
    let c = ServerConfig::merge(cli(&["--pooling", "mean"]), ServeArgs::default()).unwrap();
    assert_eq!(c.engine.pooling, Some(PoolingKind::Mean));
    let file = ServerConfig::parse_file("pooling = \"last\"").unwrap();
    assert_eq!(
        ServerConfig::merge(ServeArgs::default(), file).unwrap().engine.pooling,
        Some(PoolingKind::Last)
    );
    assert!(Cli::try_parse_from(["pagoda", "--pooling", "max"]).is_err());
}

#[test]
fn kv_events_config_takes_vllms_json_and_names_bad_fields() {
    let on = r#"{"enable_kv_cache_events": true, "endpoint": "tcp://*:6000", "topic": "kv"}"#;
    let c = ServerConfig::merge(cli(&["--kv-events-config", on]), ServeArgs::default()).unwrap();
    let kv = c.kv_events.expect("enabled");
    assert_eq!((kv.topic.as_str(), kv.buffer_steps), ("kv", 10_000));
    // Present but not enabled: nothing is published.
    let off = r#"{"enable_kv_cache_events": false}"#;
    assert!(ServerConfig::merge(cli(&["--kv-events-config", off]), ServeArgs::default())
        .unwrap()
        .kv_events
        .is_none());
    for (json, needle) in [
        (r#"{"enable_kv_cache_events": true, "endpoint": "ipc:///tmp/kv"}"#, "endpoint"),
        (r#"{"enable_kv_cache_events": true, "publisher": "kafka"}"#, "kafka"),
        (r#"{"enable_kv_cache_events": true, "unknown": 1}"#, "unknown"),
        ("not json", "expected"),
    ] {
        let err = ServerConfig::merge(cli(&["--kv-events-config", json]), ServeArgs::default()).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("--kv-events-config") && text.contains(needle), "{json}: {text}");
    }
}

#[test]
fn quantization_comes_from_the_flag_or_the_file() {
    let quantization = |args: &[&str], file: &str| {
        ServerConfig::merge(cli(args), ServerConfig::parse_file(file).unwrap())
            .map(|c| c.engine.quantization.map(|q| format!("{q:?}")))
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
    let c = ServerConfig::merge(ServeArgs::default(), ServeArgs::default()).unwrap();
    assert!(c.allowed_origins.is_empty(), "{:?}", c.allowed_origins);
    assert!(!c.health_generate_without_key);
    assert_eq!((c.stored_responses_memory, c.max_stored_response_bytes), (256 << 20, 4 << 20));
    let c = ServerConfig::merge(
        cli(&["--allowed-origins", r#"["*"]"#, "--allowed-methods", r#"["GET","POST"]"#]),
        ServeArgs::default(),
    )
    .unwrap();
    assert_eq!(
        (c.allowed_origins, c.allowed_methods),
        (vec!["*".to_owned()], vec!["GET".into(), "POST".into()])
    );
    let c = ServerConfig::merge(
        cli(&["--allowed-origins", "https://a.example", "https://b.example"]),
        ServeArgs::default(),
    )
    .unwrap();
    assert_eq!(c.allowed_origins, ["https://a.example", "https://b.example"]);
    for args in [
        &["--allowed-origins", "[\"x\""][..],
        &["--allowed-methods", "G T"],
        &["--max-stored-response-bytes", "0"],
    ] {
        assert!(ServerConfig::merge(cli(args), ServeArgs::default()).is_err(), "{args:?}");
    }
}
