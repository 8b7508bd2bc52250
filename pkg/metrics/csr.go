package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// KubeletCSRDecisions counts the kubelet certificate requests the approver
// (--approve-kubelet-csrs) approved or refused, by kind (client, serving),
// decision (approved, refused) and reason (Approved, or the check that
// failed). A request counts once per decision and reason; requests of
// nodes that are not the provider's are not counted.
var KubeletCSRDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: namespace,
	Name:      "kubelet_csr_decisions_total",
	Help:      "Kubelet certificate signing requests approved or refused by the provider, by kind (client, serving), decision (approved, refused) and reason (the check that failed).",
}, []string{"kind", "decision", "reason"})

func init() {
	crmetrics.Registry.MustRegister(KubeletCSRDecisions)
}
