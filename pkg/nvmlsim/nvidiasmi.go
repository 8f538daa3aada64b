package nvmlsim

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// nvidiaSMIScript is usr/bin/nvidia-smi of the simulated driver root: a POSIX sh script (it runs
// in busybox) that answers `nvidia-smi -L` and plain `nvidia-smi` for the GPUs and MIG devices
// whose UUIDs (or GPU indexes) are in NVIDIA_VISIBLE_DEVICES - all of them if it is unset or
// "all", none if it is empty, "none" or "void" - numbered from 0 as inside a container. The
// machine rewrites it when MIG devices change; a container keeps the copy it was started with.
const nvidiaSMIScript = `#!/bin/sh
# nvidia-smi simulated by nvmlsim for machine %[1]s: not NVIDIA software.
set -f
DRIVER_VERSION='%[2]s'
CUDA_VERSION='%[3]s'

# index|uuid|name|bus id|memory MiB|power cap W|temperature C|power W|MIG mode
gpus() {
cat <<'EOF'
%[4]sEOF
}

# parent index|profile|uuid|memory MiB
migs() {
cat <<'EOF'
%[5]sEOF
}

visible=${NVIDIA_VISIBLE_DEVICES-all}

wanted() {
	[ "$visible" = all ] && return 0
	case ",$visible," in *",$1,"*) return 0 ;; esac
	return 1
}

# gpu_shown INDEX UUID: 0 if the GPU or one of its MIG devices is visible.
gpu_shown() {
	wanted "$1" && return 0
	wanted "$2" && return 0
	for u in $(migs | while IFS='|' read -r p prof muuid mmem; do [ "$p" = "$1" ] && echo "$muuid"; done); do
		wanted "$u" && return 0
	done
	return 1
}

list() {
	n=0
	gpus | while IFS='|' read -r idx uuid name bus mem cap temp pw mig; do
		gpu_shown "$idx" "$uuid" || continue
		echo "GPU $n: $name (UUID: $uuid)"
		all=0
		if wanted "$idx" || wanted "$uuid"; then all=1; fi
		k=0
		migs | while IFS='|' read -r p prof muuid mmem; do
			[ "$p" = "$idx" ] || continue
			if [ "$all" = 1 ] || wanted "$muuid"; then
				printf '  MIG %%-11s Device %%2d: (UUID: %%s)\n' "$prof" "$k" "$muuid"
				k=$((k + 1))
			fi
		done
		n=$((n + 1))
	done
}

rule() {
	echo '+-----------------------------------------+------------------------+----------------------+'
}

table() {
	echo '+-----------------------------------------------------------------------------------------+'
	printf '| NVIDIA-SMI %%-22s Driver Version: %%-14s CUDA Version: %%-8s |\n' "$DRIVER_VERSION" "$DRIVER_VERSION" "$CUDA_VERSION"
	echo '|-----------------------------------------+------------------------+----------------------+'
	echo '| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |'
	echo '| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |'
	echo '|                                         |                        |               MIG M. |'
	echo '|=========================================+========================+======================|'
	n=0
	gpus | while IFS='|' read -r idx uuid name bus mem cap temp pw mig; do
		gpu_shown "$idx" "$uuid" || continue
		printf '| %%3d  %%-27.27s %%6s | %%18s %%-3s | %%20s |\n' "$n" "$name" On "$bus" Off 0
		printf '| N/A  %%4s    P0  %%22s | %%22s | %%6s %%13s |\n' "${temp}C" "${pw}W / ${cap}W" "0MiB / ${mem}MiB" "0%%" Default
		printf '| %%39s | %%22s | %%20s |\n' '' '' "$mig"
		rule
		n=$((n + 1))
	done
	echo
	echo '+-----------------------------------------------------------------------------------------+'
	echo '| Processes:                                                                              |'
	echo '|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |'
	echo '|        ID   ID                                                               Usage      |'
	echo '|=========================================================================================|'
	echo '|  No running processes found                                                             |'
	echo '+-----------------------------------------------------------------------------------------+'
}

case "$*" in
-L | --list-gpus) out=$(list) ;;
'') out=$(table) ;;
*)
	echo "nvidia-smi (simulated by nvmlsim): unsupported arguments: $*" >&2
	exit 2
	;;
esac
if [ -z "$(list)" ]; then
	echo 'No devices were found'
	exit 6
fi
printf '%%s\n' "$out"
`

// writeNvidiaSMI writes usr/bin/nvidia-smi under root from the current state. m.mu must be held.
func (m *Machine) writeNvidiaSMI(root string) error {
	var gpuLines, migLines strings.Builder
	for _, g := range m.gpus {
		migMode := "N/A"
		if g.spec.mig != nil {
			migMode = "Disabled"
			if g.migEnabled() {
				migMode = "Enabled"
			}
		}
		fmt.Fprintf(&gpuLines, "%d|%s|%s|%s|%d|%d|%d|%d|%s\n", g.index, g.uuid, g.spec.name,
			g.nvmlBusID(), g.spec.memoryMiB, g.spec.powerLimitW, g.temperatureC(),
			g.powerMilliwatts()/1000, migMode)
		for _, ci := range g.computeInstances() {
			fmt.Fprintf(&migLines, "%d|%s|%s|%d\n", g.index, ci.profile.name, ci.uuid, ci.gi.profile.memoryMiB)
		}
	}
	cuda := fmt.Sprintf("%d.%d", m.cudaDriverVersion/1000, m.cudaDriverVersion%1000/10)
	script := fmt.Sprintf(nvidiaSMIScript, m.spec.name, m.driverVersion, cuda, gpuLines.String(), migLines.String())
	path := filepath.Join(root, "usr", "bin", "nvidia-smi")
	if err := writeFileAtomicMkdir(path, []byte(script), 0o755); err != nil {
		return fmt.Errorf("write nvidia-smi: %w", err)
	}
	return nil
}

func writeFileAtomicMkdir(path string, data []byte, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return writeFileAtomic(path, data, perm)
}
