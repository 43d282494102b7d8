package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A base is a golden snapshot's guest memory, loaded once into a memfd
// and sealed against writes, with the snapshot's device state saved
// without that memory (QEMU's x-ignore-shared). A restore with
// Spec.SharedMemory maps the memfd privately (MAP_PRIVATE) as its guest
// RAM and loads only the device state: the guest reads the base's pages
// in place and its writes land in pages of its own, so every machine
// restored from one snapshot holds only what it changed.
//
// A base holds what the golden guest had before any tenant ran, and is
// never written after it was made: the seal refuses writes, shared
// writable maps, and the hole punching with which a balloon's free page
// reporting would otherwise reach through a private map into the file
// (these machines have no balloon). It lives in this process's memory
// only, never on disk.
type base struct {
	mem    *os.File // the sealed memfd
	device []byte   // the migration stream without the guest's RAM
}

// maxDeviceState bounds a base's device state (about 60 KiB for a
// microvm: device registers and the firmware's ROM).
const maxDeviceState = 32 << 20

// bases are this driver's bases by snapshot memory file. One is made at
// the first shared restore of a snapshot and kept while that file is the
// same file (a snapshot made again is a new file: a new base).
type bases struct {
	mu sync.Mutex
	m  map[string]*baseEntry
}

type baseEntry struct {
	id    fileID
	ready chan struct{} // closed when b or err is set
	b     *base
	err   error
}

// fileID tells one file from another that replaced it at the same path.
type fileID struct {
	dev, ino uint64
	size     int64
	mtime    int64
}

func statID(path string) (fileID, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return fileID{}, err
	}
	return fileID{dev: uint64(st.Dev), ino: st.Ino, size: st.Size, mtime: st.Mtim.Nano()}, nil
}

