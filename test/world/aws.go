package world

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	infrav1 "sigs.k8s.io/cluster-api-provider-aws/v2/api/v1beta2"
	clusterv1beta1 "sigs.k8s.io/cluster-api/api/core/v1beta1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// Instance is one simulated EC2 instance.
type Instance struct {
	ID           string
	Type         string
	Zone         string
	CapacityType string // CapacityTypeOnDemand, CapacityTypeSpot or CapacityTypeReserved
	// ReservationID is the capacity reservation it runs in.
	ReservationID string
	State         infrav1.InstanceState
	ProviderID    string
	PrivateIP     string
	// Hostname is the private DNS name, also the Node's name.
	Hostname   string
	LaunchTime time.Time
	// RunningAt is when the instance leaves "pending".
	RunningAt time.Time
	// Namespace, AWSMachine and Machine name the hub objects it belongs to;
	// ClusterName is the Machine's Cluster, whose workload cluster the
	// instance joins.
	Namespace, AWSMachine, Machine, ClusterName string
	// UserData is the bootstrap data Secret's "value" at launch.
	UserData []byte
	// Version is the Kubernetes version the instance's kubelet runs: the
	// Machine's spec.version (CAPA picks the AMI by it), else KubeletVersion.
	Version string
}

type offering struct{ instanceType, zone, capacityType string }

// NoCapacityStatusAnnotation on an AWSMachineTemplate makes SimAWS leave its
// status empty, as CAPA releases before status.capacity, or other
// infrastructure providers, do: its capacity then comes from annotations.
const NoCapacityStatusAnnotation = "world.test/no-capacity-status"

// SimAWS simulates EC2 for CAPA's AWSCluster, AWSMachine and
// AWSMachineTemplate objects of the hub. Its methods are goroutine-safe.
//
// Behaviour, modelled on CAPA v2.13's controllers:
//   - AWSCluster: kept status.ready=true with status.failureDomains = the zones.
//   - AWSMachineTemplate: an empty status gets capacity (cpu, memory) and
//     nodeInfo from InstanceTypes once the template has an owner Cluster.
//   - AWSMachine: waits for its owner Machine, the Cluster's infrastructure
//     and the Machine's bootstrap data secret; adds the finalizer; then "runs"
//     the instance: spec.providerID aws:///<zone>/i-<17 hex> and
//     spec.instanceID are set at once with instanceState "pending", and after
//     the provision delay the instance is "running": status.ready=true,
//     status.addresses, condition InstanceReady=True. Zone is the Machine's
//     spec.failureDomain, else the first zone.
//   - Launch errors are reported like CAPA reports a failed RunInstances: a
//     Warning event FailedCreate, condition InstanceReady=False reason
//     InstanceProvisionFailed severity Error with the EC2 message, and a
//     retry with backoff. CAPA sets no status.failureReason for them; with
//     SetCapacityErrorsTerminal(true) the simulator also sets
//     status.failureReason/failureMessage ("InsufficientInstanceCapacity"),
//     which CAPI copies to the Machine and which stops retries.
//   - Deletion terminates the instance, then removes the finalizer.
type SimAWS struct {
	zones  []string
	region string

	mu           sync.Mutex
	delay        time.Duration
	exhausted    map[offering]bool
	reservations map[string]capacityReservation
	terminalICE  bool
	byID         map[string]*Instance
	byAWSMachine map[types.UID]string
	byHostname   map[string]string
	nextIP       int
	listeners    []func(hostname string)
	recorder     record.EventRecorder
	client       client.Client
	reconcileAll chan event.GenericEvent
	// endpoints are the control plane endpoints of Clusters whose AWSCluster
	// has none yet (see SetControlPlaneEndpoint).
	endpoints map[types.NamespacedName]clusterv1beta1.APIEndpoint
	// failureDomains override the zones a Cluster's AWSCluster reports
	// (see SetFailureDomains).
	failureDomains map[types.NamespacedName][]string
}

