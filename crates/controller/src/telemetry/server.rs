//! The controller's HTTP endpoints on `--metrics-address`: `/metrics` (the
//! [`Telemetry`] in OpenMetrics text), `/healthz` and `/readyz` (ready once the first
//! full list of DistributedLocks was seen). A tiny HTTP/1.1 server: one request per
//! connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::Telemetry;

/// Binds `addr` and serves `/metrics`, `/healthz` and `/readyz` on a task of its own.
/// Returns the bound address (useful with port 0).
pub async fn serve(addr: SocketAddr, telemetry: Arc<Telemetry>) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tracing::info!(address = %bound, "serving /metrics, /healthz, /readyz");
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let telemetry = telemetry.clone();
                    tokio::spawn(async move {
                        let _ = tokio::time::timeout(
                            Duration::from_secs(10),
                            handle(stream, &telemetry),
                        )
                        .await;
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "metrics server: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    });
    Ok(bound)
}

/// One request per connection: read the head, answer with Content-Length, close.
async fn handle(mut stream: TcpStream, telemetry: &Telemetry) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > 16 * 1024 {
            break;
        }
    }
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let text = "text/plain; charset=utf-8";
    let (status, content_type, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            telemetry.encode(),
        ),
        ("GET" | "HEAD", "/healthz") => ("200 OK", text, "ok\n".to_string()),
        ("GET" | "HEAD", "/readyz") if telemetry.is_ready() => ("200 OK", text, "ok\n".into()),
        ("GET" | "HEAD", "/readyz") => (
            "503 Service Unavailable",
            text,
            "not ready: DistributedLocks not listed yet\n".into(),
        ),
        ("GET" | "HEAD", _) => ("404 Not Found", text, "not found\n".into()),
        _ => (
            "405 Method Not Allowed",
            text,
            "method not allowed\n".into(),
        ),
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if method != "HEAD" {
        response.extend_from_slice(body.as_bytes());
    }
    stream.write_all(&response).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockwarden_api::LockPhase;

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        stream.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn readiness_and_phase_gauge() {
        let telemetry = Arc::new(Telemetry::new());
        let addr = serve(([127, 0, 0, 1], 0).into(), telemetry.clone())
            .await
            .unwrap();
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200 "));
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 503 "));
        telemetry.set_ready();
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200 "));

        telemetry.set_phase("a", Some(LockPhase::Waiting));
        telemetry.set_phase("a", Some(LockPhase::Held));
        telemetry.set_phase("b", Some(LockPhase::Held));
        telemetry.set_phase("b", Some(LockPhase::Held));
        telemetry.set_phase("c", None);
        let metrics = get(addr, "/metrics").await;
        assert!(
            metrics.contains("lockwarden_locks{phase=\"Held\"} 2\n"),
            "{metrics}"
        );
        assert!(
            metrics.contains("lockwarden_locks{phase=\"Waiting\"} 0\n"),
            "{metrics}"
        );
        telemetry.set_phase("a", None);
        assert!(
            telemetry
                .encode()
                .contains("lockwarden_locks{phase=\"Held\"} 1\n")
        );
    }
}
