package ec2sim

import (
	"fmt"
	"net/url"
	"sort"
	"strings"
)

// CAPA's default AMI lookup (pkg/cloud/services/ec2/ami.go): images of this
// owner named capa-ami-<baseOS>-v<version>-<build>.
const (
	CAPAImageOwner  = "819546954734"
	CAPAImageBaseOS = "ubuntu-24.04"
)

// CAPAImages returns the images CAPA's default lookup finds for a
// Kubernetes version (e.g. v1.36.3): one per architecture.
func CAPAImages(version string) []Image {
	v := "v" + strings.TrimPrefix(version, "v")
	var out []Image
	for i, arch := range []string{"x86_64", "arm64"} {
		out = append(out, Image{
			ID:   fmt.Sprintf("ami-0%016x", hashString(v+arch)),
			Name: fmt.Sprintf("capa-ami-%s-%s-17000000%02d", CAPAImageBaseOS, v, i), OwnerID: CAPAImageOwner, Arch: arch,
		})
	}
	return out
}

func hashString(s string) uint64 {
	var h uint64 = 14695981039346656037
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h >> 4
}

// imageArch returns a known image's architecture, or "".
func (s *Sim) imageArch(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, im := range s.images {
		if im.ID == id {
			return im.Arch
		}
	}
	return ""
}

// AddImages makes more images known.
func (s *Sim) AddImages(images ...Image) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.images = append(s.images, images...)
}

func (s *Sim) describeInstanceTypes(form url.Values) (any, *apiError) {
	names := list(form, "InstanceType")
	type xType struct {
		Name  string `xml:"instanceType"`
		VCPUs struct {
			Default int `xml:"defaultVCpus"`
			Cores   int `xml:"defaultCores"`
			Threads int `xml:"defaultThreadsPerCore"`
		} `xml:"vCpuInfo"`
		Memory struct {
			SizeInMiB int64 `xml:"sizeInMiB"`
		} `xml:"memoryInfo"`
		Processor struct {
			Archs []string `xml:"supportedArchitectures>item"`
		} `xml:"processorInfo"`
		CurrentGeneration bool     `xml:"currentGeneration"`
		UsageClasses      []string `xml:"supportedUsageClasses>item"`
		Hypervisor        string   `xml:"hypervisor"`
	}
	out := struct {
		Types []xType `xml:"instanceTypeSet>item"`
	}{}
	if len(names) == 0 {
		for n := range s.types {
			names = append(names, n)
		}
		sort.Strings(names)
	}
	for _, n := range names {
		t, ok := s.types[n]
		if !ok {
			// EC2 refuses the whole call when one type does not exist.
			return nil, clientError("InvalidInstanceType", "The following supplied instance types do not exist: [%s]", n)
		}
		x := xType{Name: t.Name, CurrentGeneration: true, UsageClasses: []string{"on-demand", "spot"}, Hypervisor: "nitro"}
		x.VCPUs.Default, x.VCPUs.Cores, x.VCPUs.Threads = t.VCPUs, max(1, t.VCPUs/2), min(2, t.VCPUs)
		x.Memory.SizeInMiB = t.MemoryMi
		x.Processor.Archs = []string{t.Arch}
		out.Types = append(out.Types, x)
	}
	return out, nil
}

func (s *Sim) describeImages(form url.Values) (any, *apiError) {
	ids := list(form, "ImageId")
	owners := list(form, "Owner")
	fs := filters(form)
	type xImage struct {
		ID             string `xml:"imageId"`
		Name           string `xml:"name"`
		OwnerID        string `xml:"imageOwnerId"`
		State          string `xml:"imageState"`
		Arch           string `xml:"architecture"`
		Created        string `xml:"creationDate"`
		Public         bool   `xml:"isPublic"`
		Type           string `xml:"imageType"`
		RootDeviceType string `xml:"rootDeviceType"`
		RootDeviceName string `xml:"rootDeviceName"`
		Virtualization string `xml:"virtualizationType"`
		Hypervisor     string `xml:"hypervisor"`
		Platform       string `xml:"platformDetails"`
		Devices        []struct {
			DeviceName string `xml:"deviceName"`
			Ebs        struct {
				VolumeSize int    `xml:"volumeSize"`
				VolumeType string `xml:"volumeType"`
				Delete     bool   `xml:"deleteOnTermination"`
			} `xml:"ebs"`
		} `xml:"blockDeviceMapping>item"`
	}
	out := struct {
		Images []xImage `xml:"imagesSet>item"`
	}{}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		found := false
		for _, im := range s.images {
			found = found || im.ID == id
		}
		if !found {
			return nil, clientError("InvalidAMIID.NotFound", "The image id '[%s]' does not exist", id)
		}
	}
	for _, im := range s.images {
		if len(ids) > 0 && !contains(ids, im.ID) || len(owners) > 0 && !contains(owners, im.OwnerID) {
			continue
		}
		fields := map[string]string{"image-id": im.ID, "name": im.Name, "owner-id": im.OwnerID, "architecture": im.Arch,
			"state": "available", "virtualization-type": "hvm", "root-device-type": "ebs"}
		ok := true
		for _, f := range fs {
			v, known := fields[f.name]
			ok = ok && known && matchValue(f.values, v)
		}
		if !ok {
			continue
		}
		created := im.Created
		if created.IsZero() {
			created = created.AddDate(2025, 0, 0)
		}
		x := xImage{ID: im.ID, Name: im.Name, OwnerID: im.OwnerID, State: "available", Arch: im.Arch,
			Created: created.UTC().Format("2006-01-02T15:04:05.000Z"), Public: true, Type: "machine", RootDeviceType: "ebs",
			RootDeviceName: "/dev/sda1", Virtualization: "hvm", Hypervisor: "xen", Platform: "Linux/UNIX"}
		x.Devices = make([]struct {
			DeviceName string `xml:"deviceName"`
			Ebs        struct {
				VolumeSize int    `xml:"volumeSize"`
				VolumeType string `xml:"volumeType"`
				Delete     bool   `xml:"deleteOnTermination"`
			} `xml:"ebs"`
		}, 1)
		x.Devices[0].DeviceName = "/dev/sda1"
		x.Devices[0].Ebs.VolumeSize, x.Devices[0].Ebs.VolumeType, x.Devices[0].Ebs.Delete = 8, "gp3", true
		out.Images = append(out.Images, x)
	}
	return out, nil
}

