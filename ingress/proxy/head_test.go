package proxy

import (
	"bufio"
	"bytes"
	"net/http"
	"net/textproto"
	"reflect"
	"testing"
)

// FuzzSplitHead checks the fast path of readFields against textproto: on any bytes
// scanHead accepts, textproto reads the same status line and header, without error,
// and stops where scanHead said the head ends.
func FuzzSplitHead(f *testing.F) {
	for _, seed := range []string{
		"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\ncontent-length:  2 \t\r\nX-A: 1\r\nx-a: 2\r\nX-Odd_Key!: \r\n\r\n",
		"HTTP/1.1 204 \r\nWWW-Authenticate: x\r\nfoo-BAR: \x80\xff\r\n\r\nHTTP/1.1",
		"\r\n\r\n",
		"HTTP/1.1 200 OK\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\nE: 5\r\nF: 6\r\nG: 7\r\nH: 8\r\nI: 9\r\nJ: 10\r\nK: 11\r\nL: 12\r\nM: 13\r\n\r\n",
	} {
		f.Add([]byte(seed))
	}
	for _, seed := range notPlainHeads() {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		end, fields := scanHead(in)
		if end == 0 {
			return
		}
		var vals [3]string
		line, h := splitHead(string(in[:end]), fields, vals[:], http.Header{})

		tp := textproto.NewReader(bufio.NewReader(bytes.NewReader(in)))
		wantLine, err := tp.ReadLine()
		if err != nil {
			t.Fatalf("scanHead accepted %q, textproto's ReadLine failed: %v", in, err)
		}
		want, err := tp.ReadMIMEHeader()
		if err != nil {
			t.Fatalf("scanHead accepted %q, textproto's ReadMIMEHeader failed: %v", in, err)
		}
		if line != wantLine {
			t.Errorf("status line %q, textproto %q", line, wantLine)
		}
		if !reflect.DeepEqual(h, http.Header(want)) {
			t.Errorf("header of %q:\n%q\ntextproto:\n%q", in, h, want)
		}
		if rest := tp.R.Buffered(); rest != len(in)-end {
			t.Errorf("%q: the head ends at %d, textproto read %d", in, end, len(in)-rest)
		}
		if fields != len(flatten(h)) {
			t.Errorf("%q: %d fields counted, the header has %d values", in, fields, len(flatten(h)))
		}
	})
}

// notPlainHeads are heads that scanHead leaves to textproto: not whole in the buffer,
// or not plain.
func notPlainHeads() []string {
	return []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n", // not whole
		"HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n",    // continuation line
		"HTTP/1.1 200 OK\r\nX : a\r\n\r\n",         // space before the colon
		"HTTP/1.1 200 OK\r\nX: a\rb\r\n\r\n",       // bare CR
		"HTTP/1.1 200 OK\r\nX: a\nY: b\r\n\r\n",    // bare LF
		"HTTP/1.1 200 OK\n\r\n",                    // bare LF after the status line
		"HTTP/1.1 200 O\rK\r\n\r\n",                // bare CR in the status line
		"HTTP/1.1 200 OK\r\n: a\r\n\r\n",           // empty key
		"HTTP/1.1 200 OK\r\nX\r\n\r\n",             // no colon
		"HTTP/1.1 200 OK\r\nX: \x7f\r\n\r\n",       // DEL in a value
	}
}

// TestScanHeadDeclines: scanHead leaves the heads that are not whole or not plain to
// textproto, and finds the end of one that is.
func TestScanHeadDeclines(t *testing.T) {
	for _, in := range notPlainHeads() {
		if end, _ := scanHead([]byte(in)); end != 0 {
			t.Errorf("scanHead(%q) = %d, want 0", in, end)
		}
	}
	in := "HTTP/1.1 200 OK\r\nX: a\r\n\r\nbody"
	if end, fields := scanHead([]byte(in)); end != len(in)-len("body") || fields != 1 {
		t.Errorf("scanHead(%q) = %d, %d; want %d, 1", in, end, fields, len(in)-len("body"))
	}
}
