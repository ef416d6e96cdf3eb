//! A file of sensors: one a line, `NAME ADDRESS [token-file=PATH] [ca=PATH] [cert=PATH] [key=PATH]`, `#` starting
//! a comment. Paths are relative to the file's directory. A sensor without an option of its own takes the one
//! given on the command line.

use std::path::{Path, PathBuf};

use crate::{Credentials, Endpoint, RemoteError, RemoteSource};

/// One sensor of a file of sensors.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Sensor {
    /// Its name (in errors, `partial` reports and flows).
    pub name: String,
    /// Where it is.
    pub endpoint: Endpoint,
    /// A file holding its bearer token.
    pub token_file: Option<PathBuf>,
    /// Certificate authorities for its certificate.
    pub ca: Option<PathBuf>,
    /// A client certificate for it.
    pub cert: Option<PathBuf>,
    /// The client certificate's key.
    pub key: Option<PathBuf>,
}

impl Sensor {
    /// The sensor as a source: its own credentials, else `defaults`' (the command line's).
    pub fn source(&self, defaults: &Credentials) -> Result<RemoteSource, RemoteError> {
        let mut creds = defaults.clone();
        if let Some(t) = &self.token_file {
            creds = creds.token_file(t)?;
        }
        if let Some(c) = &self.ca {
            creds.ca = Some(c.clone());
        }
        if self.cert.is_some() || self.key.is_some() {
            creds.cert = self.cert.clone();
            creds.key = self.key.clone();
        }
        RemoteSource::named(self.name.clone(), self.endpoint.clone(), &creds)
    }
}

/// Parses a file of sensors' text; `base` is the directory relative paths start from. Names must differ.
pub fn parse_sensors(text: &str, file: &Path) -> Result<Vec<Sensor>, RemoteError> {
    let base = file.parent().unwrap_or(Path::new("."));
    let mut out: Vec<Sensor> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let bad = |why: String| RemoteError::Sensors { path: file.to_path_buf(), line: i + 1, why };
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let name = words.next().unwrap_or_default().to_string();
        if Endpoint::is_address(&name) {
            return Err(bad("a line starts with the sensor's name, then its address".into()));
        }
        if !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_')) {
            return Err(bad(format!(
                "the name {name:?} holds characters other than letters, digits, '.', '-' and '_'"
            )));
        }
        if out.iter().any(|s| s.name == name) {
            return Err(bad(format!("{name} is named twice")));
        }
        let address = words.next().ok_or_else(|| bad(format!("{name} has no address")))?;
        let endpoint: Endpoint = address.parse().map_err(|e: RemoteError| bad(e.to_string()))?;
        let mut s = Sensor { name, endpoint, token_file: None, ca: None, cert: None, key: None };
        for w in words {
            let (k, v) = w.split_once('=').ok_or_else(|| bad(format!("{w:?} is not OPTION=VALUE")))?;
            if v.is_empty() {
                return Err(bad(format!("{k} has no value")));
            }
            let path = Some(base.join(v));
            let slot = match k {
                "token-file" => &mut s.token_file,
                "ca" => &mut s.ca,
                "cert" => &mut s.cert,
                "key" => &mut s.key,
                _ => return Err(bad(format!("unknown option {k:?} (token-file, ca, cert, key)"))),
            };
            if slot.is_some() {
                return Err(bad(format!("{k} is given twice")));
            }
            *slot = path;
        }
        if s.cert.is_some() != s.key.is_some() {
            return Err(bad("cert and key go together".into()));
        }
        out.push(s);
    }
    if out.is_empty() {
        return Err(RemoteError::Sensors { path: file.to_path_buf(), line: 0, why: "it names no sensor".into() });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_of_sensors_parses() {
        let text = "# the sensors\n\
                    east https://10.0.0.1:8443 token-file=east.token ca=/etc/ca.pem  # comment\n\
                    \n\
                    west http://127.0.0.1:8740/?source=store cert=c.pem key=k.pem\n";
        let s = parse_sensors(text, Path::new("/etc/pcaptool/sensors")).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].name, "east");
        assert_eq!(s[0].endpoint.port, 8443);
        assert_eq!(s[0].token_file.as_deref(), Some(Path::new("/etc/pcaptool/east.token")));
        assert_eq!(s[0].ca.as_deref(), Some(Path::new("/etc/ca.pem")));
        assert_eq!(s[1].endpoint.source.as_deref(), Some("store"));
        assert_eq!(s[1].key.as_deref(), Some(Path::new("/etc/pcaptool/k.pem")));
    }

    #[test]
    fn mistakes_are_told_with_their_line() {
        for (text, line, says) in [
            ("a https://x\na https://y", 2, "named twice"),
            ("https://x", 1, "starts with the sensor's name"),
            ("a", 1, "no address"),
            ("a ftp://x", 1, "not a sensor address"),
            ("a https://x tokenfile=t", 1, "unknown option"),
            ("a https://x cert=c", 1, "go together"),
            ("a https://x ca=", 1, "no value"),
            ("\n# nothing\n", 0, "names no sensor"),
        ] {
            let e = parse_sensors(text, Path::new("s")).unwrap_err();
            let RemoteError::Sensors { line: l, why, .. } = &e else { panic!("{e:?}") };
            assert_eq!(*l, line, "{text}");
            assert!(e.to_string().contains(says) || why.contains(says), "{text}: {e}");
        }
    }
}
