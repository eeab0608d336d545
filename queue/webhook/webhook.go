// Package webhook signs and verifies sluice's completion callbacks the Standard Webhooks
// way, so that a receiver can tell a genuine callback from a forged or replayed one.
//
// A callback is an HTTP POST with a JSON body and three headers:
//
//	webhook-id         the event's identifier, the same on every retry of one event
//	webhook-timestamp  when this attempt was signed, Unix seconds
//	webhook-signature  "v1,<base64 HMAC-SHA256 of id.timestamp.body>", space-separated
//	                   when several keys sign (during a key rotation)
//
// The key is a queue's callback_secret, written "whsec_<base64 of the key bytes>".
// The package needs only the standard library: a receiver imports it without pulling
// in sluice's queue or NATS code.
//
// It lives under queue because a queue owns its callbacks: queue/queueconfig checks a
// queue's callback_secret with ParseSecret, queue hands each callback its Secret, and
// the dispatcher signs every attempt with it; the queue's folder is the lowest that all
// three reach downwards (the dispatcher builds on queue, never the other way round).
package webhook

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Header names of a signed callback.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// SecretPrefix starts the text form of a Secret.
const SecretPrefix = "whsec_"

// MinSecretBytes and MaxSecretBytes bound a secret's key (Standard Webhooks uses 24 to
// 64 random bytes).
const (
	MinSecretBytes = 24
	MaxSecretBytes = 64
)

// DefaultTolerance is how far a callback's timestamp may be from the receiver's clock
// before Verify refuses it as a replay.
const DefaultTolerance = 5 * time.Minute

// Errors of ParseSecret and Verify.
var (
	ErrSecret    = errors.New("webhook: invalid secret")
	ErrHeaders   = errors.New("webhook: missing webhook-id, webhook-timestamp or webhook-signature")
	ErrTimestamp = errors.New("webhook: timestamp outside the tolerance")
	ErrSignature = errors.New("webhook: no matching signature")
)

// Secret is the key that signs a queue's callbacks.
type Secret []byte

// ParseSecret reads a secret in its text form, "whsec_" and the key in standard base64.
// Its errors never quote the text.
func ParseSecret(s string) (Secret, error) {
	enc, ok := strings.CutPrefix(strings.TrimSpace(s), SecretPrefix)
	if !ok {
		return nil, fmt.Errorf("%w: it must start with %s", ErrSecret, SecretPrefix)
	}
	key, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		return nil, fmt.Errorf("%w: the part after %s is not standard base64", ErrSecret, SecretPrefix)
	}
	if len(key) < MinSecretBytes || len(key) > MaxSecretBytes {
		return nil, fmt.Errorf("%w: the key must be %d to %d bytes, got %d", ErrSecret, MinSecretBytes, MaxSecretBytes, len(key))
	}
	return Secret(key), nil
}

// NewSecret returns a fresh random secret of 32 bytes in its text form.
func NewSecret() string {
	var key [32]byte
	_, _ = rand.Read(key[:]) // never fails (crypto/rand panics on failure)
	return SecretPrefix + base64.StdEncoding.EncodeToString(key[:])
}

// String is the secret's text form (ParseSecret reads it back).
func (s Secret) String() string { return SecretPrefix + base64.StdEncoding.EncodeToString(s) }

// Sign returns the webhook-signature value of one attempt: "v1," and the base64 HMAC-SHA256
// of id, '.', the timestamp in Unix seconds, '.', and the body.
func (s Secret) Sign(id string, ts time.Time, body []byte) string {
	return "v1," + base64.StdEncoding.EncodeToString(s.mac(id, strconv.FormatInt(ts.Unix(), 10), body))
}

func (s Secret) mac(id, ts string, body []byte) []byte {
	h := hmac.New(sha256.New, s)
	h.Write([]byte(id))
	h.Write([]byte{'.'})
	h.Write([]byte(ts))
	h.Write([]byte{'.'})
	h.Write(body)
	return h.Sum(nil)
}

// SetHeaders sets the three headers of a callback attempt signed at ts.
func (s Secret) SetHeaders(h http.Header, id string, ts time.Time, body []byte) {
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
	h.Set(HeaderSignature, s.Sign(id, ts, body))
}

// Verify checks a received callback: the headers must be present, the timestamp within
// tolerance of now (DefaultTolerance when tolerance is 0), and one of the v1 signatures
// the HMAC of id, timestamp and body under one of the secrets (several during a key
// rotation). It returns the event's id, which a receiver uses to drop repeats: a
// callback is retried until the receiver answers 2xx, so it may arrive more than once.
func Verify(h http.Header, body []byte, now time.Time, tolerance time.Duration, secrets ...Secret) (id string, err error) {
	id, ts, sigs := h.Get(HeaderID), h.Get(HeaderTimestamp), h.Get(HeaderSignature)
	if id == "" || ts == "" || sigs == "" {
		return "", ErrHeaders
	}
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return "", fmt.Errorf("%w: %s is not Unix seconds", ErrTimestamp, HeaderTimestamp)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return "", ErrTimestamp
	}
	for _, sig := range strings.Fields(sigs) {
		enc, ok := strings.CutPrefix(sig, "v1,")
		if !ok {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(enc)
		if err != nil {
			continue
		}
		for _, s := range secrets {
			if hmac.Equal(got, s.mac(id, ts, body)) {
				return id, nil
			}
		}
	}
	return "", ErrSignature
}
