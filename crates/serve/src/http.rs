//! The HTTP side: the listener (TLS or not), authentication, the routes, JSON errors and one log line per
//! request.

// A refusal is the response itself (axum's way): handlers return `Result<_, Response>`.
#![allow(clippy::result_large_err)]

use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request as HttpRequest, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use pcaptool_engine::{Cancel, Container, Counter, Error as EngineError, Request, Source, TraceSink, WriteOptions};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use crate::api::{Query, QueryBody, parse_flows_query, parse_query};
use crate::body::{self, ByteLimit};
use crate::sources::{Served, Service};
use crate::{Config, Limits, ServeError, Tokens};

/// Who is on the other end of a connection.
#[derive(Clone, Debug)]
struct Peer {
    addr: SocketAddr,
    /// The client certificate's name, under mutual TLS.
    cert: Option<String>,
}

/// Who made a request, once authenticated.
#[derive(Clone, Debug)]
struct Who(String);

#[derive(Debug)]
struct AppState {
    service: Arc<Service>,
    tokens: Option<Tokens>,
    limits: Limits,
    queries: Arc<Semaphore>,
    /// Turns to run the engine, as many as processors, given in the order asked: concurrent queries then wait
    /// their turn instead of all sharing the processors (which let some wait seconds under 64 clients).
    exec: Arc<Semaphore>,
    closing: AtomicBool,
    /// Set when a stop has waited long enough: every running query is then cancelled.
    stop: tokio::sync::watch::Sender<bool>,
}

type Shared = Arc<AppState>;

/// Runs the service of `config` until `shutdown` completes (SIGTERM or SIGINT in the binary): it then stops
/// accepting, answers new requests 503, lets running queries finish, and returns. `ready` is told the address
/// listened on (port 0 picks one).
pub async fn serve(
    config: Config,
    service: Arc<Service>,
    shutdown: impl Future<Output = ()> + Send,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    config.check()?;
    let tokens = config.tokens.as_deref().map(Tokens::load).transpose()?;
    let tls = config.tls.as_ref().map(crate::tls::server_config).transpose()?.map(TlsAcceptor::from);
    let listener =
        TcpListener::bind(config.listen).await.map_err(|source| ServeError::Listen { addr: config.listen, source })?;
    let local = listener.local_addr().map_err(|source| ServeError::Listen { addr: config.listen, source })?;
    let state = Arc::new(AppState {
        service: service.clone(),
        tokens,
        limits: config.limits,
        queries: Arc::new(Semaphore::new(config.limits.concurrent)),
        exec: Arc::new(Semaphore::new(std::thread::available_parallelism().map_or(1, usize::from))),
        closing: AtomicBool::new(false),
        stop: tokio::sync::watch::channel(false).0,
    });
    let app = router(state.clone());
    // Stores are looked at for new segments (a capture closing them) every half second.
    let watcher = {
        let service = service.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Service::WATCH).await;
                let s = service.clone();
                if let Ok(results) = tokio::task::spawn_blocking(move || s.refresh()).await {
                    for r in results {
                        match r {
                            Ok(name) => log(&json!({ "event": "store reopened", "source": name })),
                            Err(e) => log(&json!({ "event": "store not reopened", "error": chain(&e) })),
                        }
                    }
                }
            }
        })
    };
    ready(local);
    log(&json!({ "event": "listening", "addr": local.to_string(), "tls": tls.is_some(),
                 "sources": service.names() }));
    let graceful = GracefulShutdown::new();
    // The connections' tasks, so that a stop that has waited long enough can end them.
    let mut connections = tokio::task::JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        while connections.try_join_next().is_some() {}
        let (tcp, addr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                // (Out of file descriptors and the like: wait a little rather than spin.)
                Err(_) => { tokio::time::sleep(Duration::from_millis(50)).await; continue; }
            },
            () = &mut shutdown => break,
        };
        let _ = tcp.set_nodelay(true);
        let app = app.clone();
        let tls = tls.clone();
        let watch = graceful.watcher();
        connections.spawn(async move {
            let builder = auto::Builder::new(TokioExecutor::new());
            match tls {
                Some(acceptor) => {
                    // A failed handshake (no or a wrong client certificate, an expired one, not TLS) ends here.
                    let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await
                    else {
                        return;
                    };
                    let cert =
                        stream.get_ref().1.peer_certificates().and_then(|c| c.first()).map(crate::tls::cert_name);
                    let svc =
                        hyper_util::service::TowerToHyperService::new(app.layer(axum::Extension(Peer { addr, cert })));
                    let conn = builder.serve_connection(TokioIo::new(stream), svc);
                    let _ = watch.watch(conn.into_owned()).await;
                }
                None => {
                    let svc = hyper_util::service::TowerToHyperService::new(
                        app.layer(axum::Extension(Peer { addr, cert: None })),
                    );
                    let conn = builder.serve_connection(TokioIo::new(tcp), svc);
                    let _ = watch.watch(conn.into_owned()).await;
                }
            }
        });
    }
    state.closing.store(true, Ordering::SeqCst);
    log(&json!({ "event": "shutting down", "running": config.limits.concurrent - state.queries.available_permits() }));
    drop(listener);
    // Running queries finish, for `drain` at most (a client that stopped reading would hold its query forever);
    // then they are cancelled, and their streams end with an error.
    let drained = tokio::time::timeout(config.drain, graceful.shutdown()).await.is_ok();
    if !drained {
        // Cancel the engines, and end the connections (an engine waiting for a client that stopped reading
        // stops when its answer's stream is dropped).
        state.stop.send_replace(true);
        connections.abort_all();
    }
    // Answers still running hold a permit each until their engine stops.
    let all = config.limits.concurrent as u32;
    let stopped = tokio::time::timeout(Duration::from_secs(10), state.queries.acquire_many(all)).await.is_ok();
    watcher.abort();
    log(&json!({ "event": "stopped", "drained": drained, "engines_stopped": stopped }));
    Ok(())
}

