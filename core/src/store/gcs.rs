//! Google Cloud Storage (and emulators of its XML API): base URL, client options, retries,
//! credentials, and the probe's question whether the bucket exists.

use std::sync::Arc;

use object_store::client::{
    HttpClient, HttpConnector, HttpRequest, HttpRequestBody, ReqwestConnector,
};
use object_store::gcp::{GcpCredentialProvider, GoogleCloudStorageBuilder};

use super::classify::error_chain;
use super::http_options::{client_options, retry_config, CountingConnector, RetryLedger};
use super::DynStore;
use crate::config::endpoint::parse_endpoint;
use crate::config::Endpoint;
use crate::config::GcsConfig;
use crate::error::{Error, Result};

const DEFAULT_BASE_URL: &str = "https://storage.googleapis.com";

/// The base URL requests go to: `endpoint`, else the service-account file's
/// `gcs_base_url` (as `object_store` reads it), else Google's.
pub(crate) fn base_url(gcs: &GcsConfig) -> String {
    if !gcs.endpoint.is_empty() {
        return gcs.endpoint.trim_end_matches('/').to_string();
    }
    if !gcs.service_account.is_empty() {
        let from_file = std::fs::read_to_string(&gcs.service_account)
            .ok()
            .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
            .and_then(|json| {
                json.get("gcs_base_url")?
                    .as_str()
                    .map(|url| url.trim_end_matches('/').to_string())
            });
        if let Some(url) = from_file {
            return url;
        }
    }
    DEFAULT_BASE_URL.to_string()
}

/// Where the credentials come from, for messages.
pub(crate) fn credential_source(gcs: &GcsConfig) -> String {
    if gcs.service_account.is_empty() {
        "the Google credential chain (GOOGLE_* environment variables, application default credentials, instance metadata)"
            .to_string()
    } else {
        format!("store.service_account {}", gcs.service_account)
    }
}

/// A GCS client and what the probe needs beside it.
pub(super) struct GcsStore {
    pub(super) client: DynStore,
    pub(super) bucket_check: Arc<BucketCheck>,
    pub(super) retries: Arc<RetryLedger>,
}

/// [`base_url`], parsed.
pub(crate) fn base_endpoint(gcs: &GcsConfig) -> Result<Endpoint> {
    let url = base_url(gcs);
    parse_endpoint(&url, "https").map_err(|why| {
        Error::config(format!(
            "the GCS base URL {url:?} (store.endpoint, or the service-account file's gcs_base_url) \
             is not a usable endpoint: {why}"
        ))
    })
}

pub(super) fn open(gcs: &GcsConfig, endpoint: &Endpoint) -> Result<GcsStore> {
    let url = endpoint.url();
    let options = client_options(gcs.client_settings(), !endpoint.tls())?;
    // An explicit file leaves the environment out (a GOOGLE_SERVICE_ACCOUNT_KEY there
    // would otherwise make the builder refuse two service accounts).
    let mut builder = if gcs.service_account.is_empty() {
        GoogleCloudStorageBuilder::from_env()
    } else {
        GoogleCloudStorageBuilder::new().with_service_account_path(&gcs.service_account)
    };
    if !gcs.endpoint.is_empty() {
        builder = builder.with_base_url(&url);
    }
    let (connector, retries) = CountingConnector::new();
    let built = builder
        .with_bucket_name(&gcs.bucket)
        .with_client_options(options.clone())
        .with_http_connector(connector)
        .with_retry(retry_config(gcs.client_settings()))
        .build()
        .map_err(|e| {
            Error::config(format!(
                "GCS store (bucket {:?}, credentials from {}): {}",
                gcs.bucket,
                credential_source(gcs),
                error_chain(&e)
            ))
        })?;
    log::debug!(
        "gcs bucket {:?}: credentials from {}",
        gcs.bucket,
        credential_source(gcs)
    );
    let http = ReqwestConnector::default().connect(&options).map_err(|e| {
        Error::config(format!(
            "GCS store (bucket {:?}): {}",
            gcs.bucket,
            error_chain(&e)
        ))
    })?;
    let bucket_check = Arc::new(BucketCheck {
        url: format!("{url}/storage/v1/b/{}?fields=name", gcs.bucket),
        credentials: built.credentials().clone(),
        http,
    });
    Ok(GcsStore {
        client: Arc::new(built),
        bucket_check,
        retries,
    })
}

/// Asks the JSON API for the bucket's own resource (`GET /storage/v1/b/BUCKET`): the one
/// answer that tells a missing bucket apart for certain. GCS's XML API already says
/// `NoSuchBucket` for an object of a missing bucket; emulators may answer a bare 404 there.
pub(crate) struct BucketCheck {
    url: String,
    credentials: GcpCredentialProvider,
    http: HttpClient,
}

impl BucketCheck {
    /// `Some(true)` when the service answered 404 for the bucket, `Some(false)` when it
    /// answered 200, `None` when it could not tell (no `storage.buckets.get` permission,
    /// an error).
    pub(crate) async fn bucket_missing(&self) -> Option<bool> {
        let token = match self.credentials.get_credential().await {
            Ok(credential) => credential.bearer.clone(),
            Err(e) => {
                log::debug!("gcs bucket check: no token ({})", error_chain(&e));
                return None;
            }
        };
        let mut request = HttpRequest::new(HttpRequestBody::from(Vec::new()));
        *request.uri_mut() = self.url.parse().ok()?;
        if !token.is_empty() {
            request
                .headers_mut()
                .insert("authorization", format!("Bearer {token}").try_into().ok()?);
        }
        match self.http.execute(request).await {
            Ok(response) => match response.status().as_u16() {
                404 => Some(true),
                200 => Some(false),
                status => {
                    log::debug!("gcs bucket check {}: HTTP {status}; cannot tell", self.url);
                    None
                }
            },
            Err(e) => {
                log::debug!("gcs bucket check {}: {}", self.url, error_chain(&e));
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gcs(json: &str) -> GcsConfig {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn base_url_from_endpoint_then_file_then_google() {
        assert_eq!(base_url(&gcs(r#"{"bucket":"b"}"#)), DEFAULT_BASE_URL);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sa.json");
        std::fs::write(
            &file,
            r#"{"gcs_base_url":"http://127.0.0.1:4443/","disable_oauth":true}"#,
        )
        .unwrap();
        let with_file = format!(
            r#"{{"bucket":"b","service_account":{:?}}}"#,
            file.display().to_string()
        );
        assert_eq!(base_url(&gcs(&with_file)), "http://127.0.0.1:4443");
        let both = format!(
            r#"{{"bucket":"b","service_account":{:?},"endpoint":"http://h:1"}}"#,
            file.display().to_string()
        );
        assert_eq!(base_url(&gcs(&both)), "http://h:1");
        assert!(credential_source(&gcs(&with_file)).contains("sa.json"));
    }

    #[test]
    fn missing_service_account_file_is_a_config_error_naming_it() {
        let c = gcs(r#"{"bucket":"b","service_account":"/nonexistent/kvtier-sa.json"}"#);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _guard = runtime.enter();
        let endpoint = base_endpoint(&c).unwrap();
        let e = open(&c, &endpoint).err().expect("a missing file must fail");
        assert_eq!(e.status, crate::error::Status::Config, "{}", e.message);
        assert!(
            e.message.contains("/nonexistent/kvtier-sa.json"),
            "{}",
            e.message
        );
    }
}
