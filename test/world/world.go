// Package world starts an end-to-end test world made of real parts, with
// only AWS and the kubelet simulated:
//
//   - a hub (management cluster) API server running Cluster API's real core
//     controllers (cluster, machinedeployment, machineset, machine,
//     machinehealthcheck, with a ClusterCache reaching the spoke) and real admission webhooks (Cluster,
//     Machine, MachineSet, MachineDeployment, MachineHealthCheck,
//     MachineDrainRule), wired as Cluster API's core/main.go wires them;
//   - a spoke (workload cluster) API server with the real kube-scheduler and
//     kube-controller-manager (deployment, replicaset, daemonset, garbagecollector, podgc,
//     disruption: PodDisruptionBudget status);
//   - SimAWS, a simulated EC2 behind CAPA's AWSCluster, AWSMachine and
//     AWSMachineTemplate objects (CAPA v1beta2 types, v1beta1 infra contract);
//     or, with Options.CAPA, CAPA's real controller manager against a
//     simulated EC2 API (ec2sim; see CAPAOptions);
//   - a simulated kubelet and AWS cloud-controller-manager that register
//     Nodes for running instances and run the Pods bound to them;
//   - a simulated kubeadm bootstrap provider serving CABPK's real
//     KubeadmConfig and KubeadmConfigTemplate CRDs (bootstrapper.go).
//
// The hub holds, in Namespace: the Cluster ClusterName, its AWSCluster, a
// WorldControlPlane (a managed, EKS-like control plane that reports itself
// initialized, see ControlPlaneCRD), the Secret "<cluster>-kubeconfig" of the
// spoke and the bootstrap data Secret "<cluster>-bootstrap" (BootstrapData).
//
// What tests must set themselves: Cluster API's webhooks run, so
// MachineDeployments, MachineSets and Machines get their defaults (rollout
// strategy, selector labels, replicas from the autoscaler min-size annotation
// or 1, ...) and are validated as in production. Bootstrap: either
// spec.template.spec.bootstrap.dataSecretName (environment.NewMachineDeployment
// uses "<cluster>-bootstrap") or a configRef to a KubeadmConfigTemplate (or,
// on a Machine, a KubeadmConfig) that the simulated bootstrap provider renders
// (see bootstrapper.go, CreateKubeadmConfigTemplate). Infrastructure templates need an AMI
// (AWSMachineTemplate sets one) or the Machine needs spec.version, as with
// CAPA. Pods must tolerate the bootstrap taints (karpenter.sh/unregistered by
// default) unless something removes them.
//
// More Clusters: AddCluster adds a Cluster with a workload cluster of its
// own (API server, kube-scheduler, kube-controller-manager, simulated
// kubelet) in the same hub namespace, AddClusterIn in another one; SimAWS runs every Cluster's instances
// and each simulated kubelet registers only the instances of its Cluster's
// Machines.
//
// Outages: StopHubAPIServer kills the hub's kube-apiserver (etcd keeps
// running) and StartHubAPIServer starts it again on the same address; every
// controller of the world retries meanwhile and resumes on its own.
//
// Audit: the hub's API server logs every request of users in AuditedGroup
// to HubAuditLog (level Metadata), and nothing else. The (first) workload
// cluster's API server logs every write to NodeClaims to SpokeAuditLog, a
// status write with its body: who undid a NodeClaim's condition is named
// there (LogFiles keeps it with the logs).
//
// Logs: the Cluster API controllers, the simulators and webhooks log to
// world.log in Dir; kube-scheduler and kube-controller-manager to their own
// files there (LogFiles). Callers that want controller-runtime's global
// logger quiet should call ctrl.SetLogger themselves.
package world

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	infrav1 "sigs.k8s.io/cluster-api-provider-aws/v2/api/v1beta2"
	clusterv1beta1 "sigs.k8s.io/cluster-api/api/core/v1beta1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/autonode/karpenter-clusterapi/test/environment"
	"github.com/autonode/karpenter-clusterapi/test/placement"
	"github.com/autonode/karpenter-clusterapi/test/world/ec2sim"
)

// Defaults of Options.
const (
	DefaultNamespace      = "default"
	DefaultClusterName    = "c1"
	DefaultProvisionDelay = time.Second
)

