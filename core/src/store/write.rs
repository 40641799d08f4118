//! The write path: a block's body on its way up (one PUT, the direct path's single PUT
//! from caller memory, or a multipart upload), with its checksums computed in one pass.

use super::link::{Plan, Tag};
use super::*;

/// What a block write found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteOutcome {
    Stored,
    /// A conditional create found the object in the store already.
    AlreadyStored,
}

/// The checksums of a body on its way up.
#[derive(Debug, Clone, Copy, Default)]
struct BodyChecksums {
    /// The CRC32C recorded with the object (when checksums are on).
    recorded: Option<u32>,
    /// Its CRC64NVME for `x-amz-checksum-crc64nvme`, when computed in the same pass.
    upload: Option<u64>,
}

impl Store {
    /// Writes one block. With `checksum`, its CRC32C is recorded beside the bytes and
    /// returned (the local store computes it piece by piece as it writes, on its file I/O
    /// thread; the others before the upload); `create` asks the store to refuse the write
    /// if the object exists (conditional PUT), which then answers [`WriteOutcome::AlreadyStored`].
    /// An S3 store sends the object as one PUT or as a multipart upload as the link and
    /// `lane` (the transfer lane as the transfer found it) make it worth
    /// (`store_part_bytes`, `link.rs`).
    pub(crate) async fn write_block(
        &self,
        path: &Path,
        body: PutPayload,
        checksum: bool,
        create: bool,
        lane: Lane,
    ) -> Result<(WriteOutcome, Option<u32>)> {
        if let Backend::Local { files } = &self.backend {
            let (files, name) = (files.clone(), path.to_string());
            return tokio::task::spawn_blocking(move || {
                files.write(&name, &body, checksum, create)
            })
            .await
            .map_err(|e| Error::join(&format!("store {path}"), &e))?;
        }
        let plan = self.store_plan(body.content_length(), lane);
        // The upload checksum a direct PUT sends is computed here with the block's own, in
        // the same pass over its bytes; the general client computes its own.
        let checksums = if checksum {
            let direct_put = self.puts_direct(plan);
            let (crc, upload) = integrity::body_checksums(body.iter().map(|b| &b[..]), direct_put);
            BodyChecksums {
                recorded: Some(crc),
                upload,
            }
        } else {
            BodyChecksums::default()
        };
        let put = self.put_object(path, body, checksums, create, plan);
        budget::within(self.retry.budget, put)
            .await
            .map(|written| (written, checksums.recorded))
    }

    /// Whether PUTs carry `x-amz-checksum-crc64nvme` (an S3 store, unless
    /// `req_checksum: "required"`).
    pub(super) fn sends_upload_checksum(&self) -> bool {
        matches!(
            self.backend,
            Backend::S3 {
                upload_checksum: true,
                ..
            }
        )
    }

    /// Whether a body planned as `plan` goes first as one PUT on the direct path, with an
    /// upload checksum.
    fn puts_direct(&self, plan: Option<Plan>) -> bool {
        self.sends_upload_checksum()
            && self.direct.as_ref().is_some_and(|direct| direct.puts())
            && plan.is_none_or(|plan| plan.part_len.is_none())
    }

    /// How a body of `len` bytes goes up to an S3 store (one PUT, or a multipart upload of
    /// parts of `part_len`), as the link plans it for `lane`, or as `store_part_bytes`
    /// fixes it; one PUT once the store has refused multipart uploads. `None` for the other
    /// stores: one PUT, not measured.
    fn store_plan(&self, len: usize, lane: Lane) -> Option<Plan> {
        let Backend::S3 {
            store_part_bytes, ..
        } = self.backend
        else {
            return None;
        };
        let fixed = if self.multipart_refused.load(Ordering::Relaxed) {
            Some(0)
        } else {
            store_part_bytes
        };
        Some(self.link.plan(LinkDirection::Store, len, lane, fixed))
    }