func newSimAWS(zones []string, delay time.Duration) *SimAWS {
	return &SimAWS{
		zones:          zones,
		region:         regionOf(zones[0]),
		delay:          delay,
		exhausted:      map[offering]bool{},
		byID:           map[string]*Instance{},
		byAWSMachine:   map[types.UID]string{},
		byHostname:     map[string]string{},
		reconcileAll:   make(chan event.GenericEvent, 1024),
		endpoints:      map[types.NamespacedName]clusterv1beta1.APIEndpoint{},
		failureDomains: map[types.NamespacedName][]string{},
	}
}

// SetFailureDomains makes the AWSCluster of a Cluster report these zones as
// failure domains instead of all of Zones; an empty list reports none, like
// an infrastructure provider whose cluster spans no zones or has not
// reported them yet. Instances of that Cluster without a failure domain
// still run in the first zone. Call it before the Cluster is created.
func (a *SimAWS) SetFailureDomains(cluster types.NamespacedName, zones []string) {
	a.mu.Lock()
	a.failureDomains[cluster] = append([]string{}, zones...)
	a.mu.Unlock()
}

// zonesOf are the failure domains an AWSCluster reports.
func (a *SimAWS) zonesOf(c *infrav1.AWSCluster) []string {
	name := c.Labels[clusterv1.ClusterNameLabel]
	for _, ref := range c.OwnerReferences {
		if ref.Kind == "Cluster" && strings.HasPrefix(ref.APIVersion, clusterv1.GroupVersion.Group+"/") {
			name = ref.Name
		}
	}
	if name == "" {
		name = c.Name // the world names a Cluster's AWSCluster after it
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if zones, ok := a.failureDomains[types.NamespacedName{Namespace: c.Namespace, Name: name}]; ok {
		return zones
	}
	return a.zones
}

// SetControlPlaneEndpoint is the address of a Cluster's API server load
// balancer: an AWSCluster of that Cluster without spec.controlPlaneEndpoint
// gets it, as CAPA sets the endpoint from the load balancer it creates.
func (a *SimAWS) SetControlPlaneEndpoint(cluster types.NamespacedName, host string, port int32) {
	a.mu.Lock()
	a.endpoints[cluster] = clusterv1beta1.APIEndpoint{Host: host, Port: port}
	a.mu.Unlock()
	a.requeueAll()
}

func (a *SimAWS) endpointOf(c *infrav1.AWSCluster) (clusterv1beta1.APIEndpoint, bool) {
	name := c.Labels[clusterv1.ClusterNameLabel]
	for _, ref := range c.OwnerReferences {
		if ref.Kind == "Cluster" && strings.HasPrefix(ref.APIVersion, clusterv1.GroupVersion.Group+"/") {
			name = ref.Name
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.endpoints[types.NamespacedName{Namespace: c.Namespace, Name: name}]
	return e, ok
}

func regionOf(zone string) string {
	if zone == "" {
		return ""
	}
	last := zone[len(zone)-1]
	if last >= 'a' && last <= 'z' {
		return zone[:len(zone)-1]
	}
	return zone
}

// Zones returns the simulated availability zones.
func (a *SimAWS) Zones() []string { return append([]string(nil), a.zones...) }

// Region returns the region of the zones.
func (a *SimAWS) Region() string { return a.region }

// SetProvisionDelay sets how long instances launched from now on stay
// "pending" before they run.
func (a *SimAWS) SetProvisionDelay(d time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.delay = d
}

// SetInsufficientCapacity marks an offering as exhausted (or available
// again). Exhausted launches fail with InsufficientInstanceCapacity. Empty
// instanceType, zone or capacityType match any. Pending launches are retried
// at once when capacity changes.
func (a *SimAWS) SetInsufficientCapacity(instanceType, zone, capacityType string, exhausted bool) {
	a.mu.Lock()
	k := offering{instanceType, zone, capacityType}
	if exhausted {
		a.exhausted[k] = true
	} else {
		delete(a.exhausted, k)
	}
	a.mu.Unlock()
	a.requeueAll()
}

// SetCapacityErrorsTerminal makes capacity errors also set the AWSMachine's
// status.failureReason "InsufficientInstanceCapacity" and failureMessage
// (default false: CAPA only reports them in conditions and events and retries).
func (a *SimAWS) SetCapacityErrorsTerminal(terminal bool) {
	a.mu.Lock()
	a.terminalICE = terminal
	a.mu.Unlock()
	a.requeueAll()
}

// Instances returns the running instances, sorted by ID.
func (a *SimAWS) Instances() []Instance {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []Instance
	for _, in := range a.byID {
		if in.State == infrav1.InstanceStateRunning {
			out = append(out, *in)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Instance returns any instance ever launched (terminated ones included) by ID.
func (a *SimAWS) Instance(id string) (Instance, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	in, ok := a.byID[id]
	if !ok {
		return Instance{}, false
	}
	return *in, true
}

// TerminateInstance terminates a running instance behind CAPI's back, like a
// spot interruption or a console action: its Node goes away and the
// AWSMachine reports the instance terminated (as CAPA does: ready=false,
// instanceState terminated, failureReason UpdateError).
func (a *SimAWS) TerminateInstance(id string) error {
	a.mu.Lock()
	in, ok := a.byID[id]
	if !ok || in.State == infrav1.InstanceStateTerminated {
		a.mu.Unlock()
		return fmt.Errorf("instance %s is not running", id)
	}
	in.State = infrav1.InstanceStateTerminated
	host := in.Hostname
	a.mu.Unlock()
	a.notify(host)
	a.requeueAll()
	return nil
}

func (a *SimAWS) instanceByHostname(host string) (Instance, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	id, ok := a.byHostname[host]
	if !ok {
		return Instance{}, false
	}
	return *a.byID[id], true
}

func (a *SimAWS) onInstanceChange(f func(hostname string)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.listeners = append(a.listeners, f)
}

func (a *SimAWS) notify(hostname string) {
	a.mu.Lock()
	ls := append([]func(string){}, a.listeners...)
	a.mu.Unlock()
	for _, l := range ls {
		l(hostname)
	}
}

// requeueAll enqueues every AWSMachine, e.g. after a capacity change.
func (a *SimAWS) requeueAll() {
	if a.client == nil {
		return
	}
	go func() {
		list := &infrav1.AWSMachineList{}
		if err := a.client.List(context.Background(), list); err != nil {
			return
		}
		for i := range list.Items {
			select {
			case a.reconcileAll <- event.GenericEvent{Object: &list.Items[i]}:
			default: // the queue is full: the periodic retries will get there
			}
		}
	}()
}

func (a *SimAWS) isExhausted(o offering) bool {
	for k := range a.exhausted {
		if (k.instanceType == "" || k.instanceType == o.instanceType) &&
			(k.zone == "" || k.zone == o.zone) &&
			(k.capacityType == "" || k.capacityType == o.capacityType) {
			return true
		}
	}
	return false
}

func randomInstanceID() string {
	b := make([]byte, 9)
	_, _ = rand.Read(b)
	return "i-" + hex.EncodeToString(b)[:17]
}

// capacityTypeOf is spot when the AWSMachine asks for spot.
func capacityTypeOf(m *infrav1.AWSMachine) string {
	if m.Spec.SpotMarketOptions != nil || m.Spec.MarketType == infrav1.MarketTypeSpot {
		return CapacityTypeSpot
	}
	return CapacityTypeOnDemand
}

// setupWithManager registers the simulator's controllers in the hub manager.
func (a *SimAWS) setupWithManager(mgr ctrl.Manager) error {
	a.client = mgr.GetClient()
	a.recorder = mgr.GetEventRecorderFor("aws-simulator")
	if err := ctrl.NewControllerManagedBy(mgr).Named("sim-awscluster").
		For(&infrav1.AWSCluster{}).
		Complete(reconcile.Func(a.reconcileAWSCluster)); err != nil {
		return err
	}
	if err := ctrl.NewControllerManagedBy(mgr).Named("sim-awsmachinetemplate").
		For(&infrav1.AWSMachineTemplate{}).
		Complete(reconcile.Func(a.reconcileTemplate)); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).Named("sim-awsmachine").
		For(&infrav1.AWSMachine{}).
		Watches(&clusterv1.Machine{}, handler.EnqueueRequestsFromMapFunc(machineToAWSMachine)).
		Watches(&clusterv1.Cluster{}, handler.EnqueueRequestsFromMapFunc(a.clusterToAWSMachines)).
		WatchesRawSource(source.Channel(a.reconcileAll, &handler.EnqueueRequestForObject{})).
		// CAPA's --awsmachine-concurrency default: one worker made a burst
		// of hundreds wait minutes for instance IDs that EC2 hands out in
		// parallel (make bench-1000: 545 of 1 531 in 17 minutes).
		WithOptions(controller.Options{MaxConcurrentReconciles: capaAWSMachineConcurrency}).
		Complete(reconcile.Func(a.reconcileAWSMachine))
}

func machineToAWSMachine(_ context.Context, o client.Object) []reconcile.Request {
	m, ok := o.(*clusterv1.Machine)
	if !ok || m.Spec.InfrastructureRef.Kind != "AWSMachine" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: m.Namespace, Name: m.Spec.InfrastructureRef.Name}}}
}

func (a *SimAWS) clusterToAWSMachines(ctx context.Context, o client.Object) []reconcile.Request {
	list := &infrav1.AWSMachineList{}
	if err := a.client.List(ctx, list, client.InNamespace(o.GetNamespace()),
		client.MatchingLabels{clusterv1.ClusterNameLabel: o.GetName()}); err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for _, m := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&m)})
	}
	return out
}

