// Pinned build of Kueue's controller manager for the test cluster (optional component,
// see tests/cluster/kueue.py). Kueue v0.14.8 is built against k8s.io v0.34.x, matching the
// pinned Kubernetes v1.34.4, and serves only kueue.x-k8s.io/v1beta1 (no conversion webhook).
module mpjob.dev/testcluster/kueue

go 1.25.0

require sigs.k8s.io/kueue v0.14.8
