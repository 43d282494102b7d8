package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/overlay"
	"github.com/harebox/harebox/hypervisor/qmp"
	"github.com/harebox/harebox/internal/sealstream"
)

// machine is a handle on one QEMU process.
type machine struct {
	d  *Driver
	st *state

	mu sync.Mutex // one QMP conversation at a time
}

var _ hypervisor.Machine = (*machine)(nil)

func (m *machine) ID() string                { return m.st.Spec.ID }
func (m *machine) Handle() hypervisor.Handle { return m.st.handle() }

func (m *machine) AgentEndpoint() hypervisor.AgentEndpoint {
	return hypervisor.AgentEndpoint{Transport: hypervisor.TransportSerial, Path: m.st.Agent}
}

// exec runs one QMP command on a fresh connection. QEMU serves one QMP
// client at a time, so holding a connection would lock out every other
// handle on this machine (a re-attached engine, a second plugin process).
func (m *machine) exec(ctx context.Context, cmd string, args any) (out json.RawMessage, err error) {
	err = m.session(ctx, func(q *qmp.Client) error {
		out, err = q.Execute(ctx, cmd, args)
		return err
	})
	return out, err
}

// session runs f on a fresh QMP connection, closed after it: exec's, for
// a few commands in a row.
func (m *machine) session(ctx context.Context, f func(q *qmp.Client) error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.st.Proc.alive() {
		return hypervisor.Errorf(hypervisor.ErrState, "qemu: %s: %v", m.ID(), errStopped)
	}
	q, err := qmp.Dial(ctx, m.st.QMP)
	if err != nil {
		return err
	}
	defer q.Close()
	return f(q)
}

