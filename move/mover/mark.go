package mover

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// mark is what a sandbox's record says of its move in flight (its
// extras, under markKey): where from and to, how it was, and how far.
type mark struct {
	From   string    `json:"from"`
	To     string    `json:"to"`
	Resume bool      `json:"resume"`
	Paused bool      `json:"paused"`
	Stage  string    `json:"stage"`
	At     time.Time `json:"at,omitzero"`
}

const (
	markKey = "move"
	// stageSending: hibernated on the source, its files on their way;
	// stageHanded: the target's, not yet taken up there; stageWaking:
	// taken up by the target, which resumes it (a resume's outcome takes
	// the mark off).
	stageSending = "sending"
	stageHanded  = "handed"
	stageWaking  = "waking"
)

// withMark sets (or with nil, clears) rec's move mark, and returns rec.
func withMark(rec *store.Sandbox, m *mark) *store.Sandbox {
	if m == nil {
		delete(rec.Extra, markKey)
	} else {
		rec.SetExtra(markKey, m)
	}
	return rec
}

// ClearMark takes off what a move left on rec: one that could not finish
// (a sandbox hibernated again here), or one whose resume on its target
// ended.
func ClearMark(rec *store.Sandbox) {
	if markOf(rec) != nil {
		withMark(rec, nil)
	}
}

// MarkHeld marks rec, which a move holds and hibernates from state
// from, as being sent: a host that dies before the move's own mark is
// written (with its target) then rolls it back as it rolls back a move
// that was sending, resumed as it was.
func MarkHeld(rec *store.Sandbox, from sandbox.State) {
	withMark(rec, &mark{From: rec.Host, Resume: resumes(from), Paused: from == sandbox.StatePaused, Stage: stageSending})
}

func markOf(rec *store.Sandbox) *mark {
	var m mark
	if raw, ok := rec.Extra[markKey]; !ok || json.Unmarshal(raw, &m) != nil {
		return nil
	}
	return &m
}

// copyRecord is a copy of rec whose extras can change.
func copyRecord(rec *store.Sandbox) *store.Sandbox {
	c := *rec
	c.Extra = maps.Clone(rec.Extra)
	return &c
}

// movable says whether a sandbox in state moves, resumes whether it runs
// (or is paused) there after, and kept whether it is kept there.
func movable(st sandbox.State) bool { return resumes(st) || kept(st) }
func resumes(st sandbox.State) bool {
	return st == sandbox.StateRunning || st == sandbox.StatePaused
}
func kept(st sandbox.State) bool { return st == sandbox.StateHibernated || st == sandbox.StateStopped }

// notMoved names what of a stopped sandbox's machine directory stays:
// what belongs to its last VMM's process (its pid file), and its state
// record, which names paths of this host (the target's next launch
// writes its own). What a move carries of it is its disks (the backend's
// overlays, sealed under its data key) and its console log.
func notMoved(rel string) bool {
	return strings.HasSuffix(rel, ".pid") || rel == "state.json"
}

// manifestSum is the SHA-256 of an image build's manifest: two hosts
// have the same build when they have the same directory and this.
func manifestSum(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, images.ManifestFile))
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}
