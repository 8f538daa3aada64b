// Package chart tests the Helm chart (deployments/helm/gpu-dra-driver) with
// the real helm ($HELM; `make unit` passes the one hack/cluster builds):
// values.schema.json covers every value and refuses mistyped ones by path,
// every documented values combination (ci/*-values.yaml) passes
// `helm lint --strict` and `helm template`, and the chart's README.md, the
// reference of every value, is generated from values.yaml
// (`go test ./test/chart -update` rewrites it).
package chart
