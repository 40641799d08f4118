//! The store abstraction: every backend is an `object_store::ObjectStore`.
//!
//! The S3 part resolves credentials (explicit keys, then the AWS environment variables,
//! then the shared credentials/config files with `AWS_PROFILE`, then web identity, ECS/EKS
//! and instance metadata through `object_store`), builds the client, probes the bucket at
//! start-up and maps every failure to a [`Status`] with a message a user can act on.
//! Secrets are registered for redaction as soon as they are read, so no message built by
//! [`error_chain`] can carry them.

use std::collections::HashMap;
use std::path::{Path as FsPath, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, AwsCredential, Checksum};
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, RetryConfig, StaticCredentialProvider,
};

use crate::config::{ChecksumPolicy, S3Config, Secret, StoreConfig};
use crate::error::{Error, Result, Status};

use crate::direct_http::DirectHttp;

pub type DynStore = Arc<dyn ObjectStore>;

/// Builds the store a configuration describes. Does no I/O except creating a local root
/// and reading the AWS shared credentials/config files.
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

/// The endpoint handed to `object_store`. With virtual-hosted addressing the bucket is
/// part of the host name (`https://bucket.host:port`), as the AWS SDKs do with an
/// endpoint override; `object_store` expects the caller to have done that.
pub fn s3_endpoint(s3: &S3Config) -> Option<String> {
    let url = endpoint_url(&s3.endpoint_override, s3.scheme.as_deref())?;
    if !s3.use_virtual_addressing {
        return Some(url);
    }
    let (scheme, rest) = url.split_once("://").expect("endpoint_url always has a scheme");
    if rest.starts_with(&format!("{}.", s3.bucket)) {
        return Some(url);
    }
    Some(format!("{scheme}://{}.{rest}", s3.bucket))
}

// ------------------------------------------------------------------------------------
// Secrets and redaction

fn secret_registry() -> &'static RwLock<Vec<String>> {
    static SECRETS: OnceLock<RwLock<Vec<String>>> = OnceLock::new();
    SECRETS.get_or_init(Default::default)
}

/// Shortest value treated as a secret by [`scrub`]: replacing one- to three-character
/// strings everywhere would mangle messages without protecting anything.
const MIN_SCRUBBED_LEN: usize = 4;

/// Remembers a credential so that [`scrub`] removes it from every message of the process.
pub fn register_secret(value: &str) {
    if value.len() < MIN_SCRUBBED_LEN {
        return;
    }
    let mut secrets = secret_registry().write().unwrap_or_else(|p| p.into_inner());
    if !secrets.iter().any(|s| s == value) {
        secrets.push(value.to_string());
        // Longest first, so a secret that contains another is removed whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    }
}

/// Replaces every credential this process has read with `***`.
pub fn scrub(message: &str) -> String {
    let secrets = secret_registry().read().unwrap_or_else(|p| p.into_inner());
    let mut out = message.to_string();
    for secret in secrets.iter() {
        if out.contains(secret.as_str()) {
            out = out.replace(secret.as_str(), "***");
        }
    }
    out
}

/// Removes any configured secret from a message produced by a dependency.
pub fn redact(message: &str, s3: &S3Config) -> String {
    let mut out = message.to_string();
    for secret in [&s3.access_key, &s3.secret_key, &s3.session_token] {
        if !secret.is_empty() {
            out = out.replace(secret.expose(), "***");
        }
    }
    scrub(&out)
}

// ------------------------------------------------------------------------------------
// Credentials

/// Where the credentials of an S3 store come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialSource {
    /// `access_key`/`secret_key` in the tier configuration.
    Config,
    /// `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN`).
    Environment,
    /// A profile of the shared credentials or config file.
    Profile { profile: String, file: PathBuf },
    /// Resolved at request time by `object_store`: web identity (IRSA), ECS, EKS pod
    /// identity, or the EC2 instance metadata service.
    Provider(&'static str),
}

impl std::fmt::Display for CredentialSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CredentialSource::Config => f.write_str("store.access_key/store.secret_key"),
            CredentialSource::Environment => f.write_str("the AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY environment variables"),
            CredentialSource::Profile { profile, file } => write!(f, "profile [{profile}] of {}", file.display()),
            CredentialSource::Provider(p) => f.write_str(p),
        }
    }
}

/// Static credentials found by the chain. `Debug` never shows the secret parts.
#[derive(Clone)]
pub struct StaticCredentials {
    pub access_key: String,
    pub secret_key: Secret,
    pub session_token: Secret,
}

impl std::fmt::Debug for StaticCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaticCredentials")
            .field("access_key", &"***")
            .field("secret_key", &self.secret_key)
            .field("session_token", &self.session_token)
            .finish()
    }
}

/// The outcome of the credential chain.
#[derive(Debug, Clone)]
pub struct ResolvedCredentials {
    /// `None` when `object_store` resolves them itself (web identity, ECS, IMDS).
    pub credentials: Option<StaticCredentials>,
    pub source: CredentialSource,
    /// Region named by the selected profile in the config file, if any.
    pub profile_region: Option<String>,
}

/// Profile keys that describe credentials kvtier cannot obtain itself.
const UNSUPPORTED_PROFILE_KEYS: &[&str] =
    &["role_arn", "credential_process", "sso_session", "sso_start_url", "sso_account_id", "web_identity_token_file"];

