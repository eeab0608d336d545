package main

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"path/filepath"
	"strings"
)

// consoleTokenFile is where a process with a data directory of its own (the embedded
// NATS) keeps the token of its operator console when no --admin-token is given: the
// base64url of 32 random bytes and a newline, mode 0600, created at the first start and
// reused after.
//
// It signs in to the console only; the admin API stays as --admin-token has it (open
// without one), so that Prometheus scrapes, `sluice queue` and scripts against an
// admin listener without a token keep working across an upgrade. The console needs a
// secret of its own all the same: without one, any page the operator's browser opens
// could drive the queues through it. The file is as readable as queue.key beside it
// (its owner only), whose reader can forge orders anyway; what goes to the log is a
// one-time sign-in code (console.NewSignInCode), printed at the start that created
// the file only.
const consoleTokenFile = "console.token"

// loadConsoleToken returns the console token kept in dir, creating it when there is
// none (created true). The caller holds the lock of dir.
func loadConsoleToken(dir string) (token string, created bool, err error) {
	path := filepath.Join(dir, consoleTokenFile)
	b, err := readPrivateFile(path, "console token", "it signs in to the console")
	switch {
	case err == nil:
		token = strings.TrimSpace(string(b))
		if len(token) < 16 || strings.ContainsAny(token, " \t\r\n") {
			return "", false, fmt.Errorf("console token %s is not a token: delete it for a new one", path)
		}
		return token, false, nil
	case !errors.Is(err, fs.ErrNotExist):
		return "", false, err
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key) // crypto/rand.Read never fails (Go 1.24)
	token = base64.RawURLEncoding.EncodeToString(key)
	if err := writeNewFile(path, []byte(token+"\n")); err != nil {
		return "", false, fmt.Errorf("console token %s: %w", path, err)
	}
	return token, true, nil
}

// consoleURL is the console's address on the admin listener at addr (as it listens:
// an unspecified host is reached on loopback).
func consoleURL(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "http://" + addr + "/console/"
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/console/"
}
