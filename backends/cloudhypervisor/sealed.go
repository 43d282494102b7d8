package cloudhypervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/internal/sealstream"
)

// The VMM reads and writes a snapshot's memory and device state only as
// plain files in a directory. For an encrypted machine that directory is
// a tmpfs mounted for the one snapshot or restore inside the state dir
// (where a Landlock-sandboxed VMM may write): the plain files live in RAM
// only, the host seals them into the snapshot (sealstream, under the
// snapshot's key) or unseals them from it, and the mount goes away.

// sealedExt marks a VMM file sealed under the snapshot's key.
const sealedExt = ".sealed"

// stageSlack is what a staging tmpfs holds beyond the guest's memory:
// the device state and config.
const stageSlack = 64 << 20

// mountStage mounts a tmpfs on the empty directory dir for the plain
// snapshot files of a guest with memory bytes of RAM (0: unknown, the
// kernel's default cap of half the host's RAM). A host where this process
// may not mount refuses the encrypted snapshot rather than write plain
// memory to the disk.
func mountStage(dir string, memory int64) error {
	opts := "mode=0700"
	if memory > 0 {
		opts += fmt.Sprintf(",size=%d", memory+stageSlack)
	}
	if err := unix.Mount("harebox-stage", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		return hypervisor.Errorf(hypervisor.ErrUnavailable, "mount a tmpfs for the snapshot's plain files at %s: %v", dir, err)
	}
	return nil
}

// removeStage unmounts dir if it is a mount (dropping what the tmpfs
// held) and removes it.
func removeStage(dir string) error {
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", dir, err)
	}
	return os.RemoveAll(dir)
}

// removeStages removes every staging dir a snapshot or restore left in
// stateDir (a process killed mid-way leaves its tmpfs mounted).
func removeStages(stateDir string) error {
	dirs, _ := filepath.Glob(filepath.Join(stateDir, stagePrefix+"*"))
	dirs = append(dirs, filepath.Join(stateDir, restoreDirName))
	var errs []error
	for _, d := range dirs {
		if err := removeStage(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// sealFiles seals every regular file of src into dst as name.sealed.
func sealFiles(ctx context.Context, src, dst string, key []byte) error {
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !e.Type().IsRegular() {
			continue
		}
		if err := sealFile(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name()+sealedExt), key); err != nil {
			return fmt.Errorf("seal %s: %w", e.Name(), err)
		}
	}
	return nil
}

func sealFile(src, dst string, key []byte) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	w, err := sealstream.NewWriter(out, key)
	if err != nil {
		return err
	}
	if _, err := io.Copy(w, in); err != nil {
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	return out.Close()
}

// unsealFiles opens every name.sealed of src under key into dst as name.
// A file that does not authenticate (a wrong key, or altered) fails it.
func unsealFiles(ctx context.Context, src, dst string, key []byte) error {
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return err
		}
		name, ok := strings.CutSuffix(e.Name(), sealedExt)
		if !ok || !e.Type().IsRegular() || name == snapshotMetaName {
			continue
		}
		if err := unsealFile(filepath.Join(src, e.Name()), filepath.Join(dst, name), key); err != nil {
			return fmt.Errorf("unseal %s: %w", e.Name(), err)
		}
	}
	return nil
}

func unsealFile(src, dst string, key []byte) error {
	in, err := openRegular(src)
	if err != nil {
		return err
	}
	defer in.Close()
	r, err := sealstream.NewReader(in, key)
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	if _, err := io.Copy(out, r); err != nil {
		return err
	}
	return out.Close()
}

// readSealed reads the regular file path, sealed under key, whole: at
// most max bytes.
func readSealed(path string, key []byte, max int) ([]byte, error) {
	f, err := openRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r, err := sealstream.NewReader(f, key)
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(r, int64(max)+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(b) > max {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, max)
	}
	return b, nil
}

// openRegular opens path for reading if it is a regular file (a FIFO or
// a device put in a snapshot dir would block or mislead a restore).
func openRegular(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	return f, nil
}
