#!/usr/bin/env bash
# Builds the test cluster's binaries from the exact Go module versions pinned in
# tests/cluster/build/*/go.mod into a cache outside git keyed by those versions.
# A second run with the same pins rebuilds nothing. Prints the bin directory.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$here/build"

die() { echo "mpjob test cluster: $*" >&2; exit 1; }

command -v go >/dev/null 2>&1 || die "no Go toolchain on PATH; install Go >= 1.26 (https://go.dev/doc/install) or set KUBEBUILDER_ASSETS to prebuilt binaries"

version_of() { awk -v m="$2" '$1==m {print $2; exit} $1=="require" && $2==m {print $3; exit}' "$build/$1/go.mod"; }
K8S="$(version_of kubernetes k8s.io/kubernetes)"
ETCD="$(version_of etcd go.etcd.io/etcd/server/v3)"
HELM="$(version_of helm helm.sh/helm/v3)"
[[ -n "$K8S" && -n "$ETCD" && -n "$HELM" ]] || die "could not read pinned versions from $build/*/go.mod"

digest="$(cat "$build"/*/go.mod "$build"/*/go.sum "$0" | sha256sum | cut -c1-12)"
cache="${MPJOB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mpjob}/cluster/k8s-$K8S-etcd-$ETCD-helm-$HELM-$digest"
bin="$cache/bin"
mkdir -p "$bin"

export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
# Every build here (and in build-kueue.sh, build-s3.sh) compiles without DWARF: the linker's -w
# drops it anyway, and not generating it cut a cold build's CPU by 11 % (Helm: 192 s, was 215 s).

gobuild() { # dir ldflags pkgs...
  local dir="$1" ldflags="$2"; shift 2
  local log="$cache/build-$dir.log"
  echo "mpjob test cluster: building $* (log: $log)" >&2
  if ! (cd "$build/$dir" && go build -trimpath -gcflags=all=-dwarf=false -ldflags "-s -w $ldflags" -o "$bin/" "$@") >"$log" 2>&1; then
    if grep -qE "dial tcp|proxy.golang.org|no such host|i/o timeout|TLS handshake" "$log"; then
      die "downloading Go modules for $dir failed (see $log); check the Go module proxy is reachable (GOPROXY=$(go env GOPROXY))"
    fi
    die "building $dir failed (see $log)"
  fi
}

kver="${K8S#v}"; kmajor="${kver%%.*}"; kminor="${kver#*.}"; kminor="${kminor%%.*}"
kflags=""
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kflags+=" -X $p.gitVersion=$K8S -X $p.gitMajor=$kmajor -X $p.gitMinor=$kminor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done

need() { for b in "$@"; do [[ -x "$bin/$b" ]] || return 0; done; return 1; }

if need etcd; then
  gobuild etcd "-X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD" go.etcd.io/etcd/server/v3
  mv "$bin/server" "$bin/etcd"
fi
if need kube-apiserver kube-controller-manager kube-scheduler kubectl; then
  gobuild kubernetes "$kflags" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
fi
if need helm; then
  gobuild helm "-X helm.sh/helm/v3/internal/version.version=$HELM -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=$kmajor -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$kminor" helm.sh/helm/v3/cmd/helm
fi
echo "$bin"
