package checkpoint

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

const (
	// FormatVersion is the format version this package writes.
	FormatVersion = "v1"
	// supportedMajor is the highest major format version this package reads.
	supportedMajor = 1
	// checksumPrefix names the checksum algorithm in the checksum field.
	checksumPrefix = "sha256:"
)

// ErrCorrupt is matched (with errors.Is) by every error that says the
// checkpoint file exists but cannot be trusted: truncated, not JSON, missing
// fields, or a checksum that does not match its data.
var ErrCorrupt = errors.New("corrupt checkpoint")

// ErrUnsupportedVersion is matched (with errors.Is) by the error for a
// checkpoint written in a major format version newer than this package reads,
// for example after a downgrade across a major format change.
var ErrUnsupportedVersion = errors.New("unsupported checkpoint format version")

// CorruptError says what is wrong with a corrupt checkpoint file. It matches
// ErrCorrupt.
type CorruptError struct {
	// Path is the checkpoint file.
	Path string
	// Reason describes the problem.
	Reason string
	// Err is the underlying error, if any.
	Err error
}

// Error implements error.
func (e *CorruptError) Error() string {
	msg := fmt.Sprintf("checkpoint file %s is corrupt: %s", e.Path, e.Reason)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is makes errors.Is(err, ErrCorrupt) true.
func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }

// Unwrap returns the underlying error.
func (e *CorruptError) Unwrap() error { return e.Err }

// envelope is the top level of the file. Data is kept as the exact bytes
// stored in the file: the checksum covers those bytes, not a re-encoding, so
// fields added by a later release never invalidate it.
type envelope struct {
	Version  string          `json:"version"`
	Checksum string          `json:"checksum"`
	Data     json.RawMessage `json:"data"`
}

// encode returns the file content for c.
func encode(c *Checkpoint) ([]byte, error) {
	if c == nil {
		c = New()
	}
	// Indented so operators can read the file; "  " as prefix nests the data
	// object inside the envelope. The checksum covers these exact bytes.
	data, err := json.MarshalIndent(c, "  ", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode checkpoint data: %w", err)
	}
	version, _ := json.Marshal(FormatVersion)
	sum, _ := json.Marshal(checksum(data))

	var buf bytes.Buffer
	buf.WriteString("{\n  \"version\": ")
	buf.Write(version)
	buf.WriteString(",\n  \"checksum\": ")
	buf.Write(sum)
	buf.WriteString(",\n  \"data\": ")
	buf.Write(data)
	buf.WriteString("\n}\n")
	return buf.Bytes(), nil
}

// decode parses the content of the checkpoint file at path.
func decode(path string, content []byte) (*Checkpoint, error) {
	corrupt := func(reason string, err error) error {
		return &CorruptError{Path: path, Reason: reason, Err: err}
	}
	if len(bytes.TrimSpace(content)) == 0 {
		return nil, corrupt("file is empty", nil)
	}

	var env envelope
	if err := json.Unmarshal(content, &env); err != nil {
		return nil, corrupt("not a valid JSON document (truncated or garbled)", err)
	}
	if env.Version == "" {
		return nil, corrupt(`field "version" is missing`, nil)
	}
	major, err := majorVersion(env.Version)
	if err != nil {
		return nil, corrupt(fmt.Sprintf("invalid format version %q", env.Version), err)
	}
	if major > supportedMajor {
		return nil, fmt.Errorf("checkpoint file %s has format version %s, this plugin reads format versions up to v%d: %w",
			path, env.Version, supportedMajor, ErrUnsupportedVersion)
	}
	if major < 1 {
		return nil, fmt.Errorf("checkpoint file %s has format version %s, this plugin reads format versions v1 to v%d: %w",
			path, env.Version, supportedMajor, ErrUnsupportedVersion)
	}

	if len(env.Data) == 0 || bytes.Equal(env.Data, []byte("null")) {
		return nil, corrupt(`field "data" is missing`, nil)
	}
	if !strings.HasPrefix(env.Checksum, checksumPrefix) {
		return nil, corrupt(fmt.Sprintf("checksum %q is not of the form %s<hex>", env.Checksum, checksumPrefix), nil)
	}
	if want := checksum(env.Data); env.Checksum != want {
		return nil, corrupt(fmt.Sprintf("checksum mismatch: file says %s, data hashes to %s", env.Checksum, want), nil)
	}

	c := New()
	if err := json.Unmarshal(env.Data, c); err != nil {
		return nil, corrupt(`field "data" does not hold a checkpoint`, err)
	}
	if c.Claims == nil {
		c.Claims = map[types.UID]*PreparedClaim{}
	}
	for uid, claim := range c.Claims {
		if claim == nil {
			return nil, corrupt(fmt.Sprintf("claim %s has an empty record", uid), nil)
		}
		if claim.UID != uid {
			return nil, corrupt(fmt.Sprintf("claim record under key %s has UID %q", uid, claim.UID), nil)
		}
	}
	return c, nil
}

// checksum returns the checksum field value for data.
func checksum(data []byte) string {
	sum := sha256.Sum256(data)
	return checksumPrefix + hex.EncodeToString(sum[:])
}

// majorVersion parses "v<major>" or "v<major>.<minor>" and returns major.
// Minor versions may mark compatible additions; readers ignore them.
func majorVersion(v string) (int, error) {
	rest, ok := strings.CutPrefix(v, "v")
	if !ok {
		return 0, errors.New(`does not start with "v"`)
	}
	majorStr, _, _ := strings.Cut(rest, ".")
	major, err := strconv.Atoi(majorStr)
	if err != nil || major < 0 {
		return 0, fmt.Errorf("major version %q is not a number", majorStr)
	}
	return major, nil
}
