// Package model tests MachineDeployment mode's binding protocol
// (docs/design/machinedeployment-binding.md) against a simulated world: a
// fake hub whose cache lags, Cluster API's MachineDeployment and MachineSet
// controllers (capi_test.go: several MachineSets during an OnDelete or
// RollingUpdate rollout; each creates Machines up to its replicas and
// deletes deleting, marked, then Node-less Machines first), an
// infrastructure that may fail launches, and Karpenter core calling Launch
// and Release. The provider's code is the
// real one; every write it makes is checked against the invariants as it
// happens.
package model

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/utils/ptr"
	infrav1 "sigs.k8s.io/cluster-api-provider-aws/v2/api/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpapis "sigs.k8s.io/karpenter/pkg/apis"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/capacity"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/hub/hubtest"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
	"github.com/autonode/karpenter-clusterapi/pkg/launch"
	"github.com/autonode/karpenter-clusterapi/pkg/machinedeployment"
)

const (
	ns      = "ns"
	cluster = "c1"
)

// claimState is what simulated Karpenter core knows of a NodeClaim.
type claimState struct {
	chosen   *types.NamespacedName
	launched bool
	deleting bool
	created  time.Time
}

// launchTimeout is Karpenter core's launch timeout in the model: a NodeClaim
// not launched this long after its creation is deleted (without a Delete
// call: it has no providerID), and core makes a new NodeClaim for its pods.
// Core's is 5 minutes; the model's MachineSets make Machines within seconds
// unless stalled, so the model's is shorter, to meet it as often as a burst
// of hundreds on one MachineDeployment does (docs/performance.md, "1 000
// nodes").
const launchTimeout = 45 * time.Second

// moveAfter is the provider's MoveAfter in the model: within launchTimeout.
const moveAfter = 15 * time.Second

// world is the simulation.
type world struct {
	t     testing.TB
	now   time.Time
	hub   *hubtest.Hub
	spoke client.Client
	// acting is true while the world (not the provider) writes: the
	// invariant checks look at the provider's writes only.
	acting atomic.Bool

	store       *instancetype.Store
	unavailable *launch.Unavailable
	provider    *machinedeployment.Provider
	controller  *machinedeployment.Controller

	claims    map[string]*claimState
	mds       []string
	exhausted map[string]bool      // MachineDeployment -> its launches fail
	stalled   map[string]bool      // MachineDeployment -> its MachineSet makes no Machines
	unsettled map[string]time.Time // MachineDeployment -> when its MachineSet last had fewer or more Machines than replicas
	userOwned map[string]bool      // Machines that existed before Karpenter (never bindable)
	seq       int
	// machinesMade counts the Machines the MachineSets made.
	machinesMade int
	// setSeq and templateSeq name the MachineSets Cluster API makes and the
	// infrastructure templates rollouts move to.
	setSeq, templateSeq int
	// removedRunning records the running, unmarked Machines of NodeClaims
	// not being deleted that a MachineSet removed (noteRemoval).
	removedRunning []string
	failures       []string
	synced         time.Time // when the cache last caught up
	// liveMachineLists counts the provider's lists of Machines from the
	// API server (the cache's do not pass the interceptor).
	liveMachineLists atomic.Int64
	// listing is set while the world itself lists Machines (checks).
	listing atomic.Int32
	// mdWrites counts the provider's writes of MachineDeployments.
	mdWrites atomic.Int64
	// trace, when set (MODEL_TRACE=1), is told of every MachineDeployment
	// write the provider makes.
	trace func(string)
	// mu guards failures and trace: the checks of a pass's bindings run
	// at once.
	mu sync.Mutex
}

// spokeScheme holds only the spoke's kinds: the fake client's field manager
// rebuilds a REST mapper of its whole scheme on every write, which with
// client-go's full scheme was 40 % of the model's CPU.
var spokeScheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(corev1.AddToScheme(s))
	gv := schema.GroupVersion{Group: karpapis.Group, Version: "v1"}
	metav1.AddToGroupVersion(s, gv)
	s.AddKnownTypes(gv, &karpv1.NodeClaim{}, &karpv1.NodeClaimList{}, &karpv1.NodePool{}, &karpv1.NodePoolList{})
	return s
}()

