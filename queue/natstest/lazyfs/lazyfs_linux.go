package lazyfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// FS is one lazy mount: Dir is where programs use it.
type FS struct {
	base    string // holds backing/, mnt/, grave/
	backing string // the files themselves, written through
	mnt     string
	grave   string // keeps alive what a removed name pointed to: files by hard link, directories moved

	mu     sync.Mutex
	dead   bool                        // between a cut and the next mount: opens, reads and changes fail with EIO
	files  map[uint64]*unsynced        // by backing inode: files changed since their last sync
	dirs   map[uint64]map[string]entry // by backing inode: durable entries of directories changed since their last sync
	server *fuse.Server
	cuts   int

	journal bool // WithJournal
}

// Option configures Mount and New.
type Option func(*FS)

// WithJournal makes directories behave as on a journaling filesystem (ext4's default
// data=ordered, XFS): a sync of any file or directory also makes every directory
// change made before it durable, since they share one journal that the sync commits.
// File contents still need their own file's sync. Without it a directory's entries
// need that directory's own sync, as POSIX has it (and ext2, or ext4 without a
// journal).
func WithJournal() Option { return func(f *FS) { f.journal = true } }

// unsynced is what a file's last sync left durable, where it has changed since.
type unsynced struct {
	size int64  // the durable size
	undo []span // durable bytes overwritten or cut off since, oldest first
}

type span struct {
	off  int64
	data []byte
}

// entry is one name in a directory: the inode it names and its type bits.
type entry struct {
	ino  uint64
	mode uint32
}

// Loss is what a cut discarded on one mount.
type Loss struct {
	Files   int      // files whose contents or size went back to their last sync
	Bytes   int64    // bytes written, or cut off by a truncation, since their file's last sync
	Entries int      // directory names that differ from the running state (created ones gone, removed ones back)
	Changed []string // what changed, for a test's log: the first few paths (relative to the mount) with what happened
}

func (l Loss) add(o Loss) Loss {
	changed := append(l.Changed, o.Changed...)
	return Loss{l.Files + o.Files, l.Bytes + o.Bytes, l.Entries + o.Entries, changed[:min(len(changed), maxChanged)]}
}

// maxChanged bounds Loss.Changed.
const maxChanged = 10

func (l *Loss) note(format string, args ...any) {
	if len(l.Changed) < maxChanged {
		l.Changed = append(l.Changed, fmt.Sprintf(format, args...))
	}
}

// Discarded reports whether anything was lost.
func (l Loss) Discarded() bool { return l.Bytes > 0 || l.Entries > 0 }

func (l Loss) String() string {
	s := fmt.Sprintf("%d bytes in %d files, %d directory entries", l.Bytes, l.Files, l.Entries)
	if len(l.Changed) > 0 {
		s += " (" + strings.Join(l.Changed, "; ") + ")"
	}
	return s
}

// ErrUnavailable is wrapped by New when this machine cannot mount FUSE filesystems.
var ErrUnavailable = errors.New("lazyfs: FUSE is not available")

// Available reports whether lazy mounts can be made: nil, or an error wrapping
// ErrUnavailable.
func Available() error {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if _, err := exec.LookPath("fusermount3"); err != nil {
		return fmt.Errorf("%w: %w (install fuse3)", ErrUnavailable, err)
	}
	return nil
}

// Mount mounts a new, empty lazy filesystem in a temporary directory of t, unmounted
// when the test ends (after the cleanups registered later, such as the processes
// started on it). It skips t where FUSE is missing, or fails it when CI is "true".
func Mount(t testing.TB, opts ...Option) *FS {
	t.Helper()
	if err := Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%v; CI must run the power-loss tests", err)
		}
		t.Skipf("%v; skipping (CI=true makes this a failure)", err)
	}
	f, err := New(t.TempDir(), opts...)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skipf("%v; skipping (CI=true makes this a failure)", err) // no right to mount here
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Error(err)
		}
	})
	return f
}

// New mounts a lazy filesystem whose files live under base (an existing directory,
// which should be empty); its owner must Close it.
func New(base string, opts ...Option) (*FS, error) {
	f := &FS{base: base, backing: filepath.Join(base, "backing"), mnt: filepath.Join(base, "mnt"), grave: filepath.Join(base, "grave")}
	for _, o := range opts {
		o(f)
	}
	for _, d := range []string{f.backing, f.mnt, f.grave} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if err := f.mount(); err != nil {
		return nil, err
	}
	return f, nil
}

// Dir is the mount point: the directory programs are given.
func (f *FS) Dir() string { return f.mnt }

