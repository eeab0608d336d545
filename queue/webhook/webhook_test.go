package webhook

import (
	"encoding/base64"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The Standard Webhooks specification's own example: this secret, id, timestamp and
// body sign to this value, so any conforming receiver accepts sluice's callbacks.
func TestSignMatchesTheSpecificationsExample(t *testing.T) {
	s, err := ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		t.Fatal(err)
	}
	got := s.Sign("msg_p5jXN8AQM9LWM0D4loKWxJek", time.Unix(1614265330, 0), []byte(`{"test": 2432232314}`))
	if want := "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; got != want {
		t.Errorf("Sign = %s, want %s", got, want)
	}
}

func TestVerify(t *testing.T) {
	s, err := ParseSecret(NewSecret())
	if err != nil {
		t.Fatal(err)
	}
	other, _ := ParseSecret(NewSecret())
	now := time.Unix(1_800_000_000, 0)
	body := []byte(`{"ticket":"t"}`)
	signed := func(at time.Time) http.Header {
		h := http.Header{}
		s.SetHeaders(h, "evt_1", at, body)
		return h
	}
	cases := []struct {
		name    string
		h       http.Header
		body    []byte
		secrets []Secret
		want    error
	}{
		{"genuine", signed(now), body, []Secret{s}, nil},
		{"genuine, key rotation", signed(now), body, []Secret{other, s}, nil},
		{"signed 4 minutes ago", signed(now.Add(-4 * time.Minute)), body, []Secret{s}, nil},
		{"replayed after 6 minutes", signed(now.Add(-6 * time.Minute)), body, []Secret{s}, ErrTimestamp},
		{"from the future", signed(now.Add(6 * time.Minute)), body, []Secret{s}, ErrTimestamp},
		{"body changed", signed(now), []byte(`{"ticket":"u"}`), []Secret{s}, ErrSignature},
		{"other key", signed(now), body, []Secret{other}, ErrSignature},
		{"no headers", http.Header{}, body, []Secret{s}, ErrHeaders},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id, err := Verify(c.h, c.body, now, 0, c.secrets...)
			if !errors.Is(err, c.want) || (err == nil) != (c.want == nil) {
				t.Fatalf("Verify = %q, %v; want %v", id, err, c.want)
			}
			if err == nil && id != "evt_1" {
				t.Errorf("id = %q", id)
			}
		})
	}
	// A changed id or timestamp breaks the signature.
	h := signed(now)
	h.Set(HeaderID, "evt_2")
	if _, err := Verify(h, body, now, 0, s); !errors.Is(err, ErrSignature) {
		t.Errorf("changed id: %v", err)
	}
	h = signed(now)
	h.Set(HeaderSignature, "v2,"+strings.TrimPrefix(h.Get(HeaderSignature), "v1,")+" garbage v1,!!!")
	if _, err := Verify(h, body, now, 0, s); !errors.Is(err, ErrSignature) {
		t.Errorf("other version only: %v", err)
	}
}

func TestParseSecret(t *testing.T) {
	key := make([]byte, 32)
	cases := []struct {
		in string
		ok bool
	}{
		{SecretPrefix + base64.StdEncoding.EncodeToString(key), true},
		{NewSecret(), true},
		{base64.StdEncoding.EncodeToString(key), false},                             // no prefix
		{SecretPrefix + "not base64!", false},                                       // not base64
		{SecretPrefix + base64.StdEncoding.EncodeToString(key[:8]), false},          // too short
		{SecretPrefix + base64.StdEncoding.EncodeToString(make([]byte, 65)), false}, // too long
		{"", false},
	}
	for _, c := range cases {
		s, err := ParseSecret(c.in)
		if (err == nil) != c.ok {
			t.Errorf("ParseSecret(%.12q…) = %v", c.in, err)
			continue
		}
		if err != nil {
			if !errors.Is(err, ErrSecret) || (len(c.in) > 12 && strings.Contains(err.Error(), c.in[6:])) {
				t.Errorf("error %q: must wrap ErrSecret and not quote the secret", err)
			}
			continue
		}
		if s.String() != strings.TrimSpace(c.in) {
			t.Errorf("String() does not give the text back")
		}
	}
}

func FuzzVerify(f *testing.F) {
	s, _ := ParseSecret(NewSecret())
	f.Add("evt_1", "1800000000", "v1,abc", []byte("{}"))
	f.Add("", "x", "v1, v1,", []byte(nil))
	f.Fuzz(func(t *testing.T, id, ts, sig string, body []byte) {
		h := http.Header{}
		h.Set(HeaderID, id)
		h.Set(HeaderTimestamp, ts)
		h.Set(HeaderSignature, sig)
		if _, err := Verify(h, body, time.Unix(1_800_000_000, 0), 0, s); err == nil {
			t.Fatalf("accepted a signature not made with the key: %q %q %q", id, ts, sig)
		}
	})
}
