//! The S3 credential chain, in the AWS SDKs' order. kvtier decides which source applies (so
//! that errors can name it); maintained code reads and resolves each one:
//! 1. `store.access_key`/`store.secret_key` (and `store.session_token`) in the configuration;
//! 2. `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN`), read by
//!    `object_store`'s `AmazonS3Builder::from_env`;
//! 3. the profile named by `AWS_PROFILE` (else `default`) of the shared config and
//!    credentials files, parsed and resolved by `aws-config`, the AWS SDK's own
//!    implementation: static keys, assume-role (`role_arn` with `source_profile` or
//!    `credential_source`), `credential_process`, IAM Identity Center (`sso_session` or the
//!    legacy `sso_*` keys, from the SSO token cache) and `web_identity_token_file`;
//! 4. web identity (`AWS_ROLE_ARN` + `AWS_WEB_IDENTITY_TOKEN_FILE`), the ECS/EKS container
//!    endpoints and the EC2 instance metadata service, resolved by `object_store` at
//!    request time.
//!
//! Secrets never reach a message: configured ones are [`Secret`]s, credentials from a
//! provider stay inside `object_store`'s signer, and dependency errors pass through
//! [`crate::redact`].

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_config::profile::ProfileFileCredentialsProvider;
use aws_config::provider_config::ProviderConfig;
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::ProvideCredentials;
use aws_runtime::env_config::file::{EnvConfigFileKind, EnvConfigFiles};
use aws_types::os_shim_internal::{Env as AwsEnv, Fs as AwsFs};
use object_store::aws::{AwsCredential, AwsCredentialProvider};
use object_store::{CredentialProvider, StaticCredentialProvider};

use super::classify::error_chain;
use crate::config::S3Config;
use crate::error::{Error, Result, Status};

/// Where the credentials of an S3 store come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialSource {
    /// `access_key`/`secret_key` in the tier configuration.
    Config,
    /// `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN`).
    Environment,
    /// A profile of the shared credentials or config file; `kind` names the profile key
    /// that says how its credentials are obtained (`aws_access_key_id`, `role_arn`, ...).
    Profile {
        profile: String,
        kind: &'static str,
        files: Vec<PathBuf>,
    },
    /// Resolved at request time by `object_store`: web identity (IRSA), ECS, EKS pod
    /// identity, or the EC2 instance metadata service.
    Provider(&'static str),
}

impl std::fmt::Display for CredentialSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CredentialSource::Config => f.write_str("store.access_key/store.secret_key"),
            CredentialSource::Environment => {
                f.write_str("the AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY environment variables")
            }
            CredentialSource::Profile {
                profile,
                kind,
                files,
            } => write!(
                f,
                "profile [{profile}] ({kind}) of {}",
                describe_files(files)
            ),
            CredentialSource::Provider(p) => f.write_str(p),
        }
    }
}

/// The outcome of the credential chain.
#[derive(Debug)]
pub(crate) struct ResolvedCredentials {
    /// `None` when `object_store` reads them itself (step 2) or resolves them at request
    /// time (step 4).
    pub(crate) provider: Option<AwsCredentialProvider>,
    pub(crate) source: CredentialSource,
    /// The signing region: `store.region`, else `AWS_REGION`, `AWS_DEFAULT_REGION`, the
    /// selected profile's `region`, else `us-east-1`. The store's requests and a profile's
    /// STS or SSO requests are signed for it.
    pub(crate) region: String,
}

/// Profile keys that say how a profile's credentials are obtained, most specific first:
/// the first one present names the profile's kind in messages.
const PROFILE_CREDENTIAL_KEYS: &[&str] = &[
    "role_arn",
    "credential_process",
    "sso_session",
    "sso_start_url",
    "web_identity_token_file",
    "aws_access_key_id",
    "aws_secret_access_key",
];

