//! HTTP client options shared by the S3, Azure Blob and GCS stores (many HTTP/1.1
//! connections, a large idle pool, the configured timeouts, exponential backoff with
//! jitter, extra trusted CAs), and the connector that counts the storage client's retries.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Method;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService, ReqwestConnector,
};
use object_store::{BackoffConfig, ClientOptions, RetryConfig};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use super::answer;
use super::budget::{self, BudgetSpent, RetryPolicy};
use crate::config::ClientSettings;
use crate::error::{Error, Result};

/// Client options for an endpoint; `allow_http` when plain http is allowed.
pub(super) fn client_options(
    settings: ClientSettings<'_>,
    allow_http: bool,
) -> Result<ClientOptions> {
    let mut options = ClientOptions::new()
        // Many HTTP/1.1 connections rather than one multiplexed HTTP/2 connection.
        // reqwest sets TCP_NODELAY on every connection by default.
        .with_http1_only()
        .with_connect_timeout(Duration::from_millis(settings.connect_timeout_ms))
        .with_timeout(Duration::from_millis(settings.request_timeout_ms))
        .with_pool_max_idle_per_host(1024)
        .with_allow_http(allow_http);
    if !settings.ca_bundle.is_empty() {
        for cert in load_ca_bundle(settings.ca_bundle)? {
            options = options.with_root_certificate(cert);
        }
    }
    Ok(options)
}

/// Exponential backoff with jitter (50 ms up to 1 s) for 5xx, throttling, timeouts, refused
/// connections and resets, for the retry budget from a request's first attempt (and at most
/// `max_retries` times, when set). An operation of several requests shares one budget:
/// see [`budget`](super::budget).
pub(super) fn retry_config(settings: ClientSettings<'_>) -> RetryConfig {
    let policy = retry_policy(settings);
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: budget::FIRST_BACKOFF,
            max_backoff: budget::MAX_BACKOFF,
            base: 2.0,
        },
        max_retries: policy.object_store_max_retries(),
        retry_timeout: policy.budget,
    }
}

/// The retry policy of an HTTP store's settings.
pub(super) fn retry_policy(settings: ClientSettings<'_>) -> RetryPolicy {
    RetryPolicy {
        budget: Duration::from_millis(settings.retry_budget_ms),
        max_retries: settings.max_retries,
    }
}

/// The certificates of a `store.ca_bundle` PEM file, read and checked in one place for
/// every client that trusts them (the general client here, the direct path's TLS).
pub(super) fn read_ca_bundle(path: &str) -> Result<Vec<CertificateDer<'static>>> {
    let pem =
        std::fs::read(path).map_err(|e| Error::config(format!("store.ca_bundle {path}: {e}")))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::config(format!("store.ca_bundle {path} is not a PEM bundle: {e}")))?;
    if certs.is_empty() {
        return Err(Error::config(format!(
            "store.ca_bundle {path} holds no certificate"
        )));
    }
    Ok(certs)
}

fn load_ca_bundle(path: &str) -> Result<Vec<object_store::Certificate>> {
    read_ca_bundle(path)?
        .iter()
        .map(|der| {
            object_store::Certificate::from_der(der).map_err(|e| {
                Error::config(format!(
                    "store.ca_bundle {path} holds a bad certificate: {e}"
                ))
            })
        })
        .collect()
}

// ------------------------------------------------------------------------------------
// Counting retries

/// Most failed requests remembered while their repeat is awaited; a request that is not
/// repeated (its retries are exhausted, or the failure was final) stays until the ledger
/// is full, and is then forgotten with the rest.
const MAX_AWAITED_REPEATS: usize = 4096;

/// The requests a store's HTTP client repeated. `object_store` retries inside its client
/// and reports nothing of it; what it does do is send the same request again through the
/// connector. So a request whose previous attempt (same method and URL) failed with a 5xx
/// or 429 answer or a transport error is counted as a retry, whoever repeats it
/// (`object_store`'s retry loop, or kvtier's own for conditional PUTs).
#[derive(Debug, Default)]
pub(crate) struct RetryLedger {
    retries: AtomicU64,
    awaiting_repeat: Mutex<HashSet<(Method, String)>>,
}

