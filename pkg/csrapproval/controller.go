package csrapproval

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	controllerruntime "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/metrics"
	"github.com/autonode/karpenter-clusterapi/pkg/spoke"
)

const (
	// indexNodeName indexes pending kubelet requests by the node they name.
	indexNodeName = "karpenter.cluster.x-k8s.io/csr-node-name"
	// nodeClaimProviderIDIndex is core's index of NodeClaims by providerID.
	nodeClaimProviderIDIndex = "status.providerID"
	// approvalReason is the reason of the Approved condition the approver sets.
	approvalReason = "KarpenterClusterAPIApprove"
	// recheck is how often a pending request of the provider's signers that
	// is not (yet) approvable is looked at again without an event, while
	// it is younger than recheckFor (a watch event missed during an outage).
	recheck    = 30 * time.Second
	recheckFor = 15 * time.Minute
)

// Machines finds the provider's Machines (hub.Lookup).
type Machines interface {
	ByHostname(ctx context.Context, name string) ([]*clusterv1.Machine, error)
	Find(ctx context.Context, claim string, machine *types.NamespacedName, providerID string) (*clusterv1.Machine, error)
	Owned(m *clusterv1.Machine) bool
}

// Controller approves the kubelet certificate requests Judge approves,
// watching CertificateSigningRequests, Nodes and NodeClaims in the workload
// cluster and Machines in the management cluster (a request that arrives
// before its Machine reports its address is decided when it does).
type Controller struct {
	kubeClient client.Client
	// apiReader reads the workload cluster live, where the cache may lag
	// behind the controller's own writes.
	apiReader client.Reader
	hub       *hub.Hub
	machines  Machines
	policy    Policy
	recorder  record.EventRecorder

	mu sync.Mutex
	// refused is the last refusal reason counted per request name, so that
	// each request counts (and is reported) once per reason.
	refused map[string]string
}

// NewController returns the approver; kubeClient is the workload cluster's
// cached client (with core's NodeClaim providerID index).
func NewController(kubeClient client.Client, apiReader client.Reader, h *hub.Hub, machines Machines, policy Policy) *Controller {
	return &Controller{kubeClient: kubeClient, apiReader: apiReader, hub: h, machines: machines, policy: policy, refused: map[string]string{}}
}

// Name of the controller.
func (c *Controller) Name() string { return "csr.approval" }

// Register indexes the pending kubelet requests by node name and watches
// what a decision depends on.
func (c *Controller) Register(ctx context.Context, m manager.Manager) error {
	c.recorder = m.GetEventRecorderFor("karpenter-clusterapi") //nolint:staticcheck // the recorder core uses too
	if err := IndexRequests(ctx, m.GetFieldIndexer()); err != nil {
		return err
	}
	return controllerruntime.NewControllerManagedBy(m).
		Named(c.Name()).
		For(&certificatesv1.CertificateSigningRequest{}, builder.WithPredicates(decidedOrPending())).
		// A request for a node wakes the other requests for it: one that
		// competes, or leaves, changes their decision.
		Watches(&certificatesv1.CertificateSigningRequest{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			csr, ok := o.(*certificatesv1.CertificateSigningRequest)
			if !ok || KindOf(csr.Spec.SignerName) != KindClient {
				return nil
			}
			if r := ReadRequest(csr); r.NodeName != "" {
				return c.requestsFor(ctx, r.canonicalNodeName())
			}
			return nil
		})).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return c.requestsFor(ctx, o.GetName())
		})).
		Watches(&karpv1.NodeClaim{}, handler.EnqueueRequestsFromMapFunc(c.nodeClaimToRequests)).
		WatchesRawSource(source.Kind(c.hub.GetCache(), client.Object(&clusterv1.Machine{}),
			handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
				return c.machineToRequests(ctx, o.(*clusterv1.Machine))
			}))).
		Complete(c)
}

