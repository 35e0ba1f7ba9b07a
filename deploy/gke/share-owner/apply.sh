#!/usr/bin/env bash
# Give the Filestore share behind the claim `autoresearch-data` to the pods' user (uid 10001),
# once, from a root Job with only CAP_CHOWN and CAP_DAC_OVERRIDE (see kustomization.yaml). Run after the claim is
# bound (`kubectl -n autoresearch get pvc autoresearch-data` says Bound); safe to run again.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
pv="$(kubectl -n autoresearch get pvc autoresearch-data -o jsonpath='{.spec.volumeName}')"
if [ -z "$pv" ]; then
  echo "the claim autoresearch-data is not bound yet: apply an overlay (its pods bind it) and run this again" >&2
  exit 1
fi
ip="$(kubectl get pv "$pv" -o jsonpath='{.spec.csi.volumeAttributes.ip}')"
share="$(kubectl get pv "$pv" -o jsonpath='{.spec.csi.volumeAttributes.volume}')"
if [ -z "$ip" ] || [ -z "$share" ]; then
  echo "volume $pv is not a Filestore CSI volume (no ip/volume attributes): give its root to 10001:10001 by hand" >&2
  exit 1
fi
kubectl delete job -n autoresearch-share-owner autoresearch-share-owner --ignore-not-found >/dev/null 2>&1 || true
kubectl kustomize "$here" \
  | sed -e "s|FILESTORE_IP|${ip}|" -e "s|/FILESTORE_SHARE|/${share}|" \
  | kubectl apply -f -
kubectl -n autoresearch-share-owner wait --for=condition=complete job/autoresearch-share-owner --timeout=300s
kubectl -n autoresearch-share-owner logs job/autoresearch-share-owner
