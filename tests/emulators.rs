//! The Azure Blob and GCS emulators of the tests (`support::emulators`): each starts through
//! `scripts/emulators.sh`, gets a fresh container or bucket, and answers for it over plain
//! HTTP. (`tests/cloud.rs` runs the library's Azure and GCS stores on the `store` sections
//! checked here.)

mod support;

use support::emulators::{azure_shared_key_request, Emulator, AZURITE_ACCOUNT, AZURITE_KEY};
use support::http_plain;

#[test]
fn azurite_starts_and_serves_a_new_container() {
    let azurite = Emulator::shared_azurite();
    let store = azurite.new_store_json();
    assert_eq!(store["type"], "azure");
    assert_eq!(store["account"], AZURITE_ACCOUNT);
    assert_eq!(
        store["endpoint"],
        format!("http://127.0.0.1:{}/{AZURITE_ACCOUNT}", azurite.port)
    );
    let container = store["container"].as_str().unwrap();

    // The container exists (Get Container Properties, signed as Azurite demands).
    let path = format!("/{AZURITE_ACCOUNT}/{container}");
    let (status, body) = azure_shared_key_request(
        azurite.port,
        "GET",
        &path,
        &[("restype", "container")],
        AZURITE_KEY,
    )
    .unwrap();
    assert_eq!(
        status,
        200,
        "container {container}: {body}\n{}",
        azurite.log_tail()
    );
    // An unknown one does not, and an unsigned request is refused.
    let (status, _) = azure_shared_key_request(
        azurite.port,
        "GET",
        &format!("/{AZURITE_ACCOUNT}/no-such-container"),
        &[("restype", "container")],
        AZURITE_KEY,
    )
    .unwrap();
    assert_eq!(status, 404);
    let (status, _) =
        http_plain(azurite.port, "GET", &format!("{path}?restype=container")).unwrap();
    assert_eq!(status, 403, "Azurite answered an unsigned request");
    // A second container gets another name.
    assert_ne!(azurite.new_container(), container);
}

#[test]
fn gcs_emulator_starts_and_serves_a_new_bucket() {
    let gcs = Emulator::shared_gcs();
    let store = gcs.new_store_json();
    assert_eq!(store["type"], "gcs");
    assert_eq!(store["endpoint"], format!("http://127.0.0.1:{}", gcs.port));
    let bucket = store["bucket"].as_str().unwrap();

    // The bucket exists (JSON API), and an object in it is missing (XML API, as object_store
    // asks).
    let (status, body) = http_plain(gcs.port, "GET", &format!("/storage/v1/b/{bucket}")).unwrap();
    assert_eq!(status, 200, "bucket {bucket}: {body}\n{}", gcs.log_tail());
    let (status, _) = http_plain(gcs.port, "GET", &format!("/{bucket}/missing-object")).unwrap();
    assert_eq!(status, 404);
    // The service-account file points object_store at this emulator, without OAuth.
    let account: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(gcs.service_account()).unwrap()).unwrap();
    assert_eq!(account["gcs_base_url"], gcs.endpoint());
    assert_eq!(account["disable_oauth"], true);
    assert_eq!(
        store["service_account"],
        gcs.service_account().display().to_string()
    );
}