func (f *FS) mount() error {
	var st syscall.Stat_t
	if err := syscall.Stat(f.backing, &st); err != nil {
		return err
	}
	root := &gofs.LoopbackRoot{Path: f.backing, Dev: st.Dev}
	// NewNode is deprecated for NodeWrapChilder; moving over changes how every node is
	// made, a change for its own commit with the power-loss tests, not a lint fix.
	root.NewNode = func(r *gofs.LoopbackRoot, _ *gofs.Inode, _ string, _ *syscall.Stat_t) gofs.InodeEmbedder { //nolint:staticcheck // SA1019, above
		return &node{LoopbackNode: gofs.LoopbackNode{RootData: r}, fs: f}
	}
	root.RootNode = root.NewNode(root, nil, "", &st) //nolint:staticcheck // SA1019, above
	f.mu.Lock()
	f.files, f.dirs, f.dead = map[uint64]*unsynced{}, map[uint64]map[string]entry{}, false
	f.mu.Unlock()
	server, err := gofs.Mount(f.mnt, root.RootNode, &gofs.Options{MountOptions: fuse.MountOptions{
		FsName: "lazyfs", Name: "lazyfs",
		// Each mount's requests are few and small; go-fuse's default of 16
		// idle readers is plenty.
	}})
	if err != nil {
		return fmt.Errorf("lazyfs: mount %s: %w", f.mnt, err)
	}
	f.server = server
	return nil
}

// unmount unmounts the filesystem, lazily when a process still holds a file on it,
// and waits (a bounded time) until its server has stopped.
func (f *FS) unmount() error {
	if f.server == nil {
		return nil
	}
	server := f.server
	f.server = nil
	if err := server.Unmount(); err != nil {
		if out, err2 := exec.Command("fusermount3", "-u", "-z", f.mnt).CombinedOutput(); err2 != nil {
			return fmt.Errorf("lazyfs: unmount %s: %w; fusermount3 -u -z: %w %s", f.mnt, err, err2, out)
		}
	}
	done := make(chan struct{})
	go func() { server.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("lazyfs: %s: the FUSE server did not stop after the unmount", f.mnt)
	}
	return nil
}

// Close unmounts the filesystem. The files under base stay (a test's TempDir removes them).
func (f *FS) Close() error {
	f.mu.Lock()
	f.dead = true
	f.mu.Unlock()
	return f.unmount()
}

// Sync makes everything durable, as if every file and directory had been synced.
func (f *FS) Sync() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.files)
	clear(f.dirs)
}

// synced records a sync of the file or directory ino. The caller holds mu.
func (f *FS) synced(ino uint64) {
	delete(f.files, ino)
	delete(f.dirs, ino)
	if f.journal {
		clear(f.dirs)
	}
}

// begin takes the lock for a change; it fails with EIO after a cut.
func (f *FS) begin() syscall.Errno {
	f.mu.Lock()
	if f.dead {
		f.mu.Unlock()
		return syscall.EIO
	}
	return 0
}

// touchFile records the durable state of the file open as fd (inode ino) before its
// first change since its last sync. The caller holds mu.
func (f *FS) touchFile(ino uint64, fd int) (*unsynced, error) {
	if u, ok := f.files[ino]; ok {
		return u, nil
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, err
	}
	u := &unsynced{size: st.Size}
	f.files[ino] = u
	return u, nil
}

// keep saves the durable bytes of [off, off+n) of the file open as fd before they are
// overwritten or cut off. The caller holds mu.
func (f *FS) keep(ino uint64, fd int, off, n int64) error {
	u, err := f.touchFile(ino, fd)
	if err != nil {
		return err
	}
	end := min(off+n, u.size)
	if off >= end {
		return nil // beyond the durable size: a cut truncates it away
	}
	buf := make([]byte, end-off)
	got, err := syscall.Pread(fd, buf, off)
	if err != nil {
		return err
	}
	u.undo = append(u.undo, span{off, buf[:got]})
	return nil
}

// touchDir records the durable entries of the directory at path before its first
// change since its last sync. The caller holds mu.
func (f *FS) touchDir(path string) error {
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		return err
	}
	if _, ok := f.dirs[st.Ino]; ok {
		return nil
	}
	entries, err := readEntries(path)
	if err != nil {
		return err
	}
	f.dirs[st.Ino] = entries
	return nil
}

