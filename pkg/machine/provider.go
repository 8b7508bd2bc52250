package machine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/failpoint"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
	"github.com/autonode/karpenter-clusterapi/pkg/launch"
	"github.com/autonode/karpenter-clusterapi/pkg/metrics"
)

// DefaultLaunchWait bounds how long one Create call waits for a providerID
// before returning a retryable error; the launch it started goes on.
const DefaultLaunchWait = 2 * time.Minute

// DefaultLaunchTimeout is how long a Machine may go without a providerID
// before its offering is taken as unable to deliver (unless it waits behind
// other launches in the infrastructure's queue, see progress): the Machine
// is removed and Karpenter relaunches elsewhere.
const DefaultLaunchTimeout = 3 * time.Minute

// ErrMachineGone means the Machine is truly gone (a live read said so).
var ErrMachineGone = launch.ErrMachineGone

// ErrStillLaunching is returned when no providerID arrived within the wait.
var ErrStillLaunching = launch.ErrStillLaunching

// Provider implements Machine mode.
type Provider struct {
	hub         *hub.Hub
	machines    *hub.Lookup
	catalogue   *Catalogue
	unavailable *launch.Unavailable
	waiters     *hub.Waiters
	// launching holds the NodeClaims this process is launching right now:
	// the garbage collector leaves their objects alone.
	launching sync.Map
	// infraWatch makes infrastructure machine events wake waiters.
	infraWatch *launch.InfraWatch
	// progress tells a stalled offering from a queue at LaunchTimeout.
	progress *progress

	// LaunchWait bounds one Create call's wait for a providerID.
	LaunchWait time.Duration
	// LaunchTimeout bounds a Machine's time without a providerID.
	LaunchTimeout time.Duration
	// Events records events on Machines in the hub.
	Events record.EventRecorder
	now    func() time.Time
}

// NewProvider returns the Machine mode provider; it wakes launches on
// Machine events of the hub cache.
func NewProvider(ctx context.Context, h *hub.Hub, machines *hub.Lookup, catalogue *Catalogue) (*Provider, error) {
	p := &Provider{
		hub: h, machines: machines, catalogue: catalogue, unavailable: catalogue.unavailable,
		waiters:       hub.NewWaiters(),
		progress:      newProgress(),
		LaunchWait:    DefaultLaunchWait,
		LaunchTimeout: DefaultLaunchTimeout,
		Events:        h.GetEventRecorderFor("karpenter-clusterapi"), //nolint:staticcheck // the recorder core uses too
		now:           time.Now,
	}
	p.infraWatch = launch.NewInfraWatch(h, func(_ context.Context, o client.Object) string {
		return o.GetAnnotations()[v1alpha1.NodeClaimAnnotation] // Machine mode annotates what it creates
	}, p.waiters.Notify)
	informer, err := h.GetCache().GetInformer(ctx, &clusterv1.Machine{}, cache.BlockUntilSynced(false))
	if err != nil {
		return nil, fmt.Errorf("getting the Machine informer: %w", err)
	}
	if _, err := informer.AddEventHandler(p.wakeHandler()); err != nil {
		return nil, fmt.Errorf("watching Machines: %w", err)
	}
	return p, nil
}

// Catalogue returns the provider's instance-type catalogue.
func (p *Provider) Catalogue() *Catalogue { return p.catalogue }

// Launching reports whether this process is launching for the NodeClaim.
func (p *Provider) Launching(claim string) bool {
	_, ok := p.launching.Load(claim)
	return ok
}

// wakeHandler wakes the waiters of the NodeClaim an object was made for.
func (p *Provider) wakeHandler() toolscache.ResourceEventHandlerFuncs {
	wake := func(o any) {
		if tomb, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
			o = tomb.Obj
		}
		if obj, ok := o.(client.Object); ok {
			if claim := obj.GetAnnotations()[v1alpha1.NodeClaimAnnotation]; claim != "" {
				p.waiters.Notify(claim)
			}
		}
	}
	return toolscache.ResourceEventHandlerFuncs{AddFunc: wake, UpdateFunc: func(_, o any) { wake(o) }, DeleteFunc: wake}
}

