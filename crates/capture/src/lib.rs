//! Live capture for pcaptool: packets from network interfaces, handed in batches to a [`Sink`] on another thread.
//!
//! The threads that read the NIC only copy packets into pre-allocated buffers and pass them on; a sink (the
//! flow store, in `pcaptool capture`) consumes them on the calling thread, so disk and index work never block a
//! capture thread (n2disk's writer thread, FloSIS's split of capture, writing and indexing). When the sink falls
//! behind and every buffer is in use, packets are dropped and counted, never lost silently.
//!
//! Backends: AF_XDP (cargo feature `xdp`: one XDP socket per receive queue, driver mode where the driver has it,
//! generic otherwise, timestamps taken per batch in user space) and AF_PACKET with a TPACKET_V3 ring (kernel
//! nanosecond timestamps, one socket per queue joined in a fanout group). [`Backend::Auto`] tries AF_XDP first and
//! reports in [`Summary::fallback`] why it fell back to AF_PACKET.
//!
//! ```no_run
//! use pcaptool_capture::{CaptureConfig, Control, Sink, SinkError};
//!
//! struct Count(u64);
//! impl Sink for Count {
//!     fn packet(&mut self, _iface: u32, _ts_ns: u64, _wirelen: u32, _data: &[u8]) -> Result<(), SinkError> {
//!         self.0 += 1;
//!         Ok(())
//!     }
//!     fn flush(&mut self) -> Result<(), SinkError> {
//!         Ok(())
//!     }
//! }
//! let config = CaptureConfig::new(vec!["eth0".into()]);
//! let control = Control::default();
//! control.limit_packets(1000);
//! let summary = pcaptool_capture::run(&config, &mut Count(0), &control, &mut |_event| {})?;
//! println!("{} packets", summary.total().written);
//! # Ok::<(), pcaptool_capture::CaptureError>(())
//! ```

#![deny(missing_docs)]

/// Entry points for the fuzz targets in `fuzz/` (the `fuzz` feature; not part of the stable API).
#[cfg(any(test, feature = "fuzz"))]
#[doc(hidden)]
pub mod fuzz_harness;
mod ring;
mod sys;
#[cfg(feature = "xdp")]
mod xdp;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, bounded};
use pcaptool_packet::LinkType;
use pcaptool_query::{Filter, Matcher, Target};

/// Which way packets come from the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// AF_XDP where it can run (built in, not the loopback, a socket per queue opens), AF_PACKET otherwise.
    Auto,
    /// AF_PACKET with a TPACKET_V3 ring.
    AfPacket,
    /// AF_XDP sockets (cargo feature `xdp`; an error without it).
    AfXdp,
}

impl Backend {
    /// Its name as the CLI spells it.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Auto => "auto",
            Backend::AfPacket => "af_packet",
            Backend::AfXdp => "af_xdp",
        }
    }
}

/// What to capture and how.
#[derive(Clone, Debug)]
pub struct CaptureConfig {
    /// Interfaces, each recorded as its own interface (its index in this list).
    pub interfaces: Vec<String>,
    /// Bytes kept of each packet.
    pub snaplen: u32,
    /// Sockets (and threads) per interface, joined in a fanout group by flow hash.
    pub queues: usize,
    /// Bytes of kernel ring per socket.
    pub ring_bytes: usize,
    /// Bytes of buffers between the capture threads and the sink, in all.
    pub buffer_bytes: usize,
    /// Only packets this filter matches are kept (tcpdump's language, run by the query crate's evaluator).
    pub filter: Option<Filter>,
    /// The backend asked for.
    pub backend: Backend,
    /// How often the sink is flushed (so that queries see what was captured).
    pub flush_every: Duration,
}

impl CaptureConfig {
    /// Capture of whole packets on `interfaces`: one queue each, 64 MiB of ring per socket, 256 MiB of buffers,
    /// flushed every 5 seconds.
    pub fn new(interfaces: Vec<String>) -> CaptureConfig {
        CaptureConfig {
            interfaces,
            snaplen: 262_144,
            queues: 1,
            ring_bytes: 64 << 20,
            buffer_bytes: 256 << 20,
            filter: None,
            backend: Backend::Auto,
            flush_every: Duration::from_secs(5),
        }
    }
}

/// An interface being captured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    /// Its name.
    pub name: String,
    /// Its index in the configuration (the interface id packets are recorded with).
    pub id: u32,
    /// The link type of its packets.
    pub linktype: LinkType,
}

/// An error a sink reports; capture stops and the error is returned with what was counted.
pub type SinkError = Box<dyn std::error::Error + Send + Sync>;

