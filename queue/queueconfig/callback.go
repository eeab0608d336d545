package queueconfig

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// ErrCallbackRefused is returned by Config.CheckCallback for a callback URL the queue
// does not allow.
var ErrCallbackRefused = errors.New("callback refused")

// MaxCallbackURL is the longest callback URL a queue takes, in bytes.
const MaxCallbackURL = 2048

// callbackHost is one entry of CallbackHosts.
type callbackHost struct {
	hostPort  string // lower case, port only if the entry gave one
	plainHTTP bool
}

func parseCallbackHost(entry string) (callbackHost, error) {
	h := callbackHost{hostPort: entry}
	if rest, ok := strings.CutPrefix(entry, "http://"); ok {
		h = callbackHost{hostPort: rest, plainHTTP: true}
	}
	hp := h.hostPort
	host, port := hp, ""
	if strings.Contains(hp, ":") {
		var err error
		if host, port, err = net.SplitHostPort(hp); err != nil || port == "" {
			return h, fmt.Errorf("%q is not host or host:port", entry)
		}
	}
	if host == "" || strings.ContainsAny(host, "/?#@*[]% ") {
		return h, fmt.Errorf("%q is not host or host:port (no scheme but http://, path, credentials or wildcard)", entry)
	}
	if n, err := strconv.Atoi(port); port != "" && (err != nil || n < 1 || n > 65535 || port[0] == '+') {
		return h, fmt.Errorf("%q is not host or host:port (invalid port)", entry)
	}
	h.hostPort = strings.ToLower(hp)
	return h, nil
}

// CheckCallback parses a client's callback URL and reports whether the queue allows it:
// an absolute https URL (or http for a host listed as http://…) whose host[:port] is in
// CallbackHosts, without credentials or fragment, at most MaxCallbackURL bytes. Its
// errors wrap ErrCallbackRefused and never quote more than the URL's host.
func (c Config) CheckCallback(raw string) (*url.URL, error) {
	if len(c.CallbackHosts) == 0 {
		return nil, fmt.Errorf("%w: queue %q takes no callbacks", ErrCallbackRefused, c.Name)
	}
	if len(raw) > MaxCallbackURL {
		return nil, fmt.Errorf("%w: the URL is longer than %d bytes", ErrCallbackRefused, MaxCallbackURL)
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil || !u.IsAbs() || u.Host == "" || u.Opaque != "":
		return nil, fmt.Errorf("%w: not an absolute http(s) URL", ErrCallbackRefused)
	case u.User != nil:
		return nil, fmt.Errorf("%w: the URL must not carry credentials", ErrCallbackRefused)
	case u.Fragment != "":
		return nil, fmt.Errorf("%w: the URL must not have a #fragment", ErrCallbackRefused)
	case u.Scheme != "https" && u.Scheme != "http":
		return nil, fmt.Errorf("%w: the URL must be https", ErrCallbackRefused)
	}
	host := strings.ToLower(u.Host)
	for _, e := range c.CallbackHosts {
		h, err := parseCallbackHost(e)
		if err == nil && h.hostPort == host && (u.Scheme == "https" || h.plainHTTP) {
			return u, nil
		}
	}
	if u.Scheme == "http" {
		return nil, fmt.Errorf("%w: plain http to %s is not allowed by queue %q (list it as http://%s in callback_hosts)", ErrCallbackRefused, host, c.Name, host)
	}
	return nil, fmt.Errorf("%w: host %s is not in queue %q's callback_hosts", ErrCallbackRefused, host, c.Name)
}
