//! The start-up probe: what the store answers for a key that never exists, and whether
//! it honours conditional PUT.

use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};

use super::http_options::DamagedBody;
use super::UploadCheck;

use super::classify::{
    answered, classify, error_chain, is_damaged_body, tls_problem, Failed, TlsProblem,
};
use super::{object_path, Backend, Store};
use crate::error::{Error, Result, Status};

/// Outcome of the start-up connectivity probe.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProbeOutcome {
    /// The store answered "not found" (or found) for the probe key.
    Ready,
    /// The principal may read objects but gets 403 for missing keys (no ListBucket).
    /// Existence checks then treat 403 as "absent".
    ReadyWithoutList,
}

/// Looks up a key that never exists. "Not found" is success.
///
/// A HEAD answer has no body, so a 404 or 403 is followed by a GET of the same key,
/// whose error body tells a missing key (`NoSuchKey`) from a missing bucket
/// (`NoSuchBucket`), and a principal without ListBucket (`AccessDenied`) from bad
/// credentials (`SignatureDoesNotMatch`, `InvalidAccessKeyId`). Some servers answer
/// `NoSuchKey` for a key of a missing bucket; a listing of the probe's directory settles
/// that.
pub(super) async fn probe(store: &Store, probe_name: &str) -> Result<ProbeOutcome> {
    let path = object_path(probe_name);
    let describe = store.describe();
    let client = &store.client;
    let head_error = match answered(client.head(&path)).await {
        Ok(_) => return Ok(ProbeOutcome::Ready),
        Err(e) => e,
    };
    match classify(&head_error) {
        Status::NotFound | Status::PermissionDenied | Status::Auth => {}
        status => return Err(probe_error(status, &head_error, store)),
    }
    let get_error = match answered(client.get(&path)).await {
        Ok(_) => return Ok(ProbeOutcome::Ready),
        Err(e) => e,
    };
    match classify(&get_error) {
        Status::NotFound => {}
        Status::PermissionDenied if get_error.code() == Some("AccessDenied") => {
            log::warn!(
                "{describe}: the credentials get 403 AccessDenied for a missing key (no s3:ListBucket); \
                 starting anyway and treating 403 on existence checks as absent"
            );
            return Ok(ProbeOutcome::ReadyWithoutList);
        }
        status => return Err(probe_error(status, &get_error, store)),
    }
    if let Backend::Gcs { bucket_check, .. } = &store.backend {
        // GCS's XML API says NoSuchBucket above; an emulator's bare 404 is settled by the
        // bucket's own resource.
        if bucket_check.bucket_missing().await == Some(true) {
            return Err(probe_error(Status::BucketNotFound, &get_error, store));
        }
    }
    let directory = object_path(probe_name.rsplit_once('/').map_or("", |(dir, _)| dir));
    match answered(client.list_with_delimiter(Some(&directory))).await {
        Err(e) if classify(&e) == Status::BucketNotFound => {
            Err(probe_error(Status::BucketNotFound, &e, store))
        }
        Err(e) => {
            log::debug!("{describe}: listing the probe directory failed ({}); the bucket answered GET, so starting", e.chain());
            Ok(ProbeOutcome::Ready)
        }
        Ok(_) => Ok(ProbeOutcome::Ready),
    }
}

fn probe_error(status: Status, failed: &Failed, store: &Store) -> Error {
    let detail = failed.chain();
    let error = &failed.error;
    let describe = store.describe();
    let (ca_bundle, credentials) = match &store.backend {
        Backend::S3 {
            ca_bundle,
            credentials,
            ..
        } => (
            ca_bundle.as_str(),
            format!(" (credentials from {credentials})"),
        ),
        Backend::Azure {
            ca_bundle,
            credentials,
        } => (
            ca_bundle.as_str(),
            format!(" (credentials from {credentials})"),
        ),
        Backend::Gcs {
            ca_bundle,
            credentials,
            ..
        } => (
            ca_bundle.as_str(),
            format!(" (credentials from {credentials})"),
        ),
        _ => ("", String::new()),
    };
    let azure = matches!(store.backend, Backend::Azure { .. });
    let advice = match (status, &store.backend) {
        (Status::Tls, Backend::Azure { .. } | Backend::Gcs { .. }) => tls_advice(
            tls_problem(error),
            ca_bundle,
            "store.endpoint",
            "an http:// URL in store.endpoint",
        ),
        (_, Backend::Azure { .. } | Backend::Gcs { .. }) => {
            cloud_advice(status, azure, failed.code(), &credentials)
        }
        _ => s3_advice(status, failed, ca_bundle, &credentials),
    };
    let status = if status == Status::Timeout || status == Status::Io {
        Status::Connect
    } else {
        status
    };
    Error::new(
        status,
        crate::redact::in_text(&format!(
            "connectivity probe of {describe} failed: {advice} ({detail})"
        )),
    )
}