/// Walks the credential chain. `env` looks up an environment variable (the process
/// environment in production; a map in unit tests).
pub fn resolve_credentials(s3: &S3Config, env: &dyn Fn(&str) -> Option<String>) -> Result<ResolvedCredentials> {
    let var = |name: &str| env(name).filter(|v| !v.is_empty());
    // Every credential in sight is registered before any error can be built.
    for name in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"] {
        if let Some(value) = var(name) {
            register_secret(&value);
        }
    }
    for secret in [&s3.access_key, &s3.secret_key, &s3.session_token] {
        register_secret(secret.expose());
    }

    let profile_name = var("AWS_PROFILE").or_else(|| var("AWS_DEFAULT_PROFILE"));
    let home = var("HOME");
    let credentials_file = var("AWS_SHARED_CREDENTIALS_FILE")
        .map(PathBuf::from)
        .or_else(|| home.as_ref().map(|h| FsPath::new(h).join(".aws/credentials")));
    let config_file = var("AWS_CONFIG_FILE")
        .map(PathBuf::from)
        .or_else(|| home.as_ref().map(|h| FsPath::new(h).join(".aws/config")));
    // An unreadable file matters only if the chain gets to the files (step 3).
    let profiles = ProfileFiles::read(credentials_file.as_deref(), config_file.as_deref());
    let selected = profile_name.clone().unwrap_or_else(|| "default".to_string());
    let profile = profiles.profile(&selected);
    let profile_region = profile.as_ref().and_then(|p| p.get("region").cloned());

    // 1. Explicit keys in the configuration replace the whole chain.
    if !s3.access_key.is_empty() {
        return Ok(ResolvedCredentials {
            credentials: Some(StaticCredentials {
                access_key: s3.access_key.expose().to_string(),
                secret_key: s3.secret_key.clone(),
                session_token: s3.session_token.clone(),
            }),
            source: CredentialSource::Config,
            profile_region,
        });
    }

    // 2. Environment variables.
    match (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
        (Some(access_key), Some(secret_key)) => {
            let token = var("AWS_SESSION_TOKEN").or_else(|| var("AWS_SECURITY_TOKEN")).unwrap_or_default();
            return Ok(ResolvedCredentials {
                credentials: Some(StaticCredentials {
                    access_key,
                    secret_key: Secret::new(secret_key),
                    session_token: Secret::new(token),
                }),
                source: CredentialSource::Environment,
                profile_region,
            });
        }
        (Some(_), None) => {
            return Err(Error::new(
                Status::Auth,
                "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not: set both, or neither",
            ))
        }
        (None, Some(_)) => {
            return Err(Error::new(
                Status::Auth,
                "AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not: set both, or neither",
            ))
        }
        (None, None) => {}
    }

    // 3. Shared credentials and config files.
    let web_identity = var("AWS_WEB_IDENTITY_TOKEN_FILE").is_some() && var("AWS_ROLE_ARN").is_some();
    let container = var("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").is_some()
        || (var("AWS_CONTAINER_CREDENTIALS_FULL_URI").is_some()
            && var("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE").is_some());
    if let Some(e) = &profiles.error {
        return Err(e.clone());
    }
    if let Some(profile) = &profile {
        match (profile.get("aws_access_key_id"), profile.get("aws_secret_access_key")) {
            (Some(access_key), Some(secret_key)) if !access_key.is_empty() && !secret_key.is_empty() => {
                let token = profile
                    .get("aws_session_token")
                    .or_else(|| profile.get("aws_security_token"))
                    .cloned()
                    .unwrap_or_default();
                return Ok(ResolvedCredentials {
                    credentials: Some(StaticCredentials {
                        access_key: access_key.clone(),
                        secret_key: Secret::new(secret_key.clone()),
                        session_token: Secret::new(token),
                    }),
                    source: CredentialSource::Profile { profile: selected, file: profile.file.clone() },
                    profile_region,
                });
            }
            (Some(_), _) | (_, Some(_)) => {
                return Err(Error::new(
                    Status::Auth,
                    format!(
                        "profile [{selected}] of {} has only one of aws_access_key_id and aws_secret_access_key: give both",
                        profile.file.display()
                    ),
                ))
            }
            _ => {}
        }
        if let Some(key) = UNSUPPORTED_PROFILE_KEYS.iter().find(|k| profile.get(k).is_some()) {
            let message = format!(
                "profile [{selected}] of {} uses {key}, which kvtier does not resolve: give the profile static keys, \
                 export AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (e.g. from `aws configure export-credentials`), \
                 or use web identity (AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE)",
                profile.file.display()
            );
            if !(web_identity || container) {
                return Err(Error::new(Status::Auth, message));
            }
            log::warn!("{message}; falling back to the next provider");
        }
    } else if let Some(name) = &profile_name {
        return Err(Error::new(
            Status::Auth,
            format!(
                "AWS_PROFILE names profile [{name}], which is in neither {} nor {}",
                describe_file(credentials_file.as_deref()),
                describe_file(config_file.as_deref()),
            ),
        ));
    }

    // 4. Providers object_store resolves at request time.
    let provider = if web_identity {
        "web identity (AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE)"
    } else if var("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").is_some() {
        "the ECS container credentials endpoint"
    } else if container {
        "the EKS pod identity endpoint"
    } else {
        let disabled = var("AWS_EC2_METADATA_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"));
        if disabled {
            return Err(Error::new(
                Status::Auth,
                format!(
                    "no S3 credentials found: store.access_key/secret_key are empty, AWS_ACCESS_KEY_ID is unset, \
                     {} and {} have no profile [{selected}] with keys, no web identity or container credentials \
                     are configured, and AWS_EC2_METADATA_DISABLED forbids the instance metadata service",
                    describe_file(credentials_file.as_deref()),
                    describe_file(config_file.as_deref()),
                ),
            ));
        }
        "the EC2 instance metadata service (no keys in the configuration, environment or profile files)"
    };
    Ok(ResolvedCredentials { credentials: None, source: CredentialSource::Provider(provider), profile_region })
}

