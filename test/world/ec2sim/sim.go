// Package ec2sim is a simulated EC2 (and the AWS Secrets Manager CAPA keeps
// bootstrap data in) for running Cluster API Provider AWS's real controllers
// in tests. It speaks the wire protocols of the AWS SDK for Go v2, which CAPA
// v2.13 uses: EC2's Query protocol (form-encoded Action=..., XML answers,
// errors as <Response><Errors><Error><Code>...) and Secrets Manager's JSON
// 1.1 protocol (X-Amz-Target). Point CAPA's --service-endpoints at URL().
//
// It answers the actions CAPA's AWSMachine and AWSMachineTemplate
// controllers call for a worker machine (see actions in ec2.go); any other
// action gets EC2's InvalidAction error and is recorded in
// UnknownActions(), so a test notices a CAPA code path nobody simulated.
//
// # Instances: state machine
//
//	RunInstances ──► pending ──(PendingFor)──► running
//	                    │                         │
//	TerminateInstances / Interrupt (spot) / ──────┘
//	                    ▼
//	              shutting-down ──(ShuttingDownFor)──► terminated
//
// Invariants: an instance only moves forward along these arrows; a
// terminated instance stays visible to DescribeInstances (as on EC2, for a
// while) and never counts as Live; capacity (Pool) is held from launch until
// terminated. Every state change is reported to OnChange listeners.
//
// # Capacity
//
// A launch asks for one instance of a pool (instance type, zone, market:
// on-demand or spot). Pools are unlimited unless SetCapacity limits them;
// a pool at its limit fails RunInstances as EC2 does: on-demand with
// InsufficientInstanceCapacity (HTTP 500), spot with
// InsufficientInstanceCapacity and EC2's spot wording; SetLaunchError makes a
// pool answer another code instead (e.g. InsufficientCapacity).
// SetSpotPrice makes spot requests whose max price is lower fail with
// SpotMaxPriceTooLow (HTTP 400).
package ec2sim

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// Markets of a pool, spelled like Karpenter's capacity types.
const (
	OnDemand = "on-demand"
	Spot     = "spot"
)

// Instance states, as EC2 names them.
const (
	StatePending      = "pending"
	StateRunning      = "running"
	StateShuttingDown = "shutting-down"
	StateTerminated   = "terminated"
)

// stateCodes are EC2's numeric instance state codes.
var stateCodes = map[string]int{StatePending: 0, StateRunning: 16, StateShuttingDown: 32, StateTerminated: 48}

// InstanceType is one entry of the simulated catalogue (DescribeInstanceTypes).
type InstanceType struct {
	Name     string
	VCPUs    int
	MemoryMi int64
	// Arch is EC2's architecture name: x86_64 or arm64.
	Arch string
}

// Image is an AMI DescribeImages knows.
type Image struct {
	ID, Name, OwnerID string
	Arch              string // x86_64 or arm64
	Created           time.Time
}

// Pool names the capacity one launch draws on. Empty fields match any.
type Pool struct {
	InstanceType, Zone, Market string
}

func (p Pool) matches(q Pool) bool {
	return (p.InstanceType == "" || p.InstanceType == q.InstanceType) &&
		(p.Zone == "" || p.Zone == q.Zone) && (p.Market == "" || p.Market == q.Market)
}

// Instance is one simulated EC2 instance.
type Instance struct {
	ID, Type, Zone, Market, SubnetID, ImageID string
	State                                     string
	// StateReason is EC2's stateReason code once the instance stops
	// (Client.UserInitiatedShutdown, Server.SpotInstanceTermination).
	StateReason        string
	PrivateIP, DNSName string
	ENI                string
	SecurityGroups     []string
	Tags               map[string]string
	// UserData is the decoded (base64) user data of RunInstances.
	UserData   []byte
	LaunchTime time.Time
	// MetadataOptions: httpTokens, httpEndpoint, hop limit, tags.
	HTTPTokens, HTTPEndpoint, MetadataTags string
	HopLimit                               int
	nextAt                                 time.Time // when the current timed state ends
}

