//! S3 (and S3-compatible servers): endpoint, client options, retries, credentials.

use std::sync::Arc;

use object_store::aws::{AmazonS3Builder, Checksum};

use super::classify::error_chain;
use super::credentials::{resolve_credentials, CredentialSource};
use super::direct::DirectHttp;
use super::http_options::{client_options, retry_config, CountingConnector, RetryLedger};
use super::DynStore;
use crate::config::Endpoint;
use crate::config::{ChecksumPolicy, S3Config};
use crate::error::{Error, Result};

/// The endpoint handed to `object_store`. With virtual-hosted addressing the bucket is
/// part of the host name (`https://bucket.host:port`), as the AWS SDKs do with an
/// endpoint override; `object_store` expects the caller to have done that.
pub(crate) fn client_endpoint(s3: &S3Config, endpoint: &Endpoint) -> Endpoint {
    if s3.use_virtual_addressing {
        endpoint.with_host_label(&s3.bucket)
    } else {
        endpoint.clone()
    }
}

/// Whether PUTs carry `x-amz-checksum-crc64nvme`: unless `req_checksum` is `required`.
pub(super) fn sends_upload_checksum(s3: &S3Config) -> bool {
    s3.req_checksum != Some(ChecksumPolicy::Required)
}

/// An S3 client and what kvtier knows about it.
pub(super) struct S3Store {
    pub(super) client: DynStore,
    pub(super) credentials: CredentialSource,
    pub(super) direct: Option<Arc<DirectHttp>>,
    pub(super) retries: Arc<RetryLedger>,
}

pub(super) fn open(s3: &S3Config, endpoint: Option<&Endpoint>) -> Result<S3Store> {
    let resolved = resolve_credentials(s3, &|name| std::env::var(name).ok())?;
    let options = client_options(s3.client_settings(), s3.allow_http)?;
    let (connector, retries) = CountingConnector::new();
    let mut builder = AmazonS3Builder::from_env()
        .with_bucket_name(&s3.bucket)
        .with_client_options(options)
        .with_http_connector(connector)
        .with_retry(retry_config(s3.client_settings()))
        .with_virtual_hosted_style_request(s3.use_virtual_addressing)
        .with_unsigned_payload(!s3.payload_signing)
        .with_allow_http(s3.allow_http);
    // Every PUT carries a CRC64NVME of its body (`x-amz-checksum-crc64nvme`), which a server
    // that supports checksums verifies before it stores anything: a body damaged in transit
    // is refused (and sent again), never stored. CRC64NVME because it is the one checksum
    // `object_store` computes besides SHA-256, and with the same folding CRC as kvtier's
    // CRC32C it costs a few hundredths of a CPU-second per GiB, where SHA-256 costs tenths.
    // `req_checksum: "required"` (servers that reject checksum headers) sends none.
    if sends_upload_checksum(s3) {
        builder = builder.with_checksum_algorithm(Checksum::CRC64NVME);
    }
    let endpoint = endpoint.map(|endpoint| client_endpoint(s3, endpoint));
    if let Some(endpoint) = &endpoint {
        builder = builder.with_endpoint(endpoint.url());
    }
    let region = &resolved.region;
    builder = builder.with_region(region);
    if let Some(provider) = &resolved.provider {
        builder = builder.with_credentials(provider.clone());
    }
    log::debug!(
        "s3 bucket {:?}: credentials from {}",
        s3.bucket,
        resolved.source
    );
    let built = builder.build().map_err(|e| {
        Error::config(format!(
            "S3 store: {}",
            crate::redact::secrets(&error_chain(&e), &[&s3.secret_key, &s3.session_token])
        ))
    })?;
    let direct = endpoint.and_then(|endpoint| {
        DirectHttp::new(s3, &endpoint.url(), region, built.credentials().clone())
    });
    Ok(S3Store {
        client: Arc::new(built),
        credentials: resolved.source,
        direct,
        retries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(json: &str) -> S3Config {
        serde_json::from_str(json).unwrap()
    }

    fn endpoint_of(json: &str) -> Option<String> {
        let c = s3(json);
        c.endpoint()
            .unwrap()
            .map(|e| client_endpoint(&c, &e).to_string())
    }

    #[test]
    fn the_scheme_is_the_urls_else_the_settings_else_https() {
        assert_eq!(endpoint_of(r#"{"bucket":"b","scheme":"http"}"#), None);
        let of = |override_: &str, scheme: Option<&str>| {
            let mut json = serde_json::json!({"bucket": "b", "endpoint_override": override_});
            if let Some(scheme) = scheme {
                json["scheme"] = scheme.into();
            }
            endpoint_of(&json.to_string()).unwrap()
        };
        assert_eq!(of("localhost:9000", None), "https://localhost:9000");
        assert_eq!(of("localhost:9000", Some("http")), "http://localhost:9000");
        assert_eq!(
            of("https://s3.example.com/", Some("http")),
            "https://s3.example.com"
        );
        assert_eq!(of("HTTPS://h", None), "https://h");
    }

    #[test]
    fn virtual_addressing_puts_the_bucket_in_the_host() {
        assert_eq!(
            endpoint_of(
                r#"{"bucket":"kv","endpoint_override":"minio.local:9000","scheme":"http","use_virtual_addressing":true}"#
            )
            .unwrap(),
            "http://kv.minio.local:9000"
        );
        assert_eq!(
            endpoint_of(
                r#"{"bucket":"kv","endpoint_override":"https://kv.minio.local","use_virtual_addressing":true}"#
            )
            .unwrap(),
            "https://kv.minio.local"
        );
        assert_eq!(
            endpoint_of(r#"{"bucket":"kv","endpoint_override":"minio.local:9000"}"#).unwrap(),
            "https://minio.local:9000"
        );
    }

    #[test]
    fn an_unusable_override_is_a_config_error_naming_it() {
        let e = s3(r#"{"bucket":"b","endpoint_override":"ftp://h"}"#)
            .endpoint()
            .unwrap_err();
        assert_eq!(e.status, crate::error::Status::Config);
        assert!(
            e.message.contains("store.endpoint_override"),
            "{}",
            e.message
        );
    }
}
