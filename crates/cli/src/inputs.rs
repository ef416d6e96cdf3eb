//! What the user names as inputs, made into the files and stores to read: a pattern (`'dir/*.pcap'`, expanded
//! here so that it works quoted, and on a shell that does not expand it) becomes the files it matches, in name
//! order; a directory that is not a flow store becomes the captures in it; a store and a file stay as they are.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// One input, as it is to be opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Input {
    /// A capture file (or `-`, standard input).
    Trace(PathBuf),
    /// A flow store's directory.
    Store(PathBuf),
}

impl Input {
    pub(crate) fn path(&self) -> &Path {
        match self {
            Input::Trace(p) | Input::Store(p) => p,
        }
    }
}

/// The sources and the filter's words of a command's positional words: with -r (`read`), every word is
/// filter; with `--`, the words before it (`words`) are sources and those after it (`after`) the filter;
/// otherwise the first word is the source and the rest the filter.
pub(crate) fn split_words(words: &[String], after: &[String], read: &[PathBuf]) -> (Vec<PathBuf>, Vec<String>) {
    if !read.is_empty() {
        return (read.to_vec(), words.iter().chain(after).cloned().collect());
    }
    if !after.is_empty() {
        return (words.iter().map(PathBuf::from).collect(), after.to_vec());
    }
    let mut words = words.iter();
    (words.next().map(PathBuf::from).into_iter().collect(), words.cloned().collect())
}

/// The filter the words make (joined with spaces, as tcpdump does); a parse error whose first word is a file
/// says how to name several sources.
pub(crate) fn parse_filter(words: &[String]) -> anyhow::Result<pcaptool_query::Filter> {
    pcaptool_query::Filter::new(&words.join(" ")).map_err(|e| match words.first().filter(|w| Path::new(w).exists()) {
        Some(w) => anyhow::anyhow!(
            "invalid filter: {e}\n{w} is a file: to read several sources, name them before `--` and put the filter \
             after it, or give each with -r"
        ),
        None => anyhow::anyhow!("invalid filter: {e}"),
    })
}

/// Whether `s` holds a pattern's special characters.
pub(crate) fn is_pattern(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// The inputs `items` name, in order (each pattern's and directory's files in name order).
pub(crate) fn expand(items: &[PathBuf]) -> anyhow::Result<Vec<Input>> {
    let mut out = Vec::new();
    for item in items {
        let text = item.to_string_lossy();
        if item.as_os_str() == "-" {
            out.push(Input::Trace(item.clone()));
        } else if !item.exists() && is_pattern(&text) {
            let paths = glob::glob(&text).with_context(|| format!("{text} is not a valid pattern"))?;
            // A trace's index beside it is not an input, though `dir/*` matches it.
            let is_index = |p: &PathBuf| p.extension().is_some_and(|e| e == "ptidx");
            let mut matched: Vec<PathBuf> = paths.filter_map(Result::ok).filter(|p| !is_index(p)).collect();
            matched.sort();
            if matched.is_empty() {
                bail!("no file matches {text}");
            }
            for m in matched {
                out.extend(expand_path(&m)?);
            }
        } else {
            out.extend(expand_path(item)?);
        }
    }
    Ok(out)
}

/// A path as inputs: a store, the captures of a directory, or a file (a missing one is left for opening to
/// report, with its name).
fn expand_path(path: &Path) -> anyhow::Result<Vec<Input>> {
    if !path.is_dir() {
        return Ok(vec![Input::Trace(path.to_path_buf())]);
    }
    if pcaptool_flowstore::is_store_dir(path) {
        return Ok(vec![Input::Store(path.to_path_buf())]);
    }
    let captures = captures_in(path)?;
    if captures.is_empty() {
        bail!(
            "{} is neither a flow store nor a directory of captures (no pcap or pcapng file in it; a store is made \
             with `pcaptool import TRACE --store DIR`)",
            path.display()
        );
    }
    Ok(captures.into_iter().map(Input::Trace).collect())
}

/// The capture files directly in `dir` (recognised by their first bytes: pcap, pcapng, or gzip, zstd or lz4
/// compression), in name order.
pub(crate) fn captures_in(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read the directory {}", dir.display()))? {
        let entry = entry.with_context(|| format!("cannot read the directory {}", dir.display()))?;
        let path = entry.path();
        if path.is_file() && looks_like_capture(&path) {
            found.push(path);
        }
    }
    found.sort();
    Ok(found)
}

