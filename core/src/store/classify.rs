//! Store errors mapped to the library status, and turned into one-line messages.

use object_store::path::Path;
use object_store::ObjectStoreExt;

use super::answer::ErrorAnswer;
use super::budget::{self, BudgetSpent, RetryPolicy};
use super::DynStore;
use crate::error::{Error, Status};

/// A store request that failed, with the store's answer to it where it answered.
#[derive(Debug)]
pub(crate) struct Failed {
    pub(crate) error: object_store::Error,
    /// The answer of the request's last exchange, when that was an HTTP error status.
    pub(crate) answer: Option<ErrorAnswer>,
}

impl Failed {
    /// A failure seen without an answer: a body cut short after a success status, a task
    /// that failed.
    pub(crate) fn unanswered(error: object_store::Error) -> Failed {
        Failed {
            error,
            answer: None,
        }
    }

    /// The store's error code of the answer, if any.
    pub(crate) fn code(&self) -> Option<&str> {
        self.answer.as_ref()?.code.as_deref()
    }

    /// The HTTP status of the answer, if any.
    pub(crate) fn http_status(&self) -> Option<u16> {
        self.answer.as_ref().map(|a| a.status)
    }

    /// The error and its sources as one line, for messages.
    pub(crate) fn chain(&self) -> String {
        error_chain(&self.error)
    }
}

/// Runs one store request, keeping the store's answer with its error.
pub(crate) async fn answered<T>(
    request: impl std::future::Future<Output = object_store::Result<T>>,
) -> Result<T, Failed> {
    let (result, answer) = super::answer::observed(request).await;
    result.map_err(|error| Failed { error, answer })
}

/// A failed operation on one object, as the error a job reports.
pub(crate) fn op_error(op: &str, path: &Path, failed: &Failed) -> Error {
    if let object_store::Error::JoinError { source } = &failed.error {
        // The store's blocking task was abandoned at shutdown: the job is cancelled.
        return Error::join(&format!("{op} {path}"), source);
    }
    // classify maps a 416 / InvalidRange answer to LengthMismatch itself.
    let status = classify(failed);
    Error::new(
        status,
        with_tls_advice(
            format!("{op} {path}: {}", failed.chain()),
            status,
            &failed.error,
        ),
    )
}

