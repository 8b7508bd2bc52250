package autonode

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// readyGauge is 1 for a Cluster whose Karpenter runs, 0 for one that opted
// in (or is opting out) without it running; absent for the others.
var readyGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "karpenter_clusterapi_autonode_ready",
	Help: "1 when Karpenter runs for the Cluster, 0 while it opted in or is opting out and Karpenter does not run; the reason is the Cluster's condition " + ConditionType + ".",
}, []string{"namespace", "cluster"})

func init() { metrics.Registry.MustRegister(readyGauge) }

func setReady(namespace, name string, d Decision) {
	v := 0.0
	if d.Reason == ReasonRunning {
		v = 1
	}
	if d.Reason == ReasonDisabled {
		readyGauge.DeleteLabelValues(namespace, name)
		return
	}
	readyGauge.WithLabelValues(namespace, name).Set(v)
}
