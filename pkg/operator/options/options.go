// Package options holds the provider's flags. Every flag is also an
// environment variable; both are registered in Karpenter core's flag set, so
// the binary accepts them beside core's own.
package options

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/clientcmd"
	crconfig "sigs.k8s.io/controller-runtime/pkg/client/config"
	coreoptions "sigs.k8s.io/karpenter/pkg/operator/options"
	"sigs.k8s.io/karpenter/pkg/utils/env"

	"github.com/autonode/karpenter-clusterapi/pkg/operator/leader"
)

func init() {
	coreoptions.Injectables = append(coreoptions.Injectables, &Options{})
}

// Flag names of the product contract.
const (
	FlagKubeconfig           = "kubeconfig"
	FlagClusterAPIKubeconfig = "cluster-api-kubeconfig"
	FlagClusterAPINamespace  = "cluster-api-namespace"
	FlagClusterAPICluster    = "cluster-api-cluster-name"
	FlagInstallWorkloadCRDs  = "install-workload-crds"
	FlagUnavailableTTL       = "unavailable-offerings-ttl"
	FlagLeaseDuration        = "leader-election-lease-duration"
	FlagRenewDeadline        = "leader-election-renew-deadline"
	FlagRetryPeriod          = "leader-election-retry-period"
	FlagApproveKubeletCSRs   = "approve-kubelet-csrs"
	FlagSoleScalerWindow     = "sole-scaler-window"
	// FlagKubeletCSRServiceAccounts names the service accounts, besides
	// bootstrap tokens, whose client requests count as a bootstrapper's.
	FlagKubeletCSRServiceAccounts = "kubelet-csr-bootstrap-service-accounts"
	// FlagKubeletCSRAuthorization is how a bootstrap identity is recognised:
	// KubeletCSRAuthorizationIdentities or KubeletCSRAuthorizationSAR.
	FlagKubeletCSRAuthorization = "kubelet-csr-bootstrap-authorization"
	// FlagKubeletCSRServingExternal lets serving certificates carry the
	// Machines' external addresses.
	FlagKubeletCSRServingExternal = "kubelet-csr-serving-external-addresses"
)

// Values of --kubelet-csr-bootstrap-authorization.
const (
	// KubeletCSRAuthorizationIdentities: bootstrap tokens and the service
	// accounts of --kubelet-csr-bootstrap-service-accounts.
	KubeletCSRAuthorizationIdentities = "identities"
	// KubeletCSRAuthorizationSAR: whoever a SubjectAccessReview allows to
	// create certificatesigningrequests/nodeclient.
	KubeletCSRAuthorizationSAR = "subjectaccessreview"
)

// DefaultUnavailableTTL is how long an offering that failed for lack of
// capacity is left out of launches.
const DefaultUnavailableTTL = 3 * time.Minute

// Options are the provider's settings.
type Options struct {
	// Kubeconfig of the workload (spoke) cluster; in-cluster config when empty.
	Kubeconfig string
	// ClusterAPIKubeconfig of the management (hub) cluster; the spoke when empty.
	ClusterAPIKubeconfig string
	// ClusterAPINamespace restricts every hub read and write to this namespace.
	ClusterAPINamespace string
	// ClusterAPIClusterName restricts hub objects to those of this Cluster.
	ClusterAPIClusterName string
	// InstallWorkloadCRDs installs the Karpenter and NodeClass CRDs in the spoke at start.
	InstallWorkloadCRDs bool
	// UnavailableTTL is how long an offering that reported insufficient
	// capacity stays unavailable (Machine mode).
	UnavailableTTL time.Duration
	// LeaderElection is the election of the provider's replicas (package
	// leader). Whether it runs, and the Lease's name and namespace, are
	// core's settings (DISABLE_LEADER_ELECTION, LEADER_ELECTION_NAME,
	// LEADER_ELECTION_NAMESPACE); the timings are ours.
	LeaderElection leader.Settings
	// RepairConditions are node conditions, besides Ready, that make
	// Karpenter replace a node once they held for their toleration.
	RepairConditions []RepairCondition
	// ApproveKubeletCSRs runs the approver of the kubelet certificate
	// requests of the provider's nodes (package csrapproval).
	ApproveKubeletCSRs bool
	// KubeletCSRBootstrapServiceAccounts are "<namespace>/<name>" of the
	// service accounts that may ask for a node's first client certificate.
	KubeletCSRBootstrapServiceAccounts []string
	// KubeletCSRBootstrapAuthorization is KubeletCSRAuthorizationIdentities
	// or KubeletCSRAuthorizationSAR.
	KubeletCSRBootstrapAuthorization string
	// KubeletCSRServingExternalAddresses lets serving certificates carry the
	// Machines' ExternalIP and ExternalDNS addresses.
	KubeletCSRServingExternalAddresses bool
	// SoleScalerWindow is how long after another autoscaler last changed
	// a member MachineDeployment's replicas its NodeClass's SoleScaler
	// stays False (package coexistence; 15m when 0).
	SoleScalerWindow time.Duration

	repairConditionsRaw   string
	csrServiceAccountsRaw string
}

