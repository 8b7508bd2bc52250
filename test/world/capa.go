package world

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	infrav1 "sigs.k8s.io/cluster-api-provider-aws/v2/api/v1beta2"
	clusterv1beta1 "sigs.k8s.io/cluster-api/api/core/v1beta1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/autonode/karpenter-clusterapi/test/environment"
	"github.com/autonode/karpenter-clusterapi/test/world/ec2sim"
)

// CAPAOptions make a World run Cluster API Provider AWS's real controller
// manager (a binary built by hack/capa-bin.sh) against a simulated EC2
// (ec2sim) instead of SimAWS, the world's own stand-in for CAPA.
//
// What is real and what is not:
//   - CAPA's AWSMachine and AWSMachineTemplate controllers and its admission
//     webhooks (defaulting and validation of AWSCluster, AWSMachine,
//     AWSMachineTemplate and the identity kinds) run unchanged; only EC2 and
//     Secrets Manager behind --service-endpoints are simulated.
//   - The AWSCluster is externally managed (annotation
//     cluster.x-k8s.io/managed-by): CAPA's AWSCluster controller leaves it
//     alone and the world writes its status (ready, failure domains) and its
//     BYO network (the simulator's VPC and one private subnet per zone), as
//     a user's own infrastructure tooling would. A CAPA-managed AWSCluster
//     would need VPC, NAT, route table, security group and load balancer
//     APIs that a worker machine never calls. What the AWSMachine path does
//     differently for an externally managed cluster: it uses only the
//     machine's additionalSecurityGroups (no CAPA-made node and lb groups),
//     and does not wait for the API server load balancer.
//   - CAPA runs with its default feature gates except EKS and MachinePool
//     (off: their controllers need the EKS and AWSMachinePool kinds, which
//     this world does not serve; they play no part in a worker AWSMachine).
//   - Bootstrap data goes through (simulated) Secrets Manager, CAPA's
//     default; the simulated kubelet reads it back as an instance's boot
//     script would, so a Node joins only with the data CAPA stored.
type CAPAOptions struct {
	// Binary is CAPA's manager binary.
	Binary string
	// ShuttingDownFor is how long a terminating instance stays
	// shutting-down (default 1s). Options.ProvisionDelay is how long a new
	// one stays pending.
	ShuttingDownFor time.Duration
}

// capaResources are the CAPA kinds whose webhooks the world registers:
// those whose CRDs the hub serves.
var capaResources = sets.New("awsclusters", "awsmachines", "awsmachinetemplates",
	"awsclustercontrolleridentities", "awsclusterroleidentities", "awsclusterstaticidentities")

// capaManager is CAPA's controller manager subprocess and its webhook
// registration.
type capaManager struct {
	proc     *process
	webhooks *envtest.WebhookInstallOptions
	health   string
}

// startCAPA installs the CRDs CAPA needs beyond the world's, starts CAPA's
// manager against the hub with EC2 and Secrets Manager on the simulator,
// waits until it is ready and registers its webhooks.
func (w *World) startCAPA(ctx context.Context, o *CAPAOptions) error {
	crds, err := environment.CAPAControllerCRDs()
	if err != nil {
		return err
	}
	if _, err := envtest.InstallCRDs(w.Hub.Config, envtest.CRDInstallOptions{CRDs: crds}); err != nil {
		return fmt.Errorf("installing CAPA's identity CRDs: %w", err)
	}
	capaDir, err := environment.ModuleDir("sigs.k8s.io/cluster-api-provider-aws/v2")
	if err != nil {
		return err
	}
	wh := &envtest.WebhookInstallOptions{LocalServingHost: "127.0.0.1"}
	if wh.MutatingWebhooks, wh.ValidatingWebhooks, err = webhookConfigurations(
		filepath.Join(capaDir, "config", "webhook", "manifests.yaml"), capaResources, "v1beta2", "world-capa"); err != nil {
		return err
	}
	if err := wh.PrepWithoutInstalling(); err != nil {
		return fmt.Errorf("preparing CAPA's webhook serving: %w", err)
	}
	m := &capaManager{webhooks: wh}
	w.capa = m
	healthPort, err := freeLoopbackPort()
	if err != nil {
		return err
	}
	m.health = fmt.Sprintf("127.0.0.1:%d", healthPort)
	url := w.EC2.URL()
	args := []string{
		"--kubeconfig=" + w.HubKubeconfig,
		"--leader-elect=false",
		fmt.Sprintf("--webhook-port=%d", wh.LocalServingPort),
		"--webhook-cert-dir=" + wh.LocalServingCertDir,
		"--health-addr=" + m.health,
		"--diagnostics-address=0",
		"--insecure-diagnostics",
		// ${SigningRegion}:${ServiceID}=${URL},...: every AWS service the
		// worker path calls, on the simulator.
		fmt.Sprintf("--service-endpoints=%s:ec2=%s,secretsmanager=%s,sts=%s", w.EC2.Region(), url, url, url),
		"--feature-gates=EKS=false,MachinePool=false",
		"--v=2",
	}
	env := []string{
		// The AWS SDK's default credential chain: static, dummy keys, and no
		// instance metadata service to ask.
		"AWS_ACCESS_KEY_ID=AKIASIMULATEDWORLD00",
		"AWS_SECRET_ACCESS_KEY=simulated-secret-access-key",
		"AWS_REGION=" + w.EC2.Region(),
		"AWS_EC2_METADATA_DISABLED=true",
		// CAPA's AWSMachineTemplate controller builds its EC2 client without
		// the --service-endpoints resolver (ec2.NewFromConfig of the bare
		// session, v2.13): only the SDK's own endpoint setting reaches it.
		// On AWS both lead to EC2; here both must lead to the simulator.
		"AWS_ENDPOINT_URL_EC2=" + url,
		"AWS_ENDPOINT_URL_SECRETS_MANAGER=" + url,
		"AWS_ENDPOINT_URL_STS=" + url,
		"AWS_CONFIG_FILE=/dev/null",
		"AWS_SHARED_CREDENTIALS_FILE=/dev/null",
		// CAPA looks for its own namespace here (leader election, static identities).
		"POD_NAMESPACE=capa-system",
	}
	if m.proc, err = startProcessWithEnv("cluster-api-provider-aws", o.Binary, args, awsFreeEnv(env), filepath.Join(w.Dir, "capa.log"), nil); err != nil {
		return err
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 90*time.Second, true, func(context.Context) (bool, error) {
		if m.proc.exited() {
			return false, fmt.Errorf("CAPA exited: %v (log %s)", m.proc.err, m.proc.logPath)
		}
		resp, err := http.Get("http://" + m.health + "/readyz")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	}); err != nil {
		return fmt.Errorf("waiting for CAPA to be ready: %w", err)
	}
	if err := wh.Install(w.Hub.Config); err != nil {
		return fmt.Errorf("installing CAPA's webhooks: %w", err)
	}
	return nil
}

