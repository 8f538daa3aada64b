package v1beta1

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"

	yamlv2 "go.yaml.in/yaml/v2"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// MaxConfigBytes is the largest config Decode accepts: the limit the API
// server puts on opaque parameters, so the plugin and the webhook agree with
// it even for configs that did not come through the API server.
const MaxConfigBytes = resourceapi.OpaqueParametersMaxLength

// DriverAPI is this package's API for DecodeObject.
var DriverAPI = NewAPI(GroupVersion, AddToScheme, kinds, nil)

// Decode strictly decodes one GpuConfig or MigDeviceConfig from JSON or
// YAML. It fails, naming the offending field, on:
//   - a missing or other apiVersion than gpu.dra.dev/v1beta1,
//   - a missing or unknown kind,
//   - an unknown field, or a field spelt with other case than the API's,
//   - a field given twice,
//   - a value of the wrong type (a string where a number belongs),
//   - more than MaxConfigBytes of input, or bytes that are not UTF-8,
//   - objects and arrays nested more than MaxConfigDepth levels deep,
//   - YAML nested so deep or with aliases expanding so far that parsing
//     it would cost more than a config of MaxConfigBytes.
//
// Its time and allocation are linear in the size of the input, whatever
// the input's structure (see BenchmarkDecodeWorstCase).
//
// It neither defaults nor validates; see DecodeDefaultValidate.
func Decode(data []byte) (Config, error) {
	obj, err := DecodeObject(data, DriverAPI)
	if err != nil {
		return nil, err
	}
	cfg, ok := obj.(Config)
	if !ok {
		return nil, fmt.Errorf("decode %s: decoded a %T, which is not a config of this API",
			obj.GetObjectKind().GroupVersionKind().Kind, obj)
	}
	return cfg, nil
}

// DecodeDefaultValidate decodes a config with Decode, defaults it and
// validates it. The kubelet plugin and the admission webhook call it through
// pkg/opaqueconfig, which also accepts NVIDIA's API. On a validation failure the error lists every
// field error (it wraps a k8s.io/apimachinery/pkg/util/errors.Aggregate of
// *field.Error) and no object is returned.
func DecodeDefaultValidate(data []byte) (Config, error) {
	cfg, err := Decode(data)
	if err != nil {
		return nil, err
	}
	cfg.Default()
	if errs := cfg.Validate(); len(errs) > 0 {
		return nil, fmt.Errorf("invalid %s: %w", cfg.GetObjectKind().GroupVersionKind().Kind, errs.ToAggregate())
	}
	return cfg, nil
}

// isBlank reports whether data holds nothing but white space.
func isBlank(data []byte) bool { return len(bytes.TrimSpace(data)) == 0 }

// checkJSON checks that a document is JSON and an object.
func checkJSON(jsonData []byte) error {
	if !json.Valid(jsonData) {
		var raw json.RawMessage // for the syntax error's message
		err := json.Unmarshal(jsonData, &raw)
		return fmt.Errorf("config is not valid JSON: %w", err)
	}
	if t := topLevelType(jsonData); t != "an object" {
		return fmt.Errorf("config must be an object, not %s", t)
	}
	return nil
}

// typeMetaString returns obj[key] if it is a string or missing (""), and an
// error naming the field otherwise.
func typeMetaString(obj map[string]any, key string) (string, *field.Error) {
	switch v := obj[key].(type) {
	case nil:
		return "", nil
	case string:
		return v, nil
	default:
		return "", field.Invalid(field.NewPath(key), v, fmt.Sprintf("must be a string, not %s", jsonType(v)))
	}
}

// topLevelType names the JSON type of a valid document by its first byte.
func topLevelType(jsonData []byte) string {
	switch b := bytes.TrimSpace(jsonData); b[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	default:
		return "a number"
	}
}

// jsonType names the JSON type of a value decoded into any.
func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	default:
		return "a number"
	}
}

// yamlToJSON converts a single YAML document to JSON. Strict conversion
// reports keys given twice, which plain conversion would silently merge, and
// a second document is an error rather than silently dropped.
func yamlToJSON(data []byte) ([]byte, error) {
	if err := checkYAMLBounds(data); err != nil {
		return nil, err
	}
	dec := yamlv2.NewDecoder(bytes.NewReader(data))
	docs := 0
	for {
		err := dec.Decode(&yamlDocument{})
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if docs++; docs > 1 {
			return nil, errors.New("config must be a single YAML document, found a second after ---")
		}
	}
	return yaml.YAMLToJSONStrict(data)
}

// yamlDocument counts a YAML document without decoding it, so that
// counting does not expand aliases.
type yamlDocument struct{}

func (yamlDocument) UnmarshalYAML(func(any) error) error { return nil }

// quantityErrors finds the quantities in a config that do not parse and
// reports them with their field paths. The JSON decoder reports such a
// quantity only by the parser's message; this names the field.
func quantityErrors(jsonData []byte) field.ErrorList {
	var doc struct {
		Sharing struct {
			MPSConfig struct {
				DefaultPinnedDeviceMemoryLimit    json.RawMessage            `json:"defaultPinnedDeviceMemoryLimit"`
				DefaultPerDevicePinnedMemoryLimit map[string]json.RawMessage `json:"defaultPerDevicePinnedMemoryLimit"`
			} `json:"mpsConfig"`
		} `json:"sharing"`
	}
	// Non-strict and tolerant: this runs only to explain an error that the
	// strict decoder already found.
	_ = kjson.UnmarshalCaseSensitivePreserveInts(jsonData, &doc)
	mps := doc.Sharing.MPSConfig
	path := field.NewPath("sharing", "mpsConfig")
	var errs field.ErrorList
	check := func(raw json.RawMessage, p *field.Path) {
		var q resource.Quantity
		if raw == nil {
			return
		}
		if err := q.UnmarshalJSON(raw); err != nil {
			var value any = string(raw)
			var s string
			if json.Unmarshal(raw, &s) == nil {
				value = s
			}
			errs = append(errs, field.Invalid(p, value, "must be a quantity of bytes such as 512Mi or 16Gi"))
		}
	}
	check(mps.DefaultPinnedDeviceMemoryLimit, path.Child("defaultPinnedDeviceMemoryLimit"))
	keys := make([]string, 0, len(mps.DefaultPerDevicePinnedMemoryLimit))
	for k := range mps.DefaultPerDevicePinnedMemoryLimit {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		check(mps.DefaultPerDevicePinnedMemoryLimit[k], path.Child("defaultPerDevicePinnedMemoryLimit").Key(k))
	}
	return errs
}
