package clone

import (
	"crypto/cipher"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/internal/mounts"
	"github.com/harebox/harebox/internal/procs"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/store"
)

// The golden snapshots' directory (Options.Dir). Each golden snapshot
// lives in a directory of its own there, named by what it was made of
// (goldenName: the image build, the size, the backend, the golden key),
// with its manifest written last, its key sealed in it under
// Options.Seal (the golden key). A start finds them again (Open) and
// removes what is of no use there: a build a crash cut short (and its
// machine, if it still runs), one whose key does not open, one of an
// image build that is gone, one unused for unusedFor. One of a build that
// its image's name does not find here, or of another kind of engine, is
// left to others. Engines that share Dir and the golden key (several
// servers on one machine, the servers of a test run) share them: one
// makes each, under a lock on its name (NAME.lock), while the others'
// creates boot.

// manifest is what a kept golden snapshot's goldenManifest holds.
type manifest struct {
	Format int `json:"format"`
	// Backend is the Options.Backend of the engine that made it, and
	// KeyID names its golden key (keyID).
	Backend string `json:"backend"`
	KeyID   string `json:"key_id"`
	// Snapshot is its record (its Dir is where it is found).
	Snapshot store.Snapshot `json:"snapshot"`
	// Key is its key sealed under Options.Seal, the nonce first (none
	// without encryption).
	Key []byte `json:"key,omitempty"`
}

var (
	// errBusy: another engine on Dir holds the golden snapshot's lock.
	errBusy = errors.New("another engine is making it")
	// errOther: another kind of engine on Dir (another golden key,
	// backend, version or network, or encryption set otherwise) made it
	// for its own use.
	errOther = errors.New("made by another kind of engine")
)

// unusedFor is how long a golden snapshot is kept unused (an image or a
// backend upgraded away from it leaves it).
const unusedFor = 7 * 24 * time.Hour

// touchEvery: a golden snapshot's manifest's time says when it was last
// used, to within this.
const touchEvery = time.Hour

// goldenName is the directory of the golden snapshot of the image build
// in imageDir at res, made by this backend.
func (s *Service) goldenName(imageDir string, res sandbox.Resources) string {
	return goldenName(imageDir, res, s.o.Backend, s.keyID, s.o.Encrypt)
}

func goldenName(imageDir string, res sandbox.Resources, backend, keyID string, encrypt bool) string {
	made := fmt.Sprintf("%d|%s|%d|%d|%d|%s|%s|%v", goldenFormat, imageDir, res.VCPUs, res.MemoryMB, res.DiskGB, backend, keyID, encrypt)
	sum := sha256.Sum256([]byte(made))
	return "g-" + hex.EncodeToString(sum[:12])
}

// keyID names a golden key without saying anything of it: engines under
// other keys on one Dir keep apart.
func keyID(seal cipher.AEAD) string {
	if seal == nil {
		return ""
	}
	tag := seal.Seal(nil, make([]byte, seal.NonceSize()), nil, []byte("harebox golden key id"))
	sum := sha256.Sum256(tag)
	return hex.EncodeToString(sum[:8])
}

// touch marks ready golden snapshot g used now (its manifest's time),
// once in a while; under s.mu.
func (s *Service) touch(g *golden) {
	if now := time.Now(); now.Sub(g.touched) > touchEvery {
		g.touched = now
		os.Chtimes(filepath.Join(s.o.Dir, g.name, goldenManifest), now, now)
	}
}

// keep writes g's manifest, last: from then on a start finds it.
func (s *Service) keep(g *golden) error {
	m := manifest{Format: goldenFormat, Backend: s.o.Backend, KeyID: s.keyID, Snapshot: *g.snap}
	m.Snapshot.Dir = ""
	if g.key != nil {
		var err error
		if m.Key, err = secrets.SealWith(s.o.Seal, []byte("harebox golden "+g.name), g.key); err != nil {
			return err
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	dir := filepath.Join(s.o.Dir, g.name)
	tmp := filepath.Join(dir, goldenManifest+".new")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, goldenManifest))
}

// find fills g from its kept manifest, if there is one that opens and is
// g's: made of the same image build, at the same size, by this backend.
func (s *Service) find(g *golden) error {
	dir := filepath.Join(s.o.Dir, g.name)
	b, err := os.ReadFile(filepath.Join(dir, goldenManifest))
	if err != nil {
		return err
	}
	var m manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	snap := m.Snapshot
	if m.Format != goldenFormat || goldenName(snap.ImageDir, snap.Size, m.Backend, m.KeyID, len(m.Key) > 0) != g.name {
		return errors.New("made of something else")
	}
	g.imageDir = snap.ImageDir
	if m.Backend != s.o.Backend || m.KeyID != s.keyID || (len(m.Key) > 0) != s.o.Encrypt {
		return errOther
	}
	var key []byte
	if len(m.Key) > 0 {
		if key, err = secrets.OpenWith(s.o.Seal, []byte("harebox golden "+g.name), m.Key); err != nil {
			return fmt.Errorf("its key does not open: %w", err)
		}
		if len(key) != hypervisor.KeySize {
			return errors.New("a key of another size")
		}
	}
	snap.Dir = filepath.Join(dir, "snap")
	g.snap, g.key, g.image, g.imageDir, g.res = &snap, key, snap.Image, snap.ImageDir, snap.Size
	return nil
}