// newWorld builds a world with member MachineDeployments "cheap" and "dear"
// at the given replicas of someone else's (Machines with Nodes).
func newWorld(t testing.TB, replicas map[string]int32, mdAnnotations map[string]map[string]string, templateLabels map[string]string) *world {
	w := &world{t: t, now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), claims: map[string]*claimState{},
		exhausted: map[string]bool{}, stalled: map[string]bool{}, unsettled: map[string]time.Time{}, userOwned: map[string]bool{}}
	w.hub = hubtest.New(hub.Scope{Namespace: ns, ClusterName: cluster}, w.checks())
	w.hub.SetClock(w.clock)
	w.spoke = fake.NewClientBuilder().WithScheme(spokeScheme).Build()
	w.acting.Store(true)
	for i, name := range []string{"cheap", "dear"} {
		labels := map[string]string{clusterv1.ClusterNameLabel: cluster, v1alpha1.KarpenterMemberLabel: "", "pool": "general"}
		sel := map[string]string{clusterv1.ClusterNameLabel: cluster, clusterv1.MachineDeploymentNameLabel: name}
		tl := map[string]string{"node.kubernetes.io/instance-type": "t-" + name}
		for k, v := range sel {
			tl[k] = v
		}
		for k, v := range templateLabels {
			tl[k] = v
		}
		ann := map[string]string{capacity.CPUKey: "2", capacity.MemoryKey: "4Gi", v1alpha1.PriceAnnotation: fmt.Sprintf("0.%d", i+1)}
		for k, v := range mdAnnotations[name] {
			ann[k] = v
		}
		md := &clusterv1.MachineDeployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels, Annotations: ann, UID: types.UID("uid-" + name)},
			Spec: clusterv1.MachineDeploymentSpec{
				ClusterName: cluster, Replicas: ptr.To(replicas[name]),
				Selector: metav1.LabelSelector{MatchLabels: sel},
				Template: clusterv1.MachineTemplateSpec{ObjectMeta: clusterv1.ObjectMeta{Labels: tl},
					Spec: clusterv1.MachineSpec{ClusterName: cluster, FailureDomain: "zone-a",
						InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "AWSMachineTemplate", Name: name}}},
				Rollout: clusterv1.MachineDeploymentRolloutSpec{Strategy: rollingUpdate()},
			},
		}
		md.Annotations[clusterv1.RevisionAnnotation] = "1"
		w.must(w.hub.API.Create(context.Background(), md))
		ms := newMachineSet(md, name+"-ms", w.now.Add(-31*24*time.Hour), "1", replicas[name])
		ms.UID = types.UID("uid-ms-" + name)
		w.must(w.hub.API.Create(context.Background(), ms))
		w.mds = append(w.mds, name)
	}
	// Someone else's Machines, long running with Nodes.
	w.now = w.now.Add(-30 * 24 * time.Hour)
	w.runMachineSets()
	w.runInfrastructure()
	w.runInfrastructure()
	for _, m := range w.machines() {
		w.userOwned[m.Name] = true
		w.registerNode(context.Background(), m.Status.NodeRef.Name) // running someone's workloads
	}
	w.now = w.now.Add(30 * 24 * time.Hour)
	w.hub.Sync()
	w.acting.Store(false)
	w.restart()
	return w
}

func init() {
	// The provider's code logs through controller-runtime: silence it (a
	// model run logs millions of lines) rather than print its warning.
	ctrllog.SetLogger(logr.Discard())
}

func (w *world) must(err error) {
	w.t.Helper()
	if err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) clock() time.Time { return w.now }

// fired is a launch wait that is over at once: Launch looks once and
// returns (the world moves on between calls, not during one).
var fired = func() <-chan time.Time {
	ch := make(chan time.Time)
	close(ch)
	return ch
}()

