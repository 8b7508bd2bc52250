// Package allocatable checks, once per NodeClaim, that the allocatable the
// provider promised at launch (NodeClaim status.allocatable, what Karpenter
// packed pods against) is what the Node's kubelet reports. A difference of
// more than 5% in cpu, memory or pods means the kubelet settings Karpenter
// planned with (bootstrap template, spec.kubelet, defaults) are not the
// node's: pods planned for the node may not fit (an extra node), or nodes
// are larger than needed. It is reported as a Warning event on the
// NodeClaim and the metric karpenter_clusterapi_allocatable_mismatch_total.
package allocatable

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	controllerruntime "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/metrics"
	"github.com/autonode/karpenter-clusterapi/pkg/spoke"
)

const (
	// Tolerance is the relative difference reported as a mismatch.
	Tolerance = 0.05
	// MismatchAnnotation on a NodeClaim records a reported mismatch, so that
	// it is reported once, also across restarts.
	MismatchAnnotation = v1alpha1.Group + "/allocatable-mismatch"
	// ReasonMismatch is the reason of the Warning event.
	ReasonMismatch = "AllocatableMismatch"
)

// Checked are the resources compared.
var Checked = []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourcePods}

// Controller compares promised and reported allocatable of NodeClaims.
type Controller struct {
	kubeClient client.Client
	recorder   record.EventRecorder

	mu sync.Mutex
	// checked remembers NodeClaims compared without a mismatch (a match is
	// not written anywhere: after a restart they are compared again, which
	// costs reads, not writes).
	checked map[string]types.UID
}

// NewController returns the controller; kubeClient is the workload cluster's.
func NewController(kubeClient client.Client) *Controller {
	return &Controller{kubeClient: kubeClient, checked: map[string]types.UID{}}
}

// Name of the controller.
func (c *Controller) Name() string { return "nodeclaim.allocatable" }

// Register watches the provider's initialized NodeClaims: by then the Node
// is Ready and its kubelet has posted its allocatable.
func (c *Controller) Register(_ context.Context, m manager.Manager) error {
	c.recorder = m.GetEventRecorderFor("karpenter-clusterapi") //nolint:staticcheck // the recorder core uses too
	return controllerruntime.NewControllerManagedBy(m).
		Named(c.Name()).
		For(&karpv1.NodeClaim{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			nc, ok := o.(*karpv1.NodeClaim)
			return ok && spoke.Ours(nc)
		}))).
		Complete(c)
}

// Reconcile compares one NodeClaim, once.
func (c *Controller) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	nc := &karpv1.NodeClaim{}
	if err := c.kubeClient.Get(ctx, req.NamespacedName, nc); err != nil {
		if client.IgnoreNotFound(err) == nil {
			c.forget(req.Name)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !nc.DeletionTimestamp.IsZero() || !spoke.Ours(nc) || !nc.StatusConditions().IsTrue(karpv1.ConditionTypeInitialized) || nc.Status.NodeName == "" {
		return reconcile.Result{}, nil
	}
	if _, done := nc.Annotations[MismatchAnnotation]; done || c.wasChecked(nc) {
		return reconcile.Result{}, nil
	}
	node := &corev1.Node{}
	if err := c.kubeClient.Get(ctx, types.NamespacedName{Name: nc.Status.NodeName}, node); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if len(node.Status.Allocatable) == 0 {
		return reconcile.Result{}, nil // not posted yet; its status update does not wake us, the NodeClaim's next will
	}
	mismatches := Compare(nc.Status.Allocatable, node.Status.Allocatable)
	if len(mismatches) == 0 {
		c.markChecked(nc)
		return reconcile.Result{}, nil
	}
	var parts []string
	for _, mm := range mismatches {
		parts = append(parts, mm.String())
	}
	summary := strings.Join(parts, ", ")
	patch := client.MergeFrom(nc.DeepCopy())
	if nc.Annotations == nil {
		nc.Annotations = map[string]string{}
	}
	nc.Annotations[MismatchAnnotation] = summary
	if err := c.kubeClient.Patch(ctx, nc, patch); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	// Remembered at once: a reconcile reading a cache that does not show the
	// annotation yet must not report it a second time.
	c.markChecked(nc)
	instanceType := nc.Labels[corev1.LabelInstanceTypeStable]
	for _, mm := range mismatches {
		metrics.AllocatableMismatches.WithLabelValues(instanceType, string(mm.Resource), mm.Direction()).Inc()
	}
	if c.recorder != nil {
		c.recorder.Event(nc, corev1.EventTypeWarning, ReasonMismatch, fmt.Sprintf(
			"Node %s reports allocatable %s, more than %.0f%% away from what was planned for instance type %s: its kubelet settings differ from the bootstrap template's or the NodeClass's spec.kubelet; fix them so Karpenter plans with the real allocatable",
			nc.Status.NodeName, summary, Tolerance*100, instanceType))
	}
	return reconcile.Result{}, nil
}

func (c *Controller) wasChecked(nc *karpv1.NodeClaim) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.checked[nc.Name] == nc.UID
}

func (c *Controller) markChecked(nc *karpv1.NodeClaim) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.checked[nc.Name] = nc.UID
}

func (c *Controller) forget(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.checked, name)
}

// Mismatch is one resource whose reported allocatable is off.
type Mismatch struct {
	Resource           corev1.ResourceName
	Promised, Reported resource.Quantity
}

// Direction is "under" when the Node has less than promised, else "over".
func (m Mismatch) Direction() string {
	if m.Reported.Cmp(m.Promised) < 0 {
		return "under"
	}
	return "over"
}

func (m Mismatch) String() string {
	return fmt.Sprintf("%s %s (planned %s, %+.1f%%)", m.Resource, m.Reported.String(), m.Promised.String(), 100*relative(m.Promised, m.Reported))
}

// Compare returns the checked resources whose reported allocatable differs
// from the promised by more than Tolerance (relative to the promise), in
// the order of Checked. Resources not promised are not compared.
func Compare(promised, reported corev1.ResourceList) []Mismatch {
	var out []Mismatch
	for _, name := range Checked {
		p, ok := promised[name]
		if !ok || p.IsZero() {
			continue
		}
		r := reported[name]
		if math.Abs(relative(p, r)) > Tolerance {
			out = append(out, Mismatch{Resource: name, Promised: p, Reported: r})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return indexOf(out[i].Resource) < indexOf(out[j].Resource) })
	return out
}

func relative(promised, reported resource.Quantity) float64 {
	p := promised.AsApproximateFloat64()
	if p == 0 {
		return 0
	}
	return (reported.AsApproximateFloat64() - p) / p
}

func indexOf(r corev1.ResourceName) int {
	for i, x := range Checked {
		if x == r {
			return i
		}
	}
	return len(Checked)
}
