// Package autonode runs Karpenter for Cluster API Clusters that ask for it
// (AutoNode): a controller in the management cluster that, for every
// Cluster labelled karpenter.cluster.x-k8s.io/autonode=enabled, deploys the
// provider beside the Cluster's control plane (topology (b) of
// docs/install.md), keeps it at the controller's version and the Cluster's
// settings, reports per Cluster whether it runs, and removes Karpenter's
// nodes in order before the provider when the Cluster opts out.
//
// The decisions are pure (Parse reads the knob, Desired builds the objects,
// Decide picks the step); the Reconciler only observes and acts. See
// docs/autonode.md.
package autonode
