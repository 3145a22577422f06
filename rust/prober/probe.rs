//! One probe: `GET path` over HTTP/1.1 on a fresh TCP or TLS connection, up to the status line.
//!
//! RTT is the TCP connect plus the request's round trip (request written to status line read):
//! the TLS handshake is timed apart and left out, so an https region's RTT compares with a plain
//! one's and with what a request on an already open (pooled) connection sees. The timeout covers
//! everything, handshake included.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};

use super::settings::MAX_DURATION;
use super::target::Target;
use super::tls::Tls;

/// One probe's answer: the status and the timings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeAnswer {
    pub status: u16,
    /// TCP connect plus request round trip; excludes the TLS handshake.
    pub rtt: Duration,
    /// The TLS handshake, for an https region.
    pub handshake: Option<Duration>,
}

/// How much of the answer is read (and dropped) after the status line so the server sees an
/// orderly close rather than a reset.
const DRAIN_LIMIT: usize = 256 * 1024;
const STATUS_LINE_LIMIT: usize = 8192;

/// GET `path` (from the server root, after the target's prefix) and read the status line.
pub async fn probe_once(
    target: &Target,
    path: &str,
    timeout: Duration,
    tls: &Tls,
) -> Result<ProbeAnswer, String> {
    let started = Instant::now();
    // Capped: a huge timeout must not overflow the clock (a panic would end the region's probes).
    let deadline = started
        .checked_add(timeout.min(MAX_DURATION))
        .unwrap_or(started);
    let late = |phase: &str| format!("timeout after {:.3}s ({phase})", timeout.as_secs_f64());
    // Resolve the TLS side before connecting: a missing trust store is not the region's fault.
    let secure = if target.tls {
        Some((
            tls.connector().map_err(str::to_owned)?,
            target.server_name()?,
        ))
    } else {
        None
    };
    let tcp = timeout_at(
        deadline,
        TcpStream::connect((target.host.as_str(), target.port)),
    )
    .await
    .map_err(|_| late("connect"))?
    .map_err(|e| format!("connect: {e}"))?;
    let _ = tcp.set_nodelay(true);
    let connected = Instant::now();
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: router-prober\r\nAccept: */*\r\n\
         Connection: close\r\n\r\n",
        target.request_path(path),
        target.authority()
    );
    let exchanged = if let Some((connector, name)) = secure {
        let stream = timeout_at(deadline, connector.connect(name, tcp))
            .await
            .map_err(|_| late("tls handshake"))?
            .map_err(|e| format!("tls: {e}"))?;
        let secured = Instant::now();
        let (status, answered) = exchange(stream, request.as_bytes(), deadline)
            .await
            .map_err(|e| e.unwrap_or_else(|| late("waiting for the status line")))?;
        (status, answered - secured, Some(secured - connected))
    } else {
        let (status, answered) = exchange(tcp, request.as_bytes(), deadline)
            .await
            .map_err(|e| e.unwrap_or_else(|| late("waiting for the status line")))?;
        (status, answered - connected, None)
    };
    let (status, round_trip, handshake) = exchanged;
    Ok(ProbeAnswer {
        status,
        rtt: (connected - started) + round_trip,
        handshake,
    })
}

/// Write the request, read up to the status line (stamped when it arrives), then drain and
/// close within the deadline. Err(None) is the deadline passing before the status line.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    request: &[u8],
    deadline: Instant,
) -> Result<(u16, Instant), Option<String>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let head = async {
        stream
            .write_all(request)
            .await
            .map_err(|e| format!("write: {e}"))?;
        loop {
            let n = stream
                .read(&mut chunk)
                .await
                .map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                return Err("connection closed before the status line".to_owned());
            }
            buf.extend_from_slice(&chunk[..n]);
            if let Some(end) = buf.windows(2).position(|w| w == b"\r\n") {
                return Ok((parse_status_line(&buf[..end])?, Instant::now()));
            }
            if buf.len() > STATUS_LINE_LIMIT {
                return Err("status line too long".to_owned());
            }
        }
    };
    let answer = timeout_at(deadline, head).await.map_err(|_| None)?;
    let answer = answer.map_err(Some)?;
    // The verdict is in: what follows only keeps the close orderly, and never fails the probe.
    let drain = async {
        let mut drained = buf.len();
        while drained < DRAIN_LIMIT {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
        let _ = stream.shutdown().await;
    };
    let _ = timeout_at(deadline, drain).await;
    Ok(answer)
}

/// The status code of an `HTTP/1.x NNN reason` line.
pub fn parse_status_line(line: &[u8]) -> Result<u16, String> {
    let text = std::str::from_utf8(line).map_err(|_| "status line is not text".to_owned())?;
    let mut parts = text.split(' ');
    let version = parts.next().unwrap_or("");
    let code = parts.next().unwrap_or("");
    if !version.starts_with("HTTP/1.") || code.len() != 3 {
        return Err(format!("bad status line {text:?}"));
    }
    code.parse()
        .map_err(|_| format!("bad status line {text:?}"))
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    use rustls::RootCertStore;
    use tokio::net::TcpListener;
    use tokio::task::JoinHandle;
    use tokio_rustls::TlsAcceptor;

    use super::*;

    /// A CA made now, and a server certificate it signed for some names.
    pub struct Pki {
        pub ca: CertificateDer<'static>,
        pub ca_pem: String,
        chain: Vec<CertificateDer<'static>>,
        key: Vec<u8>,
    }

    impl Pki {
        /// The server certificate is for `localhost` and 127.0.0.1.
        pub fn new() -> Self {
            Self::for_names(&["localhost", "127.0.0.1"])
        }

        pub fn for_names(names: &[&str]) -> Self {
            // A distinct subject per CA: another CA of the same name would be a bad signature,
            // not the unknown issuer a wrong CA is in practice.
            static SERIAL: AtomicU32 = AtomicU32::new(0);
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            let n = SERIAL.fetch_add(1, Ordering::Relaxed);
            params
                .distinguished_name
                .push(DnType::CommonName, format!("router test CA {n}"));
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
            let key = KeyPair::generate().unwrap();
            let names: Vec<String> = names.iter().map(|&n| n.to_owned()).collect();
            let leaf = CertificateParams::new(names)
                .unwrap()
                .signed_by(&key, &ca)
                .unwrap();
            Self {
                ca: ca.der().clone(),
                ca_pem: ca.pem(),
                chain: vec![leaf.der().clone()],
                key: key.serialize_der(),
            }
        }

        /// A client trusting only this CA.
        pub fn client(&self) -> Tls {
            let mut roots = RootCertStore::empty();
            roots.add(self.ca.clone()).unwrap();
            Tls::with_roots(roots)
        }

        fn acceptor(&self) -> TlsAcceptor {
            let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.clone()));
            let config = rustls::ServerConfig::builder_with_provider(super::super::tls::provider())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(self.chain.clone(), key)
                .unwrap();
            TlsAcceptor::from(Arc::new(config))
        }
    }

    /// Answer one request: `health_status` on `/health`, 200 on `/v1/models`, 404 elsewhere,
    /// after `delay`.
    async fn answer<S: AsyncRead + AsyncWrite + Unpin>(
        mut sock: S,
        health_status: u16,
        delay: Duration,
    ) {
        let mut buf = vec![0u8; 2048];
        let mut got = 0;
        // Like a real HTTP server, answer a TLS ClientHello (0x16) with a 400 at once.
        while !buf[..got].windows(4).any(|w| w == b"\r\n\r\n") && buf[0] != 0x16 {
            match sock.read(&mut buf[got..]).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got += n,
            }
        }
        let head = String::from_utf8_lossy(&buf[..got]).to_string();
        let status = if buf[0] == 0x16 {
            400
        } else if head.starts_with("GET /health ") {
            health_status
        } else if head.starts_with("GET /v1/models ") || head.starts_with("GET /live ") {
            200
        } else {
            404
        };
        tokio::time::sleep(delay).await;
        let body = "{}";
        let resp = format!(
            "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = sock.write_all(resp.as_bytes()).await;
        let _ = sock.shutdown().await;
    }

    /// A tiny HTTP server (HTTPS with `pki`) on 127.0.0.1; see [`answer`].
    pub async fn server(
        health_status: u16,
        delay: Duration,
        pki: Option<&Pki>,
    ) -> (u16, JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let acceptor = pki.map(Pki::acceptor);
        let task = tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    match acceptor {
                        Some(a) => {
                            if let Ok(tls) = a.accept(sock).await {
                                answer(tls, health_status, delay).await;
                            }
                        }
                        None => answer(sock, health_status, delay).await,
                    }
                });
            }
        });
        (port, task)
    }

    fn local(scheme: &str, host: &str, port: u16) -> Target {
        Target::parse(&format!("{scheme}://{host}:{port}")).unwrap()
    }

    fn no_tls() -> Tls {
        Tls::with_roots(RootCertStore::empty())
    }

    #[test]
    fn status_lines_parse() {
        assert_eq!(parse_status_line(b"HTTP/1.1 204 No Content"), Ok(204));
        assert_eq!(parse_status_line(b"HTTP/1.0 503"), Ok(503));
        for bad in [
            &b"HTTP/2 200 OK"[..],
            b"HTTP/1.1 20 OK",
            b"garbage",
            b"HTTP/1.1 2x0 OK",
        ] {
            assert!(parse_status_line(bad).is_err());
        }
    }

    #[tokio::test]
    async fn http_probe_reads_status_and_measures_rtt() {
        let (port, _srv) = server(200, Duration::from_millis(30), None).await;
        let t = local("http", "127.0.0.1", port);
        let a = probe_once(&t, "/health", Duration::from_secs(2), &no_tls())
            .await
            .unwrap();
        assert_eq!((a.status, a.handshake), (200, None));
        assert!(a.rtt >= Duration::from_millis(30), "{:?}", a.rtt);
        let a = probe_once(&t, "/nope", Duration::from_secs(2), &no_tls())
            .await
            .unwrap();
        assert_eq!(a.status, 404);
    }

    #[tokio::test]
    async fn a_huge_timeout_is_capped_not_a_panic() {
        let (port, _srv) = server(200, Duration::ZERO, None).await;
        let t = local("http", "127.0.0.1", port);
        let a = probe_once(&t, "/health", Duration::MAX, &no_tls()).await;
        assert_eq!(a.map(|a| a.status), Ok(200));
    }

    #[tokio::test]
    async fn probe_times_out_and_reports_refused() {
        let (port, _srv) = server(200, Duration::from_secs(5), None).await;
        let t = local("http", "127.0.0.1", port);
        let e = probe_once(&t, "/health", Duration::from_millis(100), &no_tls())
            .await
            .unwrap_err();
        assert!(e.starts_with("timeout after 0.100s (waiting"), "{e}");
        let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dead_port = dead.local_addr().unwrap().port();
        drop(dead);
        let t = local("http", "127.0.0.1", dead_port);
        let e = probe_once(&t, "/health", Duration::from_secs(1), &no_tls())
            .await
            .unwrap_err();
        assert!(e.starts_with("connect"), "{e}");
    }

    #[tokio::test]
    async fn https_probe_checks_status_over_tls_by_name_and_by_ip() {
        let pki = Pki::new();
        let (port, _srv) = server(503, Duration::from_millis(30), Some(&pki)).await;
        for host in ["localhost", "127.0.0.1"] {
            let t = local("https", host, port);
            let a = probe_once(&t, "/health", Duration::from_secs(2), &pki.client())
                .await
                .unwrap();
            assert_eq!(a.status, 503, "{host}");
            assert!(a.handshake.is_some());
            assert!(a.rtt >= Duration::from_millis(30), "{:?}", a.rtt);
            let a = probe_once(&t, "/v1/models", Duration::from_secs(2), &pki.client())
                .await
                .unwrap();
            assert_eq!(a.status, 200);
        }
    }

    #[tokio::test]
    async fn https_probe_rejects_unknown_ca_wrong_name_and_plain_servers() {
        let pki = Pki::new();
        let (port, _srv) = server(200, Duration::ZERO, Some(&pki)).await;
        let other = Pki::new();
        let t = local("https", "localhost", port);
        let e = probe_once(&t, "/health", Duration::from_secs(2), &other.client())
            .await
            .unwrap_err();
        assert!(e.starts_with("tls: ") && e.contains("UnknownIssuer"), "{e}");
        // A certificate for localhost only does not vouch for 127.0.0.1.
        let named = Pki::for_names(&["localhost"]);
        let (named_port, _srv3) = server(200, Duration::ZERO, Some(&named)).await;
        let t = local("https", "localhost", named_port);
        let a = probe_once(&t, "/health", Duration::from_secs(2), &named.client()).await;
        assert_eq!(a.map(|a| a.status), Ok(200));
        let t = local("https", "127.0.0.1", named_port);
        let e = probe_once(&t, "/health", Duration::from_secs(2), &named.client())
            .await
            .unwrap_err();
        assert!(
            e.starts_with("tls: ") && e.contains("not valid for name"),
            "{e}"
        );
        let (plain, _srv2) = server(200, Duration::ZERO, None).await;
        let t = local("https", "127.0.0.1", plain);
        let e = probe_once(&t, "/health", Duration::from_secs(2), &pki.client())
            .await
            .unwrap_err();
        assert!(e.starts_with("tls: "), "{e}");
    }
}
