//! Discovery referrals: whether a referral leads back to this target. The conf refuses a
//! referral to one of its listener addresses as written; only once the listeners are bound
//! does the target know a `:0` listener's port and, for a listener on the unspecified
//! address, which addresses reach it (every local one).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::subsystem::BoundListener;

/// The first referral of `referrals` that reaches one of `listeners`, with that listener's
/// address: a host following it would discover this target again (and connect-all would
/// loop until its depth limit).
pub fn self_referral(referrals: &[SocketAddr], listeners: &[BoundListener]) -> Option<(SocketAddr, SocketAddr)> {
    let mut local: Option<Vec<IpAddr>> = None;
    for r in referrals {
        for l in listeners {
            if reaches(*r, l.addr, &mut local) {
                return Some((*r, l.addr));
            }
        }
    }
    None
}

/// Whether a host connecting to `referral` reaches a listener bound to `listener`: the same
/// address, or the same port of a listener on the unspecified address through a loopback or
/// local address (a Linux `[::]` socket also takes IPv4 unless `IPV6_V6ONLY`; `0.0.0.0`
/// takes no IPv6). `local`: this machine's addresses, read once when first needed.
fn reaches(referral: SocketAddr, listener: SocketAddr, local: &mut Option<Vec<IpAddr>>) -> bool {
    if referral.port() != listener.port() {
        return false;
    }
    let (r, l) = (referral.ip(), listener.ip());
    if r == l {
        return true;
    }
    if !l.is_unspecified() || (l.is_ipv4() && r.is_ipv6()) {
        return false;
    }
    r.is_loopback() || local.get_or_insert_with(local_addresses).contains(&r)
}

/// This machine's interface addresses (getifaddrs(3)); empty if they cannot be read, so
/// only loopback then counts as local.
fn local_addresses() -> Vec<IpAddr> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs stores the head of a list it allocates in `head`; it is freed
    // below with freeifaddrs, once.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "cannot list the local addresses (getifaddrs)");
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut p = head;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list getifaddrs returned, valid until freeifaddrs.
        let ifa = unsafe { &*p };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: a non-null ifa_addr points to a sockaddr, whose family says its type.
            let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
            match family {
                libc::AF_INET => {
                    // SAFETY: an AF_INET address is a sockaddr_in.
                    let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
                    out.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))));
                }
                libc::AF_INET6 => {
                    // SAFETY: an AF_INET6 address is a sockaddr_in6.
                    let sin6 = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
                    out.push(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
                }
                _ => {}
            }
        }
        p = ifa.ifa_next;
    }
    // SAFETY: `head` came from getifaddrs and nothing refers to the list any more.
    unsafe { libc::freeifaddrs(head) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pollux_conf::TlsMode;

    fn bound(a: &str) -> BoundListener {
        BoundListener {
            addr: a.parse().unwrap_or_else(|e| panic!("{a}: {e}")),
            configured: a.parse().unwrap_or_else(|e| panic!("{a}: {e}")),
            tls: TlsMode::None,
            ana: Default::default(),
            max_connections: None,
        }
    }

    fn addr(a: &str) -> SocketAddr {
        a.parse().unwrap_or_else(|e| panic!("{a}: {e}"))
    }

    #[test]
    fn a_referral_to_a_bound_listener_is_found() {
        let ls = [bound("127.0.0.1:4420"), bound("127.0.0.1:34567")];
        assert_eq!(
            self_referral(&[addr("10.0.0.2:8009"), addr("127.0.0.1:34567")], &ls),
            Some((addr("127.0.0.1:34567"), addr("127.0.0.1:34567")))
        );
        assert_eq!(self_referral(&[addr("127.0.0.1:4421")], &ls), None);
        assert_eq!(self_referral(&[addr("127.0.0.2:4420")], &ls), None);
    }

    #[test]
    fn an_unspecified_listener_is_reached_through_local_addresses_only() {
        let any4 = [bound("0.0.0.0:8009")];
        assert!(self_referral(&[addr("127.0.0.1:8009")], &any4).is_some());
        assert!(self_referral(&[addr("127.9.9.9:8009")], &any4).is_some());
        assert!(
            self_referral(&[addr("[::1]:8009")], &any4).is_none(),
            "0.0.0.0 takes no IPv6"
        );
        // TEST-NET-3 (RFC 5737) is never a local address.
        assert!(self_referral(&[addr("203.0.113.7:8009")], &any4).is_none());
        let any6 = [bound("[::]:8009")];
        assert!(self_referral(&[addr("[::1]:8009")], &any6).is_some());
        assert!(self_referral(&[addr("127.0.0.1:8009")], &any6).is_some());
        assert!(self_referral(&[addr("[2001:db8::7]:8009")], &any6).is_none());
        // Every address of this machine reaches it.
        for ip in local_addresses() {
            assert!(self_referral(&[SocketAddr::new(ip, 8009)], &any6).is_some(), "{ip}");
        }
    }

    #[test]
    fn local_addresses_include_loopback() {
        assert!(local_addresses().contains(&IpAddr::V4(Ipv4Addr::LOCALHOST)));
    }
}