// ProviderID is the providerID CAPA gives the instance's Machine and the
// cloud provider gives its Node: aws:///<zone>/<id>.
func (i Instance) ProviderID() string { return fmt.Sprintf("aws:///%s/%s", i.Zone, i.ID) }

// Options shape a Sim. Zero values take defaults.
type Options struct {
	// Region (default us-east-1) and its Zones (default us-east-1a..c).
	Region string
	Zones  []string
	// PendingFor and ShuttingDownFor are how long instances stay pending
	// and shutting-down (default 1s each).
	PendingFor, ShuttingDownFor time.Duration
	// InstanceTypes is the catalogue (default DefaultInstanceTypes).
	InstanceTypes []InstanceType
	// Images DescribeImages knows, besides CAPA's published lookup names
	// for every Kubernetes version asked (see images.go).
	Images []Image
}

// Sim is a running simulator. Its methods are goroutine-safe.
type Sim struct {
	region string
	zones  []string
	types  map[string]InstanceType
	vpcID  string

	mu          sync.Mutex
	pendingFor  time.Duration
	shutdownFor time.Duration
	images      []Image
	instances   map[string]*Instance
	capacity    map[Pool]int
	launchErr   map[Pool]string
	spotPrice   map[Pool]float64
	secrets     map[string][]byte
	// resourceTags are the tags of interfaces and volumes (instances keep theirs).
	resourceTags map[string]map[string]string
	unknown      map[string]int
	// launchErrors counts failed RunInstances by error code.
	launchErrors map[[2]string]int
	calls        map[string]int
	nextIP       int
	listeners    []func(Instance)

	srv      *http.Server
	listener net.Listener
	stop     chan struct{}
	done     chan struct{}
}

// DefaultInstanceTypes are real EC2 sizes (vCPUs, MiB, architecture).
var DefaultInstanceTypes = []InstanceType{
	{"t3.medium", 2, 4096, "x86_64"}, {"m5.large", 2, 8192, "x86_64"}, {"m5.xlarge", 4, 16384, "x86_64"},
	{"m5.2xlarge", 8, 32768, "x86_64"}, {"c5.large", 2, 4096, "x86_64"}, {"c5.xlarge", 4, 8192, "x86_64"},
	{"r5.large", 2, 16384, "x86_64"}, {"m6g.large", 2, 8192, "arm64"}, {"m6g.xlarge", 4, 16384, "arm64"},
	{"g4dn.xlarge", 4, 16384, "x86_64"},
}

// Start starts a simulator on a loopback port.
func Start(o Options) (*Sim, error) {
	if o.Region == "" {
		o.Region = "us-east-1"
	}
	if len(o.Zones) == 0 {
		o.Zones = []string{o.Region + "a", o.Region + "b", o.Region + "c"}
	}
	if o.PendingFor == 0 {
		o.PendingFor = time.Second
	}
	if o.ShuttingDownFor == 0 {
		o.ShuttingDownFor = time.Second
	}
	if len(o.InstanceTypes) == 0 {
		o.InstanceTypes = DefaultInstanceTypes
	}
	s := &Sim{
		region: o.Region, zones: append([]string(nil), o.Zones...), types: map[string]InstanceType{},
		vpcID: "vpc-0sim" + randomHex(9), pendingFor: o.PendingFor, shutdownFor: o.ShuttingDownFor,
		images: append([]Image(nil), o.Images...), instances: map[string]*Instance{}, capacity: map[Pool]int{},
		launchErr: map[Pool]string{}, spotPrice: map[Pool]float64{}, secrets: map[string][]byte{}, resourceTags: map[string]map[string]string{},
		unknown: map[string]int{}, launchErrors: map[[2]string]int{}, calls: map[string]int{}, stop: make(chan struct{}), done: make(chan struct{}),
	}
	for _, t := range o.InstanceTypes {
		s.types[t.Name] = t
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s.listener = l
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(l) }()
	go s.tick()
	return s, nil
}