// AddFlags registers the flags in core's flag set.
func (o *Options) AddFlags(fs *coreoptions.FlagSet) {
	fs.StringVar(&o.Kubeconfig, FlagKubeconfig, "",
		"Path to the kubeconfig of the workload cluster (NodePools, NodeClaims, Nodes). The KUBECONFIG environment variable works too; in-cluster config when neither is set.")
	fs.StringVar(&o.ClusterAPIKubeconfig, FlagClusterAPIKubeconfig, env.WithDefaultString("CLUSTER_API_KUBECONFIG", ""),
		"Path to the kubeconfig of the management cluster that holds the Cluster API objects. The workload cluster when unset.")
	fs.StringVar(&o.ClusterAPINamespace, FlagClusterAPINamespace, env.WithDefaultString("CLUSTER_API_NAMESPACE", ""),
		"Namespace of the Cluster in the management cluster. When set, only this namespace is watched and changed.")
	fs.StringVar(&o.ClusterAPIClusterName, FlagClusterAPICluster, env.WithDefaultString("CLUSTER_API_CLUSTER_NAME", ""),
		"Name of the Cluster. When set, only objects labelled cluster.x-k8s.io/cluster-name=<name> are used. Requires --cluster-api-namespace.")
	fs.BoolVarWithEnv(&o.InstallWorkloadCRDs, FlagInstallWorkloadCRDs, "INSTALL_WORKLOAD_CRDS", false,
		"Install or update the Karpenter and ClusterAPINodeClass CRDs in the workload cluster at start.")
	fs.DurationVar(&o.UnavailableTTL, FlagUnavailableTTL, env.WithDefaultDuration("UNAVAILABLE_OFFERINGS_TTL", DefaultUnavailableTTL),
		"How long an offering (instance type, zone, capacity type) that reported insufficient capacity is left out of launches (Machine mode).")
	fs.DurationVar(&o.LeaderElection.LeaseDuration, FlagLeaseDuration, env.WithDefaultDuration("LEADER_ELECTION_LEASE_DURATION", leader.DefaultLeaseDuration),
		"How long standby replicas wait after the leader's last renewal before taking over. Shorter: faster takeover after a crash; must exceed the renew deadline.")
	fs.DurationVar(&o.LeaderElection.RenewDeadline, FlagRenewDeadline, env.WithDefaultDuration("LEADER_ELECTION_RENEW_DEADLINE", leader.DefaultRenewDeadline),
		"How long the leader keeps trying to renew its lease before it gives up and exits (an API server outage longer than this restarts the leader).")
	fs.DurationVar(&o.LeaderElection.RetryPeriod, FlagRetryPeriod, env.WithDefaultDuration("LEADER_ELECTION_RETRY_PERIOD", leader.DefaultRetryPeriod),
		"How often the leader renews its lease and standbys try to take it: one lease write per period by the leader, one read per standby.")
	fs.BoolVarWithEnv(&o.ApproveKubeletCSRs, FlagApproveKubeletCSRs, "APPROVE_KUBELET_CSRS", false,
		"Approve the kubelet client and serving certificate signing requests of this provider's nodes, checked against the Machines that launched them (needs the approver's RBAC).")
	fs.StringVar(&o.csrServiceAccountsRaw, FlagKubeletCSRServiceAccounts, env.WithDefaultString("KUBELET_CSR_BOOTSTRAP_SERVICE_ACCOUNTS", ""),
		"With --approve-kubelet-csrs: service accounts (<namespace>/<name>,...) whose client certificate requests count as a node bootstrapper's, besides bootstrap tokens. None by default.")
	fs.StringVar(&o.KubeletCSRBootstrapAuthorization, FlagKubeletCSRAuthorization, env.WithDefaultString("KUBELET_CSR_BOOTSTRAP_AUTHORIZATION", KubeletCSRAuthorizationIdentities),
		"With --approve-kubelet-csrs: who may ask for a node's first client certificate: \"identities\" (bootstrap tokens and --kubelet-csr-bootstrap-service-accounts) or \"subjectaccessreview\" (whoever the workload cluster authorizes to create certificatesigningrequests/nodeclient, as kube-controller-manager asks; needs create on subjectaccessreviews).")
	fs.BoolVarWithEnv(&o.KubeletCSRServingExternalAddresses, FlagKubeletCSRServingExternal, "KUBELET_CSR_SERVING_EXTERNAL_ADDRESSES", false,
		"With --approve-kubelet-csrs: let kubelet serving certificates carry their Machine's ExternalIP and ExternalDNS addresses (internal addresses only by default).")
	fs.DurationVar(&o.SoleScalerWindow, FlagSoleScalerWindow, env.WithDefaultDuration("SOLE_SCALER_WINDOW", 15*time.Minute),
		"How long after another autoscaler (cluster-autoscaler, kubectl scale) last changed a member MachineDeployment's spec.replicas its NodeClass's condition SoleScaler stays False.")
	fs.StringVar(&o.repairConditionsRaw, FlagRepairConditions, env.WithDefaultString("REPAIR_CONDITIONS", ""),
		"Node conditions, besides Ready, that make Karpenter replace a node once they held for a while (feature gate NodeRepair): <type>=<status>:<toleration>,... e.g. KernelDeadlock=True:10m.")
}

