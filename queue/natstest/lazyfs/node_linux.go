package lazyfs

import (
	"context"
	"path/filepath"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// node is go-fuse's loopback node with every change of a directory or a file's size
// recorded first (FS.touchDir, FS.keep), and fsync moving what is durable.
type node struct {
	gofs.LoopbackNode
	fs *FS
}

// path is the node's path in the backing directory.
func (n *node) path() string {
	return filepath.Join(n.RootData.Path, n.Path(n.Root()))
}

func (n *node) child(name string) string { return filepath.Join(n.path(), name) }

// changeDirs runs change with mu held after recording the directories it changes.
func (n *node) changeDirs(change func() syscall.Errno, dirs ...string) syscall.Errno {
	if errno := n.fs.begin(); errno != 0 {
		return errno
	}
	defer n.fs.mu.Unlock()
	for _, d := range dirs {
		if err := n.fs.touchDir(d); err != nil {
			return gofs.ToErrno(err)
		}
	}
	return change()
}

var (
	_ gofs.NodeCreater        = (*node)(nil)
	_ gofs.NodeOpener         = (*node)(nil)
	_ gofs.NodeMkdirer        = (*node)(nil)
	_ gofs.NodeMknoder        = (*node)(nil)
	_ gofs.NodeSymlinker      = (*node)(nil)
	_ gofs.NodeLinker         = (*node)(nil)
	_ gofs.NodeUnlinker       = (*node)(nil)
	_ gofs.NodeRmdirer        = (*node)(nil)
	_ gofs.NodeRenamer        = (*node)(nil)
	_ gofs.NodeSetattrer      = (*node)(nil)
	_ gofs.NodeFsyncer        = (*node)(nil)
	_ gofs.NodeOpendirHandler = (*node)(nil)
	_ gofs.NodeCopyFileRanger = (*node)(nil)
)

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (ch *gofs.Inode, fh gofs.FileHandle, fuseFlags uint32, errno syscall.Errno) {
	errno = n.changeDirs(func() syscall.Errno {
		var lfh gofs.FileHandle
		ch, lfh, fuseFlags, errno = n.LoopbackNode.Create(ctx, name, readable(flags)&^syscall.O_TRUNC, mode, out)
		if errno != 0 {
			return errno
		}
		f, errno := n.fs.wrap(lfh)
		if errno == 0 && flags&syscall.O_TRUNC != 0 {
			errno = f.truncate(0)
		}
		fh = f
		return errno
	}, n.path())
	return ch, fh, fuseFlags, errno
}

func (n *node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if n.fs.isDead() {
		return nil, 0, syscall.EIO
	}
	lfh, fuseFlags, errno := n.LoopbackNode.Open(ctx, readable(flags)&^syscall.O_TRUNC)
	if errno != 0 {
		return nil, 0, errno
	}
	f, errno := n.fs.wrap(lfh)
	if errno != 0 {
		return nil, 0, errno
	}
	if flags&syscall.O_TRUNC != 0 {
		if errno := n.fs.begin(); errno != 0 {
			return nil, 0, errno
		}
		errno := f.truncate(0)
		n.fs.mu.Unlock()
		if errno != 0 {
			return nil, 0, errno
		}
	}
	return f, fuseFlags, 0
}

// readable turns a write-only open into a read-write one: a write must read the
// durable bytes it replaces (FS.keep). The kernel has checked the caller's access.
func readable(flags uint32) uint32 {
	if flags&syscall.O_ACCMODE == syscall.O_WRONLY {
		return flags&^syscall.O_ACCMODE | syscall.O_RDWR
	}
	return flags
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (ch *gofs.Inode, errno syscall.Errno) {
	errno = n.changeDirs(func() syscall.Errno {
		if ch, errno = n.LoopbackNode.Mkdir(ctx, name, mode, out); errno != 0 {
			return errno
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(n.child(name), &st); err != nil {
			return gofs.ToErrno(err)
		}
		n.fs.dirs[st.Ino] = map[string]entry{} // new: nothing in it is durable yet
		return 0
	}, n.path())
	return ch, errno
}

func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (ch *gofs.Inode, errno syscall.Errno) {
	errno = n.changeDirs(func() syscall.Errno {
		ch, errno = n.LoopbackNode.Mknod(ctx, name, mode, rdev, out)
		return errno
	}, n.path())
	return ch, errno
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (ch *gofs.Inode, errno syscall.Errno) {
	errno = n.changeDirs(func() syscall.Errno {
		ch, errno = n.LoopbackNode.Symlink(ctx, target, name, out)
		return errno
	}, n.path())
	return ch, errno
}

func (n *node) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (ch *gofs.Inode, errno syscall.Errno) {
	errno = n.changeDirs(func() syscall.Errno {
		ch, errno = n.LoopbackNode.Link(ctx, target, name, out)
		return errno
	}, n.path())
	return ch, errno
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	return n.changeDirs(func() syscall.Errno {
		if _, err := n.fs.bury(n.child(name)); err != nil {
			return gofs.ToErrno(err)
		}
		return n.LoopbackNode.Unlink(ctx, name)
	}, n.path())
}

// Rmdir moves the (empty) directory into the grave instead of removing it (FS.bury).
func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	return n.changeDirs(func() syscall.Errno {
		_, err := n.fs.bury(n.child(name))
		return gofs.ToErrno(err)
	}, n.path())
}

func (n *node) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	np, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV
	}
	return n.changeDirs(func() syscall.Errno {
		if flags&(unix.RENAME_EXCHANGE|unix.RENAME_NOREPLACE) == 0 {
			// What the new name pointed to loses that name. A directory is moved
			// into the grave, so the rename must be one that can replace it.
			var src, dst syscall.Stat_t
			if err := syscall.Lstat(n.child(name), &src); err != nil {
				return gofs.ToErrno(err)
			}
			if err := syscall.Lstat(np.child(newName), &dst); err == nil {
				srcDir, dstDir := src.Mode&syscall.S_IFMT == syscall.S_IFDIR, dst.Mode&syscall.S_IFMT == syscall.S_IFDIR
				switch {
				case src.Ino == dst.Ino:
					return 0 // the same file: rename(2) does nothing
				case dstDir && !srcDir:
					return syscall.EISDIR
				case srcDir && !dstDir:
					return syscall.ENOTDIR
				}
				if _, err := n.fs.bury(np.child(newName)); err != nil {
					return gofs.ToErrno(err)
				}
			}
		}
		return n.LoopbackNode.Rename(ctx, name, newParent, newName, flags)
	}, n.path(), np.path())
}

func (n *node) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if _, ok := fh.(*file); ok {
		return n.LoopbackNode.Setattr(ctx, fh, in, out) // the file records its truncation
	}
	size, ok := in.GetSize()
	if !ok {
		return n.LoopbackNode.Setattr(ctx, fh, in, out)
	}
	if errno := n.fs.begin(); errno != 0 {
		return errno
	}
	defer n.fs.mu.Unlock()
	fd, err := syscall.Open(n.path(), syscall.O_RDWR|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return gofs.ToErrno(err)
	}
	defer syscall.Close(fd)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return gofs.ToErrno(err)
	}
	if err := n.fs.keep(st.Ino, fd, int64(size), max(0, st.Size-int64(size))); err != nil {
		return gofs.ToErrno(err)
	}
	return n.LoopbackNode.Setattr(ctx, fh, in, out)
}

