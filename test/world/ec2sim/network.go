package ec2sim

import (
	"net/url"
	"strings"
)

// xENI is a network interface as DescribeNetworkInterfaces returns it.
type xENI struct {
	ID             string   `xml:"networkInterfaceId"`
	SubnetID       string   `xml:"subnetId"`
	VpcID          string   `xml:"vpcId"`
	Zone           string   `xml:"availabilityZone"`
	OwnerID        string   `xml:"ownerId"`
	Status         string   `xml:"status"`
	InterfaceType  string   `xml:"interfaceType"`
	PrivateIP      string   `xml:"privateIpAddress"`
	PrivateDNSName string   `xml:"privateDnsName"`
	Groups         []xGroup `xml:"groupSet>item"`
	Tags           []xTag   `xml:"tagSet>item"`
	Attachment     struct {
		ID          string `xml:"attachmentId"`
		InstanceID  string `xml:"instanceId"`
		DeviceIndex int    `xml:"deviceIndex"`
		Status      string `xml:"status"`
	} `xml:"attachment"`
}

// eniOf returns an instance's interface; it exists until the instance is
// terminated (EC2 deletes it with the instance).
func (s *Sim) eniOf(in *Instance) xENI {
	x := xENI{ID: in.ENI, SubnetID: in.SubnetID, VpcID: s.vpcID, Zone: in.Zone, OwnerID: accountID, Status: "in-use",
		InterfaceType: "interface", PrivateIP: in.PrivateIP, PrivateDNSName: in.DNSName, Tags: xTags(s.resourceTags[in.ENI])}
	for _, g := range in.SecurityGroups {
		x.Groups = append(x.Groups, xGroup{GroupID: g})
	}
	x.Attachment.ID, x.Attachment.InstanceID, x.Attachment.Status = "eni-attach-"+strings.TrimPrefix(in.ENI, "eni-"), in.ID, "attached"
	return x
}

func (s *Sim) describeNetworkInterfaces(form url.Values) (any, *apiError) {
	ids := list(form, "NetworkInterfaceId")
	fs := filters(form)
	out := struct {
		ENIs []xENI `xml:"networkInterfaceSet>item"`
	}{}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, in := range s.instances {
		if in.State == StateTerminated || len(ids) > 0 && !contains(ids, in.ENI) {
			continue
		}
		fields := map[string]string{"attachment.instance-id": in.ID, "network-interface-id": in.ENI, "subnet-id": in.SubnetID, "vpc-id": s.vpcID}
		ok := true
		for _, f := range fs {
			v, known := fields[f.name]
			ok = ok && known && matchValue(f.values, v)
		}
		if ok {
			out.ENIs = append(out.ENIs, s.eniOf(in))
		}
	}
	return out, nil
}

// instanceByENI returns the live instance of an interface.
func (s *Sim) instanceByENI(id string) *Instance {
	for _, in := range s.instances {
		if in.ENI == id && in.State != StateTerminated {
			return in
		}
	}
	return nil
}

func (s *Sim) describeNetworkInterfaceAttribute(form url.Values) (any, *apiError) {
	id := form.Get("NetworkInterfaceId")
	s.mu.Lock()
	defer s.mu.Unlock()
	in := s.instanceByENI(id)
	if in == nil {
		return nil, clientError("InvalidNetworkInterfaceID.NotFound", "The networkInterface ID '%s' does not exist", id)
	}
	x := s.eniOf(in)
	return struct {
		ID     string   `xml:"networkInterfaceId"`
		Groups []xGroup `xml:"groupSet>item"`
	}{id, x.Groups}, nil
}

func (s *Sim) modifyNetworkInterfaceAttribute(form url.Values) (any, *apiError) {
	id := form.Get("NetworkInterfaceId")
	s.mu.Lock()
	defer s.mu.Unlock()
	in := s.instanceByENI(id)
	if in == nil {
		return nil, clientError("InvalidNetworkInterfaceID.NotFound", "The networkInterface ID '%s' does not exist", id)
	}
	if groups := list(form, "SecurityGroupId"); len(groups) > 0 {
		in.SecurityGroups = groups
	}
	return struct {
		Return bool `xml:"return"`
	}{true}, nil
}

// createTags tags instances, interfaces and volumes.
func (s *Sim) createTags(form url.Values) (any, *apiError) {
	ids := list(form, "ResourceId")
	tags := tagsOf(form, "Tag")
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if aerr := s.checkResource(id); aerr != nil {
			return nil, aerr
		}
	}
	for _, id := range ids {
		m := s.tagsOfResource(id)
		for k, v := range tags {
			m[k] = v
		}
	}
	return struct {
		Return bool `xml:"return"`
	}{true}, nil
}

func (s *Sim) deleteTags(form url.Values) (any, *apiError) {
	ids := list(form, "ResourceId")
	tags := tagsOf(form, "Tag")
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if aerr := s.checkResource(id); aerr != nil {
			return nil, aerr
		}
	}
	for _, id := range ids {
		m := s.tagsOfResource(id)
		for k := range tags {
			delete(m, k)
		}
	}
	return struct {
		Return bool `xml:"return"`
	}{true}, nil
}

func (s *Sim) checkResource(id string) *apiError {
	switch {
	case strings.HasPrefix(id, "i-"):
		if _, ok := s.instances[id]; !ok {
			return clientError("InvalidInstanceID.NotFound", "The instance ID '%s' does not exist", id)
		}
	case strings.HasPrefix(id, "eni-"):
		if s.instanceByENI(id) == nil {
			return clientError("InvalidNetworkInterfaceID.NotFound", "The networkInterface ID '%s' does not exist", id)
		}
	}
	return nil
}

func (s *Sim) tagsOfResource(id string) map[string]string {
	if in, ok := s.instances[id]; ok {
		return in.Tags
	}
	m, ok := s.resourceTags[id]
	if !ok {
		m = map[string]string{}
		s.resourceTags[id] = m
	}
	return m
}
