//! Request heads on the direct path: an `http::Request`, signed with SigV4 by
//! `object_store`'s own [`AwsAuthorizer`], then written out as an HTTP/1.1 head.
//!
//! Everything that goes into a head is checked first: the endpoint when the direct path is
//! built (`url` parses it the way `object_store`'s client does, after control characters
//! were refused, since URL parsing would silently drop CR, LF and tabs), and the credential
//! on each request (the signer panics on a header value it cannot hold).

use http::{header, Method, Request};
use object_store::aws::{AwsAuthorizer, AwsCredential};
use object_store::client::{CryptoProvider, HttpRequestBody};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use url::{Position, Url};

/// SigV4's URI encoding: every byte but the unreserved `A-Za-z0-9-_.~` is percent-encoded
/// (`object_store`'s `STRICT_ENCODE_SET`). For the bucket name.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');
/// The same with `/` kept, for an object name (`object_store`'s `STRICT_PATH_ENCODE_SET`).
const PATH: &AsciiSet = &SEGMENT.remove(b'/');

/// The service name in the SigV4 scope.
const SERVICE: &str = "s3";

/// Where the direct path sends requests, and how it signs them.
#[derive(Debug)]
pub(super) struct Target {
    /// `host[:port]` as `url` normalises it (lowercase, no default port): the Host header,
    /// and the host `AwsAuthorizer` signs.
    host: String,
    /// `host:port` to connect to.
    pub(super) address: String,
    /// The host name or IP address alone (no brackets, no port): the name a TLS server's
    /// certificate is checked against, and the SNI sent.
    pub(super) host_name: String,
    /// Whether the endpoint is `https`.
    pub(super) tls: bool,
    /// `/<bucket>/`, percent-encoded.
    bucket_path: String,
    region: String,
}

/// Why an endpoint gets no direct path.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Unusable {
    /// Not an http or https endpoint with path-style addressing: `object_store` serves it.
    NotApplicable(&'static str),
    /// A value that cannot be put into a request head.
    Invalid(String),
}

impl Target {
    /// The target of `endpoint_url` (`http[s]://host[:port]`, no path) and `bucket`.
    pub(super) fn new(endpoint_url: &str, bucket: &str, region: &str) -> Result<Target, Unusable> {
        use Unusable::*;
        if endpoint_url.chars().any(char::is_control) {
            return Err(Invalid("the endpoint holds a control character".into()));
        }
        if !region.bytes().all(is_header_token_byte) || region.is_empty() {
            return Err(Invalid(format!(
                "the region {region:?} is not printable ASCII without blanks"
            )));
        }
        if bucket.is_empty() || bucket == "." || bucket == ".." {
            return Err(Invalid(format!("the bucket name {bucket:?}")));
        }
        let url = Url::parse(endpoint_url).map_err(|_| NotApplicable("not a URL"))?;
        let tls = match url.scheme() {
            "http" => false,
            "https" => true,
            _ => return Err(NotApplicable("neither http nor https")),
        };
        if !matches!(url.path(), "" | "/") || url.query().is_some() || url.fragment().is_some() {
            return Err(NotApplicable("an endpoint with a path"));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(NotApplicable("an endpoint with user information"));
        }
        let (Some(host_name), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
            return Err(NotApplicable("an endpoint without a host"));
        };
        let bare_host = match url.host() {
            Some(url::Host::Ipv6(ip)) => ip.to_string(),
            _ => host_name.to_string(),
        };
        Ok(Target {
            host: url[Position::BeforeHost..Position::AfterPort].to_string(),
            address: format!("{host_name}:{port}"),
            host_name: bare_host,
            tls,
            bucket_path: format!("/{}/", utf8_percent_encode(bucket, SEGMENT)),
            region: region.to_string(),
        })
    }

    /// A signed request head: `GET` with `Range: bytes=start-(start+len-1)` for a range
    /// `(start, len)`, or `HEAD`. The payload is declared `UNSIGNED-PAYLOAD`. An `Err` is a
    /// reason to leave the request to `object_store`.
    pub(super) fn head(
        &self,
        method: Method,
        name: &str,
        range: Option<(usize, usize)>,
        credential: &AwsCredential,
    ) -> Result<Vec<u8>, String> {
        self.signed_head(method, name, range, &[], credential, false, None)
    }

