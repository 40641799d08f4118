//! Tests of the direct path against a scripted server: connection reuse, framing, answers
//! that send it back to the general client.

use super::*;
use object_store::StaticCredentialProvider;
use std::collections::VecDeque;
use tokio::net::TcpListener;

fn s3(endpoint: &str) -> S3Config {
    serde_json::from_value(
        serde_json::json!({"bucket": "examplebucket", "endpoint_override": endpoint}),
    )
    .unwrap()
}

fn provider() -> AwsCredentialProvider {
    let credential = AwsCredential {
        key_id: "AKIAIOSFODNN7EXAMPLE".into(),
        secret_key: "secret".into(),
        token: None,
    };
    Arc::new(StaticCredentialProvider::new(credential))
}

#[test]
fn only_path_style_http_and_https_endpoints_take_the_direct_path() {
    let make = |endpoint: &str, edit: &dyn Fn(&mut S3Config)| {
        let mut config = s3(endpoint);
        edit(&mut config);
        DirectHttp::new(&config, endpoint, "us-east-1", provider())
            .map(|d| d.target.address.clone())
    };
    let none = |_: &mut S3Config| {};
    assert_eq!(
        make("http://127.0.0.1:9000", &none).as_deref(),
        Some("127.0.0.1:9000")
    );
    assert_eq!(make("http://minio/", &none).as_deref(), Some("minio:80"));
    assert_eq!(make("http://[::1]", &none).as_deref(), Some("[::1]:80"));
    assert_eq!(
        make("http://[::1]:9000", &none).as_deref(),
        Some("[::1]:9000")
    );
    assert_eq!(
        make("https://127.0.0.1:9000", &|c| c.allow_http = false).as_deref(),
        Some("127.0.0.1:9000")
    );
    assert_eq!(
        make("https://s3.example.com", &none).as_deref(),
        Some("s3.example.com:443")
    );
    assert_eq!(
        make("https://127.0.0.1:9000", &|c| c.ca_bundle =
            "/nonexistent/ca.pem".into()),
        None
    );
    assert_eq!(make("https://gateway:8443/s3", &none), None);
    assert_eq!(make("http://gateway:8080/s3", &none), None);
    assert_eq!(make("http://127.0.0.1:9000\r\nX: 1", &none), None);
    assert_eq!(
        make("http://127.0.0.1:9000", &|c| c.direct_http = false),
        None
    );
    assert_eq!(
        make("http://127.0.0.1:9000", &|c| c.use_virtual_addressing =
            true),
        None
    );
    assert_eq!(
        make("http://127.0.0.1:9000", &|c| c.allow_http = false),
        None
    );
    let config = s3("http://127.0.0.1:9000");
    assert!(DirectHttp::new(&config, "http://127.0.0.1:9000", "us-east-1\n", provider()).is_none());
}

/// One scripted answer: bytes sent at once, then bytes sent when the test says so
/// ([`Scripted::send_later`]).
struct ScriptedReply {
    now: Vec<u8>,
    later: Vec<u8>,
}

fn reply(now: &str) -> ScriptedReply {
    ScriptedReply {
        now: now.as_bytes().to_vec(),
        later: Vec::new(),
    }
}

/// A server that answers each request head with the next scripted answer, and records
/// which connection (by accept order) carried each request.
struct Scripted {
    direct: Arc<DirectHttp>,
    served: Arc<Mutex<Vec<(usize, String)>>>,
    /// Lets the server send a reply's `later` bytes.
    later_go: Arc<tokio::sync::Notify>,
    /// Told once they were written.
    later_sent: Arc<tokio::sync::Notify>,
}

async fn scripted(answers: Vec<ScriptedReply>) -> Scripted {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let answers = Arc::new(Mutex::new(VecDeque::from(answers)));
    let served = Arc::new(Mutex::new(Vec::new()));
    let record = served.clone();
    let later_go = Arc::new(tokio::sync::Notify::new());
    let later_sent = Arc::new(tokio::sync::Notify::new());
    let (go, sent) = (later_go.clone(), later_sent.clone());
    tokio::spawn(async move {
        for id in 0.. {
            let (mut conn, _) = listener.accept().await.unwrap();
            let answers = answers.clone();
            let record = record.clone();
            let (go, sent) = (go.clone(), sent.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let mut piece = [0u8; 4096];
                    let n = conn.read(&mut piece).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&piece[..n]);
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_string();
                    buf.drain(..end + 4);
                    let line = head.lines().next().unwrap_or_default().to_string();
                    record.lock().unwrap().push((id, line));
                    let Some(answer) = answers.lock().unwrap().pop_front() else {
                        return;
                    };
                    if conn.write_all(&answer.now).await.is_err() {
                        return;
                    }
                    if !answer.later.is_empty() {
                        go.notified().await;
                        let _ = conn.write_all(&answer.later).await;
                        sent.notify_one();
                    }
                }
            });
        }
    });
    let direct = DirectHttp::new(&s3(&endpoint), &endpoint, "us-east-1", provider()).unwrap();
    Scripted {
        direct,
        served,
        later_go,
        later_sent,
    }
}

impl Scripted {
    /// Has the server send the pending reply's `later` bytes, and returns once they
    /// are written (on loopback, in the client's socket buffer).
    async fn send_later(&self) {
        self.later_go.notify_one();
        self.later_sent.notified().await;
    }

