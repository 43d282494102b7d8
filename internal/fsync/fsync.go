// Package fsync makes changes to a directory's entries durable: a file
// created, renamed into or removed from it is on the disk only once the
// directory itself is synced.
package fsync

import "os"

// Dir syncs directory dir.
func Dir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
