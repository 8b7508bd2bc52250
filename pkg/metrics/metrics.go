// Package metrics defines the provider's Prometheus metrics, served with
// Karpenter core's on its metrics port.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

const namespace = "karpenter_clusterapi"

var (
	// LaunchReturnDelay is what the provider adds to a launch: from the
	// Machine or infrastructure machine event that carried the instance's
	// providerID to Create returning.
	LaunchReturnDelay = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: namespace,
		Name:      "launch_return_delay_seconds",
		Help:      "Time from the Machine or infrastructure machine event carrying the instance's providerID to Create returning the NodeClaim.",
		Buckets:   []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1},
	})
	// MachineDeploymentWriteBatch is how many NodeClaim or Machine changes one
	// MachineDeployment update carried.
	MachineDeploymentWriteBatch = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: namespace,
		Name:      "machinedeployment_write_batch_size",
		Help:      "Replica and bookkeeping changes carried by one MachineDeployment update.",
		Buckets:   prometheus.ExponentialBuckets(1, 2, 10),
	})
	// HubErrors counts failed requests to the management cluster by operation.
	HubErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace,
		Name:      "hub_errors_total",
		Help:      "Failed requests to the management cluster, by operation.",
	}, []string{"operation"})
	// UnownedMachines is, per member MachineDeployment, how many of its
	// Machines no NodeClaim owns once its MachineSet has settled: nodes
	// that keep Karpenter's unregistered taint and run no pod.
	UnownedMachines = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace,
		Name:      "machinedeployment_unowned_machines",
		Help:      "Machines of a member MachineDeployment that no NodeClaim owns (settled MachineSet): paid nodes that run no pod.",
	}, []string{"namespace", "machinedeployment"})
	// OrphansReleased counts replicas and Machines given back because their NodeClaim was gone.
	OrphansReleased = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace,
		Name:      "orphans_released_total",
		Help:      "MachineDeployment mode: replicas reserved for NodeClaims that went away given back with a Machine made for them (kind=replica), Machines whose NodeClaim went away released (kind=machine), released Machines deleted directly because their MachineSet kept them (kind=kept), and reservations of NodeClaims that went away taken by the next NodeClaim (kind=taken_over).",
	}, []string{"kind"})

	// OfferingPrice is the hourly price in use per offering, and whether it
	// is the resource-based estimate (estimated="true") or from an annotation.
	OfferingPrice = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace,
		Name:      "offering_price",
		Help:      "Hourly price in use per NodeClass offering; estimated=\"true\" when no price annotation gave it.",
	}, []string{"nodeclass", "instance_type", "zone", "capacity_type", "estimated"})

	// UnavailableOfferings is 1 for each offering left out of launches after
	// it reported insufficient capacity, until its TTL passes.
	UnavailableOfferings = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace,
		Name:      "offering_unavailable",
		Help:      "1 while an offering is left out of launches because it reported insufficient capacity (Machine mode).",
	}, []string{"instance_type", "zone", "capacity_type"})
	// MachineLaunchFailures counts standalone Machines removed because their launch failed.
	MachineLaunchFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace,
		Name:      "machine_launch_failures_total",
		Help:      "Standalone Machines (Machine mode) removed because their launch failed, by reason (insufficient_capacity, timeout, failed).",
	}, []string{"reason"})
	// NodeClaimsMachineGone counts NodeClaims deleted because their Machine
	// went before their Node registered.
	NodeClaimsMachineGone = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace,
		Name:      "nodeclaims_machine_gone_total",
		Help:      "Launched NodeClaims deleted because their Machine was deleted (by someone else: a scale-down, a MachineHealthCheck, a rollout) before their Node registered, so that Karpenter replaces them at once.",
	})
)

func init() {
	crmetrics.Registry.MustRegister(UnownedMachines, LaunchReturnDelay, MachineDeploymentWriteBatch, HubErrors, OrphansReleased, OfferingPrice, UnavailableOfferings, MachineLaunchFailures, NodeClaimsMachineGone)
}
