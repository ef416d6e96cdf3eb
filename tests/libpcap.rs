//! libpcap itself, as the oracle for filter semantics: `pcap_compile` and `pcap_offline_filter` through a small
//! FFI binding (no device, no root). The `pcap` crate's `filter` sets the wire length to the captured length,
//! which would hide differences in `len`, `less` and `greater` on truncated packets, so the test calls libpcap
//! directly. This module is the only unsafe code of the test suite.

#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_int, c_long, c_uint, c_void};
use std::path::Path;

#[repr(C)]
struct BpfProgram {
    bf_len: c_uint,
    bf_insns: *mut c_void,
}

#[repr(C)]
struct Timeval {
    tv_sec: c_long,
    tv_usec: c_long,
}

#[repr(C)]
struct PktHdr {
    ts: Timeval,
    caplen: u32,
    len: u32,
}

#[link(name = "pcap")]
unsafe extern "C" {
    fn pcap_open_dead(linktype: c_int, snaplen: c_int) -> *mut c_void;
    fn pcap_open_offline(fname: *const c_char, errbuf: *mut c_char) -> *mut c_void;
    fn pcap_datalink(p: *mut c_void) -> c_int;
    fn pcap_compile(p: *mut c_void, fp: *mut BpfProgram, s: *const c_char, optimize: c_int, netmask: u32) -> c_int;
    fn pcap_offline_filter(fp: *const BpfProgram, h: *const PktHdr, pkt: *const u8) -> c_int;
    fn pcap_freecode(fp: *mut BpfProgram);
    fn pcap_geterr(p: *mut c_void) -> *const c_char;
    fn pcap_close(p: *mut c_void);
}

/// The DLT libpcap uses for a file's LINKTYPE value (`linktype_to_dlt` on Linux).
pub fn linktype_to_dlt(linktype: u32) -> u32 {
    match linktype {
        100 => 11,
        101 => 12,
        102 => 15,
        103 => 16,
        106 => 19,
        other => other,
    }
}

/// A libpcap handle without a device: a dead one of a link type, or an opened capture file.
#[derive(Debug)]
pub struct Handle(*mut c_void);

// SAFETY: a pcap_t is used by one thread at a time here (the handle is moved, never shared).
unsafe impl Send for Handle {}

impl Handle {
    /// `pcap_open_dead` for a DLT.
    pub fn dead(dlt: u32) -> Handle {
        // SAFETY: pcap_open_dead has no preconditions; it returns NULL only when out of memory.
        let p = unsafe { pcap_open_dead(dlt as c_int, 262_144) };
        assert!(!p.is_null(), "pcap_open_dead failed");
        Handle(p)
    }

    /// `pcap_open_offline`: libpcap reading the file (so its byte order counts, as in tcpdump -r).
    pub fn offline(path: &Path) -> Result<Handle, String> {
        let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
        let mut errbuf = [0 as c_char; 256];
        // SAFETY: `c` is NUL-terminated, errbuf has PCAP_ERRBUF_SIZE (256) bytes.
        let p = unsafe { pcap_open_offline(c.as_ptr(), errbuf.as_mut_ptr()) };
        if p.is_null() {
            // SAFETY: libpcap wrote a NUL-terminated message into errbuf.
            return Err(unsafe { CStr::from_ptr(errbuf.as_ptr()) }.to_string_lossy().into_owned());
        }
        Ok(Handle(p))
    }

    /// The handle's DLT.
    pub fn datalink(&self) -> u32 {
        // SAFETY: self.0 is a live pcap_t.
        unsafe { pcap_datalink(self.0) as u32 }
    }

    /// Compiles as tcpdump does when reading a file: optimised, netmask 0.
    pub fn compile(&self, filter: &str) -> Result<Program, String> {
        let c = CString::new(filter).map_err(|e| e.to_string())?;
        let mut prog = BpfProgram { bf_len: 0, bf_insns: std::ptr::null_mut() };
        // SAFETY: self.0 is live, `prog` is a valid out-parameter, `c` is NUL-terminated.
        let rc = unsafe { pcap_compile(self.0, &mut prog, c.as_ptr(), 1, 0) };
        if rc != 0 {
            // SAFETY: after a failure pcap_geterr returns the handle's NUL-terminated message.
            return Err(unsafe { CStr::from_ptr(pcap_geterr(self.0)) }.to_string_lossy().into_owned());
        }
        Ok(Program(prog))
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: self.0 is live and closed once.
        unsafe { pcap_close(self.0) }
    }
}

/// A compiled BPF program.
#[derive(Debug)]
pub struct Program(BpfProgram);

impl std::fmt::Debug for BpfProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BpfProgram({} instructions)", self.bf_len)
    }
}

// SAFETY: the program is immutable after compilation; pcap_offline_filter only reads it.
unsafe impl Send for Program {}
// SAFETY: as above.
unsafe impl Sync for Program {}

impl Program {
    /// `pcap_offline_filter` on a packet with its real wire length.
    pub fn matches(&self, data: &[u8], wirelen: u32) -> bool {
        let h = PktHdr { ts: Timeval { tv_sec: 0, tv_usec: 0 }, caplen: data.len() as u32, len: wirelen };
        // SAFETY: the program is valid; `h.caplen` bytes are readable at `data`.
        unsafe { pcap_offline_filter(&self.0, &h, data.as_ptr()) != 0 }
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was filled by pcap_compile and is freed once.
        unsafe { pcap_freecode(&mut self.0) }
    }
}
