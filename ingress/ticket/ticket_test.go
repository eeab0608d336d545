package ticket

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestWaitAgainstHostileAnswers: Wait asks with Prefer: wait, asks again at once after
// an applied wait, follows Retry-After (within bounds) on 429 and when the preference
// is ignored, and turns 404, an oversized or malformed body and other statuses into
// errors instead of looping.
func TestWaitAgainstHostileAnswers(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		switch r.URL.Path {
		case "/follow":
			if p := r.Header.Get("Prefer"); !strings.HasPrefix(p, "wait=") {
				t.Errorf("request %d: Prefer %q", i, p)
			}
			switch i {
			case 1:
				w.Header().Set("Retry-After", "-5") // hostile: never a spin
				w.WriteHeader(http.StatusTooManyRequests)
			case 2:
				w.Header().Set("Preference-Applied", "wait=60")
				w.Write([]byte(`{"ticket":"t","status":"queued"}`))
			default:
				w.Write([]byte(`{"ticket":"t","status":"done","result":{"status":201,"body":"made"}}`))
			}
		case "/gone":
			w.WriteHeader(http.StatusNotFound)
		case "/huge":
			w.Write([]byte(`{"status":"` + strings.Repeat("x", maxBody) + `"}`))
		case "/teapot":
			w.WriteHeader(http.StatusTeapot)
		case "/junk":
			w.Write([]byte("<html>"))
		case "/slow":
			w.Header().Set("Retry-After", "86400") // capped at a minute; ctx ends first
			w.Write([]byte(`{"status":"queued"}`))
		}
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := Wait(ctx, srv.URL+"/follow")
	if err != nil || st.Status != Done || st.Result.Body != "made" || n.Load() != 3 {
		t.Fatalf("Wait: %+v %v after %d requests, want done after 3", st, err, n.Load())
	}
	if _, err := Wait(ctx, srv.URL+"/gone"); !errors.Is(err, ErrNotFound) {
		t.Errorf("404: %v, want ErrNotFound", err)
	}
	for _, path := range []string{"/huge", "/teapot", "/junk"} {
		if st, err := Wait(ctx, srv.URL+path); err == nil {
			t.Errorf("%s: %+v, want an error", path, st)
		}
	}
	short, cancelShort := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancelShort()
	if _, err := Wait(short, srv.URL+"/slow"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a status that stays queued past ctx's deadline: %v", err)
	}
}

func TestRetryAfter(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"": time.Second, "0": time.Second, "3": 3 * time.Second, "99999999999999999999": time.Minute,
		"86400": time.Minute, "junk": time.Second, http.TimeFormat: time.Second,
		time.Now().Add(time.Hour).UTC().Format(http.TimeFormat): time.Minute,
	} {
		if got := retryAfter(in); got != want {
			t.Errorf("retryAfter(%q) = %v, want %v", in, got, want)
		}
	}
}