/// Where captured packets go.
pub trait Sink {
    /// Takes a packet of interface `iface` (its index in [`CaptureConfig::interfaces`]).
    fn packet(&mut self, iface: u32, ts_ns: u64, wirelen: u32, data: &[u8]) -> Result<(), SinkError>;
    /// Makes everything taken so far durable and visible.
    fn flush(&mut self) -> Result<(), SinkError>;
    /// Makes everything taken so far durable and visible soon (every [`CaptureConfig::flush_every`]): the sink
    /// may go on writing it while it takes more packets, and report a failure at a later call. The default
    /// flushes; the capture's end always [`flush`](Self::flush)es.
    fn flush_soon(&mut self) -> Result<(), SinkError> {
        self.flush()
    }
    /// Takes packets in order, as [`packet`](Self::packet) would one at a time (which the default does); a
    /// sink given many at once may work ahead (the flow store loads what the next packets' pushes will read).
    /// Returns how many it took (all of them, or up to and including one that failed) and the failure.
    fn packets(&mut self, packets: &mut dyn Iterator<Item = SinkPacket<'_>>) -> (u64, Result<(), SinkError>) {
        let mut taken = 0;
        for p in packets {
            taken += 1;
            if let Err(e) = self.packet(p.iface, p.ts_ns, p.wirelen, p.data) {
                return (taken, Err(e));
            }
        }
        (taken, Ok(()))
    }
    /// Flows seen so far (for statistics; 0 if the sink does not track flows).
    fn flows(&self) -> u64 {
        0
    }
    /// Packets of interface `iface` taken but not (or no longer, after a failure) on their way to durable
    /// storage; after a failure they are counted as not written.
    fn unsaved(&self, _iface: u32) -> u64 {
        0
    }
}

/// A packet as [`Sink::packets`] takes it: what [`Sink::packet`] takes, one by one.
#[derive(Clone, Copy, Debug)]
pub struct SinkPacket<'a> {
    /// Its interface's index in [`CaptureConfig::interfaces`].
    pub iface: u32,
    /// When it arrived, in nanoseconds since the epoch.
    pub ts_ns: u64,
    /// Its length on the wire.
    pub wirelen: u32,
    /// Its captured bytes.
    pub data: &'a [u8],
}

/// Why capture could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// No interface of that name.
    #[error("there is no network interface named `{0}` (`ip link` lists them)")]
    NoInterface(String),
    /// The process may not open packet sockets.
    #[error(
        "capturing on {0} needs the CAP_NET_RAW capability: run as root, or grant it with `setcap cap_net_raw,cap_net_admin+eip <path of pcaptool>`"
    )]
    Privileges(String),
    /// The interface's hardware type has no link type pcaptool records.
    #[error("{name} has hardware type {hw}, which pcaptool cannot record yet (Ethernet, loopback and raw IP can be)")]
    LinkType {
        /// The interface.
        name: String,
        /// Its ARPHRD type.
        hw: u16,
    },
    /// The filter does not compile for an interface's link type.
    #[error("the filter is invalid for {name} (link type {linktype}): {why}")]
    Filter {
        /// The interface.
        name: String,
        /// Its link type.
        linktype: LinkType,
        /// The compiler's message.
        why: String,
    },
    /// AF_XDP was asked for, and this build has no AF_XDP (cargo feature `xdp`).
    #[error(
        "AF_XDP is not built into this pcaptool: build it with `--features xdp` (needs clang, libelf-dev, \
         zlib1g-dev), or use --backend af_packet"
    )]
    XdpNotBuilt,
    /// AF_XDP is not used on the loopback device, whose packets it would take from the host.
    #[error("{name} is the loopback device, whose packets AF_XDP would take from the host")]
    XdpLoopback {
        /// The interface.
        name: String,
    },
    /// An AF_XDP socket could not be opened on a queue.
    #[error("AF_XDP cannot run on {name} queue {queue}")]
    XdpQueue {
        /// The interface.
        name: String,
        /// The receive queue.
        queue: u32,
        /// Why.
        source: std::io::Error,
    },
    /// A system call failed.
    #[error("{what} on {name}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The interface.
        name: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The sink failed; capture stopped.
    #[error("the sink failed; capture stopped: {summary}")]
    Sink {
        /// The sink's error.
        source: SinkError,
        /// What was counted up to then.
        summary: Box<Summary>,
    },
}

/// Counters of one interface; all monotonic.
#[derive(Debug, Default)]
struct Counters {
    received: AtomicU64,
    kernel_drops: AtomicU64,
    ring_full: AtomicU64,
    filtered: AtomicU64,
    dropped: AtomicU64,
    malformed: AtomicU64,
    written: AtomicU64,
    bytes: AtomicU64,
    unwritten: AtomicU64,
}

/// Statistics of one interface (or their sum).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Packets read from the kernel's ring.
    pub received: u64,
    /// Packets the kernel dropped because the ring was full.
    pub kernel_drops: u64,
    /// Times the kernel found the ring full (`tp_freeze_q_cnt`).
    pub ring_full: u64,
    /// Packets the capture filter rejected.
    pub filtered: u64,
    /// Packets pcaptool dropped because every buffer to the sink was in use.
    pub dropped: u64,
    /// Ring entries whose offsets were not inside their block (never expected; counted, not read).
    pub malformed: u64,
    /// Packets the sink took.
    pub written: u64,
    /// Bytes (captured) the sink took.
    pub bytes: u64,
    /// Packets captured but not given to the sink because it failed or a limit was reached first.
    pub unwritten: u64,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.received += o.received;
        self.kernel_drops += o.kernel_drops;
        self.ring_full += o.ring_full;
        self.filtered += o.filtered;
        self.dropped += o.dropped;
        self.malformed += o.malformed;
        self.written += o.written;
        self.bytes += o.bytes;
        self.unwritten += o.unwritten;
    }
}