// IndexRequests indexes the pending kubelet requests by the node they name,
// in canonical form: what the controller finds competing requests by.
func IndexRequests(ctx context.Context, indexer client.FieldIndexer) error {
	if err := indexer.IndexField(ctx, &certificatesv1.CertificateSigningRequest{}, indexNodeName, func(o client.Object) []string {
		csr := o.(*certificatesv1.CertificateSigningRequest)
		if !pending(csr) {
			return nil
		}
		if r := ReadRequest(csr); r.NodeName != "" {
			return []string{r.canonicalNodeName()}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("indexing CertificateSigningRequests by node name: %w", err)
	}
	return nil
}

// decidedOrPending passes the events of kubelet requests that are pending
// or were until this event (someone approved or denied them: their
// refusal is forgotten), and their deletion.
func decidedOrPending() predicate.Predicate {
	isPending := func(o client.Object) bool {
		csr, ok := o.(*certificatesv1.CertificateSigningRequest)
		return ok && pending(csr)
	}
	kubelet := func(o client.Object) bool {
		csr, ok := o.(*certificatesv1.CertificateSigningRequest)
		return ok && KindOf(csr.Spec.SignerName) != ""
	}
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return isPending(e.Object) },
		UpdateFunc:  func(e event.UpdateEvent) bool { return isPending(e.ObjectOld) || isPending(e.ObjectNew) },
		DeleteFunc:  func(e event.DeleteEvent) bool { return kubelet(e.Object) },
		GenericFunc: func(e event.GenericEvent) bool { return isPending(e.Object) },
	}
}

// pending: a request of a kubelet signer nobody decided on yet.
func pending(csr *certificatesv1.CertificateSigningRequest) bool {
	if KindOf(csr.Spec.SignerName) == "" || len(csr.Status.Certificate) > 0 {
		return false
	}
	for _, cond := range csr.Status.Conditions {
		switch cond.Type {
		case certificatesv1.CertificateApproved, certificatesv1.CertificateDenied, certificatesv1.CertificateFailed:
			return false
		}
	}
	return true
}

func (c *Controller) requestsFor(ctx context.Context, nodeName string) []reconcile.Request {
	if nodeName == "" {
		return nil
	}
	list := &certificatesv1.CertificateSigningRequestList{}
	if err := c.kubeClient.List(ctx, list, client.MatchingFields{indexNodeName: canonicalName(nodeName)}); err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: list.Items[i].Name}})
	}
	return out
}

func (c *Controller) machineToRequests(ctx context.Context, m *clusterv1.Machine) []reconcile.Request {
	var out []reconcile.Request
	for _, a := range m.Status.Addresses {
		if a.Type == clusterv1.MachineHostName || a.Type == clusterv1.MachineInternalDNS {
			out = append(out, c.requestsFor(ctx, a.Address)...)
		}
	}
	return out
}

// nodeClaimToRequests wakes the requests of a NodeClaim's node: by its
// Node's name once registered, else by its Machine's names.
func (c *Controller) nodeClaimToRequests(ctx context.Context, o client.Object) []reconcile.Request {
	nc, ok := o.(*karpv1.NodeClaim)
	if !ok || !spoke.Ours(nc) {
		return nil
	}
	if nc.Status.NodeName != "" {
		return c.requestsFor(ctx, nc.Status.NodeName)
	}
	key, ok := machineKey(nc)
	if !ok {
		return nil
	}
	m := &clusterv1.Machine{}
	if err := c.hub.GetCache().Get(ctx, key, m); err != nil {
		return nil
	}
	return c.machineToRequests(ctx, m)
}

