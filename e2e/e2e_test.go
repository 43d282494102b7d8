// Package e2e runs HareBox the way users do: a real hareboxd with real
// VMs, driven by the CLI, the Go client and a browser, one feature at a
// time (the walkthrough in every client is in e2e/clients).
package e2e
