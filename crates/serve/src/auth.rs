//! Bearer tokens, stored hashed: a token file has one line per token, `NAME sha256:HEX`, where HEX is the
//! SHA-256 of the token. A token is 32 random bytes in hex behind `pt_`, so a hash without salt is enough (no
//! dictionary reaches it); the file never holds a token itself, and a token is shown once, when it is made.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::ServeError;

/// The tokens a service accepts: names and hashes, read from a token file at start.
#[derive(Clone, Debug, Default)]
pub struct Tokens {
    entries: Vec<(String, [u8; 32])>,
}

impl Tokens {
    /// Reads the token file `path`. Blank lines and lines starting with `#` are skipped; anything else must be
    /// `NAME sha256:HEX`.
    pub fn load(path: &Path) -> Result<Tokens, ServeError> {
        let text = std::fs::read_to_string(path).map_err(|source| ServeError::Io {
            what: "read the token file",
            path: path.to_path_buf(),
            source,
        })?;
        Tokens::parse(&text).map_err(|(line, why)| ServeError::TokenFile { path: path.to_path_buf(), line, why })
    }

    /// Parses a token file's text; an error names the line (from 1) and what is wrong.
    pub fn parse(text: &str) -> Result<Tokens, (usize, String)> {
        let mut entries = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: &str| (i + 1, why.to_string());
            let (name, hash) = line.split_once(char::is_whitespace).ok_or_else(|| bad("expected NAME sha256:HEX"))?;
            let hex = hash.trim().strip_prefix("sha256:").ok_or_else(|| bad("the hash must start with sha256:"))?;
            let digest = from_hex(hex).ok_or_else(|| bad("the hash must be 64 hexadecimal digits"))?;
            entries.push((name.to_string(), digest));
        }
        Ok(Tokens { entries })
    }

    /// How many tokens there are.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The name of the token `token`, if it is one of these. Every hash is compared in full, in time that does
    /// not depend on where they differ.
    pub fn check(&self, token: &str) -> Option<&str> {
        let digest = hash(token);
        let mut found = None;
        for (name, h) in &self.entries {
            let diff = h.iter().zip(&digest).fold(0u8, |acc, (a, b)| acc | (a ^ b));
            if diff == 0 && found.is_none() {
                found = Some(name.as_str());
            }
        }
        found
    }
}

/// SHA-256 of a token.
fn hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (o, pair) in out.iter_mut().zip(hex.as_bytes().chunks(2)) {
        *o = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
}

/// Makes a token for `name`, appends its hash to the token file `path` (created readable by its owner only),
/// and returns the token, which is not kept anywhere else.
pub fn add_token(path: &Path, name: &str) -> Result<String, ServeError> {
    if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(ServeError::TokenName { name: name.to_string() });
    }
    let io = |what, source| ServeError::Io { what, path: path.to_path_buf(), source };
    if path.exists() {
        let tokens = Tokens::load(path)?;
        if tokens.entries.iter().any(|(n, _)| n == name) {
            return Err(ServeError::TokenExists { path: path.to_path_buf(), name: name.to_string() });
        }
    }
    let mut random = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut random))
        .map_err(|e| io("read random bytes from /dev/urandom for", e))?;
    let token = format!("pt_{}", to_hex(&random));
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| io("open the token file", e))?;
    writeln!(file, "{name} sha256:{}", to_hex(&hash(&token))).map_err(|e| io("write the token file", e))?;
    file.sync_all().map_err(|e| io("write the token file", e))?;
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_checked_by_their_hash() {
        let dir = std::env::temp_dir().join(format!("serve-tokens-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("tokens");
        let a = add_token(&file, "alice").unwrap();
        let b = add_token(&file, "bob").unwrap();
        assert!(a.starts_with("pt_") && a.len() == 67 && a != b);
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(!text.contains(&a[3..]) && !text.contains(&b[3..]), "a token is stored as itself: {text}");
        let tokens = Tokens::load(&file).unwrap();
        assert_eq!((tokens.check(&a), tokens.check(&b)), (Some("alice"), Some("bob")));
        assert_eq!(tokens.check(&a[..66]), None);
        assert_eq!(tokens.check(""), None);
        assert!(matches!(add_token(&file, "alice"), Err(ServeError::TokenExists { .. })));
        assert!(matches!(add_token(&file, "two words"), Err(ServeError::TokenName { .. })));
        let mode = std::fs::metadata(&file).map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions())).unwrap();
        assert_eq!(mode & 0o077, 0, "the token file is readable by others");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_bad_line_is_named() {
        assert_eq!(Tokens::parse("# c\n\nx sha256:00\n").unwrap_err().0, 3);
        assert_eq!(Tokens::parse("x\n").unwrap_err().0, 1);
        assert_eq!(Tokens::parse(&format!("x md5:{}\n", "0".repeat(64))).unwrap_err().0, 1);
        assert_eq!(Tokens::parse(&format!("x sha256:{}\n", "0".repeat(64))).unwrap().len(), 1);
    }
}
