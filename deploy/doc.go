// Package deploy holds lockgate's packaging: a docker compose quick start
// (compose/) and a kustomize base for the Kubernetes sidecar
// (kubernetes/base/); monitoring/ has the dashboard and alerts. It has no
// code: its Go test lints the manifests where no linter for them can be
// installed (no Docker engine, no cluster): the embedded lockgate
// configurations validate, the probes, ports and selectors agree with
// them and with each other.
package deploy
