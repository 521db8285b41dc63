# shellcheck shell=bash
# Builds a Go main package from the Go module proxy into gymkube's tool cache.
# Sourced by hack/local-cluster.sh and hack/kind-*.sh.

GYMKUBE_CACHE="${GYMKUBE_CACHE:-${HOME}/.cache/gymkube}"

# gobuild_tool NAME MODULE VERSION PACKAGE [LDFLAGS]
# Prints the path of the built binary. A wrapper module is used because several of
# these modules carry replace directives, which `go install pkg@version` refuses.
gobuild_tool() {
  local name="$1" module="$2" version="$3" package="$4" ldflags="${5:-}"
  local dir="${GYMKUBE_CACHE}/tools/${name}/${version}"
  local bin="${dir}/${name}"
  if [[ -x "${bin}" ]]; then
    echo "${bin}"
    return 0
  fi
  mkdir -p "${dir}/src"
  (
    # Go's build cache in a scratch folder removed when this build ends (as hack/build-tools.sh does).
    if [[ -z "${GOCACHE:-}" ]]; then
      GOCACHE="$(mktemp -d "${GYMKUBE_CACHE}/go-build-${name}.XXXXXX")"
      export GOCACHE
      trap 'rm -rf "${GOCACHE}"' EXIT
    fi
    cd "${dir}/src"
    [[ -f go.mod ]] || go mod init "gymkube.local/build/${name}" >/dev/null 2>&1
    go get "${module}@${version}" >&2
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w ${ldflags}" -o "${bin}.tmp" "${package}" >&2
    mv "${bin}.tmp" "${bin}"
  ) || { echo "error: building ${name} ${version} failed" >&2; return 1; }
  echo "${bin}"
}
