//! One HTTP exchange on a pooled connection: a GET whose body lands in the block, a PUT
//! sent from caller memory, a HEAD; each says whether its connection can be reused.

use super::*;

/// One request/response exchange on a connection: what it reads, and into where.
pub(super) trait Exchange {
    type Outcome;
    /// Returns the answer and whether the exchange left the connection reusable: framed
    /// without doubt, read to its end, not closed by the server.
    async fn run(&mut self, conn: &mut Conn, request: &[u8]) -> io::Result<(Self::Outcome, bool)>;
}

/// A ranged GET whose body goes into `dest`: the whole object of `object_len` bytes (when
/// `dest` is that long), or a part of it.
pub(super) struct GetInto<'a> {
    pub(super) dest: &'a mut BlockSlot,
    pub(super) crc: bool,
    pub(super) object_len: usize,
    /// The time from the request to its response head (for the link's round trip).
    pub(super) head_after: Option<std::time::Duration>,
}

impl Exchange for GetInto<'_> {
    type Outcome = GetOutcome;
    async fn run(&mut self, conn: &mut Conn, request: &[u8]) -> io::Result<(GetOutcome, bool)> {
        get_exchange(conn, request, self).await
    }
}

/// A PUT of `body`: the answer is `Ok` for a 2xx, else the store's answer.
pub(super) struct PutFrom<'a> {
    pub(super) body: &'a object_store::PutPayload,
}

impl Exchange for PutFrom<'_> {
    type Outcome = Result<(), ErrorAnswer>;
    async fn run(&mut self, conn: &mut Conn, request: &[u8]) -> io::Result<(Self::Outcome, bool)> {
        put_exchange(conn, request, self.body).await
    }
}

/// A HEAD: the answer is the status.
pub(super) struct Head;

impl Exchange for Head {
    type Outcome = u16;
    async fn run(&mut self, conn: &mut Conn, request: &[u8]) -> io::Result<(u16, bool)> {
        head_exchange(conn, request).await
    }
}

/// A failure that a reused keep-alive connection shows when the server had closed it.
pub(super) fn is_stale(e: &io::Error) -> bool {
    use io::ErrorKind::*;
    matches!(
        e.kind(),
        UnexpectedEof | ConnectionReset | BrokenPipe | ConnectionAborted
    )
}

pub(super) fn eof(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, what.to_string())
}

/// A failure after the response head arrived: the server did answer on this connection,
/// so it was not stale, and the request is not repeated on a fresh one ([`is_stale`]).
pub(super) fn after_head(e: io::Error) -> io::Error {
    io::Error::other(format!("after the response head: {e}"))
}

/// Sends `request` and reads the response head into `buf`. Returns the parsed head and how
/// many bytes of `buf` were filled (the body's first bytes follow the head).
pub(super) async fn send_and_read_head(
    conn: &mut Conn,
    request: &[u8],
    buf: &mut Vec<u8>,
) -> io::Result<(ResponseHead, usize)> {
    conn.write_all(request).await?;
    // TLS: rustls may hold part of the request until flushed.
    conn.flush().await?;
    read_head(conn, buf).await
}

/// Reads a response head into `buf`. Returns the parsed head and how many bytes of `buf`
/// were filled (the body's first bytes follow the head).
pub(super) async fn read_head(
    conn: &mut Conn,
    buf: &mut Vec<u8>,
) -> io::Result<(ResponseHead, usize)> {
    buf.resize(4096, 0);
    let mut filled = 0usize;
    loop {
        if filled == buf.len() {
            if buf.len() >= MAX_RESPONSE_HEAD {
                return Err(io::Error::other("response head too large"));
            }
            buf.resize(buf.len() * 2, 0);
        }
        let n = conn.read(&mut buf[filled..]).await?;
        if n == 0 {
            return Err(eof("connection closed before the response head"));
        }
        filled += n;
        if let Some(head) = response::parse(&buf[..filled]).map_err(io::Error::other)? {
            return Ok((head, filled));
        }
    }
}

