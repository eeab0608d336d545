//go:build linux

package lazyfs_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/limiter/linktest"
	"github.com/sluicehq/sluice/queue/natstest/lazyfs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Nothing but tests imports the package: go-fuse stays out of sluice's programs.
func TestNoProductionImport(t *testing.T) {
	const self = "github.com/sluicehq/sluice/queue/natstest/lazyfs"
	imports := linktest.Imports(t, "github.com/sluicehq/sluice/...")
	if _, ok := imports["github.com/sluicehq/sluice/cmd/sluice"]; !ok {
		t.Fatalf("go list did not list the sluice command among %d packages", len(imports))
	}
	for pkg, imps := range imports {
		if pkg != self && slices.Contains(imps, self) {
			t.Errorf("%s imports %s", pkg, self)
		}
	}
}

// write creates or replaces the file at path with data through the mount, syncing
// it when sync is set.
func write(t *testing.T, path, data string, sync bool) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(data); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// syncDir fsyncs the directory at path.
func syncDir(t *testing.T, path string) {
	t.Helper()
	d, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
}

// content returns the file's contents, or "<none>" if it does not exist.
func content(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "<none>"
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func cut(t *testing.T, procs []*os.Process, fss ...*lazyfs.FS) lazyfs.Loss {
	t.Helper()
	loss, err := lazyfs.PowerCut(procs, fss...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("discarded %s", loss)
	return loss
}

func expect(t *testing.T, path, want string) {
	t.Helper()
	if got := content(t, path); got != want {
		t.Errorf("%s: %q, want %q", filepath.Base(path), got, want)
	}
}

func TestWriteWithoutSyncIsLostWithSyncKept(t *testing.T) {
	f := lazyfs.Mount(t)
	lost, kept := filepath.Join(f.Dir(), "lost"), filepath.Join(f.Dir(), "kept")
	write(t, lost, "", false)
	write(t, kept, "", false)
	syncDir(t, f.Dir()) // both names durable, both files empty

	write(t, lost, "not synced", false)
	write(t, kept, "synced", true)
	// Before the cut every write is read back, synced or not.
	expect(t, lost, "not synced")
	expect(t, kept, "synced")

	loss := cut(t, nil, f)
	expect(t, lost, "")
	expect(t, kept, "synced")
	if loss.Bytes != int64(len("not synced")) || loss.Files != 1 || loss.Entries != 0 {
		t.Errorf("loss %+v, want the 10 unsynced bytes of one file", loss)
	}
}

// A write to a file opened with O_SYNC (or O_DSYNC) is durable when it returns: the
// kernel syncs the file after each one.
func TestOSyncWriteIsKept(t *testing.T) {
	f := lazyfs.Mount(t)
	for _, flag := range []int{os.O_SYNC, syscall.O_DSYNC} {
		path := filepath.Join(f.Dir(), fmt.Sprint("sync-", flag))
		write(t, path, "", true)
		syncDir(t, f.Dir())
		o, err := os.OpenFile(path, os.O_WRONLY|flag, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := o.WriteString("durable"); err != nil {
			t.Fatal(err)
		}
		o.Close()
	}
	cut(t, nil, f)
	for _, flag := range []int{os.O_SYNC, syscall.O_DSYNC} {
		expect(t, filepath.Join(f.Dir(), fmt.Sprint("sync-", flag)), "durable")
	}
}

func TestNewFileWithoutDirSyncIsLost(t *testing.T) {
	f := lazyfs.Mount(t)
	dir := filepath.Join(f.Dir(), "d")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	syncDir(t, f.Dir())
	write(t, filepath.Join(dir, "synced-file-only"), "data", true)
	write(t, filepath.Join(dir, "both"), "data", true)
	syncDir(t, dir)
	write(t, filepath.Join(dir, "after-dir-sync"), "data", true)
	// A directory made and filled, but never synced, nor its parent after it.
	sub := filepath.Join(f.Dir(), "new")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(sub, "x"), "data", true)
	syncDir(t, sub)

	loss := cut(t, nil, f)
	expect(t, filepath.Join(dir, "synced-file-only"), "data") // created before the directory's sync
	expect(t, filepath.Join(dir, "both"), "data")
	expect(t, filepath.Join(dir, "after-dir-sync"), "<none>")
	if _, err := os.Stat(sub); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a directory whose parent was not synced after its mkdir survived: %v", err)
	}
	if loss.Entries != 2 {
		t.Errorf("loss %+v, want 2 directory entries", loss)
	}
}

// On a journaling filesystem a sync of a file commits every directory change before
// it; what came after stays unsynced.
func TestJournalCommitsEarlierDirectoryChanges(t *testing.T) {
	f := lazyfs.Mount(t, lazyfs.WithJournal())
	dir := filepath.Join(f.Dir(), "d")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "synced"), "data", true) // commits the mkdir and its own name
	write(t, filepath.Join(dir, "later"), "data", false)
	cut(t, nil, f)
	expect(t, filepath.Join(dir, "synced"), "data")
	expect(t, filepath.Join(dir, "later"), "<none>")
}

