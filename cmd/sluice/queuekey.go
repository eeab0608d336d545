package main

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/sluicehq/sluice/queue"
)

// queueKeyFile is where the embedded shape keeps its generated signing key, in
// --data-dir: the base64 of 32 random bytes and a newline, mode 0600.
const queueKeyFile = "queue.key"

// checkQueueKey decodes --queue-key, which --nats requires: replicas cannot share a
// generated key.
func (c *natsConfig) checkQueueKey() error {
	switch {
	case c.queueKey != "":
		key, err := parseQueueKey(c.queueKey)
		if err != nil {
			return fmt.Errorf("--queue-key: %w", err)
		}
		c.signKey = key
	case c.url != "":
		return errors.New("--queue-key (or SLUICE_QUEUE_KEY) is required with --nats: every process sharing the queues must sign with the same key (generate one with: openssl rand -base64 32)")
	}
	return nil
}

// parseQueueKey decodes a signing key given as standard base64 (padding optional, as
// `openssl rand -base64 32` prints it) of at least queue.MinSigningKey bytes.
func parseQueueKey(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	key, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		key, err = base64.RawStdEncoding.DecodeString(s)
	}
	if err != nil {
		return nil, errors.New("not base64 (generate one with: openssl rand -base64 32)")
	}
	if len(key) < queue.MinSigningKey {
		return nil, fmt.Errorf("%d bytes, want at least %d (generate one with: openssl rand -base64 32)", len(key), queue.MinSigningKey)
	}
	return key, nil
}

// loadQueueKey returns the key kept in dir, creating it when there is none. The caller
// holds the lock of dir. A key file that others may read, or that is not a key,
// is refused rather than replaced: parked orders were signed with it.
func loadQueueKey(dir string) ([]byte, error) {
	path := filepath.Join(dir, queueKeyFile)
	key, err := readQueueKey(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return key, err
	}
	key = make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("queue key: %w", err)
	}
	if err := writeNewFile(path, []byte(base64.StdEncoding.EncodeToString(key)+"\n")); err != nil {
		if errors.Is(err, fs.ErrExist) { // cannot happen under the lock; read what is there
			return readQueueKey(path)
		}
		return nil, fmt.Errorf("queue key %s: %w", path, err)
	}
	return key, nil
}

func readQueueKey(path string) ([]byte, error) {
	b, err := readPrivateFile(path, "queue key", "it signs every parked order")
	if err != nil {
		return nil, err
	}
	key, err := parseQueueKey(string(b))
	if err != nil {
		return nil, fmt.Errorf("queue key %s: %w", path, err)
	}
	return key, nil
}

// readPrivateFile reads a secret that sluice keeps in its data directory, what (for
// the errors) and why it matters: a regular file that only its owner may read. A
// missing file gives os.Lstat's error, which wraps fs.ErrNotExist.
func readPrivateFile(path, what, why string) ([]byte, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s %s is not a regular file", what, path)
	}
	if runtime.GOOS != "windows" && fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%s %s may be read by others (mode %04o); %s: chmod 600 it", what, path, fi.Mode().Perm(), why)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return b, nil
}

// writeNewFile creates path with data, mode 0600, all or nothing: the data goes to a
// temporary file that is synced, then linked to path, which fails if path exists.
func writeNewFile(path string, data []byte) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+"-*") // O_EXCL, mode 0600
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		return err
	}
	if d, err := os.Open(dir); err == nil { // make the new name durable
		_ = d.Sync()
		d.Close()
	}
	return nil
}
