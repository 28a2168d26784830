#!/usr/bin/env bash
# Make the GPU node of a kind cluster (hack/kind/gpu.yaml) schedule `nvidia.com/gpu` pods:
# install the NVIDIA container toolkit inside the node, make it containerd's default runtime,
# and deploy the NVIDIA device plugin. Usage: hack/kind/gpu-setup.sh CLUSTER KUBECONFIG
set -euo pipefail
cluster=${1:?usage: gpu-setup.sh CLUSTER KUBECONFIG}
kubeconfig=${2:?usage: gpu-setup.sh CLUSTER KUBECONFIG}
device_plugin_version=${NVIDIA_DEVICE_PLUGIN_VERSION:-v0.17.0}

gpu_nodes=$(kubectl --kubeconfig "$kubeconfig" get nodes -l nvidia.com/gpu.present=true \
  -o jsonpath='{.items[*].metadata.name}')
[ -n "$gpu_nodes" ] || { echo "no node labelled nvidia.com/gpu.present=true in $cluster" >&2; exit 1; }

for node in $gpu_nodes; do
  echo "configuring the NVIDIA runtime in $node"
  docker exec "$node" bash -euc '
    # The host driver is visible through the injected devices; the node needs only the toolkit.
    apt-get update -qq && apt-get install -y -qq curl gpg >/dev/null
    curl -fsSL https://nvidia.github.io/libnvidia-container/gpgkey \
      | gpg --dearmor -o /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg
    curl -fsSL https://nvidia.github.io/libnvidia-container/stable/deb/nvidia-container-toolkit.list \
      | sed "s#deb https://#deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] https://#" \
      > /etc/apt/sources.list.d/nvidia-container-toolkit.list
    apt-get update -qq && apt-get install -y -qq nvidia-container-toolkit >/dev/null
    nvidia-ctk runtime configure --runtime=containerd --set-as-default
    systemctl restart containerd
    # The toolkit mounts the host driver state read-only; the device plugin needs its own view.
    umount -R /proc/driver/nvidia 2>/dev/null || true
  '
done

kubectl --kubeconfig "$kubeconfig" apply -f \
  "https://raw.githubusercontent.com/NVIDIA/k8s-device-plugin/${device_plugin_version}/deployments/static/nvidia-device-plugin.yml"
echo "waiting for GPUs to become allocatable"
for _ in $(seq 60); do
  if kubectl --kubeconfig "$kubeconfig" get nodes \
      -o jsonpath='{.items[*].status.allocatable.nvidia\.com/gpu}' | grep -q '[1-9]'; then
    kubectl --kubeconfig "$kubeconfig" get nodes \
      -o custom-columns='NODE:.metadata.name,GPUS:.status.allocatable.nvidia\.com/gpu'
    exit 0
  fi
  sleep 5
done
echo "no GPU became allocatable: check 'kubectl -n kube-system logs ds/nvidia-device-plugin-daemonset'" >&2
exit 1
