// Package proxyproto reads the PROXY protocol (versions 1 and 2, as HAProxy's
// send-proxy and send-proxy-v2 write it) on connections from trusted load balancers,
// so that the front door sees the client's address as the connection's peer.
//
// Only a connection whose peer is in the trusted prefixes is read for a header; any
// other is served as it came (a PROXY header from it is what it sent: an HTTP server
// answers 400). A trusted peer's connection may start with a header or not (a health
// check); a header that is there must be whole and valid within the header timeout,
// else the connection is closed. A version 2 LOCAL header, or a version 1 UNKNOWN one,
// keeps the peer's own address; so does an address family other than TCP over IPv4 or
// IPv6 (UDP, Unix). Version 2 TLVs are skipped.
//
// The header is read on the connection's first Read or RemoteAddr, in the goroutine
// that serves it (net/http asks RemoteAddr there), never in Accept: a peer that sends
// its header slowly holds up its own connection only.
package proxyproto

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrHeader is wrapped by the errors of a malformed header.
var ErrHeader = errors.New("proxyproto: malformed PROXY header")

// DefaultHeaderTimeout bounds the read of a header when Listen is given 0.
const DefaultHeaderTimeout = 5 * time.Second

// v2Signature starts a version 2 header.
var v2Signature = []byte("\r\n\r\n\x00\r\nQUIT\n")

// maxV1 is the longest version 1 header, CRLF included (the specification's 107).
const maxV1 = 107

// Listen returns a listener whose connections from a peer that trusted reports carry
// the address their PROXY header names as RemoteAddr (ingress.Prefixes.Contains is one
// such function).
func Listen(inner net.Listener, trusted func(netip.Addr) bool, headerTimeout time.Duration) net.Listener {
	if headerTimeout <= 0 {
		headerTimeout = DefaultHeaderTimeout
	}
	return &listener{Listener: inner, trusted: trusted, timeout: headerTimeout}
}

type listener struct {
	net.Listener
	trusted func(netip.Addr) bool
	timeout time.Duration
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	ap, err := netip.ParseAddrPort(c.RemoteAddr().String())
	if err != nil || !l.trusted(ap.Addr().Unmap()) {
		return c, nil
	}
	return &conn{Conn: c, r: bufio.NewReaderSize(c, 256), timeout: l.timeout}, nil
}

// conn is a trusted peer's connection: its header is read once, on first use.
type conn struct {
	net.Conn
	r       *bufio.Reader
	timeout time.Duration
	once    sync.Once
	remote  net.Addr // the header's source; nil: the peer's own
	err     error
}

func (c *conn) init() {
	c.once.Do(func() {
		_ = c.Conn.SetReadDeadline(time.Now().Add(c.timeout))
		src, err := ReadHeader(c.r)
		_ = c.Conn.SetReadDeadline(time.Time{})
		if err != nil {
			c.err = err
			c.Conn.Close()
			return
		}
		if src.IsValid() {
			c.remote = net.TCPAddrFromAddrPort(src)
		}
	})
}

func (c *conn) Read(b []byte) (int, error) {
	if c.init(); c.err != nil {
		return 0, c.err
	}
	return c.r.Read(b)
}

func (c *conn) RemoteAddr() net.Addr {
	if c.init(); c.remote != nil {
		return c.remote
	}
	return c.Conn.RemoteAddr()
}

// ReadHeader reads a PROXY header, version 1 or 2, from r and returns the client's
// address and port it names. It returns the zero AddrPort, having consumed nothing,
// when r does not start with a header, and also for a header that names no client
// (v1 UNKNOWN, v2 LOCAL, or a family other than TCP over IPv4/IPv6). r must buffer at
// least 16 bytes.
func ReadHeader(r *bufio.Reader) (netip.AddrPort, error) {
	first, err := r.Peek(1)
	if err != nil {
		if err == io.EOF {
			return netip.AddrPort{}, nil
		}
		return netip.AddrPort{}, err
	}
	switch first[0] {
	case 'P':
		if b, err := r.Peek(6); err != nil || string(b) != "PROXY " {
			return netip.AddrPort{}, nil // not a header (an HTTP method, say)
		}
		return readV1(r)
	case '\r':
		if b, err := r.Peek(len(v2Signature)); err != nil || !bytes.Equal(b, v2Signature) {
			return netip.AddrPort{}, nil
		}
		return readV2(r)
	}
	return netip.AddrPort{}, nil
}

