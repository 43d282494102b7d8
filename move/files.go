package move

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/harebox/harebox/internal/fsync"
	"github.com/harebox/harebox/sandbox"
)

// A sandbox's files travel as a tar stream of one directory: its
// hibernation (memory, device state, disks) or, for a stopped sandbox,
// its machine directory (its disks), each file already sealed under the
// sandbox's data key. Only regular files and directories go: a socket,
// a pipe or a symbolic link is left behind, never followed.

// fileName is what each element of a path a move carries may be called:
// no dot file, no "..".
var fileName = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$`)

const (
	// maxFiles bounds how many files and directories a move carries,
	// maxDepth how deep.
	maxFiles = 64
	maxDepth = 3
)

// validPath reports whether rel (slash-separated) is a path a move
// carries.
func validPath(rel string) bool {
	parts := strings.Split(rel, "/")
	if len(parts) > maxDepth {
		return false
	}
	for _, p := range parts {
		if !fileName.MatchString(p) {
			return false
		}
	}
	return true
}

// pack writes dir's regular files and directories to w as a tar stream,
// but those skip names (by their path relative to dir).
func pack(w io.Writer, dir string, skip func(rel string) bool) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		if (skip != nil && skip(rel)) || (!d.IsDir() && !d.Type().IsRegular()) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if !validPath(rel) {
			return fmt.Errorf("move: %s: %s is not a file a move carries", dir, rel)
		}
		if d.IsDir() {
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: rel + "/", Mode: 0o700})
		}
		return packFile(tw, path, rel)
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

func packFile(tw *tar.Writer, path, rel string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: rel, Size: st.Size(), Mode: 0o600, ModTime: st.ModTime()}); err != nil {
		return err
	}
	_, err = io.Copy(tw, f)
	return err
}

// unpack reads a tar stream of files from r into dir, which it makes:
// regular files and directories only, with paths a move carries, max
// bytes in all (as announced: no more, no less). Each file reaches the
// disk (fsync) before unpack returns.
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
		name := strings.TrimSuffix(h.Name, "/")
		if (h.Typeflag != tar.TypeReg && h.Typeflag != tar.TypeDir) || !validPath(name) {
			return sandbox.Errorf(sandbox.ErrInvalid, "", "a move carries regular files and directories of plain names, not %q", h.Name)
		}
		path := filepath.Join(dir, filepath.FromSlash(name))
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(path, 0o700); err != nil {
				return err
			}
			continue
		}
		if h.Size < 0 || h.Size > left {
			return sandbox.Errorf(sandbox.ErrTooLarge, "", "the files of the move are over the %d bytes announced", max)
		}
		left -= h.Size
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return err
		}
		if err := unpackFile(tr, path, h.Size); err != nil {
			return err
		}
	}
	if left != 0 {
		// (A tar stream cut at a file's end reads as whole.)
		return sandbox.Errorf(sandbox.ErrInvalid, "", "the files' stream ended %d bytes short of the %d announced", left, max)
	}
	return fsync.Dir(dir)
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

// dirBytes is what the files of dir that pack sends (but those skip
// names) hold.
func dirBytes(dir string, skip func(rel string) bool) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if rel == "." {
			return nil
		}
		if skip != nil && skip(filepath.ToSlash(rel)) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Type().IsRegular() {
			st, err := d.Info()
			if err != nil {
				return err
			}
			n += st.Size()
		}
		return nil
	})
	return n, err
}