fn describe_file(file: Option<&FsPath>) -> String {
    match file {
        Some(f) => f.display().to_string(),
        None => "(no HOME, so no default file)".to_string(),
    }
}

/// One profile: its keys and the file that defined them (the credentials file wins).
struct Profile {
    file: PathBuf,
    keys: HashMap<String, String>,
}

impl Profile {
    fn get(&self, key: &str) -> Option<&String> {
        self.keys.get(key)
    }
}

/// Sections of an INI file, each a map of lower-cased keys to values.
type Sections = HashMap<String, HashMap<String, String>>;

/// The shared credentials file (`[name]` sections) and config file (`[default]` and
/// `[profile name]` sections).
struct ProfileFiles {
    credentials: Option<(PathBuf, Sections)>,
    config: Option<(PathBuf, Sections)>,
    /// A file that exists but could not be read.
    error: Option<Error>,
}

impl ProfileFiles {
    fn read(credentials: Option<&FsPath>, config: Option<&FsPath>) -> ProfileFiles {
        let load = |path: Option<&FsPath>| -> Result<Option<(PathBuf, Sections)>> {
            let Some(path) = path else { return Ok(None) };
            match std::fs::read_to_string(path) {
                Ok(text) => {
                    let sections = parse_ini(&text);
                    for keys in sections.values() {
                        for (k, v) in keys {
                            if k.contains("secret") || k.contains("token") || k == "aws_access_key_id" {
                                register_secret(v);
                            }
                        }
                    }
                    Ok(Some((path.to_path_buf(), sections)))
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(Error::new(Status::Auth, format!("cannot read AWS profile file {}: {e}", path.display()))),
            }
        };
        let (credentials, config) = (load(credentials), load(config));
        let error = credentials.as_ref().err().or(config.as_ref().err()).cloned();
        ProfileFiles { credentials: credentials.ok().flatten(), config: config.ok().flatten(), error }
    }

    fn profile(&self, name: &str) -> Option<Profile> {
        let from_credentials = self.credentials.as_ref().and_then(|(f, s)| s.get(name).map(|k| (f, k)));
        let config_section = if name == "default" { "default".to_string() } else { format!("profile {name}") };
        let from_config = self.config.as_ref().and_then(|(f, s)| {
            s.get(&config_section).or_else(|| (name == "default").then(|| s.get("profile default")).flatten()).map(|k| (f, k))
        });
        match (from_credentials, from_config) {
            (None, None) => None,
            (Some((file, keys)), config) => {
                let mut merged = config.map(|(_, k)| k.clone()).unwrap_or_default();
                // The credentials file wins for credential keys; the config file keeps the rest.
                if keys.contains_key("aws_access_key_id") || keys.contains_key("aws_secret_access_key") {
                    merged.retain(|k, _| !k.starts_with("aws_"));
                }
                merged.extend(keys.iter().map(|(k, v)| (k.clone(), v.clone())));
                Some(Profile { file: file.clone(), keys: merged })
            }
            (None, Some((file, keys))) => Some(Profile { file: file.clone(), keys: keys.clone() }),
        }
    }
}

/// A small INI reader for the AWS files: `[section]`, `key = value`, `#`/`;` comments.
/// Keys are lower-cased; indented lines (nested sub-sections) are ignored.
fn parse_ini(text: &str) -> Sections {
    let mut sections = Sections::new();
    let mut current: Option<String> = None;
    for raw in text.lines() {
        if raw.starts_with([' ', '\t']) {
            continue;
        }
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = name.split_whitespace().collect::<Vec<_>>().join(" ");
            sections.entry(name.clone()).or_default();
            current = Some(name);
            continue;
        }
        let (Some(section), Some((key, value))) = (&current, line.split_once('=')) else { continue };
        let value = value.trim();
        // Inline comments need whitespace before them, as in the AWS CLI.
        let value = value.split(" #").next().unwrap_or(value).split(" ;").next().unwrap_or(value).trim();
        sections
            .get_mut(section)
            .expect("section inserted above")
            .insert(key.trim().to_ascii_lowercase(), value.to_string());
    }
    sections
}

// ------------------------------------------------------------------------------------
// S3 store

/// What the probe needs to know about an S3 store to explain a failure.
#[derive(Clone)]
struct StoreInfo {
    ca_bundle: String,
    credentials: CredentialSource,
    direct: Option<Arc<DirectHttp>>,
}