fn router(state: Shared) -> Router {
    let api = Router::new()
        .route("/v1/query", post(query))
        .route("/v1/count", post(count))
        .route("/v1/explain", post(explain))
        .route("/v1/flows", get(flows))
        .route("/v1/stats", get(stats))
        .layer(middleware::from_fn_with_state(state.clone(), authenticate));
    Router::new()
        .route("/healthz", get(healthz))
        .merge(api)
        .fallback(not_found)
        .method_not_allowed_fallback(wrong_method)
        .layer(middleware::from_fn_with_state(state.clone(), closing))
        .with_state(state)
}

/// A JSON error response.
fn error(status: StatusCode, message: impl Into<String>, extra: Value) -> Response {
    let mut v = json!({ "error": message.into() });
    if let (Some(o), Value::Object(e)) = (v.as_object_mut(), extra) {
        o.extend(e);
    }
    (status, [(header::CONTENT_TYPE, "application/json")], v.to_string() + "\n").into_response()
}

async fn not_found(req: HttpRequest) -> Response {
    refused(&req, StatusCode::NOT_FOUND, "no such endpoint: see docs/service.md")
}

async fn wrong_method(req: HttpRequest) -> Response {
    refused(&req, StatusCode::METHOD_NOT_ALLOWED, "this endpoint takes another method: see docs/service.md")
}