impl RetryLedger {
    pub(crate) fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    fn sent(&self, key: &(Method, String)) {
        let mut awaiting = self
            .awaiting_repeat
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if awaiting.remove(key) {
            self.retries.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn answered(&self, key: (Method, String), failed: bool) {
        if !failed {
            return;
        }
        let mut awaiting = self
            .awaiting_repeat
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if awaiting.len() >= MAX_AWAITED_REPEATS {
            awaiting.clear();
        }
        awaiting.insert(key);
    }
}

/// `object_store`'s own connector (reqwest), with every request seen by a [`RetryLedger`].
#[derive(Debug)]
pub(super) struct CountingConnector {
    ledger: Arc<RetryLedger>,
}

impl CountingConnector {
    pub(super) fn new() -> (CountingConnector, Arc<RetryLedger>) {
        let ledger = Arc::new(RetryLedger::default());
        (
            CountingConnector {
                ledger: ledger.clone(),
            },
            ledger,
        )
    }
}

impl HttpConnector for CountingConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(Counting {
            inner,
            ledger: self.ledger.clone(),
        }))
    }
}

#[derive(Debug)]
struct Counting {
    inner: HttpClient,
    ledger: Arc<RetryLedger>,
}

/// A request extension that replaces a PUT's body, after the request was signed and its
/// checksum headers computed, by these bytes of the same length: the start-up probe's way
/// to ask whether the server refuses a body damaged in transit.
#[derive(Debug, Clone)]
pub(super) struct DamagedBody(pub(super) bytes::Bytes);

#[async_trait::async_trait]
impl HttpService for Counting {
    async fn call(&self, request: HttpRequest) -> std::result::Result<HttpResponse, HttpError> {
        let request = match request.extensions().get::<DamagedBody>().cloned() {
            Some(DamagedBody(bytes)) => {
                let (parts, _) = request.into_parts();
                HttpRequest::from_parts(parts, bytes.into())
            }
            None => request,
        };
        let key = (request.method().clone(), request.uri().to_string());
        self.ledger.sent(&key);
        let answer = self.inner.execute(request).await;
        let failed = match &answer {
            Ok(response) => {
                response.status().is_server_error() || response.status().as_u16() == 429
            }
            Err(_) => true,
        };
        // A refused connection sent nothing; a 5xx or a transport failure after that may
        // follow a server that stored the body.
        let may_have_landed = key.0 == Method::PUT
            && match &answer {
                Ok(response) => response.status().is_server_error(),
                Err(e) => e.kind() != object_store::client::HttpErrorKind::Connect,
            };
        if may_have_landed {
            answer::put_may_have_landed();
        }
        self.ledger.answered(key, failed);
        let answer = match answer {
            Ok(response) if response.status().as_u16() >= 400 => observe_error(response).await,
            other => {
                answer::record(None);
                other
            }
        };
        if let Ok(response) = &answer {
            if is_permanent_refusal(response.status().as_u16()) {
                return Err(HttpError::new(
                    object_store::client::HttpErrorKind::Unknown,
                    PermanentRefusal(response.status()),
                ));
            }
        }
        if budget::spent() {
            return final_once_spent(answer);
        }
        answer
    }
}

/// Server errors that the same request sent again would get again: 501 Not Implemented (a
/// server or gateway without the feature asked for, such as multipart uploads) and 505.
/// `object_store` repeats every 5xx; repeating these spent a whole retry budget (20 s by
/// default) before a store without multipart uploads was known as one.
fn is_permanent_refusal(status: u16) -> bool {
    matches!(status, 501 | 505)
}

/// A server error made final at its first answer (see [`is_permanent_refusal`]); handed to
/// `object_store` as a transport error of a kind it does not repeat. The answer's status
/// and error code were recorded for the operation already, and classify it.
#[derive(Debug)]
struct PermanentRefusal(http::StatusCode);

