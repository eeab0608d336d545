//go:build !unix

package main

import (
	"errors"
	"fmt"
	"os"
)

// errDataDirLocked: another process runs an embedded NATS server on the directory.
var errDataDirLocked = errors.New("in use by another sluice process")

// lockDataDir only creates dir here: there is no flock, so keeping two processes off
// one directory is up to the operator on this platform.
func lockDataDir(dir string) (release func(), err error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("--data-dir: %w", err)
	}
	return func() {}, nil
}
