//! The crate's only `unsafe` code: memory-mapping a file and cache prefetch hints.

#![allow(unsafe_code)]

use std::fs::File;
use std::io;

/// A read-only memory map of a whole file.
#[derive(Debug)]
pub(crate) struct Mapped(memmap2::Mmap);

impl Mapped {
    /// Maps `file` read-only.
    pub(crate) fn map(file: &File) -> io::Result<Mapped> {
        // SAFETY: the map is read-only and private to this process. memmap2 requires that the file not be
        // modified or truncated while mapped; a capture file that another process truncates under us would make a
        // later access fault (SIGBUS). This is the documented contract of `TraceReader::open` (pass
        // `ReadOptions::no_mmap` for files that may change), the same one tcpdump -r and Wireshark live with.
        let map = unsafe { memmap2::Mmap::map(file)? };
        // Sequential access is the common case; the advice is only a hint and a failure changes nothing.
        let _ = map.advise(memmap2::Advice::Sequential);
        Ok(Mapped(map))
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// A whole file mapped read-only into memory, for readers of files that are written once and replaced by rename
/// (such as indexes), so that loading one costs no copy and touches only the pages used.
#[derive(Debug)]
pub struct MappedFile(Mapped);

impl MappedFile {
    /// Maps the file at `path`. The file must not be truncated or modified in place while mapped (see
    /// `TraceReader::open`); files replaced by rename are safe.
    pub fn open(path: &std::path::Path) -> io::Result<MappedFile> {
        MappedFile::map(&File::open(path)?)
    }

    /// Maps the open file `file` (the same contract as [`open`](Self::open)). A map outlives the file's name:
    /// a file removed while mapped stays readable through the map.
    pub fn map(file: &File) -> io::Result<MappedFile> {
        Ok(MappedFile(Mapped::map(file)?))
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        self.0.bytes()
    }
}

/// Makes `v` empty with room for at least `n` items, every item of that room written once with `fill`, so that
/// filling it later never waits for the kernel to provide a page (on first touch a page costs a fault and its
/// zeroing). `fill` should not be all zero bits: a zeroed allocation may come from `calloc`, whose fresh pages are
/// never touched.
pub fn touch<T: Clone>(v: &mut Vec<T>, n: usize, fill: T) {
    v.clear();
    v.resize(n.max(v.capacity()), fill);
    std::hint::black_box(&mut *v);
    v.clear();
}

/// Asks the CPU to start loading the cache line holding `data[at]`, if that index exists: for loops that read
/// scattered bytes in an order they know a few steps ahead.
#[inline(always)]
pub fn prefetch(data: &[u8], at: usize) {
    prefetch_item(data, at);
}

/// Asks the CPU to start loading the cache line holding `items[i]`, if that index exists.
#[inline(always)]
pub fn prefetch_item<T>(items: &[T], i: usize) {
    #[cfg(target_arch = "x86_64")]
    if i < items.len() {
        // SAFETY: `_mm_prefetch` is a hint that never faults and never reads memory architecturally; the pointer is
        // in bounds of `items` anyway. SSE is part of the x86_64 baseline, so the target feature is always present.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(items.as_ptr().add(i).cast::<i8>())
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (items, i);
}