// restart builds a provider and controller afresh, with no memory of the
// previous ones: all they know comes from the hub and the spoke. A new
// process's cache starts with a full list, so it shows every write the
// previous process made (it may lag behind later writes again).
func (w *world) restart() {
	w.hub.Sync()
	w.synced = w.now
	w.restartLagging()
}

// restartLagging restarts with a cache that still lags behind the previous
// process's last writes: the narrow window of a leader handover, which the
// scenarios of seeds_test.go need.
func (w *world) restartLagging() {
	w.store = instancetype.NewStore()
	w.unavailable = launch.NewUnavailable(time.Minute, nil)
	w.unavailable.SetClock(w.clock)
	w.provider = machinedeployment.NewProvider(w.hub.Hub, nil, w.store, w.unavailable)
	w.provider.SetClock(w.clock)
	w.provider.SetLaunchTimer(func(time.Duration) <-chan time.Time { return fired })
	// The model's time is its own: lowerings are not spaced in real time
	// (spacing only makes them ride together, which batches already do).
	w.provider.SetLowerSpacing(0)
	// Below the model's launch timeout, so that launches move off stalled
	// MachineSets as core's 5 minutes leave room for the provider's minute.
	w.provider.MoveAfter = moveAfter
	w.controller = machinedeployment.NewController(w.provider, w.spoke, w.spoke)
}

// reconcile runs the provider's controller on every MachineDeployment.
func (w *world) reconcile() {
	for _, md := range w.mds {
		_, err := w.controller.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: md}})
		if err != nil {
			w.t.Logf("reconcile %s: %v", md, err)
		}
	}
}

// newClaim creates a NodeClaim (as core does before Create).
func (w *world) newClaim() string {
	w.seq++
	name := fmt.Sprintf("nc-%d", w.seq)
	w.acting.Store(true)
	defer w.acting.Store(false)
	w.must(w.spoke.Create(context.Background(), &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(w.now),
		Finalizers: []string{karpv1.TerminationFinalizer}}}))
	w.claims[name] = &claimState{created: w.now}
	return name
}

// choose picks the cheapest available MachineDeployment, as the cloud
// provider's cheapest() does on the resolved set. With avoid set (a launch
// moving off a MachineSet that is behind) it picks the cheapest other one:
// the model's two MachineDeployments stand for two members of one offering
// there, so that moves meet every other actor.
func (w *world) choose(avoid *types.NamespacedName) (instancetype.Source, error) {
	if err := w.store.Prime(context.Background()); err != nil {
		return instancetype.Source{}, err
	}
	set := w.provider.WithUnavailable(w.store.Resolve(labelsEverything(), "all"))
	var best *instancetype.Source
	for _, srcs := range set.Origins {
		for i := range srcs {
			s := srcs[i]
			if s.Available && (avoid == nil || s.Origin != *avoid) && (best == nil || s.Price < best.Price) {
				best = &s
			}
		}
	}
	if best == nil {
		return instancetype.Source{}, cloudprovider.NewInsufficientCapacityError(errors.New("no offering available"))
	}
	return *best, nil
}

// create is core's Create of a pending NodeClaim.
func (w *world) create(name string) error {
	c := w.claims[name]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m, err := w.provider.Launch(ctx, name, c.chosen, func(md types.NamespacedName) { c.chosen = &md }, w.choose)
	switch {
	case err == nil:
		if m.Spec.ProviderID == "" {
			w.failf("Launch returned Machine %s without a providerID", m.Name)
		}
		c.launched = true
		w.setProviderID(name, m.Spec.ProviderID)
	case cloudprovider.IsInsufficientCapacityError(err):
		w.startDeleting(name) // core deletes the NodeClaim and re-plans
	}
	return err
}

