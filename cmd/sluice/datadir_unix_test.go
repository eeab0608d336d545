//go:build unix

package main

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

func TestDataDirLock(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	release, err := lockDataDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	// flock locks belong to the open file, so a second open in this process is refused
	// like another process would be.
	if _, err := lockDataDir(dir); !errors.Is(err, errDataDirLocked) || !strings.Contains(err.Error(), "pid ") {
		t.Fatalf("second lock: %v", err)
	}
	release()
	release, err = lockDataDir(dir)
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	release()
}
