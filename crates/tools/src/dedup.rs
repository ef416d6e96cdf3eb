//! Duplicate packets, as `editcap -d`, `-D N` and `-w SECONDS` find them: a packet is a duplicate when its
//! captured bytes equal those of one of the packets just before it, within a window of packets or of time.
//! Every packet, duplicate or not, enters the window, as in editcap, and packets are compared as editcap
//! compares them: by the MD5 digest of their captured bytes and their length (16 bytes and a length a packet
//! remembered, so that a time window of editcap's million packets takes about 40 MB).

use std::collections::VecDeque;

/// The window a packet is compared within.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    /// The packets before it, this many in all counting itself (editcap's default is 5: `-d`).
    Packets(usize),
    /// The packets at most this many nanoseconds before it (and up to 1,000,000 of them, as editcap).
    Time(u64),
}

/// Packets a time window remembers at most (editcap's MAX_DUP_DEPTH).
const MAX_DEPTH: usize = 1_000_000;

/// The state of a duplicate search: the recent packets.
#[derive(Debug)]
pub struct Dedup {
    window: Window,
    recent: VecDeque<(u64, [u8; 16], usize)>,
}

fn digest(data: &[u8]) -> [u8; 16] {
    use md5::Digest as _;
    md5::Md5::digest(data).into()
}

impl Dedup {
    /// A search within `window`.
    pub fn new(window: Window) -> Dedup {
        Dedup { window, recent: VecDeque::new() }
    }

    /// Whether the packet captured as `data` at `ts_ns` repeats one of the window's; it enters the window. With
    /// a time window the packets before it are looked at newest first, those later than it passed over, up to
    /// the first more than the window before it (editcap's walk, which assumes packets in time order).
    pub fn is_duplicate(&mut self, ts_ns: u64, data: &[u8]) -> bool {
        let (h, len) = (digest(data), data.len());
        let dup = match self.window {
            Window::Packets(n) => {
                while self.recent.len() >= n.max(1) {
                    self.recent.pop_front();
                }
                self.recent.iter().any(|(_, rh, l)| *rh == h && *l == len)
            }
            Window::Time(w) => {
                while self.recent.len() >= MAX_DEPTH {
                    self.recent.pop_front();
                }
                let mut dup = false;
                for (t, rh, l) in self.recent.iter().rev() {
                    if *t > ts_ns {
                        continue;
                    }
                    if ts_ns - t > w {
                        break;
                    }
                    if *rh == h && *l == len {
                        dup = true;
                        break;
                    }
                }
                dup
            }
        };
        if self.window != Window::Packets(1) {
            self.recent.push_back((ts_ns, h, len));
        }
        dup
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows() {
        let mut d = Dedup::new(Window::Packets(5));
        let seq: Vec<bool> = [1, 2, 1, 3, 4, 5, 6, 1, 1].iter().map(|&b| d.is_duplicate(0, &[b])).collect();
        // The third packet repeats the first (within 4 before it); the eighth's last 1 was 5 packets before.
        assert_eq!(seq, [false, false, true, false, false, false, false, false, true]);
        let mut d = Dedup::new(Window::Time(10));
        assert!(!d.is_duplicate(0, b"a"));
        assert!(d.is_duplicate(10, b"a"));
        assert!(!d.is_duplicate(21, b"a"));
    }
}