    /// The connection each request went on.
    fn connections(&self) -> Vec<usize> {
        self.served
            .lock()
            .unwrap()
            .iter()
            .map(|(id, _)| *id)
            .collect()
    }
}

const OK_10: &str = "HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\n\
                     Content-Range: bytes 0-9/10\r\nx-amz-meta-kvtier-crc32c: 0000beef\r\n\r\n\
                     0123456789";

async fn get(s: &Scripted) -> Result<(Option<u32>, u32), DirectError> {
    let mut block = [0u8; 10];
    let got = s
        .direct
        .get_into(
            "kv/a",
            &mut BlockSlot::of_buffer(&mut block),
            true,
            &Link::default(),
            Lane::ALONE,
        )
        .await;
    if got.is_ok() {
        assert_eq!(&block, b"0123456789");
    }
    got
}

#[tokio::test]
async fn clean_exchanges_reuse_one_connection() {
    let s = scripted(vec![
        reply(OK_10),
        reply("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n"),
        reply(
            "HTTP/1.1 404 Not Found\r\nContent-Length: 44\r\n\r\n\
             <Error><Code>NoSuchKey</Code></Error>\n\n\n\n\n\n\n",
        ),
        reply("HTTP/1.1 404 Not Found\r\nConnection: keep-alive\r\n\r\n"),
        reply(OK_10),
    ])
    .await;
    assert_eq!(
        get(&s).await.unwrap(),
        (Some(0xbeef), crc32c::crc32c(b"0123456789"))
    );
    assert!(s.direct.exists("kv/a", false).await.unwrap());
    assert!(matches!(
        get(&s).await,
        Err(DirectError::Final(Status::NotFound, _))
    ));
    assert!(!s.direct.exists("kv/b", false).await.unwrap());
    get(&s).await.unwrap();
    assert_eq!(s.connections(), [0, 0, 0, 0, 0]);
    let served = s.served.lock().unwrap().clone();
    assert_eq!(served[0].1, "GET /examplebucket/kv/a HTTP/1.1");
    assert_eq!(served[1].1, "HEAD /examplebucket/kv/a HTTP/1.1");
}

#[tokio::test]
async fn unread_bytes_or_close_retire_the_connection() {
    let s = scripted(vec![
        // Bytes after the body, read with it.
        reply(&format!("{OK_10}HTTP/1.1 200 OK\r\n")),
        // Bytes after the body that arrive later: found when the connection is taken.
        ScriptedReply {
            now: OK_10.as_bytes().to_vec(),
            later: b"junk".to_vec(),
        },
        // Bytes after a HEAD's head.
        reply("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789"),
        // An error body followed by more bytes.
        reply("HTTP/1.1 503 Slow Down\r\nContent-Length: 2\r\n\r\nabcd"),
        // close anywhere in the Connection list.
        reply("HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\n\r\n"),
        reply(OK_10),
    ])
    .await;
    get(&s).await.unwrap();
    get(&s).await.unwrap();
    s.send_later().await;
    assert!(s.direct.exists("kv/a", false).await.unwrap());
    assert!(matches!(get(&s).await, Err(DirectError::Fallback(_))));
    assert!(s.direct.exists("kv/a", false).await.unwrap());
    get(&s).await.unwrap();
    assert_eq!(s.connections(), [0, 1, 2, 3, 4, 5]);
}

#[tokio::test]
async fn ambiguous_answers_fall_back_and_retire_the_connection() {
    let s = scripted(vec![
        reply(
            "HTTP/1.1 206 Partial Content\r\nTransfer-Encoding: chunked\r\n\r\n\
             a\r\n0123456789\r\n0\r\n\r\n",
        ),
        reply(
            "HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\n\
             Content-Length: 11\r\n\r\n0123456789",
        ),
        reply(
            "HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\n\
             Transfer-Encoding: chunked\r\n\r\n",
        ),
        reply("HTTP/1.1 206 Partial Content\r\nContent-Length: +10\r\n\r\n0123456789"),
        reply("HTTP/1.0 206 Partial Content\r\nContent-Length: 10\r\n\r\n0123456789"),
        reply("HTTP/1.1 206 Partial Content\r\n\r\n0123456789"),
        reply("HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"),
        reply(OK_10),
    ])
    .await;
    for case in 0..6 {
        assert!(
            matches!(get(&s).await, Err(DirectError::Fallback(_))),
            "case {case}"
        );
    }
    assert!(matches!(
        s.direct.exists("kv/a", false).await,
        Err(DirectError::Fallback(_))
    ));
    get(&s).await.unwrap();
    assert_eq!(s.connections(), [0, 1, 2, 3, 4, 5, 6, 7]);
}

#[tokio::test]
async fn a_body_of_another_length_fails_the_key() {
    let s = scripted(vec![
        reply(
            "HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\n\
             Content-Range: bytes 0-9/44\r\n\r\n0123456789",
        ),
        reply("HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n0123456789ab"),
        reply(OK_10),
    ])
    .await;
    assert!(matches!(get(&s).await, Err(DirectError::WrongLength(44))));
    assert!(matches!(get(&s).await, Err(DirectError::WrongLength(12))));
    get(&s).await.unwrap();
    assert_eq!(s.connections(), [0, 1, 2]);
}
