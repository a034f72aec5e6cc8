#!/usr/bin/env bash
# Installs the Debian packages that the tests and `make cluster` run, when any is
# missing: PostgreSQL 15 and the sqlite3 and psql shells (the registries), and the
# node's containerd, runc, CNI plugins and nftables, and gcc with a static libc for its
# pause image (package node). Only root can; others
# are told what to install. Nothing is downloaded from anywhere but Debian's mirrors.
set -o errexit -o nounset -o pipefail

missing=()
[[ -x /usr/lib/postgresql/15/bin/postgres ]] || missing+=(postgresql)
command -v sqlite3 >/dev/null || missing+=(sqlite3)
[[ -x /usr/bin/containerd && -x /usr/bin/ctr ]] || missing+=(containerd)
[[ -x /usr/sbin/runc ]] || missing+=(runc)
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] || missing+=(containernetworking-plugins)
[[ -x /usr/sbin/nft ]] || missing+=(nftables)
# The node's pause image is built from Kubernetes' pause.c, static.
command -v gcc >/dev/null || missing+=(gcc)
[[ "$(gcc -print-file-name=libc.a 2>/dev/null)" == /* ]] || missing+=(libc6-dev)
command -v ip >/dev/null || missing+=(iproute2)

if [[ ${#missing[@]} -eq 0 ]]; then
	exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
	echo "packages: missing Debian packages: ${missing[*]}" >&2
	echo "packages: install them (apt-get install ${missing[*]}), or run as root; the tests that need them fail without" >&2
	exit 0
fi
echo "packages: installing Debian's ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "packages: installed ${missing[*]}"
