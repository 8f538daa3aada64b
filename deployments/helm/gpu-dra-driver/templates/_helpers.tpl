{{/* Chart name, truncated to a DNS label. */}}
{{- define "gpu-dra-driver.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the release name, plus the chart name unless the release name has it. */}}
{{- define "gpu-dra-driver.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "gpu-dra-driver.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-dra-driver.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gpu-dra-driver.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "gpu-dra-driver.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "gpu-dra-driver.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The kubelet plugin's service account: the one its pods really run as. */}}
{{- define "gpu-dra-driver.pluginServiceAccount" -}}
{{- if .Values.serviceAccount.create }}
{{- default (printf "%s-kubelet-plugin" (include "gpu-dra-driver.fullname" .)) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "gpu-dra-driver.controllerServiceAccount" -}}
{{- printf "%s-controller" (include "gpu-dra-driver.fullname" .) }}
{{- end }}

{{/*
The DRA driver name: driverName, or NVIDIA's (gpu.nvidia.com) under the compat.nvidia
profile, which refuses a driverName set to anything else rather than pick one.
*/}}
{{- define "gpu-dra-driver.driverName" -}}
{{- $name := required "driverName is required" .Values.driverName }}
{{- if (.Values.compat).nvidia }}
{{- if not (has $name (list "gpu.dra.dev" "gpu.nvidia.com")) }}
{{- fail (printf "compat.nvidia publishes under NVIDIA's driver name gpu.nvidia.com; driverName %q contradicts it: leave driverName at its default" $name) }}
{{- end }}
{{- print "gpu.nvidia.com" }}
{{- else }}
{{- print $name }}
{{- end }}
{{- end }}

{{/* The MIG DeviceClass's name: mig.<driver name>, NVIDIA's mig.nvidia.com under compat.nvidia. */}}
{{- define "gpu-dra-driver.migClassName" -}}
{{- if (.Values.compat).nvidia }}mig.nvidia.com{{ else }}mig.{{ include "gpu-dra-driver.driverName" . }}{{ end }}
{{- end }}

{{/* The plugin's data directory on the host: socket, checkpoint, MPS pipes, simulation. */}}
{{- define "gpu-dra-driver.pluginDataDir" -}}
{{- printf "%s/plugins/%s" (trimSuffix "/" .Values.kubeletDir) (include "gpu-dra-driver.driverName" .) }}
{{- end }}

{{/*
gpu-dra-driver.devicePolicy renders a device policy file (docs/device-model.md) from a
policy value (dict with default and gpus); .Values.mig is the default of default.mig.
Argument: dict "root" $ "policy" <policy>.
*/}}
{{- define "gpu-dra-driver.devicePolicy" -}}
{{- $root := .root }}
{{- $default := deepCopy (default (dict) .policy.default) }}
{{- if $root.Values.mig }}
{{- if not (has $root.Values.mig (list "dynamic" "off")) }}
{{- fail (printf "mig: %q must be \"dynamic\" or \"off\"" $root.Values.mig) }}
{{- end }}
{{- $default = merge $default (dict "mig" $root.Values.mig) }}
{{- end }}
{{- $policy := dict "default" $default }}
{{- with .policy.gpus }}
{{- $_ := set $policy "gpus" . }}
{{- end }}
{{- with .policy.reserve }}
{{- $_ := set $policy "reserve" . }}
{{- end }}
{{- toYaml $policy }}
{{- end }}

{{/* The service account of MPS control daemon pods: no token, no RBAC. */}}
{{- define "gpu-dra-driver.mpsDaemonServiceAccount" -}}
{{- printf "%s-mps-daemon" (include "gpu-dra-driver.fullname" .) }}
{{- end }}

{{/*
The driver root as the plugin sees it (--driver-root) and on the host (--host-driver-root):
MPS daemon pods mount the host one at the plugin's path. Returns a dict with keys path and host.
*/}}
{{- define "gpu-dra-driver.driverRootMount" -}}
{{- if not .Values.simulate }}
{{- toJson (dict "path" "/driver-root" "host" .Values.driverRoot) }}
{{- else if .Values.simulateDriverRoot }}
{{- toJson (dict "path" "/driver-root" "host" .Values.simulateDriverRoot) }}
{{- else }}
{{- $dataDir := include "gpu-dra-driver.pluginDataDir" . }}
{{- $root := printf "%s/simulated-%s/driver-root" $dataDir .Values.simulate }}
{{- $nodes := dict }}
{{- range $node, $machine := .Values.simulateNodeMachines }}
{{- $_ := set $nodes $node (printf "%s/simulated-%s/driver-root" $dataDir $machine) }}
{{- end }}
{{- toJson (dict "path" $root "host" $root "nodes" $nodes) }}
{{- end }}
{{- end }}

{{/*
driverRootExpr is a CEL expression of one of driverRootMount's paths ("path" or
"host"): a string literal, or with simulateNodeMachines a lookup by the node of
the request (variables.userNodeName), since each simulated machine has its own root.
*/}}
{{- define "gpu-dra-driver.driverRootExpr" -}}
{{- $m := index . 0 }}{{- $key := index . 1 }}
{{- if $m.nodes }}
{{- $entries := list }}
{{- range $node, $root := $m.nodes }}
{{- $entries = append $entries (printf "'%s': '%s'" $node $root) }}
{{- end }}
{{- printf "{%s}[?variables.userNodeName].orValue('%s')" (join ", " $entries) (index $m $key) }}
{{- else }}
{{- printf "'%s'" (index $m $key) }}
{{- end }}
{{- end }}

{{/*
credentialNodeName is the CEL expression of the node a request's credential names, ''
for none: a pod-bound service account token carries its pod's node
(authentication.kubernetes.io/node-name, Kubernetes 1.32+). The admission policies that
hold the kubelet plugin to its own node compare with it (variables.userNodeName).
*/}}
{{- define "gpu-dra-driver.credentialNodeName" -}}
has(request.userInfo.extra) &&
'authentication.kubernetes.io/node-name' in request.userInfo.extra &&
size(request.userInfo.extra['authentication.kubernetes.io/node-name']) > 0
? request.userInfo.extra['authentication.kubernetes.io/node-name'][0] : ''
{{- end }}

{{/* The MPS control program as the plugin (and so its daemon pods) see it (pkg/app mpsControl). */}}
{{- define "gpu-dra-driver.mpsControl" -}}
{{- if .Values.simulate }}/usr/bin/mps-control-sim{{ else }}/driver-root/usr/bin/nvidia-cuda-mps-control{{ end }}
{{- end }}

{{/*
heartbeat is "true" when the plugin renews a heartbeat Lease (kubeletPlugin.heartbeatPeriod
is not zero), else empty.
*/}}
{{- define "gpu-dra-driver.heartbeat" -}}
{{- if not (regexMatch "^(0+(\\.0+)?(ms|s|m))+$" (toString .Values.kubeletPlugin.heartbeatPeriod)) }}true{{ end }}
{{- end }}

{{/*
The extended resource names the DeviceClasses serve beyond the NVIDIA device
plugin's names, as a JSON list: the controller's --quota-resource-names and
the quota webhook's matchCondition (pkg/controller/webhook QuotaNames, which
filters the same way). A ResourceQuota limiting one of them or a device plugin
name without the requests. prefix gets a warning.
*/}}
{{- define "gpu-dra-driver.quotaResourceNames" -}}
{{- $ext := default (dict) .Values.extendedResources }}
{{- $names := list }}
{{- range (list .Values.extendedResourceName $ext.mig $ext.timeslice $ext.mps) }}
{{- if and . (not (regexMatch `^nvidia\.com/(gpu(\..*)?|mig-.*)$` .)) }}{{ $names = append $names . }}{{ end }}
{{- end }}
{{- uniq $names | toJson }}
{{- end }}

{{/*
Whether a device policy of the chart enables the reserve policy (reserve.spareGPUs > 0):
its plugins then list and watch ResourceClaims to follow their pool's allocations.
*/}}
{{- define "gpu-dra-driver.reservePolicy" -}}
{{- $on := false }}
{{- with .Values.devicePolicy.reserve }}{{ if .spareGPUs }}{{ $on = true }}{{ end }}{{ end }}
{{- range .Values.devicePolicy.nodeGroups }}
{{- with .policy }}{{ with .reserve }}{{ if .spareGPUs }}{{ $on = true }}{{ end }}{{ end }}{{ end }}
{{- end }}
{{- if $on }}true{{ end }}
{{- end }}
