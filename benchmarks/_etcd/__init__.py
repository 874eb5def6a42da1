"""Generated etcd v3 KV stubs (a subset) for the benchmark harness; see etcd_kv.proto.

The generated ``etcd_kv_pb2_grpc`` does ``import etcd_kv_pb2`` (top level), so this
package puts its own directory on ``sys.path`` before importing them.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import etcd_kv_pb2  # noqa: E402
import etcd_kv_pb2_grpc  # noqa: E402

__all__ = ["etcd_kv_pb2", "etcd_kv_pb2_grpc"]