func (a *SimAWS) reconcileAWSCluster(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	c := &infrav1.AWSCluster{}
	if err := a.client.Get(ctx, req.NamespacedName, c); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !c.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	if !c.Spec.ControlPlaneEndpoint.IsValid() {
		e, ok := a.endpointOf(c)
		if !ok {
			return reconcile.Result{RequeueAfter: time.Second}, nil // CAPA: no load balancer yet
		}
		patch := client.MergeFrom(c.DeepCopy())
		c.Spec.ControlPlaneEndpoint = e
		if err := a.client.Patch(ctx, c, patch); err != nil {
			return reconcile.Result{}, err
		}
	}
	original := c.DeepCopy()
	c.Status.Ready = true
	c.Status.FailureDomains = clusterv1beta1.FailureDomains{}
	for _, z := range a.zonesOf(c) {
		c.Status.FailureDomains[z] = clusterv1beta1.FailureDomainSpec{ControlPlane: true}
	}
	setV1Beta1Condition(&c.Status.Conditions, clusterv1beta1.Condition{Type: clusterv1beta1.ReadyCondition, Status: corev1.ConditionTrue})
	if equalJSON(original.Status, c.Status) {
		return reconcile.Result{}, nil
	}
	return reconcile.Result{}, a.client.Status().Patch(ctx, c, client.MergeFrom(original))
}

