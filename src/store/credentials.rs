//! The S3 credential chain: explicit keys, then the AWS environment variables, then the
//! shared credentials/config files with `AWS_PROFILE`, then web identity, ECS/EKS and
//! instance metadata through `object_store`. Secrets are registered for redaction as soon
//! as they are read, so no message built by [`super::classify::error_chain`] can carry them.

use std::collections::HashMap;
use std::path::{Path as FsPath, PathBuf};
use std::sync::{OnceLock, RwLock};

use crate::config::{S3Config, Secret};
use crate::error::{Error, Result, Status};

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
            CredentialSource::Environment => {
                f.write_str("the AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY environment variables")
            }
            CredentialSource::Profile { profile, file } => {
                write!(f, "profile [{profile}] of {}", file.display())
            }
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
const UNSUPPORTED_PROFILE_KEYS: &[&str] = &[
    "role_arn",
    "credential_process",
    "sso_session",
    "sso_start_url",
    "sso_account_id",
    "web_identity_token_file",
];

/// Walks the credential chain. `env` looks up an environment variable (the process
/// environment in production; a map in unit tests).
pub fn resolve_credentials(
    s3: &S3Config,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ResolvedCredentials> {
    let var = |name: &str| env(name).filter(|v| !v.is_empty());
    // Every credential in sight is registered before any error can be built.
    for name in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
    ] {
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
        .or_else(|| {
            home.as_ref()
                .map(|h| FsPath::new(h).join(".aws/credentials"))
        });
    let config_file = var("AWS_CONFIG_FILE")
        .map(PathBuf::from)
        .or_else(|| home.as_ref().map(|h| FsPath::new(h).join(".aws/config")));
    // An unreadable file matters only if the chain gets to the files (step 3).
    let profiles = ProfileFiles::read(credentials_file.as_deref(), config_file.as_deref());
    let selected = profile_name
        .clone()
        .unwrap_or_else(|| "default".to_string());
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
            let token = var("AWS_SESSION_TOKEN")
                .or_else(|| var("AWS_SECURITY_TOKEN"))
                .unwrap_or_default();
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
    let web_identity =
        var("AWS_WEB_IDENTITY_TOKEN_FILE").is_some() && var("AWS_ROLE_ARN").is_some();
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
        if let Some(key) = UNSUPPORTED_PROFILE_KEYS
            .iter()
            .find(|k| profile.get(k).is_some())
        {
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
        let disabled =
            var("AWS_EC2_METADATA_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"));
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
    Ok(ResolvedCredentials {
        credentials: None,
        source: CredentialSource::Provider(provider),
        profile_region,
    })
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
                            if k.contains("secret")
                                || k.contains("token")
                                || k == "aws_access_key_id"
                            {
                                register_secret(v);
                            }
                        }
                    }
                    Ok(Some((path.to_path_buf(), sections)))
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(Error::new(
                    Status::Auth,
                    format!("cannot read AWS profile file {}: {e}", path.display()),
                )),
            }
        };
        let (credentials, config) = (load(credentials), load(config));
        let error = credentials
            .as_ref()
            .err()
            .or(config.as_ref().err())
            .cloned();
        ProfileFiles {
            credentials: credentials.ok().flatten(),
            config: config.ok().flatten(),
            error,
        }
    }

    fn profile(&self, name: &str) -> Option<Profile> {
        let from_credentials = self
            .credentials
            .as_ref()
            .and_then(|(f, s)| s.get(name).map(|k| (f, k)));
        let config_section = if name == "default" {
            "default".to_string()
        } else {
            format!("profile {name}")
        };
        let from_config = self.config.as_ref().and_then(|(f, s)| {
            s.get(&config_section)
                .or_else(|| {
                    (name == "default")
                        .then(|| s.get("profile default"))
                        .flatten()
                })
                .map(|k| (f, k))
        });
        match (from_credentials, from_config) {
            (None, None) => None,
            (Some((file, keys)), config) => {
                let mut merged = config.map(|(_, k)| k.clone()).unwrap_or_default();
                // The credentials file wins for credential keys; the config file keeps the rest.
                if keys.contains_key("aws_access_key_id")
                    || keys.contains_key("aws_secret_access_key")
                {
                    merged.retain(|k, _| !k.starts_with("aws_"));
                }
                merged.extend(keys.iter().map(|(k, v)| (k.clone(), v.clone())));
                Some(Profile {
                    file: file.clone(),
                    keys: merged,
                })
            }
            (None, Some((file, keys))) => Some(Profile {
                file: file.clone(),
                keys: keys.clone(),
            }),
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
        let (Some(section), Some((key, value))) = (&current, line.split_once('=')) else {
            continue;
        };
        let value = value.trim();
        // Inline comments need whitespace before them, as in the AWS CLI.
        let value = value
            .split(" #")
            .next()
            .unwrap_or(value)
            .split(" ;")
            .next()
            .unwrap_or(value)
            .trim();
        sections
            .get_mut(section)
            .expect("section inserted above")
            .insert(key.trim().to_ascii_lowercase(), value.to_string());
    }
    sections
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(json: &str) -> S3Config {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn scrub_removes_registered_secrets_only() {
        register_secret("sEcReT-value-for-scrub-test");
        register_secret("abc"); // too short to scrub
        let out = scrub("key sEcReT-value-for-scrub-test in abc");
        assert_eq!(out, "key *** in abc");
    }

    fn env_of(pairs: &[(&str, String)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        move |name: &str| map.get(name).cloned()
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
        with_env.push(("AWS_SESSION_TOKEN", "env-token-1".to_string()));

        let explicit = s3(r#"{"bucket":"b","access_key":"AKIDCONF","secret_key":"conf-secret-1"}"#);
        let r = resolve_credentials(&explicit, &env_of(&with_env)).unwrap();
        assert_eq!(r.source, CredentialSource::Config);
        let c = r.credentials.unwrap();
        assert_eq!(c.access_key, "AKIDCONF");
        assert!(
            c.session_token.is_empty(),
            "explicit keys do not pick up the environment's token"
        );

        let r = resolve_credentials(&s3(NO_KEYS), &env_of(&with_env)).unwrap();
        assert_eq!(r.source, CredentialSource::Environment);
        let c = r.credentials.unwrap();
        assert_eq!(
            (
                c.access_key.as_str(),
                c.secret_key.expose(),
                c.session_token.expose()
            ),
            ("AKIDENV", "env-secret-1", "env-token-1")
        );

        let r = resolve_credentials(&s3(NO_KEYS), &env_of(&files)).unwrap();
        assert!(
            matches!(r.source, CredentialSource::Profile { ref profile, .. } if profile == "default")
        );
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
        assert_eq!(
            r.unwrap_err().status,
            Status::Auth,
            "half a key pair is an error"
        );

        let r = resolve_credentials(&s3(NO_KEYS), &env_of(&with_profile("cfgonly"))).unwrap();
        assert_eq!(r.profile_region.as_deref(), Some("us-west-2"));
        let c = r.credentials.unwrap();
        assert_eq!(
            (c.access_key.as_str(), c.secret_key.expose()),
            ("AKIDCFG", "cfg-secret")
        );
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
            (
                "AWS_CONFIG_FILE",
                dir.path().join("none").display().to_string(),
            ),
            ("AWS_PROFILE", "team".to_string()),
        ];
        let c = resolve_credentials(&s3(NO_KEYS), &env_of(&env))
            .unwrap()
            .credentials
            .unwrap();
        assert_eq!(
            (c.secret_key.expose(), c.session_token.expose()),
            ("team-secret", "team-token")
        );
        let debug = format!("{c:?}");
        assert!(
            !debug.contains("team-secret")
                && !debug.contains("team-token")
                && !debug.contains("AKIDTEAM"),
            "{debug}"
        );
    }

    #[test]
    fn providers_after_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let none = dir.path().join("none").display().to_string();
        let base = vec![
            ("AWS_SHARED_CREDENTIALS_FILE", none.clone()),
            ("AWS_CONFIG_FILE", none),
        ];
        let mut web = base.clone();
        web.push(("AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/token".to_string()));
        web.push(("AWS_ROLE_ARN", "arn:aws:iam::1:role/r".to_string()));
        let r = resolve_credentials(&s3(NO_KEYS), &env_of(&web)).unwrap();
        assert!(r.credentials.is_none());
        assert!(matches!(r.source, CredentialSource::Provider(p) if p.starts_with("web identity")));
        let mut ecs = base.clone();
        ecs.push((
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
            "/v2/creds".to_string(),
        ));
        let r = resolve_credentials(&s3(NO_KEYS), &env_of(&ecs)).unwrap();
        assert!(matches!(r.source, CredentialSource::Provider(p) if p.contains("ECS")));
        let r = resolve_credentials(&s3(NO_KEYS), &env_of(&base)).unwrap();
        assert!(
            matches!(r.source, CredentialSource::Provider(p) if p.contains("instance metadata"))
        );
        let mut off = base.clone();
        off.push(("AWS_EC2_METADATA_DISABLED", "true".to_string()));
        let e = resolve_credentials(&s3(NO_KEYS), &env_of(&off)).unwrap_err();
        assert_eq!(e.status, Status::Auth);
        assert!(e.message.contains("no S3 credentials"), "{}", e.message);
        let mut half = base;
        half.push(("AWS_ACCESS_KEY_ID", "AKIDHALF".to_string()));
        assert_eq!(
            resolve_credentials(&s3(NO_KEYS), &env_of(&half))
                .unwrap_err()
                .status,
            Status::Auth
        );
    }

    #[test]
    fn unreadable_profile_file_matters_only_when_needed() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where the file should be: reading it fails with something else than NotFound.
        let env = vec![
            (
                "AWS_SHARED_CREDENTIALS_FILE",
                dir.path().display().to_string(),
            ),
            (
                "AWS_CONFIG_FILE",
                dir.path().join("none").display().to_string(),
            ),
        ];
        let explicit = s3(r#"{"bucket":"b","access_key":"AKIDCONF","secret_key":"conf-secret-2"}"#);
        assert_eq!(
            resolve_credentials(&explicit, &env_of(&env))
                .unwrap()
                .source,
            CredentialSource::Config
        );
        let e = resolve_credentials(&s3(NO_KEYS), &env_of(&env)).unwrap_err();
        assert_eq!(e.status, Status::Auth);
        assert!(
            e.message.contains("cannot read AWS profile file"),
            "{}",
            e.message
        );
    }

    #[test]
    fn ini_parser() {
        let s = parse_ini("[a]\nk = v # c\n[profile  b]\nK2=v2\n  nested = x\nnoequals\n");
        assert_eq!(s["a"]["k"], "v");
        assert_eq!(s["profile b"]["k2"], "v2");
        assert!(!s["profile b"].contains_key("nested"));
    }
}