impl std::fmt::Display for PermanentRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HTTP {}, not repeated: the store does not do this request",
            self.0
        )
    }
}

impl std::error::Error for PermanentRefusal {}

/// An attempt's outcome, with a failure `object_store` would repeat made final: the
/// operation's retry budget is spent. A transport error keeps its kind inside
/// [`BudgetSpent`] (by which it is classified); an error answer was recorded already.
fn final_once_spent(
    answer: std::result::Result<HttpResponse, HttpError>,
) -> std::result::Result<HttpResponse, HttpError> {
    use object_store::client::HttpErrorKind as Kind;
    let spent = match answer {
        Ok(response) => {
            let status = response.status().as_u16();
            if !(response.status().is_server_error() || status == 429 || status == 408) {
                return Ok(response);
            }
            BudgetSpent {
                kind: None,
                what: format!("HTTP {status}"),
                source: None,
            }
        }
        Err(e) => {
            let kind = e.kind();
            if matches!(kind, Kind::Unknown | Kind::Decode) {
                return Err(e);
            }
            BudgetSpent {
                kind: Some(kind),
                what: format!("{kind:?}"),
                source: Some(Box::new(e)),
            }
        }
    };
    Err(HttpError::new(Kind::Unknown, spent))
}

/// Records what an error response says (its status, and the store's error code from the
/// `x-ms-error-code` header or the XML body) for the operation under way, and hands the
/// response on with the same body, which `object_store` reads for its own error.
async fn observe_error(response: HttpResponse) -> std::result::Result<HttpResponse, HttpError> {
    let status = response.status().as_u16();
    let code_header = response
        .headers()
        .get("x-ms-error-code")
        .map(|h| h.as_bytes().to_vec());
    let declared = response
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let (parts, body) = response.into_parts();
    if declared.is_some_and(|bytes| bytes > answer::MAX_ERROR_BODY as u64) {
        answer::record(Some(answer::ErrorAnswer::of(
            status,
            code_header.as_deref(),
            b"",
        )));
        return Ok(HttpResponse::from_parts(parts, body));
    }
    match body.bytes().await {
        Ok(bytes) => {
            answer::record(Some(answer::ErrorAnswer::of(
                status,
                code_header.as_deref(),
                &bytes,
            )));
            Ok(HttpResponse::from_parts(parts, bytes.into()))
        }
        Err(e) => {
            // The answer was cut short: object_store would have failed reading it the same way.
            answer::record(None);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_bundle_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem").display().to_string();
        let e = read_ca_bundle(&missing).unwrap_err();
        assert!(
            e.message
                .starts_with(&format!("store.ca_bundle {missing}: ")),
            "{}",
            e.message
        );
        let text = dir.path().join("text.pem");
        std::fs::write(&text, "not a certificate\n").unwrap();
        let text = text.display().to_string();
        let e = read_ca_bundle(&text).unwrap_err();
        assert_eq!(
            e.message,
            format!("store.ca_bundle {text} holds no certificate")
        );
    }

    #[test]
    fn a_repeat_of_a_failed_request_is_a_retry() {
        let ledger = RetryLedger::default();
        let get = |path: &str| (Method::GET, format!("http://h/b/{path}"));
        ledger.sent(&get("a"));
        ledger.answered(get("a"), true);
        ledger.sent(&get("b")); // another request
        ledger.answered(get("b"), false);
        assert_eq!(ledger.retries(), 0);
        ledger.sent(&get("a")); // the repeat
        assert_eq!(ledger.retries(), 1);
        ledger.answered(get("a"), false);
        ledger.sent(&get("a")); // a new request after the success
        assert_eq!(ledger.retries(), 1);
        ledger.answered(get("a"), true);
        ledger.sent(&(Method::PUT, get("a").1)); // another method
        assert_eq!(ledger.retries(), 1);
    }
}
