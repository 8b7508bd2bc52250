// Package csrapproval approves the certificate signing requests of the
// kubelets of this provider's nodes, and nothing else.
//
// Clusters whose kubelets join with a bootstrap identity that kubeadm's
// RBAC does not approve (OpenShift-style bootstrappers, a node-bootstrapper
// service account), and every cluster with serverTLSBootstrap, leave the
// kubelets' requests pending until something approves them. The provider
// knows each node before it joins: the Machine it launched, the addresses
// Cluster API reports for it, its NodeClaim and whether that registered.
//
// Judge is the whole decision, a pure function of the request and those
// facts; the Controller gathers the facts and acts on the decision:
//   - a client request (kubernetes.io/kube-apiserver-client-kubelet) for
//     system:node:<name>, asked by a bootstrap identity, is approved when
//     exactly one Machine of this provider reports <name> as its hostname
//     or internal DNS name, and that Machine's NodeClaim is launched, not
//     registered, has no Node, and had no other client request approved;
//   - a serving request (kubernetes.io/kubelet-serving) asked by
//     system:node:<name> is approved when Node <name> belongs to a NodeClaim
//     of this provider and each DNS name and IP it asks for is among the
//     addresses of that NodeClaim's Machine;
//   - both only when the request is what the Kubernetes signers accept
//     (subject, usages, key type, signature).
//
// A request for a name that is not this provider's node is not ours:
// another approver may own it, and it is left alone. A request for one of
// its nodes that fails a check is refused: never approved, never denied
// (a human or another approver may still decide), with an event on the
// NodeClaim and a log line naming the check.
package csrapproval