// DefaultZones are the default failure domains.
var DefaultZones = []string{"us-east-1a", "us-east-1b", "us-east-1c"}

// Options shape a World. Zero values take the defaults.
type Options struct {
	// Namespace and name of the Cluster in the hub (default "default", "c1").
	Namespace, ClusterName string
	// ProvisionDelay is how long a simulated instance stays "pending" after
	// its AWSMachine got an instance (providerID) until it runs (default 1s).
	ProvisionDelay time.Duration
	// Zones the AWSCluster reports as failure domains (default DefaultZones).
	Zones []string
	// Logger for the controllers of the world; default: world.log in Dir.
	Logger *logr.Logger
	// WithoutWorkloadCRDs starts the spoke without the Karpenter and NodeClass
	// CRDs (the provider's --install-workload-crds installs them).
	WithoutWorkloadCRDs bool
	// Published makes the world take clusters as CAPA publishes them
	// (clusterctl templates, ClusterClasses): older API versions, topology
	// reconcilers, a simulated kubeadm control plane. See published.go.
	Published bool
	// CAPA, when set, runs CAPA's real controller manager against a
	// simulated EC2 (World.EC2) instead of SimAWS (World.AWS is then nil).
	// See CAPAOptions. One Cluster only: AddCluster is not supported.
	CAPA *CAPAOptions
	// KubeSchedulerConfig, when set, is a KubeSchedulerConfiguration (YAML)
	// the first spoke's kube-scheduler runs with (--config), for extra
	// profiles; its clientConnection.kubeconfig and leader election are the
	// world's.
	KubeSchedulerConfig []byte
	// NodeReadyDelay is how long a simulated Node reports NotReady after its
	// kubelet registered it, as a real node does while its network plugin
	// starts (default 0: Ready at once).
	NodeReadyDelay time.Duration
	// ImagePullDelay is how long a simulated Node takes to pull an image it
	// has not run yet before it starts a Pod's containers (default 0: at
	// once). A real node pulls every image of its first Pods.
	ImagePullDelay time.Duration
	// Split, when set, runs the world's two sides in processes of their
	// own, each on its CPU set (split.go). Not with Published, CAPA or
	// AddCluster; the setters of the in-process simulators (World.AWS, the
	// kubelet's delays and join mode) are then unavailable, except
	// SetProvisionDelay.
	Split *SplitOptions
}

// AuditedGroup is the group whose users' requests the hub's API server
// writes to World.HubAuditLog: give a test's hub user this group to see
// what it asked for.
const AuditedGroup = "world.test:audited"

// World is a running world. Stop it when done.
type World struct {
	// Hub is the management cluster; Spoke the workload cluster of the
	// first Cluster, ClusterName.
	Hub, Spoke *environment.Cluster
	// Kubeconfig files of the hub and the spoke, usable by subprocesses and kubectl.
	HubKubeconfig, SpokeKubeconfig string
	Namespace, ClusterName         string
	// BootstrapSecretName is the default bootstrap data Secret, "<cluster>-bootstrap".
	BootstrapSecretName string
	// AWS is the simulated CAPA (default); EC2 the simulated EC2 behind the
	// real CAPA (Options.CAPA). Exactly one is set.
	AWS *SimAWS
	EC2 *ec2sim.Sim
	// Dir is the world's temporary directory (kubeconfigs, logs).
	Dir string
	// KeepDir keeps Dir on Stop (set it when a test failed, to read the logs).
	KeepDir bool
	// HubAuditLog is the hub API server's audit log (JSON lines): the
	// requests of users in AuditedGroup.
	HubAuditLog string
	// SpokeAuditLog is the workload cluster's audit log (JSON lines):
	// every write to a NodeClaim, status writes at level Request.
	SpokeAuditLog string

	hub          *hubManager
	kcp          *simKCP // with Options.Published
	capa         *capaManager
	instances    instanceSource
	mctx         context.Context // the controllers' context
	cancel       context.CancelFunc
	log          logr.Logger
	mu           sync.Mutex // guards managersDone and clusters
	managersDone []chan error
	// clusters are the Clusters with their spokes, the first one first.
	clusters []*WorkloadCluster
	logFile  *os.File
	// schedulerConfig is Options.KubeSchedulerConfig.
	schedulerConfig []byte
	// nodeReadyDelay is Options.NodeReadyDelay, or SetNodeReadyDelay's
	// (nanoseconds).
	nodeReadyDelay atomic.Int64
	// imagePullDelay is Options.ImagePullDelay (nanoseconds).
	imagePullDelay atomic.Int64
	// kubeletJoin is SetKubeletJoin's JoinMode.
	kubeletJoin atomic.Int32
	// zones are Options.Zones.
	zones []string
	// split is Options.Split; hubSide and kubeletSide its side processes.
	split                *SplitOptions
	hubSide, kubeletSide *sideProcess
	// kubeletHold is HoldKubeletJoin's.
	kubeletHold atomic.Bool
	stopOnce    sync.Once
	stopErr     error
}

