package ec2sim

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
)

// Secrets Manager, as CAPA uses it to keep a machine's bootstrap data out
// of EC2 user data: CreateSecret per chunk (name <prefix>-<n>, binary
// value), DeleteSecret with ForceDeleteWithoutRecovery once the Node joined
// or the machine is deleted. The instance's user data is then a boot script
// that fetches the chunks (GetSecretValue) and gunzips them.

func (s *Sim) createSecret(body []byte) (any, *apiError) {
	var in struct {
		Name         string
		SecretBinary []byte // base64 in JSON
		SecretString *string
	}
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, clientError("InvalidRequestException", "%v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.secrets[in.Name]; ok {
		return nil, clientError("ResourceExistsException", "The operation failed because the secret %s already exists.", in.Name)
	}
	v := in.SecretBinary
	if in.SecretString != nil {
		v = []byte(*in.SecretString)
	}
	s.secrets[in.Name] = v
	return map[string]string{"ARN": s.secretARN(in.Name), "Name": in.Name, "VersionId": requestID()}, nil
}

func (s *Sim) secretARN(name string) string {
	return fmt.Sprintf("arn:aws:secretsmanager:%s:%s:secret:%s-%s", s.region, accountID, name, randomHex(6))
}

func (s *Sim) deleteSecret(body []byte) (any, *apiError) {
	var in struct{ SecretId string }
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, clientError("InvalidRequestException", "%v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.secrets[in.SecretId]; !ok {
		return nil, clientError("ResourceNotFoundException", "Secrets Manager can't find the specified secret.")
	}
	delete(s.secrets, in.SecretId)
	return map[string]any{"ARN": s.secretARN(in.SecretId), "Name": in.SecretId, "DeletionDate": 0}, nil
}

func (s *Sim) getSecretValue(body []byte) (any, *apiError) {
	var in struct{ SecretId string }
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, clientError("InvalidRequestException", "%v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.secrets[in.SecretId]
	if !ok {
		return nil, &apiError{status: http.StatusBadRequest, code: "ResourceNotFoundException", message: "Secrets Manager can't find the specified secret."}
	}
	return map[string]any{"Name": in.SecretId, "SecretBinary": v}, nil
}

var (
	secretPrefixRE = regexp.MustCompile(`SECRET_PREFIX="([^"]+)"`)
	chunksRE       = regexp.MustCompile(`CHUNKS="([0-9]+)"`)
)

// BootstrapData is what an instance's cloud-init would run: its user data,
// or, when the user data is CAPA's Secrets Manager boot script, the chunks
// it names, joined and gunzipped (as the script does on the instance). It
// fails when a chunk is missing: the instance could not bootstrap.
func (s *Sim) BootstrapData(in Instance) ([]byte, error) {
	data := in.UserData
	if m := secretPrefixRE.FindSubmatch(data); m != nil {
		c := chunksRE.FindSubmatch(data)
		if c == nil {
			return nil, fmt.Errorf("instance %s: boot script without CHUNKS", in.ID)
		}
		n, _ := strconv.Atoi(string(c[1]))
		var joined []byte
		for i := 0; i < n; i++ {
			name := fmt.Sprintf("%s-%d", m[1], i)
			chunk, ok := s.Secret(name)
			if !ok {
				return nil, fmt.Errorf("instance %s: secret %s not found", in.ID, name)
			}
			joined = append(joined, chunk...)
		}
		data = joined
	}
	if len(data) > 2 && data[0] == 0x1f && data[1] == 0x8b {
		r, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			return nil, fmt.Errorf("instance %s: %w", in.ID, err)
		}
		return io.ReadAll(r)
	}
	return data, nil
}
