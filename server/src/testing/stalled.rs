//! Stalled gRPC calls on raw HTTP/2 (the `h2` crate, no gRPC layer), for the connection-layer
//! tests (`server/tests/connections.rs`) and the stalled-stream soak
//! (`bench/src/bin/soak_streams.rs`): a call announces a request message of some length,
//! sends only the first part of it and keeps its stream open, the way a slow or hostile client
//! makes a server hold what it has received so far.

use bytes::Bytes;
use h2::client::{ResponseFuture, SendRequest};
use std::net::SocketAddr;
use tokio::net::TcpStream;

/// Opens an HTTP/2 connection to `addr` (prior knowledge, no TLS) and drives it on a task of
/// its own until the server or the last handle closes it.
///
/// # Errors
/// When the TCP connection or the HTTP/2 handshake fails.
pub async fn connect(
    addr: SocketAddr,
) -> Result<SendRequest<Bytes>, Box<dyn std::error::Error + Send + Sync>> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let (send, conn) = h2::client::handshake(tcp).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(send)
}

/// `message` as a gRPC body: the 5-byte header (uncompressed, its length) and the message.
pub fn grpc_body(message: &[u8]) -> Bytes {
    let mut m = Vec::with_capacity(message.len() + 5);
    m.push(0);
    m.extend_from_slice(&(message.len() as u32).to_be_bytes());
    m.extend_from_slice(message);
    m.into()
}

/// A GetJob request (`sepp.admin.v1`) for job `id`, as a gRPC body.
pub fn get_job_body(id: &str) -> Bytes {
    let mut m = vec![0x0a, id.len() as u8];
    m.extend_from_slice(id.as_bytes());
    grpc_body(&m)
}

/// A gRPC request body of exactly `len` message bytes behind its 5-byte header, that every
/// sepp request type decodes: one length-delimited field numbered 15, which no request
/// message declares and protobuf decoders skip. `len` is at least 2.
pub fn filler_message(len: usize) -> Bytes {
    assert!(len >= 2, "a filler message has at least 2 bytes");
    // Field 15, wire type 2: one tag byte, then the length of the rest as a varint of `k`
    // bytes (padded with continuation bits where that makes the total exact; decoders accept
    // such varints), then the rest.
    let fits = |content: usize, k: usize| k >= 10 || content >> (7 * k) == 0;
    let k = (1..=10)
        .find(|&k| fits(len - 1 - k.min(len - 1), k))
        .expect("a varint has at most 10 bytes");
    let content = len - 1 - k;
    let mut out = Vec::with_capacity(len + 5);
    out.push(0);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    out.push(15 << 3 | 2);
    for i in 0..k {
        let byte = ((content >> (7 * i)) & 0x7f) as u8;
        out.push(if i + 1 < k { byte | 0x80 } else { byte });
    }
    out.resize(len + 5, 0x2a);
    out.into()
}

/// One call whose request body is partly sent.
pub struct StalledCall {
    /// The server's answer, when it comes.
    pub response: ResponseFuture,
    body: h2::SendStream<Bytes>,
    rest: Bytes,
}

/// Opens a call to `path` (e.g. `/sepp.v1.QueueService/GetServerInfo`) whose request is
/// `message` (a gRPC body: 5-byte header and message) and sends its first `sent` bytes without
/// ending the stream. Waits first, as any HTTP/2 client does, while the connection has as many
/// streams open as the server allows.
///
/// # Errors
/// The HTTP/2 error when the connection is gone.
pub async fn open(
    conn: &mut SendRequest<Bytes>,
    path: &str,
    message: Bytes,
    sent: usize,
) -> Result<StalledCall, h2::Error> {
    let request = http::Request::post(format!("http://localhost{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("a valid request");
    let mut ready = conn.clone().ready().await?;
    let (response, mut body) = ready.send_request(request, false)?;
    let sent = sent.min(message.len());
    body.send_data(message.slice(..sent), false)?;
    Ok(StalledCall {
        response,
        body,
        rest: message.slice(sent..),
    })
}

/// Sends a whole call to `path` whose request is `message` (a gRPC body) and ends its stream;
/// returns the answer to come, whose body the caller may leave unread.
///
/// # Errors
/// The HTTP/2 error when the connection is gone.
pub async fn call(
    conn: &mut SendRequest<Bytes>,
    path: &str,
    message: Bytes,
) -> Result<ResponseFuture, h2::Error> {
    let mut call = open(conn, path, message, usize::MAX).await?;
    call.end_here()?;
    Ok(call.response)
}

/// The gRPC status in `headers` (a trailers-only answer's headers, or trailers), if any.
pub fn status_in(headers: &http::HeaderMap) -> Option<(i32, String)> {
    headers.get("grpc-status").map(|code| {
        let code = code
            .to_str()
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(-1);
        let message = headers
            .get("grpc-message")
            .and_then(|m| m.to_str().ok())
            .map(percent_decode)
            .unwrap_or_default();
        (code, message)
    })
}

impl StalledCall {
    /// Sends the rest of the request and ends the stream.
    ///
    /// # Errors
    /// When the stream is gone (the server answered or reset it).
    pub fn finish(&mut self) -> Result<(), h2::Error> {
        let rest = std::mem::take(&mut self.rest);
        self.body.send_data(rest, true)
    }

    /// Ends the stream with the part sent so far: the request is truncated.
    ///
    /// # Errors
    /// When the stream is gone.
    pub fn end_here(&mut self) -> Result<(), h2::Error> {
        self.body.send_data(Bytes::new(), true)
    }

    /// Resets the stream (`RST_STREAM` with `CANCEL`), as a client that gives up does.
    pub fn reset(&mut self) {
        self.body.send_reset(h2::Reason::CANCEL);
    }

    /// The call's gRPC status code and message, from a trailers-only answer's headers or from
    /// the trailers after the reply.
    ///
    /// # Errors
    /// When the stream was reset or the connection closed before the status came.
    pub async fn status(self) -> Result<(i32, String), h2::Error> {
        grpc_status(self.response).await
    }
}

/// The gRPC status of the answer `response` resolves to; `(-1, "")` when it has none.
///
/// # Errors
/// When the stream was reset or the connection closed before the status came.
pub async fn grpc_status(
    response: impl std::future::Future<Output = Result<http::Response<h2::RecvStream>, h2::Error>>,
) -> Result<(i32, String), h2::Error> {
    let (parts, mut body) = response.await?.into_parts();
    if let Some(s) = status_in(&parts.headers) {
        return Ok(s);
    }
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    Ok(body
        .trailers()
        .await?
        .as_ref()
        .and_then(status_in)
        .unwrap_or((-1, String::new())))
}

/// Decodes a `grpc-message` header value (percent-encoded).
pub fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn filler_messages_have_the_length_asked_and_decode_as_any_request() {
        for len in [2, 3, 127, 128, 129, 130, 16_383, 16_384, 16_385, 700 * 1024] {
            let body = filler_message(len);
            assert_eq!(body.len(), len + 5, "{len}");
            assert_eq!(
                u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize,
                len
            );
            sepp_proto::v1::GetServerInfoRequest::decode(&body[5..]).expect("decodes");
            sepp_proto::v1::EnqueueBatchRequest::decode(&body[5..]).expect("decodes");
        }
    }
}
