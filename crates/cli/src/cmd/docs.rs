//! `pcaptool completions SHELL` and `pcaptool man`: shell completions and manual pages generated from the
//! command line's definition (clap_complete, clap_mangen), so that they never disagree with it.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap_complete::Shell;

/// Arguments of `pcaptool completions`.
#[derive(Debug, clap::Args)]
pub(crate) struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    shell: Shell,
}

/// Arguments of `pcaptool man`.
#[derive(Debug, clap::Args)]
pub(crate) struct ManArgs {
    /// Write `pcaptool.1` and one `pcaptool-COMMAND.1` a command into this directory (created if missing)
    /// instead of printing the main page.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

pub(crate) fn completions(args: CompletionsArgs) -> anyhow::Result<ExitCode> {
    let mut cmd = crate::command();
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "pcaptool", &mut out);
    std::io::stdout().lock().write_all(&out)?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn man(args: ManArgs) -> anyhow::Result<ExitCode> {
    let cmd = crate::command();
    let Some(dir) = args.out else {
        let mut out = Vec::new();
        clap_mangen::Man::new(cmd).render(&mut out)?;
        std::io::stdout().lock().write_all(&out)?;
        return Ok(ExitCode::SUCCESS);
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut written = 0;
    let mut write = |name: String, page: clap::Command| -> anyhow::Result<()> {
        let mut out = Vec::new();
        clap_mangen::Man::new(page).title(&name).render(&mut out)?;
        let path = dir.join(format!("{name}.1"));
        std::fs::write(&path, out).with_context(|| format!("cannot write {}", path.display()))?;
        written += 1;
        Ok(())
    };
    let mut main = cmd.clone();
    main.build();
    for sub in main.get_subcommands().filter(|s| s.get_name() != "help") {
        let name = format!("pcaptool-{}", sub.get_name());
        write(name, sub.clone())?;
    }
    write("pcaptool".into(), cmd)?;
    outln!("{written} manual pages written into {}", dir.display());
    Ok(ExitCode::SUCCESS)
}
