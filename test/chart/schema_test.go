package chart

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
)

// A mistyped key, a value of the wrong type or one outside its set is
// refused by `helm template` (and so by install and upgrade) with its path,
// instead of being ignored or failing later in a pod.
func TestSchemaRefusesMistypedValues(t *testing.T) {
	helmBinary(t) // skip (or fail in CI) once, not per case
	for name, tc := range map[string]struct {
		args []string
		want []string // each in the error
	}{
		"mistyped plugin key": {
			args: []string{"--set", "kubeletPlugin.metricAuth=x"},
			want: []string{"at '/kubeletPlugin'", "'metricAuth' not allowed"},
		},
		"extended resource name not qualified": {
			args: []string{"--set", "extendedResources.timeslice=Nvidia/gpu"},
			want: []string{"at '/extendedResources/timeslice'", "does not match pattern"},
		},
		"MIG profile misspelt": {
			args: []string{"--set", "extendedResources.migProfiles={1g10gb}"},
			want: []string{"at '/extendedResources/migProfiles/0'", "does not match pattern"},
		},
		"device plugin check period without unit": {
			args: []string{"--set-string", "kubeletPlugin.devicePluginCheckPeriod=10"},
			want: []string{"at '/kubeletPlugin/devicePluginCheckPeriod'", "does not match pattern"},
		},
		"mass lapse threshold zero": {
			args: []string{"--set", "controller.outage.massLapse.threshold=0"},
			want: []string{"at '/controller/outage/massLapse/threshold'"},
		},
		"mass lapse threshold over one": {
			args: []string{"--set", "controller.outage.massLapse.threshold=1.5"},
			want: []string{"at '/controller/outage/massLapse/threshold'"},
		},
		"heartbeat priority without shares": {
			args: []string{"--set", "kubeletPlugin.heartbeatPriority.nominalConcurrencyShares=0"},
			want: []string{"at '/kubeletPlugin/heartbeatPriority/nominalConcurrencyShares'"},
		},
		"mistyped top-level key": {
			args: []string{"--set", "driverNmae=gpu.example.com"},
			want: []string{"'driverNmae' not allowed"},
		},
		"mistyped nested key": {
			args: []string{"--set", "controller.webhook.certManager.enable=true"},
			want: []string{"at '/controller/webhook/certManager'", "'enable' not allowed"},
		},
		"mistyped device policy key": {
			args: []string{"--set", "devicePolicy.default.mps.maxShare=3"},
			want: []string{"at '/devicePolicy/default/mps'", "'maxShare' not allowed"},
		},
		// The MPS daemon pod policy quotes it in CEL.
		"image repository with a quote": {
			args: []string{"--set", "image.repository=gdd.local/x' || true || 'y"},
			want: []string{"at '/image/repository'", "does not match pattern"},
		},
		"image repository with a tag": {
			args: []string{"--set", "image.repository=gdd.local/gpu-dra-driver:v1"},
			want: []string{"at '/image/repository'", "does not match pattern"},
		},
		"port as a string": {
			args: []string{"--set", "kubeletPlugin.metricsPort=abc"},
			want: []string{"at '/kubeletPlugin/metricsPort'", "want integer"},
		},
		"boolean as a string": {
			args: []string{"--set-string", "validatingAdmissionPolicy.enabled=false"},
			want: []string{"at '/validatingAdmissionPolicy/enabled'", "want boolean"},
		},
		"replicas as a word": {
			args: []string{"--set", "controller.replicas=two"},
			want: []string{"at '/controller/replicas'", "want integer"},
		},
		"unknown metrics auth": {
			args: []string{"--set", "kubeletPlugin.metricsAuth=basic"},
			want: []string{"at '/kubeletPlugin/metricsAuth'", "'delegated', 'none'"},
		},
		"unknown log format": {
			args: []string{"--set", "logFormat=yaml"},
			want: []string{"at '/logFormat'", "'text', 'json'"},
		},
		"unknown pull policy": {
			args: []string{"--set", "image.pullPolicy=always"},
			want: []string{"at '/image/pullPolicy'", "'IfNotPresent'"},
		},
		"unknown failure policy": {
			args: []string{"--set", "controller.webhook.failurePolicy=fail"},
			want: []string{"at '/controller/webhook/failurePolicy'", "'Fail', 'Ignore'"},
		},
		"unknown simulated machine": {
			args: []string{"--set", "simulate=dgx"},
			want: []string{"at '/simulate'", "'dgxh100'"},
		},
		"relative kubelet dir": {
			args: []string{"--set", "kubeletDir=var/lib/kubelet"},
			want: []string{"at '/kubeletDir'"},
		},
		"share count out of range": {
			args: []string{"--set", "devicePolicy.default.timeSlicing.maxShares=65"},
			want: []string{"at '/devicePolicy/default/timeSlicing/maxShares'"},
		},
		"node group with two labels": {
			args: []string{"--set-json", `devicePolicy.nodeGroups=[{"name":"a","nodeSelector":{"x":"1","y":"2"}}]`},
			want: []string{"at '/devicePolicy/nodeGroups/0/nodeSelector'"},
		},
		"extra arg as a number": {
			args: []string{"--set-json", `kubeletPlugin.extraArgs=[7]`},
			want: []string{"at '/kubeletPlugin/extraArgs/0'", "want string"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			out, err := helm(t, append([]string{"template", "rel", chartDir}, tc.args...)...)
			if err == nil {
				t.Fatalf("helm template %s renders; want a schema error", strings.Join(tc.args, " "))
			}
			for _, w := range append([]string{"values don't meet the specifications of the schema"}, tc.want...) {
				if !strings.Contains(out, w) {
					t.Errorf("helm template %s: the error does not contain %q:\n%s", strings.Join(tc.args, " "), w, out)
				}
			}
		})
	}
}

