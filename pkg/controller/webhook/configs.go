package webhook

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/metrics"
	"github.com/gpu-dra/gpu-dra-driver/pkg/opaqueconfig"
)

// The webhook reads only the opaque configs of an object, so it decodes into
// these minimal shapes rather than the full API types: faster, and the same
// for every version of resource.k8s.io (v1beta1, v1beta2 and v1 agree on
// these field names).
type opaqueConfig struct {
	Driver     string          `json:"driver"`
	Parameters json.RawMessage `json:"parameters"`
}

type deviceConfig struct {
	Opaque *opaqueConfig `json:"opaque"`
}

type claimSpec struct {
	Devices struct {
		Config []deviceConfig `json:"config"`
	} `json:"devices"`
}

type claimObject struct {
	metav1.ObjectMeta `json:"metadata"`
	Spec              claimSpec `json:"spec"`
}

type templateObject struct {
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Spec claimSpec `json:"spec"`
	} `json:"spec"`
}

type classObject struct {
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Config []deviceConfig `json:"config"`
	} `json:"spec"`
}

// located is one opaque config with the field path of its parameters.
type located struct {
	path   *field.Path
	opaque *opaqueConfig
}

// resourceKind knows where one resource keeps its opaque configs.
type resourceKind struct {
	// configs decodes an object and returns its opaque configs.
	configs func(raw []byte) (metav1.Object, []located, error)
}

var kinds = map[string]resourceKind{
	"resourceclaims": {configs: func(raw []byte) (metav1.Object, []located, error) {
		var obj claimObject
		if err := json.Unmarshal(raw, &obj); err != nil {
			return nil, nil, err
		}
		return &obj.ObjectMeta, locate(field.NewPath("spec", "devices", "config"), obj.Spec.Devices.Config), nil
	}},
	"resourceclaimtemplates": {configs: func(raw []byte) (metav1.Object, []located, error) {
		var obj templateObject
		if err := json.Unmarshal(raw, &obj); err != nil {
			return nil, nil, err
		}
		return &obj.ObjectMeta, locate(field.NewPath("spec", "spec", "devices", "config"), obj.Spec.Spec.Devices.Config), nil
	}},
	"deviceclasses": {configs: func(raw []byte) (metav1.Object, []located, error) {
		var obj classObject
		if err := json.Unmarshal(raw, &obj); err != nil {
			return nil, nil, err
		}
		return &obj.ObjectMeta, locate(field.NewPath("spec", "config"), obj.Spec.Config), nil
	}},
}

func locate(base *field.Path, configs []deviceConfig) []located {
	var out []located
	for i, c := range configs {
		if c.Opaque == nil {
			continue
		}
		out = append(out, located{path: base.Index(i).Child("opaque", "parameters"), opaque: c.Opaque})
	}
	return out
}

// configProblem is why one config was rejected.
type configProblem struct {
	// message names the parameters' path, then what is wrong.
	message string
	reason  string
	causes  []metav1.StatusCause
}

// checkConfigs validates every config addressed to driverName with the
// plugin's own opaqueconfig.DecodeDefaultValidate. Configs whose parameters also appear,
// for our driver, in old (the object before an update) are skipped: an
// update that does not touch a config must not fail because validation
// became stricter after the object was created (it could, for example,
// block removing a finalizer).
func checkConfigs(driverName string, configs, old []located) []configProblem {
	var problems []configProblem
	for _, c := range configs {
		if c.opaque.Driver != driverName || unchanged(driverName, c, old) {
			continue
		}
		if _, err := opaqueconfig.DecodeDefaultValidate(c.opaque.Parameters); err != nil {
			problems = append(problems, describe(c.path, err))
		}
	}
	return problems
}

func unchanged(driverName string, c located, old []located) bool {
	for _, o := range old {
		if o.opaque.Driver == driverName && bytes.Equal(o.opaque.Parameters, c.opaque.Parameters) {
			return true
		}
	}
	return false
}

// describe turns a DecodeDefaultValidate error into a message rooted at the
// object: "spec.devices.config[1].opaque.parameters: sharing.mpsConfig.…:
// Invalid value: 150: must be between 1 and 100". Field errors keep their
// own paths (relative to the parameters), one per message part.
func describe(path *field.Path, err error) configProblem {
	var agg utilerrors.Aggregate
	var fieldErrs []*field.Error
	if errors.As(err, &agg) {
		for _, e := range agg.Errors() {
			var fe *field.Error
			if !errors.As(e, &fe) {
				fieldErrs = nil
				break
			}
			fieldErrs = append(fieldErrs, fe)
		}
	}
	// DecodeDefaultValidate reports decoding problems as "decode …" and
	// validation problems as "invalid <Kind>: …". Field errors, of either,
	// have paths relative to the parameters and are reported one by one.
	reason := metrics.ReasonInvalid
	if strings.HasPrefix(err.Error(), "decode") {
		reason = metrics.ReasonDecode
	}
	if len(fieldErrs) > 0 {
		p := configProblem{reason: reason}
		parts := make([]string, 0, len(fieldErrs))
		for _, fe := range fieldErrs {
			parts = append(parts, fmt.Sprintf("%s: %s", path, fe.Error()))
			p.causes = append(p.causes, metav1.StatusCause{
				Type:    metav1.CauseType(fe.Type),
				Message: fe.ErrorBody(),
				Field:   path.String() + "." + fe.Field,
			})
		}
		p.message = strings.Join(parts, "; ")
		return p
	}
	return configProblem{
		reason:  reason,
		message: fmt.Sprintf("%s: %v", path, err),
		causes: []metav1.StatusCause{{
			Type:    metav1.CauseTypeFieldValueInvalid,
			Message: err.Error(),
			Field:   path.String(),
		}},
	}
}
