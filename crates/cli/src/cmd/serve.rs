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
    #[command(flatten)]
    service: ServiceArgs,
}

/// How the service is secured and limited (`pcaptool serve`, `pcaptool capture --serve`).
#[derive(Debug, clap::Args)]
pub(crate) struct ServiceArgs {
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
    /// Memory each flow store may keep of its decoded flow tables and sorted arrays between requests (a
    /// needle then reads no index twice); what does not fit is decoded for each request.
    #[arg(long, value_name = "BYTES", default_value = "512M", value_parser = crate::args::parse_size)]
    index_memory: u64,
}

impl ServiceArgs {
    /// The service's configuration on `listen` for `sources`, checked (the loopback rule).
    pub(crate) fn config(&self, listen: SocketAddr, sources: Vec<PathBuf>) -> anyhow::Result<Config> {
        let config = Config {
            listen,
            sources,
            tls: self.tls_cert.clone().zip(self.tls_key.clone()).map(|(cert, key)| TlsFiles {
                cert,
                key,
                client_ca: self.client_ca.clone(),
            }),
            tokens: self.tokens.clone(),
            limits: Limits {
                body_bytes: self.max_body,
                concurrent: self.max_queries,
                packets: self.max_packets,
                bytes: self.max_bytes,
                seconds: self.max_seconds,
            },
            drain: std::time::Duration::from_secs(self.drain_seconds),
            index_memory: self.index_memory,
        };
        config.check()?;
        Ok(config)
    }

    /// Whether any option was given other than its default (they mean nothing without a service).
    pub(crate) fn given(&self) -> bool {
        self.tls_cert.is_some()
            || self.tokens.is_some()
            || self.max_packets.is_some()
            || self.max_bytes.is_some()
            || self.max_seconds.is_some()
            || self.index_memory != pcaptool_engine::DEFAULT_INDEX_MEMORY
    }
}

/// A service running on threads of its own beside other work (`pcaptool capture --serve`), stopped by
/// [`Background::stop`].
pub(crate) struct Background {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
}

impl Background {
    /// Starts serving `service` as `config` says; returns once it listens, with the address.
    pub(crate) fn start(config: Config, service: Arc<Service>) -> anyhow::Result<(Background, SocketAddr)> {
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("pcaptool-serve".into())
            .spawn(move || -> anyhow::Result<()> {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .build()
                    .context("cannot start the runtime")?;
                runtime.block_on(async move {
                    let shutdown = async {
                        let _ = stop_rx.await;
                    };
                    pcaptool_serve::serve(config, service, shutdown, |addr| {
                        let _ = ready_tx.send(addr);
                    })
                    .await
                })?;
                Ok(())
            })
            .context("cannot start the service's thread")?;
        match ready_rx.recv() {
            Ok(addr) => Ok((Background { stop: Some(stop_tx), thread: Some(thread) }, addr)),
            // The thread ended before listening: its error says why.
            Err(_) => Err(match thread.join() {
                Ok(Err(e)) => e,
                _ => anyhow::anyhow!("the service stopped before it listened"),
            }),
        }
    }

    /// Stops accepting, lets running queries finish (up to the drain time), and waits for the service to end.
    pub(crate) fn stop(mut self) -> anyhow::Result<()> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        match self.thread.take().map(std::thread::JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(anyhow::anyhow!("the service's thread panicked")),
            None => Ok(()),
        }
    }
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
    let config = args.service.config(args.listen, args.sources.clone())?;
    let service = Arc::new(Service::open_with(&config.sources, config.index_memory)?);
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
