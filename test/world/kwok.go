package world

import (
	"context"
	"fmt"
	"hash/fnv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// KWOKProviderIDPrefix starts the providerID of the Nodes Karpenter's own
// kwok provider (sigs.k8s.io/karpenter/kwok) creates. Those Nodes have no
// instance and no kubelet behind them: that provider expects the kwok
// controller to play their kubelet. In this world the simulated kubelet
// does, so that Karpenter with the kwok provider can run in the same world
// as this project's provider (the floor of the side-by-side bench): it
// posts Ready, removes the not-ready taint, renews the Lease and runs the
// Pods bound to them, exactly as for a simulated instance, but registers
// and deletes nothing (Karpenter creates and deletes kwok Nodes itself).
const KWOKProviderIDPrefix = "kwok://"

// isKWOKNode reports whether a Node was created by Karpenter's kwok provider.
func isKWOKNode(o client.Object) bool {
	n, ok := o.(*corev1.Node)
	return ok && strings.HasPrefix(n.Spec.ProviderID, KWOKProviderIDPrefix)
}

// simulatedNode reports whether the simulated kubelet plays this Node's
// kubelet: a simulated instance's Node, or a kwok Node.
func simulatedNode(o client.Object) bool {
	if _, ok := o.GetAnnotations()[InstanceIDAnnotation]; ok {
		return true
	}
	return isKWOKNode(o)
}

// kwokHostIP is a stable made-up address for a kwok Node (it has no instance).
func kwokHostIP(name string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(name))
	n := h.Sum32()
	return fmt.Sprintf("10.%d.%d.%d", 128+(n>>16)%64, (n>>8)%256, 1+n%254)
}

// reconcileKWOKNode keeps a kwok Node Ready, as the kwok controller would.
func (k *simKubelet) reconcileKWOKNode(ctx context.Context, node *corev1.Node) (reconcile.Result, error) {
	if !node.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil // Karpenter is draining it; its Pods finish in reconcilePod
	}
	ip := kwokHostIP(node.Name)
	arch := node.Labels[corev1.LabelArchStable]
	if arch == "" {
		arch = "amd64"
	}
	desired := node.Status.DeepCopy()
	desired.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: ip},
		{Type: corev1.NodeHostName, Address: node.Name},
	}
	desired.DaemonEndpoints = corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: 10250}}
	desired.NodeInfo = corev1.NodeSystemInfo{
		MachineID: node.Name, SystemUUID: node.Name, BootID: node.Name,
		KernelVersion: "6.1.0-simulated", OSImage: "Simulated Linux", ContainerRuntimeVersion: "containerd://2.0.0",
		KubeletVersion: KubeletVersion, OperatingSystem: "linux", Architecture: arch,
	}
	desired.Phase = ""
	desired.Conditions = readyConditions(node.Status.Conditions)
	if !equalJSON(desired, &node.Status) {
		patch := client.MergeFrom(node.DeepCopy())
		node.Status = *desired
		if err := client.IgnoreNotFound(k.client.Status().Patch(ctx, node, patch)); err != nil {
			return reconcile.Result{}, err
		}
	}
	if err := k.removeNotReadyTaint(ctx, node); err != nil {
		return reconcile.Result{}, err
	}
	if err := k.renewLease(ctx, node); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{RequeueAfter: NodeLeaseRenewInterval}, nil
}

// kwokPodHost returns the host address of a kwok Node that can run Pods.
func (k *simKubelet) kwokPodHost(ctx context.Context, nodeName string) (string, bool, error) {
	node := &corev1.Node{}
	if err := k.client.Get(ctx, client.ObjectKey{Name: nodeName}, node); err != nil {
		return "", false, client.IgnoreNotFound(err)
	}
	if !isKWOKNode(node) {
		return "", false, nil
	}
	return kwokHostIP(node.Name), true, nil
}

// readyConditions are a healthy kubelet's Node conditions, keeping the
// times of those that did not change (and the heartbeat while fresh).
func readyConditions(old []corev1.NodeCondition) []corev1.NodeCondition {
	return kubeletConditions(old, true)
}

// kubeletConditions are a kubelet's Node conditions, Ready or not (a
// kubelet whose network plugin has not started yet reports NotReady with
// the reason kubelets give), keeping the times of those that did not change
// (and the heartbeat while fresh).
func kubeletConditions(old []corev1.NodeCondition, ready bool) []corev1.NodeCondition {
	now := metav1.Now()
	readyStatus, readyReason, readyMessage := corev1.ConditionTrue, "KubeletReady", "kubelet is posting ready status"
	if !ready {
		readyStatus, readyReason = corev1.ConditionFalse, "KubeletNotReady"
		readyMessage = "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized"
	}
	stale := true
	for _, c := range old {
		if c.Type == corev1.NodeReady && c.Status == readyStatus && now.Sub(c.LastHeartbeatTime.Time) < NodeStatusReportInterval {
			stale = false
		}
	}
	var conds []corev1.NodeCondition
	for _, c := range []struct {
		t              corev1.NodeConditionType
		s              corev1.ConditionStatus
		reason, detail string
	}{
		{corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "kubelet has sufficient memory available"},
		{corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"},
		{corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "kubelet has sufficient PID available"},
		{corev1.NodeReady, readyStatus, readyReason, readyMessage},
	} {
		nc := corev1.NodeCondition{Type: c.t, Status: c.s, Reason: c.reason, Message: c.detail, LastHeartbeatTime: now, LastTransitionTime: now}
		for _, o := range old {
			if o.Type == c.t {
				if !stale {
					nc.LastHeartbeatTime = o.LastHeartbeatTime
				}
				if o.Status == c.s {
					nc.LastTransitionTime = o.LastTransitionTime
				}
			}
		}
		conds = append(conds, nc)
	}
	// Conditions others own (node-problem-detector, a test injecting a
	// fault) are kept, as the kubelet only updates its own.
	for _, c := range old {
		switch c.Type {
		case corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodePIDPressure, corev1.NodeReady:
		default:
			conds = append(conds, c)
		}
	}
	return conds
}
