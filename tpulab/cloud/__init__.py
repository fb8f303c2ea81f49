"""The cloud layer: the `TpuApi` seam (`api`), its google-cloud-tpu implementation
(`google`, the only google.* importer), the error classification table (`classify`) and
`polling`, the only wait/retry loop.

Modules are imported by name (`tpulab.cloud.api`), so importing this package loads nothing.
"""
