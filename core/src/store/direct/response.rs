//! Response heads on the direct path. `httparse` parses them, and this module holds them to
//! framing rules strict enough that the end of every accepted body is certain. A head that
//! breaks a rule is [`Malformed`]: the request falls back to `object_store` and the
//! connection is dropped, never reused.

use std::fmt;

use crate::integrity;

/// Most headers a response head may carry. S3 servers send about 10 to 25.
const MAX_HEADERS: usize = 64;

/// What a response head says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ResponseHead {
    pub(super) status: u16,
    /// Length of the head, blank line included: the body starts at this offset.
    pub(super) len: usize,
    /// The Content-Length. If several are present they agree.
    pub(super) content_length: Option<u64>,
    /// Whether a Transfer-Encoding header is present. There is then no Content-Length.
    pub(super) transfer_encoding: bool,
    /// The object's full size, from `Content-Range: bytes a-b/size`.
    pub(super) object_size: Option<u64>,
    /// The CRC32C recorded with the object (`x-amz-meta-kvtier-crc32c`).
    pub(super) recorded_crc: Option<u32>,
    /// The object's ETag, as sent: the parts of one load must all come from one version.
    pub(super) etag: Option<Vec<u8>>,
    /// Whether the server closes the connection after this response.
    pub(super) close: bool,
}

/// Why a response head is not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Malformed(pub(super) String);

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Malformed {}

fn malformed(why: impl Into<String>) -> Malformed {
    Malformed(why.into())
}

impl ResponseHead {
    /// The body length of an answer to a ranged GET. Only Content-Length may frame it: a
    /// Transfer-Encoding is refused whatever its value, and so is a body that only the
    /// end of the connection would delimit.
    pub(super) fn ranged_get_body_length(&self) -> Result<u64, Malformed> {
        if self.transfer_encoding {
            return Err(malformed(format!(
                "HTTP {} to a ranged GET with Transfer-Encoding",
                self.status
            )));
        }
        self.content_length.ok_or_else(|| {
            malformed(format!(
                "HTTP {} to a ranged GET without Content-Length",
                self.status
            ))
        })
    }
}

/// Parses the response head at the start of `buf`. Returns `Ok(None)` while the head is
/// incomplete.
///
/// Refused: anything `httparse` refuses (including obsolete line folding and whitespace
/// before a colon); anything before the status line; status lines other than HTTP/1.1;
/// Content-Length values that are not plain decimal numbers, or that disagree with each
/// other; Transfer-Encoding together with Content-Length; more than [`MAX_HEADERS`]
/// headers.
pub(super) fn parse(buf: &[u8]) -> Result<Option<ResponseHead>, Malformed> {
    // `httparse` skips empty lines before the status line; a response starts with it.
    let start = &buf[..buf.len().min(5)];
    if start != &b"HTTP/"[..start.len()] {
        return Err(malformed("response does not start with a status line"));
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let len = match response.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(malformed(format!("malformed response head: {e}"))),
    };
    let version = response.version.unwrap_or_default();
    if version != 1 {
        return Err(malformed(format!(
            "HTTP/1.{version} response (not HTTP/1.1)"
        )));
    }
    let status = response
        .code
        .ok_or_else(|| malformed("response head without a status"))?;
    let mut head = ResponseHead {
        status,
        len,
        content_length: None,
        transfer_encoding: false,
        object_size: None,
        recorded_crc: None,
        etag: None,
        close: false,
    };
    let mut connection = Connection::default();
    for header in response.headers.iter() {
        let name = header.name;
        let value = header.value;
        if name.eq_ignore_ascii_case("content-length") {
            let length = content_length(value)?;
            if head.content_length.is_some_and(|seen| seen != length) {
                return Err(malformed("Content-Length headers that disagree"));
            }
            head.content_length = Some(length);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            head.transfer_encoding = true;
        } else if name.eq_ignore_ascii_case("connection") {
            connection.add(value);
        } else if name.eq_ignore_ascii_case("content-range") {
            head.object_size = std::str::from_utf8(value)
                .ok()
                .and_then(|v| v.trim().rsplit('/').next())
                .and_then(|size| decimal(size.as_bytes()));
        } else if name.eq_ignore_ascii_case("etag") {
            head.etag = Some(value.trim_ascii().to_vec());
        } else if name.eq_ignore_ascii_case(integrity::CRC_HEADER) {
            head.recorded_crc = std::str::from_utf8(value)
                .ok()
                .and_then(|v| integrity::parse_crc(v.trim()));
        }
    }
    if head.transfer_encoding && head.content_length.is_some() {
        return Err(malformed("Transfer-Encoding together with Content-Length"));
    }
    head.close = connection.closes(version);
    Ok(Some(head))
}