/// `message`, with what to change when `error` is a failed TLS handshake: a request in the
/// middle of a run fails with the TLS library's words (`invalid peer certificate:
/// UnknownIssuer`), which do not say which setting decides the trusted CAs. (The start-up
/// probe's advice, which knows the configuration, is longer: probe.rs.)
pub(crate) fn with_tls_advice(
    message: String,
    status: Status,
    error: &(dyn std::error::Error + 'static),
) -> String {
    if status != Status::Tls {
        return message;
    }
    let advice = match tls_problem(error) {
        Some(TlsProblem::UnknownIssuer) => {
            "the server's certificate was issued by a CA this tier does not trust: store.ca_bundle \
             must name a PEM file holding the certificate of the CA that signed it"
        }
        Some(TlsProblem::WrongName) => {
            "the server's certificate does not name the endpoint's host: connect by a name it lists"
        }
        Some(TlsProblem::Expired) => {
            "the server's certificate is expired or not yet valid: renew it or check the clock"
        }
        Some(TlsProblem::NotTls) => "the server does not speak TLS on this port",
        Some(TlsProblem::Other) | None => {
            "the server's certificate could not be verified: check the scheme and store.ca_bundle"
        }
    };
    format!("{message} ({advice})")
}

pub(crate) fn status_of_s3_code(code: &str) -> Option<Status> {
    Some(match code {
        "NoSuchBucket" => Status::BucketNotFound,
        "NoSuchKey" | "NotFound" => Status::NotFound,
        "InvalidAccessKeyId"
        | "SignatureDoesNotMatch"
        | "ExpiredToken"
        | "InvalidToken"
        | "TokenRefreshRequired"
        | "InvalidSecurity"
        | "AuthorizationHeaderMalformed"
        | "MissingSecurityHeader"
        | "RequestTimeTooSkewed"
        | "NotSignedUp"
        | "InvalidClientTokenId" => Status::Auth,
        "AccessDenied" | "AllAccessDisabled" | "AccountProblem" => Status::PermissionDenied,
        "InvalidRange" => Status::LengthMismatch,
        "RequestTimeout" => Status::Timeout,
        _ => return None,
    })
}

/// The status of an Azure Blob error code (`<Code>` in the body), or of a code only GCS's
/// XML API uses; codes S3 shares are in [`status_of_s3_code`].
pub(crate) fn status_of_cloud_code(code: &str) -> Option<Status> {
    Some(match code {
        "ContainerNotFound" | "ContainerBeingDeleted" | "ContainerDisabled" => Status::BucketNotFound,
        "BlobNotFound" | "ResourceNotFound" => Status::NotFound,
        "AuthenticationFailed" | "InvalidAuthenticationInfo" | "NoAuthenticationInformation"
        // GCS: a request without credentials.
        | "AuthenticationRequired" => Status::Auth,
        "AuthorizationFailure" | "AuthorizationPermissionMismatch" | "AuthorizationSourceIPMismatch"
        | "AuthorizationProtocolMismatch" | "AuthorizationResourceTypeMismatch" | "AuthorizationServiceMismatch"
        | "InsufficientAccountPermissions" | "AccountIsDisabled" => Status::PermissionDenied,
        "OperationTimedOut" => Status::Timeout,
        _ => return None,
    })
}

/// The first error of type `T` in `error`'s source chain, looking inside `io::Error`s too.
fn find_in_chain<'a, T: std::error::Error + 'static>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a T> {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(found) = e.downcast_ref::<T>() {
            return Some(found);
        }
        // An io::Error wrapping an error reports that error's source as its own, skipping
        // the wrapped error itself: step into it instead.
        current = match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    None
}

/// The kind of the transport error inside a store error, if the failure happened below
/// HTTP: the kind of the failure itself where the retry budget made it final (which hands
/// it to `object_store` as a kind it does not repeat).
fn transport_kind(
    error: &(dyn std::error::Error + 'static),
) -> Option<object_store::client::HttpErrorKind> {
    if let Some(spent) = find_in_chain::<BudgetSpent>(error) {
        return spent.kind;
    }
    find_in_chain::<object_store::client::HttpError>(error).map(|http| http.kind())
}

/// Why a TLS handshake failed, as far as the advice to the user differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TlsProblem {
    /// The certificate chains to no trusted CA.
    UnknownIssuer,
    /// The certificate does not name the host connected to.
    WrongName,
    /// The certificate is expired or not yet valid.
    Expired,
    /// The peer does not speak TLS (a plain-http port).
    NotTls,
    /// Anything else rustls refused.
    Other,
}

/// The TLS failure inside a store error, from the TLS library's own error type.
pub(crate) fn tls_problem(error: &(dyn std::error::Error + 'static)) -> Option<TlsProblem> {
    use rustls::{CertificateError as C, Error as R};
    Some(match find_in_chain::<R>(error)? {
        R::InvalidCertificate(C::UnknownIssuer) => TlsProblem::UnknownIssuer,
        R::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => {
            TlsProblem::WrongName
        }
        R::InvalidCertificate(
            C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. },
        ) => TlsProblem::Expired,
        R::InvalidMessage(_) => TlsProblem::NotTls,
        _ => TlsProblem::Other,
    })
}

/// Maps a failed store request to the library status: by the store's error code in its
/// answer where there is one (it tells a missing bucket from a missing key, and bad
/// credentials from a refused permission), else by `object_store`'s error variant (which
/// carries the HTTP status class), else by the answer's HTTP status, else by the transport
/// error's kind and the TLS library's error type. Never by the wording of a message.
pub(crate) fn classify(failed: &Failed) -> Status {
    use object_store::client::HttpErrorKind;
    use object_store::Error as E;
    if let Some(status) = failed.answer.as_ref().and_then(status_of_answer) {
        return status;
    }
    match &failed.error {
        E::NotFound { .. } => return Status::NotFound,
        E::PermissionDenied { .. } => return Status::PermissionDenied,
        E::Unauthenticated { .. } => return Status::Auth,
        E::JoinError { .. } => return Status::Cancelled,
        _ => {}
    }
    if tls_problem(&failed.error).is_some() {
        return Status::Tls;
    }
    match transport_kind(&failed.error) {
        Some(HttpErrorKind::Connect) => Status::Connect,
        Some(HttpErrorKind::Timeout) => Status::Timeout,
        _ => Status::Io,
    }
}

/// The status a store's answer settles: by its error code, else by its HTTP status where
/// that alone says what happened. Shared by the general client's failures and the direct
/// path's answers.
pub(crate) fn status_of_answer(answer: &ErrorAnswer) -> Option<Status> {
    if let Some(status) = answer
        .code
        .as_deref()
        .and_then(|code| status_of_s3_code(code).or_else(|| status_of_cloud_code(code)))
    {
        return Some(status);
    }
    Some(match answer.status {
        401 => Status::Auth,
        403 => Status::PermissionDenied,
        404 => Status::NotFound,
        408 => Status::Timeout,
        416 => Status::LengthMismatch,
        _ => return None,
    })
}

/// Whether a request that failed this way may have left no answer behind while the server
/// did or did not act on it: a timeout or a connection cut mid-exchange. `object_store`
/// repeats such requests only when it deems them idempotent, which a conditional PUT
/// (`If-None-Match: *`) is not in its eyes; for kvtier it is, because a repeat that finds
/// the object answers 412, and the object found is then confirmed as this write's or
/// overwritten (`Store::settle_found`).
pub(crate) fn is_interrupted(error: &object_store::Error) -> bool {
    use object_store::client::HttpErrorKind;
    matches!(
        transport_kind(error),
        Some(HttpErrorKind::Timeout | HttpErrorKind::Interrupted)
    )
}

/// Whether the server refused a PUT because the body it received does not match the
/// request's checksum (or signed payload hash): the body was damaged on the way, and
/// nothing was stored. S3 answers `BadDigest` (checksum headers, Content-MD5) or
/// `XAmzContentSHA256Mismatch` (a signed payload); Azure `Md5Mismatch`/`Crc64Mismatch`.
pub(crate) fn is_damaged_body(failed: &Failed) -> bool {
    matches!(
        failed.code(),
        Some(
            "BadDigest"
                | "InvalidDigest"
                | "XAmzContentSHA256Mismatch"
                | "XAmzContentChecksumMismatch"
                | "Md5Mismatch"
                | "Crc64Mismatch"
        )
    )
}

/// Whether a failed create means the object is there: `AlreadyExists` from a 412 or 304,
/// Azure's 409 `BlobAlreadyExists` (or with no answer seen). Not from another 409, which
/// `object_store` also turns into `AlreadyExists`: a conflicting write in flight (S3's
/// `ConditionalRequestConflict`, `OperationAborted`) may still fail, and the block would be
/// reported stored and not be.
pub(crate) fn found_by_create(failed: &Failed) -> bool {
    matches!(failed.error, object_store::Error::AlreadyExists { .. })
        && !matches!(&failed.answer, Some(answer)
            if answer.status == 409 && answer.code.as_deref() != Some("BlobAlreadyExists"))
}

/// A direct PUT's answer (`Ok` for a 2xx) as the general client's would be read: stored;
/// `AlreadyExists` for a conditional PUT's 412 or 304; a failure with the answer for a
/// refusal that settles something (4xx but 408 and 429; a damaged body among them, which
/// the caller repeats; a 409, a conflicting write, fails the store); `None` for what
/// `object_store` retries itself (5xx, 408, 429): the caller sends those through it.
pub(super) fn direct_put_answer(
    path: &Path,
    answer: Result<(), ErrorAnswer>,
    create: bool,
) -> Option<Result<object_store::PutResult, Failed>> {
    let answer = match answer {
        Ok(()) => {
            return Some(Ok(object_store::PutResult {
                e_tag: None,
                version: None,
                extensions: Default::default(),
            }))
        }
        Err(answer) => answer,
    };
    let text = format!(
        "direct PUT answered HTTP {}{}",
        answer.status,
        answer
            .code
            .as_deref()
            .map(|c| format!(" ({c})"))
            .unwrap_or_default()
    );
    let error = match answer.status {
        304 | 412 if create => object_store::Error::AlreadyExists {
            path: path.to_string(),
            source: text.into(),
        },
        408 | 429 => return None,
        400..=499 => object_store::Error::Generic {
            store: "S3",
            source: text.into(),
        },
        _ => return None,
    };
    Some(Err(Failed {
        error,
        answer: Some(answer),
    }))
}

/// Runs `upload` (given the mode to write with) and repeats it with exponential backoff
/// and jitter while `policy` allows (the operation's retry budget, and its count if set),
/// as `object_store` does for the requests it repeats itself, when the server refused the
/// body as damaged in transit (counted in `damaged`; the repeat overwrites), and, for a
/// create (`PutMode::Create`), on a timeout or a cut connection, which `object_store` does
/// not repeat for a PUT it deems not idempotent. A repeated create answered 412 comes back
/// as `AlreadyExists`: the object is in the store.
pub(super) async fn repeat_refused_uploads<F>(
    store: &DynStore,
    path: &Path,
    mode: object_store::PutMode,
    policy: RetryPolicy,
    damaged: &std::sync::atomic::AtomicU64,
    mut upload: impl FnMut(object_store::PutMode) -> F,
) -> Result<object_store::PutResult, Failed>
where
    F: std::future::Future<Output = Result<object_store::PutResult, Failed>>,
{
    let started = std::time::Instant::now();
    let mut mode = mode;
    let mut attempt = 0;
    loop {
        let create = matches!(mode, object_store::PutMode::Create);
        let outcome = upload(mode.clone()).await;
        let refused = matches!(&outcome, Err(e) if is_damaged_body(e));
        let why = match &outcome {
            Err(_) if refused => {
                damaged.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                // A server may keep the body it refused (s3s-fs 0.14 writes it, without its
                // metadata, before it compares checksums): a conditional repeat would find
                // that object and answer 412 over damaged bytes. The repeat overwrites.
                mode = object_store::PutMode::Overwrite;
                "refused as damaged in transit"
            }
            Err(e) if create && is_interrupted(&e.error) => "interrupted",
            _ => return outcome,
        };
        attempt += 1;
        if !policy.allows(attempt, started) {
            if refused {
                // Gone rather than damaged and unchecked: a reader of an object without a
                // recorded checksum checks only its length.
                if let Err(e) = store.delete(path).await {
                    log::debug!(
                        "deleting {path} after its refused uploads: {}",
                        error_chain(&e)
                    );
                }
            }
            return outcome;
        }
        let backoff = budget::backoff(attempt);
        if let Err(e) = &outcome {
            log::info!(
                "PUT {path} {why} ({}); retry {attempt} in {} ms",
                e.chain(),
                backoff.as_millis()
            );
        }
        tokio::time::sleep(backoff).await;
    }
}

/// The error and all its sources as one line, with the credentials of any URL in it removed.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    // Error bodies may span lines; a message is one line.
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    crate::redact::in_text(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_direct_puts_answer_is_read_as_the_general_clients() {
        let path = Path::from("kv/a.bin");
        let answer = |status, code: Option<&str>| ErrorAnswer {
            status,
            code: code.map(str::to_string),
        };
        assert!(matches!(
            direct_put_answer(&path, Ok(()), true),
            Some(Ok(_))
        ));
        for status in [304, 412] {
            let read = direct_put_answer(&path, Err(answer(status, None)), true);
            assert!(
                matches!(&read, Some(Err(f)) if matches!(f.error, object_store::Error::AlreadyExists { .. })),
                "{status}: {read:?}"
            );
            // Without a condition, a 412 is no "already stored".
            let read = direct_put_answer(&path, Err(answer(status, None)), false);
            assert!(
                !matches!(&read, Some(Err(f)) if matches!(f.error, object_store::Error::AlreadyExists { .. })),
                "{status}: {read:?}"
            );
        }
        // Refusals that settle something keep the answer, so that classification and the
        // repeat of a damaged body see it.
        let damaged = direct_put_answer(&path, Err(answer(400, Some("BadDigest"))), true)
            .unwrap()
            .unwrap_err();
        assert!(is_damaged_body(&damaged), "{damaged:?}");
        let denied = direct_put_answer(&path, Err(answer(403, Some("AccessDenied"))), false)
            .unwrap()
            .unwrap_err();
        assert_eq!(classify(&denied), Status::PermissionDenied);
        assert!(
            denied.chain().contains("AccessDenied"),
            "{}",
            denied.chain()
        );
        // A conflicting write in flight fails the store: it may never complete.
        let conflict = direct_put_answer(
            &path,
            Err(answer(409, Some("ConditionalRequestConflict"))),
            true,
        )
        .unwrap()
        .unwrap_err();
        assert!(!found_by_create(&conflict), "{conflict:?}");
        // What object_store retries itself goes to it.
        for status in [408, 429, 500, 503] {
            assert!(
                direct_put_answer(&path, Err(answer(status, None)), true).is_none(),
                "{status}"
            );
        }
    }

    #[test]
    fn only_a_412_or_304_says_a_create_found_the_object() {
        let already = |status: Option<u16>| Failed {
            error: object_store::Error::AlreadyExists {
                path: "kv/a.bin".into(),
                source: "exists".into(),
            },
            answer: status.map(|status| ErrorAnswer { status, code: None }),
        };
        assert!(found_by_create(&already(Some(412))));
        assert!(found_by_create(&already(Some(304))));
        assert!(found_by_create(&already(None)));
        // object_store turns a 409 into AlreadyExists too; Azure's create answers one.
        assert!(!found_by_create(&already(Some(409))));
        let mut azure = already(Some(409));
        azure.answer.as_mut().unwrap().code = Some("BlobAlreadyExists".into());
        assert!(found_by_create(&azure));
        let other = Failed::unanswered(object_store::Error::Generic {
            store: "S3",
            source: "no".into(),
        });
        assert!(!found_by_create(&other));
    }

    #[test]
    fn codes_map_to_statuses() {
        assert_eq!(
            status_of_s3_code("SignatureDoesNotMatch"),
            Some(Status::Auth)
        );
        assert_eq!(
            status_of_s3_code("NoSuchBucket"),
            Some(Status::BucketNotFound)
        );
        assert_eq!(
            status_of_s3_code("AccessDenied"),
            Some(Status::PermissionDenied)
        );
        assert_eq!(status_of_s3_code("SlowDown"), None);
        assert_eq!(
            status_of_cloud_code("ContainerNotFound"),
            Some(Status::BucketNotFound)
        );
        assert_eq!(status_of_cloud_code("BlobNotFound"), Some(Status::NotFound));
        assert_eq!(
            status_of_cloud_code("AuthenticationFailed"),
            Some(Status::Auth)
        );
        assert_eq!(
            status_of_cloud_code("AuthorizationFailure"),
            Some(Status::PermissionDenied)
        );
        assert_eq!(
            status_of_cloud_code("NoSuchBucket"),
            None,
            "an S3 code, mapped by status_of_s3_code"
        );
    }

    #[test]
    fn tls_failures_are_found_by_type_inside_nested_io_errors() {
        use std::io::{Error as Io, ErrorKind};
        let wrapped = |e: rustls::Error| object_store::Error::Generic {
            store: "S3",
            source: Box::new(Io::other(Io::new(ErrorKind::InvalidData, e))),
        };
        let unknown = wrapped(rustls::Error::InvalidCertificate(
            rustls::CertificateError::UnknownIssuer,
        ));
        assert_eq!(tls_problem(&unknown), Some(TlsProblem::UnknownIssuer));
        let status = classify(&Failed::unanswered(unknown));
        let unknown = wrapped(rustls::Error::InvalidCertificate(
            rustls::CertificateError::UnknownIssuer,
        ));
        let message = with_tls_advice("load kv/x".into(), status, &unknown);
        assert!(message.starts_with("load kv/x ("), "{message}");
        assert!(message.contains("store.ca_bundle"), "{message}");
        let not_tls = object_store::Error::NotFound {
            path: "kv/x".into(),
            source: "missing".into(),
        };
        assert_eq!(with_tls_advice("m".into(), Status::NotFound, &not_tls), "m");
        assert_eq!(status, Status::Tls);
        let plain = wrapped(rustls::Error::InvalidMessage(
            rustls::InvalidMessage::InvalidContentType,
        ));
        assert_eq!(tls_problem(&plain), Some(TlsProblem::NotTls));
        let other = object_store::Error::Generic {
            store: "S3",
            source: Box::new(Io::other("certificate expired")),
        };
        assert_eq!(
            tls_problem(&other),
            None,
            "words alone never make a TLS failure"
        );
        assert_eq!(classify(&Failed::unanswered(other)), Status::Io);
    }
}