// WorkloadCluster is a Cluster of the world and its workload cluster.
type WorkloadCluster struct {
	// Namespace and Name of the Cluster in the hub: the world's Namespace
	// unless AddClusterIn put it elsewhere.
	Namespace, Name string
	// Spoke is its workload cluster; SpokeKubeconfig a kubeconfig file of it.
	Spoke           *environment.Cluster
	SpokeKubeconfig string
	// BootstrapSecretName is its bootstrap data Secret, "<cluster>-bootstrap".
	BootstrapSecretName string

	// logSuffix tells its scheduler's and controller manager's log files
	// from the first Cluster's.
	logSuffix         string
	scheduler         *process
	controllerManager *process
}

// Start starts a world. ctx bounds the start only; the world runs until Stop.
// On error, everything started is stopped again and Dir is kept for its logs.
func Start(ctx context.Context, o Options) (w *World, err error) {
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if o.ClusterName == "" {
		o.ClusterName = DefaultClusterName
	}
	if o.ProvisionDelay == 0 {
		o.ProvisionDelay = DefaultProvisionDelay
	}
	if len(o.Zones) == 0 {
		o.Zones = DefaultZones
	}
	if os.Getenv(sideEnv) != "" {
		return nil, errors.New("a side process of a split world must not start a world: call world.RunSideIfAsked first thing in TestMain")
	}
	if o.Split != nil && (o.Published || o.CAPA != nil || o.Logger != nil) {
		return nil, errors.New("a split world runs neither Published clusters, nor CAPA, nor a caller's Logger")
	}
	dir, err := os.MkdirTemp("", "world-")
	if err != nil {
		return nil, err
	}
	w = &World{
		Dir: dir, Namespace: o.Namespace, ClusterName: o.ClusterName, schedulerConfig: o.KubeSchedulerConfig,
		BootstrapSecretName: o.ClusterName + "-bootstrap",
		HubAuditLog:         filepath.Join(dir, "hub-audit.log"),
		SpokeAuditLog:       filepath.Join(dir, "spoke-audit.log"),
		zones:               append([]string(nil), o.Zones...),
		split:               o.Split,
	}
	w.nodeReadyDelay.Store(int64(o.NodeReadyDelay))
	w.imagePullDelay.Store(int64(o.ImagePullDelay))
	if o.Split != nil {
		// The hub side process runs the simulated AWS.
	} else if o.CAPA == nil {
		w.AWS = newSimAWS(append([]string(nil), o.Zones...), o.ProvisionDelay)
		w.instances = w.AWS
	} else {
		if w.EC2, err = ec2sim.Start(ec2sim.Options{
			Region: regionOf(o.Zones[0]), Zones: o.Zones, PendingFor: o.ProvisionDelay, ShuttingDownFor: o.CAPA.ShuttingDownFor,
			InstanceTypes: simulatedCatalogue(), Images: ec2sim.CAPAImages(KubeletVersion),
		}); err != nil {
			return w, err
		}
		w.instances = &ec2Instances{sim: w.EC2, namespace: o.Namespace, userData: map[string][]byte{}}
	}
	defer func() {
		if r := recover(); r != nil {
			// A panic would otherwise leave the API servers running.
			w.KeepDir = true
			_ = w.Stop()
			panic(r)
		}
		if err != nil {
			w.KeepDir = true
			_ = w.Stop()
			err = fmt.Errorf("starting world (logs in %s): %w", dir, err)
		}
	}()
	log := ptr.Deref(o.Logger, logr.Discard())
	if o.Logger == nil {
		if w.logFile, err = os.Create(filepath.Join(dir, "world.log")); err != nil {
			return w, err
		}
		log = zap.New(zap.WriteTo(w.logFile), zap.UseDevMode(true))
	}
	w.log = log

	t0 := time.Now()
	phase := func(name string) {
		log.WithName("world").Info("start phase done", "phase", name, "elapsed", time.Since(t0).Round(time.Millisecond).String())
	}
	if err := w.startAPIServers(!o.WithoutWorkloadCRDs); err != nil {
		return w, err
	}
	phase("api servers")
	mp, err := machinePoolCRD()
	if err != nil {
		return w, err
	}
	if _, err := envtest.InstallCRDs(w.Hub.Config, envtest.CRDInstallOptions{
		CRDs: []*apiextensionsv1.CustomResourceDefinition{mp, ControlPlaneCRD()},
	}); err != nil {
		return w, fmt.Errorf("installing CRDs: %w", err)
	}
	if w.HubKubeconfig, err = w.Hub.WriteKubeconfig(dir); err != nil {
		return w, err
	}
	if w.SpokeKubeconfig, err = w.Spoke.WriteKubeconfig(dir); err != nil {
		return w, err
	}
	first := &WorkloadCluster{Namespace: w.Namespace, Name: w.ClusterName, Spoke: w.Spoke, SpokeKubeconfig: w.SpokeKubeconfig, BootstrapSecretName: w.BootstrapSecretName}
	w.clusters = append(w.clusters, first)

	if o.Split != nil {
		if err := w.startSides(ctx, o, first); err != nil {
			return w, err
		}
		phase("side processes serving")
		if err := w.waitWebhooksActive(ctx); err != nil {
			return w, err
		}
	} else if err := w.startInProcess(ctx, o, first); err != nil {
		return w, err
	}
	phase("webhooks active")
	if o.Published {
		if err := w.startPublished(ctx); err != nil {
			return w, err
		}
		phase("published kinds served")
	}
	if o.CAPA != nil {
		if err := w.startCAPA(ctx, o.CAPA); err != nil {
			return w, err
		}
		phase("CAPA ready")
	}
	if err := w.createHubObjects(ctx, first); err != nil {
		return w, err
	}
	if err := w.startSpokeComponents(ctx, first); err != nil {
		return w, err
	}
	phase("scheduler and controller manager ready")
	if err := w.waitClusterReady(ctx, first); err != nil {
		return w, err
	}
	phase("cluster ready")
	return w, nil
}

