package images

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/harebox/harebox/internal/fsync"
	"github.com/harebox/harebox/internal/mounts"
)

// Garbage collection of an image cache (an OutDir). A build is removed
// only when nothing may use it: it is not the newest of its name, no
// reference names it, and it was not built, used or superseded lately.
//
// Who uses a build: the caller says (GCOptions.InUse), and so do the
// reference files in OUT/.refs/, one per user of the cache: an engine
// writes there the builds its sandboxes, snapshots, golden snapshots and
// pool use (WriteRefs), again every minute, so a GC run on its own (no
// database at hand) knows them. Between two writes a user can only start
// using the newest build of a name (a create picks that one; everything
// else it uses is recorded), so GC also keeps every build that was the
// newest at any time since the oldest reference file was written, with
// GCGrace to spare: a stale or a crashed user's file errs on keeping.
//
// GC and Build share OUT/.lock: a build takes it shared to find a cached
// build (which it then marks used) and to move a new one into place, GC
// exclusively while it picks builds and moves them aside (to .gc-*, then
// removed). A build in progress lives in .tmp-*, which GC leaves alone
// until it is a day old, as Build does.

// File and directory names in the cache.
const (
	lockFile = ".lock"
	// RefsDir holds the reference files.
	RefsDir  = ".refs"
	gcPrefix = ".gc-"
)

const (
	// GCGrace is how long before the oldest reference (or now) a build
	// must have stopped being used (built, found by a cache hit, or the
	// newest of its name) to be removed: a create that picked the newest
	// build records it in its sandbox a moment later, and a program given
	// a build by a cache hit starts it a moment later.
	GCGrace = 10 * time.Minute
	// RefStaleAfter: a reference file not written again for this long
	// whose owner (an engine's data directory) is gone is left over from
	// a removed engine; GC ignores it and removes it.
	RefStaleAfter = time.Hour
	// staleLeftover is the age at which a temporary build directory is a
	// crashed build's (a running build's is younger).
	staleLeftover = 24 * time.Hour
)

// Reasons in a GCReport.
const (
	ReasonNewest   = "newest"   // the newest build of its name
	ReasonInUse    = "in use"   // a reference or InUse names it
	ReasonRecent   = "recent"   // built, used or the newest since the horizon
	ReasonUnused   = "unused"   // removed
	ReasonLeftover = "leftover" // removed: a crashed build's or GC's
)

// Refs is a reference file: the image builds Owner uses, as of WrittenAt.
type Refs struct {
	// Owner is who uses them: an engine's data directory.
	Owner     string    `json:"owner"`
	WrittenAt time.Time `json:"written_at"`
	Dirs      []string  `json:"dirs"`
}

// WriteRefs records in cache directory dir that owner uses the builds
// dirs, as of now, replacing owner's earlier file there at once.
func WriteRefs(dir, owner string, dirs []string, now time.Time) error {
	rd := filepath.Join(dir, RefsDir)
	if err := os.MkdirAll(rd, 0o755); err != nil {
		return fmt.Errorf("images: %w", err)
	}
	sorted := append([]string{}, dirs...)
	sort.Strings(sorted)
	b, err := json.MarshalIndent(Refs{Owner: owner, WrittenAt: now.UTC(), Dirs: sorted}, "", "  ")
	if err != nil {
		return err
	}
	sum := sha256.Sum256([]byte(owner))
	p := filepath.Join(rd, hex.EncodeToString(sum[:8])+".json")
	tmp := p + ".tmp-" + randSuffix()
	if err := writeFileSync(tmp, append(b, '\n'), 0o644); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("images: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("images: %w", err)
	}
	return nil
}

// GCOptions say what GC may remove.
type GCOptions struct {
	// InUse are builds in use besides those the reference files name.
	InUse []string
	// DryRun reports what GC would remove, and removes nothing.
	DryRun bool
	// NoEngine says no engine uses the cache. Without it GC removes no
	// build from a cache where no engine ever wrote its references: an
	// engine of before reference files (or one that never ran since) may
	// have sandboxes on any build.
	NoEngine bool
	// Grace is GCGrace by default.
	Grace time.Duration
	// Now is time.Now by default.
	Now func() time.Time
}

