package chart

import (
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
)

// rendered is what one `helm template` gives, by kind.
type rendered struct {
	classes  []resourceapi.DeviceClass
	webhooks []admissionregistrationv1.ValidatingWebhook
	args     map[string][]string // container name → args, of the Deployments and DaemonSets
}

func renderObjects(t *testing.T, args ...string) rendered {
	t.Helper()
	out, err := helm(t, append([]string{"template", "rel", chartDir, "-n", "ns"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	r := rendered{args: map[string][]string{}}
	for _, doc := range strings.Split(out, "\n---") {
		switch {
		case strings.Contains(doc, "\nkind: DeviceClass\n"):
			var c resourceapi.DeviceClass
			if err := yaml.UnmarshalStrict([]byte(doc), &c); err != nil {
				t.Fatalf("%v in:\n%s", err, doc)
			}
			r.classes = append(r.classes, c)
		case strings.Contains(doc, "\nkind: ValidatingWebhookConfiguration\n"):
			var vwc admissionregistrationv1.ValidatingWebhookConfiguration
			if err := yaml.UnmarshalStrict([]byte(doc), &vwc); err != nil {
				t.Fatalf("%v in:\n%s", err, doc)
			}
			r.webhooks = append(r.webhooks, vwc.Webhooks...)
		case strings.Contains(doc, "\nkind: DaemonSet\n"), strings.Contains(doc, "\nkind: Deployment\n"):
			var d appsv1.Deployment // the pod template is all that is read
			if err := yaml.Unmarshal([]byte(doc), &d); err != nil {
				t.Fatalf("%v in:\n%s", err, doc)
			}
			for _, c := range d.Spec.Template.Spec.Containers {
				r.args[c.Name] = append(r.args[c.Name], c.Args...)
			}
		}
	}
	return r
}

// compat.nvidia runs everything under NVIDIA's driver name: the plugin's
// registration and slices, the controller, the webhook's match conditions
// and the DeviceClasses, which take NVIDIA's names where NVIDIA has them.
// Off (the default), nothing of it shows.
func TestChartNVIDIACompatProfile(t *testing.T) {
	helmBinary(t)
	for name, tc := range map[string]struct {
		args   []string
		driver string
	}{
		"default":                    {driver: "gpu.dra.dev"},
		"compat.nvidia":              {args: []string{"--set", "compat.nvidia=true"}, driver: "gpu.nvidia.com"},
		"compat.nvidia, driver name": {args: []string{"--set", "compat.nvidia=true", "--set", "driverName=gpu.nvidia.com"}, driver: "gpu.nvidia.com"},
	} {
		t.Run(name, func(t *testing.T) {
			r := renderObjects(t, tc.args...)
			var got, want []string
			for _, c := range r.classes {
				got = append(got, c.Name)
				for _, s := range c.Spec.Selectors {
					if !strings.Contains(s.CEL.Expression, `device.driver == "`+tc.driver+`"`) {
						t.Errorf("class %s selects %s, not driver %s", c.Name, s.CEL.Expression, tc.driver)
					}
				}
			}
			for _, c := range deviceclass.DeviceClasses(tc.driver) {
				want = append(want, c.Name)
			}
			if !slices.Equal(got, want) {
				t.Errorf("DeviceClasses %v, want %v", got, want)
			}
			if tc.driver == "gpu.nvidia.com" && !slices.Contains(got, "mig.nvidia.com") {
				t.Errorf("no mig.nvidia.com among %v", got)
			}
			flag := "--driver-name=" + tc.driver
			for _, ctr := range []string{"plugin", "controller"} {
				if !slices.Contains(r.args[ctr], flag) {
					t.Errorf("container %s args %v lack %s", ctr, r.args[ctr], flag)
				}
			}
			if len(r.webhooks) == 0 {
				t.Fatal("no webhooks rendered")
			}
			for _, wh := range r.webhooks {
				if !strings.HasSuffix(wh.Name, "."+tc.driver) {
					t.Errorf("webhook %s is not named for %s", wh.Name, tc.driver)
				}
				for _, mc := range wh.MatchConditions {
					if strings.Contains(mc.Expression, "opaque") && !strings.Contains(mc.Expression, "'"+tc.driver+"'") {
						t.Errorf("webhook %s matches configs %s, not those of %s", wh.Name, mc.Expression, tc.driver)
					}
				}
			}
		})
	}
}

// A driverName that contradicts the profile fails the install instead of
// one of them being silently ignored.
func TestChartNVIDIACompatRefusesOtherDriverName(t *testing.T) {
	helmBinary(t)
	out, err := helm(t, "template", "rel", chartDir, "--set", "compat.nvidia=true", "--set", "driverName=gpu.example.com")
	if err == nil || !strings.Contains(out, `driverName "gpu.example.com" contradicts it`) {
		t.Fatalf("err %v, want the contradiction refused:\n%s", err, out)
	}
}
