package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// The lean client sends the prepared request (headers, body, the key when given),
// reuses its connection while the server keeps it, and dials anew when the server
// closes it.
func TestLeanPoster(t *testing.T) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch {
		case r.Method != "POST" || r.URL.RequestURI() != "/v1/orders?x=1" || string(body) != "payload" ||
			r.Header.Get("Content-Type") != "application/json":
			http.Error(w, "unexpected request", http.StatusBadRequest)
		case r.Header.Get("Idempotency-Key") == `"close"`:
			w.Header().Set("Connection", "close")
			w.WriteHeader(http.StatusAccepted)
		case r.Header.Get("Idempotency-Key") != "":
			w.WriteHeader(http.StatusAccepted)
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	p, err := newLeanPoster(srv.URL+"/v1/orders?x=1", http.Header{"Content-Type": {"application/json"}}, []byte("payload"), 4)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, c := range []struct {
		key   string
		want  int
		conns int32
	}{
		{"", http.StatusNoContent, 1},
		{`"k-1"`, http.StatusAccepted, 1},
		{`"close"`, http.StatusAccepted, 1},
		{`"k-2"`, http.StatusAccepted, 2},
	} {
		status, err := p.post(ctx, c.key)
		if err != nil || status != c.want || conns.Load() != c.conns {
			t.Errorf("request %d (key %s): %d %v over %d connections; want %d over %d", i, c.key, status, err, conns.Load(), c.want, c.conns)
		}
	}
	if _, err := newLeanPoster("https://example.com/", nil, nil, 1); err == nil {
		t.Error("an https URL was taken")
	}
}