// readEntries lists the directory at path with each name's inode and type.
func readEntries(path string) (map[string]entry, error) {
	des, err := os.ReadDir(path)
	if err != nil {
		return nil, err
	}
	out := make(map[string]entry, len(des))
	for _, de := range des {
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(path, de.Name()), &st); err != nil {
			if errors.Is(err, syscall.ENOENT) {
				continue
			}
			return nil, err
		}
		out[de.Name()] = entry{st.Ino, st.Mode}
	}
	return out, nil
}

// bury keeps alive what path names before the name is removed or replaced: a file by
// a hard link in the grave, an (empty) directory by moving it there, in place of
// removing it, so that its inode is not reused while a durable entry may name it.
// It reports whether path was a directory that has been moved. The caller holds mu.
func (f *FS) bury(path string) (moved bool, err error) {
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return false, nil
		}
		return false, err
	}
	if st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		des, err := os.ReadDir(path)
		if err != nil {
			return false, err
		}
		if len(des) > 0 {
			return false, syscall.ENOTEMPTY
		}
		if err := f.touchDir(path); err != nil {
			return false, err
		}
		return true, os.Rename(path, filepath.Join(f.grave, "d"+strconv.FormatUint(st.Ino, 10)))
	}
	err = os.Link(path, filepath.Join(f.grave, strconv.FormatUint(st.Ino, 10)))
	if errors.Is(err, fs.ErrExist) {
		err = nil
	}
	return false, err
}

// cut discards what is not durable: it rebuilds the backing directory from the
// durable entries of every directory (hard links to the surviving files, so their
// inodes stay), rolls each changed file back to its last sync, and leaves every
// operation failing with EIO until the next mount.
func (f *FS) cut() (Loss, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dead = true
	f.cuts++

	// Where each inode is now: in the tree, or in the grave.
	files := map[uint64]string{}
	dirs := map[uint64]string{}
	index := func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(path, &st); err != nil {
			return err
		}
		if st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
			if _, ok := dirs[st.Ino]; !ok {
				dirs[st.Ino] = path
			}
		} else if _, ok := files[st.Ino]; !ok {
			files[st.Ino] = path
		}
		return nil
	}
	if err := filepath.WalkDir(f.backing, index); err != nil {
		return Loss{}, fmt.Errorf("lazyfs: index %s: %w", f.backing, err)
	}
	if err := filepath.WalkDir(f.grave, index); err != nil {
		return Loss{}, fmt.Errorf("lazyfs: index %s: %w", f.grave, err)
	}
	var rootSt syscall.Stat_t
	if err := syscall.Lstat(f.backing, &rootSt); err != nil {
		return Loss{}, err
	}

	stage := filepath.Join(f.base, fmt.Sprintf("stage-%d", f.cuts))
	if err := os.Mkdir(stage, os.FileMode(rootSt.Mode&0o7777)); err != nil {
		return Loss{}, err
	}
	var loss Loss
	staged := map[uint64]string{} // file inode → a path in stage
	visited := map[uint64]bool{}
	var build func(ino uint64, dst string) error
	build = func(ino uint64, dst string) error {
		visited[ino] = true
		var now map[string]entry
		if p, ok := dirs[ino]; ok {
			var err error
			if now, err = readEntries(p); err != nil {
				return err
			}
		}
		durable, changed := f.dirs[ino]
		if !changed {
			durable = now
		} else {
			rel, _ := filepath.Rel(stage, dst)
			for name, e := range now {
				if d, ok := durable[name]; !ok || d.ino != e.ino {
					loss.Entries++
					loss.note("%s dropped", filepath.Join(rel, name))
				}
			}
			for name, d := range durable {
				if e, ok := now[name]; !ok || d.ino != e.ino {
					loss.Entries++
					loss.note("%s back", filepath.Join(rel, name))
				}
			}
		}
		for name, e := range durable {
			p := filepath.Join(dst, name)
			if e.mode&syscall.S_IFMT == syscall.S_IFDIR {
				if visited[e.ino] { // named twice: once renamed, both sides durable
					continue
				}
				if err := os.Mkdir(p, os.FileMode(e.mode&0o777)); err != nil {
					return err
				}
				if err := build(e.ino, p); err != nil {
					return err
				}
				continue
			}
			src, ok := files[e.ino]
			if !ok {
				return fmt.Errorf("lazyfs: inode %d of %s is gone", e.ino, p)
			}
			if err := os.Link(src, p); err != nil {
				return err
			}
			staged[e.ino] = p
		}
		return nil
	}
	if err := build(rootSt.Ino, stage); err != nil {
		return Loss{}, fmt.Errorf("lazyfs: rebuild: %w", err)
	}
	for ino, u := range f.files {
		p, ok := staged[ino]
		if !ok {
			continue // not durably named: gone with its name
		}
		l, err := rollBack(p, u)
		if err != nil {
			return Loss{}, fmt.Errorf("lazyfs: roll back %s: %w", p, err)
		}
		if l.Files > 0 {
			rel, _ := filepath.Rel(stage, p)
			l.note("%s: %d bytes", rel, l.Bytes)
		}
		loss = loss.add(l)
	}

	old := filepath.Join(f.base, fmt.Sprintf("old-%d", f.cuts))
	if err := os.Rename(f.backing, old); err != nil {
		return Loss{}, err
	}
	if err := os.Rename(stage, f.backing); err != nil {
		return Loss{}, err
	}
	// The processes still hold files of the old tree, which they can no longer
	// reach; their inodes live on until the processes are killed.
	if err := os.RemoveAll(old); err != nil {
		return Loss{}, err
	}
	if err := os.RemoveAll(f.grave); err != nil {
		return Loss{}, err
	}
	return loss, os.Mkdir(f.grave, 0o755)
}