func TestRename(t *testing.T) {
	f := lazyfs.Mount(t)
	d := f.Dir()
	path := func(name string) string { return filepath.Join(d, name) }
	write(t, path("cur"), "v1", true)
	write(t, path("moved"), "m", true)
	syncDir(t, d)

	// The replace-by-rename idiom without the directory's sync: the old file is back.
	write(t, path("cur.tmp"), "v2", true)
	if err := os.Rename(path("cur.tmp"), path("cur")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path("moved"), path("moved2")); err != nil {
		t.Fatal(err)
	}
	expect(t, path("cur"), "v2")
	cut(t, nil, f)
	expect(t, path("cur"), "v1")
	expect(t, path("cur.tmp"), "<none>")
	expect(t, path("moved"), "m")
	expect(t, path("moved2"), "<none>")

	// With the directory's sync the new file is what stays.
	write(t, path("cur.tmp"), "v3", true)
	if err := os.Rename(path("cur.tmp"), path("cur")); err != nil {
		t.Fatal(err)
	}
	syncDir(t, d)
	cut(t, nil, f)
	expect(t, path("cur"), "v3")
	expect(t, path("cur.tmp"), "<none>")

	// Across directories, only the synced side is durable: the file is in both.
	if err := os.Mkdir(path("a"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path("b"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, path("a/f"), "across", true)
	syncDir(t, path("a"))
	syncDir(t, path("b"))
	syncDir(t, d)
	if err := os.Rename(path("a/f"), path("b/f")); err != nil {
		t.Fatal(err)
	}
	syncDir(t, path("b"))
	cut(t, nil, f)
	expect(t, path("a/f"), "across")
	expect(t, path("b/f"), "across")
}

func TestUnlinkRmdirTruncateOverwrite(t *testing.T) {
	f := lazyfs.Mount(t)
	d := f.Dir()
	path := func(name string) string { return filepath.Join(d, name) }
	write(t, path("removed"), "still here", true)
	write(t, path("overwritten"), "0123456789", true)
	write(t, path("truncated"), "0123456789", true)
	if err := os.Mkdir(path("emptydir"), 0o755); err != nil {
		t.Fatal(err)
	}
	syncDir(t, d)

	if err := os.Remove(path("removed")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path("emptydir")); err != nil {
		t.Fatal(err)
	}
	o, err := os.OpenFile(path("overwritten"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.WriteAt([]byte("abc"), 2); err != nil {
		t.Fatal(err)
	}
	if _, err := o.WriteAt([]byte("XY"), 3); err != nil { // twice over the same bytes
		t.Fatal(err)
	}
	if _, err := o.WriteAt([]byte("tail"), 10); err != nil {
		t.Fatal(err)
	}
	o.Close()
	if err := os.Truncate(path("truncated"), 4); err != nil {
		t.Fatal(err)
	}
	expect(t, path("overwritten"), "01aXY56789tail")
	expect(t, path("truncated"), "0123")
	expect(t, path("removed"), "<none>")

	cut(t, nil, f)
	expect(t, path("removed"), "still here")
	expect(t, path("overwritten"), "0123456789")
	expect(t, path("truncated"), "0123456789")
	if st, err := os.Stat(path("emptydir")); err != nil || !st.IsDir() {
		t.Errorf("the removed directory is not back: %v", err)
	}
	des, err := os.ReadDir(d)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	if want := []string{"emptydir", "overwritten", "removed", "truncated"}; !slices.Equal(names, want) {
		t.Errorf("after the cut: %v, want %v", names, want)
	}
}

// PowerCut stops, cuts and kills a process that holds a file open on the mount, and
// mounts the filesystem again: the process is gone, what it synced is there, and
// the new mount takes writes.
func TestPowerCutKillsAndRemounts(t *testing.T) {
	f := lazyfs.Mount(t)
	held := filepath.Join(f.Dir(), "held")
	cmd := exec.Command("sh", "-c", `printf synced > "$1" && sync "$1" && printf ' unsynced' >> "$1" && exec sleep 600 3<"$1"`, "sh", held)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	// Wait for the unsynced part: written, then the shell sleeps holding the file.
	for content(t, held) != "synced unsynced" {
		select {
		case err := <-done:
			t.Fatalf("the writer exited: %v", err)
		default:
		}
	}
	syncDir(t, f.Dir())
	cut(t, []*os.Process{cmd.Process}, f)
	select {
	case err := <-done:
		done <- err
	case <-time.After(10 * time.Second):
		t.Fatal("the process outlived the cut")
	}
	expect(t, held, "synced")
	write(t, filepath.Join(f.Dir(), "after"), "new mount", true)
	expect(t, filepath.Join(f.Dir(), "after"), "new mount")
}
