// Pinned source of the Prometheus Operator CRDs (ServiceMonitor, PodMonitor, PrometheusRule)
// that the chart's monitoring objects are dry-run against. Only the module's files are used
// (example/prometheus-operator-crd/); nothing is built.
module mpjob.dev/testcluster/monitoringcrds

go 1.24.0

require github.com/prometheus-operator/prometheus-operator v0.85.0