/// A refusal before any handler, logged as one.
fn refused(req: &HttpRequest, status: StatusCode, message: &str) -> Response {
    let peer = req.extensions().get::<Peer>().map(|p| p.addr.to_string());
    log(&json!({ "peer": peer, "path": req.uri().path(), "status": status.as_u16(), "outcome": message }));
    error(status, message, Value::Null)
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// 503 for every request once the service is stopping.
///
/// Every request's body (at most `--max-body` bytes) is read first, whatever answers it: a refusal that left it
/// unread would end an HTTP/2 stream with a reset that clients report as an error instead of the refusal.
async fn closing(State(state): State<Shared>, req: HttpRequest, next: Next) -> Response {
    if state.closing.load(Ordering::SeqCst) {
        let mut r = refused(&req, StatusCode::SERVICE_UNAVAILABLE, "the service is shutting down");
        r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        return r;
    }
    let (parts, body) = req.into_parts();
    match read_body(&state, body).await {
        Ok(bytes) => next.run(HttpRequest::from_parts(parts, Body::from(bytes))).await,
        Err(r) => {
            let peer = parts.extensions.get::<Peer>().map(|p| p.addr.to_string());
            log(
                &json!({ "peer": peer, "path": parts.uri.path(), "status": r.status().as_u16(), "outcome": "refused" }),
            );
            r
        }
    }
}

/// Bearer tokens, when the service has a token file; the client certificate was checked by the handshake.
async fn authenticate(State(state): State<Shared>, mut req: HttpRequest, next: Next) -> Response {
    let peer = req.extensions().get::<Peer>().cloned();
    let cert = peer.as_ref().and_then(|p| p.cert.clone());
    let who = match &state.tokens {
        None => cert.unwrap_or_else(|| "local".to_string()),
        Some(tokens) => {
            let given = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
            let token = given.and_then(|v| v.strip_prefix("Bearer ")).map(str::trim);
            let refuse = |message: &str| {
                log(&json!({ "peer": peer.as_ref().map(|p| p.addr.to_string()), "path": req.uri().path(),
                             "status": 401, "outcome": message }));
                let mut r = error(StatusCode::UNAUTHORIZED, message, Value::Null);
                r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                r
            };
            match token {
                None => return refuse("this service needs a bearer token: Authorization: Bearer TOKEN"),
                Some(t) => match tokens.check(t) {
                    Some(name) => match cert {
                        Some(c) => format!("{name} ({c})"),
                        None => name.to_string(),
                    },
                    None => return refuse("the bearer token is not one this service accepts"),
                },
            }
        }
    };
    req.extensions_mut().insert(Who(who));
    next.run(req).await
}

/// What was asked, for the log line.
#[derive(Debug, Default)]
struct Asked {
    source: Option<String>,
    filter: Option<String>,
}

/// The parts of a request a handler needs: who, from where, the body parsed, and the source.
struct Prepared {
    who: String,
    peer: Option<SocketAddr>,
    body: QueryBody,
    served: Arc<Source>,
    name: String,
    req: Request,
}

/// Reads and checks a query body: 413 past the body limit, 400 for what does not parse (a filter with its
/// caret), 404 for a source not served.
async fn prepare(
    state: &AppState,
    who: Option<Who>,
    peer: Option<Peer>,
    req: HttpRequest,
) -> Result<Prepared, Response> {
    // `GET /v1/flows` asks in its query string, the others in a JSON body.
    let parsed = if req.method() == axum::http::Method::GET {
        parse_flows_query(req.uri().query().unwrap_or(""), &state.limits)
    } else {
        parse_query(&read_body(state, req.into_body()).await?, &state.limits)
    };
    let Query { body, request: req } = parsed.map_err(|r| {
        let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::BAD_REQUEST);
        error(status, r.message, r.detail)
    })?;
    let (name, served) = state
        .service
        .find(body.source.as_deref())
        .map_err(|m| error(StatusCode::NOT_FOUND, m, json!({ "sources": state.service.names() })))?;
    Ok(Prepared {
        who: who.map_or_else(|| "local".to_string(), |w| w.0),
        peer: peer.map(|p| p.addr),
        name,
        served,
        body,
        req,
    })
}

/// A request body up to the service's limit (413 beyond).
async fn read_body(state: &AppState, body: Body) -> Result<axum::body::Bytes, Response> {
    match axum::body::to_bytes(body, state.limits.body_bytes).await {
        Ok(b) => Ok(b),
        Err(e) => {
            let too_big = std::error::Error::source(&e).is_some_and(|s| s.to_string().contains("length limit"))
                || e.to_string().contains("length limit");
            Err(if too_big {
                error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("the request body is larger than {} bytes", state.limits.body_bytes),
                    Value::Null,
                )
            } else {
                error(StatusCode::BAD_REQUEST, format!("cannot read the request body: {e}"), Value::Null)
            })
        }
    }
}

