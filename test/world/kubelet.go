package world

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	infrav1 "sigs.k8s.io/cluster-api-provider-aws/v2/api/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

const (
	// InstanceIDAnnotation marks the Nodes the simulated kubelet registered.
	InstanceIDAnnotation = "world.test/instance-id"
	// KubeletVersion is what simulated Nodes report.
	KubeletVersion = "v1.36.3"
	// NodeLeaseRenewInterval is how often the simulated kubelet renews its
	// Lease in kube-node-lease (the real kubelet's default).
	NodeLeaseRenewInterval = 10 * time.Second
	// NodeStatusReportInterval is how often the simulated kubelet refreshes
	// the Ready condition's lastHeartbeatTime when nothing changed.
	NodeStatusReportInterval = time.Minute

	notReadyTaintKey = "node.kubernetes.io/not-ready"
	nodeLeaseNS      = "kube-node-lease"
)

// simKubelet plays the kubelet and the AWS cloud-controller-manager of every
// simulated instance of one Cluster's Machines against its spoke (instances
// of other Clusters are not its business):
//   - registers a Node when an instance runs (once: like a real kubelet it
//     does not re-register a Node someone deleted), with the cloud labels,
//     providerID, bootstrap taints and labels, capacity and allocatable;
//   - posts Ready (after Options.NodeReadyDelay of NotReady) and
//     heartbeats, renews the Node Lease, and removes the
//     node.kubernetes.io/not-ready taint TaintNodesByCondition admission adds;
//   - runs the Pods bound to its Nodes once their images are pulled
//     (Options.ImagePullDelay, once per image and Node) (Running, Ready,
//     podIP; a container
//     with a readiness or startup probe never becomes ready: a simulated
//     container serves nothing, so every probe a real kubelet would send it
//     fails, as against the pause image) and finishes
//     terminating ones as a kubelet does: a Pod stays Running and Ready while
//     its preStop hooks run, within its termination grace period, and is
//     deleted for good once its containers stopped (terminationDone);
//   - deletes the Node when the instance is terminated (the CCM's node
//     lifecycle controller);
//   - with JoinWithCSR (World.SetKubeletJoin), registers only once its
//     client certificate request was approved and signed, then asks for a
//     serving certificate (see csrjoin.go).
type simKubelet struct {
	aws     instanceSource
	cluster types.NamespacedName
	client  client.Client

	mu         sync.Mutex
	registered map[string]bool // Node names registered once
	// terminating is when the kubelet first saw each deleted Pod: its
	// termination (preStop hooks, grace period) starts then.
	terminating map[types.UID]time.Time
	nextPodIP   int
	events      chan event.GenericEvent
	// readyDelay is how long a Node reports NotReady after registering
	// (Options.NodeReadyDelay); nil: Ready at once.
	readyDelay func() time.Duration
	// pullDelay is how long a Node takes to pull an image it has not run
	// yet (Options.ImagePullDelay); nil: at once.
	pullDelay func() time.Duration
	// pulls are when each Node started pulling each image (node -> image
	// -> start), guarded by mu.
	pulls map[string]map[string]time.Time
	// join is how kubelets join (World.SetKubeletJoin); nil: JoinDirect.
	join func() JoinMode
	// holdJoin: JoinWithCSR kubelets wait before asking (World.HoldKubeletJoin).
	holdJoin func() bool
	// csrJoined are the Nodes registered after a JoinWithCSR bootstrap
	// (they ask for a serving certificate), guarded by mu.
	csrJoined map[string]bool
	// config is the spoke's admin config, impersonated to make requests
	// as a bootstrap token or a node.
	config   *rest.Config
	rbacDone atomic.Bool
}

// instanceSource is the cloud whose instances the simulated kubelet runs:
// SimAWS, or the simulated EC2 behind the real CAPA (ec2Instances).
type instanceSource interface {
	instanceByHostname(host string) (Instance, bool)
	onInstanceChange(func(hostname string))
}

func newSimKubelet(aws instanceSource, cluster types.NamespacedName) *simKubelet {
	k := &simKubelet{aws: aws, cluster: cluster, registered: map[string]bool{}, csrJoined: map[string]bool{}, terminating: map[types.UID]time.Time{}, events: make(chan event.GenericEvent, 4096)}
	aws.onInstanceChange(func(host string) {
		k.events <- event.GenericEvent{Object: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: host}}}
	})
	return k
}