impl Counters {
    fn snapshot(&self) -> Stats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            received: g(&self.received),
            kernel_drops: g(&self.kernel_drops),
            ring_full: g(&self.ring_full),
            filtered: g(&self.filtered),
            dropped: g(&self.dropped),
            malformed: g(&self.malformed),
            written: g(&self.written),
            bytes: g(&self.bytes),
            unwritten: g(&self.unwritten),
        }
    }
}

/// What a capture did, per interface.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// The interfaces, in configuration order.
    pub interfaces: Vec<Interface>,
    /// Their statistics, in the same order.
    pub stats: Vec<Stats>,
    /// Flows the sink saw.
    pub flows: u64,
    /// The backend that ran (`af_packet`, `af_xdp (driver mode)`, `af_xdp (generic mode)`).
    pub backend: String,
    /// Why AF_XDP did not run, when `auto` fell back to AF_PACKET.
    pub fallback: Option<String>,
    /// How long the capture ran.
    pub elapsed: Duration,
}

impl Summary {
    /// The statistics of all interfaces together.
    pub fn total(&self) -> Stats {
        let mut t = Stats::default();
        for s in &self.stats {
            t.add(s);
        }
        t
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = self.total();
        write!(
            f,
            "{} packets received, {} written ({} bytes), {} dropped by the kernel, {} dropped by pcaptool, {} filtered out, {} not written, {} flows",
            t.received, t.written, t.bytes, t.kernel_drops, t.dropped, t.filtered, t.unwritten, self.flows
        )
    }
}

/// Stops a capture from another thread (a signal handler's flag, say) and sets its limits.
#[derive(Debug, Default)]
pub struct Control {
    stop: Arc<AtomicBool>,
    /// Set when the capture stops without taking what is left in the rings: the packet limit was reached or
    /// the sink failed.
    at_once: AtomicBool,
    max_packets: AtomicU64,
    max_nanos: AtomicU64,
}

impl Control {
    /// A control whose stop flag is `flag` (for example one a signal handler sets).
    pub fn with_flag(flag: Arc<AtomicBool>) -> Control {
        Control { stop: flag, ..Control::default() }
    }

    /// Asks the capture to stop: capture threads take what the kernel has already put in their rings (waiting
    /// up to twice the ring's 100 ms retire timeout for the block being filled), the sink gets what was
    /// captured, then is flushed.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Stops without taking what is left in the rings (the packet limit is reached, or the sink failed).
    fn stop_at_once(&self) {
        self.at_once.store(true, Ordering::SeqCst);
        self.stop();
    }

    /// Whether a stopped capture takes what is left in its rings.
    fn drains(&self) -> bool {
        !self.at_once.load(Ordering::SeqCst)
    }

    /// Whether a stop was asked.
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Stop once this many packets were written.
    pub fn limit_packets(&self, n: u64) {
        self.max_packets.store(n, Ordering::SeqCst);
    }

    /// Stop after this long.
    pub fn limit_time(&self, d: Duration) {
        self.max_nanos.store(d.as_nanos().min(u128::from(u64::MAX)) as u64, Ordering::SeqCst);
    }
}

/// A batch of packets on its way from a capture thread to the sink.
#[derive(Debug, Default)]
struct Batch {
    /// The socket (capture thread) that filled it.
    sock: u32,
    data: Vec<u8>,
    pkts: Vec<Pkt>,
}

/// A packet of a batch: its bytes are `data[start..start + len]`.
#[derive(Clone, Copy, Debug)]
struct Pkt {
    iface: u32,
    wirelen: u32,
    ts: u64,
    start: u32,
    len: u32,
}

/// The batches not in use, last returned first: at a rate the writer keeps up with, the same few batches go
/// round while still in cache, instead of every batch of the pool in turn. The lock is held for one push or pop
/// (the vector never grows past the pool's size, so never reallocates): a capture thread waits at most that long.
#[derive(Debug)]
struct Pool(std::sync::Mutex<Vec<Batch>>);

impl Pool {
    fn take(&self) -> Option<Batch> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    fn put(&self, b: Batch) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(b);
    }
}

impl Batch {
    /// An empty batch with room for `bytes` of packets, its memory written once so that the capture threads,
    /// which fill it later, never wait for the kernel to provide a page (on first touch a page costs a fault and
    /// its zeroing: measured here as a quarter of a capture's CPU when the pool was left untouched).
    fn touched(bytes: usize) -> Batch {
        let mut b = Batch::default();
        pcaptool_packet::touch(&mut b.data, bytes, 0xa5);
        pcaptool_packet::touch(&mut b.pkts, 4096, Pkt { iface: 1, wirelen: 1, ts: 1, start: 1, len: 1 });
        b
    }
}

/// The interfaces of `config`, checked to exist and to have a link type pcaptool records.
pub fn interfaces(config: &CaptureConfig) -> Result<Vec<Interface>, CaptureError> {
    config
        .interfaces
        .iter()
        .enumerate()
        .map(|(i, name)| {
            sys::if_index(name).ok_or_else(|| CaptureError::NoInterface(name.clone()))?;
            let hw = sys::hw_type(name).unwrap_or(u16::MAX);
            let linktype = match hw {
                1 | 772 => LinkType::ETHERNET,
                65534 => LinkType::RAW,
                _ => return Err(CaptureError::LinkType { name: name.clone(), hw }),
            };
            Ok(Interface { name: name.clone(), id: i as u32, linktype })
        })
        .collect()
}