// rollBack puts the file at path back as its last sync left it.
func rollBack(path string, u *unsynced) (Loss, error) {
	fd, err := syscall.Open(path, syscall.O_RDWR|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return Loss{}, err
	}
	defer syscall.Close(fd)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return Loss{}, err
	}
	l := Loss{Files: 1, Bytes: max(0, st.Size-u.size)}
	for i := len(u.undo) - 1; i >= 0; i-- { // newest first: the oldest copy, the durable one, ends on top
		s := u.undo[i]
		if _, err := syscall.Pwrite(fd, s.data, s.off); err != nil {
			return Loss{}, err
		}
		l.Bytes += int64(len(s.data))
	}
	if err := syscall.Ftruncate(fd, u.size); err != nil {
		return Loss{}, err
	}
	if l.Bytes == 0 && st.Size == u.size && len(u.undo) == 0 {
		l.Files = 0
	}
	return l, nil
}

// PowerCut cuts the power of a machine whose processes procs use the mounts fss: it
// stops every process (SIGSTOP) and waits until all their threads have stopped, so
// that none answers anything after the cut; discards on every mount what was not
// durable; kills the processes (SIGKILL) and waits until they are gone; and mounts
// the filesystems again over what survived. The processes' owners still reap them
// (exec.Cmd.Wait); nil processes, and those that have exited, are passed over. It
// returns what was discarded, summed over the mounts.
func PowerCut(procs []*os.Process, fss ...*FS) (Loss, error) {
	procs = slices.DeleteFunc(slices.Clone(procs), func(p *os.Process) bool { return p == nil })
	for _, p := range procs {
		if err := p.Signal(syscall.SIGSTOP); err != nil && !errors.Is(err, os.ErrProcessDone) {
			return Loss{}, fmt.Errorf("lazyfs: stop pid %d: %w", p.Pid, err)
		}
	}
	for _, p := range procs {
		if err := waitStopped(p.Pid, 30*time.Second); err != nil {
			return Loss{}, err
		}
	}
	var loss Loss
	var errs []error
	for _, f := range fss {
		l, err := f.cut()
		loss = loss.add(l)
		errs = append(errs, err)
	}
	for _, p := range procs {
		_ = p.Kill()
	}
	for _, p := range procs {
		if err := waitGone(p.Pid, 30*time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	for _, f := range fss {
		if err := f.unmount(); err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, f.mount())
	}
	return loss, errors.Join(errs...)
}

// waitStopped waits until every thread of process pid is stopped (state T or t), or
// the process is gone. A thread inside a FUSE request stops once it is answered.
func waitStopped(pid int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return nil // gone
		}
		stopped := true
		for _, task := range tasks {
			if s := procState(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name())); s != 'T' && s != 't' && s != 'Z' && s != 0 {
				stopped = false
				break
			}
		}
		if stopped {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lazyfs: pid %d did not stop within %s", pid, within)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitGone waits until process pid has exited (a zombie holds no files).
func waitGone(pid int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		if s := procState(fmt.Sprintf("/proc/%d/stat", pid)); s == 0 || s == 'Z' || s == 'X' {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lazyfs: pid %d still runs %s after SIGKILL", pid, within)
		}
		time.Sleep(time.Millisecond)
	}
}

// procState returns the state letter of a /proc stat file, 0 if it cannot be read.
func procState(path string) byte {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	// pid (comm) S ...: comm may hold spaces and parentheses; the state follows the last ')'.
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == ')' {
			if i+2 < len(b) {
				return b[i+2]
			}
			break
		}
	}
	return 0
}
