#!/usr/bin/env bash
# The e2e fault contract (tests/e2e, DDPJOB_E2E_FAULTS) implemented for a kind cluster, whose nodes
# are docker containers named after the Kubernetes node:
#
#   faults.sh kill NAMESPACE/POD [--signal N]   a container crash: signal N (default 9) to the main
#                                              process of the pod's first container
#   faults.sh node-down NODE                   the node goes silent: its processes stop answering with
#                                              their sockets left open, it posts no more status, deletions
#                                              of its pods hang; only the node controller's grace period
#                                              reveals it
#   faults.sh node-up NODE                     the node comes back rebooted; its kubelet re-registers
#   faults.sh api-down SECONDS                 the API server stops answering; it comes back on its own
#                                              SECONDS later at the latest (so a test that dies cannot
#                                              leave the cluster without one); returns once it no
#                                              longer answers
#   faults.sh api-up                           the API server comes back now; returns once it is ready
#   faults.sh supports VERB                    exit 0 when this implementation has VERB, 1 when not
#
# Uses kubectl (KUBECONFIG) and docker; `make e2e` passes this script as DDPJOB_E2E_FAULTS.
#
# kill: the pod's node and container id come from the API (spec.nodeName,
# status.containerStatuses[0].containerID); the host pid of the container's init comes from crictl
# inside the node. The main process is PID 1 of the container's pid namespace: SIGKILL (and
# SIGSTOP) always reach it, any other signal only when the process installed a handler for it
# (the kernel protects a namespace's init from default-action signals).
#
# node-down is `docker pause` of the node container (the cgroup freezer): every process on it stops
# where it is and keeps its sockets; the kernel, which is the host's, keeps ACKing their TCP
# connections, so peers see no reset and no refusal, only silence (their sends stall once the frozen
# receiver's window fills, their reads wait); the kubelet posts no status, and a pod deletion waits
# for a kubelet that never confirms -- a node that lost power or its network, as the operator sees it
# (a `docker kill` would be the fast path instead: the dead processes' sockets close at once).
# node-up never lets the frozen processes resume (old trainers would wake up and talk to peers that
# moved on): it kills the paused container and starts it again, a reboot. kind's entrypoint boots
# systemd, containerd and the kubelet; pods the control plane deleted meanwhile are cleaned up by the
# kubelet, the node's filesystem (local-path volumes included) is kept. The node's restart policy is
# set to "no" while it is down (docker would otherwise restart it on its own once killed, or when
# its daemon restarts) and restored by node-up.
#
# api-down moves the kube-apiserver static pod manifest of every control-plane node of the cluster
# (kind's node containers labelled io.x-k8s.kind.cluster=NAME, NAME from KIND_CLUSTER_NAME or the
# current context kind-NAME) out of /etc/kubernetes/manifests: the kubelet stops the API server, and
# clients get "connection refused" (etcd and the other components keep running). A watchdog started
# inside the node (`docker exec -d`) puts that very manifest back after SECONDS; api-up puts back any
# parked manifest at once. Either way the kubelet starts the API server again from it.
set -euo pipefail

KUBECTL=${KUBECTL:-kubectl}
DOCKER=${DOCKER:-docker}
STATE_DIR=${DDPJOB_FAULTS_STATE_DIR:-${TMPDIR:-/tmp}/ddpjob-faults}

usage() {
  cat >&2 <<'EOF'
usage: faults.sh kill NAMESPACE/POD [--signal N]
       faults.sh node-down NODE
       faults.sh node-up NODE
       faults.sh api-down SECONDS
       faults.sh api-up
       faults.sh supports VERB
EOF
  exit 2
}

die() {
  echo "faults.sh: $*" >&2
  exit 1
}

kind_node() {
  local node=$1 role
  role=$("$DOCKER" inspect --format '{{ index .Config.Labels "io.x-k8s.kind.role" }}' "$node" 2>/dev/null) \
    || die "no docker container named $node: is $node a node of a kind cluster?"
  [ -n "$role" ] || die "docker container $node is not a kind node (no io.x-k8s.kind.role label)"
  echo "$role"
}