/// The interfaces of `config` (as [`interfaces`]), after checking that this process may capture on them, so
/// that a missing privilege is reported before anything is set up.
pub fn probe(config: &CaptureConfig) -> Result<Vec<Interface>, CaptureError> {
    let ifaces = interfaces(config)?;
    if let Some(i) = ifaces.first() {
        sys::probe().map_err(|e| match e.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => CaptureError::Privileges(i.name.clone()),
            _ => CaptureError::Io { what: "opening a packet socket", name: i.name.clone(), source: e },
        })?;
    }
    if config.backend == Backend::AfXdp && !cfg!(feature = "xdp") {
        return Err(no_xdp());
    }
    Ok(ifaces)
}

fn no_xdp() -> CaptureError {
    CaptureError::XdpNotBuilt
}

/// Bytes of an AF_PACKET ring block; a batch to the writer holds a block's packets.
const BLOCK_SIZE: u32 = 1 << 20;
/// Milliseconds after which the kernel hands over a ring block that is not full.
const RETIRE_MS: u32 = 100;

/// Sockets opened (each with its interface's index in the configuration) and the backend's name.
type Opened = (Vec<(usize, Source)>, String);

/// Opens the AF_PACKET sockets: `queues` per interface, in a fanout group when there are several.
fn open_packet(config: &CaptureConfig, ifaces: &[Interface]) -> Result<Vec<(usize, Source)>, CaptureError> {
    let block_nr = (config.ring_bytes / BLOCK_SIZE as usize).max(2) as u32;
    let mut sockets = Vec::new();
    for (k, i) in ifaces.iter().enumerate() {
        let index = sys::if_index(&i.name).ok_or_else(|| CaptureError::NoInterface(i.name.clone()))?;
        for _ in 0..config.queues.max(1) {
            let fanout = (config.queues > 1).then_some((std::process::id() as u16) ^ (k as u16).wrapping_mul(7919));
            let params = sys::RingParams { block_size: BLOCK_SIZE, block_nr, retire_ms: RETIRE_MS, fanout };
            let s = sys::PacketSocket::open(index, params).map_err(|e| match e.raw_os_error() {
                Some(libc::EPERM) | Some(libc::EACCES) => CaptureError::Privileges(i.name.clone()),
                _ => CaptureError::Io { what: "opening a packet socket", name: i.name.clone(), source: e },
            })?;
            sockets.push((k, Source::Packet(s, 0)));
        }
    }
    Ok(sockets)
}

/// Opens the AF_XDP sockets, one per receive queue `0..queues` of each interface; `None` when AF_XDP is not
/// built in or not asked for.
#[cfg(feature = "xdp")]
fn open_xdp(config: &CaptureConfig, ifaces: &[Interface]) -> Option<Result<Opened, CaptureError>> {
    if config.backend == Backend::AfPacket {
        return None;
    }
    // An XDP socket takes the packets it receives away from the host's network stack: fine on a capture port,
    // not on the loopback device, which `auto` therefore leaves to AF_PACKET.
    if config.backend == Backend::Auto
        && let Some(lo) = ifaces.iter().find(|i| sys::hw_type(&i.name) == Some(772))
    {
        return Some(Err(CaptureError::XdpLoopback { name: lo.name.clone() }));
    }
    let mut sockets = Vec::new();
    let mut modes = Vec::new();
    for (k, i) in ifaces.iter().enumerate() {
        for q in 0..config.queues.max(1) as u32 {
            match xdp::XdpSocket::open(&i.name, q, config.ring_bytes) {
                Ok(s) => {
                    modes.push(s.mode);
                    sockets.push((k, Source::Xdp(s)));
                }
                Err(e) => {
                    return Some(Err(CaptureError::XdpQueue { name: i.name.clone(), queue: q, source: e }));
                }
            }
        }
    }
    let generic = modes.contains(&xdp::Mode::Generic);
    let name = if generic { "af_xdp (generic mode)" } else { "af_xdp (driver mode)" };
    Some(Ok((sockets, name.to_string())))
}

#[cfg(not(feature = "xdp"))]
fn open_xdp(_config: &CaptureConfig, _ifaces: &[Interface]) -> Option<Result<Opened, CaptureError>> {
    None
}

