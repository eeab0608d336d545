//go:build unix

package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// errDataDirLocked: another process runs an embedded NATS server on the directory.
var errDataDirLocked = errors.New("in use by another sluice process")

// dataDirLockFile is kept next to JetStream's own directory (DIR/jetstream).
const dataDirLockFile = "sluice.lock"

// lockDataDir takes an exclusive lock on dir (created if missing) for the life of the
// process, or until release is called. A directory locked by another process gives an
// error wrapping errDataDirLocked that names the holder's process id.
func lockDataDir(dir string) (release func(), err error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("--data-dir: %w", err)
	}
	path := filepath.Join(dir, dataDirLockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("--data-dir: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			holder := ""
			if b, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(b))) > 0 {
				holder = " (pid " + strings.TrimSpace(string(b)) + ")"
			}
			return nil, fmt.Errorf("--data-dir %s is %w%s", dir, errDataDirLocked, holder)
		}
		return nil, fmt.Errorf("--data-dir %s: lock: %w", dir, err)
	}
	// The process id is only for the message above; the lock is what counts.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(fmt.Sprintf("%d\n", os.Getpid())), 0)
	}
	return func() { f.Close() }, nil
}
