// Package validate holds only tests: they decode every object of the Kubernetes
// manifests under deploy/ strictly into the Go types of its API, so that an unknown
// or misspelt field fails. It is a module of its own (like cmd/sluice-bench): the API
// types are heavy, and users of the sluice library inherit none of them.
package validate