type InfoRegistry = Mutex<Vec<(Weak<dyn ObjectStore>, StoreInfo)>>;

fn info_registry() -> &'static InfoRegistry {
    static INFO: OnceLock<InfoRegistry> = OnceLock::new();
    INFO.get_or_init(Default::default)
}

fn remember_info(store: &DynStore, info: StoreInfo) {
    let mut registry = info_registry().lock().unwrap_or_else(|p| p.into_inner());
    registry.retain(|(w, _)| w.strong_count() > 0);
    registry.push((Arc::downgrade(store), info));
}

fn info_for(store: &DynStore) -> Option<StoreInfo> {
    let weak = Arc::downgrade(store);
    let registry = info_registry().lock().unwrap_or_else(|p| p.into_inner());
    registry.iter().find(|(w, _)| Weak::ptr_eq(w, &weak)).map(|(_, i)| i.clone())
}

fn build_s3(s3: &S3Config) -> Result<DynStore> {
    let resolved = resolve_credentials(s3, &|name| std::env::var(name).ok())?;
    let mut options = ClientOptions::new()
        // Many HTTP/1.1 connections rather than one multiplexed HTTP/2 connection.
        // reqwest sets TCP_NODELAY on every connection by default.
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
    // Exponential backoff with jitter for 5xx, 429/503 SlowDown, timeouts and resets.
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
    if s3.req_checksum == Some(ChecksumPolicy::Supported) {
        builder = builder.with_checksum_algorithm(Checksum::SHA256);
    }
    let endpoint = s3_endpoint(s3);
    if let Some(url) = &endpoint {
        builder = builder.with_endpoint(url);
    }
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let region = if !s3.region.is_empty() {
        s3.region.clone()
    } else {
        env("AWS_REGION")
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .or_else(|| resolved.profile_region.clone())
            .unwrap_or_else(|| "us-east-1".to_string())
    };
    builder = builder.with_region(&region);
    if let Some(creds) = &resolved.credentials {
        let credential = AwsCredential {
            key_id: creds.access_key.clone(),
            secret_key: creds.secret_key.expose().to_string(),
            token: (!creds.session_token.is_empty()).then(|| creds.session_token.expose().to_string()),
        };
        builder = builder.with_credentials(Arc::new(StaticCredentialProvider::new(credential)));
    }
    log::debug!("s3 bucket {:?}: credentials from {}", s3.bucket, resolved.source);
    let built = builder
        .build()
        .map_err(|e| Error::config(format!("S3 store: {}", redact(&error_chain(&e), s3))))?;
    let direct = endpoint.and_then(|url| DirectHttp::new(s3, &url, &region, built.credentials().clone()));
    let store: DynStore = Arc::new(built);
    remember_info(&store, StoreInfo { ca_bundle: s3.ca_bundle.clone(), credentials: resolved.source, direct });
    Ok(store)
}

/// The direct HTTP path of an S3 store, when its configuration allows one: see
/// [`crate::direct_http`].
pub fn direct_http_for(store: &DynStore) -> Option<Arc<DirectHttp>> {
    info_for(store)?.direct
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

// ------------------------------------------------------------------------------------
// Error classification

/// The S3 error code in a response body (`<Code>NoSuchKey</Code>`), if any.
pub fn s3_error_code(text: &str) -> Option<&str> {
    let start = text.find("<Code>")? + "<Code>".len();
    let len = text[start..].find("</Code>")?;
    Some(&text[start..start + len])
}

pub(crate) fn status_of_s3_code(code: &str) -> Option<Status> {
    Some(match code {
        "NoSuchBucket" => Status::BucketNotFound,
        "NoSuchKey" | "NotFound" => Status::NotFound,
        "InvalidAccessKeyId" | "SignatureDoesNotMatch" | "ExpiredToken" | "InvalidToken" | "TokenRefreshRequired"
        | "InvalidSecurity" | "AuthorizationHeaderMalformed" | "MissingSecurityHeader" | "RequestTimeTooSkewed"
        | "NotSignedUp" | "InvalidClientTokenId" => {
            Status::Auth
        }
        "AccessDenied" | "AllAccessDisabled" | "AccountProblem" => Status::PermissionDenied,
        "InvalidRange" => Status::LengthMismatch,
        "RequestTimeout" => Status::Timeout,
        _ => return None,
    })
}

/// The transport error inside a store error, if the failure happened below HTTP.
fn http_error<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a object_store::client::HttpError> {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(h) = e.downcast_ref::<object_store::client::HttpError>() {
            return Some(h);
        }
        current = e.source();
    }
    None
}

fn is_tls_text(text: &str) -> bool {
    let t = text.to_ascii_lowercase();
    t.contains("certificate")
        || t.contains("unknownissuer")
        || t.contains("tls")
        || t.contains("handshake")
        || t.contains("corrupt message")
}