    /// A signed `PUT` head for a body of `content_length` bytes, with `headers` (lowercase
    /// names) signed too. The payload is declared `UNSIGNED-PAYLOAD`: the body's integrity
    /// is the checksum header's job, as on the general client's PUTs.
    pub(super) fn put_head(
        &self,
        name: &str,
        content_length: usize,
        mut headers: Vec<(String, String)>,
        credential: &AwsCredential,
    ) -> Result<Vec<u8>, String> {
        headers.push(("content-length".to_string(), content_length.to_string()));
        self.signed_head(Method::PUT, name, None, &headers, credential, false, None)
    }

    /// [`Target::head`] with `headers` added (and signed, but for `content-length`, which
    /// SigV4 leaves out), signing the (empty) payload's SHA-256 instead when `sign_payload`,
    /// with `crypto` instead of `object_store`'s default provider when given.
    #[allow(clippy::too_many_arguments)]
    fn signed_head(
        &self,
        method: Method,
        name: &str,
        range: Option<(usize, usize)>,
        headers: &[(String, String)],
        credential: &AwsCredential,
        sign_payload: bool,
        crypto: Option<&dyn CryptoProvider>,
    ) -> Result<Vec<u8>, String> {
        if !credential.key_id.bytes().all(is_header_token_byte) {
            return Err("the access key id is not printable ASCII without blanks".into());
        }
        if let Some(token) = &credential.token {
            if !token.bytes().all(is_header_token_byte) {
                return Err("the session token is not printable ASCII without blanks".into());
            }
        }
        // `url` (which the signer parses the URI with) would remove dot segments, so the
        // signed path would not be the path sent. Valid object paths have none.
        if name
            .split('/')
            .any(|segment| segment == "." || segment == "..")
        {
            return Err(format!("object name {name:?} has a dot segment"));
        }
        let path = format!("{}{}", self.bucket_path, utf8_percent_encode(name, PATH));
        let mut builder = Request::builder().method(method).uri(format!(
            "{}://{}{path}",
            if self.tls { "https" } else { "http" },
            self.host
        ));
        if let Some((start, len)) = range {
            let last = len
                .checked_sub(1)
                .and_then(|n| n.checked_add(start))
                .ok_or("an empty range")?;
            builder = builder.header(header::RANGE, format!("bytes={start}-{last}"));
        }
        for (name, value) in headers {
            builder = builder.header(name.as_str(), value.as_str());
        }
        let mut request = builder
            .body(HttpRequestBody::empty())
            .map_err(|e| format!("request for {name:?}: {e}"))?;
        let mut authorizer =
            AwsAuthorizer::new(credential, SERVICE, &self.region).with_sign_payload(sign_payload);
        if let Some(crypto) = crypto {
            authorizer = authorizer.with_crypto(crypto);
        }
        authorizer
            .try_authorize(&mut request, None)
            .map_err(|e| format!("signing: {e}"))?;
        // The signer signed `host` and took it out again: it goes first.
        let mut head = Vec::with_capacity(512);
        head.extend_from_slice(request.method().as_str().as_bytes());
        head.push(b' ');
        head.extend_from_slice(request.uri().path().as_bytes());
        head.extend_from_slice(b" HTTP/1.1\r\nhost: ");
        head.extend_from_slice(self.host.as_bytes());
        head.extend_from_slice(b"\r\n");
        for (name, value) in request.headers() {
            // `HeaderValue` cannot hold CR, LF or NUL; `header_line` also refuses any other
            // control character.
            header_line(&mut head, name.as_str(), value.as_bytes())?;
        }
        head.extend_from_slice(b"\r\n");
        Ok(head)
    }
}

/// A byte of a header value that needs no quoting and no care: printable ASCII, no blank.
fn is_header_token_byte(b: u8) -> bool {
    b.is_ascii_graphic()
}

