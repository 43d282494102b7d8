package audit

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"strings"

	"github.com/harebox/harebox/store"
)

// Report is what Verify found.
type Report struct {
	OK          bool  `json:"ok"`
	Entries     int64 `json:"entries"`
	Checkpoints int   `json:"checkpoints"`
	// FirstBad is the sequence number of the first entry that was altered,
	// removed or reordered (0 when OK), and Reason says how it shows.
	FirstBad int64  `json:"first_bad,omitempty"`
	Reason   string `json:"reason,omitempty"`
	// Anchor names where the checkpoints are also kept ("none" if
	// nowhere); Anchored is the newest entry it holds a checkpoint of,
	// and Unanchored how many entries follow that one: the entries not
	// yet signed, or those a crash (kill -9) left unsigned. They are not
	// an error, but nothing outside the database vouches for them.
	Anchor     string `json:"anchor"`
	Anchored   int64  `json:"anchored"`
	Unanchored int64  `json:"unanchored"`
}

// Verify checks the whole chain and every checkpoint against pub, with
// no anchor.
func Verify(ctx context.Context, db Reader, pub ed25519.PublicKey) (*Report, error) {
	return VerifyAnchored(ctx, db, pub, None)
}

// VerifyAnchored checks the whole chain: every row's columns against its
// record, each record against its hash, each hash against the next
// entry's, and every checkpoint (the database's, then the anchor's)
// against pub and against the chain, which must reach the newest one.
func VerifyAnchored(ctx context.Context, db Reader, pub ed25519.PublicKey, anchor Anchor) (*Report, error) {
	r := &Report{Anchor: anchor.String()}
	hashes := map[int64]string{}
	prev, want := "", int64(1)
	bad := func(seq int64, format string, args ...any) (*Report, error) {
		r.FirstBad, r.Reason = seq, fmt.Sprintf(format, args...)
		return r, nil
	}
	for after := int64(0); ; {
		page, err := db.ListAudit(ctx, store.AuditFilter{After: after, Limit: 1000})
		if err != nil {
			return nil, err
		}
		if len(page) == 0 {
			break
		}
		for _, e := range page {
			switch {
			case e.Seq != want:
				return bad(want, "entry %d is missing or out of place (the next row holds entry %d)", want, e.Seq)
			case len(e.Mismatch) > 0:
				return bad(e.Seq, "entry %d was altered (its %s column disagrees with its hashed record)", e.Seq, strings.Join(e.Mismatch, ", "))
			case e.Prev != prev:
				return bad(e.Seq, "entry %d does not follow entry %d (removed or reordered)", e.Seq, e.Seq-1)
			case Hash(e) != e.Hash:
				return bad(e.Seq, "entry %d was altered (its hash does not match its fields)", e.Seq)
			}
			hashes[e.Seq] = e.Hash
			prev, want, after = e.Hash, e.Seq+1, e.Seq
			r.Entries++
		}
	}
	cps, err := db.ListAuditCheckpoints(ctx)
	if err != nil {
		return nil, err
	}
	for _, c := range cps {
		if !ed25519.Verify(pub, checkpointMsg(c.Seq, c.Hash), c.Sig) {
			return bad(c.Seq, "checkpoint %d's signature does not verify", c.Seq)
		}
		h, ok := hashes[c.Seq]
		if !ok {
			return bad(r.Entries+1, "entries from %d to %d, which a signed checkpoint covers, are gone (the log was cut)", r.Entries+1, c.Seq)
		}
		if h != c.Hash {
			return bad(firstDiff(hashes, cps, c), "the log up to entry %d was rewritten (a signed checkpoint disagrees)", c.Seq)
		}
		r.Checkpoints++
	}
	acps, err := anchor.Checkpoints(ctx)
	if err != nil {
		return nil, err
	}
	for _, c := range acps {
		if !ed25519.Verify(pub, checkpointMsg(c.Seq, c.Hash), c.Sig) {
			return bad(c.Seq, "the anchor's checkpoint of entry %d does not verify (another key's, or forged)", c.Seq)
		}
		h, ok := hashes[c.Seq]
		if !ok {
			return bad(r.Entries+1, "entries from %d to %d are gone: the anchor saw the log reach %d (its tail was cut, with its checkpoints)",
				r.Entries+1, c.Seq, c.Seq)
		}
		if h != c.Hash {
			return bad(firstDiff(hashes, acps, c), "the log up to entry %d was rewritten (the anchor's checkpoint disagrees)", c.Seq)
		}
		r.Anchored = max(r.Anchored, c.Seq)
	}
	r.Unanchored = r.Entries - r.Anchored
	r.OK = true
	return r, nil
}

// firstDiff narrows a rewrite down to the entries after the last
// checkpoint that still agrees: a chain recomputed by someone without the
// key is placed that precisely, no more.
func firstDiff(hashes map[int64]string, cps []*store.AuditCheckpoint, bad *store.AuditCheckpoint) int64 {
	from := int64(1)
	for _, c := range cps {
		if c.Seq < bad.Seq && hashes[c.Seq] == c.Hash {
			from = c.Seq + 1
		}
	}
	return from
}