// Launch makes sure a Machine exists for the NodeClaim and returns it once
// it has a providerID, with the Source it was launched from. It resumes what
// an earlier attempt (of this process or one before a restart) created:
// objects are named after the NodeClaim, so nothing is created twice.
// recorded is the offering an earlier attempt chose (from the NodeClaim),
// record is told a new choice before anything is created, and choose picks
// the offering when nothing was chosen yet.
//
// attempt numbers the launches of one call after failed ones (0 first):
// each attempt's objects have names of their own, so that a new attempt
// never resumes the objects of a failed one while Cluster API removes
// them. failed holds the names of the Machines of failed attempts.
func (p *Provider) Launch(ctx context.Context, nc *v1alpha1.ClusterAPINodeClass, claim string, claimLabels map[string]string, attempt int, failed map[string]bool, recorded *Offering,
	record func(Offering), choose func(*Resolved) (instancetype.Source, error)) (*clusterv1.Machine, error) {
	p.launching.Store(claim, true)
	defer p.launching.Delete(claim)

	m, err := p.machines.Bound(ctx, claim)
	if err != nil {
		return nil, err
	}
	if m != nil && failed[m.Name] {
		m = nil
	}
	if m == nil {
		if m, err = p.create(ctx, nc, claim, claimLabels, attempt, recorded, record, choose); err != nil {
			return nil, err
		}
	} else if err := p.resume(ctx, nc, claim, claimLabels, m); err != nil {
		return nil, err
	}
	return p.await(ctx, claim, m)
}

// attemptName is the name of an attempt's objects.
func attemptName(clusterName, claim string, attempt int) string {
	if attempt == 0 {
		return ObjectName(clusterName, claim)
	}
	return ObjectName(clusterName, fmt.Sprintf("%s-%d", claim, attempt))
}

// create creates the Machine, then its bootstrap config and infrastructure
// machine owned by it, each only when missing.
func (p *Provider) create(ctx context.Context, nc *v1alpha1.ClusterAPINodeClass, claim string, claimLabels map[string]string, attempt int, recorded *Offering,
	record func(Offering), choose func(*Resolved) (instancetype.Source, error)) (m *clusterv1.Machine, err error) {
	resolved, err := p.catalogue.Resolve(ctx, nc)
	if err != nil {
		return nil, err
	}
	src, offering, err := p.offering(ctx, resolved, claim, attempt, recorded, choose)
	if err != nil {
		return nil, err
	}
	reservation := ""
	if offering.CapacityType == karpv1.CapacityTypeReserved {
		// Take a slot before anything is made: concurrent launches of this
		// process never overfill a reservation.
		if !p.catalogue.reservations.Reserve(src.ReservationID, claim, src.ReservationCount) {
			return nil, cloudprovider.NewInsufficientCapacityError(fmt.Errorf("NodeClaim %s: capacity reservation %s of %s %s is full (%d instances)",
				claim, src.ReservationID, resolved.Template.Kind, offering.Template, src.ReservationCount))
		}
		reservation = src.ReservationID
		defer func() {
			if m == nil { // the Machine was not made: the slot is free again
				p.catalogue.reservations.Unreserve(reservation, claim)
			}
		}()
	}
	record(offering)

	c, err := NewClone(ctx, p.hub, nc, resolved.Template, src, offering, claim, attempt)
	if err != nil {
		return nil, err
	}
	c.ReservationID = reservation
	if err := p.infraWatch.Ensure(ctx, resolved.Template.GroupVersion().WithKind(machineKind(resolved.Template.Kind))); err != nil {
		return nil, err
	}
	// Everything is built before anything is written: an unusable template
	// fails the launch with nothing to clean up.
	ps, err := p.buildParts(ctx, nc, c, claimLabels)
	if err != nil {
		return nil, err
	}
	m = c.Machine(ps.bootstrap, ps.bootstrapTemplate)
	if owner, err := p.adoptingMachineSet(ctx, m); err != nil {
		return nil, err
	} else if owner != "" {
		msg := fmt.Sprintf("ClusterAPINodeClass %s: the Machine's labels (spec.machineTemplate.metadata.labels) match the selector of MachineSet %s, which would adopt it: remove those labels", nc.Name, owner)
		return nil, cloudprovider.NewCreateError(errors.New(msg), "MachineWouldBeAdopted", msg)
	}

	// 1. The Machine, first: its parts are created owned by it (parts.go).
	created, err := p.ensureMachine(ctx, m, claim)
	if err != nil {
		return nil, err
	}
	if !created {
		// An earlier attempt's Machine the cache did not show yet: its parts
		// are built from what it records, not from this call's choice.
		return m, p.resume(ctx, nc, claim, claimLabels, m)
	}
	failpoint.Crash(StepMachine)
	// 2. Its bootstrap config and infrastructure machine. On an error the
	// Machine stays (it holds its reservation slot): the next Create
	// resumes it.
	if err := p.ensureParts(ctx, m, ps, claim); err != nil {
		return m, err
	}
	if p.Events != nil {
		p.Events.Eventf(m, corev1.EventTypeNormal, "Launched", "Launched for NodeClaim %s: %s in %q (%s) from %s %s",
			claim, src.Name, offering.Zone, offering.CapacityType, resolved.Template.Kind, offering.Template.Name)
	}
	return m, nil
}

