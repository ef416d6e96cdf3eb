//! The crate's only `unsafe` code: an AF_PACKET socket with a TPACKET_V3 receive ring mapped into memory.
//!
//! The ring is `block_nr` blocks of `block_size` bytes shared with the kernel. The kernel fills a block with
//! packets and hands it over by setting `TP_STATUS_USER` in its status word; user space reads it and hands it back
//! by writing `TP_STATUS_KERNEL`. A block is only ever viewed as a slice while user space owns it, and the status
//! word is accessed atomically (acquire to take a block, release to give it back), as the kernel's documentation
//! (Documentation/networking/packet_mmap.rst) requires.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

/// Offset of the status word in a block descriptor (`tpacket_block_desc.hdr.bh1.block_status`).
const BLOCK_STATUS: usize = 8;

/// Parameters of a ring.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RingParams {
    pub block_size: u32,
    pub block_nr: u32,
    /// Milliseconds after which the kernel hands over a block that is not full.
    pub retire_ms: u32,
    /// Join this fanout group (hash of the flow), if set.
    pub fanout: Option<u16>,
}

/// An AF_PACKET socket bound to one interface, with its receive ring.
#[derive(Debug)]
pub(crate) struct PacketSocket {
    fd: OwnedFd,
    ring: *mut u8,
    ring_len: usize,
    block_size: usize,
    block_nr: usize,
}

// SAFETY: the ring pointer is owned by this value (unmapped in Drop) and the socket is a file descriptor; moving
// both to another thread is sound. Blocks are handed out as slices only through `&mut self` (see `block`).
unsafe impl Send for PacketSocket {}

fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r) }
}

/// The index of the interface named `name`, or `None` if there is none.
pub(crate) fn if_index(name: &str) -> Option<u32> {
    let c = CString::new(name).ok()?;
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (i != 0).then_some(i)
}

/// The ARPHRD hardware type of interface `name` (from /sys, so no socket is needed).
pub(crate) fn hw_type(name: &str) -> Option<u16> {
    std::fs::read_to_string(format!("/sys/class/net/{name}/type")).ok()?.trim().parse().ok()
}

fn setsockopt<T>(fd: &OwnedFd, level: libc::c_int, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: `value` points to a live `T` of the size passed; the kernel copies it and keeps no reference.
    check(unsafe {
        libc::setsockopt(fd.as_raw_fd(), level, name, (value as *const T).cast(), size_of::<T>() as libc::socklen_t)
    })
    .map(|_| ())
}