// get returns the base of the snapshot memory file at path, made by mk
// if there is none yet (one maker at a time; the others wait for it). A
// maker's failure is kept, so that restores of that snapshot do not try
// again, unless it failed because its caller gave up.
func (bs *bases) get(ctx context.Context, path string, mk func() (*base, error)) (*base, error) {
	id, err := statID(path)
	if err != nil {
		return nil, err
	}
	bs.mu.Lock()
	bs.sweepLocked()
	e := bs.m[path]
	if e == nil || e.id != id {
		if e != nil {
			bs.dropLocked(path)
		}
		e = &baseEntry{id: id, ready: make(chan struct{})}
		if bs.m == nil {
			bs.m = map[string]*baseEntry{}
		}
		bs.m[path] = e
		bs.mu.Unlock()
		e.b, e.err = mk()
		if e.err != nil && ctx.Err() != nil {
			bs.mu.Lock()
			if bs.m[path] == e {
				delete(bs.m, path)
			}
			bs.mu.Unlock()
		}
		close(e.ready)
		return e.b, e.err
	}
	bs.mu.Unlock()
	select {
	case <-e.ready:
		return e.b, e.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// fail gives up the base at path, for as long as the snapshot is the
// same file: its restores load all the memory.
func (bs *bases) fail(path string, err error) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	e := bs.m[path]
	if e == nil {
		return
	}
	select {
	case <-e.ready:
	default:
		return // (being made: not the base that failed)
	}
	bs.dropLocked(path)
	bs.m[path] = &baseEntry{id: e.id, ready: closed, err: err}
}

// closed is a closed channel: an entry that is ready from the start.
var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// sweep drops the bases whose snapshot is gone or was made again: their
// memory returns to the host once no machine maps it any longer.
func (bs *bases) sweep() {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	bs.sweepLocked()
}

func (bs *bases) sweepLocked() {
	for path, e := range bs.m {
		if id, err := statID(path); err != nil || id != e.id {
			bs.dropLocked(path)
		}
	}
}

// dropLocked forgets the base at path; a maker still at work closes
// nothing of it here, and its result is closed once it is ready.
func (bs *bases) dropLocked(path string) {
	e := bs.m[path]
	delete(bs.m, path)
	go func() {
		<-e.ready
		if e.b != nil {
			e.b.mem.Close()
		}
	}()
}

// makeBase makes the base of the snapshot whose full memory stream is at
// memPath (under snapKey) by loading it, in a VMM of the clone's own
// (st: its overlays, its network) that never runs the guest, into a new
// memfd mapped shared, then saving the device state without the memfd's
// RAM. The VMM is stopped before the clone's own starts.
func (d *Driver) makeBase(ctx context.Context, st *state, dataKey, snapKey []byte, memPath string) (_ *base, err error) {
	size := int64(st.Spec.MemoryMB) << 20
	fd, err := unix.MemfdCreate("harebox-golden-memory", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	mem := os.NewFile(uintptr(fd), "harebox-golden-memory")
	defer func() {
		if err != nil {
			mem.Close()
		}
	}()
	if err := mem.Truncate(size); err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	maker := *st
	maker.mem, maker.memShared = mem, true
	m, err := d.launch(ctx, &maker, dataKey, snapKey, true)
	if err != nil {
		return nil, err
	}
	// Whatever happens, this VMM is gone before the clone's starts on the
	// same overlays and network.
	defer func() {
		if kerr := m.st.Proc.kill(context.WithoutCancel(ctx)); kerr != nil && err == nil {
			err = kerr
		}
		removeSockets(st.Spec.StateDir)
	}()
	if err := m.incoming(ctx, incoming{path: memPath, key: snapKey, keepPaused: true}); err != nil {
		return nil, err
	}
	device, err := m.saveDevice(ctx)
	if err != nil {
		return nil, err
	}
	if err := m.st.Proc.kill(ctx); err != nil {
		return nil, err
	}
	if err := sparsify(mem, size); err != nil {
		return nil, err
	}
	if err := seal(ctx, mem); err != nil {
		return nil, err
	}
	return &base{mem: mem, device: device}, nil
}

// sparsify punches holes in the base where its pages are zeros: loading
// the stream gave every page of the memfd memory, zeros too (QEMU reads
// a page before it writes a zero one), and a hole holds none.
func sparsify(mem *os.File, size int64) error {
	const page = 4096
	buf, zero := make([]byte, 1<<20), make([]byte, page)
	var hole, holeLen int64
	punch := func() error {
		if holeLen == 0 {
			return nil
		}
		err := unix.Fallocate(int(mem.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, hole, holeLen)
		holeLen = 0
		if err != nil {
			return fmt.Errorf("memfd: punch a hole: %w", err)
		}
		return nil
	}
	for off := int64(0); off < size; off += int64(len(buf)) {
		n, err := mem.ReadAt(buf, off)
		if err != nil && !(errors.Is(err, io.EOF) && n > 0) {
			return fmt.Errorf("memfd: %w", err)
		}
		for i := 0; i+page <= n; i += page {
			switch {
			case !bytes.Equal(buf[i:i+page], zero):
				if err := punch(); err != nil {
					return err
				}
			case holeLen == 0:
				hole, holeLen = off+int64(i), page
			default:
				holeLen += page
			}
		}
	}
	return punch()
}

// seal seals the memfd against writes, shared writable maps, growing and
// shrinking, and further seals. The VMM that wrote it is gone, but its
// memory can outlive it for a moment (a process that reads its
// /proc/PID files holds it until it is done): until then the seal is
// refused (EBUSY), so it is tried again for a while.
func seal(ctx context.Context, mem *os.File) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		_, err := unix.FcntlInt(mem.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_WRITE|unix.F_SEAL_GROW|unix.F_SEAL_SHRINK|unix.F_SEAL_SEAL)
		if !errors.Is(err, unix.EBUSY) {
			if err != nil {
				return fmt.Errorf("memfd seal: %w", err)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("memfd seal: %w (still mapped writable)", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// saveDevice migrates the paused machine, with x-ignore-shared, into
// memory: the stream holds its devices' state and the RAM it does not
// share (the firmware's), not the guest's memory.
func (m *machine) saveDevice(ctx context.Context) ([]byte, error) {
	if err := m.ignoreShared(ctx, true); err != nil {
		return nil, err
	}
	sock := m.migrationSocket()
	os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	defer os.Remove(sock)
	defer l.Close()
	type result struct {
		b   []byte
		err error
	}
	read := make(chan result, 1)
	go func() {
		conn, err := l.Accept()
		if err != nil {
			read <- result{err: err}
			return
		}
		defer conn.Close()
		var buf bytes.Buffer
		n, err := io.Copy(&buf, io.LimitReader(conn, maxDeviceState+1))
		if err == nil && n > maxDeviceState {
			err = fmt.Errorf("device state over %d bytes", maxDeviceState)
		}
		read <- result{buf.Bytes(), err}
	}()
	if _, err := m.exec(ctx, "migrate", map[string]any{"uri": "unix:" + sock}); err != nil {
		return nil, err
	}
	if err := m.waitMigration(ctx, "query-migrate"); err != nil {
		return nil, err
	}
	select {
	case r := <-read:
		return r.b, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(10 * time.Second):
		return nil, errors.New("device state: the stream did not end")
	}
}

// ignoreShared sets QEMU's x-ignore-shared migration capability: with it
// a stream leaves out (and expects left out) the RAM mapped shared.
func (m *machine) ignoreShared(ctx context.Context, on bool) error {
	_, err := m.exec(ctx, "migrate-set-capabilities", map[string]any{
		"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": on}},
	})
	return err
}

// memoryArgs are the command line's guest RAM when it is mapped from a
// file (fd, inherited): named as QEMU names a microvm's own RAM, so that
// streams of machines without a file load into it and the other way
// round.
func memoryArgs(st *state, fd int) []string {
	share := "off"
	if st.memShared {
		share = "on"
	}
	return []string{
		"-object", fmt.Sprintf("memory-backend-file,id=microvm.ram,x-use-canonical-path-for-ramblock-id=off,size=%dM,mem-path=/proc/self/fd/%d,share=%s", st.Spec.MemoryMB, fd, share),
		"-machine", "memory-backend=microvm.ram",
	}
}