// startInProcess runs the world's controllers and simulators in this
// process: the hub's controller manager (and webhooks), the simulated AWS,
// kubelet and bootstrap provider.
func (w *World) startInProcess(ctx context.Context, o Options, first *WorkloadCluster) error {
	log := w.log
	var err error
	// Controllers: the hub's controller manager and the simulated kubelet.
	mctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	mctx = ctrl.LoggerInto(mctx, log)
	w.mctx = mctx
	if o.Published {
		if err := enablePublished(); err != nil {
			return err
		}
	}
	if w.hub, err = newHubManager(mctx, w.Hub.Config, log.WithName("capi"), o.Published); err != nil {
		return err
	}
	if o.Published {
		// Before the controllers start: a controller watching a kind its
		// manager's REST mapper did not know at start may never see it.
		if err := w.installPublishedCRDs(); err != nil {
			return err
		}
	}
	managers := []ctrl.Manager{w.hub.mgr}
	if w.AWS != nil {
		awsMgr, err := newAWSManager(w.Hub.Config, w.AWS, log.WithName("aws"))
		if err != nil {
			return err
		}
		managers = append(managers, awsMgr)
	}
	spokeMgr, err := newSpokeManager(w.Spoke.Config, w.instances, w.clusterKey(first), w.readyDelay, w.pullDelay, w.joinMode, w.kubeletHeld, log.WithName("kubelet"))
	if err != nil {
		return err
	}
	bootMgr, err := newBootstrapManager(w.Hub.Config, log.WithName("bootstrap"))
	if err != nil {
		return err
	}
	for _, m := range append(managers, spokeMgr, bootMgr) {
		w.startManager(m)
	}
	log.WithName("world").Info("start phase done", "phase", "managers started")
	if err := w.hub.installWebhooks(ctx, w.Hub.Config); err != nil {
		return fmt.Errorf("installing Cluster API webhooks: %w", err)
	}
	if err := w.waitWebhooksActive(ctx); err != nil {
		return err
	}
	return nil
}