/// Walks the credential chain. `env` looks up an environment variable (the process
/// environment in production; a map in unit tests). A profile's credentials are resolved
/// once here, so that a broken profile fails the tier's start with its own reason.
pub(crate) fn resolve_credentials(
    s3: &S3Config,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ResolvedCredentials> {
    let var = |name: &str| env(name).filter(|v| !v.is_empty());
    let files = ProfileFiles::locate(&var);
    let selected = var("AWS_PROFILE");
    let profile_name = selected.clone().unwrap_or_else(|| "default".to_string());
    // The profile's region applies whichever step supplies the keys.
    let profile = files.load(&profile_name);
    let profile_region = profile
        .as_ref()
        .ok()
        .and_then(|p| p.as_ref())
        .and_then(|p| p.region.clone());
    let region = Some(s3.region.clone())
        .filter(|r| !r.is_empty())
        .or_else(|| var("AWS_REGION"))
        .or_else(|| var("AWS_DEFAULT_REGION"))
        .or(profile_region)
        .unwrap_or_else(|| "us-east-1".to_string());

    // 1. Explicit keys in the configuration replace the whole chain.
    if !s3.access_key.is_empty() {
        let credential = AwsCredential {
            key_id: s3.access_key.expose().to_string(),
            secret_key: s3.secret_key.expose().to_string(),
            token: (!s3.session_token.is_empty()).then(|| s3.session_token.expose().to_string()),
        };
        return Ok(ResolvedCredentials {
            provider: Some(Arc::new(StaticCredentialProvider::new(credential))),
            source: CredentialSource::Config,
            region,
        });
    }

    // 2. Environment variables, read by object_store's builder.
    match (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
        (Some(_), Some(_)) => {
            return Ok(ResolvedCredentials {
                provider: None,
                source: CredentialSource::Environment,
                region,
            })
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

    // 3. The shared config and credentials files.
    match profile? {
        Some(ProfileSummary {
            kind: Some(kind), ..
        }) => {
            let source = CredentialSource::Profile {
                profile: profile_name.clone(),
                kind,
                files: files.present.clone(),
            };
            let provider =
                ProfileCredentials::resolve(&files, &profile_name, &region).map_err(|e| {
                    Error::new(
                        Status::Auth,
                        format!(
                            "{source} could not be resolved: {}",
                            crate::redact::in_text(&e)
                        ),
                    )
                })?;
            return Ok(ResolvedCredentials {
                provider: Some(Arc::new(provider)),
                source,
                region,
            });
        }
        Some(_) => {
            log::debug!(
                "profile [{profile_name}] of {} holds no credentials; trying the next provider",
                describe_files(&files.present)
            );
        }
        None if selected.is_some() => {
            return Err(Error::new(
                Status::Auth,
                format!(
                    "AWS_PROFILE names profile [{profile_name}], which is in neither {} nor {}",
                    describe_file(files.credentials.as_deref()),
                    describe_file(files.config.as_deref()),
                ),
            ))
        }
        None => {}
    }

    // 4. Providers object_store resolves at request time.
    let web_identity =
        var("AWS_WEB_IDENTITY_TOKEN_FILE").is_some() && var("AWS_ROLE_ARN").is_some();
    let provider = if web_identity {
        "web identity (AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE)"
    } else if var("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").is_some() {
        "the ECS container credentials endpoint"
    } else if var("AWS_CONTAINER_CREDENTIALS_FULL_URI").is_some()
        && var("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE").is_some()
    {
        "the EKS pod identity endpoint"
    } else {
        let disabled =
            var("AWS_EC2_METADATA_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"));
        if disabled {
            return Err(Error::new(
                Status::Auth,
                format!(
                    "no S3 credentials found: store.access_key/secret_key are empty, AWS_ACCESS_KEY_ID is unset, \
                     {} and {} have no profile [{profile_name}] with credentials, no web identity or container \
                     credentials are configured, and AWS_EC2_METADATA_DISABLED forbids the instance metadata service",
                    describe_file(files.credentials.as_deref()),
                    describe_file(files.config.as_deref()),
                ),
            ));
        }
        "the EC2 instance metadata service (no keys in the configuration, environment or profile files)"
    };
    Ok(ResolvedCredentials {
        provider: None,
        source: CredentialSource::Provider(provider),
        region,
    })
}

fn describe_file(file: Option<&FsPath>) -> String {
    match file {
        Some(f) => f.display().to_string(),
        None => "(no HOME, so no default file)".to_string(),
    }
}

fn describe_files(files: &[PathBuf]) -> String {
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    names.join(" and ")
}

/// The shared credentials and config files, located as the AWS SDKs locate them.
struct ProfileFiles {
    credentials: Option<PathBuf>,
    config: Option<PathBuf>,
    /// The files among those two that exist.
    present: Vec<PathBuf>,
}

/// What kvtier needs to know of the selected profile before handing it to `aws-config`.
struct ProfileSummary {
    /// The first of [`PROFILE_CREDENTIAL_KEYS`] the profile sets; `None` if it sets none.
    kind: Option<&'static str>,
    region: Option<String>,
}

impl ProfileFiles {
    fn locate(var: &dyn Fn(&str) -> Option<String>) -> ProfileFiles {
        let home = var("HOME");
        let path = |override_var: &str, default: &str| {
            var(override_var)
                .map(|p| expand_home(&p, home.as_deref()))
                .or_else(|| home.as_ref().map(|h| FsPath::new(h).join(default)))
        };
        let credentials = path("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials");
        let config = path("AWS_CONFIG_FILE", ".aws/config");
        // A missing file is an empty one, as for the SDKs; one that exists but cannot be
        // read fails when the chain reaches the files.
        let present = [&credentials, &config]
            .into_iter()
            .flatten()
            .filter(|p| p.exists())
            .cloned()
            .collect();
        ProfileFiles {
            credentials,
            config,
            present,
        }
    }

    /// `aws-config`'s description of the files: exactly the present ones, so that neither
    /// the real environment nor a missing file changes what is read.
    fn aws_files(&self) -> EnvConfigFiles {
        let mut builder = EnvConfigFiles::builder()
            .include_default_config_file(false)
            .include_default_credentials_file(false);
        for (path, kind) in [
            (&self.credentials, EnvConfigFileKind::Credentials),
            (&self.config, EnvConfigFileKind::Config),
        ] {
            if let Some(path) = path.as_ref().filter(|p| self.present.contains(p)) {
                builder = builder.with_file(kind, path);
            }
        }
        builder.build()
    }

    /// The selected profile, parsed by `aws-config`; `Ok(None)` if no file defines it.
    fn load(&self, name: &str) -> Result<Option<ProfileSummary>> {
        if self.present.is_empty() {
            return Ok(None);
        }
        let files = self.aws_files();
        let name = name.to_string();
        let loaded = futures::executor::block_on(aws_config::profile::load(
            &AwsFs::real(),
            &AwsEnv::from_slice(&[]),
            &files,
            Some(name.clone().into()),
        ));
        let set = loaded.map_err(|e| {
            Error::new(
                Status::Auth,
                format!(
                    "cannot read the AWS profile files {}: {}",
                    describe_files(&self.present),
                    crate::redact::in_text(&error_chain(&e))
                ),
            )
        })?;
        Ok(set.get_profile(&name).map(|profile| ProfileSummary {
            kind: PROFILE_CREDENTIAL_KEYS
                .iter()
                .copied()
                .find(|k| profile.get(k).is_some()),
            region: profile.get("region").map(str::to_string),
        }))
    }
}

fn expand_home(path: &str, home: Option<&str>) -> PathBuf {
    match (path.strip_prefix("~/"), home) {
        (Some(rest), Some(home)) => FsPath::new(home).join(rest),
        _ => PathBuf::from(path),
    }
}

// ------------------------------------------------------------------------------------
// A profile's credentials behind object_store's provider trait

/// Credentials this close to their expiry are refreshed before use.
const REFRESH_BEFORE_EXPIRY: Duration = Duration::from_secs(5 * 60);

/// `aws-config`'s profile provider as an `object_store` credential provider, caching each
/// credential until shortly before it expires (static keys never do).
struct ProfileCredentials {
    provider: ProfileFileCredentialsProvider,
    cached: tokio::sync::Mutex<(Arc<AwsCredential>, Option<SystemTime>)>,
}

impl std::fmt::Debug for ProfileCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProfileCredentials")
    }
}