// lock takes the lock on golden snapshot name, held by one engine on Dir
// at a time (errBusy: another holds it).
func (s *Service) lock(name string) (unlock func(), err error) {
	if err := os.MkdirAll(s.o.Dir, 0o700); err != nil {
		return nil, err
	}
	path := filepath.Join(s.o.Dir, name+".lock")
	for {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return nil, err
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				return nil, errBusy
			}
			return nil, err
		}
		// Unless the engine that held it removed the file meanwhile: this
		// lock is then on a file no one else opens.
		fi, err := f.Stat()
		pi, perr := os.Stat(path)
		if err == nil && perr == nil && os.SameFile(fi, pi) {
			return func() { f.Close() }, nil
		}
		f.Close()
	}
}

// remove removes golden snapshot name's files, under its lock (unless
// another engine holds it: that one makes it again).
func (s *Service) remove(name string) { s.removeIf(name, "") }

// removeIf removes golden snapshot name's files, under its lock, if it is
// snapshot id (any, for ""; none: another engine holds the lock, or made
// it again since), and reports whether it did.
func (s *Service) removeIf(name, id string) bool {
	unlock, err := s.lock(name)
	if err != nil {
		return false
	}
	defer unlock()
	if now := (&golden{name: name}); id != "" && s.find(now) == nil && now.snap.ID != id {
		return false
	}
	if err := s.clear(filepath.Join(s.o.Dir, name)); err != nil {
		s.o.Log.Warn("cannot remove a golden snapshot's files", "dir", filepath.Join(s.o.Dir, name), "err", err)
	}
	return true
}

// clear stops a golden machine still running in dir (whose boot an
// engine died in) and removes dir. Its own machine directory only: a
// sandbox restored from the golden snapshot names the snapshot's disk on
// its command line (the backing of its overlay), and lives on.
func (s *Service) clear(dir string) error {
	if n := procs.KillVMMs(filepath.Join(dir, goldenMachine)); n > 0 {
		s.o.Log.Warn("stopped a golden machine left running", "dir", dir, "vmms", n)
	}
	// The manifest first: an engine that reads it without the lock must
	// not find it over files half removed.
	if err := os.Remove(filepath.Join(dir, goldenManifest)); err != nil && !os.IsNotExist(err) {
		return err
	}
	return mounts.RemoveAll(dir)
}

// Open, at start, finds the kept golden snapshots again (of image builds
// that are still current) and removes the other golden files: what a
// crash cut short, and those it can judge unusable. With golden
// snapshots off (no Seal) it leaves the kept ones as they are.
func (s *Service) Open() {
	ents, _ := os.ReadDir(s.o.Dir)
	for _, ent := range ents {
		name, ok := strings.CutSuffix(ent.Name(), ".lock")
		if !strings.HasPrefix(name, "g-") && !strings.HasPrefix(name, "golden-") || !ent.IsDir() && !ok {
			continue // (not a golden snapshot's: the golden key may live here)
		}
		if !ent.IsDir() {
			if _, err := os.Stat(filepath.Join(s.o.Dir, name)); err == nil {
				continue // (its directory's turn)
			}
		}
		unlock, err := s.lock(name)
		if err != nil {
			continue // another engine makes it now
		}
		s.openKept(name)
		unlock()
	}
}

// openKept finds golden snapshot name again, or removes it, under its
// lock.
func (s *Service) openKept(name string) {
	dir := filepath.Join(s.o.Dir, name)
	fi, err := os.Stat(filepath.Join(dir, goldenManifest))
	if err == nil && s.o.Seal == nil {
		return // (not this engine's to judge)
	}
	g := &golden{name: name, ready: make(chan struct{}), cancel: func() {}}
	if err == nil {
		err = s.find(g)
	}
	if err != nil && !errors.Is(err, errOther) {
		s.drop(name) // (cut short, or it does not open: of no use)
		return
	}
	if _, serr := os.Stat(g.imageDir); serr != nil || time.Since(fi.ModTime()) > unusedFor {
		s.drop(name) // (its image build is gone, or no one used it for long)
		return
	}
	if err != nil {
		return // (another kind of engine's: left to it)
	}
	if img, err := s.o.Images.Lookup(g.image); err != nil || img.Dir != g.imageDir {
		// Of a build that its image's name does not find here (a newer
		// one does, or another engine's image): neither held (so
		// harebox-image gc may remove that build, and a later start this
		// golden snapshot) nor removed (another engine on Dir may use
		// it).
		return
	}
	// (A machine a crash left behind after the manifest.)
	procs.KillVMMs(filepath.Join(dir, goldenMachine))
	mounts.RemoveAll(filepath.Join(dir, goldenMachine))
	close(g.ready)
	s.mu.Lock()
	s.goldens[goldenID(images.Image{Dir: g.imageDir}, g.res)] = g
	s.touch(g)
	s.mu.Unlock()
	s.o.Log.Info("golden snapshot ready", "image", g.image, "size", g.res, "kept", true)
}

// drop removes golden snapshot name's files and its lock file, under the
// lock (one who opens the lock file later makes a new one).
func (s *Service) drop(name string) {
	dir := filepath.Join(s.o.Dir, name)
	if err := s.clear(dir); err != nil {
		s.o.Log.Warn("cannot remove a golden snapshot's files", "dir", dir, "err", err)
	}
	os.Remove(filepath.Join(s.o.Dir, name+".lock"))
}
