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

// helmDriver is the template expression of the driver name in the chart.
const helmDriver = "{{ $driver }}"

// HelmTemplate renders the chart's DeviceClass template from Classes, with
// the driver name taken from .Values.driverName and, on the whole-GPU class,
// spec.extendedResourceName from .Values.extendedResourceName (so that
// `resources.limits: nvidia.com/gpu: 1` is served by DRA). It uses the chart's
// "gpu-dra-driver.labels" helper.
func HelmTemplate() []byte {
	var b bytes.Buffer
	b.WriteString(`{{- /* Generated from pkg/deviceclass (go test ./pkg/deviceclass -update). Do not edit. */ -}}
{{- if .Values.deviceClasses.create }}
{{- $driver := required "driverName is required" .Values.driverName }}
`)
	for _, c := range Classes {
		fmt.Fprintf(&b, `---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: %s
  labels:
    {{- include "gpu-dra-driver.labels" . | nindent 4 }}
  annotations:
    %s: %q
spec:
  selectors:
  - cel:
      expression: '%s'
`, c.Name(helmDriver), vocabulary.AnnotationDescription, c.Description, strings.ReplaceAll(c.Selector(helmDriver), "'", "''"))
		if c.DeviceType == vocabulary.KindGPU {
			b.WriteString(`  {{- with .Values.extendedResourceName }}
  extendedResourceName: {{ . | quote }}
  {{- end }}
`)
		}
	}
	b.WriteString("{{- end }}\n")
	return b.Bytes()
}