// waitQMP waits until a freshly started QEMU answers on its QMP socket.
func (m *machine) waitQMP(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		_, err := m.exec(ctx, "query-status", nil)
		if err == nil {
			return nil
		}
		if !m.st.Proc.alive() {
			return fmt.Errorf("qemu: %s exited during start: %w (see %s)", m.ID(), err, m.st.Serial)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("qemu: QMP not ready: %w", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// status returns QEMU's run state ("running", "paused", "postmigrate", ...).
func (m *machine) status(ctx context.Context) (s string, err error) {
	err = m.session(ctx, func(q *qmp.Client) error {
		s, err = queryStatus(ctx, q)
		return err
	})
	return s, err
}

// queryStatus asks q for QEMU's run state.
func queryStatus(ctx context.Context, q *qmp.Client) (string, error) {
	out, err := q.Execute(ctx, "query-status", nil)
	if err != nil {
		return "", err
	}
	var s struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &s); err != nil {
		return "", fmt.Errorf("qemu: query-status: %w", err)
	}
	return s.Status, nil
}

// Info implements hypervisor.Machine.
func (m *machine) Info(ctx context.Context) (hypervisor.Info, error) {
	info := hypervisor.Info{ID: m.ID(), PID: m.st.Proc.PID, Started: m.st.StartedAt, State: hypervisor.StateStopped}
	if !m.st.Proc.alive() {
		return info, nil
	}
	s, err := m.status(ctx)
	if err != nil {
		if !m.st.Proc.alive() {
			return info, nil
		}
		return info, err
	}
	switch s {
	case "running":
		info.State = hypervisor.StateRunning
	case "shutdown", "guest-panicked", "internal-error":
		info.State = hypervisor.StateStopped
	default: // paused, postmigrate, inmigrate, finish-migrate, ...
		info.State = hypervisor.StatePaused
	}
	return info, nil
}

// Pause implements hypervisor.Machine.
func (m *machine) Pause(ctx context.Context) error {
	_, err := m.exec(ctx, "stop", nil)
	return err
}

// Resume implements hypervisor.Machine.
func (m *machine) Resume(ctx context.Context) error {
	_, err := m.exec(ctx, "cont", nil)
	return err
}

// Snapshot implements hypervisor.Machine: pause, stream the machine state
// through a socket into dir/memory (sealed under key when the machine is
// encrypted), then copy the writable disks' own writes: an encrypted one
// by QEMU itself into a new overlay under key (so the snapshot opens with
// its own key alone), a plain one as a file.
func (m *machine) Snapshot(ctx context.Context, dir string, key []byte) error {
	if !filepath.IsAbs(dir) || strings.ContainsAny(dir, "'\n") {
		return hypervisor.Errorf(hypervisor.ErrInvalid, "qemu: snapshot dir %q: want an absolute path without quotes", dir)
	}
	switch {
	case len(key) != 0 && len(key) != hypervisor.KeySize:
		return hypervisor.Errorf(hypervisor.ErrInvalid, "qemu: snapshot key of %d bytes", len(key))
	case m.st.Encrypted && len(key) == 0:
		return hypervisor.Errorf(hypervisor.ErrInvalid, "qemu: %s is encrypted: a snapshot needs its key", m.ID())
	case !m.st.Encrypted && len(key) != 0:
		return hypervisor.Errorf(hypervisor.ErrInvalid, "qemu: %s is not encrypted: its disks cannot be snapshotted under a key", m.ID())
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if os.IsExist(err) {
			return hypervisor.Errorf(hypervisor.ErrExists, "qemu: snapshot dir %s exists", dir)
		}
		return fmt.Errorf("qemu: %w", err)
	}
	err := m.snapshot(ctx, dir, key)
	if err != nil {
		os.RemoveAll(dir)
	}
	return err
}

func (m *machine) snapshot(ctx context.Context, dir string, key []byte) error {
	// A volume's disk is not the machine's to copy, and a clone would
	// need the same device to load the stream.
	if plugged, err := m.volumes(ctx); err != nil {
		return err
	} else if len(plugged) > 0 {
		return hypervisor.Errorf(hypervisor.ErrState, "qemu: %s has volumes plugged in: unplug them before a snapshot", m.ID())
	}
	if err := m.Pause(ctx); err != nil {
		return err
	}
	if err := m.saveMemory(ctx, filepath.Join(dir, memoryFile), key); err != nil {
		return fmt.Errorf("qemu: snapshot: %w", err)
	}
	snap := snapshot{Version: snapshotVersion, Spec: m.st.Spec.WithoutKeys(), Accel: m.st.Accel, TSCKHz: m.st.TSCKHz, CreatedAt: time.Now().UTC(), Encrypted: len(key) > 0, SCSI: m.st.SCSI}
	for i, dk := range m.st.Disks {
		if dk.ReadOnly {
			snap.Disks = append(snap.Disks, dk)
			continue
		}
		// The machine is stopped, so its disks are flushed and quiet.
		name := fmt.Sprintf("disk%d.qcow2", i)
		var err error
		if m.st.Encrypted {
			err = m.copyUnder(ctx, i, filepath.Join(dir, name), key)
		} else {
			err = m.d.copyOverlay(ctx, dk, filepath.Join(dir, name))
		}
		if err != nil {
			return err
		}
		snap.Disks = append(snap.Disks, hypervisor.Disk{Path: name, Format: "qcow2"})
	}
	b, err := json.MarshalIndent(snap, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, snapshotMeta), b)
}

// migrationSocket is where QEMU and this process exchange a migration
// stream, in the machine's own state directory.
func (m *machine) migrationSocket() string { return filepath.Join(m.st.Spec.StateDir, "mig.sock") }

// saveMemory migrates the paused machine into path. QEMU writes the stream
// to a socket this process listens on, so that it can be sealed before
// it reaches the disk.
func (m *machine) saveMemory(ctx context.Context, path string, key []byte) (err error) {
	sock := m.migrationSocket()
	os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	defer os.Remove(sock)
	defer l.Close()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	copied := make(chan error, 1)
	go func() {
		conn, err := l.Accept()
		if err != nil {
			copied <- err
			return
		}
		defer conn.Close()
		copied <- sealTo(f, conn, key)
	}()
	if _, err := m.exec(ctx, "migrate", map[string]any{"uri": "unix:" + sock}); err != nil {
		return err
	}
	if err := m.waitMigration(ctx, "query-migrate"); err != nil {
		return err
	}
	select {
	case err = <-copied:
	case <-ctx.Done():
		return ctx.Err()
	}
	if err != nil {
		return err
	}
	return f.Sync()
}

// sealTo copies src to f, through a sealstream writer when key is set.
func sealTo(f *os.File, src io.Reader, key []byte) error {
	if len(key) == 0 {
		_, err := io.Copy(f, src)
		return err
	}
	w, err := sealstream.NewWriter(f, key)
	if err != nil {
		return err
	}
	if _, err := io.Copy(w, src); err != nil {
		return err
	}
	return w.Close()
}

// checkMemoryKey refuses a key the memory file does not open under: the
// first record is read, which a wrong key does not authenticate.
func checkMemoryKey(path string, key []byte) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("qemu: %w", err)
	}
	defer f.Close()
	r, err := sealstream.NewReader(f, key)
	if err == nil {
		_, err = r.Read(make([]byte, 1))
	}
	if err != nil && err != io.EOF {
		return hypervisor.Errorf(hypervisor.ErrInvalid, "qemu: snapshot memory does not open under the snapshot key: %v", err)
	}
	return nil
}

