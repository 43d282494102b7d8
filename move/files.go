package move

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"

	"github.com/harebox/harebox/sandbox"
)

// A sandbox's files travel as a tar stream of one flat directory of
// regular files (a hibernation: memory, device state, disks), each
// already sealed under the sandbox's data key.

// fileName is what a file of a move may be called: no path, no dot file.
var fileName = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$`)

// maxFiles bounds how many files a move carries.
const maxFiles = 64

// pack writes dir's files to w as a tar stream.
func pack(w io.Writer, dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	for _, d := range ents {
		if !d.Type().IsRegular() || !fileName.MatchString(d.Name()) {
			return fmt.Errorf("move: %s: %s is not a file a move carries", dir, d.Name())
		}
		if err := packFile(tw, filepath.Join(dir, d.Name())); err != nil {
			return err
		}
	}
	return tw.Close()
}

func packFile(tw *tar.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: filepath.Base(path), Size: st.Size(), Mode: 0o600, ModTime: st.ModTime()}); err != nil {
		return err
	}
	_, err = io.Copy(tw, f)
	return err
}

// unpack reads a tar stream of files from r into dir, which it makes:
// regular files only, with names a move carries, max bytes in all (as
// announced: no more, no less). Each file reaches the disk (fsync) before unpack returns.
func unpack(r io.Reader, dir string, max int64) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	tr := tar.NewReader(r)
	left, n := max, 0
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("move: the files' stream: %w", err)
		}
		if n++; n > maxFiles {
			return sandbox.Errorf(sandbox.ErrTooLarge, "", "a move carries at most %d files", maxFiles)
		}
		if h.Typeflag != tar.TypeReg || !fileName.MatchString(h.Name) {
			return sandbox.Errorf(sandbox.ErrInvalid, "", "a move carries regular files of plain names, not %q", h.Name)
		}
		if h.Size < 0 || h.Size > left {
			return sandbox.Errorf(sandbox.ErrTooLarge, "", "the files of the move are over the %d bytes announced", max)
		}
		left -= h.Size
		if err := unpackFile(tr, filepath.Join(dir, h.Name), h.Size); err != nil {
			return err
		}
	}
	if left != 0 {
		// (A tar stream cut at a file's end reads as whole.)
		return sandbox.Errorf(sandbox.ErrInvalid, "", "the files' stream ended %d bytes short of the %d announced", left, max)
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func unpackFile(r io.Reader, path string, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err // (a name twice)
	}
	if _, err := io.CopyN(f, r, size); err != nil {
		f.Close()
		return fmt.Errorf("move: %s: %w", filepath.Base(path), err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