func readV1(r *bufio.Reader) (netip.AddrPort, error) {
	var line []byte
	for len(line) < maxV1 {
		b, err := r.ReadByte()
		if err != nil {
			return netip.AddrPort{}, fmt.Errorf("%w: v1 header cut short: %w", ErrHeader, err)
		}
		line = append(line, b)
		if b == '\n' {
			break
		}
	}
	s, ok := strings.CutSuffix(string(line), "\r\n")
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("%w: v1 header longer than %d bytes or without CRLF", ErrHeader, maxV1)
	}
	f := strings.Split(s, " ")
	if len(f) >= 2 && f[1] == "UNKNOWN" {
		return netip.AddrPort{}, nil
	}
	if len(f) != 6 || (f[1] != "TCP4" && f[1] != "TCP6") {
		return netip.AddrPort{}, fmt.Errorf("%w: v1 header %q", ErrHeader, s)
	}
	src, err1 := netip.ParseAddr(f[2])
	dst, err2 := netip.ParseAddr(f[3])
	sport, err3 := parsePort(f[4])
	_, err4 := parsePort(f[5])
	if err := errors.Join(err1, err2, err3, err4); err != nil || src.Zone() != "" || dst.Zone() != "" ||
		(f[1] == "TCP4") != (src.Is4() && dst.Is4()) || (f[1] == "TCP6") != (src.Is6() && dst.Is6()) {
		return netip.AddrPort{}, fmt.Errorf("%w: v1 header %q", ErrHeader, s)
	}
	return netip.AddrPortFrom(src, sport), nil
}

// parsePort reads a port in decimal without sign or leading zeros, as v1 writes it.
func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || (len(s) > 1 && s[0] == '0') {
		return 0, fmt.Errorf("port %q", s)
	}
	return uint16(n), nil
}

func readV2(r *bufio.Reader) (netip.AddrPort, error) {
	var head [16]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return netip.AddrPort{}, fmt.Errorf("%w: v2 header cut short: %w", ErrHeader, err)
	}
	verCmd, famProto := head[12], head[13]
	n := int(binary.BigEndian.Uint16(head[14:16]))
	if verCmd>>4 != 2 || verCmd&0xf > 1 {
		return netip.AddrPort{}, fmt.Errorf("%w: v2 version/command byte %#x", ErrHeader, verCmd)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return netip.AddrPort{}, fmt.Errorf("%w: v2 header cut short: %w", ErrHeader, err)
	}
	if verCmd&0xf == 0 { // LOCAL: the balancer's own connection (a health check)
		return netip.AddrPort{}, nil
	}
	switch famProto {
	case 0x11: // TCP over IPv4
		if n < 12 {
			return netip.AddrPort{}, fmt.Errorf("%w: v2 IPv4 addresses in %d bytes", ErrHeader, n)
		}
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(body[0:4])), binary.BigEndian.Uint16(body[8:10])), nil
	case 0x21: // TCP over IPv6
		if n < 36 {
			return netip.AddrPort{}, fmt.Errorf("%w: v2 IPv6 addresses in %d bytes", ErrHeader, n)
		}
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(body[0:16])).Unmap(), binary.BigEndian.Uint16(body[32:34])), nil
	}
	if famProto>>4 > 3 || famProto&0xf > 2 {
		return netip.AddrPort{}, fmt.Errorf("%w: v2 family/protocol byte %#x", ErrHeader, famProto)
	}
	return netip.AddrPort{}, nil // UNSPEC, UDP, Unix: no client address to take
}
