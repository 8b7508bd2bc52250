package e2e

import (
	"context"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// A Machine-mode NodeClass bootstrapping from a KubeadmConfigTemplate (what
// CAPA's cluster templates give workers) registers each Node with its
// NodeClaim's labels: the Node's first write carries the NodePool's
// template labels, karpenter.sh/nodepool and the offering's instance type,
// zone and capacity type, as a cloud provider's user data does. A NodeClass
// with a shared bootstrap data Secret cannot, and its Node gets the labels
// only from Karpenter after registration: the same check fails there.
func TestMachineModeNodesRegisterWithTheNodeClaimsLabels(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := w.CreateKubeadmConfigTemplate(ctx, "labels-bootstrap", nil); err != nil {
		t.Fatal(err)
	}

	// Labels of each Node as its creation wrote them (the informer's first
	// event for it, started before any of these Nodes exists).
	var mu sync.Mutex
	created := map[string]map[string]string{} // providerID -> labels at creation
	nodes, err := cache.New(w.Spoke.Config, cache.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	inf, err := nodes.GetInformer(ctx, &corev1.Node{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: func(o any) {
		if n, ok := o.(*corev1.Node); ok {
			mu.Lock()
			defer mu.Unlock()
			created[n.Spec.ProviderID] = n.Labels
		}
	}}); err != nil {
		t.Fatal(err)
	}
	go func() { _ = nodes.Start(ctx) }()
	if !nodes.WaitForCacheSync(ctx) {
		t.Fatal("the Node cache did not sync")
	}

	kubeadm := "reglabels-kubeadm"
	machinePool(t, kubeadm, machinePoolOptions{Bootstrap: &v1alpha1.Bootstrap{ConfigRef: &v1alpha1.TemplateReference{
		APIGroup: bootstrapv1.GroupVersion.Group, Kind: "KubeadmConfigTemplate", Name: "labels-bootstrap",
	}}})
	secret := "reglabels-secret"
	machinePool(t, secret, machinePoolOptions{}) // the world's bootstrap data Secret
	for _, pool := range []string{kubeadm, secret} {
		memberTemplate(t, pool, pool+"-m5", "m5.large", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
		// Karpenter writes the NodePool's status meanwhile: read, change,
		// update, again on a conflict, as a user's kubectl edit does.
		if err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
			np := &karpv1.NodePool{}
			if err := w.Spoke.Client.Get(ctx, client.ObjectKey{Name: pool}, np); err != nil {
				return err
			}
			np.Spec.Template.Labels = map[string]string{"team": "blue"}
			return w.Spoke.Client.Update(ctx, np)
		}); err != nil {
			t.Fatalf("labelling NodePool %s: %v", pool, err)
		}
		workload(t, pool, pool+"-app", 1, "1500m", "", nil)
	}

	// What each NodeClaim's Node was created with.
	atCreation := func(pool string) (*karpv1.NodeClaim, map[string]string) {
		t.Helper()
		var nc *karpv1.NodeClaim
		var labels map[string]string
		err := WaitFor(ctx, 3*time.Minute, func(ctx context.Context) (bool, error) {
			list := &karpv1.NodeClaimList{}
			if err := w.Spoke.Client.List(ctx, list, client.MatchingLabels{karpv1.NodePoolLabelKey: pool}); err != nil {
				return false, err
			}
			for i := range list.Items {
				c := &list.Items[i]
				if !c.StatusConditions().IsTrue(karpv1.ConditionTypeRegistered) {
					continue
				}
				mu.Lock()
				l, ok := created[c.Status.ProviderID]
				mu.Unlock()
				if ok {
					nc, labels = c, l
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			t.Fatalf("NodePool %s: no registered NodeClaim with a Node: %v", pool, err)
		}
		return nc, labels
	}

	nc, labels := atCreation(kubeadm)
	want := map[string]string{
		"team":                         "blue",
		karpv1.NodePoolLabelKey:        kubeadm,
		corev1.LabelInstanceTypeStable: "m5.large",
		karpv1.CapacityTypeLabelKey:    karpv1.CapacityTypeOnDemand,
		corev1.LabelTopologyZone:       nc.Labels[corev1.LabelTopologyZone],
	}
	if want[corev1.LabelTopologyZone] == "" {
		t.Fatalf("NodeClaim %s has no zone label: %v", nc.Name, nc.Labels)
	}
	for k, v := range want {
		if labels[k] != v {
			t.Errorf("NodeClaim %s (KubeadmConfigTemplate): its Node was created with %s=%q, want %q (labels at creation: %v)", nc.Name, k, labels[k], v, labels)
		}
	}

	// The control: with a shared data Secret the Node is created without the
	// NodeClaim's labels, so the check above is not satisfied by Karpenter's
	// labelling after registration.
	nc, labels = atCreation(secret)
	if _, ok := labels["team"]; ok {
		t.Errorf("NodeClaim %s (data Secret): its Node was created with team=%q; the shared bootstrap data cannot carry it, so the check above cannot tell creation from Karpenter's later labelling", nc.Name, labels["team"])
	}
}