func (a *SimAWS) reconcileTemplate(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	t := &infrav1.AWSMachineTemplate{}
	if err := a.client.Get(ctx, req.NamespacedName, t); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if t.Annotations[NoCapacityStatusAnnotation] != "" {
		return reconcile.Result{}, nil // as a CAPA that does not fill status.capacity
	}
	if len(t.Status.Capacity) > 0 && t.Status.NodeInfo != nil && t.Status.NodeInfo.Architecture != "" && t.Status.NodeInfo.OperatingSystem != "" {
		return reconcile.Result{}, nil
	}
	hasCluster := false
	for _, ref := range t.OwnerReferences {
		if ref.Kind == "Cluster" && strings.HasPrefix(ref.APIVersion, clusterv1.GroupVersion.Group+"/") {
			hasCluster = true
		}
	}
	if !hasCluster {
		return reconcile.Result{}, nil // CAPA waits for the owner Cluster too
	}
	it, ok := InstanceTypes[t.Spec.Template.Spec.InstanceType]
	if !ok {
		a.recorder.Eventf(t, corev1.EventTypeWarning, "CapacityQueryFailed", "Failed to query capacity for instance type %q: no information found for instance type %q",
			t.Spec.Template.Spec.InstanceType, t.Spec.Template.Spec.InstanceType)
		return reconcile.Result{}, nil
	}
	original := t.DeepCopy()
	t.Status.Capacity = it.TemplateCapacity()
	t.Status.NodeInfo = it.NodeInfo()
	return reconcile.Result{}, a.client.Status().Patch(ctx, t, client.MergeFrom(original))
}