type xSubnet struct {
	ID        string `xml:"subnetId"`
	VpcID     string `xml:"vpcId"`
	Zone      string `xml:"availabilityZone"`
	ZoneID    string `xml:"availabilityZoneId"`
	CIDR      string `xml:"cidrBlock"`
	State     string `xml:"state"`
	Available int    `xml:"availableIpAddressCount"`
	MapPublic bool   `xml:"mapPublicIpOnLaunch"`
	OwnerID   string `xml:"ownerId"`
	Tags      []xTag `xml:"tagSet>item"`
}

func (s *Sim) describeSubnets(form url.Values) (any, *apiError) {
	ids := list(form, "SubnetId")
	fs := filters(form)
	out := struct {
		Subnets []xSubnet `xml:"subnetSet>item"`
	}{}
	for i, z := range s.zones {
		x := xSubnet{ID: s.SubnetID(z), VpcID: s.vpcID, Zone: z, ZoneID: fmt.Sprintf("use1-az%d", i+1),
			CIDR: fmt.Sprintf("10.0.%d.0/18", i*64), State: "available", Available: 16000, OwnerID: accountID,
			Tags: xTags(map[string]string{"kubernetes.io/role/internal-elb": "1"})}
		if len(ids) > 0 && !contains(ids, x.ID) {
			continue
		}
		fields := map[string]string{"subnet-id": x.ID, "vpc-id": x.VpcID, "availability-zone": z, "state": "available"}
		ok := true
		for _, f := range fs {
			v, known := fields[f.name]
			ok = ok && known && matchValue(f.values, v)
		}
		if ok {
			out.Subnets = append(out.Subnets, x)
		}
	}
	return out, nil
}

func (s *Sim) describeVpcs(form url.Values) (any, *apiError) {
	for _, id := range list(form, "VpcId") {
		if id != s.vpcID {
			return nil, clientError("InvalidVpcID.NotFound", "The vpc ID '%s' does not exist", id)
		}
	}
	type xVpc struct {
		ID      string `xml:"vpcId"`
		State   string `xml:"state"`
		CIDR    string `xml:"cidrBlock"`
		DHCP    string `xml:"dhcpOptionsId"`
		OwnerID string `xml:"ownerId"`
	}
	return struct {
		Vpcs []xVpc `xml:"vpcSet>item"`
	}{[]xVpc{{ID: s.vpcID, State: "available", CIDR: "10.0.0.0/16", DHCP: "dopt-0sim", OwnerID: accountID}}}, nil
}

func (s *Sim) describeDhcpOptions(url.Values) (any, *apiError) {
	type xValue struct {
		Value string `xml:"value"`
	}
	type xConfig struct {
		Key    string   `xml:"key"`
		Values []xValue `xml:"valueSet>item"`
	}
	type xOptions struct {
		ID      string    `xml:"dhcpOptionsId"`
		OwnerID string    `xml:"ownerId"`
		Configs []xConfig `xml:"dhcpConfigurationSet>item"`
	}
	// The default DHCP options of us-east-1: CAPA then adds no extra DNS name.
	domain := s.region + ".compute.internal"
	if s.region == "us-east-1" {
		domain = "ec2.internal"
	}
	return struct {
		Options []xOptions `xml:"dhcpOptionsSet>item"`
	}{[]xOptions{{ID: "dopt-0sim", OwnerID: accountID, Configs: []xConfig{
		{Key: "domain-name", Values: []xValue{{domain}}}, {Key: "domain-name-servers", Values: []xValue{{"AmazonProvidedDNS"}}},
	}}}}, nil
}