// URL is the endpoint for every simulated service.
func (s *Sim) URL() string { return "http://" + s.listener.Addr().String() }

// Region returns the simulated region; Zones its availability zones.
func (s *Sim) Region() string  { return s.region }
func (s *Sim) Zones() []string { return append([]string(nil), s.zones...) }

// VPCID is the one VPC; SubnetID the private subnet of a zone.
func (s *Sim) VPCID() string { return s.vpcID }

// SubnetID returns the private subnet of a zone.
func (s *Sim) SubnetID(zone string) string {
	for i, z := range s.zones {
		if z == zone {
			return fmt.Sprintf("subnet-0sim%012d", i)
		}
	}
	return ""
}

// Close stops the simulator.
func (s *Sim) Close() error {
	close(s.stop)
	<-s.done
	return s.srv.Close()
}

// SetCapacity limits a pool to n instances at a time (pending, running or
// shutting-down); n < 0 removes the limit. 0 exhausts it.
func (s *Sim) SetCapacity(p Pool, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n < 0 {
		delete(s.capacity, p)
		return
	}
	s.capacity[p] = n
}

// SetLaunchError makes launches from a pool at its limit fail with code
// (InsufficientInstanceCapacity by default, or InsufficientCapacity);
// empty restores the default.
func (s *Sim) SetLaunchError(p Pool, code string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if code == "" {
		delete(s.launchErr, p)
		return
	}
	s.launchErr[p] = code
}

// SetSpotPrice sets the current spot price of a pool (Market is ignored):
// spot requests with a lower max price fail with SpotMaxPriceTooLow.
func (s *Sim) SetSpotPrice(p Pool, price float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p.Market = Spot
	s.spotPrice[p] = price
}

// OnChange registers a listener called (outside the lock) after every
// state change of an instance, and at launch.
func (s *Sim) OnChange(f func(Instance)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listeners = append(s.listeners, f)
}

// Instance returns an instance by ID (terminated ones included).
func (s *Sim) Instance(id string) (Instance, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	in, ok := s.instances[id]
	if !ok {
		return Instance{}, false
	}
	return in.copy(), true
}

// InstanceByDNSName returns the instance with a private DNS name.
func (s *Sim) InstanceByDNSName(name string) (Instance, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, in := range s.instances {
		if in.DNSName == name {
			return in.copy(), true
		}
	}
	return Instance{}, false
}

// Instances returns every instance, terminated ones included, by launch time.
func (s *Sim) Instances() []Instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Instance, 0, len(s.instances))
	for _, in := range s.instances {
		out = append(out, in.copy())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].LaunchTime.Before(out[j].LaunchTime) })
	return out
}

// Live returns the instances not terminated: what a bill would show.
func (s *Sim) Live() []Instance {
	var out []Instance
	for _, in := range s.Instances() {
		if in.State != StateTerminated {
			out = append(out, in)
		}
	}
	return out
}

// Interrupt terminates an instance on the cloud's initiative, as a spot
// interruption does: it goes shutting-down with reason
// Server.SpotInstanceTermination, then terminated.
func (s *Sim) Interrupt(id string) error {
	s.mu.Lock()
	in, ok := s.instances[id]
	if !ok || in.State == StateShuttingDown || in.State == StateTerminated {
		s.mu.Unlock()
		return fmt.Errorf("instance %s is not running", id)
	}
	in.State, in.StateReason, in.nextAt = StateShuttingDown, "Server.SpotInstanceTermination", time.Now().Add(s.shutdownFor)
	snap := in.copy()
	s.mu.Unlock()
	s.notify(snap)
	return nil
}

// Calls returns how often each action was called.
func (s *Sim) Calls() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.calls))
	for k, v := range s.calls {
		out[k] = v
	}
	return out
}

// LaunchErrors returns how many launches of an instance type EC2 refused
// with an error code.
func (s *Sim) LaunchErrors(code, instanceType string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.launchErrors[[2]string{code, instanceType}]
}

