// Package csrapproval approves the certificate signing requests of the
// kubelets of this provider's nodes, and nothing else.
//
// Clusters whose kubelets join with a bootstrap identity that kubeadm's
// RBAC does not approve, and every cluster with serverTLSBootstrap, leave
// the kubelets' requests pending until something approves them. The
// provider knows each node before it joins: the Machine it launched, the
// addresses Cluster API reports for it, the Machine's bootstrap config, its
// NodeClaim and whether that registered.
//
// Judge is the whole decision, a pure function of the policy, the request
// and those facts; the Controller gathers the facts and acts on the
// decision. The trust model it implements (who may ask for what, and what
// binds a request to its Machine) is the table of docs/concepts.md,
// section "Kubelet certificate requests":
//   - a client request (kubernetes.io/kube-apiserver-client-kubelet) for
//     system:node:<name> is approved when it is asked by a bootstrap
//     identity the policy accepts; exactly one Machine of this provider
//     reports <name> as its hostname or internal DNS name; when that
//     Machine's bootstrap is a KubeadmConfig with a bootstrap token, it is
//     asked by that very token's user; it is not older than the Machine;
//     that Machine's NodeClaim is launched, not registered, has no Node and
//     had no other client request approved; and no other pending request
//     for the name passes the same checks (which of two is the kubelet's
//     cannot be told: neither is approved);
//   - a serving request (kubernetes.io/kubelet-serving) asked by
//     system:node:<name> is approved when Node <name> belongs to a NodeClaim
//     of this provider, <name> is its Machine's hostname or internal DNS
//     name (and the NodeClaim's Node once registered), and each DNS name and
//     IP it asks for is among that Machine's internal addresses (external
//     ones too when the policy allows);
//   - both only when the request is what the Kubernetes signers accept
//     (subject, usages, key type, signature), names compared in canonical
//     form (lower case, no trailing dot).
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
	"time"

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
	// ReasonNameNotOnMachine: a serving request for a node name that is not
	// its Machine's hostname or internal DNS name.
	ReasonNameNotOnMachine = "NodeNameNotOnMachine"
	// ReasonNotTheMachinesToken: a client request for a Machine whose
	// KubeadmConfig has a bootstrap token, asked by another identity.
	ReasonNotTheMachinesToken = "NotTheMachinesBootstrapToken"
	// ReasonBootstrapUnreadable: the Machine's bootstrap config is missing.
	ReasonBootstrapUnreadable = "BootstrapConfigNotFound"
	// ReasonOlderThanMachine: the request was made before its Machine existed.
	ReasonOlderThanMachine = "RequestOlderThanMachine"
	// ReasonCompeting: another pending request for the same node passes
	// every check too; which one is the kubelet's cannot be told.
	ReasonCompeting = "CompetingRequests"
)

// Kinds of request.
const (
	KindClient  = "client"
	KindServing = "serving"
)

// Policy is what the operator configured: who counts as a bootstrap
// identity and which addresses a serving certificate may carry.
type Policy struct {
	// BootstrapServiceAccounts ("<namespace>/<name>") may ask for a node's
	// first client certificate, besides bootstrap tokens.
	BootstrapServiceAccounts []string
	// SubjectAccessReview: a requester is a bootstrap identity when the
	// workload cluster authorizes it to create
	// certificatesigningrequests/nodeclient (Facts.Authorized), as
	// kube-controller-manager's approver asks; bootstrap tokens and
	// BootstrapServiceAccounts are then not accepted on their own.
	SubjectAccessReview bool
	// ServingExternalAddresses lets a serving certificate carry the
	// Machine's ExternalIP and ExternalDNS addresses.
	ServingExternalAddresses bool
}

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
	// Created is the Machine's creation: its instance, and so its kubelet,
	// came later.
	Created time.Time
	// BootstrapTokenID is the ID of the bootstrap token in the Machine's
	// KubeadmConfig (Cluster API's kubeadm bootstrap provider writes one per
	// Machine): only system:bootstrap:<id> may ask for its node's client
	// certificate. Empty when its bootstrap has no token the approver reads
	// (a shared data Secret, file discovery, another bootstrap provider).
	BootstrapTokenID string
	// BootstrapMissing says which bootstrap config the Machine names and
	// does not exist; nothing is approved for it then.
	BootstrapMissing string
}