// remove is core's termination: Delete until the Machine is gone.
func (w *world) remove(name string) error {
	lookup := hub.NewLookup(w.hub.Hub, nil)
	m, err := lookup.Find(context.Background(), name, nil, "")
	if err != nil {
		return err
	}
	err = w.provider.Release(context.Background(), name, m)
	if errors.Is(err, machinedeployment.ErrMachineGone) {
		w.acting.Store(true)
		defer w.acting.Store(false)
		w.gone(name)
		delete(w.claims, name)
		w.deleted(name)
		return nil
	}
	return err
}

// timeOut is core's launch timeout: the NodeClaim is deleted outright (its
// finalizer does not call Delete without a providerID).
func (w *world) timeOut(name string) {
	w.acting.Store(true)
	defer w.acting.Store(false)
	w.gone(name)
	delete(w.claims, name)
	w.deleted(name)
}

// deleted is the provider's NodeClaim watch reporting a deletion (begun:
// the deletionTimestamp set, or ended: the NodeClaim gone).
func (w *world) deleted(name string) {
	w.provider.NodeClaimDeleted(name)
}

func (w *world) failf(format string, args ...any) {
	w.mu.Lock() // a pass binds several Machines at once
	defer w.mu.Unlock()
	w.failures = append(w.failures, fmt.Sprintf(format, args...))
}

func (w *world) machines() []clusterv1.Machine {
	list := &clusterv1.MachineList{}
	w.listing.Add(1)
	defer w.listing.Add(-1)
	w.must(w.hub.API.List(context.Background(), list))
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	return list.Items
}

func (w *world) md(name string) *clusterv1.MachineDeployment {
	md := &clusterv1.MachineDeployment{}
	w.must(w.hub.API.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, md))
	return md
}

func owned(md *clusterv1.MachineDeployment) (int32, bool) {
	v, ok := md.Annotations[machinedeployment.OwnedReplicasAnnotation]
	n, err := strconv.Atoi(v)
	return int32(n), ok && err == nil
}

func bound(m *clusterv1.Machine) string { return m.Annotations[v1alpha1.NodeClaimAnnotation] }

func marked(m *clusterv1.Machine) bool {
	_, ok := m.Annotations[clusterv1.DeleteMachineAnnotation]
	return ok
}

// infraFailed reports whether the Machine's infrastructure machine failed.
func (w *world) infraFailed(m *clusterv1.Machine) bool {
	am := &infrav1.AWSMachine{}
	if err := w.hub.API.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: m.Name}, am); err != nil {
		return false
	}
	return am.Status.FailureReason != nil
}

// startDeleting is core deleting a NodeClaim: it is terminating (its
// finalizer holds it) until its Machine is gone.
func (w *world) startDeleting(name string) {
	c, ok := w.claims[name]
	if !ok || c.deleting {
		return
	}
	c.deleting = true
	w.acting.Store(true)
	w.must(client.IgnoreNotFound(w.spoke.Delete(context.Background(), &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: name}})))
	w.acting.Store(false)
	w.deleted(name) // the provider's NodeClaim watch sees the deletion begin
}

// gone is core's finalizer letting the NodeClaim go.
func (w *world) gone(name string) {
	ctx := context.Background()
	w.acting.Store(true)
	defer w.acting.Store(false)
	nc := &karpv1.NodeClaim{}
	if err := w.spoke.Get(ctx, types.NamespacedName{Name: name}, nc); err != nil {
		return
	}
	if nc.DeletionTimestamp.IsZero() {
		w.must(w.spoke.Delete(ctx, nc))
		if err := w.spoke.Get(ctx, types.NamespacedName{Name: name}, nc); err != nil {
			return
		}
	}
	nc.Finalizers = nil
	w.must(client.IgnoreNotFound(w.spoke.Update(ctx, nc)))
}

// setProviderID is core recording a launched NodeClaim's providerID.
func (w *world) setProviderID(name, id string) {
	ctx := context.Background()
	w.acting.Store(true)
	defer w.acting.Store(false)
	nc := &karpv1.NodeClaim{}
	if err := w.spoke.Get(ctx, types.NamespacedName{Name: name}, nc); err != nil {
		return
	}
	nc.Status.ProviderID = id
	w.must(w.spoke.Update(ctx, nc))
}
