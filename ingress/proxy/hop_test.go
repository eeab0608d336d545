package proxy

import (
	"net/textproto"
	"testing"
)

// FuzzCanonicalIs checks canonicalIs against its definition.
func FuzzCanonicalIs(f *testing.F) {
	for _, seed := range [][2]string{
		{"keep-alive", "Keep-Alive"}, {"Keep-Alive", "Keep-Alive"}, {"KEEP-ALIVE", "Keep-Alive"},
		{"keep-alive", "keep-alive"}, {"x y", "x y"}, {"X y", "x y"}, {"\u212a", "K"}, {"k", "K"},
		{"www-authenticate", "Www-Authenticate"}, {"WWW-Authenticate", "WWW-Authenticate"}, {"", ""},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, name, k string) {
		if got, want := canonicalIs(name, k), textproto.CanonicalMIMEHeaderKey(name) == k; got != want {
			t.Errorf("canonicalIs(%q, %q) = %v, want %v", name, k, got, want)
		}
	})
}
