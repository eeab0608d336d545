package console

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A sign-in that is not a form and expects 100-continue is answered without waiting
// for a body the client does not send before its 100 Continue.
func TestLoginExpectContinue(t *testing.T) {
	f := newFixture(t, nil)
	srv := httptest.NewServer(f.h)
	defer srv.Close()
	c, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The deadline is only how long the test waits for an answer that would otherwise
	// never come; the answer is not timed.
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	if _, err := io.WriteString(c, "POST "+Prefix+"login HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	// No token in a body that is not a form: a failed sign-in, answered at once.
	if resp.StatusCode != http.StatusSeeOther || !strings.HasSuffix(resp.Header.Get("Location"), "login?failed=1") {
		t.Fatalf("status %d, Location %q: want 303 to the failed sign-in page (100: the server asked for a body it had no use for)",
			resp.StatusCode, resp.Header.Get("Location"))
	}
}
