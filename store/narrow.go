package store

import "context"

// Narrowed is the store as one domain sees it: its transactions offer only
// T, the methods of Tx the domain declares it needs (its own Tx
// interface), and the rest of the Store is there as it is. A domain keeps
// its store as its own narrow Store interface, filled by Narrow.
type Narrowed[T any] struct {
	Store
	as func(Tx) T
}

// Narrow gives a domain db with transactions seen as T. as is the
// conversion, checked by the compiler: pass func(tx Tx) T { return tx }.
func Narrow[T any](db Store, as func(Tx) T) Narrowed[T] {
	return Narrowed[T]{Store: db, as: as}
}

// Update runs fn in one transaction of the underlying store (Store.Update).
func (n Narrowed[T]) Update(ctx context.Context, fn func(tx T) error) error {
	return n.Store.Update(ctx, func(tx Tx) error { return fn(n.as(tx)) })
}
