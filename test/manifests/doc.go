// Package manifests tests what users apply: every file under examples/, every
// kustomize overlay under config/overlays and the Helm chart under charts/.
// Each is rendered and applied with server-side dry-run to real API servers
// that serve the kinds it uses: a management cluster (hub) with the Cluster
// API, kubeadm and CAPA CRDs, and a workload cluster (spoke) with the
// Karpenter and NodeClass CRDs.
package manifests