// startManager runs a controller manager until the world stops.
func (w *World) startManager(m ctrl.Manager) {
	done := make(chan error, 1)
	w.mu.Lock()
	w.managersDone = append(w.managersDone, done)
	w.mu.Unlock()
	go func() { done <- m.Start(w.mctx) }()
}

func (w *World) clusterKey(c *WorkloadCluster) types.NamespacedName {
	return types.NamespacedName{Namespace: c.Namespace, Name: c.Name}
}

func (w *World) startAPIServers(workloadCRDs bool) error {
	audit, spokeAudit, err := w.auditConfiguration()
	if err != nil {
		return err
	}
	startSpoke := func() (*environment.Cluster, error) { return environment.StartSpoke(spokeAudit) }
	if !workloadCRDs {
		startSpoke = func() (*environment.Cluster, error) { return environment.Start("spoke", nil) }
	}
	var wg sync.WaitGroup
	var hubErr, spokeErr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		hubErr = placement.Do(w.hubCPUs(), func() (err error) { w.Hub, err = environment.StartHub(audit); return err })
	}()
	go func() {
		defer wg.Done()
		spokeErr = placement.Do(w.workloadCPUs(), func() (err error) { w.Spoke, err = startSpoke(); return err })
	}()
	wg.Wait()
	return errors.Join(hubErr, spokeErr)
}

// hubCPUs and workloadCPUs are the CPU sets of the two sides (none: anywhere).
func (w *World) hubCPUs() placement.CPUs {
	if w.split == nil {
		return nil
	}
	return w.split.HubCPUs
}

func (w *World) workloadCPUs() placement.CPUs {
	if w.split == nil {
		return nil
	}
	return w.split.WorkloadCPUs
}

// newAWSManager runs the AWS simulator against the hub in a manager of its
// own, as CAPA runs in a controller manager of its own.
func newAWSManager(cfg *rest.Config, aws *SimAWS, log logr.Logger) (ctrl.Manager, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, clusterv1.AddToScheme, infrav1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	mgr, err := ctrl.NewManager(rest.CopyConfig(cfg), ctrl.Options{
		Scheme:                 s,
		Logger:                 log,
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// Like CAPA, read Secrets (bootstrap data) without caching them all.
		Client: client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
		Cache:  cache.Options{NewInformer: reconnectingInformer}, // see StopHubAPIServer
	})
	if err != nil {
		return nil, err
	}
	return mgr, aws.setupWithManager(mgr)
}

// SetNodeReadyDelay sets how long Nodes registered from now on report
// NotReady after registering (Options.NodeReadyDelay).
func (w *World) SetNodeReadyDelay(d time.Duration) { w.nodeReadyDelay.Store(int64(d)) }

func (w *World) readyDelay() time.Duration { return time.Duration(w.nodeReadyDelay.Load()) }

// SetImagePullDelay sets how long a Node takes to pull an image it has not
// run yet (Options.ImagePullDelay).
func (w *World) SetImagePullDelay(d time.Duration) { w.imagePullDelay.Store(int64(d)) }

func (w *World) pullDelay() time.Duration { return time.Duration(w.imagePullDelay.Load()) }

// newSpokeManager runs the simulated kubelet of the Cluster's instances
// against its workload cluster.
func newSpokeManager(cfg *rest.Config, aws instanceSource, cluster types.NamespacedName, readyDelay, pullDelay func() time.Duration, join func() JoinMode, hold func() bool, log logr.Logger) (ctrl.Manager, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	mgr, err := ctrl.NewManager(rest.CopyConfig(cfg), ctrl.Options{
		Scheme:                 s,
		Logger:                 log,
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  cache.Options{NewInformer: reconnectingInformer}, // see StopSpokeAPIServer
	})
	if err != nil {
		return nil, err
	}
	k := newSimKubelet(aws, cluster)
	k.readyDelay, k.pullDelay, k.join, k.holdJoin = readyDelay, pullDelay, join, hold
	return mgr, k.setupWithManager(mgr)
}