// Parse parses the arguments and validates the result.
func (o *Options) Parse(fs *coreoptions.FlagSet, args ...string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		return fmt.Errorf("parsing flags, %w", err)
	}
	o.takeOverLeaderElection()
	if err := o.Validate(); err != nil {
		return err
	}
	// Core takes the workload cluster's config from controller-runtime's own
	// kubeconfig flag, which core's flag set does not parse: hand it over.
	if o.Kubeconfig != "" {
		if err := flag.CommandLine.Set(crconfig.KubeconfigFlagName, o.Kubeconfig); err != nil {
			return fmt.Errorf("--%s: %w", FlagKubeconfig, err)
		}
	}
	return nil
}

// Validate checks the settings without touching any cluster.
func (o *Options) Validate() error {
	if o.ClusterAPIClusterName != "" && o.ClusterAPINamespace == "" {
		return fmt.Errorf("--%s (CLUSTER_API_CLUSTER_NAME) requires --%s (CLUSTER_API_NAMESPACE): a Cluster is named within its namespace",
			FlagClusterAPICluster, FlagClusterAPINamespace)
	}
	if err := o.LeaderElection.Validate(); err != nil {
		return err
	}
	conditions, err := ParseRepairConditions(o.repairConditionsRaw)
	if err != nil {
		return err
	}
	o.RepairConditions = conditions
	if err := o.validateKubeletCSRs(); err != nil {
		return err
	}
	if o.SoleScalerWindow < 0 {
		return fmt.Errorf("--%s (SOLE_SCALER_WINDOW): %s is negative", FlagSoleScalerWindow, o.SoleScalerWindow)
	}
	if o.UnavailableTTL <= 0 {
		return fmt.Errorf("--%s (UNAVAILABLE_OFFERINGS_TTL): %s is not a positive duration", FlagUnavailableTTL, o.UnavailableTTL)
	}
	if err := checkKubeconfig(FlagKubeconfig, o.Kubeconfig); err != nil {
		return err
	}
	return checkKubeconfig(FlagClusterAPIKubeconfig+" (CLUSTER_API_KUBECONFIG)", o.ClusterAPIKubeconfig)
}