/// What a running capture reports.
#[derive(Clone, Copy, Debug)]
pub enum Event<'a> {
    /// Every socket is open and bound: packets from now on are captured.
    Started(&'a Summary),
    /// The statistics, about once a second.
    Stats(&'a Summary),
}

/// Captures until `control` stops it or a limit is reached, handing packets to `sink` on this thread;
/// `events` hears when capture starts and gets the statistics about once a second. Returns what was counted.
pub fn run(
    config: &CaptureConfig,
    sink: &mut dyn Sink,
    control: &Control,
    events: &mut dyn FnMut(Event<'_>),
) -> Result<Summary, CaptureError> {
    let ifaces = interfaces(config)?;
    if config.backend == Backend::AfXdp && !cfg!(feature = "xdp") {
        return Err(no_xdp());
    }
    let mut matchers = Vec::with_capacity(ifaces.len());
    for i in &ifaces {
        matchers.push(match &config.filter {
            Some(f) => Some(f.compile(Target::new(i.linktype)).map_err(|e| CaptureError::Filter {
                name: i.name.clone(),
                linktype: i.linktype,
                why: e.to_string(),
            })?),
            None => None,
        });
    }
    // Open every socket first, so that a missing privilege or interface fails before anything runs. AF_XDP first
    // (when built in and asked for, or `auto`), AF_PACKET if it cannot run.
    let (mut sockets, backend, fallback) = match open_xdp(config, &ifaces) {
        Some(Ok((socks, backend))) => (socks, backend, None),
        Some(Err(e)) if config.backend == Backend::AfXdp => return Err(e),
        Some(Err(e)) => (Vec::new(), String::new(), Some(pcaptool_packet::Chain(&e).to_string())),
        None => (Vec::new(), String::new(), None),
    };
    let backend = if sockets.is_empty() {
        sockets = open_packet(config, &ifaces)?;
        Backend::AfPacket.name().to_string()
    } else {
        backend
    };
    let counters: Vec<Counters> = ifaces.iter().map(|_| Counters::default()).collect();
    let batch_bytes = BLOCK_SIZE as usize + 64 * 1024;
    let nbatches = (config.buffer_bytes / batch_bytes).max(2 * sockets.len());
    let pool = Pool(std::sync::Mutex::new((0..nbatches).map(|_| Batch::touched(batch_bytes)).collect()));
    let (full_tx, full_rx) = bounded::<Batch>(nbatches);
    let started = Instant::now();
    let snaplen = config.snaplen.max(1) as usize;
    let summary = |flows: u64| Summary {
        interfaces: ifaces.clone(),
        stats: counters.iter().map(Counters::snapshot).collect(),
        flows,
        backend: backend.clone(),
        fallback: fallback.clone(),
        elapsed: started.elapsed(),
    };
    events(Event::Started(&summary(0)));
    let mut failure: Option<SinkError> = None;
    let result = std::thread::scope(|s| -> Result<(), CaptureError> {
        let mut handles = Vec::new();
        let nsockets = sockets.len();
        for (sock_id, (k, sock)) in sockets.into_iter().enumerate() {
            let (c, m, full_tx, pool) = (&counters[k], matchers[k].as_ref(), full_tx.clone(), &pool);
            let name = &ifaces[k].name;
            // On the loopback device every packet passes twice, sent and received: keep one (as libpcap does).
            let skip_outgoing = sys::hw_type(name) == Some(772);
            let at = Where { sock: sock_id as u32, iface: k as u32, name, skip_outgoing };
            handles.push(s.spawn(move || {
                // A failing socket stops the whole capture, which then reports the error with what it counted.
                let r = capture_loop(sock, at, snaplen, m, c, control, &full_tx, pool);
                if r.is_err() {
                    control.stop();
                }
                r
            }));
        }
        drop(full_tx);
        let mut w = Writer {
            sink,
            counters: &counters,
            control,
            pool: &pool,
            failure: None,
            taken: 0,
            unsettled: vec![(0, 0); counters.len()],
        };
        write_loop(&full_rx, &mut w, nsockets, config.flush_every, started, &mut |flows| {
            events(Event::Stats(&summary(flows)))
        });
        failure = w.failure;
        if failure.is_some() {
            control.stop_at_once();
        }
        let mut first_err = None;
        for h in handles {
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(p) => std::panic::resume_unwind(p),
            }
        }
        // Whatever the capture threads sent after the writer stopped is counted, never silently dropped.
        for b in full_rx.try_iter() {
            for p in &b.pkts {
                counters[p.iface as usize].unwritten.fetch_add(1, Ordering::Relaxed);
            }
        }
        first_err.map_or(Ok(()), Err)
    });
    let flush = sink.flush();
    if failure.is_some() || flush.is_err() {
        // What the sink took but could not keep is not written: never reported as stored.
        for (i, c) in counters.iter().enumerate() {
            let lost = sink.unsaved(i as u32).min(c.written.load(Ordering::Relaxed));
            c.written.fetch_sub(lost, Ordering::Relaxed);
            c.unwritten.fetch_add(lost, Ordering::Relaxed);
        }
    }
    let sum = summary(sink.flows());
    if let Some(e) = failure {
        return Err(CaptureError::Sink { source: e, summary: Box::new(sum) });
    }
    result?;
    if let Err(e) = flush {
        return Err(CaptureError::Sink { source: e, summary: Box::new(sum) });
    }
    Ok(sum)
}

/// Which interface a capture thread reads.
struct Where<'a> {
    /// The socket's number among all of the capture's sockets.
    sock: u32,
    iface: u32,
    name: &'a str,
    skip_outgoing: bool,
}

/// Where a capture thread's packets come from.
#[derive(Debug)]
enum Source {
    /// An AF_PACKET socket and the next block of its ring.
    Packet(sys::PacketSocket, usize),
    /// An AF_XDP socket.
    #[cfg(feature = "xdp")]
    Xdp(xdp::XdpSocket),
}

