//! Azure Blob Storage (and Azurite): account URL, client options, retries, credentials.

use std::sync::Arc;

use object_store::azure::MicrosoftAzureBuilder;

use super::classify::error_chain;
use super::http_options::{client_options, retry_config, CountingConnector, RetryLedger};
use super::DynStore;
use crate::config::AzureConfig;
use crate::config::Endpoint;
use crate::error::{Error, Result};

/// Where the credentials come from, for messages.
pub(crate) fn credential_source(azure: &AzureConfig) -> &'static str {
    if !azure.access_key.is_empty() {
        "store.access_key"
    } else if !azure.sas.is_empty() {
        "store.sas"
    } else {
        "the Azure credential chain (AZURE_* environment variables, workload or managed identity)"
    }
}

/// An Azure Blob client for the configured container.
pub(super) fn open(
    azure: &AzureConfig,
    endpoint: &Endpoint,
) -> Result<(DynStore, Arc<RetryLedger>)> {
    let allow_http = !endpoint.tls();
    let options = client_options(azure.client_settings(), allow_http)?;
    // Explicit credentials leave the environment out: an AZURE_STORAGE_TOKEN there would
    // otherwise win over the configured key.
    let builder = if !azure.access_key.is_empty() {
        MicrosoftAzureBuilder::new().with_access_key(azure.access_key.expose())
    } else if !azure.sas.is_empty() {
        MicrosoftAzureBuilder::new().with_config(
            object_store::azure::AzureConfigKey::SasKey,
            azure.sas.expose(),
        )
    } else {
        MicrosoftAzureBuilder::from_env()
    };
    let (connector, retries) = CountingConnector::new();
    let built = builder
        .with_http_connector(connector)
        .with_account(&azure.account)
        .with_container_name(&azure.container)
        .with_endpoint(endpoint.url())
        .with_allow_http(allow_http)
        .with_client_options(options)
        .with_retry(retry_config(azure.client_settings()))
        .build()
        .map_err(|e| {
            Error::config(format!(
                "Azure store (container {:?}, credentials from {}): {}",
                azure.container,
                credential_source(azure),
                crate::redact::secrets(&error_chain(&e), &[&azure.access_key, &azure.sas])
            ))
        })?;
    log::debug!(
        "azure container {:?}: credentials from {}",
        azure.container,
        credential_source(azure)
    );
    Ok((Arc::new(built), retries))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn azure(json: &str) -> AzureConfig {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn account_url_defaults_to_azure() {
        let url = |c: &AzureConfig| c.account_endpoint().unwrap().to_string();
        assert_eq!(
            url(&azure(r#"{"account":"acct","container":"c"}"#)),
            "https://acct.blob.core.windows.net"
        );
        let c = azure(
            r#"{"account":"devstoreaccount1","container":"c","endpoint":"http://127.0.0.1:10000/devstoreaccount1/"}"#,
        );
        assert_eq!(url(&c), "http://127.0.0.1:10000/devstoreaccount1");
        assert!(!c.account_endpoint().unwrap().tls());
    }

    #[test]
    fn store_debug_shows_no_credentials() {
        let c = azure(
            r#"{"account":"a","container":"c","sas":"sv=2024&sig=debug-sig-value-123","endpoint":"http://127.0.0.1:1/a"}"#,
        );
        let config = crate::config::StoreConfig::Azure(c);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _guard = runtime.enter();
        let store = super::super::Store::open(&config).unwrap();
        let debug = format!("{store:?}");
        assert!(!debug.contains("debug-sig-value-123"), "{debug}");
        assert_eq!(
            store.describe(),
            "azure container \"c\" at http://127.0.0.1:1/a"
        );
    }
}
