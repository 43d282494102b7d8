package harebox

import (
	"github.com/harebox/harebox/images/catalog"
	"github.com/harebox/harebox/sandbox"
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
func (e *Engine) heldImages() (goldens, pooled []string) { return e.clones.Held() }

// poolSpecs is what the warm pool keeps now, "IMAGE:PRESET" -> count
// (catalog's Options.Pool).
func (e *Engine) poolSpecs() map[string]int { return e.pool.Load().Specs() }

// warm is what the clone paths keep warm of an image build (catalog's
// Options.Warm): its golden snapshots and idle pool members.
func (e *Engine) warm(imageDir string) ([]sandbox.GoldenSnapshot, int) {
	return e.clones.Warm(imageDir)
}
