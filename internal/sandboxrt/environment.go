package sandboxrt

import (
	"github.com/harebox/harebox/guestenv"
)

// What a guest is given is package guestenv's: the engine calls it at
// fixed points of a sandbox's life (Pin in the create's transaction, its
// Prepare steps at create, its Load calls when a sandbox runs again,
// Deliver after every boot, Erase at delete), gives it the live
// sandboxes' Guests (sandboxView.Guest) and their agents; the box holds
// what its sandbox is given.

// guest is the box's sandbox as package guestenv's calls take it.
func (b *box) guest() guestenv.Sandbox {
	return guestenv.Sandbox{Rec: b.rec, Key: b.keys.Data, Guest: &b.given}
}

// Guest implements guestenv.Sandboxes: what live sandbox id is given, or
// nil.
func (s sandboxView) Guest(id string) *guestenv.Guest {
	if b := s.e.boxes.get(id); b != nil {
		return &b.given
	}
	return nil
}
