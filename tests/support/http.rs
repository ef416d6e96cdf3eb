//! A small HTTP/1.1 client for the service's tests and benchmark: one connection kept alive across requests,
//! bodies by `Content-Length` or chunked, and a streamed body read into a sink without holding it.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};

/// A response: status, headers (names lowercased), body (chunked decoding undone), and whether the body ended
/// as HTTP says a complete one ends.
#[derive(Debug)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Headers, names lowercased.
    pub headers: Vec<(String, String)>,
    /// The body (empty when it was sent to a sink).
    pub body: Vec<u8>,
    /// Bytes of body received.
    pub body_len: u64,
    /// Whether the body ended as a complete one does (its length reached, or the last chunk seen).
    pub complete: bool,
}

impl Response {
    /// The value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// The body as JSON (panics when it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }
}

/// The bytes of a request.
pub fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8], close: bool) -> Vec<u8> {
    let mut r = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\n");
    if close {
        r.push_str("Connection: close\r\n");
    }
    for (n, v) in headers {
        r.push_str(&format!("{n}: {v}\r\n"));
    }
    r.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let mut bytes = r.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// A connection kept alive across requests.
#[derive(Debug)]
pub struct Client {
    reader: BufReader<TcpStream>,
}

impl Client {
    /// Connects to `addr`.
    pub fn connect(addr: SocketAddr) -> io::Result<Client> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        Ok(Client { reader: BufReader::with_capacity(1 << 16, s) })
    }

    /// Sends a request and reads its response, the body kept.
    pub fn request(&mut self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> io::Result<Response> {
        let mut keep = Vec::new();
        let mut r = self.request_into(method, path, headers, body, &mut keep)?;
        r.body = keep;
        Ok(r)
    }

    /// Sends a request and writes its body into `sink` as it comes (for answers too large to hold).
    pub fn request_into(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        sink: &mut dyn Write,
    ) -> io::Result<Response> {
        self.reader.get_mut().write_all(&request_bytes(method, path, headers, body, false))?;
        read_response(&mut self.reader, sink)
    }
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// Reads one response from `r`, its body into `sink`. A body cut short is returned with `complete` false.
pub fn read_response(r: &mut impl BufRead, sink: &mut dyn Write) -> io::Result<Response> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the connection closed before a response"));
    }
    let status = line.split(' ').nth(1).and_then(|s| s.trim().parse().ok()).ok_or_else(|| bad("a status line"))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((n, v)) = l.split_once(':') {
            headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let mut resp = Response { status, headers, body: Vec::new(), body_len: 0, complete: false };
    let chunked = resp.header("transfer-encoding").is_some_and(|v| v.contains("chunked"));
    const BUF: u64 = 1 << 16;
    let mut buf = vec![0u8; BUF as usize];
    if !chunked {
        let len: Option<u64> = resp.header("content-length").and_then(|v| v.parse().ok());
        let mut left = len.unwrap_or(u64::MAX);
        while left > 0 {
            let n = r.read(&mut buf[..left.min(BUF) as usize])?;
            if n == 0 {
                break;
            }
            sink.write_all(&buf[..n])?;
            resp.body_len += n as u64;
            left -= n as u64;
        }
        resp.complete = len.is_none_or(|l| l == resp.body_len);
        return Ok(resp);
    }
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Ok(resp);
        }
        let Ok(size) = u64::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16) else { return Ok(resp) };
        if size == 0 {
            line.clear();
            r.read_line(&mut line)?;
            resp.complete = true;
            return Ok(resp);
        }
        let mut left = size;
        while left > 0 {
            let n = r.read(&mut buf[..left.min(BUF) as usize])?;
            if n == 0 {
                return Ok(resp);
            }
            sink.write_all(&buf[..n])?;
            resp.body_len += n as u64;
            left -= n as u64;
        }
        line.clear();
        r.read_line(&mut line)?;
    }
}

/// One request on a connection of its own (closed after it).
pub fn once(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> io::Result<Response> {
    let mut s = TcpStream::connect(addr)?;
    s.write_all(&request_bytes(method, path, headers, body, true))?;
    let mut r = BufReader::new(s);
    let mut keep = Vec::new();
    let mut resp = read_response(&mut r, &mut keep)?;
    resp.body = keep;
    Ok(resp)
}