// instance returns the instance named by a Node name (hostname) when it
// belongs to this kubelet's Cluster.
func (k *simKubelet) instance(host string) (Instance, bool) {
	in, ok := k.aws.instanceByHostname(host)
	if !ok || in.Namespace != k.cluster.Namespace || in.ClusterName != k.cluster.Name {
		return Instance{}, false
	}
	return in, true
}

func (k *simKubelet) setupWithManager(mgr ctrl.Manager) error {
	k.client = mgr.GetClient()
	k.config = mgr.GetConfig()
	if err := ctrl.NewControllerManagedBy(mgr).Named("sim-kubelet-node").
		For(&corev1.Node{}, builder.WithPredicates(predicate.NewPredicateFuncs(simulatedNode))).
		WatchesRawSource(source.Channel(k.events, &handler.EnqueueRequestForObject{})).
		// A JoinWithCSR kubelet waits for its client certificate.
		Watches(&certificatesv1.CertificateSigningRequest{}, handler.EnqueueRequestsFromMapFunc(csrToNode)).
		// Every Node has a kubelet of its own: its heartbeats do not queue
		// behind a thousand others'.
		WithOptions(controller.Options{MaxConcurrentReconciles: kubeletConcurrency}).
		Complete(reconcile.Func(k.reconcileNode)); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).Named("sim-kubelet-pod").
		For(&corev1.Pod{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			p, ok := o.(*corev1.Pod)
			return ok && p.Spec.NodeName != ""
		}))).
		// A Node becoming ours (or Ready) lets its Pods start.
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(k.nodeToPods)).
		WithOptions(controller.Options{MaxConcurrentReconciles: kubeletConcurrency}).
		Complete(reconcile.Func(k.reconcilePod))
}

func (k *simKubelet) nodeToPods(ctx context.Context, o client.Object) []reconcile.Request {
	if !simulatedNode(o) {
		return nil
	}
	pods := &corev1.PodList{}
	if err := k.client.List(ctx, pods); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range pods.Items {
		if pods.Items[i].Spec.NodeName == o.GetName() {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&pods.Items[i])})
		}
	}
	return out
}

func (k *simKubelet) reconcileNode(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	name := req.Name
	if in, ok := k.aws.instanceByHostname(name); ok && (in.Namespace != k.cluster.Namespace || in.ClusterName != k.cluster.Name) {
		return reconcile.Result{}, nil // another Cluster's kubelet registers it
	}
	in, known := k.instance(name)
	node := &corev1.Node{}
	err := k.client.Get(ctx, client.ObjectKey{Name: name}, node)
	if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	exists := err == nil
	if exists && !known && isKWOKNode(node) {
		return k.reconcileKWOKNode(ctx, node)
	}
	ours := exists && known && node.Annotations[InstanceIDAnnotation] == in.ID

	if !known || in.State == infrav1.InstanceStateTerminated {
		// The cloud-controller-manager deletes Nodes whose instance is gone.
		if exists && node.Annotations[InstanceIDAnnotation] != "" && (!known || ours) {
			if err := k.client.Delete(ctx, node, client.Preconditions{UID: &node.UID}); client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
				return reconcile.Result{}, err
			}
		}
		k.forgetPulls(name)
		lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: nodeLeaseNS, Name: name}}
		if err := k.client.Delete(ctx, lease); client.IgnoreNotFound(err) != nil {
			return reconcile.Result{}, err
		}
		return reconcile.Result{}, nil
	}
	if in.State != infrav1.InstanceStateRunning {
		return reconcile.Result{}, nil // still booting
	}
	boot, err := ParseBootstrapData(in.UserData)
	if err != nil {
		// A kubelet with broken configuration never registers.
		ctrl.LoggerFrom(ctx).Error(err, "simulated kubelet cannot start", "instance", in.ID)
		return reconcile.Result{}, nil
	}

	k.mu.Lock()
	registered := k.registered[name]
	k.mu.Unlock()
	if !exists {
		if registered {
			return reconcile.Result{}, nil // deleted after registration: a kubelet does not re-register
		}
		byCSR := k.join != nil && k.join() == JoinWithCSR
		if byCSR {
			issued, err := k.joinWithCSR(ctx, in, boot)
			if err == nil && !issued && k.holdJoin != nil && k.holdJoin() {
				return reconcile.Result{RequeueAfter: 200 * time.Millisecond}, nil // held: still booting
			}
			if err != nil || !issued {
				return reconcile.Result{}, err // the request's approval and certificate bring it back
			}
		}
		node = k.newNode(in, boot)
		if err := k.client.Create(ctx, node); err != nil && !apierrors.IsAlreadyExists(err) {
			return reconcile.Result{}, err
		}
		k.mu.Lock()
		k.registered[name] = true
		if byCSR {
			k.csrJoined[name] = true
		}
		k.mu.Unlock()
		// The Node create event brings us back to post its status.
		return reconcile.Result{}, nil
	}
	if !ours {
		return reconcile.Result{}, nil
	}
	k.mu.Lock()
	k.registered[name] = true
	csrJoined := k.csrJoined[name]
	k.mu.Unlock()
	if csrJoined {
		if err := k.requestServingCert(ctx, in); err != nil {
			return reconcile.Result{}, err
		}
	}

	// A real node reports NotReady for a while after registering, until
	// its network plugin runs; the API server's clock dates the Node.
	var notReadyFor time.Duration
	if k.readyDelay != nil {
		notReadyFor = k.readyDelay() - time.Since(node.CreationTimestamp.Time)
	}
	if err := k.postStatus(ctx, node, in, boot, notReadyFor <= 0); err != nil {
		return reconcile.Result{}, err
	}
	if err := k.removeNotReadyTaint(ctx, node); err != nil {
		return reconcile.Result{}, err
	}
	if err := k.renewLease(ctx, node); err != nil {
		return reconcile.Result{}, err
	}
	if notReadyFor > 0 && notReadyFor < NodeLeaseRenewInterval {
		return reconcile.Result{RequeueAfter: notReadyFor}, nil
	}
	return reconcile.Result{RequeueAfter: NodeLeaseRenewInterval}, nil
}