/// What a GET read: the checksum the object records, the CRC32C of the bytes read (when
/// asked for), and the object's ETag.
pub(super) struct GetRead {
    pub(super) recorded_crc: Option<u32>,
    pub(super) crc: u32,
    pub(super) etag: Option<Vec<u8>>,
}

pub(super) type GetOutcome = Result<GetRead, DirectError>;

/// One GET exchange: the body goes straight into `get.dest`. Returns the outcome and
/// whether the connection can be reused.
pub(super) async fn get_exchange(
    conn: &mut Conn,
    request: &[u8],
    get: &mut GetInto<'_>,
) -> io::Result<(GetOutcome, bool)> {
    let (dest, crc) = (&mut *get.dest, get.crc);
    let mut buf = Vec::new();
    let sent = std::time::Instant::now();
    let (head, filled) = send_and_read_head(conn, request, &mut buf).await?;
    get.head_after = Some(sent.elapsed());
    let length = head.ranged_get_body_length().map_err(io::Error::other)?;
    let early = &buf[head.len..filled];
    if !(head.status == 200 || head.status == 206) {
        return error_answer(conn, &head, length, early).await;
    }
    let object_size = head.object_size.unwrap_or(length);
    if dest.len() == get.object_len {
        if length != dest.len() as u64 || object_size != dest.len() as u64 {
            // Never drain a body of the wrong size into the block; the connection is dropped.
            return Ok((Err(DirectError::WrongLength(object_size)), false));
        }
    } else if head.status != 206 || head.object_size.is_none() {
        // A server that ignores Range answers a part with the whole object.
        return Ok((
            Err(DirectError::Fallback(format!(
                "HTTP {} without Content-Range to the GET of a part",
                head.status
            ))),
            false,
        ));
    } else if object_size != get.object_len as u64 {
        return Ok((Err(DirectError::WrongLength(object_size)), false));
    } else if length != dest.len() as u64 {
        return Ok((
            Err(DirectError::Fallback(format!(
                "a {length}-byte body for a part of {} bytes",
                dest.len()
            ))),
            false,
        ));
    }
    // Bytes beyond the body, already read with the head, belong to no request: the body is
    // whole, but the connection is not reused.
    let total = dest.len();
    let (early, surplus) = early.split_at(early.len().min(total));
    dest.write_at(0, early);
    let mut sum = if crc { integrity::checksum(early) } else { 0 };
    let mut done = early.len();
    let mut wake_at = 1;
    while done < total {
        let want = wake_bytes(conn.is_tls(), total - done);
        if want != wake_at {
            set_receive_low_water(conn, want);
            wake_at = want;
        }
        // Up to READ_PIECE bytes, across the slot's pieces, in one read.
        let mut slices = dest.slices_at(done, READ_PIECE);
        let n = conn.read_vectored(&mut slices).await.map_err(after_head)?;
        if n == 0 {
            return Err(after_head(eof("body cut short")));
        }
        if crc {
            sum = integrity::checksum_slices(sum, &slices, n);
        }
        done += n;
    }
    if wake_at != 1 {
        // A pooled connection must wake on its next response's first byte.
        set_receive_low_water(conn, 1);
    }
    let reusable = !head.close && surplus.is_empty();
    let got = GetRead {
        recorded_crc: head.recorded_crc,
        crc: sum,
        etag: head.etag,
    };
    Ok((Ok(got), reusable))
}

/// The SO_RCVLOWAT for a body read with `left` bytes still to come: [`WAKE_BYTES`], or
/// less near the end. On TLS the socket carries ciphertext, and what rustls already read
/// of it is not on the socket any more: the value stays [`TLS_WAKE_MARGIN`] below what is
/// left, and is 1 (wake on any byte) for the last part of the body.
pub(super) fn wake_bytes(tls: bool, left: usize) -> usize {
    if !tls {
        return left.min(WAKE_BYTES);
    }
    match left.checked_sub(TLS_WAKE_MARGIN) {
        Some(n) if n > TLS_WAKE_MARGIN => n.min(WAKE_BYTES),
        _ => 1,
    }
}