// launchError is a failed RunInstances: code and message as EC2 returns them.
type launchError struct {
	code, message string
	terminal      bool
}

func (e *launchError) Error() string { return e.code + ": " + e.message }

func (a *SimAWS) reconcileAWSMachine(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	am := &infrav1.AWSMachine{}
	if err := a.client.Get(ctx, req.NamespacedName, am); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !am.DeletionTimestamp.IsZero() {
		return a.reconcileDelete(ctx, am)
	}

	machine, err := a.ownerMachine(ctx, am)
	if err != nil || machine == nil {
		return reconcile.Result{}, err // wait for the Machine controller to set the owner reference
	}
	if am.Status.FailureReason != nil || am.Status.FailureMessage != nil {
		return reconcile.Result{}, nil // CAPA: "Error state detected, skipping reconciliation"
	}
	cluster := &clusterv1.Cluster{}
	if err := a.client.Get(ctx, client.ObjectKey{Namespace: am.Namespace, Name: machine.Spec.ClusterName}, cluster); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !ptr.Deref(cluster.Status.Initialization.InfrastructureProvisioned, false) {
		return reconcile.Result{}, a.patchStatus(ctx, am, func(s *infrav1.AWSMachineStatus) {
			markInstanceReady(s, corev1.ConditionFalse, infrav1.WaitingForClusterInfrastructureReason, clusterv1beta1.ConditionSeverityInfo, "")
		})
	}
	if machine.Spec.Bootstrap.DataSecretName == nil {
		return reconcile.Result{}, a.patchStatus(ctx, am, func(s *infrav1.AWSMachineStatus) {
			markInstanceReady(s, corev1.ConditionFalse, infrav1.WaitingForBootstrapDataReason, clusterv1beta1.ConditionSeverityInfo, "")
		})
	}

	a.mu.Lock()
	id, known := a.byAWSMachine[am.UID]
	a.mu.Unlock()

	if !known && ptr.Deref(am.Spec.ProviderID, "") != "" {
		// An instance this simulator never launched (e.g. the object was
		// copied from elsewhere): CAPA would fail to describe it.
		return reconcile.Result{}, a.patchStatus(ctx, am, func(s *infrav1.AWSMachineStatus) {
			markInstanceReady(s, corev1.ConditionUnknown, infrav1.InstanceNotFoundReason, clusterv1beta1.ConditionSeverityWarning,
				fmt.Sprintf("failed to find instance %q", ptr.Deref(am.Spec.ProviderID, "")))
		})
	}

	if controllerutil.AddFinalizer(am, infrav1.MachineFinalizer) {
		if err := a.client.Update(ctx, am); err != nil {
			return reconcile.Result{}, err
		}
	}

	if !known {
		in, err := a.launch(ctx, am, machine)
		if err != nil {
			var le *launchError
			if !errors.As(err, &le) {
				return reconcile.Result{}, err
			}
			msg := "failed to create AWSMachine instance: failed to run instance: " + le.Error()
			a.recorder.Eventf(am, corev1.EventTypeWarning, "FailedCreate", "Failed to create instance: failed to run instance: %s", le.Error())
			if perr := a.patchStatus(ctx, am, func(s *infrav1.AWSMachineStatus) {
				markInstanceReady(s, corev1.ConditionFalse, infrav1.InstanceProvisionFailedReason, clusterv1beta1.ConditionSeverityError, msg)
				if le.terminal {
					s.FailureReason = ptr.To(le.code)
					s.FailureMessage = ptr.To(le.message)
				}
			}); perr != nil {
				return reconcile.Result{}, perr
			}
			if le.terminal {
				return reconcile.Result{}, nil
			}
			return reconcile.Result{}, err // retried with backoff, like CAPA
		}
		id = in.ID
		a.recorder.Eventf(am, corev1.EventTypeNormal, "SuccessfulCreate", "Created new node instance with id %q", in.ID)
		patch := client.MergeFrom(am.DeepCopy())
		am.Spec.ProviderID = ptr.To(in.ProviderID)
		am.Spec.InstanceID = ptr.To(in.ID)
		if err := a.client.Patch(ctx, am, patch); err != nil {
			return reconcile.Result{}, err
		}
	}

	a.mu.Lock()
	in := a.byID[id]
	becameRunning := false
	if in.State == infrav1.InstanceStatePending && !time.Now().Before(in.RunningAt) {
		in.State = infrav1.InstanceStateRunning
		becameRunning = true
	}
	snapshot := *in
	a.mu.Unlock()
	if becameRunning {
		a.notify(snapshot.Hostname)
	}

	if ptr.Deref(am.Spec.ProviderID, "") != snapshot.ProviderID {
		patch := client.MergeFrom(am.DeepCopy())
		am.Spec.ProviderID = ptr.To(snapshot.ProviderID)
		am.Spec.InstanceID = ptr.To(snapshot.ID)
		if err := a.client.Patch(ctx, am, patch); err != nil {
			return reconcile.Result{}, err
		}
	}

	err = a.patchStatus(ctx, am, func(s *infrav1.AWSMachineStatus) {
		s.Interruptible = am.Spec.SpotMarketOptions != nil
		s.InstanceState = ptr.To(snapshot.State)
		switch snapshot.State {
		case infrav1.InstanceStatePending:
			s.Ready = false
			markInstanceReady(s, corev1.ConditionFalse, infrav1.InstanceNotReadyReason, clusterv1beta1.ConditionSeverityWarning, "")
		case infrav1.InstanceStateRunning:
			s.Ready = true
			s.Addresses = []clusterv1beta1.MachineAddress{
				{Type: clusterv1beta1.MachineInternalIP, Address: snapshot.PrivateIP},
				{Type: clusterv1beta1.MachineInternalDNS, Address: snapshot.Hostname},
			}
			markInstanceReady(s, corev1.ConditionTrue, "", "", "")
		case infrav1.InstanceStateTerminated:
			s.Ready = false
			markInstanceReady(s, corev1.ConditionFalse, infrav1.InstanceTerminatedReason, clusterv1beta1.ConditionSeverityError, "")
			s.FailureReason = ptr.To("UpdateError")
			s.FailureMessage = ptr.To(fmt.Sprintf("EC2 instance state %q is unexpected", snapshot.State))
		}
	})
	if err != nil {
		return reconcile.Result{}, err
	}
	if snapshot.State == infrav1.InstanceStatePending {
		return reconcile.Result{RequeueAfter: time.Until(snapshot.RunningAt) + 10*time.Millisecond}, nil
	}
	return reconcile.Result{}, nil
}

