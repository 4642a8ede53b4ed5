//! The metrics endpoint: hyper's HTTP/1.1 server on its own thread and tokio runtime (so that a
//! scrape never waits on, nor delays, the role's own runtime), answering `GET /metrics` and
//! `GET /healthz` (and, on the chief, `GET /status` and `GET /status.json`), one request per
//! connection.
//!
//! Bounded everywhere: [`CONNECTIONS_MAX`] connections at once (more wait in the listen
//! queue), [`REQUEST_BYTES_MAX`] of request head (hyper answers 431 past it), [`REQUEST_TIMEOUT`]
//! for a whole exchange.

use std::convert::Infallible;
use std::io;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE as CONTENT_TYPE_HEADER};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use super::{Exposition, StatusFormat, CONTENT_TYPE};

/// Most connections served at once.
pub const CONNECTIONS_MAX: usize = 16;
/// Most bytes of a request's head (request line and headers); a longer one is answered 431.
/// hyper's smallest read buffer.
pub const REQUEST_BYTES_MAX: usize = 8 * 1024;
/// Bound on one exchange: reading the request, reading the role's counters, writing the answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A running metrics endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsServer {
    /// Where it serves (the port chosen when the address asked for port 0).
    pub addr: SocketAddr,
}

/// Binds `addr` and serves `exposition` there from a thread of its own, for the rest of the
/// process. Fails only if the address cannot be bound or the thread not started.
pub fn serve(addr: SocketAddr, exposition: Arc<Exposition>) -> io::Result<MetricsServer> {
    let listener = StdListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("metrics-http".into())
        .spawn(move || {
            runtime.block_on(async move {
                let listener = match TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::warn!("metrics endpoint on {addr} not served: {e}");
                        return;
                    }
                };
                accept_loop(listener, exposition).await;
            });
        })?;
    Ok(MetricsServer { addr })
}

async fn accept_loop(listener: TcpListener, exposition: Arc<Exposition>) {
    let slots = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    loop {
        // A slot first: past the bound, connections wait in the kernel's queue.
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, most often: wait rather than spin.
                tracing::debug!("metrics endpoint: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let exposition = Arc::clone(&exposition);
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let exposition = Arc::clone(&exposition);
                async move { Ok::<_, Infallible>(route(&request, &exposition).await) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .max_buf_size(REQUEST_BYTES_MAX)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(REQUEST_TIMEOUT, connection).await;
        });
    }
}

/// The answer to one request.
async fn route(request: &Request<Incoming>, exposition: &Exposition) -> Response<Full<Bytes>> {
    let path = request.uri().path();
    if request.method() != Method::GET {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{}: only GET is served\n", request.method()),
        );
    }
    match path {
        "/metrics" => answer(StatusCode::OK, CONTENT_TYPE, exposition.render().await),
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
        "/status" | "/status.json" => {
            let (format, content_type) = if path == "/status" {
                (StatusFormat::Html, "text/html; charset=utf-8")
            } else {
                (StatusFormat::Json, "application/json")
            };
            match exposition.status(format).await {
                Some(Some(page)) => answer(StatusCode::OK, content_type, page),
                Some(None) => text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("{path}: the coordinator did not answer in time\n"),
                ),
                None => text(
                    StatusCode::NOT_FOUND,
                    format!("{path}: only the chief serves the status page\n"),
                ),
            }
        }
        _ => text(
            StatusCode::NOT_FOUND,
            format!("{path}: not found (try /metrics or /healthz)\n"),
        ),
    }
}

/// `GET http://{addr}{path}` within `timeout` (connecting included): the body of a 200 answer
/// (at most [`GET_BODY_BYTES_MAX`]), or `None` for any other answer or failure. What cohort's
/// own readers of this endpoint use (the benchmark's scrapes, the chaos runner's samples).
pub fn get(addr: SocketAddr, path: &str, timeout: Duration) -> Option<String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .build()
        .into();
    let mut response = agent.get(format!("http://{addr}{path}")).call().ok()?;
    if response.status() != 200 {
        return None;
    }
    response
        .body_mut()
        .with_config()
        .limit(GET_BODY_BYTES_MAX)
        .read_to_string()
        .ok()
}

/// The largest body [`get`] reads.
pub const GET_BODY_BYTES_MAX: u64 = 8 * 1024 * 1024;

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    answer(status, "text/plain", body)
}

fn answer(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE_HEADER, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use super::super::Role;
    use super::*;
    use std::io::{Read, Write};

    fn get(addr: SocketAddr, request: &[u8]) -> String {
        let mut stream = std::net::TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        stream.write_all(request).expect("write");
        let mut text = String::new();
        stream.read_to_string(&mut text).expect("read");
        text
    }

    #[test]
    fn it_serves_metrics_and_health_and_refuses_the_rest() {
        let exposition = Arc::new(Exposition::new(Role::Worker, 3, 9, None));
        let server = serve("127.0.0.1:0".parse().unwrap(), exposition).expect("serve");
        let metrics = get(server.addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(metrics.starts_with("HTTP/1.1 200 OK\r\n"), "{metrics}");
        assert!(
            metrics.contains("cohort_incarnation{role=\"worker\",index=\"3\"} 9"),
            "{metrics}"
        );
        let health = get(server.addr, b"GET /healthz HTTP/1.0\r\n\r\n");
        assert!(health.starts_with("HTTP/1.0 200 OK\r\n"), "{health}");
        let missing = get(server.addr, b"GET /nope HTTP/1.1\r\n\r\n");
        assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
        let status = get(server.addr, b"GET /status.json HTTP/1.1\r\n\r\n");
        assert!(status.starts_with("HTTP/1.1 404"), "{status}");
        assert!(status.contains("only the chief"), "{status}");
        let post = get(server.addr, b"POST /metrics HTTP/1.1\r\n\r\n");
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        let mut long = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
        long.extend(std::iter::repeat_n(b'a', REQUEST_BYTES_MAX + 10));
        let refused = get(server.addr, &long);
        assert!(refused.starts_with("HTTP/1.1 431"), "{refused}");
    }

    #[test]
    fn the_status_page_is_served_where_a_source_is_given() {
        let status: super::super::StatusSource = Arc::new(|format| {
            Box::pin(async move {
                Some(match format {
                    StatusFormat::Json => "{\"step\":1}".to_string(),
                    StatusFormat::Html => "<html></html>".to_string(),
                })
            })
        });
        let exposition = Arc::new(Exposition::new(Role::Chief, 0, 1, None).with_status(status));
        let server = serve("127.0.0.1:0".parse().unwrap(), exposition).expect("serve");
        let json = get(server.addr, b"GET /status.json HTTP/1.1\r\n\r\n");
        assert!(json.starts_with("HTTP/1.1 200 OK\r\n"), "{json}");
        assert!(json.contains("content-type: application/json"), "{json}");
        assert!(json.ends_with("{\"step\":1}"), "{json}");
        let page = get(server.addr, b"GET /status?x=1 HTTP/1.1\r\n\r\n");
        assert!(page.contains("content-type: text/html"), "{page}");
        assert!(page.ends_with("<html></html>"), "{page}");
    }
}
