package manifests

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/controllers/nodeclass/status"
	"github.com/autonode/karpenter-clusterapi/test/environment"
)

// TestDocsNameEveryInstanceLabel keeps docs/instance-labels.md complete:
// every well-known label the provider registers is described there.
func TestDocsNameEveryInstanceLabel(t *testing.T) {
	doc := readText(t, filepath.Join(environment.RepoRoot(), "docs", "instance-labels.md"))
	labels := append(append([]string{v1alpha1.LabelCapacityReservationID}, v1alpha1.InstanceLabels...), v1alpha1.AWSInstanceLabels...)
	for _, l := range labels {
		if !mentions(doc, l) {
			t.Errorf("docs/instance-labels.md does not name %s", l)
		}
	}
}

// TestTroubleshootingExplainsEveryNodeClassReason: each reason the NodeClass
// status controller sets has an entry in docs/troubleshooting.md.
func TestTroubleshootingExplainsEveryNodeClassReason(t *testing.T) {
	doc := readText(t, filepath.Join(environment.RepoRoot(), "docs", "troubleshooting.md"))
	for _, reason := range []string{status.ReasonResolved, status.ReasonNothingSelected, status.ReasonResolutionFailed,
		status.ReasonPricesAnnotated, status.ReasonPricesEstimated, "UnhealthyDependents", "ReconcilingDependents", "AwaitingReconciliation"} {
		if !strings.Contains(doc, "**`"+reason+"`**") {
			t.Errorf("docs/troubleshooting.md has no entry **`%s`**", reason)
		}
	}
}
