//! What a store answered to a request that did not succeed: the HTTP status and the store's
//! error code, taken from the response where it is seen (the HTTP client's service in
//! `http_options.rs`, the direct path's response parser) and carried as data to the code
//! that classifies the failure. `object_store` folds an answer into the text of its error
//! and keeps no typed copy of it; reading it back out of that text would make a status
//! depend on a dependency's wording.

use std::cell::RefCell;
use std::future::Future;

use serde::Deserialize;

/// Error bodies longer than this are passed on unread: no store's error document is near it.
pub(crate) const MAX_ERROR_BODY: usize = 64 << 10;

/// A store's answer to a request that did not succeed (HTTP 400 and up).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ErrorAnswer {
    pub(crate) status: u16,
    /// The store's error code: Azure's `x-ms-error-code` header where sent, else the
    /// `<Error><Code>` of an XML error body (S3, Azure Blob, GCS's XML API).
    pub(crate) code: Option<String>,
}

impl ErrorAnswer {
    /// The answer of `status`, with the error code its headers or body carry.
    pub(crate) fn of(status: u16, code_header: Option<&[u8]>, body: &[u8]) -> ErrorAnswer {
        let code = code_header
            .and_then(|h| std::str::from_utf8(h).ok())
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(str::to_string)
            .or_else(|| xml_error_code(body));
        ErrorAnswer { status, code }
    }
}

/// The code of an XML error document (`<Error><Code>NoSuchKey</Code>…</Error>`), if `body`
/// is one.
pub(crate) fn xml_error_code(body: &[u8]) -> Option<String> {
    /// The document's root element names the variant: only `<Error>` is an error document.
    #[derive(Deserialize)]
    enum Document {
        Error {
            #[serde(rename = "Code")]
            code: Option<String>,
        },
    }
    let text = std::str::from_utf8(body).ok()?;
    // Azure starts its documents with a byte-order mark.
    let text = text.trim_start_matches('\u{feff}').trim();
    if text.is_empty() {
        return None;
    }
    match quick_xml::de::from_str::<Document>(text).ok()? {
        Document::Error { code } => code.map(|c| c.trim().to_string()).filter(|c| !c.is_empty()),
    }
}

tokio::task_local! {
    /// The answer of the last exchange of the operation under way in this task.
    static LAST_ANSWER: RefCell<Option<ErrorAnswer>>;
}

/// Runs one store operation and returns its output with the answer of its last HTTP
/// exchange, when that exchange was answered with an error status: `None` when it
/// succeeded, failed below HTTP (connect, reset, timeout, TLS) or never happened. The HTTP
/// service runs inside the caller's task, so every exchange of `operation` (its retries
/// too) records into this scope and no other; the last one decides, as it decides the
/// operation's error.
pub(crate) async fn observed<F: Future>(operation: F) -> (F::Output, Option<ErrorAnswer>) {
    LAST_ANSWER
        .scope(RefCell::new(None), async move {
            let output = operation.await;
            (output, LAST_ANSWER.with(|last| last.borrow_mut().take()))
        })
        .await
}

/// Records the outcome of one exchange: its answer, or `None` for a success or a failure
/// without an answer. Outside [`observed`] there is no one to tell, and nothing is kept.
pub(crate) fn record(answer: Option<ErrorAnswer>) {
    let _ = LAST_ANSWER.try_with(|last| *last.borrow_mut() = answer);
}

tokio::task_local! {
    /// Whether an attempt of the write under way in this task failed after its body may
    /// have reached the server (a 5xx answer, a timeout, a connection cut mid-request).
    static PUT_MAY_HAVE_LANDED: std::cell::Cell<bool>;
}

/// Runs one write and returns its output with whether any of its PUT attempts failed in a
/// way that leaves open whether the server stored the body ([`put_may_have_landed`]).
pub(crate) async fn watching_puts<F: Future>(write: F) -> (F::Output, bool) {
    PUT_MAY_HAVE_LANDED
        .scope(std::cell::Cell::new(false), async move {
            let output = write.await;
            (output, PUT_MAY_HAVE_LANDED.with(std::cell::Cell::get))
        })
        .await
}

/// Notes that a PUT attempt of the write under way failed after its body may have reached
/// the server. Outside [`watching_puts`] nothing is kept.
pub(crate) fn put_may_have_landed() {
    let _ = PUT_MAY_HAVE_LANDED.try_with(|landed| landed.set(true));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_documents_give_their_code() {
        let s3 = br#"<?xml version="1.0" encoding="UTF-8"?>
            <Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message>
            <BucketName>kv</BucketName></Error>"#;
        assert_eq!(xml_error_code(s3).as_deref(), Some("NoSuchBucket"));
        let azure = "\u{feff}<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>ContainerNotFound</Code><Message>The specified container does not exist.\nRequestId:1</Message></Error>";
        assert_eq!(
            xml_error_code(azure.as_bytes()).as_deref(),
            Some("ContainerNotFound")
        );
        let message_first = b"<Error><Message>m</Message><Code>AccessDenied</Code></Error>";
        assert_eq!(
            xml_error_code(message_first).as_deref(),
            Some("AccessDenied")
        );
        // Not error documents: no code.
        for body in [
            &b""[..],
            b"Forbidden",
            b"{\"error\":{\"code\":404}}",
            b"<ListBucketResult><Code>NoSuchKey</Code></ListBucketResult>",
            b"<Error><Message>no code</Message></Error>",
            b"<Error><Code>",
        ] {
            assert_eq!(
                xml_error_code(body),
                None,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn the_error_code_header_wins_over_the_body() {
        let body = b"<Error><Code>AuthenticationFailed</Code></Error>";
        let answer = ErrorAnswer::of(403, Some(b"AuthorizationFailure"), body);
        assert_eq!(answer.code.as_deref(), Some("AuthorizationFailure"));
        assert_eq!(
            ErrorAnswer::of(403, None, body).code.as_deref(),
            Some("AuthenticationFailed")
        );
        assert_eq!(ErrorAnswer::of(404, None, b"").code, None);
    }

    #[tokio::test]
    async fn an_operation_sees_the_answer_of_its_last_exchange_only() {
        let answer = |status| ErrorAnswer {
            status,
            code: Some("SlowDown".into()),
        };
        let ((), last) = observed(async {
            record(Some(answer(503)));
            record(None);
        })
        .await;
        assert_eq!(last, None, "a success after a 503 leaves no answer");
        let ((), last) = observed(async {
            record(None);
            record(Some(answer(503)));
        })
        .await;
        assert_eq!(last, Some(answer(503)));
        record(Some(answer(500))); // outside any operation: kept nowhere
        let ((), last) = observed(async {}).await;
        assert_eq!(last, None);
    }
}