func (k *simKubelet) newNode(in Instance, boot BootstrapData) *corev1.Node {
	it := InstanceTypes[in.Type]
	labels := map[string]string{}
	for key, v := range boot.Labels {
		labels[key] = v
	}
	for key, v := range map[string]string{
		corev1.LabelHostname:           in.Hostname,
		corev1.LabelInstanceTypeStable: in.Type,
		corev1.LabelTopologyZone:       in.Zone,
		corev1.LabelTopologyRegion:     regionOf(in.Zone),
		corev1.LabelArchStable:         it.Arch,
		corev1.LabelOSStable:           "linux",
	} {
		labels[key] = v
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:   in.Hostname,
			Labels: labels,
			Annotations: map[string]string{
				InstanceIDAnnotation: in.ID,
				"volumes.kubernetes.io/controller-managed-attach-detach": "true",
			},
		},
		Spec: corev1.NodeSpec{ProviderID: in.ProviderID, Taints: append([]corev1.Taint(nil), boot.Taints...)},
	}
}

func (k *simKubelet) postStatus(ctx context.Context, node *corev1.Node, in Instance, boot BootstrapData, ready bool) error {
	it := InstanceTypes[in.Type]
	desired := node.Status.DeepCopy()
	desired.Capacity = NodeCapacity(it, boot.KubeletArgs)
	desired.Allocatable = NodeAllocatable(it, boot.KubeletArgs)
	desired.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: in.PrivateIP},
		{Type: corev1.NodeInternalDNS, Address: in.Hostname},
		{Type: corev1.NodeHostName, Address: in.Hostname},
	}
	desired.DaemonEndpoints = corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: 10250}}
	desired.NodeInfo = corev1.NodeSystemInfo{
		MachineID:               in.ID,
		SystemUUID:              in.ID,
		BootID:                  in.ID,
		KernelVersion:           "6.1.0-simulated",
		OSImage:                 "Simulated Linux",
		ContainerRuntimeVersion: "containerd://2.0.0",
		KubeletVersion:          in.Version,
		OperatingSystem:         "linux",
		Architecture:            it.Arch,
	}
	desired.Phase = ""
	desired.Conditions = kubeletConditions(node.Status.Conditions, ready)
	if equalJSON(desired, &node.Status) {
		return nil
	}
	// The optimistic lock keeps a condition someone adds meanwhile: the
	// conditions list is replaced as a whole.
	patch := client.MergeFromWithOptions(node.DeepCopy(), client.MergeFromWithOptimisticLock{})
	node.Status = *desired
	return client.IgnoreNotFound(k.client.Status().Patch(ctx, node, patch))
}