impl ProfileCredentials {
    fn provider(files: &ProfileFiles, name: &str, region: &str) -> ProfileFileCredentialsProvider {
        let config = ProviderConfig::without_region()
            .with_region(Some(aws_config::Region::new(region.to_string())));
        ProfileFileCredentialsProvider::builder()
            .configure(&config)
            .profile_files(files.aws_files())
            .profile_name(name)
            .build()
    }

    /// Resolves the profile once, on a runtime of its own (an assume-role or SSO profile
    /// makes HTTPS requests; the caller may or may not be inside a runtime). The provider
    /// kept for refreshes is a fresh one, so no connection of that runtime outlives it.
    fn resolve(
        files: &ProfileFiles,
        name: &str,
        region: &str,
    ) -> std::result::Result<Self, String> {
        let first = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    crate::signals::block_sigpipe_on_library_thread();
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| format!("cannot start a runtime to resolve it: {e}"))?;
                    runtime
                        .block_on(Self::provider(files, name, region).provide_credentials())
                        .map_err(|e| describe_credentials_error(&e))
                })
                .join()
                .unwrap_or_else(|_| Err("the resolver panicked".to_string()))
        })?;
        let expiry = first.expiry();
        Ok(ProfileCredentials {
            provider: Self::provider(files, name, region),
            cached: tokio::sync::Mutex::new((Arc::new(to_object_store(&first)), expiry)),
        })
    }
}