// Fsync makes the node durable: a file's contents and size, a directory's entries.
func (n *node) Fsync(ctx context.Context, fh gofs.FileHandle, flags uint32) syscall.Errno {
	if f, ok := fh.(*file); ok {
		return f.Fsync(ctx, flags)
	}
	if errno := n.fs.begin(); errno != 0 {
		return errno
	}
	defer n.fs.mu.Unlock()
	var st syscall.Stat_t
	if err := syscall.Lstat(n.path(), &st); err != nil {
		return gofs.ToErrno(err)
	}
	n.fs.synced(st.Ino)
	return 0
}

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	h, fuseFlags, errno := n.LoopbackNode.OpendirHandle(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	ds, ok := h.(loopbackDir)
	if !ok {
		return nil, 0, syscall.ENOTSUP
	}
	return &dir{ds, n}, fuseFlags, 0
}

// CopyFileRange is left to the kernel's fallback (reads and writes, which are recorded).
func (n *node) CopyFileRange(context.Context, gofs.FileHandle, uint64, *gofs.Inode, gofs.FileHandle, uint64, uint64, uint64) (uint32, syscall.Errno) {
	return 0, syscall.ENOSYS
}

// loopbackDir is what go-fuse's loopback directory handle does that a directory
// handle here passes on.
type loopbackDir interface {
	gofs.FileReaddirenter
	gofs.FileSeekdirer
	gofs.FileReleasedirer
}