// removeNotReadyTaint does what the node lifecycle controller would do once
// the Node is Ready: TaintNodesByCondition admission put the taint on the new
// Node, and nothing else removes it in this world.
func (k *simKubelet) removeNotReadyTaint(ctx context.Context, node *corev1.Node) error {
	ready := false
	for _, c := range node.Status.Conditions {
		ready = ready || (c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue)
	}
	if !ready {
		return nil
	}
	var kept []corev1.Taint
	for _, t := range node.Spec.Taints {
		if t.Key != notReadyTaintKey {
			kept = append(kept, t)
		}
	}
	if len(kept) == len(node.Spec.Taints) {
		return nil
	}
	patch := client.MergeFromWithOptions(node.DeepCopy(), client.MergeFromWithOptimisticLock{})
	node.Spec.Taints = kept
	return client.IgnoreNotFound(k.client.Patch(ctx, node, patch))
}

func (k *simKubelet) renewLease(ctx context.Context, node *corev1.Node) error {
	now := metav1.NewMicroTime(time.Now())
	lease := &coordinationv1.Lease{}
	err := k.client.Get(ctx, client.ObjectKey{Namespace: nodeLeaseNS, Name: node.Name}, lease)
	if apierrors.IsNotFound(err) {
		lease = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: nodeLeaseNS, Name: node.Name,
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}},
			},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node.Name), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now},
		}
		return client.IgnoreAlreadyExists(k.client.Create(ctx, lease))
	}
	if err != nil {
		return err
	}
	lease.Spec.RenewTime = &now
	return k.client.Update(ctx, lease)
}

func (k *simKubelet) reconcilePod(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	pod := &corev1.Pod{}
	if err := k.client.Get(ctx, req.NamespacedName, pod); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if pod.Spec.NodeName == "" {
		return reconcile.Result{}, nil
	}
	hostIP, ok, err := k.podHost(ctx, pod.Spec.NodeName)
	if err != nil || !ok {
		return reconcile.Result{}, err // not our Node, or its kubelet is gone
	}
	if !pod.DeletionTimestamp.IsZero() {
		// The kubelet runs the preStop hooks, then stops the containers, and
		// deletes the Pod for good once they exited (see terminationDone).
		if wait := time.Until(terminationDone(pod, k.terminationStart(pod.UID))); wait > 0 {
			return reconcile.Result{RequeueAfter: wait}, nil
		}
		err := k.client.Delete(ctx, pod, client.GracePeriodSeconds(0), client.Preconditions{UID: &pod.UID})
		if err == nil || apierrors.IsNotFound(err) {
			k.mu.Lock()
			delete(k.terminating, pod.UID)
			k.mu.Unlock()
		}
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed || podStarted(pod) {
		return reconcile.Result{}, nil
	}
	if wait := k.pulling(pod); wait > 0 {
		return reconcile.Result{RequeueAfter: wait}, nil
	}
	now := metav1.Now()
	k.mu.Lock()
	k.nextPodIP++
	n := k.nextPodIP
	k.mu.Unlock()
	podIP := pod.Status.PodIP
	if podIP == "" {
		podIP = fmt.Sprintf("100.%d.%d.%d", 64+(n>>16)%64, (n>>8)%256, n%256)
	}
	if pod.Spec.HostNetwork {
		podIP = hostIP
	}
	st := pod.Status.DeepCopy()
	st.Phase = corev1.PodRunning
	st.HostIP = hostIP
	st.HostIPs = []corev1.HostIP{{IP: hostIP}}
	st.PodIP = podIP
	st.PodIPs = []corev1.PodIP{{IP: podIP}}
	if st.StartTime == nil {
		st.StartTime = &now
	}
	if st.QOSClass == "" {
		st.QOSClass = qosClass(pod)
	}
	ready := true
	for _, c := range pod.Spec.Containers {
		ready = ready && containerReady(c)
	}
	for _, t := range []corev1.PodConditionType{"PodReadyToStartContainers", corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady, corev1.PodScheduled} {
		c := corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now}
		if !ready && (t == corev1.ContainersReady || t == corev1.PodReady) {
			c.Status, c.Reason = corev1.ConditionFalse, "ContainersNotReady"
		}
		setPodCondition(st, c)
	}
	st.InitContainerStatuses = nil
	for _, c := range pod.Spec.InitContainers {
		st.InitContainerStatuses = append(st.InitContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: imageID(c.Image), ContainerID: containerID(), Ready: true,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: now, FinishedAt: now}},
		})
	}
	st.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		st.ContainerStatuses = append(st.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: imageID(c.Image), ContainerID: containerID(),
			Ready: containerReady(c), Started: ptr.To(c.StartupProbe == nil),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
	pod.Status = *st
	if err := k.client.Status().Update(ctx, pod); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return reconcile.Result{Requeue: !apierrors.IsNotFound(err)}, nil
		}
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, nil
}

