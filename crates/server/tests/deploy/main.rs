//! The deployment stack run locally, from the repository's own deployment files: nginx with
//! docker/nginx/pagoda.conf.template (rendered by docker/nginx/render-conf.sh, as the compose
//! load balancer renders it) in front of two `pagoda serve` processes on 127.0.0.1 with
//! configs/serve-cpu.toml, and Prometheus with configs/prometheus.yml scraping both; plus the
//! Grafana dashboard, loaded and checked against the server's real metrics; and the same
//! replicas behind sglang-router and vllm-router, under their policies and through a replica's
//! crash.
//!
//! nginx and Prometheus are the Debian packages (`make deploy-tools` installs them), the routers
//! PyPI wheels (`make router-tools`), and the model is the default one (`make model`); the tests
//! fail, never skip, without them.

mod dashboard;
mod disaggregation;
mod load_balancer;
mod processes;
mod router_faults;
mod router_policies;
mod routers;
mod stack;

/// The tests that start servers take turns. On a 2-core machine two of them at once slow each
/// other's requests past their deadlines, and a timing check would then measure the other test
/// rather than the code under test.
pub static SERVERS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