// waitWebhooksActive waits until the hub's API server calls the defaulting
// webhook: a dry-run MachineDeployment without rollout strategy gets one.
func (w *World) waitWebhooksActive(ctx context.Context) error {
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{
			Namespace: "default", Name: "webhook-probe", ClusterName: "webhook-probe",
		})
		if err := w.Hub.Client.Create(ctx, md, client.DryRunAll); err != nil {
			return false, nil //nolint:nilerr // the webhook may not answer yet
		}
		return md.Spec.Rollout.Strategy.Type != "", nil
	})
}

// createHubObjects creates a Cluster's objects in the hub: its Cluster,
// AWSCluster, control plane, kubeconfig and bootstrap data Secrets.
func (w *World) createHubObjects(ctx context.Context, wc *WorkloadCluster) error {
	c := w.Hub.Client
	ns, name := wc.Namespace, wc.Name
	u, err := url.Parse(wc.Spoke.Config.Host)
	if err != nil {
		return err
	}
	host, portStr, err := net.SplitHostPort(u.Host)
	if err != nil {
		return err
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return err
	}
	if err := client.IgnoreAlreadyExists(c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})); err != nil {
		return err
	}
	kubeconfig, err := environment.KubeconfigBytes(wc.Spoke.Config, name)
	if err != nil {
		return err
	}
	boot, err := BootstrapSecret(ns, wc.BootstrapSecretName, name, DefaultBootstrapData())
	if err != nil {
		return err
	}
	cp := controlPlaneObject(ns, name, host, int64(port))
	var awsCluster *infrav1.AWSCluster
	if w.EC2 != nil {
		awsCluster = w.externalAWSCluster(ns, name, host, int32(port))
	} else {
		awsCluster = &infrav1.AWSCluster{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: infrav1.AWSClusterSpec{
				Region:               regionOf(w.zones[0]),
				ControlPlaneEndpoint: clusterv1beta1.APIEndpoint{Host: host, Port: int32(port)},
			},
		}
	}
	objects := []client.Object{
		&corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-kubeconfig", Labels: map[string]string{clusterv1.ClusterNameLabel: name}},
			Type:       clusterv1.ClusterSecretType,
			Data:       map[string][]byte{"value": kubeconfig},
		},
		boot,
		cp,
		awsCluster,
		&clusterv1.Cluster{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: clusterv1.ClusterSpec{
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "AWSCluster", Name: name},
				ControlPlaneRef:   clusterv1.ContractVersionedObjectReference{APIGroup: ControlPlaneGroup, Kind: ControlPlaneKind, Name: name},
			},
		},
	}
	for _, o := range objects {
		if err := c.Create(ctx, o); err != nil {
			return fmt.Errorf("creating %T %s: %w", o, o.GetName(), err)
		}
	}
	if w.EC2 != nil {
		if err := w.markExternalAWSClusterReady(ctx, awsCluster); err != nil {
			return fmt.Errorf("writing the status of AWSCluster %s: %w", name, err)
		}
	}
	// The managed control plane is up from the start.
	if err := unstructured.SetNestedField(cp.Object, controlPlaneStatus(cp.GetGeneration()), "status"); err != nil {
		return err
	}
	return c.Status().Update(ctx, cp)
}

// waitClusterReady waits until Cluster API sees the infrastructure
// provisioned, the control plane initialized and the spoke reachable.
func (w *World) waitClusterReady(ctx context.Context, wc *WorkloadCluster) error {
	cluster := &clusterv1.Cluster{}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := w.Hub.Client.Get(ctx, w.clusterKey(wc), cluster); err != nil {
			return false, err
		}
		return conditions.IsTrue(cluster, clusterv1.ClusterInfrastructureReadyCondition) &&
			conditions.IsTrue(cluster, clusterv1.ClusterControlPlaneInitializedCondition) &&
			conditions.IsTrue(cluster, clusterv1.ClusterRemoteConnectionProbeCondition), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for Cluster %s to be ready (conditions %v): %w", w.clusterKey(wc), cluster.Status.Conditions, err)
	}
	return nil
}