// Reconcile decides on one request.
func (c *Controller) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	csr := &certificatesv1.CertificateSigningRequest{}
	if err := c.kubeClient.Get(ctx, req.NamespacedName, csr); err != nil {
		if apierrors.IsNotFound(err) {
			c.forget(req.Name)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !pending(csr) {
		c.forget(csr.Name)
		return reconcile.Result{}, nil
	}
	r := ReadRequest(csr)
	facts, err := c.facts(ctx, r)
	if err != nil {
		// On doubt, nothing: the request stays pending and is retried.
		return reconcile.Result{}, fmt.Errorf("CertificateSigningRequest %s: %w", csr.Name, err)
	}
	d := Judge(c.policy, r, facts)
	logger := log.FromContext(ctx).WithValues("CertificateSigningRequest", csr.Name, "signer", csr.Spec.SignerName, "node", r.NodeName)
	switch d.Verdict {
	case NotOurs:
		logger.V(1).Info("kubelet certificate request is not for a node of this provider: left alone")
		return c.recheck(csr), nil
	case Refuse:
		c.refuse(ctx, csr, d)
		return c.recheck(csr), nil
	}
	// The cache may not have seen an approval written a moment ago (this
	// controller's own, or anyone's): the approval is written on the
	// request as the API server has it, and a request decided meanwhile is
	// left alone, its record with it.
	live := &certificatesv1.CertificateSigningRequest{}
	if err := c.apiReader.Get(ctx, req.NamespacedName, live); err != nil {
		if apierrors.IsNotFound(err) {
			c.forget(req.Name)
		}
		return reconcile.Result{}, client.IgnoreNotFound(fmt.Errorf("reading CertificateSigningRequest %s: %w", csr.Name, err))
	}
	if !pending(live) || live.UID != csr.UID {
		c.forget(csr.Name)
		return reconcile.Result{}, nil
	}
	csr = live
	if d.Kind == KindClient {
		if err := c.recordClientApproval(ctx, d.NodeClaim, csr.Name); err != nil {
			return reconcile.Result{}, err
		}
	}
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue,
		Reason: approvalReason, Message: d.Message, LastUpdateTime: metav1.Now(),
	})
	if err := c.kubeClient.SubResource("approval").Update(ctx, csr); err != nil {
		err = fmt.Errorf("approving CertificateSigningRequest %s: %w", csr.Name, err)
		if d.Kind == KindClient {
			err = c.rollBackRecord(ctx, d.NodeClaim, csr, err)
		}
		return reconcile.Result{}, err
	}
	c.forget(csr.Name)
	metrics.KubeletCSRDecisions.WithLabelValues(d.Kind, "approved", ReasonApproved).Inc()
	logger.Info("approved kubelet certificate request", "kind", d.Kind, "NodeClaim", d.NodeClaim, "Machine", d.Machine)
	c.event(ctx, d.NodeClaim, corev1.EventTypeNormal, "KubeletCSRApproved", fmt.Sprintf("CertificateSigningRequest %s: %s", csr.Name, d.Message))
	return reconcile.Result{}, nil
}

// recheck requeues a young request that is not approvable yet.
func (c *Controller) recheck(csr *certificatesv1.CertificateSigningRequest) reconcile.Result {
	if time.Since(csr.CreationTimestamp.Time) < recheckFor {
		return reconcile.Result{RequeueAfter: recheck}
	}
	return reconcile.Result{}
}