fn to_object_store(c: &aws_credential_types::Credentials) -> AwsCredential {
    AwsCredential {
        key_id: c.access_key_id().to_string(),
        secret_key: c.secret_access_key().to_string(),
        token: c.session_token().map(str::to_string),
    }
}

fn describe_credentials_error(e: &CredentialsError) -> String {
    match e {
        CredentialsError::CredentialsNotLoaded(_) => {
            format!("the profile yields no credentials ({})", error_chain(e))
        }
        _ => error_chain(e),
    }
}

fn needs_refresh(expiry: Option<SystemTime>) -> bool {
    expiry.is_some_and(|at| {
        at.duration_since(SystemTime::now())
            .map_or(true, |left| left < REFRESH_BEFORE_EXPIRY)
    })
}

#[async_trait::async_trait]
impl CredentialProvider for ProfileCredentials {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        let mut cached = self.cached.lock().await;
        if !needs_refresh(cached.1) {
            return Ok(cached.0.clone());
        }
        match self.provider.provide_credentials().await {
            Ok(fresh) => {
                *cached = (Arc::new(to_object_store(&fresh)), fresh.expiry());
                Ok(cached.0.clone())
            }
            // Still valid for a while: keep signing with it and try again next time.
            Err(e) if cached.1.is_some_and(|at| at > SystemTime::now()) => {
                log::warn!(
                    "refreshing S3 credentials from the profile failed ({}); the current ones stay in use until they expire",
                    describe_credentials_error(&e)
                );
                Ok(cached.0.clone())
            }
            Err(e) => Err(object_store::Error::Generic {
                store: "S3",
                source: describe_credentials_error(&e).into(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn s3(json: &str) -> S3Config {
        serde_json::from_str(json).unwrap()
    }

    fn env_of(pairs: &[(&str, String)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        move |name: &str| map.get(name).cloned()
    }

    fn credential(r: &ResolvedCredentials) -> Arc<AwsCredential> {
        let provider = r.provider.as_ref().expect("a provider");
        futures::executor::block_on(provider.get_credential()).unwrap()
    }

    const NO_KEYS: &str = r#"{"bucket":"b"}"#;

    #[test]
    fn chain_order_explicit_then_env_then_profile() {
        let dir = tempfile::tempdir().unwrap();
        let creds = dir.path().join("credentials");
        std::fs::write(
            &creds,
            "[default]\naws_access_key_id = AKIDFILE\naws_secret_access_key = file-secret-1\n",
        )
        .unwrap();
        let files = [
            ("AWS_SHARED_CREDENTIALS_FILE", creds.display().to_string()),
            (
                "AWS_CONFIG_FILE",
                dir.path().join("none").display().to_string(),
            ),
        ];
        let mut with_env = files.to_vec();
        with_env.push(("AWS_ACCESS_KEY_ID", "AKIDENV".to_string()));
        with_env.push(("AWS_SECRET_ACCESS_KEY", "env-secret-1".to_string()));

        let explicit = s3(r#"{"bucket":"b","access_key":"AKIDCONF","secret_key":"conf-secret-1"}"#);
        let r = resolve_credentials(&explicit, &env_of(&with_env)).unwrap();
        assert_eq!(r.source, CredentialSource::Config);
        let c = credential(&r);
        assert_eq!(c.key_id, "AKIDCONF");
        assert_eq!(c.token, None, "explicit keys take no token from elsewhere");

        let r = resolve_credentials(&s3(NO_KEYS), &env_of(&with_env)).unwrap();
        assert_eq!(r.source, CredentialSource::Environment);
        assert!(r.provider.is_none(), "object_store reads the variables");

        let r = resolve_credentials(&s3(NO_KEYS), &env_of(&files)).unwrap();
        assert!(
            matches!(&r.source, CredentialSource::Profile { profile, kind, files }
                if profile == "default" && *kind == "aws_access_key_id" && files == std::slice::from_ref(&creds)),
            "{:?}",
            r.source
        );
        assert_eq!(credential(&r).secret_key, "file-secret-1");
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
            "[default]\nregion = eu-west-1\n[profile team]\nregion = ap-south-1\n[profile cfgonly]\naws_access_key_id = AKIDCFG\naws_secret_access_key = cfg-secret\nregion = us-west-2\n",
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
        assert_eq!(credential(&r).key_id, "AKIDDEF");
        assert_eq!(r.region, "eu-west-1");

        let r = resolve_credentials(&s3(NO_KEYS), &env_of(&with_profile("cfgonly"))).unwrap();
        assert_eq!(credential(&r).key_id, "AKIDCFG");
        assert_eq!(r.region, "us-west-2");

        // A region-only profile: no credentials there, so the chain goes on (here to the
        // instance metadata service), keeping the profile's region.
        let r = resolve_credentials(&s3(NO_KEYS), &env_of(&with_profile("team"))).unwrap();
        assert!(matches!(r.source, CredentialSource::Provider(_)));
        assert_eq!(r.region, "ap-south-1");

        // Half a key pair: the SDK's own error, naming the profile and its kind.
        let e = resolve_credentials(&s3(NO_KEYS), &env_of(&with_profile("half"))).unwrap_err();
        assert_eq!(e.status, Status::Auth);
        assert!(
            e.message.contains("profile [half] (aws_secret_access_key)"),
            "{}",
            e.message
        );
        assert!(!e.message.contains("half-secret"), "{}", e.message);

        let e = resolve_credentials(&s3(NO_KEYS), &env_of(&with_profile("nosuch"))).unwrap_err();
        assert_eq!(e.status, Status::Auth);
        assert!(e.message.contains("[nosuch]"), "{}", e.message);
    }

    #[test]
    fn credential_process_and_assume_role_are_resolved_by_the_sdk() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("creds.sh");
        std::fs::write(
            &script,
            "#!/bin/sh\necho '{\"Version\": 1, \"AccessKeyId\": \"AKIDPROC\", \"SecretAccessKey\": \"proc-secret\", \"SessionToken\": \"proc-token\"}'\n",
        )
        .unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let config = dir.path().join("config");
        std::fs::write(
            &config,
            format!(
                "[profile proc]\ncredential_process = {}\n[profile broken]\ncredential_process = {}/missing\n\
                 [profile loop]\nrole_arn = arn:aws:iam::1:role/x\nsource_profile = loop\n",
                script.display(),
                dir.path().display()
            ),
        )
        .unwrap();
        let env = |p: &str| {
            vec![
                ("AWS_CONFIG_FILE", config.display().to_string()),
                ("AWS_PROFILE", p.to_string()),
            ]
        };
        let r = resolve_credentials(&s3(NO_KEYS), &env_of(&env("proc"))).unwrap();
        let c = credential(&r);
        assert_eq!(
            (c.key_id.as_str(), c.secret_key.as_str(), c.token.as_deref()),
            ("AKIDPROC", "proc-secret", Some("proc-token"))
        );
        assert!(r.source.to_string().contains("(credential_process)"));

        let e = resolve_credentials(&s3(NO_KEYS), &env_of(&env("broken"))).unwrap_err();
        assert_eq!(e.status, Status::Auth);
        assert!(
            e.message.contains("profile [broken] (credential_process)"),
            "{}",
            e.message
        );

        let e = resolve_credentials(&s3(NO_KEYS), &env_of(&env("loop"))).unwrap_err();
        assert_eq!(e.status, Status::Auth);
        assert!(
            e.message.contains("profile [loop] (role_arn)"),
            "{}",
            e.message
        );
    }

    #[test]
    fn providers_after_the_files() {
        let home = tempfile::tempdir().unwrap();
        let h = ("HOME", home.path().display().to_string());
        let r = resolve_credentials(
            &s3(NO_KEYS),
            &env_of(&[
                h.clone(),
                ("AWS_WEB_IDENTITY_TOKEN_FILE", "/t".into()),
                ("AWS_ROLE_ARN", "arn".into()),
            ]),
        )
        .unwrap();
        assert!(matches!(r.source, CredentialSource::Provider(p) if p.contains("web identity")));
        let r = resolve_credentials(
            &s3(NO_KEYS),
            &env_of(&[
                h.clone(),
                ("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "/v2/x".into()),
            ]),
        )
        .unwrap();
        assert!(matches!(r.source, CredentialSource::Provider(p) if p.contains("ECS")));
        let r = resolve_credentials(&s3(NO_KEYS), &env_of(std::slice::from_ref(&h))).unwrap();
        assert!(matches!(r.source, CredentialSource::Provider(p) if p.contains("metadata")));
        let e = resolve_credentials(
            &s3(NO_KEYS),
            &env_of(&[h, ("AWS_EC2_METADATA_DISABLED", "true".into())]),
        )
        .unwrap_err();
        assert_eq!(e.status, Status::Auth);
        assert!(
            e.message.contains("no S3 credentials found"),
            "{}",
            e.message
        );
    }

    #[test]
    fn unreadable_profile_file_matters_only_when_needed() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where the file should be: it exists and cannot be read.
        let creds = dir.path().join("credentials");
        std::fs::create_dir(&creds).unwrap();
        let env = [("AWS_SHARED_CREDENTIALS_FILE", creds.display().to_string())];
        let explicit = s3(r#"{"bucket":"b","access_key":"AK","secret_key":"sk"}"#);
        assert!(resolve_credentials(&explicit, &env_of(&env)).is_ok());
        let e = resolve_credentials(&s3(NO_KEYS), &env_of(&env)).unwrap_err();
        assert_eq!(e.status, Status::Auth);
        assert!(
            e.message.contains("cannot read the AWS profile files"),
            "{}",
            e.message
        );
    }

    #[test]
    fn refresh_policy() {
        assert!(!needs_refresh(None));
        assert!(needs_refresh(Some(SystemTime::now())));
        assert!(needs_refresh(Some(
            SystemTime::now() + Duration::from_secs(60)
        )));
        assert!(!needs_refresh(Some(
            SystemTime::now() + Duration::from_secs(3600)
        )));
    }
}