// CreateAWSMachineTemplate creates AWSMachineTemplate(namespace of the world,
// name, instanceType, spot) and writes its status.
func (w *World) CreateAWSMachineTemplate(ctx context.Context, name, instanceType string, spot bool) (*infrav1.AWSMachineTemplate, error) {
	t := AWSMachineTemplate(w.Namespace, name, instanceType, spot)
	status := t.Status
	if err := w.Hub.Client.Create(ctx, t); err != nil {
		return nil, err
	}
	t.Status = status
	if err := w.Hub.Client.Status().Update(ctx, t); err != nil {
		return nil, err
	}
	return t, nil
}

// LogFiles returns the world's log files.
func (w *World) LogFiles() []string {
	var out []string
	files := []string{"world.log", "world-hub.log", "world-kubelet.log", "capa.log", filepath.Base(w.SpokeAuditLog)}
	for _, c := range w.workloadClusters() {
		files = append(files, "kube-scheduler"+c.logSuffix+".log", "kube-controller-manager"+c.logSuffix+".log")
	}
	for _, f := range files {
		p := filepath.Join(w.Dir, f)
		if _, err := os.Stat(p); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// Cluster returns the world's Cluster name (the first one or one AddCluster
// added), or nil.
func (w *World) Cluster(name string) *WorkloadCluster {
	for _, c := range w.workloadClusters() {
		if c.Name == name {
			return c
		}
	}
	return nil
}

func (w *World) workloadClusters() []*WorkloadCluster {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]*WorkloadCluster(nil), w.clusters...)
}

// AddCluster adds a Cluster name to the running world, in its Namespace,
// with a workload cluster of its own: an API server with the Karpenter and
// NodeClass CRDs, kube-scheduler, kube-controller-manager and a simulated
// kubelet for the instances of the Cluster's Machines. In the hub it gets
// what the first Cluster has (Cluster, AWSCluster, control plane,
// "<name>-kubeconfig" and "<name>-bootstrap" Secrets); Cluster API's
// ClusterCache reaches it through its kubeconfig Secret. It returns once
// Cluster API sees the Cluster ready. Stop stops it with the world.
func (w *World) AddCluster(ctx context.Context, name string) (*WorkloadCluster, error) {
	return w.AddClusterIn(ctx, w.Namespace, name)
}

// AddClusterIn is AddCluster with the Cluster in another hub namespace,
// created if missing (names stay unique across the world).
func (w *World) AddClusterIn(ctx context.Context, namespace, name string) (*WorkloadCluster, error) {
	if w.Cluster(name) != nil {
		return nil, fmt.Errorf("the world has a Cluster %s already", name)
	}
	if w.EC2 != nil {
		return nil, errors.New("AddCluster: a world with the real CAPA has one Cluster")
	}
	if w.split != nil {
		return nil, errors.New("AddCluster: a split world has one Cluster")
	}
	t0 := time.Now()
	spoke, err := environment.StartSpoke()
	if err != nil {
		return nil, fmt.Errorf("adding Cluster %s: %w", name, err)
	}
	spoke.Name = "spoke-" + name
	wc := &WorkloadCluster{Namespace: namespace, Name: name, Spoke: spoke, BootstrapSecretName: name + "-bootstrap", logSuffix: "-" + name}
	w.mu.Lock()
	w.clusters = append(w.clusters, wc) // Stop stops it from now on
	w.mu.Unlock()
	if wc.SpokeKubeconfig, err = spoke.WriteKubeconfig(w.Dir); err != nil {
		return nil, err
	}
	mgr, err := newSpokeManager(spoke.Config, w.instances, w.clusterKey(wc), w.readyDelay, w.pullDelay, w.joinMode, w.kubeletHeld, w.log.WithName("kubelet-"+name))
	if err != nil {
		return nil, err
	}
	w.startManager(mgr)
	if err := w.createHubObjects(ctx, wc); err != nil {
		return nil, fmt.Errorf("adding Cluster %s: %w", name, err)
	}
	if err := w.startSpokeComponents(ctx, wc); err != nil {
		return nil, fmt.Errorf("adding Cluster %s: %w", name, err)
	}
	if err := w.waitClusterReady(ctx, wc); err != nil {
		return nil, err
	}
	w.log.WithName("world").Info("Cluster added", "namespace", namespace, "cluster", name, "elapsed", time.Since(t0).Round(time.Millisecond).String())
	return wc, nil
}

