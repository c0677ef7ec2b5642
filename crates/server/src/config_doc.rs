//! docs/configuration.md is `pagoda serve --help`, rendered from [`ServeArgs`]' own flag docs,
//! so the reference cannot drift from the flags. A test compares the file with the help text;
//! `PAGODA_BLESS_DOCS=1 cargo test -p pagoda-server --lib config_doc` rewrites it.

use clap::{CommandFactory, Parser};

use crate::config::ServeArgs;

#[derive(Parser)]
#[command(name = "pagoda serve", about = "Serve the OpenAI-compatible HTTP API.")]
struct ServeCommand {
    #[command(flatten)]
    args: ServeArgs,
}

/// The text of docs/configuration.md.
pub fn configuration_doc() -> String {
    let help = ServeCommand::command().term_width(100).render_long_help().to_string();
    let help: Vec<&str> = help.lines().map(str::trim_end).collect();
    format!(
        "# Configuration\n\n\
         Every flag of `pagoda serve`, as `pagoda serve --help` prints it. A TOML file given with \
         `--config` takes the same names in kebab-case (see `configs/serve-cpu.toml`); flags and \
         environment variables override it. The topics behind the flags: kernels, dtypes and \
         `--batch-invariant` in [numerics.md](numerics.md), `--speculative-config` in \
         [speculative.md](speculative.md), tool and reasoning parsers in [tools.md](tools.md), \
         images, replicas behind a proxy and CUDA builds in [deployment.md](deployment.md).\n\n\
         This file is generated: `PAGODA_BLESS_DOCS=1 cargo test -p pagoda-server --lib config_doc` \
         rewrites it, and `make test` fails when it is out of date.\n\n```text\n{}\n```\n",
        help.join("\n").trim_end()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docs_configuration_md_is_the_current_help() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md");
        let expected = configuration_doc();
        if std::env::var_os("PAGODA_BLESS_DOCS").is_some() {
            std::fs::write(&path, &expected).expect("write docs/configuration.md");
        }
        let actual = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            actual == expected,
            "docs/configuration.md is not `pagoda serve --help`: run \
             `PAGODA_BLESS_DOCS=1 cargo test -p pagoda-server --lib config_doc`"
        );
    }
}