/// Whether this process may open packet sockets: opens one and closes it.
pub(crate) fn probe() -> io::Result<()> {
    // SAFETY: a plain socket(2) call; the descriptor is owned at once and closed on return.
    let raw = check(unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `raw` is a new, valid descriptor that nothing else owns.
    drop(unsafe { OwnedFd::from_raw_fd(raw) });
    Ok(())
}

impl PacketSocket {
    /// Opens a socket receiving every packet of interface `ifindex` into a TPACKET_V3 ring of `p`.
    pub(crate) fn open(ifindex: u32, p: RingParams) -> io::Result<PacketSocket> {
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: a plain socket(2) call; the result is checked and owned at once.
        let raw = check(unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto.into()) })?;
        // SAFETY: `raw` is a new, valid descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let version = libc::tpacket_versions::TPACKET_V3 as libc::c_int;
        setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_VERSION, &version)?;
        let req = libc::tpacket_req3 {
            tp_block_size: p.block_size,
            tp_block_nr: p.block_nr,
            tp_frame_size: 2048,
            tp_frame_nr: p.block_size / 2048 * p.block_nr,
            tp_retire_blk_tov: p.retire_ms,
            tp_sizeof_priv: 0,
            tp_feature_req_word: 0,
        };
        setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_RX_RING, &req)?;
        let ring_len = p.block_size as usize * p.block_nr as usize;
        // SAFETY: maps the ring the kernel just allocated for this socket; the length is the ring's, and the
        // mapping is checked before use and unmapped in Drop.
        let ring = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                ring_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_LOCKED,
                fd.as_raw_fd(),
                0,
            )
        };
        // MAP_LOCKED can fail under a small memlock limit: map without it then.
        let ring = if ring == libc::MAP_FAILED {
            // SAFETY: as above, without locking the pages.
            unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    ring_len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd.as_raw_fd(),
                    0,
                )
            }
        } else {
            ring
        };
        if ring == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let sock = PacketSocket {
            fd,
            ring: ring.cast(),
            ring_len,
            block_size: p.block_size as usize,
            block_nr: p.block_nr as usize,
        };
        // SAFETY: sockaddr_ll is plain data for which all-zero is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = ifindex as libc::c_int;
        // SAFETY: `sll` is a valid sockaddr_ll of the size passed.
        check(unsafe {
            libc::bind(
                sock.fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        })?;
        if let Some(group) = p.fanout {
            let arg: u32 = u32::from(group) | (libc::PACKET_FANOUT_HASH << 16);
            setsockopt(&sock.fd, libc::SOL_PACKET, libc::PACKET_FANOUT, &arg)?;
        }
        Ok(sock)
    }

    /// Blocks in the ring.
    pub(crate) fn blocks(&self) -> usize {
        self.block_nr
    }

    fn status(&self, i: usize) -> &AtomicU32 {
        assert!(i < self.block_nr);
        // SAFETY: block `i` lies in the mapping (checked above); its status word is 4-byte aligned (blocks are
        // page-aligned) and shared with the kernel, so it is only accessed atomically.
        unsafe { AtomicU32::from_ptr(self.ring.add(i * self.block_size + BLOCK_STATUS).cast()) }
    }

    /// Block `i`, if the kernel has handed it to user space; it stays ours until [`release`](Self::release).
    pub(crate) fn block(&mut self, i: usize) -> Option<&[u8]> {
        if self.status(i).load(Ordering::Acquire) & libc::TP_STATUS_USER == 0 {
            return None;
        }
        // SAFETY: the kernel set TP_STATUS_USER (observed with acquire ordering, so its writes to the block are
        // visible) and does not touch the block again until `release` stores TP_STATUS_KERNEL; `&mut self` keeps
        // the slice from outliving that, and the range lies in the mapping.
        Some(unsafe { std::slice::from_raw_parts(self.ring.add(i * self.block_size), self.block_size) })
    }

    /// Hands block `i` back to the kernel.
    pub(crate) fn release(&mut self, i: usize) {
        self.status(i).store(libc::TP_STATUS_KERNEL, Ordering::Release);
    }

    /// Waits up to `timeout_ms` for the socket to have a block ready (or an error); returns whether it has.
    pub(crate) fn wait(&self, timeout_ms: i32) -> io::Result<bool> {
        let mut pfd = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN | libc::POLLERR, revents: 0 };
        // SAFETY: one valid pollfd for the duration of the call.
        match unsafe { libc::poll(&mut pfd, 1, timeout_ms) } {
            r if r < 0 => {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted { Ok(false) } else { Err(e) }
            }
            0 => Ok(false),
            _ => Ok(true),
        }
    }

    /// The kernel's counters since the last call: packets received, packets dropped, and how often the ring
    /// was full (`tpacket_stats_v3`; reading resets them).
    pub(crate) fn stats(&self) -> io::Result<(u64, u64, u64)> {
        let mut st = libc::tpacket_stats_v3 { tp_packets: 0, tp_drops: 0, tp_freeze_q_cnt: 0 };
        let mut len = size_of::<libc::tpacket_stats_v3>() as libc::socklen_t;
        // SAFETY: `st` and `len` are valid for writes of the size passed.
        check(unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&mut st as *mut libc::tpacket_stats_v3).cast(),
                &mut len,
            )
        })?;
        Ok((u64::from(st.tp_packets), u64::from(st.tp_drops), u64::from(st.tp_freeze_q_cnt)))
    }
}

impl Drop for PacketSocket {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `open`; no slice of it can outlive `self`.
        unsafe {
            libc::munmap(self.ring.cast(), self.ring_len);
        }
    }
}