impl Source {
    /// Kernel drops and ring-full counts since the last call.
    fn stats(&mut self) -> std::io::Result<(u64, u64)> {
        match self {
            Source::Packet(sock, _) => sock.stats().map(|(_, drops, frozen)| (drops, frozen)),
            #[cfg(feature = "xdp")]
            Source::Xdp(x) => x.stats(),
        }
    }
}

/// Adds the thread's counts to `c` and sends its batch, if it holds packets, to the writer; false if the writer
/// is gone (its packets are then counted as not written).
fn ship(t: &mut Taker<'_>, c: &Counters, full_tx: &Sender<Batch>) -> bool {
    c.received.fetch_add(std::mem::take(&mut t.received), Ordering::Relaxed);
    c.filtered.fetch_add(std::mem::take(&mut t.filtered), Ordering::Relaxed);
    c.dropped.fetch_add(std::mem::take(&mut t.dropped), Ordering::Relaxed);
    t.since = None;
    if let Some(b) = t.batch.take_if(|b| !b.pkts.is_empty())
        && let Err(crossbeam_channel::SendError(b)) = full_tx.send(b)
    {
        c.unwritten.fetch_add(b.pkts.len() as u64, Ordering::Relaxed);
        return false;
    }
    true
}

/// What a capture thread does with each packet: the capture filter, then a copy into its batch.
struct Taker<'a> {
    iface: u32,
    skip_outgoing: bool,
    snaplen: usize,
    matcher: Option<&'a Matcher>,
    batch: Option<Batch>,
    /// When the batch in hand got its first packet (AF_XDP fills a batch over several reads).
    since: Option<Instant>,
    scratch: Vec<u8>,
    received: u64,
    filtered: u64,
    dropped: u64,
}

impl Taker<'_> {
    /// Whether the batch in hand has no room for another read of the AF_XDP ring (or there is none).
    #[cfg(feature = "xdp")]
    fn batch_full(&self) -> bool {
        self.batch.as_ref().is_none_or(|b| b.pkts.len() >= 8192 || b.data.len() >= 960 << 10)
    }

    /// A batch from the pool (kept across idle rounds), if it has none; none free means the next packets are
    /// dropped.
    fn refill(&mut self, pool: &Pool, sock: u32) {
        if self.batch.is_none() {
            self.batch = pool.take();
            if let Some(b) = self.batch.as_mut() {
                b.sock = sock;
            }
        }
    }

    /// Takes the packets of the ring's block `next`, if the kernel has handed it over, gives the block back and
    /// moves `next` on; returns how many of its packets were malformed.
    fn take_block(&mut self, sock: &mut sys::PacketSocket, next: &mut usize) -> Option<u32> {
        let block = sock.block(*next)?;
        let (_, bad) = ring::packets(block, |p| self.take(p));
        sock.release(*next);
        *next = (*next + 1) % sock.blocks();
        Some(bad)
    }

    /// Takes what the AF_XDP receive ring holds, waiting up to `timeout_ms` for something; returns how many.
    /// AF_XDP has no receive timestamp: one taken in user space serves the whole read.
    #[cfg(feature = "xdp")]
    fn take_xdp(&mut self, x: &mut xdp::XdpSocket, timeout_ms: i32) -> std::io::Result<usize> {
        let ts_ns = now_ns();
        x.recv(timeout_ms, &mut |data| {
            let wirelen = data.len() as u32;
            self.take(ring::RingPacket { ts_ns, wirelen, data, vlan: None, outgoing: false });
        })
    }

    fn take(&mut self, p: ring::RingPacket<'_>) {
        if self.skip_outgoing && p.outgoing {
            return;
        }
        self.received += 1;
        let (data, wirelen) = match p.vlan {
            Some((tpid, tci)) => (ring::with_vlan(p.data, tpid, tci, &mut self.scratch), p.wirelen.saturating_add(4)),
            None => (p.data, p.wirelen),
        };
        let data = &data[..data.len().min(self.snaplen)];
        if self.matcher.is_some_and(|m| !m.matches(data, wirelen, p.ts_ns)) {
            self.filtered += 1;
            return;
        }
        let Some(b) = self.batch.as_mut() else {
            self.dropped += 1;
            return;
        };
        let start = b.data.len();
        b.data.extend_from_slice(data);
        b.pkts.push(Pkt { iface: self.iface, wirelen, ts: p.ts_ns, start: start as u32, len: data.len() as u32 });
    }
}