/// Sets SO_RCVLOWAT: readiness is reported once `bytes` are buffered (or at EOF). Best
/// effort: where it fails, reads simply wake up more often.
pub(super) fn set_receive_low_water(conn: &Conn, bytes: usize) {
    use std::os::fd::AsRawFd;
    let conn = conn.tcp();
    let value = bytes.min(i32::MAX as usize) as libc::c_int;
    // SAFETY: a valid socket descriptor owned by `conn`, and a c_int option value.
    unsafe {
        libc::setsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            &value as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// Reads a non-2xx answer's (small) body so the connection stays usable, and classifies
/// it: 404s are final, the rest fall back to `object_store`.
pub(super) async fn error_answer(
    conn: &mut Conn,
    head: &ResponseHead,
    length: u64,
    early: &[u8],
) -> io::Result<(GetOutcome, bool)> {
    let (answer, reusable) = read_answer(conn, head, length, early).await?;
    let code = answer.code.as_deref().unwrap_or("");
    let outcome = match head.status {
        // A missing bucket or key, as the general client's failures are read.
        404 => {
            let status = match status_of_answer(&answer) {
                Some(Status::BucketNotFound) => Status::BucketNotFound,
                _ => Status::NotFound,
            };
            DirectError::Final(status, format!("HTTP 404 {code}"))
        }
        status => DirectError::Fallback(format!("HTTP {status} {code}")),
    };
    Ok((Err(outcome), reusable))
}

/// Reads an answer's (small) body of `length` bytes, `early` of them read with the head,
/// so the connection stays usable, and returns the answer with its error code and whether
/// the connection can be reused.
pub(super) async fn read_answer(
    conn: &mut Conn,
    head: &ResponseHead,
    length: u64,
    early: &[u8],
) -> io::Result<(ErrorAnswer, bool)> {
    // Larger error bodies are not read: the connection is not reused.
    if length > MAX_ERROR_BODY as u64 {
        return Err(io::Error::other(format!(
            "HTTP {} with a {length}-byte body",
            head.status
        )));
    }
    let length = length as usize;
    let (early, surplus) = early.split_at(early.len().min(length));
    let mut body = vec![0u8; length];
    body[..early.len()].copy_from_slice(early);
    conn.read_exact(&mut body[early.len()..])
        .await
        .map_err(after_head)?;
    let answer = ErrorAnswer::of(head.status, None, &body);
    Ok((answer, !head.close && surplus.is_empty()))
}

/// One PUT exchange: the head and `body`'s pieces written whole, then the answer read.
/// Returns `Ok` for a 2xx, else the store's answer, and whether the connection can be
/// reused. An answer not framed by Content-Length is read no further, and its connection
/// not reused.
pub(super) async fn put_exchange(
    conn: &mut Conn,
    request: &[u8],
    body: &object_store::PutPayload,
) -> io::Result<(Result<(), ErrorAnswer>, bool)> {
    let mut pieces: Vec<&[u8]> = vec![request];
    pieces.extend(body.iter().map(|piece| piece.as_ref()));
    conn.write_all_pieces(&pieces).await?;
    let mut buf = Vec::new();
    let (head, filled) = read_head(conn, &mut buf).await?;
    let early = &buf[head.len..filled];
    let stored = (200..300).contains(&head.status);
    let (answer, reusable) = match head.content_length.filter(|_| !head.transfer_encoding) {
        Some(length) => read_answer(conn, &head, length, early).await?,
        None => (ErrorAnswer::of(head.status, None, early), false),
    };
    // A server that refused the PUT may have answered before reading the whole body, and
    // would read the rest as a next request: only a success leaves the connection reusable.
    Ok((
        if stored { Ok(()) } else { Err(answer) },
        reusable && stored,
    ))
}

/// One HEAD exchange (a HEAD response has no body, whatever its Content-Length says).
/// Returns the status and whether the connection can be reused.
pub(super) async fn head_exchange(conn: &mut Conn, request: &[u8]) -> io::Result<(u16, bool)> {
    let mut buf = Vec::new();
    let (head, filled) = send_and_read_head(conn, request, &mut buf).await?;
    // Bytes after the head would belong to no request: do not reuse such a connection.
    Ok((head.status, !head.close && filled == head.len))
}