    async fn put_object(
        &self,
        path: &Path,
        body: PutPayload,
        checksums: BodyChecksums,
        create: bool,
        plan: Option<Plan>,
    ) -> Result<WriteOutcome> {
        let attributes = match (checksums.recorded, &self.backend) {
            (None, _) => Default::default(),
            (Some(crc), Backend::Azure { .. }) => {
                integrity::checksum_attributes_named(crc, integrity::CRC_METADATA_AZURE)
            }
            (Some(crc), _) => integrity::checksum_attributes(crc),
        };
        let body = match self.backend {
            // The in-memory store keeps the body past the job: a copy, never a view of
            // caller memory.
            Backend::Memory => {
                let mut copy = Vec::with_capacity(body.content_length());
                body.iter().for_each(|piece| copy.extend_from_slice(piece));
                PutPayload::from(copy)
            }
            _ => body,
        };
        if let Some((part_len, tag)) = plan.and_then(|p| Some((p.part_len?, p.tag))) {
            let in_parts = self
                .put_in_parts(path, &body, &attributes, create, part_len, tag)
                .await;
            if let Some(written) = in_parts {
                return written;
            }
        }
        let mode = if create {
            PutMode::Create
        } else {
            PutMode::Overwrite
        };
        // Each attempt sets its own mode (a repeat of a damaged body overwrites).
        let options = PutOptions {
            attributes,
            ..Default::default()
        };
        // A body the server refused as damaged in transit, and a conditional PUT cut short by
        // a timeout or a reset, are repeated here: object_store repeats neither (a 400, and
        // a PUT it deems not idempotent); a repeat that finds the object is a 412. The first
        // attempt goes on the direct path where there is one.
        let mut first = true;
        let timing = plan.map(|plan| self.link.request(plan.tag, body.content_length()));
        let (stored, may_have_landed) = answer::watching_puts(classify::repeat_refused_uploads(
            &self.client,
            path,
            mode,
            self.retry,
            &self.damaged_uploads,
            |mode| {
                let options = PutOptions {
                    mode,
                    ..options.clone()
                };
                let direct_first = std::mem::take(&mut first);
                let body = &body;
                async move {
                    if direct_first {
                        if let Some(answered) =
                            self.put_direct(path, body, checksums, &options.mode).await
                        {
                            return answered;
                        }
                    }
                    answered(self.client.put_opts(path, body.clone(), options)).await
                }
            },
        ))
        .await;
        if let (Some(timing), true) = (timing, stored.is_ok()) {
            timing.done();
        }
        match stored {
            Ok(_) => Ok(WriteOutcome::Stored),
            Err(e) if create && classify::found_by_create(&e) => {
                if may_have_landed {
                    self.settle_found(path, &body, checksums.recorded, options)
                        .await
                } else {
                    Ok(WriteOutcome::AlreadyStored)
                }
            }
            Err(e) => Err(op_error("store", path, &e)),
        }
    }

    /// A create that found the object after an earlier attempt of the same write may have
    /// stored its body (a 5xx answer, a timeout or a cut connection, then a repeat answered
    /// 412 or 304): the object may be that attempt's, or another writer's, or a body the
    /// server kept from a failed request. It is looked at: the same length and the same
    /// recorded checksum as this write's body make it this write's, reported stored as if
    /// the first attempt had succeeded; anything else (another length or checksum, no
    /// recorded checksum to compare, or no object any more) is overwritten with this
    /// write's body, and only then reported stored.
    async fn settle_found(
        &self,
        path: &Path,
        body: &PutPayload,
        recorded: Option<u32>,
        options: PutOptions,
    ) -> Result<WriteOutcome> {
        let head = GetOptions {
            head: true,
            ..Default::default()
        };
        let found = match answered(self.client.get_opts(path, head)).await {
            Ok(got) => Some((got.meta.size, integrity::recorded_checksum(&got.attributes))),
            Err(e) if classify(&e) == Status::NotFound => None,
            Err(e) => return Err(op_error("store (confirming the object found)", path, &e)),
        };
        let sent = (body.content_length() as u64, recorded);
        if recorded.is_some() && found == Some(sent) {
            return Ok(WriteOutcome::Stored);
        }
        log::info!(
            "store {path}: after an attempt that may have stored it, the object found is not \
             this write's ({}); overwriting it",
            match found {
                None => "it is gone".to_string(),
                Some((size, crc)) => format!(
                    "{size} bytes, checksum {}, where this write sent {} bytes, checksum {}",
                    crc.map_or("none".into(), integrity::format_crc),
                    sent.0,
                    recorded.map_or("none".into(), integrity::format_crc)
                ),
            }
        );
        classify::repeat_refused_uploads(
            &self.client,
            path,
            PutMode::Overwrite,
            self.retry,
            &self.damaged_uploads,
            |mode| {
                let options = PutOptions {
                    mode,
                    ..options.clone()
                };
                answered(self.client.put_opts(path, body.clone(), options))
            },
        )
        .await
        .map(|_| WriteOutcome::Stored)
        .map_err(|e| op_error("store", path, &e))
    }