/// An engine error before any packet: its status and JSON.
fn engine_error(e: &EngineError) -> Response {
    // A part of a merged source: the part's error decides the status; the message names the part.
    let mut inner = e;
    while let EngineError::Part { source, .. } = inner {
        inner = source;
    }
    let status = match inner {
        EngineError::Filter(_)
        | EngineError::FilterForLinkType { .. }
        | EngineError::EmptyWindow
        | EngineError::NoFlow { .. }
        | EngineError::FlowNeedsStore { .. } => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let mut extra = Value::Null;
    if let EngineError::Filter(f) | EngineError::FilterForLinkType { source: f, .. } = inner {
        extra = json!({ "caret": f.caret() });
    }
    error(status, chain(e), extra)
}

/// The message of an error and its causes, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string().replace('\n', " "));
        cause = c.source();
    }
    s
}

/// One JSON line on standard error.
pub(crate) fn log(v: &Value) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        o.insert("time".into(), json!((now * 1000.0).round() / 1000.0));
    }
    // One write a line (stderr is unbuffered: formatting into it writes each piece with a system call of its
    // own, dozens a line, which took a fifth of a busy service's time).
    let mut line = serde_json::to_vec(&v).unwrap_or_default();
    line.push(b'\n');
    let _ = std::io::stderr().lock().write_all(&line);
}

/// The log line of a request handled (or refused) by a handler.
#[allow(clippy::too_many_arguments)]
fn log_request(
    peer: Option<SocketAddr>,
    who: &str,
    path: &str,
    asked: &Asked,
    status: u16,
    returned: Option<(&str, u64)>,
    bytes: Option<u64>,
    started: Instant,
    outcome: &str,
) {
    let mut v = json!({
        "peer": peer.map(|p| p.to_string()), "who": who, "path": path, "source": asked.source,
        "filter": asked.filter, "status": status, "packets": null, "bytes": bytes,
        "ms": (started.elapsed().as_secs_f64() * 1e6).round() / 1e3, "outcome": outcome,
    });
    // Packets returned or counted; for `/v1/flows`, flows listed.
    if let Some((what, n)) = returned {
        v[what] = n.into();
    }
    log(&v);
}

/// Runs a request's preparation; a refusal is logged and returned.
async fn prepared(
    state: &AppState,
    who: Option<Who>,
    peer: Option<Peer>,
    req: HttpRequest,
    path: &str,
    started: Instant,
) -> Result<Prepared, Response> {
    let (w, p) = (who.as_ref().map_or("local".to_string(), |w| w.0.clone()), peer.as_ref().map(|p| p.addr));
    prepare(state, who, peer, req).await.inspect_err(|r| {
        log_request(p, &w, path, &Asked::default(), r.status().as_u16(), None, None, started, "refused");
    })
}

fn extensions(req: &HttpRequest) -> (Option<Who>, Option<Peer>) {
    (req.extensions().get::<Who>().cloned(), req.extensions().get::<Peer>().cloned())
}

/// A query's request prepared (see [`prepare`]) and its place among the queries running taken, or the refusal,
/// logged: what `/v1/query`, `/v1/count` and `/v1/flows` begin with.
async fn admitted(
    state: &AppState,
    req: HttpRequest,
    path: &str,
    started: Instant,
) -> Result<(Prepared, Asked, tokio::sync::OwnedSemaphorePermit), Response> {
    let (who, peer) = extensions(&req);
    let p = prepared(state, who, peer, req, path, started).await?;
    let asked = Asked { source: Some(p.name.clone()), filter: Some(p.body.filter.clone()) };
    let permit = permit(state).inspect_err(|_| {
        log_request(p.peer, &p.who, path, &asked, 429, None, None, started, "too many queries");
    })?;
    Ok((p, asked, permit))
}

