//! Helpers shared by the engine's integration tests.

use std::path::PathBuf;

/// A temporary directory, removed on drop.
pub struct Dir(pub PathBuf);

impl Dir {
    /// A fresh `engine-NAME-PID` under the system's temporary directory.
    pub fn new(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("engine-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
