package proxyproto

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// v2 builds a version 2 header: command (0 LOCAL, 1 PROXY), family/protocol, addresses
// and TLVs as the body.
func v2(cmd, famProto byte, body []byte) []byte {
	h := append([]byte{}, v2Signature...)
	h = append(h, 0x20|cmd, famProto, 0, 0)
	binary.BigEndian.PutUint16(h[14:16], uint16(len(body)))
	return append(h, body...)
}

func v2TCP4(src, dst [4]byte, sport, dport uint16, tlvs []byte) []byte {
	b := append(append(src[:], dst[:]...), byte(sport>>8), byte(sport), byte(dport>>8), byte(dport))
	return v2(1, 0x11, append(b, tlvs...))
}

func v2TCP6(src, dst netip.Addr, sport, dport uint16) []byte {
	s, d := src.As16(), dst.As16()
	b := append(append(s[:], d[:]...), byte(sport>>8), byte(sport), byte(dport>>8), byte(dport))
	return v2(1, 0x21, b)
}

var headerCases = []struct {
	name string
	in   []byte
	want string // the client's address ("": none named), or "error"
	rest string // what must be left to read
}{
	{"v1 tcp4", []byte("PROXY TCP4 203.0.113.7 192.0.2.1 51000 80\r\nGET / HTTP/1.1\r\n"), "203.0.113.7:51000", "GET / HTTP/1.1\r\n"},
	{"v1 tcp6", []byte("PROXY TCP6 2001:db8::7 2001:db8::1 443 8080\r\nGET"), "[2001:db8::7]:443", "GET"},
	{"v1 unknown", []byte("PROXY UNKNOWN ffff::1 ffff::2 1 2\r\nGET"), "", "GET"},
	{"v1 unknown bare", []byte("PROXY UNKNOWN\r\nGET"), "", "GET"},
	{"v2 tcp4", append(v2TCP4([4]byte{198, 51, 100, 9}, [4]byte{127, 0, 0, 1}, 40000, 80, nil), "GET"...), "198.51.100.9:40000", "GET"},
	{"v2 tcp4 with TLVs", append(v2TCP4([4]byte{198, 51, 100, 9}, [4]byte{127, 0, 0, 1}, 1, 80, []byte{0x04, 0, 1, 0}), "GET"...), "198.51.100.9:1", "GET"},
	{"v2 tcp6", append(v2TCP6(netip.MustParseAddr("2001:db8::9"), netip.MustParseAddr("::1"), 5, 6), "GET"...), "[2001:db8::9]:5", "GET"},
	{"v2 tcp6 mapped", append(v2TCP6(netip.MustParseAddr("::ffff:198.51.100.9"), netip.MustParseAddr("::1"), 5, 6), "GET"...), "198.51.100.9:5", "GET"},
	{"v2 local", append(v2(0, 0x00, nil), "GET"...), "", "GET"},
	{"v2 udp", append(v2(1, 0x12, make([]byte, 12)), "GET"...), "", "GET"},
	{"v2 unix", append(v2(1, 0x31, make([]byte, 216)), "GET"...), "", "GET"},
	{"no header", []byte("GET / HTTP/1.1\r\n"), "", "GET / HTTP/1.1\r\n"},
	{"POST", []byte("POST / HTTP/1.1\r\n"), "", "POST / HTTP/1.1\r\n"},
	{"empty", nil, "", ""},
	{"v1 no CRLF", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n"), "error", ""},
	{"v1 too long", []byte("PROXY TCP4 " + strings.Repeat("1", 200) + "\r\n"), "error", ""},
	{"v1 cut", []byte("PROXY TCP4 1.2.3.4"), "error", ""},
	{"v1 family mismatch", []byte("PROXY TCP4 2001:db8::1 1.2.3.4 1 2\r\n"), "error", ""},
	{"v1 bad port", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n"), "error", ""},
	{"v1 leading zero", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 080 2\r\n"), "error", ""},
	{"v1 zone", []byte("PROXY TCP6 fe80::1%eth0 ::1 1 2\r\n"), "error", ""},
	{"v1 extra field", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n"), "error", ""},
	{"v1 other protocol", []byte("PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n"), "error", ""},
	{"v2 version 1", append(append([]byte{}, v2Signature...), 0x11, 0x11, 0, 0), "error", ""},
	{"v2 command 2", append(append([]byte{}, v2Signature...), 0x22, 0x11, 0, 0), "error", ""},
	{"v2 short ipv4", v2(1, 0x11, make([]byte, 8)), "error", ""},
	{"v2 short ipv6", v2(1, 0x21, make([]byte, 20)), "error", ""},
	{"v2 cut body", append(append([]byte{}, v2Signature...), 0x21, 0x11, 0, 12, 1, 2), "error", ""},
	{"v2 bad family", v2(1, 0x41, nil), "error", ""},
}

func TestReadHeader(t *testing.T) {
	for _, c := range headerCases {
		t.Run(c.name, func(t *testing.T) {
			r := bufio.NewReaderSize(bytes.NewReader(c.in), 256)
			got, err := ReadHeader(r)
			if c.want == "error" {
				if !errors.Is(err, ErrHeader) {
					t.Fatalf("got %v, %v; want ErrHeader", got, err)
				}
				return
			}
			if err != nil || (got.IsValid() && got.String() != c.want) || (!got.IsValid() && c.want != "") {
				t.Fatalf("got %v, %v; want %q", got, err, c.want)
			}
			if rest, _ := io.ReadAll(r); string(rest) != c.rest {
				t.Errorf("left %q, want %q", rest, c.rest)
			}
		})
	}
}

// FuzzReadHeader: whatever the bytes, ReadHeader returns an address only with no
// error, consumes nothing when it finds no header, and never reads past a v1 header's
// 107 bytes or a v2 header's declared length.
func FuzzReadHeader(f *testing.F) {
	for _, c := range headerCases {
		f.Add(c.in)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bufio.NewReaderSize(bytes.NewReader(in), 256)
		ap, err := ReadHeader(r)
		if err != nil && ap.IsValid() {
			t.Fatalf("an address with an error: %v %v", ap, err)
		}
		if err != nil {
			return
		}
		rest, _ := io.ReadAll(r)
		consumed := len(in) - len(rest)
		if !bytes.Equal(in[consumed:], rest) {
			t.Fatalf("the rest is not the input's tail")
		}
		switch {
		case consumed == 0:
		case in[0] == 'P':
			if consumed > maxV1 || !bytes.HasSuffix(in[:consumed], []byte("\r\n")) {
				t.Fatalf("v1: consumed %d bytes %q", consumed, in[:consumed])
			}
		default:
			if consumed != 16+int(binary.BigEndian.Uint16(in[14:16])) {
				t.Fatalf("v2: consumed %d bytes of a header declaring %d", consumed, binary.BigEndian.Uint16(in[14:16]))
			}
		}
		if ap.IsValid() && (ap.Addr().Is4In6() || ap.Addr().Zone() != "") {
			t.Fatalf("address %v not in its plain form", ap)
		}
	})
}

// Through a real HTTP server: a trusted peer's header names the client (v1 and v2), its
// header-less connection keeps its own address, a malformed header closes the
// connection, and an untrusted peer's header is not read (the server answers 400).
func TestListener(t *testing.T) {
	for _, c := range []struct {
		name    string
		trusted string
		send    []byte
		want    string // RemoteAddr the handler sees; "400" for a Bad Request, "closed"
	}{
		{"v1", "127.0.0.0/8", []byte("PROXY TCP4 203.0.113.7 127.0.0.1 51000 80\r\n"), "203.0.113.7:51000"},
		{"v2", "127.0.0.0/8", v2TCP4([4]byte{198, 51, 100, 9}, [4]byte{127, 0, 0, 1}, 40000, 80, nil), "198.51.100.9:40000"},
		{"no header", "127.0.0.0/8", nil, "peer"},
		{"v2 local", "127.0.0.0/8", v2(0, 0, nil), "peer"},
		{"malformed", "127.0.0.0/8", []byte("PROXY TCP4 nonsense\r\n"), "closed"},
		{"untrusted", "10.0.0.0/8", []byte("PROXY TCP4 203.0.113.7 127.0.0.1 51000 80\r\n"), "400"},
	} {
		t.Run(c.name, func(t *testing.T) {
			inner, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.WriteString(w, r.RemoteAddr)
			})}
			ln := Listen(inner, netip.MustParsePrefix(c.trusted).Contains, 5*time.Second)
			done := make(chan struct{})
			go func() { defer close(done); _ = srv.Serve(ln) }()
			defer func() { srv.Close(); <-done }()
			conn, err := net.Dial("tcp", inner.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
			if _, err := conn.Write(append(c.send, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"...)); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			switch {
			case c.want == "closed":
				if err == nil {
					t.Fatalf("a malformed header was answered: %d", resp.StatusCode)
				}
				return
			case err != nil:
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			want := c.want
			if want == "peer" {
				want = conn.LocalAddr().String()
			}
			if want == "400" {
				if resp.StatusCode != http.StatusBadRequest {
					t.Fatalf("an untrusted peer's header: %d %q", resp.StatusCode, body)
				}
				return
			}
			if resp.StatusCode != 200 || string(body) != want {
				t.Fatalf("%d %q, want %s", resp.StatusCode, body, want)
			}
		})
	}
}