func (a *SimAWS) ownerMachine(ctx context.Context, am *infrav1.AWSMachine) (*clusterv1.Machine, error) {
	for _, ref := range am.OwnerReferences {
		if ref.Kind != "Machine" || !strings.HasPrefix(ref.APIVersion, clusterv1.GroupVersion.Group+"/") {
			continue
		}
		m := &clusterv1.Machine{}
		if err := a.client.Get(ctx, client.ObjectKey{Namespace: am.Namespace, Name: ref.Name}, m); err != nil {
			return nil, client.IgnoreNotFound(err)
		}
		return m, nil
	}
	return nil, nil
}

// launch is RunInstances: it checks the request and capacity and records a
// pending instance.
func (a *SimAWS) launch(ctx context.Context, am *infrav1.AWSMachine, machine *clusterv1.Machine) (*Instance, error) {
	if am.Spec.AMI.ID == nil && machine.Spec.Version == "" {
		// CAPA's own terminal error for this case.
		return nil, &launchError{code: "CreateError", message: "Either AWSMachine's spec.ami.id or Machine's spec.version must be defined", terminal: true}
	}
	if _, ok := InstanceTypes[am.Spec.InstanceType]; !ok {
		return nil, &launchError{code: "InvalidParameterValue", message: fmt.Sprintf("Invalid value '%s' for InstanceType.", am.Spec.InstanceType)}
	}
	zone := machine.Spec.FailureDomain
	if zone == "" {
		zone = a.zones[0]
	}
	validZone := false
	for _, z := range a.zones {
		validZone = validZone || z == zone
	}
	if !validZone {
		return nil, &launchError{code: "InvalidParameterValue", message: fmt.Sprintf("no subnet found in availability zone %q", zone)}
	}
	secret := &corev1.Secret{}
	if err := a.client.Get(ctx, client.ObjectKey{Namespace: am.Namespace, Name: *machine.Spec.Bootstrap.DataSecretName}, secret); err != nil {
		if apierrors.IsNotFound(err) {
			a.recorder.Eventf(am, corev1.EventTypeWarning, "FailedGetBootstrapData", "failed to retrieve bootstrap data secret %s: %v", *machine.Spec.Bootstrap.DataSecretName, err)
		}
		return nil, err
	}
	userData, ok := secret.Data["value"]
	if !ok {
		return nil, fmt.Errorf("bootstrap data secret %s has no key \"value\"", secret.Name)
	}
	o := offering{am.Spec.InstanceType, zone, capacityTypeOf(am)}

	a.mu.Lock()
	defer a.mu.Unlock()
	if a.isExhausted(o) {
		return nil, &launchError{
			code: "InsufficientInstanceCapacity",
			message: fmt.Sprintf("We currently do not have sufficient %s capacity in the Availability Zone you requested (%s). "+
				"Our system will be working on provisioning additional capacity. You can currently get %s capacity by not specifying an Availability Zone "+
				"in your request or choosing an Availability Zone other than %s.", o.instanceType, zone, o.instanceType, zone),
			terminal: a.terminalICE,
		}
	}
	reservationID, err := a.checkReservation(am, zone)
	if err != nil {
		return nil, err
	}
	if reservationID != "" {
		o.capacityType = CapacityTypeReserved
	}
	a.nextIP++
	zoneIdx := 0
	for i, z := range a.zones {
		if z == zone {
			zoneIdx = i
		}
	}
	ip := fmt.Sprintf("10.0.%d.%d", zoneIdx*64+a.nextIP/250, a.nextIP%250+4)
	now := time.Now()
	in := &Instance{
		ID:            randomInstanceID(),
		Type:          am.Spec.InstanceType,
		Zone:          zone,
		CapacityType:  o.capacityType,
		ReservationID: reservationID,
		State:         infrav1.InstanceStatePending,
		PrivateIP:     ip,
		Hostname:      "ip-" + strings.ReplaceAll(ip, ".", "-") + ".ec2.internal",
		LaunchTime:    now,
		RunningAt:     now.Add(a.delay),
		Namespace:     am.Namespace,
		AWSMachine:    am.Name,
		Machine:       machine.Name,
		ClusterName:   machine.Spec.ClusterName,
		UserData:      append([]byte(nil), userData...),
		Version:       machine.Spec.Version,
	}
	if in.Version == "" {
		in.Version = KubeletVersion
	}
	in.ProviderID = fmt.Sprintf("aws:///%s/%s", zone, in.ID)
	a.byID[in.ID] = in
	a.byAWSMachine[am.UID] = in.ID
	a.byHostname[in.Hostname] = in.ID
	return in, nil
}

