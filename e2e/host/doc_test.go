// Package host runs what a hareboxd host does over time and under
// stress, with real VMs: kill -9 at random points, load, an upgrade from
// the previous release, processes that outlive the server, several hosts
// on one store, systemd deployment and readiness, budgets that act on a
// VM, forks, hibernation and the warm pool. Package e2e beside it drives
// the same server through every client.
package host