fn header_line(head: &mut Vec<u8>, name: &str, value: &[u8]) -> Result<(), String> {
    if value.iter().any(|&b| b.is_ascii_control() || !b.is_ascii()) {
        return Err(format!("header {name} holds a control or non-ASCII byte"));
    }
    head.extend_from_slice(name.as_bytes());
    head.extend_from_slice(b": ");
    head.extend_from_slice(value);
    head.extend_from_slice(b"\r\n");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::client::{
        DigestAlgorithm, DigestContext, HmacContext, Signer, SigningAlgorithm,
    };

    fn credential(token: Option<&str>) -> AwsCredential {
        AwsCredential {
            key_id: "AKIAIOSFODNN7EXAMPLE".into(),
            secret_key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into(),
            token: token.map(str::to_string),
        }
    }

    fn target(endpoint: &str) -> Target {
        Target::new(endpoint, "examplebucket", "us-east-1").unwrap()
    }

    fn text(head: Vec<u8>) -> String {
        String::from_utf8(head).unwrap()
    }

    /// A crypto provider (aws-lc-rs, as `object_store`'s default) that signs as if the
    /// clock read `2013-05-24T00:00:00Z`: it puts that date and time wherever the signer
    /// hashes the current ones (the `x-amz-date` line of the canonical request, the date
    /// of the key derivation, the string to sign). `AwsAuthorizer` takes its time from the
    /// clock, and this lets a test check it against AWS's published examples.
    #[derive(Debug)]
    struct PinnedClock;

    const PINNED_DATE: &str = "20130524";
    const PINNED_DATETIME: &str = "20130524T000000Z";

    fn pin(data: &[u8]) -> Vec<u8> {
        let text = String::from_utf8(data.to_vec()).unwrap();
        if text.len() == 8 && text.bytes().all(|b| b.is_ascii_digit()) {
            return PINNED_DATE.into(); // the first step of the key derivation
        }
        let mut lines: Vec<String> = text.split('\n').map(str::to_string).collect();
        if lines[0] == "AWS4-HMAC-SHA256" {
            lines[1] = PINNED_DATETIME.into();
            lines[2] = format!("{PINNED_DATE}{}", &lines[2][8..]);
        }
        for line in &mut lines {
            if line.starts_with("x-amz-date:") {
                *line = format!("x-amz-date:{PINNED_DATETIME}");
            }
        }
        lines.join("\n").into_bytes()
    }

    struct Pinned {
        key: Option<Vec<u8>>,
        data: Vec<u8>,
        out: Vec<u8>,
    }

    impl Pinned {
        fn compute(&mut self) -> &[u8] {
            let data = pin(&self.data);
            self.out = match &self.key {
                Some(key) => {
                    let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, key);
                    aws_lc_rs::hmac::sign(&key, &data).as_ref().to_vec()
                }
                None => aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &data)
                    .as_ref()
                    .to_vec(),
            };
            &self.out
        }
    }

    impl DigestContext for Pinned {
        fn update(&mut self, data: &[u8]) {
            self.data.extend_from_slice(data);
        }
        fn finish(&mut self) -> object_store::Result<&[u8]> {
            Ok(self.compute())
        }
    }

    impl HmacContext for Pinned {
        fn update(&mut self, data: &[u8]) {
            self.data.extend_from_slice(data);
        }
        fn finish(&mut self) -> object_store::Result<&[u8]> {
            Ok(self.compute())
        }
    }

    impl CryptoProvider for PinnedClock {
        fn digest(&self, _: DigestAlgorithm) -> object_store::Result<Box<dyn DigestContext>> {
            Ok(Box::new(Pinned {
                key: None,
                data: Vec::new(),
                out: Vec::new(),
            }))
        }
        fn hmac(
            &self,
            _: DigestAlgorithm,
            secret: &[u8],
        ) -> object_store::Result<Box<dyn HmacContext>> {
            Ok(Box::new(Pinned {
                key: Some(secret.to_vec()),
                data: Vec::new(),
                out: Vec::new(),
            }))
        }
        fn sign(&self, _: SigningAlgorithm, _: &[u8]) -> object_store::Result<Box<dyn Signer>> {
            Err(object_store::Error::NotSupported {
                source: "no signing in this test".into(),
            })
        }
    }

    /// The "GET Object" example of AWS's SigV4 documentation for S3 (header-based auth):
    /// <https://docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html>.
    #[test]
    fn signature_matches_the_aws_get_object_example() {
        let mut target = target("http://examplebucket.s3.amazonaws.com");
        target.bucket_path = "/".into(); // the example is virtual-hosted
        let head = target
            .signed_head(
                Method::GET,
                "test.txt",
                Some((0, 10)),
                &[],
                &credential(None),
                true,
                Some(&PinnedClock),
            )
            .unwrap();
        let head = text(head);
        assert!(
            head.starts_with("GET /test.txt HTTP/1.1\r\nhost: examplebucket.s3.amazonaws.com\r\n"),
            "{head}"
        );
        assert!(head.contains("\r\nrange: bytes=0-9\r\n"), "{head}");
        assert!(
            head.contains(
                "\r\nx-amz-content-sha256: \
                 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\r\n"
            ),
            "{head}"
        );
        assert!(head.contains("Credential=AKIAIOSFODNN7EXAMPLE/"), "{head}");
        assert!(
            head.contains(
                "/us-east-1/s3/aws4_request, \
                 SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, \
                 Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41\r\n"
            ),
            "{head}"
        );
        assert!(
            head.ends_with("\r\n\r\n") && !head[..head.len() - 4].contains("\r\n\r\n"),
            "{head}"
        );
    }

    #[test]
    fn heads_are_signed_unsigned_payload_with_the_token() {
        let target = target("http://127.0.0.1:9000");
        let head = text(
            target
                .head(Method::HEAD, "kv/a b", None, &credential(Some("tok/en+==")))
                .unwrap(),
        );
        assert!(
            head.starts_with("HEAD /examplebucket/kv/a%20b HTTP/1.1\r\nhost: 127.0.0.1:9000\r\n"),
            "{head}"
        );
        assert!(
            head.contains("\r\nx-amz-content-sha256: UNSIGNED-PAYLOAD\r\n"),
            "{head}"
        );
        assert!(
            head.contains("\r\nx-amz-security-token: tok/en+==\r\n"),
            "{head}"
        );
        assert!(
            head.contains(
                "SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-security-token,"
            ),
            "{head}"
        );
        assert!(!head.contains("range"), "{head}");
    }

    #[test]
    fn names_are_encoded_as_sigv4_and_object_store_encode_them() {
        let target = target("http://127.0.0.1:9000");
        let line = |name: &str| {
            let head = text(
                target
                    .head(Method::HEAD, name, None, &credential(None))
                    .unwrap(),
            );
            head.lines().next().unwrap().to_string()
        };
        assert_eq!(
            line("a/b_c-d.e~f"),
            "HEAD /examplebucket/a/b_c-d.e~f HTTP/1.1"
        );
        assert_eq!(
            line("a=b+c@d,e f"),
            "HEAD /examplebucket/a%3Db%2Bc%40d%2Ce%20f HTTP/1.1"
        );
        assert_eq!(
            line("kv/modèle_0/x"),
            "HEAD /examplebucket/kv/mod%C3%A8le_0/x HTTP/1.1"
        );
        assert_eq!(
            line("100%/?#[]"),
            "HEAD /examplebucket/100%25/%3F%23%5B%5D HTTP/1.1"
        );
        assert_eq!(
            line("back\\slash"),
            "HEAD /examplebucket/back%5Cslash HTTP/1.1"
        );
        assert_eq!(
            line("a..b/.c/d."),
            "HEAD /examplebucket/a..b/.c/d. HTTP/1.1"
        );
        let bucket = Target::new("http://h", "a/b c", "r").unwrap();
        assert_eq!(bucket.bucket_path, "/a%2Fb%20c/");
    }

    #[test]
    fn dot_segments_are_left_to_object_store() {
        let target = target("http://127.0.0.1:9000");
        for name in ["a/../b", "./a", "a/.", ".."] {
            assert!(
                target
                    .head(Method::HEAD, name, None, &credential(None))
                    .is_err(),
                "{name}"
            );
        }
    }

    #[test]
    fn endpoints_are_normalised_as_url_does() {
        let t = target("http://127.0.0.1:9000");
        assert_eq!(
            (t.host.as_str(), t.address.as_str()),
            ("127.0.0.1:9000", "127.0.0.1:9000")
        );
        let t = target("http://MinIO.local/");
        assert_eq!(
            (t.host.as_str(), t.address.as_str()),
            ("minio.local", "minio.local:80")
        );
        let t = target("http://127.0.0.1:80");
        assert_eq!(
            (t.host.as_str(), t.address.as_str()),
            ("127.0.0.1", "127.0.0.1:80")
        );
        let t = target("http://[::1]");
        assert_eq!((t.host.as_str(), t.address.as_str()), ("[::1]", "[::1]:80"));
        let t = target("http://[0:0::1]:9000");
        assert_eq!(
            (t.host.as_str(), t.address.as_str()),
            ("[::1]:9000", "[::1]:9000")
        );
        assert!(!t.tls && t.host_name == "::1");
        let t = target("https://S3.Example.com");
        assert_eq!(
            (t.host.as_str(), t.address.as_str(), t.host_name.as_str()),
            ("s3.example.com", "s3.example.com:443", "s3.example.com")
        );
        assert!(t.tls);
        let t = target("https://127.0.0.1:9443/");
        assert_eq!(
            (t.host.as_str(), t.address.as_str(), t.host_name.as_str()),
            ("127.0.0.1:9443", "127.0.0.1:9443", "127.0.0.1")
        );
        let t = target("https://[::1]:443");
        assert_eq!(
            (t.host.as_str(), t.address.as_str(), t.host_name.as_str()),
            ("[::1]", "[::1]:443", "::1")
        );
        let not_applicable = |endpoint: &str| {
            assert!(
                matches!(
                    Target::new(endpoint, "b", "r"),
                    Err(Unusable::NotApplicable(_))
                ),
                "{endpoint}"
            )
        };
        not_applicable("ftp://127.0.0.1:9000");
        not_applicable("https://gateway:8080/s3");
        not_applicable("http://gateway:8080/s3");
        not_applicable("http://gateway:8080/?x=1");
        not_applicable("http://user:pw@gateway:8080");
        not_applicable("127.0.0.1:9000");
        not_applicable("http://");
    }

    #[test]
    fn control_characters_never_reach_a_head() {
        let invalid = |endpoint: &str, bucket: &str, region: &str| {
            assert!(
                matches!(
                    Target::new(endpoint, bucket, region),
                    Err(Unusable::Invalid(_))
                ),
                "{endpoint:?} {bucket:?} {region:?}"
            )
        };
        invalid("http://host\r\nX-Injected: 1", "b", "r");
        invalid("http://ho\nst:9000", "b", "r");
        invalid("http://ho\tst", "b", "r");
        invalid("http://host\u{7f}", "b", "r");
        invalid("http://host\u{85}", "b", "r");
        invalid("http://host", "b", "us-east-1\r\nX: 1");
        invalid("http://host", "b", "us east");
        invalid("http://host", "b", "régiön");
        invalid("http://host", "b", "");
        invalid("http://host", "..", "r");
        let target = target("http://127.0.0.1:9000");
        for token in ["a\r\nX-Injected: 1", "a\nb", "a\tb", "a b", "tök", "a\u{0}"] {
            let why = target
                .head(Method::HEAD, "k", None, &credential(Some(token)))
                .unwrap_err();
            assert!(why.contains("session token"), "{token:?}: {why}");
        }
        let mut bad_key = credential(None);
        bad_key.key_id = "AKIA\r\nX: 1".into();
        assert!(target.head(Method::HEAD, "k", None, &bad_key).is_err());
    }

    /// What `object_store` itself sends for a HEAD of `name`, as a listening socket sees it.
    fn object_store_request_line(path: &object_store::path::Path) -> (String, String) {
        use object_store::ObjectStoreExt;
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (conn, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(conn);
            let mut lines = Vec::new();
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                if line == "\r\n" || line.is_empty() {
                    break;
                }
                lines.push(line.trim_end().to_string());
            }
            let mut conn = reader.into_inner();
            conn.write_all(
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            )
            .unwrap();
            lines
        });
        let store = object_store::aws::AmazonS3Builder::new()
            .with_bucket_name("examplebucket")
            .with_endpoint(format!("http://127.0.0.1:{port}"))
            .with_allow_http(true)
            .with_region("us-east-1")
            .with_access_key_id("AKIAIOSFODNN7EXAMPLE")
            .with_secret_access_key("secret")
            .build()
            .unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _ = runtime.block_on(store.head(path));
        let lines = server.join().unwrap();
        let host = lines
            .iter()
            .find_map(|l| {
                l.split_once(": ")
                    .filter(|(k, _)| k.eq_ignore_ascii_case("host"))
            })
            .map(|(_, v)| v.to_string())
            .unwrap_or_default();
        (lines[0].clone(), host)
    }

    /// Object names with non-ASCII letters, blanks, `+`, `=` and other reserved characters
    /// go out on the direct path exactly as `object_store` sends them.
    #[test]
    fn request_targets_match_object_store() {
        let target = target("http://127.0.0.1:9000");
        for name in [
            "kv/modèle_0123/abc.bin",
            "kv/a b+c=d/e,f;g@h",
            "kv/日本/ü~x-y_z.w",
            "kv/%41!$&'()*:",
        ] {
            let path = crate::store::object_path(name);
            let head = text(
                target
                    .head(Method::HEAD, path.as_ref(), None, &credential(None))
                    .unwrap(),
            );
            let ours = head.lines().next().unwrap().to_string();
            let (theirs, host) = object_store_request_line(&path);
            assert_eq!(ours, theirs, "{name}");
            assert!(host.starts_with("127.0.0.1:"), "{host}");
        }
    }

    /// Signing cost of the direct path (run with `--ignored --nocapture`).
    #[test]
    #[ignore]
    fn signing_cost() {
        let target = target("http://127.0.0.1:9000");
        let credential = credential(None);
        let names: Vec<String> = (0..10_000u64)
            .map(|i| format!("model/{:016x}/blocks/{i:032x}", i * 7919))
            .collect();
        for round in 0..3 {
            let start = std::time::Instant::now();
            let mut bytes = 0;
            for name in &names {
                bytes += target
                    .head(Method::HEAD, name, None, &credential)
                    .unwrap()
                    .len();
            }
            let elapsed = start.elapsed();
            eprintln!(
                "round {round}: 10000 HEADs signed in {elapsed:?} ({:.2} us each, {bytes} bytes)",
                elapsed.as_secs_f64() * 1e6 / 10_000.0
            );
        }
    }

    #[test]
    fn a_put_head_signs_its_headers_but_the_length() {
        let headers = vec![
            ("if-none-match".to_string(), "*".to_string()),
            (
                "x-amz-meta-kvtier-crc32c".to_string(),
                "0000beef".to_string(),
            ),
        ];
        let head = text(
            target("http://127.0.0.1:9000")
                .put_head("a/b.bin", 2 << 20, headers, &credential(Some("token")))
                .unwrap(),
        );
        assert!(
            head.starts_with("PUT /examplebucket/a/b.bin HTTP/1.1\r\nhost: 127.0.0.1:9000\r\n"),
            "{head}"
        );
        assert!(head.contains("\r\ncontent-length: 2097152\r\n"), "{head}");
        assert!(head.contains("\r\nif-none-match: *\r\n"), "{head}");
        assert!(
            head.contains("\r\nx-amz-content-sha256: UNSIGNED-PAYLOAD\r\n"),
            "{head}"
        );
        assert!(
            head.contains(
                "SignedHeaders=host;if-none-match;x-amz-content-sha256;x-amz-date;\
                 x-amz-meta-kvtier-crc32c;x-amz-security-token,"
            ),
            "{head}"
        );
        assert!(head.ends_with("\r\n\r\n"), "{head}");
    }
}
