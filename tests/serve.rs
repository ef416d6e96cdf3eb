//! `pcaptool serve` through the binary, on loopback: answers byte-identical to `pcaptool query` for the filter
//! table, JSON errors, bearer tokens, the loopback rule, cancellation when a client goes away, and bounded memory
//! under a client that stops reading.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pcaptool_tests::http::{Response, once, request_bytes};
use pcaptool_tests::{TempDir, filter_table, pcaptool_bin, repo_root};
use pcaptool_tests::{generated_trace as generated, path_arg as p};

/// A running `pcaptool serve`, killed when dropped; its log lines (JSON, standard error) collected.
struct Server {
    child: Child,
    addr: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    fn start(args: &[&str]) -> Server {
        let mut child = Command::new(pcaptool_bin())
            .arg("serve")
            .args(args)
            .args(["--listen", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start pcaptool serve");
        let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let mut addr = None;
        let mut seen = Vec::new();
        for line in lines.by_ref() {
            let line = line.expect("read the log");
            seen.push(line.clone());
            let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            if v["event"] == "listening" {
                addr = v["addr"].as_str().and_then(|a| a.parse().ok());
                break;
            }
        }
        let addr = addr.unwrap_or_else(|| panic!("pcaptool serve did not start: {seen:?}"));
        let log = Arc::new(Mutex::new(seen));
        let l = log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                l.lock().unwrap().push(line);
            }
        });
        Server { child, addr, log }
    }

    /// The log lines of requests to `path`, parsed.
    fn logged(&self, path: &str) -> Vec<serde_json::Value> {
        let log = self.log.lock().unwrap();
        log.iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["path"] == path)
            .collect()
    }

    /// Waits (at most 30 s) until a logged request to `path` satisfies `f`.
    fn wait_for(&self, path: &str, f: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        let start = Instant::now();
        loop {
            if let Some(v) = self.logged(path).into_iter().find(&f) {
                return v;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "no such log line for {path}: {:?}", self.logged(path));
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits (at most 30 s) for the log line of event `name`.
    fn wait_for_event(&self, name: &str) -> serde_json::Value {
        let start = Instant::now();
        loop {
            let found = self
                .log
                .lock()
                .unwrap()
                .iter()
                .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok().filter(|v| v["event"] == name));
            if let Some(v) = found {
                return v;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "no {name} event: {:?}", self.log.lock().unwrap());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request on a connection of its own.
fn http(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
    once(addr, method, path, headers, body).expect("an HTTP response")
}

fn query_body(filter: &str, source: &str) -> Vec<u8> {
    serde_json::json!({ "filter": filter, "source": source }).to_string().into_bytes()
}

fn pcaptool(args: &[&str]) -> std::process::Output {
    Command::new(pcaptool_bin()).args(args).output().expect("run pcaptool")
}

#[test]
fn the_service_answers_as_pcaptool_query_does_for_every_filter_of_the_table() {
    let dir = TempDir::new("serve-table");
    let trace = generated(&dir, "g.pcap", 20_000, 5);
    assert!(pcaptool(&["index", p(&trace), "--chunk-packets", "4096"]).status.success());
    let store = dir.join("store");
    assert!(pcaptool(&["import", p(&trace), "--store", p(&store)]).status.success());
    let tunnels = dir.join("tunnels.pcap");
    std::fs::copy(repo_root().join("testdata/tunnels.pcap"), &tunnels).unwrap();
    let server = Server::start(&[p(&trace), p(&store), p(&tunnels)]);
    let out = dir.join("cli.pcap");
    let (mut same, mut refused, mut packets) = (0, 0, 0u64);
    for filter in filter_table() {
        for (name, path) in [("g.pcap", &trace), ("store", &store), ("tunnels.pcap", &tunnels)] {
            let r = http(server.addr, "POST", "/v1/query", &[], &query_body(&filter, name));
            let _ = std::fs::remove_file(&out);
            let cli = pcaptool(&["query", p(path), "-w", p(&out), "--", &filter]);
            if cli.status.success() {
                assert_eq!(r.status, 200, "{name} `{filter}`: {}", String::from_utf8_lossy(&r.body));
                assert!(r.complete, "{name} `{filter}`: the stream did not end as a complete one");
                let want = std::fs::read(&out).unwrap();
                assert!(r.body == want, "{name} `{filter}`: {} bytes, the CLI wrote {}", r.body.len(), want.len());
                packets += pcaptool_tests::records_us(&out).len() as u64;
                same += 1;
            } else {
                assert_eq!(
                    r.status,
                    400,
                    "{name} `{filter}`: the CLI refused it: {}",
                    String::from_utf8_lossy(&cli.stderr)
                );
                assert!(r.json()["error"].as_str().is_some_and(|e| e.contains("filter")), "{name} `{filter}`");
                refused += 1;
            }
        }
    }
    // pcapng on request, as `-F pcapng` writes it.
    let r =
        http(server.addr, "POST", "/v1/query", &[], br#"{"filter": "tcp", "source": "g.pcap", "format": "pcapng"}"#);
    assert!(pcaptool(&["query", p(&trace), "tcp", "-F", "pcapng", "-w", p(&out)]).status.success());
    assert_eq!((r.status, r.header("content-type")), (200, Some("application/x-pcapng")));
    assert!(r.body == std::fs::read(&out).unwrap(), "pcapng differs from the CLI's");
    println!("serve: {same} answers byte-identical to pcaptool query ({packets} packets), {refused} refusals alike");
    assert!(same > 1000 && packets > 0);
}

#[test]
fn errors_are_json_with_a_fitting_status() {
    let dir = TempDir::new("serve-errors");
    let trace = generated(&dir, "g.pcap", 2_000, 6);
    let server = Server::start(&[p(&trace), "--max-body", "1000"]);
    let a = server.addr;
    let r = http(a, "POST", "/v1/query", &[], br#"{"filter": "tcp port"}"#);
    assert_eq!(r.status, 400);
    let v = r.json();
    assert!(v["error"].as_str().unwrap().starts_with("invalid filter"), "{v}");
    assert!(v["caret"].as_str().unwrap().contains('^'), "{v}");
    let r = http(a, "POST", "/v1/count", &[], br#"{"filtre": "tcp"}"#);
    assert!(r.status == 400 && r.json()["error"].as_str().unwrap().contains("unknown field"), "{}", r.json());
    let r = http(a, "POST", "/v1/count", &[], br#"{"filter": "tcp", "source": "nope"}"#);
    assert_eq!((r.status, r.json()["sources"].clone()), (404, serde_json::json!(["g.pcap"])));
    let r = http(a, "POST", "/v1/count", &[], &[b' '; 2000]);
    assert_eq!(r.status, 413, "{}", String::from_utf8_lossy(&r.body));
    let r = http(a, "POST", "/v1/query", &[], br#"{"filter": "tcp", "flow": 3}"#);
    assert!(r.status == 400 && r.json()["error"].as_str().unwrap().contains("flow store"), "{}", r.json());
    let r = http(a, "POST", "/v1/query", &[], br#"{"after": "yesterday-ish"}"#);
    assert_eq!(r.status, 400);
    let r = http(a, "GET", "/v1/nothing", &[], b"");
    assert_eq!(r.status, 404);
    let r = http(a, "GET", "/v1/query", &[], b"");
    assert_eq!(r.status, 405);
    // Counts, plans and stats, as JSON.
    let r = http(a, "POST", "/v1/count", &[], br#"{"filter": "tcp"}"#);
    let cli = pcaptool(&["query", p(&trace), "tcp", "--count"]);
    assert_eq!(r.json()["matched"].to_string(), String::from_utf8_lossy(&cli.stdout).trim());
    let r = http(a, "POST", "/v1/explain", &[], br#"{"filter": "udp"}"#);
    assert_eq!((r.status, r.json()["source"].as_str()), (200, Some("g.pcap")));
    let v = http(a, "GET", "/v1/stats", &[], b"").json();
    assert_eq!(v["sources"][0]["name"], "g.pcap");
    assert!(!v.to_string().contains(p(&dir.join(""))), "a path is shown: {v}");
    assert_eq!(http(a, "GET", "/healthz", &[], b"").status, 200);
    // One log line per request, refusals before any handler too.
    // The log is read beside the requests: wait for each line rather than expect it already read.
    server.wait_for("/v1/count", |l| l["status"] == 404);
    server.wait_for("/v1/count", |l| l["status"] == 200);
    server.wait_for("/v1/count", |l| l["status"] == 413);
    server.wait_for("/v1/nothing", |l| l["status"] == 404);
    server.wait_for("/v1/query", |l| l["status"] == 405);
}

#[test]
fn bearer_tokens_are_required_when_configured() {
    let dir = TempDir::new("serve-tokens");
    let trace = generated(&dir, "g.pcap", 2_000, 7);
    let tokens = dir.join("tokens");
    let out = pcaptool(&["serve", "token", "add", "analyst", "--tokens", p(&tokens)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let token = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(!std::fs::read_to_string(&tokens).unwrap().contains(&token), "the token is stored as it is");
    let server = Server::start(&[p(&trace), "--tokens", p(&tokens)]);
    let a = server.addr;
    let body = br#"{"filter": "tcp"}"#;
    let r = http(a, "POST", "/v1/count", &[], body);
    assert_eq!((r.status, r.header("www-authenticate")), (401, Some("Bearer")));
    let r = http(a, "POST", "/v1/count", &[("Authorization", "Bearer pt_0000")], body);
    assert_eq!(r.status, 401);
    let bearer = format!("Bearer {token}");
    let r = http(a, "POST", "/v1/count", &[("Authorization", &bearer)], body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(http(a, "GET", "/v1/stats", &[], b"").status, 401);
    assert_eq!(http(a, "GET", "/healthz", &[], b"").status, 200);
    let ok = server.wait_for("/v1/count", |l| l["status"] == 200);
    assert_eq!(ok["who"], "analyst");
}

#[test]
fn only_loopback_is_served_without_tls_and_authentication() {
    let dir = TempDir::new("serve-loopback");
    let trace = generated(&dir, "g.pcap", 100, 8);
    let out = pcaptool(&["serve", p(&trace), "--listen", "0.0.0.0:0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("not a loopback address") && err.contains("--tls-cert"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let out = pcaptool(&["serve", "--listen", "127.0.0.1:0"]);
    assert!(!out.status.success());
}

/// The server's anonymous memory (heap and stacks, not the mapped trace), bytes.
fn rss_anon(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

#[test]
fn a_slow_client_holds_no_answer_in_memory_and_leaving_cancels_the_query() {
    let dir = TempDir::new("serve-slow");
    let trace = generated(&dir, "big.pcap", 300_000, 9);
    let size = std::fs::metadata(&trace).unwrap().len();
    let server = Server::start(&[p(&trace), "--max-queries", "1"]);
    // A query read to its end gives its place back before the client sees the end: the next is never refused.
    for _ in 0..5 {
        let r = http(server.addr, "POST", "/v1/query", &[], br#"{"filter": "udp", "limit": 10}"#);
        assert_eq!(r.status, 200);
        assert_eq!(http(server.addr, "POST", "/v1/count", &[], br#"{"filter": "udp"}"#).status, 200);
    }
    let before = rss_anon(server.pid());
    // Every packet, scanned (no index): an answer as large as the trace.
    let mut s = TcpStream::connect(server.addr).unwrap();
    s.write_all(&request_bytes("POST", "/v1/query", &[], b"{}", true)).unwrap();
    let mut first = vec![0u8; 64 << 10];
    s.read_exact(&mut first).unwrap();
    // The client stops reading: the engine must wait for it, not gather the answer.
    let mut most = 0;
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(100));
        most = most.max(rss_anon(server.pid()));
    }
    let grown = most.saturating_sub(before);
    assert!(grown < 48 << 20, "the server grew by {grown} bytes while a client of a {size}-byte answer stalled");
    // Only one query runs at once: another is refused while this one waits.
    let r = http(server.addr, "POST", "/v1/count", &[], b"{}");
    assert_eq!(r.status, 429);
    // The client leaves: the query stops, and its place is free again.
    drop(s);
    let line = server.wait_for("/v1/query", |l| l["outcome"] != "ok");
    assert_eq!(line["status"], 200, "{line}");
    assert!(line["outcome"].as_str().unwrap().starts_with("cancelled"), "{line}");
    assert!(line["bytes"].as_u64().unwrap() < size, "{line}");
    // The query's place was given back before its log line was written.
    assert_eq!(http(server.addr, "POST", "/v1/count", &[], b"{}").status, 200);
    println!("serve: a stalled client of a {size}-byte answer: the server grew by {grown} bytes; leaving cancelled it");
}

/// A certificate authority and what it signs, written as PEM files into a directory.
struct Pki {
    ca: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl Pki {
    fn new(name: &str) -> Pki {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::DigitalSignature];
        Pki { ca: rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap()).unwrap() }
    }

    /// Writes the CA's certificate to `dir/NAME-ca.pem`.
    fn ca_file(&self, dir: &TempDir, name: &str) -> PathBuf {
        let path = dir.join(&format!("{name}-ca.pem"));
        std::fs::write(&path, self.ca.pem()).unwrap();
        path
    }

    /// A leaf certificate and key for `names`, for a server or a client, valid until `until` (year), written to
    /// `dir/NAME.pem` and `dir/NAME-key.pem`.
    fn leaf(&self, dir: &TempDir, name: &str, names: &[&str], client: bool, until: i32) -> (PathBuf, PathBuf) {
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(until, 1, 1);
        params.extended_key_usages = vec![if client {
            rcgen::ExtendedKeyUsagePurpose::ClientAuth
        } else {
            rcgen::ExtendedKeyUsagePurpose::ServerAuth
        }];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        let (c, k) = (dir.join(&format!("{name}.pem")), dir.join(&format!("{name}-key.pem")));
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }
}

/// Debian's curl against the service: (exit status, body).
fn curl(args: &[&str]) -> (i32, Vec<u8>) {
    let out = Command::new("curl").args(["-sS", "--max-time", "60"]).args(args).output().expect("run curl");
    (out.status.code().unwrap_or(-1), out.stdout)
}

#[test]
fn tls_with_client_certificates_and_tokens_checked_with_curl() {
    if pcaptool_tests::tool("curl").is_none() {
        return;
    }
    let dir = TempDir::new("serve-tls");
    let trace = generated(&dir, "g.pcap", 5_000, 10);
    let (servers, clients, strangers) = (Pki::new("server CA"), Pki::new("client CA"), Pki::new("other CA"));
    let server_ca = servers.ca_file(&dir, "server");
    let client_ca = clients.ca_file(&dir, "client");
    let (cert, key) = servers.leaf(&dir, "server", &["localhost", "127.0.0.1"], false, 2099);
    let (good, good_key) = clients.leaf(&dir, "analyst", &[], true, 2099);
    let (expired, expired_key) = clients.leaf(&dir, "expired", &[], true, 2021);
    let (foreign, foreign_key) = strangers.leaf(&dir, "stranger", &[], true, 2099);
    let tokens = dir.join("tokens");
    let token = String::from_utf8(pcaptool(&["serve", "token", "add", "ci", "--tokens", p(&tokens)]).stdout).unwrap();
    let bearer = format!("Authorization: Bearer {}", token.trim());
    let server = Server::start(&[
        p(&trace),
        "--tls-cert",
        p(&cert),
        "--tls-key",
        p(&key),
        "--client-ca",
        p(&client_ca),
        "--tokens",
        p(&tokens),
    ]);
    let url = format!("https://localhost:{}/v1/query", server.addr.port());
    let resolve = format!("localhost:{}:127.0.0.1", server.addr.port());
    let base = ["--resolve", &resolve, "--cacert", p(&server_ca), "-X", "POST", "-d", r#"{"filter": "tcp port 80"}"#];
    let out = dir.join("cli.pcap");
    assert!(pcaptool(&["query", p(&trace), "tcp port 80", "-w", p(&out)]).status.success());
    let want = std::fs::read(&out).unwrap();
    for http in ["--http1.1", "--http2"] {
        let (code, body) = curl(
            &[&base[..], &[http, "--fail", "--cert", p(&good), "--key", p(&good_key), "-H", &bearer, &url]].concat(),
        );
        assert_eq!(code, 0, "{http}: {}", String::from_utf8_lossy(&body));
        assert!(body == want, "{http}: {} bytes, the CLI wrote {}", body.len(), want.len());
    }
    // Refused: no client certificate, an expired one, one from another authority (the handshake fails); the
    // right certificate without the token (401).
    for (what, extra) in [
        ("no client certificate", vec![]),
        ("an expired certificate", vec!["--cert", p(&expired), "--key", p(&expired_key)]),
        ("a certificate of another authority", vec!["--cert", p(&foreign), "--key", p(&foreign_key)]),
    ] {
        let (code, _) = curl(&[&base[..], &extra[..], &["-H", &bearer, &url]].concat());
        assert!(code != 0, "{what}: curl succeeded");
    }
    let (code, body) = curl(
        &[&base[..], &["--cert", p(&good), "--key", p(&good_key), "-w", "%{http_code}", "-o", "/dev/null", &url]]
            .concat(),
    );
    assert_eq!((code, String::from_utf8_lossy(&body).as_ref()), (0, "401"));
    // Plain HTTP to the TLS port is not answered.
    let (code, _) = curl(&["-X", "POST", &format!("http://127.0.0.1:{}/v1/query", server.addr.port())]);
    assert!(code != 0);
    let ok = server.wait_for("/v1/query", |l| l["status"] == 200);
    assert!(ok["who"].as_str().unwrap().starts_with("ci (cert:"), "{ok}");

    // pcaptool query as the client: the same bytes; each credential missing or wrong is refused, and said so.
    let token_file = dir.join("token");
    std::fs::write(&token_file, &token).unwrap();
    let wrong_token = dir.join("wrong-token");
    std::fs::write(&wrong_token, "not-the-token\n").unwrap();
    let sensor = format!("https://localhost:{}", server.addr.port());
    let remote = dir.join("remote.pcap");
    let ask = |extra: &[&str]| {
        let _ = std::fs::remove_file(&remote);
        let args =
            [&["query", &sensor, "tcp port 80", "-w", p(&remote), "--ca-cert", p(&server_ca)][..], extra].concat();
        let out = pcaptool(&args);
        (out.status.success(), String::from_utf8_lossy(&out.stderr).to_string())
    };
    let me = ["--client-cert", p(&good), "--client-key", p(&good_key)];
    let (ok, err) = ask(&[&me[..], &["--token-file", p(&token_file)]].concat());
    assert!(ok, "{err}");
    assert!(std::fs::read(&remote).unwrap() == want, "the remote answer differs from the CLI's");
    let (ok, err) = ask(&[&me[..], &["--token-file", p(&wrong_token)]].concat());
    assert!(!ok && err.contains("refused with 401"), "{err}");
    let (ok, err) = ask(&me);
    assert!(!ok && err.contains("refused with 401"), "{err}");
    let (ok, err) = ask(&["--token-file", p(&token_file)]);
    assert!(!ok && err.contains("certificate"), "{err}");
    let (ok, err) =
        ask(&["--token-file", p(&token_file), "--client-cert", p(&expired), "--client-key", p(&expired_key)]);
    assert!(!ok, "an expired client certificate was accepted: {err}");
    // A server whose certificate the client's authorities did not sign.
    let out =
        pcaptool(&["query", &sensor, "tcp", "--count", "--ca-cert", p(&client_ca), "--token-file", p(&token_file)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("TLS") && err.contains("certificate"), "{err}");
    assert!(!std::fs::exists(&remote).unwrap(), "a refused query left an output file");
}

#[test]
fn flows_are_listed_as_pcaptool_flows_lists_them() {
    let dir = TempDir::new("serve-flows");
    let trace = generated(&dir, "g.pcap", 5_000, 11);
    let store = dir.join("st");
    assert!(pcaptool(&["import", p(&trace), "--store", p(&store)]).status.success());
    let server = Server::start(&[p(&store), p(&trace)]);
    for (filter, query) in
        [("", ""), ("tcp port 443", "tcp%20port%20443"), ("udp and net 10.0.0.0/8", "udp+and+net+10.0.0.0%2F8")]
    {
        let r = http(server.addr, "GET", &format!("/v1/flows?source=st&filter={query}"), &[], b"");
        assert_eq!((r.status, r.header("content-type")), (200, Some("application/x-ndjson")), "`{filter}`");
        let mut args = vec!["flows", p(&store), "--json"];
        args.extend(filter.split_whitespace());
        let cli = pcaptool(&args);
        assert!(cli.status.success());
        assert!(
            !cli.stdout.is_empty() && r.body == cli.stdout,
            "`{filter}`: the service's flows differ from the CLI's"
        );
    }
    // Logged with the flows listed (not as packets).
    let line = server.wait_for("/v1/flows", |l| l["status"] == 200 && l["flows"].as_u64().is_some_and(|n| n > 0));
    assert!(line["packets"].is_null(), "{line}");
    let r = http(server.addr, "GET", "/v1/flows?source=g.pcap", &[], b"");
    assert!(r.status == 400 && r.json()["error"].as_str().unwrap().contains("flow store"), "{}", r.json());
    assert_eq!(http(server.addr, "GET", "/v1/flows?source=st&path=/etc", &[], b"").status, 400);
}

/// A generated trace split in three parts (packet i in part i mod 3), and the whole merged again by time, ties in
/// part order (as mergecap would): the reference a merged answer must equal. The second part is indexed.
fn three_parts(dir: &TempDir, seed: u64) -> (PathBuf, Vec<PathBuf>) {
    use pcaptool_packet::{LinkType, PcapWriter, Records, TsPrecision};
    let trace = generated(dir, "g.pcap", 20_000, seed);
    let bytes = std::fs::read(&trace).unwrap();
    let recs: Vec<(u64, u32, Vec<u8>)> =
        Records::new(&bytes).map(|r| r.unwrap()).map(|r| (r.ts_ns, r.wirelen, r.data.to_vec())).collect();
    let mut tagged: Vec<(u64, usize, usize)> = recs.iter().enumerate().map(|(i, r)| (r.0, i % 3, i)).collect();
    tagged.sort();
    let write = |path: &Path, which: &mut dyn Iterator<Item = usize>| {
        let mut w = PcapWriter::new(Vec::new(), LinkType::ETHERNET, 65535, TsPrecision::Nano).unwrap();
        for i in which {
            w.write_packet(recs[i].0, recs[i].1, &recs[i].2).unwrap();
        }
        std::fs::write(path, w.finish().unwrap()).unwrap();
    };
    let whole = dir.join("whole.pcap");
    write(&whole, &mut tagged.iter().map(|t| t.2));
    let mut names = Vec::new();
    for k in 0..3 {
        let p = dir.join(&format!("part{k}.pcap"));
        write(&p, &mut (0..recs.len()).filter(|i| i % 3 == k));
        names.push(p);
    }
    assert!(pcaptool(&["index", p(&names[1])]).status.success());
    (whole, names)
}

#[test]
fn several_sources_are_answered_as_their_merged_trace() {
    let dir = TempDir::new("serve-merged");
    let (whole, names) = three_parts(&dir, 12);
    let server = Server::start(&[p(&names[0]), p(&names[1]), p(&names[2])]);
    let out = dir.join("cli.pcap");
    let (mut same, mut packets) = (0, 0);
    for filter in filter_table().into_iter().step_by(4) {
        let _ = std::fs::remove_file(&out);
        let cli = pcaptool(&["query", p(&whole), "-w", p(&out), "--", &filter]);
        let body = serde_json::json!({ "filter": filter }).to_string();
        let r = http(server.addr, "POST", "/v1/query", &[], body.as_bytes());
        if !cli.status.success() {
            assert_eq!(r.status, 400, "`{filter}`");
            continue;
        }
        assert_eq!(r.status, 200, "`{filter}`: {}", String::from_utf8_lossy(&r.body));
        let want = std::fs::read(&out).unwrap();
        assert!(r.complete && r.body == want, "`{filter}`: {} bytes, the CLI wrote {}", r.body.len(), want.len());
        packets += pcaptool_tests::records_us(&out).len();
        same += 1;
    }
    // Named in a list, and counted.
    let r = http(server.addr, "POST", "/v1/count", &[], br#"{"filter": "udp", "source": "part0.pcap,part2.pcap"}"#);
    let a = http(server.addr, "POST", "/v1/count", &[], br#"{"filter": "udp", "source": "part0.pcap"}"#).json();
    let b = http(server.addr, "POST", "/v1/count", &[], br#"{"filter": "udp", "source": "part2.pcap"}"#).json();
    assert_eq!(r.json()["matched"].as_u64(), Some(a["matched"].as_u64().unwrap() + b["matched"].as_u64().unwrap()));
    let plan = http(server.addr, "POST", "/v1/explain", &[], br#"{"filter": "udp"}"#).json();
    assert_eq!(plan["parts"].as_array().map(Vec::len), Some(3));
    assert!(!plan.to_string().contains(p(&dir.join(""))), "a path is shown: {plan}");
    println!("serve: three sources merged: {same} answers byte-identical to the merged trace's ({packets} packets)");
    assert!(same > 50 && packets > 0);
}

#[test]
fn a_fan_out_over_three_services_equals_a_query_over_the_merged_trace() {
    let dir = TempDir::new("serve-fanout");
    let (whole, names) = three_parts(&dir, 14);
    let mut servers: Vec<Server> = names.iter().map(|n| Server::start(&[p(n)])).collect();
    let urls: Vec<String> = servers.iter().map(|s| format!("http://127.0.0.1:{}", s.addr.port())).collect();
    let all = urls.join(",");
    let (fan, local) = (dir.join("fan.pcap"), dir.join("local.pcap"));
    let (mut same, mut packets) = (0, 0);
    for filter in filter_table().into_iter().step_by(4) {
        let _ = std::fs::remove_file(&fan);
        let _ = std::fs::remove_file(&local);
        let want = pcaptool(&["query", p(&whole), "-w", p(&local), "--", &filter]);
        let got = pcaptool(&["query", &all, "-w", p(&fan), "--", &filter]);
        assert_eq!(got.status.success(), want.status.success(), "`{filter}`: {}", String::from_utf8_lossy(&got.stderr));
        if !want.status.success() {
            continue;
        }
        assert!(
            std::fs::read(&fan).unwrap() == std::fs::read(&local).unwrap(),
            "`{filter}`: the sensors' merged answer differs from the merged trace's"
        );
        packets += pcaptool_tests::records_us(&fan).len();
        same += 1;
    }
    println!("remote: three services merged: {same} answers byte-identical to the merged trace's ({packets} packets)");
    assert!(same > 50 && packets > 0);

    // Counting, explaining, a limit, and a file of sensors naming them.
    let count = |source: &str, extra: &[&str]| {
        let out = pcaptool(&[&["query", source, "udp", "--count"][..], extra].concat());
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (_, whole_udp, _) = count(p(&whole), &[]);
    assert_eq!(count(&all, &[]).1, whole_udp);
    let sensors = dir.join("sensors");
    std::fs::write(&sensors, format!("# three sensors\neast {}\nwest {}\nsouth {}\n", urls[0], urls[1], urls[2]))
        .unwrap();
    assert_eq!(count(&format!("@{}", p(&sensors)), &[]).1, whole_udp);
    let explain = pcaptool(&["query", &all, "udp", "--explain", "--json"]);
    let plan: serde_json::Value = serde_json::from_slice(&explain.stdout).unwrap();
    assert_eq!((plan["strategy"].as_str(), plan["parts"].as_array().map(Vec::len)), (Some("merge"), Some(3)));
    assert_eq!(plan["parts"][1]["parts"][0]["kind"], "indexed_trace", "{plan}");
    let limited = dir.join("limited.pcap");
    assert!(pcaptool(&["query", &all, "tcp", "--limit", "7", "-w", p(&limited)]).status.success());
    let _ = std::fs::remove_file(&local);
    assert!(pcaptool(&["query", p(&whole), "tcp", "--limit", "7", "-w", p(&local)]).status.success());
    assert!(std::fs::read(&limited).unwrap() == std::fs::read(&local).unwrap());

    // A sensor that is gone: named, and the query fails; with --partial, the others answer (exit status 3).
    drop(servers.remove(1));
    let (code, _, err) = count(&format!("@{}", p(&sensors)), &[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.starts_with("pcaptool: error: west: cannot connect to 127.0.0.1:"), "{err}");
    let (code, n, err) = count(&format!("@{}", p(&sensors)), &["--partial"]);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("left out west: cannot connect"), "{err}");
    let part = |k: usize| count(p(&names[k]), &[]).1.parse::<u64>().unwrap();
    assert_eq!(n.parse::<u64>().unwrap(), part(0) + part(2));
    // A bad filter is refused before any sensor is asked, as for a local trace.
    let out = pcaptool(&["query", &all, "tcp prt 80", "--count"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("invalid filter"));
}

#[test]
fn sigterm_lets_queries_finish_then_cancels_a_stalled_one() {
    let dir = TempDir::new("serve-stop");
    let trace = generated(&dir, "big.pcap", 100_000, 13);
    let mut server = Server::start(&[p(&trace), "--drain-seconds", "1"]);
    // A query that finishes, then a client that stops reading its answer.
    assert_eq!(http(server.addr, "POST", "/v1/count", &[], b"{}").status, 200);
    let mut s = TcpStream::connect(server.addr).unwrap();
    s.write_all(&request_bytes("POST", "/v1/query", &[], b"{}", true)).unwrap();
    let mut first = vec![0u8; 64 << 10];
    s.read_exact(&mut first).unwrap();
    let st = Command::new("kill").args(["-TERM", &server.pid().to_string()]).status().unwrap();
    assert!(st.success());
    // The stop waits a second for the stalled query, cancels it, and the process ends cleanly.
    let start = Instant::now();
    let status = loop {
        if let Some(st) = server.child.try_wait().unwrap() {
            break st;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "pcaptool serve did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
    let stopped = server.wait_for_event("stopped");
    assert_eq!((stopped["drained"].as_bool(), stopped["engines_stopped"].as_bool()), (Some(false), Some(true)));
    // The stalled answer ends short of complete, and nothing listens any more.
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    let whole = std::fs::metadata(&trace).unwrap().len() as usize;
    assert!(first.len() + rest.len() < whole, "the stalled answer was sent whole");
    assert!(TcpStream::connect(server.addr).is_err());
}

#[test]
fn a_query_past_its_time_ends_its_stream_with_an_error() {
    let dir = TempDir::new("serve-time");
    let trace = generated(&dir, "big.pcap", 100_000, 14);
    let server = Server::start(&[p(&trace), "--max-seconds", "1"]);
    let mut s = TcpStream::connect(server.addr).unwrap();
    s.write_all(&request_bytes("POST", "/v1/query", &[], b"{}", true)).unwrap();
    let mut raw = vec![0u8; 64 << 10];
    s.read_exact(&mut raw).unwrap();
    // The client waits past the limit, then reads the rest: the answer is cut short, not complete.
    std::thread::sleep(Duration::from_millis(2500));
    let _ = s.read_to_end(&mut raw);
    let r = pcaptool_tests::http::read_response(&mut std::io::Cursor::new(&raw), &mut std::io::sink()).unwrap();
    assert_eq!(r.status, 200);
    assert!(!r.complete, "a cancelled answer ended as a complete one ({} bytes)", r.body_len);
    let line = server.wait_for("/v1/query", |l| l["status"] == 200);
    assert_eq!(line["outcome"], "cancelled");
}
