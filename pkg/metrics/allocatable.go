package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// AllocatableMismatches counts NodeClaims whose Node reported an allocatable
// more than 5% away from what the provider promised at launch, per instance
// type and resource (cpu, memory, pods) and direction (over: the Node has
// more, Karpenter planned too stingily; under: the Node has less, pods
// planned for it may not fit). Each NodeClaim counts once.
var AllocatableMismatches = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: namespace,
	Name:      "allocatable_mismatch_total",
	Help:      "NodeClaims whose Node's allocatable differs by more than 5% from what was promised at launch, by instance type, resource and direction (under: the Node has less).",
}, []string{"instance_type", "resource", "direction"})

func init() {
	crmetrics.Registry.MustRegister(AllocatableMismatches)
}