kill_pod() {
  local target=$1 signal=$2 namespace pod node cid pid
  [[ $target == */* ]] || usage
  namespace=${target%%/*}
  pod=${target#*/}
  [ -n "$namespace" ] && [ -n "$pod" ] || usage
  [[ $signal =~ ^[0-9]+$ ]] && [ "$signal" -ge 1 ] && [ "$signal" -le 64 ] \
    || die "--signal takes a signal number 1-64, got '$signal'"

  node=$("$KUBECTL" get pod -n "$namespace" "$pod" -o jsonpath='{.spec.nodeName}') \
    || die "cannot read pod $namespace/$pod"
  [ -n "$node" ] || die "pod $namespace/$pod is not scheduled on a node"
  cid=$("$KUBECTL" get pod -n "$namespace" "$pod" -o jsonpath='{.status.containerStatuses[0].containerID}')
  cid=${cid#*://}
  [ -n "$cid" ] || die "pod $namespace/$pod has no started container"
  kind_node "$node" >/dev/null

  pid=$("$DOCKER" exec "$node" crictl inspect --output go-template --template '{{.info.pid}}' "$cid" 2>/dev/null \
        || "$DOCKER" exec "$node" crictl inspect "$cid" | grep -m1 '"pid":' | tr -dc '0-9') \
    || die "crictl on $node cannot inspect container $cid of $namespace/$pod"
  pid=$(echo "$pid" | tr -dc '0-9')
  [ -n "$pid" ] && [ "$pid" != 0 ] || die "container $cid of $namespace/$pod is not running (no pid)"

  "$DOCKER" exec "$node" sh -c 'kill -"$1" "$2"' kill "$signal" "$pid" \
    || die "kill -$signal $pid (container $cid of $namespace/$pod) failed on $node"
  echo "sent signal $signal to pid $pid (pod $namespace/$pod, container ${cid:0:13}) on $node"
}

node_state() {
  "$DOCKER" inspect --format '{{.State.Status}}' "$1"
}

# await_state NODE STATE SECONDS: true once the node container is in STATE (docker's State.Status),
# false after SECONDS.
await_state() {
  local node=$1 want=$2 seconds=$3
  for _ in $(seq 1 "$seconds"); do
    [ "$(node_state "$node")" = "$want" ] && return 0
    sleep 1
  done
  [ "$(node_state "$node")" = "$want" ]
}

node_down() {
  local node=$1 role status saved
  role=$(kind_node "$node")
  [ "$role" != control-plane ] \
    || die "$node is a control-plane node: taking it down takes the API server with it, refusing"
  status=$(node_state "$node")
  [ "$status" = running ] || die "node $node is $status, not running: already down?"
  mkdir -p "$STATE_DIR"
  saved="$STATE_DIR/$node.restart-policy"
  # A policy saved by an earlier node-down that failed is the original one: keep it.
  [ -f "$saved" ] || "$DOCKER" inspect \
    --format '{{.HostConfig.RestartPolicy.Name}}:{{.HostConfig.RestartPolicy.MaximumRetryCount}}' "$node" > "$saved" \
    || die "cannot read the restart policy of $node"
  "$DOCKER" update --restart=no "$node" >/dev/null || die "cannot clear the restart policy of $node"
  "$DOCKER" pause "$node" >/dev/null || die "docker pause $node failed"
  await_state "$node" paused 30 || die "node $node is $(node_state "$node"), not paused, 30s after docker pause"
  echo "node $node is down (silent: its processes frozen, their sockets open)"
}

start_node() {
  local node=$1
  "$DOCKER" start "$node" >/dev/null || die "docker start $node failed"
  await_state "$node" running 30 || die "node $node is $(node_state "$node"), not running, 30s after docker start"
}

node_up() {
  local node=$1 status refused saved name count
  kind_node "$node" >/dev/null
  status=$(node_state "$node")
  case $status in
    running) ;;  # not down (never was, or already back): nothing to reboot
    paused)
      if ! refused=$("$DOCKER" kill --signal KILL "$node" 2>&1 >/dev/null); then
        # Older docker refuses to kill a paused container ("Unpause the container before stopping or
        # killing"). Thawed, the old processes run for the instant until the kill lands: harmless, as
        # the survivors have moved to a new rendezvous id (an old trainer's messages reach no one that
        # listens) and every checkpoint commit is fenced by generation (an old one commits nothing).
        { "$DOCKER" unpause "$node" >/dev/null && "$DOCKER" kill --signal KILL "$node" >/dev/null; } \
          || die "cannot kill the paused node $node (docker kill: $refused)"
      fi
      if ! await_state "$node" exited 30; then
        # A freezer that holds even SIGKILL until thawed (cgroup v1): thaw it, the kill lands at once.
        "$DOCKER" unpause "$node" >/dev/null 2>&1 || true
        await_state "$node" exited 30 || die "node $node is $(node_state "$node"), not exited, after docker kill"
      fi
      start_node "$node"
      ;;
    exited|created) start_node "$node" ;;
    *) die "node $node is $status: cannot bring it up" ;;
  esac
  saved="$STATE_DIR/$node.restart-policy"
  if [ -f "$saved" ]; then
    IFS=: read -r name count < "$saved"
    case $name in
      on-failure) "$DOCKER" update --restart="on-failure:$count" "$node" >/dev/null ;;
      always|unless-stopped|no) "$DOCKER" update --restart="$name" "$node" >/dev/null ;;
      *) ;;
    esac || die "cannot restore the restart policy $name of $node"
    rm -f "$saved"
  fi
  if [ "$status" = running ]; then
    echo "node $node is up (it was not down)"
  else
    echo "node $node is up, rebooted (its kubelet re-registers within a minute)"
  fi
}