/// A Content-Length value: a decimal number, or a list of equal ones (`10, 10`, as a proxy
/// may fold repeated headers). Signs, blanks inside a number, empty list members and values
/// beyond `u64` are malformed.
fn content_length(value: &[u8]) -> Result<u64, Malformed> {
    let mut length = None;
    for member in value.split(|&b| b == b',') {
        let number =
            decimal(member.trim_ascii()).ok_or_else(|| malformed("malformed Content-Length"))?;
        if length.is_some_and(|seen| seen != number) {
            return Err(malformed("Content-Length values that disagree"));
        }
        length = Some(number);
    }
    length.ok_or_else(|| malformed("malformed Content-Length"))
}

/// `1*DIGIT` as a `u64` (no sign, no blanks).
fn decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// The options of the Connection headers: comma-separated tokens, any case.
#[derive(Debug, Default)]
struct Connection {
    close: bool,
    keep_alive: bool,
}

impl Connection {
    fn add(&mut self, value: &[u8]) {
        for token in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
            self.close |= token.eq_ignore_ascii_case(b"close");
            self.keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
        }
    }

    /// Whether the connection ends after the response: `close` anywhere, or HTTP/1.0
    /// without `keep-alive`.
    fn closes(&self, minor_version: u8) -> bool {
        self.close || (minor_version == 0 && !self.keep_alive)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> Result<Option<ResponseHead>, Malformed> {
        parse(text.as_bytes())
    }

    fn accepted(text: &str) -> ResponseHead {
        head(text).unwrap().unwrap()
    }

    fn refused(text: &str) -> String {
        match head(text) {
            Err(Malformed(why)) => why,
            Ok(parsed) => panic!("accepted {text:?}: {parsed:?}"),
        }
    }

    #[test]
    fn a_ranged_answer() {
        let text = "HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\n\
                    content-range: bytes 0-9/44\r\nx-amz-meta-kvtier-crc32c: 0000beef\r\n\
                    ETag: \"9b2cf535f27731c974343645a3985328\"\r\nConnection: close\r\n\r\nbody";
        let parsed = accepted(text);
        assert_eq!(
            parsed,
            ResponseHead {
                status: 206,
                len: text.len() - 4,
                content_length: Some(10),
                transfer_encoding: false,
                object_size: Some(44),
                recorded_crc: Some(0xbeef),
                etag: Some(b"\"9b2cf535f27731c974343645a3985328\"".to_vec()),
                close: true,
            }
        );
        assert_eq!(parsed.ranged_get_body_length(), Ok(10));
    }

    #[test]
    fn a_head_answer_without_reason_phrase() {
        let parsed = accepted("HTTP/1.1 200 \r\nContent-Length: 1048576\r\nETag: \"x\"\r\n\r\n");
        assert_eq!(
            (parsed.status, parsed.content_length, parsed.close),
            (200, Some(1048576), false)
        );
        let parsed = accepted("HTTP/1.1 404 Not Found\r\n\r\n");
        assert_eq!((parsed.status, parsed.content_length), (404, None));
    }

    #[test]
    fn incomplete_heads_ask_for_more() {
        let full = "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n";
        for end in 0..full.len() {
            assert_eq!(head(&full[..end]), Ok(None), "{:?}", &full[..end]);
        }
        assert!(head(full).unwrap().is_some());
    }

    #[test]
    fn repeated_equal_content_lengths_are_one() {
        let parsed = accepted("HTTP/1.1 200 OK\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\n");
        assert_eq!(parsed.content_length, Some(5));
        let parsed = accepted("HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n");
        assert_eq!(parsed.content_length, Some(5));
        let parsed = accepted("HTTP/1.1 200 OK\r\nContent-Length:   7 \r\n\r\n");
        assert_eq!(parsed.content_length, Some(7));
    }

    #[test]
    fn ambiguous_framing_is_refused() {
        let cases = [
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\nContent-Length: 5\r\n\r\n",
        ];
        for case in cases {
            refused(case);
        }
    }

    #[test]
    fn malformed_content_lengths_are_refused() {
        for value in [
            "ten",
            "",
            "+5",
            "-5",
            "5 5",
            "0x10",
            "5,",
            ",5",
            "5;",
            "18446744073709551616",
        ] {
            let text = format!("HTTP/1.1 200 OK\r\nContent-Length: {value}\r\n\r\n");
            assert!(refused(&text).contains("Content-Length"), "{text:?}");
        }
        assert_eq!(
            accepted("HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551615\r\n\r\n")
                .content_length,
            Some(u64::MAX)
        );
    }

    #[test]
    fn status_lines_other_than_http_1_1_are_refused() {
        for line in [
            "HTTP/1.0 200 OK",
            "HTTP/2 200",
            "HTTP/2.0 200 OK",
            "HTTP/1.2 200 OK",
            "http/1.1 200 OK",
            "ICY 200 OK",
            "HTTP/1.1 20 OK",
            "HTTP/1.1 2000 OK",
            "HTTP/1.1 abc OK",
            "HTTP/1.1",
            "garbage",
            "\r\nHTTP/1.1 200 OK",
            " HTTP/1.1 200 OK",
        ] {
            refused(&format!("{line}\r\nContent-Length: 0\r\n\r\n"));
        }
    }

    #[test]
    fn malformed_header_lines_are_refused() {
        for case in [
            "HTTP/1.1 200 OK\r\nContent-Length : 5\r\n\r\n",
            "HTTP/1.1 200 OK\r\nX-Folded: a\r\n b\r\nContent-Length: 5\r\n\r\n",
            "HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
            "HTTP/1.1 200 OK\r\nBad\x01Name: x\r\n\r\n",
            "HTTP/1.1 200 OK\r\nX: a\x00b\r\n\r\n",
        ] {
            refused(case);
        }
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: v\r\n")).collect();
        refused(&format!("HTTP/1.1 200 OK\r\n{many}\r\n"));
    }

    #[test]
    fn transfer_encoding_never_frames_a_ranged_get() {
        let parsed = accepted("HTTP/1.1 206 Partial Content\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert!(parsed.transfer_encoding);
        assert!(parsed.ranged_get_body_length().is_err());
        let parsed = accepted("HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\n\r\n");
        assert!(parsed.ranged_get_body_length().is_err());
        let parsed = accepted("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n");
        assert!(
            parsed.ranged_get_body_length().is_err(),
            "a body delimited by the close"
        );
    }

    #[test]
    fn connection_options_are_a_token_list() {
        let closes = |value: &str| {
            accepted(&format!(
                "HTTP/1.1 200 OK\r\nConnection: {value}\r\nContent-Length: 0\r\n\r\n"
            ))
            .close
        };
        assert!(closes("close"));
        assert!(closes("Close"));
        assert!(closes("keep-alive, close"));
        assert!(closes("upgrade,CLOSE"));
        assert!(closes(" te , close "));
        assert!(!closes("keep-alive"));
        assert!(!closes("closed"));
        assert!(!closes("not-close"));
        assert!(!closes(""));
        let two =
            accepted("HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nConnection: te, close\r\n\r\n");
        assert!(two.close);
    }

    #[test]
    fn http_1_0_closes_unless_kept_alive() {
        let mut options = Connection::default();
        assert!(options.closes(0));
        assert!(!options.closes(1));
        options.add(b"Keep-Alive");
        assert!(!options.closes(0));
        options.add(b"close");
        assert!(options.closes(0) && options.closes(1));
    }

    #[test]
    fn content_range_and_checksum_are_read_leniently() {
        let parsed = accepted(
            "HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\ncontent-range: bytes 0-9/*\r\n\
             x-amz-meta-kvtier-crc32c: not-hex\r\n\r\n",
        );
        assert_eq!((parsed.object_size, parsed.recorded_crc), (None, None));
    }

    /// A seeded xorshift64* generator: the mutation test below is deterministic.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// The header lines of a head as a plain reading splits them: `(name, value)`.
    fn plain_headers(head: &[u8]) -> Vec<(&[u8], &[u8])> {
        head.split(|&b| b == b'\n')
            .skip(1)
            .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
            .take_while(|line| !line.is_empty())
            .filter_map(|line| {
                let colon = line.iter().position(|&b| b == b':')?;
                Some((&line[..colon], line[colon + 1..].trim_ascii()))
            })
            .collect()
    }

    /// The Content-Length values of a head, each member of each header.
    fn plain_lengths(head: &[u8]) -> Vec<Option<u64>> {
        plain_headers(head)
            .into_iter()
            .filter(|(name, _)| name.eq_ignore_ascii_case(b"content-length"))
            .flat_map(|(_, value)| value.split(|&b| b == b',').map(|v| decimal(v.trim_ascii())))
            .collect()
    }

    /// Whether the framing of `head` is ambiguous by an independent, plain reading: a
    /// Content-Length that is not a number, several that differ, or Transfer-Encoding with
    /// Content-Length.
    fn framing_is_ambiguous(head: &[u8]) -> bool {
        let lengths = plain_lengths(head);
        let transfer_encoding = plain_headers(head)
            .iter()
            .any(|(name, _)| name.eq_ignore_ascii_case(b"transfer-encoding"));
        lengths.iter().any(Option::is_none)
            || lengths.windows(2).any(|w| w[0] != w[1])
            || (transfer_encoding && !lengths.is_empty())
    }

    /// Mutates valid heads byte by byte (replace, insert, delete, duplicate a line, splice
    /// framing headers) and parses every result: the parser never panics, never accepts a
    /// head with ambiguous framing, and an accepted head's Content-Length is the one its
    /// text carries.
    #[test]
    fn mutated_heads_never_panic_nor_pass_ambiguous_framing() {
        let seeds = [
            "HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\nContent-Range: bytes 0-9/10\r\n\
             x-amz-meta-kvtier-crc32c: 0000beef\r\nConnection: keep-alive\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 4096\r\nETag: \"abc\"\r\n\r\n",
            "HTTP/1.1 404 Not Found\r\nContent-Type: application/xml\r\nContent-Length: 0\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
            "HTTP/1.1 503 Slow Down\r\nContent-Length: 5, 5\r\nConnection: close\r\n\r\n",
        ];
        let splices: [&[u8]; 8] = [
            b"Content-Length: 11\r\n",
            b"Content-Length: 10\r\n",
            b"content-length:0\r\n",
            b"Transfer-Encoding: chunked\r\n",
            b"Connection: close\r\n",
            b"Content-Length: +10\r\n",
            b"Content-Length: 10, 12\r\n",
            b"\r\n",
        ];
        let alphabet =
            b"HTTP/1.0 \r\n:,-+Content-LengthTransfer-Encodingclose0123456789\t\x00\x7f\xff";
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        let (mut accepted_count, mut refused_count) = (0, 0);
        for round in 0..40_000 {
            let mut text = seeds[round % seeds.len()].as_bytes().to_vec();
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(text.len() + 1);
                match rng.below(6) {
                    0 if at < text.len() => text[at] = alphabet[rng.below(alphabet.len())],
                    1 => text.insert(at, alphabet[rng.below(alphabet.len())]),
                    2 if at < text.len() => {
                        text.remove(at);
                    }
                    3 if at < text.len() => text[at] = rng.next() as u8,
                    4 => {
                        // Splice a framing header at a line start.
                        let line_start = text[..at]
                            .iter()
                            .rposition(|&b| b == b'\n')
                            .map_or(0, |p| p + 1);
                        let splice = splices[rng.below(splices.len())];
                        text.splice(line_start..line_start, splice.iter().copied());
                    }
                    _ => {
                        // Duplicate the line around `at`.
                        let start = text[..at]
                            .iter()
                            .rposition(|&b| b == b'\n')
                            .map_or(0, |p| p + 1);
                        let end = text[at..]
                            .iter()
                            .position(|&b| b == b'\n')
                            .map_or(text.len(), |p| at + p + 1);
                        let line = text[start..end].to_vec();
                        text.splice(end..end, line);
                    }
                }
            }
            let result = std::panic::catch_unwind(|| parse(&text));
            let Ok(result) = result else {
                panic!("parser panicked on {:?}", String::from_utf8_lossy(&text))
            };
            match result {
                Ok(Some(parsed)) => {
                    accepted_count += 1;
                    let head = &text[..parsed.len];
                    let shown = String::from_utf8_lossy(head);
                    assert!(
                        !framing_is_ambiguous(head),
                        "ambiguous head accepted: {shown:?}"
                    );
                    assert_eq!(
                        parsed.content_length,
                        plain_lengths(head).first().copied().flatten(),
                        "{shown:?}"
                    );
                    assert!(
                        !(parsed.transfer_encoding && parsed.content_length.is_some()),
                        "{shown:?}"
                    );
                    // Parsing only the head gives the same answer.
                    assert_eq!(parse(head), Ok(Some(parsed)), "{shown:?}");
                }
                Ok(None) => {}
                Err(_) => refused_count += 1,
            }
        }
        // The mutations reach both sides.
        assert!(
            accepted_count > 1000 && refused_count > 1000,
            "{accepted_count} accepted, {refused_count} refused"
        );
    }
}
