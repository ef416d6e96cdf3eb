//! `pcaptool serve SOURCE...`: the query service (`pcaptool_serve`) on a tokio runtime, stopped by SIGTERM or
//! SIGINT after its running queries finish; `pcaptool serve token add NAME --tokens FILE` makes a bearer token.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Subcommand;
use pcaptool_serve::{Config, Limits, Service, TlsFiles};

/// Arguments of `pcaptool serve`.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Traces (indexed or not) and flow stores to serve, each named in requests by its file or directory name.
    sources: Vec<PathBuf>,
    /// The address to listen on. Anything but loopback needs TLS and --tokens or --client-ca.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8740")]
    listen: SocketAddr,
    /// The server's certificate chain (PEM): serve over TLS.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The server's private key (PEM).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Certificate authorities (PEM) whose client certificates are accepted: mutual TLS, every client must
    /// present one.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    client_ca: Option<PathBuf>,
    /// A token file (see `pcaptool serve token add`): every request but /healthz needs one of its bearer tokens.
    #[arg(long, value_name = "FILE")]
    tokens: Option<PathBuf>,
    /// Queries running at once; more are refused with 429.
    #[arg(long, value_name = "N", default_value_t = 16)]
    max_queries: usize,
    /// Bytes of a request body; larger ones are refused with 413.
    #[arg(long, value_name = "BYTES", default_value_t = 65536)]
    max_body: usize,
    /// Packets of one answer at most.
    #[arg(long, value_name = "N")]
    max_packets: Option<u64>,
    /// Bytes of packet data of one answer at most.
    #[arg(long, value_name = "BYTES")]
    max_bytes: Option<u64>,
    /// Seconds one query may run before it is cancelled.
    #[arg(long, value_name = "SECONDS")]
    max_seconds: Option<u64>,
    /// On SIGTERM or SIGINT, seconds to let running queries finish before cancelling them.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    drain_seconds: u64,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Bearer tokens of a token file.
    #[command(subcommand)]
    Token(Token),
}

#[derive(Debug, Subcommand)]
enum Token {
    /// Make a token named NAME, store its hash in the token file, and print the token (once: it is kept nowhere).
    Add {
        /// The token's name, shown in the service's log.
        name: String,
        /// The token file (created readable by its owner only).
        #[arg(long, value_name = "FILE")]
        tokens: PathBuf,
    },
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    if let Some(Command::Token(Token::Add { name, tokens })) = &args.command {
        let token = pcaptool_serve::add_token(tokens, name)?;
        outln!("{token}");
        eprintln!(
            "pcaptool: the token {name} is stored hashed in {}; this is the only time it is shown",
            tokens.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    if args.sources.is_empty() {
        bail!("name the traces or flow stores to serve: pcaptool serve TRACE... [--listen ADDR]");
    }
    let config = Config {
        listen: args.listen,
        sources: args.sources.clone(),
        tls: args.tls_cert.clone().zip(args.tls_key.clone()).map(|(cert, key)| TlsFiles {
            cert,
            key,
            client_ca: args.client_ca.clone(),
        }),
        tokens: args.tokens.clone(),
        limits: Limits {
            body_bytes: args.max_body,
            concurrent: args.max_queries,
            packets: args.max_packets,
            bytes: args.max_bytes,
            seconds: args.max_seconds,
        },
        drain: std::time::Duration::from_secs(args.drain_seconds),
    };
    config.check()?;
    let service = Arc::new(Service::open(&config.sources)?);
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the runtime")?;
    runtime.block_on(async move {
        let shutdown = async {
            use tokio::signal::unix::{SignalKind, signal};
            match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                _ => std::future::pending::<()>().await,
            }
        };
        pcaptool_serve::serve(config, service, shutdown, |_| ()).await
    })?;
    Ok(ExitCode::SUCCESS)
}