// StopHubAPIServer kills the hub's kube-apiserver (SIGKILL: a crash, no
// graceful shutdown), leaving etcd, the controllers and the simulators
// running: every client of the hub sees refused connections until
// StartHubAPIServer. The world's own controllers retry every 250 ms
// meanwhile (reconnectingInformer) and resume at once when it is back.
func (w *World) StopHubAPIServer() error {
	return w.Hub.KillAPIServer()
}

// StartHubAPIServer starts the hub's kube-apiserver again on the same
// address, with the same certificates, users, audit settings and etcd, and
// returns once it is ready. Clients reconnect on their own.
func (w *World) StartHubAPIServer(ctx context.Context) error {
	return w.Hub.RestartAPIServer(ctx)
}

// StopSpokeAPIServer kills the first Cluster's workload cluster
// kube-apiserver (SIGKILL), leaving etcd, the kube-scheduler, the
// kube-controller-manager and the simulated kubelet running: every client
// of the spoke sees refused connections until StartSpokeAPIServer.
func (w *World) StopSpokeAPIServer() error {
	return w.Spoke.KillAPIServer()
}

// StartSpokeAPIServer starts the workload cluster's kube-apiserver again on
// the same address, certificates, users and etcd, then restarts its
// kube-scheduler and kube-controller-manager, as the reboot of a control
// plane node would, and returns once all three work. Other clients
// reconnect on their own.
//
// Why restart the two: they are client-go programs, and client-go's
// reflectors back off up to 30 s (60 s with jitter) while an API server is
// down; the scheduler would then mark pending pods unschedulable, which is
// what Karpenter waits for, only up to a minute after the return. An outage
// test measures the provider, not the scheduler's back-off.
func (w *World) StartSpokeAPIServer(ctx context.Context) error {
	if err := w.Spoke.RestartAPIServer(ctx); err != nil {
		return err
	}
	first := w.workloadClusters()[0]
	if err := first.stopSpokeComponents(); err != nil {
		return err
	}
	return w.startSpokeComponents(ctx, first)
}

// Stop stops everything Start started, in reverse order, and waits for it:
// the spoke's scheduler and controller manager (process groups), the
// controllers, the API servers. Dir is removed unless KeepDir is set.
func (w *World) Stop() error {
	w.stopOnce.Do(func() {
		var errs []error
		clusters := w.workloadClusters()
		for _, c := range clusters {
			errs = append(errs, c.stopSpokeComponents())
		}
		errs = append(errs, w.capa.stop())
		errs = append(errs, w.stopSides())
		if w.cancel != nil {
			w.cancel()
			w.mu.Lock()
			managersDone := append([]chan error(nil), w.managersDone...)
			w.mu.Unlock()
			for _, done := range managersDone {
				select {
				case err := <-done:
					if err != nil && !errors.Is(err, context.Canceled) {
						errs = append(errs, err)
					}
				case <-time.After(60 * time.Second):
					errs = append(errs, errors.New("a controller manager did not stop within 60s"))
				}
			}
		}
		if w.hub != nil {
			w.hub.shutdownClusterCache()
			errs = append(errs, w.hub.webhooks.Cleanup())
		}
		for _, c := range clusters {
			if c.Spoke != w.Spoke {
				errs = append(errs, c.Spoke.Stop())
			}
		}
		if w.Spoke != nil {
			errs = append(errs, w.Spoke.Stop())
		}
		if w.Hub != nil {
			errs = append(errs, w.Hub.Stop())
		}
		if w.EC2 != nil {
			errs = append(errs, w.EC2.Close())
		}
		if w.logFile != nil {
			_ = w.logFile.Close()
		}
		if !w.KeepDir {
			errs = append(errs, os.RemoveAll(w.Dir))
		}
		w.stopErr = errors.Join(errs...)
	})
	return w.stopErr
}
