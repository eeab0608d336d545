package ingress

import (
	"context"
	"crypto/subtle"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// Wrong admin tokens an address may present before it is locked out, and how fast
// that allowance comes back.
const (
	MaxWrongTokens   = 10
	WrongTokenRefill = 6 * time.Second // one more wrong token every 6 s: 10 a minute

	maxLockedAddrs = 10_000
)

// TokenGuard checks presented admin tokens and makes guessing them slow: an address
// (the connection's peer; for IPv6 its /64) that presented MaxWrongTokens wrong
// tokens is refused, with the right token too, until its allowance refills by one
// (WrongTokenRefill); right tokens cost nothing. Admin uses one for its bearer token
// and the console for its sign-in; sharing one between them (NewTokenGuard once) gives
// a guesser one allowance for both. Safe for concurrent use.
type TokenGuard struct {
	token []byte
	now   func() time.Time
	wrong *limiter.Memory
	limit limiter.Limit

	mu     sync.Mutex
	locked map[string]time.Time // address → end of its lockout
}

// NewTokenGuard returns a guard of token. now is the clock (nil: time.Now).
func NewTokenGuard(token string, now func() time.Time) *TokenGuard {
	if now == nil {
		now = time.Now
	}
	return &TokenGuard{
		token:  []byte(token),
		now:    now,
		wrong:  limiter.NewMemory(limiter.WithClock(now), limiter.WithMaxKeys(maxLockedAddrs)),
		limit:  limiter.Limit{Algorithm: limiter.TokenBucket, Rate: 1, Period: WrongTokenRefill, Burst: MaxWrongTokens},
		locked: make(map[string]time.Time),
	}
}

// Check reports whether presented is the token, for a request from r's peer. When the
// peer is locked out (before or because of this attempt) ok is false and retryAfter
// says for how long; a wrong token within the allowance has ok false and retryAfter 0.
func (g *TokenGuard) Check(r *http.Request, presented string) (ok bool, retryAfter time.Duration) {
	addr := peerAddr(r)
	now := g.now()
	g.mu.Lock()
	until, locked := g.locked[addr]
	g.mu.Unlock()
	if locked && now.Before(until) {
		return false, until.Sub(now)
	}
	if subtle.ConstantTimeCompare([]byte(presented), g.token) == 1 {
		return true, 0
	}
	d, err := g.wrong.AllowN(context.Background(), addr, g.limit, 1)
	if err != nil || d.Allowed {
		return false, 0
	}
	g.lock(addr, now.Add(d.RetryAfter))
	return false, d.RetryAfter
}

// lock records a lockout, keeping at most maxLockedAddrs: past it, ended lockouts go
// first, then the one ending soonest.
func (g *TokenGuard) lock(addr string, until time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.locked) >= maxLockedAddrs {
		now := g.now()
		soonest, soonestAt := "", time.Time{}
		for a, t := range g.locked {
			if !t.After(now) {
				delete(g.locked, a)
			} else if soonest == "" || t.Before(soonestAt) {
				soonest, soonestAt = a, t
			}
		}
		if len(g.locked) >= maxLockedAddrs {
			delete(g.locked, soonest)
		}
	}
	g.locked[addr] = until
}

// WriteLockedOut answers a request from a locked-out address: 429 with Retry-After.
func WriteLockedOut(w http.ResponseWriter, retryAfter time.Duration) {
	w.Header().Set("Retry-After", strconv.FormatInt(int64((retryAfter+time.Second-1)/time.Second), 10))
	writeProblem(w, simpleProblem(http.StatusTooManyRequests, "Too many wrong tokens from this address: try again later."))
}

// guardV6Prefix is how IPv6 peers are grouped for their allowance of wrong tokens: a
// host has a whole /64 to send from (the front door groups IPv6 clients the same way
// by default).
const guardV6Prefix = 64

// peerAddr is the host of r's connection peer (not a forwarded address: the admin
// listener trusts no proxy headers for this); an IPv6 peer's /64.
func peerAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	if a, err := netip.ParseAddr(host); err == nil && a.Unmap().Is6() {
		if p, err := a.Prefix(guardV6Prefix); err == nil {
			return p.String()
		}
	}
	return host
}