func (a *SimAWS) reconcileDelete(ctx context.Context, am *infrav1.AWSMachine) (reconcile.Result, error) {
	a.mu.Lock()
	id, known := a.byAWSMachine[am.UID]
	var host string
	if known {
		in := a.byID[id]
		if in.State != infrav1.InstanceStateTerminated {
			in.State = infrav1.InstanceStateTerminated
			host = in.Hostname
		}
		delete(a.byAWSMachine, am.UID)
	}
	a.mu.Unlock()
	if host != "" {
		a.notify(host)
		a.recorder.Eventf(am, corev1.EventTypeNormal, "SuccessfulTerminate", "Terminated instance %q", id)
	}
	if controllerutil.RemoveFinalizer(am, infrav1.MachineFinalizer) {
		if err := a.client.Update(ctx, am); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
	}
	return reconcile.Result{}, nil
}

func (a *SimAWS) patchStatus(ctx context.Context, am *infrav1.AWSMachine, mutate func(*infrav1.AWSMachineStatus)) error {
	original := am.DeepCopy()
	mutate(&am.Status)
	setV1Beta1Condition(&am.Status.Conditions, summaryOf(am.Status.Conditions))
	if equalJSON(original.Status, am.Status) {
		return nil
	}
	return client.IgnoreNotFound(a.client.Status().Patch(ctx, am, client.MergeFrom(original)))
}

