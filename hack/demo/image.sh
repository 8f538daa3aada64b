#!/usr/bin/env bash
# Builds the driver image as a tar, without a registry or a container engine:
# dra-kubelet-plugin, mps-control-sim and imex-sim (side by side in /usr/bin, where the
# plugin looks for the simulated MPS control program and IMEX daemon under --simulate), gpu-load-sim (the
# simulated CUDA job the demo's load pods run, static), dra-controller when
# it exists, the glibc runtime the cgo binaries (and a dlopen'ed libnvidia-ml) need,
# and Debian's static busybox for a shell. The tar is an OCI image layout that
# `ctr images import` and hack/cluster/up.sh --image understand.
#
# Usage: hack/demo/image.sh [OUT.tar]
# Environment: IMAGE_REF (gdd.local/gpu-dra-driver:dev), IMAGE_TAR (bin/gpu-dra-driver-image.tar).
# Prints the tar's path on stdout.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

ref=${IMAGE_REF:-gdd.local/gpu-dra-driver:dev}
out=${1:-${IMAGE_TAR:-bin/gpu-dra-driver-image.tar}}
export CGO_ENABLED=1 CGO_CFLAGS=${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}

bindir=$(hack/cluster/build.sh --print-bin-dir)
if [[ ! -x $bindir/mkimage ]]; then
	hack/cluster/build.sh >&2
fi

cmds=(./cmd/dra-kubelet-plugin ./cmd/mps-control-sim ./cmd/imex-sim)
[[ -d cmd/dra-controller ]] && cmds+=(./cmd/dra-controller)
go build -trimpath -ldflags="-s -w" -o bin/ "${cmds[@]}" >&2
CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o bin/ ./cmd/gpu-load-sim >&2
files=(-file bin/dra-kubelet-plugin -file bin/mps-control-sim -file bin/imex-sim -file bin/gpu-load-sim)
[[ -d cmd/dra-controller ]] && files+=(-file bin/dra-controller)

# glibc: the loader and the libraries libc-linked Go binaries and the NVIDIA
# driver libraries (libnvidia-ml, loaded with dlopen from the driver root) need.
multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
libs=(libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libgcc_s.so.1)
for l in "${libs[@]}"; do
	if [[ -e /lib/$multiarch/$l ]]; then
		files+=("-file" "/lib/$multiarch/$l:/lib/$multiarch/$l")
	fi
done
loader=$(readlink -f /lib64/ld-linux-x86-64.so.2)
files+=("-file" "$loader:/lib64/ld-linux-x86-64.so.2" "-file" "$loader:/lib/$multiarch/$(basename "$loader")")

busybox=()
if [[ -x /bin/busybox ]] && file -L /bin/busybox 2>/dev/null | grep -q 'statically linked'; then
	busybox=(-busybox /bin/busybox)
fi

mkdir -p "$(dirname "$out")"
"$bindir/mkimage" -ref "$ref" -o "$out" "${busybox[@]}" \
	-entrypoint /usr/bin/dra-kubelet-plugin "${files[@]}" >&2
echo "$out"