// pulling returns how long the Pod's Node still pulls the Pod's images: a
// fresh node has none of them, and its kubelet starts a Pod's containers
// only once every image is there (the Pod is ContainerCreating meanwhile).
// An image is pulled once per Node, as a kubelet's image cache keeps it.
func (k *simKubelet) pulling(pod *corev1.Pod) time.Duration {
	if k.pullDelay == nil {
		return 0
	}
	delay := k.pullDelay()
	if delay <= 0 {
		return 0
	}
	now := time.Now()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.pulls == nil {
		k.pulls = map[string]map[string]time.Time{}
	}
	images := k.pulls[pod.Spec.NodeName]
	if images == nil {
		images = map[string]time.Time{}
		k.pulls[pod.Spec.NodeName] = images
	}
	var wait time.Duration
	for _, c := range append(append([]corev1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...) {
		started, ok := images[c.Image]
		if !ok {
			started = now
			images[c.Image] = now
		}
		if left := delay - now.Sub(started); left > wait {
			wait = left
		}
	}
	return wait
}

// forgetPulls drops a Node's image cache: a new instance under the same
// name starts with none.
func (k *simKubelet) forgetPulls(node string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.pulls, node)
}

// terminationStart is when the kubelet first saw the Pod deleted.
func (k *simKubelet) terminationStart(uid types.UID) time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	t, ok := k.terminating[uid]
	if !ok {
		t = time.Now()
		k.terminating[uid] = t
	}
	return t
}

// podHost returns the host address of the Node a Pod is bound to when this
// kubelet runs that Node's Pods: a running simulated instance's Node, or a
// kwok Node.
func (k *simKubelet) podHost(ctx context.Context, nodeName string) (string, bool, error) {
	in, known := k.instance(nodeName)
	if !known {
		if _, other := k.aws.instanceByHostname(nodeName); other {
			return "", false, nil // another Cluster's instance
		}
		return k.kwokPodHost(ctx, nodeName)
	}
	if in.State != infrav1.InstanceStateRunning {
		return "", false, nil
	}
	node := &corev1.Node{}
	if err := k.client.Get(ctx, client.ObjectKey{Name: nodeName}, node); err != nil {
		return "", false, client.IgnoreNotFound(err)
	}
	return in.PrivateIP, node.Annotations[InstanceIDAnnotation] == in.ID, nil
}

// containerReady tells whether a simulated container becomes ready: only
// without a readiness or startup probe, since it answers none.
func containerReady(c corev1.Container) bool {
	return c.ReadinessProbe == nil && c.StartupProbe == nil
}

// podStarted tells whether the kubelet started the Pod already: Running,
// with a status for each container and a Ready condition that says what the
// containers' probes allow.
func podStarted(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) != len(p.Spec.Containers) {
		return false
	}
	want := corev1.ConditionTrue
	for _, c := range p.Spec.Containers {
		if !containerReady(c) {
			want = corev1.ConditionFalse
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == want
		}
	}
	return false
}

func setPodCondition(st *corev1.PodStatus, c corev1.PodCondition) {
	for i := range st.Conditions {
		if st.Conditions[i].Type == c.Type {
			if st.Conditions[i].Status == c.Status {
				return
			}
			st.Conditions[i] = c
			return
		}
	}
	st.Conditions = append(st.Conditions, c)
}

func qosClass(p *corev1.Pod) corev1.PodQOSClass {
	requests, limits := false, true
	for _, c := range p.Spec.Containers {
		if len(c.Resources.Requests) > 0 || len(c.Resources.Limits) > 0 {
			requests = true
		}
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			l, ok := c.Resources.Limits[r]
			if !ok {
				limits = false
				continue
			}
			if q, ok := c.Resources.Requests[r]; ok && q.Cmp(l) != 0 {
				limits = false
			}
		}
	}
	switch {
	case !requests:
		return corev1.PodQOSBestEffort
	case limits:
		return corev1.PodQOSGuaranteed
	default:
		return corev1.PodQOSBurstable
	}
}

func imageID(image string) string {
	sum := sha256.Sum256([]byte(image))
	return "sha256:" + hex.EncodeToString(sum[:])
}

func containerID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return "containerd://" + hex.EncodeToString(b)
}