// recordClientApproval writes, before the approval, which client request
// the NodeClaim gets: with the optimistic lock, two requests for one
// NodeClaim cannot both pass (the second sees the first's name). A failed
// approval removes it again (unrecordClientApproval); a record whose
// request is gone, denied or failed binds nothing (facts).
func (c *Controller) recordClientApproval(ctx context.Context, claim, csrName string) error {
	nc := &karpv1.NodeClaim{}
	if err := c.kubeClient.Get(ctx, types.NamespacedName{Name: claim}, nc); err != nil {
		return fmt.Errorf("reading NodeClaim %s: %w", claim, err)
	}
	switch recorded := nc.Annotations[v1alpha1.KubeletClientCSRAnnotation]; recorded {
	case csrName:
		return nil
	case "":
	default:
		// A record of a request that is gone, denied or failed is replaced.
		state, err := c.recordState(ctx, recorded)
		if err != nil {
			return err
		}
		if state != RecordVoid {
			return fmt.Errorf("NodeClaim %s had another client certificate request (%s) approved meanwhile", claim, recorded)
		}
	}
	patch := client.MergeFromWithOptions(nc.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if nc.Annotations == nil {
		nc.Annotations = map[string]string{}
	}
	nc.Annotations[v1alpha1.KubeletClientCSRAnnotation] = csrName
	if err := c.kubeClient.Patch(ctx, nc, patch); err != nil {
		return fmt.Errorf("recording client certificate request %s on NodeClaim %s: %w", csrName, claim, err)
	}
	return nil
}

// rollBackRecord undoes the record of a client approval that failed with
// err: the record must not outlive a failed approval, or the NodeClaim
// would refuse its kubelet's next request. An approval that failed to
// the client but holds on the API server (a timeout, a conflict with an
// approval already written) keeps its record; when the request cannot be
// read, the record stays (it binds nothing once the request is gone,
// denied or failed).
func (c *Controller) rollBackRecord(ctx context.Context, claim string, csr *certificatesv1.CertificateSigningRequest, err error) error {
	live := &certificatesv1.CertificateSigningRequest{}
	if getErr := c.apiReader.Get(ctx, client.ObjectKeyFromObject(csr), live); getErr != nil {
		if !apierrors.IsNotFound(getErr) {
			return fmt.Errorf("%w; reading it back: %w", err, getErr)
		}
	} else if live.UID == csr.UID && approvedCondition(live) {
		return err
	}
	if rbErr := c.unrecordClientApproval(ctx, claim, csr.Name); rbErr != nil {
		return fmt.Errorf("%w; %w", err, rbErr)
	}
	return err
}

// approvedCondition: the request carries Approved=True.
func approvedCondition(csr *certificatesv1.CertificateSigningRequest) bool {
	for _, cond := range csr.Status.Conditions {
		if cond.Type == certificatesv1.CertificateApproved && cond.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// unrecordClientApproval removes the record of csrName from the NodeClaim,
// if it is still that request's.
func (c *Controller) unrecordClientApproval(ctx context.Context, claim, csrName string) error {
	nc := &karpv1.NodeClaim{}
	if err := c.apiReader.Get(ctx, types.NamespacedName{Name: claim}, nc); err != nil {
		return client.IgnoreNotFound(fmt.Errorf("reading NodeClaim %s: %w", claim, err))
	}
	if nc.Annotations[v1alpha1.KubeletClientCSRAnnotation] != csrName {
		return nil
	}
	patch := client.MergeFromWithOptions(nc.DeepCopy(), client.MergeFromWithOptimisticLock{})
	delete(nc.Annotations, v1alpha1.KubeletClientCSRAnnotation)
	if err := c.kubeClient.Patch(ctx, nc, patch); err != nil {
		return fmt.Errorf("removing the record of client certificate request %s from NodeClaim %s: %w", csrName, claim, err)
	}
	return nil
}

// refuse reports a refusal once per request and reason: a log line, the
// metric and, when the NodeClaim is known, a Warning event on it. The
// request is left pending (not denied): a human or another approver may
// still decide.
func (c *Controller) refuse(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, d Decision) {
	c.mu.Lock()
	seen := c.refused[csr.Name] == d.Reason
	c.refused[csr.Name] = d.Reason
	c.mu.Unlock()
	if seen {
		return
	}
	metrics.KubeletCSRDecisions.WithLabelValues(d.Kind, "refused", d.Reason).Inc()
	log.FromContext(ctx).Info("not approving kubelet certificate request", "CertificateSigningRequest", csr.Name,
		"kind", d.Kind, "reason", d.Reason, "NodeClaim", d.NodeClaim, "Machine", d.Machine, "check", d.Message)
	c.event(ctx, d.NodeClaim, corev1.EventTypeWarning, "KubeletCSRNotApproved", fmt.Sprintf("CertificateSigningRequest %s not approved (%s): %s", csr.Name, d.Reason, d.Message))
}

func (c *Controller) forget(name string) {
	c.mu.Lock()
	delete(c.refused, name)
	c.mu.Unlock()
}

func (c *Controller) event(ctx context.Context, claim, eventType, reason, message string) {
	if claim == "" || c.recorder == nil {
		return
	}
	nc := &karpv1.NodeClaim{}
	if err := c.kubeClient.Get(ctx, types.NamespacedName{Name: claim}, nc); err != nil {
		return
	}
	c.recorder.Event(nc, eventType, reason, message)
}

// facts gathers what Judge needs about the node a request names. Errors
// are errors, never an empty answer.
func (c *Controller) facts(ctx context.Context, r Request) (Facts, error) {
	var f Facts
	if r.NodeName == "" {
		return f, nil
	}
	node := &corev1.Node{}
	switch err := c.kubeClient.Get(ctx, types.NamespacedName{Name: r.NodeName}, node); {
	case err == nil:
		f.NodeExists = true
	case !apierrors.IsNotFound(err):
		return f, fmt.Errorf("reading Node %s: %w", r.NodeName, err)
	}
	switch KindOf(r.SignerName) {
	case KindClient:
		return f, c.clientFacts(ctx, r, &f)
	case KindServing:
		return f, c.servingFacts(ctx, node, &f)
	}
	return f, nil
}

// clientFacts: the Machines reporting the name with their bootstrap and
// NodeClaim, the other pending requests for the name, and, with
// SubjectAccessReview, what the workload cluster authorizes.
func (c *Controller) clientFacts(ctx context.Context, r Request, f *Facts) error {
	if !f.NodeExists && r.canonicalNodeName() != r.NodeName {
		node := &corev1.Node{}
		switch err := c.kubeClient.Get(ctx, types.NamespacedName{Name: r.canonicalNodeName()}, node); {
		case err == nil:
			f.NodeExists = true
		case !apierrors.IsNotFound(err):
			return fmt.Errorf("reading Node %s: %w", r.canonicalNodeName(), err)
		}
	}
	machines, err := c.machines.ByHostname(ctx, r.canonicalNodeName())
	if err != nil {
		return err
	}
	for _, m := range machines {
		cand := Candidate{Machine: machineFacts(m), NodeClaimName: m.Annotations[v1alpha1.NodeClaimAnnotation]}
		if err := c.bootstrapFacts(ctx, m, &cand.Machine); err != nil {
			return err
		}
		if claim := cand.NodeClaimName; claim != "" {
			nc, err := c.nodeClaim(ctx, claim)
			if err != nil {
				return err
			}
			if nc != nil && nc.ApprovedClientCSR != "" && nc.ApprovedClientCSR != r.Name {
				if nc.ApprovedClientCSRState, err = c.recordState(ctx, nc.ApprovedClientCSR); err != nil {
					return err
				}
			}
			cand.NodeClaim = nc
		}
		f.Machines = append(f.Machines, cand)
	}
	if len(f.Machines) == 0 {
		return nil // not ours: nothing more to learn
	}
	list := &certificatesv1.CertificateSigningRequestList{}
	if err := c.kubeClient.List(ctx, list, client.MatchingFields{indexNodeName: r.canonicalNodeName()}); err != nil {
		return fmt.Errorf("listing the requests for node %s: %w", r.NodeName, err)
	}
	for i := range list.Items {
		o := &list.Items[i]
		if o.Name != r.Name && pending(o) && KindOf(o.Spec.SignerName) == KindClient {
			f.Others = append(f.Others, ReadRequest(o))
		}
	}
	if c.policy.SubjectAccessReview {
		f.Authorized = map[string]bool{}
		for _, q := range append([]Request{r}, f.Others...) {
			ok, err := c.authorizedNodeClient(ctx, q)
			if err != nil {
				return err
			}
			f.Authorized[q.Name] = ok
		}
	}
	return nil
}

// bootstrapFacts reads the bootstrap token of a Machine's KubeadmConfig.
// Other bootstrap configs, and data Secrets, give the approver nothing to
// bind a request to.
func (c *Controller) bootstrapFacts(ctx context.Context, m *clusterv1.Machine, out *Machine) error {
	ref := m.Spec.Bootstrap.ConfigRef
	if !ref.IsDefined() || ref.APIGroup != bootstrapv1.GroupVersion.Group || ref.Kind != "KubeadmConfig" {
		return nil
	}
	key := types.NamespacedName{Namespace: m.Namespace, Name: ref.Name}
	cfg := &bootstrapv1.KubeadmConfig{}
	// A live read: the token is read when a request needs it, and CABPK
	// replaces a token that expired before the node joined.
	if err := c.hub.GetAPIReader().Get(ctx, key, cfg); err != nil {
		if apierrors.IsNotFound(err) {
			out.BootstrapMissing = "KubeadmConfig " + key.String()
			return nil
		}
		return fmt.Errorf("reading KubeadmConfig %s of Machine %s/%s: %w", key, m.Namespace, m.Name, err)
	}
	out.BootstrapTokenID = TokenID(cfg.Spec.JoinConfiguration.Discovery.BootstrapToken.Token)
	return nil
}

// TokenID is the ID part of a bootstrap token "<id>.<secret>"; "" when the
// token is not of that form.
func TokenID(token string) string {
	id, secret, ok := strings.Cut(token, ".")
	if !ok || !tokenUser.MatchString(BootstrapTokenUserPrefix+id) || len(secret) != 16 {
		return ""
	}
	return id
}

// recordState reads the state of the client request a NodeClaim records.
func (c *Controller) recordState(ctx context.Context, name string) (RecordState, error) {
	csr := &certificatesv1.CertificateSigningRequest{}
	if err := c.kubeClient.Get(ctx, types.NamespacedName{Name: name}, csr); err != nil {
		if apierrors.IsNotFound(err) {
			return RecordVoid, nil
		}
		return "", fmt.Errorf("reading recorded CertificateSigningRequest %s: %w", name, err)
	}
	if pending(csr) {
		return RecordPending, nil
	}
	if approvedCondition(csr) {
		return RecordApproved, nil
	}
	return RecordVoid, nil
}

// authorizedNodeClient asks the workload cluster whether the requester of a
// request may create certificatesigningrequests/nodeclient: what
// kube-controller-manager's approver asks of a new node client certificate.
func (c *Controller) authorizedNodeClient(ctx context.Context, r Request) (bool, error) {
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range r.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: r.Username, UID: r.UID, Groups: r.Groups, Extra: extra,
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Group: certificatesv1.GroupName, Resource: "certificatesigningrequests", Subresource: "nodeclient", Verb: "create",
		},
	}}
	if err := c.kubeClient.Create(ctx, sar); err != nil {
		return false, fmt.Errorf("SubjectAccessReview for %q (CertificateSigningRequest %s): %w", r.Username, r.Name, err)
	}
	return sar.Status.Allowed, nil
}

