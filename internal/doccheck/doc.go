// Package doccheck holds tests that compile the Go examples of the
// plugin author guide (docs/plugins.md) against the SDK, so that an SDK
// change that breaks them fails the build instead of an integrator.
package doccheck
