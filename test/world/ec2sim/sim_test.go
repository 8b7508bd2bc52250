package ec2sim

import (
	"encoding/base64"
	"encoding/xml"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// call posts an EC2 Query request as the AWS SDK does and returns the
// status and body.
func call(t *testing.T, s *Sim, form url.Values) (int, string) {
	t.Helper()
	form.Set("Version", "2016-11-15")
	resp, err := http.Post(s.URL(), "application/x-www-form-urlencoded; charset=utf-8", strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func run(t *testing.T, s *Sim, itype, zone string, spotMaxPrice string) (int, string) {
	f := url.Values{"Action": {"RunInstances"}, "InstanceType": {itype}, "ImageId": {"ami-1"}, "MinCount": {"1"}, "MaxCount": {"1"},
		"NetworkInterface.1.SubnetId": {s.SubnetID(zone)}, "NetworkInterface.1.DeviceIndex": {"0"},
		"UserData":                        {base64.StdEncoding.EncodeToString([]byte("#cloud-config\n"))},
		"TagSpecification.1.ResourceType": {"instance"},
		"TagSpecification.1.Tag.1.Key":    {"sigs.k8s.io/cluster-api-provider-aws/cluster/c1"},
		"TagSpecification.1.Tag.1.Value":  {"owned"},
		"TagSpecification.1.Tag.2.Key":    {"Name"},
		"TagSpecification.1.Tag.2.Value":  {"m1"},
	}
	if spotMaxPrice != "-" {
		f.Set("InstanceMarketOptions.MarketType", "spot")
		if spotMaxPrice != "" {
			f.Set("InstanceMarketOptions.SpotOptions.MaxPrice", spotMaxPrice)
		}
	}
	return call(t, s, f)
}

func errorCode(t *testing.T, body string) string {
	t.Helper()
	var e struct {
		Errors []struct {
			Code string `xml:"Error>Code"`
		} `xml:"Errors"`
		RequestID string `xml:"RequestID"`
	}
	if err := xml.Unmarshal([]byte(body), &e); err != nil || len(e.Errors) == 0 || e.RequestID == "" {
		t.Fatalf("not an EC2 error response (%v): %s", err, body)
	}
	return e.Errors[0].Code
}

func waitState(t *testing.T, s *Sim, id, state string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if in, _ := s.Instance(id); in.State == state {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	in, _ := s.Instance(id)
	t.Fatalf("instance %s is %s, want %s", id, in.State, state)
}

func TestLifecycleAndCapacity(t *testing.T) {
	s, err := Start(Options{PendingFor: 100 * time.Millisecond, ShuttingDownFor: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.SetCapacity(Pool{InstanceType: "m5.large", Zone: "us-east-1a", Market: OnDemand}, 1)

	status, body := run(t, s, "m5.large", "us-east-1a", "-")
	if status != 200 || !strings.Contains(body, "<instanceState><code>0</code><name>pending</name>") {
		t.Fatalf("RunInstances: %d %s", status, body)
	}
	id := s.Live()[0].ID
	if got := s.Live()[0].ProviderID(); got != "aws:///us-east-1a/"+id {
		t.Errorf("providerID %q", got)
	}
	waitState(t, s, id, StateRunning)

	// The pool is full: EC2 answers a server error the SDK retries.
	status, body = run(t, s, "m5.large", "us-east-1a", "-")
	if status != 500 || errorCode(t, body) != "InsufficientInstanceCapacity" {
		t.Fatalf("launch beyond capacity: %d %s", status, body)
	}
	// Other zones and spot are other pools.
	if status, body = run(t, s, "m5.large", "us-east-1b", "-"); status != 200 {
		t.Fatalf("other zone: %d %s", status, body)
	}
	s.SetCapacity(Pool{Market: Spot}, 0)
	if status, body = run(t, s, "m5.large", "us-east-1b", ""); status != 500 || errorCode(t, body) != "InsufficientInstanceCapacity" || !strings.Contains(body, "Spot capacity") {
		t.Fatalf("spot exhausted: %d %s", status, body)
	}
	s.SetCapacity(Pool{Market: Spot}, -1)
	s.SetSpotPrice(Pool{InstanceType: "m5.large"}, 0.05)
	if status, body = run(t, s, "m5.large", "us-east-1b", "0.01"); status != 400 || errorCode(t, body) != "SpotMaxPriceTooLow" {
		t.Fatalf("spot max price: %d %s", status, body)
	}
	s.SetLaunchError(Pool{InstanceType: "m5.large"}, "InsufficientCapacity")
	if status, body = run(t, s, "m5.large", "us-east-1a", "-"); status != 500 || errorCode(t, body) != "InsufficientCapacity" {
		t.Fatalf("custom capacity error: %d %s", status, body)
	}

	// Filters as CAPA's GetRunningInstanceByTags sends them.
	_, body = call(t, s, url.Values{"Action": {"DescribeInstances"},
		"Filter.1.Name": {"tag:sigs.k8s.io/cluster-api-provider-aws/cluster/c1"}, "Filter.1.Value.1": {"owned"},
		"Filter.2.Name": {"tag:Name"}, "Filter.2.Value.1": {"m1"},
		"Filter.3.Name": {"instance-state-name"}, "Filter.3.Value.1": {"pending"}, "Filter.3.Value.2": {"running"}})
	if n := strings.Count(body, "<instanceId>"); n != 2 {
		t.Fatalf("DescribeInstances by tags found %d instances: %s", n, body)
	}

	// Terminate: shutting-down, then terminated; capacity is freed.
	_, body = call(t, s, url.Values{"Action": {"TerminateInstances"}, "InstanceId.1": {id}})
	if !strings.Contains(body, "<currentState><code>32</code><name>shutting-down</name>") {
		t.Fatalf("TerminateInstances: %s", body)
	}
	waitState(t, s, id, StateTerminated)
	s.SetLaunchError(Pool{InstanceType: "m5.large"}, "")
	if status, body = run(t, s, "m5.large", "us-east-1a", "-"); status != 200 {
		t.Fatalf("launch after termination freed capacity: %d %s", status, body)
	}

	// A spot interruption.
	spot := s.Live()[len(s.Live())-1].ID
	waitState(t, s, spot, StateRunning)
	if err := s.Interrupt(spot); err != nil {
		t.Fatal(err)
	}
	waitState(t, s, spot, StateTerminated)
	if in, _ := s.Instance(spot); in.StateReason != "Server.SpotInstanceTermination" {
		t.Errorf("interrupted instance's reason %q", in.StateReason)
	}
	if status, body = call(t, s, url.Values{"Action": {"DescribeInstances"}, "InstanceId.1": {"i-0000000000000000"}}); status != 400 || errorCode(t, body) != "InvalidInstanceID.NotFound" {
		t.Fatalf("unknown instance: %d %s", status, body)
	}
	if status, body = call(t, s, url.Values{"Action": {"CreateVpc"}}); status != 400 || errorCode(t, body) != "InvalidAction" || s.UnknownActions()["CreateVpc"] != 1 {
		t.Fatalf("unknown action: %d %s %v", status, body, s.UnknownActions())
	}
}

func TestImagesLookupAsCAPA(t *testing.T) {
	s, err := Start(Options{Images: CAPAImages("v1.36.3")})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, body := call(t, s, url.Values{"Action": {"DescribeImages"},
		"Filter.1.Name": {"owner-id"}, "Filter.1.Value.1": {CAPAImageOwner},
		"Filter.2.Name": {"name"}, "Filter.2.Value.1": {"capa-ami-ubuntu-24.04-?1.36.3-*"},
		"Filter.3.Name": {"architecture"}, "Filter.3.Value.1": {"arm64"},
		"Filter.4.Name": {"state"}, "Filter.4.Value.1": {"available"},
		"Filter.5.Name": {"virtualization-type"}, "Filter.5.Value.1": {"hvm"}})
	if strings.Count(body, "<imageId>") != 1 || !strings.Contains(body, "<architecture>arm64</architecture>") {
		t.Fatalf("CAPA's AMI lookup: %s", body)
	}
}
