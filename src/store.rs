//! The store abstraction: every backend is an `object_store::ObjectStore`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, RetryConfig};

use crate::config::{S3Config, StoreConfig};
use crate::error::{Error, Result, Status};

pub type DynStore = Arc<dyn ObjectStore>;

/// Builds the store a configuration describes. Does no I/O except creating a local root.
pub fn build_store(config: &StoreConfig) -> Result<DynStore> {
    match config {
        StoreConfig::Local(local) => {
            std::fs::create_dir_all(&local.path).map_err(|e| {
                Error::config(format!("cannot create local store directory {}: {e}", local.path.display()))
            })?;
            let fs = LocalFileSystem::new_with_prefix(&local.path)
                .map_err(|e| Error::config(format!("local store {}: {e}", local.path.display())))?
                .with_automatic_cleanup(true);
            Ok(Arc::new(fs))
        }
        StoreConfig::Memory(memory) => Ok(match &memory.name {
            None => Arc::new(InMemory::new()),
            Some(name) => named_memory_store(name),
        }),
        StoreConfig::S3(s3) => build_s3(s3),
    }
}

fn named_memory_store(name: &str) -> DynStore {
    static STORES: OnceLock<Mutex<HashMap<String, DynStore>>> = OnceLock::new();
    let mut stores = STORES.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    stores.entry(name.to_string()).or_insert_with(|| Arc::new(InMemory::new())).clone()
}

/// The endpoint URL for an `endpoint_override` that may or may not carry a scheme.
pub fn endpoint_url(endpoint_override: &str, scheme: Option<&str>) -> Option<String> {
    if endpoint_override.is_empty() {
        return None;
    }
    if endpoint_override.contains("://") {
        return Some(endpoint_override.trim_end_matches('/').to_string());
    }
    Some(format!("{}://{}", scheme.unwrap_or("https"), endpoint_override.trim_end_matches('/')))
}

fn build_s3(s3: &S3Config) -> Result<DynStore> {
    let mut options = ClientOptions::new()
        .with_http1_only()
        .with_connect_timeout(Duration::from_millis(s3.connect_timeout_ms))
        .with_timeout(Duration::from_millis(s3.request_timeout_ms))
        .with_pool_max_idle_per_host(1024)
        .with_allow_http(s3.allow_http);
    if !s3.ca_bundle.is_empty() {
        for cert in load_ca_bundle(&s3.ca_bundle)? {
            options = options.with_root_certificate(cert);
        }
    }
    let retry = RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(5),
            base: 2.0,
        },
        max_retries: s3.max_retries,
        retry_timeout: Duration::from_millis(s3.request_timeout_ms.saturating_mul(s3.max_retries as u64 + 1)),
    };
    let mut builder = AmazonS3Builder::from_env()
        .with_bucket_name(&s3.bucket)
        .with_client_options(options)
        .with_retry(retry)
        .with_virtual_hosted_style_request(s3.use_virtual_addressing)
        .with_unsigned_payload(!s3.payload_signing)
        .with_allow_http(s3.allow_http);
    if let Some(url) = endpoint_url(&s3.endpoint_override, s3.scheme.as_deref()) {
        builder = builder.with_endpoint(url);
    }
    builder = builder.with_region(if s3.region.is_empty() {
        std::env::var("AWS_REGION")
            .or_else(|_| std::env::var("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|_| "us-east-1".to_string())
    } else {
        s3.region.clone()
    });
    if !s3.access_key.is_empty() {
        builder = builder
            .with_access_key_id(s3.access_key.expose())
            .with_secret_access_key(s3.secret_key.expose());
        // Explicit keys replace the whole chain, including a token from the environment.
        builder = builder.with_token(s3.session_token.expose());
    }
    let store = builder
        .build()
        .map_err(|e| Error::config(format!("S3 store: {}", redact(&e.to_string(), s3))))?;
    Ok(Arc::new(store))
}

fn load_ca_bundle(path: &str) -> Result<Vec<object_store::Certificate>> {
    let pem = std::fs::read(path).map_err(|e| Error::config(format!("store.ca_bundle {path}: {e}")))?;
    let certs = object_store::Certificate::from_pem_bundle(&pem)
        .map_err(|e| Error::config(format!("store.ca_bundle {path} is not a PEM bundle: {e}")))?;
    if certs.is_empty() {
        return Err(Error::config(format!("store.ca_bundle {path} holds no certificate")));
    }
    Ok(certs)
}

/// Removes any configured secret from a message produced by a dependency.
pub fn redact(message: &str, s3: &S3Config) -> String {
    let mut out = message.to_string();
    for secret in [&s3.access_key, &s3.secret_key, &s3.session_token] {
        if !secret.is_empty() {
            out = out.replace(secret.expose(), "***");
        }
    }
    out
}

/// Maps a store error to the library status.
pub fn classify(error: &object_store::Error) -> Status {
    use object_store::Error as E;
    match error {
        E::NotFound { .. } => Status::NotFound,
        E::PermissionDenied { .. } => Status::PermissionDenied,
        E::Unauthenticated { .. } => Status::Auth,
        _ => {
            let text = error_chain(error);
            if text.contains("NoSuchBucket") {
                Status::BucketNotFound
            } else if text.contains("InvalidAccessKeyId")
                || text.contains("SignatureDoesNotMatch")
                || text.contains("ExpiredToken")
                || text.contains("InvalidToken")
            {
                Status::Auth
            } else if text.contains("AccessDenied") || text.contains("403 Forbidden") {
                Status::PermissionDenied
            } else if text.contains("certificate") || text.contains("InvalidCertificate") || text.contains("tls") {
                Status::Tls
            } else if text.contains("error sending request")
                || text.contains("onnection refused")
                || text.contains("dns error")
                || text.contains("error trying to connect")
            {
                Status::Connect
            } else if text.contains("timed out") || text.contains("Timeout") {
                Status::Timeout
            } else {
                Status::Io
            }
        }
    }
}

/// The error and all its sources as one line.
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
    text
}