// waitMigration polls until the migration completes or fails.
func (m *machine) waitMigration(ctx context.Context, query string) error {
	for {
		out, err := m.exec(ctx, query, nil)
		if err != nil {
			return err
		}
		var s struct {
			Status string `json:"status"`
			Error  string `json:"error-desc"`
		}
		if err := json.Unmarshal(out, &s); err != nil {
			return fmt.Errorf("%s: %w", query, err)
		}
		switch s.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %s", s.Status, s.Error)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// incoming is what a restore loads into its machine before it runs.
type incoming struct {
	path string // a memory file, sealed under key when key is set
	key  []byte
	// stream, in place of path: a stream held in memory (a base's device
	// state), which leaves the shared RAM out when ignoreShared.
	stream       []byte
	ignoreShared bool
	keepPaused   bool // the machine stays paused after (a base's maker)
}

// incoming loads a stream into a machine started with -incoming defer
// and resumes it (unless keepPaused). QEMU listens on a socket this process feeds, from the
// file opened (and authenticated) under key when it is sealed.
func (m *machine) incoming(ctx context.Context, in incoming) error {
	var src io.Reader = bytes.NewReader(in.stream)
	if in.path != "" {
		f, err := os.Open(in.path)
		if err != nil {
			return fmt.Errorf("qemu: restore: %w", err)
		}
		defer f.Close()
		src = f
		if len(in.key) > 0 {
			if src, err = sealstream.NewReader(f, in.key); err != nil {
				return hypervisor.Errorf(hypervisor.ErrInvalid, "qemu: restore: %v", err)
			}
		}
	}
	if in.ignoreShared {
		if err := m.ignoreShared(ctx, true); err != nil {
			return fmt.Errorf("qemu: restore: %w", err)
		}
	}
	sock := m.migrationSocket()
	os.Remove(sock)
	defer os.Remove(sock)
	if _, err := m.exec(ctx, "migrate-incoming", map[string]any{"uri": "unix:" + sock}); err != nil {
		return fmt.Errorf("qemu: restore: %w", err)
	}
	conn, err := net.Dial("unix", sock)
	if err != nil {
		return fmt.Errorf("qemu: restore: %w", err)
	}
	fed := make(chan error, 1)
	go func() {
		_, err := io.Copy(conn, src)
		// On a damaged stream QEMU sees the connection end early and
		// fails the migration; the feed error says why.
		conn.Close()
		fed <- err
	}()
	if err := m.waitMigration(ctx, "query-migrate"); err != nil {
		conn.Close() // a feed blocked on a QEMU that stopped reading ends
		if ferr := <-fed; errors.Is(ferr, sealstream.ErrAuth) {
			return hypervisor.Errorf(hypervisor.ErrInvalid, "qemu: restore: snapshot memory: %v", ferr)
		}
		return fmt.Errorf("qemu: restore: %w", err)
	}
	if err := <-fed; err != nil {
		return hypervisor.Errorf(hypervisor.ErrInvalid, "qemu: restore: snapshot memory: %v", err)
	}
	// The incoming side reports "completed" and then leaves "inmigrate".
	for {
		s, err := m.status(ctx)
		if err != nil {
			return err
		}
		if s != "inmigrate" {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	if in.ignoreShared {
		// The machine's own snapshots carry all its memory: its RAM is
		// not mapped shared, and the stream must load without the
		// capability.
		if err := m.ignoreShared(ctx, false); err != nil {
			return fmt.Errorf("qemu: restore: %w", err)
		}
	}
	if in.keepPaused {
		return nil
	}
	return m.Resume(ctx)
}

// Shutdown implements hypervisor.Machine: an ACPI power-button press, then
// QMP quit and finally SIGKILL if the guest does not power off in time.
func (m *machine) Shutdown(ctx context.Context) error {
	if !m.st.Proc.alive() {
		return nil
	}
	grace, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if s, err := m.status(grace); err == nil && s != "running" {
		// A paused guest cannot see the button.
		m.Resume(grace)
	}
	// The button is pressed again every few seconds: a guest that had not
	// yet watched it (one that just booted) misses a press.
	for grace.Err() == nil {
		if _, err := m.exec(grace, "system_powerdown", nil); err != nil {
			break
		}
		press, cancel := context.WithTimeout(grace, 5*time.Second)
		err := m.st.Proc.wait(press)
		cancel()
		if err == nil {
			return nil
		}
	}
	if !m.st.Proc.alive() {
		return nil // it went as the last press was sent
	}
	if err := m.Kill(context.Background()); err != nil {
		return err
	}
	return fmt.Errorf("qemu: %s did not power off in time; the VMM was stopped: %w", m.ID(), grace.Err())
}

// Kill implements hypervisor.Machine.
func (m *machine) Kill(ctx context.Context) error {
	return m.st.Proc.kill(ctx)
}

// Wait implements hypervisor.Machine.
func (m *machine) Wait(ctx context.Context) error {
	return m.st.Proc.wait(ctx)
}

// Cleanup implements hypervisor.Machine.
func (m *machine) Cleanup(ctx context.Context) error {
	if m.st.Proc.alive() {
		return hypervisor.Errorf(hypervisor.ErrState, "qemu: %s is still running", m.ID())
	}
	m.d.stopDrain(m.ID())
	if err := os.RemoveAll(m.st.Spec.StateDir); err != nil {
		return fmt.Errorf("qemu: cleanup: %w", err)
	}
	if m.st.Spec.SerialLog != "" {
		os.Remove(m.st.Spec.SerialLog)
	}
	return nil
}

// copyOverlay copies a machine's qcow2 overlay; the copy keeps the same
// backing file, so only the machine's own writes are copied.
func (d *Driver) copyOverlay(ctx context.Context, dk hypervisor.Disk, dst string) error {
	if formatOf(dk) != "qcow2" {
		return hypervisor.Errorf(hypervisor.ErrUnsupported, "qemu: snapshot of a writable %s disk: use Disk.Overlay", formatOf(dk))
	}
	src, err := os.Open(dk.Path)
	if err != nil {
		return fmt.Errorf("qemu: snapshot disk: %w", err)
	}
	defer src.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("qemu: snapshot disk: %w", err)
	}
	_, err = io.Copy(out, src)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("qemu: snapshot disk: %w", err)
	}
	return ctx.Err()
}

// detach makes a restored machine's writable overlays self-contained over
// their plain base: QEMU streams into each what it still reads from the
// snapshot's disk copy (block-stream, while the guest runs), then points
// it at the base. After that the clone needs neither the snapshot nor its
// key, so a snapshot can be deleted while its clones live, and a clone can
// be stopped, started and snapshotted like any machine.
func (m *machine) detach(ctx context.Context) error {
	out, err := m.exec(ctx, "query-block", nil)
	if err != nil {
		return err
	}
	type image struct {
		Filename string `json:"filename"`
		Backing  *image `json:"backing-image"`
	}
	var devs []struct {
		Device   string `json:"device"`
		Inserted *struct {
			Image image `json:"image"`
		} `json:"inserted"`
	}
	if err := json.Unmarshal(out, &devs); err != nil {
		return fmt.Errorf("query-block: %w", err)
	}
	for i, dk := range m.st.Disks {
		if dk.ReadOnly {
			continue
		}
		dev := fmt.Sprintf("disk%d", i)
		var chain []string
		for _, d := range devs {
			if d.Device == dev && d.Inserted != nil {
				for im := &d.Inserted.Image; im != nil && len(chain) < 8; im = im.Backing {
					chain = append(chain, im.Filename)
				}
			}
		}
		if len(chain) < 2 {
			continue // nothing below the overlay
		}
		base := ""
		if len(chain) >= 3 {
			// Keep the base the snapshot's copy was made over.
			base = chain[2]
		}
		if err := qmp.Stream(ctx, m.exec, dev, base, "stream-"+dev); err != nil {
			return fmt.Errorf("stream %s: %w", dev, err)
		}
	}
	m.st.BackingEncrypted, m.st.Backing = false, nil
	return m.st.save()
}

// copyUnder copies what the machine wrote to its disk i (the top layer of
// its overlay) into a new overlay at dst, over the same plain base, under
// key. QEMU does the copy (blockdev-backup, sync top) with the machine's
// key it holds; the new key reaches it through QMP for the copy only.
func (m *machine) copyUnder(ctx context.Context, i int, dst string, key []byte) error {
	if i >= len(m.st.Spec.Disks) || !m.st.Spec.Disks[i].Overlay {
		return hypervisor.Errorf(hypervisor.ErrUnsupported, "qemu: snapshot of writable disk %d: it is not an overlay", i)
	}
	src := m.st.Spec.Disks[i]
	if err := overlay.CreateEncrypted(ctx, m.d.opts.QEMUImg, src.Path, formatOf(src), dst, src.SizeMB<<20, key); err != nil {
		return fmt.Errorf("qemu: snapshot disk %d: %w", i, err)
	}
	if err := qmp.CopyTop(ctx, m.exec, fmt.Sprintf("disk%d", i), dst, overlay.Passphrase(key), fmt.Sprintf("copy%d", i)); err != nil {
		return fmt.Errorf("qemu: snapshot disk %d: %w", i, err)
	}
	return nil
}