MANIFEST=/etc/kubernetes/manifests/kube-apiserver.yaml
PARKED_PREFIX=/etc/kubernetes/kube-apiserver.yaml.ddpjob-parked  # outside manifests/: the kubelet ignores it

api_answers() {
  "$KUBECTL" get --raw /readyz --request-timeout=5s >/dev/null 2>&1
}

control_planes() {
  local cluster=${KIND_CLUSTER_NAME:-} context nodes
  if [ -z "$cluster" ]; then
    context=$("$KUBECTL" config current-context 2>/dev/null) || die "no current kubectl context (KUBECONFIG)"
    [[ $context == kind-* ]] || die "context '$context' is not a kind cluster's; set KIND_CLUSTER_NAME"
    cluster=${context#kind-}
  fi
  nodes=$("$DOCKER" ps --filter "label=io.x-k8s.kind.cluster=$cluster" \
          --filter "label=io.x-k8s.kind.role=control-plane" --format '{{.Names}}')
  [ -n "$nodes" ] || die "no running control-plane node container of kind cluster '$cluster'"
  echo "$nodes"
}

api_up_now() {
  local node nodes
  nodes=$(control_planes) || exit 1
  for node in $nodes; do
    "$DOCKER" exec "$node" sh -c 'for f in "$1".*; do [ -f "$f" ] && mv "$f" "$2"; done; true' \
      sh "$PARKED_PREFIX" "$MANIFEST" || die "cannot restore the kube-apiserver manifest on $node"
  done
}

api_down() {
  local seconds=$1 node nodes nonce parked
  [[ $seconds =~ ^[0-9]+$ ]] && [ "$seconds" -ge 1 ] && [ "$seconds" -le 3600 ] \
    || die "api-down takes the outage's longest duration in seconds, 1-3600, got '$seconds'"
  nodes=$(control_planes) || exit 1
  nonce=$$-$(date +%s)
  parked="$PARKED_PREFIX.$nonce"
  for node in $nodes; do
    "$DOCKER" exec "$node" test -f "$MANIFEST" || die "no $MANIFEST on $node: is the API server already down?"
    "$DOCKER" exec "$node" mv "$MANIFEST" "$parked" || die "cannot park the kube-apiserver manifest on $node"
    # This outage's manifest only: an earlier watchdog must not end a later outage early.
    "$DOCKER" exec -d "$node" sh -c 'sleep "$1"; [ -f "$2" ] && mv "$2" "$3"' sh "$seconds" "$parked" "$MANIFEST" \
      || die "cannot start the watchdog on $node"
  done
  for _ in $(seq 1 120); do
    api_answers || {
      echo "API server down (back within ${seconds}s, or at api-up)"
      return 0
    }
    sleep 1
  done
  api_up_now
  die "the API server still answered 120s after its manifest was removed; put back"
}

api_up() {
  api_up_now
  for _ in $(seq 1 300); do
    api_answers && {
      echo "API server up"
      return 0
    }
    sleep 1
  done
  die "the API server is not ready 300s after its manifest was put back"
}

[ $# -ge 1 ] || usage
command=$1
shift
case $command in
  kill)
    [ $# -ge 1 ] || usage
    target=$1
    shift
    signal=9
    while [ $# -gt 0 ]; do
      case $1 in
        --signal) [ $# -ge 2 ] || usage; signal=$2; shift 2 ;;
        --signal=*) signal=${1#--signal=}; shift ;;
        *) usage ;;
      esac
    done
    kill_pod "$target" "$signal"
    ;;
  node-down) [ $# -eq 1 ] || usage; node_down "$1" ;;
  node-up) [ $# -eq 1 ] || usage; node_up "$1" ;;
  api-down) [ $# -eq 1 ] || usage; api_down "$1" ;;
  api-up) [ $# -eq 0 ] || usage; api_up ;;
  supports)
    [ $# -eq 1 ] || usage
    case $1 in kill|node-down|node-up|api-down|api-up|supports) exit 0 ;; *) exit 1 ;; esac
    ;;
  -h|--help|help) usage ;;
  *) usage ;;
esac
