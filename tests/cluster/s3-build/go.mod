// Pinned build of versitygw, an S3-compatible gateway over a POSIX folder (Apache-2.0), the
// object store of the test cluster (see tests/cluster/s3.py).
module mpjob.dev/testcluster/s3

go 1.25.0

require github.com/versity/versitygw v1.8.0