/// What to do about a failed probe of an Azure Blob or GCS store.
fn cloud_advice(status: Status, azure: bool, code: Option<&str>, credentials: &str) -> String {
    let code = code.map(|c| format!(" ({c})")).unwrap_or_default();
    match (status, azure) {
        (Status::Connect, _) => "the endpoint is unreachable: check store.endpoint and that the server is running".to_string(),
        (Status::BucketNotFound, true) => "the container does not exist: create it or fix store.container".to_string(),
        (Status::BucketNotFound, false) => "the bucket does not exist: create it or fix store.bucket".to_string(),
        (Status::Auth, true) => {
            format!("the credentials were rejected{code}: check store.access_key or store.sas, and store.account{credentials}")
        }
        (Status::Auth, false) => format!(
            "the credentials were rejected{code}: check store.service_account or the application default credentials{credentials}"
        ),
        (Status::PermissionDenied, true) => format!(
            "access was denied{code}: check store.access_key or store.sas (a wrong key is refused this way too) and that \
             they may read, write and delete blobs in the container{credentials}"
        ),
        (Status::PermissionDenied, false) => format!(
            "access was denied{code}: the credentials need storage.objects.get, create and delete on the bucket{credentials}"
        ),
        (Status::Timeout, _) => {
            "the store did not answer in time: check store.endpoint, connect_timeout_ms and request_timeout_ms".to_string()
        }
        _ => "the store returned an error: check store.endpoint and the server's logs".to_string(),
    }
}

/// What to do about a failed probe of an S3 store.
fn s3_advice(status: Status, failed: &Failed, ca_bundle: &str, credentials: &str) -> String {
    match status {
        Status::Connect => "the endpoint is unreachable: check endpoint_override, scheme and that the server is running"
            .to_string(),
        Status::Tls => tls_advice(tls_problem(&failed.error), ca_bundle, "endpoint_override", "scheme http"),
        Status::BucketNotFound => "the bucket does not exist: create it or fix store.bucket".to_string(),
        Status::Auth => format!(
            "the credentials were rejected{}: check the access key, secret key and session token, and the region{credentials}",
            failed.code().map(|c| format!(" ({c})")).unwrap_or_default()
        ),
        Status::PermissionDenied => format!(
            "access was denied: the credentials need s3:GetObject and s3:PutObject on the bucket{credentials}"
        ),
        Status::Timeout => {
            "the store did not answer in time: check endpoint_override, connect_timeout_ms and request_timeout_ms"
                .to_string()
        }
        _ => "the store returned an error: check endpoint_override, scheme and the server's logs".to_string(),
    }
}

/// `endpoint` names the key of the endpoint, `plain` how to ask for plain http.
fn tls_advice(problem: Option<TlsProblem>, ca_bundle: &str, endpoint: &str, plain: &str) -> String {
    let ca_bundle = Some(ca_bundle).filter(|c| !c.is_empty());
    let trusted = match ca_bundle {
        Some(path) => format!("the system roots plus store.ca_bundle {path}"),
        None => "the system roots (store.ca_bundle is not set)".to_string(),
    };
    match problem {
        Some(TlsProblem::UnknownIssuer) => match ca_bundle {
            Some(path) => format!(
                "the server's certificate was issued by a CA that store.ca_bundle {path} does not hold: \
                 put the PEM certificate of the CA that signed the server's certificate in that file"
            ),
            None => format!(
                "the server's certificate was issued by an unknown CA (trusted: {trusted}): set store.ca_bundle \
                 to a PEM file holding the certificate of the CA that signed it"
            ),
        },
        Some(TlsProblem::WrongName) => format!(
            "the server's certificate does not name the host of {endpoint}: \
             connect by a name the certificate lists, or reissue the certificate"
        ),
        Some(TlsProblem::Expired) => {
            "the server's certificate is expired or not yet valid: renew it or check the clock".to_string()
        }
        Some(TlsProblem::NotTls) => {
            format!("the server does not speak TLS on this port: use {plain}, or the server's TLS port")
        }
        Some(TlsProblem::Other) | None => {
            format!("the server certificate could not be verified against {trusted}: check scheme and store.ca_bundle")
        }
    }
}