// LaunchErrorCodes returns how many launches EC2 refused, by error code.
func (s *Sim) LaunchErrorCodes() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for k, v := range s.launchErrors {
		out[k[0]] += v
	}
	return out
}

// UnknownActions returns the actions asked for that the simulator does not
// implement, with their counts.
func (s *Sim) UnknownActions() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.unknown))
	for k, v := range s.unknown {
		out[k] = v
	}
	return out
}

// Secret returns a Secrets Manager secret's binary value.
func (s *Sim) Secret(name string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.secrets[name]
	return append([]byte(nil), v...), ok
}

// SecretCount is how many Secrets Manager secrets exist (CAPA deletes a
// machine's once its Node joined or it is deleted: leftovers leak).
func (s *Sim) SecretCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.secrets)
}

func (in *Instance) copy() Instance {
	c := *in
	c.Tags = make(map[string]string, len(in.Tags))
	for k, v := range in.Tags {
		c.Tags[k] = v
	}
	c.SecurityGroups = append([]string(nil), in.SecurityGroups...)
	c.UserData = append([]byte(nil), in.UserData...)
	return c
}

// tick moves timed states forward.
func (s *Sim) tick() {
	defer close(s.done)
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.advance()
		}
	}
}

// advance applies the timed transitions that are due and notifies listeners.
func (s *Sim) advance() {
	now := time.Now()
	var changed []Instance
	s.mu.Lock()
	for _, in := range s.instances {
		if in.nextAt.IsZero() || now.Before(in.nextAt) {
			continue
		}
		switch in.State {
		case StatePending:
			in.State, in.nextAt = StateRunning, time.Time{}
		case StateShuttingDown:
			in.State, in.nextAt = StateTerminated, time.Time{}
		}
		changed = append(changed, in.copy())
	}
	s.mu.Unlock()
	for _, in := range changed {
		s.notify(in)
	}
}

func (s *Sim) notify(in Instance) {
	s.mu.Lock()
	ls := append([]func(Instance){}, s.listeners...)
	s.mu.Unlock()
	for _, l := range ls {
		l(in)
	}
}

// holding counts the instances of a pool that hold capacity.
func (s *Sim) holding(p Pool) int {
	n := 0
	for _, in := range s.instances {
		if in.State != StateTerminated && p.matches(Pool{in.Type, in.Zone, in.Market}) {
			n++
		}
	}
	return n
}

// capacityError returns the EC2 error a launch from pool q gets, if any.
func (s *Sim) capacityError(q Pool, maxPrice float64) *apiError {
	if q.Market == Spot && maxPrice > 0 {
		for p, price := range s.spotPrice {
			if p.matches(q) && maxPrice < price {
				return &apiError{status: http.StatusBadRequest, code: "SpotMaxPriceTooLow", message: fmt.Sprintf(
					"Your Spot request price of %g is lower than the minimum required Spot request fulfillment price of %g.", maxPrice, price)}
			}
		}
	}
	for p, limit := range s.capacity {
		if !p.matches(q) || s.holding(p) < limit {
			continue
		}
		code := "InsufficientInstanceCapacity"
		for ep, c := range s.launchErr {
			if ep.matches(q) {
				code = c
			}
		}
		msg := fmt.Sprintf("We currently do not have sufficient %s capacity in the Availability Zone you requested (%s). "+
			"Our system will be working on provisioning additional capacity. You can currently get %s capacity by not "+
			"specifying an Availability Zone in your request or choosing an Availability Zone other than %s.", q.InstanceType, q.Zone, q.InstanceType, q.Zone)
		switch {
		case code == "InsufficientCapacity":
			msg = "There is not enough capacity to fulfill your request."
		case q.Market == Spot:
			msg = "There is no Spot capacity available that matches your request."
		}
		return &apiError{status: http.StatusInternalServerError, code: code, message: msg}
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, (n+1)/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)[:n]
}

func requestID() string {
	h := randomHex(32)
	return strings.Join([]string{h[0:8], h[8:12], h[12:16], h[16:20], h[20:32]}, "-")
}
