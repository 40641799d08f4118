//! A store's endpoint, parsed once by `url` into a typed value (scheme, host, port, base
//! path) that every user of it asks: the clients it is handed to, the direct path, the
//! store's description, whether requests go over TLS.

use url::Url;

/// An http or https endpoint: `scheme://host[:port][/base/path]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    url: Url,
}

impl Endpoint {
    /// Whether requests to it go over TLS.
    pub(crate) fn tls(&self) -> bool {
        self.url.scheme() == "https"
    }

    /// `http` or `https`.
    pub(crate) fn scheme(&self) -> &str {
        self.url.scheme()
    }

    /// The host as `url` normalises it (lowercase; an IPv6 address in brackets).
    pub(crate) fn host(&self) -> &str {
        self.url.host_str().unwrap_or_default()
    }

    /// The port, when it is not the scheme's default.
    pub(crate) fn port(&self) -> Option<u16> {
        self.url.port()
    }

    /// The path below the host, without a trailing slash ("" for none).
    pub(crate) fn base_path(&self) -> &str {
        self.url.path().trim_end_matches('/')
    }

    /// The same endpoint with `label.` before its host (virtual-hosted addressing puts
    /// the bucket there), unless the host already starts so.
    pub(crate) fn with_host_label(&self, label: &str) -> Endpoint {
        let host = self.host();
        if host.starts_with(&format!("{label}.")) {
            return self.clone();
        }
        let mut url = self.url.clone();
        if url.set_host(Some(&format!("{label}.{host}"))).is_err() {
            return self.clone();
        }
        Endpoint { url }
    }

    /// The endpoint as a URL without a trailing slash: `http://127.0.0.1:9000`,
    /// `https://acct.blob.core.windows.net/base`.
    pub(crate) fn url(&self) -> String {
        let mut text = format!("{}://{}", self.scheme(), self.host());
        if let Some(port) = self.port() {
            text.push_str(&format!(":{port}"));
        }
        text.push_str(self.base_path());
        text
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.url())
    }
}

/// Parses an endpoint: `scheme://host[:port][/path]`, or `host[:port][/path]` with
/// `default_scheme`. The error says what is wrong with it, for a message naming the
/// setting. Refused: other schemes than http and https, user information (credentials
/// belong in their own settings), a port of 0, characters a path cannot hold, control
/// characters (URL parsing would drop CR, LF and tabs silently).
pub(crate) fn parse_endpoint(text: &str, default_scheme: &str) -> Result<Endpoint, String> {
    if let Some(c) = text.chars().find(|c| c.is_control()) {
        return Err(format!("{c:?} cannot appear in an endpoint"));
    }
    let (scheme, rest) = match text.split_once("://") {
        Some((scheme, rest)) => (scheme, rest),
        None => (default_scheme, text),
    };
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "http" && scheme != "https" {
        return Err(format!(
            "the scheme is {scheme:?}; it must be http or https"
        ));
    }
    // `url` would percent-encode what a path cannot hold; an endpoint holding it is a typo.
    let path = rest.find('/').map_or("", |i| &rest[i..]);
    let path_ok = |c: char| c.is_ascii_alphanumeric() || "-._~!$&'()*+,;=:@/%".contains(c);
    if let Some(c) = path.chars().find(|&c| !path_ok(c)) {
        return Err(format!("{c:?} cannot appear in its path"));
    }
    let authority = &rest[..rest.len() - path.len()];
    if authority.contains('@') {
        return Err(
            "it carries user information; give credentials as access_key and secret_key".into(),
        );
    }
    let url = Url::parse(&format!("{scheme}://{rest}")).map_err(|e| match e {
        url::ParseError::InvalidPort => "the port is not a number from 1 to 65535".to_string(),
        url::ParseError::EmptyHost => "the host is empty".to_string(),
        url::ParseError::InvalidIpv6Address => "the IPv6 address is not valid".to_string(),
        other => other.to_string(),
    })?;
    if url.host_str().is_none_or(str::is_empty) {
        return Err("the host is empty".into());
    }
    if url.port() == Some(0) {
        return Err("the port 0 is not a number from 1 to 65535".into());
    }
    Ok(Endpoint { url })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_into_their_parts() {
        let e = parse_endpoint("minio.internal:9000", "https").unwrap();
        assert_eq!(
            (e.scheme(), e.host(), e.port(), e.base_path(), e.tls()),
            ("https", "minio.internal", Some(9000), "", true)
        );
        assert_eq!(e.to_string(), "https://minio.internal:9000");
        let e = parse_endpoint("http://127.0.0.1:10000/devstoreaccount1/", "https").unwrap();
        assert_eq!(
            (e.scheme(), e.host(), e.port(), e.base_path(), e.tls()),
            ("http", "127.0.0.1", Some(10000), "/devstoreaccount1", false)
        );
        assert_eq!(e.to_string(), "http://127.0.0.1:10000/devstoreaccount1");
        let e = parse_endpoint("HTTPS://S3.example.com:443/base", "http").unwrap();
        assert_eq!(e.to_string(), "https://s3.example.com/base");
        let e = parse_endpoint("[::1]", "http").unwrap();
        assert_eq!(
            (e.host(), e.to_string().as_str()),
            ("[::1]", "http://[::1]")
        );
        assert_eq!(
            parse_endpoint("s3_gw.local", "https").unwrap().host(),
            "s3_gw.local"
        );
    }

    #[test]
    fn virtual_hosting_puts_a_label_before_the_host() {
        let e = parse_endpoint("http://minio.local:9000", "https").unwrap();
        assert_eq!(
            e.with_host_label("kv").to_string(),
            "http://kv.minio.local:9000"
        );
        let e = parse_endpoint("https://kv.minio.local", "https").unwrap();
        assert_eq!(
            e.with_host_label("kv").to_string(),
            "https://kv.minio.local"
        );
    }

    #[test]
    fn unusable_endpoints_say_why() {
        for (bad, why) in [
            ("http://[::1", "IPv6"),
            ("http://127.0.0.1:99999", "port"),
            ("ht!tp://x", "scheme"),
            ("ftp://host", "scheme"),
            ("host:port", "port"),
            ("http://a b:9000", ""),
            ("http://:9000", "host"),
            ("http://[nope]:9000", "IPv6"),
            ("http://[::1]x", ""),
            ("http://h:0", "port"),
            ("http://u:p@h:9000", "user information"),
            ("http://h/a b", "path"),
            ("http://h:+80", "port"),
            ("http://h\r\nX: 1", "cannot appear"),
            ("http://", "host"),
        ] {
            match parse_endpoint(bad, "https") {
                Ok(e) => panic!("{bad:?} parsed as {e}"),
                Err(e) => assert!(e.contains(why), "{bad:?}: {e}"),
            }
        }
    }
}