/// A permit to run a query, or 429.
fn permit(state: &AppState) -> Result<tokio::sync::OwnedSemaphorePermit, Response> {
    state.queries.clone().try_acquire_owned().map_err(|_| {
        error(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "{} queries are running, the most this service runs at once: try again shortly",
                state.limits.concurrent
            ),
            Value::Null,
        )
    })
}

/// `POST /v1/query`: the matching packets as a pcap (or pcapng) stream.
async fn query(State(state): State<Shared>, req: HttpRequest) -> Response {
    let started = Instant::now();
    let (p, asked, permit) = match admitted(&state, req, "/v1/query", started).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let cancel = Cancel::new();
    let mut req = p.req.clone().with_cancel(cancel.clone());
    req.count_only = false;
    // The response waits for the answer's first byte (a needle's answer is then whole), so that a failure before
    // it (a filter meaningless for a link type of the source, a flow it lacks) gets its own status.
    let Ok(turn) = state.exec.clone().acquire_owned().await else {
        return error(StatusCode::SERVICE_UNAVAILABLE, "the service is shutting down", Value::Null);
    };
    let (first, started_rx) = body::First::new(Some(turn));
    let (stream, writer, tx, sent) = body::channel(cancel.clone(), first.clone());
    // Pieces of 128 KiB go out as the engine writes them, not 1 MiB gathered first.
    let mut opts = WriteOptions::new().gather(false);
    let pcapng = p.body.format.as_deref() == Some("pcapng");
    if pcapng {
        opts = opts.container(Container::PcapNg);
    }
    let max_bytes = match (p.body.max_bytes, state.limits.bytes) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let watch = watch_cancel(&state, &cancel);
    let (source, who, peer) = (p.served.clone(), p.who.clone(), p.peer);
    tokio::task::spawn_blocking(move || {
        let _watch = watch;
        let sink = TraceSink::to_writer(Box::new(writer), "the response", opts);
        let mut sink =
            ByteLimit { inner: sink, max_bytes: max_bytes.unwrap_or(u64::MAX), bytes: 0, packets: 0, reached: false };
        let result = source.run(&req, &mut sink);
        // The query's work is over: its place is free before the client sees the end or the log says so.
        drop(permit);
        // Failed before its first byte: the handler answers with the error's own status.
        if !first.fired()
            && let Err(e) = result.as_ref()
            && !matches!(e, EngineError::Cancelled)
            && !e.is_broken_pipe()
        {
            let (status, m) = (engine_error(e).status().as_u16(), chain(e));
            first.fire(result.err());
            log_request(peer, &who, "/v1/query", &asked, status, None, None, started, &m);
            return;
        }
        let outcome = match &result {
            Ok(o) if o.damage.is_some() => {
                let e = o.damage.as_ref().map(|d| d.to_string()).unwrap_or_default();
                let _ = tx.blocking_send(Err(std::io::Error::other(format!("the source is damaged: {e}"))));
                format!("damaged: {e}")
            }
            Ok(_) if sink.reached => "ok (max_bytes reached)".to_string(),
            Ok(_) => "ok".to_string(),
            Err(EngineError::Cancelled) => {
                // (Its time was up, or a stop waited long enough: the stream must not end as a whole answer.)
                let _ = tx.blocking_send(Err(std::io::Error::other("the query was cancelled")));
                "cancelled".to_string()
            }
            Err(e) if e.is_broken_pipe() => "cancelled (the client went away)".to_string(),
            Err(e) => {
                let m = chain(e);
                let _ = tx.blocking_send(Err(std::io::Error::other(m.clone())));
                m
            }
        };
        first.fire(None);
        drop(tx);
        let bytes = sent.load(Ordering::Relaxed);
        log_request(
            peer,
            &who,
            "/v1/query",
            &asked,
            200,
            Some(("packets", sink.packets)),
            Some(bytes),
            started,
            &outcome,
        );
    });
    let ct = if pcapng { "application/x-pcapng" } else { "application/vnd.tcpdump.pcap" };
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    if let Some(n) = p.req.limit {
        headers.insert("pcaptool-limit-packets", HeaderValue::from(n));
    }
    if let Some(n) = max_bytes {
        headers.insert("pcaptool-limit-bytes", HeaderValue::from(n));
    }
    match started_rx.await {
        Ok(None) => (StatusCode::OK, headers, Body::new(stream)).into_response(),
        Ok(Some(e)) => engine_error(&e),
        Err(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "the query ended without an answer", Value::Null),
    }
}