// GCBuild is one build (or leftover directory) in a GCReport.
type GCBuild struct {
	Name    string    `json:"name,omitempty"`
	Dir     string    `json:"dir"`
	BuiltAt time.Time `json:"built_at,omitzero"`
	Bytes   int64     `json:"bytes"`
	Reason  string    `json:"reason"`
}

// GCRef is a reference file GC read.
type GCRef struct {
	File      string    `json:"file"`
	Owner     string    `json:"owner"`
	WrittenAt time.Time `json:"written_at"`
	Dirs      int       `json:"dirs"`
	// Stale: left over from an owner that is gone; ignored (and removed
	// unless DryRun).
	Stale bool `json:"stale,omitempty"`
}

// GCReport says what GC removed (would remove, with DryRun) and kept.
type GCReport struct {
	Dir        string    `json:"dir"`
	DryRun     bool      `json:"dry_run"`
	Horizon    time.Time `json:"horizon"`
	Removed    []GCBuild `json:"removed"`
	Kept       []GCBuild `json:"kept"`
	FreedBytes int64     `json:"freed_bytes"`
	KeptBytes  int64     `json:"kept_bytes"`
	References []GCRef   `json:"references"`
}

// GC removes the builds in cache directory dir that nothing uses (see
// the top of this file), and directories left by crashed builds.
func GC(ctx context.Context, dir string, o GCOptions) (GCReport, error) {
	if o.Grace <= 0 {
		o.Grace = GCGrace
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return GCReport{}, err
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return GCReport{}, fmt.Errorf("images: gc: %s is not a directory (%v)", dir, err)
	}
	r := GCReport{Dir: dir, DryRun: o.DryRun, Removed: []GCBuild{}, Kept: []GCBuild{}, References: []GCRef{}}
	unlock := func() {}
	if !o.DryRun {
		if unlock, err = lockCache(dir, syscall.LOCK_EX); err != nil {
			return GCReport{}, fmt.Errorf("images: gc: %w", err)
		}
	}
	locked := true
	defer func() {
		if locked {
			unlock()
		}
	}()
	now := o.Now()

	refs, err := readRefs(dir, now)
	if err != nil {
		return GCReport{}, err
	}
	inUse := map[string]bool{}
	for _, d := range o.InUse {
		inUse[sameFile(d)] = true
	}
	horizon := now
	for _, rf := range refs {
		r.References = append(r.References, rf.GCRef)
		if rf.Stale {
			continue
		}
		for _, d := range rf.Dirs {
			inUse[sameFile(d)] = true
		}
		if rf.WrittenAt.Before(horizon) {
			horizon = rf.WrittenAt
		}
	}
	r.Horizon = horizon.Add(-o.Grace)

	builds, leftovers, err := scanCache(dir, now)
	if err != nil {
		return GCReport{}, err
	}
	reasons := plan(builds, inUse, r.Horizon)
	if len(refs) == 0 && !o.NoEngine && !o.DryRun {
		for _, why := range reasons {
			if why == ReasonUnused {
				return GCReport{}, fmt.Errorf("images: gc: no engine wrote its references in %s (hareboxd does while it runs, in %s): start hareboxd once, or say that no engine uses this cache", dir, RefsDir)
			}
		}
	}

	var doomed []string // moved aside, to remove once unlocked
	drop := func(b GCBuild) error {
		r.Removed = append(r.Removed, b)
		r.FreedBytes += b.Bytes
		if o.DryRun {
			return nil
		}
		if strings.HasPrefix(filepath.Base(b.Dir), gcPrefix) {
			doomed = append(doomed, b.Dir)
			return nil
		}
		aside := filepath.Join(dir, gcPrefix+filepath.Base(b.Dir)+"-"+randSuffix())
		if err := os.Rename(b.Dir, aside); err != nil {
			return fmt.Errorf("images: gc: %w", err)
		}
		doomed = append(doomed, aside)
		return nil
	}
	for _, d := range leftovers {
		if err := ctx.Err(); err != nil {
			return GCReport{}, err
		}
		if err := drop(GCBuild{Dir: d, Bytes: diskUse(d), Reason: ReasonLeftover}); err != nil {
			return GCReport{}, err
		}
	}
	for _, b := range builds {
		if err := ctx.Err(); err != nil {
			return GCReport{}, err
		}
		g := GCBuild{Name: b.name, Dir: b.dir, BuiltAt: b.builtAt, Bytes: diskUse(b.dir), Reason: reasons[b.dir]}
		if g.Reason != ReasonUnused {
			r.Kept = append(r.Kept, g)
			r.KeptBytes += g.Bytes
			continue
		}
		if err := drop(g); err != nil {
			return GCReport{}, err
		}
	}
	if !o.DryRun {
		fsync.Dir(dir)
		for _, rf := range refs {
			if rf.Stale {
				os.Remove(rf.File)
			}
		}
	}
	unlock()
	locked = false
	// The moved-aside builds are no one's now: remove them, unlocked (a
	// crash here leaves .gc-* directories, which the next GC removes).
	for _, d := range doomed {
		if err := mounts.RemoveAll(d); err != nil {
			return r, fmt.Errorf("images: gc: %w", err)
		}
	}
	return r, nil
}

