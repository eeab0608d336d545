// Package lazyfs is a filesystem for tests that forgets, on command, what a power cut
// would: a pass-through FUSE mount over a backing directory that tracks every change
// not yet made durable by fsync or fdatasync, and on PowerCut discards it.
//
// The model is the weakest one POSIX allows, the one Jepsen's lazyfs simulates:
//
//   - a file's contents and size survive as they were at the last fsync or fdatasync
//     of that file (through any of its descriptors; a write through a descriptor
//     opened with O_SYNC or O_DSYNC counts, the kernel syncs after it); writes,
//     truncations and fallocate since then are undone;
//   - a directory's entries survive as they were at the last fsync of that directory:
//     names created (files, directories, links, symbolic links) since then vanish,
//     names removed or renamed away since then come back with the file they named, and
//     a rename is durable only in each directory that was synced after it;
//   - everything present when the filesystem was mounted (or came back from the last
//     cut) is durable.
//
// WithJournal relaxes the directory rule to what ext4 (data=ordered) and XFS do: a
// sync of any file or directory commits every directory change made before it.
//
// Until the cut, reads see every write, synced or not: the backing directory is
// written through at once, and what a cut would undo (old bytes overwritten, old sizes,
// old directory entries, the files that removed names pointed to) is kept beside it.
// fsync itself only moves that line; it does not reach the disk under the backing
// directory, whose durability a test does not care about, so a syncing program runs
// at memory speed.
//
// PowerCut stops the processes that use the mounts as a power cut stops a machine
// (SIGSTOP, and a wait until every thread has stopped), so that nothing they answer
// afterwards can rest on writes the cut discards; then it discards on every mount what
// was not durable, kills the processes (SIGKILL) and mounts the filesystems again over
// what survived, ready for the programs to be restarted on the same paths. Between the
// cut and the kill every open, read, write, sync and directory change on a mount fails
// with EIO.
//
// Linux only, through /dev/fuse and fusermount3 (Debian's fuse3 package, which
// .ci/test installs). Mount skips a test where FUSE is missing, except under CI=true,
// where it fails it. A mount is unmounted when its test ends (lazily, if a process
// still holds a file on it). The package is for tests: nothing in sluice imports it.
package lazyfs
