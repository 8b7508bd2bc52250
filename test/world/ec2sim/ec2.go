package ec2sim

import (
	"encoding/base64"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// ec2Actions are the EC2 actions CAPA v2.13 calls on a worker AWSMachine's
// path (controllers/awsmachine_controller.go, pkg/cloud/services/ec2) and
// its AWSMachineTemplate controller's.
var ec2Actions = map[string]func(*Sim, url.Values) (any, *apiError){
	"RunInstances":                      (*Sim).runInstances,
	"DescribeInstances":                 (*Sim).describeInstances,
	"TerminateInstances":                (*Sim).terminateInstances,
	"DescribeInstanceTypes":             (*Sim).describeInstanceTypes,
	"DescribeImages":                    (*Sim).describeImages,
	"DescribeSubnets":                   (*Sim).describeSubnets,
	"DescribeVpcs":                      (*Sim).describeVpcs,
	"DescribeDhcpOptions":               (*Sim).describeDhcpOptions,
	"DescribeNetworkInterfaces":         (*Sim).describeNetworkInterfaces,
	"DescribeNetworkInterfaceAttribute": (*Sim).describeNetworkInterfaceAttribute,
	"ModifyNetworkInterfaceAttribute":   (*Sim).modifyNetworkInterfaceAttribute,
	"CreateTags":                        (*Sim).createTags,
	"DeleteTags":                        (*Sim).deleteTags,
	"ModifyInstanceMetadataOptions":     (*Sim).modifyInstanceMetadataOptions,
	"DescribeInstanceAttribute":         (*Sim).describeInstanceAttribute,
}

// DefaultSecurityGroup is the VPC's default group: EC2 puts an interface
// launched without groups in it.
const DefaultSecurityGroup = "sg-0simdefault0000"

// accountID is the simulated account (owner of instances and interfaces).
const accountID = "123456789012"

type xState struct {
	Code int    `xml:"code"`
	Name string `xml:"name"`
}

type xGroup struct {
	GroupID   string `xml:"groupId"`
	GroupName string `xml:"groupName,omitempty"`
}

type xInstanceENI struct {
	ID             string   `xml:"networkInterfaceId"`
	SubnetID       string   `xml:"subnetId"`
	VpcID          string   `xml:"vpcId"`
	OwnerID        string   `xml:"ownerId"`
	Status         string   `xml:"status"`
	PrivateIP      string   `xml:"privateIpAddress"`
	PrivateDNSName string   `xml:"privateDnsName"`
	Groups         []xGroup `xml:"groupSet>item"`
	Attachment     struct {
		ID          string `xml:"attachmentId"`
		DeviceIndex int    `xml:"deviceIndex"`
		Status      string `xml:"status"`
	} `xml:"attachment"`
}

type xInstance struct {
	ID             string         `xml:"instanceId"`
	ImageID        string         `xml:"imageId"`
	State          xState         `xml:"instanceState"`
	PrivateDNSName string         `xml:"privateDnsName"`
	DNSName        string         `xml:"dnsName"`
	Reason         string         `xml:"reason"`
	StateReason    *xCode         `xml:"stateReason,omitempty"`
	InstanceType   string         `xml:"instanceType"`
	LaunchTime     string         `xml:"launchTime"`
	Placement      xPlace         `xml:"placement"`
	SubnetID       string         `xml:"subnetId"`
	VpcID          string         `xml:"vpcId"`
	PrivateIP      string         `xml:"privateIpAddress"`
	Architecture   string         `xml:"architecture"`
	RootDeviceType string         `xml:"rootDeviceType"`
	RootDeviceName string         `xml:"rootDeviceName"`
	Lifecycle      string         `xml:"instanceLifecycle,omitempty"`
	SpotRequestID  string         `xml:"spotInstanceRequestId,omitempty"`
	Groups         []xGroup       `xml:"groupSet>item"`
	Tags           []xTag         `xml:"tagSet>item"`
	ENIs           []xInstanceENI `xml:"networkInterfaceSet>item"`
	Metadata       xMetadata      `xml:"metadataOptions"`
	Hypervisor     string         `xml:"hypervisor"`
	Virtualization string         `xml:"virtualizationType"`
	EbsOptimized   bool           `xml:"ebsOptimized"`
	EnaSupport     bool           `xml:"enaSupport"`
}

type xCode struct {
	Code    string `xml:"code"`
	Message string `xml:"message"`
}

type xPlace struct {
	Zone    string `xml:"availabilityZone"`
	Tenancy string `xml:"tenancy"`
}

type xMetadata struct {
	State        string `xml:"state"`
	HTTPTokens   string `xml:"httpTokens"`
	HopLimit     int    `xml:"httpPutResponseHopLimit"`
	HTTPEndpoint string `xml:"httpEndpoint"`
	IPv6         string `xml:"httpProtocolIpv6"`
	Tags         string `xml:"instanceMetadataTags"`
}

func (s *Sim) xInstance(in *Instance) xInstance {
	arch := "x86_64"
	if t, ok := s.types[in.Type]; ok {
		arch = t.Arch
	}
	x := xInstance{
		ID: in.ID, ImageID: in.ImageID, State: xState{stateCodes[in.State], in.State},
		PrivateDNSName: in.DNSName, InstanceType: in.Type, LaunchTime: in.LaunchTime.UTC().Format("2006-01-02T15:04:05.000Z"),
		Placement: xPlace{Zone: in.Zone, Tenancy: "default"}, SubnetID: in.SubnetID, VpcID: s.vpcID, PrivateIP: in.PrivateIP,
		Architecture: arch, RootDeviceType: "ebs", RootDeviceName: "/dev/sda1", Tags: xTags(in.Tags),
		Metadata:   xMetadata{State: "applied", HTTPTokens: in.HTTPTokens, HopLimit: in.HopLimit, HTTPEndpoint: in.HTTPEndpoint, IPv6: "disabled", Tags: in.MetadataTags},
		Hypervisor: "xen", Virtualization: "hvm", EnaSupport: true,
	}
	if in.StateReason != "" {
		x.StateReason = &xCode{Code: in.StateReason, Message: in.StateReason + ": " + strings.TrimPrefix(in.StateReason, "Client.")}
	}
	if in.Market == Spot {
		x.Lifecycle, x.SpotRequestID = "spot", "sir-"+strings.TrimPrefix(in.ID, "i-")[:8]
	}
	if in.State != StateTerminated {
		eni := xInstanceENI{ID: in.ENI, SubnetID: in.SubnetID, VpcID: s.vpcID, OwnerID: accountID, Status: "in-use", PrivateIP: in.PrivateIP, PrivateDNSName: in.DNSName}
		for _, g := range in.SecurityGroups {
			eni.Groups = append(eni.Groups, xGroup{GroupID: g})
			x.Groups = append(x.Groups, xGroup{GroupID: g})
		}
		eni.Attachment.ID, eni.Attachment.Status = "eni-attach-"+strings.TrimPrefix(in.ENI, "eni-"), "attached"
		x.ENIs = []xInstanceENI{eni}
	} else {
		x.PrivateDNSName, x.PrivateIP, x.SubnetID, x.VpcID = "", "", "", ""
	}
	return x
}

// runInstances launches one instance (CAPA always asks MinCount=MaxCount=1).
func (s *Sim) runInstances(form url.Values) (any, *apiError) {
	itype := form.Get("InstanceType")
	t, ok := s.types[itype]
	if !ok {
		return nil, clientError("InvalidParameterValue", "Invalid value '%s' for InstanceType.", itype)
	}
	image := form.Get("ImageId")
	if image == "" {
		return nil, clientError("MissingParameter", "The request must contain the parameter ImageId")
	}
	subnet := form.Get("NetworkInterface.1.SubnetId")
	if subnet == "" {
		subnet = form.Get("SubnetId")
	}
	zone := ""
	for _, z := range s.zones {
		if s.SubnetID(z) == subnet {
			zone = z
		}
	}
	if zone == "" {
		return nil, clientError("InvalidSubnetID.NotFound", "The subnet ID '%s' does not exist", subnet)
	}
	market := OnDemand
	maxPrice := 0.0
	if strings.EqualFold(form.Get("InstanceMarketOptions.MarketType"), "spot") {
		market = Spot
		if p := form.Get("InstanceMarketOptions.SpotOptions.MaxPrice"); p != "" {
			v, err := strconv.ParseFloat(p, 64)
			if err != nil {
				return nil, clientError("InvalidParameterValue", "Invalid value '%s' for MaxPrice.", p)
			}
			maxPrice = v
		}
	}
	if s.imageArch(image) != "" && s.imageArch(image) != t.Arch {
		return nil, clientError("InvalidParameterValue", "The architecture '%s' of the specified instance type does not match the architecture '%s' of the specified AMI.", t.Arch, s.imageArch(image))
	}
	userData, err := base64.StdEncoding.DecodeString(form.Get("UserData"))
	if err != nil {
		return nil, clientError("InvalidParameterValue", "Invalid BASE64 encoding of user data.")
	}
	tags, eniTags := map[string]string{}, map[string]string{}
	for i := 1; ; i++ {
		p := "TagSpecification." + strconv.Itoa(i)
		rt := form.Get(p + ".ResourceType")
		if rt == "" {
			break
		}
		switch rt {
		case "instance":
			for k, v := range tagsOf(form, p+".Tag") {
				tags[k] = v
			}
		case "network-interface":
			eniTags = tagsOf(form, p+".Tag")
		}
	}
	groups := list(form, "NetworkInterface.1.SecurityGroupId")
	if len(groups) == 0 {
		groups = []string{DefaultSecurityGroup}
	}

	s.mu.Lock()
	if aerr := s.capacityError(Pool{itype, zone, market}, maxPrice); aerr != nil {
		s.launchErrors[[2]string{aerr.code, itype}]++
		s.mu.Unlock()
		return nil, aerr
	}
	s.nextIP++
	zi := 0
	for i, z := range s.zones {
		if z == zone {
			zi = i
		}
	}
	ip := fmt.Sprintf("10.0.%d.%d", zi*64+s.nextIP/250, s.nextIP%250+4)
	in := &Instance{
		ID: "i-0" + randomHex(16), Type: itype, Zone: zone, Market: market, SubnetID: subnet, ImageID: image,
		State: StatePending, PrivateIP: ip, DNSName: "ip-" + strings.ReplaceAll(ip, ".", "-") + ".ec2.internal",
		ENI: "eni-0" + randomHex(16), SecurityGroups: groups, Tags: tags, UserData: userData, LaunchTime: time.Now(),
		HTTPTokens: orDefault(form.Get("MetadataOptions.HttpTokens"), "optional"), HTTPEndpoint: orDefault(form.Get("MetadataOptions.HttpEndpoint"), "enabled"),
		MetadataTags: orDefault(form.Get("MetadataOptions.InstanceMetadataTags"), "disabled"), HopLimit: 1,
	}
	if h, err := strconv.Atoi(form.Get("MetadataOptions.HttpPutResponseHopLimit")); err == nil {
		in.HopLimit = h
	}
	in.nextAt = in.LaunchTime.Add(s.pendingFor)
	s.instances[in.ID] = in
	s.resourceTags[in.ENI] = eniTags
	x := s.xInstance(in)
	snap := in.copy()
	s.mu.Unlock()
	s.notify(snap)
	return struct {
		ReservationID string      `xml:"reservationId"`
		OwnerID       string      `xml:"ownerId"`
		Groups        []xGroup    `xml:"groupSet>item"`
		Instances     []xInstance `xml:"instancesSet>item"`
	}{"r-0" + randomHex(16), accountID, nil, []xInstance{x}}, nil
}

func orDefault(v, d string) string {
	if v == "" {
		return d
	}
	return v
}

// instanceMatches applies DescribeInstances filters CAPA uses: tag:<key>,
// tag-key, instance-state-name, instance-id, vpc-id, subnet-id.
func (s *Sim) instanceMatches(in *Instance, fs []filter) bool {
	for _, f := range fs {
		switch {
		case strings.HasPrefix(f.name, "tag:"):
			v, ok := in.Tags[strings.TrimPrefix(f.name, "tag:")]
			if !ok || !matchValue(f.values, v) {
				return false
			}
		case f.name == "tag-key":
			found := false
			for k := range in.Tags {
				found = found || matchValue(f.values, k)
			}
			if !found {
				return false
			}
		case f.name == "instance-state-name":
			if !matchValue(f.values, in.State) {
				return false
			}
		case f.name == "instance-id":
			if !matchValue(f.values, in.ID) {
				return false
			}
		case f.name == "vpc-id":
			if !matchValue(f.values, s.vpcID) {
				return false
			}
		case f.name == "subnet-id":
			if !matchValue(f.values, in.SubnetID) {
				return false
			}
		case f.name == "instance-type":
			if !matchValue(f.values, in.Type) {
				return false
			}
		default:
			return false // an unsupported filter matches nothing rather than everything
		}
	}
	return true
}

func (s *Sim) describeInstances(form url.Values) (any, *apiError) {
	ids := list(form, "InstanceId")
	fs := filters(form)
	type reservation struct {
		ID        string      `xml:"reservationId"`
		OwnerID   string      `xml:"ownerId"`
		Instances []xInstance `xml:"instancesSet>item"`
	}
	out := struct {
		Reservations []reservation `xml:"reservationSet>item"`
	}{}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if _, ok := s.instances[id]; !ok {
			return nil, clientError("InvalidInstanceID.NotFound", "The instance ID '%s' does not exist", id)
		}
	}
	var matched []*Instance
	for _, in := range s.instances {
		if len(ids) > 0 && !contains(ids, in.ID) {
			continue
		}
		if s.instanceMatches(in, fs) {
			matched = append(matched, in)
		}
	}
	sort.Slice(matched, func(i, j int) bool { return matched[i].LaunchTime.Before(matched[j].LaunchTime) })
	for _, in := range matched {
		out.Reservations = append(out.Reservations, reservation{ID: "r-" + strings.TrimPrefix(in.ID, "i-"), OwnerID: accountID, Instances: []xInstance{s.xInstance(in)}})
	}
	return out, nil
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

func (s *Sim) terminateInstances(form url.Values) (any, *apiError) {
	ids := list(form, "InstanceId")
	type change struct {
		ID       string `xml:"instanceId"`
		Current  xState `xml:"currentState"`
		Previous xState `xml:"previousState"`
	}
	out := struct {
		Changes []change `xml:"instancesSet>item"`
	}{}
	var changed []Instance
	s.mu.Lock()
	for _, id := range ids {
		if _, ok := s.instances[id]; !ok {
			s.mu.Unlock()
			return nil, clientError("InvalidInstanceID.NotFound", "The instance ID '%s' does not exist", id)
		}
	}
	for _, id := range ids {
		in := s.instances[id]
		prev := in.State
		if in.State == StatePending || in.State == StateRunning {
			in.State, in.StateReason, in.nextAt = StateShuttingDown, "Client.UserInitiatedShutdown", time.Now().Add(s.shutdownFor)
			changed = append(changed, in.copy())
		}
		out.Changes = append(out.Changes, change{ID: id, Current: xState{stateCodes[in.State], in.State}, Previous: xState{stateCodes[prev], prev}})
	}
	s.mu.Unlock()
	for _, in := range changed {
		s.notify(in)
	}
	return out, nil
}

func (s *Sim) modifyInstanceMetadataOptions(form url.Values) (any, *apiError) {
	id := form.Get("InstanceId")
	s.mu.Lock()
	defer s.mu.Unlock()
	in, ok := s.instances[id]
	if !ok {
		return nil, clientError("InvalidInstanceID.NotFound", "The instance ID '%s' does not exist", id)
	}
	if v := form.Get("HttpTokens"); v != "" {
		in.HTTPTokens = v
	}
	if v := form.Get("HttpEndpoint"); v != "" {
		in.HTTPEndpoint = v
	}
	if v := form.Get("InstanceMetadataTags"); v != "" {
		in.MetadataTags = v
	}
	if h, err := strconv.Atoi(form.Get("HttpPutResponseHopLimit")); err == nil {
		in.HopLimit = h
	}
	x := s.xInstance(in)
	x.Metadata.State = "pending"
	return struct {
		ID       string    `xml:"instanceId"`
		Metadata xMetadata `xml:"instanceMetadataOptions"`
	}{id, x.Metadata}, nil
}

func (s *Sim) describeInstanceAttribute(form url.Values) (any, *apiError) {
	id := form.Get("InstanceId")
	s.mu.Lock()
	defer s.mu.Unlock()
	in, ok := s.instances[id]
	if !ok {
		return nil, clientError("InvalidInstanceID.NotFound", "The instance ID '%s' does not exist", id)
	}
	switch form.Get("Attribute") {
	case "userData":
		return struct {
			ID       string `xml:"instanceId"`
			UserData struct {
				Value string `xml:"value"`
			} `xml:"userData"`
		}{ID: id, UserData: struct {
			Value string `xml:"value"`
		}{base64.StdEncoding.EncodeToString(in.UserData)}}, nil
	default:
		return nil, clientError("InvalidParameterValue", "Value (%s) for parameter attribute is invalid.", form.Get("Attribute"))
	}
}