func markInstanceReady(s *infrav1.AWSMachineStatus, status corev1.ConditionStatus, reason string, severity clusterv1beta1.ConditionSeverity, message string) {
	setV1Beta1Condition(&s.Conditions, clusterv1beta1.Condition{
		Type: infrav1.InstanceReadyCondition, Status: status, Reason: reason, Severity: severity, Message: message,
	})
}

// summaryOf mirrors the InstanceReady condition into Ready, the summary
// condition CAPI reads from v1beta1-contract infrastructure machines.
func summaryOf(conds clusterv1beta1.Conditions) clusterv1beta1.Condition {
	for _, c := range conds {
		if c.Type == infrav1.InstanceReadyCondition {
			c.Type = clusterv1beta1.ReadyCondition
			return c
		}
	}
	return clusterv1beta1.Condition{Type: clusterv1beta1.ReadyCondition, Status: corev1.ConditionFalse, Severity: clusterv1beta1.ConditionSeverityInfo, Reason: "WaitingForInstance"}
}

// setV1Beta1Condition sets a condition, keeping lastTransitionTime when the
// status does not change.
func setV1Beta1Condition(conds *clusterv1beta1.Conditions, c clusterv1beta1.Condition) {
	for i := range *conds {
		old := &(*conds)[i]
		if old.Type != c.Type {
			continue
		}
		if old.Status == c.Status {
			c.LastTransitionTime = old.LastTransitionTime
		} else {
			c.LastTransitionTime = metav1.Now()
		}
		*old = c
		return
	}
	c.LastTransitionTime = metav1.Now()
	*conds = append(*conds, c)
}

func equalJSON(a, b any) bool {
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errA == nil && errB == nil && bytes.Equal(ja, jb)
}