/// Outcome of the start-up connectivity probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// The store answered "not found" (or found) for the probe key.
    Ready,
    /// The principal may read objects but gets 403 for missing keys (no ListBucket).
    /// Existence checks then treat 403 as "absent".
    ReadyWithoutList,
}

/// Looks up a key that never exists. "Not found" is success.
pub async fn probe(store: &DynStore, probe_name: &str, describe: &str) -> Result<ProbeOutcome> {
    let path = Path::from(probe_name);
    match store.head(&path).await {
        Ok(_) => Ok(ProbeOutcome::Ready),
        Err(e) => match classify(&e) {
            Status::NotFound => Ok(ProbeOutcome::Ready),
            Status::PermissionDenied => {
                // S3 answers HEAD without a body; a GET shows whether this is AccessDenied
                // for a missing key (no ListBucket) or a real refusal.
                match store.get(&path).await {
                    Err(ref ge) if classify(ge) == Status::NotFound => Ok(ProbeOutcome::Ready),
                    Err(ref ge) if error_chain(ge).contains("AccessDenied") => {
                        log::warn!(
                            "{describe}: the credentials get 403 for a missing key (no s3:ListBucket); \
                             starting anyway and treating 403 on existence checks as absent"
                        );
                        Ok(ProbeOutcome::ReadyWithoutList)
                    }
                    Err(ge) => Err(probe_error(classify(&ge), &error_chain(&ge), describe)),
                    Ok(_) => Ok(ProbeOutcome::Ready),
                }
            }
            status => Err(probe_error(status, &error_chain(&e), describe)),
        },
    }
}

fn probe_error(status: Status, detail: &str, describe: &str) -> Error {
    let advice = match status {
        Status::Connect => "the endpoint is unreachable: check endpoint_override, scheme and that the server is running",
        Status::Tls => "the server certificate could not be verified: check scheme and ca_bundle",
        Status::BucketNotFound => "the bucket does not exist: create it or fix store.bucket",
        Status::Auth => "the credentials were rejected: check access_key/secret_key/session_token or the default credential chain",
        Status::PermissionDenied => "access was denied: the credentials need s3:GetObject and s3:PutObject on the bucket",
        Status::Timeout => "the store did not answer in time: check endpoint_override and connect_timeout_ms",
        _ => "the store returned an error",
    };
    let status = if status == Status::Timeout || status == Status::Io { Status::Connect } else { status };
    Error::new(status, format!("connectivity probe of {describe} failed: {advice} ({detail})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_url_scheme_rules() {
        assert_eq!(endpoint_url("", Some("http")), None);
        assert_eq!(endpoint_url("localhost:9000", None).unwrap(), "https://localhost:9000");
        assert_eq!(endpoint_url("localhost:9000", Some("http")).unwrap(), "http://localhost:9000");
        assert_eq!(endpoint_url("https://s3.example.com/", Some("http")).unwrap(), "https://s3.example.com");
    }
}
