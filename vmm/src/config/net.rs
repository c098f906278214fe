//! What a guest may reach: `--publish HOSTPORT:GUESTPORT` and `--allow-connect HOST:PORT`
//! (loopback only), parsed and kept per guest.

use std::net::SocketAddrV4;

/// What a guest may reach (`--publish`, `--allow-connect`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetConfig {
    /// `(host port, guest port)`: a guest listening on the guest port is reached at
    /// `127.0.0.1:host port`.
    pub publish: Vec<(u16, u16)>,
    /// Loopback addresses the guest may connect to.
    pub allow_connect: Vec<SocketAddrV4>,
}

impl NetConfig {
    pub fn is_empty(&self) -> bool {
        self.publish.is_empty() && self.allow_connect.is_empty()
    }
}

/// Parse `HOSTPORT:GUESTPORT`.
pub fn parse_publish(s: &str) -> Result<(u16, u16), String> {
    let (host, guest) = s
        .split_once(':')
        .ok_or_else(|| format!("'{s}' is not HOSTPORT:GUESTPORT"))?;
    let port = |p: &str| match p.parse::<u16>() {
        Ok(n) if n != 0 => Ok(n),
        _ => Err(format!("'{p}' in '{s}' is not a port (1-65535)")),
    };
    Ok((port(host)?, port(guest)?))
}

/// Parse `HOST:PORT` with a loopback IPv4 host (`localhost` is 127.0.0.1).
pub fn parse_allow_connect(s: &str) -> Result<SocketAddrV4, String> {
    let s2 = s.replacen("localhost:", "127.0.0.1:", 1);
    let addr: SocketAddrV4 = s2
        .parse()
        .map_err(|_| format!("'{s}' is not HOST:PORT with an IPv4 host"))?;
    if !addr.ip().is_loopback() || addr.port() == 0 {
        return Err(format!(
            "'{s}': only loopback addresses (127.0.0.0/8) and a non-zero port are allowed"
        ));
    }
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn options_parse_and_refuse_other_hosts() {
        assert_eq!(parse_publish("6380:6379"), Ok((6380, 6379)));
        assert!(parse_publish("6380").is_err());
        assert!(parse_publish("0:1").is_err());
        assert_eq!(
            parse_allow_connect("localhost:80"),
            Ok(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 80))
        );
        assert!(parse_allow_connect("10.0.0.1:80").is_err());
        assert!(parse_allow_connect("127.0.0.1:0").is_err());
    }
}
