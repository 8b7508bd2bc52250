package e2ecapa

import (
	"context"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	toolscache "k8s.io/client-go/tools/cache"
	infrav1 "sigs.k8s.io/cluster-api-provider-aws/v2/api/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// Machine mode makes each AWSMachine already owned by its Machine and
// labelled with its Cluster, as Cluster API's Machine controller would make
// it, so CAPA launches the instance without waiting for that controller
// (issue 45). The Machines here are paused (the NodeClass's metadata gives
// them Cluster API's paused annotation): the Machine controller never
// touches them, yet the instance is launched, the NodeClaim gets its
// providerID from the AWSMachine and its pod runs.
func TestMachineModeLaunchDoesNotWaitForTheMachineController(t *testing.T) {
	t.Parallel()
	const pool = "mowned"
	nodePool(t, pool, v1alpha1.ClusterAPINodeClassSpec{MachineTemplate: &v1alpha1.MachineTemplate{
		InfrastructureTemplates: v1alpha1.InfrastructureTemplates{
			APIGroup: infrav1.GroupVersion.Group, Kind: "AWSMachineTemplate",
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{"pool": pool}},
		},
		Bootstrap: v1alpha1.Bootstrap{DataSecretName: &w.BootstrapSecretName},
		Metadata: v1alpha1.MachineMetadata{
			Labels:      map[string]string{"pool": pool},
			Annotations: map[string]string{clusterv1.PausedAnnotation: ""},
		},
	}})
	memberTemplate(t, pool, pool+"-m5-large", "m5.large", capacityAnnotations("m5.large", map[string]string{v1alpha1.PriceAnnotation: "0.096"}), nil)
	// The Machines must be resumed before they go, or their deletion waits
	// for a controller that ignores them.
	t.Cleanup(func() { resumeMachines(t, pool) })

	d := app(t, pool, pool, 1, "1500m")
	v := waitView(t, 3*time.Minute, pool, pool, func(v view) bool {
		return v.RunningPods == 1 && len(v.Nodes) == 1 && len(v.Machines) == 1 && len(v.Instances) == 1
	})
	m := v.Machines[0]
	am := &infrav1.AWSMachine{}
	if err := w.Hub.Client.Get(context.Background(), client.ObjectKey{Namespace: m.Namespace, Name: m.Spec.InfrastructureRef.Name}, am); err != nil {
		t.Fatal(err)
	}
	if ref := metav1.GetControllerOf(am); ref == nil || ref.Kind != "Machine" || ref.Name != m.Name || ref.UID != m.UID || ref.APIVersion != clusterv1.GroupVersion.String() {
		t.Fatalf("AWSMachine %s is not controlled by Machine %s (%s): owners %+v", am.Name, m.Name, m.UID, am.OwnerReferences)
	}
	if am.Labels[clusterv1.ClusterNameLabel] != m.Spec.ClusterName {
		t.Fatalf("AWSMachine %s has no %s=%s label: %v", am.Name, clusterv1.ClusterNameLabel, m.Spec.ClusterName, am.Labels)
	}
	if m.Spec.ProviderID != "" {
		t.Fatalf("Machine %s is paused, yet Cluster API's Machine controller set its providerID: the scenario did not hold the controller off", m.Name)
	}
	resumeMachines(t, pool)
	scaleToZeroAndCheckNothingLeaks(t, d, pool)
}

// resumeMachines removes Cluster API's paused annotation from the pool's
// Machines.
func resumeMachines(t testing.TB, pool string) {
	t.Helper()
	ctx := context.Background()
	list := &clusterv1.MachineList{}
	if err := w.Hub.Client.List(ctx, list, client.InNamespace(w.Namespace), client.MatchingLabels{"pool": pool}); err != nil {
		t.Errorf("listing Machines: %v", err)
		return
	}
	for i := range list.Items {
		m := &list.Items[i]
		if _, paused := m.Annotations[clusterv1.PausedAnnotation]; !paused {
			continue
		}
		patch := client.MergeFrom(m.DeepCopy())
		delete(m.Annotations, clusterv1.PausedAnnotation)
		if err := w.Hub.Client.Patch(ctx, m, patch); err != nil {
			t.Errorf("resuming Machine %s: %v", m.Name, err)
		}
	}
}

// The time from a Machine's creation to CAPA's RunInstances of its
// instance, for a burst of Machine-mode launches: what the Machine
// controller's queue adds before CAPA starts (the figures of issue 45).
// A measurement (it asserts only that every launch happened): make
// test-capa, or E2E_CAPA_LAUNCH_BURST=<n>.
func TestMachineModeMachineToRunInstances(t *testing.T) {
	n := 10
	if v := os.Getenv("E2E_CAPA_LAUNCH_BURST"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("E2E_CAPA_LAUNCH_BURST=%q is not a positive number", v)
		}
	} else {
		fullSuite(t)
	}
	t.Parallel()
	const pool = "mlatency"
	machineModePool(t, pool)
	memberTemplate(t, pool, pool+"-m5-large", "m5.large", capacityAnnotations("m5.large", map[string]string{v1alpha1.PriceAnnotation: "0.096"}), nil)

	// When each Machine appeared, from a watch of the hub's own.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hub, err := cache.New(w.Hub.Config, cache.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	inf, err := hub.GetInformer(ctx, &clusterv1.Machine{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string]time.Time{} // Machine name -> first seen
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: func(o any) {
		if m, ok := o.(*clusterv1.Machine); ok && m.Labels["pool"] == pool {
			mu.Lock()
			if _, ok := seen[m.Name]; !ok {
				seen[m.Name] = time.Now()
			}
			mu.Unlock()
		}
	}}); err != nil {
		t.Fatal(err)
	}
	go func() { _ = hub.Start(ctx) }()
	hub.WaitForCacheSync(ctx)

	d := app(t, pool, pool, int32(n), "1500m")
	v := waitView(t, 5*time.Minute, pool, pool, func(v view) bool {
		return v.RunningPods == n && len(v.Instances) == n
	})
	launched := map[string]time.Time{} // instance ID -> RunInstances
	for _, in := range v.Instances {
		launched[in.ID] = in.LaunchTime
	}
	var delays []time.Duration
	for _, m := range v.Machines {
		am := &infrav1.AWSMachine{}
		if err := w.Hub.Client.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: m.Spec.InfrastructureRef.Name}, am); err != nil {
			t.Fatal(err)
		}
		id := ""
		if am.Spec.ProviderID != nil {
			id = (*am.Spec.ProviderID)[strings.LastIndex(*am.Spec.ProviderID, "/")+1:]
		}
		mu.Lock()
		created, ok := seen[m.Name]
		mu.Unlock()
		at, launchedOK := launched[id]
		if !ok || !launchedOK {
			t.Fatalf("Machine %s: seen %v, instance %q launched %v", m.Name, ok, id, launchedOK)
		}
		delays = append(delays, at.Sub(created))
	}
	sort.Slice(delays, func(i, j int) bool { return delays[i] < delays[j] })
	t.Logf("%d Machines: Machine created -> RunInstances: min %s, median %s, max %s",
		len(delays), delays[0].Round(time.Millisecond), delays[len(delays)/2].Round(time.Millisecond), delays[len(delays)-1].Round(time.Millisecond))
	scaleToZeroAndCheckNothingLeaks(t, d, pool)
}
