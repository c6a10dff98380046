"""The test node agent: stands in for kubelet + a container runtime on the test cluster.

It registers two Nodes (a GPU node with NVIDIA GPU Feature Discovery's labels, capacity
`nvidia.com/gpu: 2` and the `nvidia.com/gpu=present:NoSchedule` taint, and a CPU node), keeps
their Leases and Ready conditions fresh, and runs every pod bound to them as local
processes: container command and args (no image), env (incl. fieldRef, envFrom; a pod whose
Secret or ConfigMap is not there waits, CreateContainerConfigError, as with kubelet), volumes as local
directories (mount paths are rewritten to them in env values and args), a ServiceAccount
kubeconfig only when automountServiceAccountToken allows, a per-pod loopback IP with
`hostname.subdomain.namespace.svc` names in a marked /etc/hosts block, status with exit
codes and termination messages, and graceful deletion (SIGTERM, grace period, SIGKILL).

Each container runs under `/bin/sh -c 'trap true TERM INT; "$@"; echo $? > "$0"'` in its own
session, so the exit code survives an agent restart; the agent's state file lets a
restarted agent re-adopt running processes instead of orphaning them.

The modules, each importing only those above it in this list:

    log          timestamps and the agent's log lines
    hosts        the /etc/hosts block (pod DNS names)
    state        what the agent remembers on disk: running pods, ended pods, pod IPs
    downward     fieldRef values (env and downwardAPI volumes)
    environment  a container's env and envFrom; a Secret or ConfigMap not there holds the pod
    nodes        the two Nodes: registration, capacity and labels, Ready and Lease renewal
    volumes      the default StorageClass, the PV provisioner, a pod's volumes as directories
    credentials  a pod's ServiceAccount kubeconfig
    processes    the runtime: a container as a local process group; env, exit code, kill
    podstatus    the status documents the agent writes
    pods         one pod's life: sandbox, init containers, start, exit, restart, deletion
    watch        list and watch the pods bound to our nodes and act on each
    agent        NodeAgent: the parts and their threads
    __main__     `python -m tests.cluster.nodeagent` (started by `tests.cluster.controlplane.up`)

Everything here may import `tests.cluster.layout`, and nothing else of `tests.cluster`.
"""