// The schema's device policy is the plugin's: the same keys as
// devicemodel.Policy, GPUPolicy and SharePolicy, and the MIG modes it
// accepts, so a key the plugin knows is never refused and one it does not
// know never reaches it.
func TestSchemaDevicePolicyMatchesPlugin(t *testing.T) {
	schema := loadSchema(t)
	def := func(name string) schemaNode {
		n, err := resolve(schema, schemaNode{"$ref": "#/definitions/" + name})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	props := func(path string, n schemaNode) []string {
		p, ok := n["properties"].(map[string]any)
		if !ok {
			t.Fatalf("values.schema.json: %s has no properties", path)
		}
		var keys []string
		for k := range p {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		return keys
	}
	nodeGroupPolicy := func() schemaNode {
		dp := schema["properties"].(map[string]any)["devicePolicy"].(map[string]any)
		items := dp["properties"].(map[string]any)["nodeGroups"].(map[string]any)["items"].(map[string]any)
		return items["properties"].(map[string]any)["policy"].(map[string]any)
	}()
	for _, tc := range []struct {
		path string
		node schemaNode
		typ  reflect.Type
	}{
		{"definitions/gpuPolicy", def("gpuPolicy"), reflect.TypeFor[devicemodel.GPUPolicy]()},
		{"definitions/sharePolicy", def("sharePolicy"), reflect.TypeFor[devicemodel.SharePolicy]()},
		{"definitions/reservePolicy", def("reservePolicy"), reflect.TypeFor[devicemodel.ReservePolicy]()},
		{"devicePolicy.nodeGroups[].policy", nodeGroupPolicy, reflect.TypeFor[devicemodel.Policy]()},
	} {
		if got, want := props(tc.path, tc.node), jsonFields(tc.typ); !slices.Equal(got, want) {
			t.Errorf("values.schema.json: %s has keys %v, %s has %v", tc.path, got, tc.typ, want)
		}
	}
	mig := def("gpuPolicy")["properties"].(map[string]any)["mig"].(map[string]any)["enum"]
	if want := []any{"", string(devicemodel.MIGDynamic), string(devicemodel.MIGOff)}; !reflect.DeepEqual(mig, want) {
		t.Errorf("values.schema.json: gpuPolicy.mig is one of %v, the plugin accepts %v", mig, want)
	}
	if top := schema["properties"].(map[string]any)["mig"].(map[string]any)["enum"]; !reflect.DeepEqual(top, mig) {
		t.Errorf("values.schema.json: mig is one of %v, gpuPolicy.mig of %v", top, mig)
	}
}

// jsonFields are the JSON names of a struct's fields, sorted.
func jsonFields(typ reflect.Type) []string {
	var names []string
	for f := range typ.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// simulate takes exactly the machines pkg/nvmlsim simulates (or "", off).
func TestSchemaSimulateMachines(t *testing.T) {
	schema := loadSchema(t)
	got := schema["properties"].(map[string]any)["simulate"].(map[string]any)["enum"]
	want := []any{""}
	machines := nvmlsim.Machines()
	slices.Sort(machines)
	for _, m := range machines {
		want = append(want, m)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("values.schema.json: simulate is one of %v, pkg/nvmlsim simulates %v", got, want)
	}
}

// One DeviceClass may serve an extended resource name: the scheduler would
// silently use the newest of two, so the chart refuses the second.
func TestChartRefusesExtendedResourceServedTwice(t *testing.T) {
	helmBinary(t)
	for name, args := range map[string][]string{
		"gpu and timeslice":    {"--set", "extendedResources.timeslice=nvidia.com/gpu"},
		"a profile twice by +": {"--set", "extendedResources.migProfiles={1g.10gb+me}", "--set", "extendedResources.mig=nvidia.com/mig-1g.10gb.me"},
	} {
		t.Run(name, func(t *testing.T) {
			out, err := helm(t, append([]string{"template", "rel", chartDir}, args...)...)
			if err == nil || !strings.Contains(out, "must name each extended resource once") {
				t.Fatalf("helm template %v: err %v, want the duplicate refused:\n%s", args, err, out)
			}
		})
	}
}