/// Whether the store refuses a second create of one object. The object has one fixed
/// name per prefix, beside the probe key (never below it: on file-backed stores a child
/// would turn the probe key into a directory), so that a start whose delete is refused
/// leaves at most this one object behind, whoever started before.
pub(super) async fn honours_conditional_put(store: &Store, probe_name: &str) -> bool {
    let path = object_path(&format!("{probe_name}-conditional-put"));
    let client = &store.client;
    let create = || PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    let put = || client.put_opts(&path, PutPayload::from_static(b"kvtier"), create());
    let already =
        |r: &object_store::Result<_>| matches!(r, Err(object_store::Error::AlreadyExists { .. }));
    // A refused create proves the condition is honoured (the object is a leftover, or
    // another tier's probe in progress). A store that ignores it answers OK twice; as
    // another starting tier may delete the object between the two creates, that is asked
    // up to three times before it counts.
    let mut honoured = false;
    for _ in 0..3 {
        let first = put().await;
        honoured = already(&first) || (first.is_ok() && already(&put().await));
        if honoured || first.is_err() {
            break;
        }
    }
    if let Err(e) = client.delete(&path).await {
        if !matches!(e, object_store::Error::NotFound { .. }) {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                log::warn!(
                    "{}: cannot delete the start-up probe object {path} ({}); it stays (one object per prefix)",
                    store.describe(),
                    error_chain(&e)
                )
            });
        }
    }
    honoured
}

/// Whether the server refuses a body damaged in transit: a PUT whose body the client's
/// connector replaces, after the checksum headers were computed and the request signed, by
/// other bytes of the same length (one flipped byte). A refusal as damaged proves the check;
/// a stored body disproves it; any other failure (a principal that may not write there) is
/// not proof, and counts as not verified. The object sits beside the probe key, as the
/// conditional-PUT probe's does, and is deleted after.
pub(super) async fn checks_uploads(store: &Store, probe_name: &str) -> UploadCheck {
    const BODY: &[u8] = b"kvtier upload check";
    const DAMAGED: &[u8] = b"kvtier upload checl";
    let path = object_path(&format!("{probe_name}-upload-check"));
    let client = &store.client;
    let mut options = PutOptions::default();
    options
        .extensions
        .insert(DamagedBody(bytes::Bytes::from_static(DAMAGED)));
    let check = match answered(client.put_opts(&path, PutPayload::from_static(BODY), options)).await
    {
        Err(e) if is_damaged_body(&e) => {
            // Some servers keep the body they refused (s3s-fs 0.14 does).
            let _ = client.delete(&path).await;
            UploadCheck::Verified
        }
        Err(e) => {
            let text = e.chain();
            let sends_checksum = store.sends_upload_checksum();
            // A server that does not know the checksum header may refuse every PUT that
            // carries it: asked once more with the body intact, so that the tier fails at
            // start with the fix instead of failing every store.
            if sends_checksum && refused_as_a_request(&e) {
                match answered(client.put_opts(
                    &path,
                    PutPayload::from_static(BODY),
                    PutOptions::default(),
                ))
                .await
                {
                    Err(again) if refused_as_a_request(&again) => {
                        return UploadCheck::HeaderRefused(again.chain());
                    }
                    Err(_) => {}
                    Ok(_) => {
                        let _ = client.delete(&path).await;
                    }
                }
            }
            log::debug!(
                "{}: the upload-check probe failed ({text}); counting its uploads as not verified",
                store.describe(),
            );
            UploadCheck::NotVerified
        }
        Ok(_) => {
            let _ = client.delete(&path).await;
            UploadCheck::NotVerified
        }
    };
    if check == UploadCheck::NotVerified {
        log::info!(
            "{} stores an upload whose body was damaged in transit (it verifies neither \
             the request's checksum nor its payload hash): such a block is found only by a later \
             load's CRC32C check",
            store.describe()
        );
    }
    check
}

/// A PUT refused for what it carries: answered 400 or 501 (what a server answers a header
/// it does not know) with a code that says the request is invalid or not implemented, or
/// with no code that names another reason (credentials, a damaged body, a clock skew).
fn refused_as_a_request(failed: &Failed) -> bool {
    if is_damaged_body(failed) || !matches!(failed.http_status(), Some(400 | 501)) {
        return false;
    }
    match failed.code() {
        Some("InvalidArgument" | "InvalidRequest" | "NotImplemented" | "BadRequest") | None => true,
        Some(code) => {
            super::classify::status_of_s3_code(code).is_none()
                && super::classify::status_of_cloud_code(code).is_none()
        }
    }
}
