package harebox

import (
	"strings"

	"github.com/harebox/harebox/images/catalog"
)

// The image catalog is package images/catalog's: the engine looks images
// up in it (a create, the pool, a start), the REST API lists, builds and
// deletes through it, and it writes the references of the builds in use
// for harebox-image gc. The engine tells it what it holds in memory
// (heldImages).

// Images is the engine's image catalog, whose calls (List, Build,
// Delete) are for the principal in the context, as the REST API makes
// them.
func (e *Engine) Images() *catalog.Catalog { return e.catalog }

// heldImages are the image builds of the engine's golden snapshots and
// idle pool members.
func (e *Engine) heldImages() (goldens, pooled []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for id := range e.goldens {
		goldens = append(goldens, goldenImageDir(id))
	}
	for _, ms := range e.pool {
		for _, m := range ms {
			pooled = append(pooled, m.img.Dir)
		}
	}
	return goldens, pooled
}

// goldenImageDir is the image build of a golden snapshot's ID (goldenID:
// the build's directory, then three numbers).
func goldenImageDir(id string) string {
	for range 3 {
		if i := strings.LastIndexByte(id, '|'); i >= 0 {
			id = id[:i]
		}
	}
	return id
}