#[allow(clippy::too_many_arguments)]
fn capture_loop(
    mut src: Source,
    at: Where<'_>,
    snaplen: usize,
    matcher: Option<&Matcher>,
    c: &Counters,
    control: &Control,
    full_tx: &Sender<Batch>,
    pool: &Pool,
) -> Result<(), CaptureError> {
    let Where { sock: sock_id, iface, name, skip_outgoing } = at;
    let io = |what, e| CaptureError::Io { what, name: name.to_string(), source: e };
    let mut last_stats = Instant::now();
    let fetch_stats = |src: &mut Source| -> Result<(), CaptureError> {
        let (drops, frozen) = src.stats().map_err(|e| io("reading the socket's statistics", e))?;
        c.kernel_drops.fetch_add(drops, Ordering::Relaxed);
        c.ring_full.fetch_add(frozen, Ordering::Relaxed);
        Ok(())
    };
    let mut t = Taker {
        iface,
        skip_outgoing,
        snaplen,
        matcher,
        batch: None,
        since: None,
        scratch: Vec::new(),
        received: 0,
        filtered: 0,
        dropped: 0,
    };
    while !control.stopped() {
        if last_stats.elapsed() >= Duration::from_millis(500) {
            fetch_stats(&mut src)?;
            last_stats = Instant::now();
        }
        t.refill(pool, sock_id);
        let bad = match &mut src {
            Source::Packet(sock, next) => {
                let Some(bad) = t.take_block(sock, next) else {
                    sock.wait(100).map_err(|e| io("waiting for packets", e))?;
                    continue;
                };
                bad
            }
            #[cfg(feature = "xdp")]
            Source::Xdp(x) => {
                // Batches from the ring are small (at most 256 packets): several go into one batch to the writer,
                // while packets keep coming and it has room.
                let mut timeout = if t.batch.as_ref().is_some_and(|b| !b.pkts.is_empty()) { 5 } else { 100 };
                loop {
                    let n = t.take_xdp(x, timeout).map_err(|e| io("receiving packets", e))?;
                    if n > 0 && t.since.is_none() {
                        t.since = Some(Instant::now());
                    }
                    if n == 0 || t.batch_full() {
                        break;
                    }
                    timeout = 0;
                }
                // A batch goes to the writer when full or 20 ms old: many small batches would run the pool dry
                // while the writer closes a segment.
                if !t.batch_full() && t.since.is_some_and(|s| s.elapsed() < Duration::from_millis(20)) {
                    continue;
                }
                0
            }
        };
        c.malformed.fetch_add(u64::from(bad), Ordering::Relaxed);
        if !ship(&mut t, c, full_tx) {
            return fetch_stats(&mut src);
        }
    }
    if control.drains() {
        drain(&mut src, &mut t, c, full_tx, pool, sock_id).map_err(|e| io("taking the packets left at the stop", e))?;
    }
    // Stopped with a batch in hand (AF_XDP keeps one for up to 20 ms): it goes to the writer too.
    ship(&mut t, c, full_tx);
    fetch_stats(&mut src)
}

/// After a stop (a signal, the time limit): the packets the kernel has already put in the ring are taken too,
/// not left there. A TPACKET_V3 ring hands over the block being filled at most `RETIRE_MS` after it opened, so
/// the drain waits up to twice that for it; it reads at most one turn of the ring, so a busy link cannot hold
/// the stop. Packets that arrive in that time are taken as well.
fn drain(
    src: &mut Source,
    t: &mut Taker<'_>,
    c: &Counters,
    full_tx: &Sender<Batch>,
    pool: &Pool,
    sock_id: u32,
) -> std::io::Result<()> {
    let deadline = Instant::now() + Duration::from_millis(2 * u64::from(RETIRE_MS));
    match src {
        Source::Packet(sock, next) => {
            let mut left = sock.blocks();
            while left > 0 {
                t.refill(pool, sock_id);
                let Some(bad) = t.take_block(sock, next) else {
                    let ms = deadline.saturating_duration_since(Instant::now()).as_millis();
                    if ms == 0 || !sock.wait(ms as i32)? {
                        break;
                    }
                    continue;
                };
                left -= 1;
                c.malformed.fetch_add(u64::from(bad), Ordering::Relaxed);
                if !ship(t, c, full_tx) {
                    break;
                }
            }
        }
        #[cfg(feature = "xdp")]
        Source::Xdp(x) => {
            // The receive ring holds what arrived; nothing waits to be handed over as a block does.
            let mut left = x.frames();
            while left > 0 {
                t.refill(pool, sock_id);
                let n = t.take_xdp(x, 0)?;
                if n == 0 || !ship(t, c, full_tx) {
                    break;
                }
                left = left.saturating_sub(n);
            }
        }
    }
    Ok(())
}

/// The sink's side of a capture: hands packets to the sink, counts them, applies the limits.
struct Writer<'a> {
    sink: &'a mut dyn Sink,
    counters: &'a [Counters],
    control: &'a Control,
    pool: &'a Pool,
    failure: Option<SinkError>,
    /// Packets handed to the sink, all interfaces (for the packet limit, without summing counters per packet).
    taken: u64,
    /// Per interface, packets written and their bytes not yet added to `counters`: they are added once a batch
    /// (an atomic addition per packet would cost more than storing it).
    unsettled: Vec<(u64, u64)>,
}