// dir is an open directory; its Fsyncdir makes the directory's entries durable.
type dir struct {
	loopbackDir
	n *node
}

func (d *dir) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	return d.n.Fsync(ctx, nil, flags)
}

// file is an open file: writes, truncations and fallocate record what they replace
// before they change the backing file; Fsync marks the file durable. It does not pass
// on go-fuse's PassthroughFd, Writev or Ioctl, so every write comes through Write.
type file struct {
	lf  *gofs.LoopbackFile
	fd  int
	ino uint64
	fs  *FS
}

var (
	_ gofs.FileReader    = (*file)(nil)
	_ gofs.FileWriter    = (*file)(nil)
	_ gofs.FileFsyncer   = (*file)(nil)
	_ gofs.FileFlusher   = (*file)(nil)
	_ gofs.FileReleaser  = (*file)(nil)
	_ gofs.FileGetattrer = (*file)(nil)
	_ gofs.FileSetattrer = (*file)(nil)
	_ gofs.FileLseeker   = (*file)(nil)
	_ gofs.FileAllocater = (*file)(nil)
)

func (f *FS) isDead() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dead
}

// wrap wraps the loopback file handle h.
func (f *FS) wrap(h gofs.FileHandle) (*file, syscall.Errno) {
	lf, ok := h.(*gofs.LoopbackFile)
	if !ok {
		return nil, syscall.ENOTSUP
	}
	fd, ok := lf.PassthroughFd() // only read here: the descriptor stays lf's
	if !ok {
		return nil, syscall.EBADF
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		lf.Release(context.Background())
		return nil, gofs.ToErrno(err)
	}
	return &file{lf: lf, fd: fd, ino: st.Ino, fs: f}, 0
}

func (f *file) Read(ctx context.Context, buf []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if f.fs.isDead() {
		return nil, syscall.EIO
	}
	return f.lf.Read(ctx, buf, off)
}

func (f *file) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if errno := f.fs.begin(); errno != 0 {
		return 0, errno
	}
	defer f.fs.mu.Unlock()
	if err := f.fs.keep(f.ino, f.fd, off, int64(len(data))); err != nil {
		return 0, gofs.ToErrno(err)
	}
	return f.lf.Write(ctx, data, off)
}

// truncate sets the file's size, recording what it cuts off. The caller holds mu.
func (f *file) truncate(size int64) syscall.Errno {
	var st syscall.Stat_t
	if err := syscall.Fstat(f.fd, &st); err != nil {
		return gofs.ToErrno(err)
	}
	if err := f.fs.keep(f.ino, f.fd, size, max(0, st.Size-size)); err != nil {
		return gofs.ToErrno(err)
	}
	return gofs.ToErrno(syscall.Ftruncate(f.fd, size))
}

func (f *file) Setattr(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if size, ok := in.GetSize(); ok {
		if errno := f.fs.begin(); errno != 0 {
			return errno
		}
		errno := f.truncate(int64(size))
		f.fs.mu.Unlock()
		if errno != 0 {
			return errno
		}
	}
	return f.lf.Setattr(ctx, in, out)
}

func (f *file) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	if errno := f.fs.begin(); errno != 0 {
		return errno
	}
	defer f.fs.mu.Unlock()
	// A plain allocation only grows the file (which a cut truncates away); punching
	// or zeroing a range replaces its bytes.
	if err := f.fs.keep(f.ino, f.fd, int64(off), int64(size)); err != nil {
		return gofs.ToErrno(err)
	}
	return f.lf.Allocate(ctx, off, size, mode)
}

// Fsync (fsync and fdatasync alike) makes the file's contents and size durable. It
// does not sync the backing file: only this model's durability counts.
func (f *file) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	if errno := f.fs.begin(); errno != 0 {
		return errno
	}
	defer f.fs.mu.Unlock()
	f.fs.synced(f.ino)
	return 0
}

func (f *file) Flush(ctx context.Context) syscall.Errno   { return f.lf.Flush(ctx) }
func (f *file) Release(ctx context.Context) syscall.Errno { return f.lf.Release(ctx) }
func (f *file) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	return f.lf.Getattr(ctx, out)
}
func (f *file) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	return f.lf.Lseek(ctx, off, whence)
}