// RecordState is the state of the client request a NodeClaim records.
type RecordState string

const (
	// RecordApproved: the recorded request was approved.
	RecordApproved RecordState = "Approved"
	// RecordPending: recorded, not approved yet (an approval under way).
	RecordPending RecordState = "Pending"
	// RecordVoid: the recorded request is gone, denied or failed: the
	// record binds nothing.
	RecordVoid RecordState = "Void"
)

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
	// ApprovedClientCSR is the client request recorded for it, if any, and
	// ApprovedClientCSRState that request's state (for another request
	// than the one judged).
	ApprovedClientCSR      string
	ApprovedClientCSRState RecordState
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
	// reporting the name (in canonical form) as hostname or internal DNS name.
	Machines []Candidate
	// Others: the other pending client requests for the same name.
	Others []Request
	// Authorized: with Policy.SubjectAccessReview, whether the requester
	// of each request (by name: the judged one and Others) may create
	// certificatesigningrequests/nodeclient.
	Authorized map[string]bool
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

// Judge decides on a request given the policy and the facts about the node
// it names.
func Judge(p Policy, r Request, f Facts) Decision {
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
		return judgeClient(p, r, f)
	}
	return judgeServing(p, r, f)
}

func judgeClient(p Policy, r Request, f Facts) Decision {
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
	if reason, msg := clientEligible(p, r, f, c.Machine); reason != "" {
		return d(reason, "%s", msg)
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
	}
	approved := Decision{Verdict: Approve, Kind: KindClient, Reason: ReasonApproved, NodeClaim: nc.Name, Machine: c.Machine.Key,
		Message: fmt.Sprintf("client certificate for node %s approved: Machine %s reports that name, %s, and NodeClaim %s has not registered", r.NodeName, c.Machine.Key, binding(c.Machine), nc.Name)}
	if nc.ApprovedClientCSR == r.Name {
		// Chosen already (the record is written before the approval):
		// finish what was decided.
		return approved
	}
	if nc.ApprovedClientCSR != "" && nc.ApprovedClientCSRState != RecordVoid {
		return d(ReasonAlreadyApproved, "NodeClaim %s had client request %s approved already (%s): one per NodeClaim", nc.Name, nc.ApprovedClientCSR, nc.ApprovedClientCSRState)
	}
	if rivals := competing(p, r, f, c.Machine); len(rivals) > 0 {
		return d(ReasonCompeting, "pending requests %v for the same node pass every check too; which one is the kubelet's cannot be told, so none is approved (delete or deny the foreign ones)", rivals)
	}
	return approved
}

// clientEligible checks what a client request must be on its own for the
// Machine: its name in canonical form, a bootstrap identity, the format the
// signer accepts, the Machine's own token where it has one, and made after
// the Machine. It returns the failed check's reason and message.
func clientEligible(p Policy, r Request, f Facts, m Machine) (string, string) {
	if r.NodeName != r.canonicalNodeName() {
		return ReasonSubject, fmt.Sprintf("node name %q is not in canonical form (%q)", r.NodeName, r.canonicalNodeName())
	}
	if ok, why := p.bootstrapIdentity(r, f); !ok {
		return ReasonIdentity, fmt.Sprintf("requested by %q: %s", r.Username, why)
	}
	if reason, err := checkFormat(r, false); err != nil {
		return reason, err.Error()
	}
	if m.BootstrapMissing != "" {
		return ReasonBootstrapUnreadable, fmt.Sprintf("its bootstrap config %s does not exist: what the kubelet joins with is unknown", m.BootstrapMissing)
	}
	if m.BootstrapTokenID != "" && r.Username != BootstrapTokenUserPrefix+m.BootstrapTokenID {
		return ReasonNotTheMachinesToken, fmt.Sprintf("requested by %q, not by the Machine's own bootstrap token %s%s", r.Username, BootstrapTokenUserPrefix, m.BootstrapTokenID)
	}
	if r.Created.IsZero() || r.Created.Before(m.Created) {
		return ReasonOlderThanMachine, fmt.Sprintf("the request (%s) is older than the Machine (%s): no kubelet of it could have made it", stamp(r.Created), stamp(m.Created))
	}
	return "", ""
}

