package audit

import (
	"context"
	"crypto/ed25519"
	"fmt"

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
}

// Verify checks the whole chain and every checkpoint against pub.
func Verify(ctx context.Context, db store.Store, pub ed25519.PublicKey) (*Report, error) {
	r := &Report{}
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
				return bad(want, "entry %d is missing (the next one is %d)", want, e.Seq)
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
