//! HTTP client options shared by the Azure Blob and GCS stores: the same choices as the
//! S3 store's (many HTTP/1.1 connections, a large idle pool, the configured timeouts,
//! exponential backoff with jitter, extra trusted CAs).

use std::time::Duration;

use object_store::{BackoffConfig, ClientOptions, RetryConfig};

use crate::error::{Error, Result};

/// Client options for an endpoint; `allow_http` when its URL says http.
pub(super) fn client_options(
    connect_timeout_ms: u64,
    request_timeout_ms: u64,
    allow_http: bool,
    ca_bundle: &str,
) -> Result<ClientOptions> {
    let mut options = ClientOptions::new()
        // Many HTTP/1.1 connections rather than one multiplexed HTTP/2 connection.
        // reqwest sets TCP_NODELAY on every connection by default.
        .with_http1_only()
        .with_connect_timeout(Duration::from_millis(connect_timeout_ms))
        .with_timeout(Duration::from_millis(request_timeout_ms))
        .with_pool_max_idle_per_host(1024)
        .with_allow_http(allow_http);
    if !ca_bundle.is_empty() {
        for cert in load_ca_bundle(ca_bundle)? {
            options = options.with_root_certificate(cert);
        }
    }
    Ok(options)
}

/// Exponential backoff with jitter for 5xx, throttling, timeouts and resets.
pub(super) fn retry_config(request_timeout_ms: u64, max_retries: usize) -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(5),
            base: 2.0,
        },
        max_retries,
        retry_timeout: Duration::from_millis(
            request_timeout_ms.saturating_mul(max_retries as u64 + 1),
        ),
    }
}

fn load_ca_bundle(path: &str) -> Result<Vec<object_store::Certificate>> {
    let pem =
        std::fs::read(path).map_err(|e| Error::config(format!("store.ca_bundle {path}: {e}")))?;
    let certs = object_store::Certificate::from_pem_bundle(&pem)
        .map_err(|e| Error::config(format!("store.ca_bundle {path} is not a PEM bundle: {e}")))?;
    if certs.is_empty() {
        return Err(Error::config(format!(
            "store.ca_bundle {path} holds no certificate"
        )));
    }
    Ok(certs)
}

/// Whether a URL is plain http.
pub(super) fn is_http(url: &str) -> bool {
    url.get(..7)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("http://"))
}