/// `POST /v1/count`: the number of matching packets, as JSON.
async fn count(State(state): State<Shared>, req: HttpRequest) -> Response {
    let started = Instant::now();
    let (p, asked, permit) = match admitted(&state, req, "/v1/count", started).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let cancel = Cancel::new();
    let req = p.req.clone().count_only(true).with_cancel(cancel.clone());
    let watch = watch_cancel(&state, &cancel);
    // A client that goes away cancels the count too.
    let guard = CancelOnDrop(cancel);
    let source = p.served.clone();
    let Ok(turn) = state.exec.clone().acquire_owned().await else {
        return error(StatusCode::SERVICE_UNAVAILABLE, "the service is shutting down", Value::Null);
    };
    let result = tokio::task::spawn_blocking(move || {
        let (_permit, _watch, _turn) = (permit, watch, turn);
        source.run(&req, &mut Counter::default())
    })
    .await;
    drop(guard);
    match result {
        Ok(Ok(o)) => {
            let mut v =
                json!({ "source": p.name, "filter": p.body.filter, "packets": o.packets, "matched": o.matched });
            if let Some(c) = o.candidates {
                v["index_candidates"] = c.into();
            }
            if let Some(c) = o.counted_from_index {
                v["counted_from_index"] = c.into();
            }
            if let Some(d) = &o.damage {
                v["damage"] = d.to_string().into();
            }
            log_request(p.peer, &p.who, "/v1/count", &asked, 200, Some(("packets", o.matched)), None, started, "ok");
            (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], v.to_string() + "\n").into_response()
        }
        Ok(Err(e)) => {
            let r = engine_error(&e);
            log_request(p.peer, &p.who, "/v1/count", &asked, r.status().as_u16(), None, None, started, &chain(&e));
            r
        }
        Err(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "the count failed", Value::Null),
    }
}

/// Cancels a query when its time (`--max-seconds`) is up or when a stop has waited long enough; the watch ends
/// when the returned guard is dropped (the query is over).
#[must_use]
fn watch_cancel(state: &AppState, cancel: &Cancel) -> tokio::sync::oneshot::Sender<()> {
    let (c, secs, mut stop) = (cancel.clone(), state.limits.seconds, state.stop.subscribe());
    let (guard, over) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let deadline = async {
            match secs {
                Some(s) => tokio::time::sleep(Duration::from_secs(s)).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = deadline => c.cancel(),
            _ = stop.wait_for(|&v| v) => c.cancel(),
            _ = over => {}
        }
    });
    guard
}

/// Sets a cancel flag when dropped (a handler future dropped because its client went away).
struct CancelOnDrop(Cancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// `POST /v1/explain`: the engine's plan, as JSON.
async fn explain(State(state): State<Shared>, req: HttpRequest) -> Response {
    let started = Instant::now();
    let (who, peer) = extensions(&req);
    let p = match prepared(&state, who, peer, req, "/v1/explain", started).await {
        Ok(p) => p,
        Err(r) => return r,
    };
    let asked = Asked { source: Some(p.name.clone()), filter: Some(p.body.filter.clone()) };
    let (source, req) = (p.served.clone(), p.req.clone());
    match tokio::task::spawn_blocking(move || source.plan(&req)).await {
        Ok(Ok(plan)) => {
            log_request(p.peer, &p.who, "/v1/explain", &asked, 200, None, None, started, "ok");
            // Sources are named, never shown by path: the index by its file name.
            let mut v = serde_json::to_value(&plan).unwrap_or_else(|e| json!({ "error": e.to_string() }));
            v["source"] = p.name.clone().into();
            hide_paths(&mut v);
            (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], v.to_string() + "\n").into_response()
        }
        Ok(Err(e)) => {
            let r = engine_error(&e);
            log_request(p.peer, &p.who, "/v1/explain", &asked, r.status().as_u16(), None, None, started, &chain(&e));
            r
        }
        Err(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "planning failed", Value::Null),
    }
}

