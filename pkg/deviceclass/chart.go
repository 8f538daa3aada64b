package deviceclass

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// ChartTemplatePath is the Helm chart template rendered by HelmTemplate,
// relative to the repository root.
const ChartTemplatePath = "deployments/helm/gpu-dra-driver/templates/deviceclasses.yaml"

// Template expressions of the chart: the driver name, and per MIG profile
// class the profile, its name with '+' as '.', and its resource name.
const (
	helmDriver   = "{{ $driver }}"
	helmProfile  = "{{ $profile }}"
	helmSuffix   = "{{ $suffix }}"
	helmResource = "{{ $resource }}"
)

// extendedValues is, per class, the chart value holding the extended
// resource name it serves (empty: none). The whole GPU's is the top-level
// extendedResourceName, as before there were others.
var extendedValues = map[vocabulary.Kind]string{
	vocabulary.KindGPU:       ".Values.extendedResourceName",
	vocabulary.KindMIG:       "$ext.mig",
	vocabulary.KindTimeSlice: "$ext.timeslice",
	vocabulary.KindMPS:       "$ext.mps",
}

// HelmTemplate renders the chart's DeviceClass template from Classes, with
// the driver name taken from the chart's "gpu-dra-driver.driverName" helper
// (driverName, or NVIDIA's under compat.nvidia) and spec.extendedResourceName
// from extendedValues, plus one ProfileClass per .Values.extendedResources.migProfiles
// entry serving nvidia.com/mig-<profile>. The API lets several classes name
// one extended resource and the scheduler then silently picks the newest,
// so the template fails when a name is served twice. It uses the chart's
// "gpu-dra-driver.labels" helper.
func HelmTemplate() []byte {
	var b bytes.Buffer
	b.WriteString(`{{- /* Generated from pkg/deviceclass (go test ./pkg/deviceclass -update). Do not edit. */ -}}
{{- if .Values.deviceClasses.create }}
{{- $driver := include "gpu-dra-driver.driverName" . }}
{{- $ext := default (dict) .Values.extendedResources }}
{{- $profiles := default (list) $ext.migProfiles }}
{{- $served := list }}
`)
	fmt.Fprintf(&b, "{{- range (list %s %s %s %s) }}{{ if . }}{{ $served = append $served . }}{{ end }}{{ end }}\n",
		extendedValues[vocabulary.KindGPU], extendedValues[vocabulary.KindMIG], extendedValues[vocabulary.KindTimeSlice], extendedValues[vocabulary.KindMPS])
	fmt.Fprintf(&b, `{{- range $profiles }}{{ $served = append $served (printf "%s%%s" (replace "+" "." .)) }}{{ end }}
{{- if ne (len $served) (len (uniq $served)) }}
{{- fail (printf "extendedResourceName and extendedResources must name each extended resource once (one DeviceClass may serve it), got: %%s" (join ", " $served)) }}
{{- end }}
`, vocabulary.ResourceMIGPrefix)
	for _, c := range Classes {
		writeClass(&b, c.helmName(), c.Description, c.Selector(helmDriver), ".")
		if v := extendedValues[c.DeviceType]; v != "" { // a VM's device is no container's extended resource
			fmt.Fprintf(&b, `  {{- with %s }}
  extendedResourceName: {{ . | quote }}
  {{- end }}
`, v)
		}
	}
	fmt.Fprintf(&b, `{{- range $profile := $profiles }}
{{- $suffix := replace "+" "." $profile }}
{{- $resource := printf "%s%%s" $suffix }}
`, vocabulary.ResourceMIGPrefix)
	p := ProfileClass{Profile: helmProfile}
	writeClass(&b, profileClassName(helmSuffix, helmDriver), profileDescription(helmProfile, helmResource), p.Selector(helmDriver), "$")
	b.WriteString("  extendedResourceName: {{ $resource | quote }}\n{{- end }}\n{{- end }}\n")
	return b.Bytes()
}

// helmName is the template of the class's name: Name with the chart's
// driver name, which may be NVIDIA's.
func (c Class) helmName() string {
	if c.NVIDIAName == "" {
		return c.Name(helmDriver)
	}
	return fmt.Sprintf(`{{ if eq $driver %q }}%s{{ else }}%s{{ end }}`, vocabulary.NVIDIADriverName, c.NVIDIAName, c.Name(helmDriver))
}

// writeClass writes one DeviceClass up to its selectors; root is the
// template's root context (. outside a range, $ inside).
func writeClass(b *bytes.Buffer, name, description, selector, root string) {
	fmt.Fprintf(b, `---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: %s
  labels:
    {{- include "gpu-dra-driver.labels" %s | nindent 4 }}
  annotations:
    %s: %q
spec:
  selectors:
  - cel:
      expression: '%s'
`, name, root, vocabulary.AnnotationDescription, description, strings.ReplaceAll(selector, "'", "''"))
}
