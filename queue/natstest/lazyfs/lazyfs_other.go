//go:build !linux

package lazyfs

import (
	"errors"
	"os"
	"testing"
)

// ErrUnavailable is returned where this system has no lazy mounts (Linux only).
var ErrUnavailable = errors.New("lazyfs: FUSE mounts are built for Linux only")

// Available reports ErrUnavailable: lazy mounts are Linux only.
func Available() error { return ErrUnavailable }

// FS is a lazy mount; on this system none can be made.
type FS struct{}

// Loss is what a cut discarded.
type Loss struct {
	Files, Entries int
	Bytes          int64
}

// Discarded reports whether anything was lost.
func (l Loss) Discarded() bool { return l.Bytes > 0 || l.Entries > 0 }

// Option configures Mount and New.
type Option func(*FS)

// WithJournal makes directories behave as on a journaling filesystem.
func WithJournal() Option { return func(*FS) {} }

// Mount skips t: lazy mounts are Linux only.
func Mount(t testing.TB, _ ...Option) *FS {
	t.Helper()
	t.Skip(ErrUnavailable)
	return nil
}

// New fails: lazy mounts are Linux only.
func New(string, ...Option) (*FS, error) { return nil, ErrUnavailable }

// Dir is the mount point.
func (f *FS) Dir() string { return "" }

// Close does nothing.
func (f *FS) Close() error { return nil }

// Sync does nothing.
func (f *FS) Sync() {}

// PowerCut fails: lazy mounts are Linux only.
func PowerCut([]*os.Process, ...*FS) (Loss, error) { return Loss{}, ErrUnavailable }