import (
	"fmt"
	"slices"

	certificatesv1 "k8s.io/api/certificates/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// Verdict is what to do with a request.
type Verdict string

const (
	// Approve the request.
	Approve Verdict = "approve"
	// Refuse: the request names one of this provider's nodes (or is a
	// kubelet request that cannot be read) and fails a check.
	Refuse Verdict = "refuse"
	// NotOurs: leave it to whoever owns it.
	NotOurs Verdict = "not-ours"
)

// Reasons of a decision: the metric's reason label and the event's reason.
const (
	ReasonApproved             = "Approved"
	ReasonMalformed            = "Malformed"
	ReasonSubject              = "Subject"
	ReasonIdentity             = "Identity"
	ReasonUsages               = "Usages"
	ReasonKeyType              = "KeyType"
	ReasonSignature            = "Signature"
	ReasonAmbiguousName        = "AmbiguousName"
	ReasonMachineDeleting      = "MachineDeleting"
	ReasonMachineNotFound      = "MachineNotFound"
	ReasonMachineNotBound      = "MachineNotBound"
	ReasonNodeClaimNotFound    = "NodeClaimNotFound"
	ReasonNodeClaimNotOurs     = "NodeClaimNotOurs"
	ReasonNodeClaimDeleting    = "NodeClaimDeleting"
	ReasonNotLaunched          = "NotLaunched"
	ReasonAlreadyRegistered    = "AlreadyRegistered"
	ReasonAlreadyApproved      = "ClientAlreadyApproved"
	ReasonAddressNotOnMachine  = "AddressNotOnMachine"
	ReasonNotTheNodeClaimsNode = "NotTheNodeClaimsNode"
)

// Kinds of request.
const (
	KindClient  = "client"
	KindServing = "serving"
)

// Decision is Judge's answer.
type Decision struct {
	Verdict Verdict
	// Kind is KindClient or KindServing; empty for a request of another signer.
	Kind string
	// Reason is one of the Reason constants (empty for NotOurs).
	Reason string
	// Message says what was checked, naming the node, Machine and NodeClaim.
	Message string
	// NodeClaim and Machine ("<namespace>/<name>") the request concerns,
	// where known.
	NodeClaim, Machine string
}

// Machine is what the approver knows of one of the provider's Machines.
type Machine struct {
	// Key is "<namespace>/<name>".
	Key       string
	Addresses clusterv1.MachineAddresses
	Deleting  bool
}

// NodeClaim is what the approver knows of a NodeClaim.
type NodeClaim struct {
	Name string
	// Ours: its NodeClass is this provider's.
	Ours bool
	// Launched: it has a providerID.
	Launched bool
	// Registered: core registered its Node (condition Registered or status.nodeName).
	Registered bool
	// NodeName is status.nodeName: the Node core registered for it, if any.
	NodeName string
	Deleting bool
	// ApprovedClientCSR is the client request approved for it before, if any.
	ApprovedClientCSR string
}

// Candidate is one of the provider's Machines, the NodeClaim it is bound to
// (its karpenter.cluster.x-k8s.io/nodeclaim annotation; empty while a
// MachineDeployment's new Machine is not bound yet) and that NodeClaim (nil
// when it does not exist).
type Candidate struct {
	Machine       Machine
	NodeClaimName string
	NodeClaim     *NodeClaim
}

// Facts are what the controller found about the name a request asks for.
type Facts struct {
	// Client: the provider's Machines (in its Cluster, Karpenter members)
	// reporting the name as hostname or internal DNS name.
	Machines []Candidate
	// NodeExists: a Node of that name exists.
	NodeExists bool
	// Serving: the NodeClaim of this provider whose providerID is the Node's
	// (nil: the Node does not exist or is not the provider's), and its
	// Machine (nil: not found).
	NodeClaim *NodeClaim
	Machine   *Machine
}

// KindOf returns the kind of request a signer makes, or "" for other signers.
func KindOf(signerName string) string {
	switch signerName {
	case certificatesv1.KubeAPIServerClientKubeletSignerName:
		return KindClient
	case certificatesv1.KubeletServingSignerName:
		return KindServing
	}
	return ""
}

// Judge decides on a request given the facts about the node it names.
func Judge(r Request, f Facts) Decision {
	kind := KindOf(r.SignerName)
	if kind == "" {
		return Decision{Verdict: NotOurs}
	}
	if r.ParseErr != nil {
		return refuse(kind, ReasonMalformed, "CertificateSigningRequest %s: %v", r.Name, r.ParseErr)
	}
	if r.NodeName == "" {
		return refuse(kind, ReasonSubject, "CertificateSigningRequest %s: common name %q does not start with %q", r.Name, r.X509.Subject.CommonName, NodeUserPrefix)
	}
	if kind == KindClient {
		return judgeClient(r, f)
	}
	return judgeServing(r, f)
}

func judgeClient(r Request, f Facts) Decision {
	if r.nodeIdentity() {
		// A node renewing its own client certificate: kube-controller-
		// manager's approver (or another) decides on renewals.
		return Decision{Verdict: NotOurs, Kind: KindClient}
	}
	if len(f.Machines) == 0 {
		return Decision{Verdict: NotOurs, Kind: KindClient}
	}
	if len(f.Machines) > 1 {
		keys := make([]string, 0, len(f.Machines))
		for _, c := range f.Machines {
			keys = append(keys, c.Machine.Key)
		}
		slices.Sort(keys)
		return refuse(KindClient, ReasonAmbiguousName, "client certificate for node %s: Machines %v all report that name; which one is joining is unknown", r.NodeName, keys)
	}
	c := f.Machines[0]
	d := func(reason, format string, args ...any) Decision {
		out := refuse(KindClient, reason, "client certificate for node %s (Machine %s): "+format, append([]any{r.NodeName, c.Machine.Key}, args...)...)
		out.Machine = c.Machine.Key
		if c.NodeClaim != nil {
			out.NodeClaim = c.NodeClaim.Name
		}
		return out
	}
	if !r.bootstrapIdentity() {
		return d(ReasonIdentity, "requested by %q, not a bootstrap identity (system:bootstrap:<token id> in %s, or a %s service account)", r.Username, BootstrappersGroup, BootstrapServiceAccount)
	}
	if reason, err := checkFormat(r, false); err != nil {
		return d(reason, "%v", err)
	}
	if c.Machine.Deleting {
		return d(ReasonMachineDeleting, "the Machine is being deleted")
	}
	nc := c.NodeClaim
	switch {
	case c.NodeClaimName == "" && nc == nil:
		return d(ReasonMachineNotBound, "the Machine is not bound to a NodeClaim yet")
	case nc == nil:
		return d(ReasonNodeClaimNotFound, "its NodeClaim %s does not exist", c.NodeClaimName)
	case !nc.Ours:
		return d(ReasonNodeClaimNotOurs, "NodeClaim %s is not of a ClusterAPINodeClass", nc.Name)
	case nc.Deleting:
		return d(ReasonNodeClaimDeleting, "NodeClaim %s is being deleted", nc.Name)
	case !nc.Launched:
		return d(ReasonNotLaunched, "NodeClaim %s has no providerID yet", nc.Name)
	case nc.Registered || f.NodeExists:
		return d(ReasonAlreadyRegistered, "NodeClaim %s has a Node already: a joined kubelet renews as the node, not with a bootstrap identity", nc.Name)
	case nc.ApprovedClientCSR != "" && nc.ApprovedClientCSR != r.Name:
		return d(ReasonAlreadyApproved, "NodeClaim %s had client request %s approved already: one per NodeClaim", nc.Name, nc.ApprovedClientCSR)
	}
	return Decision{Verdict: Approve, Kind: KindClient, Reason: ReasonApproved, NodeClaim: nc.Name, Machine: c.Machine.Key,
		Message: fmt.Sprintf("client certificate for node %s approved: Machine %s reports that name and NodeClaim %s has not registered", r.NodeName, c.Machine.Key, nc.Name)}
}

func judgeServing(r Request, f Facts) Decision {
	nc := f.NodeClaim
	if nc == nil || !nc.Ours {
		return Decision{Verdict: NotOurs, Kind: KindServing}
	}
	d := func(reason, format string, args ...any) Decision {
		out := refuse(KindServing, reason, "serving certificate for node %s (NodeClaim %s): "+format, append([]any{r.NodeName, nc.Name}, args...)...)
		out.NodeClaim = nc.Name
		if f.Machine != nil {
			out.Machine = f.Machine.Key
		}
		return out
	}
	if !r.nodeIdentity() {
		return d(ReasonIdentity, "requested by %q, not by %s%s in %s", r.Username, NodeUserPrefix, r.NodeName, NodesGroup)
	}
	if reason, err := checkFormat(r, true); err != nil {
		return d(reason, "%v", err)
	}
	if nc.NodeName != "" && nc.NodeName != r.NodeName {
		return d(ReasonNotTheNodeClaimsNode, "NodeClaim %s registered Node %s, not this one, with that providerID", nc.Name, nc.NodeName)
	}
	if f.Machine == nil {
		return d(ReasonMachineNotFound, "its Machine is not found")
	}
	known := map[string]bool{}
	for _, a := range f.Machine.Addresses {
		known[canonicalAddress(a.Address)] = true
	}
	for _, san := range r.sans() {
		if !known[san] {
			return d(ReasonAddressNotOnMachine, "%q is not among the addresses of Machine %s", san, f.Machine.Key)
		}
	}
	return Decision{Verdict: Approve, Kind: KindServing, Reason: ReasonApproved, NodeClaim: nc.Name, Machine: f.Machine.Key,
		Message: fmt.Sprintf("serving certificate for node %s approved: each name and address it asks for is Machine %s's", r.NodeName, f.Machine.Key)}
}

// checkFormat checks what the Kubernetes signer checks: subject and SANs,
// usages, key type and the request's signature.
func checkFormat(r Request, serving bool) (string, error) {
	if err := r.checkSubject(serving); err != nil {
		return ReasonSubject, err
	}
	if err := r.checkUsages(serving); err != nil {
		return ReasonUsages, err
	}
	if err := r.checkKey(); err != nil {
		return ReasonKeyType, err
	}
	if err := r.X509.CheckSignature(); err != nil {
		return ReasonSignature, fmt.Errorf("the request's signature does not verify: %w", err)
	}
	return "", nil
}

func refuse(kind, reason, format string, args ...any) Decision {
	return Decision{Verdict: Refuse, Kind: kind, Reason: reason, Message: fmt.Sprintf(format, args...)}
}
