package options

import (
	"flag"
	"io"
	"strings"
	"testing"

	coreoptions "sigs.k8s.io/karpenter/pkg/operator/options"
)

// The approver is off unless asked for, by flag or environment.
func TestApproveKubeletCSRs(t *testing.T) {
	if ours, _ := parse(t); ours.ApproveKubeletCSRs {
		t.Error("the kubelet certificate approver is on by default")
	}
	if ours, _ := parse(t, "--"+FlagApproveKubeletCSRs); !ours.ApproveKubeletCSRs {
		t.Errorf("--%s left the approver off", FlagApproveKubeletCSRs)
	}
	t.Setenv("APPROVE_KUBELET_CSRS", "true")
	if ours, _ := parse(t); !ours.ApproveKubeletCSRs {
		t.Error("APPROVE_KUBELET_CSRS=true left the approver off")
	}
	if ours, _ := parse(t, "--"+FlagApproveKubeletCSRs+"=false"); ours.ApproveKubeletCSRs {
		t.Error("the flag set to false does not win over the environment")
	}
}

// The approver's identities: none but bootstrap tokens by default; the
// listed service accounts, exactly; SubjectAccessReview on request; bad
// values name the flag.
func TestKubeletCSRSettings(t *testing.T) {
	ours, _ := parse(t)
	if len(ours.KubeletCSRBootstrapServiceAccounts) != 0 || ours.KubeletCSRBootstrapAuthorization != KubeletCSRAuthorizationIdentities || ours.KubeletCSRServingExternalAddresses {
		t.Errorf("defaults: service accounts %v, authorization %q, external addresses %v; want none, %q, false",
			ours.KubeletCSRBootstrapServiceAccounts, ours.KubeletCSRBootstrapAuthorization, ours.KubeletCSRServingExternalAddresses, KubeletCSRAuthorizationIdentities)
	}
	ours, _ = parse(t, "--"+FlagKubeletCSRServiceAccounts+"=machine-config/node-bootstrapper, ops/joiner",
		"--"+FlagKubeletCSRAuthorization+"="+KubeletCSRAuthorizationSAR, "--"+FlagKubeletCSRServingExternal)
	if got := ours.KubeletCSRBootstrapServiceAccounts; len(got) != 2 || got[0] != "machine-config/node-bootstrapper" || got[1] != "ops/joiner" ||
		ours.KubeletCSRBootstrapAuthorization != KubeletCSRAuthorizationSAR || !ours.KubeletCSRServingExternalAddresses {
		t.Errorf("flags parsed as %v, %q, %v", got, ours.KubeletCSRBootstrapAuthorization, ours.KubeletCSRServingExternalAddresses)
	}
	t.Setenv("KUBELET_CSR_BOOTSTRAP_SERVICE_ACCOUNTS", "tenant/node-bootstrapper")
	if ours, _ = parse(t); len(ours.KubeletCSRBootstrapServiceAccounts) != 1 {
		t.Errorf("KUBELET_CSR_BOOTSTRAP_SERVICE_ACCOUNTS: %v", ours.KubeletCSRBootstrapServiceAccounts)
	}
	for _, bad := range []string{"--" + FlagKubeletCSRServiceAccounts + "=node-bootstrapper", "--" + FlagKubeletCSRServiceAccounts + "=Tenant/x",
		"--" + FlagKubeletCSRAuthorization + "=rbac"} {
		if err := parseErr(bad); err == nil || !strings.Contains(err.Error(), "kubelet-csr-bootstrap") {
			t.Errorf("%s: error %v, want one naming the flag", bad, err)
		}
	}
}

// parseErr parses args with a fresh provider's options and returns the error.
func parseErr(args ...string) error {
	fs := &coreoptions.FlagSet{FlagSet: flag.NewFlagSet("karpenter", flag.ContinueOnError)}
	fs.SetOutput(io.Discard)
	ours := &Options{}
	ours.AddFlags(fs)
	return ours.Parse(fs, args...)
}
