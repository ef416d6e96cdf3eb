#!/usr/bin/env python3
"""Writes the small synthetic captures in testdata/ (deterministic; run from anywhere: python3 testdata/make.py).

Each file exercises reader features that the tests check by exact values:
  pcapng-two-sections.pcapng  big-endian section (Ethernet µs interface, raw-IP interface with if_tsresol 2^-20
                              and if_tsoffset 10 s; EPB on both, SPB, obsolete packet block, unknown block, NRB),
                              then a little-endian section (Linux SLL2 with if_tsresol 10^-9) with one EPB.
  pcap-be-ns.pcap             big-endian nanosecond pcap, Linux SLL, 3 packets.
  truncated-last-record.pcap  3 records, then a 4th cut inside its packet data.
  garbage-tail.pcap           2 records, then 40 bytes of garbage whose "caplen" is absurd.
  tunnels.pcap                Ethernet packets: QinQ+TCP, MPLS+IPv6/UDP, PPPoE+ICMP, GRE/Ethernet, VXLAN,
                              IPv6 hop-by-hop+fragment, IPv4 later fragment, a TCP header cut by the snaplen.
  geneve.pcap                 Ethernet packets carrying Geneve (UDP port 6081) over IPv4 and IPv6: inner Ethernet
                              (Transparent Ethernet Bridging) or bare IPv4/IPv6, options, VNIs, nested Geneve,
                              VLAN/MPLS/PPPoE inside and VLAN outside, version 1, fragments, and packets cut inside
                              the Geneve header.
  fddi.pcap                   FDDI (link type 10) frames with LLC/SNAP: IPv4 TCP and UDP, IPv6 UDP, ARP, a
                              broadcast and a group-addressed frame, and a frame of plain 802.2 LLC (no SNAP).
  token-ring.pcap             the same frames over token ring (link type 6): access and frame control, addresses,
                              LLC; one with source routing information.
  ip-over-fc.pcap             the same over IP over Fibre Channel (link type 122).
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def eth(dst, src, ethertype, payload, vlans=()):
    b = bytes(dst) + bytes(src)
    for tpid, vid in vlans:
        b += struct.pack(">HH", tpid, vid)
    return b + struct.pack(">H", ethertype) + payload


def csum(h):
    s = sum(struct.unpack(">%dH" % (len(h) // 2), h))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return (~s) & 0xFFFF


def ipv4(src, dst, proto, payload, frag=0, mf=False, ident=1):
    fo = frag | (0x2000 if mf else 0)
    h = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), ident, fo, 64, proto, 0, bytes(src), bytes(dst))
    h = h[:10] + struct.pack(">H", csum(h)) + h[12:]
    return h + payload


def ipv6(src, dst, nh, payload):
    return struct.pack(">IHBB16s16s", 0x60000000, len(payload), nh, 64, bytes(src), bytes(dst)) + payload


def tcp(sp, dp, flags, payload=b""):
    return struct.pack(">HHIIBBHHH", sp, dp, 1000, 2000, 5 << 4, flags, 65535, 0, 0) + payload


def udp(sp, dp, payload):
    return struct.pack(">HHHH", sp, dp, 8 + len(payload), 0) + payload


A = bytes([0x02, 0, 0, 0, 0, 0xA])
B = bytes([0x02, 0, 0, 0, 0, 0xB])
V4A = [192, 0, 2, 1]
V4B = [198, 51, 100, 2]
V6A = bytes.fromhex("20010db8000000000000000000000001")
V6B = bytes.fromhex("20010db8000000000000000000000002")


def pcap(path, packets, linktype=1, be=False, ns=False, snaplen=65535, tail=b""):
    e = ">" if be else "<"
    magic = 0xA1B23C4D if ns else 0xA1B2C3D4
    out = struct.pack(e + "IHHiIII", magic, 2, 4, 0, 0, snaplen, linktype)
    for ts_s, ts_f, data, wirelen in packets:
        out += struct.pack(e + "IIII", ts_s, ts_f, len(data), wirelen) + data
    with open(os.path.join(HERE, path), "wb") as f:
        f.write(out + tail)


def block(e, btype, body):
    body += b"\0" * (-len(body) % 4)
    n = 12 + len(body)
    return struct.pack(e + "II", btype, n) + body + struct.pack(e + "I", n)


def opt(e, code, value):
    return struct.pack(e + "HH", code, len(value)) + value + b"\0" * (-len(value) % 4)


def shb(e):
    return block(e, 0x0A0D0D0A, struct.pack(e + "IHHq", 0x1A2B3C4D, 1, 0, -1))


def idb(e, linktype, snaplen, options=b""):
    if options:
        options += opt(e, 0, b"")
    return block(e, 1, struct.pack(e + "HHI", linktype, 0, snaplen) + options)


def epb(e, iface, ts, data, wirelen=None):
    return block(e, 6, struct.pack(e + "IIIII", iface, ts >> 32, ts & 0xFFFFFFFF, len(data), wirelen or len(data)) + data)


def main():
    p1 = eth(B, A, 0x0800, ipv4(V4A, V4B, 6, tcp(40000, 80, 0x02)))
    p2 = ipv4(V4B, V4A, 17, udp(53, 40001, b"answer"))
    p3 = eth(A, B, 0x86DD, ipv6(V6A, V6B, 17, udp(5353, 5353, b"mdns")))
    # Section 1, big-endian.
    e = ">"
    s1 = shb(e)
    s1 += idb(e, 1, 65535, opt(e, 2, b"eth0"))
    s1 += idb(e, 101, 0, opt(e, 9, bytes([0x80 | 20])) + opt(e, 14, struct.pack(">q", 10)))
    s1 += epb(e, 0, 1_600_000_000_000_001, p1)  # µs
    s1 += epb(e, 1, 3 << 20 | 1 << 19, p2)  # 3.5 s in 2^-20 units, plus 10 s offset
    s1 += block(e, 3, struct.pack(e + "I", len(p1)) + p1)  # simple packet block, interface 0
    s1 += block(e, 0x80000BAD, b"unknown block body")
    s1 += block(e, 4, struct.pack(e + "HH", 1, 4) + bytes(V4A) + struct.pack(e + "HH", 0, 0))  # NRB
    s1 += block(e, 2, struct.pack(e + "HHIIII", 0, 0, 0, 1_600_000_002, len(p1), 1514) + p1)  # obsolete, cut
    # Section 2, little-endian.
    e = "<"
    sll2 = struct.pack(">HHIHBB8s", 0x86DD, 0, 3, 1, 0, 6, A + b"\0\0")
    s2 = shb(e) + idb(e, 276, 262144, opt(e, 9, bytes([9]))) + epb(e, 0, 1_700_000_000_123_456_789, sll2 + p3[14:])
    with open(os.path.join(HERE, "pcapng-two-sections.pcapng"), "wb") as f:
        f.write(s1 + s2)

    sll = struct.pack(">HHH8sH", 0, 1, 6, A + b"\0\0", 0x0800)
    pcap("pcap-be-ns.pcap", [(1_700_000_000, i * 1000 + 7, sll + ipv4(V4A, V4B, 1, bytes([8, 0, 0, 0, 0, 1, 0, i])), 0)
                             for i in range(3)], linktype=113, be=True, ns=True)
    # wirelen 0 means "same as caplen" above; fix it up:
    path = os.path.join(HERE, "pcap-be-ns.pcap")
    raw = bytearray(open(path, "rb").read())
    p = 24
    while p < len(raw):
        caplen = struct.unpack(">I", raw[p + 8:p + 12])[0]
        raw[p + 12:p + 16] = struct.pack(">I", caplen)
        p += 16 + caplen
    open(path, "wb").write(raw)

    recs = [(1_700_000_000 + i, 0, p1, len(p1)) for i in range(4)]
    pcap("truncated-last-record.pcap", recs)
    path = os.path.join(HERE, "truncated-last-record.pcap")
    raw = open(path, "rb").read()
    open(path, "wb").write(raw[:-10])
    pcap("garbage-tail.pcap", recs[:2], tail=bytes(range(40)) + b"\xff" * 0)

    pk = []
    pk.append(eth(B, A, 0x0800, ipv4(V4A, V4B, 6, tcp(1234, 443, 0x18, b"x" * 10)), vlans=[(0x88A8, 100), (0x8100, 200)]))
    mpls = struct.pack(">II", (1000 << 12) | 64, (2000 << 12) | 0x100 | 64)
    pk.append(eth(B, A, 0x8847, mpls + ipv6(V6A, V6B, 17, udp(1111, 2222, b"mpls"))))
    pppoe = struct.pack(">BBHH", 0x11, 0, 0x1234, 2 + 28) + struct.pack(">H", 0x0021)
    pk.append(eth(B, A, 0x8864, pppoe + ipv4(V4A, V4B, 1, bytes([8, 0, 0, 0, 0, 1, 0, 1]))))
    inner = eth(A, B, 0x0800, ipv4([10, 0, 0, 1], [10, 0, 0, 2], 17, udp(7, 7, b"gre")))
    pk.append(eth(B, A, 0x0800, ipv4(V4A, V4B, 47, struct.pack(">HH", 0x2000, 0x6558) + struct.pack(">I", 42) + inner)))
    vx = struct.pack(">II", 0x08000000, 5000 << 8) + eth(A, B, 0x0800, ipv4([10, 1, 0, 1], [10, 1, 0, 2], 6, tcp(5, 6, 0x02)))
    pk.append(eth(B, A, 0x0800, ipv4(V4A, V4B, 17, udp(33333, 4789, vx))))
    hbh = bytes([44, 0, 1, 4, 0, 0, 0, 0])  # next: fragment; PadN
    frag = bytes([6, 0]) + struct.pack(">HI", 0 | 1, 0xABCD)  # offset 0, more fragments
    pk.append(eth(B, A, 0x86DD, ipv6(V6A, V6B, 0, hbh + frag + tcp(8080, 9090, 0x10))))
    pk.append(eth(B, A, 0x0800, ipv4(V4A, V4B, 17, b"\0" * 16, frag=185, mf=False, ident=77)))
    full = eth(B, A, 0x0800, ipv4(V4A, V4B, 6, tcp(1, 2, 0x02)))
    recs = [(1_700_000_100 + i, 0, d, len(d)) for i, d in enumerate(pk)]
    recs.append((1_700_000_200, 0, full[:14 + 20 + 10], len(full)))
    pcap("tunnels.pcap", recs, snaplen=65535)

    pcap("geneve.pcap", [(1_700_000_300 + i, 0, d, w) for i, (d, w) in enumerate(geneve_packets())], snaplen=65535)

    pcap("fddi.pcap", [(1_700_000_400 + i, 0, d, len(d)) for i, d in enumerate(fddi_packets())], linktype=10)
    tr = [bytes([0x10, 0x40]) + f[1:] for f in fddi_packets()]
    # Source routing: the source's top bit set, a 2-byte routing information field before LLC.
    routed = fddi(B, A, snap(0x0800, ipv4(V4A, V4B, 6, tcp(40001, 80, 0x02))))
    tr.append(bytes([0x10, 0x40]) + routed[1:7] + bytes([routed[7] | 0x80]) + routed[8:13] + bytes([0x02, 0x00]) + routed[13:])
    pcap("token-ring.pcap", [(1_700_000_500 + i, 0, d, len(d)) for i, d in enumerate(tr)], linktype=6)
    fc = [bytes([0x10, 0x00]) + f[1:7] + bytes([0x10, 0x00]) + f[7:] for f in fddi_packets()]
    pcap("ip-over-fc.pcap", [(1_700_000_600 + i, 0, d, len(d)) for i, d in enumerate(fc)], linktype=122)


def fddi(dst, src, llc_payload):
    """An FDDI frame: frame control (async LLC, priority 0), destination, source, then LLC."""
    return bytes([0x50]) + bytes(dst) + bytes(src) + llc_payload


def snap(ethertype, payload):
    return bytes([0xAA, 0xAA, 0x03, 0, 0, 0]) + struct.pack(">H", ethertype) + payload


def fddi_packets():
    arp = struct.pack(">HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 1, A, bytes(V4A), bytes(6), bytes(V4B))
    return [
        fddi(B, A, snap(0x0800, ipv4(V4A, V4B, 6, tcp(40000, 80, 0x02)))),
        fddi(A, B, snap(0x0800, ipv4(V4B, V4A, 6, tcp(80, 40000, 0x12)))),
        fddi(B, A, snap(0x0800, ipv4(V4A, V4B, 17, udp(5353, 53, b"q" * 12)))),
        fddi(B, A, snap(0x86DD, ipv6(V6A, V6B, 17, udp(1000, 2000, b"six"))))
        ,
        fddi([0xFF] * 6, A, snap(0x0806, arp)),
        fddi([0x01, 0, 0x5E, 0, 0, 0xFB], A, snap(0x0800, ipv4(V4A, [224, 0, 0, 251], 17, udp(5353, 5353, b"")))),
        fddi(B, A, bytes([0x42, 0x42, 0x03]) + b"spanning tree"),
    ]


def geneve(vni, proto, payload, options=b"", version=0):
    assert len(options) % 4 == 0
    return struct.pack(">BBHI", version << 6 | len(options) // 4, 0, proto, vni << 8) + options + payload


def geneve_packets():
    """(data, wirelen) of each packet of geneve.pcap."""
    C, D = bytes([0x02, 0, 0, 0, 0, 0xC]), bytes([0x02, 0, 0, 0, 0, 0xD])
    IN4A, IN4B = [10, 0, 0, 1], [10, 0, 0, 2]
    IN6A, IN6B = bytes.fromhex("fd000000000000000000000000000001"), bytes.fromhex("fd000000000000000000000000000002")
    TEB = 0x6558

    def over4(g, vlans=(), **kw):
        return eth(B, A, 0x0800, ipv4(V4A, V4B, 17, udp(40000, 6081, g), **kw), vlans=vlans)

    def over6(g):
        return eth(B, A, 0x86DD, ipv6(V6A, V6B, 17, udp(40000, 6081, g)))

    inner_tcp = eth(D, C, 0x0800, ipv4(IN4A, IN4B, 6, tcp(1234, 80, 0x02)))
    pk = [
        over4(geneve(10, TEB, inner_tcp)),
        # Options (8 bytes), an inner broadcast ARP request.
        over4(geneve(11, TEB, eth(b"\xff" * 6, C, 0x0806, struct.pack(">HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 1, C,
                                                                         bytes(IN4A), b"\0" * 6, bytes(IN4B))),
                     options=struct.pack(">HBBI", 0x0103, 0x80, 1, 0xDEADBEEF))),
        # IPv6 outside, bare IPv4 inside (no inner Ethernet header).
        over6(geneve(12, 0x0800, ipv4(IN4A, IN4B, 17, udp(5555, 53, b"query")))),
        # IPv6 inside IPv4 (bare), with IPv4 options outside.
        eth(B, A, 0x0800, ipv4_opts(V4A, V4B, 17, udp(40000, 6081, geneve(13, 0x86DD, ipv6(IN6A, IN6B, 6, tcp(5, 443, 0x12)))))),
        # Geneve in Geneve: the inner one carries TCP to port 22.
        over4(geneve(14, TEB, eth(D, C, 0x0800, ipv4(IN4A, IN4B, 17, udp(1, 6081, geneve(15, TEB, eth(
            A, B, 0x0800, ipv4([172, 16, 0, 1], [172, 16, 0, 2], 6, tcp(2222, 22, 0x02))))))))),
        # A VLAN tag inside, one outside.
        over4(geneve(16, TEB, eth(D, C, 0x0800, ipv4(IN4A, IN4B, 6, tcp(1, 2, 0x10)), vlans=[(0x8100, 7)]))),
        over4(geneve(17, TEB, eth(D, C, 0x0800, ipv4(IN4A, IN4B, 1, bytes([8, 0, 0, 0, 0, 1, 0, 1])))),
              vlans=[(0x8100, 100)]),
        # Version 1: not Geneve as libpcap reads it.
        over4(geneve(10, TEB, inner_tcp, version=1)),
        # An inner multicast IPv6 packet.
        over4(geneve(18, TEB, eth(bytes([0x33, 0x33, 0, 0, 0, 1]), C, 0x86DD, ipv6(IN6A, bytes.fromhex(
            "ff020000000000000000000000000001"), 17, udp(546, 547, b"dhcp"))))),
        # First fragment (more fragments), then a later fragment of UDP to 6081.
        over4(geneve(19, TEB, inner_tcp), mf=True, ident=9),
        eth(B, A, 0x0800, ipv4(V4A, V4B, 17, b"\0" * 8 + geneve(19, TEB, inner_tcp), frag=3, ident=9)),
        # PPPoE session and MPLS inside.
        over4(geneve(20, TEB, eth(D, C, 0x8864, struct.pack(">BBHHH", 0x11, 0, 0x99, 2 + 20 + 8, 0x0021)
                                  + ipv4(IN4A, IN4B, 17, udp(7, 9, b""))))),
        over4(geneve(21, TEB, eth(D, C, 0x8847, struct.pack(">I", (77 << 12) | 0x100 | 64)
                                  + ipv4(IN4A, IN4B, 6, tcp(3, 4, 0x04))))),
    ]
    out = [(d, len(d)) for d in pk]
    # Cut inside the Geneve header: before its protocol type (the offsets cannot be computed), and after it.
    whole = over4(geneve(10, TEB, inner_tcp))
    g = 14 + 20 + 8
    out += [(whole[:g + 3], len(whole)), (whole[:g + 4], len(whole)), (whole[:g + 20], len(whole))]
    return out


def ipv4_opts(src, dst, proto, payload):
    """IPv4 with a 4-byte option (NOP, NOP, NOP, end): a 24-byte header."""
    h = struct.pack(">BBHHHBBH4s4s", 0x46, 0, 24 + len(payload), 1, 0, 64, proto, 0, bytes(src), bytes(dst))
    h += bytes([1, 1, 1, 0])
    h = h[:10] + struct.pack(">H", csum(h)) + h[12:]
    return h + payload


if __name__ == "__main__":
    main()