// servingFacts: the NodeClaim of this provider whose providerID is the
// Node's, and the Machine that runs that very instance.
func (c *Controller) servingFacts(ctx context.Context, node *corev1.Node, f *Facts) error {
	if !f.NodeExists || node.Spec.ProviderID == "" {
		return nil
	}
	list := &karpv1.NodeClaimList{}
	if err := c.kubeClient.List(ctx, list, client.MatchingFields{nodeClaimProviderIDIndex: node.Spec.ProviderID}); err != nil {
		return fmt.Errorf("looking up the NodeClaim of Node %s: %w", node.Name, err)
	}
	for i := range list.Items {
		nc := &list.Items[i]
		if !spoke.Ours(nc) {
			continue
		}
		f.NodeClaim = nodeClaimFacts(nc)
		key, ok := machineKey(nc)
		var keyPtr *types.NamespacedName
		if ok {
			keyPtr = &key
		}
		m, err := c.machines.Find(ctx, nc.Name, keyPtr, node.Spec.ProviderID)
		if err != nil {
			return err
		}
		// Only a Machine of the provider's Cluster that runs this very
		// instance vouches for its addresses.
		if m != nil && c.machines.Owned(m) && m.Spec.ProviderID == node.Spec.ProviderID {
			mf := machineFacts(m)
			f.Machine = &mf
		}
		return nil
	}
	return nil
}