// competing returns the other pending requests for the node that pass
// clientEligible too.
func competing(p Policy, r Request, f Facts, m Machine) []string {
	var out []string
	for _, o := range f.Others {
		if o.Name == r.Name || KindOf(o.SignerName) != KindClient || o.ParseErr != nil || o.canonicalNodeName() != r.canonicalNodeName() {
			continue
		}
		if reason, _ := clientEligible(p, o, f, m); reason == "" {
			out = append(out, o.Name)
		}
	}
	slices.Sort(out)
	return out
}

// bootstrapIdentity checks the requester of a client request against the
// policy, saying why not.
func (p Policy) bootstrapIdentity(r Request, f Facts) (bool, string) {
	if p.SubjectAccessReview {
		if f.Authorized[r.Name] {
			return true, ""
		}
		return false, "the workload cluster does not authorize it to create certificatesigningrequests/nodeclient (SubjectAccessReview)"
	}
	if r.bootstrapTokenUser() {
		return true, ""
	}
	for _, sa := range p.BootstrapServiceAccounts {
		if r.serviceAccount(sa) {
			return true, ""
		}
	}
	accepted := fmt.Sprintf("a bootstrap token (%s<token id> in %s)", BootstrapTokenUserPrefix, BootstrappersGroup)
	if len(p.BootstrapServiceAccounts) > 0 {
		accepted += fmt.Sprintf(" or one of the service accounts %v", p.BootstrapServiceAccounts)
	}
	return false, "not " + accepted
}

// binding says what ties an approved client request to the Machine.
func binding(m Machine) string {
	if m.BootstrapTokenID != "" {
		return "it was asked by the Machine's own bootstrap token"
	}
	return "it was made after the Machine and no other request competes"
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "unknown"
	}
	return t.UTC().Format(time.RFC3339)
}

func judgeServing(p Policy, r Request, f Facts) Decision {
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
	if r.NodeName != r.canonicalNodeName() {
		return d(ReasonSubject, "node name %q is not in canonical form (%q)", r.NodeName, r.canonicalNodeName())
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
	// The Node's providerID is the kubelet's own word: the name must be the
	// Machine's too, or any node could claim another's instance.
	if !slices.Contains(machineNames(*f.Machine), r.NodeName) {
		return d(ReasonNameNotOnMachine, "%q is not a Hostname or InternalDNS address of Machine %s (%v)", r.NodeName, f.Machine.Key, machineNames(*f.Machine))
	}
	allowed, external := servingAddresses(p, *f.Machine)
	for _, san := range r.sans() {
		if allowed[san] {
			continue
		}
		if external[san] {
			return d(ReasonAddressNotOnMachine, "%q is an external address of Machine %s: external addresses are not allowed (--kubelet-csr-serving-external-addresses)", san, f.Machine.Key)
		}
		return d(ReasonAddressNotOnMachine, "%q is not among the addresses of Machine %s", san, f.Machine.Key)
	}
	return Decision{Verdict: Approve, Kind: KindServing, Reason: ReasonApproved, NodeClaim: nc.Name, Machine: f.Machine.Key,
		Message: fmt.Sprintf("serving certificate for node %s approved: the node name and each name and address it asks for are Machine %s's", r.NodeName, f.Machine.Key)}
}

// machineNames are a Machine's Hostname and InternalDNS addresses, canonical.
func machineNames(m Machine) []string {
	var out []string
	for _, a := range m.Addresses {
		if a.Type == clusterv1.MachineHostName || a.Type == clusterv1.MachineInternalDNS {
			out = append(out, canonicalName(a.Address))
		}
	}
	return out
}

// servingAddresses are the addresses a serving certificate may carry (the
// internal ones, and the external ones when the policy allows), and the
// external ones it may not.
func servingAddresses(p Policy, m Machine) (allowed, external map[string]bool) {
	allowed, external = map[string]bool{}, map[string]bool{}
	for _, a := range m.Addresses {
		addr := canonicalAddress(a.Address)
		switch a.Type {
		case clusterv1.MachineHostName, clusterv1.MachineInternalDNS, clusterv1.MachineInternalIP:
			allowed[addr] = true
		case clusterv1.MachineExternalDNS, clusterv1.MachineExternalIP:
			if p.ServingExternalAddresses {
				allowed[addr] = true
			} else {
				external[addr] = true
			}
		}
	}
	return allowed, external
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
