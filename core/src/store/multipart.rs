//! Stores of large objects as multipart uploads, every part in flight at once.
//!
//! A remote store caps what one connection moves (tens of MB/s), so one PUT of a 32 MiB
//! vLLM chunk takes as long as that one connection needs; its parts on connections of
//! their own take a fraction of it. The parts are views of the body (of the caller's
//! block, or of the sealed copy): nothing is gathered or copied.

use bytes::Bytes;
use object_store::path::Path;
use object_store::{Attributes, PutMultipartOptions, PutPayload, PutResult};

use super::classify::{answered, error_chain, Failed};
use super::link::{Link, Tag};
use super::DynStore;

/// How many parts a body of `len` bytes is cut into with parts of `part_len`: whole parts
/// only, the last one taking the remainder (so no part is small). Fewer than two: the body
/// goes up as one PUT.
pub(super) fn part_count(len: usize, part_len: usize) -> usize {
    len.checked_div(part_len).unwrap_or(0)
}

/// `body` cut into [`part_count`] parts of `part_len` bytes, the last one with the
/// remainder, each a list of views of the body's pieces.
pub(super) fn split(body: &PutPayload, part_len: usize) -> Vec<PutPayload> {
    let count = part_count(body.content_length(), part_len).max(1);
    let mut parts = Vec::with_capacity(count);
    let mut part: Vec<Bytes> = Vec::new();
    // Bytes still to go into the current part; the last part takes all that is left.
    let room_of = |index: usize| {
        if index + 1 < count {
            part_len
        } else {
            usize::MAX
        }
    };
    let mut room = room_of(0);
    for piece in body.iter() {
        let mut at = 0;
        while at < piece.len() {
            let take = room.min(piece.len() - at);
            part.push(piece.slice(at..at + take));
            at += take;
            room -= take;
            if room == 0 {
                parts.push(std::mem::take(&mut part).into_iter().collect());
                room = room_of(parts.len());
            }
        }
    }
    if !part.is_empty() {
        parts.push(part.into_iter().collect());
    }
    parts
}

/// One multipart upload of `parts` at `path`, with `attributes` (the recorded checksum):
/// every part is sent at once, and the upload completes when all have been stored. Any
/// failure aborts the upload (the store keeps no parts of it) and is returned. Returns
/// only when no request of the upload is running: the parts' views of the block are gone.
/// Each part reports to the link what it got.
pub(super) async fn upload(
    store: &DynStore,
    path: &Path,
    parts: &[PutPayload],
    attributes: &Attributes,
    (link, tag): (&Link, Tag),
) -> Result<PutResult, Failed> {
    let options = PutMultipartOptions {
        attributes: attributes.clone(),
        ..Default::default()
    };
    let mut upload = answered(store.put_multipart_opts(path, options)).await?;
    // Each part request is repeated by `object_store` itself on 5xx, throttling and cut
    // connections (a part is idempotent); all of them are awaited, failed or not.
    let sending: Vec<_> = parts
        .iter()
        .map(|part| {
            let timing = link.request(tag, part.content_length());
            let sent = upload.put_part(part.clone());
            async move {
                let sent = sent.await;
                if sent.is_ok() {
                    timing.done();
                }
                sent
            }
        })
        .collect();
    let sent = answered(async {
        futures::future::join_all(sending)
            .await
            .into_iter()
            .collect::<object_store::Result<Vec<()>>>()
    })
    .await;
    let outcome = match sent {
        Ok(_) => answered(upload.complete()).await,
        Err(failed) => Err(failed),
    };
    if outcome.is_err() {
        // Parts of an upload never completed are kept (and billed) by S3 until aborted.
        if let Err(e) = upload.abort().await {
            log::debug!(
                "aborting the multipart upload of {path}: {}",
                error_chain(&e)
            );
        }
    }
    outcome
}

/// Whether a failed upload was refused as a request the store does not do (a server or
/// gateway without multipart uploads answers 501 NotImplemented, or 405), rather than
/// failed.
pub(super) fn refused_as_unsupported(failed: &Failed) -> bool {
    matches!(failed.http_status(), Some(501 | 405))
        || matches!(failed.code(), Some("NotImplemented" | "MethodNotAllowed"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parts cover the body in order, each `part_len` long but the last, which takes the
    /// remainder, over pieces of any lengths, and are views of the pieces (no copy).
    #[test]
    fn parts_cover_the_body_in_order() {
        let whole: Vec<u8> = (0..100u8).collect();
        let pieces = [&whole[..7], &whole[7..40], &whole[40..41], &whole[41..]];
        let body: PutPayload = pieces.iter().map(|p| Bytes::copy_from_slice(p)).collect();
        for part_len in [1, 6, 7, 10, 33, 49, 50, 51, 99, 100, 101, 1000] {
            let parts = split(&body, part_len);
            let count = (100 / part_len).max(1);
            assert_eq!(parts.len(), count, "part_len {part_len}");
            let mut joined = Vec::new();
            for (i, part) in parts.iter().enumerate() {
                let want = if i + 1 < count {
                    part_len
                } else {
                    100 - part_len * (count - 1)
                };
                assert_eq!(part.content_length(), want, "part {i} of {part_len}");
                part.iter().for_each(|b| joined.extend_from_slice(b));
            }
            assert_eq!(joined, whole, "part_len {part_len}");
        }
        let one = split(&body, 10);
        let first_piece = body.iter().next().unwrap();
        assert_eq!(
            one[0].iter().next().unwrap().as_ptr(),
            first_piece.as_ptr(),
            "a part is a view of the body"
        );
    }

    #[test]
    fn only_whole_parts_count() {
        assert_eq!(part_count(32 << 20, 16 << 20), 2);
        assert_eq!(part_count((32 << 20) - 1, 16 << 20), 1);
        assert_eq!(part_count((16 << 20) + 4160, 16 << 20), 1);
        assert_eq!(part_count(40 << 20, 8 << 20), 5);
        assert_eq!(part_count(5, 0), 0);
    }
}
