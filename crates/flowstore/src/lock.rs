//! The writer lock: one process at a time adds to, removes from or repairs a store.
//!
//! The lock is an advisory `flock` on `DIR/writer.lock`, held for the writer's life; the kernel lets go of it when
//! the process ends however it ends, so a crash never leaves a store locked. While it holds the lock, the writer
//! keeps its process id, command line and start time in the file, so that a second writer is told who it waits
//! for. Readers never take it, never create the file and never write to the directory: they work on read-only
//! media and beside a running writer.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::Path;

use crate::error::{LockHolder, StoreError};

/// The lock file's name in a store directory.
pub const LOCK_FILE: &str = "writer.lock";

/// The writer lock of a store, held until dropped.
#[derive(Debug)]
pub(crate) struct WriterLock {
    file: File,
}

impl WriterLock {
    /// Takes the lock of the store in `dir`, at once or not at all: a store another process writes is refused
    /// with who holds it.
    pub(crate) fn acquire(dir: &Path) -> Result<WriterLock, StoreError> {
        let path = dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| StoreError::io(&path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                return Err(StoreError::Locked { dir: dir.to_path_buf(), holder: LockHolder::parse(&text) });
            }
            Err(TryLockError::Error(e)) => return Err(StoreError::io(&path, e)),
        }
        let holder = LockHolder::this_process();
        let write = |f: &mut File| -> std::io::Result<()> {
            f.set_len(0)?;
            f.rewind()?;
            f.write_all(holder.to_text().as_bytes())
        };
        write(&mut file).map_err(|e| StoreError::io(&path, e))?;
        Ok(WriterLock { file })
    }
}

impl Drop for WriterLock {
    fn drop(&mut self) {
        // Emptied while still held, so that nobody reads a finished writer's details as a live one's; the lock
        // itself goes with the file descriptor.
        let _ = self.file.set_len(0);
    }
}

impl LockHolder {
    fn this_process() -> LockHolder {
        let mut command: String =
            std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ");
        if command.len() > 512 {
            let mut end = 512;
            while !command.is_char_boundary(end) {
                end -= 1;
            }
            command.truncate(end);
            command.push_str(" ...");
        }
        let since_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        LockHolder { pid: std::process::id(), command, since_ns }
    }

    fn to_text(&self) -> String {
        format!("pid {}\nsince {}\ncommand {}\n", self.pid, self.since_ns, self.command.replace('\n', " "))
    }

    /// The holder written in a lock file (`None` if the file does not name one: the holder has not written it
    /// yet, or the file is not pcaptool's).
    fn parse(text: &str) -> Option<LockHolder> {
        let (mut pid, mut since_ns, mut command) = (None, None, None);
        for line in text.lines() {
            match line.split_once(' ') {
                Some(("pid", v)) => pid = v.trim().parse().ok(),
                Some(("since", v)) => since_ns = v.trim().parse().ok(),
                Some(("command", v)) => command = Some(v.to_string()),
                _ => {}
            }
        }
        Some(LockHolder { pid: pid?, since_ns: since_ns?, command: command.unwrap_or_default() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("pcaptool-lock-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    /// A second writer is refused while the first holds the lock, told who holds it; once the first lets go,
    /// the next takes it and the file names the new holder.
    #[test]
    fn one_writer_at_a_time() {
        let dir = temp("one");
        let first = WriterLock::acquire(&dir).expect("first");
        match WriterLock::acquire(&dir) {
            Err(StoreError::Locked { holder: Some(h), .. }) => {
                assert_eq!(h.pid, std::process::id());
                assert!(h.since_ns > 1_600_000_000_000_000_000, "{h:?}");
                assert!(!h.command.is_empty());
            }
            other => panic!("a second writer: {other:?}"),
        }
        drop(first);
        assert_eq!(std::fs::read(dir.join(LOCK_FILE)).expect("lock file").len(), 0, "emptied when let go");
        let _second = WriterLock::acquire(&dir).expect("taken again");
        assert!(std::fs::read_to_string(dir.join(LOCK_FILE)).expect("lock file").starts_with("pid "));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn holder_text_round_trips() {
        let h = LockHolder { pid: 42, since_ns: 1_700_000_000_123_456_789, command: "pcaptool import a b".into() };
        assert_eq!(LockHolder::parse(&h.to_text()), Some(h));
        assert_eq!(LockHolder::parse(""), None);
        assert_eq!(LockHolder::parse("pid x\n"), None);
    }
}
