package world

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// hubAuditPolicy logs the requests of AuditedGroup's users at level
// Metadata (who, verb, resource, object, request URI with its selectors,
// response code) and nothing else: the world's own traffic costs nothing.
const hubAuditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  userGroups: ["` + AuditedGroup + `"]
- level: None
`

// spokeAuditPolicy logs every write to a NodeClaim, and every status write
// to a NodeClass with its body (upstream specs race the provider's status
// controller over a NodeClass's Ready condition): a status write with
// its body (level Request: which conditions it wrote), any other at level
// Metadata (who, verb, user agent, when). Core's controllers write a
// NodeClaim's status with JSON merge patches that replace its conditions
// whole, so a writer holding an older copy undoes another's condition;
// conformance run G saw a registration undone and could not name the
// writer without this log.
const spokeAuditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Request
  verbs: ["patch", "update"]
  resources:
  - group: karpenter.sh
    resources: ["nodeclaims/status"]
- level: Metadata
  verbs: ["create", "patch", "update", "delete"]
  resources:
  - group: karpenter.sh
    resources: ["nodeclaims"]
- level: Request
  verbs: ["patch", "update"]
  resources:
  - group: karpenter.cluster.x-k8s.io
    resources: ["clusterapinodeclasses/status"]
- level: None
`

// auditConfiguration writes the audit policies into Dir and returns the
// hub's and the spoke's API server audit flags.
func (w *World) auditConfiguration() (hub, spoke func(*envtest.Environment), err error) {
	flags := func(policyName, policy, log, mode string) (func(*envtest.Environment), error) {
		path := filepath.Join(w.Dir, policyName)
		if err := os.WriteFile(path, []byte(policy), 0o600); err != nil {
			return nil, err
		}
		return func(env *envtest.Environment) {
			env.ControlPlane.GetAPIServer().Configure().
				Set("audit-policy-file", path).
				Set("audit-log-path", log).
				Set("audit-log-mode", mode).
				Set("audit-log-format", "json")
		}, nil
	}
	if hub, err = flags("hub-audit-policy.yaml", hubAuditPolicy, w.HubAuditLog, "blocking"); err != nil {
		return nil, nil, err
	}
	if spoke, err = flags("spoke-audit-policy.yaml", spokeAuditPolicy, w.SpokeAuditLog, "blocking"); err != nil {
		return nil, nil, err
	}
	return hub, spoke, nil
}

// AuditEvent is what the hub's audit log records of one request (the
// fields of audit.k8s.io/v1 Event that tests read).
type AuditEvent struct {
	Stage      string `json:"stage"`
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	User       struct {
		Username string   `json:"username"`
		Groups   []string `json:"groups"`
	} `json:"user"`
	UserAgent string `json:"userAgent"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
		APIGroup    string `json:"apiGroup"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	// RequestObject is the request's body, at level Request (the spoke's
	// NodeClaim status writes).
	RequestObject json.RawMessage `json:"requestObject"`
	// StageTimestamp is when the stage was logged (RFC 3339, microseconds).
	StageTimestamp string `json:"stageTimestamp"`
}

// HubAudit reads the hub's audit log: every request of AuditedGroup's users
// so far, in the order the API server logged them.
func (w *World) HubAudit() ([]AuditEvent, error) { return readAudit(w.HubAuditLog) }

// SpokeAudit reads the workload cluster's audit log: every write to a
// NodeClaim so far, a status write with its body (RequestObject).
func (w *World) SpokeAudit() ([]AuditEvent, error) { return readAudit(w.SpokeAuditLog) }

func readAudit(path string) ([]AuditEvent, error) {
	raw, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	// A line still being written is read next time.
	raw = raw[:bytes.LastIndexByte(raw, '\n')+1]
	var out []AuditEvent
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	for line := 1; sc.Scan(); line++ {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var e AuditEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("%s line %d: %w", path, line, err)
		}
		out = append(out, e)
	}
	return out, sc.Err()
}