/// `GET /v1/flows?filter=F`: a store's flows that the filter may match, as JSON lines (`pcaptool flows --json`),
/// written as they are formatted.
async fn flows(State(state): State<Shared>, req: HttpRequest) -> Response {
    let started = Instant::now();
    let (p, asked, permit) = match admitted(&state, req, "/v1/flows", started).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let (source, req) = (p.served.clone(), p.req.clone());
    let records = match tokio::task::spawn_blocking(move || source.flows(&req)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            let r = engine_error(&e);
            log_request(p.peer, &p.who, "/v1/flows", &asked, r.status().as_u16(), None, None, started, &chain(&e));
            return r;
        }
        Err(_) => return error(StatusCode::INTERNAL_SERVER_ERROR, "listing flows failed", Value::Null),
    };
    let cancel = Cancel::new();
    let watch = watch_cancel(&state, &cancel);
    let (stream, writer, tx, sent) = body::channel(cancel.clone(), body::First::new(None).0);
    let (who, peer, n) = (p.who.clone(), p.peer, records.len() as u64);
    tokio::task::spawn_blocking(move || {
        let _watch = watch;
        let mut w = std::io::BufWriter::with_capacity(64 << 10, writer);
        let mut outcome = "ok".to_string();
        for r in &records {
            if cancel.is_cancelled() {
                outcome = "cancelled (the client went away)".into();
                break;
            }
            let line = serde_json::to_string(r).unwrap_or_default();
            if writeln!(w, "{line}").is_err() {
                outcome = "cancelled (the client went away)".into();
                break;
            }
        }
        if w.flush().is_err() {
            outcome = "cancelled (the client went away)".into();
        }
        // Its place is free before the client sees the end or the log says so.
        drop(permit);
        drop(w);
        drop(tx);
        log_request(
            peer,
            &who,
            "/v1/flows",
            &asked,
            200,
            Some(("flows", n)),
            Some(sent.load(Ordering::Relaxed)),
            started,
            &outcome,
        );
    });
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/x-ndjson")], Body::new(stream)).into_response()
}

/// A plan shows indexes by file name only, its parts' too (a part's `source` is its name already).
fn hide_paths(plan: &mut Value) {
    if let Some(path) = plan.pointer_mut("/index/path")
        && let Some(name) = path.as_str().and_then(|s| std::path::Path::new(s).file_name())
    {
        *path = name.to_string_lossy().into_owned().into();
    }
    if let Some(Value::Array(parts)) = plan.get_mut("parts") {
        parts.iter_mut().for_each(hide_paths);
    }
}

/// `GET /v1/stats`: the sources, and the queries running.
async fn stats(State(state): State<Shared>) -> Response {
    let service = state.service.clone();
    let sources = tokio::task::spawn_blocking(move || service.sources.iter().map(Served::stats).collect::<Vec<_>>())
        .await
        .unwrap_or_default();
    let mut v = json!({
        "sources": sources,
        "queries_running": state.limits.concurrent - state.queries.available_permits(),
        "limits": {
            "concurrent": state.limits.concurrent, "body_bytes": state.limits.body_bytes,
            "packets": state.limits.packets, "bytes": state.limits.bytes, "seconds": state.limits.seconds,
        },
    });
    if let Some(c) = state.service.capture_stats() {
        v["capture"] = c;
    }
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], v.to_string() + "\n").into_response()
}