// nodeClaim reads a NodeClaim from the cache; nil when it does not exist.
func (c *Controller) nodeClaim(ctx context.Context, name string) (*NodeClaim, error) {
	nc := &karpv1.NodeClaim{}
	if err := c.kubeClient.Get(ctx, types.NamespacedName{Name: name}, nc); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading NodeClaim %s: %w", name, err)
	}
	return nodeClaimFacts(nc), nil
}

func nodeClaimFacts(nc *karpv1.NodeClaim) *NodeClaim {
	return &NodeClaim{
		Name:              nc.Name,
		Ours:              spoke.Ours(nc),
		Launched:          nc.Status.ProviderID != "",
		Registered:        nc.Status.NodeName != "" || nc.StatusConditions().IsTrue(karpv1.ConditionTypeRegistered),
		NodeName:          nc.Status.NodeName,
		Deleting:          !nc.DeletionTimestamp.IsZero(),
		ApprovedClientCSR: nc.Annotations[v1alpha1.KubeletClientCSRAnnotation],
	}
}

func machineFacts(m *clusterv1.Machine) Machine {
	_, marked := m.Annotations[clusterv1.DeleteMachineAnnotation]
	return Machine{
		Key:       m.Namespace + "/" + m.Name,
		Addresses: append(clusterv1.MachineAddresses(nil), m.Status.Addresses...),
		Deleting:  marked || !m.DeletionTimestamp.IsZero(),
		Created:   m.CreationTimestamp.Time,
	}
}

// machineKey reads the Machine recorded on the NodeClaim at launch.
func machineKey(nc *karpv1.NodeClaim) (types.NamespacedName, bool) {
	ns, name, ok := v1alpha1.MachineRef(nc.Annotations)
	if !ok {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: ns, Name: name}, true
}