// ensureMachine creates the Machine unless the NodeClaim's Machine of that
// name exists, which it then reads into m; created says which.
func (p *Provider) ensureMachine(ctx context.Context, m *clusterv1.Machine, claim string) (created bool, err error) {
	err = p.hub.GetClient().Create(ctx, m)
	if err == nil {
		return true, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		metrics.HubErrors.WithLabelValues("create_machine").Inc()
		return false, fmt.Errorf("creating Machine %s/%s for NodeClaim %s: %w", m.Namespace, m.Name, claim, err)
	}
	if err := p.hub.GetAPIReader().Get(ctx, client.ObjectKeyFromObject(m), m); err != nil {
		return false, fmt.Errorf("reading Machine %s/%s: %w", m.Namespace, m.Name, err)
	}
	if m.Annotations[v1alpha1.NodeClaimAnnotation] != claim {
		return false, fmt.Errorf("Machine %s/%s exists and is not NodeClaim %s's: not touching it", m.Namespace, m.Name, claim)
	}
	return false, nil
}

// offering decides what to launch: the recorded choice, else what an
// interrupted earlier attempt already created, else a new choice.
func (p *Provider) offering(ctx context.Context, resolved *Resolved, claim string, attempt int, recorded *Offering,
	choose func(*Resolved) (instancetype.Source, error)) (instancetype.Source, Offering, error) {
	find := func(o Offering) (instancetype.Source, bool) {
		for _, list := range resolved.Set.Origins {
			for _, s := range list {
				if s.Origin == o.Template && s.Zone == o.Zone && s.CapacityType == o.CapacityType {
					return s, true
				}
			}
		}
		return instancetype.Source{}, false
	}
	if recorded != nil {
		if src, ok := find(*recorded); ok {
			return src, *recorded, nil
		}
	}
	src, err := choose(resolved)
	if err != nil {
		return instancetype.Source{}, Offering{}, err
	}
	// An infrastructure machine of an attempt that ended before its choice
	// was recorded (a crash) decides, so that the launch resumes.
	existing := &unstructured.Unstructured{}
	existing.SetGroupVersionKind(resolved.Template.GroupVersion().WithKind(machineKind(resolved.Template.Kind)))
	existingName := attemptName(src.ClusterName, claim, attempt)
	err = p.hub.GetAPIReader().Get(ctx, types.NamespacedName{Namespace: src.Origin.Namespace, Name: existingName}, existing)
	switch {
	case err == nil:
		if o, perr := ParseOffering(existing.GetAnnotations()[v1alpha1.OfferingAnnotation]); perr == nil && existing.GetAnnotations()[v1alpha1.NodeClaimAnnotation] == claim {
			if s, ok := find(o); ok {
				return s, o, nil
			}
		}
	case !apierrors.IsNotFound(err):
		return instancetype.Source{}, Offering{}, fmt.Errorf("reading %s %s/%s: %w", existing.GetKind(), src.Origin.Namespace, existingName, err)
	}
	return src, Offering{Template: src.Origin, Zone: src.Zone, CapacityType: src.CapacityType}, nil
}

// ensure creates obj unless an object of that name made for the same
// NodeClaim exists. It returns obj when this call created it.
func (p *Provider) ensure(ctx context.Context, obj *unstructured.Unstructured, claim string) (client.Object, error) {
	err := p.hub.GetClient().Create(ctx, obj)
	if err == nil {
		return obj, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		metrics.HubErrors.WithLabelValues("create_" + obj.GetKind()).Inc()
		return nil, fmt.Errorf("creating %s %s/%s for NodeClaim %s: %w", obj.GetKind(), obj.GetNamespace(), obj.GetName(), claim, err)
	}
	existing := &unstructured.Unstructured{}
	existing.SetGroupVersionKind(obj.GroupVersionKind())
	if err := p.hub.GetAPIReader().Get(ctx, client.ObjectKeyFromObject(obj), existing); err != nil {
		return nil, fmt.Errorf("reading %s %s/%s: %w", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
	}
	if existing.GetAnnotations()[v1alpha1.NodeClaimAnnotation] != claim {
		return nil, fmt.Errorf("%s %s/%s exists and was not made for NodeClaim %s: not touching it", obj.GetKind(), obj.GetNamespace(), obj.GetName(), claim)
	}
	return nil, nil
}

// adoptingMachineSet returns the MachineSet whose selector matches the
// Machine's labels (it would adopt the Machine), or "".
func (p *Provider) adoptingMachineSet(ctx context.Context, m *clusterv1.Machine) (string, error) {
	list := &clusterv1.MachineSetList{}
	if err := p.hub.GetCache().List(ctx, list, client.InNamespace(m.Namespace)); err != nil {
		return "", fmt.Errorf("listing MachineSets: %w", err)
	}
	for i := range list.Items {
		ms := &list.Items[i]
		if ms.Spec.ClusterName != m.Spec.ClusterName {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(&ms.Spec.Selector)
		if err != nil || sel.Empty() {
			continue
		}
		if sel.Matches(labels.Set(m.Labels)) {
			return ms.Name, nil
		}
	}
	return "", nil
}
