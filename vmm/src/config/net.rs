//! What a guest may reach: `--publish HOSTPORT:GUESTPORT` and `--allow-connect HOST:PORT`
//! (loopback only), parsed and kept per guest. A `/udp` suffix (docker's) names a UDP port,
//! `/tcp` or none a TCP one.

use std::net::SocketAddrV4;

/// What a guest may reach (`--publish`, `--allow-connect`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetConfig {
    /// `(host port, guest port)`: a guest listening on the guest port is reached at
    /// `127.0.0.1:host port`.
    pub publish: Vec<(u16, u16)>,
    /// Loopback addresses the guest may connect to.
    pub allow_connect: Vec<SocketAddrV4>,
    /// `(host port, guest port)` of UDP (`--publish 5353:53/udp`).
    pub publish_udp: Vec<(u16, u16)>,
    /// Loopback addresses the guest may send datagrams to (`--allow-connect HOST:PORT/udp`).
    pub allow_connect_udp: Vec<SocketAddrV4>,
}

impl NetConfig {
    pub fn is_empty(&self) -> bool {
        self.publish.is_empty()
            && self.allow_connect.is_empty()
            && self.publish_udp.is_empty()
            && self.allow_connect_udp.is_empty()
    }

    /// Adds a `--publish` entry (`HOSTPORT:GUESTPORT[/tcp|/udp]`).
    pub fn add_publish(&mut self, s: &str) -> Result<(), String> {
        let (rest, udp) = split_proto(s)?;
        let ports = parse_publish(rest).map_err(|e| e.replace(rest, s))?;
        if udp {
            self.publish_udp.push(ports);
        } else {
            self.publish.push(ports);
        }
        Ok(())
    }

    /// Adds an `--allow-connect` entry (`HOST:PORT[/tcp|/udp]`).
    pub fn add_allow_connect(&mut self, s: &str) -> Result<(), String> {
        let (rest, udp) = split_proto(s)?;
        let addr = parse_allow_connect(rest).map_err(|e| e.replace(rest, s))?;
        if udp {
            self.allow_connect_udp.push(addr);
        } else {
            self.allow_connect.push(addr);
        }
        Ok(())
    }
}

/// Splits a `/tcp` or `/udp` suffix off: the rest, and whether it names UDP.
fn split_proto(s: &str) -> Result<(&str, bool), String> {
    match s.rsplit_once('/') {
        None => Ok((s, false)),
        Some((rest, "tcp")) => Ok((rest, false)),
        Some((rest, "udp")) => Ok((rest, true)),
        Some((_, other)) => Err(format!(
            "'{s}': the protocol after '/' must be tcp or udp, not '{other}'"
        )),
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

    #[test]
    fn a_udp_suffix_selects_udp() {
        let mut c = NetConfig::default();
        c.add_publish("5353:53/udp").unwrap();
        c.add_publish("6380:6379/tcp").unwrap();
        c.add_publish("6381:6379").unwrap();
        c.add_allow_connect("127.0.0.1:9000/udp").unwrap();
        c.add_allow_connect("127.0.0.1:9001").unwrap();
        assert_eq!(c.publish_udp, [(5353, 53)]);
        assert_eq!(c.publish, [(6380, 6379), (6381, 6379)]);
        let local = |p| SocketAddrV4::new(Ipv4Addr::LOCALHOST, p);
        assert_eq!(c.allow_connect_udp, [local(9000)]);
        assert_eq!(c.allow_connect, [local(9001)]);
        assert!(!c.is_empty());
        for bad in ["5353:53/sctp", "5353:53/", "5353/udp", "0:53/udp"] {
            assert!(c.add_publish(bad).is_err(), "{bad}");
        }
        for bad in ["10.0.0.1:9000/udp", "127.0.0.1:9000/icmp", "127.0.0.1/udp"] {
            assert!(c.add_allow_connect(bad).is_err(), "{bad}");
        }
        assert!(NetConfig::default().is_empty());
    }
}
