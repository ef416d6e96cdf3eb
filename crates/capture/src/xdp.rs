//! The AF_XDP backend (cargo feature `xdp`): one XDP socket per receive queue through xsk-rs (libxdp, built from
//! source), its UMEM frames cycled between the fill ring and the receive ring without allocation. This module
//! and `sys.rs` hold the crate's `unsafe` code: xsk-rs marks its ring and frame accesses unsafe because a frame
//! must not be read while the kernel owns it.
//!
//! AF_XDP gives no receive timestamp: packets are stamped in user space once per batch taken from the ring, so
//! packets of one batch share a timestamp (the precision is the time between two batches, microseconds under
//! load). Packets an XDP socket receives are redirected to it and do not reach the host's own network stack:
//! use it on a capture port.

#![allow(unsafe_code)]

use std::io;

use xsk_rs::config::{Interface, QueueSize, SocketConfig, UmemConfig, XdpFlags};
use xsk_rs::{FillQueue, FrameDesc, RxQueue, Socket, Umem};

/// Bytes of a UMEM frame (xsk-rs's default frame size).
const FRAME_BYTES: usize = 4096;
/// Descriptors taken from the receive ring at once.
const BATCH: usize = 256;

/// Whether the NIC's driver runs XDP itself (driver mode) or the kernel runs it after allocating the socket
/// buffer (generic mode, any interface).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Driver,
    Generic,
}

/// An AF_XDP socket on one receive queue of an interface.
pub(crate) struct XdpSocket {
    umem: Umem,
    rx: RxQueue,
    fq: FillQueue,
    descs: Vec<FrameDesc>,
    /// The frames not yet in the fill ring.
    spare: Vec<FrameDesc>,
    /// The kernel's drop and ring-full counters at the last `stats`.
    last: (u64, u64),
    /// Frames the receive ring holds.
    rx_frames: usize,
    pub(crate) mode: Mode,
}

impl std::fmt::Debug for XdpSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "XdpSocket({:?})", self.mode)
    }
}

fn err(what: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("{what}: {e}"))
}

impl XdpSocket {
    /// Opens an XDP socket on queue `queue` of interface `name`, in driver mode if the driver supports it, else
    /// in generic mode, with 4 × `ring_bytes` of UMEM (every packet takes a whole 4 KiB frame, so the same
    /// number of bytes holds far fewer small packets than an AF_PACKET ring): half its frames wait in the fill
    /// ring, the other half can wait in the receive ring (the kernel's buffer while the capture thread is busy).
    pub(crate) fn open(name: &str, queue: u32, ring_bytes: usize) -> io::Result<XdpSocket> {
        let frames_n = (ring_bytes.saturating_mul(4) / FRAME_BYTES).clamp(4096, 1 << 20).next_power_of_two() as u32;
        let ring_n = frames_n / 2;
        // libxdp and libbpf log to standard error (missing bpffs, skipped ELF sections); errors come back as
        // values, so their chatter is silenced.
        // SAFETY: setting the print callbacks to none is always valid; they are process-wide settings read
        // only by the libraries' own logging.
        unsafe {
            libxdp_sys::libxdp_set_print(None);
            libbpf_sys::libbpf_set_print(None);
        }
        let frames = frames_n.try_into().map_err(|e| err("frame count", e))?;
        let ring = QueueSize::new(ring_n).map_err(|e| err("ring size", e))?;
        let ifname: Interface = name.parse().map_err(|e| err("interface name", e))?;
        let mut last_err = None;
        for (mode, flags) in
            [(Mode::Driver, XdpFlags::XDP_FLAGS_DRV_MODE), (Mode::Generic, XdpFlags::XDP_FLAGS_SKB_MODE)]
        {
            let ucfg = UmemConfig::builder()
                .fill_queue_size(ring)
                .comp_queue_size(ring)
                .build()
                .map_err(|e| err("UMEM configuration", e))?;
            let (umem, mut descs) = Umem::new(ucfg, frames, false).map_err(|e| err("creating the UMEM", e))?;
            let cfg = SocketConfig::builder().rx_queue_size(ring).xdp_flags(flags).build();
            // SAFETY: the UMEM is new and owned by this socket alone (no other socket shares it), which is what
            // xsk-rs requires of `Socket::new`.
            match unsafe { Socket::new(cfg, &umem, &ifname, queue) } {
                Ok((_tx, rx, Some((mut fq, _cq)))) => {
                    let spare = descs.split_off(ring_n as usize);
                    // SAFETY: these frames were just created and are in no ring; the kernel owns them until they
                    // come back through the receive ring.
                    let n = unsafe { fq.produce(&descs) };
                    if n != descs.len() {
                        return Err(err("filling the fill ring", format!("{n} of {} frames", descs.len())));
                    }
                    let descs = vec![FrameDesc::default(); BATCH];
                    return Ok(XdpSocket {
                        umem,
                        rx,
                        fq,
                        descs,
                        spare,
                        last: (0, 0),
                        rx_frames: ring_n as usize,
                        mode,
                    });
                }
                Ok(_) => last_err = Some(err("creating the XDP socket", "no fill ring")),
                Err(e) => last_err = Some(err("creating the XDP socket", e)),
            }
        }
        Err(last_err.unwrap_or_else(|| err("creating the XDP socket", "no mode worked")))
    }

    /// How many packets the receive ring holds at most.
    pub(crate) fn frames(&self) -> usize {
        self.rx_frames
    }

    /// Waits up to `timeout_ms` for packets and calls `f` with each (its bytes); returns how many.
    pub(crate) fn recv(&mut self, timeout_ms: i32, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        // SAFETY: the descriptors filled in are frames the kernel handed back through the receive ring; they are
        // read below and only then returned to the fill ring.
        let n = unsafe { self.rx.poll_and_consume(&mut self.descs, timeout_ms) }?;
        for d in &self.descs[..n] {
            // SAFETY: the frame came out of the receive ring and is not in the fill ring, so the kernel does not
            // write it while it is read.
            let data = unsafe { self.umem.data(d) };
            f(data.contents());
        }
        if n > 0 {
            // SAFETY: the frames were read above and are handed back to the kernel; none is used again until it
            // comes back through the receive ring.
            let back = unsafe { self.fq.produce(&self.descs[..n]) };
            if back != n {
                // The fill ring is full (it cannot be: it holds half the frames); keep them for later.
                self.spare.extend_from_slice(&self.descs[back..n]);
            }
        }
        if !self.spare.is_empty() {
            // SAFETY: spare frames are in no ring.
            let k = unsafe { self.fq.produce(&self.spare) };
            self.spare.drain(..k);
        }
        Ok(n)
    }

    /// What the kernel counted since the last call: packets dropped (no room in the receive ring, or no frame in
    /// the fill ring), and times the receive ring was full.
    pub(crate) fn stats(&mut self) -> io::Result<(u64, u64)> {
        let s = self.rx.fd().xdp_statistics()?;
        // rx_dropped counts every packet the socket dropped (no frame in the fill ring, no room in the receive
        // ring); rx_ring_full and rx_fill_ring_empty_descs count the same drops by cause, so they are not added.
        let now = (s.rx_dropped(), s.rx_ring_full());
        let delta = (now.0.saturating_sub(self.last.0), now.1.saturating_sub(self.last.1));
        self.last = now;
        Ok(delta)
    }
}
