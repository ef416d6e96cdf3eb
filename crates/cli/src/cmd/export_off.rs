//! `pcaptool export` and `capture --export` in a pcaptool built without the `export` feature: they say how to
//! get them.

use std::path::Path;
use std::process::ExitCode;

/// Why exports are missing, and how to get them.
const MISSING: &str = "this pcaptool was built without exports (the `export` feature, on by default): \
    `cargo install pcaptool` (or build with `--features export`) to have them";

/// Arguments of `pcaptool export`, taken whole (the command is not built in).
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    rest: Vec<String>,
}

pub(crate) fn run(_: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("{MISSING}")
}

/// A capture's exporter: none without the feature.
pub(crate) enum CaptureExport {}

impl CaptureExport {
    pub(crate) fn start(
        _: &Path,
        _: &Path,
        _: Option<String>,
        _: bool,
        _: std::time::Duration,
    ) -> anyhow::Result<CaptureExport> {
        anyhow::bail!("--export: {MISSING}")
    }

    pub(crate) fn finish(self) -> anyhow::Result<(usize, u64)> {
        match self {}
    }

    pub(crate) fn out(&self) -> &Path {
        match *self {}
    }
}