/// Maps a store error to the library status.
pub fn classify(error: &object_store::Error) -> Status {
    use object_store::client::HttpErrorKind;
    use object_store::Error as E;
    let text = error_chain(error);
    // The S3 error code of a response body is the most precise signal: it tells a
    // missing bucket from a missing key, and bad credentials from a refused permission.
    if let Some(status) = s3_error_code(&text).and_then(status_of_s3_code) {
        return status;
    }
    match error {
        E::NotFound { .. } => return Status::NotFound,
        E::PermissionDenied { .. } => return Status::PermissionDenied,
        E::Unauthenticated { .. } => return Status::Auth,
        _ => {}
    }
    // A range the object cannot satisfy (416, or object_store's own range check): the
    // object is shorter than the block.
    if text.contains("status code: 416") || text.contains("Requested range was invalid") {
        return Status::LengthMismatch;
    }
    if let Some(http) = http_error(error) {
        let transport = error_chain(http);
        if is_tls_text(&transport) {
            return Status::Tls;
        }
        return match http.kind() {
            HttpErrorKind::Connect => Status::Connect,
            HttpErrorKind::Timeout => Status::Timeout,
            _ => Status::Io,
        };
    }
    if text.contains("InvalidAccessKeyId") || text.contains("SignatureDoesNotMatch") || text.contains("ExpiredToken") {
        Status::Auth
    } else if text.contains("403 Forbidden") {
        Status::PermissionDenied
    } else if text.contains("invalid peer certificate") || text.contains("UnknownIssuer") {
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

/// Whether a request that failed this way may have left no answer behind while the server
/// did or did not act on it: a timeout or a connection cut mid-exchange. `object_store`
/// repeats such requests only when it deems them idempotent, which a conditional PUT
/// (`If-None-Match: *`) is not in its eyes; for kvtier it is, because a repeat that finds
/// the object answers 412 and counts as stored.
pub fn is_interrupted(error: &object_store::Error) -> bool {
    use object_store::client::HttpErrorKind;
    http_error(error).is_some_and(|h| matches!(h.kind(), HttpErrorKind::Timeout | HttpErrorKind::Interrupted))
}

/// Retries (after the first attempt) the store configuration allows per request.
pub fn max_retries(config: &StoreConfig) -> usize {
    match config {
        StoreConfig::S3(s3) => s3.max_retries,
        _ => 0,
    }
}

/// `put_opts`, repeated on a timeout or a cut connection when `options` is a create
/// (`PutMode::Create`), up to `retries` times with exponential backoff and jitter, as
/// `object_store` does for the requests it repeats itself. A repeat answered 412 comes
/// back as `AlreadyExists`: the object is in the store.
pub async fn put_with_retries(
    store: &DynStore,
    path: &Path,
    payload: object_store::PutPayload,
    options: object_store::PutOptions,
    retries: usize,
) -> object_store::Result<object_store::PutResult> {
    let create = matches!(options.mode, object_store::PutMode::Create);
    let mut attempt = 0;
    loop {
        match store.put_opts(path, payload.clone(), options.clone()).await {
            Err(e) if create && attempt < retries && is_interrupted(&e) => {
                attempt += 1;
                let backoff = retry_backoff(attempt);
                log::info!(
                    "conditional PUT {path} interrupted ({}); retry {attempt} of {retries} in {} ms",
                    error_chain(&e),
                    backoff.as_millis()
                );
                tokio::time::sleep(backoff).await;
            }
            outcome => return outcome,
        }
    }
}

/// Backoff before retry `attempt` (1-based): 50 ms doubling up to 5 s, with full jitter
/// over its upper half.
fn retry_backoff(attempt: usize) -> Duration {
    let ceiling = 50u64.saturating_mul(1 << attempt.min(7).saturating_sub(1)).min(5_000);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let jitter = u64::from(nanos) % (ceiling / 2 + 1);
    Duration::from_millis(ceiling / 2 + jitter)
}

/// The error and all its sources as one line, with every known credential removed.
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
    scrub(&text)
}

// ------------------------------------------------------------------------------------
// Existence checks and the start-up probe

/// The one `Path` of an object name, used by every request about that object (PUT, GET,
/// HEAD, DELETE, on the general and the direct path): `Path::parse` keeps the name as it
/// is, so the HTTP layer percent-encodes it exactly once (`modèle` goes out as
/// `mod%C3%A8le`). `Path::from` would encode it first (`mod%C3%A8le` in the path, sent as
/// `mod%25C3%25A8le`), naming another object. Layout names always parse; anything else
/// falls back to `Path::from`.
pub fn object_path(name: &str) -> Path {
    Path::parse(name).unwrap_or_else(|_| Path::from(name))
}

/// Whether `path` exists, by HEAD. "Not found" is `false`; a 403 is `false` only when
/// `missing_is_forbidden` (the principal lacks ListBucket, so S3 answers 403 for missing
/// keys); anything else is an error.
pub async fn exists(store: &DynStore, path: &Path, missing_is_forbidden: bool) -> Result<bool> {
    match store.head(path).await {
        Ok(_) => Ok(true),
        Err(e) => match classify(&e) {
            Status::NotFound => Ok(false),
            Status::PermissionDenied if missing_is_forbidden => Ok(false),
            status => Err(Error::new(status, format!("exists {path}: {}", error_chain(&e)))),
        },
    }
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
///
/// A HEAD answer has no body, so a 404 or 403 is followed by a GET of the same key,
/// whose error body tells a missing key (`NoSuchKey`) from a missing bucket
/// (`NoSuchBucket`), and a principal without ListBucket (`AccessDenied`) from bad
/// credentials (`SignatureDoesNotMatch`, `InvalidAccessKeyId`). Some servers answer
/// `NoSuchKey` for a key of a missing bucket; a listing of the probe's directory settles
/// that.
pub async fn probe(store: &DynStore, probe_name: &str, describe: &str) -> Result<ProbeOutcome> {
    let path = object_path(probe_name);
    let info = info_for(store);
    let head_error = match store.head(&path).await {
        Ok(_) => return Ok(ProbeOutcome::Ready),
        Err(e) => e,
    };
    match classify(&head_error) {
        Status::NotFound | Status::PermissionDenied | Status::Auth => {}
        status => return Err(probe_error(status, &error_chain(&head_error), describe, info.as_ref())),
    }
    let get_error = match store.get(&path).await {
        Ok(_) => return Ok(ProbeOutcome::Ready),
        Err(e) => e,
    };
    let text = error_chain(&get_error);
    match classify(&get_error) {
        Status::NotFound => {}
        Status::PermissionDenied if s3_error_code(&text) == Some("AccessDenied") => {
            log::warn!(
                "{describe}: the credentials get 403 AccessDenied for a missing key (no s3:ListBucket); \
                 starting anyway and treating 403 on existence checks as absent"
            );
            return Ok(ProbeOutcome::ReadyWithoutList);
        }
        status => return Err(probe_error(status, &text, describe, info.as_ref())),
    }
    let directory = object_path(probe_name.rsplit_once('/').map_or("", |(dir, _)| dir));
    match store.list_with_delimiter(Some(&directory)).await {
        Err(e) if classify(&e) == Status::BucketNotFound => {
            Err(probe_error(Status::BucketNotFound, &error_chain(&e), describe, info.as_ref()))
        }
        Err(e) => {
            log::debug!("{describe}: listing the probe directory failed ({}); the bucket answered GET, so starting", error_chain(&e));
            Ok(ProbeOutcome::Ready)
        }
        Ok(_) => Ok(ProbeOutcome::Ready),
    }
}

fn probe_error(status: Status, detail: &str, describe: &str, info: Option<&StoreInfo>) -> Error {
    let credentials = info.map(|i| format!(" (credentials from {})", i.credentials)).unwrap_or_default();
    let advice = match status {
        Status::Connect => "the endpoint is unreachable: check endpoint_override, scheme and that the server is running"
            .to_string(),
        Status::Tls => tls_advice(detail, info),
        Status::BucketNotFound => "the bucket does not exist: create it or fix store.bucket".to_string(),
        Status::Auth => format!(
            "the credentials were rejected{}: check the access key, secret key and session token, and the region{credentials}",
            s3_error_code(detail).map(|c| format!(" ({c})")).unwrap_or_default()
        ),
        Status::PermissionDenied => format!(
            "access was denied: the credentials need s3:GetObject and s3:PutObject on the bucket{credentials}"
        ),
        Status::Timeout => {
            "the store did not answer in time: check endpoint_override, connect_timeout_ms and request_timeout_ms"
                .to_string()
        }
        _ => "the store returned an error: check endpoint_override, scheme and the server's logs".to_string(),
    };
    let status = if status == Status::Timeout || status == Status::Io { Status::Connect } else { status };
    Error::new(status, scrub(&format!("connectivity probe of {describe} failed: {advice} ({detail})")))
}

fn tls_advice(detail: &str, info: Option<&StoreInfo>) -> String {
    let ca_bundle = info.map(|i| i.ca_bundle.as_str()).filter(|c| !c.is_empty());
    let trusted = match ca_bundle {
        Some(path) => format!("the system roots plus store.ca_bundle {path}"),
        None => "the system roots (store.ca_bundle is not set)".to_string(),
    };
    if detail.contains("UnknownIssuer") || detail.contains("unknown issuer") {
        match ca_bundle {
            Some(path) => format!(
                "the server's certificate was issued by a CA that store.ca_bundle {path} does not hold: \
                 put the PEM certificate of the CA that signed the server's certificate in that file"
            ),
            None => format!(
                "the server's certificate was issued by an unknown CA (trusted: {trusted}): set store.ca_bundle \
                 to a PEM file holding the certificate of the CA that signed it"
            ),
        }
    } else if detail.contains("NotValidForName") || detail.contains("not valid for name") {
        "the server's certificate does not name the host of endpoint_override: connect by a name the certificate \
         lists, or reissue the certificate"
            .to_string()
    } else if detail.contains("Expired") || detail.contains("NotValidYet") {
        "the server's certificate is expired or not yet valid: renew it or check the clock".to_string()
    } else if detail.contains("corrupt message") || detail.contains("InvalidContentType") {
        "the server does not speak TLS on this port: use scheme http, or the server's TLS port".to_string()
    } else {
        format!("the server certificate could not be verified against {trusted}: check scheme and store.ca_bundle")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(json: &str) -> S3Config {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn endpoint_url_scheme_rules() {
        assert_eq!(endpoint_url("", Some("http")), None);
        assert_eq!(endpoint_url("localhost:9000", None).unwrap(), "https://localhost:9000");
        assert_eq!(endpoint_url("localhost:9000", Some("http")).unwrap(), "http://localhost:9000");
        assert_eq!(endpoint_url("https://s3.example.com/", Some("http")).unwrap(), "https://s3.example.com");
    }

    #[test]
    fn virtual_addressing_puts_the_bucket_in_the_host() {
        let c = s3(r#"{"bucket":"kv","endpoint_override":"minio.local:9000","scheme":"http","use_virtual_addressing":true}"#);
        assert_eq!(s3_endpoint(&c).unwrap(), "http://kv.minio.local:9000");
        let c = s3(r#"{"bucket":"kv","endpoint_override":"https://kv.minio.local","use_virtual_addressing":true}"#);
        assert_eq!(s3_endpoint(&c).unwrap(), "https://kv.minio.local");
        let c = s3(r#"{"bucket":"kv","endpoint_override":"minio.local:9000"}"#);
        assert_eq!(s3_endpoint(&c).unwrap(), "https://minio.local:9000");
        assert_eq!(s3_endpoint(&s3(r#"{"bucket":"kv"}"#)), None);
    }

    #[test]
    fn s3_codes_map_to_statuses() {
        let body = "Server returned non-2xx status code: 403 Forbidden: <?xml?><Error><Code>SignatureDoesNotMatch</Code></Error>";
        assert_eq!(s3_error_code(body), Some("SignatureDoesNotMatch"));
        assert_eq!(status_of_s3_code("SignatureDoesNotMatch"), Some(Status::Auth));
        assert_eq!(status_of_s3_code("NoSuchBucket"), Some(Status::BucketNotFound));
        assert_eq!(status_of_s3_code("AccessDenied"), Some(Status::PermissionDenied));
        assert_eq!(status_of_s3_code("SlowDown"), None);
        assert_eq!(s3_error_code("no body"), None);
    }

    #[test]
    fn scrub_removes_registered_secrets_only() {
        register_secret("sEcReT-value-for-scrub-test");
        register_secret("abc"); // too short to scrub
        let out = scrub("key sEcReT-value-for-scrub-test in abc");
        assert_eq!(out, "key *** in abc");
    }

    fn env_of(pairs: &[(&str, String)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        move |name: &str| map.get(name).cloned()
    }

    const NO_KEYS: &str = r#"{"bucket":"b"}"#;

    #[test]
    fn chain_order_explicit_then_env_then_profile() {
        let dir = tempfile::tempdir().unwrap();
        let creds = dir.path().join("credentials");
        std::fs::write(&creds, "[default]\naws_access_key_id = AKIDFILE\naws_secret_access_key = file-secret-1\n").unwrap();
        let files = [
            ("AWS_SHARED_CREDENTIALS_FILE", creds.display().to_string()),
            ("AWS_CONFIG_FILE", dir.path().join("none").display().to_string()),
        ];
        let mut with_env = files.to_vec();
        with_env.push(("AWS_ACCESS_KEY_ID", "AKIDENV".to_string()));
        with_env.push(("AWS_SECRET_ACCESS_KEY", "env-secret-1".to_string()));
        with_env.push(("AWS_SESSION_TOKEN", "env-token-1".to_string()));

        let explicit = s3(r#"{"bucket":"b","access_key":"AKIDCONF","secret_key":"conf-secret-1"}"#);
        let r = resolve_credentials(&explicit, &env_of(&with_env)).unwrap();
        assert_eq!(r.source, CredentialSource::Config);
        let c = r.credentials.unwrap();
        assert_eq!(c.access_key, "AKIDCONF");
        assert!(c.session_token.is_empty(), "explicit keys do not pick up the environment's token");

        let r = resolve_credentials(&s3(NO_KEYS), &env_of(&with_env)).unwrap();
        assert_eq!(r.source, CredentialSource::Environment);
        let c = r.credentials.unwrap();
        assert_eq!((c.access_key.as_str(), c.secret_key.expose(), c.session_token.expose()), ("AKIDENV", "env-secret-1", "env-token-1"));

        let r = resolve_credentials(&s3(NO_KEYS), &env_of(&files)).unwrap();
        assert!(matches!(r.source, CredentialSource::Profile { ref profile, .. } if profile == "default"));
        assert_eq!(r.credentials.unwrap().secret_key.expose(), "file-secret-1");
    }

    #[test]
    fn profile_selection_and_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let creds = dir.path().join("credentials");
        let config = dir.path().join("config");
        std::fs::write(
            &creds,
            "# comment\n[default]\naws_access_key_id=AKIDDEF\naws_secret_access_key=def-secret\n\n[half]\naws_secret_access_key = half-secret\n",
        )
        .unwrap();
        std::fs::write(
            &config,
            "[default]\nregion = eu-west-1\n[profile team]\nregion = ap-south-1\n[profile cfgonly]\naws_access_key_id = AKIDCFG\naws_secret_access_key = cfg-secret\nregion = us-west-2\n[profile assumed]\nrole_arn = arn:aws:iam::1:role/x\nsource_profile = default\n",
        )
        .unwrap();
        let base = vec![
            ("AWS_SHARED_CREDENTIALS_FILE", creds.display().to_string()),
            ("AWS_CONFIG_FILE", config.display().to_string()),
        ];
        let with_profile = |p: &str| {
            let mut e = base.clone();
            e.push(("AWS_PROFILE", p.to_string()));
            e
        };
        let r = resolve_credentials(&s3(NO_KEYS), &env_of(&base)).unwrap();
        assert_eq!(r.profile_region.as_deref(), Some("eu-west-1"));
        assert_eq!(r.credentials.unwrap().access_key, "AKIDDEF");

        let r = resolve_credentials(&s3(NO_KEYS), &env_of(&with_profile("half")));
        assert_eq!(r.unwrap_err().status, Status::Auth, "half a key pair is an error");

        let r = resolve_credentials(&s3(NO_KEYS), &env_of(&with_profile("cfgonly"))).unwrap();
        assert_eq!(r.profile_region.as_deref(), Some("us-west-2"));
        let c = r.credentials.unwrap();
        assert_eq!((c.access_key.as_str(), c.secret_key.expose()), ("AKIDCFG", "cfg-secret"));
        assert!(matches!(r.source, CredentialSource::Profile { ref file, .. } if file == &config));

        let e = resolve_credentials(&s3(NO_KEYS), &env_of(&with_profile("assumed"))).unwrap_err();
        assert_eq!(e.status, Status::Auth);
        assert!(e.message.contains("role_arn"), "{}", e.message);

        let e = resolve_credentials(&s3(NO_KEYS), &env_of(&with_profile("nope"))).unwrap_err();
        assert!(e.message.contains("[nope]"), "{}", e.message);
        assert!(!e.message.contains("def-secret"));
    }

    #[test]
    fn inline_comments_and_session_token_from_profile() {
        let dir = tempfile::tempdir().unwrap();
        let creds = dir.path().join("credentials");
        std::fs::write(
            &creds,
            "[team]\naws_access_key_id = AKIDTEAM\naws_secret_access_key = team-secret ; note\naws_session_token = team-token\n",
        )
        .unwrap();
        let env = vec![
            ("AWS_SHARED_CREDENTIALS_FILE", creds.display().to_string()),
            ("AWS_CONFIG_FILE", dir.path().join("none").display().to_string()),
            ("AWS_PROFILE", "team".to_string()),
        ];
        let c = resolve_credentials(&s3(NO_KEYS), &env_of(&env)).unwrap().credentials.unwrap();
        assert_eq!((c.secret_key.expose(), c.session_token.expose()), ("team-secret", "team-token"));
        let debug = format!("{c:?}");
        assert!(!debug.contains("team-secret") && !debug.contains("team-token") && !debug.contains("AKIDTEAM"), "{debug}");
    }

    #[test]
    fn providers_after_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let none = dir.path().join("none").display().to_string();
        let base = vec![("AWS_SHARED_CREDENTIALS_FILE", none.clone()), ("AWS_CONFIG_FILE", none)];
        let mut web = base.clone();
        web.push(("AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/token".to_string()));
        web.push(("AWS_ROLE_ARN", "arn:aws:iam::1:role/r".to_string()));
        let r = resolve_credentials(&s3(NO_KEYS), &env_of(&web)).unwrap();
        assert!(r.credentials.is_none());
        assert!(matches!(r.source, CredentialSource::Provider(p) if p.starts_with("web identity")));
        let mut ecs = base.clone();
        ecs.push(("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "/v2/creds".to_string()));
        let r = resolve_credentials(&s3(NO_KEYS), &env_of(&ecs)).unwrap();
        assert!(matches!(r.source, CredentialSource::Provider(p) if p.contains("ECS")));
        let r = resolve_credentials(&s3(NO_KEYS), &env_of(&base)).unwrap();
        assert!(matches!(r.source, CredentialSource::Provider(p) if p.contains("instance metadata")));
        let mut off = base.clone();
        off.push(("AWS_EC2_METADATA_DISABLED", "true".to_string()));
        let e = resolve_credentials(&s3(NO_KEYS), &env_of(&off)).unwrap_err();
        assert_eq!(e.status, Status::Auth);
        assert!(e.message.contains("no S3 credentials"), "{}", e.message);
        let mut half = base;
        half.push(("AWS_ACCESS_KEY_ID", "AKIDHALF".to_string()));
        assert_eq!(resolve_credentials(&s3(NO_KEYS), &env_of(&half)).unwrap_err().status, Status::Auth);
    }

    #[test]
    fn unreadable_profile_file_matters_only_when_needed() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where the file should be: reading it fails with something else than NotFound.
        let env = vec![
            ("AWS_SHARED_CREDENTIALS_FILE", dir.path().display().to_string()),
            ("AWS_CONFIG_FILE", dir.path().join("none").display().to_string()),
        ];
        let explicit = s3(r#"{"bucket":"b","access_key":"AKIDCONF","secret_key":"conf-secret-2"}"#);
        assert_eq!(resolve_credentials(&explicit, &env_of(&env)).unwrap().source, CredentialSource::Config);
        let e = resolve_credentials(&s3(NO_KEYS), &env_of(&env)).unwrap_err();
        assert_eq!(e.status, Status::Auth);
        assert!(e.message.contains("cannot read AWS profile file"), "{}", e.message);
    }

    #[test]
    fn ini_parser() {
        let s = parse_ini("[a]\nk = v # c\n[profile  b]\nK2=v2\n  nested = x\nnoequals\n");
        assert_eq!(s["a"]["k"], "v");
        assert_eq!(s["profile b"]["k2"], "v2");
        assert!(!s["profile b"].contains_key("nested"));
    }
}
