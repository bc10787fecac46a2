//go:build unix

package freeport

import (
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// claims is a file on which a process holds a one-byte lock at the offset
// of each port it picked, until it exits: the kernel releases a process's
// locks then, however it ended. Test packages run as processes side by
// side, and a port the kernel offers one of them may be one another picked
// and has stopped its server on, while a client of that server still
// retries it (a Redis connection whose reconciler owes releases, for up to
// 101 s): a server of the second process on that port answered it, and
// the first counted round trips and reconciled claims it never made.
var claims struct {
	once sync.Once
	file *os.File // nil if it cannot be opened: claim then claims every port
}

// claim takes port for this process among those that pick through this
// package, and reports whether no other live one had it.
func claim(port int) bool {
	claims.once.Do(func() {
		claims.file, _ = os.OpenFile(filepath.Join(os.TempDir(), "telemetry-dedup-freeport.lock"), os.O_RDWR|os.O_CREATE, 0o666)
	})
	if claims.file == nil {
		return true // another user's file, or no temporary directory: as before, per process only
	}
	lock := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: 0, Start: int64(port), Len: 1}
	for {
		switch err := syscall.FcntlFlock(claims.file.Fd(), syscall.F_SETLK, &lock); err {
		case nil:
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN, syscall.EACCES: // another process holds it
			return false
		default:
			return true // locks unsupported here: per process only
		}
	}
}