// build is a complete build in a cache directory.
type build struct {
	name    string
	dir     string
	builtAt time.Time
	// usedAt is the directory's modification time: a cache hit sets it.
	usedAt time.Time
}

// plan gives each build why it is kept, or ReasonUnused: it is kept if
// it is the newest of its name, in use, or was built, used or the newest
// of its name after horizon.
func plan(builds []build, inUse map[string]bool, horizon time.Time) map[string]string {
	byName := map[string][]build{}
	for _, b := range builds {
		byName[b.name] = append(byName[b.name], b)
	}
	out := map[string]string{}
	for _, bs := range byName {
		// Newest first (by build time, then by directory for a tie).
		sort.Slice(bs, func(i, j int) bool {
			if !bs[i].builtAt.Equal(bs[j].builtAt) {
				return bs[i].builtAt.After(bs[j].builtAt)
			}
			return bs[i].dir > bs[j].dir
		})
		for i, b := range bs {
			switch {
			case i == 0:
				out[b.dir] = ReasonNewest
			case inUse[sameFile(b.dir)]:
				out[b.dir] = ReasonInUse
			// (The next newer one's build time is when this one stopped
			// being the newest.)
			case b.builtAt.After(horizon), b.usedAt.After(horizon), bs[i-1].builtAt.After(horizon):
				out[b.dir] = ReasonRecent
			default:
				out[b.dir] = ReasonUnused
			}
		}
	}
	return out
}

// scanCache lists the complete builds in dir (directories named
// <name>-<hash> holding a loadable manifest of that name and hash: what
// Build makes, nothing else), and the leftovers GC removes: its own
// .gc-* and a crashed build's .tmp-* or .old-* a day old.
func scanCache(dir string, now time.Time) (builds []build, leftovers []string, err error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("images: gc: %w", err)
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		p := filepath.Join(dir, e.Name())
		fi, err := e.Info()
		if err != nil {
			continue // (gone meanwhile)
		}
		switch n := e.Name(); {
		case strings.HasPrefix(n, gcPrefix):
			leftovers = append(leftovers, p)
		case strings.HasPrefix(n, ".tmp-"), strings.HasPrefix(n, ".old-"):
			if now.Sub(fi.ModTime()) >= staleLeftover {
				leftovers = append(leftovers, p)
			}
		case strings.HasPrefix(n, "."):
		default:
			img, err := Load(p)
			if err != nil || len(img.InputHash) < 12 || n != img.Name+"-"+img.InputHash[:12] {
				continue
			}
			builds = append(builds, build{name: img.Name, dir: p, builtAt: img.BuiltAt, usedAt: fi.ModTime()})
		}
	}
	return builds, leftovers, nil
}