impl Writer<'_> {
    /// Hands packet `i` of `b` to the sink (the merge of several sockets hands them one at a time).
    fn packet(&mut self, b: &Batch, i: usize) {
        self.hand(&b.pkts[i..=i], &b.data);
    }

    /// Hands packets (of `data`) to the sink all at once, or counts them as not written, after a failure or
    /// past the packet limit.
    fn hand(&mut self, pkts: &[Pkt], data: &[u8]) {
        let max = self.control.max_packets.load(Ordering::SeqCst);
        let allowed = match () {
            _ if self.failure.is_some() => 0,
            _ if max > 0 => max.saturating_sub(self.taken).min(pkts.len() as u64) as usize,
            _ => pkts.len(),
        };
        let bytes = |q: &Pkt| &data[q.start as usize..(q.start + q.len) as usize];
        let (taken, r) = match &pkts[..allowed] {
            [] => (0, Ok(())),
            // One packet: nothing to look ahead to.
            [q] => (1, self.sink.packet(q.iface, q.ts, q.wirelen, bytes(q))),
            some => {
                let mut packets =
                    some.iter().map(|q| SinkPacket { iface: q.iface, ts_ns: q.ts, wirelen: q.wirelen, data: bytes(q) });
                let (n, r) = self.sink.packets(&mut packets);
                (n as usize, r)
            }
        };
        // Taken either way: a packet lost with its segment is counted in the sink's `unsaved`.
        let written = if r.is_ok() { taken } else { taken.saturating_sub(1) };
        for (i, q) in pkts[..taken].iter().enumerate() {
            let u = &mut self.unsettled[q.iface as usize];
            u.0 += 1;
            if i < written {
                u.1 += u64::from(q.len);
            }
        }
        self.taken += taken as u64;
        if let Err(e) = r {
            self.failure = Some(e);
            self.control.stop_at_once();
        }
        for q in &pkts[taken..] {
            self.counters[q.iface as usize].unwritten.fetch_add(1, Ordering::Relaxed);
        }
        if max > 0 && self.taken >= max {
            self.control.stop_at_once();
        }
    }

    /// Adds the packets written since the last call to the shared counters.
    fn settle(&mut self) {
        for (c, u) in self.counters.iter().zip(&mut self.unsettled) {
            if u.0 > 0 {
                c.written.fetch_add(u.0, Ordering::Relaxed);
                c.bytes.fetch_add(u.1, Ordering::Relaxed);
                *u = (0, 0);
            }
        }
    }

    fn recycle(&mut self, mut b: Batch) {
        self.settle();
        b.data.clear();
        b.pkts.clear();
        self.pool.put(b);
    }
}

/// How long after a packet arrives its block reaches the writer at the latest: the ring hands a block over
/// within its `RETIRE_MS` (100 ms) retire timeout, and the capture thread forwards it at once. A socket that has
/// sent nothing newer may still send packets up to this far in the past.
const DELIVERY_LAG: Duration = Duration::from_millis(400);

fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// Hands the batches the capture threads send to the sink. With several sockets, packets are merged by
/// timestamp (each socket's are in time order), so the store's order is the order of arrival: a packet is
/// handed over once no socket can still send an earlier one.
fn write_loop(
    full_rx: &Receiver<Batch>,
    w: &mut Writer<'_>,
    nsockets: usize,
    flush_every: Duration,
    started: Instant,
    tick: &mut dyn FnMut(u64),
) {
    let mut last_flush = Instant::now();
    let mut last_tick = Instant::now();
    // Per socket: batches waiting (with the index of the next packet) and the latest timestamp it sent.
    let mut pending: Vec<std::collections::VecDeque<(Batch, usize)>> =
        (0..nsockets).map(|_| std::collections::VecDeque::new()).collect();
    let mut latest = vec![0u64; nsockets];
    let mut open = true;
    while open {
        let max_nanos = w.control.max_nanos.load(Ordering::SeqCst);
        if max_nanos > 0 && started.elapsed().as_nanos() >= u128::from(max_nanos) {
            w.control.stop();
        }
        match full_rx.recv_timeout(Duration::from_millis(100)) {
            Ok(b) if nsockets <= 1 => {
                w.hand(&b.pkts, &b.data);
                w.recycle(b);
            }
            Ok(b) => {
                let s = b.sock as usize;
                if let Some(last) = b.pkts.last() {
                    latest[s] = latest[s].max(last.ts);
                    pending[s].push_back((b, 0));
                } else {
                    w.recycle(b);
                }
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => open = false,
        }
        if nsockets > 1 {
            // The earliest timestamp each socket may still send: its next waiting packet's, or, with nothing
            // waiting, whatever arrived after its latest and within the delivery lag (none once the channel closed).
            let horizon = if open { now_ns().saturating_sub(DELIVERY_LAG.as_nanos() as u64) } else { u64::MAX };
            loop {
                let head = |s: usize| pending[s].front().map(|(b, i)| b.pkts[*i].ts);
                let floor = |s: usize| head(s).unwrap_or(latest[s].max(horizon));
                let Some(s) = (0..nsockets).filter(|&s| head(s).is_some()).min_by_key(|&s| head(s)) else { break };
                let ts = head(s).unwrap_or(u64::MAX);
                if (0..nsockets).any(|o| o != s && floor(o) < ts) {
                    break;
                }
                let (b, i) = pending[s].front_mut().expect("a waiting batch");
                let idx = *i;
                *i += 1;
                let done = *i == b.pkts.len();
                w.packet(b, idx);
                if done && let Some((b, _)) = pending[s].pop_front() {
                    w.recycle(b);
                }
            }
        }
        if w.failure.is_none() && last_flush.elapsed() >= flush_every {
            if let Err(e) = w.sink.flush_soon() {
                w.failure = Some(e);
                w.control.stop_at_once();
            }
            last_flush = Instant::now();
        }
        if last_tick.elapsed() >= Duration::from_secs(1) {
            w.settle();
            tick(w.sink.flows());
            last_tick = Instant::now();
        }
    }
    w.settle();
}