    /// The first attempt of a single PUT, on the direct path of an S3 store that has one:
    /// the store's answer as the general client's would be read, or `None` (no direct path,
    /// or no answer, or one that `object_store` should retry itself) to send it through the
    /// client.
    async fn put_direct(
        &self,
        path: &Path,
        body: &PutPayload,
        checksums: BodyChecksums,
        mode: &PutMode,
    ) -> Option<std::result::Result<object_store::PutResult, Failed>> {
        let (
            Some(direct),
            Backend::S3 {
                upload_checksum, ..
            },
        ) = (&self.direct, &self.backend)
        else {
            return None;
        };
        if !direct.puts() {
            return None;
        }
        let create = matches!(mode, PutMode::Create);
        self.direct_requests.fetch_add(1, Ordering::Relaxed);
        let put = direct::PutRequest {
            body,
            recorded_crc: checksums.recorded,
            // Computed with the block's checksum where it was; else here.
            upload_checksum: upload_checksum.then(|| {
                checksums
                    .upload
                    .unwrap_or_else(|| integrity::upload_checksum(body.iter().map(|b| &b[..])))
            }),
            create,
        };
        let outcome = match direct.put_from(path.as_ref(), put).await {
            Ok(answer) => {
                if matches!(&answer, Err(a) if a.status >= 500) {
                    answer::put_may_have_landed();
                }
                classify::direct_put_answer(path, answer, create)
            }
            Err(e) => {
                // No answer: the body may have reached the server (a connection that could
                // not be opened is not told apart here; confirming costs one HEAD).
                answer::put_may_have_landed();
                log::debug!("store {path}: direct PUT failed ({e:?}); repeating it through the store client");
                None
            }
        };
        if outcome.is_none() {
            self.direct_fallbacks.fetch_add(1, Ordering::Relaxed);
        }
        outcome
    }

    /// [`Store::put_object`] of a body of two parts or more: one multipart upload, its
    /// parts all in flight at once. `object_store` completes a multipart upload without a
    /// condition, so a `create` asks first whether the object is there (two tiers storing
    /// the same new block at the same moment may then both upload it: the same bytes,
    /// written twice). `None`: the store does not do multipart uploads (told once; the
    /// caller sends one PUT, as it will for every large object from now on).
    async fn put_in_parts(
        &self,
        path: &Path,
        body: &PutPayload,
        attributes: &object_store::Attributes,
        create: bool,
        part_len: usize,
        tag: Tag,
    ) -> Option<Result<WriteOutcome>> {
        if create {
            match self.exists(path, false).await {
                Ok(true) => return Some(Ok(WriteOutcome::AlreadyStored)),
                Ok(false) => {}
                Err(e) => return Some(Err(e)),
            }
        }
        let parts = multipart::split(body, part_len);
        let uploaded = classify::repeat_refused_uploads(
            &self.client,
            path,
            PutMode::Overwrite,
            self.retry,
            &self.damaged_uploads,
            |_| multipart::upload(&self.client, path, &parts, attributes, (&self.link, tag)),
        )
        .await;
        match uploaded {
            Ok(_) => Some(Ok(WriteOutcome::Stored)),
            Err(e) if multipart::refused_as_unsupported(&e) => {
                if !self.multipart_refused.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "{}: the store does not take multipart uploads ({}); objects of two \
                         store.store_part_bytes or more go up as one PUT each (set it to 0 to \
                         say so)",
                        self.describe,
                        e.chain()
                    );
                }
                None
            }
            Err(e) => Some(Err(op_error("store", path, &e))),
        }
    }
}