/// Whether the file starts as a capture (or a compressed file) does.
fn looks_like_capture(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    let Ok(mut f) = std::fs::File::open(path) else { return false };
    if f.read_exact(&mut magic).is_err() {
        return false;
    }
    matches!(
        u32::from_be_bytes(magic),
        0xa1b2_c3d4 | 0xd4c3_b2a1 | 0xa1b2_3c4d | 0x4d3c_b2a1 | 0x0a0d_0d0a | 0x28b5_2ffd | 0x0422_4d18
    ) || magic[..2] == [0x1f, 0x8b]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_split_into_sources_and_filter() {
        let w = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let p = |v: &[&str]| v.iter().map(PathBuf::from).collect::<Vec<_>>();
        assert_eq!(
            split_words(&w(&["a.pcap", "tcp", "port", "80"]), &[], &[]),
            (p(&["a.pcap"]), w(&["tcp", "port", "80"]))
        );
        assert_eq!(split_words(&w(&["a.pcap", "b.pcap"]), &w(&["tcp"]), &[]), (p(&["a.pcap", "b.pcap"]), w(&["tcp"])));
        assert_eq!(split_words(&w(&["tcp"]), &[], &p(&["a", "b"])), (p(&["a", "b"]), w(&["tcp"])));
        assert_eq!(split_words(&w(&["store"]), &[], &[]), (p(&["store"]), w(&[])));
    }

    #[test]
    fn patterns_directories_and_stores_expand() {
        let tmp = std::env::temp_dir().join(format!("pcaptool-inputs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let caps = tmp.join("caps");
        std::fs::create_dir_all(&caps).unwrap();
        std::fs::write(caps.join("b.pcap"), 0xa1b2_c3d4u32.to_le_bytes()).unwrap();
        std::fs::write(caps.join("a.pcapng"), 0x0a0d_0d0au32.to_le_bytes()).unwrap();
        std::fs::write(caps.join("notes.txt"), b"hello").unwrap();
        std::fs::write(caps.join("a.pcapng.ptidx"), b"PTIX").unwrap();
        let store = tmp.join("store");
        std::fs::create_dir_all(&store).unwrap();
        std::fs::write(store.join(pcaptool_flowstore::LOCK_FILE), b"").unwrap();
        std::fs::create_dir_all(tmp.join("empty")).unwrap();

        let traces = |v: &[&str]| v.iter().map(|n| Input::Trace(caps.join(n))).collect::<Vec<_>>();
        assert_eq!(expand(std::slice::from_ref(&caps)).unwrap(), traces(&["a.pcapng", "b.pcap"]));
        assert_eq!(expand(&[caps.join("*.pcap*")]).unwrap(), traces(&["a.pcapng", "b.pcap"]));
        assert_eq!(expand(&[caps.join("b.*")]).unwrap(), traces(&["b.pcap"]));
        assert_eq!(expand(&[caps.join("*")]).unwrap(), traces(&["a.pcapng", "b.pcap", "notes.txt"]));
        assert_eq!(expand(std::slice::from_ref(&store)).unwrap(), vec![Input::Store(store.clone())]);
        assert_eq!(expand(&[PathBuf::from("-")]).unwrap(), vec![Input::Trace("-".into())]);
        let missing = tmp.join("missing.pcap");
        assert_eq!(expand(std::slice::from_ref(&missing)).unwrap(), vec![Input::Trace(missing)]);
        let e = expand(&[caps.join("*.nothing")]).unwrap_err().to_string();
        assert!(e.starts_with("no file matches") && e.contains("*.nothing"), "{e}");
        let e = expand(&[tmp.join("empty")]).unwrap_err().to_string();
        assert!(e.contains("neither a flow store nor a directory of captures"), "{e}");
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