// validateKubeletCSRs parses the approver's settings.
func (o *Options) validateKubeletCSRs() error {
	switch o.KubeletCSRBootstrapAuthorization {
	case KubeletCSRAuthorizationIdentities, KubeletCSRAuthorizationSAR:
	default:
		return fmt.Errorf("--%s (KUBELET_CSR_BOOTSTRAP_AUTHORIZATION): %q is neither %q nor %q",
			FlagKubeletCSRAuthorization, o.KubeletCSRBootstrapAuthorization, KubeletCSRAuthorizationIdentities, KubeletCSRAuthorizationSAR)
	}
	o.KubeletCSRBootstrapServiceAccounts = nil
	for _, sa := range strings.Split(o.csrServiceAccountsRaw, ",") {
		if sa = strings.TrimSpace(sa); sa == "" {
			continue
		}
		ns, name, ok := strings.Cut(sa, "/")
		if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
			return fmt.Errorf("--%s (KUBELET_CSR_BOOTSTRAP_SERVICE_ACCOUNTS): %q is not <namespace>/<name> of a service account", FlagKubeletCSRServiceAccounts, sa)
		}
		o.KubeletCSRBootstrapServiceAccounts = append(o.KubeletCSRBootstrapServiceAccounts, sa)
	}
	return nil
}

// takeOverLeaderElection moves the leader election from core's manager to
// package leader, whose lease timings can be set (core's cannot): it reads
// core's settings as the user gave them and turns core's own election off.
// Core parses its options before this provider's (it registers first), and
// again, flags and environment both, at every parse, so the user's choice
// is read anew each time.
func (o *Options) takeOverLeaderElection() {
	for _, inj := range coreoptions.Injectables {
		core, ok := inj.(*coreoptions.Options)
		if !ok {
			continue
		}
		o.LeaderElection.Enabled = !core.DisableLeaderElection
		o.LeaderElection.Name = core.LeaderElectionName
		o.LeaderElection.Namespace = core.LeaderElectionNamespace
		core.DisableLeaderElection = true
	}
}

func checkKubeconfig(flagName, path string) error {
	if path == "" {
		return nil
	}
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return fmt.Errorf("--%s: cannot read kubeconfig %q: %s", flagName, path, firstLine(err.Error()))
	}
	if _, err := clientcmd.NewDefaultClientConfig(*cfg, nil).ClientConfig(); err != nil {
		return fmt.Errorf("--%s: kubeconfig %q is not usable: %s", flagName, path, firstLine(err.Error()))
	}
	return nil
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// ToContext stores the options in the context.
func (o *Options) ToContext(ctx context.Context) context.Context {
	return ToContext(ctx, o)
}

type optionsKey struct{}

// ToContext stores options in a context.
func ToContext(ctx context.Context, o *Options) context.Context {
	return context.WithValue(ctx, optionsKey{}, o)
}

// FromContext returns the options stored in the context, or nil.
func FromContext(ctx context.Context) *Options {
	o, _ := ctx.Value(optionsKey{}).(*Options)
	return o
}

// Preflight parses args with every registered injectable (core's and ours)
// on a throwaway flag set, so that bad configuration ends the process with
// one clear line instead of core's panic and stack trace. It returns this
// provider's options, or nil when help was asked for.
func Preflight(args []string) (*Options, error) {
	for _, a := range args {
		if a == "-h" || a == "--help" || a == "-help" {
			return nil, nil // let core print its usage
		}
	}
	fs := &coreoptions.FlagSet{FlagSet: flag.NewFlagSet("karpenter", flag.ContinueOnError)}
	fs.SetOutput(io.Discard)
	for _, o := range coreoptions.Injectables {
		o.AddFlags(fs)
	}
	var ours *Options
	for _, o := range coreoptions.Injectables {
		if err := o.Parse(fs, args...); err != nil {
			return nil, err
		}
		if mine, ok := o.(*Options); ok {
			ours = mine
		}
	}
	return ours, nil
}