func (m *capaManager) stop() error {
	if m == nil {
		return nil
	}
	return errors.Join(m.proc.stop(20*time.Second), m.webhooks.Cleanup())
}

// awsFreeEnv is the test's environment without AWS settings, plus env.
func awsFreeEnv(env []string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AWS_") {
			out = append(out, kv)
		}
	}
	return append(out, env...)
}

func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// simulatedCatalogue is the world's instance type catalogue as EC2 describes it.
func simulatedCatalogue() []ec2sim.InstanceType {
	var out []ec2sim.InstanceType
	for _, name := range InstanceTypeNames() {
		t := InstanceTypes[name]
		arch := "x86_64"
		if t.Arch == "arm64" {
			arch = "arm64"
		}
		out = append(out, ec2sim.InstanceType{Name: name, VCPUs: int(t.CPU.Value()), MemoryMi: t.Memory.Value() >> 20, Arch: arch})
	}
	return out
}

// externalAWSCluster is the AWSCluster of a Cluster whose infrastructure is
// managed outside CAPA: the simulator's VPC and a private subnet per zone.
func (w *World) externalAWSCluster(namespace, name, host string, port int32) *infrav1.AWSCluster {
	c := &infrav1.AWSCluster{}
	c.Namespace, c.Name = namespace, name
	c.Annotations = map[string]string{clusterv1.ManagedByAnnotation: "karpenter-clusterapi-world"}
	c.Spec.Region = w.EC2.Region()
	c.Spec.ControlPlaneEndpoint = clusterv1beta1.APIEndpoint{Host: host, Port: port}
	c.Spec.NetworkSpec.VPC.ID = w.EC2.VPCID()
	for _, z := range w.EC2.Zones() {
		c.Spec.NetworkSpec.Subnets = append(c.Spec.NetworkSpec.Subnets, infrav1.SubnetSpec{
			ID: w.EC2.SubnetID(z), ResourceID: w.EC2.SubnetID(z), AvailabilityZone: z, IsPublic: false,
		})
	}
	return c
}

// markExternalAWSClusterReady writes what the external infrastructure
// manager writes: ready, and a failure domain per zone.
func (w *World) markExternalAWSClusterReady(ctx context.Context, c *infrav1.AWSCluster) error {
	patch := client.MergeFrom(c.DeepCopy())
	c.Status.Ready = true
	c.Status.FailureDomains = clusterv1beta1.FailureDomains{}
	for _, z := range w.EC2.Zones() {
		c.Status.FailureDomains[z] = clusterv1beta1.FailureDomainSpec{ControlPlane: true}
	}
	return w.Hub.Client.Status().Patch(ctx, c, patch)
}

// ec2Instances shows the simulated EC2's instances to the simulated
// kubelet: the kubelet registers a Node for each running instance of its
// Cluster (CAPA's cluster tag), with the bootstrap data the instance's boot
// script would fetch.
type ec2Instances struct {
	sim       *ec2sim.Sim
	namespace string

	mu       sync.Mutex
	userData map[string][]byte // by instance ID, once read: CAPA deletes the secret after the Node joined
}

const capaClusterTagPrefix = "sigs.k8s.io/cluster-api-provider-aws/cluster/"

func (e *ec2Instances) instanceByHostname(host string) (Instance, bool) {
	in, ok := e.sim.InstanceByDNSName(host)
	if !ok {
		return Instance{}, false
	}
	out := Instance{
		ID: in.ID, Type: in.Type, Zone: in.Zone, CapacityType: in.Market, State: infrav1.InstanceState(in.State),
		ProviderID: in.ProviderID(), PrivateIP: in.PrivateIP, Hostname: in.DNSName, LaunchTime: in.LaunchTime,
		Namespace: e.namespace, AWSMachine: in.Tags["Name"],
	}
	for k := range in.Tags {
		if name, ok := strings.CutPrefix(k, capaClusterTagPrefix); ok {
			out.ClusterName = name
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if data, ok := e.userData[in.ID]; ok {
		out.UserData = data
	} else if in.State == ec2sim.StateRunning {
		if data, err := e.sim.BootstrapData(in); err == nil {
			e.userData[in.ID] = data
			out.UserData = data
		}
	}
	return out, true
}

func (e *ec2Instances) onInstanceChange(f func(hostname string)) {
	e.sim.OnChange(func(in ec2sim.Instance) { f(in.DNSName) })
}
