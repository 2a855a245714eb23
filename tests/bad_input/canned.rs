//! A tiny HTTP server that answers every request with a canned response chosen by the
//! test: for checking how *our* code reads status codes and bodies no real backend
//! sends on demand (500, 503, 403, 301, bytes that are not HTTP). It says nothing
//! about a backend's behaviour: everything else is tested against the real servers.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// One request as received.
#[derive(Clone, Debug)]
#[allow(dead_code)] // Each test binary reads the parts it needs.
pub struct Request {
    pub method: String,
    pub path: String,
    /// Header names lowercased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

type Responder = dyn Fn(&Request) -> Vec<u8> + Send + Sync;

/// The server; it runs until the test binary exits.
pub struct Canned {
    port: u16,
    requests: Arc<Mutex<Vec<Request>>>,
}

impl Canned {
    /// Starts a server on a free loopback port; `respond` gives the raw bytes written
    /// back for each request (the connection is closed after them).
    pub fn start(respond: impl Fn(&Request) -> Vec<u8> + Send + Sync + 'static) -> Canned {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind canned server");
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let respond: Arc<Responder> = Arc::new(respond);
        let seen = requests.clone();
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let respond = respond.clone();
                let seen = seen.clone();
                thread::spawn(move || serve(stream, &*respond, &seen));
            }
        });
        Canned { port, requests }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }
}

fn serve(mut stream: TcpStream, respond: &Responder, seen: &Mutex<Vec<Request>>) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let Some(request) = read_request(&mut stream) else {
        return;
    };
    let response = respond(&request);
    seen.lock().unwrap().push(request);
    let _ = stream.write_all(&response);
    let _ = stream.flush();
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

fn read_request(stream: &mut TcpStream) -> Option<Request> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = stream.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_string();
    let path = first.next()?.to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < length {
        let n = stream.read(&mut chunk).ok()?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some(Request {
        method,
        path,
        headers,
        body,
    })
}

/// An HTTP/1.1 response with a body and extra headers.
pub fn response(status: u16, reason: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {status} {reason}\r\n");
    for (name, value) in headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    ));
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// An S3-style XML error response.
pub fn s3_error(status: u16, reason: &str, code: &str) -> Vec<u8> {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code><Message>canned {code}</Message><RequestId>canned</RequestId></Error>"
    );
    response(
        status,
        reason,
        &[("Content-Type", "application/xml")],
        body.as_bytes(),
    )
}

/// A DynamoDB-style JSON error response.
pub fn dynamodb_error(status: u16, reason: &str, code: &str) -> Vec<u8> {
    let body = format!(
        r#"{{"__type":"com.amazonaws.dynamodb.v20120810#{code}","message":"canned {code}"}}"#
    );
    response(
        status,
        reason,
        &[
            ("Content-Type", "application/x-amz-json-1.0"),
            ("x-amzn-RequestId", "canned"),
        ],
        body.as_bytes(),
    )
}
