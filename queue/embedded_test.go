package queue_test

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/embedded"
	"github.com/sluicehq/sluice/queue/natstest"
)

// TestEmbeddedListenerNeedsCredentials: there is no listener that anyone who reaches
// it can use.
func TestEmbeddedListenerNeedsCredentials(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  embedded.Config
	}{
		{"nothing", embedded.Config{Listen: "127.0.0.1:0"}},
		{"TLS without client certificates", embedded.Config{Listen: "127.0.0.1:0", TLS: &tls.Config{ClientAuth: tls.VerifyClientCertIfGiven}}},
	} {
		tc.cfg.DataDir = t.TempDir()
		e, err := embedded.Start(tc.cfg)
		if !errors.Is(err, embedded.ErrUnauthenticated) {
			if e != nil {
				e.Shutdown()
			}
			t.Errorf("%s: embedded.Start = %v, want ErrUnauthenticated", tc.name, err)
		}
	}
}

// TestEmbeddedTokenGuardsEveryConnection: with a token, a client without it (or with
// another) is refused, over TCP and in process alike; Connect gives it.
func TestEmbeddedTokenGuardsEveryConnection(t *testing.T) {
	const token = "0123456789abcdef0123456789abcdef"
	e, err := embedded.Start(embedded.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Token: token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Shutdown)
	url := e.ClientURL()
	for _, tc := range []struct {
		name string
		opts []nats.Option
		ok   bool
	}{
		{"no token", nil, false},
		{"wrong token", []nats.Option{nats.Token("0123456789abcdef0123456789abcdeX")}, false},
		{"token", []nats.Option{nats.Token(token)}, true},
		{"in process, no token", []nats.Option{nats.InProcessServer(e.NATS())}, false},
	} {
		nc, err := nats.Connect(url, append([]nats.Option{nats.Timeout(10 * time.Second)}, tc.opts...)...)
		if err == nil {
			_, err = nc.JetStream()
			if err == nil {
				_, err = nc.Request("$JS.API.INFO", nil, 10*time.Second)
			}
			nc.Close()
		}
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v, want success %v", tc.name, err, tc.ok)
		}
		// In process the server's refusal closes the pipe before nats.go reads it.
		if !tc.ok && err != nil && !strings.Contains(strings.ToLower(err.Error()), "authorization") && !strings.Contains(err.Error(), "closed pipe") {
			t.Errorf("%s: %v, want an authorization violation", tc.name, err)
		}
	}
	nc, err := e.Connect()
	if err != nil {
		t.Fatalf("in-process Connect: %v", err)
	}
	defer nc.Close()
	if _, err := queue.Open(ctxT(t), nc, queue.WithSigningKey(natstest.SigningKey())); err != nil {
		t.Fatalf("queue.Open on the in-process connection: %v", err)
	}
}

// grepDir returns the files under dir that contain marker.
func grepDir(t *testing.T, dir, marker string) []string {
	t.Helper()
	var found []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.Contains(b, []byte(marker)) {
			found = append(found, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// TestEmbeddedEncryptionAtRest: with a key, neither a parked body nor its headers are
// in clear in any file of the data directory; the directory does not open without
// the key or with another one (and is left as it was), and opens with it, orders
// there. Without a key the same bytes are in clear (which shows the search finds
// them), and a key given later encrypts that directory.
func TestEmbeddedEncryptionAtRest(t *testing.T) {
	const (
		key      = "k3y-0123456789abcdef0123456789abcdef"
		bodyMark = "BODY-MARKER-7f3a9c"
		hdrMark  = "Bearer HEADER-MARKER-51be02"
	)
	start := func(dir, key string) (*embedded.Server, *queue.Store, error) {
		e, err := embedded.Start(embedded.Config{DataDir: dir, EncryptionKey: key})
		if err != nil {
			return nil, nil, err
		}
		nc, err := e.Connect()
		if err != nil {
			e.Shutdown()
			t.Fatal(err)
		}
		s, err := queue.Open(ctxT(t), nc, queue.WithSigningKey(natstest.SigningKey()))
		if err == nil {
			_, err = s.Declare(ctxT(t), testConfig("orders"))
		}
		if err != nil {
			nc.Close()
			e.Shutdown()
			t.Fatal(err)
		}
		return e, s, nil
	}
	stop := func(e *embedded.Server, s *queue.Store) {
		s.Conn().Close()
		e.Shutdown()
	}
	park := func(s *queue.Store) string {
		req := order("orders", bodyMark)
		req.Header.Set("Authorization", hdrMark)
		rc, err := s.Park(ctxT(t), req)
		if err != nil {
			t.Fatal(err)
		}
		return rc.Ticket
	}
	queued := func(s *queue.Store, ticket string) {
		t.Helper()
		st, err := s.Status(ctxT(t), ticket)
		if err != nil || st.Status != queue.StatusQueued {
			t.Fatalf("ticket %s: %+v %v", ticket, st, err)
		}
		q, err := s.Queue("orders")
		if err != nil {
			t.Fatal(err)
		}
		m, err := q.Stream().GetLastMsgForSubject(ctxT(t), ">")
		if err != nil || !bytes.Contains(m.Data, []byte(bodyMark)) {
			t.Fatalf("the parked message does not read back: %v", err)
		}
	}

	t.Run("with a key", func(t *testing.T) {
		dir := t.TempDir()
		e, s, err := start(dir, key)
		if err != nil {
			t.Fatal(err)
		}
		ticket := park(s)
		stop(e, s)
		for _, m := range []string{bodyMark, hdrMark} {
			if files := grepDir(t, dir, m); len(files) > 0 {
				t.Errorf("%q in clear in %v", m, files)
			}
		}
		for _, k := range []string{"", "another-key-0123456789abcdef0123"} {
			e, _, err := start(dir, k)
			if !errors.Is(err, embedded.ErrEncryptionKey) {
				if e != nil {
					e.Shutdown()
				}
				t.Fatalf("key %q: %v, want ErrEncryptionKey", k, err)
			}
			t.Logf("key %q: %v", k, err)
		}
		e, s, err = start(dir, key)
		if err != nil {
			t.Fatal(err)
		}
		defer stop(e, s)
		queued(s, ticket)
	})

	t.Run("clear, then a key", func(t *testing.T) {
		dir := t.TempDir()
		e, s, err := start(dir, "")
		if err != nil {
			t.Fatal(err)
		}
		ticket := park(s)
		stop(e, s)
		for _, m := range []string{bodyMark, hdrMark} {
			if files := grepDir(t, dir, m); len(files) == 0 {
				t.Errorf("%q not found in clear without a key: the search is blind", m)
			}
		}
		e, s, err = start(dir, key)
		if err != nil {
			t.Fatal(err)
		}
		queued(s, ticket)
		stop(e, s)
		for _, m := range []string{bodyMark, hdrMark} {
			if files := grepDir(t, dir, m); len(files) > 0 {
				t.Errorf("%q still in clear after a start with a key: %v", m, files)
			}
		}
		if e, _, err := start(dir, ""); !errors.Is(err, embedded.ErrEncryptionKey) {
			if e != nil {
				e.Shutdown()
			}
			t.Fatalf("no key after encryption: %v", err)
		}
	})
}
