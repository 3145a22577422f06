//! Where a region is probed, parsed from its base URL.

use rustls::pki_types::ServerName;

use super::ProberError;

/// Host, port, path prefix and scheme of a region's base URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub host: String,
    pub port: u16,
    /// Path prefix of the base URL without a trailing slash or `/v1` (e.g. "" or "/proxy").
    pub prefix: String,
    /// https: the probe runs over TLS, verifying the certificate against `host`.
    pub tls: bool,
}

impl Target {
    /// Parse `http://host[:port][/prefix]` or `https://...`.
    pub fn parse(url: &str) -> Result<Self, ProberError> {
        let err = || ProberError::Url(url.to_owned());
        let (tls, rest) = if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else {
            return Err(err());
        };
        let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
        if authority.is_empty() || authority.contains('@') {
            return Err(err());
        }
        let default_port = if tls { 443 } else { 80 };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or_else(err)?;
            let port = match after.strip_prefix(':') {
                Some(p) => p.parse().map_err(|_| err())?,
                None if after.is_empty() => default_port,
                None => return Err(err()),
            };
            (h.to_owned(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_owned(), p.parse().map_err(|_| err())?),
                None => (authority.to_owned(), default_port),
            }
        };
        if host.is_empty() || port == 0 {
            return Err(err());
        }
        if path.bytes().any(|b| !b.is_ascii_graphic()) {
            return Err(err());
        }
        let target = Self {
            host,
            port,
            // Probe paths are from the server root: a base URL ending in /v1 (OpenAI style, as
            // regions are configured) has /health and /v1/models one level up.
            prefix: {
                let p = path.trim_end_matches('/');
                p.strip_suffix("/v1").unwrap_or(p).to_owned()
            },
            tls,
        };
        if tls && target.server_name().is_err() {
            return Err(err());
        }
        Ok(target)
    }

    /// `host:port` for the Host header (IPv6 literals bracketed).
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The name the certificate must match: a DNS name (also sent as SNI) or an IP address.
    pub fn server_name(&self) -> Result<ServerName<'static>, String> {
        ServerName::try_from(self.host.clone())
            .map_err(|e| format!("tls: {:?} is not a valid server name: {e}", self.host))
    }

    /// The request target for `path` (a probe path from the server root, after the prefix).
    pub fn request_path(&self, path: &str) -> String {
        format!("{}{path}", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hosts_ports_prefixes() {
        let t = Target::parse("http://127.0.0.1:8080/base/").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.prefix.as_str(), t.tls),
            ("127.0.0.1", 8080, "/base", false)
        );
        assert_eq!(t.request_path("/health"), "/base/health");
        let t = Target::parse("https://api.openai.com/v1").unwrap();
        assert_eq!((t.port, t.tls, t.prefix.as_str()), (443, true, ""));
        assert!(matches!(t.server_name(), Ok(ServerName::DnsName(_))));
        let t = Target::parse("http://h:1/proxy/v1/").unwrap();
        assert_eq!(t.prefix, "/proxy");
        let t = Target::parse("https://[::1]:81").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.authority()),
            ("::1", 81, "[::1]:81".to_owned())
        );
        assert!(matches!(t.server_name(), Ok(ServerName::IpAddress(_))));
        for bad in [
            "ftp://x",
            "http://",
            "http://h:notaport",
            "http://h:0",
            "http://u@h",
            "h:80",
            "http://h/a b",
            "https://bad host",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }
}