type refFile struct {
	GCRef
	Dirs []string
}

// readRefs reads dir's reference files. One that cannot be read stops GC:
// it may name builds in use.
func readRefs(dir string, now time.Time) ([]refFile, error) {
	ms, err := filepath.Glob(filepath.Join(dir, RefsDir, "*.json"))
	if err != nil {
		return nil, err
	}
	var out []refFile
	for _, m := range ms {
		b, err := os.ReadFile(m)
		if errors.Is(err, fs.ErrNotExist) {
			continue // (replaced meanwhile: written anew under the same name)
		}
		var rf Refs
		if err == nil {
			err = json.Unmarshal(b, &rf)
		}
		if err != nil || rf.Owner == "" || rf.WrittenAt.IsZero() {
			return nil, fmt.Errorf("images: gc: reference file %s unreadable (%v); remove it if no engine uses this cache", m, err)
		}
		f := refFile{GCRef: GCRef{File: m, Owner: rf.Owner, WrittenAt: rf.WrittenAt, Dirs: len(rf.Dirs)}, Dirs: rf.Dirs}
		if now.Sub(rf.WrittenAt) > RefStaleAfter {
			if _, err := os.Stat(rf.Owner); errors.Is(err, fs.ErrNotExist) {
				f.Stale = true
			}
		}
		out = append(out, f)
	}
	return out, nil
}

// sameFile is the path p names, with symbolic links resolved where it
// exists, so a build named by another path still counts as in use.
func sameFile(p string) string {
	if abs, err := filepath.Abs(p); err == nil {
		p = abs
	}
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	return filepath.Clean(p)
}

// lockCache takes the cache directory's lock (syscall.LOCK_SH or LOCK_EX)
// until unlock.
func lockCache(dir string, how int) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDONLY|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err = syscall.Flock(int(f.Fd()), how)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	return func() { f.Close() }, nil
}

// touch marks a build as just used (GC keeps it for GCGrace).
func touch(dir string) {
	now := time.Now()
	os.Chtimes(dir, now, now) // (a read-only cache has no GC either)
}

// diskUse is the space the files under p take on disk (sparse files by
// their blocks, hard links once).
func diskUse(p string) int64 {
	var n int64
	seen := map[uint64]bool{}
	filepath.WalkDir(p, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			if seen[st.Ino] {
				return nil
			}
			seen[st.Ino] = true
			n += st.Blocks * 512
		}
		return nil
	})
	return n
}

// Usage sums a GCReport by image name: what each name's builds take and
// how much of it GC would free.
type Usage struct {
	Name             string `json:"name"`
	Builds           int    `json:"builds"`
	Bytes            int64  `json:"bytes"`
	Unused           int    `json:"unused"`
	ReclaimableBytes int64  `json:"reclaimable_bytes"`
}

// ByName sums r by image name (leftovers under ""), by name.
func (r GCReport) ByName() []Usage {
	m := map[string]*Usage{}
	get := func(n string) *Usage {
		if m[n] == nil {
			m[n] = &Usage{Name: n}
		}
		return m[n]
	}
	for _, b := range r.Kept {
		u := get(b.Name)
		u.Builds++
		u.Bytes += b.Bytes
	}
	for _, b := range r.Removed {
		u := get(b.Name)
		if b.Reason != ReasonLeftover {
			u.Builds++
		}
		u.Unused++
		u.Bytes += b.Bytes
		u.ReclaimableBytes += b.Bytes
	}
	out := make([]Usage, 0, len(m))
	for _, u := range m {
		out = append(out, *u)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
