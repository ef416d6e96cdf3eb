//! Progress bars on standard error for long work, shown only when standard error is a terminal.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Inputs smaller than this finish too fast for a bar to help.
const MIN_BYTES: u64 = 64 << 20;

/// A byte-counting bar for reading `total` bytes, hidden when stderr is not a terminal or the input is small.
pub(crate) fn bytes(total: Option<u64>, what: &str) -> ProgressBar {
    let show = std::io::stderr().is_terminal() && total.is_none_or(|t| t >= MIN_BYTES);
    if !show {
        return ProgressBar::hidden();
    }
    let pb = match total {
        Some(t) => ProgressBar::with_draw_target(Some(t), ProgressDrawTarget::stderr()),
        None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
    };
    let style = ProgressStyle::with_template(
        "{prefix} [{elapsed_precise}] {wide_bar} {binary_bytes}/{binary_total_bytes} ({binary_bytes_per_sec}, {eta})",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    pb.set_style(style);
    pb.set_prefix(what.to_string());
    pb
}

/// A byte-counting bar that the engine drives ([`pcaptool_engine::Progress`]); created when the work's size is
/// known.
#[derive(Debug)]
pub(crate) struct Bar {
    what: &'static str,
    bar: std::sync::OnceLock<ProgressBar>,
}

impl Bar {
    pub(crate) fn new(what: &'static str) -> Bar {
        Bar { what, bar: std::sync::OnceLock::new() }
    }
}

impl pcaptool_engine::Progress for Bar {
    fn start(&self, total: Option<u64>) {
        let _ = self.bar.set(bytes(total, self.what));
    }
    fn advance(&self, n: u64) {
        if let Some(b) = self.bar.get() {
            b.inc(n);
        }
    }
    fn at(&self, at: u64) {
        if let Some(b) = self.bar.get() {
            b.set_position(at);
        }
    }
    fn finish(&self) {
        if let Some(b) = self.bar.get() {
            b.finish_and_clear();
        }
    }
}

/// A bar counting `total` items (segments, say), hidden when stderr is not a terminal or there are few.
#[cfg_attr(not(feature = "export"), allow(dead_code))]
pub(crate) fn items(total: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() || total < 2 {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template("{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} ({eta})")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    pb.set_style(style);
    pb.set_prefix(what.to_string());
    pb
}
