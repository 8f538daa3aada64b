package v1beta1

import (
	"errors"
	"fmt"
	"slices"

	kjson "sigs.k8s.io/json"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	jsonserializer "k8s.io/apimachinery/pkg/runtime/serializer/json"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// API is one opaque parameter API as DecodeObject reads it: its group and
// version, the kinds it decodes, and a strict decoder over its scheme. This
// package's API is one; NVIDIA's (api/nvidia/v1beta1) is another, decoded
// with the same bounds and the same field paths in errors.
//
// +k8s:deepcopy-gen=false
type API struct {
	gv      schema.GroupVersion
	kinds   []string
	refused map[string]string
	// strict rejects unknown and duplicate fields (and fields whose case
	// differs from the API's) as strict decoding errors.
	strict runtime.Decoder
}

// NewAPI describes an API for DecodeObject. kinds are the kinds it
// decodes; refused maps kinds of the group that are known but not
// supported to the reason, which the error gives instead of a bare
// "unsupported value". It panics if addToScheme fails, as at init.
func NewAPI(gv schema.GroupVersion, addToScheme func(*runtime.Scheme) error, kinds []string, refused map[string]string) *API {
	s := runtime.NewScheme()
	utilruntime.Must(addToScheme(s))
	return &API{
		gv: gv, kinds: kinds, refused: refused,
		strict: jsonserializer.NewSerializerWithOptions(jsonserializer.DefaultMetaFactory, s, s,
			jsonserializer.SerializerOptions{Strict: true}),
	}
}

// GroupVersion is the API's apiVersion.
func (a *API) GroupVersion() schema.GroupVersion { return a.gv }

// DecodeObject strictly decodes one object of one of apis from JSON or
// YAML, picking the API by the object's apiVersion. It fails, naming the
// offending field, on:
//   - a missing apiVersion or one that none of apis has,
//   - a missing kind, or one the chosen API does not decode,
//   - an unknown field, or a field spelt with other case than the API's,
//   - a field given twice,
//   - a value of the wrong type (a string where a number belongs),
//   - more than MaxConfigBytes of input, or bytes that are not UTF-8,
//   - objects and arrays nested more than MaxConfigDepth levels deep,
//   - YAML nested so deep or with aliases expanding so far that parsing
//     it would cost more than a config of MaxConfigBytes.
//
// Its time and allocation are linear in the size of the input, whatever
// the input's structure (see BenchmarkDecodeWorstCase). It neither
// defaults nor validates.
func DecodeObject(data []byte, apis ...*API) (runtime.Object, error) {
	jsonData, err := boundedJSON(data)
	if err != nil {
		return nil, err
	}
	// The depth first: every step after this one recurses on the structure.
	tooDeep, badQuantities := scanJSON(jsonData)
	if tooDeep != nil {
		return nil, fmt.Errorf("decode config: %w", field.ErrorList{tooDeep}.ToAggregate())
	}
	a, kind, err := checkTypeMeta(jsonData, apis)
	if err != nil {
		return nil, fmt.Errorf("decode config: %w", err)
	}
	if len(badQuantities) > 0 {
		return nil, fmt.Errorf("decode %s: %w", kind, badQuantities.ToAggregate())
	}
	obj, _, err := a.strict.Decode(jsonData, nil, nil)
	if err != nil {
		// A strict decoding error comes with a filled-in object; it is
		// still an error.
		if !runtime.IsStrictDecodingError(err) {
			// A malformed quantity fails without naming its field.
			if errs := quantityErrors(jsonData); len(errs) > 0 {
				err = errs.ToAggregate()
			}
		}
		return nil, fmt.Errorf("decode %s: %w", kind, err)
	}
	return obj, nil
}

// boundedJSON checks the size and encoding of a config and turns YAML into
// JSON, within the bounds DecodeObject promises; the result is a JSON
// object.
func boundedJSON(data []byte) ([]byte, error) {
	if len(data) > MaxConfigBytes {
		return nil, fmt.Errorf("decode config: %d bytes is more than the %d bytes opaque parameters may have",
			len(data), MaxConfigBytes)
	}
	if isBlank(data) {
		return nil, errors.New("decode config: config is empty")
	}
	if err := checkUTF8(data); err != nil {
		return nil, fmt.Errorf("decode config: %w", err)
	}
	jsonData := data
	if !utilyaml.IsJSONBuffer(data) {
		var err error
		if jsonData, err = yamlToJSON(data); err != nil {
			return nil, fmt.Errorf("decode config as YAML: %w", err)
		}
	}
	if err := checkJSON(jsonData); err != nil {
		return nil, fmt.Errorf("decode config: %w", err)
	}
	return jsonData, nil
}

// checkTypeMeta checks apiVersion and kind before decoding, so that an
// unknown kind is reported as such (the scheme also knows meta kinds such as
// WatchEvent, which are no configs) and the message lists what is supported.
// It returns the API the apiVersion names.
func checkTypeMeta(jsonData []byte, apis []*API) (*API, string, error) {
	// The struct keeps only the two fields, and the document nests at most
	// MaxConfigDepth levels: the cost stays linear in the size.
	var meta struct {
		APIVersion any `json:"apiVersion"`
		Kind       any `json:"kind"`
	}
	if err := kjson.UnmarshalCaseSensitivePreserveInts(jsonData, &meta); err != nil {
		return nil, "", fmt.Errorf("config is not valid JSON: %w", err)
	}
	obj := map[string]any{"apiVersion": meta.APIVersion, "kind": meta.Kind}
	// Map keys are case-sensitive, like the strict decoder: "Kind" is not
	// "kind".
	apiVersion, apiVersionErr := typeMetaString(obj, "apiVersion")
	kind, kindErr := typeMetaString(obj, "kind")
	gvs := make([]string, len(apis))
	var chosen *API
	for i, a := range apis {
		gvs[i] = a.gv.String()
		if gvs[i] == apiVersion {
			chosen = a
		}
	}
	var errs field.ErrorList
	switch {
	case apiVersionErr != nil:
		errs = append(errs, apiVersionErr)
	case apiVersion == "" && len(gvs) == 1:
		errs = append(errs, field.Required(field.NewPath("apiVersion"), fmt.Sprintf("must be %q", gvs[0])))
	case apiVersion == "":
		errs = append(errs, field.Required(field.NewPath("apiVersion"), fmt.Sprintf("must be one of %s", quoted(gvs))))
	case chosen == nil:
		errs = append(errs, field.NotSupported(field.NewPath("apiVersion"), apiVersion, gvs))
	}
	// Without a known apiVersion, the kinds of the first API are the ones
	// to suggest.
	kinds := apis[0].kinds
	if chosen != nil {
		kinds = chosen.kinds
	}
	switch why, refused := chosen.refusedKind(kind); {
	case kindErr != nil:
		errs = append(errs, kindErr)
	case kind == "":
		errs = append(errs, field.Required(field.NewPath("kind"), fmt.Sprintf("must be one of %s", quoted(kinds))))
	case refused:
		errs = append(errs, field.Forbidden(field.NewPath("kind"), fmt.Sprintf("%s is not supported by this driver: %s", kind, why)))
	case !slices.Contains(kinds, kind):
		errs = append(errs, field.NotSupported(field.NewPath("kind"), kind, kinds))
	}
	if len(errs) > 0 {
		return nil, "", errs.ToAggregate()
	}
	return chosen, kind, nil
}

// refusedKind says whether the API refuses kind, and why; nil refuses none.
func (a *API) refusedKind(kind string) (string, bool) {
	if a == nil {
		return "", false
	}
	why, ok := a.refused[kind]
	return why, ok
}
